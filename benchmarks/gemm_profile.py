"""Nsight Compute counters for one 8192^3 GEMM: ours (TMA and cp.async) and cuBLAS, side by side.

    ncu --clock-control none --nvtx --nvtx-include "profile/" --metrics <list> \
        python benchmarks/gemm_profile.py

Only the launches inside the NVTX range "profile" are measured (warm-ups and compiles are
outside it). ``run_ncu()`` builds that command, runs it and writes the table as JSON.
"""

from __future__ import annotations

import csv
import io
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

METRICS = [
    "gpu__time_duration.sum",
    "sm__cycles_elapsed.avg.per_second",
    "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "lts__t_sector_hit_rate.pct",
    "smsp__inst_executed.sum",
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum",
    "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio",
]


def workload():
    import torch

    from cutetma import ops

    a = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
    calls = {"ours_tma": lambda: ops.gemm(a, b, load="tma"),
             "ours_cp_async": lambda: ops.gemm(a, b, load="cp_async"),
             "cublas": lambda: a @ b.T}
    for fn in calls.values():  # compile and warm up outside the profiled range
        fn()
        fn()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_push("profile")  # ncu --nvtx-include "profile/" matches this range
    for fn in calls.values():  # in order: ours (TMA), ours (cp.async), cuBLAS
        fn()
        torch.cuda.synchronize()
    torch.cuda.nvtx.range_pop()


def find_ncu() -> str | None:
    """ncu on PATH, else the newest under /opt/nvidia/nsight-compute, else None."""
    found = sorted(Path("/opt/nvidia").glob("nsight-compute/*/ncu"))
    return shutil.which("ncu") or (str(found[-1]) if found else None)


def supported(ncu: str, metrics):
    """``metrics`` less those this ncu and GPU do not know (``--query-metrics``), so one
    misspelt or missing counter costs its column, not the whole profile; names them."""
    proc = subprocess.run([ncu, "--query-metrics"], capture_output=True, text=True, timeout=120)
    known = set(re.findall(r"^\s*(\w+)", proc.stdout, re.M))
    if proc.returncode or not known:
        return list(metrics)  # nothing to check against: let ncu say
    kept = [m for m in metrics if m.split(".")[0] in known]
    if len(kept) < len(metrics):
        print("ncu does not know:", sorted(set(metrics) - set(kept)))
    return kept


def run_ncu(out: Path, script: str = __file__, metrics=METRICS,
            order=("ours_tma", "ours_cp_async", "cublas")) -> int:
    """ncu over ``script --workload`` (its launches inside the NVTX range "profile"), the
    ``metrics`` of each launch as a JSON table in ``out``; ``order`` names the launches."""
    ncu = find_ncu()
    if not ncu:
        print("ncu not found")
        return 1
    metrics = supported(ncu, metrics)
    cmd = [ncu, "--clock-control", "none", "--nvtx", "--nvtx-include", "profile/",
           "--metrics", ",".join(metrics), "--csv", "--page", "raw",
           sys.executable, script, "--workload"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=400)
    text = proc.stdout[proc.stdout.find('"ID"'):] if '"ID"' in proc.stdout else ""
    rows = list(csv.DictReader(io.StringIO(text)))
    table = [{"kernel": r.get("Kernel Name", "")[:80], **{m: r.get(m) for m in metrics}}
             for r in rows]
    from cutetma import results

    out.write_text(json.dumps({"meta": results.meta(" ".join(cmd[:-3])), "rows": table,
                               "order": list(order),
                               "stdout_tail": proc.stdout[-3000:],
                               "stderr_tail": proc.stderr[-2000:]}, indent=1))
    for r in table:
        print(r)
    return proc.returncode


if __name__ == "__main__":
    if "--workload" in sys.argv:
        workload()
    else:
        sys.exit(run_ncu(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("gemm_profile.json")))
