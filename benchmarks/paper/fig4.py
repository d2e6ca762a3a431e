"""Figure 4 of the seed paper: TMA vs cp.async (LDGSTS) latency and sustained bandwidth,
against bytes in flight per SM.

    python benchmarks/paper/fig4.py [--quick] [--out DIR]

(a) single-shot latency: ``SingleShotLatency``, one load per CTA, one CTA per SM on every SM
    (and, as extra rows, a lone CTA), timed in the kernel from issue to the mbarrier's
    completion (clock64 -> ns by a calibration kernel; %globaltimer kept too). Tiles 0.5 KiB
    .. 128 KiB for both mechanisms: TMA one 2D box, cp.async 1..32 16-byte vectors per
    thread of 256 (the paper stops cp.async at 16 KiB = 256 threads x 4 vectors; beyond that
    our rows have ``vectors_per_thread`` > 4). L2 flushed before each launch ("cold"); the
    "warm" rows load the tile a second time.
(b) ns/byte = (a) / tile bytes.
(c) sustained bandwidth: ``StreamingLoad`` streams a 4 GiB buffer global -> shared through
    a ring of 1..8 stages, 1..4 CTAs per SM, tiles 0.5..32 KiB; CUDA events; bytes read =
    tiles x tile bytes. Panel (c) shows, per bytes in flight per SM (CTAs x stages x tile),
    the best configuration of each mechanism, like the paper's "max across the sweep".

Every configuration is checked before it is timed: (a) dumps each CTA's tile, (c) every
stage of every CTA (the last tiles of its walk); a mismatch is a row with an ``error``.
Writes ``paper_fig4.json`` and ``paper_fig4.png``.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run_all as common  # noqa: E402

LAT_ROWS = (1, 2, 4, 8, 16, 32, 64, 128, 256)  # x 512 B: 0.5 KiB .. 128 KiB
LAT_ROWS_QUICK = (1, 8, 32, 256)
LAT_COLS = 128  # 512-byte rows
STREAM_ROWS = (1, 4, 16, 64)  # 0.5, 2, 8, 32 KiB tiles
STREAM_ROWS_QUICK = (4, 64)
STAGES = (1, 2, 4, 8)
CTAS_PER_SM = (1, 2, 4)
LOADS = ("cp_async", "tma")
HBM_PEAK_GBPS = 4800  # H200 SXM advertised (HBM3e); the paper's line is H100's 3350
LAT_BUFFER = 64 << 20
STREAM_BUFFER = 4 << 30


def calibrate_ghz() -> dict:
    """SM clock in GHz: clock64 ticks per %globaltimer ns over a ~2 ms spin."""
    import torch

    from cutetma.kernels import microbench as mb

    out = torch.zeros(4, dtype=torch.int64, device=common.DEVICE)
    args = (common.cute_tensor(out), 4_000_000, common.stream())
    kernel = common.compiled(("calibration",), mb.TimerCalibration, *args)
    kernel(*args)
    torch.cuda.synchronize()
    ns, cycles = out[0].item(), out[1].item()
    return {"ghz": cycles / ns if ns > 0 else None, "ns": ns, "cycles": cycles}


def measure_latency(load: str, rows: int, ctas: int, l2: str, reps: int, src, ghz: float):
    import torch

    from cutetma.kernels import microbench as mb

    cfg = mb.LatencyConfig(load, rows, LAT_COLS)
    row = {"figure": "4a", "load": load, "tile_bytes": cfg.tile_bytes,
           "bytes_in_flight_per_sm": cfg.tile_bytes, "ctas": ctas, "l2": l2,
           "threads_loading": cfg.threads_loading,
           "vectors_per_thread": cfg.vectors_per_thread if load == "cp_async" else None}
    words = cfg.rows * cfg.cols
    x = src.view(-1, cfg.cols)
    slots = x.shape[0] // cfg.rows // ctas
    times = torch.zeros(ctas, 2, dtype=torch.int64, device=common.DEVICE)
    dump = torch.zeros(ctas, words, dtype=torch.int32, device=common.DEVICE)
    tX, tT, tD, s = (common.cute_tensor(x), common.cute_tensor(times), common.cute_tensor(dump),
                     common.stream())
    kernel = common.compiled(("latency", cfg), lambda: mb.SingleShotLatency(cfg),
                             tX, tT, tD, 0, 1, s)

    kernel(tX, tT, tD, 0, 1, s)  # correctness first: CTA i loaded tile i
    expected = x[:ctas * cfg.rows].view(torch.int32).reshape(ctas, words)
    bad = (dump != expected).any(dim=1).sum().item()
    if bad:
        return {**row, "error": f"wrong tile in shared memory in {bad} of {ctas} CTAs"}

    samples = []
    for r in range(reps):
        base = (1 + r) % max(1, slots) * ctas  # other tiles than the check launch read
        if l2 == "cold":
            common.flush_l2()
        else:
            kernel(tX, tT, tD, base, 0, s)  # the second load of the same tiles hits in L2
        kernel(tX, tT, tD, base, 0, s)
        samples.append(times.clone())
    t = torch.stack(samples).cpu()
    ns = t[..., 0].flatten().tolist()
    cycles = t[..., 1].flatten().tolist()
    cyc_med = common.median(cycles)
    lat = cyc_med / ghz if ghz else common.median(ns)
    steps = sorted({b - a for a, b in zip(sorted(set(ns)), sorted(set(ns))[1:], strict=False)})
    return {**row, "samples": len(ns), "latency_ns": lat,
            "latency_ns_p10": common.quantile(cycles, 0.1) / ghz if ghz else None,
            "latency_ns_p90": common.quantile(cycles, 0.9) / ghz if ghz else None,
            "cycles_median": cyc_med, "globaltimer_ns_median": common.median(ns),
            "globaltimer_step_ns": steps[0] if steps else None,
            "ns_per_byte": lat / cfg.tile_bytes, "verified": True}


def measure_stream(cfg, reps: int, src):
    """Check, then time ``StreamingLoad(cfg)`` with ``cfg.ctas_per_sm`` CTAs on every SM."""
    import torch

    from cutetma.kernels import microbench as mb

    stages = cfg.stages
    grid = cfg.ctas_per_sm * common.sm_count()
    row = {"figure": "4c", "load": cfg.load, "tile_bytes": cfg.tile_bytes, "stages": stages,
           "ctas_per_sm": cfg.ctas_per_sm,
           "bytes_in_flight_per_sm": cfg.ctas_per_sm * stages * cfg.tile_bytes}
    x = src.view(-1, cfg.cols)
    num_tiles = x.shape[0] // cfg.rows
    words = cfg.rows * cfg.cols
    dump = torch.zeros(grid, stages * words, dtype=torch.int32, device=common.DEVICE)
    tX, tD, s = common.cute_tensor(x), common.cute_tensor(dump), common.stream()
    kernel = common.compiled(("stream", cfg), lambda: mb.StreamingLoad(cfg), tX, tD, num_tiles,
                             1, s)

    kernel(tX, tD, num_tiles, 1, s)  # correctness first (and warm-up)
    tiles = x[:num_tiles * cfg.rows].view(torch.int32).reshape(num_tiles, words)
    b = torch.arange(grid, device=common.DEVICE)
    mine = (num_tiles - b + grid - 1) // grid
    for st in range(stages):  # the last tile k of CTA b with k % stages == st sits in stage st
        k = mine - 1 - (mine - 1 - st) % stages
        ok = k >= 0
        got = dump[:, st * words:(st + 1) * words][ok]
        if not torch.equal(got, tiles[(b + k * grid)[ok]]):
            return {**row, "error": f"stage {st}: shared memory does not hold the tile it should"}

    ms = common.gpu_ms(lambda: kernel(tX, tD, num_tiles, 0, s), reps)
    nbytes = num_tiles * cfg.tile_bytes
    med = common.median(ms)
    return {**row, "bytes_read": nbytes, "ms": med, "ms_all": ms, "gbps": nbytes / med / 1e6,
            "grid": grid, "verified": True}


def latency_cases(quick: bool):
    rows = LAT_ROWS_QUICK if quick else LAT_ROWS
    cases = [(load, r, "sms", "cold") for r in rows for load in LOADS]
    if not quick:
        cases += [(load, r, "sms", "warm") for r in rows for load in LOADS]
        cases += [(load, r, 1, "cold") for r in rows for load in LOADS]
    return cases


def stream_cases(quick: bool):
    from cutetma.kernels import microbench as mb

    cases = []
    for rows in (STREAM_ROWS_QUICK if quick else STREAM_ROWS):
        for stages in ((1, 4) if quick else STAGES):
            for ctas in ((1, 4) if quick else CTAS_PER_SM):
                try:  # only configurations whose CTAs fit ctas-per-SM times
                    cases += [mb.StreamConfig(load, rows, LAT_COLS, stages, ctas_per_sm=ctas)
                              for load in LOADS]
                except ValueError:
                    pass
    return cases


def run(quick: bool, writer: common.Writer):
    import torch

    reps = 10 if quick else 20
    cal = calibrate_ghz()
    writer.meta["clock_calibration_start"] = cal
    ghz = cal["ghz"]
    src = common.random_words(LAT_BUFFER, seed=4)
    cases = latency_cases(quick)
    for load, rows, ctas, l2 in common.progress(cases, len(cases), "fig4 (a) latency"):
        n = common.sm_count() if ctas == "sms" else ctas
        try:
            writer.add(measure_latency(load, rows, n, l2, reps, src, ghz))
        except Exception as exc:
            writer.add({"figure": "4a", "load": load, "tile_bytes": rows * LAT_COLS * 4,
                        "ctas": n, "l2": l2, "error": common.error_text(exc)})
    writer.meta["clock_calibration_end"] = calibrate_ghz()
    del src
    src = common.random_words(STREAM_BUFFER // (4 if quick else 1), seed=5)
    cases = stream_cases(quick)
    for cfg in common.progress(cases, len(cases), "fig4 (c) bandwidth"):
        try:
            writer.add(measure_stream(cfg, 3 if quick else 5, src))
        except Exception as exc:
            writer.add({"figure": "4c", "load": cfg.load, "tile_bytes": cfg.tile_bytes,
                        "stages": cfg.stages, "ctas_per_sm": cfg.ctas_per_sm,
                        "error": common.error_text(exc)})
    del src
    torch.cuda.empty_cache()


# ------------------------------------------------------------------ summary and plot
def latency_curve(rows, load, ctas=None, l2="cold"):
    """{tile bytes: row} for one mechanism, all-SM (largest ``ctas``) cold rows by default."""
    pts = [r for r in rows if r.get("figure") == "4a" and r["load"] == load and r.get("l2") == l2
           and "error" not in r]
    if ctas is None and pts:
        ctas = max(r["ctas"] for r in pts)
    return {r["tile_bytes"]: r for r in pts if r["ctas"] == ctas}


def bandwidth_curve(rows, load):
    """{bytes in flight per SM: best row} (the paper plots the max over the sweep)."""
    best = {}
    for r in rows:
        if r.get("figure") == "4c" and r["load"] == load and "error" not in r:
            b = r["bytes_in_flight_per_sm"]
            if b not in best or r["gbps"] > best[b]["gbps"]:
                best[b] = r
    return dict(sorted(best.items()))


def summarize(rows) -> dict:
    """The numbers REPORT.md needs for observation #2 (all from this run's rows)."""
    s = {}
    tma, cpa = latency_curve(rows, "tma"), latency_curve(rows, "cp_async")
    both = sorted(set(tma) & set(cpa))
    s["latency_ratio_tma_over_cp_async"] = {
        f"{b / 1024:g} KiB": tma[b]["latency_ns"] / cpa[b]["latency_ns"] for b in both}
    s["latency_ns"] = {f"{b / 1024:g} KiB": {"tma": tma[b]["latency_ns"] if b in tma else None,
                                              "cp_async": cpa[b]["latency_ns"] if b in cpa
                                              else None} for b in sorted(set(tma) | set(cpa))}
    within2 = [b for b in both if tma[b]["latency_ns"] < 2 * cpa[b]["latency_ns"]]
    s["first_size_tma_within_2x_KiB"] = within2[0] / 1024 if within2 else None
    parity = [b for b in both if tma[b]["latency_ns"] <= 1.1 * cpa[b]["latency_ns"]]
    s["first_size_tma_within_10pct_KiB"] = parity[0] / 1024 if parity else None
    for name, curve in (("tma", tma), ("cp_async", cpa)):
        if curve:
            npb = [curve[b]["ns_per_byte"] for b in sorted(curve)]
            s[f"{name}_ns_per_byte_first_last"] = (npb[0], npb[-1])
            s[f"{name}_ns_per_byte_collapse"] = npb[0] / npb[-1]
    for name in LOADS:
        curve = bandwidth_curve(rows, name)
        if curve:
            peak = max(curve.values(), key=lambda r: r["gbps"])
            s[f"{name}_peak_gbps"] = peak["gbps"]
            s[f"{name}_peak_config"] = {k: peak[k] for k in (
                "tile_bytes", "stages", "ctas_per_sm", "bytes_in_flight_per_sm")}
            s[f"{name}_gbps_by_bif_KiB"] = {f"{b / 1024:g}": r["gbps"] for b, r in curve.items()}
    tops = [s.get(f"{n}_peak_gbps") or 0 for n in LOADS]
    if max(tops):
        target = 0.9 * max(tops)
        for name in LOADS:
            curve = bandwidth_curve(rows, name)
            hit = [b for b, r in curve.items() if r["gbps"] >= target]
            s[f"{name}_first_bif_KiB_at_90pct_of_best"] = hit[0] / 1024 if hit else None
    return s


