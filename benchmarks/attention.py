"""Attention forward benchmark on the H200: cuDNN and FlashAttention-2 (torch SDPA backends)
and FlashAttention-4's SM90 forward (``flash_attn.cute``, column ``fa4``, where installed)
against ours (TMA and cp.async producers), one run, the same randn data.

    python benchmarks/attention.py [--quick] [--out DIR]

The FlashAttention-3 grid: 16k tokens per batch (b = 16384 / s), h = 2048 / d heads,
d in {64, 128, 256}, s in {512, 1k, 2k, 4k, 8k, 16k}, causal and not, fp16 and bf16.
FLOPs = 4 b h s^2 d, halved for causal. Times: medians of ``triton.testing.do_bench`` over
CUDA-graph replays (``benchmarks/gemm.py``'s ``bench``); cuDNN and the headline columns are
timed again in alternating rounds after the single pass, and report medians
(``FINAL_ROUNDS``). Ours is checked against cuDNN's output first; a wrong or unsupported
configuration becomes a row with an error.
``tma`` / ``cp_async`` use the default consumer schedule for the head dim and mask
(``BEST_SCHEDULE``, docs/design.md); fp16 rows also time the TMA kernel, at the default's
tile, with each schedule (``tma_serial``, ``tma_overlap``, ``tma_pingpong``) and one CTA per
tile (``tma_one_cta_per_tile``): the ablation of FlashAttention-3's intra-warpgroup overlap,
pingpong and the persistent grid, from which those defaults were chosen, the default with
the wait for P V on the other side of the softmax (``tma_other_pv_wait``), and, where ``ALT_BLOCKS``
names one, the default with another (block_m, block_n) (``tma_alt_blocks``), and with the
other number of Q buffers (``tma_other_q``, d <= 128: ``Q_STAGES``).
``--variants tma tma_two_q tma_two_kv_stages --head-dims 128`` times only
those columns (both dtypes) and cuDNN: an A/B in a few minutes. ``--custom
NAME=field:value,...`` adds a column with any AttentionConfig fields, ``--seqlens`` and
``--masks`` narrow the grid; ``--peer-cells`` adds ``PEER_CELLS`` of those head dims
(bf16; GQA rows carry ``h_kv``), the shapes where FlashAttention-4 led. Every peer is
checked against cuDNN's output before it is timed.
Writes ``attention.json`` and ``attention.png`` into --out (``--no-grid``:
``attention_peers.json``, the peer cells alone). ``--backward``: the backward's grid instead
(``attention_bwd.py``).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gemm import bench, device_label, progress  # noqa: E402

TOKENS = 16384
HEAD_DIMS = (64, 128, 256)
SEQLENS = (512, 1024, 2048, 4096, 8192, 16384)
# the block shape each (head dim, causal)'s default is measured against (fp16 rows): d = 64
# non-causal two consumer warpgroups (the default: three, WIDE_ROWS), causal three
# (FlashAttention-3's 192-row tile, 96-key stages), d = 256 64-key stages (the default: 80)
ALT_BLOCKS = {(64, False): (128, 128), (64, True): (192, 96), (256, False): (128, 64),
              (256, True): (128, 64)}
# A single pass times cuDNN first and ours after it, on a card whose clock moves with its
# power state by several % within seconds: the same kernel timed twice in one cell of a grid
# read 0.993x and 1.017x cuDNN. So, as in ``gemm.py``, after every column of a cell
# has been timed once, cuDNN and the headline columns (``tma``, ``cp_async``; with
# ``--variants`` / ``--custom`` every requested column) are timed again in this many
# alternating rounds, and a cell's figure is the median of its timings (the single pass
# included); ``selection`` keeps the single pass, against which the ablation columns, timed
# once, are compared.
FINAL_ROUNDS = 2


# the cells where FlashAttention-4's SM90 forward led (``--peer-cells``): (b, s, h, h_kv, d,
# causal), d = 64, a short odd length (ViT-L/14 at 336 px), long d = 128, GQA, d = 256
PEER_CELLS = ((8, 2048, 16, 16, 128, False), (8, 2048, 16, 16, 128, True),
              (2, 8192, 16, 16, 128, False), (2, 8192, 16, 16, 128, True),
              (1, 8192, 32, 8, 128, True), (4, 4096, 16, 16, 64, False),
              (32, 577, 16, 16, 64, False), (1, 4096, 16, 8, 256, True),
              # short odd lengths (ViT-L/14 at 224 px, and its 336-px length at d = 128)
              (64, 257, 16, 16, 64, False), (32, 577, 16, 16, 128, False))


def cells(quick: bool, head_dims=HEAD_DIMS, seqlens=SEQLENS, masks=(False, True)):
    seqs = (1024, 4096) if quick else seqlens
    dims = (128,) if quick else head_dims
    return [(d, s, causal) for d in dims for s in seqs for causal in masks]


def parse_custom(spec: str):
    """``NAME=key:value,key:value`` -> (NAME, {key: value}): a column of ours with those
    AttentionConfig fields (ints where they parse), e.g. ``n176=block_n:176,stages:2``."""
    name, _, fields = spec.partition("=")
    config = {}
    for field in filter(None, fields.split(",")):
        key, _, value = field.partition(":")
        config[key] = int(value) if value.lstrip("-").isdigit() else value
    if not name or not config:
        raise argparse.ArgumentTypeError(f"--custom {spec!r}: NAME=key:value[,key:value...]")
    return name, config


def variants(dtype: str, d: int, causal: bool, chosen=None, custom=(), seqlen: int = 0):
    """Ours, as (column, mechanism, config overrides or None: the torch face's default). The
    full run: the defaults for both dtypes, the ablations for fp16 only, each at the tile the
    default runs for keys of length ``seqlen`` (``dense_tile``; 0: ``BLOCKS``'). ``chosen``:
    exactly these columns, for both dtypes (an A/B of a few; ``tma_two_q`` and
    ``tma_two_kv_stages`` only on request)."""
    from cutetma import AttentionConfig
    from cutetma.kernels.attention.config import BLOCKS, dense_tile

    block_m, block_n = dense_tile(d, causal, seqlen) if seqlen else BLOCKS[(d, causal)]
    tile = dict(block_m=block_m, block_n=block_n)
    default = AttentionConfig(head_dim=d, causal=causal, **tile)
    every = [("tma", "tma", None), ("cp_async", "cp_async", None)]
    # tutorial 08's ablation ladder: each schedule, and one CTA per tile (persistent=False)
    every += [(f"tma_{x}", "tma", dict(tile, schedule=x)) for x in ("serial", "overlap",
                                                                      "pingpong")]
    every += [("tma_one_cta_per_tile", "tma", dict(tile, persistent=False))]
    # the default's other place for the wait for P V (before or after the softmax, PV_WAIT)
    every += [("tma_other_pv_wait", "tma",
               dict(tile, pv_wait={"early": "late", "late": "early"}[default.pv_wait]))]
    if (d, causal) in ALT_BLOCKS and ALT_BLOCKS[(d, causal)] != (block_m, block_n):
        alt_m, alt_n = ALT_BLOCKS[(d, causal)]
        every += [("tma_alt_blocks", "tma", dict(block_m=alt_m, block_n=alt_n))]
    if d <= 128:  # two Q buffers leave no K/V stage at d = 256
        every += [("tma_other_q", "tma", dict(tile, q_stages=3 - default.q_stages)),
                  ("tma_two_q", "tma", dict(tile, q_stages=2))]
    if d == 128:  # what two Q buffers cost there: a K/V stage (3 -> 2), alone
        every += [("tma_two_kv_stages", "tma", dict(tile, stages=2))]
    extra = [(name, config.get("load", "tma"), config) for name, config in custom]
    if chosen is not None or extra:
        return [v for v in every if v[0] in (chosen or ())] + extra
    on_request = ("tma_two_q", "tma_two_kv_stages")
    return [v for v in every if v[0] not in on_request and (
        dtype == "float16" or v[0] in ("tma", "cp_async"))]


def fa4():
    """FlashAttention-4's interface (``flash_attn.cute``: its SM90 forward on the H200), or
    None with the reason it could not be imported."""
    try:
        from flash_attn.cute import interface
    except Exception as exc:  # not installed, or no GPU it supports
        return None, f"{type(exc).__name__}: {exc}"[:200]
    return interface, None


def measure(dtype: str, d: int, s: int, causal: bool, chosen=None, custom=(),
            rounds: int = FINAL_ROUNDS, shape=None) -> dict:
    """One cell: cuDNN, FA2 (not with ``chosen`` or ``custom``) and FA4, then ours
    (``variants``), then ``rounds`` alternating rounds of cuDNN, FA4 and the headline
    columns (``FINAL_ROUNDS``). ``shape``: (b, h, h_kv), else the grid's 16k tokens and
    h = 2048 / d."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import cutetma
    from cutetma import AttentionConfig

    t = getattr(torch, dtype)
    b, h, h_kv = shape or (TOKENS // s, 2048 // d, 2048 // d)
    q = torch.randn(b, s, h, d, device="cuda", dtype=t)
    k, v = (torch.randn(b, s, h_kv, d, device="cuda", dtype=t) for _ in range(2))
    flops = 4 * b * h * s * s * d / (2 if causal else 1)
    row = {"dtype": dtype, "d": d, "s": s, "b": b, "h": h, "causal": causal}
    if h_kv != h:
        row["h_kv"] = h_kv
    # SDPA's GQA: the K/V heads repeated (cuDNN and FA2 see MHA of the same numbers)
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k.repeat_interleave(h // h_kv, 2),
                                              v.repeat_interleave(h // h_kv, 2)))
    ref = None
    timed = {}  # column -> (callable, [ms, ...]) for the final rounds
    peers = (("cudnn", SDPBackend.CUDNN_ATTENTION), ("fa2", SDPBackend.FLASH_ATTENTION))
    for name, backend in peers if chosen is None and not custom else peers[:1]:
        def call(backend=backend):
            with sdpa_kernel(backend):
                return torch.nn.functional.scaled_dot_product_attention(qt, kt, vt,
                                                                        is_causal=causal)
        try:
            out = call()
            ref = out.transpose(1, 2) if ref is None else ref
            timed[name] = (call, [bench(call)])
            row[name] = flops / timed[name][1][0] / 1e9
        except Exception as exc:
            row[f"{name}_error"] = f"{type(exc).__name__}: {exc}"[:200]
    peer, why = fa4()  # the strongest peer, beside every column set
    if peer is not None:
        def fa4_call():
            return peer.flash_attn_func(q, k, v, causal=causal)[0]
        try:
            out = fa4_call()
            err = (out.float() - ref.float()).abs().max().item() if ref is not None else 0.0
            if err < 2e-2:  # a peer that computes something else is not a peer
                timed["fa4"] = (fa4_call, [bench(fa4_call)])
                row["fa4"] = flops / timed["fa4"][1][0] / 1e9
            else:
                row["fa4_error"] = f"max |fa4 - sdpa| = {err:.3g}"
        except Exception as exc:
            row["fa4_error"] = f"{type(exc).__name__}: {exc}"[:200]
    elif why:
        row["fa4_error"] = why
    for load, mechanism, config in variants(dtype, d, causal, chosen, custom, s):
        if config is not None:
            config = {key: value for key, value in config.items() if key != "load"}

        def ours(mechanism=mechanism, config=config):
            if config is None:
                return cutetma.attention(q, k, v, causal=causal, load=mechanism)
            cfg = AttentionConfig(head_dim=d, causal=causal, load=mechanism, **config)
            return cutetma.attention(q, k, v, causal=causal, softmax_scale=d ** -0.5,
                                     config=cfg, return_lse=True)[0]
        try:
            out = ours()
            if ref is not None:
                err = (out.float() - ref.float()).abs().max().item()
                if not err < 2e-2:
                    row[f"{load}_error"] = f"max |ours - sdpa| = {err:.3g}"
                    continue
            timed[load] = (ours, [bench(ours)])
            row[load] = flops / timed[load][1][0] / 1e9
        except Exception as exc:
            row[f"{load}_error"] = f"{type(exc).__name__}: {exc}"[:200]
    headline = ("tma", "cp_async") if chosen is None and not custom else tuple(timed)
    final_rounds(row, timed, [key for key in timed if key in ("cudnn", "fa4", *headline)],
                 rounds, flops)
    return row


def final_rounds(row: dict, timed: dict, keys, rounds: int, flops: float, timer=None):
    """Time ``keys`` (cuDNN first) again, ``rounds`` times in turn; each key's figure in
    ``row`` becomes the median of all its timings (TFLOP/s); the single pass moves to
    ``row["selection"]``. ``timed``: key -> (callable, [ms of the single pass])."""
    timer = timer or bench
    if not rounds or "cudnn" not in keys or len(keys) < 2:
        return
    row["selection"] = {key: row[key] for key in keys}
    for _ in range(rounds):
        for key in keys:
            timed[key][1].append(timer(timed[key][0]))
    row.update({key: flops / statistics.median(timed[key][1]) / 1e9 for key in keys})
    row["rounds"] = 1 + rounds


def single_pass(row: dict, key: str):
    """``key``'s single-pass timing (TFLOP/s): what an ablation column, timed once right
    after it, is compared with."""
    return row.get("selection", {}).get(key, row.get(key))


def grid_parser(description: str, head_dims, seqlens, config: str, example: str):
    """The attention benchmarks' shared flags: --quick, --out, --rounds, --head-dims,
    --seqlens, and --custom columns of ours with ``config``'s fields."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--rounds", type=int, default=FINAL_ROUNDS)
    ap.add_argument("--head-dims", nargs="+", type=int, default=list(head_dims))
    ap.add_argument("--seqlens", nargs="+", type=int, default=list(seqlens))
    ap.add_argument("--custom", nargs="*", type=parse_custom, default=[],
                    help=f"NAME=field:value,..: a column of ours with those {config} "
                         f"fields, e.g. {example}")
    return ap


def ratio_summary(rows, ours: str, peer: str, suffix: str = "", where=None) -> dict:
    """``geomean_{ours}_over_{peer}{suffix}`` and ``min_..``, over the rows (``where``
    passes) that timed both, and ``median_tma_over_cp_async`` over the rows that timed those."""
    s = {}
    ratios = [r[ours] / r[peer] for r in rows
              if r.get(ours) and r.get(peer) and (where is None or where(r))]
    if ratios:
        s[f"geomean_{ours}_over_{peer}{suffix}"] = math.exp(statistics.mean(map(math.log,
                                                                                  ratios)))
        s[f"min_{ours}_over_{peer}{suffix}"] = min(ratios)
    mech = [r["tma"] / r["cp_async"] for r in rows if r.get("tma") and r.get("cp_async")]
    if mech:
        s["median_tma_over_cp_async"] = statistics.median(mech)
    return s


def summarize(rows) -> dict:
    s = {}
    d128 = [r for r in rows if r["d"] == 128 and r["s"] >= 2048 and r.get("tma")
            and r.get("cudnn")]
    if d128:
        s["d128_s>=2k_min_tma_over_cudnn"] = min(r["tma"] / r["cudnn"] for r in d128)
    both = [r for r in rows if r.get("tma") and r.get("cudnn")]
    if both:
        s["geomean_tma_over_cudnn"] = math.exp(statistics.mean(
            math.log(r["tma"] / r["cudnn"]) for r in both))
    over_fa4 = [r["tma"] / r["fa4"] for r in rows if r.get("tma") and r.get("fa4")]
    if over_fa4:
        s["geomean_tma_over_fa4"] = math.exp(statistics.mean(map(math.log, over_fa4)))
        s["min_tma_over_fa4"] = min(over_fa4)
    mech = [r["tma"] / r["cp_async"] for r in rows if r.get("tma") and r.get("cp_async")]
    if mech:
        s["median_tma_over_cp_async"] = statistics.median(mech)
        s["cells_tma_beats_cp_async"] = sum(m > 1 for m in mech)
        s["cells_timed_both"] = len(mech)
    for ablation in ("tma_serial", "tma_overlap", "tma_pingpong", "tma_one_cta_per_tile",
                     "tma_alt_blocks", "tma_other_q", "tma_two_q", "tma_two_kv_stages"):
        gains = [single_pass(r, "tma") / r[ablation] for r in rows
                 if r.get("tma") and r.get(ablation)]
        if gains:
            s[f"median_default_over_{ablation.removeprefix('tma_')}"] = statistics.median(gains)
    return s


def bar_plot(rows, path: Path, keys, ylabel: str, title: str):
    """One bar per contender (``keys``) per row, rows labelled by head dim, length, mask."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(rows)), 3.6))
    width = 0.8 / len(keys)
    for i, key in enumerate(keys):
        ax.bar([j + (i - (len(keys) - 1) / 2) * width for j in range(len(rows))],
               [r.get(key) or 0 for r in rows], width, label=key)
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels([f"d{r['d']} s{r['s']}\n{'causal' if r['causal'] else ''}"
                        for r in rows], fontsize=7)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, ncol=len(keys))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot(rows, path: Path):
    """Three panels: TFLOP/s non-causal and causal (fp16: cuDNN, FA2, ours with TMA), and
    ours with TMA over ours with cp.async in every cell (both dtypes)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8), dpi=80,
                             gridspec_kw={"width_ratios": [1, 1, 0.9]})
    for ax, causal in zip(axes[:2], (False, True), strict=True):
        for i, d in enumerate(HEAD_DIMS):
            for name, style in (("cudnn", "--"), ("fa2", ":"), ("tma", "-")):
                pts = [(r["s"], r[name]) for r in rows if r["d"] == d and r["causal"] == causal
                       and r.get(name) and r["dtype"] == "float16"]
                if pts:
                    ax.plot(*zip(*pts, strict=True), style, color=f"C{i}", marker="o", ms=3,
                            label=f"{name} d={d}")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("sequence length")
        ax.set_title(("causal" if causal else "non-causal") + ", fp16", fontsize=10)
    axes[0].set_ylabel("TFLOP/s")
    axes[0].legend(fontsize=6, ncol=3)
    ax = axes[2]
    for i, d in enumerate(HEAD_DIMS):
        for causal, marker in ((False, "o"), (True, "^")):
            for dtype, fill in (("float16", None), ("bfloat16", "none")):
                pts = [(r["s"], r["tma"] / r["cp_async"]) for r in rows
                       if r["d"] == d and r["causal"] == causal and r["dtype"] == dtype
                       and r.get("tma") and r.get("cp_async")]
                if pts:
                    ax.plot(*zip(*pts, strict=True), marker, color=f"C{i}", ms=4,
                            mfc=fill, ls="none")
    for i, d in enumerate(HEAD_DIMS):
        ax.plot([], [], "s", color=f"C{i}", label=f"d={d}")
    ax.plot([], [], "ko", label="non-causal")
    ax.plot([], [], "k^", label="causal")
    ax.plot([], [], "ko", mfc="none", label="hollow: bf16")
    ax.axhline(1.0, color="k", lw=0.8)
    if any(r.get("cp_async") for r in rows):  # not with --default-only: nothing to scale
        ax.set_xscale("log", base=2)
    ax.set_xlabel("sequence length")
    ax.set_ylabel("TMA / cp.async (same kernel)")
    ax.set_title("producer: TMA over cp.async, every cell", fontsize=10)
    ax.legend(fontsize=6, ncol=2)
    fig.suptitle(f"Attention forward on the {device_label()}, 16k tokens, h = 2048 / d",
                 fontsize=11)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--backward" in argv:  # the backward's grid: benchmarks/attention_bwd.py
        import attention_bwd

        return attention_bwd.main([a for a in argv if a != "--backward"])
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--default-only", action="store_true",
                    help="time cuDNN and ours (TMA, default config) only: a quick A/B of builds")
    ap.add_argument("--variants", nargs="+", metavar="COLUMN",
                    help="time cuDNN and only these columns of ours, both dtypes "
                         "(e.g. tma tma_two_q)")
    ap.add_argument("--custom", nargs="+", type=parse_custom, default=[], metavar="NAME=K:V,..",
                    help="extra columns of ours with these AttentionConfig fields, both "
                         "dtypes (e.g. n176=block_n:176,stages:2); cuDNN only beside them")
    ap.add_argument("--rounds", type=int, default=FINAL_ROUNDS,
                    help="alternating rounds of cuDNN and the headline columns after the "
                         "single pass (0: the single pass only)")
    ap.add_argument("--head-dims", nargs="+", type=int, default=list(HEAD_DIMS))
    ap.add_argument("--seqlens", nargs="+", type=int, default=list(SEQLENS))
    ap.add_argument("--masks", choices=("both", "causal", "non-causal"), default="both")
    ap.add_argument("--dtypes", nargs="+", choices=("float16", "bfloat16"),
                    default=["float16", "bfloat16"], help="the grid's dtypes")
    ap.add_argument("--peer-cells", action="store_true",
                    help="also the cells where FlashAttention-4 led (PEER_CELLS: d = 64, "
                         "s = 577, long d = 128, GQA, d = 256)")
    ap.add_argument("--no-grid", action="store_true",
                    help="leave the FA3 grid out (with --peer-cells: those cells only)")
    ap.add_argument("--replot", metavar="JSON",
                    help="redraw the PNG (next to the JSON) from a results file; no GPU")
    args = ap.parse_args(argv)
    if args.replot:
        import json

        path = Path(args.replot)
        plot(json.loads(path.read_text())["rows"], path.with_suffix(".png"))
        print(f"wrote {path.with_suffix('.png')}")
        return 0
    from cutetma import results

    out = Path(args.out)
    t0 = time.time()
    # both dtypes of a cell back to back, so they see the same card state (power, clocks)
    chosen = ["tma"] if args.default_only else args.variants
    masks = {"both": (False, True), "causal": (True,), "non-causal": (False,)}[args.masks]
    todo = [] if args.no_grid else [
        (dtype, c) for c in cells(args.quick, args.head_dims, args.seqlens, masks)
        for dtype in args.dtypes]
    name = "attention_peers" if args.no_grid else "attention"  # the results file
    rows = []
    if args.peer_cells:
        todo += [("bfloat16", cell) for cell in PEER_CELLS if cell[4] in args.head_dims]
    for dtype, cell in progress(todo, len(todo)):
        if len(cell) == 3:
            d, s, causal = cell
            rows.append(measure(dtype, d, s, causal, chosen, args.custom, args.rounds))
        else:
            b, s, h, h_kv, d, causal = cell
            rows.append(measure(dtype, d, s, causal, chosen, args.custom, args.rounds,
                                shape=(b, h, h_kv)))
        results.write(name, rows, out, extra_meta={"complete": False})
    summary = summarize(rows)
    path = results.write(name, rows, out, extra_meta={
        "summary": summary, "complete": True, "seconds": round(time.time() - t0)})
    plot(rows, out / f"{name}.png")
    print(f"wrote {path}")
    for key, value in summary.items():
        print(f"  {key}: {value:.3f}" if isinstance(value, float) else f"  {key}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
