"""The GEMM compiled for sm_90a on a CPU machine, every mechanism x dtype x cluster: WGMMA is
there, the producer issues what its mechanism says and nothing else."""

import dataclasses
import itertools
import math
import re
import shutil

import pytest

from cutetma import kernels
from cutetma.kernels.gemm_sm90 import GemmConfig

WGMMA = "wgmma.mma_async.sync.aligned"
BULK_LOAD = "cp.async.bulk.tensor.2d.shared::c"  # ::cta or ::cluster destination
MCAST = ".multicast::cluster"
CP_ASYNC = "cp.async.cg.shared.global"
STORE = "cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group"

CLUSTERS = [(1, 1), (2, 1), (1, 2), (2, 2)]


@pytest.mark.parametrize("dtype", ["Float16", "BFloat16"])
@pytest.mark.parametrize("cluster", CLUSTERS, ids=lambda c: f"cluster{c[0]}x{c[1]}")
def test_tma_variant(dtype, cluster):
    ptx = kernels.compile_gemm(GemmConfig(cluster_m=cluster[0], cluster_n=cluster[1]), dtype).ptx
    suffix = "f16.f16" if dtype == "Float16" else "bf16.bf16"
    assert f"{WGMMA}.m64n256k16.f32.{suffix}" in ptx
    assert BULK_LOAD in ptx and STORE in ptx and CP_ASYNC not in ptx
    assert re.search(r"setmaxnreg.dec.sync.aligned.u32\s+40;", ptx)
    assert re.search(r"setmaxnreg.inc.sync.aligned.u32\s+232;", ptx)
    assert (MCAST in ptx) == (cluster != (1, 1))
    if cluster == (2, 2):  # A and B both multicast: two multicast loads in the producer
        assert ptx.count(MCAST) >= 2


def test_clusters_of_eight_multicast_both_operands_in_quarters_and_halves():
    """cuBLAS's (2, 4) cluster of 64 x 64 tiles: each CTA issues a quarter of A's box and half
    of B's, both multicast; every stage's empty barrier counts the 4 consumer warps of each
    of the 2 + 4 - 1 CTAs that read it."""
    cfg = GemmConfig(tile_m=64, tile_n=64, cluster_m=2, cluster_n=4)
    ptx = kernels.compile_gemm(cfg, "Float16").ptx
    assert f"{WGMMA}.m64n64k16.f32.f16.f16" in ptx
    assert ptx.count(MCAST) >= 2 and "shared::cta.global" not in ptx  # no unshared load
    assert cfg.num_stages() == 13  # cuBLAS's kernel there: 64x64_64x13


def test_a_cluster_may_leave_an_operand_unshared():
    """``multicast_a=False``: a (2, 4) cluster whose row of four CTAs each load their own A
    (whole 64-row boxes, CTA-local) while the column pairs multicast halves of B; every
    stage's empty barrier then counts the consumer warps of the 2 CTAs that fill it."""
    cfg = GemmConfig(tile_m=64, tile_n=128, cluster_m=2, cluster_n=4, multicast_a=False)
    assert (cfg.a_sharers, cfg.b_sharers) == (1, 2)
    ptx = kernels.compile_gemm(cfg, "Float16").ptx
    loads = re.findall(r"cp\.async\.bulk\.tensor\.2d\.shared::\w+\.global\S*", ptx)
    assert [MCAST in op for op in loads] == [False, True]  # A from its own CTA, B shared
    with pytest.raises(ValueError, match="multicasts neither"):
        GemmConfig(cluster_m=1, cluster_n=2, multicast_a=False)


@pytest.mark.parametrize("load", ["tma", "cp_async"])
def test_order_table_is_read_a_work_unit_ahead(load):
    """``order_table``: each work unit's cluster comes from the table, loaded a unit ahead
    of its use: the first unit's entry once, at the top of the kernel (before the barriers
    are set up), then one load in the producer's loop and one in the consumers', both
    before the first WGMMA (the consumers' is issued before their mainloop, not after it,
    where it stalled the tensor cores between tiles). Under ``pdl`` the first load waits
    for the previous kernel. Without the table, no global load at all."""
    table_load = r"ld\.global(?:\.\w+)*\.[usb]32"

    def table_loads(ptx):
        return [m.start() for m in re.finditer(table_load, ptx)]

    cfg = GemmConfig(tile_m=64, tile_n=128, load=load, order_table=True)
    ptx = kernels.compile_gemm(cfg, "Float16").ptx
    loads = table_loads(ptx)
    assert len(loads) == 3
    assert loads[0] < ptx.index("mbarrier.init")
    assert loads[-1] < ptx.index(WGMMA)
    assert not table_loads(kernels.compile_gemm(GemmConfig(tile_m=64, tile_n=128, load=load),
                                                "Float16").ptx)
    pdl = kernels.compile_gemm(dataclasses.replace(cfg, pdl=True), "Float16").ptx
    assert pdl.index("griddepcontrol.wait;") < table_loads(pdl)[0]
    with pytest.raises(ValueError, match="order_table orders whole tiles"):
        GemmConfig(order_table=True, split_k=2)


@pytest.mark.parametrize("dtype", ["Float16", "BFloat16"])
def test_cp_async_variant(dtype):
    ptx = kernels.compile_gemm(GemmConfig(load="cp_async"), dtype).ptx
    assert WGMMA in ptx and CP_ASYNC in ptx
    assert "cp.async.mbarrier.arrive.noinc" in ptx
    assert BULK_LOAD not in ptx and MCAST not in ptx  # no TMA load at all
    assert STORE in ptx  # the same TMA-store epilogue


@pytest.mark.parametrize("load", ["tma", "cp_async"])
@pytest.mark.parametrize("tile", [(64, 128), (128, 160)])
def test_n_major_b_and_other_tiles(load, tile):
    ptx = kernels.compile_gemm(GemmConfig(tile_m=tile[0], tile_n=tile[1], load=load),
                               "Float16", b_k_major=False).ptx
    assert f"{WGMMA}.m64n{tile[1]}k16.f32.f16.f16" in ptx


@pytest.mark.parametrize("vectors,lines,shape", [
    (8, 128, (8, 16)),    # K-major, 64 of K: whole lines
    (32, 64, (32, 4)),    # N-major B, 256 wide
    # N-major B, 160 wide: whole lines left 48 threads idle, and they copied past the tile
    # (wrong results on the H200, 2026-11-30)
    (20, 64, (4, 32)),
    (24, 64, (8, 16)),    # N-major B, 192 wide
])
def test_cp_async_shares_every_tile_over_all_producer_threads(vectors, lines, shape):
    from cutetma.copy import cpasync

    along, at_once = cpasync.thread_shape(vectors, lines, 128)
    assert (along, at_once) == shape
    assert along * at_once == 128 and vectors % along == 0 and lines % at_once == 0


def test_cp_async_refuses_a_tile_that_leaves_threads_without_work():
    from cutetma import dsl
    from cutetma.copy import cpasync

    cutlass, _ = dsl.cutlass()
    with pytest.raises(ValueError, match="does not share out over 128 threads"):
        cpasync.tiled_copy(cutlass.Float16, 24, 8, 128, every_thread=True)


@pytest.mark.parametrize("load", ["tma", "cp_async"])
@pytest.mark.parametrize("tile_n", [80, 112, 176, 240])
def test_widths_in_steps_of_16(load, tile_n):
    """Tiles as wide as a shape needs to fill the SMs' waves (cuBLAS's own tiles on the H200
    are 80, 96, 112, 168, 176 wide, ``cublas_kernels.json``): one m64nNk16 WGMMA per
    warpgroup spans the width, and an odd multiple of 16 goes out in 16-column sub-tiles,
    one stmatrix and one TMA store each (a multiple of 32: 32-column ones, as before)."""
    cfg = GemmConfig(tile_n=tile_n, load=load)
    assert cfg.epi_n == (32 if tile_n % 32 == 0 else 16)
    ptx = kernels.compile_gemm(cfg, "Float16").ptx
    assert f"{WGMMA}.m64n{tile_n}k16.f32.f16.f16" in ptx
    assert ptx.count("stmatrix") == ptx.count(STORE) == tile_n // cfg.epi_n
    assert (BULK_LOAD in ptx) == (load == "tma") and (CP_ASYNC in ptx) == (load == "cp_async")
    assert GemmConfig(tile_n=96).epi_n == 32  # the widths measured before keep their stores


