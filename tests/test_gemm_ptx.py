"""The GEMM kernel compiled for sm_90a on a CPU machine (``kernels.build``): every mechanism,
dtype and cluster shape has its WGMMAs, the producer issues what its mechanism says and
nothing else, ptxas neither serializes nor spills, and the SASS keeps the stores where they
were put; ``GemmConfig``'s checks, the epilogue's and stream-K's host-side arithmetic, and the
prepared launch ``cutetma.gemm`` calls. Kernels are compiled once per configuration
(``build.compile_gemm`` is cached), so tests that read one configuration share it.
The host's choice of configuration: ``test_tuning.py``."""

import dataclasses
import itertools
import re
import shutil

import pytest

from cutetma import GemmConfig, select_gemm_config
from cutetma.kernels import build

WGMMA = "wgmma.mma_async.sync.aligned"
BULK_LOAD = "cp.async.bulk.tensor.2d.shared::c"  # ::cta or ::cluster destination
MCAST = ".multicast::cluster"
CP_ASYNC = "cp.async.cg.shared.global"
STORE = "cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group"

# each cluster shape once, the two input types between them: the type only changes the
# WGMMA's operand suffix, the cluster what the producer issues
CLUSTERS = [((1, 1), "Float16"), ((2, 1), "BFloat16"), ((1, 2), "Float16"),
            ((2, 2), "BFloat16")]


@pytest.mark.parametrize("cluster,dtype", CLUSTERS, ids=lambda c: f"{c[0]}x{c[1]}"
                         if isinstance(c, tuple) else c)
def test_tma_variant(cluster, dtype):
    ptx = build.compile_gemm(GemmConfig(cluster_m=cluster[0], cluster_n=cluster[1]), dtype).ptx
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
    ptx = build.compile_gemm(cfg, "Float16").ptx
    assert f"{WGMMA}.m64n64k16.f32.f16.f16" in ptx
    assert ptx.count(MCAST) >= 2 and "shared::cta.global" not in ptx  # no unshared load
    assert cfg.num_stages() == 13  # cuBLAS's kernel there: 64x64_64x13


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
    ptx = build.compile_gemm(cfg, "Float16").ptx
    loads = table_loads(ptx)
    assert len(loads) == 3
    assert loads[0] < ptx.index("mbarrier.init")
    assert loads[-1] < ptx.index(WGMMA)
    assert not table_loads(build.compile_gemm(GemmConfig(tile_m=64, tile_n=128, load=load),
                                                "Float16").ptx)
    pdl = build.compile_gemm(dataclasses.replace(cfg, pdl=True), "Float16").ptx
    assert pdl.index("griddepcontrol.wait;") < table_loads(pdl)[0]
    with pytest.raises(ValueError, match="order_table orders whole tiles"):
        GemmConfig(order_table=True, split_k=2)


@pytest.mark.parametrize("dtype", ["Float16", "BFloat16"])
def test_cp_async_variant(dtype):
    ptx = build.compile_gemm(GemmConfig(load="cp_async"), dtype).ptx
    assert WGMMA in ptx and CP_ASYNC in ptx
    assert "cp.async.mbarrier.arrive.noinc" in ptx
    assert BULK_LOAD not in ptx and MCAST not in ptx  # no TMA load at all
    assert STORE in ptx  # the same TMA-store epilogue


