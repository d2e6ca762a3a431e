"""The attention backward's producers (``FlashAttentionBackwardSm90``'s mixin): K_n and V_n
once per CTA, then Q_m, dO_m and their LSE and D per query block into the Q / dO ring, by
one TMA warp (``produce``) or a cp.async warpgroup (``produce_cp_async``), into the same
swizzled stages."""

from __future__ import annotations

from cutetma import dsl
from cutetma.copy import cpasync as cpa
from cutetma.copy import tma
from cutetma.kernels.attention.config import WARPGROUP

cutlass, cute = dsl.cutlass()
from cutlass import pipeline  # noqa: E402


class BackwardProducers:
    @cute.jit
    def produce(self, pipe, kv_full, tma_q, mQ_tma, tma_do, mdO_tma, tma_k, mK_tma, tma_v,
                mV_tma, tma_lse, mLSE_tma, tma_d, mD_tma, smem, tile, kv_bytes):
        """One warp: K_n and V_n once (the kv_full barrier), then Q_m, dO_m and their LSE and
        D of every query block into the next free stage (one barrier per stage for all)."""
        cfg = self.cfg
        d = cfg.head_dim
        n, head, batch, kv_head = tile.n_block, tile.head, tile.batch, tile.kv_head
        tKsK, tKgK = tma.partition(tma_k, smem.sK, cute.local_tile(
            mK_tma[(None, None, kv_head, batch)], (cfg.block_n, d), (None, 0)), box_rank=2)
        tVsV, tVgV = tma.partition(tma_v, smem.sV, cute.local_tile(
            mV_tma[(None, None, kv_head, batch)], (cfg.block_n, d), (None, 0)), box_rank=2)
        with cute.arch.elect_one():
            cute.arch.mbarrier_arrive_and_expect_tx(kv_full, kv_bytes)
        cute.copy(tma_k, tKgK[(None, n)], tKsK[(None, 0)], tma_bar_ptr=kv_full)
        cute.copy(tma_v, tVgV[(None, n)], tVsV[(None, 0)], tma_bar_ptr=kv_full)
        tQsQ, tQgQ = tma.partition(tma_q, smem.sQ, cute.local_tile(
            mQ_tma[(None, None, head, batch)], (cfg.block_m, d), (None, 0)), box_rank=2)
        tOsO, tOgO = tma.partition(tma_do, smem.sdO, cute.local_tile(
            mdO_tma[(None, None, head, batch)], (cfg.block_m, d), (None, 0)), box_rank=2)
        tLsL, tLgL = tma.partition(tma_lse, smem.sLSE, cute.local_tile(
            mLSE_tma[(None, head, batch)], (cfg.block_m,), (None,)), box_rank=1)
        tDsD, tDgD = tma.partition(tma_d, smem.sD, cute.local_tile(
            mD_tma[(None, head, batch)], (cfg.block_m,), (None,)), box_rank=1)
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, cfg.stages)
        for m in cutlass.range(tile.m_lo, tile.m_hi, unroll=1):
            pipe.producer_acquire(state)
            bar = pipe.producer_get_barrier(state)
            self.loader.load(tma_q, tQgQ[(None, m)], tQsQ[(None, state.index)], bar)
            self.loader.load(tma_do, tOgO[(None, m)], tOsO[(None, state.index)], bar)
            self.loader.load(tma_lse, tLgL[(None, m)], tLsL[(None, state.index)], bar)
            self.loader.load(tma_d, tDgD[(None, m)], tDsD[(None, state.index)], bar)
            pipe.producer_commit(state)
            state.advance()
        pipe.producer_tail(state)

    @cute.jit
    def produce_cp_async(self, pipe, kv_full, mQ, mdO, mK, mV, mLSE, mD, smem, tile):
        """A warpgroup: the same tiles 16 bytes a thread into the same swizzled stages. Rows
        past s_q or s_k are written as zeros (they meet real data in the products: 0 times
        garbage can be NaN)."""
        cfg = self.cfg
        tidx = cute.arch.thread_idx()[0] % WARPGROUP
        n, head, batch, kv_head = tile.n_block, tile.head, tile.batch, tile.kv_head

        key0 = n * cfg.block_n
        self._gather_rows(mK, key0, kv_head, batch, smem.sK, cfg.block_n, 0,
                          tile.seqlen_k - key0, tidx)
        self._gather_rows(mV, key0, kv_head, batch, smem.sV, cfg.block_n, 0,
                          tile.seqlen_k - key0, tidx)
        self.loader.commit(kv_full)
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, cfg.stages)
        for m in cutlass.range(tile.m_lo, tile.m_hi, unroll=1):
            pipe.producer_acquire(state)
            q0 = m * cfg.block_m
            self._gather_rows(mQ, q0, head, batch, smem.sQ, cfg.block_m, state.index,
                              tile.seqlen_q - q0, tidx)
            self._gather_rows(mdO, q0, head, batch, smem.sdO, cfg.block_m, state.index,
                              tile.seqlen_q - q0, tidx)
            self._copy_stats(mLSE, mD, smem, q0, head, batch, state.index, tidx)
            pipe.producer_commit(state)
            state.advance()
        pipe.producer_tail(state)

    @cute.jit
    def _gather_rows(self, mX, first, head, batch, sX, rows, stage, valid, tidx):
        """Rows ``first`` .. ``first + rows - 1`` of (head, batch) of ``mX`` into stage
        ``stage`` of ``sX``, 16 bytes a thread per copy; rows from ``valid`` on are zeros."""
        d = self.cfg.head_dim
        vec = cpa.VECTOR_BYTES * 8 // mX.element_type.width
        views = cpa.partition_stage(sX, (rows, d), tidx, WARPGROUP, 1)

        def source(row, col):
            return cute.local_tile(mX[(first + row, None, head, batch)], (vec,), (col // vec,))

        # d = 256: as a loop (unrolled, the producer's 24 registers spilled a kilobyte)
        cpa.load_gathered(views, stage, valid, 0, source, zero_past=True,
                          rolled=self.cfg.splits_d)

    @cute.jit
    def _copy_stats(self, mLSE, mD, smem, q0, head, batch, stage, tidx):
        """The query block's LSE and D (padded: whole blocks, no bounds) into stage
        ``stage``, 16 bytes a thread: the first threads of the warpgroup take the LSE, the
        next ones D."""
        vec = cpa.VECTOR_BYTES * 8 // cutlass.Float32.width
        per_stat = self.cfg.block_m // vec
        atom = cute.make_copy_atom(cute.nvgpu.cpasync.CopyG2SOp(
            cache_mode=cute.nvgpu.cpasync.LoadCacheMode.GLOBAL), cutlass.Float32,
            num_bits_per_copy=cpa.VECTOR_BYTES * 8)
        for which, mX, sX in ((0, mLSE, smem.sLSE), (1, mD, smem.sD)):
            t = tidx - which * per_stat
            if t >= 0 and t < per_stat:
                cute.copy(atom, cute.local_tile(mX[(None, head, batch)], (vec,),
                                                (q0 // vec + t,)),
                          cute.local_tile(sX[(None, stage)], (vec,), (t,)))
