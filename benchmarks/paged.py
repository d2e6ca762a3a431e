"""Paged-KV attention on the H200: the seed paper's case study (section 4.3.2, Figures 3 and
5), TMA-paged against cp.async-paged at every page size, beside FlashAttention-4's paged
forward and both libraries' dense kernels, one run, the same randn data.

    python benchmarks/paged.py [--quick] [--out DIR] [--dtypes bfloat16 float16]
                               [--phases prefill decode]

Prefill: b = 4, s_q = s_k = 4096, h = 32 query / 8 key-value heads, d = 128, causal and not,
page sizes 16 .. 256; FLOPs = 4 b h s^2 d, halved for causal; TFLOP/s. Decode: s_q = 1,
h 32 / 8, d = 128, random page tables; the K/V bytes a call must read over its time, TB/s,
beside ``ceiling_tbps``, the read bandwidth a plain torch reduction reaches in the same run.
Chunked prefill: b = 4, 512 new queries over an 8k cache, causal, pages 16 / 64 / 128; FLOPs
4 h d per (query, visible key); TFLOP/s.
Columns: ``tma`` and ``cp_async`` (``cutetma.attention_with_kvcache`` with the producer
forced), ``auto`` (decode: its own choice of producer, packing and splits), ``tma_append``
(decode: ``tma`` with the step's key and value written into the cache first, ``k=`` / ``v=``),
``fa4`` (``flash_attn.cute.flash_attn_varlen_func`` with ``page_table``: TMA when the page is
its key block, cp.async otherwise), ``dense`` / ``fa4_dense`` (contiguous K/V).
Every column is checked against the dense cutetma output first (a column that computes
something else is an error, not a number). Times: CUDA-graph replays (``gemm.bench``), then
``ROUNDS`` alternating rounds; a cell's figure is the median of its timings.
Writes ``paged.json`` and ``paged.png`` into --out, the JSON after every row (meta
``complete`` false until the end); ``--update`` keeps the existing file's rows that this run
does not measure again (the file must come from the same card), so ``--phases decode
--update`` refreshes the decode rows and leaves the others.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gemm import bench, progress  # noqa: E402

PAGES = (16, 32, 64, 128, 256)
PREFILL = dict(b=4, s=4096, h=32, h_kv=8, d=128)
# (b, context, page size): FlashAttention-4's decode anchors (../shared/notes/peers-h200.md)
# chunked prefill: s_q new tokens over a longer cache, causal (b, s_q, context)
CHUNKED = (4, 512, 8192)
DECODE = ((64, 4096, 128), (16, 16384, 128), (64, 4096, 16),
          # and the corners: one long sequence (split-KV), many short ones
          (1, 65536, 128), (1, 16384, 64), (4, 4096, 64), (256, 1024, 64))
ROUNDS = 3
FP8 = "float8_e4m3fn"


def paged_copy(k, v, page_size, generator):
    """(k_cache, v_cache, page_table): the dense (b, s, h_kv, d) K/V scattered over a pool
    in a random page order, as a serving engine's allocator leaves it."""
    import torch

    b, s, h_kv, d = k.shape
    per_seq = (s + page_size - 1) // page_size
    pages = b * per_seq
    order = torch.randperm(pages, generator=generator).to(k.device)
    k_cache = torch.zeros(pages, page_size, h_kv, d, device=k.device, dtype=k.dtype)
    v_cache = torch.zeros_like(k_cache)
    pad = per_seq * page_size - s
    kp = torch.nn.functional.pad(k, (0, 0, 0, 0, 0, pad)).view(pages, page_size, h_kv, d)
    vp = torch.nn.functional.pad(v, (0, 0, 0, 0, 0, pad)).view(pages, page_size, h_kv, d)
    k_cache[order] = kp
    v_cache[order] = vp
    table = order.view(b, per_seq).int()
    return k_cache, v_cache, table


_CEILING: list = []


def read_ceiling_tbps() -> float:
    """HBM read bandwidth in TB/s as torch's reductions reach it over 4 GiB (the best of a
    few forms), measured once per run: the decode rows' yardstick."""
    import torch

    if not _CEILING:
        x = torch.randn(1 << 31, device="cuda", dtype=torch.bfloat16)
        forms = (lambda: x.sum(dtype=torch.float32), lambda: x.view(-1, 8192).amax(1),
                 lambda: x.view(8192, -1).sum(0, dtype=torch.float32))
        _CEILING.append(max(x.numel() * 2 / 1e9 / min(bench(f) for _ in range(3))
                            for f in forms))
        del x
    return _CEILING[0]


