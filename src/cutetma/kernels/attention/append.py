"""``KVAppend``: ``attention_with_kvcache``'s ``k=`` / ``v=`` written into the paged cache, one
small kernel before the paged forward.

Row r of the new keys (sequence i's t-th: r = i * s_new + t, or with ``cu_seqlens_q``
r = cu[i] + t) goes to position p = cache_seqlens[i] + t of sequence i: page
``page_table[i, p // page_size]``, slot ``p % page_size``. One CTA per row reads that page id
once and copies the row's h_kv x d keys and values as 16-byte vectors (thread j: vectors j,
j + 128, ...), whatever the element type (FP8 too: bytes are bytes); with ``cu_seqlens_q``
the CTA's threads find the row's sequence together (one compare each per 128 sequences).
The first CTAs also write ``lens_out[i] = cache_seqlens[i] + (sequence i's new keys)``
(thread j of CTA c: sequence 128 c + j), the lengths the forward then attends over, so the
caller's ``cache_seqlens`` is not changed. A position past the table or a page id outside
the pool is not written. Written with torch's index arithmetic and index copies the append
was about ten kernels: a decode step with new keys ran at 0.91x the step without them at
b = 64 and 0.55x at b = 1 (H100, CUDA graphs); with this kernel 0.99x and 0.88x
(docs/design.md, "Paged attention").

Strides are in bytes and multiples of 16 (the host makes k / v contiguous where they are
not); the head dim is contiguous.
"""

from __future__ import annotations

from cutetma import dsl

cutlass, cute = dsl.cutlass()
from cuda.bindings import driver as cuda  # noqa: E402

THREADS = 128
VECTOR_BYTES = 16
WORDS = VECTOR_BYTES // 4  # a vector as Int32 words


