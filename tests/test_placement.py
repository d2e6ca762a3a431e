"""The CTA placement model (``cutetma.tuning.placement``): the scheduler's order as the DSL
computes it, GPCs named from cluster launches, the L2-sector model, and the raster order it
picks on the H200's measured placement (benchmarks/results/sm_placement.json); and what
``cutetma.runtime.placement`` makes of it for ``cutetma.gemm``."""

import dataclasses
import json
from pathlib import Path

import pytest

from cutetma import GemmConfig, select_gemm_config
from cutetma.runtime import placement as runtime_placement
from cutetma.tuning import placement

RESULTS = Path(__file__).resolve().parent.parent / "benchmarks" / "results"


def _dsl_order(clusters_m, clusters_n, band, along_m):
    from cutetma import dsl

    cutlass, cute = dsl.cutlass()
    import cutlass.utils as utils

    coords = []

    @cute.jit
    def walk():
        params = utils.PersistentTileSchedulerParams((clusters_m, clusters_n, 1), (1, 1, 1),
                                                     band, along_m)
        layout = params.problem_layout_ncluster_mnl
        for i in cutlass.range_constexpr(cute.size(layout)):
            m, n, _ = layout.get_flat_coord(i)
            coords.append((int(m), int(n)))

    walk()
    return coords


@pytest.mark.parametrize("clusters_m,clusters_n,band,along_m", [
    (16, 4, 4, True), (8, 12, 4, True), (8, 12, 2, False), (32, 4, 8, False), (6, 8, 2, True),
])
@pytest.mark.filterwarnings("ignore:This static loop has")  # unrolled on purpose
def test_cluster_order_is_the_schedulers(clusters_m, clusters_n, band, along_m):
    """Bands of 2 and more: the scheduler's own layout, inverted on the host. (A band of 1
    takes the scheduler's divmod path: M first along M, N first otherwise.)"""
    def order(*args):
        return [(int(m), int(n)) for m, n in zip(*placement.cluster_order(*args), strict=True)]

    assert order(clusters_m, clusters_n, band, along_m) == _dsl_order(
        clusters_m, clusters_n, band, along_m)
    assert order(4, 3, 1, True)[:5] == [(0, 0), (1, 0), (2, 0), (3, 0), (0, 1)]
    assert order(4, 3, 1, False)[:4] == [(0, 0), (0, 1), (0, 2), (1, 0)]


def test_gpcs_are_named_by_the_clusters_that_share_them():
    # SMs 0-3 and 4-7 in two GPCs; a later cluster of 2 joins 8 to GPC of 4; 9 is never seen
    launches = [(4, [0, 1, 2, 3, 4, 5, 6, 7]), (2, [5, 8])]
    assert placement.gpcs_from_clusters(launches, 10) == [0, 0, 0, 0, 1, 1, 1, 1, 1, -1]


def test_l2_sectors_count_one_read_per_gpc_and_wave():
    """2 x 2 tiles of 128 x 128, K = 64 (one k-tile; a 128-row box is 512 sectors): on one
    GPC each of A's 2 row blocks and B's 2 column blocks is read once; on four GPCs each
    block twice, whatever the order."""
    cfg = GemmConfig(tile_m=128, tile_n=128)
    order = placement.band_order(256, 256, cfg, 1, True)
    box = 128 * 64 * 2 // 32
    assert placement.l2_sectors(256, 256, 64, cfg, (0, 0, 0, 0), order) == 4 * box
    assert placement.l2_sectors(256, 256, 64, cfg, (0, 1, 2, 3), order) == 8 * box
    # two GPCs: CTAs 0, 2 and 1, 3; M first puts A's blocks on both, B's on one each
    assert placement.l2_sectors(256, 256, 64, cfg, (0, 1, 0, 1), order) == 6 * box
    # two waves of a 2-CTA grid never merge across the waves
    assert placement.l2_sectors(256, 256, 64, cfg, (0, 0), order) == 6 * box


def _h200_gpcs(ctas: int, cluster: int = 1):
    """GPC of each of the first ``ctas`` CTAs of a full grid (a smaller grid's CTAs went to
    the same SMs as a full one's first)."""
    doc = json.loads((RESULTS / "sm_placement.json").read_text())
    gpc = placement.apart(doc["gpc_of_sm"])
    row = next(r for r in doc["rows"] if r["cluster"] == cluster and r["ctas"] == 132)
    return tuple(gpc[sm] for sm in row["sm"][:ctas])


@pytest.mark.parametrize("mnk,tile,default,chosen", [
    # one wave of 64 x 128: B's 32 readers per column block on few GPCs (measured 23.6 ->
    # 20.4 us, cuBLAS 19.7: gemm_raster_gpc_k5120.json)
    ((2048, 512, 5120), (64, 128), (4, True), (1, True)),
    # the default already has the fewest sectors (band 1 measured 17.8 -> 22.7 us)
    ((512, 1536, 5120), (64, 128), (4, True), (4, True)),
    # M = 2048, several waves: a band of 2 (band 1 and 2 both measured 1-2% faster)
    ((2048, 6144, 4096), (128, 256), (8, True), (2, True)),
    # 8192^3-like: bands of 1 and 4 read 3x / 1.7x as much from DRAM (measured 4% / 1%
    # slower): kept
    ((8192, 8192, 4096), (128, 256), (8, True), (8, True)),
])
def test_the_raster_order_chosen_on_the_h200s_placement(mnk, tile, default, chosen):
    m, n, k = mnk
    cfg = GemmConfig(tile_m=tile[0], tile_n=tile[1], raster_swizzle=default[0],
                     raster_along_m=default[1])
    clusters_m, clusters_n = placement.cluster_grid(m, n, cfg)
    gpcs = _h200_gpcs(min(clusters_m * clusters_n, 132))
    assert placement.choose_raster(m, n, k, cfg, gpcs, 50 << 20) == chosen


