"""cutetma inside PyTorch: the custom ops' schemas (CPU), and on a Hopper GPU
``torch.library.opcheck``, ``torch.compile(fullgraph=True)`` of a small model that calls both
ops, CUDA-graph capture and replay of eager calls, and the per-problem plans that make an
eager call cheap (a plan is reused only where every fact it decided is the same)."""

import pytest
import torch

import cutetma
from cutetma import ops
from cutetma.reference import attention_ref, gemm_ref


def test_custom_op_schemas_take_optional_arguments():
    """``torch.ops.cutetma.gemm(a, b)`` and ``...attention(q, k, v)`` need nothing more."""
    gemm_schema = str(torch.ops.cutetma.gemm.default._schema)
    assert "bool trans_b=True" in gemm_schema and "ScalarType? out_dtype=None" in gemm_schema
    attn_schema = str(torch.ops.cutetma.attention.default._schema)
    assert "bool causal=False" in attn_schema and "float? softmax_scale=None" in attn_schema


def _rand(*shape, dtype=torch.bfloat16):
    return torch.randn(*shape, device="cuda", dtype=dtype)


@pytest.mark.gpu
def test_opcheck_gemm_and_attention():
    a, b = _rand(256, 128), _rand(192, 128)
    torch.library.opcheck(torch.ops.cutetma.gemm.default, (a, b),
                          {"trans_b": True, "load": "tma", "out_dtype": torch.float32},
                          test_utils=("test_schema", "test_faketensor"))
    q, k = _rand(1, 128, 4, 64), _rand(1, 128, 2, 64)
    torch.library.opcheck(torch.ops.cutetma.attention.default, (q, k, k),
                          {"causal": True}, test_utils=("test_schema", "test_faketensor"))


class _Block(torch.nn.Module):
    """A projection, attention over it, an output projection: both ops in one graph."""

    def __init__(self, d_model: int = 256, heads: int = 4):
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Parameter(torch.randn(3 * d_model, d_model, device="cuda",
                                                  dtype=torch.bfloat16) * d_model ** -0.5)
        self.proj = torch.nn.Parameter(torch.randn(d_model, d_model, device="cuda",
                                                   dtype=torch.bfloat16) * d_model ** -0.5)

    def forward(self, x):
        b, s, d = x.shape
        qkv = cutetma.gemm(x.reshape(b * s, d), self.qkv).reshape(b, s, 3, self.heads, -1)
        o = cutetma.attention(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], causal=True)
        return cutetma.gemm(o.reshape(b * s, d), self.proj).reshape(b, s, d)


@pytest.mark.gpu
def test_torch_compile_fullgraph_matches_eager():
    torch.manual_seed(0)
    block = _Block()
    x = _rand(2, 128, 256)
    with torch.no_grad():
        eager = block(x)
        compiled = torch.compile(block, fullgraph=True)(x)
    assert torch.isfinite(compiled).all()
    assert torch.equal(compiled, eager)  # the same kernels on the same inputs


@pytest.mark.gpu
def test_graph_capture_replays_planned_calls():
    a, b = _rand(512, 256), _rand(384, 256)
    q, k = _rand(2, 256, 4, 128), _rand(2, 256, 4, 128)
    cutetma.gemm(a, b)
    cutetma.attention(q, k, k)  # plans made (and the tile order placed) before capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        c = cutetma.gemm(a, b)
        o = cutetma.attention(q, k, k)
    a.copy_(_rand(512, 256))
    graph.replay()
    torch.cuda.synchronize()
    ref = gemm_ref(a, b)
    assert (c.float() - ref).abs().max() <= 0.05 * ref.abs().max()
    o_ref, _ = attention_ref(q, k, k)
    assert (o.float() - o_ref).abs().max() < 2e-2


@pytest.mark.gpu
def test_plans_are_reused_only_for_the_same_problem():
    ops.clear_plans()
    a, b = _rand(256, 64), _rand(128, 64)
    cutetma.gemm(a, b)
    cutetma.gemm(_rand(256, 64), _rand(128, 64))
    assert ops.plan_counts()["gemm"] == 1
    # another alignment (a view 8 bytes in), another dtype, another shape: each its own plan
    off = torch.empty(256 * 64 + 4, device="cuda", dtype=torch.bfloat16)[4:].view(256, 64)
    off.copy_(a)
    c_off = cutetma.gemm(off, b)
    cutetma.gemm(a.half(), b.half())
    cutetma.gemm(_rand(320, 64), b)
    assert ops.plan_counts()["gemm"] == 4
    ref = gemm_ref(a, b)
    assert (c_off.float() - ref).abs().max() <= 0.05 * ref.abs().max()
    torch.use_deterministic_algorithms(True)
    try:
        cutetma.gemm(a, b)  # the mode is part of the key: a plan of its own
    finally:
        torch.use_deterministic_algorithms(False)
    assert ops.plan_counts()["gemm"] == 5
