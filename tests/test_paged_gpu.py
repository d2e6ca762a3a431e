"""Paged attention (``cutetma.attention_with_kvcache``) on the H200 against the fp32
reference over the gathered pages, flash-attention's rule as in test_attention_gpu.py.
Pages shuffled in the pool, ragged cache lengths (0 and 1 included), every cache slot past
a sequence's length and every page-table entry past its pages poisoned (NaN, -1), both
producers at every page size they take, prefill, chunked prefill and decode shapes."""

import pytest

pytestmark = pytest.mark.gpu


def make_cache(b, lengths, page_size, h_kv, d, dtype, seed=0):
    """(k_cache, v_cache, page_table, cache_seqlens): each sequence's pages drawn at random
    from a shuffled pool with spare pages; slots past a length hold NaN, table entries past
    a sequence's pages hold -1 (neither may be read)."""
    import torch

    g = torch.Generator(device="cpu").manual_seed(seed)
    need = [(n + page_size - 1) // page_size for n in lengths]
    max_pages = max(max(need), 1) + 1
    pool = sum(need) + 3
    order = torch.randperm(pool, generator=g)
    k = torch.full((pool, page_size, h_kv, d), float("nan"), dtype=dtype)
    v = torch.full_like(k, float("nan"))
    table = torch.full((b, max_pages), -1, dtype=torch.int32)
    used = 0
    for i, n in enumerate(lengths):
        pages = order[used:used + need[i]]
        used += need[i]
        table[i, :need[i]] = pages.int()
        flat_k = torch.randn(need[i] * page_size, h_kv, d, generator=g).to(dtype)
        flat_v = torch.randn(need[i] * page_size, h_kv, d, generator=g).to(dtype)
        flat_k[n:] = float("nan")
        flat_v[n:] = float("nan")
        k[pages] = flat_k.view(need[i], page_size, h_kv, d)
        v[pages] = flat_v.view(need[i], page_size, h_kv, d)
    lens = torch.tensor(lengths, dtype=torch.int32)
    return k.cuda(), v.cuda(), table.cuda(), lens.cuda()


def gathered(k_cache, v_cache, table, lens, i):
    page_size = k_cache.shape[1]
    n = int(lens[i])
    pages = table[i, :(n + page_size - 1) // page_size].long()
    return (k_cache[pages].flatten(0, 1)[:n][None], v_cache[pages].flatten(0, 1)[:n][None])


def check(b, s_q, lengths, page_size, h, h_kv, d, causal, load, dtype="bfloat16",
          num_splits=None):
    import torch
    from test_attention_gpu import _same_dtype

    import cutetma
    from cutetma.reference import attention_ref

    t = getattr(torch, dtype)
    k_cache, v_cache, table, lens = make_cache(b, lengths, page_size, h_kv, d, t)
    q = torch.randn(b, s_q, h, d, device="cuda", dtype=t)
    out, lse = cutetma.attention_with_kvcache(q, k_cache, v_cache, lens, table, causal=causal,
                                              return_lse=True, load=load,
                                              num_splits=num_splits)
    torch.cuda.synchronize()
    assert not out.isnan().any(), "NaN in the output"
    for i in range(b):
        k, v = gathered(k_cache, v_cache, table, lens, i)
        ref, ref_lse = attention_ref(q[i:i + 1], k, v, causal)
        if k.shape[1]:
            same = _same_dtype(q[i:i + 1], k, v, causal).float()
            bound = (2 * (same - ref).abs().max().item()
                     + (ref.to(t).float() - ref).abs().max().item() + 1e-5)
        else:
            bound = 0.0
        err = (out[i:i + 1].float() - ref).abs().max().item()
        assert err <= bound, f"sequence {i} (length {lengths[i]}): error {err:.3g} > {bound:.3g}"
        finite = ref_lse.isfinite()
        assert (lse[i:i + 1].isfinite() == finite).all()
        if finite.any():
            assert (lse[i:i + 1][finite] - ref_lse[finite]).abs().max().item() < 1e-3


TMA_PAGES = [16, 32, 64, 128, 256, 48, 8]
CP_PAGES = [1, 17, 16, 64, 128, 200]


@pytest.mark.parametrize("load,page_size", [("tma", p) for p in TMA_PAGES]
                         + [("cp_async", p) for p in CP_PAGES])
@pytest.mark.parametrize("causal", [False, True])
def test_prefill_ragged(load, page_size, causal):
    """b = 4 sequences of different cached lengths (one empty, one of a single key) and
    s_q = 77 new queries each (chunked prefill: s_q < the cache), GQA 8 / 2, d = 128."""
    check(4, 77, [300, 0, 1, 517], page_size, 8, 2, 128, causal, load)


@pytest.mark.parametrize("load", ["tma", "cp_async"])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_head_dims_and_dtypes(load, head_dim, dtype):
    check(2, 128, [1000, 129], 64, 4, 4, head_dim, True, load, dtype)


@pytest.mark.parametrize("load", ["tma", "cp_async"])
@pytest.mark.parametrize("s_q", [1, 4, 16])
def test_decode(load, s_q):
    """Decode: a few new queries per sequence over long caches, MQA and GQA."""
    check(3, s_q, [4096, 33, 2000], 128, 16, 4, 128, True, load)
    check(2, s_q, [700, 1500], 32, 8, 1, 128, False, load)


@pytest.mark.parametrize("load,page_size", [("tma", 64), ("tma", 16), ("cp_async", 17)])
@pytest.mark.parametrize("num_splits", [1, 2, 5, 64])
@pytest.mark.parametrize("causal", [False, True])
def test_decode_packed_and_split(load, page_size, num_splits, causal):
    """Decode with the query heads of a K/V head packed into one tile (GQA 32 / 8: 4 rows
    per query) and the keys cut into splits merged by their LSEs: more splits than key
    blocks (empty splits), a sequence with no keys and one with a single key."""
    check(4, 1, [0, 1, 4096, 1999], page_size, 32, 8, 128, causal, load,
          num_splits=num_splits)
    check(2, 4, [700, 1500], page_size, 8, 2, 128, causal, load, num_splits=num_splits)


@pytest.mark.parametrize("load", ["tma", "cp_async"])
@pytest.mark.parametrize("s_q,h,h_kv", [(16, 16, 1), (64, 8, 1), (3, 12, 4), (1, 8, 8)])
def test_decode_pack_shapes(load, s_q, h, h_kv):
    """Packed tiles over several query blocks (MQA, 16 x 16 and 64 x 8 rows), a group of 3,
    and MHA (nothing to pack: split only), causal."""
    check(2, s_q, [2048, 555], 64, h, h_kv, 128, True, load)


@pytest.mark.parametrize("head_dim", [64, 256])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_decode_head_dims(head_dim, dtype):
    """d = 64 (its pingpong default becomes overlap when packed) and d = 256 (80-key
    stages), both dtypes, automatic splits."""
    import torch

    import cutetma

    for causal in (False, True):
        check(2, 2, [3000, 77], 16, 16, 4, head_dim, causal, "tma", dtype)
        # d = 256, cp.async, causal: no split_kv (the DSL's compiler crashes on it): the
        # automatic choice runs unsplit, a forced split is refused before launch
        refused = head_dim == 256 and causal
        check(1, 1, [1234], 16, 16, 4, head_dim, causal, "cp_async", dtype,
              num_splits=None if refused else 3)
        if refused:
            q = torch.zeros(1, 1, 16, head_dim, device="cuda", dtype=getattr(torch, dtype))
            cache = torch.zeros(4, 16, 4, head_dim, device="cuda", dtype=q.dtype)
            table = torch.arange(4, dtype=torch.int32, device="cuda")[None]
            with pytest.raises(ValueError, match="split_kv"):
                cutetma.attention_with_kvcache(q, cache, cache, 60, table, causal=True,
                                               load="cp_async", num_splits=3)


def test_dense_cache_is_one_page_per_sequence():
    """Without a page table the cache is (b, s_cache, h_kv, d): the same as attention over
    each sequence's first cache_seqlens keys."""
    import torch

    import cutetma
    from cutetma.reference import attention_ref

    k = torch.randn(2, 640, 2, 128, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    q = torch.randn(2, 64, 4, 128, device="cuda", dtype=torch.bfloat16)
    lens = torch.tensor([640, 200], dtype=torch.int32, device="cuda")
    out = cutetma.attention_with_kvcache(q, k, v, lens, causal=True)
    for i, n in enumerate((640, 200)):
        ref, _ = attention_ref(q[i:i + 1], k[i:i + 1, :n], v[i:i + 1, :n], True)
        assert (out[i:i + 1].float() - ref).abs().max().item() < 2e-2


def test_paged_matches_dense_attention():
    """Full pages in order: the same numbers as ``cutetma.attention`` (both TMA)."""
    import torch

    import cutetma

    b, s, h, d, page = 2, 1024, 8, 128, 64
    k = torch.randn(b, s, 2, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    q = torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16)
    table = torch.arange(b * s // page, dtype=torch.int32, device="cuda").view(b, -1)
    lens = torch.full((b,), s, dtype=torch.int32, device="cuda")
    paged = cutetma.attention_with_kvcache(q, k.view(-1, page, 2, d), v.view(-1, page, 2, d),
                                           lens, table, causal=True, load="tma")
    dense = cutetma.attention(q, k, v, causal=True)
    assert (paged.float() - dense.float()).abs().max().item() < 1e-2


@pytest.mark.parametrize("num_splits", [None, 3])
def test_cuda_graph_capture(num_splits):
    """No host synchronisation: the call (packed decode; split, with its combine) captures
    into a CUDA graph and replays with new cache lengths written in place."""
    import torch

    import cutetma

    k, v, table, lens = make_cache(2, [500, 300], 64, 2, 128, torch.bfloat16)
    q = torch.randn(2, 1, 8, 128, device="cuda", dtype=torch.bfloat16)

    def call():
        return cutetma.attention_with_kvcache(q, k, v, lens, table, num_splits=num_splits)

    call()  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = call()
    lens.copy_(torch.tensor([450, 250], dtype=torch.int32))  # inside each sequence's pages
    graph.replay()
    want = call()
    torch.cuda.synchronize()
    assert torch.equal(out, want)


def test_errors_before_launch():
    import torch

    import cutetma

    k, v, table, lens = make_cache(2, [50, 60], 16, 2, 128, torch.float16)
    q = torch.randn(2, 3, 4, 128, device="cuda", dtype=torch.float16)
    with pytest.raises(ValueError, match="int32"):
        cutetma.attention_with_kvcache(q, k, v, lens, table.long())
    with pytest.raises(ValueError, match="cache_seqlens"):
        cutetma.attention_with_kvcache(q, k, v, lens[:1], table)
    with pytest.raises(TypeError, match="dtype"):
        cutetma.attention_with_kvcache(q.bfloat16(), k, v, lens, table)
    with pytest.raises(ValueError, match="multiple"):
        cutetma.attention_with_kvcache(q[:, :, :3], k, v, lens, table)
    with pytest.raises(ValueError, match="head_dim"):
        cutetma.attention_with_kvcache(q[..., :96].contiguous(), k[..., :96].contiguous(),
                                       v[..., :96].contiguous(), lens, table)
    odd = torch.randn(6, 12, 2, 128, device="cuda", dtype=torch.float16)
    with pytest.raises(ValueError, match="multiple of 8"):
        cutetma.attention_with_kvcache(q, odd, odd, lens, table[:, :2] % 6, load="tma")
    with pytest.raises(ValueError, match="num_splits"):
        cutetma.attention_with_kvcache(q, k, v, lens, table, num_splits=0)


def test_torch_compile_fullgraph():
    """Inside torch.compile the call is the custom op: one graph, the eager numbers."""
    import torch

    import cutetma

    k, v, table, lens = make_cache(2, [300, 700], 32, 2, 128, torch.bfloat16)
    q = torch.randn(2, 4, 8, 128, device="cuda", dtype=torch.bfloat16)

    def layer(q):
        return cutetma.attention_with_kvcache(q, k, v, lens, table, causal=True) * 2

    compiled = torch.compile(layer, fullgraph=True)
    assert torch.equal(compiled(q), layer(q))


@pytest.mark.parametrize("load,page_size", [("tma", 16), ("tma", 128), ("cp_async", 17)])
@pytest.mark.parametrize("s_new", [1, 5])
def test_new_keys_are_appended_then_attended(load, page_size, s_new):
    """``k=`` / ``v=``: the step's keys and values written at each sequence's end (their
    slots poisoned first), then attended over: the same bits as the call over a cache that
    already held them, eagerly, under torch.compile and in a CUDA graph; the caller's
    lengths unchanged."""
    import torch

    import cutetma
    from cutetma.kvcache import append_to_cache

    lengths = [300, 0, 1, 517]
    k_cache, v_cache, table, full = make_cache(4, [n + s_new for n in lengths], page_size,
                                               2, 128, torch.bfloat16)
    lens = full - s_new
    q = torch.randn(4, s_new, 8, 128, device="cuda", dtype=torch.bfloat16)
    want = cutetma.attention_with_kvcache(q, k_cache, v_cache, full, table, causal=True,
                                          load=load)
    new = [gathered(k_cache, v_cache, table, full, i) for i in range(4)]
    k_new = torch.stack([kv[0][0, n:] for kv, n in zip(new, lengths, strict=True)])
    v_new = torch.stack([kv[1][0, n:] for kv, n in zip(new, lengths, strict=True)])
    nan = torch.full_like(k_new, float("nan"))

    def step(q, k_new, v_new):
        return cutetma.attention_with_kvcache(q, k_cache, v_cache, lens, table, causal=True,
                                              load=load, k=k_new, v=v_new)

    for run in (step, torch.compile(step, fullgraph=True)):
        append_to_cache(k_cache, v_cache, nan, nan, lens, table)
        assert torch.equal(run(q, k_new, v_new), want)
    append_to_cache(k_cache, v_cache, nan, nan, lens, table)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step(q, k_new, v_new)
    append_to_cache(k_cache, v_cache, nan, nan, lens, table)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, want)
    assert lens.tolist() == lengths


@pytest.mark.parametrize("dtype", ["bfloat16", "float8_e4m3fn"])
@pytest.mark.parametrize("page_size", [1, 3, 16, 128])
@pytest.mark.parametrize("form", ["dense_1", "dense_7", "varlen", "strided"])
def test_append_kernel_writes_what_torch_writes(dtype, page_size, form):
    """The append kernel (``KVAppend``) against torch's index copies
    (``reference.append_to_cache_ref``) on the same pool: every byte of both caches equal
    (so nothing else in the pool is touched), the lengths after it returned and the
    caller's unchanged. Forms: one and 7 new keys a sequence, varlen rows with an empty
    sequence, and k / v views (a 16-byte-strided slice, and one whose strides are not, which
    is copied first) into a cache whose K and V pages interleave."""
    import torch

    from cutetma.kvcache import append_to_cache
    from cutetma.reference import append_to_cache_ref

    torch.manual_seed(0)
    lengths, h_kv, d = [300, 0, 1, 517, 64], 2, 128
    counts = {"dense_1": [1] * 5, "dense_7": [7] * 5, "strided": [3] * 5,
              "varlen": [4, 0, 9, 1, 2]}[form]
    pages_each = [-(-(n + c) // page_size) for n, c in zip(lengths, counts, strict=True)]
    pool = sum(pages_each) + 3
    kv = torch.randn(pool, page_size, 2, h_kv, d, device="cuda").to(getattr(torch, dtype))
    k_cache, v_cache = kv[:, :, 0], kv[:, :, 1]  # K and V pages interleaved
    order = torch.randperm(pool, device="cuda").int()
    table = torch.zeros(5, max(pages_each), dtype=torch.int32, device="cuda")
    at = 0
    for i, n in enumerate(pages_each):
        table[i, :n] = order[at:at + n]
        at += n
    lens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    cu = None
    shape = (sum(counts), h_kv, d) if form == "varlen" else (5, counts[0], h_kv, d)
    if form == "varlen":
        cu = torch.tensor([0, *torch.tensor(counts).cumsum(0).tolist()], dtype=torch.int32,
                          device="cuda")
    k, v = (torch.randn(*shape, device="cuda").to(kv.dtype) for _ in range(2))
    if form == "strided":  # a slice of a longer step (16-byte strides), and a d + 4 pad
        k = torch.randn(5, 8, h_kv, d, device="cuda").to(kv.dtype)[:, 2:5]
        v = torch.randn(5, 3, h_kv, d + 4, device="cuda").to(kv.dtype)[..., :d]
    want = kv.clone()
    append_to_cache_ref(want[:, :, 0], want[:, :, 1], k, v, lens, table, cu)
    after = append_to_cache(k_cache, v_cache, k, v, lens, table, cu)
    torch.cuda.synchronize()
    assert torch.equal(kv.view(torch.uint8), want.view(torch.uint8))
    assert after.tolist() == [n + c for n, c in zip(lengths, counts, strict=True)]
    assert lens.tolist() == lengths


def test_append_kernel_writes_nothing_it_cannot_place():
    """Lengths and page ids the kernel does not check (``check_contents=True`` would report
    them): a position past the table's pages, or a page id outside the pool, is not written
    (no stray write into memory it does not own); the other sequences' rows are."""
    import torch

    from cutetma.kvcache import append_to_cache

    pool, page_size, h_kv, d = 6, 16, 2, 128
    k_cache, v_cache = (torch.zeros(pool, page_size, h_kv, d, device="cuda",
                                    dtype=torch.bfloat16) for _ in range(2))
    table = torch.tensor([[0, 1], [2, 3], [4, 99]], dtype=torch.int32, device="cuda")
    lens = torch.tensor([5, 32, 16], dtype=torch.int32, device="cuda")  # 32: past 2 pages
    k = torch.ones(3, 1, h_kv, d, device="cuda", dtype=torch.bfloat16)
    after = append_to_cache(k_cache, v_cache, k, k, lens, table)
    torch.cuda.synchronize()
    assert after.tolist() == [6, 33, 17]
    assert torch.equal(k_cache[0, 5], k[0, 0])  # sequence 0: page 0, slot 5
    written = (k_cache != 0).flatten(1).any(1).tolist()
    assert written == [True, False, False, False, False, False]  # page 99: none


@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("splits", [1, 2, 33, 64])
def test_split_combine_matches_the_fp32_merge(head_dim, splits):
    """The merge kernel against the fp32 merge (``combine_splits_ref``): random partials,
    some splits empty (lse -inf, zeros), one row with no keys at all, a strided output."""
    import torch

    from cutetma import runtime
    from cutetma.reference import combine_splits_ref

    b, s_q, h = 3, 2, 5
    o_parts = torch.randn(splits * b, s_q, h, head_dim, device="cuda")
    lse_parts = torch.randn(splits * b, h, s_q, device="cuda") * 4
    lse_parts[1::3] = float("-inf")  # empty splits
    o_parts[1::3] = 0
    lse_parts[:, 0, 0].view(splits, b)[:, 2] = float("-inf")  # sequence 2, head 0, query 0
    o_parts.view(splits, b, s_q, h, head_dim)[:, 2, 0, 0] = 0
    big = torch.empty(b, h, s_q, head_dim, device="cuda", dtype=torch.bfloat16)
    out = big.transpose(1, 2)  # (b, s_q, h, d), not contiguous
    lse = torch.empty(b, h, s_q, device="cuda")
    launch = runtime.combine_launch(torch.bfloat16, head_dim)
    launch((o_parts.data_ptr(), lse_parts.data_ptr(), out.data_ptr(), lse.data_ptr(), b, s_q,
            h, splits, out.stride(1), out.stride(2), out.stride(0),
            torch.cuda.current_stream().cuda_stream))
    want_out = torch.empty(b, s_q, h, head_dim, device="cuda")
    want_lse = torch.empty_like(lse)
    combine_splits_ref(o_parts, lse_parts, splits, want_out, want_lse)
    torch.cuda.synchronize()
    assert not out.isnan().any()
    torch.testing.assert_close(out.float(), want_out, atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(lse, want_lse, atol=1e-4, rtol=1e-4)
    assert out[2, 0, 0].float().abs().max() == 0 and lse[2, 0, 0] == float("-inf")


def check_varlen(lens_q, lens_k, page_size, h, h_kv, d, causal, load, num_splits=None):
    """Varlen queries (q (total_q, h, d), cu_seqlens_q) against each sequence's fp32
    reference, flash-attention's rule as ``check``."""
    import torch
    from test_attention_gpu import _same_dtype

    import cutetma
    from cutetma.reference import attention_ref

    b = len(lens_q)
    k_cache, v_cache, table, lens = make_cache(b, lens_k, page_size, h_kv, d, torch.bfloat16)
    cu = torch.tensor([0, *torch.tensor(lens_q).cumsum(0).tolist()], dtype=torch.int32,
                      device="cuda")
    q = torch.randn(int(cu[-1]), h, d, device="cuda", dtype=torch.bfloat16)
    out, lse = cutetma.attention_with_kvcache(q, k_cache, v_cache, lens, table, causal=causal,
                                              return_lse=True, load=load,
                                              num_splits=num_splits, cu_seqlens_q=cu,
                                              max_seqlen_q=max(lens_q))
    torch.cuda.synchronize()
    assert out.shape == q.shape and lse.shape == (h, q.shape[0])
    assert not out.isnan().any(), "NaN in the output"
    for i in range(b):
        rows = slice(int(cu[i]), int(cu[i + 1]))
        if rows.start == rows.stop:
            continue
        k, v = gathered(k_cache, v_cache, table, lens, i)
        ref, ref_lse = attention_ref(q[rows][None], k, v, causal)
        bound = 0.0
        if k.shape[1]:
            same = _same_dtype(q[rows][None], k, v, causal).float()
            bound = (2 * (same - ref).abs().max().item()
                     + (ref.bfloat16().float() - ref).abs().max().item() + 1e-5)
        err = (out[rows][None].float() - ref).abs().max().item()
        assert err <= bound, f"sequence {i}: error {err:.3g} > {bound:.3g}"
        finite = ref_lse[0].isfinite()
        assert (lse[:, rows].isfinite() == finite).all()
        if finite.any():
            assert (lse[:, rows][finite] - ref_lse[0][finite]).abs().max().item() < 1e-3


@pytest.mark.parametrize("load,page_size", [("tma", 64), ("cp_async", 17)])
@pytest.mark.parametrize("causal", [False, True])
def test_varlen_chunked_prefill(load, page_size, causal):
    """Ragged new tokens per sequence (none, one, a few hundred: not packed) over ragged
    caches, GQA 8 / 2."""
    check_varlen([77, 0, 1, 300], [500, 40, 1, 1000], page_size, 8, 2, 128, causal, load)


@pytest.mark.parametrize("load,page_size", [("tma", 16), ("cp_async", 17)])
@pytest.mark.parametrize("num_splits", [None, 1, 4])
@pytest.mark.parametrize("causal", [False, True])
def test_varlen_decode_packed_and_split(load, page_size, num_splits, causal):
    """Ragged decode steps (1-5 new tokens: packed, split), a sequence without keys."""
    check_varlen([1, 5, 2, 3], [2000, 0, 700, 33], page_size, 32, 8, 128, causal, load,
                 num_splits)


def test_varlen_cuda_graph_capture():
    """Varlen decode captures (max_seqlen_q given: no host synchronisation)."""
    import torch

    import cutetma

    k, v, table, lens = make_cache(3, [500, 300, 90], 64, 2, 128, torch.bfloat16)
    cu = torch.tensor([0, 1, 3, 4], dtype=torch.int32, device="cuda")
    q = torch.randn(4, 8, 128, device="cuda", dtype=torch.bfloat16)

    def call():
        return cutetma.attention_with_kvcache(q, k, v, lens, table, cu_seqlens_q=cu,
                                              max_seqlen_q=2, causal=True)

    call()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = call()
    lens.copy_(torch.tensor([450, 250, 80], dtype=torch.int32))
    graph.replay()
    want = call()
    torch.cuda.synchronize()
    assert torch.equal(out, want)
