"""GEMM configuration: a problem (M, N, K, options) -> ``GemmConfig``, on the host only.

A time model of the persistent grid on the H200 (132 SMs), fitted to measured kernel times:
work units make waves of the SMs (``wave_count``), each unit costs its k-tiles times a
per-tile k-tile time (``k_tile_time``) plus split-K's hand-over (``hand_over``), and the
candidate tiles, K splits and clusters are compared by that time (``grid_time``).
``select_gemm_config`` turns the winner into a ``GemmConfig``. Nothing here touches a GPU:
the tests check the choices on any machine. Each constant's evidence: ``docs/design.md``.
"""

from __future__ import annotations

import dataclasses
import math

from cutetma.copy import LOAD_MECHANISMS
from cutetma.kernels.gemm_config import GemmConfig


def split_k_for(m: int, n: int, k: int, tile=(128, 128), sm_count: int = 132,
                everywhere: bool = False) -> int:
    """K slices for a shape whose output tiles fill under half the SMs (1: no split):
    enough slices for about one wave, each at least 8 k-tiles of 64, at most 8. The
    automatic choice for M <= 64 (64 x 128 tiles); larger M go by ``grid_time``. Only
    outputs of at most 24 tiles, or K >= 12288, split unless ``everywhere`` (the
    benchmark's candidate list): below both, splitting lost on the H200 (docs/design.md,
    "Split-K for M <= 64")."""
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


# A k-tile's time relative to one of a 128 x 256 tile, fitted to H200 kernel times
# (docs/design.md, "GEMM tile and split-K")
K_TILE_TIME = {(128, 256): 1.0, (128, 192): 0.8, (128, 160): 0.69, (128, 128): 0.56,
               (64, 128): 0.35}
