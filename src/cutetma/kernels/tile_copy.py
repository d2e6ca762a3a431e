"""Tile copies that show what the hardware writes: the shared-memory probe and the round trip.

**Probe** (``SmemProbe``): load one box of a 2D tensor into shared memory with a chosen
mechanism and swizzle, then copy the raw shared-memory bytes, unswizzled, to global memory.
The host compares them with ``cutetma.swizzle`` (the model) and ``cutetma.layouts`` (the
CuTe algebra), byte for byte.

    mechanism       who loads                                   completes on
    tma             warp 0 of the CTA, one 2D or 3D box          mbarrier, expect_tx(bytes)
    tma_multicast   each of N CTAs its 1/N slice, multicast      every CTA's mbarrier, whole box
    cp_async        every thread, 16-byte cp.async.cg,           mbarrier, one noinc arrival
                    swizzled by the same CuTe layout             per thread
    dsm             CTA 0 by TMA; after a cluster barrier the    mbarrier (leader), then
                    peers read it over the crossbar              cluster barriers
                    (mapa + ld.shared::cluster) into their own

The destination layout is ``cutetma.layouts``' layout for the box: the DSL's K-major atom
tiled down the rows when the box is one swizzle span wide, row-major composed with the
mode's byte swizzle when narrower, and for a 3D grouped box ``(groups, rows, G)`` each group
a dense block of all rows. The swizzle sits on the shared-memory *pointer* (byte units).

**Round trip** (``TmaRoundTrip``): every CTA loads one box by TMA and stores it back by TMA
into another tensor (bulk commit group / wait group); shapes need not be multiples of the box:
loads zero-fill outside the tensor, stores clip.

Constraints: 1-, 2- or 4-byte elements; the inner box follows the TMA rules in
``cutetma.swizzle.check_box``; the row stride is a multiple of 16 bytes; 128 threads.
Run: ``cutetma swizzle hardware`` (GPU) or ``pytest tests/test_copy_ptx.py`` (compile only).
"""

from __future__ import annotations

import dataclasses

from cutetma import dsl
from cutetma import swizzle as hw
from cutetma.copy import cpasync as cpa
from cutetma.copy import loader as loaders
from cutetma.copy import tma

cutlass, cute = dsl.cutlass()
from cuda.bindings import driver as cuda  # noqa: E402

PROBE_MECHANISMS = ("tma", "tma_multicast", "cp_async", "dsm")
THREADS = 128


def cute_dtype(elem_bytes: int):
    return {1: cutlass.Uint8, 2: cutlass.Float16, 4: cutlass.Float32}[elem_bytes]


