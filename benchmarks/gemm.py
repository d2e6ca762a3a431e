"""GEMM benchmark on the H200: cuBLAS (torch.matmul) against our kernel with each load
mechanism (TMA, TMA + multicast, cp.async), one run, the same randn data.

    python benchmarks/gemm.py [--quick] [--out DIR]

Cells: 8192^3 and 4096^3, and the seed paper's 18 (N, K) projection shapes x M in
{16, 64, 256, 512, 2048, 8192}, fp16 and bf16. Each mechanism takes its best tile of the
candidates (as the paper picks the best tile per variant; a candidate runs as
``cutetma.gemm(a, b, config=select_gemm_config(m, n, k, ...))``, ``gemm_config``);
``tma_default`` is what ``cutetma.gemm(a, b)`` gives with no options (its own tile and
split-K choice). Times are
medians of ``triton.testing.do_bench`` over CUDA-graph replays (L2 flushed between runs);
after the selection, cuBLAS, each mechanism's winner and ``tma_default`` run again in
alternating rounds (the card's clock under its power cap drifts with what ran just before),
and those medians are the figures.
Every kernel's output is checked against cuBLAS before it is timed; a wrong kernel is
reported, not timed. ``--every`` keeps every candidate's time (an ablation), ``--cells``
and ``--dtypes`` narrow the grid. ``--dtypes float8_e4m3fn``: the FP8 cells, a row per
scaling mode (``--scalings`` narrows them), ``cutetma.scaled_gemm`` (TMA and cp.async)
against ``torch._scaled_mm`` (``gemm_fp8.py``); ``--warm N`` compiles their kernels in N
processes first (the paper's grid in FP8, per tensor: ``--dtypes float8_e4m3fn --scalings
tensor --warm 14 --name gemm_fp8_grid``). QuACK's GEMM (``quack.gemm_interface.gemm``,
where installed) is timed beside cuBLAS in the final rounds (column ``quack``, checked
first); ``--peer-cells`` adds ``PEER_CELLS``, the odd sizes and M <= 128 where QuACK or
cuBLAS led.
Writes ``gemm.json`` (meta + rows) and ``gemm.png`` into --out. The whole grid takes about
8 minutes on the H200; to stay under a call's limit run ``--dtypes float16 --name gemm_fp16``
and ``--dtypes bfloat16 --name gemm_bf16`` in two calls, then ``--merge`` them (no GPU; a
cell in a later file replaces the same cell of an earlier one, so a few cells measured
again merge into the grid).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gemm_fp8  # noqa: E402

PAPER_NK = [  # Table 1 (c) and (d): (N, K)
    (6144, 4096), (4096, 4096), (14336, 4096), (4096, 14336),
    (10240, 8192), (8192, 8192), (28672, 8192), (8192, 28672),
    (7680, 5120), (5120, 5120), (12288, 5120), (5120, 12288),
    (1536, 5120), (512, 5120), (16384, 512), (24576, 1536), (5120, 16384), (32768, 512),
]
PAPER_M = [16, 64, 256, 512, 2048, 8192]
# where QuACK or cuBLAS led (``--peer-cells``): odd sizes (the tail wave) and M <= 128
PEER_CELLS = [(3000, 5000, 3000), (3072, 18944, 3584), (4096, 28672, 4096),
              (128, 8192, 8192), (32, 8192, 8192), (100, 4096, 4096)]
SMALL_M = [dict(tile=(64, 128)), dict(tile=(64, 256))]
LARGE_M = [dict(tile=(128, 256)), dict(tile=(128, 128))]
MECHANISMS = {  # each mechanism takes the best of its candidates, per cell
    "tma": [dict(load="tma", **t) for t in LARGE_M]
    + [dict(load="tma", tile=(64, 256), schedule="pingpong"),
       dict(load="tma", tile=(128, 128), schedule="pingpong")],
    "tma_multicast": [dict(load="tma", cluster=c, tile=(128, 256)) for c in ((2, 1), (1, 2))]
    # B multicast to two 128 x 128 tiles: 0.99-1.08x the same tiles alone at M = 256
    # (docs/design.md, "B multicast for mid M"); offered up to M = 512 (``candidates``)
    + [dict(load="tma", cluster=(2, 1), tile=(128, 128))],
    "cp_async": [dict(load="cp_async", **t) for t in LARGE_M],
}


SM_COUNT = 132
NARROW_BELOW = 0.9  # narrower tiles where 128 x 256 tiles fill less of the SMs
NARROW_TILES = ((128, 192), (128, 160))  # fit the tiles to the SMs instead of cutting K
# and the narrowest widths (steps of 16, ``tuning.fit_width``) whose tiles make 1 or 2 waves, as
# cuBLAS picks its tiles (80 / 96 / 112 wide at M = 256, cublas_kernels.json, 2026-12-01);
# offered where NARROW_TILES are, and to the multicast column with A shared by a (1, 2)
# cluster at M <= 512, cuBLAS's cluster for those tiles. 64 wide: 64 x 128 tiles cover it
FIT_WAVES = (1, 2)
EXTRA_TILES: list = []  # --tiles: offered to TMA in every cell with M > 64 (an ablation)
# The card is power-capped: cuBLAS timed once before a cell's dozen candidates ran cooler
# (8192^3 fp16, 2026-11-30: cuBLAS 762 TFLOP/s first, 656 in rounds alternating with ours),
# so after the selection cuBLAS and each mechanism's winner are timed again in alternating
# rounds, and the medians are the cell's figures (``selection`` keeps the first timings).
# Three: a median of two is their mean, and one throttled round then moves a cell (with two,
# 4096^3 bf16 once read 0.884x with no options where the same configuration in the TMA column
# read 1.005x; over the 96 cells where the two are the same configuration their ratio spanned
# 0.88-1.09, median 1.000: docs/perf-log.md)
FINAL_ROUNDS = 3
# GemmConfig fields a candidate or spec may set beside select_gemm_config's options (what the
# library otherwise chooses itself); the BOOL_FIELDS are given as 0 / 1
CONFIG_FIELDS = ("stages", "epi_n", "epi_stages", "raster_swizzle", "raster_along_m",
                 "order_table", "pdl")
BOOL_FIELDS = ("raster_along_m", "order_table", "pdl")
SELECT_OPTIONS = ("load", "cluster", "tile", "schedule", "split_k", "split_sum",
                  "store_under_mma")


def gemm_config(kwargs: dict, m: int, n: int, k: int, sm_count: int = SM_COUNT):
    """The ``GemmConfig`` a candidate names: ``select_gemm_config`` with its options
    (``SELECT_OPTIONS``; ``split_k`` absent: automatic, as ``cutetma.gemm`` chooses), then
    its ``CONFIG_FIELDS`` replaced."""
    import dataclasses

    from cutetma.tuning import select_gemm_config

    unknown = set(kwargs) - set(SELECT_OPTIONS) - set(CONFIG_FIELDS)
    if unknown:
        raise ValueError(f"{sorted(unknown)}: neither select_gemm_config options "
                         f"{SELECT_OPTIONS} nor GemmConfig fields {CONFIG_FIELDS}")
    fields = {key: kwargs[key] for key in CONFIG_FIELDS if key in kwargs}
    for key in BOOL_FIELDS:
        if key in fields:
            fields[key] = bool(fields[key])
    store = kwargs.get("store_under_mma")
    cfg = select_gemm_config(
        m, n, k, load=kwargs.get("load", "tma"), cluster=kwargs.get("cluster"),
        tile=kwargs.get("tile"), sm_count=sm_count, schedule=kwargs.get("schedule"),
        split_k=kwargs.get("split_k"), split_sum=kwargs.get("split_sum"),
        store_under_mma=None if store is None else bool(store))
    return dataclasses.replace(cfg, **fields) if fields else cfg


def ours(a, b, kwargs: dict | None = None, sm_count: int = SM_COUNT):
    """``cutetma.gemm`` on ``a``, ``b`` for a candidate: with no options, or ``load`` only, the
    library's own choice (its tile order placed on the card); else ``config=gemm_config``."""
    import cutetma

    kwargs = dict(kwargs or {})
    if set(kwargs) <= {"load"}:
        return lambda: cutetma.gemm(a, b, **kwargs)
    (m, k), n = a.shape, b.shape[0]
    cfg = gemm_config(kwargs, m, n, k, sm_count)
    return lambda: cutetma.gemm(a, b, config=cfg)



