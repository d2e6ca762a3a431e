"""Nsight Compute counters for one 8192^3 GEMM: ours (TMA and cp.async) and cuBLAS, side by side.

    ncu --clock-control none --nvtx --nvtx-include "profile/" --metrics <list> \
        python benchmarks/gemm_profile.py

Only the launches inside the NVTX range "profile" are measured (warm-ups and compiles are
outside it). ``run_ncu()`` builds that command, runs it and writes the table as JSON.

    python benchmarks/gemm_profile.py --source OUT_DIR MxNxK[/key=value,...] ...

profiles one launch of ours per spec (``cutetma.gemm`` with the configuration those options
name, as in ``gemm_sustained.py``; ``dtype=bfloat16`` picks the inputs' type, fp16
otherwise) with ncu's source counters: the SASS listing with its warp-stall samples
(``gemm_sass_<spec>.csv.gz``) and where the warps wait most and why
(``gemm_sass_<spec>.json``, all of them together in ``gemm_sass.json``; ``--collect OUT_DIR``
rebuilds that file), e.g. where split-K's hand-over spends its time:
``256x512x5120/tile=128x128,split_k=4``.

    python benchmarks/gemm_profile.py --compare OUT.json MxNxK[/dtype=bfloat16] SPEC ...

puts the launch-wide counters (``METRICS`` and the memory ones, ``COMPARE_METRICS``) of
cuBLAS and each spec (``cublas`` or ``ours:key=value,...``, as in ``gemm_kernel_times.py``) on
one shape side by side, e.g. why our 64 x 128 tile takes 15% longer than cuBLAS's 64 x 128
kernel (same tile, stages and cluster) at 2048 x 512 x 5120: ``--compare p.json
2048x512x5120 cublas ours ours:tile=64x128,cluster=2x1``.
"""

from __future__ import annotations

import csv
import gzip
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


# where a launch's bytes go: L2 traffic and hit rate, DRAM, the L2 -> SM crossbar, and the
# grid as launched (cluster, CTAs, shared memory)
COMPARE_METRICS = METRICS + [
    "lts__t_bytes.sum",
    "lts__throughput.avg.pct_of_peak_sustained_elapsed",
    "dram__bytes_read.sum",
    "dram__bytes_write.sum",
    "l1tex__m_xbar2l1tex_read_bytes.sum",
    "sm__memory_throughput.avg.pct_of_peak_sustained_elapsed",
    "smsp__cycles_active.avg.pct_of_peak_sustained_elapsed",
    # who asks the L2 for what: the SMs (tex: TMA and loads), the other L2 partition (the
    # fabric between the H200's two halves), requests against sectors
    "lts__t_sectors_srcunit_tex.sum",
    "lts__t_requests_srcunit_tex.sum",
    "lts__t_sectors_srcunit_ltcfabric.sum",
    "lts__t_sectors_srcunit_tex_lookup_hit.sum",
    "lts__t_sectors_op_read.sum",
    # the grid as launched: persistent or not, cluster shape, resources
    "launch__grid_size", "launch__block_size", "launch__cluster_dim_x", "launch__cluster_dim_y",
    "launch__registers_per_thread", "launch__shared_mem_per_block_dynamic",
]
# Hopper's L2 request coalescer (LRC) sits in front of the L2 slices, merges reads of the same
# sector and serves multicast: its counters (whatever this ncu names ``lrc__*``) say whether
# loads the L2 never saw were merged there (``--compare``)
COALESCER_PREFIX = "lrc__"
DEFAULT_SPECS = ("ours:load=tma", "ours:load=cp_async", "cublas")


def workload(shape=(8192, 8192, 8192), specs=DEFAULT_SPECS, dtype="float16"):
    """Each spec once inside the NVTX range "profile", after two calls outside it (compile,
    warm-up), on the same randn data."""
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gemm_kernel_times import contender  # takes GemmConfig fields (stages=...) too
    from gemm_sustained import parse_kernel

    m, n, k = shape
    a = torch.randn(m, k, device="cuda", dtype=getattr(torch, dtype))
    b = torch.randn(n, k, device="cuda", dtype=getattr(torch, dtype))
    calls = {spec: contender(parse_kernel(spec), a, b) for spec in specs}
    for fn in calls.values():  # compile and warm up outside the profiled range
        fn()
        fn()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_push("profile")  # ncu --nvtx-include "profile/" matches this range
    for fn in calls.values():  # in the specs' order (``run_ncu``'s ``order``)
        fn()
        torch.cuda.synchronize()
    torch.cuda.nvtx.range_pop()


