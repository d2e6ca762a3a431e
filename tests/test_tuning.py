"""The GEMM's tuning on the host (``cutetma.tuning.gemm``): the H200 wave model and the
configurations ``select_gemm_config`` (what ``cutetma.gemm`` runs by itself) chooses for a
problem, each case a measurement on the H200. Pure functions: no GPU, no compile."""

import math

import pytest

from cutetma import GemmConfig, select_gemm_config
from cutetma.tuning import gemm as tuning


@pytest.fixture
def deterministic():
    """torch's ``use_deterministic_algorithms(True)`` inside the test, restored after."""
    import torch

    before = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True)
    yield torch
    torch.use_deterministic_algorithms(before, warn_only=warn_only)


def test_select_gemm_config_is_exported_at_the_top():
    import cutetma
    from cutetma import tuning as package

    assert cutetma.select_gemm_config is package.select_gemm_config is tuning.select_gemm_config
    assert isinstance(select_gemm_config(256, 256, 256), GemmConfig)


def test_raster_band_never_pads_the_grid():
    for n, tile_n, cluster_n in [(512, 128, 1), (1536, 256, 1), (8192, 256, 1), (7680, 256, 2),
                                 (1000, 128, 1), (17, 128, 2)]:
        band = tuning.raster_band(n, tile_n, cluster_n)
        clusters = math.ceil(math.ceil(n / tile_n) / cluster_n)
        assert band in (1, 2, 4, 8) and clusters % band == 0
    assert tuning.raster_band(8192, 256, 1) == 8