def split_k_for(m: int, n: int, k: int, tile=(128, 128)) -> int:
    """The library's rule, on every shape it could apply to (not only where it won)."""
    from cutetma.tuning.gemm import split_k_for as rule

    return rule(m, n, k, tile, SM_COUNT, everywhere=True)


def candidates(name: str, m: int, n: int = 0, k: int = 0):
    """The mechanism's configurations for this shape (one tile row: 64-row tiles, and a
    multicast along M would share nothing; few output tiles: also split-K, as the
    library's rule would apply it everywhere; the correctness check before timing guards
    every candidate)."""
    from cutetma.tuning.gemm import auto_tile_and_split, split_for_waves, wave_efficiency

    seen = []
    split_tile = (64, 128) if m <= 64 else (128, 128)
    if name in ("tma", "cp_async") and (s := split_k_for(m, n, k, split_tile)) > 1:
        seen.append(dict(load=name, tile=split_tile, split_k=s))
    if name in ("tma", "cp_async") and m > 64:  # where whole tiles leave SMs idle:
        for tile in ((128, 256), (128, 128)):  # split-K by the wave model
            split = split_for_waves(m, n, k, tile, SM_COUNT)
            if split > 1 and dict(load=name, tile=tile, split_k=split) not in seen:
                seen.append(dict(load=name, tile=tile, split_k=split))
            if split > 1 and name == "tma" and tile == (128, 128):
                # pingpong: one warpgroup's hand-over can hide under the other's WGMMAs
                seen.append(dict(load=name, tile=tile, schedule="pingpong", split_k=split))
        if -(-m // 128) * -(-n // 128) < SM_COUNT:  # few 128 x 128 tiles: 64-row tiles
            split = split_for_waves(m, n, k, (64, 128), SM_COUNT)
            small = dict(load=name, tile=(64, 128), **({"split_k": split} if split > 1 else {}))
            if small not in seen:
                seen.append(small)
        if wave_efficiency(m, n, (128, 256), SM_COUNT) < NARROW_BELOW:
            seen += [dict(load=name, tile=tile) for tile in NARROW_TILES]
            fitted = [dict(load=name, tile=(128, w)) for w in fitted_widths(m, n)]
            seen += [c for c in fitted if c not in seen]
        tile, split = auto_tile_and_split(m, n, k, SM_COUNT)  # the library's own choice
        chosen = dict(load=name, tile=tile, **({"split_k": split} if split > 1 else {}))
        extra = [dict(load=name, tile=t) for t in EXTRA_TILES] if name == "tma" else []
        seen += [c for c in [chosen, *extra] if c not in seen]
    for kwargs in MECHANISMS[name]:
        if m > 64:  # narrow multicast tiles only where 128 x 256 tiles are few
            options = [kwargs] if m <= 512 or kwargs.get("tile") != (128, 128) else []
        elif kwargs.get("cluster", (1, 1))[0] == 1 and kwargs.get("schedule") is None:
            options = [dict(kwargs, **small) for small in SMALL_M]
        else:
            options = []
        seen += [o for o in options if o not in seen]
    if name == "tma_multicast" and 128 < m <= 512 and (
            wave_efficiency(m, n, (128, 256), SM_COUNT) < NARROW_BELOW):
        seen += [dict(load="tma", cluster=(1, 2), tile=(128, w)) for w in fitted_widths(m, n, (1,))]
    yield from seen


def fitted_widths(m: int, n: int, waves=FIT_WAVES) -> list[int]:
    """The narrowest widths for this shape that make each of ``waves`` waves, 80 to 256 (no
    duplicates, in order)."""
    from cutetma.tuning.gemm import fit_width

    widths = [fit_width(m, n, count, sm_count=SM_COUNT) for count in waves]
    return sorted({w for w in widths if w and w >= 80})


def quack_gemm():
    """QuACK's GEMM (``quack.gemm_interface.gemm(A (M, K), B (K, N))``), or None with the
    reason it could not be imported."""
    try:
        from quack.gemm_interface import gemm
    except Exception as exc:  # not installed, or no GPU it supports
        return None, f"{type(exc).__name__}: {exc}"[:200]
    return gemm, None


def cells(quick: bool, only=None, peer_cells: bool = False):
    if only:  # "MxNxK" strings
        return [tuple(int(x) for x in cell.split("x")) for cell in only]
    out = [(8192, 8192, 8192), (4096, 4096, 4096)] + (PEER_CELLS if peer_cells else [])
    nk = PAPER_NK[:3] if quick else PAPER_NK
    ms = [64, 2048] if quick else PAPER_M
    out += [(m, n, k) for n, k in nk for m in ms]
    return out


def bench(fn, window_ms: float = 25) -> float:
    """Median milliseconds of ``fn`` on the GPU: captured once in a CUDA graph, replayed by
    ``triton.testing.do_bench`` (which flushes L2 before every replay) for about
    ``window_ms``. The graph keeps host-side launch cost (Python, argument conversion) out
    of the kernel's time for every contender alike; ``eager_us`` in the results records
    what a plain call costs. A window is short against the time the power-capped clock takes
    to settle (docs/perf-log.md): a longer one lets a kernel's own power draw set it."""
    from triton.testing import do_bench

    fn()  # compile / warm up outside the capture
    return do_bench(captured(fn), warmup=5, rep=window_ms, return_mode="median")


def captured(fn):
    """``as_graph(fn)``, tried again once a capture fails. Seen on H100 and H200: a process's
    first capture of a backward (cuDNN's through autograd, or ours) invalidated
    (cudaErrorStreamCaptureInvalidated) where later captures of the same calls succeeded,
    and after it torch's RNG still counted itself inside a capture (the next ``randn``:
    "Offset increment outside graph capture"). So every failure is followed by a trivial
    capture, which ends that state; the second failure is raised."""
    for last in (False, True):
        try:
            return as_graph(fn)
        except Exception as failure:
            try:
                end_failed_capture()
            except Exception:  # the GPU itself is in error: the capture's failure says why
                raise failure from None
            if last:
                raise


def end_failed_capture():
    """A trivial capture, begun and ended: what a failed capture left half open in torch
    (its RNG's capture state) is closed."""
    import torch

    scratch = torch.zeros(1, device="cuda")
    with torch.cuda.graph(torch.cuda.CUDAGraph()):
        scratch.add_(1)


def device_label() -> str:
    """The GPU the figures come from, for a plot's title ("H100 80GB HBM3", "H200"): a
    plot names the card it measured, not the one the grid was planned for."""
    import torch

    if not torch.cuda.is_available():
        return "no GPU"
    return torch.cuda.get_device_name().removeprefix("NVIDIA ")


def as_graph(fn):
    """``fn`` captured once in a CUDA graph (after a warm-up on a side stream, as torch asks);
    returns the graph's replay, which costs the host a few microseconds whatever ``fn``
    costs in Python."""
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def alternating_rounds(fns: dict, rounds: int, window_ms: float = 25) -> dict:
    """``bench`` every callable of ``fns`` in turn, ``rounds`` times, the order reversed
    every other round (A B C, C B A, ...), so no contender always follows the same one: on
    this power-capped card what ran just before moves a kernel's clock (``cutetma.gemm``'s
    default timed always right after cp.async, which draws less power, read 0.96-1.11x,
    median 1.003x, the same configuration timed after cuBLAS in the same rounds).
    Milliseconds per key; ``window_ms``: each ``bench``'s timing window."""
    order = list(fns.items())
    times: dict = {key: [] for key in fns}
    for i in range(rounds):
        for key, fn in order if i % 2 == 0 else order[::-1]:
            times[key].append(bench(fn, window_ms))
    return times


def eager_us(fn, calls: int = 50) -> float:
    """Wall time of a plain call, host overhead included (microseconds)."""
    import torch

    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / calls * 1e6


def progress(iterable, total):
    try:
        from tqdm import tqdm

        return tqdm(iterable, total=total, file=sys.stdout, mininterval=5, ncols=100)
    except ImportError:
        return iterable


def _plain(kwargs: dict) -> dict:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in kwargs.items()}