def find_ncu() -> str | None:
    """ncu on PATH, else the newest under /opt/nvidia/nsight-compute, else None."""
    found = sorted(Path("/opt/nvidia").glob("nsight-compute/*/ncu"))
    return shutil.which("ncu") or (str(found[-1]) if found else None)


def counters_named(ncu: str, prefix: str) -> tuple[list[str], list[str]]:
    """The counters (``# of ...`` in ``--query-metrics``) whose names start with ``prefix``,
    as ``name.sum``, and every listing line with that prefix (for the record)."""
    proc = subprocess.run([ncu, "--query-metrics"], capture_output=True, text=True, timeout=120)
    lines = [line.strip() for line in proc.stdout.splitlines()
             if line.strip().startswith(prefix)]
    counters = [line.split()[0] + ".sum" for line in lines
                if len(line.split()) > 1 and line.split()[1].startswith(("#", "Counter"))]
    return counters, lines


def supported(ncu: str, metrics):
    """``metrics`` less those this ncu and GPU do not know (``--query-metrics``), so one
    misspelt or missing counter costs its column, not the whole profile; names them."""
    proc = subprocess.run([ncu, "--query-metrics"], capture_output=True, text=True, timeout=120)
    known = set(re.findall(r"^\s*(\w+)", proc.stdout, re.M))
    if proc.returncode or not known:
        return list(metrics)  # nothing to check against: let ncu say
    # launch__* (the grid as launched) are not in the listing, and every ncu knows them
    kept = [m for m in metrics if m.split(".")[0] in known or m.startswith("launch__")]
    if len(kept) < len(metrics):
        print("ncu does not know:", sorted(set(metrics) - set(kept)))
    return kept


# the SASS profile (--source): the instructions kept in its JSON summary, and the
# launch-wide counters read beside the per-instruction ones
TOP = 40
LAUNCH_METRICS = ["gpu__time_duration.sum", "sm__cycles_elapsed.avg.per_second",
                  "smsp__inst_executed.sum",
                  "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active"]


def _number(text):
    try:
        return float(str(text).replace(",", ""))
    except ValueError:
        return 0.0


def summarize_sass(rows: list[dict]) -> dict:
    """The instructions with the most stall samples, each with its stall reasons (the sample
    columns of ncu's source page that are non-zero), and the totals per reason."""
    if not rows:
        return {"rows": 0}
    columns = list(rows[0])
    total_col = next((c for c in columns if "Sampling (All" in c), None)
    reasons = [c for c in columns if c.startswith("stall_") or "stalled" in c.lower()]
    source_col = next((c for c in columns if c.strip() in ("Source", "SASS")), columns[1])
    address_col = next((c for c in columns if "Address" in c), columns[0])
    totals = {c: sum(_number(r[c]) for r in rows) for c in reasons}
    ranked = sorted(rows, key=lambda r: -_number(r.get(total_col, 0))) if total_col else []
    top = []
    for r in ranked[:TOP]:
        why = {c: _number(r[c]) for c in reasons if _number(r[c])}
        top.append({"address": r.get(address_col), "sass": r.get(source_col),
                    "samples": _number(r.get(total_col, 0)),
                    "reasons": dict(sorted(why.items(), key=lambda kv: -kv[1])[:4])})
    executed_col = next((c for c in columns if c.strip() == "Instructions Executed"),
                        next((c for c in columns if "Instructions Executed" in c
                              and "Thread" not in c), None))
    by_opcode = {}
    if executed_col:  # what the warps ran, by SASS opcode (predicate and modifiers dropped)
        for r in rows:
            words = str(r.get(source_col, "")).split()
            words = words[1:] if words and words[0].startswith("@") else words
            if words:
                op = words[0].split(".")[0]
                by_opcode[op] = by_opcode.get(op, 0) + _number(r[executed_col])
    return {"rows": len(rows), "columns": columns, "samples_total":
            sum(_number(r.get(total_col, 0)) for r in rows) if total_col else None,
            "reason_totals": dict(sorted(totals.items(), key=lambda kv: -kv[1])),
            "executed_by_opcode": dict(sorted(by_opcode.items(), key=lambda kv: -kv[1])),
            "top": top}


