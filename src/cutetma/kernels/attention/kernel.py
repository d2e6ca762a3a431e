"""``FlashAttentionSm90``: the host entry points, the kernel's warp roles, the producers (TMA
or cp.async) and the consumer warpgroups' key-block loop (the package docstring draws it)."""

from __future__ import annotations

from cutetma import dsl
from cutetma.copy import cpasync as cpa
from cutetma.copy import loader as loaders
from cutetma.copy import tma
from cutetma.kernels.attention import scheduler
from cutetma.kernels.attention.config import LOG2_E, WARPGROUP, AttentionConfig
from cutetma.kernels.attention.epilogue import epilogue
from cutetma.kernels.attention.masking import apply_mask
from cutetma.kernels.attention.softmax import online_softmax, rescale
from cutetma.kernels.barriers import AttentionBarrier

cutlass, cute = dsl.cutlass()
import cutlass.utils.hopper_helpers as sm90  # noqa: E402
from cuda.bindings import driver as cuda  # noqa: E402
from cutlass import pipeline  # noqa: E402
from cutlass.cute.nvgpu import warpgroup  # noqa: E402
from cutlass.tensor_utils import LayoutEnum  # noqa: E402


class _Problem:
    """The launch's sizes as the tile walk reads them: ``rows`` of a (head, batch) tile
    column (s_q, or group x s_q packed; varlen_q: the longest sequence's), ``seqlen_q``
    (queries), ``group`` (packed rows per query: pack_gqa's group, else 1), ``heads`` (h,
    or h_kv packed), ``batches``, ``splits`` (split_kv), ``seqlen_k`` (dense keys),
    ``cu_seqlens_q`` (varlen_q's query offsets). A plain holder: the kernel's helpers are
    inlined, so it never crosses a compiled boundary."""

    def __init__(self, **sizes):
        self.__dict__.update(sizes)