@pytest.mark.parametrize("load", ["tma", "cp_async"])
@pytest.mark.parametrize("tile_n", [288, 320, 384])
def test_tiles_wider_than_one_wgmma(load, tile_n):
    """Past 256 columns (one WGMMA's most) each consumer warpgroup issues two m64n(N/2)k16
    per k-step over its 64 rows, the two halves of the same A rows against two halves of B;
    a stage is then 52-64 KiB, so three fit (cuBLAS's 128 x 320 tile at 8192^3 has three),
    four at 288 beside two epilogue buffers instead of four (``epi_buffers``).
    ``cutetma.gemm`` keeps the serial epilogue for them (the held tile would spill)."""
    from cutetma import ops

    cfg = GemmConfig(tile_n=tile_n, load=load)
    assert cfg.mma_n == tile_n // 2
    assert (cfg.num_stages(), cfg.epi_buffers()) == ((4, 2) if tile_n == 288 else (3, 4))
    ptx = kernels.compile_gemm(cfg, "BFloat16").ptx
    wgmma = re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n(\d+)k16", ptx)
    assert set(wgmma) == {str(tile_n // 2)} and len(wgmma) == 2 * 4  # 2 halves x 4 k-steps
    assert ptx.count(STORE) == tile_n // 32
    auto = ops._gemm_config(8192, 8192, load, None, (128, tile_n), 132)
    assert not auto.store_under_mma and auto.split_k == 1
    # an N-major B (b given as (K, N)): its WGMMAs must read whole 64-column swizzle atoms
    ops.check_tile_for_b(cfg, b_k_major=True)
    if tile_n == 384:
        ops.check_tile_for_b(cfg, b_k_major=False)
        kernels.compile_gemm(cfg, "Float16", b_k_major=False)
    else:
        with pytest.raises(ValueError, match="multiple of 64"):
            ops.check_tile_for_b(cfg, b_k_major=False)


@pytest.mark.parametrize("load", ["tma", "cp_async"])
def test_pingpong_schedule(load):
    cfg = GemmConfig(tile_m=64, tile_n=256, load=load, schedule="pingpong")
    ptx = kernels.compile_gemm(cfg, "Float16").ptx
    assert f"{WGMMA}.m64n256k16.f32.f16.f16" in ptx
    # the turn barriers: one warpgroup arrives, the other waits (bar.sync id, 256 threads)
    assert re.search(r"bar\.arrive\s+\S+,\s*256;", ptx) or "barrier.arrive" in ptx


@pytest.mark.parametrize("out", ["Float32", "BFloat16"])
def test_output_dtypes(out):
    ptx = kernels.compile_gemm(GemmConfig(tile_n=128), "Float16", out).ptx
    assert WGMMA in ptx and STORE in ptx


@pytest.mark.parametrize("kwargs,match", [
    (dict(tile_m=256), "tile_m"), (dict(tile_n=72), "tile_n"), (dict(tile_n=400), "tile_n"),
    (dict(tile_n=48), "tile_n"), (dict(tile_n=160, epi_n=64), "epi_n"),
    (dict(tile_n=80, epi_n=32), "epi_n"), (dict(tile_k=32), "tile_k"),
    (dict(tile_n=320, store_under_mma=True), "serial epilogue"),
    (dict(tile_n=320, split_k=2), "K whole"),
    (dict(cluster_m=8), "cluster"), (dict(cluster_m=4, cluster_n=4), "at most 8"),
    (dict(cluster_n=3), "cluster"), (dict(tile_n=80, cluster_m=4), "swizzle atoms"),
    (dict(tile_m=64, tile_n=64, cluster_n=16), "cluster"),
    (dict(load="cp_async", cluster_n=2), "multicast"),
    (dict(load="bulk"), "load="), (dict(schedule="pingpong"), "at most 128x128"),
    (dict(store_under_mma=True, split_k=2), "whole cooperative tiles"),
    (dict(split_sum="tree", split_k=2), "split_sum"), (dict(split_sum="atomic"), "split_k > 1"),
    (dict(store_under_mma=True, tile_n=128, schedule="pingpong"), "whole cooperative tiles"),
])
def test_config_refuses(kwargs, match):
    with pytest.raises(ValueError, match=match):
        GemmConfig(**kwargs)


def test_custom_op_fake_shapes():
    import torch

    import cutetma.ops  # noqa: F401  (registers cutetma::gemm)

    a = torch.empty(100, 64, dtype=torch.float16, device="meta")
    b = torch.empty(48, 64, dtype=torch.float16, device="meta")
    c = torch.ops.cutetma.gemm(a, b, True, "tma", torch.float32)
    assert c.shape == (100, 48) and c.dtype == torch.float32
    c2 = torch.ops.cutetma.gemm(a, b.T.contiguous(), False, "tma", torch.float16)
    assert c2.shape == (100, 48)


@pytest.mark.parametrize("stages,match", [(1, "at least 2"), (9, "do not fit")])
def test_stage_count_is_checked(stages, match):
    with pytest.raises(ValueError, match=match):
        GemmConfig(stages=stages).num_stages()


def test_default_stages_fill_shared_memory():
    cfg = GemmConfig()  # 128x256: 48 KiB a stage beside a 32 KiB epilogue
    assert cfg.num_stages() == 4
    assert GemmConfig(tile_n=128).num_stages() == 6


def test_epilogue_gives_up_two_buffers_only_for_a_stage():
    """Two epilogue buffers instead of four only where the freed shared memory holds one
    more mainloop stage of a pipeline under 8 deep (128 x 96: 6 -> 7, 128 x 192: 4 -> 5,
    fp32 C at 128 x 256: 3 -> 4; not 64 x 128's 8 -> 9); pingpong and an explicit
    ``epi_stages`` keep theirs; explicit ``stages`` that need the room get it."""
    assert (GemmConfig(tile_n=96).epi_buffers(), GemmConfig(tile_n=96).num_stages()) == (2, 7)
    assert (GemmConfig(tile_n=192).epi_buffers(), GemmConfig(tile_n=192).num_stages()) == (2, 5)
    for width in (128, 160, 256):
        assert GemmConfig(tile_n=width).epi_buffers() == 4
    assert (GemmConfig().epi_buffers(4), GemmConfig().num_stages(4)) == (2, 4)
    assert GemmConfig(tile_n=96, epi_stages=4).num_stages() == 6
    assert GemmConfig(tile_n=128, schedule="pingpong").epi_buffers() == 4
    assert GemmConfig(tile_m=64, tile_n=128).epi_buffers() == 4
    assert GemmConfig(tile_n=96, stages=7).epi_buffers() == 2
    assert GemmConfig(tile_n=96, stages=6).epi_buffers() == 4
    with pytest.raises(ValueError, match="even"):
        GemmConfig(tile_n=128, schedule="pingpong", epi_stages=1)


def test_raster_band_never_pads_the_grid():
    from cutetma.ops import raster_band

    for n, tile_n, cluster_n in [(512, 128, 1), (1536, 256, 1), (8192, 256, 1), (7680, 256, 2),
                                 (1000, 128, 1), (17, 128, 2)]:
        band = raster_band(n, tile_n, cluster_n)
        clusters = math.ceil(math.ceil(n / tile_n) / cluster_n)
        assert band in (1, 2, 4, 8) and clusters % band == 0
    assert raster_band(8192, 256, 1) == 8


@pytest.mark.parametrize("load", ["tma", "cp_async"])
def test_split_k_reduces_in_the_kernel_by_ticket(load):
    """Each slice stores its partial (16-byte vectors), one thread takes a ticket (acq_rel
    atomic), the last slice sums the partials and stores C through the usual TMA
    epilogue: nothing is left for a second kernel."""
    cfg = GemmConfig(tile_n=128, load=load, split_k=3)
    ptx = kernels.compile_gemm(cfg, "Float16").ptx
    assert WGMMA in ptx and STORE in ptx
    assert "atom.global.acq_rel.add" in ptx and "fence.acq_rel.gpu" in ptx
    assert "st.global.v4.b32" in ptx and "ld.global.v4.b32" in ptx


@pytest.mark.parametrize("split", [2, 3])
def test_split_k_sums_every_slot_in_one_block(split):
    """The last slice sums all ``split`` slots (its own included) with no branch between the
    loads, so they can be in flight together and the sum does not depend on which slice
    came last. Skipping the own slot (until 2026-11-30) put each other slice's loads behind
    a branch of its own."""
    cfg = GemmConfig(tile_n=128, split_k=split)
    lines = kernels.compile_gemm(cfg, "Float16").ptx.splitlines()
    loads = [i for i, line in enumerate(lines) if "ld.global.v4.b32" in line]
    per_slot = 128 * 128 // (2 * 128) // 4  # fp32 values per consumer thread, 4 a load
    assert len(loads) == split * per_slot
    between = lines[loads[0]:loads[-1]]
    assert not any(re.match(r"\s*(@%p\d+\s+)?bra", line) for line in between)
    assert not any(line.strip().endswith(":") for line in between)  # no label: one block


@pytest.mark.parametrize("split", [2, 4])
def test_atomic_split_sum_adds_in_l2_and_reads_one_tile(split):
    """``split_sum="atomic"``: each slice adds its partial into the tile's one slot with
    16-byte vector atomics (nothing stored, nothing read back), and the last slice reads that
    one slot and writes zeros in its place, however many slices there are; the ordered sum
    has no atomics but the ticket."""
    per_thread = 128 * 128 // (2 * 128) // 4  # 16-byte vectors of a consumer thread's tile
    ptx = kernels.compile_gemm(GemmConfig(tile_n=128, split_k=split, split_sum="atomic"),
                               "Float16").ptx
    zero_stores = r"st\.global\.v4\.b32\s+\[[^\]]+\], \{0f00000000"
    assert ptx.count("red.relaxed.gpu.global.add.v4.f32") == per_thread
    assert ptx.count("ld.global.v4.b32") == per_thread
    assert len(re.findall(zero_stores, ptx)) == per_thread
    assert "atom.global.acq_rel.add" in ptx and "fence.acq_rel.gpu" in ptx
    ordered = kernels.compile_gemm(GemmConfig(tile_n=128, split_k=split), "Float16").ptx
    assert "red.relaxed" not in ordered and not re.search(zero_stores, ordered)
    assert ordered.count("ld.global.v4.b32") == split * per_thread


def test_split_k_leaves_the_unsplit_kernel_alone():
    """split_k=1 must compile to the kernel validated on the H200 (no workspace traffic)."""
    ptx = kernels.compile_gemm(GemmConfig(tile_n=128), "Float16").ptx
    assert "atom.global" not in ptx and "ld.global.v4" not in ptx


@pytest.mark.parametrize("mnk,tile,split", [
    ((512, 5120, 12288), (128, 256), 3),  # 80 tiles, 192 k-tiles: 240 units in 2 waves
    ((256, 10240, 8192), (128, 256), 3),  # 80 tiles, 128 k-tiles: won on the H200 too
    ((512, 5120, 5120), (128, 256), 1),   # 80 k-tiles: the hand-over eats the gain (lost)
    ((8192, 8192, 8192), (128, 256), 1),  # 1024 tiles, 0.97 of 8 waves: never
    ((256, 512, 448), (128, 128), 1),     # 7 k-tiles: too short to cut
])
def test_split_for_waves_follows_the_wave_model(mnk, tile, split):
    from cutetma import ops

    assert ops.split_for_waves(*mnk, tile) == split
    tiles = -(-mnk[0] // tile[0]) * -(-mnk[1] // tile[1])
    assert ops.wave_efficiency(mnk[0], mnk[1], tile) == tiles / (-(-tiles // 132) * 132)


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
    from cutetma import ops

    m, n, k = mnk
    # one CTA per cluster: the (2, 1) multicast rules may take over some of these cells
    # (test_automatic_multicast_*, test_automatic_wide_multicast_*)
    cfg = ops._gemm_config(m, n, "tma", (1, 1), None, 132, split_k=None, k=k)
    assert (cfg.tile_m, cfg.tile_n, cfg.split_k, cfg.split_sum) == (*tile, split, split_sum)


def test_split_sum_follows_the_hand_over_model_unless_asked_for_determinism():
    """The atomic sum's hand-over stays flat as slices are added and the ordered one grows,
    so the automatic choice for 64-row tiles is atomic from 3 slices on; under
    ``torch.use_deterministic_algorithms(True)`` it is always ordered (the atomic sum's last
    bits depend on the slices' order) and an explicit ``"atomic"`` is refused (a warning with
    ``warn_only``), as torch's own nondeterministic ops are; otherwise an explicit
    ``split_sum`` is kept."""
    import torch

    from cutetma import ops

    assert ops.hand_over(1) == ops.hand_over(1, "atomic") == 0
    assert ops.hand_over(2, "ordered") < ops.hand_over(2, "atomic")
    assert all(ops.hand_over(s, "atomic") < ops.hand_over(s, "ordered") for s in range(3, 17))
    assert [ops.split_sum_for(s) for s in (1, 2, 3, 8)] == ["ordered"] * 2 + ["atomic"] * 2
    assert ops.split_sum_for(8, (128, 128)) == "ordered"  # 128-row tiles: measured no gain
    auto = ops._gemm_config(16, 4096, "tma", None, None, 132, split_k=None, k=14336)
    explicit = ops._gemm_config(16, 4096, "tma", None, None, 132, split_k=4, k=14336,
                                split_sum="ordered")
    assert (auto.split_sum, explicit.split_sum) == ("atomic", "ordered")
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        assert ops.split_sum_for(8) == "ordered"
        cfg = ops._gemm_config(16, 4096, "tma", None, None, 132, split_k=None, k=14336)
        assert cfg.split_k > 1 and cfg.split_sum == "ordered"
        with pytest.raises(RuntimeError, match="split_sum='ordered'"):  # as torch's own ops
            ops._gemm_config(16, 4096, "tma", None, None, 132, split_k=4, k=14336,
                             split_sum="atomic")
        torch.use_deterministic_algorithms(True, warn_only=True)
        with pytest.warns(UserWarning, match="not deterministic"):
            ops._gemm_config(16, 4096, "tma", None, None, 132, split_k=4, k=14336,
                             split_sum="atomic")
    finally:
        torch.use_deterministic_algorithms(before)


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
    from cutetma import ops

    m, n, k = mnk
    assert ops.auto_tile_and_split(m, n, k) == ((128, width), 1)
    cfg = ops._gemm_config(m, n, "tma", None, None, 132, split_k=None, k=k)
    assert (cfg.tile_m, cfg.tile_n, cfg.cluster_m, cfg.cluster_n) == (128, width, 1, 1)


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
    from cutetma import ops

    m, n, k = mnk
    assert ops.multicast_pays(m, n, k) == (shared is not None)
    cfg = ops._gemm_config(m, n, "tma", None, None, 132, split_k=None, k=k)
    assert ((cfg.cluster_m, cfg.cluster_n) == (2, 1)) == (shared is not None)
    if shared:
        assert (cfg.tile_m, cfg.tile_n, cfg.split_k) == (128, shared, 1) and cfg.store_under_mma
    for load, cluster, tile in (("cp_async", None, None), ("tma", (1, 1), None),
                                ("tma", None, (128, 256))):  # anything given: no cluster
        other = ops._gemm_config(m, n, load, cluster, tile, 132, split_k=None, k=k)
        assert (other.cluster_m, other.cluster_n) == (1, 1)


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
    from cutetma import ops

    m, n, k = mnk
    assert ops.auto_tile_and_split(m, n, k) == (tile, split)
    cfg = ops._gemm_config(m, n, "tma", None, None, 132, split_k=None, k=k)
    assert (cfg.tile_m, cfg.tile_n, cfg.split_k) == (*tile, split)
    assert (cfg.cluster_m, cfg.cluster_n) == cluster
    assert ops.small_tile_cluster(m, tile, split) == (cluster == (2, 1))
    for load, given in (("cp_async", None), ("tma", (1, 1))):  # no cluster unless automatic
        other = ops._gemm_config(m, n, load, given, None, 132, split_k=None, k=k)
        assert (other.tile_n, other.cluster_m, other.cluster_n) == (tile[1], 1, 1)
    # the model's k-tile of the narrower tile sits below 64 x 128's, as measured
    assert ops.k_tile_time((64, 96)) == pytest.approx(0.32)
    assert ops.k_tile_time((64, 128)) == ops.K_TILE_TIME[(64, 128)]


@pytest.mark.parametrize("mnk", [(256, 1536, 5120), (208, 432, 3000)])
def test_fitted_64_row_tiles_compile_with_their_multicast(mnk):
    """The automatic 64-row tiles narrower than 128, K split in (2, 1) clusters: one
    m64nWk16 WGMMA per k-step, B multicast, the slices summed in the kernel (ordered at two
    slices, atomic at eight)."""
    from cutetma import ops

    cfg = ops._gemm_config(*mnk[:2], "tma", None, None, 132, split_k=None, k=mnk[2])
    assert cfg.cluster_m == 2 and cfg.split_k > 1 and cfg.tile_n < 128
    ptx = kernels.compile_gemm(cfg, "BFloat16").ptx
    assert f"{WGMMA}.m64n{cfg.tile_n}k16.f32.bf16.bf16" in ptx
    assert MCAST in ptx and "atom.global.acq_rel.add" in ptx
    assert ("red.relaxed.gpu.global.add.v4.f32" in ptx) == (cfg.split_sum == "atomic")


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
    from cutetma import ops

    m, n, k = mnk
    assert ops.wide_multicast_pays(m, n, k) == wide
    cfg = ops._gemm_config(m, n, "tma", None, None, 132, split_k=None, k=k)
    got = (cfg.tile_m, cfg.tile_n, cfg.cluster_m, cfg.cluster_n, cfg.split_k)
    assert (got == (128, 320, 2, 1, 1)) == wide
    if wide:  # past 256 columns: the serial epilogue; an N-major B keeps a narrower tile
        assert not cfg.store_under_mma
        other = ops._gemm_config(m, n, "tma", None, None, 132, split_k=None, k=k,
                                 b_k_major=False)
        assert other.tile_n <= 256 and (other.cluster_m, other.cluster_n) == (1, 1)
    for load, cluster, tile in (("cp_async", None, None), ("tma", (1, 1), None),
                                ("tma", None, (128, 256))):  # anything given: as given
        other = ops._gemm_config(m, n, load, cluster, tile, 132, split_k=None, k=k)
        assert (other.cluster_m, other.cluster_n) == (1, 1)


@pytest.mark.parametrize("mnk,schedule", [
    ((512, 16384, 512), "pingpong"),     # 8 k-tiles: pingpong won 11 of 12 such cells
    ((8192, 32768, 512), "pingpong"),
    # M = 256 (four grids since session 12): ahead of the held-tile cooperative default in
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
    from cutetma import ops

    m, n, k = mnk
    cfg = ops._gemm_config(m, n, "tma", None, None, 132, split_k=None, k=k)
    assert cfg.schedule == schedule
    if schedule == "pingpong":
        assert (cfg.tile_m, cfg.tile_n, cfg.split_k) == (128, 128, 1)
    explicit = ops._gemm_config(m, n, "tma", None, None, 132, schedule="cooperative",
                                split_k=None, k=k)
    assert explicit.schedule == "cooperative"  # an explicit choice is kept


def test_store_under_mma_is_the_default_for_whole_cooperative_tiles():
    """``cutetma.gemm`` holds each whole cooperative tile and stores it under the next one's
    WGMMAs unless told not to; pingpong and K cuts keep their own epilogues; asking for it
    keeps K whole (no automatic split) and a contradiction is refused before any compile."""
    from cutetma import ops

    def cfg(m, n, k, **kwargs):
        args = dict(load="tma", cluster=None, tile=None, split_k=None) | kwargs
        return ops._gemm_config(m, n, args.pop("load"), args.pop("cluster"), args.pop("tile"),
                                132, k=k, **args)

    assert cfg(8192, 8192, 8192).store_under_mma
    assert cfg(8192, 8192, 8192, load="tma_multicast").store_under_mma
    assert cfg(8192, 8192, 8192, load="cp_async").store_under_mma
    assert not cfg(8192, 8192, 8192, store_under_mma=False).store_under_mma
    assert not cfg(8192, 32768, 512).store_under_mma  # pingpong by itself there
    split = cfg(256, 512, 5120)
    assert split.split_k > 1 and not split.store_under_mma
    whole = cfg(256, 512, 5120, store_under_mma=True)
    assert whole.split_k == 1 and whole.store_under_mma
    with pytest.raises(ValueError, match="whole cooperative tiles"):
        cfg(256, 512, 5120, store_under_mma=True, split_k=2)


def test_automatic_split_k_stays_out_of_explicit_choices():
    from cutetma import ops

    m, n, k = 256, 512, 5120
    for kwargs in (dict(tile=(128, 256)), dict(cluster=(2, 1)), dict(schedule="pingpong"),
                   dict(split_k=1)):
        args = dict(load="tma", cluster=None, tile=None, split_k=None) | kwargs
        cfg = ops._gemm_config(m, n, args.pop("load"), args.pop("cluster"), args.pop("tile"),
                               132, k=k, **args)
        assert cfg.split_k == 1, kwargs


@pytest.mark.parametrize("c_dtype", ["Float16", "Float32"])  # stmatrix / the fp32 store op
@pytest.mark.parametrize("tile_m,tile_n,warpgroups", [
    (128, 256, 2), (128, 128, 2), (64, 256, 1), (64, 128, 1),  # validated on the H200
    (128, 128, 1), (128, 256, 1),  # one warpgroup, two 64-row WGMMA blocks (pingpong 128)
    (128, 160, 2), (128, 192, 2),  # the widths that fit a shape's tiles to the SMs
    (128, 80, 2), (128, 176, 2),  # odd multiples of 16: 16-column sub-tiles
    (128, 320, 2),  # two m64n160 WGMMAs per warpgroup and k-step
])
def test_epilogue_takes_each_accumulator_value_to_its_place(c_dtype, tile_m, tile_n,
                                                            warpgroups):
    """For every consumer thread and epilogue sub-tile, the value the epilogue puts at each
    fragment position (``epilogue_order``) is the accumulator element with the (row, col)
    the register-to-shared copy stores from there. Checked on identity tensors on the host;
    the order was derived from thread 0 only, so this also checks that it holds for the
    others: every lane of warp 0 and one lane of every other warp (every thread of every
    warpgroup took 7 minutes on the host; the pattern repeats per warp)."""
    from cutetma import dsl
    from cutetma.kernels.gemm_sm90 import epilogue_copy, epilogue_order, make_tiled_mma

    cutlass, cute = dsl.cutlass()
    from cutlass.tensor_utils import LayoutEnum

    epi_n = GemmConfig(tile_n=tile_n).epi_n  # 32, or 16 for an odd multiple of 16

    def build():
        row = LayoutEnum.ROW_MAJOR
        mma = make_tiled_mma(cutlass.Float16, row, row, warpgroups, tile_n)
        r2s = epilogue_copy(mma, row, getattr(cutlass, c_dtype))
        order = epilogue_order(mma, r2s, (tile_m, tile_n), epi_n)
        ids_acc = cute.make_identity_tensor((tile_m, tile_n))
        ids_sub = cute.make_identity_tensor((tile_m, epi_n))
        wrong = checked = 0
        threads = list(range(32)) + [32 * w + (7 * w) % 32 for w in range(1, 4 * warpgroups)]
        for t in threads:
            acc = r2s.retile(mma.get_slice(t).partition_C(ids_acc))
            sub = r2s.get_slice(t).partition_S(ids_sub)
            for e, positions in enumerate(order):
                for i, j in enumerate(positions):
                    want = (sub[i][0], sub[i][1] + e * epi_n)
                    wrong += (acc[j][0], acc[j][1]) != want
                    checked += 1
        return wrong, checked

    wrong, checked = dsl.on_host(build)
    assert checked == tile_m * tile_n * (32 + 4 * warpgroups - 1) // (128 * warpgroups)
    assert wrong == 0


def test_flat_epilogue_indexing_is_what_broke_pingpong_128():
    """The old ``e * size(frag) + i`` agrees with ``epilogue_order`` exactly where it was
    right on the H200 (one 64-row WGMMA block per warpgroup), and not for 128-row pingpong."""
    from cutetma import dsl
    from cutetma.kernels.gemm_sm90 import epilogue_copy, epilogue_order, make_tiled_mma

    cutlass, _ = dsl.cutlass()
    from cutlass.tensor_utils import LayoutEnum

    def flat_agrees(tile_m, warpgroups):
        def build():
            row = LayoutEnum.ROW_MAJOR
            mma = make_tiled_mma(cutlass.Float16, row, row, warpgroups, 128)
            order = epilogue_order(mma, epilogue_copy(mma, row, cutlass.Float16),
                                   (tile_m, 128), 32)
            return all(j == e * len(p) + i for e, p in enumerate(order) for i, j in enumerate(p))
        return dsl.on_host(build)

    assert flat_agrees(128, 2) and flat_agrees(64, 1)
    assert not flat_agrees(128, 1)


@pytest.mark.parametrize("tiles,k_tiles", [(80, 128), (320, 80), (160, 80), (264, 64), (4, 80),
                                           (133, 10), (1, 1), (200, 3), (561, 65)])
def test_stream_k_units_cover_every_k_tile_once(tiles, k_tiles, ctas=132):
    """The host run of the kernel's own arithmetic: every (tile, k-tile) in exactly one unit,
    at most one partial per CTA (its workspace slot), each owner's peers exactly the other
    CTAs of its tile and all after it (so no wait cycle), and the work even to one k-tile."""
    from cutetma.kernels.gemm_sm90 import stream_k_unit

    owner_of, units_of = {}, {}
    for cta in range(ctas):
        units_of[cta] = []
        for j in itertools.count():
            unit = stream_k_unit(j, cta, ctas, tiles, k_tiles)
            if not unit[3]:
                break
            units_of[cta].append(unit)
            tile, k0, kn = unit[:3]
            assert kn > 0 and 0 <= k0 and k0 + kn <= k_tiles
            for k in range(k0, k0 + kn):
                assert (tile, k) not in owner_of
                owner_of[(tile, k)] = cta
        assert sum(unit[4] for unit in units_of[cta]) <= 1
    assert set(owner_of) == set(itertools.product(range(tiles), range(k_tiles)))
    for cta, units in units_of.items():
        for tile, _, _, _, writer, first_peer, peers in units:
            if not writer:
                others = sorted({owner_of[(tile, k)] for k in range(k_tiles)} - {cta})
                assert others == list(range(first_peer, first_peer + peers))
                assert all(other > cta for other in others)
    work = [sum(unit[2] for unit in units) for units in units_of.values()]
    assert max(work) == -(-tiles * k_tiles // ctas)  # no CTA has more than its even share


@pytest.mark.parametrize("load", ["tma", "cp_async"])
def test_stream_k_hands_partials_over_with_release_and_acquire(load):
    ptx = kernels.compile_gemm(GemmConfig(tile_n=128, load=load, stream_k=True), "Float16").ptx
    assert WGMMA in ptx
    assert ("cp.async.bulk.tensor.2d" if load == "tma" else "cp.async.cg.shared.global") in ptx
    assert "fence.acq_rel.gpu" in ptx and "st.release.gpu.global.b32" in ptx
    assert "ld.acquire.gpu.global.b32" in ptx
    assert "st.global.v4.b32" in ptx and "ld.global.v4.b32" in ptx  # 16-byte partials


def test_stream_k_refuses_what_it_does_not_run():
    for bad in (dict(schedule="pingpong", tile_n=128), dict(cluster_m=2), dict(split_k=2)):
        with pytest.raises(ValueError, match="stream_k"):
            GemmConfig(stream_k=True, **bad)


def test_split_workspace_is_refused_before_it_would_fill_the_device():
    from cutetma import ops

    h200 = 141 * 2**30
    small = GemmConfig(tile_n=128, split_k=3)
    assert ops.check_split_workspace(512, 1536, small, h200) == 48 * 3 * 128 * 128 * 4
    with pytest.raises(ValueError, match=r"split_k=8 on a 65536 x 65536 output needs a 128.0 GiB"):
        ops.check_split_workspace(65536, 65536, GemmConfig(tile_n=128, split_k=8), h200)
    # the atomic sum keeps one slot per tile, whatever the slices
    atomic = GemmConfig(tile_n=128, split_k=8, split_sum="atomic")
    assert ops.check_split_workspace(512, 1536, atomic, h200) == 48 * 128 * 128 * 4
    assert ops.check_split_workspace(65536, 65536, atomic, h200) == 16 * 2**30
    cfg = ops._gemm_config(256, 512, "tma", None, (128, 128), 132, split_k=4, k=5120,
                           split_sum="atomic")
    assert (cfg.split_k, cfg.split_sum) == (4, "atomic")
    whole = ops._gemm_config(256, 512, "tma", None, (128, 128), 132, split_k=1, k=5120,
                             split_sum="atomic")
    assert whole.split_sum == "ordered"  # nothing to sum where K is whole


@pytest.mark.skipif(shutil.which("ptxas") is None, reason="needs ptxas (CUDA toolkit)")
@pytest.mark.parametrize("cfg", [
    GemmConfig(), GemmConfig(tile_n=128), GemmConfig(split_k=3), GemmConfig(stream_k=True),
    GemmConfig(load="cp_async"), GemmConfig(tile_m=64, schedule="pingpong"),
    GemmConfig(tile_n=128, schedule="pingpong"),
    GemmConfig(tile_n=128, schedule="pingpong", load="cp_async"),
    GemmConfig(tile_n=160), GemmConfig(tile_n=192, cluster_m=2),
    GemmConfig(tile_n=160, load="cp_async"), GemmConfig(store_under_mma=True),
    GemmConfig(tile_n=128, split_k=4, split_sum="atomic"),
    GemmConfig(store_under_mma=True, load="cp_async", tile_n=160),
    # widths in steps of 16 (2026-12-01): the narrowest, one that
    # multicasts A, the widest of them (the most held registers under store_under_mma)
    GemmConfig(tile_n=80, store_under_mma=True), GemmConfig(tile_n=80, load="cp_async"),
    GemmConfig(tile_n=112, cluster_n=2, store_under_mma=True),
    GemmConfig(tile_n=240, store_under_mma=True),
    # past 256 columns: two WGMMAs per warpgroup and k-step (cuBLAS's 128 x 320 at 8192^3)
    GemmConfig(tile_n=320), GemmConfig(tile_n=320, cluster_m=2), GemmConfig(tile_n=384),
    # two epilogue buffers for a seventh stage (2026-12-02)
    GemmConfig(tile_n=96, cluster_m=2, store_under_mma=True),
], ids=lambda c: f"{c.load}-{c.tile_m}x{c.tile_n}-{c.schedule}-split{c.split_k}-sk{c.stream_k}"
                 f"{'-sum' if c.store_under_mma else ''}"
                 f"{'-atomic' if c.split_sum == 'atomic' else ''}")
def test_wgmma_stays_asynchronous(cfg):
    """ptxas on the configurations the benchmark offers: no C7520 / C7512 ("wgmma.mma_async
    instructions are serialized ...") and no spills. Until 2026-11-30 (session 6) every
    pingpong configuration had C7520: ptxas could not prove ``if mine`` warpgroup-uniform,
    so each WGMMA waited for the one before, and pingpong ran at about half the cooperative
    kernel's speed on the H200 (gemm_split_every.json: 238 vs 438 TFLOP/s at 128 x 128)."""
    log = kernels.ptxas_log(kernels.compile_gemm(cfg, "Float16").ptx)
    assert "C7520" not in log and "C7512" not in log, log
    assert re.search(r"\b0 bytes spill stores, 0 bytes spill loads", log), log


def _gemm_benchmark():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import gemm

    return gemm


def test_benchmark_offers_fitted_tiles_and_the_library_choice():
    """Where 128 x 256 tiles leave SMs idle the benchmark also times 128 x 192 / 160 (so the
    grid can show what fitting the tile gives), and every cell times what ``cutetma.gemm``
    itself would choose."""
    from cutetma import ops

    gemm = _gemm_benchmark()
    for name in ("tma", "cp_async"):
        starved = [c.get("tile") for c in gemm.candidates(name, 512, 5120, 5120)]
        assert (128, 160) in starved and (128, 192) in starved
        full = [c.get("tile") for c in gemm.candidates(name, 8192, 8192, 8192)]
        assert (128, 160) not in full
        # the narrowest widths of one and two waves, as cuBLAS fits its tiles (both
        # mechanisms alike, so the TMA / cp.async comparison keeps one tile list)
        few = [c.get("tile") for c in gemm.candidates(name, 256, 5120, 5120)]
        assert (128, 80) in few and (128, 64) not in few
        assert (128, 112) in [c.get("tile") for c in gemm.candidates(name, 256, 14336, 4096)]
    shared_a = [c for c in gemm.candidates("tma_multicast", 256, 6144, 4096)
                if c.get("cluster") == (1, 2)]
    assert dict(load="tma", cluster=(1, 2), tile=(128, 96)) in shared_a
    assert all(c.get("tile") == (128, 256) for c in gemm.candidates("tma_multicast", 8192, 8192,
                                                                     8192))
    for mnk in [(512, 5120, 5120), (256, 512, 5120), (2048, 1536, 5120)]:
        tile, split = ops.auto_tile_and_split(*mnk)
        chosen = [c for c in gemm.candidates("tma", *mnk)
                  if c.get("tile") == tile and c.get("split_k", 1) == split
                  and not c.get("schedule") and not c.get("stream_k")]
        assert chosen, mnk


def test_sustained_benchmark_reads_kernel_specs():
    """gemm_sustained.py --kernels: cuBLAS, ours with no options, or ours with cutetma.gemm
    keyword arguments (the configurations compared at the power cap)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import gemm_sustained

    assert gemm_sustained.parse_kernel("cublas") is None
    assert gemm_sustained.parse_kernel("ours") == {}
    assert gemm_sustained.parse_kernel("ours:load=tma_multicast,cluster=2x1") == {
        "load": "tma_multicast", "cluster": (2, 1)}
    assert gemm_sustained.parse_kernel("ours:tile=64x256,schedule=pingpong,split_k=2") == {
        "tile": (64, 256), "schedule": "pingpong", "split_k": 2}
    for bad in ("cudnn", "ours:tile", "ours:=2", "nvidia:cluster"):
        with pytest.raises(SystemExit):
            gemm_sustained.parse_kernel(bad)


def test_grid_plot_draws_the_default_and_its_geomean_per_m(tmp_path):
    """gemm.py's plot: ``cutetma.gemm`` with no options (``tma_default``) beside each
    mechanism's best, its per-M geometric mean over cuBLAS (the issue's target), and TMA over
    cp.async with the per-M median (the paper's table); cells missing a column are skipped."""
    gemm = _gemm_benchmark()
    rows = [dict(M=m, N=n, K=512, dtype="float16", cublas=100.0, tma_default=t, tma=t + 1,
                 tma_multicast=None, cp_async=80.0)
            for m, n, t in ((256, 512, 90.0), (256, 1024, 110.0), (8192, 512, 102.0))]
    rows.append(dict(M=512, N=512, K=512, dtype="float16", cublas=100.0, tma=95.0))
    means = gemm.default_geomeans(rows)
    assert list(means) == [256, 8192]
    assert means[256] == pytest.approx((0.9 * 1.1) ** 0.5)
    assert means[8192] == pytest.approx(1.02)
    path = tmp_path / "gemm.png"
    gemm.plot(rows, path)
    assert path.stat().st_size > 10_000


def test_sustained_benchmark_sweeps_grid_cells_and_summarizes():
    """gemm_sustained.py --grid-m: the grid's 18 (N, K) at each M; its summary is the
    geometric mean over cells of each spec's mean phase against cuBLAS's and the first
    ours spec's (a cell without a cuBLAS phase counts for neither)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import gemm
    import gemm_sustained

    cells = gemm_sustained.grid_cells([2048, 8192])
    assert len(cells) == 36 and cells[0] == (2048, *gemm.PAPER_NK[0])
    assert {m for m, _, _ in cells} == {2048, 8192}

    def phases(cell, kernel, *tflops):
        return [{"M": cell[0], "N": cell[1], "K": cell[2], "kernel": kernel, "tflops": t}
                for t in tflops]

    one, two = (1, 2, 3), (4, 5, 6)
    rows = (phases(one, "cublas", 100, 100) + phases(one, "ours", 90, 110)
            + phases(one, "ours:x=1", 120, 120) + phases(two, "cublas", 100)
            + phases(two, "ours", 50) + phases(two, "ours:x=1", 100)
            + phases((7, 8, 9), "ours", 1) + phases((7, 8, 9), "ours:x=1", 4))
    summary = gemm_sustained.summarize(rows, ["cublas", "ours", "ours:x=1"])
    assert summary["ours / cublas"] == pytest.approx((1.0 * 0.5) ** 0.5)
    assert summary["ours:x=1 / cublas"] == pytest.approx((1.2 * 1.0) ** 0.5)
    assert summary["ours:x=1 / ours"] == pytest.approx((1.2 * 2.0 * 4.0) ** (1 / 3))
    assert "ours / ours" not in summary


def test_kernel_times_fit_and_config_fields():
    """gemm_kernel_times.py: the fixed cost and the cost a k-tile come back from exact lines,
    and a spec's ``GemmConfig`` fields replace only themselves in the library's own choice
    for the shape (256 x 6144 x 4096: 128 x 96 in a (2, 1) cluster, 7 stages beside two
    epilogue buffers; ``epi_stages=4`` gives the 6 stages it had before)."""
    _gemm_benchmark()  # puts benchmarks/ on the path
    import gemm_kernel_times as kt

    fit = kt.fit_line([(16, 4.0 + 16 * 0.3), (64, 4.0 + 64 * 0.3), (128, 4.0 + 128 * 0.3)])
    assert fit == {"fixed_us": 4.0, "per_k_tile_us": 0.3, "points": 3}
    assert kt.spec_config({}, 256, 6144, 4096) is None
    assert kt.spec_config({"load": "tma_multicast"}, 256, 6144, 4096) is None
    auto = kt.spec_config({"epi_stages": 4}, 256, 6144, 4096)
    assert (auto.tile_n, auto.cluster_m, auto.epi_stages, auto.num_stages()) == (96, 2, 4, 6)
    default = kt.spec_config({"stages": 7}, 256, 6144, 4096)
    assert (default.tile_n, default.epi_buffers(), default.num_stages()) == (96, 2, 7)


def test_final_rounds_alternate_their_order(monkeypatch, tmp_path):
    """gemm.py / gemm_ab.py time their contenders in rounds whose order reverses every other
    round, so no contender always runs right after the same one (the card's clock follows
    what ran before); each key gets one time per round, each timed over the window asked
    for (gemm_ab.py's ``--window-ms``)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import gemm
    import gemm_ab

    calls, windows = [], []

    def fake_bench(fn, window_ms=25):
        windows.append(window_ms)
        calls.append(fn())
        return float(len(calls))

    monkeypatch.setattr(gemm, "bench", fake_bench)
    times = gemm.alternating_rounds({k: (lambda k=k: k) for k in "abc"}, 3)
    assert "".join(calls) == "abccbaabc"
    assert times == {"a": [1.0, 6.0, 7.0], "b": [2.0, 5.0, 8.0], "c": [3.0, 4.0, 9.0]}
    assert set(windows) == {25}
    windows.clear()
    gemm.alternating_rounds({"a": lambda: "a"}, 2, window_ms=400)
    assert windows == [400, 400]
    seen = {}
    monkeypatch.setattr(gemm_ab, "measure",
                        lambda *a: seen.setdefault("window", a[-1]) and {"M": 1})
    monkeypatch.setattr(gemm_ab, "summarize", lambda rows, specs: {})
    gemm_ab.main(["--kernels", "ours", "--cells", "1x1x1", "--window-ms", "300",
                  "--out", str(tmp_path)])
    assert seen["window"] == 300


def test_nvidia_example_as_a_peer(tmp_path):
    """``nvidia:...`` specs name NVIDIA's CuTe DSL example, imported from the path given
    (never copied here); a missing file or one without the kernel class stops before any
    timing, and so does a spec with no path given."""
    import sys
    from pathlib import Path

    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import gemm_sustained
    import nvidia_peer

    assert gemm_sustained.parse_kernel("nvidia:tile=128x256,cluster=1x2") == {
        "peer": "nvidia", "tile": (128, 256), "cluster": (1, 2)}
    assert gemm_sustained.load_peer(None) == {}
    with pytest.raises(SystemExit, match="no such file"):
        gemm_sustained.load_peer(str(tmp_path / "missing.py"))
    stand_in = tmp_path / "dense_gemm_persistent.py"
    stand_in.write_text("X = 1\n")
    with pytest.raises(SystemExit, match="HopperWgmmaGemmPersistentKernel"):
        nvidia_peer.load(stand_in)
    a = torch.zeros(8, 8, dtype=torch.float16)
    with pytest.raises(SystemExit, match="--nvidia-example"):
        gemm_sustained.contender({"peer": "nvidia"}, a, a)
    stand_in.write_text("class HopperWgmmaGemmPersistentKernel:\n    pass\n")
    meta = nvidia_peer.load(stand_in)
    assert meta["nvidia_example"] == str(stand_in) and len(meta["nvidia_example_sha256"]) == 16
    with pytest.raises(ValueError, match="fp16"):
        nvidia_peer.gemm_fn(a.float(), a.float())


def test_ab_benchmark_cells_and_summary():
    """gemm_ab.py: by default the two headline shapes and every grid shape with M >= 2048;
    the summary is each configuration's geomean over cuBLAS and over the first
    configuration, each over the cells where both were timed (a failed one drops out)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import gemm_ab

    cells = gemm_ab.default_cells()
    assert cells[:2] == [(8192, 8192, 8192), (4096, 4096, 4096)] and len(cells) == 38
    assert all(m >= 2048 for m, _, _ in cells)
    rows = [{"cublas": 100.0, "a": 90.0, "b": 99.0}, {"cublas": 100.0, "a": 110.0, "b": 121.0},
            {"cublas": 100.0, "a": 50.0}]
    summary = gemm_ab.summarize(rows, ["a", "b"])
    assert summary["geomean b / a"] == pytest.approx(1.1)
    assert summary["geomean b / cublas"] == pytest.approx((0.99 * 1.21) ** 0.5)
    assert summary["geomean a / cublas"] == pytest.approx((0.9 * 1.1 * 0.5) ** (1 / 3))
    with pytest.raises(SystemExit):
        gemm_ab.main(["--kernels", "cublas"])
    # split_k=wave: the most slices whose units fit one wave, per cell; none: no sum to pick
    wave = {"tile": (64, 128), "split_k": "wave", "split_sum": "atomic"}
    assert gemm_ab.resolve(wave, 256, 512, 5120)["split_k"] == 8    # 16 tiles x 8
    assert gemm_ab.resolve(wave, 512, 512, 5120)["split_k"] == 4    # 32 tiles x 4
    assert gemm_ab.resolve(wave, 2048, 512, 5120) == {"tile": (64, 128), "split_k": 1}
    with pytest.raises(SystemExit, match="tile"):
        gemm_ab.resolve({"split_k": "wave"}, 256, 512, 5120)
    # fit=W: 128-row tiles of the narrowest width that makes at most W waves (cuBLAS's
    # tiles at these shapes are 80 and 96 wide); the rest of the spec is kept
    assert gemm_ab.resolve({"fit": 1}, 256, 5120, 5120) == {"tile": (128, 80)}
    spec = {"fit": 1, "load": "tma_multicast", "cluster": (1, 2)}
    assert gemm_ab.resolve(spec, 256, 6144, 4096) == {"load": "tma_multicast",
                                                      "cluster": (1, 2), "tile": (128, 96)}
    with pytest.raises(ValueError, match="no tile width fits"):
        gemm_ab.resolve({"fit": 1}, 8192, 8192, 8192)
    # mirror=cublas: cuBLAS's tile and cluster, transposed into our terms (its M is our N)
    def nvjet(name):
        import cublas_kernels

        return [{"name": name, **cublas_kernels.parse_nvjet(name)}]
    assert gemm_ab.resolve({"mirror": "cublas"}, 256, 1536, 5120, nvjet(
        "nvjet_sm90_hsh_64x64_64x13_4x2_h_bz_TNT")) == {
            "tile": (64, 64), "load": "tma_multicast", "cluster": (2, 4)}
    assert gemm_ab.resolve({"mirror": "cublas"}, 512, 5120, 5120, nvjet(
        "nvjet_sm90_hsh_168x128_64x5_1x2_h_bz_TNN"))["tile"] == (128, 176)  # 168: up to 16s
    assert gemm_ab.resolve({"mirror": "cublas"}, 4096, 4096, 4096, nvjet(
        "nvjet_sm90_hsh_256x128_64x4_1x1_h_bz_TNT")) == {
            "tile": (128, 256), "load": "tma", "cluster": (1, 1)}
    for refused in ("nvjet_sm90_hsh_64x64_64x13_4x2_h_bz_splitK_TNT",  # slices unknown
                    "nvjet_sm90_hsh_256x256_64x4_1x2_h_bz_TNT"):       # 256 rows of ours
        with pytest.raises(ValueError, match="cannot run"):
            gemm_ab.resolve({"mirror": "cublas"}, 256, 512, 5120, nvjet(refused))


def test_width_ab_specs_resolve():
    """``gpu_session.py``'s ``gemm_widths`` step: every spec parses, and every ``fit=W`` spec
    gives each of its cells a tile or refuses it with the reason (reported, not fatal)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import gemm_ab
    import gemm_sustained
    import gpu_session

    assert "gemm_widths" in gpu_session.STEPS
    for _, _, cells, specs in gpu_session.WIDTH_ABS:
        for spec in specs:
            kwargs = gemm_sustained.parse_kernel(spec)
            for m, n, k in cells:
                try:
                    resolved = gemm_ab.resolve(kwargs, m, n, k)
                except ValueError as exc:
                    assert "fit" in kwargs and "no tile width fits" in str(exc)
                    continue
                assert "fit" not in resolved and (resolved is kwargs or "tile" in resolved)


def test_fit_width_is_the_narrowest_that_fills_the_waves():
    from cutetma import ops

    for (m, n, waves), width in {(256, 5120, 1): 80, (256, 6144, 1): 96, (256, 14336, 2): 112,
                                 (256, 8192, 1): 128, (512, 5120, 1): 160,
                                 (2048, 5120, 3): 224, (2048, 8192, 2): None}.items():
        assert ops.fit_width(m, n, waves) == width, (m, n, waves)
        if width:
            tiles = -(-m // 128) * -(-n // width)
            assert tiles <= waves * 132 < -(-m // 128) * -(-n // (width - 16)) or width == 64


def test_source_profile_plumbing_with_a_stand_in_ncu(tmp_path, monkeypatch):
    """``gemm_profile.py --source``: its specs, and the path from ncu's three calls (profile,
    source page, raw counters) to the summary JSON and the gzipped listing, driven by a
    stand-in ``ncu`` on PATH that prints what the real one prints (no GPU needed)."""
    import gzip
    import json
    import os
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import gemm_profile

    assert gemm_profile.parse_source_spec("256x512x5120/tile=128x128,split_k=4") == (
        (256, 512, 5120), "float16", {"tile": (128, 128), "split_k": 4})
    assert gemm_profile.parse_source_spec("64x64x64/dtype=bfloat16")[1] == "bfloat16"
    for bad in ("256x512", "axbxc", "1x2x3/tile"):
        with pytest.raises(SystemExit):
            gemm_profile.parse_source_spec(bad)
    fake = tmp_path / "bin" / "ncu"
    fake.parent.mkdir()
    fake.write_text("""#!/bin/sh
case "$*" in
  *"--page source"*) printf 'Kernel Name: k\\n"Address","Source","Instructions Executed",'
    printf '"Warp Stall Sampling (All Samples)","stall_long_sb"\\n'
    printf '"0x10","SYNCS.PHASECHK.TRANS64 P0, [R1]","7","90","80"\\n'
    printf '"0x20","HGMMA.64x128x16.F32 R24, gdesc[UR4], R24","64","10","0"\\n' ;;
  *"--page raw"*) printf '"ID","gpu__time_duration.sum","smsp__inst_executed.sum"\\n'
    printf '"0","17000","123"\\n' ;;
  *) : ;;
esac
""")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    assert gemm_profile.run_source(tmp_path / "out", ["256x512x5120/tile=128x128,split_k=4"]) == 0
    name = "gemm_sass_256x512x5120_tile128x128_split_k4"
    summary = json.loads((tmp_path / "out" / f"{name}.json").read_text())
    assert summary["M"] == 256 and summary["config"] == {"tile": [128, 128], "split_k": 4}
    assert summary["launch"]["gpu__time_duration.sum"] == "17000"
    assert summary["executed_by_opcode"] == {"HGMMA": 64.0, "SYNCS": 7.0}
    assert summary["top"][0]["sass"].startswith("SYNCS") and summary["samples_total"] == 100
    with gzip.open(tmp_path / "out" / f"{name}.csv.gz", "rt") as f:
        assert "HGMMA" in f.read()
    combined = json.loads((tmp_path / "out" / "gemm_sass.json").read_text())
    assert set(combined) == {"meta", "rows"} and len(combined["rows"]) == 1
    assert combined["rows"][0]["config"] == summary["config"] and "columns" not in combined
    assert combined["meta"]["command"].endswith("256x512x5120/tile=128x128,split_k=4")


def test_benchmark_merges_results_measured_in_separate_calls(tmp_path):
    """``gemm.py --merge`` joins per-dtype runs (the grid outgrows one device call) into one
    file with the summary over all rows and the meta of the machine that measured them."""
    import json

    gemm = _gemm_benchmark()

    def row(dtype, m, ours):
        return {"M": m, "N": 4096, "K": 4096, "dtype": dtype, "cublas": 100.0, "tma": ours,
                "cp_async": ours / 2}

    for dtype, ours in (("float16", 90.0), ("bfloat16", 110.0)):
        doc = {"meta": {"device": "NVIDIA H200", "date": "2026-11-30", "command": "gemm.py",
                        "complete": True}, "rows": [row(dtype, 512, ours)]}
        (tmp_path / f"{dtype}.json").write_text(json.dumps(doc))
    assert gemm.main(["--merge", str(tmp_path / "float16.json"), str(tmp_path / "bfloat16.json"),
                      "--out", str(tmp_path), "--name", "joined"]) == 0
    joined = json.loads((tmp_path / "joined.json").read_text())
    assert [r["dtype"] for r in joined["rows"]] == ["float16", "bfloat16"]
    assert joined["meta"]["device"] == "NVIDIA H200"
    assert joined["meta"]["summary"]["geomean_tma_vs_cublas_M>=256"] == pytest.approx(
        (0.9 * 1.1) ** 0.5)
    assert (tmp_path / "joined.png").exists()
    # a cell measured again in a later file replaces its row
    again = {"meta": {"device": "NVIDIA H200", "date": "2026-12-01", "command": "gemm.py",
                      "complete": True}, "rows": [row("float16", 512, 120.0)]}
    (tmp_path / "again.json").write_text(json.dumps(again))
    assert gemm.main(["--merge", str(tmp_path / "joined.json"), str(tmp_path / "again.json"),
                      "--out", str(tmp_path), "--name", "rejoined"]) == 0
    rejoined = json.loads((tmp_path / "rejoined.json").read_text())
    assert sorted((r["dtype"], r["tma"]) for r in rejoined["rows"]) == [("bfloat16", 110.0),
                                                                        ("float16", 120.0)]


@pytest.mark.skipif(shutil.which("ptxas") is None or kernels.find_nvdisasm() is None,
                    reason="needs ptxas and nvdisasm")
@pytest.mark.parametrize("tile_n", [256, 128])
def test_held_tile_is_stored_under_the_next_tiles_wgmmas_in_the_sass(tile_n):
    """``store_under_mma`` in the SASS of the consumer's k-loop: after a k-tile's WGMMAs are
    committed, the held tile's stmatrix and TMA stores come before the wait that retires them
    (``WARPGROUP.DEPBAR.LE gsb0, 0x1``), so the stores run while the tensor pipe works; and
    the held fragments are registers of their own, not the accumulator the WGMMAs write.
    Serial, the loop holds no store at all."""
    def loop(cfg):
        return kernels.innermost_loop(
            kernels.sass(kernels.compile_gemm(cfg, "Float16").ptx), ("HGMMA", "DEPBAR"))

    held = loop(GemmConfig(tile_n=tile_n, store_under_mma=True))
    mma = [i for i, op in enumerate(held) if op.startswith("HGMMA")]
    stsm = [i for i, op in enumerate(held) if op.startswith("STSM")]
    tma_store = [i for i, op in enumerate(held) if op.startswith("UTMASTG")]
    retire = [i for i, op in enumerate(held) if op.startswith("WARPGROUP.DEPBAR.LE gsb0, 0x1")]
    assert len(stsm) == tile_n // 32 * 2 and len(tma_store) == tile_n // 32, held
    assert mma[-1] < stsm[0] and tma_store[-1] < retire[0], held
    acc = re.search(r"HGMMA\.\S+ (R\d+),", held[mma[0]]).group(1)
    assert all(f" {acc}" not in held[i] for i in stsm), (acc, [held[i] for i in stsm])
    serial = loop(GemmConfig(tile_n=tile_n))
    assert not any(op.startswith(("STSM", "UTMASTG")) for op in serial), serial


def test_gemm_remembers_its_configuration_per_shape():
    """``cutetma.gemm`` computes its automatic choice once per shape and options (the models
    cost tens of microseconds of Python a call): the same object comes back, torch's
    deterministic mode is part of the key (it picks the split sum), bad options still fail
    with the check that names them, every time."""
    import torch

    from cutetma import ops

    args = (64, 4096, 14336, "tma", None, None, 132, None, None, False, None, None)
    first = ops._config_for(*args)
    assert ops._config_for(*args) is first and first.split_sum == "atomic"
    try:
        torch.use_deterministic_algorithms(True)
        assert ops._config_for(*args).split_sum == "ordered"
    finally:
        torch.use_deterministic_algorithms(False)
    assert ops._config_for(*args) is first
    for _ in range(2):
        with pytest.raises(ValueError, match="tile_n"):
            ops._config_for(256, 256, 256, "tma", None, (128, 100), 132, None, 1, False, None,
                            None)
        with pytest.raises((TypeError, ValueError)):
            ops._config_for(256, 256, 256, "tma", None, 128, 132, None, 1, False, None, None)


@pytest.mark.parametrize("cfg,b_k_major", [
    (GemmConfig(tile_n=128, store_under_mma=True), True),
    (GemmConfig(tile_n=128, load="cp_async"), False),
], ids=["tma", "cp_async-n-major-b"])
def test_pointer_entry_compiles_the_same_kernel(cfg, b_k_major):
    """``cutetma.gemm`` launches ``HopperGemm.from_pointers`` (pointers, sizes and strides);
    the tensors it builds have the types the DLPack tensors of the tensor entry have, so
    the PTX is the same, name for name but the entry's."""
    from cutetma import dsl

    cutlass, cute = dsl.cutlass()
    from cutlass.cute.runtime import make_fake_stream, make_ptr

    from cutetma.kernels.gemm_sm90 import HopperGemm

    f16 = cutlass.Float16

    def operand(k_major=True):  # the type a torch tensor's from_dlpack gives
        return kernels.fake_operand(f16, k_major, as_from_dlpack=True)

    by_tensors = dsl.compile_ptx(HopperGemm(cfg), operand(), operand(b_k_major), operand(), 132,
                                 make_fake_stream())

    def pointer():
        return make_ptr(f16, 16, cute.AddressSpace.gmem, assumed_align=16)

    by_pointers = dsl.compile_ptx(HopperGemm(cfg).from_pointers, pointer(), pointer(),
                                  pointer(), 1, 1, 1, 1, 1, 1, 1, b_k_major, 132,
                                  make_fake_stream())

    def named_alike(ptx):
        return re.sub(r"\b\w*(HopperGemm|from_pointers|__call__)\w*\b", "ENTRY", ptx)

    assert WGMMA in by_pointers.ptx
    assert named_alike(by_pointers.ptx) == named_alike(by_tensors.ptx)


@pytest.mark.parametrize("workspace", ["none", "split_k", "order_table"])
def test_launch_args_match_the_dsl(workspace):
    """``ops.GemmLaunch`` hands the compiled program the same argument list the DSL's own
    call builds: the address of each runtime value (pointers, sizes, strides, the stream),
    then the workspace tensors' descriptors. Checked by value behind every address, for the
    ``ops._gemm_launch`` that ``cutetma.gemm`` compiles."""
    import ctypes

    import torch
    from cuda.bindings import driver as cuda
    from cutlass.cute.runtime import from_dlpack, make_ptr

    from cutetma import dsl, ops

    cutlass, cute = dsl.cutlass()
    cfg = GemmConfig(tile_n=128, split_k=2 if workspace == "split_k" else 1,
                     order_table=workspace == "order_table")
    ws = ()
    if workspace == "split_k":
        ws = (from_dlpack(torch.zeros(4 * 128 * 128), assumed_align=16).mark_layout_dynamic(),
              from_dlpack(torch.zeros(8, dtype=torch.int32), assumed_align=4)
              .mark_layout_dynamic())
    elif workspace == "order_table":
        ws = (None, None, from_dlpack(torch.zeros(8, dtype=torch.int32), assumed_align=4)
              .mark_layout_dynamic())
    launch = ops._gemm_launch(torch.bfloat16, torch.float32, False, cfg, 66, ws)
    assert ops._gemm_launch(torch.bfloat16, torch.float32, False, cfg, 66, ws) is launch
    a, b, c = 0x7F0000000000, 0x7F0000100000, 0x7F0000200000
    big = 1 << 33  # strides are 64-bit: a 32-bit slot anywhere would lose this
    values = (a, b, c, 1000, 4097, 136, 129, big + 136, big + 4104, big + 4112, 0xABC)
    ours = launch.args(values, ws)

    def ptr(address, dtype):
        return make_ptr(getattr(cutlass, dtype), address, cute.AddressSpace.gmem,
                        assumed_align=16)

    keep = (ptr(a, "BFloat16"), ptr(b, "BFloat16"), ptr(c, "Float32"), cuda.CUstream(0xABC))
    theirs, _ = launch.compiled.generate_execution_args(*keep[:3], *values[3:10], keep[3], *ws)
    assert len(ours) == len(theirs) == 11 + {"none": 0, "split_k": 2, "order_table": 1}[workspace]

    def address(p):
        return p.value if isinstance(p, ctypes.c_void_p) else int(p)

    for i, (mine, dsl_arg) in enumerate(zip(ours, theirs, strict=True)):
        if i >= 11:  # the same cached descriptor
            assert address(mine) == address(dsl_arg)
            continue
        kind = ops.GemmLaunch.SLOTS[i]
        assert kind.from_address(address(mine)).value == values[i]
        assert kind.from_address(address(dsl_arg)).value == values[i], i


def test_order_table_is_the_default_for_whole_tiles_from_m_256():
    """``cutetma.gemm`` deals whole tiles from an order table from M = 256 (the sustained
    sweep at the cap: 35 of 36 cells faster at M = 2048 / 8192; session 22's A/B at M = 256,
    13 / 14 of 15 cells faster), not split-K or stream-K units, not below M = 256 (untimed
    there), and not where a cluster coordinate would not fit the table's 16 bits."""
    from cutetma import ops

    def cfg(m, n, k, **kw):
        return ops._gemm_config(m, n, "tma", None, None, 132, split_k=None, k=k, **kw)

    assert ops.order_table_pays(8192, 8192, cfg(8192, 8192, 8192))
    assert ops.order_table_pays(512, 4096, cfg(512, 4096, 4096))
    assert ops.order_table_pays(2048, 16384, cfg(2048, 16384, 512))  # pingpong
    assert ops.order_table_pays(256, 4096, cfg(256, 4096, 4096))
    assert not ops.order_table_pays(255, 4096, cfg(255, 4096, 4096))
    assert not ops.order_table_pays(128, 4096, cfg(128, 4096, 4096))
    split = cfg(512, 512, 5120)
    assert split.split_k > 1 and not ops.order_table_pays(512, 512, split)
    assert not ops.order_table_pays(8192, 8192, cfg(8192, 8192, 8192, stream_k=True))
    assert not ops.order_table_pays(512, 128 * (1 << 15), GemmConfig(tile_n=128))


@pytest.mark.parametrize("load", ["tma", "cp_async"])
def test_programmatic_dependent_launch_waits_before_any_global_access(load):
    """``GemmConfig.pdl``: every thread waits for the previous grid (griddepcontrol.wait)
    before the first global load, TMA copy or store, then lets the next grid launch; the
    default kernel has neither instruction and is otherwise the same."""
    on = kernels.compile_gemm(GemmConfig(load=load, pdl=True), "Float16").ptx
    off = kernels.compile_gemm(GemmConfig(load=load), "Float16").ptx
    assert "griddepcontrol" not in off
    assert on.count("griddepcontrol.wait;") == 1
    assert on.count("griddepcontrol.launch_dependents;") == 1
    wait = on.index("griddepcontrol.wait;")
    first_global = min(i for i in (on.find(BULK_LOAD), on.find(CP_ASYNC), on.find("ld.global"),
                                   on.find("st.global"), on.find(STORE)) if i >= 0)
    assert wait < on.index("griddepcontrol.launch_dependents;") < first_global
    # nothing else moves: the two instructions (inline asm, with its markers) are all it adds
    def rest(ptx):
        return [line for line in ptx.splitlines()
                if "griddepcontrol" not in line and "inline asm" not in line]

    assert rest(on) == rest(off)
    from cutetma import ops  # cutetma.gemm(pdl=True) runs the same configuration with it on

    cfg = GemmConfig(load=load)
    assert ops._with_pdl(cfg) == GemmConfig(load=load, pdl=True)
    assert ops._with_pdl(cfg) is ops._with_pdl(cfg)