def measure_cell(dtype: str, m: int, n: int, k: int, every: bool = False,
                 mechanisms=tuple(MECHANISMS)) -> dict:
    """cuBLAS and every mechanism (best tile each; ``mechanisms``: only these) on one
    (M, N, K), the same randn data."""
    import torch

    import cutetma
    from cutetma.tuning import select_gemm_config

    t = getattr(torch, dtype)
    gen = torch.Generator(device="cuda").manual_seed(m * 31 + n * 7 + k)
    a = torch.randn(m, k, device="cuda", dtype=t, generator=gen)
    b = torch.randn(n, k, device="cuda", dtype=t, generator=gen)
    flops = 2 * m * n * k
    ref = a @ b.T
    scale = ref.float().abs().max().item() + 1e-6
    row = {"M": m, "N": n, "K": k, "dtype": dtype, "cublas": flops / bench(lambda: a @ b.T) / 1e9}
    finalists = {}
    for name in mechanisms:
        best = None
        for kwargs in candidates(name, m, n, k):
            try:
                call = ours(a, b, kwargs)
                rel = (call().float() - ref.float()).abs().max().item() / scale
                if not rel < 2e-2:  # a wrong result is never timed
                    row[f"{name}_error"] = f"{kwargs}: rel. max error {rel:.3g}"
                    continue
                ms = bench(call)
            except Exception as exc:  # report, keep going
                row[f"{name}_error"] = f"{kwargs}: {type(exc).__name__}: {exc}"[:300]
                continue
            if every:  # the ablation: every candidate's time, not only the best
                row.setdefault(f"{name}_every", []).append(
                    {"config": _plain(kwargs), "tflops": flops / ms / 1e9})
            if best is None or ms < best[0]:
                best = (ms, kwargs, call)
        if best:
            row[name] = flops / best[0] / 1e9
            row[f"{name}_config"] = _plain(best[1])
            finalists[name] = best[2]
            if name == "tma":
                row["tma_eager_us"] = eager_us(best[2])
                row["cublas_eager_us"] = eager_us(lambda: a @ b.T)
    # what a user gets: cutetma.gemm(a, b) with no options (tuning.auto_tile_and_split), timed
    # in the same alternating rounds as cuBLAS and the winners (a single timing after them
    # once put a cell 18% under the same configuration's median in another column:
    # 512x4096x4096 bf16)
    chosen = select_gemm_config(m, n, k, sm_count=SM_COUNT)
    row["tma_default_config"] = {"tile": [chosen.tile_m, chosen.tile_n],
                                 "split_k": chosen.split_k, "schedule": chosen.schedule,
                                 "split_sum": chosen.split_sum,
                                 "cluster": [chosen.cluster_m, chosen.cluster_n]}
    contenders = {"cublas": lambda: a @ b.T, **finalists}
    peer, why = quack_gemm()
    if peer is not None:  # checked like ours: a peer that computes something else is none
        b_kn = b.T.contiguous()
        try:
            rel = (peer(a, b_kn).float() - ref.float()).abs().max().item() / scale
            if rel < 2e-2:
                contenders["quack"] = lambda: peer(a, b_kn)
            else:
                row["quack_error"] = f"rel. max error {rel:.3g}"
        except Exception as exc:
            row["quack_error"] = f"{type(exc).__name__}: {exc}"[:300]
    else:
        row["quack_error"] = why
    rel = (cutetma.gemm(a, b).float() - ref.float()).abs().max().item() / scale
    if rel < 2e-2:
        contenders["tma_default"] = lambda: cutetma.gemm(a, b)
    else:
        row["tma_default_error"] = f"rel. max error {rel:.3g}"
    if finalists:
        row["selection"] = {key: row[key] for key in ("cublas", *finalists)}
    times = alternating_rounds(contenders, FINAL_ROUNDS)  # cuBLAS and each winner again
    row.update({key: flops / statistics.median(ms) / 1e9 for key, ms in times.items()})
    return row


