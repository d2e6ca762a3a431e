"""FP8 attention's operand orders on the CPU (``kernels.attention.fp8_operands``): the key
permutation that lets P's e4m3 A fragment be read where the fp32 accumulator left it,
checked against CuTe's partitions of both tiled MMAs for every thread, and V^T built in the
same order, so that the permuted product is the plain one."""

import pytest

from cutetma.kernels.attention import fp8_operands as ops


def test_key_order_is_a_permutation_of_each_chunk():
    assert sorted(ops.KEY_ORDER) == list(range(ops.CHUNK))
    # FlashAttention-3's: A slots 4c .. 4c+3 hold keys 2c, 2c+1, 2c+8, 2c+9
    assert ops.KEY_ORDER[:8] == (0, 1, 8, 9, 2, 3, 10, 11)
    assert ops.KEY_ORDER[16:20] == (16, 17, 24, 25)


def _orders(block_n):
    from cutetma import dsl

    cutlass, cute = dsl.cutlass()
    import cutlass.utils.hopper_helpers as sm90
    from cutlass.cute.nvgpu import warpgroup

    found = []

    @cute.jit
    def trace():
        f8, k_major = cutlass.Float8E4M3FN, cute.nvgpu.OperandMajorMode.K
        qk = sm90.make_trivial_tiled_mma(f8, f8, k_major, k_major, cutlass.Float32, (1, 1, 1),
                                         tiler_mn=(64, block_n))
        pv = sm90.make_trivial_tiled_mma(f8, f8, k_major, k_major, cutlass.Float32, (1, 1, 1),
                                         tiler_mn=(64, 128),
                                         a_source=warpgroup.OperandSource.RMEM)
        found.append(ops.p_from_accumulator(qk, pv, 64, block_n))

    trace()
    return found[0]


@pytest.mark.parametrize("block_n", [128, 192])
def test_p_fragment_reads_the_accumulator_in_place(block_n):
    """Every one of the 128 threads finds each A value among its own accumulator values
    under the key order, with one index list for all (the kernel's conversion is then a
    trace-time reordering inside each thread, no shuffles)."""
    order = _orders(block_n)
    assert sorted(order) == list(range(block_n // 2))
    first = [0, 1, 4, 5, 2, 3, 6, 7, 8, 9, 12, 13, 10, 11, 14, 15]
    assert order[:16] == first
    assert order[16:32] == [i + 16 for i in first]


def test_transposed_v_in_key_order_keeps_the_product():
    """P V with P's columns renamed by the key order and V^T stored in it equals P V; keys
    past s_k are zeros in V^T; e4m3 stays e4m3."""
    import torch

    b, s_k, h_kv, d, block_n = 2, 100, 3, 16, 64
    v = torch.randn(b, s_k, h_kv, d, dtype=torch.float64)
    p = torch.randn(b, h_kv, 5, s_k, dtype=torch.float64)
    vt = ops.transpose_v(v, block_n)
    assert vt.shape == (b, h_kv, d, 128)
    keys = torch.tensor([ops.key_of_slot(s) for s in range(128)])
    a = torch.zeros(b, h_kv, 5, 128, dtype=torch.float64)
    a[..., keys < s_k] = p[..., keys[keys < s_k]]  # A's slot s holds P's key key_of_slot(s)
    want = torch.einsum("bhqk,bkhd->bhqd", p, v)
    assert torch.allclose(a @ vt.transpose(-1, -2), want, rtol=0, atol=1e-12)
    assert vt[..., keys >= s_k].abs().sum() == 0
    assert ops.transpose_v(v.to(torch.float8_e4m3fn), block_n).dtype == torch.float8_e4m3fn
