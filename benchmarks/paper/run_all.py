"""The seed paper's microbenchmarks (Figures 4, 6 and 7) on one Hopper GPU, one command.

    python benchmarks/paper/run_all.py --out benchmarks/results [--quick]

Runs ``fig4.py``, ``fig6.py``, ``fig7.py`` and ``fig6_l2.py`` (Figure 6 (b), Nsight Compute
counters; needs ``ncu``), each in its own process under a time limit (a hung kernel costs one
figure, not the run; every figure rewrites its JSON as it goes, so a figure that is
stopped keeps what it measured), then ``summarize.py``. Writes ``paper_fig4.json`` /
``.png``, ``paper_fig6.*``, ``paper_fig7.*`` and ``paper_fig6_l2.*`` into --out (default
``benchmarks/results``). ``--in-process`` runs the figures in this process instead.

This module also holds what the three figure scripts share: progress bar, CUDA-event
timing, L2 flush, random data, torch -> CuTe conversion, the compile cache, the plot
boilerplate and the command line (``figure_main``).
"""

from __future__ import annotations

import argparse
import functools
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
# seconds each may take (under 10 min in all); fig6_l2 is Figure 6 (b), Nsight Compute counters
FIGURES = {"fig4": 200, "fig6": 120, "fig7": 150, "fig6_l2": 110}
SLEEP_CYCLES = 2_000_000  # ~1 ms of GPU busy-wait ahead of each timed launch
L2_FLUSH_BYTES = 256 << 20  # > 5x the H200's 50 MB L2
DEVICE = "cuda"  # where buffers and checks live (a test harness may point it elsewhere)


# ------------------------------------------------------------------ shared helpers
class progress:  # noqa: N801 - used like tqdm
    """tqdm when installed; else a plain bar printed every few seconds."""

    def __init__(self, iterable, total: int, desc: str):
        self.iterable, self.total, self.desc = iterable, total, desc

    def __iter__(self):
        try:
            from tqdm import tqdm

            yield from tqdm(self.iterable, total=self.total, desc=self.desc, file=sys.stdout,
                            mininterval=2, ncols=100)
            return
        except ImportError:
            pass
        t0 = last = time.time()
        for i, item in enumerate(self.iterable):
            now = time.time()
            if i == 0 or now - last > 3:
                self._line(i, now - t0)
                last = now
            yield item
        self._line(self.total, time.time() - t0)

    def _line(self, done: int, seconds: float):
        width = 30
        fill = width * done // max(1, self.total)
        print(f"{self.desc}: [{'#' * fill}{'.' * (width - fill)}] {done}/{self.total} "
              f"{seconds:5.0f} s", flush=True)


def cute_tensor(t):
    """A torch tensor as a CuTe tensor of dynamic shape (its last dimension contiguous)."""
    from cutlass.cute.runtime import from_dlpack

    return from_dlpack(t, assumed_align=16).mark_layout_dynamic(leading_dim=t.dim() - 1)


def stream():
    import torch
    from cuda.bindings import driver as cuda

    return cuda.CUstream(torch.cuda.current_stream().cuda_stream)


_COMPILED: dict = {}
COMPILE_SECONDS = [0.0]


def compiled(key, make_kernel, *args):
    """Compile ``make_kernel()`` for these arguments once per ``key`` (a config)."""
    if key not in _COMPILED:
        from cutetma import dsl

        _, cute = dsl.cutlass()
        t0 = time.time()
        _COMPILED[key] = cute.compile(make_kernel(), *args)
        COMPILE_SECONDS[0] += time.time() - t0
    return _COMPILED[key]


def gpu_ms(fn, reps: int) -> list[float]:
    """Milliseconds of each of ``reps`` calls of ``fn``, by CUDA events. A busy-wait kernel
    runs ahead of every call, so the host's launch cost (tens of microseconds for a DSL
    call) is hidden behind it instead of counted as GPU time."""
    import torch

    pairs = []
    for _ in range(reps):
        torch.cuda._sleep(SLEEP_CYCLES)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        pairs.append((start, end))
    torch.cuda.synchronize()
    return [s.elapsed_time(e) for s, e in pairs]


@functools.cache
def _l2_buffer():
    import torch

    return torch.empty(L2_FLUSH_BYTES, dtype=torch.uint8, device=DEVICE)


def flush_l2():
    """Evict the L2 (write a buffer several times its size), as triton's do_bench does."""
    _l2_buffer().zero_()