class KVAppend:
    def __init__(self, head_bytes: int, varlen: bool):
        # one head's row of d values, in 16-byte vectors
        self.vectors = head_bytes // VECTOR_BYTES
        self.varlen = varlen

    @cute.jit
    def from_pointers(self, pK: cute.Pointer, pV: cute.Pointer, pKc: cute.Pointer,
                      pVc: cute.Pointer, pTable: cute.Pointer, pLens: cute.Pointer,
                      pCu: cute.Pointer, pLensOut: cute.Pointer, rows: cutlass.Int32,
                      batch: cutlass.Int32, s_new: cutlass.Int32, h_kv: cutlass.Int32,
                      page_size: cutlass.Int32, max_pages: cutlass.Int32,
                      table_row: cutlass.Int32, pages: cutlass.Int32, k_b: cutlass.Int64,
                      k_s: cutlass.Int64, k_h: cutlass.Int64, v_b: cutlass.Int64,
                      v_s: cutlass.Int64, v_h: cutlass.Int64, kc_p: cutlass.Int64,
                      kc_s: cutlass.Int64, kc_h: cutlass.Int64, vc_p: cutlass.Int64,
                      vc_s: cutlass.Int64, vc_h: cutlass.Int64, stream: cuda.CUstream):
        """``pK`` / ``pV``: the new keys and values, (b, s_new, h_kv, d) with byte strides
        ``k_b, k_s, k_h`` (varlen: (total_q, h_kv, d), ``k_s`` the row's, ``k_b`` unused);
        ``pKc`` / ``pVc``: the caches (pages, page_size, h_kv, d), byte strides ``kc_p, kc_s,
        kc_h``; ``pTable`` (b, max_pages) int32 rows ``table_row`` apart; ``pLens`` (b,),
        ``pCu`` (b + 1,) (varlen only), ``pLensOut`` (b,) int32; ``pages`` in the pool."""
        mTable = cute.make_tensor(pTable, cute.make_layout((batch, max_pages),
                                                           stride=(table_row, 1)))
        mLens = cute.make_tensor(pLens, cute.make_layout((batch,)))
        mCu = cute.make_tensor(pCu, cute.make_layout((batch + 1,)))
        mLensOut = cute.make_tensor(pLensOut, cute.make_layout((batch,)))
        # the byte operands: only their base addresses are read (a 1-element view each)
        bases = [cute.make_tensor(p, cute.make_layout((1,))) for p in (pK, pV, pKc, pVc)]
        ctas = cutlass.max(rows, (batch + THREADS - 1) // THREADS)
        self.kernel(*bases, mTable, mLens, mCu, mLensOut, rows, batch, s_new, h_kv, page_size,
                    max_pages, pages, k_b, k_s, k_h, v_b, v_s, v_h, kc_p, kc_s, kc_h, vc_p, vc_s,
                    vc_h).launch(grid=(ctas, 1, 1), block=(THREADS, 1, 1), stream=stream)

    @cute.kernel
    def kernel(self, mK: cute.Tensor, mV: cute.Tensor, mKc: cute.Tensor, mVc: cute.Tensor,
               mTable: cute.Tensor, mLens: cute.Tensor, mCu: cute.Tensor,
               mLensOut: cute.Tensor, rows: cutlass.Int32, batch: cutlass.Int32,
               s_new: cutlass.Int32, h_kv: cutlass.Int32, page_size: cutlass.Int32,
               max_pages: cutlass.Int32, pages: cutlass.Int32, k_b: cutlass.Int64,
               k_s: cutlass.Int64, k_h: cutlass.Int64, v_b: cutlass.Int64, v_s: cutlass.Int64,
               v_h: cutlass.Int64, kc_p: cutlass.Int64, kc_s: cutlass.Int64,
               kc_h: cutlass.Int64, vc_p: cutlass.Int64, vc_s: cutlass.Int64,
               vc_h: cutlass.Int64):
        tidx, _, _ = cute.arch.thread_idx()
        row, _, _ = cute.arch.block_idx()
        owner = None  # varlen: the row's sequence, shared by the CTA's threads
        if cutlass.const_expr(self.varlen):
            owner = cute.make_tensor(
                cutlass.memory.SmemAllocator().allocate_array(cutlass.Int32, 1),
                cute.make_layout((1,)))
        sequence = row * THREADS + tidx  # the length this thread writes
        if sequence < batch:
            count = s_new
            if cutlass.const_expr(self.varlen):
                count = mCu[sequence + 1] - mCu[sequence]
            mLensOut[sequence] = mLens[sequence] + count
        if row < rows:
            seq, t = row // cutlass.max(s_new, 1), row % cutlass.max(s_new, 1)
            if cutlass.const_expr(self.varlen):
                # the sequence whose rows hold this one, cu[i] <= row < cu[i + 1] (one i:
                # empty sequences hold none), found by 128 threads at once: one round of
                # loads per 128 sequences, not a search's chain of dependent ones; none
                # (offsets that do not rise from 0 to total_q) leaves ``batch``: no copy
                if tidx == 0:
                    owner[0] = batch
                cute.arch.sync_threads()
                for first in cutlass.range(0, batch, THREADS, unroll=1):
                    i = first + tidx
                    if i < batch:
                        if mCu[i] <= row and row < mCu[i + 1]:
                            owner[0] = i
                cute.arch.sync_threads()
                seq = owner[0]
                t = row - mCu[cutlass.min(seq, batch - 1)]
            position = mLens[cutlass.min(seq, batch - 1)] + t
            block = position // page_size
            page = cutlass.Int32(-1)  # a position past the table's pages is not written
            if seq < batch and block < max_pages:
                page = mTable[seq, block]
            # nor is one whose page id lies outside the pool (lengths and ids the kernel
            # cannot trust: check_contents=True reports them)
            if page >= 0 and page < pages:
                self._copy_row(mK, mV, mKc, mVc, row, seq, t, cutlass.Int64(page),
                               cutlass.Int64(position % page_size), h_kv, tidx,
                               k_b, k_s, k_h, v_b, v_s, v_h, kc_p, kc_s, kc_h, vc_p, vc_s,
                               vc_h)

    @cute.jit
    def _copy_row(self, mK, mV, mKc, mVc, row, seq, t, page, slot, h_kv, tidx, k_b, k_s, k_h,
                  v_b, v_s, v_h, kc_p, kc_s, kc_h, vc_p, vc_s, vc_h):
        """Row ``row`` (sequence ``seq``'s ``t``-th new key) into ``page``, ``slot``."""
        # row offsets in bytes: the new keys' (b, s) or varlen row, the cache's page, slot
        k_row = cutlass.Int64(seq) * k_b + cutlass.Int64(t) * k_s
        v_row = cutlass.Int64(seq) * v_b + cutlass.Int64(t) * v_s
        if cutlass.const_expr(self.varlen):
            k_row, v_row = cutlass.Int64(row) * k_s, cutlass.Int64(row) * v_s
        copies = ((mK.iterator.toint() + k_row, k_h,
                   mKc.iterator.toint() + page * kc_p + slot * kc_s, kc_h),
                  (mV.iterator.toint() + v_row, v_h,
                   mVc.iterator.toint() + page * vc_p + slot * vc_s, vc_h))
        words = cute.make_rmem_tensor((WORDS,), cutlass.Int32)
        for i in cutlass.range(tidx, h_kv * self.vectors, THREADS, unroll=1):
            head = cutlass.Int64(i // self.vectors)
            col = cutlass.Int64(i % self.vectors * VECTOR_BYTES)
            for src, src_head, dst, dst_head in copies:
                cute.autovec_copy(self._vector(src + head * src_head + col), words)
                cute.autovec_copy(words, self._vector(dst + head * dst_head + col))

    @staticmethod
    def _vector(address):
        """The 16 bytes at ``address`` (a multiple of 16) as four Int32 words."""
        return cute.make_tensor(cute.make_ptr(cutlass.Int32, address, cute.AddressSpace.gmem,
                                              assumed_align=VECTOR_BYTES),
                                cute.make_layout((WORDS,)))
