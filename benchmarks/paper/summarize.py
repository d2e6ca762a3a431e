"""Print the numbers ``benchmarks/paper/REPORT.md`` needs from ``paper_fig{4,6,7}.json``, in
the report's order, beside the paper's H100 values, so filling the report is mechanical.

    python benchmarks/paper/summarize.py [--dir benchmarks/results]

Needs no GPU (numbers are recomputed from the rows, not read from the figures' own meta).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

PAPER = {  # the paper's H100 SXM5 numbers (section 4), quoted for side-by-side reading
    "obs2": "TMA 1.4 us vs LDGSTS 0.43 us at 0.5 KiB (3.1x); 2.1x at 1 KiB; 2.8-3.0x at "
            "2-8 KiB; within 2x at 16 KiB; ns/B collapses ~40x; TMA ~0.07 ns/B at 128 KiB, "
            "LDGSTS ~0.05 ns/B at 16 KiB; LDGSTS ~3.1 TB/s (94%) and TMA ~3.2 TB/s (96% of "
            "3.35 TB/s) at 32 KiB bytes in flight per SM",
    "obs4": "unicast / multicast runtime 0.45-0.79 at every N >= 2 (1.3-2.2x faster), "
            "saturating near 2x at N >= 8",
    "table3": "N = 2 and >= ~100 KiB per CTA: either (ratio -> 1.0); N <= 4 smaller tiles or "
              "N >= 8 streaming: redundant unicast (1.3-2.1x); N >= 8 and L2-bound: multicast",
    "obs5": "DSM / multicast 1.8-3.9x at N=2 (flat); N=4 1.9 -> 7.8x; N=8 2.3 -> 18.6x; "
            "N=16 2.9 -> 35.8x (smallest -> largest tile); 1.8x to ~36x overall",
}


def load(directory: Path, name: str):
    path = directory / f"{name}.json"
    if not path.exists():
        print(f"  ({path} not found)")
        return None, []
    doc = json.loads(path.read_text())
    meta = doc.get("meta", {})
    print(f"  {path}: {len(doc['rows'])} rows, device {meta.get('device')}, "
          f"complete={meta.get('complete')}, quick={meta.get('quick')}, "
          f"clocks {meta.get('clocks')}")
    return meta, doc["rows"]


def section(directory: Path, name: str, title: str, *quotes: str):
    """Print a section's title and the paper's numbers to read beside it; then ``load`` it."""
    print(f"\n## {title}")
    for quote in quotes:
        print(f"  {quote}")
    return load(directory, name)


def fmt(v, spec=".3g"):
    if v is None:
        return "-"
    if isinstance(v, (tuple, list)):
        return "(" + ", ".join(fmt(x, spec) for x in v) + ")"
    return format(v, spec) if isinstance(v, float) else str(v)


def fig4_section(directory: Path):
    import fig4

    meta, rows = section(directory, "paper_fig4", "Observation #2 (Figure 4): TMA vs cp.async",
                         f"paper (H100): {PAPER['obs2']}")
    if not rows:
        return
    print(f"  clock calibration: {meta.get('clock_calibration_start')} -> "
          f"{meta.get('clock_calibration_end')}")
    for label, kwargs in (("all SMs, L2 cold", {}), ("all SMs, L2 warm", {"l2": "warm"}),
                          ("one CTA, L2 cold", {"ctas": 1})):
        tma = fig4.latency_curve(rows, "tma", **kwargs)
        cpa = fig4.latency_curve(rows, "cp_async", **kwargs)
        if not tma and not cpa:
            continue
        print(f"\n  (a, b) {label}")
        print("    KiB      TMA ns  cp.async ns   TMA/cp   TMA ns/B  cp ns/B  cp vec/thr")
        for b in sorted(set(tma) | set(cpa)):
            t, c = tma.get(b, {}), cpa.get(b, {})
            ratio = t["latency_ns"] / c["latency_ns"] if t and c else None
            print(f"    {b / 1024:<7g} {fmt(t.get('latency_ns'), '8.0f')} "
                  f"{fmt(c.get('latency_ns'), '12.0f')} {fmt(ratio, '8.2f')} "
                  f"{fmt(t.get('ns_per_byte'), '10.4f')} {fmt(c.get('ns_per_byte'), '8.4f')} "
                  f"{fmt(c.get('vectors_per_thread'))}")
    s = fig4.summarize(rows)
    print("\n  crossovers (all SMs, cold):")
    for key in ("first_size_tma_within_2x_KiB", "first_size_tma_within_10pct_KiB",
                "tma_ns_per_byte_collapse", "cp_async_ns_per_byte_collapse",
                "tma_ns_per_byte_first_last", "cp_async_ns_per_byte_first_last"):
        print(f"    {key}: {fmt(s.get(key))}")
    print("\n  (c) best GB/s per bytes in flight per SM (KiB):")
    for name in fig4.LOADS:
        curve = s.get(f"{name}_gbps_by_bif_KiB", {})
        print(f"    {name:9s} " + "  ".join(f"{k}:{v:.0f}" for k, v in curve.items()))
    for name in fig4.LOADS:
        peak = s.get(f"{name}_peak_gbps")
        if peak:
            print(f"    {name} peak {peak:.0f} GB/s = {100 * peak / fig4.HBM_PEAK_GBPS:.0f}% of "
                  f"4.8 TB/s, at {s.get(f'{name}_peak_config')}; reaches 90% of the best "
                  f"mechanism's peak from {fmt(s.get(f'{name}_first_bif_KiB_at_90pct_of_best'))}"
                  f" KiB in flight per SM")


def fig6_section(directory: Path):
    import fig6

    _, rows = section(directory, "paper_fig6",
                      "Observation #4 and Table 3 (Figure 6): redundant unicast vs multicast",
                      f"paper (H100): {PAPER['obs4']}", f"paper Table 3: {PAPER['table3']}")
    if not rows:
        return
    for den in ("tma_multicast", "tma_multicast_split"):
        per_n = fig6.ratios(rows, "tma", den, "bytes_in_flight_per_cta")
        if not per_n:
            continue
        xs = sorted({x for d in per_n.values() for x in d})
        print(f"\n  runtime unicast / {den} (< 1: unicast faster), by KiB in flight per CTA")
        print("    N    " + "".join(f"{x // 1024:>8}" for x in xs) + "     min     max")
        for n, d in per_n.items():
            cells = "".join(f"{fmt(d.get(x), '8.2f')}" for x in xs)
            print(f"    {n:<4} {cells} {min(d.values()):7.2f} {max(d.values()):7.2f}")
        print("    Table 3 reading: N=2 at >= 100 KiB in flight: "
              + ", ".join(f"{x // 1024} KiB {v:.2f}" for x, v in per_n.get(2, {}).items()
                          if x >= 100 * 1024))
    us = {(r["load"], r["cluster"], r["bytes_in_flight_per_cta"]): r["us_per_iter"]
          for r in rows if "error" not in r}
    xs = sorted({k[2] for k in us})
    if us:
        print("\n  us per iteration, by KiB in flight per CTA")
        print("    load                 N   " + "".join(f"{x // 1024:>8}" for x in xs))
        for ld in fig6.LOADS:
            for n in fig6.CLUSTERS:
                if any((ld, n, x) in us for x in xs):
                    cells = "".join(fmt(us.get((ld, n, x)), "8.3f") for x in xs)
                    print(f"    {ld:20s} {n:<3} {cells}")
    s = fig6.summarize(rows)
    for u in s["unsupported"]:
        print(f"  unsupported: {u}")
    print(f"  other errors: {s['errors']}")


def fig7_section(directory: Path):
    import fig6
    import fig7

    _, rows = section(directory, "paper_fig7",
                      "Observation #5 (Figure 7): DSM broadcast vs TMA multicast",
                      f"paper (H100): {PAPER['obs5']}")
    if not rows:
        return
    per_n = fig6.ratios(rows, "dsm", "tma_multicast", "tile_bytes")
    xs = sorted({x for d in per_n.values() for x in d})
    print("\n  DSM / multicast (> 1: multicast faster), by tile KiB")
    print("    N    " + "".join(f"{x // 1024:>7}" for x in xs))
    for n, d in per_n.items():
        print(f"    {n:<4} " + "".join(f"{fmt(d.get(x), '7.2f')}" for x in xs))
    s = fig7.summarize(rows)
    for n in per_n:
        v = s[f"N={n}"]
        print(f"    N={n}: {v['smallest_tile']:.2f} at the smallest tile -> "
              f"{v['largest_tile']:.2f} at the largest; range {v['min']:.2f}..{v['max']:.2f}; "
              f"multicast faster everywhere: {v['multicast_faster_everywhere']}")
    print(f"    overall: {fmt(s.get('overall_range'))}")
    for e in s["errors"]:
        print(f"  error: {e}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=str(HERE.parents[1] / "benchmarks" / "results"))
    args = ap.parse_args(argv)
    directory = Path(args.dir)
    fig4_section(directory)
    fig6_section(directory)
    fig7_section(directory)
    return 0


if __name__ == "__main__":
    sys.exit(main())