def profile_source(out_dir: Path, prefix: str, name: str, workload_args, describe: dict) -> int:
    """ncu's source counters for the one launch ``python *workload_args`` makes inside the
    NVTX range "profile": the SASS listing with its warp-stall samples
    (``<prefix>_<name>.csv.gz``) and a summary (``<prefix>_<name>.json``: the launch's time,
    clock and instruction count, the instructions where warps wait most and why, executed
    instructions by opcode, and ``describe``)."""
    from cutetma import results

    ncu = find_ncu()
    if not ncu:
        print("ncu not found")
        return 1
    out_dir.mkdir(parents=True, exist_ok=True)
    report = out_dir / f"{prefix}_{name}"
    profile = [ncu, "--clock-control", "none", "--nvtx", "--nvtx-include", "profile/",
               "--section", "SourceCounters", "--section", "WarpStateStats",
               "--section", "SpeedOfLight", "--import-source", "no", "-f", "-o", str(report),
               sys.executable, *workload_args]
    proc = subprocess.run(profile, capture_output=True, text=True, timeout=300)
    command = " ".join(profile[:-len(workload_args) - 1])
    print(command, "->", proc.returncode, proc.stderr[-500:])
    page = subprocess.run([ncu, "-i", f"{report}.ncu-rep", "--page", "source", "--csv",
                           "--print-source", "sass"], capture_output=True, text=True,
                          timeout=300)
    raw = subprocess.run([ncu, "-i", f"{report}.ncu-rep", "--page", "raw", "--csv",
                          "--metrics", ",".join(LAUNCH_METRICS)], capture_output=True,
                         text=True, timeout=300).stdout
    launch = list(csv.DictReader(io.StringIO(raw[raw.find('"ID"'):])))[-1:] \
        if '"ID"' in raw else []
    text = page.stdout
    start = text.find('"Address"')  # the table's header (a "Kernel Name" line above it)
    rows = list(csv.DictReader(io.StringIO(text[start:]))) if start >= 0 else []
    with gzip.open(out_dir / f"{prefix}_{name}.csv.gz", "wt") as f:
        f.write(text)
    summary = {"meta": results.meta(command), **describe,
               "launch": {m: launch[0].get(m) for m in LAUNCH_METRICS} if launch else None,
               **summarize_sass(rows), "stderr_tail": (proc.stderr + page.stderr)[-1500:]}
    (out_dir / f"{prefix}_{name}.json").write_text(results.dumps(summary))
    Path(f"{report}.ncu-rep").unlink(missing_ok=True)  # large; the CSV has what we read
    return proc.returncode or page.returncode