def fa4():
    try:
        from flash_attn.cute import interface
    except Exception as exc:  # not installed, or no GPU it supports
        return None, f"{type(exc).__name__}: {exc}"[:200]
    return interface, None


def time_columns(columns: dict, row: dict, work: float, rounds: int):
    """Every column once, then ``rounds`` alternating rounds; ``row[name]`` = work / median
    time (work in units per ms -> the row's unit)."""
    times = {}
    for name, fn in columns.items():
        try:
            times[name] = [bench(fn)]
        except Exception as exc:
            row[f"{name}_error"] = f"{type(exc).__name__}: {exc}"[:200]
    for _ in range(rounds):
        for name in times:
            times[name].append(bench(columns[name]))
    for name, ms in times.items():
        row[name] = work / statistics.median(ms)
    row["rounds"] = 1 + rounds


def checked(columns: dict, want, row: dict) -> dict:
    """The columns whose output matches ``want`` (max |diff| < 2e-2); the others become
    ``<name>_error`` entries."""
    kept = {}
    for name, fn in columns.items():
        try:
            out = fn()
            err = (out.float() - want.float()).abs().max().item()
        except Exception as exc:
            row[f"{name}_error"] = f"{type(exc).__name__}: {exc}"[:200]
            continue
        if err < 2e-2:
            kept[name] = fn
        else:
            row[f"{name}_error"] = f"max |{name} - dense| = {err:.3g}"
    return kept


def paged_problem(dtype: str, b: int, s_q: int, context: int, h: int, h_kv: int, d: int,
                  page_size: int, seed: int):
    """randn q (b, s_q, h, d) and dense K, V (b, context, h_kv, d), the K/V scattered over a
    shuffled pool (``paged_copy``), every sequence's cache ``context`` keys long; float8:
    each quantised per tensor (randn / (amax / 448)), its descale as the 8th entry."""
    import torch

    fp8 = dtype == "float8_e4m3fn"
    t = torch.float32 if fp8 else getattr(torch, dtype)
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, s_q, h, d, device="cuda", dtype=t)
    k, v = (torch.randn(b, context, h_kv, d, device="cuda", dtype=t) for _ in range(2))
    descales = None
    if fp8:
        descales = [(x.abs().amax() / 448.0).item() for x in (q, k, v)]
        q, k, v = ((x / sc).to(torch.float8_e4m3fn)
                   for x, sc in zip((q, k, v), descales, strict=True))
    # one-byte values are scattered as bytes (torch's index copies do not all take float8)
    as_bytes = (lambda x: x.view(torch.uint8)) if fp8 else (lambda x: x)
    k_cache, v_cache, table = paged_copy(as_bytes(k), as_bytes(v), page_size, g)
    if fp8:
        k_cache, v_cache = (x.view(torch.float8_e4m3fn) for x in (k_cache, v_cache))
    lens = torch.full((b,), context, dtype=torch.int32, device="cuda")
    return q, k, v, k_cache, v_cache, table, lens, descales


