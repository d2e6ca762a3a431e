"""The attention backward on the H200: dq, dk, dv against fp32 references of the same inputs,
with flash-attention's rule (our error at most twice that of torch computing in the inputs'
dtype, plus a small absolute term), both producers, odd lengths, s_q != s_k both ways,
GQA / MQA, causal and not; and autograd through ``cutetma.attention``."""

import pytest

pytestmark = pytest.mark.gpu


def inputs(b, s_q, s_k, h, h_kv, d, dtype, seed=0):
    import torch

    g = torch.Generator(device="cuda").manual_seed(seed)
    t = getattr(torch, dtype)

    def randn(*shape):
        return torch.randn(*shape, device="cuda", generator=g).to(t)

    return randn(b, s_q, h, d), randn(b, s_k, h_kv, d), randn(b, s_k, h_kv, d), \
        randn(b, s_q, h, d)


def check(b, s_q, s_k, h, h_kv, d, causal, load="tma", dtype="bfloat16", **fields):
    import torch

    import cutetma
    from cutetma.reference import attention_grads_ref

    q, k, v, dout = inputs(b, s_q, s_k, h, h_kv, d, dtype)
    out, lse = cutetma.attention(q, k, v, causal=causal, return_lse=True)
    config = None
    if fields:  # a BackwardConfig other than the default
        from cutetma.kernels.attention.config import BackwardConfig

        config = BackwardConfig(head_dim=d, causal=causal, load=load, **fields)
    grads = cutetma.attention_backward(dout, q, k, v, out, lse, causal=causal, load=load,
                                       config=config)
    torch.cuda.synchronize()
    ref = attention_grads_ref(dout, q, k, v, causal)
    low = attention_grads_ref(dout, q, k, v, causal, dtype=q.dtype)
    for name, ours, want, peer, x in zip(("dq", "dk", "dv"), grads, ref, low, (q, k, v),
                                         strict=True):
        assert ours.shape == x.shape and ours.dtype == x.dtype, name
        assert not ours.isnan().any(), f"{name} has NaN"
        err = (ours.float() - want).abs().max().item()
        peer_err = (peer - want).abs().max().item()
        bound = 2 * peer_err + 1e-3 * want.abs().max().item() + 1e-4
        assert err <= bound, f"{name}: error {err:.3g} > {bound:.3g} (torch {dtype}: " \
                             f"{peer_err:.3g})"


