"""FP8 attention on the H200 (``cutetma.attention_fp8``): against the fp32 reference of the
dequantised inputs, both producers, odd lengths, GQA, causal and not, d 64 / 128 / 256.

The error budget (flash-attention's rule): P is rounded to e4m3 before P V (3 mantissa
bits), which costs about 2% of the output's mean magnitude on these inputs, so the yardstick is
torch's result at that precision (``attention_ref(..., p_dtype=e4m3)``: P rounded after the
final row max, where the kernel rounds after a running one). The kernel's error against the
fp32 reference stays within twice the yardstick's, mean and largest, plus bf16's rounding of
the output. A key order that did not match P's registers, or a V^T read out of order, puts
values under the wrong keys: errors of the output's own size, far outside it."""

import pytest

pytestmark = pytest.mark.gpu


def quantized(shape, seed):
    import torch

    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(*shape, device="cuda", generator=g)
    scale = (x.abs().amax() / 448.0).item()  # e4m3's largest finite value
    return (x / scale).to(torch.float8_e4m3fn), scale


def check(b, s_q, s_k, h, h_kv, d, causal, load="tma", v_transpose=""):
    import torch

    import cutetma
    from cutetma.fp8_attention import fp8_config

    (q8, sq), (k8, sk), (v8, sv) = (quantized(shape, i) for i, shape in enumerate(
        ((b, s_q, h, d), (b, s_k, h_kv, d), (b, s_k, h_kv, d))))
    config = fp8_config(d, causal, load, v_transpose=v_transpose) if v_transpose else None
    out, lse = cutetma.attention_fp8(q8, k8, v8, q_descale=sq, k_descale=sk, v_descale=sv,
                                     causal=causal, load=load, return_lse=True,
                                     config=config)
    torch.cuda.synchronize()
    assert_within_budget(out, lse, (q8.float() * sq, k8.float() * sk, v8.float() * sv),
                         causal)


def assert_within_budget(out, lse, dequantized, causal):
    """``out`` and ``lse`` against the fp32 reference of the dequantised inputs, within the
    module docstring's budget."""
    import torch

    from cutetma.reference import attention_ref

    ref, ref_lse = attention_ref(*dequantized, causal)
    same_dtype, _ = attention_ref(*dequantized, causal, p_dtype=torch.float8_e4m3fn)
    assert out.dtype == torch.bfloat16 and out.shape == ref.shape
    assert not out.isnan().any()
    err = (out.float() - ref).abs()
    budget = (same_dtype - ref).abs()
    bf16_ulp = 2.0 ** -8 * ref.abs()
    assert err.max() <= 2 * budget.max() + bf16_ulp.max(), (err.max(), budget.max())
    assert err.mean() <= 2 * budget.mean() + bf16_ulp.mean(), (err.mean(), budget.mean())
    # the LSE follows the row's largest score, which FP8 WGMMA accumulates with a relative
    # error of order 1e-4 (its reduced-precision accumulation: the promotion question of the
    # scaled GEMM), so the bound grows with the scores' magnitude
    finite = ref_lse.isfinite()
    assert torch.allclose(lse[finite], ref_lse[finite], atol=2e-2, rtol=1e-3)


@pytest.mark.parametrize("load", ["tma", "cp_async"])
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_square(d, causal, load):
    check(2, 512, 512, 4, 4, d, causal, load)


@pytest.mark.parametrize("s_q,s_k", [(333, 333), (100, 300), (1, 129), (77, 1)])
def test_odd_lengths(s_q, s_k):
    check(1, s_q, s_k, 4, 2, 128, True)


