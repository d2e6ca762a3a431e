"""The online softmax of one consumer warpgroup: a thread's two rows (r and r + 8 of its
WGMMA accumulator) per key block, in fp32 with exp2 (``scale * log2 e`` folded in)."""

from __future__ import annotations

from cutetma import dsl

cutlass, cute = dsl.cutlass()


def pairwise(values, combine):
    """``combine`` over ``values`` as a balanced tree (traced: a plain Python function, so the
    loop unrolls). A row's max and sum of exps as one left-to-right chain are 32 dependent
    instructions at d = 128 (ptxas does not reassociate them), which the softmax of one warp
    waits out at the start of every block; as a tree the same 31 instructions are 5 deep."""
    while len(values) > 1:
        values = [combine(values[i], values[i + 1]) if i + 1 < len(values) else values[i]
                  for i in range(0, len(values), 2)]
    return values[0]


@cute.jit
def online_softmax(acc_s, correction, row_max, row_sum, scale_log2):
    """Update the running max and sum of this thread's two rows, S -> P in place, and
    leave in ``correction`` the factor O must be rescaled by (``rescale``): the caller
    decides when, so the rescale can wait for an in-flight P V to finish."""
    for r in cutlass.range_constexpr(2):
        row = [i for i in range(cute.size(acc_s)) if (i // 2) % 2 == r]
        new_max = cute.arch.fmax(row_max[r], pairwise([acc_s[i] for i in row],
                                                      cute.arch.fmax))
        new_max = cute.arch.warp_reduction_max(new_max, threads_in_group=4)
        # a fully masked row keeps max -inf: use 0 so exp2 gives 0, not NaN
        safe_max = new_max
        if new_max == -cutlass.Float32.inf:
            safe_max = 0.0
        corr = cute.math.exp2((row_max[r] - safe_max) * scale_log2, fastmath=True)
        if row_max[r] == -cutlass.Float32.inf:
            corr = 0.0
        correction[r] = corr
        row_max[r] = new_max
        max_scaled = safe_max * scale_log2
        for i in row:
            acc_s[i] = cute.math.exp2(acc_s[i] * scale_log2 - max_scaled, fastmath=True)
        block_sum = pairwise([acc_s[i] for i in row], lambda a, b: a + b)
        row_sum[r] = row_sum[r] * corr + block_sum  # per thread; reduced at the end


@cute.jit
def rescale(acc_o, correction):
    """O *= the correction of its row (accumulator value i is row r + 8 ((i // 2) % 2))."""
    for i in cutlass.range_constexpr(cute.size(acc_o)):
        acc_o[i] = acc_o[i] * correction[(i // 2) % 2]
