"""Figure 7 of the seed paper: DSM broadcast vs TMA multicast, slowdown of DSM per cluster
size N = 2, 4, 8, 16 and tile size (20 sizes, 1 KiB .. 56 KiB).

    python benchmarks/paper/fig7.py [--quick] [--out DIR]

``ClusterBroadcast`` with ``load`` = ``tma_multicast`` (the leader multicasts each tile to
all N CTAs once they released the stage) and ``dsm`` (the leader loads the tile by unicast
TMA; cluster barrier; the N - 1 peers pull it with 16-byte ld.shared::cluster into their own
shared memory; cluster barrier). Both arms: two stages, tiles of 1 KiB rows, the same
clusters and tiles as ``fig6.py`` (``fig6.measure_broadcast``: check first, then CUDA-event
time per iteration). Slowdown = DSM time / multicast time (> 1: multicast is faster).
Writes ``paper_fig7.json`` and ``paper_fig7.png``.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fig6  # noqa: E402
import run_all as common  # noqa: E402

TILE_KIB = (1, 2, 3, 4, 5, 6, 8, 10, 12, 14, 16, 20, 24, 28, 32, 36, 40, 44, 48, 56)
TILE_KIB_QUICK = (1, 8, 56)
CLUSTERS = (2, 4, 8, 16)
LOADS = ("tma_multicast", "dsm")
STAGES = 2
COLS = 256  # 1 KiB rows


def cases(quick: bool):
    from cutetma.kernels import microbench as mb

    return [mb.BroadcastConfig(load, n, kib, COLS, STAGES) for n in CLUSTERS
            for kib in (TILE_KIB_QUICK if quick else TILE_KIB) for load in LOADS]


def run(quick: bool, writer: common.Writer):
    import torch

    iters, reps = (64, 3) if quick else (256, 5)
    src = common.random_words(fig6.BUFFER, seed=7)
    todo = cases(quick)
    for cfg in common.progress(todo, len(todo), "fig7 DSM vs multicast"):
        try:
            writer.add(fig6.measure_broadcast("7", cfg, iters, reps, src))
        except Exception as exc:
            writer.add({"figure": "7", "load": cfg.load, "cluster": cfg.cluster,
                        "tile_bytes": cfg.tile_bytes, "error": common.error_text(exc)})
    del src
    torch.cuda.empty_cache()


def summarize(rows) -> dict:
    """The numbers REPORT.md needs for observation #5."""
    per_n = fig6.ratios(rows, "dsm", "tma_multicast", "tile_bytes")
    s = {"dsm_over_multicast": {str(n): {f"{x // 1024} KiB": v for x, v in d.items()}
                                for n, d in per_n.items()}}
    for n, d in per_n.items():
        xs = sorted(d)
        s[f"N={n}"] = {"smallest_tile": d[xs[0]], "largest_tile": d[xs[-1]],
                       "min": min(d.values()), "max": max(d.values()),
                       "multicast_faster_everywhere": all(v > 1 for v in d.values())}
    every = [v for d in per_n.values() for v in d.values()]
    if every:
        s["overall_range"] = (min(every), max(every))
    s["errors"] = [f"N={r['cluster']} {r['tile_bytes'] // 1024} KiB {r['load']}: "
                   f"{r['error'][:100]}" for r in rows if "error" in r]
    return s


def plot(rows, path: Path):
    lines = [([x / 1024 for x in d], list(d.values()),
              dict(marker="o", ms=3, color=f"C{i}", label=f"N={n}"))
             for i, (n, d) in enumerate(fig6.ratios(rows, "dsm", "tma_multicast",
                                                     "tile_bytes").items())]
    common.ratio_plot(path, lines, "tile size (KiB)", "DSM broadcast slowdown (DSM / multicast)",
                      "Figure 7 on our GPU (> 1: TMA multicast is faster)", fontsize=8)


def main(argv=None):
    return common.figure_main(argv, __doc__, "paper_fig7", run, summarize, plot,
                              unsupported_is_error=False)


if __name__ == "__main__":
    sys.exit(main())
