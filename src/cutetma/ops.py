"""The torch face: validate on the host, compile once per configuration, launch on the
current CUDA stream.

    smem_image(x, box, swizzle="128B", load="tma", tile=(0, 0))  -> uint8 shared-memory bytes
    tma_round_trip(x, box, swizzle="128B")                         -> a copy of x, by TMA

Every TMA rule (``cutetma.swizzle.check_box``) and every tensor property the kernels rely
on (device, rank, dtype, a contiguous inner dimension, 16-byte aligned base and row stride)
is checked before anything is compiled or launched; the error names the rule and the numbers.
Compiled kernels are cached in memory per configuration; tensor shapes are dynamic, so a new
shape does not recompile.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import math
import threading
import warnings

import numpy as np
import torch

from cutetma import swizzle as hw

_WIDTH_VIEW = {1: torch.uint8, 2: torch.float16, 4: torch.float32}
_SUPPORTED = {
    torch.uint8, torch.int8, torch.float16, torch.bfloat16, torch.float32, torch.int32,
    getattr(torch, "float8_e4m3fn", torch.uint8), getattr(torch, "float8_e5m2", torch.uint8),
}
_COMPILED: dict = {}


def _check_tensor(x, name: str = "x") -> int:
    """The tensor rules shared by every TMA entry point; returns the element width."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.device.type != "cuda":
        raise ValueError(f"{name} is on {x.device}: TMA kernels need a CUDA tensor")
    if x.dtype not in _SUPPORTED:
        raise TypeError(f"{name} has dtype {x.dtype}: supported are 1-, 2- and 4-byte types "
                        f"({', '.join(sorted(str(d) for d in _SUPPORTED))})")
    if x.dim() != 2:
        raise ValueError(f"{name} must be 2D (rows, cols), got shape {tuple(x.shape)}")
    w = x.element_size()
    if x.stride(1) != 1:
        raise ValueError(f"{name} must be contiguous in its last dimension (stride {x.stride(1)})"
                         f"; call .contiguous()")
    hw.check_box((1, 16 // w), w, "none", global_strides_bytes=(x.stride(0) * w,),
                 global_base=x.data_ptr())
    return w


def _probe_config(x, box, swizzle, load, grouped, cluster):
    from cutetma.kernels.tile_copy import ProbeConfig

    rows, cols = (int(b) for b in box)
    if cluster is None:
        cluster = 2 if load in ("tma_multicast", "dsm") else 1
    return ProbeConfig(x.element_size(), swizzle, rows, cols, grouped, load, cluster)


def _compiled(key, make_kernel, *args):
    from cutetma import dsl

    _, cute = dsl.cutlass()
    if key not in _COMPILED:
        _COMPILED[key] = cute.compile(make_kernel(), *args)
    return _COMPILED[key]


def _cute_tensor(x: torch.Tensor):
    from cutlass.cute.runtime import from_dlpack

    view = x.view(_WIDTH_VIEW[x.element_size()])
    return from_dlpack(view, assumed_align=16).mark_layout_dynamic(leading_dim=1)


def _stream(device=None):
    """The current CUDA stream of ``device`` (default: the current device) as the DSL takes
    it. Naming the device skips torch's lookup of the current one (a few microseconds of
    an eager call's host cost, gemm_host_cost.json)."""
    from cuda.bindings import driver as cuda

    return cuda.CUstream(torch.cuda.current_stream(device).cuda_stream)


def smem_image(x: torch.Tensor, box, *, swizzle: str = "128B", load: str = "tma",
               tile=(0, 0), grouped: bool = False, cluster: int | None = None) -> torch.Tensor:
    """The raw shared-memory bytes after loading box ``tile`` of ``x`` (uint8, one row per CTA
    of the cluster for ``tma_multicast`` / ``dsm``, else a 1D tensor).

    ``box`` is (rows, cols) in elements; with ``grouped`` cols spans several swizzle-span
    groups loaded as one 3D box. ``tile`` counts boxes. TMA zero-fills what lies outside
    ``x``; cp.async and DSM take boxes inside ``x`` only.
    """
    w = _check_tensor(x)
    cfg = _probe_config(x, box, swizzle, load, grouped, cluster)
    tr, tc = (int(t) for t in tile)
    r0, c0 = tr * cfg.rows, tc * cfg.cols
    if tr < 0 or tc < 0 or r0 >= x.shape[0] or c0 >= x.shape[1]:
        raise ValueError(f"tile {tuple(tile)} of box {cfg.rows}x{cfg.cols} starts at "
                         f"({r0}, {c0}), outside the {tuple(x.shape)} tensor")
    inside = r0 + cfg.rows <= x.shape[0] and c0 + cfg.cols <= x.shape[1]
    if cfg.load == "cp_async" and not inside:
        raise ValueError(f"cp.async has no zero fill here: box rows {r0}..{r0 + cfg.rows} x "
                         f"cols {c0}..{c0 + cfg.cols} must lie inside {tuple(x.shape)}")
    if cfg.load == "cp_async":
        hw.check_box((1, 16 // w), w, "none", global_base=x[r0:, c0:].data_ptr())

    from cutetma.kernels.tile_copy import SmemProbe

    out = torch.full((cfg.cluster, cfg.smem_bytes), 0x5A, dtype=torch.uint8, device=x.device)
    args = (_cute_tensor(x), _cute_tensor(out), tr, tc, _stream())
    _compiled(("probe", cfg), lambda: SmemProbe(cfg), *args)(*args)
    return out if cfg.cluster > 1 else out[0]


def tma_round_trip(x: torch.Tensor, box=(64, 64), *, swizzle: str = "128B") -> torch.Tensor:
    """Copy ``x`` through shared memory, one box per CTA: TMA load, then TMA store."""
    w = _check_tensor(x)
    rows, cols = (int(b) for b in box)
    hw.check_box((rows, cols), w, swizzle)
    from cutetma.kernels.tile_copy import TmaRoundTrip

    dst = torch.empty_like(x)
    dst.view(torch.uint8).fill_(0xA5)  # poison: an unwritten element cannot pass
    args = (_cute_tensor(x), _cute_tensor(dst), _stream())
    key = ("round_trip", w, hw.mode(swizzle).name, rows, cols)
    _compiled(key, lambda: TmaRoundTrip(w, swizzle, rows, cols), *args)(*args)
    return dst


def model_image(box_data: np.ndarray, swizzle: str, grouped: bool = False) -> np.ndarray:
    """What the model says the shared-memory bytes of ``box_data`` are (uint8)."""
    box_data = np.ascontiguousarray(box_data)
    if not grouped:
        return hw.smem_image(box_data, swizzle)
    w = box_data.dtype.itemsize
    rows, cols = box_data.shape
    offsets = hw.grouped_box_offsets(rows, cols, w, swizzle)
    out = np.zeros(box_data.size * w, dtype=np.uint8)
    src = box_data.reshape(-1).view(np.uint8).reshape(-1, w)
    out[offsets.reshape(-1, 1) + np.arange(w)] = src
    return out


# =========================================================================== GEMM
GEMM_DTYPES = (torch.float16, torch.bfloat16)
GEMM_OUT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_ALIGN_ELEMS = 8  # 16 bytes of fp16 / bf16


def _aligned_operand(x: torch.Tensor, name: str, allow_copy: bool) -> torch.Tensor:
    """``x`` (rows, k) as TMA needs it: one unit-stride dimension, the other stride and the
    base 16-byte aligned. A contiguous-but-misaligned operand (k % 8 != 0, an offset view) is
    copied into a zero-padded aligned buffer when ``allow_copy``, else refused."""
    if x.stride(1) == 1 and x.shape[1] > 0:
        lead = 0
    elif x.stride(0) == 1 and x.shape[0] > 0:
        lead = 1
    else:
        raise ValueError(f"{name}: one dimension must have stride 1 (strides {tuple(x.stride())}"
                         f"); call .contiguous()")
    outer_stride = x.stride(lead) * x.element_size()
    ok = outer_stride % 16 == 0 and x.data_ptr() % 16 == 0
    if ok:
        return x
    if not allow_copy:
        hw.check_box((1, 8), 2, "none", global_strides_bytes=(outer_stride,),
                     global_base=x.data_ptr())
    rows, k = x.shape
    k_pad = -(-k // _ALIGN_ELEMS) * _ALIGN_ELEMS
    padded = torch.zeros(rows, k_pad, dtype=x.dtype, device=x.device)
    padded[:, :k] = x
    return padded


def split_k_for(m: int, n: int, k: int, tile=(128, 128), sm_count: int = 132,
                everywhere: bool = False) -> int:
    """K slices for a shape whose output tiles fill under half the SMs (1: no split):
    enough slices for about one wave, each at least 8 k-tiles of 64, at most 8. The
    automatic choice for M <= 64 (64 x 128 tiles); larger M go by ``grid_time``.

    On the H200 (session 2's grid, when a second kernel summed the slices) that won in 35
    of the 58 paper cells where those conditions hold, and every win had at most 24 output
    tiles or K >= 12288 (192 k-tiles); below both it lost (e.g. M = 64, N = 6144,
    K = 4096), so only those shapes split unless ``everywhere`` (the benchmark's candidate
    list, which keeps measuring the rest). With the reduction in the kernel (session 6's
    ``gemm.json``) the M = 16 / 64 winners match this rule in 59 of 72 cells."""
    tiles = -(-m // tile[0]) * -(-n // tile[1])
    k_tiles = -(-k // 64)
    if tiles * 2 > sm_count or k_tiles < 16:
        return 1
    if not everywhere and tiles > 24 and k_tiles < 192:
        return 1
    return wave_split(m, n, k, tile, sm_count, most=8, min_k_tiles=8)


def wave_count(m: int, n: int, tile=(128, 256), sm_count: int = 132, slices: int = 1) -> int:
    """The waves of the SMs that the output's tiles (each cut into ``slices`` units) make."""
    return -(-(-(-m // tile[0]) * -(-n // tile[1]) * slices) // sm_count)


def wave_efficiency(m: int, n: int, tile=(128, 256), sm_count: int = 132) -> float:
    """The share of the SMs' time the output tiles fill when each SM takes whole tiles in
    waves: ``tiles / (waves * sm_count)``. What cutting K (split-K, stream-K) can recover
    where it is low (512 x 5120 in 128 x 256 tiles: 80 tiles on 132 SMs, 0.61)."""
    tiles = -(-m // tile[0]) * -(-n // tile[1])
    return tiles / (-(-tiles // sm_count) * sm_count)


# A k-tile's time relative to one of a 128 x 256 tile: narrower tiles do less work a k-tile a
# little less efficiently. On the H200 (2026-11-30) 128 x 128 was fitted to the winners of the
# grid, 160 and 192 to the k-tile times of gemm_narrow_every.json (0.38-0.44 / 0.49-0.53 /
# 0.57-0.62 / 0.69-0.81 us at 128 / 160 / 192 / 256 wide); with them the model picks the
# measured fastest (tile, slices) in 121 of 133 cooperative cells with M >= 256 (gemm.json).
# 64 x 128 (2026-12-01, gemm_small_outputs.json): fitted with the atomic hand-over below to
# 63 timings of small outputs (N = 512 / 1536, K = 5120): a k-tile of half a 128 x 128 tile
# takes 0.35 / 0.56 of its time, since each SM's loads, not its WGMMAs, bound such a tile
K_TILE_TIME = {(128, 256): 1.0, (128, 192): 0.8, (128, 160): 0.69, (128, 128): 0.56,
               (64, 128): 0.35}
# Narrower 64-row tiles (FIT_64_WIDTHS): 64 x 96 ran 512 x 1536 x 5120 in 128 tiles 1.09x as
# fast as 64 x 128 in 96 (one wave each; gemm_n1536_m512_ab_*.json, H200, 2026-12-02), so a
# k-tile of it takes 0.32 (its loads, 20 KB against 24, bound it); a line through the two
K_TILE_64 = (0.23, 0.12)  # a k-tile of a 64 x w tile: 0.23 + 0.12 * w / 128
# the tiles ``cutetma.gemm`` chooses from for M > 64: the widths between 128 and 256 fit a
# shape's tiles to the SMs (512 x 5120: 80 tiles of 128 x 256 on 132 SMs, 128 of 128 x 160);
# 64 x 128 gives outputs of a few 128 x 128 tiles enough units for the SMs (2048 x 512: 128
# tiles; 256 x 512: 16 tiles x 8 slices)
AUTO_TILES = ((128, 256), (128, 192), (128, 160), (128, 128), (64, 128))


def k_tile_time(tile) -> float:
    """``K_TILE_TIME`` where measured, else a line through 128 x 128 and 128 x 256 (64-row
    tiles up to 128 wide: ``K_TILE_64``): a fixed cost per k-tile (barriers, issue) plus
    WGMMA time or loads in proportion to the tile's width."""
    tile = tuple(tile)
    if tile in K_TILE_TIME:
        return K_TILE_TIME[tile]
    if tile[0] == 64 and tile[1] <= 128:
        return K_TILE_64[0] + K_TILE_64[1] * tile[1] / 128
    if tile[0] != 128:
        return 1.0
    return 0.1 + 0.9 * tile[1] / 256


def hand_over(slices: int, split_sum: str = "ordered") -> float:
    """A split unit's hand-over in its own k-tile times (``grid_time``). Ordered: store the
    fp32 partial, fence, ticket, and the last slice reads every other slice's slot, about
    6 + 5 (slices - 1) (``gemm_split_every.json``, 2026-11-30: 8 us per unit at 2 slices,
    11-13 us at 3). Atomic: every slice adds into one slot in L2 and the last reads it once,
    about 14 whatever the count (fitted with the 64 x 128 k-tile time to
    ``gemm_small_outputs.json`` and ``gemm_split_atomic.json``, 2026-12-01), so it pays
    from 3 slices on."""
    if slices == 1:
        return 0.0
    return 14.0 if split_sum == "atomic" else 6.0 + 5.0 * (slices - 1)


def split_sum_for(slices: int, tile=(64, 128)) -> str:
    """How ``slices`` slices of a ``tile`` meet by default: ``"atomic"`` for 64-row tiles
    from 3 slices on, where ``hand_over`` says it is faster and the H200 agreed (M <= 64:
    1.06x the ordered sum over 10 cells, gemm_small_m_atomic.json; 256 x 512 x 5120: 0.97x
    cuBLAS against 0.71x, 2026-12-01); ``"ordered"`` for 128-row tiles, where the atomic sum
    measured 0.91-1.03x the ordered one (gemm_changed_defaults.json), and always under
    ``torch.use_deterministic_algorithms(True)`` (the atomic sum's last bits depend on the
    order the slices arrive in; the ordered sum gives the same bits every launch)."""
    if slices > 1 and tile[0] == 64 and not torch.are_deterministic_algorithms_enabled():
        if hand_over(slices, "atomic") < hand_over(slices, "ordered"):
            return "atomic"
    return "ordered"


def grid_time(m: int, n: int, k: int, tile=(128, 256), slices: int = 1,
              sm_count: int = 132, split_sum: str | None = None) -> float:
    """A time model of the persistent grid, in k-tile times of a 128 x 256 tile: waves of
    work units times (k-tiles per unit + the unit's ``hand_over`` when K is split;
    ``split_sum`` None: the faster sum, ``split_sum_for``)."""
    k_tiles = -(-k // 64)
    cost = hand_over(slices, split_sum or split_sum_for(slices, tile))
    return (wave_count(m, n, tile, sm_count, slices) * (-(-k_tiles // slices) + cost)
            * k_tile_time(tile))


def split_for_waves(m: int, n: int, k: int, tile=(128, 256), sm_count: int = 132,
                    most: int = 8) -> int:
    """The K slices (1..``most``, each >= 4 k-tiles) that minimize ``grid_time``: a split
    must win back more than its hand-over, so it pays where a wave's tail is long."""
    k_tiles = -(-k // 64)
    options = [s for s in range(1, most + 1) if s == 1 or k_tiles >= 4 * s]
    return min(options, key=lambda s: grid_time(m, n, k, tile, s, sm_count))


def wave_split(m: int, n: int, k: int, tile=(128, 128), sm_count: int = 132,
               most: int = 16, min_k_tiles: int = 4) -> int:
    """The most K slices (1..``most``, each >= ``min_k_tiles`` k-tiles) whose work units
    still fit one wave: ``tiles * slices <= sm_count`` (``split_k_for``'s count, and an
    ablation's candidate: ``gemm_ab.py``'s ``split_k=wave``)."""
    tiles = -(-m // tile[0]) * -(-n // tile[1])
    k_tiles = -(-k // 64)
    return max(1, min(most, sm_count // tiles, k_tiles // min_k_tiles))


def fit_width(m: int, n: int, waves: int = 1, tile_m: int = 128, sm_count: int = 132,
              widths=range(64, 257, 16), slices: int = 1) -> int | None:
    """The narrowest tile width (a multiple of 16, 64 to 256) whose ``tile_m``-row tiles,
    each cut into ``slices`` K slices, make at most ``waves`` waves of the SMs, or None when
    even the widest makes more. For a given count of waves the narrowest is the fastest:
    every SM runs as many units as before, each with less to do. cuBLAS picks its tiles so
    on the H200 (``cublas_kernels.json``: 256 x 5120 in 80-wide tiles, 256 x 6144 in
    96-wide: 128 tiles each, one wave; 512 x 1536 in 64 x 96)."""
    tiles_m = -(-m // tile_m)
    for width in widths:
        if tiles_m * -(-n // width) * slices <= waves * sm_count:
            return width
    return None


def pingpong_pays(m: int, n: int, k: int, sm_count: int = 132) -> bool:
    """Whether ``cutetma.gemm`` runs pingpong 128 x 128 instead of cooperative tiles: each
    warpgroup's epilogue then hides under the other's WGMMAs, which pays where the epilogue
    is a large share of a tile's time, i.e. where K is a few k-tiles. On the H200
    (gemm.json, 2026-11-30) pingpong won 11 of the 12 cells with K = 512 and M >= 512, by
    1-9% over the cooperative choice (median 5%), and lost at K = 1536 past M = 512.
    At M = 256 it lost in that first grid, but the cooperative tiles it lost to have since
    taken the held-tile epilogue (``store_under_mma``) and, at 256 x 24576 x 1536, a (2, 1)
    multicast: in the four independent grids since (sessions 12, 13, 15 and 19) pingpong was
    ahead of the default at 256 x 16384 x 512 and 256 x 32768 x 512 in 16 of 16 cell timings
    (1-3%, median 2.2%), and at 256 x 24576 x 1536 it was the grid's best TMA configuration in
    7 of 8 (ahead of the (2, 1) multicast by 0.8-3.8% in 5, of 128 x 192 by 6-8% in 2; the
    eighth's best, 128 x 192, 4.4%). So below M = 512 it runs up to 24 k-tiles, where its
    128 x 128 tiles fill at least one wave (each warpgroup then has a tile to hide an
    epilogue under)."""
    k_tiles = -(-k // 64)
    if m >= 512:
        return k_tiles <= 8
    tiles = -(-m // 128) * -(-n // 128)
    return m >= 256 and k_tiles <= 24 and tiles >= sm_count


# Up to this M, whole 128 x 256 tiles give way to the narrowest width (144 to 256, steps of
# 16) that makes as many waves: on the H200 (2026-12-01, gemm_fitted_m256_512.json and the
# fp16 grid run after it) 128 x 224 beat 128 x 256 by 3.5-10% at 256 x 14336 x 4096 (one
# wave), 256 x 28672 x 8192 and 512 x 14336 x 4096 (two), and 128 x 240 by 2% at 512 x 7680;
# at M = 2048 (three or four waves) such widths measured 0.97-0.99x 128 x 256, so larger M
# keep it
FIT_256_MAX_M = 512
# The same for 64 x 128 tiles, split or not: the narrowest width from 80 that makes as many
# waves of units. On the H200 (2026-12-02, 3 interleaved rounds, both dtypes) 64 x 96 in 128
# units against 64 x 128 in 96: 512 x 1536 x 5120 1.09x (0.88 -> 0.965x cuBLAS), and at
# 256 x 1536 x 5120 (two K slices) 1.02x alone, 1.09x with B multicast (``small_tile_cluster``)
FIT_64_WIDTHS = range(80, 129, 16)


def auto_tile_and_split(m: int, n: int, k: int, sm_count: int = 132):
    """``cutetma.gemm``'s choice for M > 64: the (tile, slices) of least ``grid_time``; for
    M <= ``FIT_256_MAX_M`` an unsplit 128 x 256 becomes the narrowest width with as many
    waves (``fit_width``), and a 64 x 128 tile the narrowest of ``FIT_64_WIDTHS`` with as
    many waves of units."""
    options = [(tile, split_for_waves(m, n, k, tile, sm_count)) for tile in AUTO_TILES]
    tile, split = min(options, key=lambda o: grid_time(m, n, k, o[0], o[1], sm_count))
    if tile == (128, 256) and split == 1 and m <= FIT_256_MAX_M:
        tile = (128, fit_width(m, n, wave_count(m, n, tile, sm_count), 128, sm_count,
                               range(144, 257, 16)))
    elif tile == (64, 128):
        waves = wave_count(m, n, tile, sm_count, split)
        tile = (64, fit_width(m, n, waves, 64, sm_count, FIT_64_WIDTHS, split))
    return tile, split


def small_tile_cluster(m: int, tile, split: int) -> bool:
    """Whether ``cutetma.gemm`` multicasts B over (2, 1) clusters of a fitted 64-row tile
    (narrower than 128, ``auto_tile_and_split``): where the order table does not run (K
    split, or M < ``TABLE_MIN_M``), whose placement lets the L2 merge the same reads instead,
    and the tile rows pair up. On the H200 (2026-12-02) 64 x 96 in two K slices at 256 x 1536
    x 5120: 1.09x 64 x 128 with the multicast, 1.02x without; unsplit at 512 x 1536 x 5120,
    where the table runs, 0.98x the same tile alone."""
    return (tile[0] == 64 and tile[1] < 128 and -(-m // 64) % 2 == 0
            and (split > 1 or m < TABLE_MIN_M))


# A k-tile of a 128 x 128 tile whose B tile is multicast to both CTAs of a (2, 1) cluster, in
# ``grid_time``'s units: each SM loads 24 KB a k-tile instead of 32. Fitted on the H200
# (gemm_m256_clusters.json, 2026-12-01, 14 cells at M = 256 / 512): with it the model picks
# the faster of the multicast and the automatic choice in 14 of 14 (the multicast won 5, by
# 1-8%, where its tiles make about one wave, and lost by 3-33% where they make 1.2-1.5)
MULTICAST_128_K_TILE_TIME = 0.52
MULTICAST_MAX_M = 512  # measured up to here; larger M keep their wider tiles
# Narrower than 128 (64 to 112 wide, cuBLAS's tiles at M = 256: cublas_kernels.json), a
# multicast tile's k-tile time is taken as ``k_tile_time``'s line scaled as at 128
# (0.52 / 0.56): the slopes measured on the H200 (gemm_fitted_m256_512.json, 2026-12-01:
# 0.23 / 0.24 us a k-tile at 64 / 80 wide, against 0.78 at 128 x 256) sit on it. Such a tile
# is chosen only where it fills a wave (the SMs at least NARROW_MIN_FILL full) and the model
# puts it NARROW_MARGIN ahead: its fixed costs (about 10 us a launch there, prologue and
# epilogue) weigh more against a split's than the model says. With both, the model picks the
# measured faster in 6 of 6 cells (won by 1-11% at 256 x 4096 / 5120 / 6144, lost by 7.5% at
# 256 x 4096 x 14336, where the model has it 2% ahead of 128 x 128 in two slices)
NARROW_MULTICAST_WIDTHS = range(64, 128, 16)
NARROW_MIN_FILL = 0.9
NARROW_MARGIN = 0.95


def multicast_k_tile_time(width: int) -> float:
    """A k-tile of a (128, ``width``) tile multicast in (2, 1) clusters, in ``grid_time``'s
    units (``MULTICAST_128_K_TILE_TIME`` and the notes above it)."""
    return MULTICAST_128_K_TILE_TIME * (k_tile_time((128, width)) / K_TILE_TIME[(128, 128)])


def multicast_tile(m: int, n: int, k: int, sm_count: int = 132, choice=None):
    """The (128, width) tile ``cutetma.gemm`` (``load="tma"``, no cluster, tile or split
    given) runs in (2, 1) clusters that multicast B, or None for ``auto_tile_and_split``'s
    choice. For 128 < M <= 512 with an even number of 128-row tiles (an odd one would leave
    a CTA of each last cluster idle): 128 x 128 where ``grid_time`` with
    ``MULTICAST_128_K_TILE_TIME`` says it is faster, or the narrowest width below 128 whose
    tiles fill one wave where ``multicast_k_tile_time`` puts it ``NARROW_MARGIN`` ahead of
    both. ``choice``: the automatic (tile, slices) when the caller has it already."""
    tiles_m = -(-m // 128)
    if not 128 < m <= MULTICAST_MAX_M or tiles_m % 2:
        return None
    k_tiles = -(-k // 64)
    tile, split = choice or auto_tile_and_split(m, n, k, sm_count)
    best, best_time = None, grid_time(m, n, k, tile, split, sm_count)

    def shared_time(width):  # waves x k-tiles x the multicast k-tile time
        return wave_count(m, n, (128, width), sm_count) * k_tiles * multicast_k_tile_time(width)

    if shared_time(128) < best_time:
        best, best_time = (128, 128), shared_time(128)
    width = fit_width(m, n, 1, 128, sm_count, NARROW_MULTICAST_WIDTHS)
    if width and tiles_m * -(-n // width) >= NARROW_MIN_FILL * sm_count:
        if shared_time(width) < NARROW_MARGIN * best_time:
            best = (128, width)
    return best


# Past MULTICAST_MAX_M, cuBLAS runs 128 x 320 tiles in (2, 1) clusters where its 128 x 256
# tiles would fill the last wave badly (cublas_kernels_m2048.json: 2048 x 5120 / 7680). A
# k-tile of ours there, in grid_time's units (H200, 2026-12-02, kernel times of 2048 x 5120 x
# 4096: 114.6 us against 127.4 for 128 x 160, cuBLAS 112.5; gemm_kernel_times_hints_large
# .json): WIDE_K_TILE_TIME, the width's share of 128 x 256's work. Chosen where the model puts
# it WIDE_MARGIN ahead: graph-timed with cuBLAS (gemm_mirror_m2048.json, 2 rounds) it gained
# 2-8% at 2048 x 5120 x 5120 / 16384 and 2048 x 7680 x 5120 (model 0.88-0.92) and lost 1-3%
# at 2048 x 5120 x 12288 (0.88) and 2048 x 28672 x 8192 (0.96)
WIDE_TILE = (128, 320)
WIDE_K_TILE_TIME = 1.22
WIDE_MARGIN = 0.93


def wide_multicast_pays(m: int, n: int, k: int, sm_count: int = 132, choice=None) -> bool:
    """Whether ``cutetma.gemm`` (``load="tma"``, nothing else given, M > MULTICAST_MAX_M
    with an even count of 128-row tiles, B K-major) runs ``WIDE_TILE`` in (2, 1) clusters:
    where ``grid_time`` with ``WIDE_K_TILE_TIME`` puts it ``WIDE_MARGIN`` ahead of
    ``auto_tile_and_split``'s choice (``choice`` when the caller has it)."""
    if m <= MULTICAST_MAX_M or -(-m // 128) % 2:
        return False
    tile, split = choice or auto_tile_and_split(m, n, k, sm_count)
    wide = wave_count(m, n, WIDE_TILE, sm_count) * -(-k // 64) * WIDE_K_TILE_TIME
    return wide < WIDE_MARGIN * grid_time(m, n, k, tile, split, sm_count)


def multicast_pays(m: int, n: int, k: int, sm_count: int = 132, choice=None) -> bool:
    """Whether ``cutetma.gemm`` multicasts B by itself (``multicast_tile``)."""
    return multicast_tile(m, n, k, sm_count, choice) is not None


def _gemm_config(m: int, n: int, load: str, cluster, tile, sm_count: int,
                 schedule: str | None = None, split_k: int | None = 1, k: int = 0,
                 stream_k: bool = False, store_under_mma: bool | None = None,
                 split_sum: str | None = None, b_k_major: bool = True):
    from cutetma.kernels.gemm_sm90 import GemmConfig

    mechanism = "cp_async" if load == "cp_async" else "tma"
    if load not in ("tma", "tma_multicast", "cp_async"):
        raise ValueError(f"load={load!r}: choose 'tma', 'tma_multicast' or 'cp_async'")
    auto_cluster = cluster is None and load == "tma"  # (2, 1) where ``multicast_pays``
    if cluster is None:  # measured on the H200 (gemm_tune.json): (2, 1) multicasts B
        cluster = (2, 1) if load == "tma_multicast" else (1, 1)
    if load == "tma_multicast" and cluster[0] * cluster[1] == 1:
        raise ValueError("load='tma_multicast' needs a cluster larger than (1, 1)")
    if stream_k and split_k is None:
        split_k = 1
    if split_k is None:  # automatic: tile and K slices from the H200 measurements
        split_k = 1
        if (tile is None and schedule != "pingpong" and tuple(cluster) == (1, 1)
                and not store_under_mma):
            if m > 64:
                tile, split_k = auto_tile_and_split(m, n, k, sm_count)
                if (schedule is None and split_k == 1 and load == "tma"
                        and pingpong_pays(m, n, k, sm_count)):
                    tile, schedule = (128, 128), "pingpong"
                elif auto_cluster and (
                        shared := multicast_tile(m, n, k, sm_count, (tile, split_k))):
                    tile, cluster, split_k = shared, (2, 1), 1
                elif auto_cluster and small_tile_cluster(m, tile, split_k):
                    cluster = (2, 1)
                elif auto_cluster and b_k_major and wide_multicast_pays(
                        m, n, k, sm_count, (tile, split_k)):
                    # an N-major B cannot feed 160-column WGMMAs (check_tile_for_b)
                    tile, cluster, split_k = WIDE_TILE, (2, 1), 1
            else:
                split_k = split_k_for(m, n, k, (64, 128), sm_count)
                tile = (64, 128) if split_k > 1 else None
    schedule = schedule or "cooperative"
    if tile is None and schedule == "pingpong":
        tile = (64, 256) if m > 64 else (64, 128)
    if tile is None:
        tile_m = 64 if m <= 64 else 128
        tiles_256 = -(-m // tile_m) * -(-n // 256)
        tile = (tile_m, 256 if tiles_256 >= sm_count and tile_m == 128 else 128)
    whole_cooperative = schedule == "cooperative" and split_k == 1 and not stream_k
    if store_under_mma is None:  # on wherever it applies: faster at the H200's power cap
        # in 4 of 4 shapes (gemm_sustained_store.json, 2026-12-01), even in short runs; not
        # past 256 columns, where the held tile does not fit in the registers (GemmConfig)
        store_under_mma = whole_cooperative and tile[1] <= 256
    if store_under_mma and not whole_cooperative:
        raise ValueError("store_under_mma=True needs whole cooperative tiles (no pingpong, "
                         "split_k or stream_k)")
    split_sum = (split_sum or split_sum_for(split_k, tile)) if split_k > 1 else "ordered"
    if split_sum == "atomic" and torch.are_deterministic_algorithms_enabled():
        # torch's convention for an op without a deterministic implementation
        message = ("cutetma.gemm(split_sum='atomic') adds split-K's slices in the order they "
                   "arrive, which is not deterministic, but torch.use_deterministic_algorithms"
                   "(True) is set: use split_sum='ordered' (the same bits every launch)")
        if not torch.is_deterministic_algorithms_warn_only_enabled():
            raise RuntimeError(message)
        warnings.warn(message, stacklevel=3)
    return GemmConfig(tile_m=tile[0], tile_n=tile[1], cluster_m=cluster[0],
                      cluster_n=cluster[1], load=mechanism, schedule=schedule,
                      raster_swizzle=raster_band(n, tile[1], cluster[1]), split_k=split_k,
                      stream_k=stream_k, store_under_mma=bool(store_under_mma),
                      split_sum=split_sum)


def _config_for(m, n, k, load, cluster, tile, sm_count, schedule, split_k, stream_k,
                store_under_mma, split_sum, b_k_major=True):
    """``gemm``'s configuration: ``_shape_config``, or where an option cannot key a cache
    (a list inside ``tile``, say) ``_gemm_config`` itself, whose checks name the problem."""
    mode = (torch.are_deterministic_algorithms_enabled(),
            torch.is_deterministic_algorithms_warn_only_enabled())
    try:
        key = (m, n, k, load, None if cluster is None else tuple(cluster),
               None if tile is None else tuple(tile), sm_count, schedule, split_k, stream_k,
               store_under_mma, split_sum, b_k_major, mode)
        hash(key)
    except TypeError:
        return _gemm_config(m, n, load, cluster, tile, sm_count, schedule, split_k, k, stream_k,
                            store_under_mma, split_sum, b_k_major)
    return _shape_config(*key)


@functools.lru_cache(maxsize=4096)
def _shape_config(m, n, k, load, cluster, tile, sm_count, schedule, split_k, stream_k,
                  store_under_mma, split_sum, b_k_major, deterministic):
    """``_gemm_config`` remembered per shape and options: the models behind the automatic
    choice cost 40-70 us of Python a call (256 x 6144 x 4096, 4096^3), more than some of
    the kernels they choose for, and a model's layers call one GEMM shape over and over.
    ``deterministic`` (torch's mode and its warn-only flag, which pick and police the split
    sum) is part of the key; what ``_gemm_config`` refuses raises every time (exceptions
    are not cached), a warning of torch's warn-only deterministic mode comes once a shape."""
    del deterministic  # only a key: _gemm_config reads torch's mode itself
    return _gemm_config(m, n, load, cluster, tile, sm_count, schedule, split_k, k, stream_k,
                        store_under_mma, split_sum, b_k_major)


def raster_band(n: int, tile_n: int, cluster_n: int) -> int:
    """Clusters per rasterization band: the largest of 8, 4, 2, 1 that divides the clusters
    along N. The scheduler rounds that count up to a whole band, and every phantom tile it
    adds is a CTA's worth of wasted work (N = 512 in 128-wide tiles padded to 8 tiles ran at
    a third of cuBLAS's speed on the H200, benchmarks/results/gemm.json, 2026-11-30).

    Within one wave, where the band only decides which SM runs which tile, a band of 1
    (consecutive clusters share B) measured 15% faster at 2048 x 512 x 5120 (the default
    64 x 128: 23.8 -> 20.3 us, cuBLAS 19.0; in (2, 1) clusters 0.233 -> 0.220 us a k-tile)
    but 15% slower at 512 x 1536 x 5120 and 7% at 256 x 12288 x 5120
    (gemm_raster_k5120.json, gemm_kernel_times_raster.json, 2026-12-02): no rule found
    yet, the band stays."""
    clusters_n = math.ceil(math.ceil(n / tile_n) / cluster_n)
    return next(s for s in (8, 4, 2, 1) if clusters_n % s == 0)


@functools.cache
def _sm_count(device_index) -> int:
    return torch.cuda.get_device_properties(device_index or 0).multi_processor_count


def _max_active_clusters(cluster_size: int, device_index: int | None = None) -> int:
    """Clusters of this many CTAs (one per SM) the card runs at once: a persistent grid's
    size. Not simply SMs / size: a cluster's CTAs must share a GPC."""
    device = torch.cuda.current_device() if device_index is None else device_index
    key = ("max_active_clusters", cluster_size, device)
    if key not in _COMPILED:
        from cutetma import dsl

        dsl.cutlass()
        import cutlass.utils as utils

        _COMPILED[key] = utils.HardwareInfo(device).get_max_active_clusters(cluster_size)
    return _COMPILED[key]


def gemm(a: torch.Tensor, b: torch.Tensor, *, out: torch.Tensor | None = None,
         out_dtype: torch.dtype | None = None, trans_b: bool = True, load: str = "tma",
         cluster: tuple[int, int] | None = None, tile: tuple[int, int] | None = None,
         schedule: str | None = None, split_k: int | None = None, stream_k: bool = False,
         store_under_mma: bool | None = None, split_sum: str | None = None,
         allow_copy: bool = True, config=None, pdl: bool = False) -> torch.Tensor:
    """``C = A @ B^T`` on Hopper (``trans_b=False``: ``C = A @ B``, torch.matmul's layout).

    ``a`` (M, K); ``b`` (N, K), or (K, N) with ``trans_b=False``; fp16 or bf16, fp32
    accumulation, output ``out_dtype`` (default: the input dtype) or into ``out`` (M, N).
    ``load``: ``"tma"``, ``"tma_multicast"`` (cluster (2, 1) unless ``cluster`` says) or
    ``"cp_async"``, the same kernel with its producer swapped. With ``"tma"`` and no
    ``cluster``, ``tile`` or ``split_k``, M from 129 to 512 may run 128 x 128 tiles, or
    the narrowest (64 to 112 wide) that fill one wave, in (2, 1) clusters that multicast B,
    where a model measured on the H200 says that is faster (``multicast_tile``), and
    larger M (an even count of 128-row tiles, B K-major) 128 x 320 tiles in (2, 1) clusters
    where 128 x 256 tiles would fill the last wave badly (``wide_multicast_pays``: 2048 x
    5120, 2048 x 7680, as cuBLAS there); ``cluster=(1, 1)`` keeps one CTA per cluster. At
    M <= 512 an unsplit 128 x 256 tile narrows to the width with as many waves, and a
    64 x 128 tile (small outputs) to the width (80 to 112) with as many waves of units
    (``auto_tile_and_split``), multicast in (2, 1) clusters where K is split or M < 256
    (``small_tile_cluster``). ``tile`` (tile_m, tile_n): tile_m 64 or 128, tile_n a
    multiple of 16 from 64 to 384 (wider than 256: K whole and the serial epilogue).
    ``cluster`` (cluster_m, cluster_n): each 1, 2 or 4, at most 8 CTAs; A is multicast to
    the cluster_n CTAs of a row, B to the cluster_m of a column (``load="tma_multicast"``).
    Runs on the current CUDA stream. Operands whose strides or base break TMA's 16-byte
    rule are copied into an aligned buffer (``allow_copy=False`` refuses them instead).
    ``schedule``: ``"cooperative"`` (both consumer warpgroups on each 128-row tile) or
    ``"pingpong"`` (each warpgroup its own tiles, epilogues hidden under the other's
    WGMMAs); ``None`` (the default): cooperative, or pingpong 128 x 128 where K is short
    and no tile or cluster is given, with TMA (``pingpong_pays``). ``split_k`` > 1 cuts K
    into that many slices, each its own work unit; the last slice of a tile to finish sums
    the slices' fp32 partials in the kernel (in slot order: the same bits every launch).
    ``None`` (the default) lets a model measured on the H200 choose the tile and the slices
    for M > 64 (``auto_tile_and_split``: it cuts K only where a wave's tail is long) and
    ``split_k_for`` for M <= 64; never with an explicit ``tile``, a cluster or pingpong.
    1 never splits. ``stream_k``: the last waves' k-tiles are shared evenly between all SMs
    and the CTAs that share a tile add their fp32 partials through a workspace
    (cooperative, cluster (1, 1); see ``GemmConfig.stream_k``). ``store_under_mma``: each
    tile's stores run under the next tile's first WGMMAs (whole cooperative tiles, 16-bit
    output; see ``GemmConfig.store_under_mma``; True keeps K whole); ``None`` (the
    default): on for whole cooperative tiles, False: every tile's epilogue before the next.
    ``split_sum``: how split-K's slices meet, ``"ordered"`` (each its own fp32 slot, summed in
    slot order by the last: the same bits every launch) or ``"atomic"`` (vector atomic adds
    into one fp32 tile, so the last slice reads one tile however many there are; the last
    bits depend on the order); ``None`` (the default): atomic for 64-row tiles from 3 slices
    on, where it measured faster (``split_sum_for``), else ordered, and always ordered under
    ``torch.use_deterministic_algorithms(True)``, which refuses an explicit ``"atomic"``.
    Ignored where K is not split.
    ``config``: a full ``kernels.gemm_sm90.GemmConfig`` (stages, rasterization, epilogue
    width and buffers), overriding ``load``, ``cluster`` and ``tile``. Without it the tiles'
    order is chosen for where this card puts the grid's CTAs (``cutetma.placement``: the
    first call on a device compiles and runs a few probe kernels, once per process and grid
    size): from M = 256 (whole tiles) an order table built on a shape's first call and kept
    on the device (``order_table_pays``), else the raster band with the fewest modelled L2
    reads; ``CUTETMA_PLACEMENT=0`` keeps the scheduler's default order.
    ``pdl``: launch with programmatic dependent launch, so the kernel may start while the
    one before it in the stream finishes, and waits for it only before touching memory
    (``GemmConfig.pdl``); a chain of such GEMMs, eager or in a CUDA graph, overlaps each
    launch and prologue with the previous kernel's tail. Off by default: in graphs of 20
    back-to-back calls at the card's power cap it was even with the default overall (+2%
    at 256 x 6144 x 4096 and 2048 x 512 x 5120, -1% at 4096^3, -3% at 512 x 4096 x 4096,
    where the gaps it fills cost clock; ``gemm_sustained_pdl.json``).

    An eager call costs the host about 70 us on the H200's machine (session 20; 190-275 us
    before the launch skipped the DSL's argument conversion, ``GemmLaunch``), against
    torch.matmul's 26-28 us: a GEMM whose kernel is shorter is host-bound when called
    eagerly. Inside a CUDA graph (``torch.cuda.graph``) that cost is paid once, at capture.
    """
    for name, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 2:
            raise ValueError(f"{name} must be 2D, got shape {tuple(t.shape)}")
        if t.dtype not in GEMM_DTYPES:
            raise TypeError(f"{name} has dtype {t.dtype}: gemm takes float16 or bfloat16")
        if t.device.type != "cuda":
            raise ValueError(f"{name} is on {t.device}: gemm needs CUDA tensors")
    if a.dtype != b.dtype:
        raise TypeError(f"a is {a.dtype} but b is {b.dtype}: both must have one dtype")
    if a.device != b.device:
        raise ValueError(f"a is on {a.device} but b on {b.device}")
    b_nk = b if trans_b else b.T
    (m, k), (n, k_b) = a.shape, b_nk.shape
    if k != k_b:
        shape_b = "(N, K)" if trans_b else "(K, N)"
        raise ValueError(f"inner dimensions differ: a is (M, K) = {tuple(a.shape)}, b {shape_b} "
                         f"= {tuple(b.shape)}")
    if max(m, n, k) >= 2**31:  # the kernel takes sizes as Int32
        raise ValueError(f"gemm sizes must be below 2**31, got M, N, K = {m}, {n}, {k}")
    out_dtype = out.dtype if out is not None else (out_dtype or a.dtype)
    if out_dtype not in GEMM_OUT_DTYPES:
        raise TypeError(f"out dtype {out_dtype}: float16, bfloat16 or float32")
    if out is not None:
        if out.shape != (m, n) or out.device != a.device:
            raise ValueError(f"out must be ({m}, {n}) on {a.device}, got {tuple(out.shape)} "
                             f"on {out.device}")
        if out.stride(1) != 1:
            raise ValueError(f"out must be row-major (stride {tuple(out.stride())})")
        hw.check_box((1, 16 // out.element_size()), out.element_size(), "none",
                     global_strides_bytes=(out.stride(0) * out.element_size(),),
                     global_base=out.data_ptr())
    cfg = config or _config_for(m, n, k, load, cluster, tile, _sm_count(a.device.index),
                                schedule, split_k, stream_k, store_under_mma, split_sum)

    result = out
    if result is None:  # pad the row so its stride is 16-byte aligned; return the view
        per = 16 // out_dtype.itemsize
        result = torch.empty(m, -(-n // per) * per, dtype=out_dtype, device=a.device)[:, :n]
    if m == 0 or n == 0:
        return result
    if k == 0:
        return result.zero_()
    a_ok = _aligned_operand(a, "a", allow_copy)
    b_ok = _aligned_operand(b_nk, "b", allow_copy)
    if a_ok.stride(1) != 1:
        raise ValueError("a must be K-major (row-major (M, K)): an M-major A is not supported")
    if config is None and b_ok.stride(1) != 1:  # the automatic choice for an N-major B
        cfg = _config_for(m, n, k, load, cluster, tile, _sm_count(a.device.index), schedule,
                          split_k, stream_k, store_under_mma, split_sum, b_k_major=False)
    check_tile_for_b(cfg, b_k_major=b_ok.stride(1) == 1)

    if pdl and not cfg.pdl:
        cfg = _with_pdl(cfg)
    clusters = _max_active_clusters(cfg.cluster_m * cfg.cluster_n, a.device.index)
    if config is None:  # the tile order for where this card puts the grid's CTAs
        cfg = _ordered(cfg, m, n, k, a.device.index or 0, clusters)
    workspace = ()
    tile_elems = cfg.tile_m * cfg.tile_n
    if cfg.stream_k:  # a slot and a ready flag per CTA
        workspace = _k_workspace(a.device, clusters, tile_elems, clusters)
    elif cfg.split_k > 1:  # a slot per (tile, slice), a ticket counter per tile
        tiles = -(-m // cfg.tile_m) * -(-n // cfg.tile_n)
        check_split_workspace(m, n, cfg, torch.cuda.get_device_properties(a.device).total_memory)
        if cfg.split_sum == "atomic":  # one slot per tile, kept at zero between launches
            workspace = _k_workspace(a.device, tiles, tile_elems, tiles, zeroed=True)
        else:
            workspace = _k_workspace(a.device, tiles * cfg.split_k, tile_elems, tiles)
    if cfg.order_table:  # the tiles' order as a table (no workspace: order_table refuses it)
        workspace = (None, None, _order_table(cfg, m, n, a.device.index or 0, clusters))
    b_k_major = b_ok.stride(1) == 1
    launch = _gemm_launch(a.dtype, result.dtype, b_k_major, cfg, clusters, workspace)
    launch((a_ok.data_ptr(), b_ok.data_ptr(), result.data_ptr(), m, n, a_ok.shape[1],
            b_ok.shape[1], a_ok.stride(0), b_ok.stride(0 if b_k_major else 1), result.stride(0),
            torch.cuda.current_stream(a.device).cuda_stream), workspace)
    return result


_CUTE_DTYPES = {torch.float16: "Float16", torch.bfloat16: "BFloat16", torch.float32: "Float32"}


class PointerLaunch:
    """One compiled kernel entry whose runtime arguments are scalars (a ``from_pointers``
    entry: pointers, sizes, strides, the stream), launched without the DSL's generic
    argument conversion.

    A compiled function's ``__call__`` turns every argument into a C pointer to its value
    on each call (DLPack for tensors, adapters for streams): about 65 us of Python a GEMM on
    this project's CPU machine, a third of an eager call's host cost on the H200's host
    (``gemm_host_cost.json``: 188 us a call at 4096^3 before, 69 us with this launch,
    cuBLAS 28; session 20). A launch here keeps ctypes slots for the scalars (``SLOTS``, a
    subclass's), writes the call's values into the slots and hands their addresses to the
    compiled program, as the DSL's own call does (``tests/test_gemm_ptx.py::
    test_launch_args_match_the_dsl`` and its attention twin hold the lists equal, so a DSL
    whose convention changes fails there, not on the GPU). Workspace tensors (the GEMM's
    split-K, stream-K, order table) are DSL tensors made once and cached, whose pointers
    are cached too."""

    SLOTS: tuple = ()

    def __init__(self, compiled):
        self.compiled = compiled
        self._slots = [kind() for kind in self.SLOTS]
        self._addresses = [ctypes.addressof(slot) for slot in self._slots]
        self._run = None  # the executor, made on the first launch (it loads the module)
        self._lock = threading.Lock()  # the slots are shared: one launch at a time

    def args(self, values, workspace=()) -> list:
        """The compiled program's argument list for ``values`` (the scalars in ``SLOTS``
        order) and the workspace tensors (``None`` where absent)."""
        for slot, value in zip(self._slots, values, strict=True):
            slot.value = value
        return self._addresses + [p for t in workspace if t is not None
                                  for p in t.__c_pointers__()]

    def __call__(self, values, workspace=()) -> None:
        with self._lock:
            if self._run is None:
                self._run = self.compiled.to().run_compiled_program
            self._run(self.args(values, workspace))


class GemmLaunch(PointerLaunch):
    """``HopperGemm.from_pointers``: A, B, C; m, n, ka, kb; lda, ldb, ldc; the stream."""

    SLOTS = ((ctypes.c_void_p,) * 3 + (ctypes.c_int32,) * 4 + (ctypes.c_int64,) * 3
             + (ctypes.c_void_p,))


class AttentionLaunch(PointerLaunch):
    """``FlashAttentionSm90.from_pointers``: Q, K, V, O, LSE; batch, s_q, s_k, heads,
    kv heads, head dim; the (seq, head, batch) strides of Q, K, V, O; the softmax scale,
    the persistent grid's size; the stream."""

    SLOTS = ((ctypes.c_void_p,) * 5 + (ctypes.c_int32,) * 6 + (ctypes.c_int64,) * 12
             + (ctypes.c_float, ctypes.c_int32, ctypes.c_void_p))


def _typed_pointer(dtype: torch.dtype, align: int = 16):
    """A global-memory pointer of ``dtype``'s DSL type for compiling a ``from_pointers``
    entry: only its type (and alignment) matters to the compiler, not its address."""
    from cutetma import dsl

    cutlass, cute = dsl.cutlass()
    from cutlass.cute.runtime import make_ptr

    return make_ptr(getattr(cutlass, _CUTE_DTYPES[dtype]), 16, cute.AddressSpace.gmem,
                    assumed_align=align)


def _gemm_launch(ab_dtype, c_dtype, b_k_major: bool, cfg, clusters: int, workspace=()):
    """The ``GemmLaunch`` of this configuration, compiled on its first use: one kernel per
    (dtypes, B's major, configuration, cluster count); sizes and strides are runtime
    values, so a new shape does not recompile."""
    key = ("gemm", ab_dtype, c_dtype, b_k_major, cfg, clusters)
    launch = _COMPILED.get(key)
    if launch is None:
        from cutetma import dsl

        _, cute = dsl.cutlass()
        from cutlass.cute.runtime import make_fake_stream

        from cutetma.kernels.gemm_sm90 import HopperGemm

        compiled = cute.compile(HopperGemm(cfg).from_pointers, _typed_pointer(ab_dtype),
                                _typed_pointer(ab_dtype), _typed_pointer(c_dtype),
                                1, 1, 1, 1, 1, 1, 1, b_k_major, clusters, make_fake_stream(),
                                *workspace)
        launch = _COMPILED[key] = GemmLaunch(compiled)
    return launch


_PLACED: dict = {}


def _grid_gpcs(cfg, m: int, n: int, device_index: int, clusters: int) -> tuple[int, ...]:
    """GPC of each CTA of the persistent grid this configuration launches for an M x N
    output (its clusters: the output's, at most ``clusters``), probed on the device."""
    from cutetma import placement

    size = cfg.cluster_m * cfg.cluster_n
    grid = min(math.prod(placement.cluster_grid(m, n, cfg)), clusters)
    return placement.cta_gpcs(size, grid * size, device_index)


def _placed(cfg, m: int, n: int, k: int, device_index: int, clusters: int):
    """``cfg`` with the raster order ``placement.choose_raster`` picks for the CTA -> GPC map
    this device's dispatcher gives a grid of ``clusters`` clusters (probed once per process
    and grid; remembered per shape). Unchanged for split-K and stream-K (their work lists
    are not the plain raster), with ``CUTETMA_PLACEMENT=0``, and while a CUDA graph is
    being captured (the probe launches a kernel and waits for it; that shape is placed at
    its next call outside a capture)."""
    from cutetma import placement

    if cfg.split_k > 1 or cfg.stream_k or not placement.enabled():
        return cfg
    key = (cfg, m, n, k, device_index, clusters)
    if key not in _PLACED:
        if torch.cuda.is_current_stream_capturing():
            return cfg
        gpcs = _grid_gpcs(cfg, m, n, device_index, clusters)
        l2 = getattr(torch.cuda.get_device_properties(device_index), "L2_cache_size", 50 << 20)
        band, along_m = placement.choose_raster(m, n, k, cfg, gpcs, l2)
        _PLACED[key] = dataclasses.replace(cfg, raster_swizzle=band, raster_along_m=along_m)
    return _PLACED[key]


# From this M, ``cutetma.gemm`` deals its tiles from an order table (``GemmConfig.
# order_table``, ``placement.order_table``) instead of the placed band. On the H200 at its
# 690 W cap (gemm_sustained_grid.json, 2026-12-02: the grid's 36 cells at M = 2048 / 8192,
# 2 s phases of CUDA-graph replays, fp16) the table was faster than the placed band in 35 of
# 36 cells, +1.2% / +2.0% geomean (0.991 -> 1.003x / 0.981 -> 1.001x cuBLAS): one GPC's
# CTAs read fewer distinct lines, so the L2 merges more of their loads, the card draws less
# power for the same work and the cap leaves it a higher clock. In short interleaved windows
# (session 18, 2 runs over the grid's cells) +0.7% at M = 512 (25 of 34 cells), even at
# M = 256, and 0.99x at M = 8192, where the windows' clock is the previous kernel's
# (gemm_window_ab_400.json: 1.021x with 400 ms windows at the headline shapes). From
# M = 256 since session 22: once each tile's table entry was loaded a work unit ahead (it had
# cost a DRAM round trip before the first load and between tiles: +0.6% over the M = 512
# cells, gemm_prefetch_ab.json) the table was 1.015x / 1.020x the default over the grid's 15
# whole-tile M = 256 cells, fp16 / bf16 (3 interleaved rounds, gemm_m256_table_ab_*.json;
# ahead in 13 / 14 of 15, behind by 1-2% at 256 x 28672 x 8192). Below M = 256 untimed
TABLE_MIN_M = 256


def order_table_pays(m: int, n: int, cfg) -> bool:
    """Whether ``cutetma.gemm`` deals this configuration's tiles from an order table: whole
    tiles (the table orders tiles, not split-K or stream-K units), M >= ``TABLE_MIN_M`` and
    fewer than 2^15 clusters along M and N (the table packs a cluster's coordinates into 16
    bits each, ``placement.pack``)."""
    fits = all(-(-size // (tile * cl)) < 1 << 15 for size, tile, cl in
               ((m, cfg.tile_m, cfg.cluster_m), (n, cfg.tile_n, cfg.cluster_n)))
    return m >= TABLE_MIN_M and cfg.split_k == 1 and not cfg.stream_k and fits


def _ordered(cfg, m: int, n: int, k: int, device_index: int, clusters: int):
    """``cfg`` with the tile order ``cutetma.gemm`` runs by default: the order table where
    ``order_table_pays`` (built from the probed placement on this shape's first call; a
    CUDA-graph capture that finds it unbuilt keeps the placed band), else the placed band
    (``_placed``). Both are off with ``CUTETMA_PLACEMENT=0``."""
    from cutetma import placement

    if placement.enabled() and order_table_pays(m, n, cfg):
        table_cfg = _with_order_table(cfg)
        if not torch.cuda.is_current_stream_capturing() or (
                (table_cfg, m, n, device_index, clusters) in _ORDER_TABLES):
            return table_cfg
    return _placed(cfg, m, n, k, device_index, clusters)


@functools.lru_cache(maxsize=1024)
def _with_order_table(cfg):
    """``cfg`` with ``order_table`` on, made once per configuration (a ``dataclasses.
    replace`` re-runs ``GemmConfig``'s checks: a tenth of an eager call's host cost)."""
    return dataclasses.replace(cfg, order_table=True)


@functools.lru_cache(maxsize=1024)
def _with_pdl(cfg):
    """``cfg`` with ``pdl`` on, made once per configuration (as ``_with_order_table``)."""
    return dataclasses.replace(cfg, pdl=True)


_ORDER_TABLES: dict = {}


def _order_table(cfg, m: int, n: int, device_index: int, clusters: int):
    """``GemmConfig.order_table``'s table for this output on this card (``placement.
    order_table`` over the probed CTA -> GPC map), as the kernel takes it; built once per
    (configuration, M, N, device), kept on the device."""
    from cutetma import placement

    key = (cfg, m, n, device_index, clusters)
    if key not in _ORDER_TABLES:
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError("order_table: call this shape once outside CUDA-graph capture "
                               "first (its table is built from a probe launch)")
        gpcs = _grid_gpcs(cfg, m, n, device_index, clusters)
        packed = placement.pack(placement.order_table(m, n, cfg, gpcs))
        table = torch.from_numpy(packed).to(f"cuda:{device_index}")
        from cutlass.cute.runtime import from_dlpack

        _ORDER_TABLES[key] = (table, from_dlpack(table, assumed_align=4).mark_layout_dynamic())
    return _ORDER_TABLES[key][1]


def check_tile_for_b(cfg, b_k_major: bool) -> None:
    """Refuse, before launch, a tile wider than 256 whose WGMMAs (half the tile each) cannot
    read an N-major B: its 128-byte swizzle atom is 64 columns and a WGMMA reads whole atoms
    (the DSL fails to partition 128 x 320 that way)."""
    if not b_k_major and cfg.tile_n > 256 and cfg.mma_n % 64:
        raise ValueError(f"tile=({cfg.tile_m}, {cfg.tile_n}) with b given as (K, N) needs its "
                         f"WGMMAs' width ({cfg.mma_n}, half the tile) to be a multiple of 64: "
                         "use tile_n 384, at most 256, or b as (N, K)")


def check_split_workspace(m: int, n: int, cfg, device_bytes: int) -> int:
    """Split-K keeps an fp32 partial tile per (tile, slice): ``split_k`` times the fp32
    output (``split_sum="atomic"``: one per tile). Refuse, before anything is allocated, a
    split whose workspace would take over a quarter of the device (an explicit ``split_k``
    on a large output); returns the bytes."""
    tiles = -(-m // cfg.tile_m) * -(-n // cfg.tile_n)
    slots = 1 if cfg.split_sum == "atomic" else cfg.split_k
    need = tiles * slots * cfg.tile_m * cfg.tile_n * 4
    if need > device_bytes // 4:
        raise ValueError(f"split_k={cfg.split_k} on a {m} x {n} output needs a "
                         f"{need / 2**30:.1f} GiB fp32 workspace ({tiles} tiles x "
                         f"{slots} slots x {cfg.tile_m} x {cfg.tile_n} x 4 B), over a "
                         f"quarter of the device: use fewer slices (split_k=1 needs none)")
    return need


_K_WORKSPACE: dict = {}
_K_WORKSPACE_RETIRED: list = []  # outgrown workspaces, kept alive (doubling bounds them)


def _k_workspace(device, slots: int, tile_elems: int, flags: int, zeroed: bool = False):
    """Split-K's and stream-K's workspace: fp32 tile slots and int32 flags, as DSL tensors of
    dynamic length (one compiled kernel serves every size), one pair per (device, stream,
    ``zeroed``): launches on one stream run in order, and every launch leaves the flags at
    zero as it found them (``zeroed``: the slots too, for ``split_sum="atomic"``, which adds
    into them; the ordered sums leave their partials behind, so they get their own pair).
    Grown by doubling and never freed, so a CUDA graph that captured a launch keeps valid
    pointers; a capture allocates its own pair (its zeroing replays with it)."""
    from cutlass.cute.runtime import from_dlpack

    key = (device, torch.cuda.current_stream(device).cuda_stream, zeroed)
    held = _K_WORKSPACE.get(key)
    need = (slots * tile_elems, flags)
    if held is None or held[0].numel() < need[0] or held[1].numel() < need[1]:
        if held is not None:  # a captured CUDA graph may still point at it: never free it
            _K_WORKSPACE_RETIRED.append(held)
        size = [max(n, 2 * held[i].numel() if held else 0) for i, n in enumerate(need)]
        partials = (torch.zeros if zeroed else torch.empty)(size[0], dtype=torch.float32,
                                                            device=device)
        flags_t = torch.zeros(size[1], dtype=torch.int32, device=device)
        held = (partials, flags_t,
                from_dlpack(partials, assumed_align=16).mark_layout_dynamic(),
                from_dlpack(flags_t, assumed_align=4).mark_layout_dynamic())
        _K_WORKSPACE[key] = held
    return held[2], held[3]


def gemm_ref(a: torch.Tensor, b: torch.Tensor, trans_b: bool = True) -> torch.Tensor:
    """The fp32 reference: ``a @ b^T`` computed from the same inputs in float32."""
    b_nk = b if trans_b else b.T
    return a.float() @ b_nk.float().T


@torch.library.custom_op("cutetma::gemm", mutates_args=())
def _gemm_op(a: torch.Tensor, b: torch.Tensor, trans_b: bool, load: str,
             out_dtype: torch.dtype) -> torch.Tensor:
    return gemm(a, b, trans_b=trans_b, load=load, out_dtype=out_dtype).contiguous()


@_gemm_op.register_fake
def _(a, b, trans_b, load, out_dtype):
    n = b.shape[0] if trans_b else b.shape[1]
    return a.new_empty((a.shape[0], n), dtype=out_dtype)


# =========================================================================== attention
ATTENTION_HEAD_DIMS = (64, 128, 256)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
              softmax_scale: float | None = None, return_lse: bool = False,
              load: str = "tma"):
    """FlashAttention-style forward: ``softmax(q k^T * scale) v`` (and the log-sum-exp).

    ``q`` (b, s_q, h, d), ``k`` and ``v`` (b, s_k, h_kv, d) with h % h_kv == 0, fp16 or bf16,
    d in {64, 128, 256}; causal masks are bottom-right aligned when s_q != s_k (FlashAttention's
    convention, not torch SDPA's). Returns ``out`` (b, s_q, h, d), and ``lse`` (b, h, s_q)
    fp32 with ``return_lse``. Runs on the current CUDA stream. ``load="cp_async"`` runs the
    same kernel with its producer swapped (the paper's forced cp.async variant). Inputs
    whose head dim is not contiguous, or whose base or strides break TMA's 16-byte rule,
    are copied into a fresh contiguous tensor first (views of a packed qkv tensor are
    fine as they are).
    """
    names = ("q", "k", "v")
    for name, t in zip(names, (q, k, v), strict=True):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must be (batch, seqlen, heads, head_dim), got "
                             f"{tuple(t.shape)}")
        if t.dtype not in GEMM_DTYPES:
            raise TypeError(f"{name} has dtype {t.dtype}: attention takes float16 or bfloat16")
        if t.device.type != "cuda":
            raise ValueError(f"{name} is on {t.device}: attention needs CUDA tensors")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError("q, k and v must be on one device")
    b, s_q, h, d = q.shape
    if k.shape != v.shape or k.shape[0] != b or k.shape[3] != d:
        raise ValueError(f"k and v must be (b={b}, s_k, h_kv, d={d}) alike, got "
                         f"{tuple(k.shape)} and {tuple(v.shape)}")
    h_kv = k.shape[2]
    if h % h_kv:
        raise ValueError(f"{h} query heads are not a multiple of {h_kv} key/value heads")
    if d not in ATTENTION_HEAD_DIMS:
        raise ValueError(f"head_dim {d}: supported are {ATTENTION_HEAD_DIMS}")
    from cutetma.kernels.attention_sm90 import AttentionConfig

    scale = softmax_scale if softmax_scale is not None else d ** -0.5
    cfg = AttentionConfig(head_dim=d, causal=causal, load=load,
                          dtype=str(q.dtype).removeprefix("torch."))
    out, lse = _run_attention(q, k, v, scale, cfg)
    return (out, lse) if return_lse else out


def _run_attention(q, k, v, scale: float, cfg):
    """Launch one compiled configuration on validated inputs (benchmarks call this directly
    to compare schedules); returns (out, lse)."""
    b, s_q, h, _ = q.shape
    # a fresh copy, not .contiguous(): that returns a misaligned base, or a size-1 dim's odd
    # stride, unchanged whenever torch already calls the tensor contiguous
    q, k, v = (x if x.stride(-1) == 1 and all(s * 2 % 16 == 0 for s in x.stride()[:-1])
               and x.data_ptr() % 16 == 0 else x.clone(memory_format=torch.contiguous_format)
               for x in (q, k, v))
    out = torch.empty_like(q)
    lse = torch.empty(b, h, s_q, device=q.device, dtype=torch.float32)
    if q.numel() == 0 or k.shape[1] == 0:  # b, s_q or h of 0 (a 0 grid dimension), or no keys
        out.zero_()
        lse.fill_(float("-inf"))
        return out, lse

    # the persistent grid: one CTA per SM, or as many clusters' CTAs as run at once
    sms = _sm_count(q.device.index) if cfg.cluster == 1 else (
        cfg.cluster * _max_active_clusters(cfg.cluster, q.device.index))
    strides = [x.stride(i) for x in (q, k, v, out) for i in (1, 2, 0)]  # (seq, head, batch)
    _attention_launch(q.dtype, cfg)(
        (q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), lse.data_ptr(), b, s_q,
         k.shape[1], h, k.shape[2], q.shape[3], *strides, scale, sms,
         torch.cuda.current_stream(q.device).cuda_stream))
    return out, lse


def _attention_launch(dtype: torch.dtype, cfg) -> AttentionLaunch:
    """The ``AttentionLaunch`` of this (dtype, configuration), compiled on its first use
    (``FlashAttentionSm90.from_pointers``); sizes and strides are runtime values."""
    key = ("attention", dtype, cfg)
    launch = _COMPILED.get(key)
    if launch is None:
        from cutetma import dsl

        cutlass, cute = dsl.cutlass()
        from cutlass.cute.runtime import make_fake_stream

        from cutetma.kernels.attention_sm90 import FlashAttentionSm90

        io = [_typed_pointer(dtype) for _ in range(4)]
        compiled = cute.compile(FlashAttentionSm90(cfg).from_pointers, *io,
                                _typed_pointer(torch.float32, 4), *(1,) * 18,
                                cutlass.Float32(1.0), cutlass.Int32(1), make_fake_stream())
        launch = _COMPILED[key] = AttentionLaunch(compiled)
    return launch


@torch.library.custom_op("cutetma::attention", mutates_args=())
def _attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                  softmax_scale: float | None, load: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch.ops.cutetma.attention(q, k, v, causal, softmax_scale, load) -> (out, lse)``."""
    return attention(q, k, v, causal=causal, softmax_scale=softmax_scale, return_lse=True,
                     load=load)


@_attention_op.register_fake
def _(q, k, v, causal, softmax_scale, load):
    b, s_q, h, _ = q.shape
    return q.new_empty(q.shape), q.new_empty((b, h, s_q), dtype=torch.float32)
