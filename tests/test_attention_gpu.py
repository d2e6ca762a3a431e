"""Attention forward on the H200 against the fp32 reference, flash-attention's rule: the
kernel's max error is at most twice torch's same-dtype error plus rounding; the LSE checked;
outputs poisoned first (the kernel writes into fresh tensors: NaN anywhere fails).
Every schedule of the consumers (serial, overlap, pingpong), both mechanisms, the custom op
on a side stream, and the errors raised before launch."""

import itertools

import pytest

pytestmark = pytest.mark.gpu

SEQLENS = [1, 2, 113, 128, 203, 1023, 1024, 4224]
HEADS = [(4, 4), (4, 2), (4, 1)]  # MHA, GQA, MQA


@pytest.fixture(autouse=True)
def _no_tf32():
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False


def _same_dtype(q, k, v, causal):
    """torch's attention in the inputs' dtype (the error baseline), bottom-right causal."""
    import torch

    b, s_q, h, d = q.shape
    s_k, h_kv = k.shape[1], k.shape[2]
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    kt = kt.repeat_interleave(h // h_kv, 1)
    vt = vt.repeat_interleave(h // h_kv, 1)
    mask = None
    if causal:
        i = torch.arange(s_q, device=q.device)[:, None]
        j = torch.arange(s_k, device=q.device)[None, :]
        mask = j <= i + s_k - s_q
    out = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask)
    return out.transpose(1, 2).nan_to_num(0.0)


def check(q, k, v, causal, load="tma", **config):
    """``config``: AttentionConfig fields other than the defaults (schedule, persistent)."""
    import cutetma
    from cutetma.kernels.attention import AttentionConfig
    from cutetma.reference import attention_ref

    if not config:
        out, lse = cutetma.attention(q, k, v, causal=causal, return_lse=True, load=load)
    else:
        cfg = AttentionConfig(head_dim=q.shape[-1], causal=causal, load=load, **config)
        out, lse = cutetma.attention(q, k, v, causal=causal, softmax_scale=q.shape[-1] ** -0.5,
                                     config=cfg, return_lse=True)
    ref, ref_lse = attention_ref(q, k, v, causal)
    same = _same_dtype(q, k, v, causal).float()
    assert not out.isnan().any(), "NaN in the output"
    rounding = (ref.to(out.dtype).float() - ref).abs().max().item()
    err = (out.float() - ref).abs().max().item()
    bound = 2 * (same - ref).abs().max().item() + rounding + 1e-5
    assert err <= bound, f"max error {err:.3g} > {bound:.3g}"
    finite = ref_lse.isfinite()
    assert (lse.isfinite() == finite).all()
    assert (lse[finite] - ref_lse[finite]).abs().max().item() < 1e-3


@pytest.mark.parametrize("load", ["tma", "cp_async"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_grid(load, dtype, head_dim, causal):
    import torch

    t = getattr(torch, dtype)
    pairs = [(s, s) for s in SEQLENS] + [(113, 203), (203, 113), (1, 1024), (1024, 1)]
    for (s_q, s_k), (h, h_kv) in itertools.product(pairs, HEADS[:1]):
        q = torch.randn(2, s_q, h, head_dim, device="cuda", dtype=t)
        k = torch.randn(2, s_k, h_kv, head_dim, device="cuda", dtype=t)
        v = torch.randn(2, s_k, h_kv, head_dim, device="cuda", dtype=t)
        check(q, k, v, causal, load)


@pytest.mark.parametrize("heads", HEADS, ids=["mha", "gqa", "mqa"])
@pytest.mark.parametrize("causal", [False, True])
def test_gqa_mqa(heads, causal):
    import torch

    h, h_kv = heads
    q = torch.randn(2, 1023, h, 128, device="cuda", dtype=torch.float16)
    k = torch.randn(2, 1024, h_kv, 128, device="cuda", dtype=torch.float16)
    v = torch.randn(2, 1024, h_kv, 128, device="cuda", dtype=torch.float16)
    check(q, k, v, causal)


@pytest.mark.parametrize("schedule", ["serial", "overlap", "pingpong"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_every_schedule(schedule, causal, head_dim):
    """Every schedule, whichever is the default (serial: the experimental ablation that
    tutorial 08 compares with the others): with two consumer
    warpgroups (d = 128) and three (d = 64, block_m = 192: pingpong's turn goes round
    three). 16 heads: at s = 1023 the 132 CTAs walk two tiles or more each, so pingpong's
    turn is passed on from one tile to the next."""
    import torch

    for s_q, s_k in [(1, 1), (113, 203), (1023, 1023), (203, 113)]:
        q = torch.randn(2, s_q, 16, head_dim, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(2, s_k, 16, head_dim, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(2, s_k, 16, head_dim, device="cuda", dtype=torch.bfloat16)
        blocks = dict(block_m=192, block_n=96) if head_dim == 64 else {}
        check(q, k, v, causal, schedule=schedule, **blocks)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_other_pv_wait(head_dim, causal):
    """The default schedule with the wait for P V on the other side of the softmax
    (``PV_WAIT``: the late wait releases V one iteration later, and the loop's last P V is
    waited for after it). 16 heads: several tiles per CTA."""
    import torch

    from cutetma.kernels.attention import PV_WAIT

    other = {"early": "late", "late": "early"}[PV_WAIT[head_dim]]
    for s_q, s_k in [(1, 1), (113, 203), (1023, 1023), (203, 113)]:
        q = torch.randn(2, s_q, 16, head_dim, device="cuda", dtype=torch.float16)
        k = torch.randn(2, s_k, 16, head_dim, device="cuda", dtype=torch.float16)
        v = torch.randn(2, s_k, 16, head_dim, device="cuda", dtype=torch.float16)
        check(q, k, v, causal, pv_wait=other)


@pytest.mark.parametrize("blocks", [(64, 192, 96), (256, 128, 64), (256, 128, 80)])
@pytest.mark.parametrize("causal", [False, True])
def test_benchmarked_block_shapes(blocks, causal):
    """The block shapes the benchmark measures the defaults against (ALT_BLOCKS)."""
    import torch

    head_dim, block_m, block_n = blocks
    for s_q, s_k in [(113, 203), (1023, 1023), (203, 113)]:
        q = torch.randn(2, s_q, 4, head_dim, device="cuda", dtype=torch.float16)
        k = torch.randn(2, s_k, 4, head_dim, device="cuda", dtype=torch.float16)
        v = torch.randn(2, s_k, 4, head_dim, device="cuda", dtype=torch.float16)
        check(q, k, v, causal, block_m=block_m, block_n=block_n)


@pytest.mark.parametrize("load", ["tma", "cp_async"])
@pytest.mark.parametrize("causal", [False, True])
def test_persistent_walk(load, causal):
    """Many tiles per CTA (one CTA per SM walks 16 x 16 x 4 = 1024 tiles; causal gives them
    different key counts), and the one-CTA-per-tile grid (experimental) on the same inputs."""
    import torch

    q = torch.randn(4, 2001, 16, 64, device="cuda", dtype=torch.float16)
    k = torch.randn(4, 1900, 4, 64, device="cuda", dtype=torch.float16)
    v = torch.randn(4, 1900, 4, 64, device="cuda", dtype=torch.float16)
    check(q, k, v, causal, load)
    check(q, k, v, causal, load, persistent=False)


@pytest.mark.parametrize("load", ["tma", "cp_async"])
@pytest.mark.parametrize("causal", [False, True])
def test_two_q_buffers(load, causal):
    """q_stages=2: tiles alternate between the Q buffers (many tiles per CTA, odd lengths,
    GQA), against the reference, and with one CTA per tile."""
    import torch

    q = torch.randn(4, 2001, 16, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(4, 1900, 4, 128, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(4, 1900, 4, 128, device="cuda", dtype=torch.bfloat16)
    check(q, k, v, causal, load, q_stages=2)
    check(q[:, :203], k[:, :113], v[:, :113], causal, load, q_stages=2, persistent=False)


def test_custom_op_and_stream():
    import torch

    from cutetma.reference import attention_ref

    q = torch.randn(1, 300, 2, 64, device="cuda", dtype=torch.float16)
    k = torch.randn(1, 300, 2, 64, device="cuda", dtype=torch.float16)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        out, lse = torch.ops.cutetma.attention(q, k, k, True, 0.1, "tma")
    side.synchronize()
    ref, ref_lse = attention_ref(q, k, k, True, softmax_scale=0.1)
    assert (out.float() - ref).abs().max().item() < 2e-2
    assert (lse - ref_lse).abs().max().item() < 1e-3


def test_strided_inputs_are_correct():
    """Non-contiguous views (q sliced from a packed qkv tensor, as models do) run as is."""
    import torch

    qkv = torch.randn(2, 257, 3, 4, 64, device="cuda", dtype=torch.float16)
    q, k, v = qkv.unbind(2)
    check(q, k, v, True)


def test_errors_before_launch():
    import torch

    from cutetma import ops
    from cutetma.kernels.attention import AttentionConfig

    def t(*shape, dtype=torch.float16):
        return torch.randn(*shape, device="cuda", dtype=dtype)

    with pytest.raises(ValueError, match="head_dim 96"):
        ops.attention(t(1, 8, 2, 96), t(1, 8, 2, 96), t(1, 8, 2, 96))
    with pytest.raises(ValueError, match="not a multiple"):
        ops.attention(t(1, 8, 3, 64), t(1, 8, 2, 64), t(1, 8, 2, 64))
    with pytest.raises(TypeError, match="share one dtype"):
        ops.attention(t(1, 8, 2, 64), t(1, 8, 2, 64, dtype=torch.bfloat16), t(1, 8, 2, 64))
    with pytest.raises(ValueError, match="alike"):
        ops.attention(t(1, 8, 2, 64), t(1, 9, 2, 64), t(1, 8, 2, 64))
    with pytest.raises(ValueError, match="load"):
        ops.attention(t(1, 8, 2, 64), t(1, 8, 2, 64), t(1, 8, 2, 64), load="bulk")
    with pytest.raises(ValueError, match="config is for"):
        ops.attention(t(1, 8, 2, 64), t(1, 8, 2, 64), t(1, 8, 2, 64),
                      config=AttentionConfig(head_dim=64, causal=True))