def contenders(problem, causal: bool, loads, row: dict, fa4_dense: bool = False) -> dict:
    """The row's columns: ``cutetma.attention_with_kvcache`` with each of ``loads``, our
    dense kernel, FA4's paged call (and with ``fa4_dense`` its dense one)."""
    import cutetma

    q, k, v, k_cache, v_cache, table, lens, descales = problem
    fp8 = descales is not None
    names = ("q_descale", "k_descale", "v_descale")
    scaled = dict(zip(names, descales, strict=True)) if fp8 else {}
    columns = {
        load: (lambda load=load: cutetma.attention_with_kvcache(
            q, k_cache, v_cache, lens, table, causal=causal, load=load, **scaled))
        for load in loads}
    if fp8:  # our dense FP8 kernel beside the paged calls
        columns["dense"] = lambda: cutetma.attention_fp8(q, k, v, causal=causal, **scaled)
        row["fa4_error"] = "not run in float8_e4m3fn"
        return columns
    if "tma" in loads and q.shape[1] > 1:  # prefill and chunked, not decode
        # the default wait for P V (tuning.attention.PAGED_PV_WAIT, else the dense PV_WAIT)
        # against the other place: tma_early (causal d = 128) or tma_late
        from cutetma.kernels.attention.config import PV_WAIT
        from cutetma.tuning.attention import paged_pv_wait

        d = q.shape[-1]
        other = {"early": "late", "late": "early"}[paged_pv_wait(d, causal) or PV_WAIT[d]]
        columns[f"tma_{other}"] = lambda: with_paged_pv_wait(
            (d, causal), other, lambda: cutetma.attention_with_kvcache(
                q, k_cache, v_cache, lens, table, causal=causal, load="tma"))
    if "tma" in loads and q.shape[1] == 1:  # decode: the step's key and value appended
        # first (k=, v=: the cache's own last key and value, so the output is the same)
        before = lens - 1
        columns["tma_append"] = lambda: cutetma.attention_with_kvcache(
            q, k_cache, v_cache, before, table, causal=causal, load="tma", k=k[:, -1:],
            v=v[:, -1:])
    columns["dense"] = lambda: cutetma.attention(q, k, v, causal=causal)
    peer, why = fa4()
    if peer is not None:
        columns["fa4"] = lambda: peer.flash_attn_varlen_func(
            q, k_cache, v_cache, seqused_k=lens, page_table=table, causal=causal)[0]
        if fa4_dense:
            columns["fa4_dense"] = lambda: peer.flash_attn_func(q, k, v, causal=causal)[0]
    else:
        row["fa4_error"] = why
    return columns


def with_paged_pv_wait(key, choice: str, call):
    """``call()`` with ``PAGED_PV_WAIT[key] = choice`` (the paged plans made afresh on both
    sides, so neither setting's plan is reused by the other), the table restored after."""
    from cutetma import kvcache
    from cutetma.tuning import attention as attention_tuning

    table = attention_tuning.PAGED_PV_WAIT
    before = table.get(key)
    kvcache.clear_plans()
    table[key] = choice
    try:
        return call()
    finally:
        if before is None:
            del table[key]
        else:
            table[key] = before
        kvcache.clear_plans()


# every row carries each contender's column (None where it did not run), so a reader of
# paged.json finds the same keys in every row
COLUMNS = ("tma", "cp_async", "auto", "dense", "fa4", "ceiling_tbps")


def timed_row(problem, causal: bool, loads, row: dict, work: float, rounds: int,
              fa4_dense: bool = False) -> dict:
    """Every column checked against our dense kernel, then timed (``work`` per ms)."""
    columns = contenders(problem, causal, loads, row, fa4_dense)
    want = columns["dense"]()
    time_columns(checked(columns, want, row), row, work, rounds)
    return {**dict.fromkeys(COLUMNS), **row}


def prefill_row(dtype: str, causal: bool, page_size: int, rounds: int) -> dict:
    p = PREFILL
    problem = paged_problem(dtype, p["b"], p["s"], p["s"], p["h"], p["h_kv"], p["d"],
                            page_size, seed=0)
    row = {"phase": "prefill", "dtype": dtype, "causal": causal, "page_size": page_size,
           **p, "s_q": p["s"], "ctx": p["s"], "unit": "TFLOP/s"}
    flops = 4 * p["b"] * p["h"] * p["s"] ** 2 * p["d"] / (2 if causal else 1)
    return timed_row(problem, causal, ("tma", "cp_async"), row, flops / 1e9, rounds,
                     fa4_dense=True)


def chunked_row(dtype: str, page_size: int, rounds: int) -> dict:
    """s_q new queries of each sequence against its whole cache (theirs at its end), causal:
    query i sees context - s_q + i + 1 keys; FLOPs 4 h d per (query, visible key)."""
    b, s_q, context = CHUNKED
    h, h_kv, d = PREFILL["h"], PREFILL["h_kv"], PREFILL["d"]
    problem = paged_problem(dtype, b, s_q, context, h, h_kv, d, page_size, seed=2)
    row = {"phase": "chunked", "dtype": dtype, "causal": True, "page_size": page_size, "b": b,
           "s": context, "ctx": context, "s_q": s_q, "h": h, "h_kv": h_kv, "d": d,
           "unit": "TFLOP/s"}
    keys = s_q * (context - s_q) + s_q * (s_q + 1) // 2
    return timed_row(problem, True, ("tma", "cp_async", "auto"), row,
                     4 * b * h * d * keys / 1e9, rounds)


