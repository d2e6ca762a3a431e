"""What leaves the attention backward (``FlashAttentionBackwardSm90``'s mixin): dQ_m per
query block, added into the fp32 accumulator in the dQ MMA's fragment order (a staging
buffer and one TMA reduction per warpgroup, or 16-byte atomics where ``splits_d``), in
key-block order where deterministic (turn counters); and dK, dV at the end of a CTA (TMA
stores through the freed Q / dO stages, or from the registers)."""

from __future__ import annotations

from cutetma import dsl
from cutetma.copy import tma
from cutetma.kernels.attention.config import WARPGROUP

DQ_ROW = 256  # fp32 per row of the fragment-ordered dQ (a TMA box row: at most 256)

cutlass, cute = dsl.cutlass()


class BackwardOutputs:
    @cute.jit
    def _send_dq(self, ops, m):
        """dQ_m (its GEMM done) staged, then added into the accumulator by one TMA
        reduction (in key-block order where deterministic)."""
        cfg = self.cfg
        self._stage_dq(ops.acc_dq, ops.smem.sdQ, ops.wg, ops.thread, ops.dq_free, ops.leader)
        if ops.leader:  # a whole warp: the TMA copy elects its own lane
            if cutlass.const_expr(cfg.deterministic):
                self._wait_turn(ops.mTurns, m, ops.tile)
            cute.copy(ops.tma_dq, ops.tDsD[(None, ops.wg)],
                      ops.tDgD[(None, ops.dq_box0 + m * cfg.consumers)])
            tma.commit()
            if cutlass.const_expr(cfg.deterministic):
                self._pass_turn(ops.mTurns, m, ops.tile)

    @cute.jit
    def _add_dq(self, ops, m):
        """``splits_d``: dQ_m (its GEMM done) added into the accumulator from the registers,
        16 bytes an atomic (red.global.add.v4.f32, summed in L2), into the same fragment-
        ordered box a TMA reduction would fill: each thread's 4-value chunk j at j x 128 +
        thread, whole 2 KB runs a warpgroup (in key-block order where deterministic)."""
        cfg = self.cfg
        if cutlass.const_expr(cfg.deterministic):
            self._wait_turn(ops.mTurns, m, ops.tile)  # every warp: each adds its own chunks
        # the box's offset in 64 bits: b x h x s_q x d fp32 passes 2^31 elements (8 GB)
        box = ops.mdQ.iterator + cutlass.Int64(ops.dq_box0 + m * cfg.consumers) * (
            cfg.dq_box_rows * DQ_ROW)
        out, chunks = self._fragment_chunks(box, ops.acc_dq)
        chunk = cute.make_rmem_tensor((4,), cutlass.Float32)
        for j in cutlass.range_constexpr(chunks):
            for v in cutlass.range_constexpr(4):
                chunk[v] = ops.acc_dq[4 * j + v]
            cute.arch.red(out[(None, j * WARPGROUP + ops.thread)].iterator,
                          chunk.load().ir_value(), op="add", dtype="f32", sem="relaxed",
                          scope="gpu")
        if cutlass.const_expr(cfg.deterministic):
            # every thread's adds before the turn passes (fence, then the warpgroup's
            # barrier, then one release)
            cute.arch.fence_acq_rel_gpu()
            ops.dq_free.arrive_and_wait()
            if ops.leader:
                self._pass_turn(ops.mTurns, m, ops.tile, after_tma=False)

    @cute.jit
    def _wait_turn(self, mTurns, m, tile):
        """``deterministic``: before adding its half of dQ_m, wait (lane 0, then the warp)
        until every key block before this one has added both its halves: the key blocks that
        see query block m are 0 .. some last one (causal's first query block grows with the
        key block), so key block n's turn is count 2 n. Key block n - 1 was launched before n
        (the launch order), so it runs or has run: the wait ends."""
        if cute.arch.lane_idx() == 0:
            turn = mTurns.iterator + (m + mTurns.shape[0] * (tile.head
                                                             + mTurns.shape[1] * tile.batch))
            want = 2 * tile.n_block
            seen = cute.arch.load(turn, cutlass.Int32, sem="acquire", scope="gpu")
            while seen < want:  # the count only grows; the other half may already be in
                seen = cute.arch.load(turn, cutlass.Int32, sem="acquire", scope="gpu")
        cute.arch.sync_warp()

    @cute.jit
    def _pass_turn(self, mTurns, m, tile, after_tma=True):
        """``deterministic``: once this half's reduction has completed in global memory
        (the bulk group's writes, not only its reads; or, not ``after_tma``, the atomics the
        caller fenced), count it (release): the next key block's adds into dQ_m come after
        it, always in key-block order."""
        if cutlass.const_expr(after_tma):
            cute.arch.cp_async_bulk_wait_group(0, read=False)
        if cute.arch.lane_idx() == 0:
            turn = mTurns.iterator + (m + mTurns.shape[0] * (tile.head
                                                             + mTurns.shape[1] * tile.batch))
            cute.arch.fence_acq_rel_gpu()
            cute.arch.atomic_add(turn, cutlass.Int32(1), sem="release", scope="gpu")
        cute.arch.sync_warp()

    @staticmethod
    def _fragment_chunks(iterator, acc_dq):
        """A warpgroup's dQ in fragment order from ``iterator`` (a staging buffer, or its box
        of the accumulator): (4 values, chunk j x 128 threads), this thread's chunk j (its
        values 4 j .. 4 j + 3) at j x 128 + thread; and the number of chunks."""
        chunks = cute.size(acc_dq) // 4
        return cute.make_tensor(iterator, cute.make_layout((4, chunks * WARPGROUP),
                                                           stride=(1, 4))), chunks

    @cute.jit
    def _stage_dq(self, acc_dq, sdQ, wg, thread, dq_free, leader):
        """dQ_m into this warpgroup's staging buffer, once the previous block's TMA
        reduction has read it (its issuing lane waits, the warpgroup's barrier passes that
        on), then ordered before the reduction reads it (proxy fence, the barrier again)."""
        if leader:
            tma.wait(0)
        dq_free.arrive_and_wait()
        buf, chunks = self._fragment_chunks(sdQ[(None, None, wg)].iterator, acc_dq)
        chunk = cute.make_rmem_tensor((4,), cutlass.Float32)
        for j in cutlass.range_constexpr(chunks):
            for v in cutlass.range_constexpr(4):
                chunk[v] = acc_dq[4 * j + v]
            cute.autovec_copy(chunk, buf[(None, j * WARPGROUP + thread)])
        cute.arch.fence_view_async_shared()
        dq_free.arrive_and_wait()

    @cute.jit
    def _store_kv_tma(self, acc_dk, acc_dv, dkv_mma, ctid, smem, kv_stores, both, mine, leader,
                      tile, softmax_scale):
        """dK * scale and dV, 16-bit, through the freed Q and dO stages: once both warpgroups'
        last GEMMs have read them (``both``), warpgroup w writes its 64 keys into stage w by
        stmatrix, and its leading warp stores them with TMA (rows past s_k clipped).
        ``splits_d``: both write their column halves of the 64 keys into stage 0, and the
        first warpgroup's leading warp stores it once both are in."""
        tma_dk, mdK_tma, tma_dv, mdV_tma = kv_stores
        cfg = self.cfg
        dtype = smem.sQ.element_type
        both.arrive_and_wait()
        # the (block_n, d) C tile of dK / dV seen over the stages: key 64 w + r is row r of
        # stage w (the transposed-view trick: a composition picks the coordinates)
        rows, d = 64, cfg.head_dim
        over_stages = cute.make_layout(((rows, cfg.kv_out_stages), d),
                                       stride=((1, rows * d), rows))
        r2s = cute.make_tiled_copy_C(cute.make_copy_atom(
            cute.nvgpu.warp.StMatrix8x8x16bOp(transpose=False, num_matrices=4), dtype), dkv_mma)
        thr = r2s.get_slice(ctid)
        wg = ctid // WARPGROUP
        for acc, sX, scale in ((acc_dk, smem.sQ_kv, softmax_scale),
                               (acc_dv, smem.sdO_kv, 1.0)):
            out = cute.make_rmem_tensor(acc.layout, dtype)
            out.store((acc.load() * scale).to(dtype))
            cute.copy(r2s, thr.retile(out), thr.partition_D(cute.composition(sX, over_stages)))
        cute.arch.fence_view_async_shared()  # generic writes, TMA reads
        if cutlass.const_expr(cfg.splits_d):
            both.arrive_and_wait()
        else:
            mine.arrive_and_wait()
        if leader and (wg == 0 or not cfg.splits_d):  # a whole warp: TMA elects its lane
            block = cfg.kv_out_stages * tile.n_block + wg  # the stage's 64 keys
            for atom, mX_tma, sX in ((tma_dk, mdK_tma, smem.sQ_kv),
                                     (tma_dv, mdV_tma, smem.sdO_kv)):
                tXsX, tXgX = tma.partition(atom, sX, cute.local_tile(
                    mX_tma[(None, None, tile.head, tile.batch)], (rows, d), (None, 0)),
                    box_rank=2)
                cute.copy(atom, tXsX[(None, wg)], tXgX[(None, block)])
            tma.commit()

    @cute.jit
    def _store_kv(self, acc_dk, acc_dv, kv_thr, mdK, mdV, key0, tile, softmax_scale):
        """dK * scale and dV in the outputs' dtype, this thread's rows below s_k, a column
        pair per store."""
        cfg = self.cfg
        tKcK = kv_thr.partition_C(cute.make_identity_tensor((cfg.block_n, cfg.head_dim)))
        for i in cutlass.range_constexpr(cute.size(acc_dk) // 2):
            row, col = tKcK[2 * i]
            key = key0 + row
            if key < tile.seqlen_k:
                pair = cute.make_rmem_tensor((2,), mdK.element_type)
                pair[0] = (acc_dk[2 * i] * softmax_scale).to(mdK.element_type)
                pair[1] = (acc_dk[2 * i + 1] * softmax_scale).to(mdK.element_type)
                cute.autovec_copy(pair, cute.local_tile(
                    mdK[(key, None, tile.head, tile.batch)], (2,), (col // 2,)))
                pair[0] = acc_dv[2 * i].to(mdK.element_type)
                pair[1] = acc_dv[2 * i + 1].to(mdK.element_type)
                cute.autovec_copy(pair, cute.local_tile(
                    mdV[(key, None, tile.head, tile.batch)], (2,), (col // 2,)))
