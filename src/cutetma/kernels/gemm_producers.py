"""The GEMM's producers and its work list, a mixin of ``HopperGemm`` (``gemm_sm90.py``).

One schedule (``_produce``) walks the CTA's work units (``_work``: the static persistent
scheduler's tiles, stream-K's units from ``stream_k_unit``, or the cluster order table's
entries) and, for each k-tile, takes an empty stage and hands it to a stage loader::

    produce_tma        one warp: A and B (multicast to the cluster's sharers) and, blockwise
                       FP8, the tile's rows of the k-tile's scale_a, one box each; the stage's
                       full barrier counts the bytes
    produce_cp_async   a warpgroup: 16-byte vectors of the same tiles into the same swizzled
                       stage (zero-filled past K), then each thread arrives on the full barrier

The consumers (``HopperGemm.consume``) call ``_work`` too, so producer and consumers agree on
every unit without talking.
"""

from __future__ import annotations

from cutetma import dsl
from cutetma.copy import cpasync as cpa
from cutetma.copy import tma
from cutetma.kernels.gemm_config import WARPGROUP

cutlass, cute = dsl.cutlass()
import cutlass.utils as utils  # noqa: E402
from cutlass import pipeline  # noqa: E402


def stream_k_unit(j, cta, ctas, tiles, k_tiles):
    """The ``j``-th work unit of CTA ``cta`` out of ``ctas`` under stream-K, as
    ``(tile, k0, kn, valid, writer, first_peer, peers)`` (all integers: the same arithmetic
    runs on the host, where tests check it, and in the kernel on Int32s).

    Whole waves of tiles stay data-parallel (CTA ``cta`` takes tiles ``cta + j * ctas``);
    the tiles of the last partial wave and of one full wave before it (so each CTA gets more
    than one tile's k-tiles to share) form the stream-K region, whose k-tiles, tile by tile,
    are cut into ``ctas`` equal contiguous ranges. A unit is the part of one tile inside one
    CTA's range: k-tiles ``k0 .. k0 + kn``.

    - ``writer``: the unit does not start at the tile's first k-tile, so it leaves its fp32
      partial in workspace slot ``cta`` and raises ``flags[cta]``. Only a CTA's first unit can
      be one, so each CTA writes at most one slot.
    - otherwise the CTA owns the tile: it adds the partials of CTAs ``first_peer ..
      first_peer + peers - 1`` (always after it, each writing its first unit, which waits on
      nobody: no cycle) and stores the tile.
    """
    lo, hi = cutlass.min, cutlass.max
    dp_tiles = hi(tiles // ctas - lo(tiles % ctas, 1), 0) * ctas  # whole waves, less one
    dp_units = dp_tiles // ctas
    sk_iters = (tiles - dp_tiles) * k_tiles
    per_cta = hi((sk_iters + ctas - 1) // ctas, 1)
    is_sk = lo(hi(j - dp_units + 1, 0), 1)  # 1 from the first stream-K unit on
    first = cta * per_cta
    last = lo(first + per_cta, sk_iters)
    start = hi(first, (first // k_tiles + j - dp_units) * k_tiles)
    end = lo((first // k_tiles + j - dp_units + 1) * k_tiles, last)
    k0 = is_sk * (start % k_tiles)
    kn = is_sk * (end - start) + (1 - is_sk) * k_tiles
    tile = is_sk * (dp_tiles + start // k_tiles) + (1 - is_sk) * (cta + j * ctas)
    valid = is_sk * lo(hi(end - start, 0), 1) + (1 - is_sk)
    writer = is_sk * lo(k0, 1)
    tile_start = (tile - dp_tiles) * k_tiles  # the tile's first k-tile in the region
    first_peer = (tile_start + kn) // per_cta
    owns_part = is_sk * (1 - lo(k0, 1)) * lo(k_tiles - kn, 1)
    peers = owns_part * ((tile_start + k_tiles - 1) // per_cta - first_peer + 1)
    return tile, k0, kn, valid, writer, first_peer, peers


class GemmProducers:
    """Producer warps and the work list; ``self.cfg``, ``self.loader`` and ``self.stages``
    come from ``HopperGemm``."""

    @cute.jit
    def _table_entry(self, j, mOrder):
        """With ``order_table``, the table's entry for the CTA's ``j``-th work unit (0
        without one). Producer and consumers load it one unit ahead of ``_work``, which
        decodes it: the table is read once per tile boundary and, after the L2 flush of a
        cold start or another kernel's traffic, from DRAM; loaded where it is needed, that
        round trip (about a microsecond) stalled the consumers between tiles and the
        producer before its first load. Issued a unit early, it lands under the mainloop."""
        if cutlass.const_expr(not self.cfg.order_table):
            return cutlass.Int32(0)
        linear = self._table_index(j)
        count = cutlass.Int32(cute.size(mOrder))
        return cutlass.Int32(mOrder[cutlass.min(linear, count - 1)])

    @cute.jit
    def _table_index(self, j):
        """The cluster's ``j``-th work index: its index in the grid + j x the grid's
        clusters (the static scheduler's order, which the table re-deals)."""
        bz = cute.arch.block_idx()[2]
        return cutlass.Int32(bz) + j * cutlass.Int32(cute.arch.grid_dim()[2])

    @cute.jit
    def _work(self, sched, work, j, k_tiles, mOrder, entry):
        """The CTA's ``j``-th work unit: ``(m, n, split, k0, kn, valid, writer, first_peer,
        peers)``. The static persistent scheduler's tile (``work``) unless ``stream_k``, whose
        units come from ``stream_k_unit`` over the same rasterized tile order, or
        ``order_table``, whose cluster the table names (``entry``: ``_table_entry(j)``)."""
        zero = cutlass.Int32(0)
        if cutlass.const_expr(self.cfg.order_table):
            bx, by, _ = cute.arch.block_idx()
            linear = self._table_index(j)
            count = cutlass.Int32(cute.size(mOrder))
            m = (entry & 0xFFFF) * self.cfg.cluster_m + cutlass.Int32(bx)
            n = (entry >> 16) * self.cfg.cluster_n + cutlass.Int32(by)
            return m, n, zero, zero, k_tiles, linear < count, zero, zero, zero
        if cutlass.const_expr(self.cfg.stream_k):
            layout = sched.problem_layout_ncluster_mnl
            tile, k0, kn, valid, writer, first_peer, peers = stream_k_unit(
                j, cutlass.Int32(cute.arch.block_idx()[0]),
                cutlass.Int32(cute.arch.grid_dim()[0]), cutlass.Int32(cute.size(layout)),
                k_tiles)
            m, n, _ = layout.get_flat_coord(cutlass.min(tile, cute.size(layout) - 1))
            return m, n, cutlass.Int32(0), k0, kn, valid > 0, writer, first_peer, peers
        m, n, split = work.tile_idx
        k0, kn = self._k_range(split, k_tiles)
        return m, n, split, k0, kn, work.is_valid_tile, zero, zero, zero

    @cute.jit
    def _k_range(self, split, k_tiles):
        """(first k-tile, k-tiles) of work slice ``split``: all of K without split-K."""
        if cutlass.const_expr(self.cfg.split_k == 1):
            return 0, k_tiles
        per = cute.ceil_div(k_tiles, self.cfg.split_k)
        first = split * per
        return first, cutlass.max(cutlass.min(per, k_tiles - first), 0)

    @cute.jit
    def produce_tma(self, pipe, tma_a, mA_tma, tma_b, mB_tma, sA, sB, tile_mk, tile_nk,
                    k_tiles, cta_layout, cluster_crd, sched, mOrder, first_entry,
                    tma_s=None, mS_tma=None, sS=None):
        """One warp: each k-tile of A and B by TMA into the next stage, multicast to the CTAs
        of the cluster that share it; the stage's full barrier counts the bytes. Blockwise
        FP8: the k-tile's scale_a of the tile's rows too, one box per CTA."""
        cfg = self.cfg
        gA = cute.local_tile(mA_tma, tile_mk, (None, None))
        gB = cute.local_tile(mB_tma, tile_nk, (None, None))
        # A is reused by the cluster_n CTAs of one cluster row, B by the cluster_m of a column
        tAsA, tAgA = tma.partition(tma_a, sA, gA, cluster_crd[1], cfg.a_sharers, box_rank=2)
        tBsB, tBgB = tma.partition(tma_b, sB, gB, cluster_crd[0], cfg.b_sharers, box_rank=2)
        a_mask = cute.make_layout_image_mask(cta_layout, cluster_crd, mode=1)
        b_mask = cute.make_layout_image_mask(cta_layout, cluster_crd, mode=0)
        a_share = None  # a multicast mask only where the operand is shared
        if cutlass.const_expr(cfg.a_sharers > 1):
            a_share = a_mask
        b_share = None
        if cutlass.const_expr(cfg.b_sharers > 1):
            b_share = b_mask
        loader = self.loader
        scales = cfg.stages_scale_a
        tSsS, tSgS = None, None
        if cutlass.const_expr(scales):
            gS = cute.local_tile(mS_tma, (cfg.tile_m, 1), (None, None))
            tSsS, tSgS = tma.partition(tma_s, sS, gS, box_rank=2)

        def load_stage(m, n, k, state):
            bar = pipe.producer_get_barrier(state)
            loader.load(tma_a, tAgA[(None, m, k)], tAsA[(None, state.index)], bar, a_share)
            loader.load(tma_b, tBgB[(None, n, k)], tBsB[(None, state.index)], bar, b_share)
            if cutlass.const_expr(scales):
                loader.load(tma_s, tSgS[(None, m, k)], tSsS[(None, state.index)], bar)

        self._produce(pipe, k_tiles, sched, mOrder, first_entry, load_stage)

    @cute.jit
    def produce_cp_async(self, pipe, mA, mB, sA, sB, tile_mk, tile_nk, k_tiles, sched,
                         mOrder, first_entry, mScaleA=None, sS=None):
        """A warpgroup: every thread copies its 16-byte vectors of each k-tile into the same
        swizzled stage (the pointer carries the swizzle), zero-filling past K, then arrives
        on the stage's full barrier when its copies land. Blockwise FP8: the first
        tile_m / 4 threads also copy a 16-byte vector of the k-tile's scale_a (rows past M
        skipped: their values are never stored)."""
        cfg = self.cfg
        tidx, _, _ = cute.arch.thread_idx()
        a_part = cpa.partition_operand(mA, sA, tile_mk, tidx, WARPGROUP)
        b_part = cpa.partition_operand(mB, sB, tile_nk, tidx, WARPGROUP)
        scales = cfg.stages_scale_a
        s_threads = cfg.tile_m // 4
        s_copy, tSgS, tSsS = None, None, None
        if cutlass.const_expr(scales):
            s_copy, _ = cpa.tiled_copy(cutlass.Float32, cfg.tile_m, 1, s_threads, contiguous=0)
            thr = s_copy.get_slice(tidx % s_threads)
            tSgS = thr.partition_S(cute.local_tile(cpa.aligned_rows(mScaleA), (cfg.tile_m, 1),
                                                   (None, None)))
            tSsS = thr.partition_D(sS)

        def load_stage(m, n, k, state):
            cpa.load_tile(a_part, m, k, state.index, mA.shape, tile_mk)
            cpa.load_tile(b_part, n, k, state.index, mB.shape, tile_nk)
            if cutlass.const_expr(scales):
                if tidx < s_threads and m * cfg.tile_m + tidx * 4 < mScaleA.shape[0]:
                    cute.copy(s_copy, tSgS[(None, None, None, m, k)],
                              tSsS[(None, None, None, state.index)])

        self._produce(pipe, k_tiles, sched, mOrder, first_entry, load_stage)

    @cute.jit
    def _produce(self, pipe, k_tiles, sched, mOrder, first_entry,
                 load_stage: cutlass.Constexpr):
        """The producer's schedule, the same for every mechanism: for each work tile and each
        of its k-tiles, take the next empty stage, ``load_stage`` into it, commit (TMA: the
        bytes complete the barrier; cp.async: each thread arrives when its copies land)."""
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
        scheduler = utils.StaticPersistentTileScheduler.create(
            sched, cute.arch.block_idx(), cute.arch.grid_dim())
        work = scheduler.initial_work_tile_info()
        j = cutlass.Int32(0)
        entry = first_entry
        m, n, _, k0, kn, valid, _, _, _ = self._work(sched, work, j, k_tiles, mOrder, entry)
        while valid:
            entry = self._table_entry(j + 1, mOrder)  # lands while this unit's loads issue
            for k in cutlass.range(k0, k0 + kn, unroll=1):
                pipe.producer_acquire(state)  # wait for an empty stage (TMA: arm expect_tx)
                load_stage(m, n, k, state)
                pipe.producer_commit(state)
                state.advance()
            j += 1
            scheduler.advance_to_next_work()
            work = scheduler.get_current_work()
            m, n, _, k0, kn, valid, _, _, _ = self._work(sched, work, j, k_tiles, mOrder,
                                                         entry)
        pipe.producer_tail(state)