@dataclasses.dataclass(frozen=True)
class ProbeConfig:
    """What to load and how. ``cols`` counts the whole box width (grouped: groups * G)."""

    elem_bytes: int
    swizzle: str
    rows: int
    cols: int
    grouped: bool = False
    load: str = "tma"
    cluster: int = 1
    # rows of a larger buffer above the box: the box lands at that row, as a paged K/V
    # stage's later boxes do (one TMA, unicast, 2D)
    row_offset: int = 0

    def __post_init__(self):
        m = hw.mode(self.swizzle)
        object.__setattr__(self, "swizzle", m.name)
        if self.load not in PROBE_MECHANISMS:
            raise ValueError(f"load={self.load!r}: choose one of {', '.join(PROBE_MECHANISMS)}")
        if self.elem_bytes not in (1, 2, 4):
            raise ValueError(f"element width {self.elem_bytes} B: the probe takes 1, 2 or 4")
        if self.grouped:
            g = hw.group_size(self.elem_bytes, m)
            if self.cols % g:
                raise ValueError(f"a grouped box is whole groups of {g} columns, got {self.cols}")
            hw.check_box((self.cols // g, self.rows, g), self.elem_bytes, m)
        else:
            hw.check_box((self.rows, self.cols), self.elem_bytes, m)
        clustered = self.load in ("tma_multicast", "dsm")
        if clustered and self.cluster not in (2, 4, 8, 16):
            raise ValueError(f"load={self.load!r} needs a cluster of 2, 4, 8 or 16 CTAs")
        if not clustered and self.cluster != 1:
            raise ValueError(f"load={self.load!r} runs on one CTA, not a cluster of {self.cluster}")
        if self.row_offset and (self.load != "tma" or self.grouped or self.row_offset < 0):
            raise ValueError("row_offset: a 2D box loaded by one TMA, at a row >= 0")
        if self.load == "tma_multicast" and self.rows % self.cluster:
            raise ValueError(
                f"multicast splits the box rows over the cluster: {self.rows} rows "
                f"do not divide into {self.cluster} slices"
            )

    @property
    def box_bytes(self) -> int:
        return self.rows * self.cols * self.elem_bytes

    @property
    def smem_bytes(self) -> int:
        """Bytes the box takes in shared memory (allocated, poisoned and dumped by the probe):
        a swizzled box narrower than its span takes a whole span per row."""
        if self.grouped:
            return self.box_bytes
        return hw.box_smem_bytes((self.rows + self.row_offset, self.cols), self.elem_bytes,
                                 self.swizzle)

    @property
    def row_pitch_elems(self) -> int:
        """Elements from one shared-memory row of the box to the next."""
        return hw.box_row_pitch(self.cols * self.elem_bytes, self.swizzle) // self.elem_bytes

    @property
    def group(self) -> int:
        return hw.group_size(self.elem_bytes, self.swizzle) if self.grouped else self.cols

    @property
    def groups(self) -> int:
        return self.cols // self.group

    @property
    def smem_alignment(self) -> int:
        return max(1024, hw.mode(self.swizzle).smem_alignment)


def smem_box_layouts(cfg: ProbeConfig):
    """``(swizzle, layout_2d, layout_tma, tma_tiler)``: the box's shared-memory layout as
    (rows, cols) and as the TMA descriptor is built from it (3D ``(groups, rows, G)`` when
    grouped).

    A swizzled box narrower than its span is the one case where the two differ: the
    hardware gives each row a whole span, so ``layout_2d`` (what cp.async writes through) is
    pitched; built from that layout the DSL would issue one TMA per row, so the descriptor is
    built from the dense layout instead: one box, which the hardware lays out pitched.
    """
    m = hw.mode(cfg.swizzle)
    sw = cute.make_swizzle(m.bits, 4, 3)
    dtype = cute_dtype(cfg.elem_bytes)
    dense = cute.make_ordered_layout((cfg.rows, cfg.cols), order=(1, 0))
    if m.bits and cfg.group * cfg.elem_bytes == m.span and cfg.rows % 8:
        # fewer rows than the swizzle atom's 8 (a box that ends mid-atom): dense rows one
        # span apart, the swizzle on the pointer (no atom tiles such a box)
        return sw, dense, dense, (cfg.rows, cfg.cols)
    if m.bits and cfg.group * cfg.elem_bytes == m.span:
        from cutlass.cute.nvgpu import warpgroup

        kind = getattr(warpgroup.SmemLayoutAtomKind, f"K_SW{m.span}")
        atom = warpgroup.make_smem_layout_atom(kind, dtype)
        layout_2d = cute.tile_to_shape(atom, (cfg.rows, cfg.cols), (0, 1)).outer
    elif m.bits:
        layout_2d = cute.make_layout((cfg.rows, cfg.cols), stride=(m.span // cfg.elem_bytes, 1))
        return sw, layout_2d, dense, (cfg.rows, cfg.cols)
    else:
        layout_2d = dense
    if cfg.grouped:
        g = cfg.group
        layout_tma = cute.make_layout((cfg.groups, cfg.rows, g), stride=(cfg.rows * g, g, 1))
        return sw, layout_2d, layout_tma, (cfg.groups, cfg.rows, g)
    return sw, layout_2d, layout_2d, (cfg.rows, cfg.cols)


class SmemProbe:
    """Load a box, dump the shared-memory bytes: ``out[cta, byte]`` (uint8)."""

    def __init__(self, config: ProbeConfig):
        self.cfg = config

    @cute.jit
    def __call__(
        self,
        mX: cute.Tensor,
        out: cute.Tensor,
        tile_r: cutlass.Int32,
        tile_c: cutlass.Int32,
        stream: cuda.CUstream,
    ):
        cfg = self.cfg
        sw, layout_2d, layout_tma, tiler = smem_box_layouts(cfg)
        mcast = cfg.cluster if cfg.load == "tma_multicast" else 1
        mG = tma.group_view(mX, cfg.group) if cutlass.const_expr(cfg.grouped) else mX
        atom, mT = tma.load_atom(mG, cute.make_composed_layout(sw, 0, layout_tma), tiler, mcast)
        self.kernel(atom, mT, mX, out, tile_r, tile_c).launch(
            grid=(cfg.cluster, 1, 1),
            block=(THREADS, 1, 1),
            cluster=(cfg.cluster, 1, 1),
            stream=stream,
        )

    @cute.kernel
    def kernel(
        self,
        atom: cute.CopyAtom,
        mT: cute.Tensor,
        mX: cute.Tensor,
        out: cute.Tensor,
        tile_r: cutlass.Int32,
        tile_c: cutlass.Int32,
    ):
        cfg = self.cfg
        dtype = cute_dtype(cfg.elem_bytes)
        sw, layout_2d, layout_tma, tiler = smem_box_layouts(cfg)
        tidx, _, _ = cute.arch.thread_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        rank = cutlass.Int32(0)
        if cutlass.const_expr(cfg.cluster > 1):
            rank = cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster())

        smem = cutlass.memory.SmemAllocator()
        raw = smem.allocate_array(cutlass.Uint8, cfg.smem_bytes, byte_alignment=cfg.smem_alignment)
        bar = smem.allocate_array(cutlass.Int64, 1, byte_alignment=8)
        typed = cute.recast_ptr(raw, swizzle_=sw, dtype=dtype)
        sX_tma = cute.make_tensor(typed + cfg.row_offset * cfg.row_pitch_elems, layout_tma)
        sX_2d = cute.make_tensor(typed, layout_2d)
        sRaw = cute.make_tensor(raw, cute.make_layout(cfg.smem_bytes))
        # Poison: a byte nobody loads keeps 0xA5, so the dump shows exactly what was written.
        for j in cutlass.range(cfg.smem_bytes // THREADS):
            sRaw[j * THREADS + tidx] = cutlass.Uint8(0xA5)
        cute.arch.fence_view_async_shared()  # generic stores before async-proxy (TMA) writes

        loader = loaders.make_loader("cp_async" if cfg.load == "cp_async" else "tma")
        if warp == 0:
            with cute.arch.elect_one():
                cute.arch.mbarrier_init(bar, loader.barrier_count(THREADS))
        cute.arch.mbarrier_init_fence()
        self._cluster_sync()  # every CTA's barrier is live before anyone's multicast lands

        if cutlass.const_expr(cfg.load == "cp_async"):
            gX = cute.local_tile(cpa.aligned_rows(mX), (cfg.rows, cfg.cols), (tile_r, tile_c))
            tiled, used = cpa.tiled_copy(dtype, cfg.rows, cfg.cols, THREADS)
            if tidx < used:
                thr = tiled.get_slice(tidx)
                loader.load(tiled, thr.partition_S(gX), thr.partition_D(sX_2d))
            loader.commit(bar)
        else:
            if cutlass.const_expr(cfg.grouped):
                gT = cute.local_tile(mT, tiler, (tile_c, tile_r, 0))
            else:
                gT = cute.local_tile(mT, tiler, (tile_r, tile_c))
            if warp == 0:
                if cutlass.const_expr(cfg.load == "dsm"):
                    if rank == 0:  # only the leader reads global memory
                        self._tma_issue(loader, atom, sX_tma, gT, rank, bar)
                else:
                    self._tma_issue(loader, atom, sX_tma, gT, rank, bar)
        if cutlass.const_expr(cfg.load == "dsm"):
            if rank == 0:
                cute.arch.mbarrier_wait(bar, 0)
            self._cluster_sync()  # release the leader's tile to the cluster
            if rank != 0:
                self._pull_from_leader(raw)
            cute.arch.sync_threads()
        else:
            cute.arch.mbarrier_wait(bar, 0)
            cute.arch.sync_threads()

        for j in cutlass.range(cfg.smem_bytes // THREADS):
            i = j * THREADS + tidx
            out[rank, i] = sRaw[i]
        self._cluster_sync()  # no CTA leaves while a peer may still read or write its memory

    @cute.jit
    def _tma_issue(self, loader, atom, sX, gX, rank, bar):
        """Arm the barrier with the whole box (every CTA receives all of it, also under
        multicast) and issue this CTA's copy: the box, or its 1/N multicast slice."""
        sharers = self.cfg.cluster if self.cfg.load == "tma_multicast" else 1
        sT, gS = tma.partition(atom, sX, gX, rank, sharers)
        loader.arm(bar, self.cfg.box_bytes)
        mask = None
        if cutlass.const_expr(sharers > 1):
            mask = cutlass.Int16((1 << self.cfg.cluster) - 1)
        loader.load(atom, gS, sT, bar, mask)

    @cute.jit
    def _cluster_sync(self):
        if cutlass.const_expr(self.cfg.cluster > 1):
            cute.arch.cluster_arrive()
            cute.arch.cluster_wait()
        else:
            cute.arch.sync_threads()

    @cute.jit
    def _pull_from_leader(self, raw: cute.Pointer):
        """DSM: read CTA 0's image over the cluster crossbar, 4 bytes per load."""
        words = cute.recast_ptr(raw, dtype=cutlass.Int32)
        remote = cute.arch.map_dsmem_ptr(words, 0)
        tidx, _, _ = cute.arch.thread_idx()
        for j in cutlass.range(self.cfg.smem_bytes // 4 // THREADS):
            i = j * THREADS + tidx
            (words + i).store((remote + i).load())


class TmaRoundTrip:
    """``dst = src`` one box per CTA, through shared memory: TMA load, then TMA store."""

    def __init__(self, elem_bytes: int, swizzle: str, rows: int, cols: int):
        self.cfg = ProbeConfig(elem_bytes, swizzle, rows, cols)

    @cute.jit
    def __call__(self, mSrc: cute.Tensor, mDst: cute.Tensor, stream: cuda.CUstream):
        cfg = self.cfg
        sw, layout_2d, _, tiler = smem_box_layouts(cfg)
        smem_layout = cute.make_composed_layout(sw, 0, layout_2d)
        load, mS = tma.load_atom(mSrc, smem_layout, tiler)
        store, mD = tma.store_atom(mDst, smem_layout, tiler)
        grid = (cute.ceil_div(mSrc.shape[0], cfg.rows), cute.ceil_div(mSrc.shape[1], cfg.cols), 1)
        self.kernel(load, mS, store, mD).launch(grid=grid, block=(THREADS, 1, 1), stream=stream)

    @cute.kernel
    def kernel(self, load: cute.CopyAtom, mS: cute.Tensor, store: cute.CopyAtom, mD: cute.Tensor):
        cfg = self.cfg
        sw, layout_2d, _, tiler = smem_box_layouts(cfg)
        bx, by, _ = cute.arch.block_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        smem = cutlass.memory.SmemAllocator()
        raw = smem.allocate_array(cutlass.Uint8, cfg.smem_bytes, byte_alignment=cfg.smem_alignment)
        bar = smem.allocate_array(cutlass.Int64, 1, byte_alignment=8)
        sX = cute.make_tensor(cute.recast_ptr(raw, swizzle_=sw, dtype=cute_dtype(cfg.elem_bytes)),
                              layout_2d)
        loader = loaders.TmaLoader()
        if warp == 0:
            with cute.arch.elect_one():
                cute.arch.mbarrier_init(bar, 1)
        cute.arch.mbarrier_init_fence()
        cute.arch.sync_threads()
        if warp == 0:
            sL, gL = tma.partition(load, sX, cute.local_tile(mS, tiler, (bx, by)))
            loader.arm(bar, cfg.box_bytes)
            loader.load(load, gL, sL, bar)
        cute.arch.mbarrier_wait(bar, 0)
        if warp == 0:
            sS, gS = tma.partition(store, sX, cute.local_tile(mD, tiler, (bx, by)))
            cute.copy(store, sS, gS)
            tma.commit()
            tma.wait(0)  # the buffer may be reused (or the CTA leave) only once it is read
