"""The FP8 GEMM compiled for sm_90a on a CPU machine: e4m3 WGMMA from 128-element k-tiles,
the scaling epilogue, the configuration's rules, the launch's argument list, and the torch
face's checks (tests/test_fp8_gpu.py holds the numerical checks on the GPU)."""

import ctypes
import re
import shutil

import pytest

from cutetma.kernels import build
from cutetma.kernels.gemm_config import GemmConfig

needs_ptxas = pytest.mark.skipif(shutil.which("ptxas") is None, reason="needs ptxas")


@pytest.mark.parametrize("scaling,load,tile_n", [("tensor", "tma", 256), ("row", "tma", 128),
                                                 ("tensor", "cp_async", 128),
                                                 ("row", "cp_async", 128),
                                                 ("block", "tma", 128),
                                                 ("block", "cp_async", 128)])
def test_fp8_gemm_issues_e4m3_wgmma_from_128_element_k_tiles(scaling, load, tile_n):
    """A k-tile is one 128-byte span: 128 e4m3 elements, 4 WGMMAs of k = 32; the scales are
    read in the epilogue only; the producer is TMA boxes or 16-byte cp.async as for 16-bit
    data."""
    cfg = GemmConfig(tile_n=tile_n, tile_k=128, scaling=scaling, load=load)
    ptx = build.compile_scaled_gemm(cfg).ptx
    wgmma = re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n(\d+)k32\.f32\.e4m3\.e4m3", ptx)
    assert len(wgmma) == 4 and set(wgmma) == {str(min(tile_n, 256))}
    tma_loads = re.search(r"cp\.async\.bulk\.tensor\.\dd\.shared::\w+\.global", ptx)
    assert bool(tma_loads) == (load == "tma")  # (C leaves by TMA stores either way)
    assert ("cp.async.cg.shared.global" in ptx) == (load == "cp_async")
    if shutil.which("ptxas"):
        log = build.ptxas_log(ptx)
        assert "C7512" not in log
        assert re.search(r"\b0 bytes spill stores, 0 bytes spill loads", log), log


@pytest.mark.parametrize("scaling,out_dtype", [("block", "BFloat16"), ("tensor", "Float32"),
                                               ("row", "Float32")])
def test_promotion_takes_each_complete_k_tile(scaling, out_dtype):
    """Each k-tile goes into a fragment of its own, which is promoted once complete: the
    promoted mainloop waits for each k-tile (wait_group 0, never 1), and ptxas neither
    serializes the WGMMAs nor spills the two 64-value fragments."""
    cfg = GemmConfig(tile_n=128, tile_k=128, scaling=scaling,
                     promote=scaling != "block")
    ptx = build.compile_scaled_gemm(cfg, out_dtype).ptx
    waits = re.findall(r"wgmma\.wait_group\.sync\.aligned\s+(\d+)", ptx)
    assert "0" in waits and "1" not in waits, waits
    if shutil.which("ptxas"):
        log = build.ptxas_log(ptx)
        assert not re.search(r"C751[24]", log), log
        assert re.search(r"\b0 bytes spill stores, 0 bytes spill loads", log), log


@pytest.mark.parametrize("scaling,out_dtype", [("block", "BFloat16"), ("row", "Float32")])
def test_tall_promoted_tile_takes_two_waves_through_one_fragment(scaling, out_dtype):
    """256 x 128: each consumer warpgroup's 128 rows as two 64-row waves, each a k-tile's
    4 WGMMAs into the one fragment, waited for (wait_group 0) and promoted; 4 rows' scale_a
    a thread blockwise; accumulator and fragment (192 registers) without spills."""
    cfg = GemmConfig(tile_m=256, tile_n=128, tile_k=128, scaling=scaling,
                     promote=scaling != "block")
    assert (cfg.consumer_groups, cfg.waves, cfg.threads) == (2, 2, 384)
    ptx = build.compile_scaled_gemm(cfg, out_dtype).ptx
    wgmma = re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n(\d+)k32", ptx)
    assert len(wgmma) == 8 and set(wgmma) == {"128"}
    waits = re.findall(r"wgmma\.wait_group\.sync\.aligned\s+(\d+)", ptx)
    assert "0" in waits and "1" not in waits, waits
    if scaling == "block":
        # scale_a of 4 rows from the stage; scale_b's one value from global memory, the
        # first k-tile's before the loop and each next one's in it
        assert len(re.findall(r"ld\.global\S*\.[bf]32", ptx)) == 2
        assert len(re.findall(r"ld\.shared\S*\.[bf]32", ptx)) == 4
    if shutil.which("ptxas"):
        log = build.ptxas_log(ptx)
        assert not re.search(r"C751[24]", log), log
        assert re.search(r"\b0 bytes spill stores, 0 bytes spill loads", log), log
    for kwargs in (dict(tile_n=256), dict(store_under_mma=True), dict(split_k=2)):
        with pytest.raises(ValueError, match="tile_m=256"):
            GemmConfig(**{**dict(tile_m=256, tile_n=128, tile_k=128, scaling="block"),
                          **kwargs})
    with pytest.raises(ValueError, match="tile_m=256"):
        GemmConfig(tile_m=256, tile_n=128, tile_k=128, scaling="tensor")  # not promoted


