"""Nsight Compute counters for the attention forward: ours (TMA, the default configuration)
and cuDNN (torch SDPA) side by side, d = 128 fp16, at a short and a middle sequence length
(s = 512 and 2k, 16k tokens, 16 heads), non-causal: where the gap to cuDNN is widest and where
it closes.

    python benchmarks/attention_profile.py OUT.json [--cells D:S ...]

The launches inside the NVTX range "profile" are measured (compiles and warm-ups are
outside it); ``gemm_profile.run_ncu`` builds the ncu command and writes the table.
``--cells``: other (head dim, sequence length) cells, non-causal, 16k tokens, 2048 / d heads.
The L2 counters say whether a cell streams K / V at the L2's limit.

    python benchmarks/attention_profile.py --source OUT_DIR [SCHEDULE[:DTYPE[:SEQLEN[:D]]] ...]

profiles ours alone (non-causal; fp16, s = 512 and d = 128 unless named; an empty schedule is
the cell's default) once per spec with
ncu's source counters and writes, per spec, the SASS listing with its warp-stall samples
(``attention_sass_<spec>.csv.gz``) and the launch's time, clock and instruction count with the
instructions where warps wait most and the reasons (``attention_sass_<spec>.json``): which
barrier, load or GEMM wait the time goes to.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gemm_profile import METRICS, profile_source, run_ncu, summarize_sass  # noqa: E402,F401

# what the attention gap could be: tensor pipe idle (bubbles between tiles, the first
# block's softmax), warps waiting on barriers (mbarrier waits show as long scoreboard or
# barrier), or the softmax's instructions themselves (issue-bound: math pipe throttle)
ATTENTION_METRICS = METRICS + [
    "smsp__average_warps_issue_stalled_wait_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio",
    "smsp__issue_active.avg.pct_of_peak_sustained_active",
    "lts__t_bytes.sum.per_second",  # L2 traffic (all clients), bytes/s
    "lts__throughput.avg.pct_of_peak_sustained_elapsed",
    # the softmax's pipes: MUFU (ex2) is the XU pipe, its waits short scoreboard and MIO
    # throttle; at d = 64 its exps need as many cycles as the tensor pipe's GEMMs
    "sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active",
    "sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active",
    "sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active",
    "smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio",
]
SEQLENS = (512, 2048)
DEFAULT_CELLS = tuple(f"128:{s}" for s in SEQLENS)
CELLS_ENV = "CUTETMA_PROFILE_CELLS"  # how the ncu child learns the parent's --cells


def parse_cells(specs):
    """``D:S`` -> [(d, s)]."""
    cells = []
    for spec in specs:
        parts = spec.split(":")
        if len(parts) != 2 or not all(p.isdigit() for p in parts):
            raise SystemExit(f"--cells {spec!r}: D:S")
        cells.append((int(parts[0]), int(parts[1])))
    return cells


def launch_names(cells):
    """The profiled launches in order, one name each."""
    names = []
    for d, s in cells:
        names += [f"ours_tma_d{d}_s{s}", f"cudnn_d{d}_s{s}"]
    return names


# the SASS profile (--source): its default sequence length
SOURCE_SEQLEN = 512


def workload():
    import os

    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import cutetma

    calls = []
    for d, s in parse_cells(os.environ.get(CELLS_ENV, "").split()
                                          or DEFAULT_CELLS):
        q, k, v = (torch.randn(16384 // s, s, 2048 // d, d, device="cuda",
                               dtype=torch.float16) for _ in range(3))
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))

        def cudnn(qt=qt, kt=kt, vt=vt):
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return torch.nn.functional.scaled_dot_product_attention(qt, kt, vt)

        calls += [lambda q=q, k=k, v=v: cutetma.attention(q, k, v), cudnn]
    for fn in calls:  # compile and warm up outside the profiled range
        fn()
        fn()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_push("profile")
    for fn in calls:  # in launch_names() order
        fn()
        torch.cuda.synchronize()
    torch.cuda.nvtx.range_pop()


def _parse_spec(spec: str):
    """``schedule[:dtype[:seqlen[:head_dim]]]`` -> (schedule, dtype, seqlen, head_dim); an
    empty schedule is the default one for the cell."""
    parts = spec.split(":")
    return (parts[0], parts[1] if len(parts) > 1 else "float16",
            int(parts[2]) if len(parts) > 2 else SOURCE_SEQLEN,
            int(parts[3]) if len(parts) > 3 else 128)


def source_workload(spec: str):
    """Ours once inside the NVTX range (the SASS profile's launch). ``spec``:
    ``schedule[:dtype[:seqlen[:head_dim]]]``, e.g. ``overlap``, ``overlap:bfloat16:2048`` or
    ``:float16:4096:256`` (non-causal, 16k tokens, 2048 / d heads; fp16, s = 512 and d = 128
    where not named)."""
    import torch

    import cutetma
    from cutetma import AttentionConfig

    schedule, dtype, s, d = _parse_spec(spec)
    q, k, v = (torch.randn(16384 // s, s, 2048 // d, d, device="cuda",
                           dtype=getattr(torch, dtype)) for _ in range(3))
    cfg = AttentionConfig(head_dim=d, schedule=schedule)

    def call():
        return cutetma.attention(q, k, v, softmax_scale=d ** -0.5, config=cfg, return_lse=True)

    for _ in range(2):
        call()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_push("profile")
    call()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_pop()


def run_source(out_dir: Path, specs) -> int:
    """One ncu source-counter profile per spec (``schedule[:dtype[:seqlen[:head_dim]]]``)."""
    status = 0
    for spec in specs:
        schedule, dtype, seqlen, head_dim = _parse_spec(spec)
        status = status or profile_source(
            out_dir, "attention_sass", spec.replace(":", "_").strip("_") or "default",
            [__file__, "--source-workload", spec],
            {"schedule": schedule, "dtype": dtype, "seqlen": seqlen, "head_dim": head_dim})
    return status


if __name__ == "__main__":
    if "--workload" in sys.argv:
        workload()
    elif "--source-workload" in sys.argv:
        source_workload(sys.argv[sys.argv.index("--source-workload") + 1])
    elif "--source" in sys.argv:
        rest = sys.argv[sys.argv.index("--source") + 1:]
        sys.exit(run_source(Path(rest[0]), rest[1:] or ["overlap", "pingpong"]))
    else:
        import os

        args = sys.argv[1:]
        cells = args[args.index("--cells") + 1:] if "--cells" in args else list(DEFAULT_CELLS)
        args = args[:args.index("--cells")] if "--cells" in args else args
        os.environ[CELLS_ENV] = " ".join(cells)
        out = Path(args[0]) if args else Path("attention_profile.json")
        sys.exit(run_ncu(out, __file__, ATTENTION_METRICS, launch_names(parse_cells(cells))))