@pytest.mark.parametrize("load", ["tma", "cp_async"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [64, 128])
def test_square(d, causal, load):
    check(2, 512, 512, 4, 4, d, causal, load)


@pytest.mark.parametrize("s_q,s_k", [(333, 333), (100, 300), (300, 100), (1, 129), (77, 1)])
@pytest.mark.parametrize("causal", [False, True])
def test_odd_lengths(s_q, s_k, causal):
    """Tails in both lengths; bottom-right causal with fewer queries than keys and more
    (rows that see no key get zero gradients)."""
    check(1, s_q, s_k, 2, 2, 128, causal)


@pytest.mark.parametrize("load", ["tma", "cp_async"])
@pytest.mark.parametrize("s_q,s_k", [(512, 512), (333, 333), (1, 129), (300, 100)])
@pytest.mark.parametrize("causal", [False, True])
def test_128_query_blocks(s_q, s_k, causal, load):
    """The 128-query tile at d = 64: one block, tails, rows that see no key."""
    check(2, s_q, s_k, 2, 2, 64, causal, load, block_m=128)


@pytest.mark.parametrize("load", ["tma", "cp_async"])
@pytest.mark.parametrize("s_q,s_k,causal", [(512, 512, False), (333, 517, True)])
def test_dv_issued_early(s_q, s_k, causal, load):
    """``dv_issue="early"`` (dV under the dS math) against the reference, and against the
    default late dV on the same data: dK and dV the same bits (the same GEMMs, issued at
    another time)."""
    import torch

    import cutetma
    from cutetma.kernels.attention.config import BackwardConfig

    check(2, s_q, s_k, 2, 2, 128, causal, load, dv_issue="early")
    q, k, v, dout = inputs(2, s_q, s_k, 2, 2, 128, "bfloat16", seed=1)
    out, lse = cutetma.attention(q, k, v, causal=causal, return_lse=True)
    late, early = (cutetma.attention_backward(
        dout, q, k, v, out, lse, causal=causal, load=load, config=BackwardConfig(
            head_dim=128, causal=causal, load=load, dv_issue=when)) for when in ("late", "early"))
    assert torch.equal(late[1], early[1]) and torch.equal(late[2], early[2])


@pytest.mark.parametrize("h,h_kv", [(6, 2), (4, 1)])
@pytest.mark.parametrize("load", ["tma", "cp_async"])
def test_gqa(h, h_kv, load):
    check(2, 256, 384, h, h_kv, 128, True, load)


def test_fp16():
    check(1, 384, 384, 4, 2, 64, True, dtype="float16")


def test_autograd_through_attention():
    """loss.backward() through cutetma.attention gives the backward's gradients, the LSE's
    own gradient included when the LSE is used."""

    import cutetma
    from cutetma.reference import attention_ref

    q, k, v, dout = inputs(1, 200, 300, 4, 2, 128, "bfloat16", seed=1)
    leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
    out, lse = cutetma.attention(*leaves, causal=True, return_lse=True)
    ((out.float() * dout.float()).sum() + lse.sum()).backward()
    ref = [x.detach().float().requires_grad_(True) for x in (q, k, v)]
    out_ref, lse_ref = attention_ref(*ref, causal=True)
    ((out_ref * dout.float()).sum() + lse_ref.sum()).backward()
    for ours, want in zip(leaves, ref, strict=True):
        err = (ours.grad.float() - want.grad).abs().max().item()
        assert err <= 0.02 * want.grad.abs().max().item() + 1e-3, err


def test_torch_compile_and_opcheck():
    import torch

    import cutetma

    q, k, v, dout = inputs(1, 128, 128, 2, 2, 64, "bfloat16", seed=2)

    def loss(q, k, v):
        return (cutetma.attention(q, k, v, causal=True).float() * dout.float()).sum()

    leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
    torch.compile(loss, fullgraph=True)(*leaves).backward()
    eager = [x.clone().requires_grad_(True) for x in (q, k, v)]
    loss(*eager).backward()
    for a, b in zip(leaves, eager, strict=True):
        assert torch.equal(a.grad, b.grad)
    out, lse = cutetma.attention(q, k, v, causal=True, return_lse=True)
    torch.library.opcheck(torch.ops.cutetma.attention_backward.default,
                          (dout, q, k, v, out, lse, None, True, None, "tma"))


@pytest.mark.parametrize("load", ["tma", "cp_async"])
@pytest.mark.parametrize("s_q,s_k", [(512, 512), (333, 333), (100, 300), (300, 100), (1, 65)])
@pytest.mark.parametrize("causal", [False, True])
def test_d256(s_q, s_k, causal, load):
    """d = 256 (``BackwardConfig.splits_d``: 64-key CTAs whose warpgroups split d, P^T and
    dS^T through shared memory, dQ added by atomics): tails, s_q != s_k both ways."""
    check(1, s_q, s_k, 2, 2, 256, causal, load, block_n=64)


@pytest.mark.parametrize("dtype,h,h_kv", [("bfloat16", 4, 2), ("float16", 2, 2)])
def test_d256_gqa_and_fp16(dtype, h, h_kv):
    """d = 256 under GQA (dK / dV in fp32 from the registers, summed by the host) and fp16."""
    check(2, 256, 384, h, h_kv, 256, True, dtype=dtype, block_n=64)


@pytest.mark.parametrize("d", [64, 128, 256])
def test_deterministic_mode_repeats_its_bits(d):
    """Under torch.use_deterministic_algorithms the key blocks add into dQ in order: two runs
    give the same bits (and the gradients stay right); at d = 256 the adds are atomics."""
    import torch

    import cutetma
    from cutetma.kernels.attention.config import BackwardConfig

    q, k, v, dout = inputs(2, 700, 900, 4, 2, d, "bfloat16", seed=3)
    out, lse = cutetma.attention(q, k, v, causal=True, return_lse=True)
    config = BackwardConfig(head_dim=d, causal=True) if d == 256 else None
    torch.use_deterministic_algorithms(True)
    try:
        first = cutetma.attention_backward(dout, q, k, v, out, lse, causal=True, config=config)
        second = cutetma.attention_backward(dout, q, k, v, out, lse, causal=True,
                                            config=config)
    finally:
        torch.use_deterministic_algorithms(False)
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a, b)
    loose = cutetma.attention_backward(dout, q, k, v, out, lse, causal=True, config=config)
    for a, b in zip(first, loose, strict=True):
        assert (a.float() - b.float()).abs().max() <= 0.01 * b.float().abs().max()


@pytest.mark.parametrize("d,block_m", [(64, 64), (128, 64), (256, 64), (64, 128)])
def test_dq_postprocess_is_its_reference(d, block_m):
    """The dQ conversion kernel (``DqPostprocess``) puts a random fragment-ordered
    accumulator where ``dq_from_fragments`` (torch, checked against CuTe's partition on the
    CPU) does, scaled, every row below s_q written (the output starts as torch.empty)."""
    import torch

    from cutetma.backward import _dq_postprocess, dq_from_fragments

    b, s_q, h = 2, 333, 3
    acc = torch.randn(b * h * -(-s_q // block_m) * block_m * d, device="cuda")
    q = torch.empty(b, s_q, h, d, device="cuda", dtype=torch.bfloat16)
    ours = _dq_postprocess(acc, q, 0.3, block_m)
    want = dq_from_fragments(acc, b, s_q, h, d, torch.bfloat16, 0.3, block_m)
    torch.cuda.synchronize()
    assert not ours.isnan().any()
    assert torch.equal(ours, want)
