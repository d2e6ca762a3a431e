"""An interleaved A/B of GEMM configurations against cuBLAS: short runs, many cells.

    python benchmarks/gemm_ab.py \
        --kernels ours:tile=128x256 ours:tile=128x256,store_under_mma=1 [--cells MxNxK ...] \
        [--dtype float16] [--rounds 3] [--window-ms 25] [--name gemm_ab] [--out DIR]

For each cell (default: the grid's cells with M >= 2048, where whole 128 x 256 tiles fill
the SMs, and the two headline shapes), cuBLAS and each ``--kernels`` spec (as in
``gemm_sustained.py``: ``ours:key=value,...`` are ``select_gemm_config`` options and
``GemmConfig`` fields (``gemm.gemm_config``), checked
against cuBLAS's result first; ``split_k=wave`` takes the most slices that fit one wave for
the spec's tile in each cell; ``mirror=cublas`` takes the tile and cluster of cuBLAS's own
kernel in each cell (read from the profiler in the same run);
``nvidia:tile=128x256,cluster=1x2`` is NVIDIA's CuTe DSL example, ``nvidia_peer.py``, with
``--nvidia-example PATH``) are timed in turn, ``--rounds`` times, on the same randn data
(``gemm.bench``: CUDA-graph replays for ``--window-ms``, median); a cell's figures are the
medians of its rounds.
Alternating keeps every contender in the same power state: on this card the clock under the
power cap moves by several % within a minute, far more than most single changes are worth.
Summary: the geometric mean of each spec over cuBLAS, and of each spec over the first.
Writes ``<name>.json``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gemm import PAPER_M, PAPER_NK, alternating_rounds, geomean, progress  # noqa: E402
from gemm_sustained import contender, load_peer, parse_kernel  # noqa: E402

HEADLINE = [(8192, 8192, 8192), (4096, 4096, 4096)]


def default_cells() -> list[tuple[int, int, int]]:
    return HEADLINE + [(m, n, k) for n, k in PAPER_NK for m in PAPER_M if m >= 2048]


def summarize(rows, specs) -> dict:
    """Geomean of each spec over cuBLAS, and of each over the first spec, over the cells
    where both were timed."""
    out = {}
    first = specs[0]
    for spec in specs:
        out[f"geomean {spec} / cublas"] = geomean(
            r[spec] / r["cublas"] for r in rows if r.get(spec) and r.get("cublas"))
        if spec != first:
            out[f"geomean {spec} / {first}"] = geomean(
                r[spec] / r[first] for r in rows if r.get(spec) and r.get(first))
    return out


def resolve(kwargs: dict, m: int, n: int, k: int, cublas=None) -> dict:
    """Specs that follow the cells' sizes. ``split_k=wave``: the most slices whose units fit
    one wave of the SMs for the spec's tile in this cell (``tuning.wave_split``). ``fit=W``:
    128-row tiles of the narrowest width (a multiple of 16) that makes at most W waves
    (``tuning.fit_width``); a cell no width fits in W waves is refused. ``mirror=cublas``: the
    tile and cluster of the kernel cuBLAS runs in this cell (``cublas``: its kernels, as
    ``cublas_kernels.kernels_of`` lists them; ``cublas_kernels.as_ours`` translates), so
    ours and cuBLAS meet with the same configuration; refused where ours cannot run it."""
    from cutetma.tuning import gemm as tuning

    if kwargs.get("mirror") == "cublas":
        from cublas_kernels import as_ours

        mirrored = as_ours(cublas or [])
        if mirrored is None:
            name = (cublas or [{}])[0].get("name", "?")
            raise ValueError(f"ours cannot run cuBLAS's kernel here ({name})")
        kwargs = {key: v for key, v in kwargs.items() if key != "mirror"} | mirrored
    if "fit" in kwargs:
        width = tuning.fit_width(m, n, kwargs["fit"])
        if width is None:
            raise ValueError(f"no tile width fits {m}x{n} in {kwargs['fit']} wave(s)")
        kwargs = {key: v for key, v in kwargs.items() if key != "fit"} | {"tile": (128, width)}
    if kwargs.get("split_k") != "wave":
        return kwargs
    if "tile" not in kwargs:
        raise SystemExit("split_k=wave needs a tile=MxN in the same spec")
    split = tuning.wave_split(m, n, k, kwargs["tile"])
    out = dict(kwargs, split_k=split)
    if split == 1:
        out.pop("split_sum", None)  # nothing to sum
    return out


def checked_contenders(specs: dict, a, b, row: dict, make=contender) -> dict:
    """cuBLAS and every spec's callable (``make(kwargs, a, b)``) whose output matched
    cuBLAS's (relative max error < 2e-2): a spec that raises, refuses the cell (the
    example's dtypes) or is wrong is reported in ``row``, never timed; a spec that follows
    the cell's sizes records what it resolved to."""
    m, n, k = a.shape[0], b.shape[0], a.shape[1]
    ref = (a @ b.T).float()
    fns = {"cublas": make(None, a, b)}
    cublas = None
    if any((kwargs or {}).get("mirror") for kwargs in specs.values()):
        from cublas_kernels import kernels_of

        cublas = kernels_of(lambda: a @ b.T)
        row["cublas_kernel"] = cublas[0]["name"] if cublas else None
    for spec, kwargs in specs.items():
        try:
            if (resolved := resolve(kwargs, m, n, k, cublas)) is not kwargs:
                kwargs = resolved
                row[f"{spec}_resolved"] = {key: list(v) if isinstance(v, tuple) else v
                                           for key, v in kwargs.items()}
            ours = make(kwargs, a, b)
            rel = ((ours().float() - ref).abs().max() / ref.abs().max()).item()
        except Exception as exc:  # report, keep going
            row[f"{spec}_error"] = f"{type(exc).__name__}: {exc}"[:300]
            continue
        if not rel < 2e-2:
            row[f"{spec}_error"] = f"rel. max error {rel:.3g}"
            continue
        fns[spec] = ours
    return fns


