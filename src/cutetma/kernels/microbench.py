"""Microbenchmarks of the seed paper ("When and Why to Use TMA", sections 4.2, 4.4, 4.5),
written once each with the load mechanism as a parameter.

All of them move tiles of 4-byte words: a tile is one ``(rows, cols)`` box of a row-major
``(R, cols)`` fp32 tensor (``cols`` <= 256, ``rows`` <= 256, no swizzle), so every TMA load
of a tile is **one** 2D ``cp.async.bulk.tensor`` instruction, and the cp.async variant writes
the same dense shared-memory layout with 16-byte ``cp.async.cg`` vectors (``cutetma.copy``).

``SingleShotLatency`` (Figure 4 a/b): one load per CTA, timed inside the kernel::

    sync_threads; t0 = %globaltimer, clock64          (every thread; thread 0's are kept)
    tma:      warp 0 arms the mbarrier (expect_tx) and issues one 2D TMA of the tile
    cp_async: every thread issues its 16-byte vectors (1..32 each), then
              cp.async.mbarrier.arrive.noinc
    wait on the mbarrier (phase 0); t1 = clock64, %globaltimer
    times[cta] = (t1 - t0 in ns, in SM cycles); with ``check``: dump[cta] = the tile's smem

  The measured interval is issue -> barrier completion observed by thread 0. Bytes in
  flight per SM = the tile (one CTA per SM). ns/byte (panel b) is derived on the host.

``StreamingLoad`` (Figure 4 c): sustained global -> shared bandwidth. Every CTA walks tiles
``bid, bid + grid, ...`` through a ring of ``stages`` buffers, one mbarrier each::

    prologue: issue tiles 0..stages-1 of this CTA into stages 0..stages-1
    for k: wait full[k % stages] (phase (k / stages) & 1); sync_threads;
           issue tile k + stages into the same stage
    with ``check``: dump every stage (the last ``stages`` tiles)

  Nothing consumes the data: the kernel measures how fast the mechanism can keep bytes in
  flight. The host times the launch with CUDA events; bytes read = tiles x tile bytes.
  Bytes in flight per SM = CTAs per SM x stages x tile.

``ClusterBroadcast`` (Figures 6 and 7): a cluster of N CTAs needs the same tile in every
CTA's shared memory, ``iters`` times (cluster c loads tile ``(c * iters + k) % num_tiles``
at iteration k, so every cluster streams different data). Ring of ``stages`` (full, empty)
barrier pairs. ``load`` picks the protocol::

    tma                   redundant unicast: every CTA loads the whole tile itself; only
                          CTA-local barriers, no cluster traffic (Figure 6, unicast arm)
    tma_multicast         leader multicast: CTA 0 waits until all N CTAs released the stage
                          (remote arrivals on its empty barrier), then issues one multicast
                          TMA of the whole tile to all N (Figure 6 / 7, the paper's arm)
    tma_multicast_split   every CTA multicasts 1/N of the tile to all N (CUTLASS style; each
                          CTA waits for N releases on its own empty barrier before its slice)
    dsm                   DSM broadcast: CTA 0 loads the tile by unicast TMA; cluster
                          barrier; the other CTAs pull it over the SM-to-SM network
                          (mapa + 16-byte ld.shared::cluster) into their own stage; cluster
                          barrier (the leader's buffer is free again) (Figure 7)

  Every CTA arms its own full barrier with the whole tile's bytes (multicast writes land in
  every CTA). The host times the launch with CUDA events: runtime per iteration =
  elapsed / iters. With ``check`` every CTA dumps the stage holding the last tile.

``PlacementProbe``: where the hardware puts each CTA of a launch (the GEMM's persistent grid
decides which tile runs on which SM only through the CTA index). Each CTA, padded to one per
SM, writes ``(smid, rank in its cluster, %globaltimer_lo at its start)`` and spins ``cycles``
clocks so that the whole grid is resident at once, as a persistent grid is. A cluster's CTAs
share a GPC, so launches of 16-, 8- and 6-CTA clusters name the GPCs' SMs
(``cutetma.placement``).

``TimerCalibration``: thread 0 spins ``cycles`` SM clocks and reports the two timers, so the
host converts clock64 deltas to ns (``%globaltimer`` ticks in steps that may be coarse).

Occupancy is part of every config: ``ctas_per_sm`` pads the launch's dynamic shared memory
so that exactly that many CTAs fit on an SM (1 unless Figure 4 (c) asks for 2 or 4), so
"bytes in flight per SM" and "a cluster spans N SMs" hold by construction.

Constraints: fp32 tensors (``R``, ``cols``), ``cols`` a multiple of 4, rows and cols at most
256, 16-byte aligned base and row stride; ``stages x tile`` fits in the padded shared
memory, stages 128-byte aligned; clusters of 2, 4, 8 or 16 (16 is non-portable: the DSL
sets ``CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED`` on every kernel it builds).
Run: ``python benchmarks/paper/run_all.py`` (GPU); ``pytest tests/test_microbench_ptx.py``.
"""

