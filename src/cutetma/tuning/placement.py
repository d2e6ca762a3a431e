"""The tile order that uses where each CTA of a persistent grid runs: a host-only model.

What the H200 showed (``benchmarks/results/sm_placement.json`` and Nsight Compute's ``lrc__*``
counters; figures in docs/design.md, "CTA placement and the order table")::

    the L2 request coalescer (LRC)   sits in front of the L2 slices and merges reads of one
                                     sector: "programmatic" merges serve TMA multicast,
                                     "hardware" merges join identical plain loads
    hardware merges                  happen between SMs of one GPC: the L2 sectors a GEMM
                                     asks for are, within 5% over seven raster orders at
                                     512 x 1536 x 5120, the count of distinct (GPC, operand
                                     k-tile) pairs (``l2_sectors``); 14-60% above it at
                                     2048 x 512 x 5120, the same winner
    the CTA dispatcher               deals a grid's CTAs round-robin over the GPCs, a TPC at
                                     a time (CTA i and i + 1 on different GPCs), the same
                                     way every launch; a CTA's SM is its index's, not its
                                     tile's

So the static scheduler's raster order (``GemmConfig.raster_swizzle`` / ``raster_along_m``)
decides how many GPCs read each A row block and B column block at once. A band that keeps one
GPC's CTAs on few row and column blocks asks the L2 for fewer sectors, until a wave's operands
no longer fit the L2 (50 MB) and DRAM sets the pace. ``choose_raster`` therefore takes the
order with the fewest modelled L2 sectors (``l2_sectors``) among those that read no more from
DRAM than the default (``dram_bytes``: what a wave finds of the previous wave's operands in
the L2).

``order_table`` goes further (``GemmConfig.order_table``): each wave keeps the default
band's clusters (the same DRAM traffic) but deals them so one GPC gets a compact block. Fewer
L2 sectors let the card draw less power for the same work, so at its power cap it keeps a
higher clock. ``cutetma.gemm`` runs it from M = 256 (``tuning.gemm.order_table_pays``).

The GPC of each CTA comes from ``PlacementProbe`` runs on the device itself
(``cutetma.runtime.placement``; floorswept chips differ: this H200 has GPCs of 18, 16 and 8
SMs), once per process and grid;
without a GPU, or with ``CUTETMA_PLACEMENT=0``, nothing is probed and the default order
stays. The order only moves tiles between CTAs: every tile is computed whatever the map
says, so a wrong map costs speed, never results.
"""

from __future__ import annotations

import math

import numpy as np

BANDS = (1, 2, 4, 8)


def gpcs_from_clusters(launches: list[tuple[int, list[int]]], sm_count: int) -> list[int]:
    """GPC index of each SM (0, 1, ... in order of first sight; -1 where no launch covered
    it) from launches of clusters: ``(cluster size, SM of each CTA)``. A cluster's CTAs share
    a GPC, whether they ran in the first wave or a later one (union-find)."""
    parent = list(range(sm_count))

    def root(s):
        while parent[s] != s:
            parent[s] = parent[parent[s]]
            s = parent[s]
        return s

    seen = set()
    for size, sms in launches:
        for first in range(0, len(sms) - size + 1, size):
            members = sms[first:first + size]
            seen.update(members)
            for s in members[1:]:
                parent[root(s)] = root(members[0])
    names: dict[int, int] = {}
    return [names.setdefault(root(s), len(names)) if s in seen else -1
            for s in range(sm_count)]


def apart(gpc_of_sm) -> tuple[int, ...]:
    """``gpc_of_sm`` with every SM no probe named (-1) in a group of its own, numbered past
    the GPCs: the model then merges nothing it cannot vouch for."""
    spare = max(gpc_of_sm) + 1
    return tuple(g if g >= 0 else spare + s for s, g in enumerate(gpc_of_sm))


