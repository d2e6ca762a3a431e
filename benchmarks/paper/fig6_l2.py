"""Figure 6 (b) of the seed paper: L2 read sectors of redundant unicast vs TMA multicast,
read with Nsight Compute, N = 2, 4, 8, 16.

    python benchmarks/paper/fig6_l2.py [--quick] [--out DIR]
    python benchmarks/paper/fig6_l2.py --resummarize benchmarks/results/paper_fig6_l2.json

Runs itself under ``ncu --clock-control none`` (counters only; the runtimes are Figure 6 (a),
``fig6.py``; ncu's default ``--cache-control all`` flushes the caches before each profiled
launch): every ``ClusterBroadcast`` configuration launches once inside the NVTX range
"profile", in the order of ``cases()``, so the n-th profiled kernel is the n-th case. The
counters: ``lts__t_sectors_op_read.sum`` (every L2 read sector, whatever unit asked for it),
its share requested by the SMs (``lts__t_sectors_srcunit_tex_op_read.sum``: the paper's
metric, "L2 read sectors served"), ``lts__t_requests_op_read.sum`` and
``dram__sectors_read.sum`` (the DRAM bytes both arms must share). Writes
``paper_fig6_l2.json`` (rows + the unicast / multicast ratios per N and size of all three
sector counts) and ``paper_fig6_l2.png`` (panel (b): the SM-requested sector ratio per N, the
paper's H100 values beside it). ``--resummarize`` recomputes both from an existing JSON's rows
without a GPU (the rest of its meta is kept).
Ran on the H200 (2026-11-30): SM-requested L2 read sectors tie at N <= 4 (1.00) and are
2.03-2.09x (N = 8) and 4.09-4.37x (N = 16) for redundant unicast, as the paper's 2.1x / 4.4x.
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

ALL = "lts__t_sectors_op_read.sum"  # every L2 read sector, any source unit
TEX = "lts__t_sectors_srcunit_tex_op_read.sum"  # requested by the SMs: the paper's metric
REQUESTS = "lts__t_requests_op_read.sum"
DRAM = "dram__sectors_read.sum"
TIME = "gpu__time_duration.sum"
METRICS = [ALL, TEX, REQUESTS, DRAM, TIME]
PAPER = {8: 2.1, 16: 4.4}  # the paper's H100 SM-requested sector ratios (section 4.4)
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
    """Compile and launch every case once outside the profiled range (a warm-up, unchecked:
    ``fig6.py`` checks the same configurations), then launch each once in it."""
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


def ratios(rows, metric: str) -> dict:
    """{N: {bytes in flight per CTA: unicast / multicast}} of one counter."""
    by = {(r["load"], r["cluster"], r["bytes_in_flight_per_cta"]): r.get(metric) for r in rows}
    out = {}
    for (load, n, bif), value in sorted(by.items()):
        other = by.get(("tma_multicast", n, bif))
        if load == "tma" and value and other:
            out.setdefault(n, {})[bif] = value / other
    return out


def _by_kib(per_n: dict) -> dict:
    return {str(n): {f"{bif // 1024} KiB": v for bif, v in d.items()} for n, d in per_n.items()}


def _range(per_n: dict) -> dict:
    return {str(n): [min(d.values()), max(d.values())] for n, d in per_n.items() if d}


def summarize(rows) -> dict:
    """Unicast / multicast per N and bytes in flight per CTA: L2 read sectors requested by the
    SMs (the paper's Figure 6 (b)), all L2 read sectors, DRAM read sectors, ncu kernel time."""
    s = {"metric_note": f"{TEX} (sectors requested by the SMs) matches the paper's 'L2 read "
                        f"sectors served' (it names no counter); "
                        f"{ALL} adds sectors of other source units (about the same count in "
                        f"both arms), which dilutes the ratio"}
    for key, metric in (("l2_read_sectors_from_sms", TEX), ("l2_read_sectors_all_sources", ALL),
                        ("dram_read_sectors", DRAM), ("ncu_gpu_time", TIME)):
        per_n = ratios(rows, metric)
        s[f"{key}_unicast_over_multicast"] = _by_kib(per_n)
        s[f"{key}_unicast_over_multicast_range"] = _range(per_n)
    other = [(r[ALL] - r[TEX]) / r[DRAM] for r in rows if r.get(ALL) and r.get(TEX)
             and r.get(DRAM)]
    if other:  # what the all-sources count adds, per DRAM sector read, over every row
        s["other_source_sectors_over_dram_sectors_range"] = [min(other), max(other)]
    s["paper_h100_l2_sectors_unicast_over_multicast"] = {str(n): v for n, v in PAPER.items()}
    return s


def plot(rows, path: Path):
    """Panel (b): SM-requested L2 read sectors, unicast / multicast, per N (all L2 read
    sectors dotted); the paper's H100 values at N = 8 and 16 dashed. Style of ``fig6.plot``
    (``common.ratio_plot``), with room above the curves for the legend."""
    plt = common.pyplot()
    fig, ax = plt.subplots(figsize=(6, 4), dpi=90)
    tex = ratios(rows, TEX)
    markers = dict(zip(fig6.CLUSTERS, ("o", "x", "s", "^"), strict=True))
    colors = {n: f"C{i}" for i, n in enumerate(fig6.CLUSTERS)}
    for n, d in tex.items():
        ax.plot([bif / 1024 for bif in d], list(d.values()), marker=markers.get(n, "o"),
                color=colors.get(n, "k"), label=f"N={n}, requested by the SMs")
    for n, d in ratios(rows, ALL).items():
        ax.plot([bif / 1024 for bif in d], list(d.values()), ls=":", marker=".",
                color=colors.get(n, "k"), alpha=0.6, label=f"N={n}, all L2 read sectors")
    xs = sorted({bif / 1024 for d in tex.values() for bif in d}) or [8.0, 128.0]
    for n, v in PAPER.items():
        ax.plot([xs[0], xs[-1]], [v, v], ls="--", lw=1.2, color=colors.get(n, "k"),
                label=f"paper (H100), N={n}: {v}x")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xscale("log", base=2)
    top = max([v for d in tex.values() for v in d.values()] + list(PAPER.values()))
    ax.set_ylim(0, max(7.0, 1.6 * top))  # room above the curves for the legend
    ax.set_xlabel("bytes in flight per CTA (KiB)")
    ax.set_ylabel("L2 read sectors: unicast / multicast")
    ax.set_title("Figure 6 (b) on our GPU (> 1: redundant unicast reads more L2 sectors)",
                 fontsize=10)
    ax.legend(fontsize=7, ncol=2, loc="upper left")
    common.save_figure(fig, path)


def resummarize(path: Path) -> Path:
    """Recompute ``meta.summary`` of an existing JSON from its rows (the rest of meta is kept)
    and redraw the PNG beside it; needs no GPU."""
    from cutetma import results

    doc = json.loads(path.read_text())
    doc["meta"]["summary"] = summarize(doc["rows"])
    path.write_text(results.dumps(doc))
    plot(doc["rows"], path.with_suffix(".png"))
    return path


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--workload", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--resummarize", metavar="JSON", type=Path,
                    help="recompute meta.summary and the PNG of an existing JSON (no GPU)")
    args = ap.parse_args(argv)
    if args.workload:
        workload(args.quick)
        return 0
    if args.resummarize:
        path = resummarize(args.resummarize)
        print(f"rewrote meta.summary of {path} and {path.with_suffix('.png')}")
        print(json.dumps(json.loads(path.read_text())["meta"]["summary"], indent=1))
        return 0
    from cutetma import results

    rows = profile(args.quick)
    summary = summarize(rows)
    path = results.write("paper_fig6_l2", rows, args.out, extra_meta={"summary": summary})
    plot(rows, path.with_suffix(".png"))
    print(f"wrote {path} and {path.with_suffix('.png')}")
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