from __future__ import annotations

import dataclasses

from cutetma import dsl
from cutetma.copy import cpasync as cpa
from cutetma.copy import loader as loaders
from cutetma.copy import tma
from cutetma.kernels.smem import smem_capacity

cutlass, cute = dsl.cutlass()
from cuda.bindings import driver as cuda  # noqa: E402
from cutlass._mlir import ir  # noqa: E402
from cutlass._mlir.dialects import llvm, nvvm  # noqa: E402

ELEM_BYTES = 4
THREADS = 256
MAX_BOX = 256  # elements per TMA box dimension
SMEM_PER_CTA = smem_capacity()  # 227 KiB on sm_90, from the DSL
SMEM_PER_SM = SMEM_PER_CTA + 1024  # a CTA's capacity plus the driver's reservation
SMEM_RESERVED = 1024  # per CTA, by the driver
BARRIER_BYTES = 256  # what the barriers and alignment take, rounded up
VECTOR = 16  # bytes per cp.async.cg / ld.shared::cluster.v4

SINGLE_SHOT_LOADS = ("tma", "cp_async")
BROADCAST_LOADS = ("tma", "tma_multicast", "tma_multicast_split", "dsm")
CLUSTER_SIZES = (2, 4, 8, 16)


def tile_shape(tile_bytes: int, min_rows: int = 1, cols: int | None = None) -> tuple[int, int]:
    """``(rows, cols)`` of fp32 words for a tile of ``tile_bytes``: the widest row (at most 256
    words) that leaves at least ``min_rows`` rows, or the given ``cols``."""
    words, rem = divmod(tile_bytes, ELEM_BYTES)
    if rem or words == 0:
        raise ValueError(f"a tile is a positive number of 4-byte words, got {tile_bytes} B")
    for c in ((cols,) if cols else (256, 128, 64, 32, 16, 8, 4)):
        rows, rem = divmod(words, c)
        if not rem and min_rows <= rows <= MAX_BOX and c % 4 == 0:
            return rows, c
    raise ValueError(f"no (rows, cols) box of {tile_bytes} B with >= {min_rows} rows, "
                     f"rows and cols <= {MAX_BOX}" + (f", cols = {cols}" if cols else ""))


def _check_tile(rows: int, cols: int, stages: int):
    if not (1 <= rows <= MAX_BOX and 4 <= cols <= MAX_BOX and cols % 4 == 0):
        raise ValueError(f"tile {rows}x{cols} words: rows 1..{MAX_BOX}, cols 4..{MAX_BOX} in "
                         f"steps of 4 (one TMA box, 16-byte rows)")
    if stages < 1:
        raise ValueError(f"stages={stages}: at least 1")
    if stages > 1 and rows * cols * ELEM_BYTES % 128:
        raise ValueError(f"a tile of {rows * cols * ELEM_BYTES} B: every stage must start "
                         f"128-byte aligned for TMA, use a multiple of 128 B")
    need = stages * rows * cols * ELEM_BYTES + BARRIER_BYTES
    if need > SMEM_PER_CTA:
        raise ValueError(f"{stages} stages of {rows * cols * ELEM_BYTES} B need {need} B of "
                         f"shared memory, a CTA has {SMEM_PER_CTA}")