@pytest.mark.parametrize("load", ["tma", "cp_async"])
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_v_transposed_in_shared_memory(d, causal, load):
    """V read as stored and transposed by the producer warpgroup (``v_transpose="smem"``):
    odd lengths (a last block of 45 keys), GQA, both producers, every head dim; and the
    same bits as V^T made before the call (the same sums in the same order)."""
    import torch

    import cutetma
    from cutetma.fp8_attention import fp8_config

    check(2, 333, 301, 8, 2, d, causal, load, v_transpose="smem")
    (q8, sq), (k8, sk), (v8, sv) = (quantized(shape, i) for i, shape in enumerate(
        ((1, 700, 4, d), (1, 700, 4, d), (1, 700, 4, d))))
    outs = [cutetma.attention_fp8(q8, k8, v8, q_descale=sq, k_descale=sk, v_descale=sv,
                                  causal=causal, config=fp8_config(d, causal, load,
                                                                   v_transpose=where))
            for where in ("smem", "global")]
    torch.cuda.synchronize()
    assert torch.equal(outs[0], outs[1])


def test_gqa():
    check(2, 256, 384, 8, 2, 128, False, "cp_async")


@pytest.mark.parametrize("s_k,block_n", [(1, 128), (333, 128), (4096, 128), (100, 64)])
def test_v_transpose_kernel_matches_torch(s_k, block_n):
    """``VTranspose`` (the GPU path of ``v_operand``) makes the same bytes as the torch
    reference ``transpose_v``, zeros past s_k included, from a strided V (a head slice)."""
    import torch

    from cutetma.fp8_attention import v_operand
    from cutetma.kernels.attention.fp8_operands import transpose_v

    for d in (64, 128, 256):
        full = torch.randn(2, s_k, 6, d, device="cuda").to(torch.float8_e4m3fn)
        v = full[:, :, 1:4]  # (seq, head, batch) strides of the whole tensor
        got = v_operand(v, block_n)
        torch.cuda.synchronize()
        want = transpose_v(v, block_n)
        assert got.shape == want.shape and got.stride(3) == 1
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))


@pytest.mark.parametrize("load", ["tma", "cp_async"])
def test_descales_per_batch_and_kv_head(load):
    """Descales per (batch, K/V head), FlashAttention-3's convention: every (batch, K/V
    head) slice of Q, K and V quantised with its own scale, the scales spread over 2^-6 ..
    2^6, so a descale read for another slice (or another slice's query heads) is off by
    orders of magnitude (and the scores reach thousands). One-element tensors and floats
    mix with them."""
    import torch

    import cutetma

    b, s_q, s_k, h, h_kv, d = 3, 200, 333, 8, 2, 128
    g = torch.Generator(device="cuda").manual_seed(7)

    def per_slice(heads):  # (b, s, heads, d) quantised per (batch, heads // group) slice
        spread = 2.0 ** torch.randint(-6, 7, (b, 1, h_kv, 1, 1), device="cuda", generator=g)
        s = s_q if heads == h else s_k
        x = torch.randn(b, s, h_kv, heads // h_kv, d, device="cuda", generator=g) * spread
        scale = x.abs().amax(dim=(1, 3, 4), keepdim=True) / 448.0
        x8 = (x / scale).to(torch.float8_e4m3fn)
        dq = (x8.float() * scale).reshape(b, s, heads, d)
        return x8.reshape(b, s, heads, d), scale.reshape(b, h_kv), dq

    (q8, sq, dq_q), (k8, sk, dq_k), (v8, sv, dq_v) = (per_slice(n) for n in (h, h_kv, h_kv))
    for causal in (False, True):
        out, lse = cutetma.attention_fp8(q8, k8, v8, q_descale=sq, k_descale=sk,
                                         v_descale=sv, causal=causal, load=load,
                                         return_lse=True)
        torch.cuda.synchronize()
        assert_within_budget(out, lse, (dq_q, dq_k, dq_v), causal)
    # a per-tensor K descale as a one-element tensor, V's as a float, beside Q's per slice
    out = cutetma.attention_fp8(q8, k8, v8, q_descale=sq, k_descale=torch.tensor(
        [0.5], device="cuda"), v_descale=2.0, load=load)
    ref = cutetma.attention_fp8(q8, k8, v8, q_descale=sq * 0.5, k_descale=1.0,
                                v_descale=torch.full((b, h_kv), 2.0, device="cuda"), load=load)
    torch.cuda.synchronize()
    assert torch.equal(out, ref)