def ncu_table(ncu: str, metrics, script: str, workload_args=(), timeout: int = 400):
    """ncu over ``script --workload *workload_args``, its launches inside the NVTX range
    "profile": ``(rows, proc, cmd)``, the CSV's rows (``metrics`` of each launch; none if
    ncu printed no table), the finished process and the command."""
    cmd = [ncu, "--clock-control", "none", "--nvtx", "--nvtx-include", "profile/",
           "--metrics", ",".join(metrics), "--csv", "--page", "raw",
           sys.executable, script, "--workload", *workload_args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    start = proc.stdout.find('"ID"')
    rows = list(csv.DictReader(io.StringIO(proc.stdout[start:]))) if start >= 0 else []
    return rows, proc, cmd


def run_ncu(out: Path, script: str = __file__, metrics=METRICS,
            order=("ours_tma", "ours_cp_async", "cublas"), workload_args=(),
            families=()) -> int:
    """ncu over ``script --workload *workload_args`` (its launches inside the NVTX range
    "profile"), the ``metrics`` of each launch as a JSON table in ``out``; ``order`` names
    the launches. ``families``: name prefixes whose counters join ``metrics`` (their
    listing is kept in the JSON)."""
    ncu = find_ncu()
    if not ncu:
        print("ncu not found")
        return 1
    listed = {}
    for prefix in families:
        counters, listed[prefix] = counters_named(ncu, prefix)
        metrics = list(metrics) + counters
    metrics = supported(ncu, metrics)
    rows, proc, cmd = ncu_table(ncu, metrics, script, workload_args)
    table = [{"kernel": r.get("Kernel Name", "")[:80], **{m: r.get(m) for m in metrics}}
             for r in rows]
    from cutetma import results

    command = " ".join(cmd[:-3 - len(workload_args)])
    out.write_text(results.dumps({"meta": results.meta(command), "rows": table,
                                  "order": list(order), "families": listed,
                                  "stdout_tail": proc.stdout[-3000:],
                                  "stderr_tail": proc.stderr[-2000:]}))
    for r in table:
        print(r)
    return proc.returncode


def parse_source_spec(spec: str):
    """``MxNxK[/key=value,...]`` -> ((m, n, k), dtype, ``cutetma.gemm`` keyword arguments)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gemm_sustained import parse_kernel

    shape, _, options = spec.partition("/")
    try:
        mnk = tuple(int(x) for x in shape.split("x"))
    except ValueError:
        mnk = ()
    if len(mnk) != 3:
        raise SystemExit(f"--source {spec!r}: MxNxK[/key=value,...]")
    kwargs = parse_kernel("ours:" + options)
    return mnk, kwargs.pop("dtype", "float16"), kwargs


def source_workload(spec: str):
    """Ours once inside the NVTX range, on randn data (the SASS profile's launch)."""
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gemm_sustained import contender

    (m, n, k), dtype, kwargs = parse_source_spec(spec)
    a = torch.randn(m, k, device="cuda", dtype=getattr(torch, dtype))
    b = torch.randn(n, k, device="cuda", dtype=getattr(torch, dtype))
    call = contender(kwargs, a, b)
    for _ in range(2):
        call()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_push("profile")
    call()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_pop()


def collect_source(out_dir: Path, name: str = "gemm_sass") -> Path:
    """The per-spec summaries in ``out_dir`` as one results file, ``<name>.json``: the
    first profile's ``meta`` (the GPU's), one row per spec (its ``meta`` and column list
    dropped; the SASS listings stay in the ``.csv.gz`` files)."""
    docs = [json.loads(p.read_text()) for p in sorted(out_dir.glob("gemm_sass_*.json"))]
    if not docs:
        raise SystemExit(f"no gemm_sass_*.json in {out_dir}")
    rows = [{k: v for k, v in doc.items() if k not in ("meta", "columns", "rows")}
            for doc in docs]
    meta = dict(docs[0]["meta"], command="python benchmarks/gemm_profile.py --source "
                f"{out_dir.name} " + " ".join(f"{r['M']}x{r['N']}x{r['K']}/" + ",".join(
                    f"{k}={'x'.join(map(str, v)) if isinstance(v, list) else v}"
                    for k, v in r["config"].items()) for r in rows))
    from cutetma import results

    path = out_dir / f"{name}.json"
    path.write_text(results.dumps({"meta": meta, "rows": rows}))
    return path


def run_source(out_dir: Path, specs) -> int:
    status = 0
    for spec in specs:
        (m, n, k), dtype, kwargs = parse_source_spec(spec)
        name = spec.replace("/", "_").replace(",", "_").replace("=", "")
        status = status or profile_source(
            out_dir, "gemm_sass", name, [__file__, "--source-workload", spec],
            {"M": m, "N": n, "K": k, "dtype": dtype,
             "config": {key: list(v) if isinstance(v, tuple) else v
                        for key, v in kwargs.items()}})
    print("wrote", collect_source(out_dir))
    return status


def parse_compare(args):
    """``MxNxK[/dtype=...] SPEC ...`` -> ((m, n, k), dtype, specs)."""
    if not args:
        raise SystemExit("--compare OUT.json MxNxK[/dtype=bfloat16] SPEC ...")
    (m, n, k), dtype, options = parse_source_spec(args[0])
    if options:
        raise SystemExit(f"--compare {args[0]!r}: only dtype= goes with the shape; "
                         "options belong to each spec")
    specs = list(args[1:]) or ["cublas", "ours"]
    for spec in specs:
        parse_kernel_spec(spec)
    return (m, n, k), dtype, specs


def parse_kernel_spec(spec: str):
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gemm_sustained import parse_kernel

    return parse_kernel(spec)


def run_compare(out: Path, args) -> int:
    """``--compare``: ``COMPARE_METRICS`` of each spec's launch at one shape."""
    (m, n, k), dtype, specs = parse_compare(args)
    return run_ncu(out, metrics=COMPARE_METRICS, order=specs,
                   workload_args=[f"{m}x{n}x{k}", dtype, *specs],
                   families=(COALESCER_PREFIX,))


if __name__ == "__main__":
    if "--workload" in sys.argv:
        rest = sys.argv[sys.argv.index("--workload") + 1:]
        if rest:  # --compare's: MxNxK dtype SPEC ...
            workload(tuple(int(x) for x in rest[0].split("x")), rest[2:], rest[1])
        else:
            workload()
    elif "--compare" in sys.argv:
        rest = sys.argv[sys.argv.index("--compare") + 1:]
        sys.exit(run_compare(Path(rest[0]), rest[1:]))
    elif "--source-workload" in sys.argv:
        source_workload(sys.argv[sys.argv.index("--source-workload") + 1])
    elif "--collect" in sys.argv:  # the summaries of an earlier --source run, as one file
        print("wrote", collect_source(Path(sys.argv[sys.argv.index("--collect") + 1])))
    elif "--source" in sys.argv:
        rest = sys.argv[sys.argv.index("--source") + 1:]
        sys.exit(run_source(Path(rest[0]), rest[1:] or ["256x512x5120/tile=128x128,split_k=4"]))
    else:
        sys.exit(run_ncu(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("gemm_profile.json")))