def launch_smem(needed: int, ctas_per_sm: int) -> int | None:
    """Dynamic shared memory to launch with so that at most ``ctas_per_sm`` CTAs share an SM
    (the padding is what limits occupancy); ``None`` (the kernel's own size) for 0."""
    if ctas_per_sm == 0:
        return None
    if ctas_per_sm < 0:
        raise ValueError(f"ctas_per_sm={ctas_per_sm}: 0 (no limit) or more")
    # k CTAs fit when k * (smem + reserved) <= the SM's 228 KiB; k + 1 then do not
    padded = min(SMEM_PER_CTA, (SMEM_PER_SM // ctas_per_sm - SMEM_RESERVED - 128) // 128 * 128)
    if needed + BARRIER_BYTES > padded:
        raise ValueError(f"{needed} B of tiles per CTA: {ctas_per_sm} CTAs do not fit on an SM "
                         f"({padded} B each at most)")
    return padded


def _check_load(load: str, loads: tuple[str, ...]):
    if load not in loads:
        raise ValueError(f"load={load!r}: choose one of {', '.join(loads)}")


class _Tile:
    """The configs' (rows, cols) tile of fp32 words, in bytes."""

    @property
    def tile_bytes(self) -> int:
        return self.rows * self.cols * ELEM_BYTES


class _Ring(_Tile):
    """A ring of ``stages`` tiles: the shared memory the tiles take."""

    @property
    def smem_bytes(self) -> int:
        return self.stages * self.tile_bytes


@dataclasses.dataclass(frozen=True)
class LatencyConfig(_Tile):
    load: str  # "tma" | "cp_async"
    rows: int
    cols: int = 128
    threads: int = THREADS
    ctas_per_sm: int = 1  # at most this many CTAs per SM (shared-memory padding); 0: no cap

    def __post_init__(self):
        _check_load(self.load, SINGLE_SHOT_LOADS)
        _check_tile(self.rows, self.cols, 1)
        if self.threads % 32 or not 32 <= self.threads <= 1024:
            raise ValueError(f"threads={self.threads}: whole warps, 32..1024")
        launch_smem(self.tile_bytes, self.ctas_per_sm)

    @property
    def vectors_per_thread(self) -> int:
        """cp.async: 16-byte vectors each thread issues (threads beyond the tile idle)."""
        return max(1, self.tile_bytes // VECTOR // self.threads)

    @property
    def threads_loading(self) -> int:
        if self.load == "tma":
            return 1
        return min(self.threads, self.tile_bytes // VECTOR)


@dataclasses.dataclass(frozen=True)
class StreamConfig(_Ring):
    load: str  # "tma" | "cp_async"
    rows: int
    cols: int = 128
    stages: int = 4
    threads: int = THREADS
    ctas_per_sm: int = 1  # exactly this many per SM when the grid is ctas_per_sm x SMs

    def __post_init__(self):
        _check_load(self.load, SINGLE_SHOT_LOADS)
        _check_tile(self.rows, self.cols, self.stages)
        launch_smem(self.smem_bytes, self.ctas_per_sm)


@dataclasses.dataclass(frozen=True)
class BroadcastConfig(_Ring):
    load: str  # one of BROADCAST_LOADS
    cluster: int
    rows: int
    cols: int
    stages: int = 2
    threads: int = THREADS
    ctas_per_sm: int = 1  # one CTA per SM: a cluster spans N SMs, as occupancy queries assume

    def __post_init__(self):
        _check_load(self.load, BROADCAST_LOADS)
        if self.cluster not in CLUSTER_SIZES:
            raise ValueError(f"cluster={self.cluster}: one of {CLUSTER_SIZES}")
        _check_tile(self.rows, self.cols, self.stages)
        if self.load == "tma_multicast_split" and self.rows % self.cluster:
            raise ValueError(f"the split multicast gives each CTA rows/N rows: {self.rows} rows "
                             f"do not divide into {self.cluster} slices")
        launch_smem(self.smem_bytes, self.ctas_per_sm)

    @property
    def multicast(self) -> bool:
        return self.load in ("tma_multicast", "tma_multicast_split")


# --------------------------------------------------------------------------- trace helpers
@cute.jit
def _alloc_ring(smem, rows, cols, stages):
    """``(sX, raw)``: ``stages`` dense (rows, cols) fp32 tiles, 128-byte aligned, as a
    (rows, cols, stages) tensor and as the raw byte pointer."""
    raw = smem.allocate_array(cutlass.Uint8, stages * rows * cols * ELEM_BYTES,
                              byte_alignment=128)
    layout = cute.make_layout((rows, cols, stages), stride=(cols, 1, rows * cols))
    return cute.make_tensor(cute.recast_ptr(raw, dtype=cutlass.Float32), layout), raw


def _tile_layout(rows: int, cols: int):
    return cute.make_ordered_layout((rows, cols), order=(1, 0))


@cute.jit
def _init_barriers(bars, count, n):
    """Warp 0 initializes ``n`` mbarriers with ``count`` arrivals each, then fences."""
    warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
    if warp == 0:
        with cute.arch.elect_one():
            for i in cutlass.range_constexpr(n):
                cute.arch.mbarrier_init(bars + i, count)
    cute.arch.mbarrier_init_fence()


@cute.jit
def _dump_words(raw, out, row, first_word, words, threads):
    """``out[row, first_word + i] = smem word i`` for ``i < words`` (every thread a share)."""
    tidx, _, _ = cute.arch.thread_idx()
    src = cute.recast_ptr(raw, dtype=cutlass.Int32)
    for j in cutlass.range(cute.ceil_div(words, threads)):
        i = j * threads + tidx
        if i < words:
            out[row, first_word + i] = (src + i).load()


DSM_BATCH = 8  # 16-byte remote loads in flight per thread before their stores


@cute.jit
def _dsm_pull(raw, peer, stage, tile_bytes, threads):
    """Copy stage ``stage`` (``tile_bytes`` each) of the ring at ``raw`` in CTA ``peer`` of the
    cluster into the same stage here: 16-byte loads over the SM-to-SM network (mapa +
    ld.shared::cluster.v4), then 16-byte local stores, ``DSM_BATCH`` loads in flight per
    thread (a store may alias a later remote load, so the compiler would not overlap them
    by itself). The probe's ``_pull_from_leader`` moves 4 bytes per load (it checks bytes,
    not speed); this is the fast version. CuTe tensors refuse loads from the dsmem space,
    hence raw LLVM loads."""
    tidx, _, _ = cute.arch.thread_idx()
    vecs = tile_bytes // VECTOR
    rounds, tail = divmod(vecs, threads)
    words = cute.recast_ptr(raw, dtype=cutlass.Int32) + stage * (tile_bytes // 4)
    remote = cute.arch.map_dsmem_ptr(words, peer)
    vec4 = ir.VectorType.get([4], cutlass.Int32.mlir_type)
    for r0 in cutlass.range_constexpr(0, rounds, DSM_BATCH):
        batch = min(DSM_BATCH, rounds - r0)
        values = [llvm.load(vec4, (remote + ((r0 + i) * threads + tidx) * 4).to_llvm_ptr(),
                            alignment=VECTOR) for i in range(batch)]
        for i in cutlass.range_constexpr(batch):
            llvm.store(values[i], (words + ((r0 + i) * threads + tidx) * 4).to_llvm_ptr(),
                       alignment=VECTOR)
    if cutlass.const_expr(tail > 0):
        if tidx < tail:
            v = rounds * threads + tidx
            value = llvm.load(vec4, (remote + v * 4).to_llvm_ptr(), alignment=VECTOR)
            llvm.store(value, (words + v * 4).to_llvm_ptr(), alignment=VECTOR)


@cute.jit
def _cluster_sync():
    cute.arch.cluster_arrive()
    cute.arch.cluster_wait()


# --------------------------------------------------------------------------- Figure 4 (a, b)
class SingleShotLatency:
    """One load per CTA; ``times[cta] = (ns, SM cycles)`` from issue to barrier completion."""

    def __init__(self, config: LatencyConfig):
        self.cfg = config
        self.loader = loaders.make_loader(config.load)

    @cute.jit
    def __call__(self, mX: cute.Tensor, times: cute.Tensor, dump: cute.Tensor,
                 tile_base: cutlass.Int32, check: cutlass.Int32, stream: cuda.CUstream):
        cfg = self.cfg
        atom, mT = tma.load_atom(mX, _tile_layout(cfg.rows, cfg.cols), (cfg.rows, cfg.cols))
        self.kernel(atom, mT, mX, times, dump, tile_base, check).launch(
            grid=(times.shape[0], 1, 1), block=(cfg.threads, 1, 1),
            smem=launch_smem(cfg.tile_bytes, cfg.ctas_per_sm), stream=stream)

    @cute.kernel
    def kernel(self, atom: cute.CopyAtom, mT: cute.Tensor, mX: cute.Tensor, times: cute.Tensor,
               dump: cute.Tensor, tile_base: cutlass.Int32, check: cutlass.Int32):
        cfg = self.cfg
        tidx, _, _ = cute.arch.thread_idx()
        bid, _, _ = cute.arch.block_idx()
        smem = cutlass.memory.SmemAllocator()
        sX, raw = _alloc_ring(smem, cfg.rows, cfg.cols, 1)
        bar = smem.allocate_array(cutlass.Int64, 1, byte_alignment=8)
        _init_barriers(bar, self.loader.barrier_count(cfg.threads), 1)
        tile = tile_base + bid
        cute.arch.sync_threads()  # the barrier is live; every thread starts together
        g0 = cute.arch.globaltimer()
        c0 = cute.arch.clock64()
        _issue(self.loader, atom, mT, mX, sX, bar, tile, 0, cfg.rows, cfg.cols, cfg.threads)
        cute.arch.mbarrier_wait(bar, 0)
        c1 = cute.arch.clock64()
        g1 = cute.arch.globaltimer()
        if tidx == 0:
            times[bid, 0] = g1 - g0
            times[bid, 1] = c1 - c0
        if check != 0:
            cute.arch.sync_threads()
            _dump_words(raw, dump, bid, 0, cfg.rows * cfg.cols, cfg.threads)


@cute.jit
def _issue(loader, atom, mT, mX, sX, bar, tile, stage, rows, cols, threads):
    """Load tile ``tile`` (row block of the tensor) into ``sX[:, :, stage]``, completing on
    ``bar``: TMA from warp 0 (one box), or cp.async from every thread + noinc arrival."""
    if cutlass.const_expr(loader.mechanism == "cp_async"):
        tidx, _, _ = cute.arch.thread_idx()
        gX = cute.local_tile(cpa.aligned_rows(mX), (rows, cols), (None, 0))
        tiled, used = cpa.tiled_copy(cutlass.Float32, rows, cols, threads)
        if tidx < used:
            thr = tiled.get_slice(tidx)
            loader.load(tiled, thr.partition_S(gX)[(None, None, None, tile)],
                        thr.partition_D(sX)[(None, None, None, stage)])
        loader.commit(bar)
    else:
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        if warp == 0:
            gT = cute.local_tile(mT, (rows, cols), (None, 0))
            tAsX, tAgX = tma.partition(atom, sX, gT, box_rank=2)
            loader.arm(bar, rows * cols * ELEM_BYTES)
            loader.load(atom, tAgX[(None, tile)], tAsX[(None, stage)], bar)


# --------------------------------------------------------------------------- Figure 4 (c)
class StreamingLoad:
    """Every CTA streams tiles ``bid, bid + grid, ...`` through a ring of ``stages`` buffers."""

    def __init__(self, config: StreamConfig):
        self.cfg = config
        self.loader = loaders.make_loader(config.load)

    @cute.jit
    def __call__(self, mX: cute.Tensor, dump: cute.Tensor, num_tiles: cutlass.Int32,
                 check: cutlass.Int32, stream: cuda.CUstream):
        cfg = self.cfg
        atom, mT = tma.load_atom(mX, _tile_layout(cfg.rows, cfg.cols), (cfg.rows, cfg.cols))
        self.kernel(atom, mT, mX, dump, num_tiles, check).launch(
            grid=(dump.shape[0], 1, 1), block=(cfg.threads, 1, 1),
            smem=launch_smem(cfg.smem_bytes, cfg.ctas_per_sm), stream=stream)

    @cute.kernel
    def kernel(self, atom: cute.CopyAtom, mT: cute.Tensor, mX: cute.Tensor, dump: cute.Tensor,
               num_tiles: cutlass.Int32, check: cutlass.Int32):
        cfg = self.cfg
        S = cfg.stages
        bid, _, _ = cute.arch.block_idx()
        grid, _, _ = cute.arch.grid_dim()
        smem = cutlass.memory.SmemAllocator()
        sX, raw = _alloc_ring(smem, cfg.rows, cfg.cols, S)
        full = smem.allocate_array(cutlass.Int64, S, byte_alignment=8)
        _init_barriers(full, self.loader.barrier_count(cfg.threads), S)
        cute.arch.sync_threads()
        mine = cutlass.Int32(0)
        if bid < num_tiles:
            mine = (num_tiles - bid + grid - 1) // grid
        for s in cutlass.range_constexpr(S):
            if s < mine:
                _issue(self.loader, atom, mT, mX, sX, full + s, bid + s * grid, s, cfg.rows,
                       cfg.cols, cfg.threads)
        for k in cutlass.range(mine, unroll=1):
            s = k % S
            cute.arch.mbarrier_wait(full + s, (k // S) % 2)
            cute.arch.sync_threads()  # nobody still waits on this phase when it is re-armed
            if k + S < mine:
                _issue(self.loader, atom, mT, mX, sX, full + s, bid + (k + S) * grid, s,
                       cfg.rows, cfg.cols, cfg.threads)
        if check != 0:
            cute.arch.sync_threads()
            _dump_words(raw, dump, bid, 0, S * cfg.rows * cfg.cols, cfg.threads)


# --------------------------------------------------------------------------- Figures 6, 7
class ClusterBroadcast:
    """N CTAs of a cluster each get the same tile per iteration, by ``cfg.load``."""

    def __init__(self, config: BroadcastConfig):
        self.cfg = config
        self.loader = loaders.TmaLoader()  # multicasts where _issue passes a mask

    @cute.jit
    def __call__(self, mX: cute.Tensor, dump: cute.Tensor, iters: cutlass.Int32,
                 num_tiles: cutlass.Int32, check: cutlass.Int32, stream: cuda.CUstream):
        cfg = self.cfg
        # the leader multicasts the whole box (one CTA's share = all of it); split: 1/N each
        share = cfg.cluster if cutlass.const_expr(cfg.load == "tma_multicast_split") else 1
        if cutlass.const_expr(cfg.multicast):
            op = tma.cpasync.CopyBulkTensorTileG2SMulticastOp()
        else:
            op = tma.cpasync.CopyBulkTensorTileG2SOp()
        atom, mT = tma.cpasync.make_tiled_tma_atom(
            op, mX, _tile_layout(cfg.rows, cfg.cols), (cfg.rows, cfg.cols), num_multicast=share)
        self.kernel(atom, mT, dump, iters, num_tiles, check).launch(
            grid=(dump.shape[0], 1, 1), block=(cfg.threads, 1, 1), cluster=(cfg.cluster, 1, 1),
            smem=launch_smem(cfg.smem_bytes, cfg.ctas_per_sm), stream=stream)

    @cute.kernel
    def kernel(self, atom: cute.CopyAtom, mT: cute.Tensor, dump: cute.Tensor,
               iters: cutlass.Int32, num_tiles: cutlass.Int32, check: cutlass.Int32):
        cfg = self.cfg
        S, N = cfg.stages, cfg.cluster
        tidx, _, _ = cute.arch.thread_idx()
        bid, _, _ = cute.arch.block_idx()
        rank = cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster())
        cid = bid // N
        smem = cutlass.memory.SmemAllocator()
        sX, raw = _alloc_ring(smem, cfg.rows, cfg.cols, S)
        full = smem.allocate_array(cutlass.Int64, S, byte_alignment=8)
        empty = smem.allocate_array(cutlass.Int64, S, byte_alignment=8)
        _init_barriers(full, 1, S)
        _init_barriers(empty, N, S)
        _cluster_sync()  # every barrier in the cluster is live before anyone signals it

        share = N if cutlass.const_expr(cfg.load == "tma_multicast_split") else 1
        gT = cute.local_tile(mT, (cfg.rows, cfg.cols), (None, 0))
        tAsX, tAgX = tma.partition(atom, sX, gT, rank % share, share, box_rank=2)
        base = cid * iters

        for s in cutlass.range_constexpr(S):
            if s < iters:
                self._produce(atom, tAsX, tAgX, full, empty, s, (base + s) % num_tiles, rank,
                              False, 0)
        for k in cutlass.range(iters, unroll=1):
            s = k % S
            phase = (k // S) % 2
            more = k + S < iters
            if cutlass.const_expr(cfg.load == "dsm"):
                if rank == 0:
                    cute.arch.mbarrier_wait(full + s, phase)
                _cluster_sync()  # the leader's tile is visible to the cluster
                if rank != 0:
                    _dsm_pull(raw, 0, s, cfg.tile_bytes, cfg.threads)
                _cluster_sync()  # every peer has its copy: the leader's stage is free
            else:
                cute.arch.mbarrier_wait(full + s, phase)
                cute.arch.sync_threads()  # nobody still waits on this phase when re-armed
                if cutlass.const_expr(cfg.multicast):
                    if more:
                        self._release(empty + s, tidx)
            if more:
                self._produce(atom, tAsX, tAgX, full, empty, s, (base + k + S) % num_tiles,
                              rank, True, phase)
        if check != 0:
            cute.arch.sync_threads()
            last = (iters - 1) % S
            words = cfg.rows * cfg.cols
            _dump_words(raw + last * cfg.tile_bytes, dump, bid, 0, words, cfg.threads)
        _cluster_sync()  # no CTA leaves while a peer may still signal or read it

    @cute.jit
    def _release(self, empty_s, tidx):
        """Tell the CTA(s) that write this stage that it may be overwritten: the leader
        (leader multicast) or every CTA of the cluster (split multicast)."""
        cfg = self.cfg
        scope = nvvm.MemScopeKind.CLUSTER
        if cutlass.const_expr(cfg.load == "tma_multicast"):
            if tidx == 0:
                cute.arch.mbarrier_arrive(empty_s, 0, scope=scope)
        else:
            if tidx < cfg.cluster:
                cute.arch.mbarrier_arrive(empty_s, tidx, scope=scope)

    @cute.jit
    def _produce(self, atom, tAsX, tAgX, full, empty, stage, tile, rank, reuse: bool, phase):
        """Warp 0: arm this CTA's full barrier with the whole tile, then (if this CTA issues)
        wait until the stage is free everywhere it writes and issue its copy."""
        cfg = self.cfg
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        if warp == 0:
            if cutlass.const_expr(cfg.load in ("tma_multicast", "dsm")):
                if cutlass.const_expr(cfg.load == "tma_multicast"):
                    self.loader.arm(full + stage, cfg.tile_bytes)  # the leader's copy lands here
                if rank == 0:
                    if cutlass.const_expr(cfg.load == "dsm"):
                        self.loader.arm(full + stage, cfg.tile_bytes)
                    self._issue(atom, tAsX, tAgX, full, empty, stage, tile, reuse, phase)
            else:
                self.loader.arm(full + stage, cfg.tile_bytes)
                self._issue(atom, tAsX, tAgX, full, empty, stage, tile, reuse, phase)

    @cute.jit
    def _issue(self, atom, tAsX, tAgX, full, empty, stage, tile, reuse: bool, phase):
        """Issue this CTA's copy into ``stage``; a multicast first waits until every CTA it
        writes into has released the stage (``reuse``: not the first use of the stage)."""
        cfg = self.cfg
        mask = None
        if cutlass.const_expr(cfg.multicast):
            mask = cutlass.Int16((1 << cfg.cluster) - 1)
            if cutlass.const_expr(reuse):
                cute.arch.mbarrier_wait(empty + stage, phase)
        self.loader.load(atom, tAgX[(None, tile)], tAsX[(None, stage)], full + stage, mask)


# --------------------------------------------------------------------------- CTA placement
class PlacementProbe:
    """``out[cta] = (smid, rank in cluster, start ns mod 2^32)``, one CTA per SM, clusters of
    ``cluster`` CTAs along x. ``clusters_along_z``: the grid is ``(cluster, 1, clusters)``,
    as the GEMM's persistent grid is (``out``'s row: cluster index x cluster + rank)."""

    def __init__(self, cluster: int = 1, clusters_along_z: bool = False):
        if not 1 <= cluster <= 16:  # past 8 non-portable (the DSL allows it on every kernel)
            raise ValueError(f"cluster={cluster}: 1 to 16 CTAs")
        self.cluster = cluster
        self.along_z = clusters_along_z

    @cute.jit
    def __call__(self, out: cute.Tensor, cycles: cutlass.Int64, stream: cuda.CUstream):
        grid = (out.shape[0], 1, 1)
        if cutlass.const_expr(self.along_z):
            grid = (self.cluster, 1, out.shape[0] // self.cluster)
        self.kernel(out, cycles).launch(
            grid=grid, block=(32, 1, 1), cluster=(self.cluster, 1, 1),
            smem=launch_smem(0, 1), stream=stream)

    @cute.kernel
    def kernel(self, out: cute.Tensor, cycles: cutlass.Int64):
        tidx, _, _ = cute.arch.thread_idx()
        bx, _, bz = cute.arch.block_idx()
        bid = bz * self.cluster + bx
        g0 = cute.arch.globaltimer_lo()
        c0 = cute.arch.clock64()
        c1 = c0
        while c1 - c0 < cycles:  # stay resident while the rest of the grid is placed
            c1 = cute.arch.clock64()
        if tidx == 0:
            out[bid, 0] = cute.arch.smid()
            out[bid, 1] = cutlass.Int32(cute.arch.block_idx_in_cluster())
            out[bid, 2] = g0


# --------------------------------------------------------------------------- timer calibration
class TimerCalibration:
    """``out = (globaltimer delta ns, clock64 delta)`` over a spin of ``cycles`` SM clocks."""

    @cute.jit
    def __call__(self, out: cute.Tensor, cycles: cutlass.Int64, stream: cuda.CUstream):
        self.kernel(out, cycles).launch(grid=(1, 1, 1), block=(32, 1, 1), stream=stream)

    @cute.kernel
    def kernel(self, out: cute.Tensor, cycles: cutlass.Int64):
        tidx, _, _ = cute.arch.thread_idx()
        g0 = cute.arch.globaltimer()
        c0 = cute.arch.clock64()
        c1 = c0
        while c1 - c0 < cycles:
            c1 = cute.arch.clock64()
        g1 = cute.arch.globaltimer()
        if tidx == 0:
            out[0] = g1 - g0
            out[1] = c1 - c0


__all__ = [
    "LatencyConfig", "StreamConfig", "BroadcastConfig", "SingleShotLatency", "StreamingLoad",
    "ClusterBroadcast", "TimerCalibration", "PlacementProbe", "tile_shape", "launch_smem",
    "SINGLE_SHOT_LOADS", "BROADCAST_LOADS", "CLUSTER_SIZES",
]
