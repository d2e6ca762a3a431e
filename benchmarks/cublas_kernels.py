"""Which kernel cuBLAS (torch.matmul) runs for each GEMM cell, read from the torch profiler.

    python benchmarks/cublas_kernels.py [--cells MxNxK ...] \
        [--dtypes float16 bfloat16] [--name cublas_kernels] [--out DIR]

cuBLAS's Hopper kernels (``nvjet_sm90_...``) carry their configuration in their names:
``nvjet_sm90_hsh_320x128_64x3_1x2_h_bz_coopB_TNT`` is a 320 x 128 output tile, 64-wide
k-tiles in 3 stages, a 1 x 2 cluster, a cooperative consumer split. Tile and cluster are in
cuBLAS's column-major view of ``a @ b.T`` (C^T = B A^T: its M is our N), so that kernel is a
128 x 320 tile of ours in a (2, 1) cluster; the fields below keep cuBLAS's order. Knowing
the peer's tile, stages, cluster and whether it splits K (a second, reduction kernel) says
what our model's choice is up against in each cell. Default cells: the paper grid's M = 256
/ 512 rows and the two headline shapes. Writes ``<name>.json`` (rows: M, N, K, dtype, the
kernels launched by one ``a @ b.T`` with their share of its GPU time, and the fields parsed
from an nvjet name).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gemm import PAPER_NK, progress  # noqa: E402

NVJET = re.compile(r"nvjet_sm90_\w+?_(\d+)x(\d+)_(\d+)x(\d+)_(\d+)x(\d+)_")


def parse_nvjet(name: str) -> dict:
    """Tile, k-tile, stages and cluster from an nvjet kernel name ({} for anything else)."""
    found = NVJET.search(name)
    if not found:
        return {}
    tm, tn, tk, stages, cm, cn = (int(x) for x in found.groups())
    return {"tile": [tm, tn], "tile_k": tk, "stages": stages, "cluster": [cm, cn]}


def as_ours(kernels: list[dict]) -> dict | None:
    """``select_gemm_config`` options for the tile and cluster of cuBLAS's main kernel in our terms
    (its tile and cluster transposed; a width that is not a multiple of 16, nvjet's 168,
    rounded up to one), or None where ours cannot run it: a split K (nvjet's "splitK"
    kernels and a reduction kernel beside them; the slice count is not in the name), a
    tile height other than 64 / 128, a width past 384, a cluster ours does not take."""
    from cutetma import GemmConfig

    main = kernels[0] if kernels else {}
    if "tile" not in main or "splitK" in main["name"] or any(
            "splitK" in kern["name"] or "reduce" in kern["name"].lower() for kern in kernels):
        return None
    width, height = main["tile"]
    width = -(-width // 16) * 16
    cluster = (main["cluster"][1], main["cluster"][0])
    try:
        GemmConfig(tile_m=height, tile_n=width, cluster_m=cluster[0], cluster_n=cluster[1])
    except ValueError:
        return None
    return {"tile": (height, width), "load": "tma", "cluster": cluster}


def kernels_of(fn, repeats: int = 5) -> list[dict]:
    """The CUDA kernels ``fn`` launches, by name, with their share of its GPU time."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(repeats):
            fn()
        torch.cuda.synchronize()
    times: dict[str, float] = {}
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            times[event.name] = times.get(event.name, 0.0) + event.device_time_total
    total = sum(times.values()) or 1.0
    return [{"name": name, "share": round(us / total, 4), "us": round(us / repeats, 2),
             **parse_nvjet(name)} for name, us in sorted(times.items(), key=lambda x: -x[1])]


def default_cells() -> list[tuple[int, int, int]]:
    return [(8192, 8192, 8192), (4096, 4096, 4096)] + [
        (m, n, k) for m in (256, 512) for n, k in PAPER_NK]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells", nargs="*", metavar="MxNxK")
    ap.add_argument("--dtypes", nargs="+", default=["float16", "bfloat16"])
    ap.add_argument("--name", default="cublas_kernels")
    ap.add_argument("--out", default="benchmarks/results")
    args = ap.parse_args(argv)
    import torch

    from cutetma import results

    cells = ([tuple(int(x) for x in c.split("x")) for c in args.cells] if args.cells
             else default_cells())
    rows = []
    todo = [(cell, dtype) for dtype in args.dtypes for cell in cells]
    for (m, n, k), dtype in progress(todo, len(todo)):
        t = getattr(torch, dtype)
        a = torch.randn(m, k, device="cuda", dtype=t)
        b = torch.randn(n, k, device="cuda", dtype=t)
        rows.append({"M": m, "N": n, "K": k, "dtype": dtype,
                     "kernels": kernels_of(lambda a=a, b=b: a @ b.T)})
    path = results.write(args.name, rows, Path(args.out), extra_meta={"complete": True})
    print(f"wrote {path}")
    for r in rows:
        first = r["kernels"][0] if r["kernels"] else {}
        extra = f" (+{len(r['kernels']) - 1} more)" if len(r["kernels"]) > 1 else ""
        print(f"  {r['M']}x{r['N']}x{r['K']} {r['dtype']}: {first.get('name', '?')}{extra}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