def measure(m: int, n: int, k: int, dtype: str, specs: dict, rounds: int,
            window_ms: float = 25) -> dict:
    import torch

    t = getattr(torch, dtype)
    a = torch.randn(m, k, device="cuda", dtype=t)
    b = torch.randn(n, k, device="cuda", dtype=t)
    row = {"M": m, "N": n, "K": k, "dtype": dtype}
    fns = checked_contenders(specs, a, b, row)
    times = alternating_rounds(fns, rounds, window_ms)
    flops = 2 * m * n * k
    row.update({key: flops / statistics.median(ms) / 1e9 for key, ms in times.items()})
    row["rounds_tflops"] = {key: [round(flops / x / 1e9, 1) for x in ms]
                            for key, ms in times.items()}
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernels", nargs="+", required=True, metavar="SPEC",
                    help="ours:key=value,... (select_gemm_config options, GemmConfig fields)")
    ap.add_argument("--cells", nargs="*", metavar="MxNxK")
    ap.add_argument("--dtype", default="float16", choices=["float16", "bfloat16"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--window-ms", type=float, default=25,
                    help="each timing's replay window (longer: the clock follows the kernel)")
    ap.add_argument("--name", default="gemm_ab")
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--nvidia-example", metavar="PATH",
                    help="NVIDIA's dense_gemm_persistent.py, for nvidia:... specs")
    args = ap.parse_args(argv)
    peer_meta = load_peer(args.nvidia_example)
    specs = {spec: parse_kernel(spec) for spec in args.kernels}
    if any(kwargs is None for kwargs in specs.values()):
        raise SystemExit("--kernels: cuBLAS is always timed; give ours:... specs")
    cells = ([tuple(int(x) for x in c.split("x")) for c in args.cells] if args.cells
             else default_cells())
    from cutetma import results

    rows = []
    for m, n, k in progress(cells, len(cells)):
        rows.append(measure(m, n, k, args.dtype, specs, args.rounds, args.window_ms))
        results.write(args.name, rows, Path(args.out),
                      extra_meta={"complete": False, **peer_meta})
    summary = summarize(rows, list(specs))
    path = results.write(args.name, rows, Path(args.out),
                         extra_meta={"complete": True, "summary": summary, **peer_meta})
    print(f"wrote {path}")
    for key, value in summary.items():
        print(f"  {key}: {value:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
