"""Figure 6 (b) of the seed paper: L2 read sectors of redundant unicast vs TMA multicast,
read with Nsight Compute, N = 2, 4, 8, 16.

    source .gpu/prelude.sh && python benchmarks/paper/fig6_l2.py [--quick] [--out DIR]

Runs itself under ``ncu --clock-control none`` (counters only; the runtimes are Figure 6 (a),
``fig6.py``): every ``ClusterBroadcast`` configuration launches once inside the NVTX range
"profile", in the order of ``cases()``, so the n-th profiled kernel is the n-th case. The
counters: ``lts__t_sectors_op_read.sum`` (every L2 read sector), its share requested by the
SMs (``lts__t_sectors_srcunit_tex_op_read.sum``), ``lts__t_requests_op_read.sum`` and
``dram__sectors_read.sum`` (the DRAM bytes both arms must share). Writes
``paper_fig6_l2.json`` (rows + the unicast / multicast sector ratios per N and size).
Status: written without a GPU at hand; first run pending (issue 6).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fig6  # noqa: E402
import run_all as common  # noqa: E402

METRICS = [
    "lts__t_sectors_op_read.sum",
    "lts__t_sectors_srcunit_tex_op_read.sum",
    "lts__t_requests_op_read.sum",
    "dram__sectors_read.sum",
    "gpu__time_duration.sum",
]
LOADS = ("tma", "tma_multicast")
BIF_KIB = (8, 32, 128)
ITERS = 64


def cases(quick: bool):
    from cutetma.kernels import microbench as mb

    sizes = BIF_KIB[1:2] if quick else BIF_KIB
    out = []
    for n in fig6.CLUSTERS:
        for kib in sizes:
            rows, cols = mb.tile_shape(kib * 1024 // fig6.STAGES, fig6.MIN_ROWS)
            out += [mb.BroadcastConfig(load, n, rows, cols, fig6.STAGES) for load in LOADS]
    return out


def workload(quick: bool):
    """Compile and check every case outside the profiled range, then launch each once in it."""
    import torch

    from cutetma.kernels import microbench as mb

    src = common.random_words(fig6.BUFFER, seed=6)
    launches = []
    for cfg in cases(quick):
        x = src.view(-1, cfg.cols)
        clusters = common.max_active_clusters(cfg.cluster)
        dump = torch.zeros(clusters * cfg.cluster, cfg.rows * cfg.cols, dtype=torch.int32,
                           device=common.DEVICE)
        args = (common.cute_tensor(x), common.cute_tensor(dump), ITERS,
                x.shape[0] // cfg.rows, 0, common.stream())
        kernel = common.compiled(("broadcast", cfg), lambda cfg=cfg: mb.ClusterBroadcast(cfg),
                                 *args)
        kernel(*args)
        launches.append((kernel, args))
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_push("profile")
    for kernel, args in launches:
        kernel(*args)
        torch.cuda.synchronize()
    torch.cuda.nvtx.range_pop()


def profile(quick: bool) -> list[dict]:
    found = sorted(Path("/opt/nvidia").glob("nsight-compute/*/ncu"))
    ncu = shutil.which("ncu") or (str(found[-1]) if found else None)
    if not ncu:
        raise RuntimeError("ncu (Nsight Compute) not found")
    cmd = [ncu, "--clock-control", "none", "--nvtx", "--nvtx-include", "profile/",
           "--metrics", ",".join(METRICS), "--csv", "--page", "raw",
           sys.executable, __file__, "--workload"] + (["--quick"] if quick else [])
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=540)
    start = proc.stdout.find('"ID"')
    if start < 0:
        raise RuntimeError(f"ncu printed no table (rc {proc.returncode}): "
                           f"{(proc.stdout + proc.stderr)[-1500:]}")
    table = [r for r in csv.DictReader(io.StringIO(proc.stdout[start:])) if r.get("ID", "")
             .strip().isdigit()]
    rows = []
    for cfg, r in zip(cases(quick), table, strict=False):
        rows.append({"load": cfg.load, "cluster": cfg.cluster, "tile_bytes": cfg.tile_bytes,
                     "bytes_in_flight_per_cta": cfg.stages * cfg.tile_bytes, "iters": ITERS,
                     "kernel": r.get("Kernel Name", "")[:60],
                     **{m: float(r[m].replace(",", "")) for m in METRICS if r.get(m)}})
    return rows


def summarize(rows) -> dict:
    """L2 read sectors, unicast / multicast, per N and bytes in flight per CTA."""
    key = "lts__t_sectors_op_read.sum"
    by = {(r["load"], r["cluster"], r["bytes_in_flight_per_cta"]): r.get(key) for r in rows}
    out = {}
    for (load, n, bif), sectors in sorted(by.items()):
        other = by.get(("tma_multicast", n, bif))
        if load == "tma" and sectors and other:
            out.setdefault(str(n), {})[f"{bif // 1024} KiB"] = sectors / other
    return {"l2_read_sectors_unicast_over_multicast": out}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--workload", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.workload:
        workload(args.quick)
        return 0
    from cutetma import results

    rows = profile(args.quick)
    summary = summarize(rows)
    path = results.write("paper_fig6_l2", rows, args.out, extra_meta={"summary": summary})
    print(f"wrote {path}")
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