def test_fp8_stages_count_one_byte_operands():
    """The same 128-byte k-tile rows as 16-bit data, so an FP8 stage of 128 x 256 is as big
    as a bf16 one (96 KiB... 48 KiB) and the pipeline as deep."""
    bf16 = GemmConfig()
    fp8 = GemmConfig(tile_k=128, scaling="tensor")
    assert fp8.ab_bytes == 1 and bf16.ab_bytes == 2
    assert fp8.stage_bytes() == bf16.stage_bytes() == (128 + 256) * 128
    assert fp8.num_stages(2) == bf16.num_stages(2)


def test_fp8_config_rules():
    with pytest.raises(ValueError, match="tile_k"):
        GemmConfig(tile_k=32)
    with pytest.raises(ValueError, match="scaling"):
        GemmConfig(scaling="blockwise")
    with pytest.raises(ValueError, match="128-column scale block"):
        GemmConfig(tile_k=128, scaling="block", tile_n=256)
    with pytest.raises(ValueError, match="8-bit"):
        GemmConfig(scaling="tensor")  # 16-bit k-tiles
    from cutetma.fp8 import fp8_config

    wide = GemmConfig(tile_n=256)
    assert fp8_config(wide, "tensor").tile_n == 256
    row = fp8_config(wide, "row")
    # row-wise keeps the model's width (its column scales go through shared memory)
    assert (row.tile_n, row.tile_k, row.scaling, row.order_table) == (256, 128, "row", False)
    for tile_n, schedule, want in ((256, "cooperative", 128), (96, "cooperative", 128),
                                   (64, "cooperative", 64), (128, "pingpong", 128)):
        block = fp8_config(GemmConfig(tile_n=tile_n, schedule=schedule), "block")
        assert (block.tile_n, block.schedule, block.scaling) == (want, "cooperative", "block")
    split = fp8_config(GemmConfig(tile_n=128, split_k=8, split_sum="atomic"), "block")
    assert split.split_k == 1
    # an fp32 C promotes each k-tile in fp32 (a pingpong tile becomes cooperative); 16-bit
    # C does not, and blockwise promotes through its own path
    import torch

    fp32 = fp8_config(GemmConfig(tile_n=128, schedule="pingpong"), "tensor", torch.float32)
    assert (fp32.promote, fp32.schedule) == (True, "cooperative")
    # a promoted tile is at most 128 wide (its accumulator and k-tile fragment); where the
    # model chose 128 x 256 whole-K tiles an fp32 C and blockwise scales take 256 x 128 (two
    # waves), elsewhere blockwise is 128 x 128
    tall = fp8_config(GemmConfig(tile_n=256, store_under_mma=True), "tensor", torch.float32)
    assert (tall.tile_m, tall.tile_n, tall.store_under_mma, tall.promote) == (256, 128,
                                                                               False, True)
    assert (fp8_config(wide, "block").tile_m, fp8_config(wide, "block").tile_n) == (256, 128)
    narrow = fp8_config(GemmConfig(tile_n=128), "block")
    assert (narrow.tile_m, narrow.tile_n, narrow.stage_scale_bytes) == (128, 128, 512)
    split_wide = fp8_config(GemmConfig(tile_n=256, split_k=2), "tensor", torch.float32)
    assert (split_wide.tile_m, split_wide.tile_n) == (128, 128)
    assert not fp8_config(wide, "tensor", torch.bfloat16).promote
    assert not fp8_config(wide, "block", torch.float32).promote
    with pytest.raises(ValueError, match="needs scaling"):
        GemmConfig(promote=True)


