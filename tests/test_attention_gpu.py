"""Attention forward on the H200 against the fp32 reference, flash-attention's rule: the
kernel's max error is at most twice torch's same-dtype error plus rounding; the LSE checked;
outputs poisoned first (the kernel writes into fresh tensors: NaN anywhere fails).

Not yet run on a GPU (issue 5): the entry point needs CUTETMA_EXPERIMENTAL_ATTENTION=1,
which these tests set."""

import itertools

import pytest

pytestmark = pytest.mark.gpu

SEQLENS = [1, 2, 113, 128, 203, 1023, 1024, 4224]
HEADS = [(4, 4), (4, 2), (4, 1)]  # MHA, GQA, MQA


@pytest.fixture(autouse=True)
def _enable(monkeypatch):
    import torch

    monkeypatch.setenv("CUTETMA_EXPERIMENTAL_ATTENTION", "1")
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


def check(q, k, v, causal, load="tma"):
    from cutetma import ops
    from cutetma.kernels.attention_sm90 import attention_ref

    out, lse = ops.attention(q, k, v, causal=causal, return_lse=True, load=load)
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