def run(quick: bool, dtypes=("float16", "bfloat16"), checkpoint=None, only=None,
        every: bool = False, mechanisms=tuple(MECHANISMS),
        peer_cells: bool = False, scalings=gemm_fp8.SCALINGS) -> list[dict]:
    """Every cell; ``checkpoint(rows)`` after each, so a run cut short keeps its rows.
    FP8 cells: a row per scaling in ``scalings``."""
    todo = [(d, c) for d in dtypes for c in cells(quick, only, peer_cells)]
    rows = []
    for dtype, mnk in progress(todo, len(todo)):
        if dtype == gemm_fp8.FP8:  # a row per scaling mode (gemm_fp8.py)
            rows += [gemm_fp8.measure_fp8_cell(*mnk, scaling, bench, alternating_rounds,
                                               FINAL_ROUNDS) for scaling in scalings]
        else:
            rows.append(measure_cell(dtype, *mnk, every=every, mechanisms=mechanisms))
        if checkpoint:
            checkpoint(rows)
    return rows


def cell_key(row: dict) -> tuple:
    return row["M"], row["N"], row["K"], row["dtype"]


def geomean(values) -> float:
    """Geometric mean (nan for no values): every summary's ratio over cells."""
    values = list(values)
    return math.exp(statistics.mean(math.log(v) for v in values)) if values else float("nan")