@pytest.mark.parametrize("tile_n", [128, 256])
def test_fp8_scales_are_loaded_once_per_row_and_column(tile_n):
    """Row-wise scales: a thread of a 128 x N tile holds 2 rows and N / 4 columns of it; it
    loads its 2 rows' scale_a and one of the tile's N column scales (into shared memory,
    two tiles' worth), and reads each of its columns' scales from there once, so at
    128 x 256 neither its 64 column scales nor 128 values' loads sit in registers (ptxas
    spilled 180 bytes when they did). Blockwise: 2 rows' scale_a per k-tile from the stage
    (loaded with A and B) and the tile's one scale_b from global memory, a k-tile ahead."""
    import re

    cfg = GemmConfig(tile_n=tile_n, tile_k=128, scaling="row")
    assert cfg.scale_bytes() == 2 * tile_n * 4
    row = build.compile_scaled_gemm(cfg).ptx
    assert len(re.findall(r"ld\.global\S*\.[bf]32", row)) == 2 + 1
    assert len(re.findall(r"st\.shared\S*\.[bf]32", row)) >= 1
    shared_reads = re.findall(r"ld\.shared(\.v\d)?\.[bf]32", row)
    assert sum(int(v[2:]) if v else 1 for v in shared_reads) == tile_n // 4
    if shutil.which("ptxas"):
        assert re.search(r"\b0 bytes spill stores", build.ptxas_log(row))
    block = build.compile_scaled_gemm(GemmConfig(tile_n=128, tile_k=128, scaling="block")).ptx
    assert len(re.findall(r"ld\.global\S*\.[bf]32", block)) == 2
    assert len(re.findall(r"ld\.shared\S*\.[bf]32", block)) == 2


def test_fp8_kernel_refuses_16_bit_operands_with_8_bit_tiles():
    with pytest.raises(Exception, match="128-byte span"):
        build.compile_gemm(GemmConfig(tile_k=128), "BFloat16")


def test_scaled_launch_args_match_the_dsl():
    """``runtime.ScaledGemmLaunch`` hands the compiled program the DSL's own argument list:
    five pointers, four sizes, three 64-bit strides, the stream (checked by value)."""
    import torch
    from cuda.bindings import driver as cuda
    from cutlass.cute.runtime import make_ptr

    from cutetma import dsl, runtime

    cutlass, cute = dsl.cutlass()
    cfg = GemmConfig(tile_n=128, tile_k=128, scaling="row")
    launch = runtime.scaled_gemm_launch(torch.bfloat16, cfg, 132)
    ptrs = (0x7F0000000000, 0x7F0000100000, 0x7F0000200000, 0x7F0000300000, 0x7F0000400000)
    big = 1 << 33
    values = (*ptrs, 1000, 4097, 256, 256, big + 256, big + 512, big + 4112, 0xABC)
    ours = launch.args(values)

    def ptr(address, dtype, align=16):
        return make_ptr(getattr(cutlass, dtype), address, cute.AddressSpace.gmem,
                        assumed_align=align)

    keep = (ptr(ptrs[0], "Float8E4M3FN"), ptr(ptrs[1], "Float8E4M3FN"),
            ptr(ptrs[2], "BFloat16"), ptr(ptrs[3], "Float32", 4), ptr(ptrs[4], "Float32", 4))
    theirs, _ = launch.compiled.generate_execution_args(*keep, *values[5:12],
                                                        cuda.CUstream(0xABC))
    assert len(ours) == len(theirs) == 13

    def address(p):
        return p.value if isinstance(p, ctypes.c_void_p) else int(p)

    for i, (mine, dsl_arg) in enumerate(zip(ours, theirs, strict=True)):
        kind = runtime.ScaledGemmLaunch.SLOTS[i]
        assert kind.from_address(address(mine)).value == values[i]
        assert kind.from_address(address(dsl_arg)).value == values[i], i