def decode_row(dtype: str, b: int, context: int, page_size: int, rounds: int) -> dict:
    h, h_kv, d = 32, 8, 128
    problem = paged_problem(dtype, b, 1, context, h, h_kv, d, page_size, seed=1)
    row = {"phase": "decode", "dtype": dtype, "causal": True, "page_size": page_size,
           "b": b, "s": context, "ctx": context, "s_q": 1, "h": h, "h_kv": h_kv, "d": d,
           "unit": "TB/s", "ceiling_tbps": read_ceiling_tbps()}
    kv_bytes = 2 * b * context * h_kv * d * problem[1].element_size()
    return timed_row(problem, True, ("tma", "cp_async", "auto"), row, kv_bytes / 1e9,
                     rounds)  # TB/s


def summarize(rows) -> dict:
    """Per phase: the geomean of tma / cp_async, and of tma / fa4, over the rows holding
    both (the paper's Figure 3 / 5 question and the peer's); decode's tma_append / tma (what
    writing the step's key first costs)."""
    import math

    def geomean(pairs):
        return math.exp(sum(math.log(a / b) for a, b in pairs) / len(pairs)) if pairs else None

    out = {}
    for dtype_rows, suffix in (([r for r in rows if r["dtype"] != FP8], ""),
                               ([r for r in rows if r["dtype"] == FP8], f"_{FP8}")):
        for phase in ("prefill", "chunked", "decode"):
            mine = [r for r in dtype_rows if r["phase"] == phase]
            if suffix and not mine:  # float8's keys only where it ran
                continue
            for other in ("cp_async", "fa4", "dense"):
                pairs = [(r["tma"], r[other]) for r in mine if r.get("tma") and r.get(other)]
                if other != "dense" or pairs:
                    out[f"{phase}_tma_over_{other}{suffix}"] = geomean(pairs)
            for other in ("early", "late"):  # the default over its other wait (contenders)
                pairs = [(r["tma"], r[f"tma_{other}"]) for r in mine
                         if r.get(f"tma_{other}") and r.get("tma")]
                if pairs:
                    out[f"{phase}_default_over_{other}_wait{suffix}"] = geomean(pairs)
            # decode with the step's key appended first (k=, v=) over without: its cost
            pairs = [(r["tma_append"], r["tma"]) for r in mine
                     if r.get("tma_append") and r.get("tma")]
            if pairs:
                out[f"{phase}_append_over_tma{suffix}"] = geomean(pairs)
    return out