def summarize(rows: list[dict]) -> dict:
    def ratio(r, key):
        return r[key] / r["cublas"] if r.get(key) else None

    def gmean(values):  # cells without the column left out; None where none has it
        values = [v for v in values if v]
        return geomean(values) if values else None

    s = {}
    for size in (8192, 4096):  # 8192^3 is measured twice (the headline, the paper's M = 8192
        for dtype in sorted({r["dtype"] for r in rows}):  # cell): the geomean of both
            same = [r for r in rows if cell_key(r) == (size, size, size, dtype)]
            if not same:
                continue
            s[f"tma_vs_cublas_{size}^3_{dtype}"] = gmean(ratio(r, "tma") for r in same)
            s[f"best_tma_vs_cublas_{size}^3_{dtype}"] = gmean(
                max(ratio(r, "tma") or 0, ratio(r, "tma_multicast") or 0) for r in same)
            s[f"default_vs_cublas_{size}^3_{dtype}"] = gmean(
                ratio(r, "tma_default") for r in same)
    big = [r for r in rows if r["M"] >= 256 and r.get("tma")]
    if big:
        s["geomean_tma_vs_cublas_M>=256"] = gmean(
            max(r["tma"], r.get("tma_multicast") or 0) / r["cublas"] for r in big)
    default = [r for r in rows if r["M"] >= 256 and r.get("tma_default")]
    if default:
        s["geomean_default_vs_cublas_M>=256"] = gmean(
            r["tma_default"] / r["cublas"] for r in default)
    with_quack = [r for r in rows if r.get("tma_default") and r.get("quack")]
    if with_quack:
        s["geomean_default_vs_quack"] = gmean(r["tma_default"] / r["quack"] for r in with_quack)
        s["min_default_vs_quack"] = min(r["tma_default"] / r["quack"] for r in with_quack)
    paper = [r for r in rows if (r["N"], r["K"]) in PAPER_NK and r.get("tma")
             and r.get("cp_async")]
    if paper:
        sp = [r["tma"] / r["cp_async"] for r in paper]
        s["paper_cells"] = len(paper)
        s["tma_beats_cp_async_cells"] = sum(x > 1 for x in sp)
        s["median_tma_over_cp_async"] = statistics.median(sp)
    return s


