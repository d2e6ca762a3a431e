"""What one eager ``cutetma.gemm`` call costs the host, beside cuBLAS's ``a @ b.T``.

    python benchmarks/gemm_host_cost.py [--cells MxNxK ...] \
        [--kernels ours ours:tile=128x96,cluster=1x1 ...] [--calls 50]

Why: the benchmarks time CUDA-graph replays, which leave the host out; a user calling
``cutetma.gemm`` in a loop pays it. Per contender and cell: ``host_us``, the wall time of a
call on the host while the GPU queue fills (no synchronization: if a call waited for the GPU
this would read as the kernel's time); ``eager_us``, CUDA events around ``--calls`` calls
back to back (the larger of host and GPU time a call, if nothing waits); ``kernel_us``, the
same launches with the GPU's own timestamps (torch profiler); and for ours a cProfile of
the calls (the Python functions that take the most, cumulative) and what the automatic
configuration alone costs (``config_us``: ``tuning.select_gemm_config``, which ``gemm``
remembers per shape). Writes ``<name>.json``.

``--pieces``: also each piece of the default call's host time (``host_pieces``).

``--attention BxSxHxD ...``: the same for ``cutetma.attention`` (non-causal, fp16) beside
torch SDPA (cuDNN / flash) on (batch, seqlen, heads, head_dim) inputs, instead of the GEMM
cells: ``cutetma.attention`` launches a pointer entry too.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gemm_kernel_times import contender, host_and_eager  # noqa: E402
from gemm_sustained import parse_kernel  # noqa: E402

CELLS = ["256x6144x4096", "4096x4096x4096"]


def kernel_us(fn, calls: int) -> float:
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    total = sum(e.device_time for e in prof.events()
                if e.device_type == torch.autograd.DeviceType.CUDA)
    return total / calls


def python_profile(fn, calls: int, top: int = 15, sort: str = "cumulative") -> list[str]:
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        fn()
    profiler.disable()
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats(sort).print_stats(top)
    lines = [line.rstrip() for line in out.getvalue().splitlines() if line.strip()]
    return lines[-top - 1:]


def host_pieces(a, b, calls: int) -> dict:
    """Host microseconds a call of each piece of one eager ``cutetma.gemm(a, b)``, each in a
    loop of its own: the whole call, its ``GemmLaunch`` alone (the slots' writes and the
    compiled program's launch), the compiled program alone (``run_compiled_program`` with
    the argument list made once: the DSL's packing and the driver's launch), the output's
    ``torch.empty`` and the stream lookup; the rest of ``gemm`` is its checks and lookups.
    The launch's values are caught from a real call, so the pieces launch the same kernel."""
    import torch

    import cutetma
    from cutetma.runtime import GemmLaunch

    seen = {}
    original = GemmLaunch.__call__

    def spy(self, values, workspace=()):
        seen.update(launch=self, values=values, workspace=workspace)
        return original(self, values, workspace)

    GemmLaunch.__call__ = spy
    try:
        cutetma.gemm(a, b)
    finally:
        GemmLaunch.__call__ = original
    launch, values, workspace = seen["launch"], seen["values"], seen["workspace"]
    packed = launch.args(values, workspace)
    m, n = a.shape[0], b.shape[0]
    pieces = {"gemm": lambda: cutetma.gemm(a, b),
              "launch": lambda: launch(values, workspace),
              "run_compiled_program": lambda: launch._run(packed),
              "torch.empty": lambda: torch.empty(m, n, dtype=a.dtype, device=a.device),
              "current_stream": lambda: torch.cuda.current_stream(a.device).cuda_stream}
    out = {name: round(host_and_eager(fn, calls)[0], 2) for name, fn in pieces.items()}
    out["rest_of_gemm"] = round(out["gemm"] - out["launch"] - out["torch.empty"]
                                - out["current_stream"], 2)
    out["profile_by_own_time"] = python_profile(pieces["gemm"], calls, top=12, sort="tottime")
    return out


def attention_row(shape: str, calls: int) -> dict:
    """Host, eager and kernel microseconds a call of ``cutetma.attention`` and of torch SDPA
    on one (b, s, h, d) fp16 shape, and the profile of ours."""
    import torch
    import torch.nn.functional as F

    import cutetma

    b, s, h, d = (int(x) for x in shape.split("x"))
    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.float16) for _ in range(3))
    fns = {"sdpa": lambda: F.scaled_dot_product_attention(
               q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)),
           "ours": lambda: cutetma.attention(q, k, v)}
    row = {"B": b, "S": s, "H": h, "D": d, "dtype": "float16"}
    for name, fn in fns.items():
        host, eager = host_and_eager(fn, calls)
        row[name] = {"host_us": round(host, 1), "eager_us": round(eager, 1),
                     "kernel_us": round(kernel_us(fn, calls), 1)}
        print(f"{shape} {name}: {row[name]['host_us']} us host, {row[name]['eager_us']} us "
              f"eager, {row[name]['kernel_us']} us kernel", flush=True)
    row["ours"]["python_profile"] = python_profile(fns["ours"], calls)
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells", nargs="*", default=CELLS, metavar="MxNxK")
    ap.add_argument("--kernels", nargs="+", default=["ours"], metavar="SPEC")
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--attention", nargs="*", metavar="BxSxHxD",
                    help="time cutetma.attention beside torch SDPA instead")
    ap.add_argument("--pieces", action="store_true",
                    help="also time each piece of ours' default call (host_pieces)")
    ap.add_argument("--name", default="gemm_host_cost")
    ap.add_argument("--out", default="benchmarks/results")
    args = ap.parse_args(argv)
    import torch

    from cutetma import results
    from cutetma.tuning import select_gemm_config

    if args.attention:
        rows = [attention_row(shape, args.calls) for shape in args.attention]
        path = results.write(args.name, rows, Path(args.out), extra_meta={"complete": True})
        print(f"wrote {path}")
        return 0
    rows = []
    for cell in args.cells:
        m, n, k = (int(x) for x in cell.split("x"))
        a = torch.randn(m, k, device="cuda", dtype=torch.float16)
        b = torch.randn(n, k, device="cuda", dtype=torch.float16)
        row = {"M": m, "N": n, "K": k, "dtype": "float16"}
        t0 = time.perf_counter()
        for _ in range(args.calls):
            select_gemm_config(m, n, k, sm_count=132)
        row["config_us"] = round((time.perf_counter() - t0) / args.calls * 1e6, 1)
        for spec in ["cublas", *args.kernels]:
            fn = contender(parse_kernel(spec), a, b)
            host, eager = host_and_eager(fn, args.calls)
            row[spec] = {"host_us": round(host, 1), "eager_us": round(eager, 1),
                         "kernel_us": round(kernel_us(fn, args.calls), 1)}
            if spec != "cublas":
                row[spec]["python_profile"] = python_profile(fn, args.calls)
            print(f"{cell} {spec}: {row[spec]['host_us']} us host, {row[spec]['eager_us']} us "
                  f"eager, {row[spec]['kernel_us']} us kernel", flush=True)
        if args.pieces:
            pieces = row["ours_pieces_us"] = host_pieces(a, b, max(args.calls, 200))
            times = {key: value for key, value in pieces.items() if key != "profile_by_own_time"}
            print(f"{cell} pieces (us): {times}", flush=True)
        rows.append(row)
    path = results.write(args.name, rows, Path(args.out), extra_meta={"complete": True})
    print(f"wrote {path}")
    for row in rows:
        print(f"{row['M']}x{row['N']}x{row['K']}: config {row['config_us']} us")
        for spec in args.kernels:
            print("\n".join(row[spec].get("python_profile", [])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
