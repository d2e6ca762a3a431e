"""The producers of ``FlashAttentionSm90``, a mixin (``kernel.py`` holds the class: its host
entry points, the kernel and the helpers both roles use).

TMA (``produce``): one warp loads Q per tile and K_j, V_j of every key block into the rings
(paged: a stage as boxes, one per page, the pool's page a coordinate; Q gathered by rows
where ``gathers_q``). cp.async (``produce_cp_async``): a warpgroup copies the same tiles 16
bytes a thread into the same swizzled stages (paged: a page-table load per lane per
block, the line's address shuffled to the lanes copying it, ``cpasync.load_lines``). Both
walk the tiles alike (``_produce_walk``, ``_produce_tile``, ``_produce_kv``).
"""

from __future__ import annotations

from cutetma import dsl
from cutetma.copy import cpasync as cpa
from cutetma.copy import tma
from cutetma.kernels.attention import scheduler
from cutetma.kernels.attention.config import WARPGROUP

cutlass, cute = dsl.cutlass()


class Producers:
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
    def produce_cp_async(self, pipe_k, pipe_v, q_full, q_empty, mQ, mK, mVt, sQ, sK, sV,
                         mPageTable, mSeqlensK, items, prob,
                         transpose: cutlass.Constexpr = None):
        """A warpgroup, per tile: Q, K_j and V_j (``_produce_tile``'s order), 16 bytes per
        cp.async into the same swizzled stages; each thread arrives (noinc) when its copies
        land. Key rows past s_k are zeros in V (P is 0 there, and 0 * garbage can be NaN);
        in K they are masked. Paged: each 16-byte vector's source row comes from the page
        table (the paper's cp.async-paged variant), one load per lane per block.
        ``transpose`` (``transposes_v``: sV is the raw V ring): transposes the count-th key
        block's V (``_produce_kv``)."""
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

            # A key's line of d is copied by `along` neighbouring lanes (a 128-byte segment
            # each), and every lane of a segment copies the same keys: so each lane looks up
            # the page of one of its segment's keys per block (before the wait for a stage)
            # and the copies take each line's address by shuffle
            along = cpa.segment_lanes(mK.element_type, cfg.head_dim)
            k_lines = cpa.LineViews(sK, (cfg.block_n, cfg.head_dim), tidx, WARPGROUP, 0, along)
            v_lines = cpa.LineViews(sV, (cfg.head_dim, cfg.block_n), tidx, WARPGROUP, 1, along)
            entries = k_lines.entries
            size = cfg.page_size
            # the tile's K/V head once (under GQA a division), not per line
            gK = mK[(None, None, head, None)]  # (row in page, d, page)
            gVt = mVt[(None, None, head, None)]  # (d, row in page, page)
            pages = cute.make_rmem_tensor((entries,), cutlass.Int32)
            page_rows = cute.make_rmem_tensor((entries,), cutlass.Int32)  # key's row in page
            lane = cute.arch.lane_idx()

            def refill(j):
                """Block j's page ids, a page-table load per lane per ``along`` lines,
                issued before the producer waits for a free stage."""
                for e in cutlass.range_constexpr(entries):
                    p = k_lines.held_pass(e, lane)
                    key = j * cfg.block_n + k_lines.first_line + p * k_lines.lines_at_once
                    page = cutlass.Int32(0)  # past the keys: never read
                    if p < k_lines.passes and key < kv_len:
                        page = mPageTable[batch, key // size]
                    pages[e] = page
                    page_rows[e] = key % size

            def line_addresses(operand, at):
                """This lane's lines' global addresses in ``operand`` (a 64-bit integer
                each), ``at(row in page, page)`` its coordinate of a line's first element."""
                held = cute.make_rmem_tensor((entries,), cutlass.Int64)
                for e in cutlass.range_constexpr(entries):
                    held[e] = (operand.iterator + cute.crd2idx(at(page_rows[e], pages[e]),
                                                               operand.layout)).toint()
                return lambda p: cpa.shuffle_in_segment(held[p // along], p % along, along)

            def load_k(j, state):
                cpa.load_lines(k_lines, state.index, kv_len - j * cfg.block_n,
                               line_addresses(gK, lambda row, page: (row, 0, page)),
                               zero_past=False)

            def load_v(j, state):
                cpa.load_lines(v_lines, state.index, kv_len - j * cfg.block_n,
                               line_addresses(gVt, lambda row, page: (0, row, page)),
                               zero_past=True)

            return load_q, load_k, load_v, refill

        self._produce_walk(pipe_k, pipe_v, q_empty, mSeqlensK, items, prob, tile_loaders,
                           transpose)

    @cute.jit
    def _produce_walk(self, pipe_k, pipe_v, q_empty, mSeqlensK, items, prob,
                      tile_loaders: cutlass.Constexpr, transpose: cutlass.Constexpr = None):
        """The producer's walk over this CTA's tiles, both mechanisms: ``tile_loaders(m_block,
        head, batch, keys)`` gives that tile's (load_q, load_k, load_v), traced once inside the
        iteration, so what they capture is this tile's; the ring position is carried as a
        plain count of key blocks (``_ring``), then (``transpose``) the last block's V
        transpose and the rings' tails."""
        cfg = self.cfg
        local = cutlass.Int32(0)  # tiles this CTA has done
        done = cutlass.Int32(0)  # key blocks this CTA has loaded: the ring's position
        for k in cutlass.range(scheduler.my_item_count(cfg, items), unroll=1):
            worker, workers = scheduler.worker()
            item = worker + k * workers
            for half in cutlass.range(scheduler.item_tiles(cfg, item, prob.rows), unroll=1):
                tile = self._tile(item, half, prob, mSeqlensK)
                load_q, load_k, load_v, refill = tile_loaders(tile.m_block, tile.head,
                                                              tile.batch, tile.kv_len,
                                                              tile.q_start, tile.rows)
                tile = self._key_blocks(tile, prob)
                self._produce_tile(pipe_k, pipe_v, q_empty, local, done, tile.lo, tile.hi,
                                   load_q, load_k, load_v, refill, transpose)
                done += tile.hi - tile.lo
                local += 1
        if cutlass.const_expr(transpose is not None):
            if done > 0:
                transpose(done - 1)
        pipe_k.producer_tail(self._ring(done, producer=True))
        pipe_v.producer_tail(self._ring(done, producer=True, stages=self.v_load_stages))

    @cute.jit
    def _produce_tile(self, pipe_k, pipe_v, q_empty, local, done, lo, hi,
                      load_q: cutlass.Constexpr, load_k: cutlass.Constexpr,
                      load_v: cutlass.Constexpr, refill: cutlass.Constexpr,
                      transpose: cutlass.Constexpr = None):
        """One tile's loads, the same order for every mechanism: K_0 and V_0 first (they
        need only a free stage, so they overlap the consumers' last blocks of the previous
        tile), then Q once the consumers have finished reading the Q that buffer held before
        (q empty: the previous tile's, or with two buffers the one before), then the
        remaining key blocks (blocks lo .. hi - 1)."""
        first = cutlass.min(hi - lo, 1)
        self._produce_kv(pipe_k, pipe_v, self._ring(done, producer=True), lo, lo + first, load_k,
                         load_v, refill, transpose)
        q_stage, q_phase = self._q_slot(local)
        if local >= self.cfg.q_stages:  # this buffer's previous tile has been read
            cute.arch.mbarrier_wait(q_empty + q_stage, 1 - q_phase)
        load_q(q_stage)
        self._produce_kv(pipe_k, pipe_v, self._ring(done + first, producer=True), lo + first,
                         hi, load_k, load_v, refill, transpose)

    @cute.jit
    def _produce_kv(self, pipe_k, pipe_v, state, start, stop, load_k: cutlass.Constexpr,
                    load_v: cutlass.Constexpr, refill: cutlass.Constexpr = None,
                    transpose: cutlass.Constexpr = None):
        """The K/V schedule: for key blocks start..stop-1 take the next empty K stage,
        ``load_k`` into it, commit, then the same for V (TMA: the bytes complete the barrier,
        a no-op here; cp.async: each thread arrives when its copies land). ``state`` is the
        ring position of block ``start`` (the same in both rings, but a raw V ring, where
        ``transposes_v``, has its own depth); the caller rebuilds its own from counts
        (``_ring``). ``transpose``
        (``transposes_v`` under cp.async): after block j's copies are issued, block j - 1's
        V is transposed. Paged TMA (``refill``): the warp keeps the pages of 32 boxes
        in its lanes, refilled when a block's boxes run past them, so a box costs a shuffle,
        not a dependent page-table load; paged cp.async: each block's pages, a load per lane,
        looked up before the wait for its stage and shuffled to the copies."""
        boxes = self.cfg.block_n // self.cfg.kv_box  # boxes per block
        pages = cutlass.Int32(-1)
        first_box = cutlass.Int32(-64)  # no box is cached yet
        boxed = refill is not None and self.cfg.load == "tma"
        raw_v = None  # transposes_v: the raw V ring's position (a depth of its own)
        if cutlass.const_expr(self.cfg.transposes_v):
            raw_v = self._ring(state.count, producer=True, stages=self.v_load_stages)
        for j in cutlass.range(start, stop, unroll=1):
            v_state = state if cutlass.const_expr(raw_v is None) else raw_v
            if cutlass.const_expr(boxed):
                if j * boxes + boxes > first_box + 32:
                    first_box = j * boxes
                    pages = refill(first_box)
            elif cutlass.const_expr(refill is not None):
                refill(j)  # cp.async: block j's pages into the producer's registers
            pipe_k.producer_acquire(state)
            if cutlass.const_expr(boxed):
                load_k(j, state, pages, first_box)
            else:
                load_k(j, state)
            pipe_k.producer_commit(state)
            pipe_v.producer_acquire(v_state)
            if cutlass.const_expr(boxed):
                load_v(j, v_state, pages, first_box)
            else:
                load_v(j, v_state)
            pipe_v.producer_commit(v_state)
            if cutlass.const_expr(transpose is not None):
                if state.count > 0:
                    transpose(state.count - 1)
            state.advance()
            if cutlass.const_expr(raw_v is not None):
                raw_v.advance()
