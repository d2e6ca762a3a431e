"""GEMM kernels' own GPU time (CUPTI, through the torch profiler), L2 flushed before every
launch, over a sweep of K: each contender's fixed cost per launch and its cost per k-tile.

    python benchmarks/gemm_kernel_times.py \
        --shapes 256x6144 256x5120 --ks 1024 2048 4096 8192 \
        --kernels ours ours:tile=128x96,cluster=1x2 [--dtype float16]

Why: ``gemm.py`` and ``gemm_ab.py`` time CUDA-graph replays between events, which adds the
graph's launch to every contender alike (a few microseconds) and so pulls short kernels'
ratios towards 1; and one K per cell cannot tell a slow start (prologue, the first loads
from DRAM, the last tile's epilogue) from a slow mainloop. Here each launch's kernels are
timed by the GPU itself (each launch a replay of the call's CUDA graph, ``--launch graph``,
so no contender's host cost idles the GPU before it: called eagerly, ours started 100-300 us
after the flush and cuBLAS at once),
and a line ``time = fixed + per_k_tile * ceil(K / 64)`` is fitted
per (M, N, contender) over the K sweep (least squares). ``--kernels``: as ``gemm_ab.py``
(``ours``, ``ours:key=value,...`` with ``select_gemm_config``'s options, ``fit=W``,
``split_k=wave``), plus ``GemmConfig`` fields the library otherwise chooses itself:
``stages=S``, ``epi_n=E``, ``epi_stages=B``, ``raster_swizzle=S``, ``raster_along_m=0|1``,
``order_table=0|1``, ``pdl=0|1`` (``gemm.CONFIG_FIELDS``). cuBLAS always runs.
Writes ``<name>.json``:
rows (M, N, K, dtype, each contender's median kernel microseconds and TFLOP/s, the kernels'
names, and ``<key>_graph_us``: the same call timed as ``gemm.py`` times it, CUDA-graph
replays between events (``--graph-rounds`` alternating rounds), so the difference is what a
launch adds; with ``--eager`` ``<key>_eager_us``, plain calls back to back) and ``fits``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gemm import alternating_rounds, as_graph, progress  # noqa: E402
from gemm_ab import checked_contenders  # noqa: E402
from gemm_sustained import CONFIG_FIELDS, contender, parse_kernel, spec_config  # noqa: E402,F401

FLUSH_BYTES = 256 << 20  # larger than the H200's L2 (50 MB), as triton.testing.do_bench


def kernel_times(fns: dict, reps: int, launch: str = "graph") -> tuple[dict, dict]:
    """Per contender: the GPU microseconds of each of ``reps`` launches (the sum of the
    kernels one call launches), every launch after an L2 flush, the contenders in turn
    (order reversed every other repetition); and the names of the kernels each launches.
    ``launch="graph"`` replays each call from a CUDA graph, so every contender follows the
    flush as closely (called eagerly, ours started 100-300 us after it, on a GPU that had
    idled that long, while cuBLAS followed at once: on a power-capped card that favours
    ours); ``"eager"`` calls them."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    flush = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    names = {}
    for key, fn in fns.items():  # which kernels one call launches (compiled already)
        fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        names[key] = [e.name for e in prof.events()
                      if e.device_type == torch.autograd.DeviceType.CUDA]
    order = list(fns.items())
    if launch == "graph":
        order = [(key, as_graph(fn)) for key, fn in order]
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(reps):
            for key, fn in order if i % 2 == 0 else order[::-1]:
                flush.fill_(7)  # a fill kernel: zero_ may be a memset, as cuBLAS launches
                torch.cuda.nvtx.range_push(key)
                fn()
                torch.cuda.nvtx.range_pop()
        torch.cuda.synchronize()
    # kernels in launch order; the flush's fill kernels are neither contender's
    events = sorted((e for e in prof.events()
                     if e.device_type == torch.autograd.DeviceType.CUDA),
                    key=lambda e: e.time_range.start)
    stream = iter(events)
    times: dict = {key: [] for key in fns}
    for i in range(reps):
        for key, _ in order if i % 2 == 0 else order[::-1]:
            want, total = list(names[key]), 0.0
            for event in stream:
                if want and event.name == want[0]:
                    total += event.device_time
                    want.pop(0)
                    if not want:
                        break
            times[key].append(total)
    missing = [key for key, us in times.items() if not all(us)]
    if missing:
        raise RuntimeError(f"no kernel time found for {missing} (the profiler did not report "
                           "the kernels one call launches)")
    return times, names


def fit_line(points) -> dict:
    """Least squares ``us = fixed + per_k_tile * k_tiles`` over (k_tiles, us) points."""
    xs, ys = zip(*points, strict=True)
    mx, my = statistics.mean(xs), statistics.mean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if sxx else 0.0
    return {"fixed_us": round(my - slope * mx, 2), "per_k_tile_us": round(slope, 4),
            "points": len(xs)}