@pytest.mark.parametrize("load", ["tma", "cp_async"])
@pytest.mark.parametrize("tile", [(64, 128), (128, 160)])
def test_n_major_b_and_other_tiles(load, tile):
    ptx = build.compile_gemm(GemmConfig(tile_m=tile[0], tile_n=tile[1], load=load),
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


@pytest.mark.parametrize("tile_n,load", [(80, "tma"), (80, "cp_async"), (112, "tma"),
                                         (176, "cp_async"), (240, "tma")])
def test_widths_in_steps_of_16(tile_n, load):
    """Tiles as wide as a shape needs to fill the SMs' waves (cuBLAS's own tiles on the H200
    are 80, 96, 112, 168, 176 wide, ``cublas_kernels.json``): one m64nNk16 WGMMA per
    warpgroup spans the width, and an odd multiple of 16 goes out in 16-column sub-tiles,
    one stmatrix and one TMA store each (a multiple of 32: 32-column ones, as before)."""
    cfg = GemmConfig(tile_n=tile_n, load=load)
    assert cfg.epi_n == (32 if tile_n % 32 == 0 else 16)
    ptx = build.compile_gemm(cfg, "Float16").ptx
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
    four at 288 beside two epilogue buffers instead of four (``epi_buffers``). An N-major B
    (b given as (K, N)) compiles at 384, whose 192-column WGMMAs read whole 64-column swizzle
    atoms (``test_tuning.py``: the narrower ones are refused before launch)."""
    cfg = GemmConfig(tile_n=tile_n, load=load)
    assert cfg.mma_n == tile_n // 2
    assert (cfg.num_stages(), cfg.epi_buffers()) == ((4, 2) if tile_n == 288 else (3, 4))
    ptx = build.compile_gemm(cfg, "BFloat16" if load == "cp_async" else "Float16").ptx
    wgmma = re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n(\d+)k16", ptx)
    assert set(wgmma) == {str(tile_n // 2)} and len(wgmma) == 2 * 4  # 2 halves x 4 k-steps
    assert ptx.count(STORE) == tile_n // 32
    if tile_n == 384:
        n_major = build.compile_gemm(cfg, "Float16", b_k_major=False).ptx
        assert f"{WGMMA}.m64n192k16.f32.f16.f16" in n_major


@pytest.mark.parametrize("load", ["tma", "cp_async"])
def test_pingpong_schedule(load):
    cfg = GemmConfig(tile_m=64, tile_n=256, load=load, schedule="pingpong")
    ptx = build.compile_gemm(cfg, "Float16").ptx
    assert f"{WGMMA}.m64n256k16.f32.f16.f16" in ptx
    # the turn barriers: one warpgroup arrives, the other waits (bar.sync id, 256 threads)
    assert re.search(r"bar\.arrive\s+\S+,\s*256;", ptx) or "barrier.arrive" in ptx


@pytest.mark.parametrize("out", ["Float32", "BFloat16"])
def test_output_dtypes(out):
    ptx = build.compile_gemm(GemmConfig(tile_n=128), "Float16", out).ptx
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


def test_stage_count_fits_the_kernels_shared_memory():
    """The stage count comes from ``GemmConfig.smem_bytes``, which must be the kernel's
    ``Storage`` byte for byte, padding included (this tile once got a stage the struct's
    1024-byte rounding did not leave room for, and failed to launch)."""
    from cutetma.kernels import build, gemm_sm90
    from cutetma.kernels.smem import smem_capacity

    cfg = GemmConfig(tile_n=112, cluster_n=2)
    made = []

    class Recorded(gemm_sm90.HopperGemm):
        def __init__(self, config):
            super().__init__(config)
            made.append(self)

    original = gemm_sm90.HopperGemm
    gemm_sm90.HopperGemm = Recorded
    try:
        build.compile_gemm(cfg, "Float16")
    finally:
        gemm_sm90.HopperGemm = original
    kernel = made[-1]
    assert kernel.stages == cfg.num_stages(2)
    size = kernel.storage.size_in_bytes()
    assert size == cfg.smem_bytes(kernel.stages, 2, kernel.epi_buffers) <= smem_capacity()


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


@pytest.mark.parametrize("load", ["tma", "cp_async"])
def test_split_k_reduces_in_the_kernel_by_ticket(load):
    """Each slice stores its partial (16-byte vectors), one thread takes a ticket (acq_rel
    atomic), the last slice sums the partials and stores C through the usual TMA
    epilogue: nothing is left for a second kernel."""
    cfg = GemmConfig(tile_n=128, load=load, split_k=3)
    ptx = build.compile_gemm(cfg, "Float16").ptx
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
    lines = build.compile_gemm(cfg, "Float16").ptx.splitlines()
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
    ptx = build.compile_gemm(GemmConfig(tile_n=128, split_k=split, split_sum="atomic"),
                             "Float16").ptx
    zero_stores = r"st\.global\.v4\.b32\s+\[[^\]]+\], \{0f00000000"
    assert ptx.count("red.relaxed.gpu.global.add.v4.f32") == per_thread
    assert ptx.count("ld.global.v4.b32") == per_thread
    assert len(re.findall(zero_stores, ptx)) == per_thread
    assert "atom.global.acq_rel.add" in ptx and "fence.acq_rel.gpu" in ptx
    ordered = build.compile_gemm(GemmConfig(tile_n=128, split_k=split), "Float16").ptx
    assert "red.relaxed" not in ordered and not re.search(zero_stores, ordered)
    assert ordered.count("ld.global.v4.b32") == split * per_thread


def test_split_k_leaves_the_unsplit_kernel_alone():
    """split_k=1 must compile to the kernel validated on the H200 (no workspace traffic)."""
    ptx = build.compile_gemm(GemmConfig(tile_n=128), "Float16").ptx
    assert "atom.global" not in ptx and "ld.global.v4" not in ptx


@pytest.mark.parametrize("mnk", [(256, 1536, 5120), (208, 432, 3000)])
def test_fitted_64_row_tiles_compile_with_their_multicast(mnk):
    """The automatic 64-row tiles narrower than 128, K split in (2, 1) clusters: one
    m64nWk16 WGMMA per k-step, B multicast, the slices summed in the kernel (ordered at two
    slices, atomic at eight)."""
    cfg = select_gemm_config(*mnk)
    assert cfg.cluster_m == 2 and cfg.split_k > 1 and cfg.tile_n < 128
    ptx = build.compile_gemm(cfg, "BFloat16").ptx
    assert f"{WGMMA}.m64n{cfg.tile_n}k16.f32.bf16.bf16" in ptx
    assert MCAST in ptx and "atom.global.acq_rel.add" in ptx
    assert ("red.relaxed.gpu.global.add.v4.f32" in ptx) == (cfg.split_sum == "atomic")


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
            # each coordinate read once (a host-side index costs a third of a millisecond)
            acc_at = [tuple(acc[j]) for j in range(cute.size(acc))]
            sub_at = [tuple(sub[i]) for i in range(cute.size(sub))]
            for e, positions in enumerate(order):
                for i, j in enumerate(positions):
                    row, col = sub_at[i]
                    wrong += acc_at[j] != (row, col + e * epi_n)
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
    from cutetma.kernels.gemm_producers import stream_k_unit

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
    ptx = build.compile_gemm(GemmConfig(tile_n=128, load=load, stream_k=True), "Float16").ptx
    assert WGMMA in ptx
    assert ("cp.async.bulk.tensor.2d" if load == "tma" else "cp.async.cg.shared.global") in ptx
    assert "fence.acq_rel.gpu" in ptx and "st.release.gpu.global.b32" in ptx
    assert "ld.acquire.gpu.global.b32" in ptx
    assert "st.global.v4.b32" in ptx and "ld.global.v4.b32" in ptx  # 16-byte partials


def test_stream_k_refuses_what_it_does_not_run():
    for bad in (dict(schedule="pingpong", tile_n=128), dict(cluster_m=2), dict(split_k=2)):
        with pytest.raises(ValueError, match="stream_k"):
            GemmConfig(stream_k=True, **bad)


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
    instructions are serialized ...") and no spills. Before ``if mine`` was made warp-uniform, every
    pingpong configuration had C7520: ptxas could not prove the branch warpgroup-uniform, so each
    WGMMA waited for the one before, and pingpong ran at about half the cooperative kernel's speed
    on the H200 (gemm_split_every.json: 238 vs 438 TFLOP/s at 128 x 128)."""
    log = build.ptxas_log(build.compile_gemm(cfg, "Float16").ptx)
    assert "C7520" not in log and "C7512" not in log, log
    assert re.search(r"\b0 bytes spill stores, 0 bytes spill loads", log), log


@pytest.mark.skipif(shutil.which("ptxas") is None or build.find_nvdisasm() is None,
                    reason="needs ptxas and nvdisasm")
@pytest.mark.parametrize("tile_n", [256, 128])
def test_held_tile_is_stored_under_the_next_tiles_wgmmas_in_the_sass(tile_n):
    """``store_under_mma`` in the SASS of the consumer's k-loop: after a k-tile's WGMMAs are
    committed, the held tile's stmatrix and TMA stores come before the wait that retires them
    (``WARPGROUP.DEPBAR.LE gsb0, 0x1``), so the stores run while the tensor pipe works; and
    the held fragments are registers of their own, not the accumulator the WGMMAs write.
    Serial, the loop holds no store at all."""
    def loop(cfg):
        return build.innermost_loop(
            build.sass(build.compile_gemm(cfg, "Float16").ptx), ("HGMMA", "DEPBAR"))

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
        return build.fake_operand(f16, k_major, as_from_dlpack=True)

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
    """``runtime.GemmLaunch`` hands the compiled program the same argument list the DSL's
    own call builds: the address of each runtime value (pointers, sizes, strides, the
    stream), then the workspace tensors' descriptors. Checked by value behind every address,
    for the ``runtime.gemm_launch`` that ``cutetma.gemm`` compiles (once per configuration)."""
    import ctypes

    import torch
    from cuda.bindings import driver as cuda
    from cutlass.cute.runtime import from_dlpack, make_ptr

    from cutetma import dsl, runtime

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
    launch = runtime.gemm_launch(torch.bfloat16, torch.float32, False, cfg, 66, ws)
    assert runtime.gemm_launch(torch.bfloat16, torch.float32, False, cfg, 66, ws) is launch
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
        kind = runtime.GemmLaunch.SLOTS[i]
        assert kind.from_address(address(mine)).value == values[i]
        assert kind.from_address(address(dsl_arg)).value == values[i], i


@pytest.mark.parametrize("load", ["tma", "cp_async"])
def test_programmatic_dependent_launch_waits_before_any_global_access(load):
    """``GemmConfig.pdl``: every thread waits for the previous grid (griddepcontrol.wait)
    before the first global load, TMA copy or store, then lets the next grid launch; the
    default kernel has neither instruction and is otherwise the same. (``cutetma.gemm(...,
    pdl=True)`` runs its configuration with ``pdl`` on, as ``dataclasses.replace`` makes it.)"""
    off_cfg = GemmConfig(load=load)
    on_cfg = dataclasses.replace(off_cfg, pdl=True)
    assert on_cfg == GemmConfig(load=load, pdl=True) and on_cfg != off_cfg
    on = build.compile_gemm(on_cfg, "Float16").ptx
    off = build.compile_gemm(off_cfg, "Float16").ptx
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