@pytest.mark.parametrize("mnk,tile,cluster,band,most", [
    ((8192, 8192, 4096), (128, 256), (1, 1), 8, 0.6),
    ((2048, 5120, 5120), (128, 320), (2, 1), 8, 0.65),
    ((1000, 3000, 64), (128, 128), (1, 2), 2, 0.8),
])
def test_order_table_deals_each_waves_tiles_to_compact_gpc_blocks(mnk, tile, cluster, band,
                                                                  most):
    """Every cluster exactly once, each wave the same clusters as the default band's (so
    DRAM sees no difference), packed as the kernel unpacks them; on the H200's placement
    the model's L2 sectors at most ``most`` of the band's."""
    import numpy as np

    m, n, k = mnk
    cfg = GemmConfig(tile_m=tile[0], tile_n=tile[1], cluster_m=cluster[0],
                     cluster_n=cluster[1], raster_swizzle=band, order_table=True)
    size = cluster[0] * cluster[1]
    clusters_m, clusters_n = placement.cluster_grid(m, n, cfg)
    gpcs = _h200_gpcs(min(clusters_m * clusters_n * size, 132 // size * size), size)
    grid = len(gpcs) // size
    band_m, band_n = placement.band_order(m, n, cfg, band, True)
    table_m, table_n = placement.order_table(m, n, cfg, gpcs)
    for first in range(0, len(band_m), grid):
        wave = slice(first, first + grid)
        assert sorted(zip(band_m[wave], band_n[wave], strict=True)) == sorted(
            zip(table_m[wave], table_n[wave], strict=True))
    packed = placement.pack((table_m, table_n))
    assert packed.dtype == np.int32
    assert ((packed & 0xFFFF) == table_m).all() and ((packed >> 16) == table_n).all()
    band_sectors = placement.l2_sectors(m, n, k, cfg, gpcs, (band_m, band_n))
    assert placement.l2_sectors(m, n, k, cfg, gpcs, (table_m, table_n)) < most * band_sectors


def test_placement_can_be_switched_off(monkeypatch):
    monkeypatch.setenv("CUTETMA_PLACEMENT", "0")
    assert not runtime_placement.enabled()
    monkeypatch.setenv("CUTETMA_PLACEMENT", "1")
    assert runtime_placement.enabled()
    with runtime_placement.switched_off():  # A/B benchmarks: the default order inside
        assert not runtime_placement.enabled()
    assert runtime_placement.enabled()
    monkeypatch.delenv("CUTETMA_PLACEMENT")
    with runtime_placement.switched_off():
        assert not runtime_placement.enabled()
    assert runtime_placement.enabled() and "CUTETMA_PLACEMENT" not in __import__("os").environ


def test_gemm_takes_the_chosen_order_once_per_shape(monkeypatch):
    """``runtime.placement.placed`` (what ``cutetma.gemm`` applies where no order table
    runs): the order ``choose_raster`` picks on the probed placement (here the H200's, no
    GPU), remembered per shape; split-K keeps its own order, and ``CUTETMA_PLACEMENT=0`` the
    default. ``ordered`` (the whole default) deals whole tiles from M = 256 from a table."""
    import types

    import torch

    probes = []

    def probed(size, ctas, device_index=0):
        probes.append(ctas)
        return _h200_gpcs(ctas, size)

    monkeypatch.setattr(runtime_placement, "cta_gpcs", probed)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda i: types.SimpleNamespace(L2_cache_size=50 << 20))
    cfg = select_gemm_config(2048, 512, 5120)
    assert (cfg.tile_m, cfg.tile_n, cfg.raster_swizzle, cfg.raster_along_m) == (64, 128, 4, True)
    # a grid of 131 clusters: a shape no other test places in this process
    for _ in range(2):
        placed = runtime_placement.placed(cfg, 2048, 512, 5120, 0, 131)
        assert (placed.raster_swizzle, placed.raster_along_m) == (1, True)
        assert dataclasses.replace(placed, raster_swizzle=4) == cfg  # nothing else changes
    assert probes == [128]  # 32 x 4 tiles: a grid of 128 CTAs, probed once
    split = GemmConfig(tile_m=64, tile_n=128, split_k=2)
    assert runtime_placement.placed(split, 2048, 512, 5120, 0, 131) is split
    table = runtime_placement.ordered(cfg, 2048, 512, 5120, 0, 131)
    assert table.order_table and dataclasses.replace(table, order_table=False) == cfg
    assert runtime_placement.ordered(split, 2048, 512, 5120, 0, 131) is split
    small = select_gemm_config(128, 4096, 4096)  # below M = 256: the placed band, no table
    assert not runtime_placement.ordered(small, 128, 4096, 4096, 0, 131).order_table
    monkeypatch.setenv("CUTETMA_PLACEMENT", "0")
    assert runtime_placement.placed(cfg, 2048, 512, 5120, 0, 131) is cfg
    assert runtime_placement.ordered(cfg, 2048, 512, 5120, 0, 131) is cfg