# ----------------------------------------------------------------------------- the model
def cluster_order(clusters_m: int, clusters_n: int, band: int, along_m: bool):
    """The static persistent scheduler's cluster coordinates for each linear work index
    (``PersistentTileSchedulerParams``), as two arrays ``(m, n)``: a band of ``band``
    clusters walked along N (``along_m``: consecutive clusters share A's row block), then
    the next M, then the next band; ``along_m=False`` the same with M and N swapped. A band
    of 1 walks M first (``along_m``) or N first. A band that does not divide its dimension
    pads it (indices past the grid)."""
    if band == 1:
        i = np.arange(clusters_m * clusters_n)
        return (i % clusters_m, i // clusters_m) if along_m else (i // clusters_n,
                                                                  i % clusters_n)
    if along_m:
        i = np.arange(clusters_m * -(-clusters_n // band) * band)
        return (i // band) % clusters_m, i // (band * clusters_m) * band + i % band
    i = np.arange(-(-clusters_m // band) * band * clusters_n)
    return i // (band * clusters_n) * band + i % band, (i // band) % clusters_n


def cluster_grid(m: int, n: int, cfg) -> tuple[int, int]:
    """Clusters along M and N that cover the output's tiles."""
    tiles_m, tiles_n = math.ceil(m / cfg.tile_m), math.ceil(n / cfg.tile_n)
    return math.ceil(tiles_m / cfg.cluster_m), math.ceil(tiles_n / cfg.cluster_n)


def band_order(m: int, n: int, cfg, band: int, along_m: bool):
    """``cluster_order`` for this output and configuration: ``(m, n)`` arrays of clusters."""
    return cluster_order(*cluster_grid(m, n, cfg), band, along_m)


def order_table(m: int, n: int, cfg, gpcs):
    """A tile order for ``GemmConfig.order_table``: each wave holds the clusters the default
    band order (``cfg``'s) gives it, so what the L2 keeps between waves is unchanged, but
    they are dealt so that the clusters of one GPC get a compact block of them (a strip of
    columns walked row by row, its width set so that a GPC's share is about as many A rows
    as B columns in bytes), where the band deals one GPC a column or a row. ``(m, n)``
    arrays of clusters by work index; ``gpcs``: GPC of each CTA index of the grid."""
    mc, nc = band_order(m, n, cfg, cfg.raster_swizzle, cfg.raster_along_m)
    size = cfg.cluster_m * cfg.cluster_n
    grid = len(gpcs) // size
    cluster_gpc = np.asarray(gpcs)[::size][:grid]
    per_gpc = grid / len(set(cluster_gpc.tolist()))
    block_m, block_n = cfg.tile_m * cfg.cluster_m, cfg.tile_n * cfg.cluster_n
    width = max(1, round(math.sqrt(per_gpc * block_m / block_n)))
    out_m, out_n = mc.copy(), nc.copy()
    for first in range(0, len(mc), grid):
        wave_m, wave_n = mc[first:first + grid], nc[first:first + grid]
        slots = np.argsort(cluster_gpc[:len(wave_m)], kind="stable")  # by GPC
        tiles = np.lexsort((wave_n, wave_m, wave_n // width))  # strips, row by row
        out_m[first + slots], out_n[first + slots] = wave_m[tiles], wave_n[tiles]
    return out_m, out_n


def pack(order) -> np.ndarray:
    """``order_table``'s clusters as the kernel reads them: int32 ``m | n << 16``."""
    mc, nc = order
    if len(mc) and max(mc.max(), nc.max()) >= 1 << 15:
        raise ValueError("more than 32767 clusters along M or N: no order table")
    return (mc | (nc << 16)).astype(np.int32)


def _waves(m, n, cfg, grid_clusters, order):
    """Every tile as four arrays: the wave that computes it (the work indices the grid's
    clusters hold at once), the CTA index in the grid, its row and its column of tiles.
    ``order``: ``(m, n)`` arrays of clusters by work index."""
    tiles_m, tiles_n = math.ceil(m / cfg.tile_m), math.ceil(n / cfg.tile_n)
    cm, cn = cfg.cluster_m, cfg.cluster_n
    mc, nc = order
    j = np.repeat(np.arange(len(mc)), cm * cn)
    rank = np.tile(np.arange(cm * cn), len(mc))
    tm, tn = np.repeat(mc, cm * cn) * cm + rank % cm, np.repeat(nc, cm * cn) * cn + rank // cm
    keep = (tm < tiles_m) & (tn < tiles_n)
    cta = (j % grid_clusters) * cm * cn + rank
    return (j // grid_clusters)[keep], cta[keep], tm[keep], tn[keep]


def l2_sectors(m, n, k, cfg, gpcs, order, elem_bytes: int = 2) -> int:
    """32-byte L2 sectors the GEMM asks for if the coalescer merges every read of one
    operand k-tile by the CTAs of one GPC in one wave (multicast within a cluster is such a
    merge too): distinct (wave, GPC, A row block) and (wave, GPC, B column block) pairs, by
    the box sizes and the k-tiles. ``gpcs``: GPC of each CTA index of the grid; ``order``:
    ``(m, n)`` arrays of clusters by work index (``band_order``, ``order_table``)."""
    grid_clusters = len(gpcs) // (cfg.cluster_m * cfg.cluster_n)
    wave, cta, tm, tn = _waves(m, n, cfg, grid_clusters, order)
    gpc = np.asarray(gpcs, dtype=np.int64)[cta]
    place = (wave * (gpc.max() + 1) + gpc) * (max(tm.max(), tn.max()) + 1)  # one key a pair
    readers_a, readers_b = len(np.unique(place + tm)), len(np.unique(place + tn))
    per_row = cfg.tile_k * elem_bytes // 32
    return (readers_a * cfg.tile_m + readers_b * cfg.tile_n) * per_row * -(-k // cfg.tile_k)


def dram_bytes(m, n, k, cfg, grid_clusters, order, l2_bytes: int,
               elem_bytes: int = 2) -> int:
    """Operand bytes read from DRAM if a wave finds in the L2 what the wave before it read
    (when that fitted in the L2) and nothing older: each wave's A row blocks and B column
    blocks (all of K) less the previous wave's. Ranks what the H200 measured: at 2048 x
    14336 x 4096, 134 MB for bands along M, 299 MB for the default band of 8 and 845 MB
    for a band of 1 along N (kernel 315 / 320 / 354 us); at 8192^3-like shapes the default
    band of 8 reads the least (386 MB against 648 for 4, 1172 for 1: 737 / 745 / 770 us)."""
    wave, _, tm, tn = _waves(m, n, cfg, grid_clusters, order)
    tiles_m = math.ceil(m / cfg.tile_m)
    waves = int(wave.max()) + 1 if len(wave) else 0
    read = np.zeros((waves, tiles_m + math.ceil(n / cfg.tile_n)), dtype=bool)
    read[wave, tm] = True  # A row blocks, then B column blocks
    read[wave, tiles_m + tn] = True
    rows = np.where(np.arange(read.shape[1]) < tiles_m, cfg.tile_m, cfg.tile_n)
    row_bytes = k * elem_bytes
    fits = np.concatenate([[False], read[:-1] @ rows * row_bytes <= l2_bytes])
    held = np.zeros_like(read)
    held[1:] = read[:-1] & fits[1:, None]
    return int(((read & ~held) @ rows).sum()) * row_bytes


def raster_candidates(m, n, cfg):
    """(band, along_m) pairs that pad no dimension (no phantom tiles)."""
    clusters_m, clusters_n = cluster_grid(m, n, cfg)
    for band in BANDS:
        for along_m in (True, False):
            if band == 1 or (clusters_n if along_m else clusters_m) % band == 0:
                yield band, along_m


def choose_raster(m, n, k, cfg, gpcs, l2_bytes: int, margin: float = 0.97):
    """``(band, along_m)``: the order with the fewest ``l2_sectors`` among those that read
    no more from DRAM (``dram_bytes``) than the default (``cfg``'s own); the default unless
    another is ``margin`` below it."""
    grid_clusters = len(gpcs) // (cfg.cluster_m * cfg.cluster_n)
    default = (cfg.raster_swizzle, cfg.raster_along_m)
    order = band_order(m, n, cfg, *default)
    limit = dram_bytes(m, n, k, cfg, grid_clusters, order, l2_bytes)
    best, best_sectors = default, l2_sectors(m, n, k, cfg, gpcs, order) * margin
    for raster in raster_candidates(m, n, cfg):
        order = band_order(m, n, cfg, *raster)
        if raster == default or dram_bytes(m, n, k, cfg, grid_clusters, order,
                                           l2_bytes) > limit:
            continue
        sectors = l2_sectors(m, n, k, cfg, gpcs, order)
        if sectors < best_sectors:
            best, best_sectors = raster, sectors
    return best
