"""Hopper GEMM: C = A B^T, warp-specialized, persistent, multistage; the load mechanism is a
parameter (``load="tma"`` with optional cluster multicast, or ``load="cp_async"``).

Dataflow::

    A (M, K), B (N, K)   --producer-->  shared-memory stages (swizzled, one CuTe layout)
                         --consumers--> WGMMA into fp32 registers
                         --epilogue-->  stmatrix into shared memory --TMA store--> C (M, N)

Warp roles and the mainloop pipeline (``stages`` (full, empty) mbarrier pairs)::

    warpgroup 0, producer   TMA: warp 0 issues A and B of every k-tile into the next free
                            stage (multicast to the cluster's row / column of CTAs);
                            cp.async: all 128 threads copy 16-byte vectors into the *same*
                            swizzled stage, then arrive (noinc) on its full barrier.
                            setmaxnreg lowers its registers (it needs few).
    warpgroups 1..2         cooperative: each owns 64 rows of every tile; pingpong: each owns
    consumers               whole tiles (64 or 128 rows) in turn (turn barriers hand over the
                            tensor cores). Wait full, WGMMA the k-tile, release the previous
                            stage (empty), keep one WGMMA group in flight; then the epilogue.
                            setmaxnreg raises their registers.

    barrier        arrivals per phase
    full[s]        TMA: 1 (arrive.expect_tx) + the stage's bytes; cp.async: 128 (noinc)
    empty[s]       consumer warps of the tile (x multicast partners under TMA multicast)

The epilogue (stmatrix into swizzled shared sub-tiles, the TMA store by one consumer warp)
runs after a tile's mainloop, or, with ``store_under_mma`` (``cutetma.gemm``'s default for
whole cooperative tiles), from registers that hold the finished tile in C's type while the
next tile's first k-tiles of WGMMAs run (``_store_held``).

Only the producer differs between mechanisms: one schedule (``_produce``) takes a stage
loader, TMA or cp.async; tiles, stages, swizzle, consumers and the epilogue are the same code
(``cutetma.copy.loader`` picks the pipeline). Tiles come from a static persistent scheduler
whose rasterization band divides the grid (no phantom tiles); CTA i takes tiles i, i + grid,
... of its order, and since the card puts CTA i on a GPC of its own choosing and merges the
identical loads of one GPC's SMs in front of the L2, ``cutetma.gemm`` picks the band for the
card's placement (``cutetma.tuning.placement``).

When the output tiles fill the SMs' waves badly, K is cut: ``split_k`` slices every tile's K
into equal work units (the last unit of a tile to finish sums all its slices' fp32 partials
from a workspace, in slot order, and stores the tile), ``stream_k`` shares the last waves'
k-tiles evenly between all CTAs (the CTA holding a tile's first k-tile waits for the others'
partials). Both keep every operand, stage and epilogue as they are; only the work list and
the hand-over differ::

    workspace    mPartials: fp32 tile slots (16-byte vectors, the MMA's thread order); with
                 split_sum="atomic" one per tile, added into by vector atomics, kept zero
                 mFlags: split-K a ticket counter per tile, stream-K a ready flag per CTA
                 (zero before a launch, zero after it: whoever reads one resets it)

The producers and the work list live in ``gemm_producers.py`` (``GemmProducers``, a mixin),
the fp32 partials' hand-over in ``gemm_partials.py`` (``PartialSums``), FP8's scales in
``gemm_scales.py`` (``Fp8Scales``).

Constraints: fp16 / bf16 inputs (K-tile 64) or e4m3 (K-tile 128, both K-major, scaled by
``GemmConfig.scaling`` on the accumulator), fp32 accumulation, fp16 / bf16 / fp32 output; A
K-major, B K-major or N-major, C row-major; tile M in {64, 128} (256: a promoted FP8 tile,
``GemmConfig.waves``), N a multiple of 16 from 64 to 384 (past 256 two WGMMAs per warpgroup
and k-step, the serial epilogue, K whole); cluster (1|2|4, 1|2|4), at most 8 CTAs,
multicasts A along N and B along M (TMA only); K and the contiguous dimensions multiples of
8 elements (16 bytes), 16-byte aligned bases. M, N, K need not be multiples of the tile.
Run: ``cutetma.gemm(a, b)``; compile-only: ``pytest tests/test_gemm_ptx.py``.
"""

from __future__ import annotations

from cutetma import dsl
from cutetma.copy import loader as loaders
from cutetma.copy import tma
from cutetma.kernels import accumulator
from cutetma.kernels.barriers import GemmBarrier
from cutetma.kernels.gemm_config import WARPGROUP, GemmConfig, mma_n
from cutetma.kernels.gemm_partials import PartialSums
from cutetma.kernels.gemm_producers import GemmProducers
from cutetma.kernels.gemm_scales import Fp8Scales

cutlass, cute = dsl.cutlass()
import cutlass.utils as utils  # noqa: E402
import cutlass.utils.hopper_helpers as sm90  # noqa: E402
from cuda.bindings import driver as cuda  # noqa: E402
from cutlass import pipeline  # noqa: E402
from cutlass.tensor_utils import LayoutEnum  # noqa: E402

