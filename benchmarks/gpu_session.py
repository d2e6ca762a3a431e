"""One GPU run on a Hopper card: checks first, then timings; everything lands under $OUT.

    python benchmarks/gpu_session.py [--quick] [--only STEP ...] [--pytest TARGET ...] \
        [--shards 4] [--test-timeout 120] [--tests-budget 400]

Steps, in this order unless ``--only`` names some:
``hardware`` (the hardware-swizzle check -> hw_swizzle.json); ``tests`` (pytest -m gpu in
``--shards`` child processes side by side, each every N-th test, each logging to
``pytest_gpu_<I>.txt``, with per-test and total timeouts, so a deadlocked kernel cannot take
the whole run); then the benchmarks: ``gemm_bench`` (benchmarks/gemm.py, about 8 minutes),
``gemm_tune``, ``gemm_headline`` (gemm_tune.py), ``gemm_widths`` (the ``WIDTH_ABS`` A/Bs
through gemm_ab.py), ``attention_bench`` (benchmarks/attention.py), ``paper_l2``
(paper/fig6_l2.py, Nsight Compute), ``tutorials`` (every tutorial, one log),
``paged_bench`` (benchmarks/paged.py), ``fp8_bench`` (the FP8 GEMM cells), ``peers`` (the
cells where FlashAttention-4 and QuACK led, both benchmarks), ``backward_bench``
(benchmarks/attention_bwd.py), ``layer_bench`` (its ``--layer``: forward + backward),
``fp8_attention`` (benchmarks/attention_fp8.py). A one-line
summary per step is printed last; logs and JSON go to $OUT (default ./gpu_out).

Example: the GEMM GPU tests in four shards, then the GEMM grid::

    OUT=/tmp/gpu_out python benchmarks/gpu_session.py --only tests gemm_bench \
        --pytest tests/test_gemm_gpu.py --shards 4
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

OUT = Path(os.environ.get("OUT", "gpu_out"))
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from gemm import PAPER_NK  # noqa: E402


def step_hardware(args):
    from cutetma import cli

    rc = cli.main(["swizzle", "hardware", "--out", str(OUT)] + (["--quick"] if args.quick else []))
    return f"hardware swizzle check rc={rc}"


def step_tests(args):
    """pytest -m gpu in child processes: a kernel that deadlocks then costs the per-test
    timeout (pytest-timeout's thread method ends the child with every stack dumped) or at
    most ``--tests-budget`` seconds, and the later steps still run. (In-process, a hung
    kernel blocks inside the CUDA driver where no Python timeout can interrupt it: that cost
    a whole 500-second call on 2026-11-30.) ``--shards N`` runs N children side by side,
    each every N-th test (``tests/conftest.py``'s ``--shard``): compiling the kernels, not
    running them, is most of a GPU test's time, and the machine has 16 cores."""
    from cutetma.runtime import cache

    # the shards share one compile cache, the user's (tests/conftest.py would give each its
    # own temporary folder): a second run, or one after `cutetma cache warm`, compiles little
    os.environ.setdefault("CUTETMA_CACHE_DIR", str(cache.cache_dir()))
    targets = args.pytest or [str(ROOT / "tests")]
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-v", "-p", "no:cacheprovider",
           *targets]
    if args.quick:
        cmd.append("-x")
    try:
        import pytest_timeout  # noqa: F401

        cmd += [f"--timeout={args.test_timeout}", "--timeout-method=thread"]
    except ImportError:
        pass
    return run_shards(cmd, shards_allowed(args.shards), args.tests_budget, OUT)


def shards_allowed(requested: int) -> int:
    """``requested``, or 1 where the GPU admits one process at a time (compute mode
    Exclusive_Process, as nvidia-smi reports it: the other shards could not open it)."""
    import subprocess

    try:
        mode = subprocess.run(["nvidia-smi", "--query-gpu=compute_mode", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return requested
    return 1 if "exclusive" in mode.lower() else requested


def run_shards(cmd: list, shards: int, budget: float, out: Path) -> str:
    """Run pytest ``cmd`` as ``shards`` children at once (``--shard I/N`` each; one child
    without it), each writing its verbose log ``pytest_gpu_<I>.txt`` under ``out``;
    children still running after ``budget`` seconds are killed. Returns the counts of the
    logs' verdicts (a killed child's tests that never reported are ``not reached``)."""
    import re
    import signal
    import subprocess

    children = []
    for i in range(shards):
        log = out / f"pytest_gpu_{i}.txt"
        argv = list(cmd)
        if shards > 1:
            argv.append(f"--shard={i}/{shards}")
        with open(log, "w") as f:  # the child keeps its own handle
            children.append((log, subprocess.Popen(
                argv, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True,
                env={**os.environ, "PYTHONUNBUFFERED": "1"})))  # a killed child's lines too
    deadline = time.time() + budget
    killed = 0
    for _, child in children:
        try:
            child.wait(timeout=max(deadline - time.time(), 0.1))
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
            killed += 1
    counts = {"passed": 0, "failed": 0, "error": 0, "skipped": 0}
    verdict = re.compile(r"::\S.* (PASSED|FAILED|ERROR|SKIPPED)\b")  # pytest -v's test lines
    for log, _ in children:
        for line in log.read_text(errors="replace").splitlines():
            found = verdict.search(line)
            if found:
                counts[found.group(1).lower()] += 1
                if found.group(1) in ("FAILED", "ERROR"):
                    print(line)
    summary = ", ".join(f"{n} {word}" for word, n in counts.items() if n)
    codes = sorted({child.returncode for _, child in children})
    tail = f"; {killed} of {shards} killed after {budget:.0f} s (not reached: the rest)" \
        if killed else ""
    return f"pytest -m gpu in {shards} shard(s): {summary or 'nothing ran'} (rc {codes}){tail}"


def step_gemm_bench(args):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import gemm

    rc = gemm.main(["--out", str(OUT)] + (["--quick"] if args.quick else []))
    return f"gemm benchmark rc={rc}"


def step_gemm_tune(args):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import gemm_tune

    return f"gemm tune rc={gemm_tune.main(['--out', str(OUT)])}"


def step_gemm_headline(args):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import gemm_tune

    return f"gemm headline rc={gemm_tune.main(['--out', str(OUT), '--headline-only'])}"


# tile widths in steps of 16 and past 256 (docs/perf-log.md): the one- and two-wave widths at
# M = 256 / 512 (cuBLAS's own tiles there) with and without a cluster, at M = 2048 where three
# or four waves fit, and 128 x 320 / 384 (cuBLAS's tile at 8192^3) at the headline shapes,
# each against cuBLAS and the default in alternating rounds
WIDTH_ABS = [
    ("gemm_fitted_m256_512", 3, [(m, n, k) for m in (256, 512) for n, k in PAPER_NK if n > 1536],
     ["ours", "ours:fit=1", "ours:fit=2", "ours:fit=1,cluster=1x2",
      "ours:fit=1,cluster=2x1", "ours:fit=2,cluster=1x2",
      "ours:tile=64x128,cluster=2x1"]),
    ("gemm_fitted_m2048", 3, [(2048, 5120, 5120), (2048, 5120, 12288), (2048, 5120, 16384),
                              (2048, 4096, 14336)],
     ["ours", "ours:fit=3", "ours:fit=4", "ours:fit=3,cluster=2x1"]),
    ("gemm_wide_tiles", 9, [(8192, 8192, 8192), (4096, 4096, 4096), (8192, 14336, 4096),
                            (512, 10240, 8192)],
     ["ours", "ours:tile=128x320", "ours:tile=128x320,cluster=2x1",
      "ours:tile=128x384,cluster=2x1",
      "ours:cluster=2x1"]),
]


def step_gemm_widths(args):
    """``WIDTH_ABS``: one interleaved A/B file each (``gemm_ab.py``), fp16."""
    import gemm_ab

    done = []
    for name, rounds, cells, kernels in WIDTH_ABS:
        cells = cells[:4] if args.quick else cells
        rc = gemm_ab.main(["--out", str(OUT), "--name", name, "--rounds", str(rounds),
                           "--cells", *("x".join(map(str, c)) for c in cells),
                           "--kernels", *kernels])
        done.append(f"{name} rc={rc}")
    return ", ".join(done)


def step_tutorials(args):
    """Run the GPU tutorials; each one's output is kept for its 'Measured on the H200' block."""
    import subprocess

    done, logs = [], []
    for script in sorted((ROOT / "tutorials").glob("[0-9][0-9]_*.py")):
        try:
            proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                                  timeout=240, cwd=ROOT)
            logs.append(f"===== {script.name} rc={proc.returncode}\n{proc.stdout}{proc.stderr}")
            done.append(f"{script.stem[:2]}:rc={proc.returncode}")
        except subprocess.TimeoutExpired:
            done.append(f"{script.stem[:2]}:timeout")
    (OUT / "tutorials.log").write_text("\n".join(logs))  # one file: $OUT returns at most 8
    return " ".join(done)


def step_attention_bench(args):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import attention

    rc = attention.main(["--out", str(OUT)] + (["--quick"] if args.quick else []))
    return f"attention rc={rc}"


def step_paged_bench(args):
    """benchmarks/paged.py: prefill, chunked prefill and decode, FA4 beside."""
    import paged

    paged.main(["--out", str(OUT)] + (["--quick"] if args.quick else []))
    return "paged done"


FP8_CELLS = ["4096x4096x4096", "8192x8192x8192", "4096x28672x4096", "3000x5000x3072",
             "512x8192x8192", "128x8192x8192"]


def step_fp8_bench(args):
    """FP8 GEMM cells (gemm.py --dtypes float8_e4m3fn): cutetma.scaled_gemm, both producers,
    every scaling, against torch._scaled_mm (gemm_fp8.json)."""
    import gemm

    cells = FP8_CELLS[:2] if args.quick else FP8_CELLS
    return "fp8 rc=" + str(gemm.main(["--out", str(OUT), "--dtypes", "float8_e4m3fn",
                                      "--name", "gemm_fp8", "--cells", *cells]))


def step_peers(args):
    """The cells where FlashAttention-4 and QuACK led, ours beside them (attention_peers.json,
    gemm_peers.json)."""
    import attention
    import gemm

    rc_a = attention.main(["--out", str(OUT), "--peer-cells", "--no-grid"])
    cells = ["x".join(map(str, c)) for c in gemm.PEER_CELLS]
    rc_g = gemm.main(["--out", str(OUT), "--dtypes", "bfloat16", "--name", "gemm_peers",
                      "--cells", *cells, "4096x4096x4096", "8192x8192x8192"])
    return f"attention rc={rc_a}, gemm rc={rc_g}"


def step_backward_bench(args):
    """benchmarks/attention_bwd.py: the attention backward against FA4 and cuDNN."""
    import attention_bwd

    return "backward rc=" + str(attention_bwd.main(["--out", str(OUT)]
                                                   + (["--quick"] if args.quick else [])))


def step_layer_bench(args):
    """benchmarks/attention_bwd.py --layer: a training layer's forward + backward against FA4
    and cuDNN (d = 128, s = 8k; attention_layer.json)."""
    import attention_bwd

    return "layer rc=" + str(attention_bwd.main(["--out", str(OUT), "--layer", "--head-dims",
                                                 "128", "--seqlens", "8192"]))


def step_fp8_attention(args):
    """benchmarks/attention_fp8.py: FP8 attention against our bf16 kernel."""
    import attention_fp8

    return "fp8 attention rc=" + str(attention_fp8.main(["--out", str(OUT)]
                                                       + (["--quick"] if args.quick else [])))


def step_paper_l2(args):
    """Figure 6 (b): L2 read sectors through Nsight Compute (benchmarks/paper/fig6_l2.py)."""
    sys.path.insert(0, str(ROOT / "benchmarks" / "paper"))
    import fig6_l2

    return f"fig6_l2 rc={fig6_l2.main(['--out', str(OUT)] + (['--quick'] if args.quick else []))}"


STEPS = {"hardware": step_hardware, "tests": step_tests, "gemm_bench": step_gemm_bench,
         "gemm_tune": step_gemm_tune, "gemm_headline": step_gemm_headline,
         "gemm_widths": step_gemm_widths,
         "tutorials": step_tutorials, "attention_bench": step_attention_bench,
         "paper_l2": step_paper_l2, "paged_bench": step_paged_bench,
         "fp8_bench": step_fp8_bench, "peers": step_peers,
         "backward_bench": step_backward_bench, "layer_bench": step_layer_bench,
         "fp8_attention": step_fp8_attention}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", nargs="*", default=list(STEPS))
    ap.add_argument("--pytest", nargs="*", default=None, help="pytest targets for the tests step")
    ap.add_argument("--test-timeout", type=int, default=120, help="seconds per GPU test")
    ap.add_argument("--tests-budget", type=int, default=400,
                    help="seconds for the whole tests step")
    ap.add_argument("--shards", type=int, default=4,
                    help="pytest processes side by side in the tests step")
    args = ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    summary = []
    for name in args.only:
        t0 = time.time()
        print(f"\n===== {name}", flush=True)
        try:
            summary.append(f"{name}: {STEPS[name](args)} ({time.time() - t0:.0f} s)")
        except Exception as exc:  # keep going: one broken step must not cost the others
            import traceback

            traceback.print_exc()
            summary.append(f"{name}: FAILED {type(exc).__name__}: {exc} ({time.time() - t0:.0f} s)")
    print("\n===== summary")
    print("\n".join(summary))


if __name__ == "__main__":
    sys.exit(main())