# a k-tile of a 64 x w tile on a line through 64 x 96 and 64 x 128 (docs/design.md)
K_TILE_64 = (0.23, 0.12)  # a k-tile of a 64 x w tile: 0.23 + 0.12 * w / 128
# the tiles ``cutetma.gemm`` chooses from for M > 64: widths between 128 and 256 fit a
# shape's tiles to the SMs' waves; 64 x 128 gives small outputs enough units
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
    6 + 5 (slices - 1). Atomic: every slice adds into one slot in L2 and the last reads it
    once, about 14 whatever the count, so it pays from 3 slices on (fitted to H200 kernel
    times: docs/design.md, "Split sum")."""
    if slices == 1:
        return 0.0
    return 14.0 if split_sum == "atomic" else 6.0 + 5.0 * (slices - 1)


def split_sum_for(slices: int, tile=(64, 128)) -> str:
    """How ``slices`` slices of a ``tile`` meet by default: ``"atomic"`` for 64-row tiles
    from 3 slices on, where ``hand_over`` says it is faster (and the H200 agreed);
    ``"ordered"`` for 128-row tiles, and always under
    ``torch.use_deterministic_algorithms(True)`` (the atomic sum's last bits depend on the
    order the slices arrive in; the ordered sum gives the same bits every launch).
    docs/design.md, "Split sum"."""
    if slices > 1 and tile[0] == 64 and not deterministic_mode():
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
    is a large share of a tile's time, i.e. where K is a few k-tiles: up to 8 k-tiles from
    M = 512; below, up to 24 where its 128 x 128 tiles fill at least one wave (each
    warpgroup then has a tile to hide an epilogue under). docs/design.md, "Pingpong for
    short K"."""
    k_tiles = -(-k // 64)
    if m >= 512:
        return k_tiles <= 8
    tiles = -(-m // 128) * -(-n // 128)
    return m >= 256 and k_tiles <= 24 and tiles >= sm_count


# Up to this M, an unsplit 128 x 256 tile narrows to the narrowest width (144 to 256) that
# makes as many waves; larger M keep it (docs/design.md, "GEMM tile and split-K")
FIT_256_MAX_M = 512
# The same for 64 x 128 tiles, split or not, from 80 wide (docs/design.md, "Narrow multicast
# widths")
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
    and the tile rows pair up. docs/design.md, "Narrow multicast widths"."""
    return (tile[0] == 64 and tile[1] < 128 and -(-m // 64) % 2 == 0
            and (split > 1 or m < TABLE_MIN_M))


# A k-tile of a 128 x 128 tile whose B is multicast to both CTAs of a (2, 1) cluster, in
# ``grid_time``'s units: each SM loads 24 KB a k-tile instead of 32 (docs/design.md, "B
# multicast for mid M")
MULTICAST_128_K_TILE_TIME = 0.52
MULTICAST_MAX_M = 512  # measured up to here; larger M keep their wider tiles
# Narrower multicast tiles (64 to 112 wide, as cuBLAS runs at M = 256): their k-tile time
# scales as at 128; chosen only where they fill a wave and the model puts them a margin ahead
# (docs/design.md, "Narrow multicast widths")
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


# Past MULTICAST_MAX_M, 128 x 320 tiles in (2, 1) clusters where 128 x 256 would fill the
# last wave badly, as cuBLAS does (docs/design.md, "Wide 128 x 320 tiles")
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


def select_gemm_config(m: int, n: int, k: int, *, load: str = "tma", cluster=None, tile=None,
                       schedule: str | None = None, split_k: int | None = None,
                       store_under_mma: bool | None = None, split_sum: str | None = None,
                       b_k_major: bool = True, sm_count: int = 132, stream_k: bool = False):
    """The ``GemmConfig`` ``cutetma.gemm`` runs for an M x N x K problem, from the wave model
    above (each default and its evidence: ``docs/design.md``).

    ``load``: ``"tma"`` or ``"cp_async"`` (the same kernel, its producer swapped).
    ``cluster`` (cluster_m, cluster_n): CTAs that share loads; A is multicast to the
    cluster_n CTAs of a row, B to the cluster_m of a column (TMA only). ``None``: chosen
    (``multicast_tile``, ``small_tile_cluster``, ``wide_multicast_pays``) with ``"tma"``,
    else (1, 1). ``tile`` (tile_m, tile_n): tile_m 64 or 128, tile_n a multiple of 16 from
    64 to 384. ``schedule``: ``"cooperative"`` or ``"pingpong"``; ``None``: pingpong 128 x
    128 where ``pingpong_pays``. ``split_k``: K slices; ``None``: chosen with the tile where
    neither a tile, a cluster nor pingpong is given (``auto_tile_and_split``, or
    ``split_k_for`` at M <= 64), else 1. ``store_under_mma``: ``None``: on for whole
    cooperative tiles up to 256 wide. ``split_sum``: ``"ordered"`` or ``"atomic"``;
    ``None``: ``split_sum_for``. ``b_k_major``: whether B is (N, K) with K contiguous (an
    N-major B cannot feed 128 x 320 tiles). ``stream_k``: the experimental stream-K
    schedule (tutorial 09; slower than split-K on the H200, ``docs/perf-log.md``).
    Pure: the same arguments give the same configuration on any machine, except that
    torch's deterministic mode keeps K slices' sums ordered."""
    mechanism = check_load(load)
    auto_cluster = cluster is None and mechanism == "tma"
    cluster = (1, 1) if cluster is None else tuple(cluster)
    if stream_k and split_k is None:
        split_k = 1
    if split_k is None:  # automatic: tile and K slices from the H200 measurements
        split_k = 1
        if (tile is None and schedule != "pingpong" and cluster == (1, 1)
                and not store_under_mma):
            if m > 64:
                tile, split_k = auto_tile_and_split(m, n, k, sm_count)
                if (schedule is None and split_k == 1 and mechanism == "tma"
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
    if store_under_mma is None:  # docs/design.md, "Store under MMA"
        store_under_mma = whole_cooperative and tile[1] <= 256
    if store_under_mma and not whole_cooperative:
        raise ValueError("store_under_mma=True needs whole cooperative tiles (no pingpong, "
                         "split_k or stream_k)")
    split_sum = (split_sum or split_sum_for(split_k, tile)) if split_k > 1 else "ordered"
    return GemmConfig(tile_m=tile[0], tile_n=tile[1], cluster_m=cluster[0],
                      cluster_n=cluster[1], load=mechanism, schedule=schedule,
                      raster_swizzle=raster_band(n, tile[1], cluster[1]), split_k=split_k,
                      stream_k=stream_k, store_under_mma=bool(store_under_mma),
                      split_sum=split_sum)


def check_load(load: str) -> str:
    """``load`` as the kernels name it: ``"tma"`` or ``"cp_async"`` (multicast is a cluster)."""
    if load not in LOAD_MECHANISMS:
        raise ValueError(f"load={load!r}: choose 'tma' or 'cp_async' (TMA multicast is a "
                         "cluster: config=select_gemm_config(..., cluster=(2, 1)))")
    return load


def deterministic_mode() -> bool:
    """torch's ``use_deterministic_algorithms`` flag: a host setting the configuration must
    honour (split-K's atomic sum is not deterministic), read here and nowhere else."""
    import torch

    return torch.are_deterministic_algorithms_enabled()


def raster_band(n: int, tile_n: int, cluster_n: int) -> int:
    """Clusters per rasterization band: the largest of 8, 4, 2, 1 that divides the clusters
    along N. The scheduler rounds that count up to a whole band, and every phantom tile it
    adds is a CTA's worth of wasted work. docs/design.md, "Raster band"."""
    clusters_n = math.ceil(math.ceil(n / tile_n) / cluster_n)
    return next(s for s in (8, 4, 2, 1) if clusters_n % s == 0)


# From this M, ``cutetma.gemm`` deals its tiles from an order table (``GemmConfig.
# order_table``) instead of the placed band (docs/design.md, "CTA placement and the order
# table")
TABLE_MIN_M = 256


def order_table_pays(m: int, n: int, cfg) -> bool:
    """Whether ``cutetma.gemm`` deals this configuration's tiles from an order table: whole
    tiles (the table orders tiles, not split-K or stream-K units), M >= ``TABLE_MIN_M`` and
    fewer than 2^15 clusters along M and N (the table packs a cluster's coordinates into 16
    bits each, ``placement.pack``)."""
    fits = all(-(-size // (tile * cl)) < 1 << 15 for size, tile, cl in
               ((m, cfg.tile_m, cfg.cluster_m), (n, cfg.tile_n, cfg.cluster_n)))
    return m >= TABLE_MIN_M and cfg.split_k == 1 and not cfg.stream_k and fits


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


# FP8 (``cutetma.scaled_gemm``): a promoted tile (blockwise, an fp32 C) at most this wide
PROMOTED_MAX_TILE_N = 128
# ... and 256 rows (fp32 C, blockwise) where the 16-bit model chose 128 x 256 (docs/design.md,
# "FP8 GEMM": per tensor fp32 C 1016 -> 1124 TFLOP/s at 4096^3, blockwise 912 -> 1134, H100)
PROMOTED_TALL_TILE = True


def fp8_config(cfg: GemmConfig, mode: str, out_dtype=None) -> GemmConfig:
    """A 16-bit configuration as the FP8 kernel's: 128-element k-tiles, the scaling mode,
    the raster band kept and no order table (FP8 tiles are not placed yet); blockwise and
    other promoted tiles at most ``PROMOTED_MAX_TILE_N`` wide (blockwise: cooperative, no
    stream-K, split-K's slices summed in order; where the model chose 128 x 256, an fp32
    C's or a blockwise tile becomes 256 x 128, ``PROMOTED_TALL_TILE``). An fp32
    ``out_dtype`` promotes each k-tile into the accumulator in fp32 (``GemmConfig.promote``:
    FP8 WGMMA's own sum is narrower, which a 16-bit C's rounding hides but an fp32 C shows);
    None: bf16."""
    import torch

    promote = out_dtype == torch.float32 or mode == "block"
    # where the model chose 128 x 256 whole-K cooperative tiles, a promoted tile takes the
    # same area on its side: 256 x 128, each warpgroup's rows in two waves through one
    # k-tile fragment (accumulator 128 + fragment 64 registers a thread); blockwise scale_a
    # comes with each stage, so neither wave waits on a global load (design.md)
    tall = (promote and PROMOTED_TALL_TILE
            and (cfg.tile_m, cfg.tile_n) == (128, 256) and cfg.schedule == "cooperative"
            and cfg.split_k == 1 and not cfg.stream_k)
    if promote and not tall and (cfg.schedule != "cooperative" or cfg.stream_k
                                 or (mode == "block" and 128 % cfg.tile_n)):
        # blockwise: a tile inside one 128-column scale block, 128 wide, or 64 where the
        # model chose a narrower one
        tile_n = (128 if cfg.tile_n > 64 else 64) if mode == "block" else cfg.tile_n
        cfg = GemmConfig(tile_m=cfg.tile_m, tile_n=tile_n, load=cfg.load, split_k=cfg.split_k,
                         split_sum=cfg.split_sum, store_under_mma=cfg.store_under_mma)
    if promote and cfg.tile_n > PROMOTED_MAX_TILE_N:
        # a promoted tile holds its accumulator and a k-tile's fragment: 128 registers a
        # thread at 128 wide, 256 at 256 wide, past setmaxnreg's 232 (it spilled 500 bytes;
        # per tensor at 4096^3 128 x 128 ran 1016 TFLOP/s against 420, docs/design.md)
        try:
            cfg = dataclasses.replace(cfg, tile_m=256 if tall else cfg.tile_m,
                                      tile_n=PROMOTED_MAX_TILE_N, epi_n=None,
                                      store_under_mma=cfg.store_under_mma and not tall,
                                      scaling=mode, tile_k=128,
                                      promote=promote and mode != "block")
        except ValueError:  # a cluster or schedule that needs the wider tile
            cfg = GemmConfig(tile_m=128, tile_n=PROMOTED_MAX_TILE_N, load=cfg.load)
    if mode == "block" and cfg.split_k > 1:
        # blockwise slices summed by split-K came out wrong on the H200 (257 x 129 x 4096,
        # 8 slices: atomic sum wrong, ordered sum NaN); whole K until that is understood
        cfg = dataclasses.replace(cfg, split_k=1, split_sum="ordered")
    return dataclasses.replace(cfg, tile_k=128, scaling=mode, order_table=False,
                               promote=promote and mode != "block")