def default_geomeans(rows: list[dict]) -> dict:
    """Per M (ascending), the geometric mean over that M's cells of ``cutetma.gemm`` with no
    options (``tma_default``) over cuBLAS; cells without the column are left out."""
    ratios: dict = {}
    for r in rows:
        if r.get("tma_default") and r.get("cublas"):
            ratios.setdefault(r["M"], []).append(r["tma_default"] / r["cublas"])
    return {m: geomean(v) for m, v in sorted(ratios.items())}


def plot(rows: list[dict], path: Path, device: str | None = None):
    """Left: ours over the vendor library per cell (16-bit rows: cuBLAS; FP8 rows:
    ``torch._scaled_mm``), by M; right: TMA over cp.async of the same kernel, with the
    median per M of each datatype family (the paper's table). ``device``: the card the rows
    were measured on (default: this machine's)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fp8 = [r for r in rows if r["dtype"] == gemm_fp8.FP8]
    sixteen = [r for r in rows if r["dtype"] != gemm_fp8.FP8]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8), dpi=90)
    series = (("tma_default", "cutetma.gemm, no options", "o", "k"),
              ("tma", "best TMA tile", ".", "C0"), ("tma_multicast", "TMA multicast", "^", "C1"),
              ("cp_async", "cp.async", "x", "C2"))
    for name, label, marker, color in series:
        pts = [(r["M"], r[name] / r["cublas"]) for r in sixteen if r.get(name) and r.get("cublas")]
        if pts:
            ax1.scatter([p[0] for p in pts], [p[1] for p in pts], marker=marker, s=14,
                        label=label, alpha=0.45 if name != "tma_default" else 0.8, color=color)
    means = default_geomeans(sixteen)  # the figure the target is about, per M
    if means:
        ax1.plot(list(means), list(means.values()), "D-", color="C3", ms=5, lw=1.2,
                 label="geomean, no options")
    for scaling, marker in (("tensor", "s"), ("row", "v"), ("block", "P")):
        pts = [(r["M"], r["cutetma"] / r["torch_scaled_mm"]) for r in fp8
               if r.get("scaling") == scaling and r.get("cutetma") and r.get("torch_scaled_mm")]
        if pts:
            ax1.scatter([p[0] for p in pts], [p[1] for p in pts], marker=marker, s=14,
                        alpha=0.6, label=f"FP8 {scaling} scales / torch._scaled_mm")
    ax1.axhline(1.0, color="k", lw=0.8)
    ax1.set_xscale("log", base=2)
    ax1.set_xlabel("M")
    ax1.set_ylabel("TFLOP/s / " + ("cuBLAS" if sixteen else "torch._scaled_mm"))
    ax1.set_title("ours vs the vendor library (same run, randn)", fontsize=10)
    ax1.legend(fontsize=7)
    for family, color, label in ((sixteen, "C0", "fp16 + bf16"), (fp8, "C4", "FP8 (e4m3)")):
        sp = [(r["M"], r["tma"] / r["cp_async"]) for r in family  # the paper's cells
              if r.get("tma") and r.get("cp_async") and (r["N"], r["K"]) in PAPER_NK]
        if not sp:
            continue
        ax2.scatter([p[0] for p in sp], [p[1] for p in sp], s=14, color=color, alpha=0.5)
        by_m: dict = {}
        for m, x in sp:
            by_m.setdefault(m, []).append(x)
        ax2.plot(sorted(by_m), [statistics.median(by_m[m]) for m in sorted(by_m)], "D-",
                 color=color, ms=5, lw=1.2, label=f"{label}: median (the paper's table)")
    if sixteen or fp8:
        ax2.legend(fontsize=8)
    ax2.axhline(1.0, color="k", lw=0.8)
    ax2.set_xscale("log", base=2)
    ax2.set_xlabel("M")
    ax2.set_ylabel("TMA / cp.async")
    ax2.set_title("same kernel, producer swapped", fontsize=10)
    dtypes = " + ".join(x for x, rows_of in (("fp16 + bf16", sixteen), ("FP8", fp8)) if rows_of)
    fig.suptitle(f"Hopper GEMM on the {device or device_label()}, {dtypes}", fontsize=11)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a few cells, for a smoke test")
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--cells", nargs="*", metavar="MxNxK", help="only these shapes")
    ap.add_argument("--name", default="gemm", help="results file name (default gemm)")
    ap.add_argument("--every", action="store_true",
                    help="record every candidate's time (<mechanism>_every), not only the best")
    ap.add_argument("--dtypes", nargs="*", default=["float16", "bfloat16"])
    ap.add_argument("--mechanisms", nargs="*", default=list(MECHANISMS), choices=MECHANISMS,
                    help="only these columns of ours (an A/B of builds in less time)")
    ap.add_argument("--tiles", nargs="*", default=[], metavar="MxN",
                    help="also offer TMA these tiles in every cell with M > 64 (an ablation)")
    ap.add_argument("--peer-cells", action="store_true",
                    help="also PEER_CELLS: odd sizes and M <= 128, where QuACK or cuBLAS led")
    ap.add_argument("--scalings", nargs="+", default=list(gemm_fp8.SCALINGS),
                    choices=gemm_fp8.SCALINGS, help="FP8 cells: only these scalings")
    ap.add_argument("--warm", type=int, default=0, metavar="N",
                    help="FP8 cells: compile every cell's kernels first in N processes "
                         "(the shared on-disk cache), so the timed run compiles nothing")
    ap.add_argument("--merge", nargs="*", metavar="JSON",
                    help="no GPU: join the rows of these results files (e.g. one per dtype, "
                         "run in separate calls) into --name, with its summary and plot")
    args = ap.parse_args(argv)
    EXTRA_TILES[:] = [tuple(int(x) for x in t.split("x")) for t in args.tiles]
    from cutetma import results

    out = Path(args.out)
    t0 = time.time()
    def checkpoint(rows):
        results.write(args.name, rows, out, extra_meta={"complete": False})

    if args.merge:
        import json

        parts = [json.loads(Path(f).read_text()) for f in args.merge]
        # a cell measured again in a later file replaces its rows in the earlier ones (within
        # one file 8192^3 is two rows, the headline and the paper's cell: both are kept)
        rows = []
        for part in parts:
            again = {cell_key(r) for r in part["rows"]}
            rows = [r for r in rows if cell_key(r) not in again] + part["rows"]
        sources = []  # a part that is itself a merge names its own parts
        for f, part in zip(args.merge, parts, strict=True):
            sources += part["meta"].get("merged_from") or [
                dict(file=Path(f).name, **{k: part["meta"].get(k)
                                           for k in ("date", "command", "complete")})]
        extra = {"merged_from": sources,
                 # the machine the rows were measured on, not this one
                 **{k: parts[0]["meta"].get(k) for k in ("device", "clocks", "torch", "cuda",
                                                         "cutlass_dsl")}}
    else:
        if args.warm and gemm_fp8.FP8 in args.dtypes:
            gemm_fp8.warm(cells(args.quick, args.cells, args.peer_cells), args.scalings,
                          args.warm)
        rows = run(args.quick, tuple(args.dtypes), checkpoint, args.cells, args.every,
                   tuple(args.mechanisms), args.peer_cells, tuple(args.scalings))
        extra = {"seconds": round(time.time() - t0)}
    sixteen = [r for r in rows if r["dtype"] != gemm_fp8.FP8]
    summary = {**(summarize(sixteen) if sixteen else {}),
               **gemm_fp8.summarize_fp8([r for r in rows if r["dtype"] == gemm_fp8.FP8])}
    path = results.write(args.name, rows, out, extra_meta={
        "summary": summary, "complete": True, **extra})
    device = extra.get("device")  # a merge: the card the rows were measured on
    plot(rows, out / f"{args.name}.png", device and str(device).removeprefix("NVIDIA "))
    print(f"wrote {path} and {out / f'{args.name}.png'}")
    for key, value in summary.items():
        print(f"  {key}: {value:.3f}" if isinstance(value, float) else f"  {key}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
