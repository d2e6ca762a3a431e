"""The epilogue of a consumer warpgroup: O /= rowsum and LSE = max * scale + ln(rowsum), O
leaving by 16-byte stores from registers after a quad transpose."""

from __future__ import annotations

from cutetma import dsl
from cutetma.kernels.attention.config import LOG2_E

cutlass, cute = dsl.cutlass()

# The 4 x 4 transpose across the 4 lanes of a quad (word q of lane t <- word t of lane q), as
# butterfly steps (lane offset m, words a, b = a | m): lanes m apart swap, the lane with bit m
# set giving its word a for the partner's word b, the other its b for the partner's a (lane
# t's word q <- lane t^m's word q^m wherever bit m of q and t differ). Steps m = 1, 2.
QUAD_TRANSPOSE_STEPS = tuple((m, a, a | m) for m in (1, 2) for a in range(4) if not a & m)


@cute.jit
def epilogue(cfg, acc_o, row_max, row_sum, mO, mLSE, head, batch, row0, seqlen_q, scale_log2,
             out_scale=None):
    """O /= rowsum, LSE = max * scale + ln(rowsum); O by 16-byte stores from registers.
    ``out_scale`` (e4m3: V's descale) multiplies O with the 1 / rowsum.

    The accumulator gives a thread two columns of every 8 (2 quad, 2 quad + 1) of rows r and
    r + 8, so storing it as it lies takes d / 2 four-byte stores per thread, each writing
    half of eight 32-byte sectors. The four threads of a row (a quad) hold, between them,
    every column: a 4 x 4 transpose of their 4-byte pairs inside each 32 columns (two
    butterfly shuffle steps, ``quad_transpose``) gives each thread 8 contiguous columns,
    stored as one 16 bytes: 4x fewer stores, whole sectors. An fp32 ``mO`` (split_kv's
    partial) takes each pair as it lies, one 8-byte store: the combine reads it once."""
    tidx, _, _ = cute.arch.thread_idx()
    quad = tidx % 4
    # both rows' sums first: the two shuffle chains' latencies overlap
    total = cute.make_rmem_tensor((2,), cutlass.Float32)
    for r in cutlass.range_constexpr(2):
        total[r] = cute.arch.warp_reduction_sum(row_sum[r], threads_in_group=4)
    for r in cutlass.range_constexpr(2):
        inv = 0.0
        if total[r] > 0.0:
            inv = cute.arch.rcp_approx(total[r])
        if cutlass.const_expr(out_scale is not None):
            inv = inv * out_scale
        row = row0 + 8 * r
        if cutlass.const_expr(mO.element_type == cutlass.Float32):
            if row < seqlen_q:
                # pair 4 g + quad of the row: columns 8 g + 2 quad + (0, 1)
                o_pairs = cute.zipped_divide(cute.local_tile(
                    mO[(row, None, head, batch)], (cfg.head_dim,), (0,)), (2,))
                for g in cutlass.range_constexpr(cfg.head_dim // 8):
                    pair = cute.make_rmem_tensor((2,), cutlass.Float32)
                    for c in cutlass.range_constexpr(2):
                        pair[c] = acc_o[4 * g + 2 * r + c] * inv
                    cute.autovec_copy(pair, o_pairs[(None, 4 * g + quad)])
        else:
            _store_row_chunks(cfg, acc_o, r, inv, mO, row, head, batch, quad, seqlen_q)
        if row < seqlen_q:
            if quad == 0:
                lse = -cutlass.Float32.inf
                if total[r] > 0.0:
                    lse = row_max[r] * (scale_log2 / LOG2_E) + cute.math.log(
                        total[r], fastmath=True)
                mLSE[row, head, batch] = lse


@cute.jit
def _store_row_chunks(cfg, acc_o, r, inv, mO, row, head, batch, quad, seqlen_q):
    """The thread's row r (``row``) of O in 16-byte chunks, after the quad transpose."""
    # the row's d columns as 8-column chunks: chunk 4 k + quad is this thread's
    o_chunks = cute.zipped_divide(cute.local_tile(
        mO[(row, None, head, batch)], (cfg.head_dim,), (0,)), (8,))
    for k in cutlass.range_constexpr(cfg.head_dim // 32):
        # slot q: this thread's pair in 8-column group 4 k + q (accumulator index 4 g + 2 r
        # + c holds row r's column 8 g + 2 quad + c)
        chunk = cute.make_rmem_tensor((8,), mO.element_type)
        for q in cutlass.range_constexpr(4):
            for c in cutlass.range_constexpr(2):
                chunk[2 * q + c] = (acc_o[4 * (4 * k + q) + 2 * r + c] * inv).to(
                    mO.element_type)
        quad_transpose(cute.recast_tensor(chunk, cutlass.Int32), quad)
        if row < seqlen_q:
            cute.autovec_copy(chunk, o_chunks[(None, 4 * k + quad)])


@cute.jit
def quad_transpose(words, quad):
    """Word q of lane ``quad`` (of 4 lanes) <- word ``quad`` of lane q, by the butterfly
    steps of ``QUAD_TRANSPOSE_STEPS``. Every lane shuffles the same register; a select
    picks which of its two words it sends and which the partner's word replaces."""
    for step in cutlass.range_constexpr(len(QUAD_TRANSPOSE_STEPS)):
        m, a, b = QUAD_TRANSPOSE_STEPS[step]
        upper = (quad & m) != 0  # this lane keeps word b and replaces word a
        send = cutlass.select_(upper, words[a], words[b])
        got = cute.arch.shuffle_sync_bfly(cutlass.Int32(send), offset=m)
        words[a] = cutlass.select_(upper, got, words[a])
        words[b] = cutlass.select_(upper, words[b], got)