def random_words(nbytes: int, seed: int = 0):
    """``nbytes`` of random bits on the GPU as a 1D float32 tensor (copies move bits; every
    check compares int32 views, so NaN patterns are fine)."""
    import torch

    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    words = torch.randint(-2**31, 2**31 - 1, (nbytes // 4,), dtype=torch.int32, device=DEVICE,
                          generator=gen)
    return words.view(torch.float32)


@functools.cache
def sm_count() -> int:
    import torch

    return torch.cuda.get_device_properties(0).multi_processor_count


@functools.cache
def max_active_clusters(n: int) -> int:
    """Clusters of ``n`` CTAs (one CTA per SM) that fit on the GPU at once; 0 if none."""
    from cutetma import dsl

    dsl.cutlass()
    import cutlass.utils as utils

    return int(utils.HardwareInfo().get_max_active_clusters(n))


def error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".replace("\n", " ")[:400]


def median(values):
    import statistics

    return statistics.median(values) if values else None


def quantile(values, q: float):
    values = sorted(values)
    return values[min(len(values) - 1, max(0, round(q * (len(values) - 1))))] if values else None


class Writer:
    """Rewrites ``<out>/<name>.json`` every ``every_s`` seconds and at the end, so a figure
    stopped by the time limit keeps its rows (meta ``complete`` says whether it finished)."""

    def __init__(self, name: str, out: Path, meta: dict, every_s: float = 20.0):
        self.name, self.out, self.meta, self.every_s = name, Path(out), meta, every_s
        self.rows: list[dict] = []
        self.t0 = self.last = time.time()

    def add(self, row: dict):
        self.rows.append(row)
        if time.time() - self.last > self.every_s:
            self.flush(complete=False)

    def flush(self, complete: bool, summary: dict | None = None) -> Path:
        from cutetma import results

        self.last = time.time()
        meta = {**self.meta, "complete": complete, "seconds": round(time.time() - self.t0),
                "compile_seconds": round(COMPILE_SECONDS[0], 1)}
        if summary is not None:
            meta["summary"] = summary
        return results.write(self.name, self.rows, self.out, extra_meta=meta)


def ok_rows(rows, **match):
    return [r for r in rows if "error" not in r and all(r.get(k) == v for k, v in match.items())]


def pyplot():
    """matplotlib.pyplot on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: Path):
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def ratio_plot(path: Path, lines, xlabel: str, ylabel: str, title: str, **legend):
    """One axes of runtime ratios against a log2 x axis, with the line at 1.0; ``lines`` are
    ``(xs, ys, plot keyword arguments)``, ``legend`` the legend's keyword arguments."""
    fig, ax = pyplot().subplots(figsize=(6, 4), dpi=90)
    for xs, ys, style in lines:
        ax.plot(xs, ys, **style)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.legend(**legend)
    save_figure(fig, path)


def figure_main(argv, doc: str, name: str, run, summarize, plot,
                unsupported_is_error: bool = True) -> int:
    """A figure script's command line: ``run(quick, writer)``, then the JSON with
    ``summarize(rows)`` in its meta, then ``plot(rows, <out>/<name>.png)``. Exit status 1 when
    a row has an error (rows refused as ``unsupported`` too, unless ``unsupported_is_error``
    is false)."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a few points, for a smoke test")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    args = ap.parse_args(argv)
    out = Path(args.out)
    writer = Writer(name, out, {"quick": args.quick, "sms": sm_count()})
    t0 = time.time()
    run(args.quick, writer)
    path = writer.flush(complete=True, summary=summarize(writer.rows))
    png = out / f"{name}.png"
    plot(writer.rows, png)
    errors = [r for r in writer.rows if "error" in r
              and (unsupported_is_error or not r["error"].startswith("unsupp"))]
    print(f"wrote {path} and {png} ({len(writer.rows)} rows, "
          f"{len(errors)} errors, {time.time() - t0:.0f} s)")
    for r in errors[:10]:
        print(f"  error: {r}")
    return 1 if errors else 0


# ------------------------------------------------------------------ the driver
def _run_subprocess(name: str, argv: list[str], limit_s: int) -> str:
    t0 = time.time()
    try:
        rc = subprocess.run([sys.executable, str(HERE / f"{name}.py"), *argv],
                            timeout=limit_s, cwd=ROOT).returncode
        return f"{name}: rc={rc} ({time.time() - t0:.0f} s)"
    except subprocess.TimeoutExpired:
        return (f"{name}: STOPPED after {limit_s} s (time limit); its JSON holds the rows "
                f"measured so far (meta.complete = false)")


def _run_in_process(name: str, argv: list[str]) -> str:
    import importlib

    t0 = time.time()
    try:
        rc = importlib.import_module(name).main(argv)
        return f"{name}: rc={rc} ({time.time() - t0:.0f} s)"
    except Exception as exc:  # keep going: one broken figure must not cost the others
        import traceback

        traceback.print_exc()
        return f"{name}: FAILED {error_text(exc)} ({time.time() - t0:.0f} s)"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    ap.add_argument("--quick", action="store_true", help="a few points per figure (smoke test)")
    ap.add_argument("--only", nargs="*", default=list(FIGURES), choices=list(FIGURES))
    ap.add_argument("--in-process", action="store_true",
                    help="run the figures in this process (no time limit per figure)")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    fig_argv = ["--out", str(out)] + (["--quick"] if args.quick else [])
    lines = []
    t0 = time.time()
    for name in args.only:
        print(f"\n===== {name}", flush=True)
        if args.in_process:
            lines.append(_run_in_process(name, fig_argv))
        else:
            lines.append(_run_subprocess(name, fig_argv, FIGURES[name]))
    print(f"\n===== done in {time.time() - t0:.0f} s")
    print("\n".join(lines))
    print("\n===== summary (benchmarks/paper/summarize.py)")
    import summarize

    summarize.main(["--dir", str(out)])
    return 0


if __name__ == "__main__":
    sys.exit(main())
