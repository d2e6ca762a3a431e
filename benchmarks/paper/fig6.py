"""Figure 6 (a) of the seed paper: redundant unicast vs TMA multicast, runtime per iteration
of a cluster of N CTAs that all need the same tile, N = 2, 4, 8, 16.

    python benchmarks/paper/fig6.py [--quick] [--out DIR]

``ClusterBroadcast`` with ``load`` = ``tma`` (every CTA its own unicast TMA of the whole
tile; CTA-local barriers only), ``tma_multicast`` (the paper's arm: the leader waits for all
N CTAs to release the stage, then multicasts the whole tile) and ``tma_multicast_split``
(every CTA multicasts 1/N, CUTLASS style). Two stages; bytes in flight per CTA = 2 x tile,
4 KiB .. 192 KiB (256 KiB would need 2 x 128 KiB of shared memory: reported as unsupported).
As many clusters as fit on the GPU run at once, each streaming its own tiles from a 1 GiB
buffer (iteration k of cluster c reads tile c * iters + k), so both arms read the same DRAM
bytes. Runtime per iteration = CUDA-event time of the launch / iterations.

Panel (b) of the paper (L2 read sectors) needs Nsight Compute counters
(``lts__t_sectors_srcunit_tex_op_read.sum``): ``fig6_l2.py`` reads them, not this script.
Every configuration is checked first: every CTA dumps the stage holding the last tile.
Writes ``paper_fig6.json`` and ``paper_fig6.png``.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run_all as common  # noqa: E402

BIF_KIB = (4, 8, 16, 32, 64, 128, 192, 256)  # bytes in flight per CTA = 2 stages x tile
BIF_KIB_QUICK = (4, 32, 192)
STAGES = 2
CLUSTERS = (2, 4, 8, 16)
LOADS = ("tma_multicast", "tma_multicast_split", "tma")
MIN_ROWS = 16  # every tile splits into 16 slices, so all N share one tile shape
BUFFER = 1 << 30


def measure_broadcast(figure: str, cfg, iters: int, reps: int, src) -> dict:
    """Check, then time ``ClusterBroadcast(cfg)`` with as many clusters as fit at once."""
    import torch

    from cutetma.kernels import microbench as mb

    n = cfg.cluster
    row = {"figure": figure, "load": cfg.load, "cluster": n, "tile_bytes": cfg.tile_bytes,
           "tile_shape": [cfg.rows, cfg.cols], "stages": cfg.stages,
           "bytes_in_flight_per_cta": cfg.stages * cfg.tile_bytes, "iters": iters}
    try:
        clusters = common.max_active_clusters(n)
    except Exception as exc:
        return {**row, "error": f"unsupported: cluster occupancy query failed: "
                                f"{common.error_text(exc)}"}
    if clusters < 1:
        return {**row, "error": f"unsupported: no cluster of {n} CTAs fits on this GPU "
                                f"(cudaOccupancyMaxActiveClusters = {clusters})"}
    grid = clusters * n
    row.update(clusters=clusters, ctas=grid)
    x = src.view(-1, cfg.cols)
    num_tiles = x.shape[0] // cfg.rows
    words = cfg.rows * cfg.cols
    dump = torch.zeros(grid, words, dtype=torch.int32, device=common.DEVICE)
    tX, tD, s = common.cute_tensor(x), common.cute_tensor(dump), common.stream()
    kernel = common.compiled(("broadcast", cfg), lambda: mb.ClusterBroadcast(cfg), tX, tD,
                             iters, num_tiles, 1, s)

    kernel(tX, tD, iters, num_tiles, 1, s)  # correctness first (and warm-up)
    tiles = x[:num_tiles * cfg.rows].view(torch.int32).reshape(num_tiles, words)
    last = (torch.arange(clusters, device=common.DEVICE) * iters + iters - 1) % num_tiles
    bad = (dump != tiles[last].repeat_interleave(n, dim=0)).any(dim=1)
    if bad.any():
        ranks = sorted({i % n for i in bad.nonzero().flatten().tolist()})
        return {**row, "error": f"wrong tile in {int(bad.sum())} of {grid} CTAs "
                                f"(cluster ranks {ranks})"}

    ms = common.gpu_ms(lambda: kernel(tX, tD, iters, num_tiles, 0, s), reps)
    med = common.median(ms)
    return {**row, "ms": med, "ms_all": ms, "us_per_iter": med * 1e3 / iters,
            "gbps_dram": clusters * iters * cfg.tile_bytes / med / 1e6, "verified": True}


def cases(quick: bool):
    from cutetma.kernels import microbench as mb

    out = []
    for n in CLUSTERS:  # 16 (non-portable) last: if it breaks, the rest is measured
        for kib in (BIF_KIB_QUICK if quick else BIF_KIB):
            tile = kib * 1024 // STAGES
            for load in LOADS:
                try:
                    rows, cols = mb.tile_shape(tile, MIN_ROWS)
                    out.append((mb.BroadcastConfig(load, n, rows, cols, STAGES), None))
                except ValueError as exc:
                    out.append(((load, n, tile), f"unsupported: {exc}"))
    return out


def run(quick: bool, writer: common.Writer):
    import torch

    iters, reps = (64, 3) if quick else (256, 5)
    src = common.random_words(BUFFER, seed=6)
    todo = cases(quick)
    for cfg, refused in common.progress(todo, len(todo), "fig6 multicast vs unicast"):
        if refused:
            load, n, tile = cfg
            writer.add({"figure": "6", "load": load, "cluster": n, "tile_bytes": tile,
                        "stages": STAGES, "bytes_in_flight_per_cta": STAGES * tile,
                        "error": refused})
            continue
        try:
            writer.add(measure_broadcast("6", cfg, iters, reps, src))
        except Exception as exc:
            writer.add({"figure": "6", "load": cfg.load, "cluster": cfg.cluster,
                        "tile_bytes": cfg.tile_bytes, "stages": cfg.stages,
                        "bytes_in_flight_per_cta": cfg.stages * cfg.tile_bytes,
                        "error": common.error_text(exc)})
    del src
    torch.cuda.empty_cache()


def ratios(rows, num: str, den: str, x_key: str):
    """{N: {x: t_num / t_den}} over the configurations both arms measured."""
    t = {(r["load"], r["cluster"], r[x_key]): r["us_per_iter"] for r in common.ok_rows(rows)}
    out = {}
    for (load, n, x), us in sorted(t.items()):
        if load == num and (den, n, x) in t:
            out.setdefault(n, {})[x] = us / t[(den, n, x)]
    return out


def summarize(rows) -> dict:
    """The numbers REPORT.md needs for observation #4 and Table 3."""
    s = {}
    for den in ("tma_multicast", "tma_multicast_split"):
        per_n = ratios(rows, "tma", den, "bytes_in_flight_per_cta")
        key = f"unicast_over_{den}"
        s[key] = {str(n): {f"{x // 1024} KiB": v for x, v in d.items()} for n, d in per_n.items()}
        s[f"{key}_range"] = {str(n): (min(d.values()), max(d.values()))
                             for n, d in per_n.items() if d}
    s["unsupported"] = sorted({f"N={r['cluster']} BIF={r.get('bytes_in_flight_per_cta', 0) // 1024}"
                               f" KiB: {r['error'][:120]}" for r in rows
                               if r.get("error", "").startswith("unsupported")})
    s["errors"] = len([r for r in rows if "error" in r
                       and not r["error"].startswith("unsupported")])
    return s


def plot(rows, path: Path):
    lines = []
    for i, (n, d) in enumerate(ratios(rows, "tma", "tma_multicast",
                                      "bytes_in_flight_per_cta").items()):
        lines.append(([x / 1024 for x in d], list(d.values()),
                      dict(marker="o", color=f"C{i}", label=f"N={n}")))
    for i, (n, d) in enumerate(ratios(rows, "tma", "tma_multicast_split",
                                      "bytes_in_flight_per_cta").items()):
        lines.append(([x / 1024 for x in d], list(d.values()),
                      dict(ls="--", color=f"C{i}", alpha=0.6, label=f"N={n}, vs split multicast")))
    common.ratio_plot(path, lines, "bytes in flight per CTA (KiB)", "runtime: unicast / multicast",
                      "Figure 6 (a) on our GPU (< 1: redundant unicast is faster)",
                      fontsize=7, ncol=2)


def main(argv=None):
    return common.figure_main(argv, __doc__, "paper_fig6", run, summarize, plot,
                              unsupported_is_error=False)


if __name__ == "__main__":
    sys.exit(main())
