"""FP8 paged attention (``cutetma.attention_with_kvcache`` with e4m3 q and caches) on the
H200, against the fp32 reference of the dequantised inputs over the gathered pages, within
test_fp8_attention_gpu.py's budget. The cache is read as stored and V transposed in shared
memory; every slot past a sequence's length holds NaN and every table entry past its pages
-1 (neither may be read), pages shuffled in the pool, ragged lengths (0 and 1 included),
both producers at the page sizes they take, prefill, chunked prefill and decode (packed and
split)."""

import pytest

pytestmark = pytest.mark.gpu


def fp8_cache(b, lengths, page_size, h_kv, d, seed=0):
    """test_paged_gpu's poisoned cache in e4m3 (randn fits e4m3's range as it is)."""
    import torch
    from test_paged_gpu import make_cache

    k, v, table, lens = make_cache(b, lengths, page_size, h_kv, d, torch.float32, seed)
    return k.to(torch.float8_e4m3fn), v.to(torch.float8_e4m3fn), table, lens


def check(b, s_q, lengths, page_size, h, h_kv, d, causal, load, num_splits=None,
          descale=(1.0, 1.0, 1.0)):
    import torch
    from test_fp8_attention_gpu import assert_within_budget
    from test_paged_gpu import gathered

    import cutetma

    k_cache, v_cache, table, lens = fp8_cache(b, lengths, page_size, h_kv, d)
    g = torch.Generator(device="cuda").manual_seed(1)
    q = torch.randn(b, s_q, h, d, device="cuda", generator=g).to(torch.float8_e4m3fn)
    sq, sk, sv = descale
    out, lse = cutetma.attention_with_kvcache(q, k_cache, v_cache, lens, table, causal=causal,
                                              return_lse=True, load=load,
                                              num_splits=num_splits, q_descale=sq,
                                              k_descale=sk, v_descale=sv)
    torch.cuda.synchronize()
    assert out.dtype == torch.bfloat16 and not out.isnan().any(), "NaN in the output"
    for i in range(b):
        k, v = gathered(k_cache, v_cache, table, lens, i)
        if k.shape[1] == 0:  # no keys: out 0, lse -inf
            assert (out[i] == 0).all() and (lse[i] == float("-inf")).all()
            continue

        def scaled(x, sc, i=i):  # sc per (sequence, K/V head): spread over its group
            return x.float() * (sc[i].reshape(1, 1, -1, 1).repeat_interleave(
                x.shape[2] // sc.shape[1], 2) if isinstance(sc, torch.Tensor) else sc)

        assert_within_budget(out[i:i + 1], lse[i:i + 1],
                             (scaled(q[i:i + 1], sq), scaled(k, sk), scaled(v, sv)), causal)


@pytest.mark.parametrize("load,page_size", [("tma", p) for p in (16, 64, 128, 256, 48, 8)]
                         + [("cp_async", p) for p in (1, 17, 64)])
@pytest.mark.parametrize("causal", [False, True])
def test_prefill_ragged(load, page_size, causal):
    """b = 4 cached lengths (one empty, one of a single key), 77 new queries each, GQA 8/2:
    a key block (192 keys) spans pages of 8 to 128 keys or lies inside one of 256."""
    check(4, 77, [300, 0, 1, 517], page_size, 8, 2, 128, causal, load)


@pytest.mark.parametrize("load", ["tma", "cp_async"])
@pytest.mark.parametrize("head_dim", [64, 256])
def test_head_dims(load, head_dim):
    check(2, 128, [1000, 129], 64, 4, 4, head_dim, True, load)


@pytest.mark.parametrize("load,page_size", [("tma", 64), ("tma", 16), ("cp_async", 17)])
@pytest.mark.parametrize("num_splits", [None, 1, 5])
def test_decode_packed_and_split(load, page_size, num_splits):
    """Decode, GQA 32/8 packed into one tile, keys split and merged by their LSEs."""
    check(4, 1, [0, 1, 4096, 1999], page_size, 32, 8, 128, True, load, num_splits)
    check(2, 4, [700, 1500], page_size, 8, 2, 128, False, load, num_splits)


@pytest.mark.parametrize("load", ["tma", "cp_async"])
def test_descales_per_sequence_and_kv_head(load):
    """Descales per (sequence, K/V head), as FlashAttention-3's paged call takes them."""
    import torch

    b, h_kv = 3, 2
    sk = 2.0 ** torch.randint(-3, 4, (b, h_kv), device="cuda").float()
    check(b, 40, [500, 77, 1030], 64, 8, h_kv, 128, True, load,
          descale=(0.5, sk, torch.full((b, h_kv), 0.25, device="cuda")))


def test_matches_dense_fp8():
    """A paged cache holding the dense K/V (one page per 128 keys, in order) gives the dense
    FP8 call's output within the budget, and the errors before launch are clear."""
    import torch

    import cutetma

    b, s, h, d = 2, 640, 4, 128
    q, k, v = (torch.randn(b, s, h, d, device="cuda").to(torch.float8_e4m3fn)
               for _ in range(3))
    table = torch.arange(b * s // 128, device="cuda", dtype=torch.int32).view(b, -1)
    lens = torch.full((b,), s, device="cuda", dtype=torch.int32)
    paged = cutetma.attention_with_kvcache(q, k.reshape(-1, 128, h, d),
                                           v.reshape(-1, 128, h, d), lens, table,
                                           causal=True)
    dense = cutetma.attention_fp8(q, k, v, causal=True)
    torch.cuda.synchronize()
    assert (paged.float() - dense.float()).abs().max() < 2e-2
    with pytest.raises(TypeError, match="one dtype"):
        cutetma.attention_with_kvcache(q, k.reshape(-1, 128, h, d).bfloat16(),
                                       v.reshape(-1, 128, h, d), lens, table)
    with pytest.raises(ValueError, match="q_descale"):
        cutetma.attention_with_kvcache(q, k.reshape(-1, 128, h, d), v.reshape(-1, 128, h, d),
                                       lens, table, q_descale=-1.0)
    with pytest.raises(TypeError, match="out_dtype"):
        cutetma.attention_with_kvcache(q, k.reshape(-1, 128, h, d), v.reshape(-1, 128, h, d),
                                       lens, table, out_dtype=torch.float32)


def test_torch_compile_fullgraph():
    """Inside torch.compile the FP8 call is the custom op, descales per (sequence, K/V head)
    included: one graph, the eager numbers."""
    import torch

    import cutetma

    k, v, table, lens = fp8_cache(2, [300, 700], 64, 2, 128)
    q = torch.randn(2, 4, 8, 128, device="cuda").to(torch.float8_e4m3fn)
    sk = torch.tensor([[0.5, 1.0], [2.0, 0.25]], device="cuda")

    def layer(q):
        return cutetma.attention_with_kvcache(q, k, v, lens, table, causal=True,
                                              q_descale=0.5, k_descale=sk,
                                              out_dtype=torch.float16) * 2

    compiled = torch.compile(layer, fullgraph=True)
    out = compiled(q)
    assert out.dtype == torch.float16 and torch.equal(out, layer(q))