class FlashAttentionSm90:
    def __init__(self, config: AttentionConfig):
        self.cfg = config
        self.loader = loaders.make_loader(config.load)

    # ------------------------------------------------------------------------ host
    @cute.jit
    def __call__(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mO: cute.Tensor,
                 mLSE: cute.Tensor, softmax_scale: cutlass.Float32, sm_count: cutlass.Int32,
                 stream: cuda.CUstream):
        """mQ, mO: (s_q, d, h, b); mK, mV: (s_k, d, h_kv, b); mLSE: (s_q, h, b) fp32.
        (The torch face permutes (b, s, h, d) tensors into these views; d is contiguous.)
        ``sm_count``: how many CTAs run at once, the persistent grid's size (one CTA per SM:
        its 384 or 512 threads fill the register file)."""
        self._launch(mQ, mK, mV, mO, mLSE, None, None, softmax_scale, sm_count, 1, stream)

    @cute.jit
    def paged(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mO: cute.Tensor,
              mLSE: cute.Tensor, mPageTable: cute.Tensor, mSeqlensK: cute.Tensor,
              softmax_scale: cutlass.Float32, sm_count: cutlass.Int32,
              num_splits: cutlass.Int32, mCuSeqlensQ: cute.Tensor, seqlen_q: cutlass.Int32,
              stream: cuda.CUstream):
        """Paged K/V: mK, mV are the cache pools seen as (page_size, d, h_kv, pages) (the
        torch (pages, page_size, h_kv, d) permuted); mPageTable (b, max_pages) int32 maps a
        sequence's i-th page to a pool page; mSeqlensK (b,) int32 its number of keys. mQ,
        mO, mLSE as in ``__call__`` (s_q the same for every sequence). ``split_kv``: mO
        and mLSE are fp32 partials for ``num_splits`` x b sequences (split s of sequence i
        at batch index s b + i), for the combine to merge. ``varlen_q``: mQ, mO
        (total_q, d, h, 1), mLSE (total_q, h, 1) (split_kv: batch index s), sequence i's
        queries rows mCuSeqlensQ[i] .. mCuSeqlensQ[i + 1] - 1, at most ``seqlen_q`` of
        them (else ``seqlen_q`` is unused)."""
        self._launch(mQ, mK, mV, mO, mLSE, mPageTable, mSeqlensK, softmax_scale, sm_count,
                     num_splits, stream, mCuSeqlensQ, seqlen_q)

    @cute.jit
    def _launch(self, mQ, mK, mV, mO, mLSE, mPageTable, mSeqlensK, softmax_scale, sm_count,
                num_splits, stream, mCuSeqlensQ=None, max_seqlen_q=None):
        cfg = self.cfg
        dtype = mQ.element_type
        # Q, K, V: strides checked by the torch face; O: made there like Q (empty_like), so
        # its strides are as aligned as Q's (the epilogue's 16-byte stores rely on it)
        mQ, mK, mV, mO = (self._aligned_strides(x) for x in (mQ, mK, mV, mO))
        group = mQ.shape[2] // mK.shape[2]  # query heads per key/value head
        mQ_heads = mQ  # TMA's view of Q (unused where Q rows are gathered)
        group_q = 1  # rows per query
        if cutlass.const_expr(cfg.pack_gqa):
            group_q = group
            # a tile's rows are (group, s_q): the query heads of one K/V head, packed
            mQ, mO = self._pack_rows(mQ, group, 2), self._pack_rows(mO, group, 2)
            mLSE = self._pack_rows(mLSE, group, 1)
            group = 1
        # GQA: head hq reads key/value head hq // group, a stride-0 mode over the group
        mK = self._broadcast_heads(mK, group)
        mV = self._broadcast_heads(mV, group)
        mVt = cute.make_tensor(mV.iterator, cute.make_layout(
            (mV.shape[1], mV.shape[0], mV.shape[2], mV.shape[3]),
            stride=(mV.stride[1], mV.stride[0], mV.stride[2], mV.stride[3])))  # (d, s_k, h, b)

        qk_tiler = (64, cfg.block_n, cfg.head_dim)
        pv_tiler = (64, cfg.head_dim, cfg.block_n)
        k_major, mn_major = cute.nvgpu.OperandMajorMode.K, cute.nvgpu.OperandMajorMode.MN
        qk_mma = sm90.make_trivial_tiled_mma(dtype, dtype, k_major, k_major, cutlass.Float32,
                                             (cfg.consumers, 1, 1), tiler_mn=qk_tiler[:2])
        pv_mma = sm90.make_trivial_tiled_mma(dtype, dtype, k_major, mn_major, cutlass.Float32,
                                             (cfg.consumers, 1, 1), tiler_mn=pv_tiler[:2],
                                             a_source=warpgroup.OperandSource.RMEM)
        row_major = LayoutEnum.ROW_MAJOR
        sQ_layout = sm90.make_smem_layout_a(row_major, (cfg.block_m, cfg.block_n, cfg.head_dim),
                                            dtype, cfg.q_stages)
        sK_layout = sm90.make_smem_layout_b(row_major, (cfg.block_m, cfg.block_n, cfg.head_dim),
                                            dtype, cfg.stages)
        sV_layout = sm90.make_smem_layout_b(LayoutEnum.COL_MAJOR,
                                            (cfg.block_m, cfg.head_dim, cfg.block_n), dtype,
                                            cfg.stages)
        tma_q, mQ_tma = tma.load_atom(mQ_heads, cute.slice_(sQ_layout, (None, None, 0)),
                                      (cfg.block_m, cfg.head_dim))
        # a K / V box: a whole stage (dense), or kv_box rows of it, each inside one page
        # (paged): the stage's own layout cut to the box, so the box's swizzle phase is the
        # stage's (kv_box is a multiple of the swizzle atom's 8 rows)
        box = cfg.kv_box
        k_box = cute.slice_(sK_layout, (None, None, 0))
        v_box = cute.slice_(sV_layout, (None, None, 0))
        if cutlass.const_expr(cfg.paged):
            # (box, d) inside the stage's (block_n, d) coordinates: d's stride is block_n
            k_box = cute.composition(k_box, cute.make_layout((box, cfg.head_dim),
                                                             stride=(1, cfg.block_n)))
            v_box = cute.composition(v_box, cute.make_layout((cfg.head_dim, box)))
        tma_k, mK_tma = tma.load_atom(mK, k_box, (box, cfg.head_dim))
        tma_v, mV_tma = tma.load_atom(mVt, v_box, (cfg.head_dim, box))

        @cute.struct
        class Storage:
            # Q full per buffer, then Q empty per buffer
            q_barriers: cute.struct.MemRange[cutlass.Int64, 2 * cfg.q_stages]
            k_barriers: cute.struct.MemRange[cutlass.Int64, cfg.stages * 2]
            v_barriers: cute.struct.MemRange[cutlass.Int64, cfg.stages * 2]
            sQ: cute.struct.Align[cute.struct.MemRange[dtype, cute.cosize(sQ_layout)], 1024]
            sK: cute.struct.Align[cute.struct.MemRange[dtype, cute.cosize(sK_layout)], 1024]
            sV: cute.struct.Align[cute.struct.MemRange[dtype, cute.cosize(sV_layout)], 1024]

        self.storage = Storage
        walk_rows = max_seqlen_q * group_q if cutlass.const_expr(cfg.varlen_q) else (
            cute.size(mQ, mode=[0]))
        batches = mSeqlensK.shape[0] if cutlass.const_expr(cfg.varlen_q) else mQ.shape[3]
        items = scheduler.work_items(cfg, walk_rows, mQ.shape[2], batches, num_splits)
        grid = (cutlass.min(items, sm_count) if cutlass.const_expr(cfg.persistent) else items,
                1, 1)
        # dense: no page table or lengths; the kernel takes the LSE in their place, unread
        if cutlass.const_expr(not cfg.paged):
            mPageTable, mSeqlensK = mLSE, mLSE
            mCuSeqlensQ = mLSE
        # varlen_q: the longest sequence's queries set the tile walk; else the kernel reads s_q
        # from Q's shape and takes neither
        if cutlass.const_expr(not cfg.varlen_q):
            mCuSeqlensQ, max_seqlen_q = mSeqlensK, cutlass.Int32(0)
        self.kernel(tma_q, mQ_tma, tma_k, mK_tma, tma_v, mV_tma, mQ, mK, mVt, mO, mLSE,
                    mPageTable, mSeqlensK, qk_mma, pv_mma, sQ_layout, sK_layout, sV_layout,
                    mK.shape[0], softmax_scale * LOG2_E, num_splits, mCuSeqlensQ,
                    max_seqlen_q).launch(
            grid=grid, block=(cfg.threads, 1, 1), min_blocks_per_mp=1, stream=stream)

    @cute.jit
    def from_pointers(self, pQ: cute.Pointer, pK: cute.Pointer, pV: cute.Pointer,
                      pO: cute.Pointer, pLSE: cute.Pointer, batch: cutlass.Int32,
                      seqlen_q: cutlass.Int32, seqlen_k: cutlass.Int32, heads: cutlass.Int32,
                      heads_kv: cutlass.Int32, head_dim: cutlass.Int32,
                      q_s: cutlass.Int64, q_h: cutlass.Int64, q_b: cutlass.Int64,
                      k_s: cutlass.Int64, k_h: cutlass.Int64, k_b: cutlass.Int64,
                      v_s: cutlass.Int64, v_h: cutlass.Int64, v_b: cutlass.Int64,
                      o_s: cutlass.Int64, o_h: cutlass.Int64, o_b: cutlass.Int64,
                      softmax_scale: cutlass.Float32, sm_count: cutlass.Int32,
                      stream: cuda.CUstream):
        """``__call__`` from base pointers, sizes and the (seq, head, batch) strides of the
        (b, s, h, d) tensors (d contiguous); the LSE is a contiguous (b, h, s_q) fp32 tensor.
        The tensors it builds have the types ``from_dlpack(...).mark_layout_dynamic()``
        gives (every size a dynamic Int32, every stride but d's a dynamic Int64), so the
        kernel is the same; a launch then passes scalars instead of five DLPack tensors,
        which lets ``cutetma.attention`` skip the DSL's per-call argument conversion."""
        def view(pointer, seqlen, count, s, h, b):  # (b, s, h, d) -> (s, d, h, b)
            return cute.make_tensor(pointer, cute.make_layout(
                (seqlen, head_dim, count, batch), stride=(s, 1, h, b)))

        per_head = cutlass.Int64(seqlen_q)
        mLSE = cute.make_tensor(pLSE, cute.make_layout(
            (seqlen_q, heads, batch), stride=(1, per_head, per_head * cutlass.Int64(heads))))
        self(view(pQ, seqlen_q, heads, q_s, q_h, q_b), view(pK, seqlen_k, heads_kv, k_s, k_h, k_b),
             view(pV, seqlen_k, heads_kv, v_s, v_h, v_b), view(pO, seqlen_q, heads, o_s, o_h, o_b),
             mLSE, softmax_scale, sm_count, stream)

    @cute.jit
    def paged_from_pointers(self, pQ: cute.Pointer, pK: cute.Pointer, pV: cute.Pointer,
                            pO: cute.Pointer, pLSE: cute.Pointer, pPageTable: cute.Pointer,
                            pSeqlensK: cute.Pointer, batch: cutlass.Int32,
                            seqlen_q: cutlass.Int32, heads: cutlass.Int32,
                            heads_kv: cutlass.Int32, head_dim: cutlass.Int32,
                            pages: cutlass.Int32, max_pages: cutlass.Int32,
                            q_s: cutlass.Int64, q_h: cutlass.Int64, q_b: cutlass.Int64,
                            k_s: cutlass.Int64, k_h: cutlass.Int64, k_p: cutlass.Int64,
                            v_s: cutlass.Int64, v_h: cutlass.Int64, v_p: cutlass.Int64,
                            o_s: cutlass.Int64, o_h: cutlass.Int64, o_b: cutlass.Int64,
                            table_b: cutlass.Int64, softmax_scale: cutlass.Float32,
                            sm_count: cutlass.Int32, num_splits: cutlass.Int32,
                            pCuSeqlensQ: cute.Pointer, total_q: cutlass.Int32,
                            stream: cuda.CUstream):
        """``paged`` from base pointers, sizes and strides: Q, O (b, s_q, h, d); the pools
        (pages, page_size, h_kv, d) with (row, head, page) strides; the page table
        (b, max_pages) with row stride ``table_b``; the cache lengths (b,) contiguous; the
        LSE a contiguous (b, h, s_q) fp32 tensor. ``split_kv``: O (num_splits b, s_q, h, d)
        and the LSE (num_splits b, h, s_q), both fp32 partials. ``varlen_q``: Q, O
        (total_q, h, d) (their batch stride unused), the LSE (h, total_q) (split_kv: O
        (num_splits, total_q, h, d), the LSE (num_splits, h, total_q)), the query offsets
        (b + 1,) contiguous, ``seqlen_q`` the longest sequence's queries; else the offsets
        and ``total_q`` are unused."""
        def view(pointer, rows, count, outer, s, h, b):  # -> (rows, d, h, outer)
            return cute.make_tensor(pointer, cute.make_layout(
                (rows, head_dim, count, outer), stride=(s, 1, h, b)))

        out_batch = batch * num_splits if cutlass.const_expr(self.cfg.split_kv) else batch
        q_rows, q_batch = seqlen_q, batch  # Q's and O's (rows, batch) modes
        if cutlass.const_expr(self.cfg.varlen_q):
            q_rows, q_batch = total_q, 1
            out_batch = num_splits if cutlass.const_expr(self.cfg.split_kv) else 1
        per_head = cutlass.Int64(q_rows)
        mLSE = cute.make_tensor(pLSE, cute.make_layout(
            (q_rows, heads, out_batch),
            stride=(1, per_head, per_head * cutlass.Int64(heads))))
        offsets = cute.make_tensor(pCuSeqlensQ, cute.make_layout((batch + 1,), stride=(1,)))
        table = cute.make_tensor(pPageTable, cute.make_layout((batch, max_pages),
                                                              stride=(table_b, 1)))
        lengths = cute.make_tensor(pSeqlensK, cute.make_layout((batch,), stride=(1,)))
        size = self.cfg.page_size
        self.paged(view(pQ, q_rows, heads, q_batch, q_s, q_h, q_b),
                   view(pK, size, heads_kv, pages, k_s, k_h, k_p),
                   view(pV, size, heads_kv, pages, v_s, v_h, v_p),
                   view(pO, q_rows, heads, out_batch, o_s, o_h, o_b), mLSE, table, lengths,
                   softmax_scale, sm_count, num_splits, offsets, seqlen_q, stream)

    @staticmethod
    def _aligned_strides(mX: cute.Tensor):
        """The same (s, d, h, b) tensor with its dynamic strides declared multiples of 16 bytes
        (the torch face checked them). ``mark_layout_dynamic`` strides carry no divisibility,
        so the (head, batch) slice the cp.async producer copies from would look 2-byte aligned
        and the 16-byte cp.async would be refused at compile time."""
        vec = 128 // mX.element_type.width
        stride = tuple(s if isinstance(s, int) else cute.assume(s, divby=vec)
                       for s in mX.stride)
        return cute.make_tensor(mX.iterator, cute.make_layout(mX.shape, stride=stride))

    @staticmethod
    def _pack_rows(mX: cute.Tensor, group, head_mode: int):
        """(s, ..., h, ...) -> ((group, s), ..., h // group, ...): row r of the packed mode is
        position r // group of head r % group of its K/V head's group (``pack_gqa``).
        ``head_mode``: where h is (2 for Q and O (s, d, h, b), 1 for the LSE (s, h, b))."""
        shape, stride = list(mX.shape), list(mX.stride)
        shape[0] = (group, mX.shape[0])
        stride[0] = (mX.stride[head_mode], mX.stride[0])
        shape[head_mode] = mX.shape[head_mode] // group
        stride[head_mode] = mX.stride[head_mode] * group
        return cute.make_tensor(mX.iterator, cute.make_layout(tuple(shape), stride=tuple(stride)))

    @staticmethod
    def _broadcast_heads(mX: cute.Tensor, group):
        """(s, d, h_kv, b) -> (s, d, (group, h_kv), b) with stride 0 over the group."""
        layout = cute.make_layout(
            (mX.shape[0], mX.shape[1], (group, mX.shape[2]), mX.shape[3]),
            stride=(mX.stride[0], mX.stride[1], (0, mX.stride[2]), mX.stride[3]))
        return cute.make_tensor(mX.iterator, layout)

    # ------------------------------------------------------------------------ device
    @cute.kernel
    def kernel(self, tma_q: cute.CopyAtom, mQ_tma: cute.Tensor, tma_k: cute.CopyAtom,
               mK_tma: cute.Tensor, tma_v: cute.CopyAtom, mV_tma: cute.Tensor,
               mQ: cute.Tensor, mK: cute.Tensor, mVt: cute.Tensor,
               mO: cute.Tensor, mLSE: cute.Tensor, mPageTable: cute.Tensor,
               mSeqlensK: cute.Tensor, qk_mma: cute.TiledMma,
               pv_mma: cute.TiledMma, sQ_layout: cute.ComposedLayout,
               sK_layout: cute.ComposedLayout, sV_layout: cute.ComposedLayout,
               seqlen_k: cutlass.Int32, scale_log2: cutlass.Float32, num_splits: cutlass.Int32,
               mCuSeqlensQ: cute.Tensor, max_seqlen_q: cutlass.Int32):
        cfg = self.cfg
        tidx, _, _ = cute.arch.thread_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        wg = cute.arch.make_warp_uniform(tidx // WARPGROUP)
        if warp == 0:
            tma.prefetch(tma_q)
            tma.prefetch(tma_k)
            tma.prefetch(tma_v)

        storage = cutlass.memory.SmemAllocator().allocate(self.storage)
        sQ = storage.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)
        sK = storage.sK.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)
        sV = storage.sV.get_tensor(sV_layout.outer, swizzle=sV_layout.inner)
        q_full = storage.q_barriers.data_ptr()  # buffer i: q_full + i, q_empty + i
        q_empty = q_full + cfg.q_stages
        k_bytes = cute.size_in_bytes(mQ.element_type, cute.slice_(sK_layout, (None, None, 0)))
        v_bytes = cute.size_in_bytes(mQ.element_type, cute.slice_(sV_layout, (None, None, 0)))
        q_bytes = cute.size_in_bytes(mQ.element_type, cute.slice_(sQ_layout, (None, None, 0)))
        # K and V each have their own ring (same depth, filled in lockstep): a consumer frees
        # K_j as soon as S_j is computed and V_j after P V, so the producer can run ahead
        # even when an overlapped iteration holds V_{j-1} and K_j at once
        pipe_k = self.loader.make_pipeline(storage.k_barriers.data_ptr(), cfg.stages,
                                           WARPGROUP, 4 * cfg.consumers, k_bytes)
        pipe_v = self.loader.make_pipeline(storage.v_barriers.data_ptr(), cfg.stages,
                                           WARPGROUP, 4 * cfg.consumers, v_bytes)
        if warp == 0:
            with cute.arch.elect_one():
                for i in cutlass.range_constexpr(cfg.q_stages):
                    cute.arch.mbarrier_init(q_full + i, self._q_arrivals())
                    # every consumer thread arrives
                    cute.arch.mbarrier_init(q_empty + i, cfg.consumers * WARPGROUP)
        # the barriers must be initialized before anyone waits on them
        pipeline.pipeline_init_arrive()
        pipeline.pipeline_init_wait()

        # O's sizes (Q's: the same view), which the epilogue holds anyway; split_kv's O has
        # num_splits x b batches, Q has b
        rows = cute.size(mO, mode=[0])
        prob = _Problem(rows=rows, seqlen_q=rows, group=1, heads=mO.shape[2],
                        batches=mQ.shape[3] if cutlass.const_expr(cfg.split_kv) else mO.shape[3],
                        splits=num_splits, seqlen_k=seqlen_k, cu_seqlens_q=mCuSeqlensQ)
        if cutlass.const_expr(cfg.pack_gqa):
            prob.group, prob.seqlen_q = mO.shape[0][0], mO.shape[0][1]
        if cutlass.const_expr(cfg.varlen_q):
            # Q is every sequence's queries end to end: the walk covers the longest
            prob.seqlen_q, prob.batches = max_seqlen_q, mSeqlensK.shape[0]
            prob.rows = max_seqlen_q * prob.group
        items = scheduler.work_items(cfg, rows, prob.heads, prob.batches, num_splits)
        producer_regs, consumer_regs = cfg.registers
        if wg == 0:
            cute.arch.setmaxregister_decrease(producer_regs)
            if cutlass.const_expr(cfg.load == "tma"):
                if warp == 0:
                    self.produce(pipe_k, pipe_v, q_full, q_empty, q_bytes, tma_q, mQ_tma, tma_k,
                                 mK_tma, tma_v, mV_tma, mQ, sQ, sK, sV, mPageTable, mSeqlensK,
                                 items, prob)
            else:
                self.produce_cp_async(pipe_k, pipe_v, q_full, q_empty, mQ, mK, mVt, sQ, sK, sV,
                                      mPageTable, mSeqlensK, items, prob)
        else:
            cute.arch.setmaxregister_increase(consumer_regs)
            self.consume(pipe_k, pipe_v, q_full, q_empty, qk_mma, pv_mma, sQ, sK, sV, mO, mLSE,
                         mSeqlensK, items, prob, scale_log2)

    def _q_arrivals(self) -> int:
        """Arrivals that fill a Q buffer: the loader's (TMA: one, with the bytes), or
        (Q gathered by rows under the TMA producer) the producer warp's 32 cp.async
        threads."""
        if self.cfg.gathers_q and self.cfg.load == "tma":
            return 32
        return self.loader.barrier_count(WARPGROUP)

    @cute.jit
    def _gathered_q_loader(self, mQ, sQ, m_block, head, batch, q_start, rows, q_full, tidx,
                           threads: cutlass.Constexpr):
        """``load_q`` where Q is gathered (``gathers_q``): the tile's rows of Q, 16 bytes per
        cp.async from each row's own (position, head) (a packed row is no TMA box; a
        sequence of varlen_q starts at any row), by ``threads`` threads that each arrive on
        the Q barrier when theirs land. Rows past the tile's are left as they are: their
        scores are never stored."""
        cfg = self.cfg
        q_part = cpa.partition_stage(sQ, (cfg.block_m, cfg.head_dim), tidx, threads, 1)
        vec = cpa.VECTOR_BYTES * 8 // mQ.element_type.width
        gQ = self._sequence_rows(mQ[(None, None, head, batch)], q_start)  # (rows, d)

        def load_q(q_stage):
            def q_vector(row, col):
                return cute.local_tile(gQ[(m_block * cfg.block_m + row, None)], (vec,),
                                       (col // vec,))

            cpa.load_gathered(q_part, q_stage, rows - m_block * cfg.block_m, 0, q_vector,
                              zero_past=False)
            cute.arch.cp_async_mbarrier_arrive_noinc(q_full + q_stage)

        return load_q

    @cute.jit
    def produce(self, pipe_k, pipe_v, q_full, q_empty, q_bytes, tma_q, mQ_tma, tma_k, mK_tma, tma_v,
                mV_tma, mQ, sQ, sK, sV, mPageTable, mSeqlensK, items, prob):
        """One warp, per tile: Q, and K_j and V_j of every key block into the next free stage
        (the ring runs on across tiles), in ``_produce_tile``'s order. Paged: a stage is
        ``block_n // kv_box`` boxes, each from the page its keys lie in (the pool's page is a
        TMA coordinate); all of them complete on the stage's one barrier."""
        cfg = self.cfg
        tQsQ, _ = tma.partition(tma_q, sQ, cute.local_tile(
            mQ_tma[(None, None, 0, 0)], (cfg.block_m, cfg.head_dim), (0, 0)), box_rank=2)

        def tile_loaders(m_block, head, batch, kv_len, q_start, rows):
            batch_q = 0 if cutlass.const_expr(cfg.varlen_q) else batch  # Q's batch index
            if cutlass.const_expr(cfg.gathers_q):
                load_q = self._gathered_q_loader(mQ, sQ, m_block, head, batch_q, q_start, rows,
                                                 q_full, cute.arch.lane_idx(), 32)
            else:
                gQ = cute.local_tile(mQ_tma[(None, None, head, batch)],
                                     (cfg.block_m, cfg.head_dim), (m_block, 0))
                _, tQgQ = tma.partition(tma_q, sQ, gQ, box_rank=2)

                def load_q(q_stage):
                    with cute.arch.elect_one():
                        cute.arch.mbarrier_arrive_and_expect_tx(q_full + q_stage, q_bytes)
                    cute.copy(tma_q, tQgQ, tQsQ[(None, q_stage)], tma_bar_ptr=q_full + q_stage)

            if cutlass.const_expr(not cfg.paged):
                gK = cute.local_tile(mK_tma[(None, None, head, batch)],
                                     (cfg.block_n, cfg.head_dim), (None, 0))
                gV = cute.local_tile(mV_tma[(None, None, head, batch)],
                                     (cfg.head_dim, cfg.block_n), (0, None))
                tKsK, tKgK = tma.partition(tma_k, sK, gK, box_rank=2)
                tVsV, tVgV = tma.partition(tma_v, sV, gV, box_rank=2)

                def load_k(j, state):
                    self.loader.load(tma_k, tKgK[(None, j)], tKsK[(None, state.index)],
                                     pipe_k.producer_get_barrier(state))

                def load_v(j, state):
                    self.loader.load(tma_v, tVgV[(None, j)], tVsV[(None, state.index)],
                                     pipe_v.producer_get_barrier(state))

                return load_q, load_k, load_v, None

            # (box, d, box in page, 1, page) and (box, d, box in stage, 1, stage); V the same
            # with its two leading modes swapped
            box = cfg.kv_box
            tKsK, tKgK = tma.partition(
                tma_k, cute.flat_divide(sK, (box, cfg.head_dim)),
                cute.flat_divide(mK_tma[(None, None, head, None)], (box, cfg.head_dim)),
                box_rank=2)
            tVsV, tVgV = tma.partition(
                tma_v, cute.flat_divide(sV, (cfg.head_dim, box)),
                cute.flat_divide(mV_tma[(None, None, head, None)], (cfg.head_dim, box)),
                box_rank=2)

            def refill(first_box):
                """Lane l's page: the one holding the tile's box ``first_box + l`` (each lane
                one page-table load, all 32 at once; the boxes then take theirs by shuffle)."""
                key = (first_box + cute.arch.lane_idx()) * box
                page = cutlass.Int32(-1)
                if key < kv_len:
                    page = mPageTable[batch, key // cfg.page_size]
                return page

            def load_k(j, state, pages, first_box):
                for i in cutlass.range_constexpr(cfg.block_n // box):
                    page, at = self._page_of(pages, first_box, j * (cfg.block_n // box) + i)
                    self.loader.load(tma_k, tKgK[(None, at, 0, page)],
                                     tKsK[(None, i, 0, state.index)],
                                     pipe_k.producer_get_barrier(state))

            def load_v(j, state, pages, first_box):
                for i in cutlass.range_constexpr(cfg.block_n // box):
                    page, at = self._page_of(pages, first_box, j * (cfg.block_n // box) + i)
                    self.loader.load(tma_v, tVgV[(None, 0, at, page)],
                                     tVsV[(None, 0, i, state.index)],
                                     pipe_v.producer_get_barrier(state))

            return load_q, load_k, load_v, refill

        self._produce_walk(pipe_k, pipe_v, q_empty, mSeqlensK, items, prob, tile_loaders)

    @cute.jit
    def _page_of(self, pages, first_box, g):
        """(pool page, box index inside it) of the tile's box ``g`` (keys g * kv_box ..),
        from lane g - first_box's cached page (``refill``): -1 past the sequence's keys, an
        out-of-range TMA coordinate, so the box lands as zeros (its bytes still count) and
        no page-table entry past the sequence is trusted."""
        page = cute.arch.shuffle_sync(pages, g - first_box)
        return page, (g * self.cfg.kv_box % self.cfg.page_size) // self.cfg.kv_box

    @cute.jit
    def _kv_len(self, mSeqlensK, batch, seqlen_k):
        """Keys of this tile's sequence: ``seqlen_k`` (dense), or its cache length (paged)."""
        if cutlass.const_expr(self.cfg.paged):
            return mSeqlensK[batch]
        return seqlen_k

    @cute.jit
    def produce_cp_async(self, pipe_k, pipe_v, q_full, q_empty, mQ, mK, mVt, sQ, sK, sV,
                         mPageTable, mSeqlensK, items, prob):
        """A warpgroup, per tile: Q, K_j and V_j (``_produce_tile``'s order), 16 bytes per
        cp.async into the same swizzled stages; each thread arrives (noinc) when its copies
        land. Key rows past s_k are zeros in V (P is 0 there, and 0 * garbage can be NaN);
        in K they are masked. Paged: each 16-byte vector's source row is looked up in the
        page table (the paper's cp.async-paged variant)."""
        cfg = self.cfg
        tidx, _, _ = cute.arch.thread_idx()

        def tile_loaders(m_block, head, batch, kv_len, q_start, rows):
            batch_q = 0 if cutlass.const_expr(cfg.varlen_q) else batch  # Q's batch index
            if cutlass.const_expr(cfg.gathers_q):
                load_q = self._gathered_q_loader(mQ, sQ, m_block, head, batch_q, q_start, rows,
                                                 q_full, tidx, WARPGROUP)
            else:
                gQ = mQ[(None, None, head, batch)]  # (s_q, d)
                q_part = cpa.partition_operand(gQ, sQ, (cfg.block_m, cfg.head_dim), tidx,
                                               WARPGROUP)

                def load_q(q_stage):
                    cpa.load_tile(q_part, m_block, 0, q_stage, gQ.shape,
                                  (cfg.block_m, cfg.head_dim))
                    self.loader.commit(q_full + q_stage)

            if cutlass.const_expr(not cfg.paged):
                gK = mK[(None, None, head, batch)]  # (s_k, d)
                gVt = mVt[(None, None, head, batch)]  # (d, s_k)
                k_part = cpa.partition_operand(gK, sK, (cfg.block_n, cfg.head_dim), tidx,
                                               WARPGROUP)
                v_part = cpa.partition_operand(gVt, sV, (cfg.head_dim, cfg.block_n), tidx,
                                               WARPGROUP)

                def load_k(j, state):
                    cpa.load_tile(k_part, j, 0, state.index, gK.shape,
                                  (cfg.block_n, cfg.head_dim))

                def load_v(j, state):
                    cpa.load_tile(v_part, 0, j, state.index, gVt.shape,
                                  (cfg.head_dim, cfg.block_n))

                return load_q, load_k, load_v, None

            k_part = cpa.partition_stage(sK, (cfg.block_n, cfg.head_dim), tidx, WARPGROUP, 1)
            v_part = cpa.partition_stage(sV, (cfg.head_dim, cfg.block_n), tidx, WARPGROUP, 0)
            vec = cpa.VECTOR_BYTES * 8 // mK.element_type.width
            size = cfg.page_size

            def load_k(j, state):
                def key_vector(row, col):  # row: a key of block j; col: a d offset
                    key = j * cfg.block_n + row
                    page = mPageTable[batch, key // size]
                    return cute.local_tile(mK[(key % size, None, head, page)], (vec,),
                                           (col // vec,))

                cpa.load_gathered(k_part, state.index, kv_len - j * cfg.block_n, 0,
                                  key_vector, zero_past=False)

            def load_v(j, state):
                def value_vector(row, col):  # row: a d offset; col: a key of block j
                    key = j * cfg.block_n + col
                    page = mPageTable[batch, key // size]
                    return cute.local_tile(mVt[(None, key % size, head, page)], (vec,),
                                           (row // vec,))

                cpa.load_gathered(v_part, state.index, kv_len - j * cfg.block_n, 1,
                                  value_vector, zero_past=True)

            return load_q, load_k, load_v, None

        self._produce_walk(pipe_k, pipe_v, q_empty, mSeqlensK, items, prob, tile_loaders)

    @cute.jit
    def _produce_walk(self, pipe_k, pipe_v, q_empty, mSeqlensK, items, prob,
                      tile_loaders: cutlass.Constexpr):
        """The producer's walk over this CTA's tiles, both mechanisms: ``tile_loaders(m_block,
        head, batch, keys)`` gives that tile's (load_q, load_k, load_v), traced once inside the
        iteration, so what they capture is this tile's; the ring position is carried as a
        plain count of key blocks (``_ring``), then the rings' tails."""
        cfg = self.cfg
        local = cutlass.Int32(0)  # tiles this CTA has done
        done = cutlass.Int32(0)  # key blocks this CTA has loaded: the ring's position
        for k in cutlass.range(scheduler.my_item_count(cfg, items), unroll=1):
            worker, workers = scheduler.worker()
            item = worker + k * workers
            for half in cutlass.range(scheduler.item_tiles(cfg, item, prob.rows), unroll=1):
                m_block, head, batch, split = scheduler.tile_coords(cfg, item, half, prob.rows,
                                                                    prob.heads, prob.batches)
                kv_len = self._kv_len(mSeqlensK, batch, prob.seqlen_k)
                q_start, seqlen_q, rows = self._tile_queries(batch, prob)
                load_q, load_k, load_v, refill = tile_loaders(m_block, head, batch, kv_len,
                                                              q_start, rows)
                lo, hi = self._key_range(m_block, split, kv_len, prob, seqlen_q, rows)
                self._produce_tile(pipe_k, pipe_v, q_empty, local, done, lo, hi, load_q,
                                   load_k, load_v, refill)
                done += hi - lo
                local += 1
        pipe_k.producer_tail(self._ring(done, producer=True))
        pipe_v.producer_tail(self._ring(done, producer=True))

    @cute.jit
    def _key_range(self, m_block, split, kv_len, prob, seqlen_q, rows):
        """The key blocks [lo, hi) a tile walks: those its rows see (``key_blocks``), or
        (split_kv) its split's range of them; none for a varlen_q tile past its sequence's
        rows (it still takes its Q buffer and stores nothing, like a tile without keys)."""
        n_blocks = scheduler.key_blocks(self.cfg, m_block, seqlen_q, kv_len, prob.group)
        if cutlass.const_expr(self.cfg.varlen_q):
            n_blocks = cutlass.select_(m_block * self.cfg.block_m < rows, n_blocks, 0)
        return scheduler.block_range(self.cfg, n_blocks, split, prob.splits)

    @cute.jit
    def _tile_queries(self, batch, prob):
        """(the sequence's first row in Q, its queries, its tile rows): (0, s_q, rows), or
        (varlen_q) from the query offsets."""
        if cutlass.const_expr(self.cfg.varlen_q):
            start = prob.cu_seqlens_q[batch]
            count = prob.cu_seqlens_q[batch + 1] - start
            return start, count, count * prob.group
        return 0, prob.seqlen_q, prob.rows

    @cute.jit
    def _sequence_rows(self, mX, q_start):
        """``mX`` (rows, ...) seen from a varlen_q sequence's first query (packed rows:
        the position sub-mode is offset); unchanged otherwise."""
        if cutlass.const_expr(not self.cfg.varlen_q):
            return mX
        offset = [0] * cute.rank(mX)
        offset[0] = (0, q_start) if cutlass.const_expr(self.cfg.pack_gqa) else q_start
        return cute.domain_offset(tuple(offset), mX)

    @cute.jit
    def _produce_tile(self, pipe_k, pipe_v, q_empty, local, done, lo, hi,
                      load_q: cutlass.Constexpr, load_k: cutlass.Constexpr,
                      load_v: cutlass.Constexpr, refill: cutlass.Constexpr):
        """One tile's loads, the same order for every mechanism: K_0 and V_0 first (they
        need only a free stage, so they overlap the consumers' last blocks of the previous
        tile), then Q once the consumers have finished reading the Q that buffer held before
        (q empty: the previous tile's, or with two buffers the one before), then the
        remaining key blocks (blocks lo .. hi - 1)."""
        first = cutlass.min(hi - lo, 1)
        self._produce_kv(pipe_k, pipe_v, self._ring(done, producer=True), lo, lo + first, load_k,
                         load_v, refill)
        q_stage, q_phase = self._q_slot(local)
        if local >= self.cfg.q_stages:  # this buffer's previous tile has been read
            cute.arch.mbarrier_wait(q_empty + q_stage, 1 - q_phase)
        load_q(q_stage)
        self._produce_kv(pipe_k, pipe_v, self._ring(done + first, producer=True), lo + first,
                         hi, load_k, load_v, refill)

    @cute.jit
    def _produce_kv(self, pipe_k, pipe_v, state, start, stop, load_k: cutlass.Constexpr,
                    load_v: cutlass.Constexpr, refill: cutlass.Constexpr = None):
        """The K/V schedule: for key blocks start..stop-1 take the next empty K stage,
        ``load_k`` into it, commit, then the same for V (TMA: the bytes complete the barrier,
        a no-op here; cp.async: each thread arrives when its copies land). ``state`` is the
        ring position of block ``start`` (the same in both rings); the caller rebuilds its own
        from counts (``_ring``). Paged TMA (``refill``): the warp keeps the pages of 32 boxes
        in its lanes, refilled when a block's boxes run past them, so a box costs a shuffle,
        not a dependent page-table load."""
        boxes = self.cfg.block_n // self.cfg.kv_box  # boxes per block
        pages = cutlass.Int32(-1)
        first_box = cutlass.Int32(-64)  # no box is cached yet
        for j in cutlass.range(start, stop, unroll=1):
            if cutlass.const_expr(refill is not None):
                if j * boxes + boxes > first_box + 32:
                    first_box = j * boxes
                    pages = refill(first_box)
            pipe_k.producer_acquire(state)
            if cutlass.const_expr(refill is not None):
                load_k(j, state, pages, first_box)
            else:
                load_k(j, state)
            pipe_k.producer_commit(state)
            pipe_v.producer_acquire(state)
            if cutlass.const_expr(refill is not None):
                load_v(j, state, pages, first_box)
            else:
                load_v(j, state)
            pipe_v.producer_commit(state)
            state.advance()

    def _ring(self, done, producer: bool = False):
        """The pipeline state after ``done`` key blocks, rebuilt from that count at each
        tile: a state advanced inside a helper's or a branch's staged loop does not reliably
        come back out of it (the tracer rebuilds such objects), while a plain Int32 count
        does. Producers start on phase 1 (every stage empty), consumers on 0."""
        stages = self.cfg.stages
        phase = (done // stages) % 2
        if producer:
            phase = 1 - phase
        return pipeline.PipelineState(stages, done, done % stages, phase)

    @cute.jit
    def consume(self, pipe_k, pipe_v, q_full, q_empty, qk_mma, pv_mma, sQ, sK, sV, mO, mLSE,
                mSeqlensK, items, prob, scale_log2):
        """A consumer warpgroup, per tile: its 64 query rows against the tile's key blocks
        (``_consume_tile``), or (``skips_idle``) with none of its rows in the tile, only the
        stages' waits and releases (``_pass_tile``)."""
        cfg = self.cfg
        tidx, _, _ = cute.arch.thread_idx()
        ctid = tidx - WARPGROUP
        wg = ctid // WARPGROUP  # 0 .. consumers - 1: rows [64 wg, 64 wg + 64) of the block
        lane = tidx % 32
        warp_in_wg = (ctid % WARPGROUP) // 32
        qk_thr = qk_mma.get_slice(wg * WARPGROUP)
        pv_thr = pv_mma.get_slice(wg * WARPGROUP)
        # this warpgroup's operands and accumulator shapes, and this thread's first row (in
        # its block) and first column inside a block (the WGMMA accumulator layout): made
        # once, outside the tile loop
        frags = _Problem(
            tSrQ=qk_mma.make_fragment_A(qk_thr.partition_A(sQ)),
            tSrK=qk_mma.make_fragment_B(qk_thr.partition_B(sK)),
            tOrV=pv_mma.make_fragment_B(pv_thr.partition_B(sV)),
            s_shape=qk_thr.partition_shape_C((cfg.block_m, cfg.block_n)),
            o_shape=pv_thr.partition_shape_C((cfg.block_m, cfg.head_dim)),
            row_in_block=wg * 64 + warp_in_wg * 16 + lane // 4, col_in_tile=(lane % 4) * 2)
        # set once, here: a field set inside a staged loop cannot be read after it
        pv_mma.set(warpgroup.Field.ACCUMULATE, True)

        # pingpong: warpgroup w waits on barrier 1 + w before issuing its GEMMs and then
        # signals the next one's, round robin (ids 1 .. consumers are this kernel's only
        # named barriers). The turn runs on across tiles (all warpgroups walk the same tiles,
        # so they take the same number of turns): the first warpgroup starts its next tile's
        # GEMMs while the last one still finishes its softmax, P V and epilogue. (Passing the
        # turn only at the next tile's start left the tensor cores idle for an epilogue per
        # tile.) The last warpgroup opens the first turn, once; its final pass is left
        # unanswered when the CTA exits, as in FlashAttention-3.
        if cutlass.const_expr(cfg.pingpong):
            if wg == cfg.consumers - 1:
                self._turn(pass_on=True)  # warpgroup 0 goes first

        local = cutlass.Int32(0)
        done = cutlass.Int32(0)  # key blocks this CTA has consumed: the ring's position
        for k in cutlass.range(scheduler.my_item_count(cfg, items), unroll=1):
            worker, workers = scheduler.worker()
            item = worker + k * workers
            for half in cutlass.range(scheduler.item_tiles(cfg, item, prob.rows), unroll=1):
                m_block, head, batch, split = scheduler.tile_coords(cfg, item, half, prob.rows,
                                                                    prob.heads, prob.batches)
                seqlen_k = self._kv_len(mSeqlensK, batch, prob.seqlen_k)
                q_start, seqlen_q, rows = self._tile_queries(batch, prob)
                lo, hi = self._key_range(m_block, split, seqlen_k, prob, seqlen_q, rows)
                if cutlass.const_expr(cfg.skips_idle):
                    if m_block * cfg.block_m + wg * 64 >= rows:
                        self._pass_tile(pipe_k, pipe_v, q_full, q_empty, local, done, lo, hi)
                    else:
                        self._consume_tile(pipe_k, pipe_v, q_full, q_empty, qk_mma, pv_mma,
                                           frags, sV, mO, mLSE, prob, scale_log2, m_block,
                                           head, batch, split, seqlen_k, lo, hi, local,
                                           done, q_start, seqlen_q, rows)
                else:
                    self._consume_tile(pipe_k, pipe_v, q_full, q_empty, qk_mma, pv_mma, frags,
                                       sV, mO, mLSE, prob, scale_log2, m_block, head, batch,
                                       split, seqlen_k, lo, hi, local, done, q_start,
                                       seqlen_q, rows)
                done += hi - lo
                local += 1

    @cute.jit
    def _pass_tile(self, pipe_k, pipe_v, q_full, q_empty, local, done, lo, hi):
        """A warpgroup with no rows in this tile: it takes and frees every stage of the tile
        and its Q buffer as the busy one does (the rings count both warpgroups' releases),
        issuing no GEMM. Q is waited for first: its buffer's empty barrier must not count
        this tile's arrival before the previous tile's."""
        q_stage, q_phase = self._q_slot(local)
        cute.arch.mbarrier_wait(q_full + q_stage, q_phase)
        cute.arch.mbarrier_arrive(q_empty + q_stage)
        read = self._ring(done)
        for _ in cutlass.range(lo, hi, unroll=1):
            self.loader.consumer_wait(pipe_k, read)
            self.loader.consumer_release(pipe_k, read)
            self.loader.consumer_wait(pipe_v, read)
            self.loader.consumer_release(pipe_v, read)
            read.advance()

    @cute.jit
    def _consume_tile(self, pipe_k, pipe_v, q_full, q_empty, qk_mma, pv_mma, frags, sV, mO,
                      mLSE, prob, scale_log2, m_block, head, batch, split, seqlen_k, lo, hi,
                      local, done, q_start, seqlen_q, rows):
        """One tile of a consumer warpgroup: S, softmax and P V over key blocks lo .. hi - 1
        in the configuration's schedule, then the epilogue (split_kv: into the split's
        partial, batch index split x b + batch)."""
        cfg = self.cfg
        dtype = sV.element_type
        tSrQ, tSrK, tOrV = frags.tSrQ, frags.tSrK, frags.tOrV
        col_in_tile = frags.col_in_tile
        p_steps = cfg.block_n // 16
        row0 = m_block * cfg.block_m + frags.row_in_block
        read = self._ring(done)
        # the register tensors are made per tile: nothing in them lives from one tile to the
        # next, so they need not be values carried around the tile loop (this alone did not
        # lift the C7512 of bf16, d = 128; the loop's form did, see _my_item_count)
        acc_o = cute.make_rmem_tensor(frags.o_shape, cutlass.Float32)
        acc_o.fill(0.0)
        row_max = cute.make_rmem_tensor((2,), cutlass.Float32)  # rows r and r + 8
        row_max.fill(-cutlass.Float32.inf)
        row_sum = cute.make_rmem_tensor((2,), cutlass.Float32)
        row_sum.fill(0.0)
        acc_s = cute.make_rmem_tensor(frags.s_shape, cutlass.Float32)
        correction = cute.make_rmem_tensor((2,), cutlass.Float32)  # O's rescale
        # P, converted element by element, is the A operand of P V (see the docstring)
        tOrP = cute.make_rmem_tensor(cute.make_layout(
            ((2, 2, 2), 1, p_steps), stride=((1, 2, 4), 0, 8)), dtype)
        tOrP_as_s = cute.make_tensor(tOrP.iterator, acc_s.layout)
        q_stage, q_phase = self._q_slot(local)
        cute.arch.mbarrier_wait(q_full + q_stage, q_phase)
        if cutlass.const_expr(cfg.load == "cp_async" or cfg.gathers_q):
            cute.arch.fence_view_async_shared()  # Q came through the generic proxy

        if cutlass.const_expr(not cfg.overlap):
            for j in cutlass.range(lo, hi, unroll=1):
                self.loader.consumer_wait(pipe_k, read)
                self._issue_qk(qk_mma, acc_s, tSrQ, tSrK, q_stage, read.index)
                warpgroup.wait_group(0)
                self.loader.consumer_release(pipe_k, read)
                self._release_q_after(j, hi, q_empty + q_stage)
                apply_mask(cfg, acc_s, j, row0, col_in_tile, seqlen_q, seqlen_k,
                           prob.group)
                online_softmax(acc_s, correction, row_max, row_sum, scale_log2)
                rescale(acc_o, correction)
                tOrP_as_s.store(acc_s.load().to(dtype))
                self.loader.consumer_wait(pipe_v, read)
                if j == hi - 1:
                    self._zero_v_tail(sV, read.index, seqlen_k - j * cfg.block_n)
                self._issue_pv(pv_mma, acc_o, tOrP, tOrV, read.index)
                warpgroup.wait_group(0)
                self.loader.consumer_release(pipe_v, read)
                read.advance()
        else:
            if hi > lo:
                # V_{j-1} (this iteration's P V) is waited for and released one iteration
                # behind K_j
                release = read.clone()
                # block lo: S_lo and its softmax; its P V is issued with S_{lo+1}
                self.loader.consumer_wait(pipe_k, read)
                if cutlass.const_expr(cfg.pingpong):
                    self._turn(pass_on=False)
                self._issue_qk(qk_mma, acc_s, tSrQ, tSrK, q_stage, read.index)
                if cutlass.const_expr(cfg.pingpong):
                    self._turn(pass_on=True)
                warpgroup.wait_group(0)
                self.loader.consumer_release(pipe_k, read)
                self._release_q_after(lo, hi, q_empty + q_stage)
                apply_mask(cfg, acc_s, lo, row0, col_in_tile, seqlen_q, seqlen_k,
                           prob.group)
                online_softmax(acc_s, correction, row_max, row_sum, scale_log2)
                read.advance()
                for j in cutlass.range(lo + 1, hi, unroll=1):
                    self.loader.consumer_wait(pipe_k, read)
                    if cutlass.const_expr(cfg.pv_wait == "late"):
                        # P_{j-2} V_{j-2}, issued in the last iteration, done (nothing is in
                        # flight at j = lo + 1): waited for here, behind the loop's back
                        # edge, which ptxas does not hoist a wait across (PV_WAIT)
                        warpgroup.wait_group(0)
                        if j > lo + 1:
                            self.loader.consumer_release(pipe_v, release)  # V_{j-2}
                            release.advance()
                    if cutlass.const_expr(cfg.pingpong):
                        self._turn(pass_on=False)
                    # P_{j-1} from S_{j-1}, just before S_j overwrites it (here, not after the
                    # softmax: left to itself the compiler sank it here for bf16 but not for
                    # fp16, two loop shapes for one source; this placement measured 1% faster
                    # at d = 128 in both dtypes)
                    tOrP_as_s.store(acc_s.load().to(dtype))
                    # S_j, while O takes j-1's rescale
                    self._issue_qk(qk_mma, acc_s, tSrQ, tSrK, q_stage, read.index)
                    rescale(acc_o, correction)
                    self.loader.consumer_wait(pipe_v, release)
                    self._issue_pv(pv_mma, acc_o, tOrP, tOrV, release.index)  # P_{j-1} V
                    if cutlass.const_expr(cfg.pingpong):
                        self._turn(pass_on=True)
                    warpgroup.wait_group(1)  # S_j is in; P V may still run
                    self.loader.consumer_release(pipe_k, read)  # K_j is read
                    self._release_q_after(j, hi, q_empty + q_stage)
                    apply_mask(cfg, acc_s, j, row0, col_in_tile, seqlen_q, seqlen_k,
                               prob.group)
                    online_softmax(acc_s, correction, row_max, row_sum, scale_log2)
                    if cutlass.const_expr(cfg.pv_wait == "early"):
                        # written after the softmax, as FlashAttention-3 writes it; ptxas
                        # hoists it to the softmax's start (PV_WAIT), so P V is done before
                        # the softmax runs. Written before the softmax instead, the SASS
                        # differs: 2-4% slower at d = 128 (geomean)
                        warpgroup.wait_group(0)
                        self.loader.consumer_release(pipe_v, release)  # V_{j-1}
                        release.advance()
                    read.advance()
                if cutlass.const_expr(cfg.pv_wait == "late"):
                    warpgroup.wait_group(0)  # the loop's last P V
                    if hi - lo > 1:
                        self.loader.consumer_release(pipe_v, release)
                        release.advance()
                tOrP_as_s.store(acc_s.load().to(dtype))
                rescale(acc_o, correction)
                self.loader.consumer_wait(pipe_v, release)
                self._zero_v_tail(sV, release.index, seqlen_k - (hi - 1) * cfg.block_n)
                self._issue_pv(pv_mma, acc_o, tOrP, tOrV, release.index)
                warpgroup.wait_group(0)
                self.loader.consumer_release(pipe_v, release)
        if hi == lo:  # no Q K^T read Q: free it for the next tile's all the same
            cute.arch.mbarrier_arrive(q_empty + q_stage)
        out_batch = batch
        if cutlass.const_expr(cfg.split_kv):
            out_batch = batch + split * prob.batches
        if cutlass.const_expr(cfg.varlen_q):
            out_batch = split  # the partial's batch mode is the split's; else 0
        epilogue(cfg, acc_o, row_max, row_sum, self._sequence_rows(mO, q_start),
                 self._sequence_rows(mLSE, q_start), head, out_batch, row0, rows, scale_log2)

    @cute.jit
    def _zero_v_tail(self, sV, stage, keys):
        """TMA-paged: zeros in V stage ``stage``'s keys ``keys`` .. block_n - 1 (past the
        sequence; nothing when ``keys`` >= block_n) before P V reads them. A page's rows past
        the sequence are in the pool's bounds, so the TMA brings whatever they hold (an
        unwritten cache can hold NaN, and 0 * NaN is NaN); dense TMA and cp.async zero-fill
        them. Only the tile's last block can need it. Each consumer warpgroup writes all the
        zeros (the other may be reading the stage already: it reads the same zeros), then
        orders them before its own WGMMA (proxy fence, the warpgroup's named barrier)."""
        cfg = self.cfg
        if cutlass.const_expr(cfg.paged and cfg.load == "tma"):
            if keys < cfg.block_n:
                tidx, _, _ = cute.arch.thread_idx()
                sVs = sV[(None, None, stage)]  # (d, block_n)
                first = cutlass.max(keys, 0) * cfg.head_dim
                for idx in cutlass.range(first + tidx % WARPGROUP, cfg.block_n * cfg.head_dim,
                                         WARPGROUP, unroll=1):
                    sVs[idx % cfg.head_dim, idx // cfg.head_dim] = sVs.element_type(0)
                cute.arch.fence_view_async_shared()
                pipeline.NamedBarrier(
                    barrier_id=int(AttentionBarrier.V_TAIL) + tidx // WARPGROUP - 1,
                    num_threads=WARPGROUP).arrive_and_wait()

    @cute.jit
    def _turn(self, pass_on: cutlass.Constexpr):
        """pingpong: wait for this warpgroup's turn (its barrier, 1 + w), or pass the turn on to
        the next warpgroup (arrive on its barrier). The warpgroup is read from the thread index
        at each call rather than kept: a value live across the whole tile loop cost ptxas a
        few spilled registers at d = 128."""
        wg = cute.arch.thread_idx()[0] // WARPGROUP - 1
        if cutlass.const_expr(pass_on):
            wg = (wg + 1) % self.cfg.consumers
        turn = pipeline.NamedBarrier(barrier_id=int(AttentionBarrier.TURN) + wg,
                                     num_threads=2 * WARPGROUP)
        if cutlass.const_expr(pass_on):
            turn.arrive()
        else:
            turn.arrive_and_wait()

    @cute.jit
    def _q_slot(self, local):
        """Tile ``local``'s Q buffer and the phase of its full barrier (buffer i serves tiles
        i, i + q_stages, ...). One buffer: buffer 0, a constant, as before there were two."""
        if cutlass.const_expr(self.cfg.q_stages == 1):
            return 0, local % 2
        return local % self.cfg.q_stages, (local // self.cfg.q_stages) % 2

    @cute.jit
    def _release_q_after(self, j, hi, q_empty):
        """Once the tile's last Q K^T (block j = hi - 1) has completed, Q is read: arrive
        on q empty there, not after the tile, so the next tile's Q loads under this tile's
        last softmax, P V and epilogue (a TMA load's latency, about a microsecond, is
        otherwise exposed at every tile start: 4 key blocks per tile at s = 512)."""
        if j == hi - 1:
            cute.arch.mbarrier_arrive(q_empty)

    @cute.jit
    def _issue_qk(self, qk_mma, acc_s, tSrQ, tSrK, q_stage, stage):
        """S = Q K^T into acc_s, one commit group (not waited for)."""
        warpgroup.fence()  # the softmax read acc_s: order it before WGMMA writes it
        for kb in cutlass.range_constexpr(cute.size(tSrQ, mode=[2])):
            qk_mma.set(warpgroup.Field.ACCUMULATE, kb != 0)
            cute.gemm(qk_mma, acc_s, tSrQ[(None, None, kb, q_stage)], tSrK[(None, None, kb, stage)],
                      acc_s)
        warpgroup.commit_group()

    @cute.jit
    def _issue_pv(self, pv_mma, acc_o, tOrP, tOrV, stage):
        """O += P V, one commit group (not waited for)."""
        warpgroup.fence()  # P and the rescaled O come from ordinary register writes
        for kb in cutlass.range_constexpr(cute.size(tOrP, mode=[2])):
            cute.gemm(pv_mma, acc_o, tOrP[(None, None, kb)], tOrV[(None, None, kb, stage)],
                      acc_o)
        warpgroup.commit_group()