# setmaxnreg budgets (per thread): the TMA producer needs almost nothing; a cp.async producer
# computes 16-byte addresses and predicates for every vector, so it keeps more.
REGISTERS = {"tma": (40, 232), "cp_async": (56, 224)}


def make_tiled_mma(ab_dtype, a_major, b_major, warpgroups: int, tile_n: int):
    """The WGMMA of ``warpgroups`` warpgroups stacked along M (64 rows each, one
    m64n{tile_n}k16 instruction per warpgroup and k-step; past 256 columns the atom is
    m64n{tile_n / 2}k16 and the tile repeats it twice along N), fp32 accumulation."""
    return sm90.make_trivial_tiled_mma(
        ab_dtype, ab_dtype, a_major.sm90_mma_major_mode(), b_major.sm90_mma_major_mode(),
        cutlass.Float32, (warpgroups, 1, 1), tiler_mn=(64, mma_n(tile_n)))


def epilogue_copy(tiled_mma, c_major, c_dtype):
    """Registers -> shared memory for the epilogue: stmatrix (16-bit C) or the DSL's store op
    (fp32 C), tiled over the MMA's accumulator layout."""
    return cute.make_tiled_copy_S(
        sm90.get_smem_store_op(c_major, c_dtype, cutlass.Float32),
        cute.make_tiled_copy_C_atom(cute.make_copy_atom(
            cute.nvgpu.warp.StMatrix8x8x16bOp(c_major.is_m_major_c(), 4), c_dtype),
            tiled_mma))