def host_and_eager(fn, calls: int) -> tuple[float, float]:
    """``calls`` plain calls back to back (no flush, no graph: each launch queued behind the
    last, as in a model's forward): microseconds a call on the host's clock while the GPU
    queue fills, and a call's share of the CUDA events around them (the larger of host and
    GPU time, if nothing waits)."""
    import time

    import torch

    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    host = (time.perf_counter() - t0) / calls * 1e6
    end.record()
    end.synchronize()
    return host, start.elapsed_time(end) * 1e3 / calls


def back_to_back(fns: dict, launches: int = 20) -> dict:
    """Microseconds a launch of each contender in turn, ``host_and_eager``'s event time."""
    return {key: host_and_eager(fn, launches)[1] for key, fn in fns.items()}


def measure(m: int, n: int, k: int, dtype: str, specs: dict, reps: int,
            graph_rounds: int = 1, eager: bool = False, launch: str = "graph") -> dict:
    import torch

    t = getattr(torch, dtype)
    a = torch.randn(m, k, device="cuda", dtype=t)
    b = torch.randn(n, k, device="cuda", dtype=t)
    row = {"M": m, "N": n, "K": k, "dtype": dtype}
    fns = checked_contenders(specs, a, b, row, make=contender)
    times, names = kernel_times(fns, reps, launch)
    flops = 2 * m * n * k
    for key, us in times.items():
        median = statistics.median(us)
        row[f"{key}_us"] = round(median, 2)
        row[key] = round(flops / median / 1e6, 1)  # TFLOP/s on the kernel's own time
        row[f"{key}_kernels"] = sorted(set(names[key]))
    # as gemm.py times it: graph replays between events (L2 flushed), launch included
    graph = alternating_rounds(fns, graph_rounds)
    for key, ms in graph.items():
        row[f"{key}_graph_us"] = round(statistics.median(ms) * 1e3, 2)
    if eager:
        for key, us in back_to_back(fns).items():
            row[f"{key}_eager_us"] = round(us, 2)
    return row


def fits(rows: list[dict], keys) -> list[dict]:
    out = []
    for m, n, dtype in sorted({(r["M"], r["N"], r["dtype"]) for r in rows}):
        same = [r for r in rows if (r["M"], r["N"], r["dtype"]) == (m, n, dtype)]
        for key in keys:
            points = [(-(-r["K"] // 64), r[f"{key}_us"]) for r in same if f"{key}_us" in r]
            if len(points) >= 2:
                out.append({"M": m, "N": n, "dtype": dtype, "kernel": key, **fit_line(points)})
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", required=True, metavar="MxN")
    ap.add_argument("--ks", nargs="+", type=int, required=True, metavar="K")
    ap.add_argument("--kernels", nargs="+", default=["ours"], metavar="SPEC")
    ap.add_argument("--dtype", default="float16", choices=["float16", "bfloat16"])
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--graph-rounds", type=int, default=1,
                    help="alternating rounds of the graph-replay timing (gemm.py's)")
    ap.add_argument("--launch", choices=["graph", "eager"], default="graph",
                    help="how the profiled launches are made (graph: no host gap)")
    ap.add_argument("--eager", action="store_true",
                    help="also time 20 plain calls back to back (no flush, no graph)")
    ap.add_argument("--name", default="gemm_kernel_times")
    ap.add_argument("--out", default="benchmarks/results")
    args = ap.parse_args(argv)
    specs = {spec: parse_kernel(spec) for spec in args.kernels}
    if any(kwargs is None for kwargs in specs.values()):
        raise SystemExit("--kernels: cuBLAS is always timed; give ours / ours:... specs")
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes]
    todo = [(m, n, k) for m, n in shapes for k in args.ks]
    from cutetma import results

    rows = []
    for m, n, k in progress(todo, len(todo)):
        rows.append(measure(m, n, k, args.dtype, specs, args.reps, args.graph_rounds,
                            args.eager, args.launch))
        results.write(args.name, rows, Path(args.out), extra_meta={"complete": False})
    line_fits = fits(rows, ["cublas", *specs])
    path = results.write(args.name, rows, Path(args.out),
                         extra_meta={"complete": True, "fits": line_fits})
    print(f"wrote {path}")
    for f in line_fits:
        print(f"  {f['M']}x{f['N']} {f['kernel']}: {f['fixed_us']} us + "
              f"{f['per_k_tile_us']} us a k-tile")
    for r in rows:
        cells = " ".join(f"{key}={r[key + '_us']}us" for key in ["cublas", *specs]
                         if f"{key}_us" in r)
        print(f"  {r['M']}x{r['N']}x{r['K']}: {cells}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