@pytest.mark.parametrize("mnk,tile,split", [
    ((512, 5120, 12288), (128, 256), 3),  # 80 tiles, 192 k-tiles: 240 units in 2 waves
    ((256, 10240, 8192), (128, 256), 3),  # 80 tiles, 128 k-tiles: won on the H200 too
    ((512, 5120, 5120), (128, 256), 1),   # 80 k-tiles: the hand-over eats the gain (lost)
    ((8192, 8192, 8192), (128, 256), 1),  # 1024 tiles, 0.97 of 8 waves: never
    ((256, 512, 448), (128, 128), 1),     # 7 k-tiles: too short to cut
])
def test_split_for_waves_follows_the_wave_model(mnk, tile, split):
    assert tuning.split_for_waves(*mnk, tile) == split
    tiles = -(-mnk[0] // tile[0]) * -(-mnk[1] // tile[1])
    assert tuning.wave_efficiency(mnk[0], mnk[1], tile) == tiles / (-(-tiles // 132) * 132)


@pytest.mark.parametrize("mnk,tile,split,split_sum", [
    # M > 64: the grid_time model; each case is a measured winner on the H200 (gemm.json,
    # gemm_narrow_every.json, 2026-11-30; gemm_small_outputs.json, 2026-12-01)
    ((256, 512, 5120), (64, 128), 8, "atomic"),    # 16 tiles x 8 slices: 0.95x cuBLAS
    ((512, 512, 5120), (64, 128), 4, "atomic"),    # 32 x 4 (128 x 128, 4 ordered: 0.78x)
    ((2048, 512, 5120), (64, 128), 1, "ordered"),  # 128 tiles: no hand-over at all
    # 64 x 128: 0.88x; 128 x 128 in 2 slices 0.80x; 64 x 96 in 128 tiles 0.965x (2026-12-02)
    ((512, 1536, 5120), (64, 96), 1, "ordered"),
    # 64 x 128: 0.87-0.91x; 128 x 128 in 4 slices 0.82-0.83x; 64 x 96 in 2: 0.90x alone,
    # 0.96x in (2, 1) clusters (test_fitted_64_row_tiles_and_their_multicast)
    ((256, 1536, 5120), (64, 96), 2, "ordered"),
    ((512, 5120, 5120), (128, 160), 1, "ordered"),  # 128 x 256: 80 tiles; 128 x 160: 128
    ((256, 12288, 5120), (128, 192), 1, "ordered"),  # 96 tiles of 128 x 256, 128 x 192: 128
    ((2048, 5120, 5120), (128, 160), 1, "ordered"),  # 2.4 waves of 128 x 256, 3.9 of x 160
    ((8192, 8192, 8192), (128, 256), 1, "ordered"),  # 1024 tiles: full waves, widest tile
    ((8192, 512, 5120), (128, 256), 1, "ordered"),   # 128 tiles: 64 x 128 lost there (0.7x)
    # M <= 64: split_k_for, 64 x 128 tiles
    ((16, 4096, 14336), (64, 128), 4, "atomic"),   # 32 tiles but K = 14336: won
    ((64, 6144, 4096), (64, 128), 1, "ordered"),   # 48 tiles, K = 4096: split-K lost there
    ((16, 512, 512), (64, 128), 1, "ordered"),     # 8 k-tiles: too short to cut
])
def test_automatic_split_k_follows_the_measurements(mnk, tile, split, split_sum):
    # one CTA per cluster: the (2, 1) multicast rules may take over some of these cells
    # (test_automatic_multicast_*, test_automatic_wide_multicast_*)
    cfg = select_gemm_config(*mnk, cluster=(1, 1))
    assert (cfg.tile_m, cfg.tile_n, cfg.split_k, cfg.split_sum) == (*tile, split, split_sum)


def test_split_sum_follows_the_hand_over_model_unless_asked_for_determinism(deterministic):
    """The atomic sum's hand-over stays flat as slices are added and the ordered one grows,
    so the automatic choice for 64-row tiles is atomic from 3 slices on; under
    ``torch.use_deterministic_algorithms(True)`` it is always ordered (the atomic sum's last
    bits depend on the slices' order). An explicit ``split_sum`` is kept: the selection is
    pure, and ``cutetma.gemm`` refuses an atomic sum under the deterministic mode when it is
    called (``test_gemm_gpu.py::test_deterministic_mode_refuses_the_atomic_sum``)."""
    torch = deterministic
    torch.use_deterministic_algorithms(False)
    assert tuning.hand_over(1) == tuning.hand_over(1, "atomic") == 0
    assert tuning.hand_over(2, "ordered") < tuning.hand_over(2, "atomic")
    assert all(tuning.hand_over(s, "atomic") < tuning.hand_over(s, "ordered")
               for s in range(3, 17))
    assert [tuning.split_sum_for(s) for s in (1, 2, 3, 8)] == ["ordered"] * 2 + ["atomic"] * 2
    assert tuning.split_sum_for(8, (128, 128)) == "ordered"  # 128-row tiles: no gain measured
    auto = select_gemm_config(16, 4096, 14336)
    explicit = select_gemm_config(16, 4096, 14336, split_k=4, split_sum="ordered")
    assert (auto.split_sum, explicit.split_sum) == ("atomic", "ordered")
    assert not tuning.deterministic_mode()
    torch.use_deterministic_algorithms(True)
    assert tuning.deterministic_mode()
    assert tuning.split_sum_for(8) == "ordered"
    cfg = select_gemm_config(16, 4096, 14336)
    assert cfg.split_k > 1 and cfg.split_sum == "ordered"
    asked = select_gemm_config(16, 4096, 14336, split_k=4, split_sum="atomic")
    assert (asked.split_k, asked.split_sum) == (4, "atomic")


def test_selection_is_pure_and_refuses_bad_options_every_time(deterministic):
    """The same arguments give an equal configuration (``cutetma.gemm`` remembers it per
    shape; torch's deterministic mode, which picks the split sum, is part of its key); an
    option the kernel cannot run fails with the check that names it, every time."""
    torch = deterministic
    torch.use_deterministic_algorithms(False)
    first = select_gemm_config(64, 4096, 14336)
    assert select_gemm_config(64, 4096, 14336) == first and first.split_sum == "atomic"
    assert hash(select_gemm_config(64, 4096, 14336)) == hash(first)
    torch.use_deterministic_algorithms(True)
    assert select_gemm_config(64, 4096, 14336).split_sum == "ordered"
    torch.use_deterministic_algorithms(False)
    assert select_gemm_config(64, 4096, 14336) == first
    for _ in range(2):
        with pytest.raises(ValueError, match="tile_n"):
            select_gemm_config(256, 256, 256, tile=(128, 100), split_k=1)
        with pytest.raises((TypeError, ValueError)):
            select_gemm_config(256, 256, 256, tile=128, split_k=1)
        with pytest.raises(ValueError, match="cluster"):  # multicast is a cluster now
            select_gemm_config(256, 256, 256, load="tma_multicast")
        with pytest.raises(ValueError, match="multicast"):
            select_gemm_config(256, 256, 256, load="cp_async", cluster=(2, 1))


@pytest.mark.parametrize("mnk,width", [
    # 2026-12-01 (gemm_fitted_m256_512.json, then the fp16 grid): the narrowest width with as
    # many waves as 128 x 256 won by 2-10% at M <= 512
    ((256, 14336, 4096), 224), ((512, 14336, 4096), 224), ((256, 28672, 8192), 224),
    ((512, 7680, 5120), 240),
    ((512, 8192, 8192), 256),    # 128 x 256 fills its one wave already
    ((2048, 14336, 4096), 256),  # M = 2048: such widths measured 0.97-0.99x, kept 256
    ((8192, 8192, 8192), 256),
])
def test_automatic_width_fits_the_waves(mnk, width):
    assert tuning.auto_tile_and_split(*mnk) == ((128, width), 1)
    cfg = select_gemm_config(*mnk)
    assert (cfg.tile_m, cfg.tile_n, cfg.cluster_m, cfg.cluster_n) == (128, width, 1, 1)


# what a caller may give that turns the automatic cluster off: cp.async, one CTA a cluster,
# a tile of its own
EXPLICIT = [dict(load="cp_async"), dict(cluster=(1, 1)), dict(tile=(128, 256))]


@pytest.mark.parametrize("mnk,shared", [
    # gemm_m256_clusters.json (H200, 2026-12-01): 128 x 128 tiles in (2, 1) clusters against
    # the automatic choice, each case the measured faster
    ((256, 8192, 8192), 128), ((256, 7680, 5120), 128),
    ((512, 4096, 4096), 128),                            # about one wave: won by 1-8%
    ((256, 12288, 5120), None), ((256, 10240, 8192), None),
    ((512, 5120, 5120), None), ((512, 6144, 4096), None),  # 1.2-1.5 waves: lost by 15-33%
    ((256, 14336, 4096), None), ((256, 28672, 8192), None),
    # gemm_fitted_m256_512.json (2026-12-01): the narrowest one-wave width, multicast, won
    # by 3-11% over the choice before (128 x 128 in (2, 1) clusters at 256 x 6144, 64 x 128 at
    # 256 x 4096 x 4096, 128 x 160 in two slices at N = 5120) and lost by 7.5% at K = 14336
    ((256, 6144, 4096), 96), ((256, 4096, 4096), 64), ((256, 5120, 5120), 80),
    ((256, 5120, 12288), 80), ((256, 5120, 16384), 80), ((256, 4096, 14336), None),
    ((384, 8192, 8192), None),   # 3 tile rows: a cluster would leave a CTA idle
    ((2048, 8192, 8192), None),  # beyond the measured M
])
def test_automatic_multicast_follows_the_measurements(mnk, shared):
    assert tuning.multicast_pays(*mnk) == (shared is not None)
    cfg = select_gemm_config(*mnk)
    assert ((cfg.cluster_m, cfg.cluster_n) == (2, 1)) == (shared is not None)
    if shared:
        assert (cfg.tile_m, cfg.tile_n, cfg.split_k) == (128, shared, 1) and cfg.store_under_mma
    for given in EXPLICIT:  # anything given: no cluster
        other = select_gemm_config(*mnk, **given)
        assert (other.cluster_m, other.cluster_n) == (1, 1), given


@pytest.mark.parametrize("mnk,tile,split,cluster", [
    # gemm_n1536_m*_ab_*.json (H200, 2026-12-02, 3 interleaved rounds, fp16 and bf16): 64 x 96
    # in 128 units against 64 x 128 in 96 (0.88-0.89x cuBLAS)
    ((512, 1536, 5120), (64, 96), 1, (1, 1)),  # 0.965x; in (2, 1) 0.94x (the table runs)
    ((256, 1536, 5120), (64, 96), 2, (2, 1)),  # 0.96x; alone 0.90x (no table: split K)
    ((200, 1536, 5000), (64, 96), 2, (2, 1)),  # 4 tile rows, the last partial: they pair up
    ((256, 512, 5120), (64, 128), 8, (1, 1)),  # 128 units: narrower would make two waves
    ((2048, 512, 5120), (64, 128), 1, (1, 1)),
])
def test_fitted_64_row_tiles_and_their_multicast(mnk, tile, split, cluster):
    m = mnk[0]
    assert tuning.auto_tile_and_split(*mnk) == (tile, split)
    cfg = select_gemm_config(*mnk)
    assert (cfg.tile_m, cfg.tile_n, cfg.split_k) == (*tile, split)
    assert (cfg.cluster_m, cfg.cluster_n) == cluster
    assert tuning.small_tile_cluster(m, tile, split) == (cluster == (2, 1))
    for given in EXPLICIT[:2]:  # no cluster unless automatic
        other = select_gemm_config(*mnk, **given)
        assert (other.tile_n, other.cluster_m, other.cluster_n) == (tile[1], 1, 1), given
    # the model's k-tile of the narrower tile sits below 64 x 128's, as measured
    assert tuning.k_tile_time((64, 96)) == pytest.approx(0.32)
    assert tuning.k_tile_time((64, 128)) == tuning.K_TILE_TIME[(64, 128)]


@pytest.mark.parametrize("mnk,wide", [
    # gemm_mirror_m2048.json (H200, 2026-12-02): cuBLAS's own 128 x 320 (2, 1) gained 2-8%
    # where 128 x 256 tiles fill the last wave badly, and lost where they fill it well
    ((2048, 5120, 5120), True), ((2048, 7680, 5120), True), ((2048, 5120, 16384), True),
    ((2048, 5120, 12288), True),
    ((2048, 28672, 8192), False), ((2048, 10240, 8192), False), ((4096, 4096, 4096), False),
    ((8192, 8192, 8192), False), ((8192, 14336, 4096), False),
    ((512, 5120, 5120), False),   # M = 256 / 512 have their own multicast rule
    ((2176, 5120, 5120), False),  # 17 tile rows: a cluster would leave a CTA idle
])
def test_automatic_wide_multicast_past_m_512(mnk, wide):
    assert tuning.wide_multicast_pays(*mnk) == wide
    cfg = select_gemm_config(*mnk)
    got = (cfg.tile_m, cfg.tile_n, cfg.cluster_m, cfg.cluster_n, cfg.split_k)
    assert (got == (128, 320, 2, 1, 1)) == wide
    if wide:  # past 256 columns: the serial epilogue; an N-major B keeps a narrower tile
        assert not cfg.store_under_mma
        other = select_gemm_config(*mnk, b_k_major=False)
        assert other.tile_n <= 256 and (other.cluster_m, other.cluster_n) == (1, 1)
    for given in EXPLICIT:  # anything given: as given
        other = select_gemm_config(*mnk, **given)
        assert (other.cluster_m, other.cluster_n) == (1, 1), given


@pytest.mark.parametrize("mnk,schedule", [
    ((512, 16384, 512), "pingpong"),     # 8 k-tiles: pingpong won 11 of 12 such cells
    ((8192, 32768, 512), "pingpong"),
    # M = 256 (four grids): ahead of the held-tile cooperative default in
    # 16 of 16 timings at K = 512, the best TMA configuration in 7 of 8 at 256 x 24576 x 1536
    ((256, 16384, 512), "pingpong"), ((256, 32768, 512), "pingpong"),
    ((256, 24576, 1536), "pingpong"),
    ((256, 4096, 512), "cooperative"),    # 64 tiles of 128 x 128: less than a wave
    ((256, 24576, 2048), "cooperative"),  # 32 k-tiles: not measured, not taken
    ((2048, 24576, 1536), "cooperative"),  # 24 k-tiles past M = 512: mostly lost
    ((512, 24576, 1536), "cooperative"),
    ((8192, 8192, 8192), "cooperative"),
])
def test_automatic_schedule_follows_the_measurements(mnk, schedule):
    cfg = select_gemm_config(*mnk)
    assert cfg.schedule == schedule
    if schedule == "pingpong":
        assert (cfg.tile_m, cfg.tile_n, cfg.split_k) == (128, 128, 1)
        # cp.async keeps the cooperative tiles: pingpong was measured with TMA only
        assert select_gemm_config(*mnk, load="cp_async").schedule == "cooperative"
    explicit = select_gemm_config(*mnk, schedule="cooperative")
    assert explicit.schedule == "cooperative"  # an explicit choice is kept


def test_store_under_mma_is_the_default_for_whole_cooperative_tiles():
    """``cutetma.gemm`` holds each whole cooperative tile and stores it under the next one's
    WGMMAs unless told not to; pingpong and K cuts keep their own epilogues; asking for it
    keeps K whole (no automatic split) and a contradiction is refused before any compile."""
    big = (8192, 8192, 8192)
    assert select_gemm_config(*big).store_under_mma
    assert select_gemm_config(*big, cluster=(2, 1)).store_under_mma
    assert select_gemm_config(*big, load="cp_async").store_under_mma
    assert not select_gemm_config(*big, store_under_mma=False).store_under_mma
    assert not select_gemm_config(8192, 32768, 512).store_under_mma  # pingpong by itself
    split = select_gemm_config(256, 512, 5120)
    assert split.split_k > 1 and not split.store_under_mma
    whole = select_gemm_config(256, 512, 5120, store_under_mma=True)
    assert whole.split_k == 1 and whole.store_under_mma
    with pytest.raises(ValueError, match="whole cooperative tiles"):
        select_gemm_config(256, 512, 5120, store_under_mma=True, split_k=2)


@pytest.mark.parametrize("given", [dict(tile=(128, 256)), dict(cluster=(2, 1)),
                                   dict(schedule="pingpong"), dict(split_k=1)], ids=str)
def test_automatic_split_k_stays_out_of_explicit_choices(given):
    assert select_gemm_config(256, 512, 5120, **given).split_k == 1


def test_stream_k_is_asked_for_never_chosen():
    """Stream-K (experimental, tutorial 09) runs only where asked for: whole cooperative
    tiles in clusters of one, K unsplit, no held-tile epilogue."""
    cfg = select_gemm_config(512, 5120, 5120, stream_k=True)
    assert cfg.stream_k and cfg.split_k == 1 and not cfg.store_under_mma
    assert (cfg.cluster_m, cfg.cluster_n, cfg.schedule) == (1, 1, "cooperative")
    assert not any(select_gemm_config(*mnk).stream_k
                   for mnk in [(512, 5120, 5120), (256, 512, 5120), (8192, 8192, 8192)])


def test_split_workspace_is_refused_before_it_would_fill_the_device():
    h200 = 141 * 2**30
    small = GemmConfig(tile_n=128, split_k=3)
    assert tuning.check_split_workspace(512, 1536, small, h200) == 48 * 3 * 128 * 128 * 4
    with pytest.raises(ValueError, match=r"split_k=8 on a 65536 x 65536 output needs a 128.0 GiB"):
        tuning.check_split_workspace(65536, 65536, GemmConfig(tile_n=128, split_k=8), h200)
    # the atomic sum keeps one slot per tile, whatever the slices
    atomic = GemmConfig(tile_n=128, split_k=8, split_sum="atomic")
    assert tuning.check_split_workspace(512, 1536, atomic, h200) == 48 * 128 * 128 * 4
    assert tuning.check_split_workspace(65536, 65536, atomic, h200) == 16 * 2**30
    cfg = select_gemm_config(256, 512, 5120, tile=(128, 128), split_k=4, split_sum="atomic")
    assert (cfg.split_k, cfg.split_sum) == (4, "atomic")
    whole = select_gemm_config(256, 512, 5120, tile=(128, 128), split_k=1, split_sum="atomic")
    assert whole.split_sum == "ordered"  # nothing to sum where K is whole


@pytest.mark.parametrize("tile_n", [288, 320, 384])
def test_tiles_wider_than_one_wgmma_keep_k_whole_and_need_b_k_major(tile_n):
    """``cutetma.gemm`` keeps the serial epilogue and K whole past 256 columns (the held tile
    would spill), and refuses, before launch, an N-major B (given as (K, N)) whose WGMMAs
    (half the tile each) would not read whole 64-column swizzle atoms."""
    auto = select_gemm_config(8192, 8192, 8192, tile=(128, tile_n))
    assert not auto.store_under_mma and auto.split_k == 1
    cfg = GemmConfig(tile_n=tile_n)
    tuning.check_tile_for_b(cfg, b_k_major=True)
    if tile_n == 384:
        tuning.check_tile_for_b(cfg, b_k_major=False)
    else:
        with pytest.raises(ValueError, match="multiple of 64"):
            tuning.check_tile_for_b(cfg, b_k_major=False)


def test_fit_width_is_the_narrowest_that_fills_the_waves():
    for (m, n, waves), width in {(256, 5120, 1): 80, (256, 6144, 1): 96, (256, 14336, 2): 112,
                                 (256, 8192, 1): 128, (512, 5120, 1): 160,
                                 (2048, 5120, 3): 224, (2048, 8192, 2): None}.items():
        assert tuning.fit_width(m, n, waves) == width, (m, n, waves)
        if width:
            tiles = -(-m // 128) * -(-n // width)
            assert tiles <= waves * 132 < -(-m // 128) * -(-n // (width - 16)) or width == 64


def test_order_table_is_the_default_for_whole_tiles_from_m_256():
    """``cutetma.gemm`` deals whole tiles from an order table from M = 256 (the sustained
    sweep at the cap: 35 of 36 cells faster at M = 2048 / 8192; an A/B at M = 256,
    13 / 14 of 15 cells faster), not split-K or stream-K units, not below M = 256 (untimed
    there), and not where a cluster coordinate would not fit the table's 16 bits."""
    pays = tuning.order_table_pays

    def cfg(m, n, k, **kw):
        return select_gemm_config(m, n, k, **kw)

    assert pays(8192, 8192, cfg(8192, 8192, 8192))
    assert pays(512, 4096, cfg(512, 4096, 4096))
    assert pays(2048, 16384, cfg(2048, 16384, 512))  # pingpong
    assert pays(256, 4096, cfg(256, 4096, 4096))
    assert not pays(255, 4096, cfg(255, 4096, 4096))
    assert not pays(128, 4096, cfg(128, 4096, 4096))
    split = cfg(512, 512, 5120)
    assert split.split_k > 1 and not pays(512, 512, split)
    assert not pays(8192, 8192, cfg(8192, 8192, 8192, stream_k=True))
    assert not pays(512, 128 * (1 << 15), GemmConfig(tile_n=128))