def epilogue_order(tiled_mma, r2s, tile_mn, epi_n) -> list[list[int]]:
    """``order[e][i]``: the index into the retiled accumulator (``r2s.retile(acc)``) of the
    value that belongs at index ``i`` of the fragment stored for epilogue sub-tile ``e``
    (columns ``e * epi_n ...``), found by matching the two tensors' (row, col) coordinates
    on identity tensors at trace time, for thread 0 (the pattern is the same for every
    thread: tests/test_gemm_ptx.py checks all of them).

    Indexing ``e * size(frag) + i`` instead holds only while a warpgroup's accumulator is one
    64-row WGMMA block; with two (a 128-row pingpong tile) it put 14336 of 16384 values in
    the wrong place."""
    ids_acc = cute.make_identity_tensor(tile_mn)
    ids_sub = cute.make_identity_tensor((tile_mn[0], epi_n))
    acc = r2s.retile(tiled_mma.get_slice(0).partition_C(ids_acc))
    sub = r2s.get_slice(0).partition_S(ids_sub)
    where = {}
    for j in range(cute.size(acc)):
        row, col = acc[j]
        where[(row, col)] = j
    order = []
    for e in range(tile_mn[1] // epi_n):
        order.append([where[(sub[i][0], sub[i][1] + e * epi_n)] for i in range(cute.size(sub))])
    return order


class HopperGemm(GemmProducers, PartialSums, Fp8Scales):
    def __init__(self, config: GemmConfig):
        self.cfg = config
        self.loader = loaders.make_loader(config.load)

    @cute.jit
    def __call__(self, mA: cute.Tensor, mB: cute.Tensor, mC: cute.Tensor,
                 max_active_clusters: cutlass.Constexpr, stream: cuda.CUstream,
                 mPartials: cute.Tensor = None, mFlags: cute.Tensor = None,
                 mOrder: cute.Tensor = None, mScaleA: cute.Tensor = None,
                 mScaleB: cute.Tensor = None):
        """``mPartials`` (fp32 tile slots) and ``mFlags`` (int32, zero before the launch and
        left at zero after it) only with ``stream_k`` (a slot and a flag per CTA) or
        ``split_k`` > 1 (a slot per work unit, a counter per output tile); ``mOrder`` (int32,
        one packed cluster coordinate per work index) only with ``order_table``;
        ``mScaleA``, ``mScaleB`` (fp32: one value each, or M and N) only with ``scaling``."""
        cfg = self.cfg
        ab_dtype, c_dtype = mA.element_type, mC.element_type
        if cutlass.const_expr(ab_dtype.width // 8 != cfg.ab_bytes):
            raise ValueError(f"tile_k={cfg.tile_k} is a 128-byte span of {cfg.ab_bytes}-byte "
                             f"elements; A and B are {ab_dtype}")
        a_major = LayoutEnum.from_tensor(mA)
        b_major = LayoutEnum.from_tensor(mB)
        c_major = LayoutEnum.from_tensor(mC)
        tile_mnk = (cfg.tile_m, cfg.tile_n, cfg.tile_k)
        stages = cfg.num_stages(c_dtype.width // 8)

        tiled_mma = make_tiled_mma(ab_dtype, a_major, b_major, cfg.mma_groups, cfg.tile_n)
        sA_layout = sm90.make_smem_layout_a(a_major, tile_mnk, ab_dtype, stages)
        sB_layout = sm90.make_smem_layout_b(b_major, tile_mnk, ab_dtype, stages)
        epi_tile = (cfg.tile_m, cfg.epi_n)
        epi_buffers = cfg.epi_buffers(c_dtype.width // 8)
        sC_layout = sm90.make_smem_layout_epi(c_dtype, c_major, epi_tile, epi_buffers)

        # TMA atoms: A is shared along N by cluster_n CTAs, B along M by cluster_m CTAs.
        tma_a, mA_tma = tma.load_atom(mA, cute.slice_(sA_layout, (None, None, 0)),
                                      (cfg.tile_m, cfg.tile_k), cfg.a_sharers)
        tma_b, mB_tma = tma.load_atom(mB, cute.slice_(sB_layout, (None, None, 0)),
                                      (cfg.tile_n, cfg.tile_k), cfg.b_sharers)
        tma_c, mC_tma = tma.store_atom(mC, cute.slice_(sC_layout, (None, None, 0)), epi_tile)
        # blockwise FP8: each k-tile's scale_a of the tile's rows, a box of M-major fp32
        tma_s, mS_tma = None, None
        if cutlass.const_expr(cfg.stages_scale_a):
            tma_s, mS_tma = tma.load_atom(mScaleA, cute.make_layout((cfg.tile_m, 1)),
                                          (cfg.tile_m, 1))

        tiles_mnl = (cute.ceil_div(mC.shape[0], cfg.tile_m),
                     cute.ceil_div(mC.shape[1], cfg.tile_n), cfg.split_k)
        sched = utils.PersistentTileSchedulerParams(
            tiles_mnl, (cfg.cluster_m, cfg.cluster_n, 1), cfg.raster_swizzle,
            cfg.raster_along_m)
        grid = utils.StaticPersistentTileScheduler.get_grid_shape(sched, max_active_clusters)
        if cutlass.const_expr(cfg.stream_k):  # every SM: the last waves' k-tiles are shared
            grid = (max_active_clusters, 1, 1)

        # blockwise FP8's per-stage scale_a: 128-byte aligned for TMA; elsewhere one bare
        # word, so the 16-bit kernels' shared memory is what their stage count assumed
        stage_scales_type = cute.struct.MemRange[cutlass.Float32, 1]
        if cutlass.const_expr(cfg.stages_scale_a):
            stage_scales_type = cute.struct.Align[cute.struct.MemRange[
                cutlass.Float32, cfg.stage_scale_bytes // 4 * stages], 128]

        @cute.struct
        class Storage:
            barriers: cute.struct.MemRange[cutlass.Int64, stages * 2]
            tickets: cute.struct.MemRange[cutlass.Int32, 4]  # split-K, one per warpgroup
            sA: cute.struct.Align[cute.struct.MemRange[ab_dtype, cute.cosize(sA_layout)], 1024]
            sB: cute.struct.Align[cute.struct.MemRange[ab_dtype, cute.cosize(sB_layout)], 1024]
            sC: cute.struct.Align[cute.struct.MemRange[c_dtype, cute.cosize(sC_layout)], 1024]
            # row-wise FP8: two tiles' column scales (a word where unused)
            scales: cute.struct.MemRange[cutlass.Float32, max(cfg.scale_bytes() // 4, 1)]
            # blockwise FP8: each stage's scale_a (a word where unused)
            sS: stage_scales_type

        self.storage = Storage
        self.stages = stages
        self.epi_buffers = epi_buffers
        self.c_major = c_major
        self.kernel(tma_a, mA_tma, tma_b, mB_tma, tma_c, mC_tma, mA, mB, tiled_mma,
                    sA_layout, sB_layout, sC_layout, sched, mPartials, mFlags, mOrder,
                    mScaleA, mScaleB, tma_s, mS_tma).launch(
            grid=grid, block=(cfg.threads, 1, 1), cluster=(cfg.cluster_m, cfg.cluster_n, 1),
            min_blocks_per_mp=1, stream=stream, use_pdl=cfg.pdl)

    @cute.jit
    def from_pointers(self, pA: cute.Pointer, pB: cute.Pointer, pC: cute.Pointer,
                      m: cutlass.Int32, n: cutlass.Int32, ka: cutlass.Int32, kb: cutlass.Int32,
                      lda: cutlass.Int64, ldb: cutlass.Int64, ldc: cutlass.Int64,
                      b_k_major: cutlass.Constexpr, max_active_clusters: cutlass.Constexpr,
                      stream: cuda.CUstream, mPartials: cute.Tensor = None,
                      mFlags: cute.Tensor = None, mOrder: cute.Tensor = None):
        """``__call__`` from base pointers, sizes and row strides: A (m, ka) and C (m, n)
        row-major, B (n, kb) K-major or, with ``b_k_major`` False, N-major. The tensors it
        builds have the types ``from_dlpack(...).mark_layout_dynamic()`` gives (dynamic
        Int32 sizes, a dynamic Int64 outer stride, the inner stride 1), so the kernel is
        the same; a launch passes eleven scalars instead of three DLPack tensors, which is
        what lets ``cutetma.gemm`` skip the DSL's per-call argument conversion (``ops``)."""
        mA = cute.make_tensor(pA, cute.make_layout((m, ka), stride=(lda, 1)))
        if cutlass.const_expr(b_k_major):
            mB = cute.make_tensor(pB, cute.make_layout((n, kb), stride=(ldb, 1)))
        else:
            mB = cute.make_tensor(pB, cute.make_layout((n, kb), stride=(1, ldb)))
        mC = cute.make_tensor(pC, cute.make_layout((m, n), stride=(ldc, 1)))
        self(mA, mB, mC, max_active_clusters, stream, mPartials, mFlags, mOrder)

    @cute.jit
    def scaled_from_pointers(self, pA: cute.Pointer, pB: cute.Pointer, pC: cute.Pointer,
                             pScaleA: cute.Pointer, pScaleB: cute.Pointer, m: cutlass.Int32,
                             n: cutlass.Int32, ka: cutlass.Int32, kb: cutlass.Int32,
                             lda: cutlass.Int64, ldb: cutlass.Int64, ldc: cutlass.Int64,
                             max_active_clusters: cutlass.Constexpr, stream: cuda.CUstream,
                             mPartials: cute.Tensor = None, mFlags: cute.Tensor = None,
                             mOrder: cute.Tensor = None):
        """``from_pointers`` for FP8 (B K-major: WGMMA reads 8-bit operands K-major only)
        with the scales: fp32, one value each (``scaling="tensor"``), M and N contiguous
        values (``"row"``), or (M, ceil(K / 128)) and (ceil(N / 128), ceil(K / 128))
        row-major (``"block"``)."""
        mA = cute.make_tensor(pA, cute.make_layout((m, ka), stride=(lda, 1)))
        mB = cute.make_tensor(pB, cute.make_layout((n, kb), stride=(ldb, 1)))
        mC = cute.make_tensor(pC, cute.make_layout((m, n), stride=(ldc, 1)))
        if cutlass.const_expr(self.cfg.scaling == "block"):
            # (M, K / 128) and (N / 128, K / 128), row-major, blocks rounded up
            k_blocks = (ka + 127) // 128
            # scale_a M-major, its columns padded to 16 bytes (TMA's stride rule): torch's
            # layout where M is a multiple of 4, else the plan's copy (``fp8._ScaledPlan``)
            mScaleA = cute.make_tensor(pScaleA, cute.make_layout(
                (m, k_blocks), stride=(1, cute.assume((m + 3) // 4 * 4, divby=4))))
            mScaleB = cute.make_tensor(pScaleB, cute.make_layout(((n + 127) // 128, k_blocks),
                                                                 stride=(k_blocks, 1)))
        else:
            rows, cols = (m, n) if cutlass.const_expr(self.cfg.scaling == "row") else (1, 1)
            mScaleA = cute.make_tensor(pScaleA, cute.make_layout((rows,), stride=(1,)))
            mScaleB = cute.make_tensor(pScaleB, cute.make_layout((cols,), stride=(1,)))
        self(mA, mB, mC, max_active_clusters, stream, mPartials, mFlags, mOrder, mScaleA,
             mScaleB)

    # ------------------------------------------------------------------------ device
    @cute.kernel
    def kernel(self, tma_a: cute.CopyAtom, mA_tma: cute.Tensor, tma_b: cute.CopyAtom,
               mB_tma: cute.Tensor, tma_c: cute.CopyAtom, mC_tma: cute.Tensor,
               mA: cute.Tensor, mB: cute.Tensor, tiled_mma: cute.TiledMma,
               sA_layout: cute.ComposedLayout, sB_layout: cute.ComposedLayout,
               sC_layout: cute.ComposedLayout, sched: utils.PersistentTileSchedulerParams,
               mPartials: cute.Tensor, mFlags: cute.Tensor, mOrder: cute.Tensor,
               mScaleA: cute.Tensor, mScaleB: cute.Tensor, tma_s: cute.CopyAtom,
               mS_tma: cute.Tensor):
        cfg = self.cfg
        tidx, _, _ = cute.arch.thread_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        warpgroup = cute.arch.make_warp_uniform(tidx // WARPGROUP)
        if warp == 0:
            tma.prefetch(tma_a)
            tma.prefetch(tma_b)
            tma.prefetch(tma_c)
            if cutlass.const_expr(cfg.stages_scale_a and cfg.load == "tma"):
                tma.prefetch(tma_s)
        if cutlass.const_expr(not cfg.pdl):
            # the first work unit's table entry: its round trip overlaps the barriers' set-up
            # (under pdl it waits for the previous kernel, below, as every global access does)
            first_entry = self._table_entry(0, mOrder)

        cta_layout = cute.make_layout((cfg.cluster_m, cfg.cluster_n, 1))
        rank = cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster())
        cluster_crd = cta_layout.get_flat_coord(rank)

        storage = cutlass.memory.SmemAllocator().allocate(self.storage)
        sA = storage.sA.get_tensor(sA_layout.outer, swizzle=sA_layout.inner)
        sB = storage.sB.get_tensor(sB_layout.outer, swizzle=sB_layout.inner)
        sC = storage.sC.get_tensor(sC_layout.outer, swizzle=sC_layout.inner)
        sS = None
        if cutlass.const_expr(cfg.stages_scale_a):
            sS = storage.sS.get_tensor(cute.make_layout((cfg.tile_m, 1, self.stages)))

        stage_bytes = cute.size_in_bytes(mA.element_type, cute.slice_(sA_layout, (None, None, 0)))
        stage_bytes += cute.size_in_bytes(mB.element_type, cute.slice_(sB_layout, (None, None, 0)))
        stage_bytes += cfg.stage_scale_bytes
        consumer_warps = cfg.mma_groups * 4  # the warps that read each stage
        pipe = self.loader.make_pipeline(
            storage.barriers.data_ptr(), self.stages, WARPGROUP, consumer_warps, stage_bytes,
            cute.make_layout((1, *cta_layout.shape)), cfg.a_sharers + cfg.b_sharers - 1,
            (1, 1))
        cluster_mn = (cfg.cluster_m, cfg.cluster_n)
        pipeline.pipeline_init_arrive(cluster_shape_mn=cluster_mn, is_relaxed=True)

        # (bM, bK, tiles_m, tiles_k) and (bN, bK, tiles_n, tiles_k) views of A and B
        tile_mk = (cfg.tile_m, cfg.tile_k)
        tile_nk = (cfg.tile_n, cfg.tile_k)
        k_tiles = cute.ceil_div(mA.shape[1], cfg.tile_k)
        pipeline.pipeline_init_wait(cluster_shape_mn=cluster_mn)
        if cutlass.const_expr(cfg.pdl):
            # nothing above reads or writes global memory: from here on A, B, C, the
            # workspace and the order table may be the previous kernel's, so wait for it
            cute.arch.griddepcontrol_wait()
            cute.arch.griddepcontrol_launch_dependents()
            first_entry = self._table_entry(0, mOrder)

        producer_regs, consumer_regs = REGISTERS[cfg.load]
        if warpgroup == 0:
            cute.arch.setmaxregister_decrease(producer_regs)
            if cutlass.const_expr(cfg.load == "tma"):
                if warp == 0:
                    self.produce_tma(pipe, tma_a, mA_tma, tma_b, mB_tma, sA, sB, tile_mk,
                                     tile_nk, k_tiles, cta_layout, cluster_crd, sched, mOrder,
                                     first_entry, tma_s, mS_tma, sS)
            else:
                self.produce_cp_async(pipe, mA, mB, sA, sB, tile_mk, tile_nk, k_tiles, sched,
                                      mOrder, first_entry, mScaleA, sS)
        else:
            cute.arch.setmaxregister_increase(consumer_regs)
            self.consume(pipe, tiled_mma, sA, sB, sC, tma_c, mC_tma, k_tiles, sched,
                         mPartials, mFlags, storage.tickets.get_tensor(cute.make_layout(4)),
                         mOrder, first_entry, mScaleA, mScaleB,
                         storage.scales.get_tensor(cute.make_layout((cfg.tile_n, 2)))
                         if cutlass.const_expr(cfg.stages_column_scales) else None, sS)

    @cute.jit
    def consume(self, pipe, tiled_mma, sA, sB, sC, tma_c, mC_tma, k_tiles, sched,
                mPartials, mFlags, sTickets, mOrder, first_entry, mScaleA=None, mScaleB=None,
                sScales=None, sS=None):
        """A consumer warpgroup: WGMMA over the k-tiles with one group in flight, then the
        epilogue: registers -> stmatrix -> shared -> TMA store.

        Cooperative: both consumer warpgroups take every tile, 64 rows each. Pingpong: the
        CTA's j-th tile belongs to warpgroup j % 2; turn barriers order the mainloops so the
        other warpgroup's epilogue runs under them. Each warpgroup then has its own epilogue
        buffers, barrier and store warp.
        """
        cfg = self.cfg
        loader = self.loader
        tidx, _, _ = cute.arch.thread_idx()
        ctid = tidx - WARPGROUP  # thread index among the consumers
        wg = ctid // WARPGROUP  # 0 or 1
        if cutlass.const_expr(cfg.pingpong):
            # say it is uniform: each warpgroup's mainloop sits under ``if mine`` (which
            # depends on wg), and where ptxas cannot prove that branch warpgroup-uniform it
            # serializes every WGMMA behind the warpgroup.arrive it inserts (C7520)
            wg = cute.arch.make_warp_uniform(wg)
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        if cutlass.const_expr(cfg.pingpong):
            thr_mma = tiled_mma.get_slice(0)
            mma_tid = ctid % WARPGROUP
            epi_threads = WARPGROUP
            epi_bufs = self.epi_buffers // 2
            epi_sync = pipeline.NamedBarrier(barrier_id=int(GemmBarrier.EPILOGUE) + wg,
                                               num_threads=WARPGROUP)
        else:
            thr_mma = tiled_mma.get_slice(cute.make_layout(cfg.consumer_groups,
                                                           stride=WARPGROUP)(wg))
            mma_tid = ctid
            epi_threads = cfg.consumer_groups * WARPGROUP
            epi_bufs = self.epi_buffers
            epi_sync = pipeline.NamedBarrier(barrier_id=int(GemmBarrier.EPILOGUE),
                                               num_threads=epi_threads)
        my_turn = pipeline.NamedBarrier(barrier_id=int(GemmBarrier.TURN) + wg,
                                          num_threads=2 * WARPGROUP)
        their_turn = pipeline.NamedBarrier(barrier_id=int(GemmBarrier.TURN) + 1 - wg,
                                             num_threads=2 * WARPGROUP)
        store_warp = 4 + 4 * wg if cutlass.const_expr(cfg.pingpong) else 4
        tCrA = tiled_mma.make_fragment_A(thr_mma.partition_A(sA))
        tCrB = tiled_mma.make_fragment_B(thr_mma.partition_B(sB))
        gC = cute.local_tile(mC_tma, (cfg.tile_m, cfg.tile_n), (None, None))
        acc = cute.make_rmem_tensor(thr_mma.partition_C(gC).shape[:3], cutlass.Float32)
        k_blocks = cute.size(tCrA, mode=[2])
        # (row, column) in the tile of each accumulator value: the row-wise scales' index.
        # Sliced by this thread's index, not ``thr_mma``'s (the warpgroup's first thread:
        # the operands' descriptors are per warpgroup, the accumulator's values per thread)
        tCcC = tiled_mma.get_slice(mma_tid).partition_C(
            cute.make_identity_tensor((cfg.tile_m, cfg.tile_n)))
        # FP8: where each k-tile's product is summed into ``acc`` in full fp32 (``part``)
        # (one 64-row block of the warpgroup's: a 256-row tile's two waves reuse it)
        promotes = cfg.scaling == "block" or cfg.promote
        part = (cute.make_rmem_tensor((acc.shape[0], 1, acc.shape[2]), cutlass.Float32)
                if promotes else None)
        # FP8's scales: once per distinct row / column of this thread's values
        offsets = (accumulator.value_offsets(tiled_mma, (cfg.tile_m, cfg.tile_n))
                   if cfg.scaling else None)
        # the scales this thread's values take (blockwise: the current k-tile's)
        scales = self._scale_fragments(offsets) if cfg.scaling else None
        # what meets the finished accumulator: every value's scale (tensor, row), nothing
        # (blockwise, a promoted tensor), or the column scales (a promoted row-wise one)
        end_scale = ("values" if cfg.scaling in ("tensor", "row") else None) if not promotes \
            else ("columns" if cfg.scaling == "row" else None)

        # epilogue: accumulator fragment -> stmatrix -> swizzled smem sub-tile -> TMA store
        c_major = self.c_major
        c_dtype = sC.element_type
        r2s = epilogue_copy(tiled_mma, c_major, c_dtype)
        thr_r2s = r2s.get_slice(mma_tid)
        tRS_sC = thr_r2s.partition_D(sC)
        tRS_acc = r2s.retile(acc)
        frag_shape = cute.shape(thr_r2s.partition_S(sC))[:3]
        frag = cute.make_rmem_tensor(frag_shape, cutlass.Float32)
        frag_out = cute.make_rmem_tensor(frag_shape, c_dtype)
        epi_tiles = cfg.tile_n // cfg.epi_n
        order = epilogue_order(tiled_mma, r2s, (cfg.tile_m, cfg.tile_n), cfg.epi_n)
        # store_under_mma: the previous tile in C's type, one fragment per sub-tile, while the
        # accumulator takes the next tile (fp32 C would need the accumulator's whole size)
        deferred = cfg.store_under_mma and c_dtype.width == 16
        held = [cute.make_rmem_tensor(frag_shape, c_dtype) for _ in range(epi_tiles)
                if deferred]
        held_m = cutlass.Int32(0)
        held_n = cutlass.Int32(0)
        holding = cutlass.Int32(0)  # 1 while ``held`` waits to be stored

        read = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
        release = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
        scheduler = utils.StaticPersistentTileScheduler.create(
            sched, cute.arch.block_idx(), cute.arch.grid_dim())
        work = scheduler.initial_work_tile_info()
        stores = cutlass.Int32(0)
        local = cutlass.Int32(0)  # tiles this CTA has seen
        entry = first_entry
        m, n, split, k0, kn, valid, writer, first_peer, peers = self._work(
            sched, work, local, k_tiles, mOrder, entry)
        while valid:
            entry = self._table_entry(local + 1, mOrder)  # lands under this tile's WGMMAs
            mine = True
            if cutlass.const_expr(cfg.pingpong):
                mine = local % 2 == wg
            if mine:
                if cutlass.const_expr(cfg.pingpong):
                    if local > 0:
                        my_turn.arrive_and_wait()  # the other warpgroup's mainloop is issued
                acc.fill(0.0)
                if cutlass.const_expr(promotes):
                    # the tile's scales (tensor, row: applied as each k-tile is promoted)
                    if cutlass.const_expr(cfg.scaling in ("tensor", "row")):
                        self._load_scales(scales[0], scales[1], tCcC, offsets, mScaleA,
                                          mScaleB, m, n, mC_tma.shape,
                                          cols=cfg.scaling != "row")
                    # blockwise: scale_b of the first k-tile; each k-tile loads the next's,
                    # so its one global load lands under a whole k-tile
                    b_block = n * cfg.tile_n // 128
                    sb_next = cutlass.Float32(0.0)
                    if cutlass.const_expr(cfg.scaling == "block"):
                        sb_next = mScaleB[b_block, k0]
                    for k in cutlass.range(k0, k0 + kn, unroll=1):
                        loader.consumer_wait(pipe, read)
                        for wave in cutlass.range_constexpr(cfg.waves):
                            # this k-tile's 64-row block ``wave`` alone into ``part`` (its
                            # first k-step overwrites it; the field is set in the loop body,
                            # so the DSL carries ``tiled_mma`` through the loop)
                            tiled_mma.set(cute.nvgpu.warpgroup.Field.ACCUMULATE, False)
                            self._issue_part(tiled_mma, part, tCrA, tCrB, read.index, wave)
                            if cutlass.const_expr(deferred and wave == 0):
                                # two k-tiles of WGMMAs queued: the previous tile goes out
                                if k == k0 + 1:
                                    if holding > 0:
                                        stores = self._store_held(
                                            held, held_m, held_n, stores, r2s, tRS_sC, tma_c,
                                            sC, gC, epi_sync, warp, store_warp, epi_bufs)
                                        holding = cutlass.Int32(0)
                            # blockwise: this k-tile's scales, scale_a from its stage,
                            # scale_b loaded a k-tile ago; then the next k-tile's scale_b
                            if cutlass.const_expr(cfg.scaling == "block" and wave == 0):
                                self._stage_block_scales(scales[0], tCcC, offsets, sS,
                                                         read.index)
                                scales[1][0] = sb_next
                                sb_next = mScaleB[b_block, cutlass.min(k + 1, k0 + kn - 1)]
                            # the product is promoted into the fp32 accumulator, so it must
                            # be complete (after the last wave its stage is free at once)
                            cute.nvgpu.warpgroup.wait_group(0)
                            if cutlass.const_expr(wave == cfg.waves - 1):
                                loader.consumer_release(pipe, release)
                                release.advance()
                            self._promote(acc, part, scales[0], scales[1], offsets, wave)
                        read.advance()
                else:
                    tiled_mma.set(cute.nvgpu.warpgroup.Field.ACCUMULATE, True)
                    cute.nvgpu.warpgroup.fence()
                    for k in cutlass.range(k0, k0 + kn, unroll=1):
                        loader.consumer_wait(pipe, read)
                        for kb in cutlass.range_constexpr(k_blocks):
                            cute.gemm(tiled_mma, acc, tCrA[(None, None, kb, read.index)],
                                      tCrB[(None, None, kb, read.index)], acc)
                        cute.nvgpu.warpgroup.commit_group()
                        if cutlass.const_expr(deferred):
                            # two k-tiles of WGMMAs queued (~1.4 us at 128 x 256): the
                            # previous tile goes out under them
                            if k == k0 + 1:
                                if holding > 0:
                                    stores = self._store_held(held, held_m, held_n, stores,
                                                              r2s, tRS_sC, tma_c, sC, gC,
                                                              epi_sync, warp, store_warp,
                                                              epi_bufs)
                                    holding = cutlass.Int32(0)
                        # keep this k-tile's WGMMAs in flight; the previous stage is free
                        # once the group before them has retired
                        cute.nvgpu.warpgroup.wait_group(1)
                        if k > k0:
                            loader.consumer_release(pipe, release)
                            release.advance()
                        read.advance()
                if cutlass.const_expr(cfg.pingpong):
                    their_turn.arrive()  # hand the tensor cores over; our epilogue follows
                if cutlass.const_expr(end_scale is not None):
                    # the scales this thread's values take, loaded under the last WGMMAs
                    # (row-wise: the rows' here, the tile's columns into shared memory)
                    self._load_scales(scales[0], scales[1], tCcC, offsets, mScaleA,
                                      mScaleB, m, n, mC_tma.shape,
                                      rows=end_scale == "values",
                                      cols=not cfg.stages_column_scales)
                if cutlass.const_expr(cfg.stages_column_scales):
                    self._stage_column_scales(sScales, mScaleB, n, local % 2, mma_tid,
                                              epi_threads, mC_tma.shape[1])
                cute.nvgpu.warpgroup.wait_group(0)
                if cutlass.const_expr(promotes):
                    pass  # every stage was released as its k-tile was promoted
                elif cutlass.const_expr(cfg.split_k > 1):
                    if kn > 0:  # an empty K slice consumed no stage: nothing to release
                        loader.consumer_release(pipe, release)
                        release.advance()
                else:
                    loader.consumer_release(pipe, release)
                    release.advance()
                if cutlass.const_expr(cfg.stages_column_scales):
                    epi_sync.arrive_and_wait()  # every column scale of the tile is staged
                    self._scale_with_staged_columns(acc, scales[0], sScales, local % 2,
                                                    tCcC, offsets)
                elif cutlass.const_expr(end_scale is not None):
                    self._scale(acc, scales[0], scales[1], offsets,
                                rows=end_scale == "values")

                finish = True
                if cutlass.const_expr(cfg.stream_k):
                    finish = writer == 0
                    if writer > 0:
                        self._leave_partial(acc, mPartials, mFlags, mma_tid, epi_threads,
                                            epi_sync)
                    else:
                        for p in cutlass.range(peers, unroll=1):
                            self._take_partial(acc, mPartials, mFlags, first_peer + p, mma_tid,
                                               epi_threads, epi_sync)
                if cutlass.const_expr(cfg.split_k > 1):
                    tiles_n = cute.ceil_div(mC_tma.shape[1], cfg.tile_n)
                    ticket = wg if cutlass.const_expr(cfg.pingpong) else 0  # per tile team
                    finish = self._split_k_finish(acc, mPartials, mFlags, sTickets,
                                                  m * tiles_n + n, split, ticket, mma_tid,
                                                  epi_threads, epi_sync)
                if cutlass.const_expr(deferred):
                    if holding > 0:  # a one-k-tile tile had nothing to hide the last one under
                        stores = self._store_held(held, held_m, held_n, stores, r2s, tRS_sC,
                                                  tma_c, sC, gC, epi_sync, warp, store_warp,
                                                  epi_bufs)
                    for e in cutlass.range_constexpr(epi_tiles):
                        for v in cutlass.range_constexpr(cute.size(frag)):
                            frag[v] = tRS_acc[order[e][v]]
                        held[e].store(frag.load().to(c_dtype))
                    held_m = m
                    held_n = n
                    holding = cutlass.Int32(1)
                    finish = False
                gC_mn = gC[(None, None, m, n)]
                gC_tile = cute.zipped_divide(gC_mn, (cfg.tile_m, cfg.epi_n))
                bSG_sC, bSG_gC = tma.partition(tma_c, sC, gC_tile, box_rank=2,
                                               gmem_box_rank=1)
                if finish:  # else this unit left its part in the workspace for another
                    for e in cutlass.range_constexpr(epi_tiles):
                        for v in cutlass.range_constexpr(cute.size(frag)):
                            frag[v] = tRS_acc[order[e][v]]
                        frag_out.store(frag.load().to(c_dtype))
                        buf = stores % epi_bufs
                        if cutlass.const_expr(cfg.pingpong):
                            buf = buf + wg * epi_bufs  # each warpgroup its own buffers
                        self._store_subtile(frag_out, buf, e, r2s, tRS_sC, tma_c, bSG_sC,
                                            bSG_gC, epi_sync, warp, store_warp, epi_bufs)
                        stores += 1
            else:
                # the other warpgroup's tile: its stages pass us by
                for _ in cutlass.range(kn, unroll=1):
                    read.advance()
                    release.advance()
            local += 1
            scheduler.advance_to_next_work()
            work = scheduler.get_current_work()
            m, n, split, k0, kn, valid, writer, first_peer, peers = self._work(
                sched, work, local, k_tiles, mOrder, entry)
        if cutlass.const_expr(deferred):
            if holding > 0:  # the CTA's last tile: nothing left to hide it under
                stores = self._store_held(held, held_m, held_n, stores, r2s, tRS_sC, tma_c,
                                          sC, gC, epi_sync, warp, store_warp, epi_bufs)
        if warp == store_warp:
            tma.wait(0)

    @cute.jit
    def _store_held(self, held, m, n, stores, r2s, tRS_sC, tma_c, sC, gC, epi_sync, warp,
                    store_warp, epi_bufs: cutlass.Constexpr):
        """``store_under_mma``: tile (m, n), held in C's type one fragment per sub-tile, out
        through the epilogue buffers as the serial epilogue stores it. Returns the updated
        store count."""
        cfg = self.cfg
        gC_tile = cute.zipped_divide(gC[(None, None, m, n)], (cfg.tile_m, cfg.epi_n))
        bSG_sC, bSG_gC = tma.partition(tma_c, sC, gC_tile, box_rank=2, gmem_box_rank=1)
        for e in cutlass.range_constexpr(len(held)):
            self._store_subtile(held[e], stores % epi_bufs, e, r2s, tRS_sC, tma_c, bSG_sC,
                                bSG_gC, epi_sync, warp, store_warp, epi_bufs)
            stores += 1
        return stores

    @cute.jit
    def _store_subtile(self, fragment, buf, e: cutlass.Constexpr, r2s, tRS_sC, tma_c, bSG_sC,
                       bSG_gC, epi_sync, warp, store_warp, epi_bufs: cutlass.Constexpr):
        """Epilogue sub-tile ``e``: ``fragment`` (C's type) by stmatrix into shared buffer
        ``buf``, then the store warp's TMA store of it to its columns of C. The barrier
        before the store makes every thread's part visible; the one after lets the buffer
        written next be reused once the store warp has seen ``epi_bufs - 1`` younger stores
        leave it."""
        cute.copy(r2s, fragment, tRS_sC[(None, None, None, buf)])
        cute.arch.fence_view_async_shared()  # stmatrix (generic) before TMA
        epi_sync.arrive_and_wait()
        if warp == store_warp:
            cute.copy(tma_c, bSG_sC[(None, buf)], bSG_gC[(None, (0, e))])
            tma.commit()
            tma.wait(epi_bufs - 1)  # the buffer written next is free again
        epi_sync.arrive_and_wait()
