"""``BackwardPreprocess``: the attention backward's per-query inputs, one small kernel before
it (FlashAttention's preprocessing pass).

For each query row it writes D = rowsum(dO * O) in fp32 and the forward's LSE in log2 units
(+inf for a row that saw no key, whose LSE is -inf, so its P is 0), both as (b, h, s_q
padded to whole ``block_m``-query blocks), +inf and 0 in the padding: the backward then
loads them with no bounds test. One CTA of 128 threads per (query block, head, batch);
d / 8 threads share a row, each multiplying 16 bytes of O by dO's, and a shuffle reduction
over those threads sums the row. The same CTA zeroes its query block's slice of the dQ
accumulator (in place of a separate memset). (With torch ops the same pass made fp32
copies of O and dO: about a gigabyte of traffic at 16k tokens x 2048 columns, a quarter of
the backward at s = 2k.) The torch face subtracts the LSE's own gradient from D where the
LSE was used.
"""

from __future__ import annotations

from cutetma import dsl
from cutetma.kernels.attention.config import LOG2_E, dq_splits_rows
from cutetma.kernels.attention.epilogue import quad_transpose

cutlass, cute = dsl.cutlass()
from cuda.bindings import driver as cuda  # noqa: E402

THREADS = 128
VECTOR = 8  # 16-bit values per 16-byte load


def dq_accumulator(pointer, per_block: int, blocks, heads, batch):
    """The backward's fp32 dQ accumulator as (``per_block`` values of a query block, query
    blocks, heads, batch), contiguous: what the preprocessing kernel zeroes and
    ``DqPostprocess`` reads."""
    per_head = cute.assume(cutlass.Int64(blocks) * per_block, divby=per_block)
    return cute.make_tensor(pointer, cute.make_layout(
        (per_block, blocks, heads, batch),
        stride=(1, per_block, per_head,
                cute.assume(cutlass.Int64(blocks) * per_block * cutlass.Int64(heads),
                            divby=per_block))))


