"""``SplitCombine``: split_kv's merge, one small kernel after the paged forward.

Each split of a sequence's keys leaves an fp32 partial output o_s (normalised over its own
keys) and its log-sum-exp lse_s. The merge is out = sum_s e^(lse_s - lse) o_s with
lse = log sum_s e^(lse_s): one warp per (head, query, sequence). Lane l reads the LSEs of
splits l and l + 32 (at most ``MAX_SPLITS``), two warp reductions give the max and the sum
of weights, and every lane then owns d / 32 contiguous columns, which it accumulates over
the splits with each split's weight taken from the lane that read it (a shuffle). A split
with no keys has lse -inf and weight 0; a row with no keys at all gets out 0, lse -inf.
(Written with torch's reductions the merge was ten kernels, tens of microseconds: more
than the attention itself at b = 1.)
"""

from __future__ import annotations

from cutetma import dsl
from cutetma.kernels.attention.config import LOG2_E

cutlass, cute = dsl.cutlass()
from cuda.bindings import driver as cuda  # noqa: E402

MAX_SPLITS = 64  # two LSEs per lane


class SplitCombine:
    def __init__(self, head_dim: int):
        self.head_dim = head_dim

    @cute.jit
    def from_pointers(self, pOp: cute.Pointer, pLp: cute.Pointer, pO: cute.Pointer,
                      pL: cute.Pointer, batch: cutlass.Int32, seqlen_q: cutlass.Int32,
                      heads: cutlass.Int32, splits: cutlass.Int32, o_s: cutlass.Int64,
                      o_h: cutlass.Int64, o_b: cutlass.Int64, stream: cuda.CUstream):
        """The partials: O (splits b, s_q, h, d) and LSE (splits b, h, s_q), contiguous fp32;
        ``pO``: the output (b, s_q, h, d) with (seq, head, batch) strides ``o_s, o_h, o_b``
        (d contiguous, 16-byte aligned), ``pL``: the LSE (b, h, s_q), contiguous fp32."""
        d = self.head_dim
        # one (sequence, query) of the partial, a sequence, a split: whole 16-byte vectors
        # (d is), declared so, for vector loads
        row = cute.assume(cutlass.Int64(heads) * d, divby=4)
        per_batch = cute.assume(cutlass.Int64(seqlen_q) * row, divby=4)
        per_split = cute.assume(cutlass.Int64(batch) * per_batch, divby=4)
        mOp = cute.make_tensor(pOp, cute.make_layout(
            (d, heads, seqlen_q, batch, splits), stride=(1, d, row, per_batch, per_split)))
        lse_batch = cutlass.Int64(heads) * seqlen_q
        mLp = cute.make_tensor(pLp, cute.make_layout(
            (heads, seqlen_q, batch, splits),
            stride=(seqlen_q, 1, lse_batch, lse_batch * batch)))
        o_s, o_h, o_b = (cute.assume(x, divby=16 // (pO.dtype.width // 8))
                         for x in (o_s, o_h, o_b))
        mO = cute.make_tensor(pO, cute.make_layout((d, heads, seqlen_q, batch),
                                                   stride=(1, o_h, o_s, o_b)))
        mL = cute.make_tensor(pL, cute.make_layout((heads, seqlen_q, batch),
                                                   stride=(seqlen_q, 1, lse_batch)))
        # launched as the forward's programmatic dependent: its CTAs are scheduled while the
        # forward still runs and wait for its end (griddepcontrol.wait) before the first read
        self.kernel(mOp, mLp, mO, mL, splits).launch(
            grid=(heads, seqlen_q, batch), block=(32, 1, 1), stream=stream, use_pdl=True)

    @cute.kernel
    def kernel(self, mOp: cute.Tensor, mLp: cute.Tensor, mO: cute.Tensor, mL: cute.Tensor,
               splits: cutlass.Int32):
        cute.arch.griddepcontrol_wait()  # the forward's partials are all written
        head, query, sequence = cute.arch.block_idx()
        lane = cute.arch.lane_idx()
        vec = self.head_dim // 32
        # this lane's two splits' LSEs (-inf past the splits), in log2 units
        mine = cute.make_rmem_tensor((2,), cutlass.Float32)
        for i in cutlass.range_constexpr(2):
            mine[i] = -cutlass.Float32.inf
            if lane + 32 * i < splits:
                mine[i] = mLp[head, query, sequence, lane + 32 * i] * LOG2_E
        top = cute.arch.warp_reduction_max(cutlass.max(mine[0], mine[1]))
        weight = cute.make_rmem_tensor((2,), cutlass.Float32)
        for i in cutlass.range_constexpr(2):
            weight[i] = 0.0
            if top != -cutlass.Float32.inf and mine[i] != -cutlass.Float32.inf:
                weight[i] = cute.math.exp2(mine[i] - top, fastmath=True)
        total = cute.arch.warp_reduction_sum(weight[0] + weight[1])
        acc = cute.make_rmem_tensor((vec,), cutlass.Float32)
        acc.fill(0.0)
        part = cute.make_rmem_tensor((vec,), cutlass.Float32)
        for split in cutlass.range(splits, unroll=8):  # eight partial reads in flight
            w = cute.arch.shuffle_sync(cutlass.select_(split < 32, weight[0], weight[1]),
                                       split % 32)
            if w > 0.0:  # an empty split's partial is zeros: skip its read
                cute.autovec_copy(cute.local_tile(mOp[(None, head, query, sequence, split)],
                                                  (vec,), (lane,)), part)
                for c in cutlass.range_constexpr(vec):
                    acc[c] = acc[c] + w * part[c]
        inv = 0.0
        if total > 0.0:
            inv = cute.arch.rcp_approx(total)
        out = cute.make_rmem_tensor((vec,), mO.element_type)
        for c in cutlass.range_constexpr(vec):
            out[c] = (acc[c] * inv).to(mO.element_type)
        cute.autovec_copy(out, cute.local_tile(mO[(None, head, query, sequence)], (vec,),
                                               (lane,)))
        if lane == 0:
            lse = -cutlass.Float32.inf
            if total > 0.0:
                lse = (top + cute.math.log2(total, fastmath=True)) / LOG2_E
            mL[head, query, sequence] = lse
