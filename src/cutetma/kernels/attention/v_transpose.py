"""``VTranspose``: V^T for the FP8 attention kernel, one small kernel before it.

In: V (b, s_k, h_kv, d), one-byte values, rows of d bytes (any strides). Out: V^T (b, h_kv,
d, keys padded to whole key blocks), keys contiguous, each 32-key chunk's columns in
``fp8_operands.KEY_ORDER``, zeros past s_k (``fp8_operands.transpose_v`` is the same in
torch, and this kernel's reference). One CTA of d threads per (32-key chunk, K/V head,
batch); thread j owns column j: it reads its byte of each of the chunk's 32 key rows (the
warp's 32 threads read 32 neighbouring bytes of one row: whole sectors) in the slot order,
and writes the chunk's 32 bytes of V^T's row j as two 16-byte stores. (torch's permuted copy
moves one-byte values at about 0.4 TB/s: 0.18 ms a call at 16k tokens x 1024 columns, more
than the FP8 kernel saves over bf16.)
"""

from __future__ import annotations

from cutetma import dsl
from cutetma.kernels.attention.fp8_operands import CHUNK, KEY_ORDER

cutlass, cute = dsl.cutlass()
from cuda.bindings import driver as cuda  # noqa: E402


class VTranspose:
    def __init__(self, head_dim: int):
        self.head_dim = head_dim

    @cute.jit
    def from_pointers(self, pV: cute.Pointer, pVt: cute.Pointer, batch: cutlass.Int32,
                      seqlen_k: cutlass.Int32, heads_kv: cutlass.Int32, padded: cutlass.Int32,
                      v_s: cutlass.Int64, v_h: cutlass.Int64, v_b: cutlass.Int64,
                      stream: cuda.CUstream):
        """``pV``: V with (seq, head, batch) strides ``v_s, v_h, v_b`` (the column's is 1);
        ``pVt``: V^T, (b, h_kv, d, ``padded``) contiguous, ``padded`` a multiple of 32."""
        d = self.head_dim
        v = cute.make_tensor(pV, cute.make_layout((d, seqlen_k, heads_kv, batch),
                                                  stride=(1, v_s, v_h, v_b)))
        row = cute.assume(cutlass.Int64(padded), divby=CHUNK)
        vt = cute.make_tensor(pVt, cute.make_layout(
            (padded, d, heads_kv, batch),
            stride=(1, row, row * d, row * d * cutlass.Int64(heads_kv))))
        self.kernel(v, vt).launch(grid=(padded // CHUNK, heads_kv, batch), block=(d, 1, 1),
                                  stream=stream)

    @cute.kernel
    def kernel(self, mV: cute.Tensor, mVt: cute.Tensor):
        chunk, head, batch = cute.arch.block_idx()
        column, _, _ = cute.arch.thread_idx()
        seqlen_k = mV.shape[1]
        values = cute.make_rmem_tensor((CHUNK,), mV.element_type)
        for slot in cutlass.range_constexpr(CHUNK):
            key = chunk * CHUNK + KEY_ORDER[slot]
            # the load is unconditional (a clamped row): a load under a branch waits for
            # its own value before the next one issues
            values[slot] = mV[column, cutlass.min(key, seqlen_k - 1), head, batch]
            if key >= seqlen_k:
                values[slot] = mV.element_type(0)
        cute.autovec_copy(values, cute.local_tile(mVt[(None, column, head, batch)], (CHUNK,),
                                                  (chunk,)))