class BackwardPreprocess:
    def __init__(self, head_dim: int, block_m: int = 64):
        self.head_dim = head_dim
        self.block_m = block_m

    @cute.jit
    def from_pointers(self, pO: cute.Pointer, pdO: cute.Pointer, pLSE: cute.Pointer,
                      pLSE2: cute.Pointer, pD: cute.Pointer, pAcc: cute.Pointer,
                      batch: cutlass.Int32,
                      seqlen_q: cutlass.Int32, heads: cutlass.Int32, o_s: cutlass.Int64,
                      o_h: cutlass.Int64, o_b: cutlass.Int64, do_s: cutlass.Int64,
                      do_h: cutlass.Int64, do_b: cutlass.Int64, stream: cuda.CUstream):
        """O and dO (b, s_q, h, d) with (seq, head, batch) strides (d contiguous, 16-byte
        aligned rows); the forward's LSE contiguous (b, h, s_q) fp32; the outputs ``pLSE2``
        (log2) and ``pD`` contiguous (b, h, s_q padded) fp32; ``pAcc``: the backward's dQ
        accumulator, (b, h, query blocks, block_m x d) fp32, zeroed here (a block a CTA)."""
        d = self.head_dim

        def rows(pointer, s, h, b):  # (b, s, h, d) -> (d, s, h, b)
            s, h, b = (cute.assume(x, divby=VECTOR) for x in (s, h, b))
            return cute.make_tensor(pointer, cute.make_layout((d, seqlen_q, heads, batch),
                                                              stride=(1, s, h, b)))

        def per_query(pointer, length):  # contiguous (b, h, length) -> (length, h, b)
            per_head = cutlass.Int64(length)
            return cute.make_tensor(pointer, cute.make_layout(
                (length, heads, batch), stride=(1, per_head, per_head * cutlass.Int64(heads))))

        blocks = (seqlen_q + self.block_m - 1) // self.block_m
        acc = dq_accumulator(pAcc, self.block_m * d, blocks, heads, batch)
        self.kernel(rows(pO, o_s, o_h, o_b), rows(pdO, do_s, do_h, do_b),
                    per_query(pLSE, seqlen_q), per_query(pLSE2, blocks * self.block_m),
                    per_query(pD, blocks * self.block_m), acc).launch(
            grid=(blocks, heads, batch), block=(THREADS, 1, 1), stream=stream)

    @cute.kernel
    def kernel(self, mO: cute.Tensor, mdO: cute.Tensor, mLSE: cute.Tensor, mLSE2: cute.Tensor,
               mD: cute.Tensor, mAcc: cute.Tensor):
        block, head, batch = cute.arch.block_idx()
        tidx, _, _ = cute.arch.thread_idx()
        seqlen_q = mO.shape[1]
        per_row = self.head_dim // VECTOR
        rows_at_once = THREADS // per_row
        chunk, row = tidx % per_row, tidx // per_row
        o = cute.make_rmem_tensor((VECTOR,), mO.element_type)
        do = cute.make_rmem_tensor((VECTOR,), mdO.element_type)
        for p in cutlass.range_constexpr(self.block_m // rows_at_once):
            q = block * self.block_m + p * rows_at_once + row
            inside = q < seqlen_q
            # a row past s_q reads the last row (no branch around the loads: they stay in
            # flight together) and counts 0
            src = cutlass.min(q, seqlen_q - 1)
            cute.autovec_copy(cute.local_tile(mO[(None, src, head, batch)], (VECTOR,),
                                              (chunk,)), o)
            cute.autovec_copy(cute.local_tile(mdO[(None, src, head, batch)], (VECTOR,),
                                              (chunk,)), do)
            total = cutlass.Float32(0.0)
            for i in cutlass.range_constexpr(VECTOR):
                total = total + o[i].to(cutlass.Float32) * do[i].to(cutlass.Float32)
            total = cute.arch.warp_reduction_sum(total, threads_in_group=per_row)
            if chunk == 0:
                lse = mLSE[src, head, batch]
                finite = inside & (lse != -cutlass.Float32.inf)
                mLSE2[q, head, batch] = cutlass.select_(finite, lse * LOG2_E,
                                                        cutlass.Float32.inf)
                mD[q, head, batch] = cutlass.select_(inside, total, cutlass.Float32(0.0))
        # this query block's slice of the dQ accumulator to zeros (one pass less than a
        # memset of its own), 16 bytes a thread at a time
        zeros = cute.make_rmem_tensor((4,), cutlass.Float32)
        zeros.fill(0.0)
        mine = mAcc[(None, block, head, batch)]
        for i in cutlass.range_constexpr(self.block_m * self.head_dim // 4 // THREADS):
            cute.autovec_copy(zeros, cute.local_tile(mine, (4,), (i * THREADS + tidx,)))


class DqPostprocess:
    """dQ from the backward's fp32 accumulator, which holds each (batch, head, query block) in
    the dQ MMA's fragment order (``cutetma.backward.dq_from_fragments`` spells the order out
    and is this kernel's reference): one CTA of 256 threads per (query block, head, batch),
    thread t of the two consumer warpgroups reading its own 16-byte chunks (neighbouring
    threads, neighbouring chunks: whole lines) and scaling them. A thread holds a column pair
    of each chunk's rows; the four lanes of a quad hold a row's 8 columns, so a transpose
    within the quad (``quad_transpose``, the forward epilogue's) over four chunks leaves each
    lane 8 neighbouring columns: 16-byte stores, a warp writing 64 contiguous bytes of each of
    8 rows (pairs of 4 bytes had left every 32-byte sector half written). (The same in torch,
    one permuted copy, read the accumulator 8 bytes at a time across 16-byte strides.)"""

    def __init__(self, head_dim: int, block_m: int = 64):
        self.head_dim = head_dim
        self.block_m = block_m

    @cute.jit
    def from_pointers(self, pAcc: cute.Pointer, pdQ: cute.Pointer, batch: cutlass.Int32,
                      seqlen_q: cutlass.Int32, heads: cutlass.Int32, q_s: cutlass.Int64,
                      q_h: cutlass.Int64, q_b: cutlass.Int64, scale: cutlass.Float32,
                      stream: cuda.CUstream):
        """``pAcc``: the accumulator, (b, h, query blocks, block_m x d) fp32 contiguous;
        ``pdQ``: dQ (b, s_q, h, d) with (seq, head, batch) strides ``q_s, q_h, q_b``."""
        d = self.head_dim
        blocks = (seqlen_q + self.block_m - 1) // self.block_m
        acc = dq_accumulator(pAcc, self.block_m * d, blocks, heads, batch)
        # dQ is the torch face's own contiguous tensor: rows of d >= 64 values, 16-byte aligned
        q_s, q_h, q_b = (cute.assume(x, divby=8) for x in (q_s, q_h, q_b))
        dq = cute.make_tensor(pdQ, cute.make_layout((d, seqlen_q, heads, batch),
                                                    stride=(1, q_s, q_h, q_b)))
        self.kernel(acc, dq, scale).launch(grid=(blocks, heads, batch),
                                           block=(2 * THREADS, 1, 1), stream=stream)

    @cute.kernel
    def kernel(self, mAcc: cute.Tensor, mdQ: cute.Tensor, scale: cutlass.Float32):
        block, head, batch = cute.arch.block_idx()
        tidx, _, _ = cute.arch.thread_idx()
        d = self.head_dim
        seqlen_q = mdQ.shape[1]
        wg, t = tidx // THREADS, tidx % THREADS
        warp, r, c = t // 32, t % 32 // 4, t % 4
        # each warpgroup's part: a half of d over every 64-row slab, or (128-query blocks,
        # ``dq_splits_rows``) its own 64 rows over all of d
        rows_split = dq_splits_rows(self.block_m, 2)
        cols = d if rows_split else d // 2
        chunks_per_row = cols // 8  # 4-value chunks per 64-row slab
        chunks = (1 if rows_split else self.block_m // 64) * chunks_per_row
        row0 = 64 * wg if rows_split else 0
        col0 = 0 if rows_split else wg * cols
        half = cute.local_tile(mAcc[(None, block, head, batch)],
                               (chunks * THREADS * 4,), (wg,))
        # Every load before the first store: a global store may alias the next load, so a
        # load after a store waits for it (one memory latency per chunk, serialized).
        held = cute.make_rmem_tensor((4, chunks), cutlass.Float32)
        for k in cutlass.range_constexpr(chunks):
            cute.autovec_copy(cute.local_tile(half, (4,), (k * THREADS + t,)), held[None, k])
        quad_chunks = chunks_per_row // 4  # chunks of a row's 8-column groups, 4 at a time
        for slab in cutlass.range_constexpr(chunks // chunks_per_row):
            for e1 in cutlass.range_constexpr(2):
                q = block * self.block_m + row0 + 64 * slab + 16 * warp + 8 * e1 + r
                row = cute.zipped_divide(mdQ[(None, q, head, batch)], (8,))
                for g in cutlass.range_constexpr(quad_chunks):
                    # word w: this lane's pair of 8-column group 4 g + w; after the transpose,
                    # lane c's pairs of group 4 g + c (columns 2 w, 2 w + 1 of it)
                    words = cute.make_rmem_tensor((8,), mdQ.element_type)
                    for w in cutlass.range_constexpr(4):
                        k = slab * chunks_per_row + 4 * g + w
                        for pair in cutlass.range_constexpr(2):
                            words[2 * w + pair] = (held[2 * e1 + pair, k] * scale).to(
                                mdQ.element_type)
                    quad_transpose(cute.recast_tensor(words, cutlass.Int32), c)
                    if q < seqlen_q:
                        cute.autovec_copy(words, row[(None, col0 // 8 + 4 * g + c)])