def test_scaled_gemm_checks_before_launch():
    """Errors a CPU machine can raise (the dtype, shape, major and scale checks come before
    the device check)."""
    import torch

    import cutetma

    fp8 = torch.float8_e4m3fn
    a = torch.zeros(64, 128).to(fp8)
    b = torch.zeros(96, 128).to(fp8).t()  # (K, N) column-major, as torch._scaled_mm
    one = torch.ones(1)
    with pytest.raises(TypeError, match="float8_e4m3fn"):
        cutetma.scaled_gemm(a.bfloat16(), b, one, one)
    with pytest.raises(TypeError, match="mixed FP8"):
        cutetma.scaled_gemm(a, b.to(torch.float8_e5m2), one, one)
    with pytest.raises(ValueError, match="inner dimensions"):
        cutetma.scaled_gemm(a[:, :64], b, one, one)
    with pytest.raises(ValueError, match="column-major"):
        cutetma.scaled_gemm(a, b.contiguous(), one, one)
    with pytest.raises(ValueError, match="row-major"):
        cutetma.scaled_gemm(a.t().contiguous().t(), b, one, one)
    with pytest.raises(ValueError, match="16 bytes"):  # K = 120: rows 120 bytes apart
        cutetma.scaled_gemm(torch.zeros(64, 120).to(fp8), torch.zeros(96, 120).to(fp8).t(),
                            one, one)
    with pytest.raises(ValueError, match="row-wise"):
        cutetma.scaled_gemm(a, b, torch.ones(64), torch.ones(96))
    with pytest.raises(ValueError, match="blockwise"):  # K = 128: one K block, N = 96: one
        cutetma.scaled_gemm(a, b, torch.ones(64, 2), torch.ones(1, 1))
    with pytest.raises(TypeError, match="float32"):
        cutetma.scaled_gemm(a, b, one.double(), one)
    with pytest.raises(ValueError, match="CUDA"):
        cutetma.scaled_gemm(a, b, torch.ones(64, 1), torch.ones(1, 96))


def test_blockwise_scale_a_row_or_m_major():
    """Blockwise scale_a is taken row-major or M-major (torch._scaled_mm's layout); the
    kernel's stages load the M-major form with 16-byte columns, so only that one is used in
    place."""
    import torch

    from cutetma.fp8 import _scale_a_in_place, scaling_mode

    sb = torch.ones(2, 3)  # N = 200, K = 300
    for m in (64, 61):
        row = torch.ones(m, 3)
        m_major = row.t().contiguous().t()
        assert scaling_mode(row, sb, m, 200, 300) == "block"
        assert scaling_mode(m_major, sb, m, 200, 300) == "block"
        assert not _scale_a_in_place(row, m)
        assert _scale_a_in_place(m_major, m) == (m % 4 == 0)
    assert not _scale_a_in_place(torch.ones(3, 68)[:, :64].t(), 64)  # not packed: copied
    assert not _scale_a_in_place(torch.ones(3 * 64 + 1)[1:].view(3, 64).t(), 64)  # 4 B base
    with pytest.raises(ValueError, match="M-major"):
        scaling_mode(torch.ones(64, 6)[:, ::2], sb, 64, 200, 300)
    with pytest.raises(ValueError, match="M-major"):
        scaling_mode(torch.ones(200).as_strided((64, 3), (1, 32)), sb, 64, 200, 300)
    with pytest.raises(ValueError, match="blockwise"):
        scaling_mode(torch.ones(64, 3), sb.t().contiguous().t(), 64, 200, 300)


def test_custom_op_fake_shape():
    """What torch.compile traces with: C (M, N) in out_dtype."""
    import torch

    import cutetma.fp8  # noqa: F401  (registers cutetma::scaled_gemm)

    a = torch.empty(64, 256, device="meta", dtype=torch.float8_e4m3fn)
    b = torch.empty(96, 256, device="meta", dtype=torch.float8_e4m3fn).t()
    one = torch.empty(1, device="meta")
    out = torch.ops.cutetma.scaled_gemm(a, b, one, one, torch.float16, "tma")
    assert out.shape == (64, 96) and out.dtype == torch.float16