def plot(rows, path: Path):
    fig, axes = common.pyplot().subplots(1, 3, figsize=(13, 3.8), dpi=90)
    styles = {"cp_async": ("LDGSTS (cp.async)", "o", "C0"), "tma": ("TMA-2D", "s", "C1")}
    for load, (label, marker, color) in styles.items():
        cold = latency_curve(rows, load)
        if cold:
            xs = [b / 1024 for b in cold]
            axes[0].plot(xs, [r["latency_ns"] for r in cold.values()], marker=marker,
                         color=color, label=label)
            axes[1].plot(xs, [r["ns_per_byte"] for r in cold.values()], marker=marker,
                         color=color, label=label)
        warm = latency_curve(rows, load, l2="warm")
        if warm:
            axes[0].plot([b / 1024 for b in warm], [r["latency_ns"] for r in warm.values()],
                         ls=":", color=color, label=f"{label}, L2 warm")
        bw = bandwidth_curve(rows, load)
        if bw:
            axes[2].plot([b / 1024 for b in bw], [r["gbps"] for r in bw.values()],
                         marker=marker, color=color, label=label)
    axes[0].axvline(16, ls="--", color="gray", lw=0.8, label="paper's cp.async ceiling")
    axes[2].axhline(HBM_PEAK_GBPS, ls=":", color="k", label="H200 HBM3e peak (4.8 TB/s)")
    titles = ("(a) single-load latency", "(b) latency per byte", "(c) sustained bandwidth")
    ylabels = ("latency (ns)", "ns / byte", "DRAM bandwidth (GB/s)")
    for ax, title, ylabel in zip(axes, titles, ylabels, strict=True):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("bytes in flight per SM (KiB)")
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=7)
    axes[0].set_yscale("log")
    axes[1].set_yscale("log")
    fig.suptitle("Figure 4 on our GPU: TMA vs cp.async (one CTA per SM, L2 cold)", fontsize=11)
    common.save_figure(fig, path)


def main(argv=None):
    return common.figure_main(argv, __doc__, "paper_fig4", run, summarize, plot)


if __name__ == "__main__":
    sys.exit(main())
