"""The consumer warpgroups of ``FlashAttentionSm90``, a mixin (``kernel.py`` holds the
class): per tile, S = Q K^T, the online softmax and O += P V over the tile's key blocks in
the configuration's schedule (serial, overlap, pingpong), then the epilogue; a warpgroup
with no rows in a packed tile only passes its stages on (``_pass_tile``).
"""

from __future__ import annotations

from types import SimpleNamespace

from cutetma import dsl
from cutetma.kernels.attention import fp8_operands, scheduler
from cutetma.kernels.attention.config import WARPGROUP
from cutetma.kernels.attention.epilogue import epilogue
from cutetma.kernels.attention.masking import apply_mask
from cutetma.kernels.attention.softmax import online_softmax, rescale
from cutetma.kernels.barriers import AttentionBarrier

cutlass, cute = dsl.cutlass()
from cutlass import pipeline  # noqa: E402
from cutlass.cute.nvgpu import warpgroup  # noqa: E402


class Consumers:
    @cute.jit
    def consume(self, pipe_k, pipe_v, q_full, q_empty, qk_mma, pv_mma, sQ, sK, sV, mO, mLSE,
                mSeqlensK, items, prob, scale_log2):
        """A consumer warpgroup, per tile: its 64 query rows against the tile's key blocks
        (``_consume_tile``), or (``skips_idle``) with none of its rows in the tile, only the
        stages' waits and releases (``_pass_tile``)."""
        cfg = self.cfg
        tidx, _, _ = cute.arch.thread_idx()
        ctid = tidx - WARPGROUP
        # 0 .. consumers - 1: rows [64 wg, 64 wg + 64) of the block; warp-uniform, so the
        # operand descriptors built from it stay in uniform registers
        wg = cute.arch.make_warp_uniform(ctid // WARPGROUP)
        lane = tidx % 32
        warp_in_wg = (ctid % WARPGROUP) // 32
        qk_thr = qk_mma.get_slice(wg * WARPGROUP)
        pv_thr = pv_mma.get_slice(wg * WARPGROUP)
        # this warpgroup's operands and accumulator shapes, and this thread's first row (in
        # its block) and first column inside a block (the WGMMA accumulator layout): made
        # once, outside the tile loop
        frags = SimpleNamespace(
            tSrQ=qk_mma.make_fragment_A(qk_thr.partition_A(sQ)),
            tSrK=qk_mma.make_fragment_B(qk_thr.partition_B(sK)),
            tOrV=pv_mma.make_fragment_B(pv_thr.partition_B(sV)),
            s_shape=qk_thr.partition_shape_C((cfg.block_m, cfg.block_n)),
            o_shape=pv_thr.partition_shape_C((cfg.block_m, cfg.head_dim)),
            # e4m3: which S value each value of P's A fragment takes (fp8_operands)
            p_order=(fp8_operands.p_from_accumulator(qk_mma, pv_mma, 64, cfg.block_n)
                     if sV.element_type.width == 8 else None),
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
                tile = self._key_blocks(self._tile(item, half, prob, mSeqlensK), prob)
                if cutlass.const_expr(cfg.skips_idle):
                    if tile.m_block * cfg.block_m + wg * 64 >= tile.rows:
                        self._pass_tile(pipe_k, pipe_v, q_full, q_empty, local, done, tile.lo,
                                        tile.hi)
                    else:
                        self._consume_tile(pipe_k, pipe_v, q_full, q_empty, qk_mma, pv_mma,
                                           frags, sV, mO, mLSE, prob, scale_log2, tile, local,
                                           done)
                else:
                    self._consume_tile(pipe_k, pipe_v, q_full, q_empty, qk_mma, pv_mma, frags,
                                       sV, mO, mLSE, prob, scale_log2, tile, local, done)
                done += tile.hi - tile.lo
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
            self._v_wait(pipe_v, read)
            self._v_release(pipe_v, read)
            read.advance()

    @cute.jit
    def _consume_tile(self, pipe_k, pipe_v, q_full, q_empty, qk_mma, pv_mma, frags, sV, mO,
                      mLSE, prob, scale_log2, tile, local, done):
        """One tile of a consumer warpgroup: S, softmax and P V over key blocks lo .. hi - 1
        in the configuration's schedule, then the epilogue (split_kv: into the split's
        partial, batch index split x b + batch). ``tile``: ``FlashAttentionSm90._tile``."""
        cfg = self.cfg
        dtype = sV.element_type
        m_block, head, batch, split = tile.m_block, tile.head, tile.batch, tile.split
        seqlen_k, q_start, seqlen_q, rows = tile.kv_len, tile.q_start, tile.seqlen_q, tile.rows
        lo, hi = tile.lo, tile.hi
        tSrQ, tSrK, tOrV = frags.tSrQ, frags.tSrK, frags.tOrV
        col_in_tile = frags.col_in_tile
        fp8 = dtype.width == 8
        p_steps = cfg.block_n // (32 if fp8 else 16)
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
        # P, converted element by element, is the A operand of P V (see the docstring); in
        # e4m3 its fragment holds 4 keys a register, its values taken from S in
        # ``frags.p_order`` (fp8_operands: no value crosses threads)
        if cutlass.const_expr(fp8):
            tOrP = cute.make_rmem_tensor(cute.make_layout(
                ((4, 2, 2), 1, p_steps), stride=((1, 4, 8), 0, 16)), dtype)
            tOrP_as_s = tOrP
        else:
            tOrP = cute.make_rmem_tensor(cute.make_layout(
                ((2, 2, 2), 1, p_steps), stride=((1, 2, 4), 0, 8)), dtype)
            tOrP_as_s = cute.make_tensor(tOrP.iterator, acc_s.layout)
        out_scale = None
        if cutlass.const_expr(fp8):
            # the descales of this (K/V head, batch): the scores' joins the softmax scale,
            # the output's the epilogue's 1 / rowsum (no pass over O afterwards)
            scale_log2 = scale_log2 * prob.descale[0, head, batch]
            out_scale = prob.descale[1, head, batch]
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
                self._to_p(acc_s, tOrP_as_s, frags.p_order)
                self._v_wait(pipe_v, read)
                if j == hi - 1:
                    self._zero_v_tail(sV, read.index, seqlen_k - j * cfg.block_n)
                self._issue_pv(pv_mma, acc_o, tOrP, tOrV, read.index)
                warpgroup.wait_group(0)
                self._v_release(pipe_v, read)
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
                            self._v_release(pipe_v, release)  # V_{j-2}
                            release.advance()
                    if cutlass.const_expr(cfg.pingpong):
                        self._turn(pass_on=False)
                    # P_{j-1} from S_{j-1}, just before S_j overwrites it (here, not after the
                    # softmax: left to itself the compiler sank it here for bf16 but not for
                    # fp16, two loop shapes for one source; this placement measured 1% faster
                    # at d = 128 in both dtypes)
                    self._to_p(acc_s, tOrP_as_s, frags.p_order)
                    # S_j, while O takes j-1's rescale
                    self._issue_qk(qk_mma, acc_s, tSrQ, tSrK, q_stage, read.index)
                    rescale(acc_o, correction)
                    self._v_wait(pipe_v, release)
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
                        self._v_release(pipe_v, release)  # V_{j-1}
                        release.advance()
                    read.advance()
                if cutlass.const_expr(cfg.pv_wait == "late"):
                    warpgroup.wait_group(0)  # the loop's last P V
                    if hi - lo > 1:
                        self._v_release(pipe_v, release)
                        release.advance()
                self._to_p(acc_s, tOrP_as_s, frags.p_order)
                rescale(acc_o, correction)
                self._v_wait(pipe_v, release)
                self._zero_v_tail(sV, release.index, seqlen_k - (hi - 1) * cfg.block_n)
                self._issue_pv(pv_mma, acc_o, tOrP, tOrV, release.index)
                warpgroup.wait_group(0)
                self._v_release(pipe_v, release)
        if hi == lo:  # no Q K^T read Q: free it for the next tile's all the same
            cute.arch.mbarrier_arrive(q_empty + q_stage)
        out_batch = batch
        if cutlass.const_expr(cfg.split_kv):
            out_batch = batch + split * prob.batches
        if cutlass.const_expr(cfg.varlen_q):
            out_batch = split  # the partial's batch mode is the split's; else 0
        epilogue(cfg, acc_o, row_max, row_sum, self._sequence_rows(mO, q_start),
                 self._sequence_rows(mLSE, q_start), head, out_batch, row0, rows, scale_log2,
                 out_scale)

    @cute.jit
    def _to_p(self, acc_s, tOrP, p_order):
        """P (in acc_s, fp32) into its A fragment in the inputs' dtype: as it lies (16-bit:
        ``tOrP`` is a view of it with acc_s's layout), or (e4m3) value i from S value
        ``p_order[i]``, converted as one vector."""
        if cutlass.const_expr(p_order is None):
            tOrP.store(acc_s.load().to(tOrP.element_type))
        else:
            # the values renamed into A's order first (free: registers), then converted as
            # one vector, so each pair of neighbours becomes one e4m3x2 conversion into the
            # byte lanes it keeps (converted one by one, every value took its own conversion
            # and byte shuffles: docs/perf-log.md)
            staged = cute.make_rmem_tensor(tOrP.layout, cutlass.Float32)
            for i in cutlass.range_constexpr(len(p_order)):
                staged[i] = acc_s[p_order[i]]
            tOrP.store(staged.load().to(tOrP.element_type))

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
        if cutlass.const_expr(cfg.paged and cfg.load == "tma" and not cfg.transposes_v):
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
        wg = cute.arch.make_warp_uniform(cute.arch.thread_idx()[0] // WARPGROUP - 1)
        if cutlass.const_expr(pass_on):
            wg = (wg + 1) % self.cfg.consumers
        turn = pipeline.NamedBarrier(barrier_id=int(AttentionBarrier.TURN) + wg,
                                     num_threads=2 * WARPGROUP)
        if cutlass.const_expr(pass_on):
            turn.arrive()
        else:
            turn.arrive_and_wait()

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