def plot(rows, path: Path):
    """Prefill TFLOP/s against page size (one panel per mask), decode TB/s per cell (a
    third panel, where the run has decode rows)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    styles = {"tma": ("C0", "o-"), "cp_async": ("C1", "s--"), "fa4": ("C2", "^:")}
    dec = [r for r in rows if r["phase"] == "decode"]
    fig, axes = plt.subplots(1, 3 if dec else 2, figsize=(15 if dec else 10, 4.2))
    dtypes = sorted({r["dtype"] for r in rows})
    for ax, causal in zip(axes[:2], (False, True), strict=True):
        for dtype in dtypes:
            mine = sorted((r for r in rows if r["phase"] == "prefill" and r["causal"] == causal
                           and r["dtype"] == dtype), key=lambda r: r["page_size"])
            for key, (color, style) in styles.items():
                xs = [r["page_size"] for r in mine if r.get(key)]
                if xs:
                    ax.plot(xs, [r[key] for r in mine if r.get(key)], style, color=color,
                            label=f"{key} {dtype}",
                            alpha=1 if dtype == "bfloat16" or len(dtypes) == 1 else 0.5)
            dense = [r["dense"] for r in mine if r.get("dense")]
            if dense:
                ax.axhline(statistics.median(dense), color="gray", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("page size (keys)")
        ax.set_ylabel("TFLOP/s")
        ax.set_title(f"prefill b4 s4k h32/8 d128, {'causal' if causal else 'non-causal'} "
                     "(gray: dense)", fontsize=9)
        if ax.get_legend_handles_labels()[0]:  # a decode-only run draws no prefill line
            ax.legend(fontsize=7)
    if not dec:
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        return
    labels = [f"b{r['b']}\n{r['s'] // 1024}k\np{r['page_size']}" for r in dec]
    for i, key in enumerate(styles):
        ax = axes[2]
        ax.bar([j + 0.27 * (i - 1) for j in range(len(dec))], [r.get(key) or 0 for r in dec],
               0.27, color=styles[key][0], label=key)
    ceilings = [r.get("ceiling_tbps") for r in dec]
    if any(ceilings):
        axes[2].plot(range(len(dec)), [c or 0 for c in ceilings], "k_", ms=18,
                     label="read ceiling")
    axes[2].set_xticks(range(len(dec)), labels, fontsize=7)
    axes[2].set_ylabel("K/V TB/s")
    axes[2].set_title("decode, s_q 1, h32/8 d128", fontsize=9)
    axes[2].legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="bf16, pages 16 / 64 / 128, "
                        "one round")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--name", default="paged", help="the results file's name (paged_fp8 "
                        "for a float8 run beside paged.json)")
    parser.add_argument("--dtypes", nargs="+", default=["bfloat16", "float16"],
                        choices=["bfloat16", "float16", "float8_e4m3fn"])
    parser.add_argument("--phases", nargs="+", default=["prefill", "chunked", "decode"],
                        choices=["prefill", "chunked", "decode"])
    parser.add_argument("--update", action="store_true", help="keep the rows of the "
                        "existing results file (same card) that this run does not measure "
                        "again: a run of some phases or dtypes updates the file")
    args = parser.parse_args(argv)
    dtypes = ["bfloat16"] if args.quick else args.dtypes
    pages = (16, 64, 128) if args.quick else PAGES
    rounds = 1 if args.quick else ROUNDS
    cells = [("prefill", dtype, causal, page) for dtype in dtypes for causal in (False, True)
             for page in pages] if "prefill" in args.phases else []
    if "chunked" in args.phases:
        cells += [("chunked", dtype, page) for dtype in dtypes[:1] for page in (16, 64, 128)]
    if "decode" in args.phases:
        cells += [("decode", dtype, *cell) for dtype in dtypes[:1] for cell in DECODE]
    from cutetma import results

    kept, kept_from = kept_rows(args.out / f"{args.name}.json") if args.update else ([], None)
    # the kept rows' own run, named in the meta (its date and command)
    extra = {"kept_rows_from": kept_from} if kept else {}
    rows = []
    for cell in progress(cells, len(cells)):
        if cell[0] == "prefill":
            rows.append(prefill_row(*cell[1:], rounds))
        elif cell[0] == "chunked":
            rows.append(chunked_row(*cell[1:], rounds))
        else:
            rows.append(decode_row(*cell[1:], rounds))
        print(json.dumps(rows[-1]), flush=True)
        # after every row, so a run stopped by a time limit keeps what it measured
        results.write(args.name, merged(kept, rows), args.out,
                      extra_meta={**extra, "complete": False})
    rows = merged(kept, rows)
    summary = summarize(rows)
    results.write(args.name, rows, args.out,
                  extra_meta={**extra, "summary": summary, "complete": True})
    plot(rows, args.out / f"{args.name}.png")
    print(json.dumps(summary))


def cell_key(row: dict) -> tuple:
    """What names a row's cell: a later measurement of it replaces the row (``--update``)."""
    return tuple(row.get(k) for k in ("phase", "dtype", "causal", "page_size", "b", "s_q",
                                      "ctx", "h", "h_kv", "d"))


def merged(kept: list, new: list) -> list:
    """``kept`` rows whose cell ``new`` does not measure again, then ``new``."""
    again = {cell_key(r) for r in new}
    return [r for r in kept if cell_key(r) not in again] + list(new)


def kept_rows(path: Path) -> tuple[list, dict | None]:
    """``--update``: the rows of an existing results file and its run (date, command), if
    it was measured on this card (rows of two cards in one file would read as one run);
    none if there is no file."""
    from cutetma import results

    if not path.exists():
        return [], None
    doc = json.loads(path.read_text())
    meta = doc.get("meta", {})
    here, there = results.meta()["device"], meta.get("device")
    if there != here:
        raise SystemExit(f"--update: {path} was measured on {there}, this is {here}; "
                         "write a new file (--name) instead")
    return doc.get("rows", []), {k: meta.get(k) for k in ("date", "command")}


if __name__ == "__main__":
    main()
