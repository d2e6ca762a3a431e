"""Which GEMM configuration is fastest on this card: a small sweep at the sizes the targets
name (8192^3, 4096^3), fp16 and bf16, against cuBLAS in the same run on the same randn data.

    python benchmarks/gemm_tune.py [--out DIR]

Writes ``gemm_tune.json`` (``--headline-only``: ``gemm_headline.json``); what it found is in
docs/design.md.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gemm import bench  # noqa: E402  (same timing: CUDA-graph replays, L2 flushed)

SIZES = [(8192, 8192, 8192), (4096, 4096, 4096)]
TILES = [(128, 256, "cooperative"), (64, 256, "pingpong"), (128, 128, "pingpong")]
CLUSTERS = [(1, 1), (2, 1)]
RASTER = [1, 8]  # clusters per rasterization band
EPI_N = [32]  # epilogue sub-tile width (64 measured no better, 2026-11-30)


HEADLINE_CANDIDATES = [  # (tile_m, tile_n, schedule), cluster, raster, epi_n: the sweep's best
    ((128, 256, "cooperative"), (1, 1), 8, 32),
    ((128, 256, "cooperative"), (2, 1), 8, 32),
    ((64, 256, "pingpong"), (1, 1), 8, 32),
]


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--headline-only", action="store_true",
                    help="skip the sweep: interleave cuBLAS with the known-good configurations")
    args = ap.parse_args(argv)
    if args.headline_only:
        from cutetma import results

        rows = []
        for size in SIZES:
            for dtype in ("float16", "bfloat16"):
                for tile, cluster, raster, epi_n in HEADLINE_CANDIDATES:
                    rows.append({"M": size[0], "N": size[1], "K": size[2], "dtype": dtype,
                                 "tile": tile, "cluster": cluster, "raster_swizzle": raster,
                                 "epi_n": epi_n, "ours": 1.0})
        out = headline(rows, rounds=5, every_config=True)
        print(f"wrote {results.write('gemm_headline', out, args.out)}")
        return 0
    import torch

    import cutetma
    from cutetma import GemmConfig, results

    rows = []
    for dtype, (m, n, k) in itertools.product(("float16", "bfloat16"), SIZES):
        t = getattr(torch, dtype)
        a = torch.randn(m, k, device="cuda", dtype=t)
        b = torch.randn(n, k, device="cuda", dtype=t)
        flops = 2 * m * n * k
        cublas = flops / bench(lambda a=a, b=b: a @ b.T) / 1e9
        for tile, cluster, raster, epi_n in itertools.product(TILES, CLUSTERS, RASTER, EPI_N):
            cfg = GemmConfig(tile_m=tile[0], tile_n=tile[1], cluster_m=cluster[0],
                             cluster_n=cluster[1], raster_swizzle=raster, epi_n=epi_n,
                             schedule=tile[2])

            def call(a=a, b=b, cfg=cfg):
                return cutetma.gemm(a, b, config=cfg)

            row = {"M": m, "N": n, "K": k, "dtype": dtype, "tile": tile, "cluster": cluster,
                   "raster_swizzle": raster, "epi_n": epi_n, "cublas": cublas}
            try:
                err = (call().float() - (a @ b.T).float()).abs().max().item()
                row["ours"] = flops / bench(call) / 1e9
                row["max_abs_err"] = err
            except Exception as exc:
                row["error"] = f"{type(exc).__name__}: {exc}"[:300]
            rows.append(row)
            print(f"{dtype} {m}x{n}x{k} tile {tile} cluster {cluster} raster {raster} "
                  f"epi {epi_n}: "
                  f"ours {row.get('ours', float('nan')):.0f} cublas {cublas:.0f} TFLOP/s "
                  f"({row.get('ours', 0) / cublas:.3f}x)", flush=True)
    rows += headline(rows)
    print(f"wrote {results.write('gemm_tune', rows, args.out)}")
    return 0


def headline(rows, rounds: int = 7, every_config: bool = False):
    """The target cells again, best configuration each, cuBLAS and ours alternating for
    ``rounds`` rounds: the card's power and clocks drift by several percent between minutes,
    so only interleaved ratios are compared. Reports the median ratio."""
    import statistics

    import torch

    import cutetma
    from cutetma import GemmConfig

    out = []
    for dtype, (m, n, k) in itertools.product(("float16", "bfloat16"), SIZES):
        mine = [r for r in rows if (r["M"], r["N"], r["K"], r["dtype"]) == (m, n, k, dtype)
                and r.get("ours")]
        if not mine:
            continue
        chosen = mine if every_config else [max(mine, key=lambda r: r["ours"])]
        t = getattr(torch, dtype)
        a = torch.randn(m, k, device="cuda", dtype=t)
        b = torch.randn(n, k, device="cuda", dtype=t)
        flops = 2 * m * n * k
        for best in chosen:
            cfg = GemmConfig(tile_m=best["tile"][0], tile_n=best["tile"][1],
                             cluster_m=best["cluster"][0], cluster_n=best["cluster"][1],
                             raster_swizzle=best["raster_swizzle"], epi_n=best["epi_n"],
                             schedule=best["tile"][2])

            def ours_call(a=a, b=b, cfg=cfg):
                return cutetma.gemm(a, b, config=cfg)

            ours, theirs = [], []
            for _ in range(rounds):
                theirs.append(flops / bench(lambda a=a, b=b: a @ b.T) / 1e9)
                ours.append(flops / bench(ours_call) / 1e9)
            ratios = [o / c for o, c in zip(ours, theirs, strict=True)]
            row = {"M": m, "N": n, "K": k, "dtype": dtype, "headline": True,
                   "config": {"tile": best["tile"], "cluster": best["cluster"],
                              "raster_swizzle": best["raster_swizzle"], "epi_n": best["epi_n"]},
                   "ours_rounds": ours, "cublas_rounds": theirs,
                   "median_ratio": statistics.median(ratios)}
            print(f"HEADLINE {dtype} {m}^3 {best['tile']} {best['cluster']}: ours/cublas median "
                  f"{row['median_ratio']:.3f} over {rounds} interleaved rounds (ours "
                  f"{statistics.median(ours):.0f}, cublas {statistics.median(theirs):.0f} "
                  f"TFLOP/s)", flush=True)
            out.append(row)
    return out


if __name__ == "__main__":
    sys.exit(main())
