"""Sustained GEMM throughput under the H200's power cap: cuBLAS and ours (``cutetma.gemm``,
no options) each run back to back for several seconds, alternating, while nvidia-smi reports
the SM clock and the power drawn.

    python benchmarks/gemm_sustained.py [--seconds 6] [--out DIR] \
        [--cells MxNxK ...] [--grid-m 2048 8192] \
        [--kernels cublas ours ours:cluster=2x1 ...]

Why: short, cool runs (a dozen cells, seconds each) and long hot ones can rank kernels
differently: under the card's power cap a kernel that spends more energy per FLOP runs at a
lower clock. Each row: one kernel's phase, its TFLOP/s over the whole phase (timed by CUDA
events around the loop), and the median SM clock and power sampled during it.
Every contender runs as replays of a CUDA graph of ``GRAPH_CALLS`` calls (``--eager``: plain
calls), so the host's cost per call (tens of microseconds for an eager ``cutetma.gemm``)
cannot idle the GPU between short kernels.
``--kernels``: ``cublas``, ``ours`` (``cutetma.gemm`` with no options) or ``ours:`` with
``select_gemm_config`` options and ``GemmConfig`` fields (``key=value`` separated by commas;
``2x1`` is a tuple; ``gemm.gemm_config``), or ``nvidia:tile=128x256,cluster=1x2`` for
NVIDIA's CuTe DSL example (``nvidia_peer.py``, with ``--nvidia-example PATH``):
which of our configurations spends least energy per FLOP once the card sits at its cap (a
cooler, shorter run can rank them differently). The kernels take turns, ``--rounds`` times.
``--grid-m``: the grid's 18 cells at each M given, after ``--cells``. Writes
``gemm_sustained.json`` (``--name``) after every cell; its summary: the geometric mean over
the cells of each spec over cuBLAS and over the first ``ours`` spec.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gemm import CONFIG_FIELDS, gemm_config, ours  # noqa: E402,F401

CELLS = [(8192, 14336, 4096), (8192, 8192, 8192)]
KERNELS = ("cublas", "ours")


def parse_kernel(spec: str) -> dict | None:
    """``cublas`` -> None; ``ours[:k=v,...]`` -> the ``cutetma.gemm`` keyword arguments
    (``2x1`` -> (2, 1), digits -> int); ``nvidia[:k=v,...]`` -> NVIDIA's example's
    arguments (``nvidia_peer.gemm_fn``) with ``peer="nvidia"``."""
    if spec == "cublas":
        return None
    name, _, args = spec.partition(":")
    if name not in ("ours", "nvidia"):
        raise SystemExit(f"--kernels {spec!r}: cublas, ours[:key=value,...] or "
                         "nvidia[:key=value,...]")
    kwargs = {"peer": "nvidia"} if name == "nvidia" else {}
    for field in filter(None, args.split(",")):
        key, _, value = field.partition("=")
        if not key or not value:
            raise SystemExit(f"--kernels {spec!r}: key=value pairs after '{name}:'")
        if "x" in value and value.replace("x", "").isdigit():
            kwargs[key] = tuple(int(v) for v in value.split("x"))
        else:
            kwargs[key] = int(value) if value.isdigit() else value
    return kwargs


def spec_config(kwargs: dict, m: int, n: int, k: int, sm_count: int = 132):
    """The ``GemmConfig`` a spec that sets ``CONFIG_FIELDS`` names (``gemm.gemm_config``:
    ``select_gemm_config`` with the spec's options, those fields replaced); None when it sets
    none of them."""
    if not any(key in kwargs for key in CONFIG_FIELDS):
        return None
    return gemm_config(kwargs, m, n, k, sm_count)


def contender(kwargs: dict | None, a, b):
    """The callable a spec names: cuBLAS (``None``), NVIDIA's example (``peer="nvidia"``)
    or ``cutetma.gemm`` (``gemm.ours``: the library's own choice, or ``config=`` the spec's
    ``GemmConfig``; ``placed=0``: with the scheduler's default raster order,
    ``cutetma.placement`` switched off)."""
    if kwargs is None:
        return lambda: a @ b.T
    if kwargs.get("peer") == "nvidia":
        import nvidia_peer

        return nvidia_peer.gemm_fn(a, b, **{k: v for k, v in kwargs.items() if k != "peer"})
    from cutetma.runtime import placement, sm_count

    if kwargs.get("placed") == 0:
        inner = contender({key: v for key, v in kwargs.items() if key != "placed"}, a, b)

        def unplaced():
            with placement.switched_off():
                return inner()
        return unplaced
    return ours(a, b, kwargs, sm_count(a.device.index))


def load_peer(path: str | None) -> dict:
    """Import NVIDIA's example when ``--nvidia-example`` is given; its path and hash for
    ``meta`` (empty without it)."""
    if not path:
        return {}
    import nvidia_peer

    return nvidia_peer.load(path)


def sample_clocks(stop: threading.Event, samples: list, period: float = 0.25):
    """The SM clock (MHz) and power (W) every ``period`` seconds until ``stop`` (the
    nvidia-smi query that every results file's ``meta.clocks`` comes from)."""
    from cutetma import results

    while not stop.is_set():
        now = results.clocks()
        try:
            samples.append((float(now["sm_clock"].split()[0]), float(now["power"].split()[0])))
        except (KeyError, ValueError, IndexError):
            pass
        stop.wait(period)


GRAPH_CALLS = 20  # calls per captured graph: one replay costs the host a few microseconds


def sustained(fn, seconds: float, flops: float, calls_per_fn: int = 1) -> dict:
    """Run ``fn`` (``calls_per_fn`` GEMMs) back to back for about ``seconds``: TFLOP/s
    over the phase, with the clock and power sampled during it."""
    import torch

    samples: list = []
    stop = threading.Event()
    sampler = threading.Thread(target=sample_clocks, args=(stop, samples), daemon=True)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    sampler.start()
    calls = 0
    t0 = time.perf_counter()
    start.record()
    while time.perf_counter() - t0 < seconds:
        for _ in range(20):
            fn()
        calls += 20 * calls_per_fn
        torch.cuda.synchronize()  # keep the host within a batch of the device
    end.record()
    torch.cuda.synchronize()
    stop.set()
    sampler.join()
    ms = start.elapsed_time(end)
    return {"tflops": flops * calls / ms / 1e9, "calls": calls, "seconds": ms / 1e3,
            "sm_clock_mhz": statistics.median(c for c, _ in samples) if samples else None,
            "power_w": statistics.median(p for _, p in samples) if samples else None,
            "samples": len(samples)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=6.0, help="length of each phase")
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--dtype", default="float16", choices=["float16", "bfloat16"])
    ap.add_argument("--cells", nargs="*", metavar="MxNxK", help="shapes (default: CELLS)")
    ap.add_argument("--grid-m", nargs="*", type=int, metavar="M",
                    help="add the grid's cells (the paper's 18 (N, K)) with these M")
    ap.add_argument("--kernels", nargs="*", default=list(KERNELS), metavar="SPEC")
    ap.add_argument("--rounds", type=int, default=2, help="turns of every kernel per cell")
    ap.add_argument("--name", default="gemm_sustained")
    ap.add_argument("--eager", action="store_true",
                    help="plain calls, host cost included (default: CUDA-graph replays)")
    ap.add_argument("--nvidia-example", metavar="PATH",
                    help="NVIDIA's dense_gemm_persistent.py, for nvidia:... specs")
    args = ap.parse_args(argv)
    peer_meta = load_peer(args.nvidia_example)
    cells = [tuple(int(x) for x in c.split("x")) for c in args.cells or ()]
    cells += grid_cells(args.grid_m or ())
    cells = cells or CELLS
    specs = {spec: parse_kernel(spec) for spec in args.kernels}
    import torch

    from cutetma import results

    rows = []
    for m, n, k in cells:
        t = getattr(torch, args.dtype)
        a = torch.randn(m, k, device="cuda", dtype=t)
        b = torch.randn(n, k, device="cuda", dtype=t)
        ref = (a @ b.T).float()
        kernels = {}
        for spec, kwargs in specs.items():
            kernels[spec] = contender(kwargs, a, b)
            if kwargs is None:
                continue
            rel = ((kernels[spec]().float() - ref).abs().max() / ref.abs().max()).item()
            if not rel < 2e-2:  # compiles and warms up, too
                raise SystemExit(f"{m}x{n}x{k} {spec}: wrong (rel. max error {rel:.3g})")
        for fn in kernels.values():  # warm up (cuBLAS picks its kernel on the first call)
            fn()
        torch.cuda.synchronize()
        calls_per_fn = 1 if args.eager else GRAPH_CALLS
        if not args.eager:
            kernels = {who: repeated_graph(fn, GRAPH_CALLS) for who, fn in kernels.items()}
        for phase in range(args.rounds * len(kernels)):
            who = list(kernels)[phase % len(kernels)]
            row = {"M": m, "N": n, "K": k, "dtype": args.dtype, "phase": phase, "kernel": who,
                   "graph": not args.eager,
                   **sustained(kernels[who], args.seconds, 2 * m * n * k, calls_per_fn)}
            rows.append(row)
            print(row, flush=True)
        # after every cell, so a sweep cut short by a time limit keeps what it measured
        results.write(args.name, rows, Path(args.out),
                      extra_meta={"complete": False, **peer_meta})
    summary = summarize(rows, list(specs))
    path = results.write(args.name, rows, Path(args.out),
                         extra_meta={"complete": True, "summary": summary, **peer_meta})
    print(f"wrote {path}")
    for (m, n, k), mean in cell_means(rows, list(specs)).items():
        base = mean.get("cublas")
        for who, tflops in mean.items():
            versus = f", {tflops / base:.3f}x cuBLAS" if base and who != "cublas" else ""
            print(f"  {m}x{n}x{k} {who}: {tflops:.0f} TFLOP/s sustained{versus}")
    for key, value in summary.items():
        print(f"  {key}: {value:.3f}")
    return 0


def repeated_graph(fn, calls: int):
    """The replay of a CUDA graph that captured ``calls`` calls of ``fn`` (``gemm.as_graph``);
    each call's output is dropped before the next, so the graph's pool reuses one buffer."""
    from gemm import as_graph

    def many():
        for _ in range(calls):
            fn()
    return as_graph(many)


def grid_cells(ms) -> list[tuple[int, int, int]]:
    """The grid's cells (``gemm.PAPER_NK``) at each M of ``ms``."""
    from gemm import PAPER_NK

    return [(m, n, k) for m in ms for n, k in PAPER_NK]


def cell_means(rows: list, specs: list) -> dict:
    """Per cell, each spec's mean TFLOP/s over its phases (the specs a cell has rows of)."""
    means: dict = {}
    for r in rows:
        means.setdefault((r["M"], r["N"], r["K"]), {}).setdefault(r["kernel"], []).append(
            r["tflops"])
    return {cell: {who: statistics.mean(by[who]) for who in specs if who in by}
            for cell, by in means.items()}


def summarize(rows: list, specs: list) -> dict:
    """Geometric mean over the cells of each spec's sustained TFLOP/s over cuBLAS's, and
    over the first spec's that is not cuBLAS (where the cells timed cuBLAS)."""
    from gemm import geomean

    means = cell_means(rows, specs)
    ours = [who for who in specs if who != "cublas"]
    summary = {}
    for base in ("cublas", *ours[:1]):
        for who in ours:
            ratios = [m[who] / m[base] for m in means.values()
                      if who in m and base in m and who != base]
            if ratios:
                summary[f"{who} / {base}"] = geomean(ratios)
    return summary


if __name__ == "__main__":
    sys.exit(main())
