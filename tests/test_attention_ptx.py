"""The attention forward compiled for sm_90a on a CPU machine, and its fp32 reference.

What can be checked without a GPU: the PTX of every variant (mechanism, schedule), the
layouts the kernel hardcodes, the reference; tests/test_attention_gpu.py holds the numerical
checks on the H200."""

import math
import re
import shutil

import pytest

from cutetma.kernels import build
from cutetma.kernels.attention import BEST_SCHEDULE, PV_WAIT, AttentionConfig
from cutetma.kernels.attention.softmax import pairwise
from cutetma.reference import attention_ref


@pytest.mark.parametrize("dtype", ["Float16", "BFloat16"])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_compiles_with_tma_and_wgmma(dtype, head_dim, causal):
    cfg = AttentionConfig(head_dim=head_dim, causal=causal)
    ptx = build.compile_attention(cfg, dtype).ptx
    suffix = "f16.f16" if dtype == "Float16" else "bf16.bf16"
    # Q K^T: N = block_n; P V: N = head_dim; both in k16 steps
    assert f"wgmma.mma_async.sync.aligned.m64n{cfg.block_n}k16.f32.{suffix}" in ptx
    assert f"wgmma.mma_async.sync.aligned.m64n{head_dim}k16.f32.{suffix}" in ptx
    wgmmas = ptx.count("wgmma.mma_async.sync")
    # d/16 for Q K^T, block_n/16 for P V; twice over when the schedule overlaps, as it peels
    # the first Q K^T and the last P V out of its loop
    copies = 1 if cfg.schedule == "serial" else 2
    assert wgmmas == copies * (head_dim // 16 + cfg.block_n // 16)
    assert "cp.async.bulk.tensor" in ptx and "cp.async.cg" not in ptx
    assert ptx.count("ex2.approx") >= cfg.block_n // 2  # an exp2 per score: 64 x n / 128
    assert "setmaxnreg.dec" in ptx and "setmaxnreg.inc" in ptx


@pytest.mark.parametrize("head_dim", [64, 128])
def test_cp_async_variant_swaps_only_the_producer(head_dim):
    tma = build.compile_attention(AttentionConfig(head_dim=head_dim)).ptx
    cp = build.compile_attention(AttentionConfig(head_dim=head_dim, load="cp_async")).ptx
    assert "cp.async.cg.shared.global" in cp and "cp.async.bulk.tensor" not in cp
    assert "cp.async.mbarrier.arrive.noinc" in cp
    # the consumers are the same code: the same WGMMAs and exponentials
    assert cp.count("wgmma.mma_async.sync") == tma.count("wgmma.mma_async.sync")
    assert cp.count("ex2.approx") == tma.count("ex2.approx")


@pytest.mark.parametrize("schedule", ["serial", "overlap", "pingpong"])
def test_schedule_shows_in_the_ptx(schedule):
    """serial waits for every GEMM (wait_group 0 only); overlap keeps P V in flight during
    the softmax (wait_group 1); pingpong adds the two warpgroups' turn barriers: named
    barriers over both consumer warpgroups (256 threads)."""
    ptx = build.compile_attention(AttentionConfig(schedule=schedule)).ptx
    pv = 128 // 16
    overlapped = "wgmma.wait_group.sync.aligned \t1;" in ptx
    turns = re.findall(r"bar\.(?:arrive|sync)\s+%r\d+, 256;", ptx)
    assert overlapped == (schedule != "serial")
    assert bool(turns) == (schedule == "pingpong")
    per_loop = 128 // 16 + pv
    assert ptx.count("wgmma.mma_async.sync") == (per_loop if schedule == "serial"
                                                else 2 * per_loop)


def test_three_consumer_warpgroups_for_head_dim_64():
    """d = 64, block_m=192: three consumer warpgroups of 64 rows (512 threads, one more
    named barrier for pingpong's round of turns); K/V stages limited by shared memory
    (d = 256: two)."""
    cfg = AttentionConfig(head_dim=64, block_m=192, block_n=96, schedule="pingpong")
    assert (cfg.block_m, cfg.block_n, cfg.consumers, cfg.threads) == (192, 96, 3, 512)
    assert AttentionConfig(head_dim=256).stages == 2 and AttentionConfig().stages == 3
    ptx = build.compile_attention(cfg).ptx
    assert ".reqntid 512, 1, 1" in ptx
    assert "wgmma.mma_async.sync.aligned.m64n96k16.f32.f16.f16" in ptx
    turns = set(re.findall(r"bar\.(?:arrive|sync)\s+(%r\d+), 256;", ptx))
    assert turns  # barrier ids are computed (1 + w, 1 + (w + 1) % 3): registers, not literals


@pytest.mark.parametrize("load", ["tma", "cp_async"])
def test_two_q_buffers_trade_a_kv_stage(load):
    """q_stages=2: a full / empty barrier pair per Q buffer, paid for at d = 128 with a K/V
    stage (shared memory: 2 x 32 KiB of Q + 2 x 64 KiB of K/V); d = 256 has no room."""
    one = AttentionConfig(head_dim=128, load=load)
    two = AttentionConfig(head_dim=128, load=load, q_stages=2)
    assert (one.stages, two.stages) == (3, 2)
    inits = {c.q_stages: build.compile_attention(c).ptx.count("mbarrier.init")
             for c in (one, two)}
    assert inits == {1: 2 + 2 * 2 * 3, 2: 2 * 2 + 2 * 2 * 2}  # Q pairs + K and V rings
    with pytest.raises(ValueError, match="stages="):
        AttentionConfig(head_dim=256, q_stages=2)


def test_register_budgets_fit_the_register_file():
    """setmaxnreg.inc waits until the registers are free, and only the registers the launch
    gave the CTA are there to take: 64K / threads per thread, rounded down to 8 (168 for 384
    threads, so 128 x 504, not 64K). Budgets over that hang the consumers (48 / 232 did, on
    the H200), so every (load, consumer warpgroups) pair must fit, in steps of 8 in [24, 256]."""
    from cutetma.kernels.attention import REGISTERS, WARPGROUP

    for (load, consumers), (producer, consumer) in REGISTERS.items():
        warpgroups = 1 + consumers
        at_launch = (64 * 1024 // (warpgroups * WARPGROUP)) // 8 * 8
        assert producer + consumers * consumer <= warpgroups * at_launch, (load, consumers)
        assert all(r % 8 == 0 and 24 <= r <= 256 for r in (producer, consumer))
    for head_dim in (64, 128, 256):
        cfg = AttentionConfig(head_dim=head_dim)
        assert ("tma", cfg.consumers) in REGISTERS
    from cutetma.kernels.attention.config import PAIR_REGISTERS, PRODUCER_REGISTERS

    assert PAIR_REGISTERS == 3 * (64 * 1024 // (3 * WARPGROUP)) // 8 * 8
    for producer in PRODUCER_REGISTERS:  # ``producer_registers``: the consumers take the rest
        budget = AttentionConfig(producer_registers=producer).registers
        assert budget[0] == producer and producer + 2 * budget[1] <= PAIR_REGISTERS
        assert all(r % 8 == 0 and 24 <= r <= 256 for r in budget)


@pytest.mark.parametrize("head_dim", [64, 128])
def test_dense_tile_by_length(head_dim):
    """Non-causal keys that whole 128-key blocks do not cover run 160-key blocks where that
    saves a block of a short walk (ODD_KEY_BLOCK, ODD_KEY_BLOCK_MAX); everything else runs
    BLOCKS' keys with WIDE_ROWS' query rows (d = 64 non-causal: 192). The 160-key kernel
    compiles as the defaults do: no spills, no serialized WGMMA."""
    import re
    import shutil

    from cutetma.kernels.attention.config import dense_tile

    wide = (192, 128) if head_dim == 64 else (128, 128)
    odd = (128, 160)
    assert [dense_tile(head_dim, False, s) for s in (257, 300)] == [odd] * 2
    # d = 64 takes up to four 160-key blocks, d = 128 two (577 keys: 4 of 160, 5 of 128)
    assert dense_tile(head_dim, False, 577) == (odd if head_dim == 64 else wide)
    # a long walk; whole blocks; one block either way
    assert [dense_tile(head_dim, False, s) for s in (1000, 4097, 1024, 4096, 100)] == [wide] * 5
    assert dense_tile(head_dim, True, 577) == dense_tile(128, True, 16384) == (128, 128)
    # d = 64 causal: 192 rows from 8k keys (WIDE_ROWS_MIN_KEYS)
    assert dense_tile(64, True, 8191) == (128, 128) and dense_tile(64, True, 8192) == (192, 128)
    assert dense_tile(256, False, 577) == dense_tile(256, True, 4096) == (128, 80)
    cfg = AttentionConfig(head_dim=head_dim, block_m=odd[0], block_n=odd[1])
    ptx = build.compile_attention(cfg, "BFloat16").ptx
    assert "wgmma.mma_async.sync.aligned.m64n160k16.f32.bf16.bf16" in ptx
    if shutil.which("ptxas"):
        log = build.ptxas_log(ptx)
        assert "serialized" not in log
        assert max(int(x) for x in re.findall(r"(\d+) bytes spill stores", log)) == 0


def test_default_schedule_is_the_measured_best():
    assert AttentionConfig(head_dim=128).schedule == "overlap"
    assert AttentionConfig(head_dim=128, causal=True).schedule == "overlap"
    # d = 64: pingpong non-causal, overlap causal (the same for both dtypes)
    assert AttentionConfig(head_dim=64, causal=True).schedule == "overlap"
    assert AttentionConfig(head_dim=64).schedule == "pingpong"
    # d = 256: FlashAttention-3's 80-key stages with overlap, causal too, both with the wait
    # for P V after the softmax; d = 64 and 128 wait before it
    assert (AttentionConfig(head_dim=256).schedule, AttentionConfig(head_dim=256).block_n) == (
        "overlap", 80)
    causal_256 = AttentionConfig(head_dim=256, causal=True)
    assert (causal_256.schedule, causal_256.block_n, causal_256.pv_wait) == (
        "overlap", 80, "late")
    assert AttentionConfig(head_dim=128).pv_wait == AttentionConfig(head_dim=64).pv_wait == "early"
    assert set(BEST_SCHEDULE) == {(d, c) for d in (64, 128, 256) for c in (False, True)}
    assert AttentionConfig(head_dim=64, schedule="serial").schedule == "serial"
    # two Q buffers where they measured faster (d = 64 non-causal), one elsewhere
    assert AttentionConfig(head_dim=64).q_stages == 2
    assert AttentionConfig(head_dim=64, causal=True).q_stages == 1
    assert AttentionConfig(head_dim=128).q_stages == AttentionConfig(head_dim=256).q_stages == 1


@pytest.mark.parametrize("kwargs,match", [
    (dict(head_dim=96), "head_dim"), (dict(block_m=64), "block_m"),
    (dict(load="bulk"), "'tma' or 'cp_async'"), (dict(stages=1), "stages=1: 2 .. 3"),
    (dict(schedule="fast"), "schedule"), (dict(block_n=72), "multiple of 16"),
    (dict(head_dim=128, block_m=192), "only for head_dim 64"),
    (dict(head_dim=256, block_n=80, stages=3), "stages=3: 2 .. 2"),
    (dict(q_stages=3), "q_stages"), (dict(pv_wait="never"), "pv_wait"),
])
def test_config_refuses(kwargs, match):
    with pytest.raises(ValueError, match=match):
        AttentionConfig(**kwargs)


def test_reference_matches_torch_sdpa():
    import torch

    torch.manual_seed(0)
    q = torch.randn(2, 37, 4, 64)
    k = torch.randn(2, 37, 2, 64)
    v = torch.randn(2, 37, 2, 64)
    kk, vv = (x.repeat_interleave(2, dim=2).transpose(1, 2) for x in (k, v))
    for causal in (False, True):  # s_q == s_k: top-left and bottom-right agree
        out, lse = attention_ref(q, k, v, causal)
        want = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), kk, vv, is_causal=causal).transpose(1, 2)
        assert torch.allclose(out, want, atol=1e-5)
        s = q.transpose(1, 2) @ kk.transpose(-1, -2) / math.sqrt(64)
        if causal:
            s = s.masked_fill(torch.ones(37, 37, dtype=torch.bool).triu(1), float("-inf"))
        assert torch.allclose(lse, torch.logsumexp(s, -1), atol=1e-5)


def test_reference_causal_is_bottom_right_aligned():
    import torch

    q, k, v = torch.randn(1, 3, 1, 64), torch.randn(1, 5, 1, 64), torch.randn(1, 5, 1, 64)
    out, lse = attention_ref(q, k, v, causal=True)
    # query 0 of 3 against 5 keys sees keys 0..2 (5 - 3 = 2 positions of offset)
    p = torch.softmax((q[0, 0, 0] @ k[0, :3, 0].T) / 8.0, -1)
    assert torch.allclose(out[0, 0, 0], p @ v[0, :3, 0], atol=1e-5)


def test_entry_point_validates_before_anything_runs():
    import torch

    import cutetma

    q = torch.randn(1, 8, 4, 64, dtype=torch.float16)
    with pytest.raises(ValueError, match="CUDA"):
        cutetma.attention(q, q, q)
    with pytest.raises(TypeError, match="float16 or bfloat16"):
        cutetma.attention(q.float(), q.float(), q.float())
    with pytest.raises(ValueError, match=r"\(batch, seqlen, heads, head_dim\)"):
        cutetma.attention(q[0], q[0], q[0])


@pytest.mark.parametrize("load", ["tma", "cp_async"])
def test_compiles_for_tensors_as_the_torch_face_passes_them(load):
    """Strides with no divisibility claim and a dynamic head_dim, as from_dlpack gives: the
    kernel restores the 16-byte facts (a per-head slice would otherwise look 2-byte aligned
    and 16-byte cp.async would be refused)."""
    cfg = AttentionConfig(head_dim=128, load=load)
    ptx = build.compile_attention(cfg, as_from_dlpack=True).ptx
    assert "wgmma.mma_async" in ptx


@pytest.mark.parametrize("n", [64, 128, 256])
def test_accumulator_layout_is_what_the_kernel_assumes(n):
    """The kernel hardcodes where a thread's fp32 accumulator elements sit (masking, row
    reductions, the epilogue): value i of thread t is row 16 (t // 32) + (t % 32) // 4 +
    8 ((i // 2) % 2), column 8 (i // 4) + 2 (t % 4) + i % 2. Check it against the DSL's own
    TV layout of the m64nN WGMMA accumulator."""
    import numpy as np

    from cutetma import dsl, layouts

    cutlass, cute = dsl.cutlass()
    import cutlass.utils.hopper_helpers as sm90

    def tiled_mma_layout():
        k = cute.nvgpu.OperandMajorMode.K
        mma = sm90.make_trivial_tiled_mma(cutlass.Float16, cutlass.Float16, k, k,
                                          cutlass.Float32, (1, 1, 1), tiler_mn=(64, n))
        return layouts._spec_from_cute(mma.tv_layout_C)

    tv = dsl.on_host(tiled_mma_layout)
    t, v = np.meshgrid(np.arange(128), np.arange(64 * n // 128), indexing="ij")
    idx = tv.outer((t, v))  # offset in the column-major (64, n) tile
    row, col = idx % 64, idx // 64
    lane = t % 32
    assert np.array_equal(row, 16 * (t // 32) + lane // 4 + 8 * ((v // 2) % 2))
    assert np.array_equal(col, 8 * (v // 4) + 2 * (lane % 4) + v % 2)


def test_epilogue_quad_transpose_gives_each_thread_8_contiguous_columns():
    """The epilogue's shuffles (QUAD_TRANSPOSE_STEPS, applied as ``_quad_transpose`` does:
    the lane with bit m set sends word a and takes the partner's word into a, the other sends
    b and takes into b). Before: word q of lane t is its pair of 8-column group 4 k + q,
    columns 8 (4 k + q) + 2 t (the accumulator layout above). After: lane t must hold
    columns 32 k + 8 t + 2 q in word q, the 8 contiguous columns of chunk 4 k + t it stores."""
    from cutetma.kernels.attention.epilogue import QUAD_TRANSPOSE_STEPS

    k = 3  # any 32-column block
    words = [[8 * (4 * k + q) + 2 * t for q in range(4)] for t in range(4)]  # first column
    for m, a, b in QUAD_TRANSPOSE_STEPS:
        sent = [w[a] if t & m else w[b] for t, w in enumerate(words)]
        for t, w in enumerate(words):
            got = sent[t ^ m]  # shfl.bfly by m
            if t & m:
                w[a] = got
            else:
                w[b] = got
    assert words == [[32 * k + 8 * t + 2 * q for q in range(4)] for t in range(4)]
    assert len(QUAD_TRANSPOSE_STEPS) == 4  # 4 shuffles per 32 columns and row


@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_epilogue_stores_16_bytes(head_dim):
    """O leaves by one 16-byte store per 8 columns of each of a thread's two rows (d / 32
    chunks per row); the only 4-byte global stores are the LSE's, one per row."""
    ptx = build.compile_attention(AttentionConfig(head_dim=head_dim)).ptx
    assert ptx.count("st.global.v4.b32") == 2 * head_dim // 32
    assert len(re.findall(r"st\.global\.(?:b32|f32)\b", ptx)) == 2


def test_p_in_registers_is_the_a_operand():
    """P V takes P from registers: value j of a thread's A fragment (one k16 slice) must be
    the same (row, column) as accumulator value 8 kb + j of S, so converting S element by
    element yields the operand. Check the RS WGMMA's A TV layout against the formula."""
    import numpy as np

    from cutetma import dsl, layouts

    cutlass, cute = dsl.cutlass()
    import cutlass.utils.hopper_helpers as sm90
    from cutlass.cute.nvgpu import warpgroup

    def tiled_mma_layout():
        mma = sm90.make_trivial_tiled_mma(
            cutlass.Float16, cutlass.Float16, cute.nvgpu.OperandMajorMode.K,
            cute.nvgpu.OperandMajorMode.MN, cutlass.Float32, (1, 1, 1), tiler_mn=(64, 128),
            a_source=warpgroup.OperandSource.RMEM)
        return layouts._spec_from_cute(mma.tv_layout_A)

    tv = dsl.on_host(tiled_mma_layout)
    t, j = np.meshgrid(np.arange(128), np.arange(8), indexing="ij")
    idx = tv.outer((t, j))  # offset in the column-major (64, 16) A slice
    row, col = idx % 64, idx // 64
    lane = t % 32
    assert np.array_equal(row, 16 * (t // 32) + lane // 4 + 8 * ((j // 2) % 2))
    assert np.array_equal(col, 8 * (j // 4) + 2 * (lane % 4) + j % 2)


def test_custom_op_fake_shapes():
    import torch

    import cutetma.ops  # noqa: F401  (registers cutetma::attention)

    q = torch.empty(2, 100, 8, 128, dtype=torch.bfloat16, device="meta")
    k = torch.empty(2, 50, 2, 128, dtype=torch.bfloat16, device="meta")
    out, lse = torch.ops.cutetma.attention(q, k, k, True, None, "tma")
    assert out.shape == q.shape and out.dtype == q.dtype
    assert lse.shape == (2, 8, 100) and lse.dtype == torch.float32


def test_benchmark_summary_and_replot(tmp_path):
    """The attention benchmark's summary and plot from rows alone (no GPU): the numbers the
    issue asks for (d = 128 s >= 2k minimum, geomean over the grid, TMA vs cp.async)."""
    import json
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import attention as bench

    rows = [dict(dtype=dt, d=d, s=s, causal=c, cudnn=600.0, fa2=300.0, tma=540.0 + s / 1024,
                 cp_async=500.0, tma_overlap=480.0)
            for dt in ("float16", "bfloat16") for d in (64, 128) for s in (1024, 4096)
            for c in (False, True)]
    summary = bench.summarize(rows)
    assert summary["d128_s>=2k_min_tma_over_cudnn"] == pytest.approx(544 / 600)
    assert summary["cells_tma_beats_cp_async"] == summary["cells_timed_both"] == len(rows)
    assert summary["median_default_over_overlap"] > 1
    path = tmp_path / "attention.json"
    path.write_text(json.dumps({"meta": {}, "rows": rows}))
    assert bench.main(["--replot", str(path)]) == 0
    assert path.with_suffix(".png").stat().st_size > 10_000


def test_final_rounds_take_medians_and_keep_the_single_pass():
    """The grid's alternating rounds: every listed column (cuDNN first) is timed again in
    turn, its figure becomes the median of all its timings, the single pass stays in
    ``selection``; nothing happens without cuDNN beside it."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import attention as bench

    order, times = [], {"cudnn": iter([1.0, 3.0]), "tma": iter([2.0, 0.5])}

    def timer(fn):
        order.append(fn)
        return next(times[fn])

    timed = {"cudnn": ("cudnn", [2.0]), "tma": ("tma", [1.0]), "tma_overlap": ("x", [9.0])}
    row = {"cudnn": 1e3, "tma": 2e3, "tma_overlap": 5.0}
    bench.final_rounds(row, timed, ["cudnn", "tma"], 2, flops=1e12, timer=timer)
    assert order == ["cudnn", "tma", "cudnn", "tma"]
    assert row["cudnn"] == pytest.approx(1e12 / 2.0 / 1e9)  # median of 2, 1, 3 ms
    assert row["tma"] == pytest.approx(1e12 / 1.0 / 1e9)  # median of 1, 2, 0.5 ms
    assert row["selection"] == {"cudnn": 1e3, "tma": 2e3} and row["rounds"] == 3
    assert row["tma_overlap"] == 5.0  # timed once, left alone
    # the ablations are compared with the default's single pass, timed beside them
    assert bench.single_pass(row, "tma") == 2e3
    lone = {"tma": 1.0}
    bench.final_rounds(lone, {"tma": ("tma", [1.0])}, ["tma"], 2, 1e12, timer=timer)
    assert lone == {"tma": 1.0}


def test_sass_profile_counts_executed_instructions_by_opcode():
    """``attention_profile.py --source``'s summary: executed warp instructions summed by SASS
    opcode, predicate and modifiers dropped (how d = 256 was seen to run every exp2 twice)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import attention_profile

    rows = [{"Address": "0x0", "Source": "@!P0 MUFU.EX2 R1, R2", "Instructions Executed": "1,000",
             "Warp Stall Sampling (All Samples)": "5", "stall_wait": "3"},
            {"Address": "0x10", "Source": "MUFU.EX2 R3, R4", "Instructions Executed": "24",
             "Warp Stall Sampling (All Samples)": "1", "stall_wait": "0"},
            {"Address": "0x20", "Source": "FMUL R1, R2, R3", "Instructions Executed": "10",
             "Warp Stall Sampling (All Samples)": "0", "stall_wait": "0"}]
    summary = attention_profile.summarize_sass(rows)
    assert summary["executed_by_opcode"] == {"MUFU": 1024.0, "FMUL": 10.0}
    assert attention_profile._parse_spec(":float16:4096:256") == ("", "float16", 4096, 256)


def test_benchmark_columns():
    """What each row of the attention grid times: the defaults for both dtypes, the ablations
    for fp16 only (tma_other_q flips the default's Q buffers, d <= 128), exactly the columns
    asked for with --variants; the A/B-only columns stay out of the full run."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import attention as bench

    def names(*args):
        return [v[0] for v in bench.variants(*args)]

    assert names("bfloat16", 128, False) == ["tma", "cp_async"]
    full = names("float16", 128, False)
    assert {"tma_serial", "tma_overlap", "tma_pingpong", "tma_one_cta_per_tile",
            "tma_other_q"} <= set(full)
    assert "tma_two_q" not in full and "tma_two_kv_stages" not in full
    assert "tma_other_q" not in names("float16", 256, False)
    other = {v[0]: v[2] for v in bench.variants("float16", 64, False)}["tma_other_q"]
    assert other == {"block_m": 128, "block_n": 128, "q_stages": 1}  # two by default
    # the ablations run at the tile the default runs for the row's keys (dense_tile)
    at_4k = {v[0]: v[2] for v in bench.variants("float16", 64, False, None, (), 4096)}
    assert at_4k["tma_serial"] == {"block_m": 192, "block_n": 128, "schedule": "serial"}
    assert names("bfloat16", 128, True, ["tma", "tma_two_kv_stages"]) == [
        "tma", "tma_two_kv_stages"]
    # the wait for P V on the default's other side of the softmax (PV_WAIT)
    flip = {v[0]: v[2] for v in bench.variants("float16", 256, True)}["tma_other_pv_wait"]
    assert flip == {"block_m": 128, "block_n": 80, "pv_wait": "early"}
    assert "tma_other_pv_wait" in full
    # --custom: any AttentionConfig fields as a column of its own, beside the chosen ones
    custom = bench.parse_custom("n80o=block_n:80,schedule:overlap")
    assert custom == ("n80o", {"block_n": 80, "schedule": "overlap"})
    assert bench.variants("float16", 256, False, ["tma"], [custom]) == [
        ("tma", "tma", None), ("n80o", "tma", {"block_n": 80, "schedule": "overlap"})]


def _walk(cfg, seqlen_q, heads, batch, grid, splits=1):
    """The kernel's own work-item functions (``scheduler``), run as plain Python: each CTA's
    work items under the persistent round robin (or one item per CTA), an item being its
    (m_block, head, batch) tiles in the order the CTA runs them. (Inside ``dsl.on_host``: with
    plain ints the arithmetic is Python's, but the DSL wants its context around it.)"""
    from cutetma import dsl
    from cutetma.kernels.attention import scheduler

    def walk():
        items = scheduler.work_items.__wrapped__(cfg, seqlen_q, heads, batch, splits)
        per_cta = [[] for _ in range(min(grid, items) if cfg.persistent else items)]
        for item in range(items):
            tiles = [scheduler.tile_coords.__wrapped__(cfg, item, half, seqlen_q, heads, batch)
                     for half in range(scheduler.item_tiles.__wrapped__(cfg, item, seqlen_q))]
            per_cta[item % len(per_cta)].append(
                tiles if cfg.split_kv else [t[:3] for t in tiles])
        return per_cta

    return dsl.on_host(walk)


def _key_block_rows(cta):
    return sum(m + 1 for item in cta for m, _, _ in item)  # block_n = block_m at d = 128


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("m_blocks", [1, 2, 5, 33, 128])
def test_work_items_cover_every_tile_once_and_balance_causal(causal, m_blocks):
    """Each (query block, head, batch) tile is walked exactly once. Causal + persistent: an
    item is blocks M-1-i and i of one head (longest first), so every CTA gets the mean number
    of key-block rows within one pair and one lone middle block (odd M); the per-head
    numbering gave CTA 0 1.6x the mean at 16k tokens (next test), 1.45x slower on the H200."""
    cfg = AttentionConfig(head_dim=128, causal=causal)
    heads, batch = 16, 3
    walk = _walk(cfg, m_blocks * cfg.block_m - 7, heads, batch, grid=132)
    tiles = [t for cta in walk for item in cta for t in item]
    assert sorted(tiles) == sorted((m, h, b) for m in range(m_blocks) for h in range(heads)
                                   for b in range(batch))
    items = [item for cta in walk for item in cta]
    if not causal:
        assert all(len(item) == 1 for item in items)
        return
    for item in items:
        (m_hi, h, b), *rest = item
        assert len(rest) == (0 if 2 * m_hi == m_blocks - 1 else 1)
        assert all((m_lo, h_lo, b_lo) == (m_blocks - 1 - m_hi, h, b) and m_lo < m_hi
                   for m_lo, h_lo, b_lo in rest)
    work = [_key_block_rows(cta) for cta in walk]
    assert max(work) <= sum(work) / len(work) + (m_blocks + 1) + (m_blocks + 1) / 2


@pytest.mark.parametrize("causal", [False, True])
def test_split_kv_walks_every_split_of_every_tile_once(causal):
    """``split_kv``: each (query block, head, batch) tile is walked once per split, and the
    splits' key-block ranges (``block_range``) cover the tile's blocks exactly once, empty
    ranges included (more splits than blocks)."""
    from cutetma import dsl
    from cutetma.kernels.attention import scheduler

    cfg = AttentionConfig(head_dim=128, causal=causal, page_size=64, pack_gqa=True,
                          split_kv=True)
    heads, batch, splits = 3, 2, 5
    walk = _walk(cfg, 200, heads, batch, grid=132, splits=splits)
    tiles = [t for cta in walk for item in cta for t in item]
    assert sorted(tiles) == sorted((m, h, b, s) for m in range(2) for h in range(heads)
                                   for b in range(batch) for s in range(splits))
    for n in (0, 1, 3, 5, 7, 64):
        ranges = dsl.on_host(lambda n=n: [scheduler.block_range.__wrapped__(cfg, n, s, splits)
                                          for s in range(splits)])
        assert [j for lo, hi in ranges for j in range(lo, hi)] == list(range(n)), ranges


def test_old_per_head_numbering_was_unbalanced():
    """What the pairing fixes: the per-head longest-first numbering, which one CTA per tile
    keeps (the hardware fills in dynamically), walked round robin by 132 persistent CTAs."""
    walk = _walk(AttentionConfig(head_dim=128, causal=True, persistent=False), 16384, 16, 1,
                 grid=132)
    assert len(walk) == 2048 and all(len(cta) == 1 and len(cta[0]) == 1 for cta in walk)
    flat = [cta[0][0] for cta in walk]  # item order = launch order
    assert flat[0][0] == 127 and flat[127][0] == 0  # a head's longest block first
    work = [sum(flat[i][0] + 1 for i in range(c, 2048, 132)) for c in range(132)]
    assert max(work) / (sum(work) / len(work)) > 1.5
    paired = [_key_block_rows(cta) for cta in _walk(AttentionConfig(head_dim=128, causal=True),
                                                   16384, 16, 1, grid=132)]
    assert max(paired) / (sum(paired) / len(paired)) < 1.05


@pytest.mark.skipif(shutil.which("ptxas") is None, reason="needs ptxas (CUDA toolkit)")
@pytest.mark.parametrize("dtype", ["Float16", "BFloat16"])
def test_default_configs_keep_wgmma_async_without_spills(dtype):
    """ptxas on every default TMA configuration, as the torch face compiles it: no C7512
    ("wgmma.mma_async instructions are serialized due to insufficient register resources")
    and no spills. A strided persistent loop once cost bf16, d = 128 exactly this: 0.67x of
    its own fp16 speed on the H200, with nothing else wrong."""
    from cutetma.kernels.attention.config import WIDE_ROWS

    configs = [AttentionConfig(head_dim=d, causal=causal) for d, causal in BEST_SCHEDULE]
    configs += [AttentionConfig(head_dim=d, causal=causal, block_m=rows)
                for (d, causal), rows in WIDE_ROWS.items()]
    for cfg in configs:
        log = build.ptxas_log(build.compile_attention(cfg, dtype, as_from_dlpack=True).ptx)
        assert "C7512" not in log, (cfg, log)
        assert re.search(r"\b0 bytes spill stores, 0 bytes spill loads", log), (cfg, log)


@pytest.mark.skipif(shutil.which("ptxas") is None or build.find_nvdisasm() is None,
                    reason="needs ptxas and nvdisasm (the test extra's nvidia-cuda-nvdisasm)")
@pytest.mark.parametrize("dtype", ["BFloat16"])  # the loop's schedule is fp16's too
def test_softmax_sits_where_pv_wait_says_in_the_sass(dtype):
    """The SASS of the key-block loop, for every default overlap / pingpong configuration and
    d = 128 with the other wait: with pv_wait "late" no wait for P V lies between the wait for
    S and the softmax's exp2s (they run under P V); with "early" one does. And one exp2 per
    score (block_n / 2 per thread, plus the two rescale factors): ptxas wrote every d = 256
    exp2 twice while the wait sat in the softmax's block; and a wait for P V written before
    the softmax once ran the softmax after P V at every head dim. And no R2UR: the operand
    descriptors are built in uniform registers."""
    from cutetma.kernels.attention.config import WIDE_ROWS

    configs = [AttentionConfig(head_dim=d, causal=causal)
               for (d, causal), schedule in BEST_SCHEDULE.items() if schedule != "serial"]
    # three consumer warpgroups: with the early wait at 160 registers ptxas wrote every exp2
    # twice (122 a block); the late wait keeps one
    configs += [AttentionConfig(head_dim=d, causal=causal, block_m=rows)
                for (d, causal), rows in WIDE_ROWS.items()]
    configs.append(AttentionConfig(head_dim=128,
                                   pv_wait={"early": "late", "late": "early"}[PV_WAIT[128]]))
    for cfg in configs:
        loop = build.innermost_loop(
            build.sass(build.compile_attention(cfg, dtype, as_from_dlpack=True).ptx),
            ("tnspB", "MUFU.EX2"))
        wait_s = next(i for i, op in enumerate(loop) if op.startswith(
            "WARPGROUP.DEPBAR.LE gsb0, 0x1"))
        exps = [i for i, op in enumerate(loop) if op.startswith("MUFU.EX2")]
        waits_pv = [i for i, op in enumerate(loop) if op.startswith(
            "WARPGROUP.DEPBAR.LE gsb0, 0x0")]
        before_softmax = [i for i in waits_pv if wait_s < i < exps[0]]
        assert exps[0] > wait_s, cfg
        assert bool(before_softmax) == (cfg.pv_wait == "early"), (cfg, waits_pv, wait_s, exps)
        assert len(exps) == cfg.block_n // 2 + 2, (cfg, len(exps))
        # the operand descriptors stay in uniform registers (the consumer's warpgroup index
        # is marked warp-uniform): no R2UR moves per block (8 at d = 64 without the mark)
        assert not any(op.startswith("R2UR") for op in loop), cfg


@pytest.mark.parametrize("head_dim", [64, 128])
def test_key_mask_is_one_select_per_score(head_dim):
    """The mask of a block with keys past s_k (a non-causal tile's last block at every odd
    length, paged and varlen calls' too) is one compare per column and one select per score.
    Written as ``if dead: acc_s[i] = -inf``, each masked value became a branch yielding the
    whole fragment, and ptxas made the key loop's masked path 997 FSELs (1570 instructions
    against 640), so a masked block cost about three unmasked ones."""
    cfg = AttentionConfig(head_dim=head_dim)
    loop = build.innermost_loop(
        build.sass(build.compile_attention(cfg, "BFloat16", as_from_dlpack=True).ptx),
        ("tnspB", "MUFU.EX2"))
    selects = [op for op in loop if op.startswith("FSEL")]
    masks = [op for op in selects if "-INF" in op]
    # one per score of the thread's 64 x block_n / 128 (both rows share a column's test),
    # and a handful for the softmax's fully masked rows
    assert len(masks) == cfg.block_n // 2, len(masks)
    assert len(selects) <= cfg.block_n // 2 + 8, len(selects)


def test_pairwise_reduces_as_a_balanced_tree():
    """The softmax's row max and row sum: the same n - 1 combines as a chain, ceil(log2 n) deep
    (a chain of 32 was what one warp's softmax waited out at d = 128)."""
    def depth(a, b):
        return max(a, b) + 1

    assert pairwise([0] * 32, depth) == 5
    assert pairwise([0] * 33, depth) == 6
    assert pairwise([0], depth) == 0
    assert pairwise(list(range(1, 8)), lambda a, b: a + b) == 28


def _opcodes(ptx: str) -> list[str]:
    return [line.split()[0] for line in ptx.splitlines()
            if line.strip() and not line.lstrip().startswith("//")]


def test_both_dtypes_compile_to_one_loop_shape():
    """P is converted at the top of the next iteration in the source, so fp16 and bf16 give the
    same instructions in the same order, bar the types of the mask's selects. (Left to the
    compiler, bf16's conversion sank to the loop's top and fp16's did not: two loop shapes
    from one source, 96 conversions against 64, and fp16 ran 4-10% behind bf16.)"""
    cfg = AttentionConfig(head_dim=128)
    fp16 = _opcodes(build.compile_attention(cfg, "Float16", True).ptx)
    bf16 = _opcodes(build.compile_attention(cfg, "BFloat16", True).ptx)
    assert len(fp16) == len(bf16)
    differ = {(a, b) for a, b in zip(fp16, bf16, strict=True) if a != b.replace("bf16", "f16")}
    assert differ <= {("selp.b32", "selp.f32")}, differ


@pytest.mark.parametrize("cfg", [AttentionConfig(head_dim=128),
                                 AttentionConfig(head_dim=64, causal=True, load="cp_async")],
                         ids=["tma-d128", "cp_async-d64-causal"])
def test_pointer_entry_compiles_the_same_kernel(cfg):
    """``cutetma.attention`` launches ``FlashAttentionSm90.from_pointers`` (pointers, sizes,
    strides); the tensors it builds have the types the DLPack tensors of the tensor entry
    have, so the PTX is the same, name for name but the entry's."""
    import re

    from cutetma import dsl

    cutlass, cute = dsl.cutlass()
    from cutlass.cute.runtime import make_fake_stream, make_ptr

    from cutetma.kernels.attention import FlashAttentionSm90

    by_tensors = build.compile_attention(cfg, as_from_dlpack=True)

    def pointer(dtype, align=16):
        return make_ptr(dtype, 16, cute.AddressSpace.gmem, assumed_align=align)

    f16 = cutlass.Float16
    by_pointers = dsl.compile_ptx(
        FlashAttentionSm90(cfg).from_pointers, *(pointer(f16) for _ in range(4)),
        pointer(cutlass.Float32, 4), *(1,) * 18, cutlass.Float32(0.125), cutlass.Int32(132),
        make_fake_stream())

    def named_alike(ptx):
        return re.sub(r"\b\w*(FlashAttentionSm90|from_pointers|__call__)\w*\b", "ENTRY", ptx)

    assert "wgmma.mma_async" in by_pointers.ptx
    assert named_alike(by_pointers.ptx) == named_alike(by_tensors.ptx)


def test_launch_args_match_the_dsl():
    """``runtime.AttentionLaunch`` hands the compiled program the same argument list the DSL's
    own call builds: the address of each runtime value, checked by value behind every
    address, for the ``runtime.attention_launch`` that ``cutetma.attention`` compiles."""
    import ctypes

    import torch
    from cuda.bindings import driver as cuda
    from cutlass.cute.runtime import make_ptr

    from cutetma import dsl, runtime

    cutlass, cute = dsl.cutlass()
    cfg = AttentionConfig(head_dim=128)
    launch = runtime.attention_launch(torch.bfloat16, cfg)
    assert runtime.attention_launch(torch.bfloat16, cfg) is launch
    bases = [0x7F0000000000 + i * 0x100000 for i in range(5)]
    big = 1 << 33  # strides are 64-bit: a 32-bit slot anywhere would lose this
    sizes = (2, 1000, 4097, 16, 4, 128)
    strides = tuple(big + 16 * i for i in range(12))
    values = (*bases, *sizes, *strides, 0.125, 132, 0xABC)
    ours = launch.args(values)

    def ptr(address, dtype, align=16):
        return make_ptr(getattr(cutlass, dtype), address, cute.AddressSpace.gmem,
                        assumed_align=align)

    keep = [ptr(a, "BFloat16") for a in bases[:4]] + [ptr(bases[4], "Float32", 4)]
    theirs, _ = launch.compiled.generate_execution_args(
        *keep, *sizes, *strides, cutlass.Float32(0.125), cutlass.Int32(132),
        cuda.CUstream(0xABC))
    assert len(ours) == len(theirs) == len(runtime.AttentionLaunch.SLOTS) == 26

    def address(p):
        return p.value if isinstance(p, ctypes.c_void_p) else int(p)

    for i, (mine, dsl_arg) in enumerate(zip(ours, theirs, strict=True)):
        kind = runtime.AttentionLaunch.SLOTS[i]
        assert kind.from_address(address(mine)).value == values[i], i
        assert kind.from_address(address(dsl_arg)).value == values[i], i
