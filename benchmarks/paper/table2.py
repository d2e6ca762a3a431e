"""Table 2 of the seed paper: Nsight Compute counters of TMA-paged against cp.async-paged
attention at three operating points, from tensor-bound to HBM-bound, with our kernel.

    python benchmarks/paper/table2.py [--quick] [--out DIR]
    python benchmarks/paper/table2.py --resummarize benchmarks/results/paper_table2.json

The paper profiles FA3 at prefill / FP16 / 16k (tensor-bound), chunked / FP8 / 8k (balanced;
MLA there, GQA here: MLA is out of scope) and decode / FP16 / 128k (HBM-bound). Ours, each
through ``cutetma.attention_with_kvcache`` with ``load="tma"`` and then ``load="cp_async"``
on the same paged cache (page 128, d = 128, causal):

* ``tc_bound``: prefill, fp16, b 1, s_q = ctx = 16k, h 32 / 32 (dense MHA, as the paper);
* ``balanced``: chunked, e4m3 (per-tensor descales), b 4, 512 new queries over an 8k cache,
  h 32 / 8;
* ``hbm_bound``: decode, fp16, b 32, one query over a 32k cache, h 32 / 8, unsplit (256
  tiles fill the SMs; the paper's 128k MHA cache would need 17 GB).

The script runs itself under ``ncu --clock-control none`` (ncu flushes the caches before each
profiled launch): the two arms' outputs are compared first (outside the profiled range), then
each cell's launches run once inside the NVTX range "profile", in ``cases()`` order. The
counters are the paper's rows (its extracted table names no rows; the order of its text is
tensor pipe, SMs active, DRAM bytes, DRAM share, L2 hit rate, instructions, WGMMAs, memory
issues, FMA and ALU pipe instructions, cycles) where this ncu knows them; the memory issues
are TMA loads plus LDGSTS, warp instructions (``LOAD_ISSUES``). Writes ``paper_table2.json``
(rows, TMA / cp.async ratios per cell) and ``paper_table2.png`` (the ratios beside the
paper's).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import run_all as common  # noqa: E402

# (name, phase, dtype, b, s_q, ctx, h, h_kv); d = 128, page 128, causal
CELLS = (("tc_bound", "prefill", "float16", 1, 16384, 16384, 32, 32),
         ("balanced", "chunked", "float8_e4m3fn", 4, 512, 8192, 32, 8),
         ("hbm_bound", "decode", "float16", 32, 1, 32768, 32, 8))
QUICK_CELLS = (("tc_bound", "prefill", "float16", 1, 2048, 2048, 32, 32),
               ("balanced", "chunked", "float8_e4m3fn", 1, 256, 2048, 32, 8),
               ("hbm_bound", "decode", "float16", 8, 1, 4096, 32, 8))
LOADS = ("tma", "cp_async")
HEAD_DIM, PAGE = 128, 128

# the paper's rows, ours named by the counter that reads them; where two are listed the
# first this ncu knows is taken (Hopper's WGMMA pipe has names of its own in newer ncu)
ROWS = (
    ("tensor pipe (% of peak, active)",
     ("sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active",
      "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active")),
    ("SMs active (% of elapsed)", ("sm__cycles_active.avg.pct_of_peak_sustained_elapsed",
                                   "smsp__cycles_active.avg.pct_of_peak_sustained_elapsed")),
    ("DRAM bytes read", ("dram__bytes_read.sum",)),
    ("DRAM throughput (% of peak)", ("dram__throughput.avg.pct_of_peak_sustained_elapsed",)),
    ("L2 hit rate (%)", ("lts__t_sector_hit_rate.pct",)),
    ("instructions executed", ("smsp__inst_executed.sum",)),
    ("WGMMA instructions", ("smsp__inst_executed_pipe_tensor_op_gmma.sum",
                            "sm__inst_executed_pipe_tensor_op_gmma.sum")),
    ("FMA-pipe instructions", ("smsp__inst_executed_pipe_fma.sum",)),
    ("ALU-pipe instructions", ("smsp__inst_executed_pipe_alu.sum",)),
    ("GPC cycles", ("gpc__cycles_elapsed.max",)),
)
MEMORY_ISSUES = "memory-issue instructions (TMA or LDGSTS)"
EXTRA = ("gpu__time_duration.sum", "smsp__issue_active.avg.pct_of_peak_sustained_active",
         "sm__cycles_elapsed.avg.per_second")
# the loads' own instructions: TMA loads (UTMALDG) and cp.async's LDGSTS, warp-level
# (ncu also lists predicated-on / -off and SASS variants of each: not summed with these)
LOAD_ISSUES = ("smsp__inst_executed_op_tma_ld.sum", "smsp__inst_executed_op_ldgsts.sum")

# the paper's Table 2 (FA3 on the H100), TMA / cp.async, in ROWS order plus the memory issues
PAPER = {
    "tc_bound": [(79.3, 71.5), (99.5, 99.5), (689e6, 690e6), (5.7, 5.2), (94.2, 94.0),
                 (1.09e9, 1.26e9), (33.8e6, 33.8e6), (451e6, 506e6), (260e6, 291e6),
                 (5.17e6, 5.73e6), (1.3e6, 34.1e6)],
    "balanced": [(37.9, 30.1), (95.1, 95.5), (327e6, 327e6), (22.5, 18.0), (69.2, 73.5),
                 (145.6e6, 166.0e6), (1.6e6, 1.6e6), (66e6, 72e6), (36e6, 39e6),
                 (617e3, 778e3), (57e3, 1.9e6)],
    "hbm_bound": [(25.4, 25.5), (91.0, 91.3), (2.15e9, 2.15e9), (92.1, 92.4), (1.5, 1.5),
                  (66.5e6, 87.4e6), (2.1e6, 2.1e6), (29e6, 35e6), (16e6, 21e6),
                  (993e3, 993e3), (131e3, 4.2e6)],
}
ROW_NAMES = [name for name, _ in ROWS] + [MEMORY_ISSUES]


def cases(quick: bool):
    """(cell, load) in the profiled order."""
    return [(cell, load) for cell in (QUICK_CELLS if quick else CELLS) for load in LOADS]


def calls(quick: bool):
    """[(cell, load, call)] and the largest difference between the arms per cell."""
    import paged  # benchmarks/paged.py: the same problems as Figures 3 and 5

    import cutetma

    out, gaps = [], {}
    for cell in (QUICK_CELLS if quick else CELLS):
        name, phase, dtype, b, s_q, ctx, h, h_kv = cell
        q, _, _, k_cache, v_cache, table, lens, descales = paged.paged_problem(
            dtype, b, s_q, ctx, h, h_kv, HEAD_DIM, PAGE, seed=7)
        scaled = ({} if descales is None else
                  dict(zip(("q_descale", "k_descale", "v_descale"), descales, strict=True)))
        arms = {}
        for load in LOADS:
            def call(load=load, q=q, k_cache=k_cache, v_cache=v_cache, table=table,
                     lens=lens, scaled=scaled):
                return cutetma.attention_with_kvcache(q, k_cache, v_cache, lens, table,
                                                      causal=True, load=load, num_splits=1,
                                                      **scaled)
            arms[load] = call
            out.append((cell, load, call))
        a, c = (arms[load]().float() for load in LOADS)
        gaps[name] = float((a - c).abs().max())
    return out, gaps


def workload(quick: bool):
    """Every call twice outside the profiled range (compile, warm-up), the arms compared,
    then each once inside it."""
    import torch

    launches, gaps = calls(quick)
    for _, _, call in launches:
        call()
    torch.cuda.synchronize()
    print("TABLE2_GAPS " + json.dumps(gaps))
    torch.cuda.nvtx.range_push("profile")
    for _, _, call in launches:
        call()
        torch.cuda.synchronize()
    torch.cuda.nvtx.range_pop()


def profile(quick: bool) -> tuple[list[dict], dict]:
    from gemm_profile import find_ncu, ncu_table, supported

    ncu = find_ncu()
    if not ncu:
        raise RuntimeError("ncu (Nsight Compute) not found")
    # only the counters this ncu lists (an unlisted one costs its row, not the run)
    metrics = supported(ncu, [m for _, names in ROWS for m in names] + list(EXTRA))
    opcodes = supported(ncu, LOAD_ISSUES)
    table, proc, _ = ncu_table(ncu, metrics + opcodes, __file__,
                               ["--quick"] if quick else [], timeout=540)
    if '"ID"' not in proc.stdout:
        raise RuntimeError(f"ncu printed no table (rc {proc.returncode}): "
                           f"{(proc.stdout + proc.stderr)[-1500:]}")
    gaps = re.search(r"TABLE2_GAPS (\{.*\})", proc.stdout)
    table = [r for r in table if r.get("ID", "").strip().isdigit()]
    # a launch of ours is the attention forward: any other kernel (a torch fill or copy of
    # the descales, a split's combine: none expected) is dropped, not taken for the next case
    table = [r for r in table if not re.search(r"at::|native|elementwise|combine",
                                               r.get("Kernel Name", ""), re.I)]
    rows = []
    for (cell, load), r in zip(cases(quick), table, strict=False):
        name, phase, dtype, b, s_q, ctx, h, h_kv = cell
        values = {m: _number(r.get(m)) for m in metrics + opcodes}
        rows.append({"cell": name, "load": load, "phase": phase, "dtype": dtype, "b": b,
                     "s_q": s_q, "ctx": ctx, "h": h, "h_kv": h_kv, "d": HEAD_DIM,
                     "page_size": PAGE, "causal": True, "kernel": r.get("Kernel Name", "")[:60],
                     **values})
    return rows, {"opcode_counters": opcodes, "counters": metrics,
                  "arm_max_abs_difference": json.loads(gaps.group(1)) if gaps else None}


def _number(text):
    if text in (None, ""):
        return None
    try:
        return float(str(text).replace(",", ""))
    except ValueError:
        return None


def row_values(row: dict) -> list:
    """One launch's figures in ``ROW_NAMES`` order (None where no counter read it); the
    memory issues are TMA loads plus LDGSTS (``LOAD_ISSUES``)."""
    out = []
    for _, names in ROWS:
        out.append(next((row[m] for m in names if row.get(m) is not None), None))
    loads = [row[m] for m in LOAD_ISSUES if row.get(m) is not None]
    out.append(sum(loads) if loads else None)
    return out


def summarize(rows) -> dict:
    """Per cell: each row's TMA and cp.async figures and their ratio, the paper's beside."""
    by = {(r["cell"], r["load"]): r for r in rows}
    cells = {}
    for cell in dict.fromkeys(r["cell"] for r in rows):
        tma, cpa = by.get((cell, "tma")), by.get((cell, "cp_async"))
        if not (tma and cpa):
            continue
        table = {}
        for i, (name, t, c) in enumerate(zip(ROW_NAMES, row_values(tma), row_values(cpa),
                                             strict=True)):
            paper = PAPER.get(cell, [None] * len(ROW_NAMES))[i]
            table[name] = {"tma": t, "cp_async": c,
                           "ratio": t / c if t is not None and c else None,
                           "paper_ratio": paper[0] / paper[1] if paper else None}
        time_t, time_c = tma.get("gpu__time_duration.sum"), cpa.get("gpu__time_duration.sum")
        cells[cell] = {"rows": table, "ncu_time_tma_over_cp_async":
                       time_t / time_c if time_t and time_c else None}
    return {"cells": cells, "row_note": "the paper's extracted Table 2 lists values without "
            "row names; its rows are read in the order of its text (section 4.3)"}


def plot(rows, path: Path):
    """TMA / cp.async per counter and cell (bars), the paper's ratio beside each (dots)."""
    cells = summarize(rows)["cells"]
    plt = common.pyplot()
    fig, ax = plt.subplots(figsize=(9, 4.2), dpi=90)
    names = ROW_NAMES
    width = 0.8 / max(1, len(cells))
    for i, (cell, data) in enumerate(cells.items()):
        xs = [j + (i - (len(cells) - 1) / 2) * width for j in range(len(names))]
        ours = [data["rows"][n]["ratio"] or 0 for n in names]
        paper = [data["rows"][n]["paper_ratio"] for n in names]
        # bars from 1 (a tie) to the ratio, up or down
        ax.bar(xs, [o - 1 for o in ours], width, bottom=1, color=f"C{i}",
               label=f"ours, {cell}")
        ax.plot([x for x, p in zip(xs, paper, strict=True) if p],
                [p for p in paper if p], "k.", ms=6,
                label="paper (FA3, H100)" if i == 0 else None)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_yscale("log", base=2)
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels([n.split(" (")[0] for n in names], rotation=35, ha="right", fontsize=7)
    ax.set_ylabel("TMA-paged / cp.async-paged")
    ax.set_title("Table 2 on our GPU: counters of the two producers (< 1: TMA needs fewer)",
                 fontsize=10)
    ax.legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    common.save_figure(fig, path)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--workload", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--resummarize", type=Path)
    args = ap.parse_args(argv)
    from cutetma import results

    if args.resummarize:
        doc = json.loads(args.resummarize.read_text())
        doc["meta"]["summary"] = summarize(doc["rows"])
        args.resummarize.write_text(results.dumps(doc))
        plot(doc["rows"], args.resummarize.with_suffix(".png"))
        return 0
    if args.workload:
        workload(args.quick)
        return 0
    rows, found = profile(args.quick)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = results.meta("benchmarks/paper/table2.py" + (" --quick" if args.quick else ""))
    meta.update(found)
    meta["summary"] = summarize(rows)
    path = out / "paper_table2.json"
    path.write_text(results.dumps({"meta": meta, "rows": rows}))
    plot(rows, path.with_suffix(".png"))
    for cell, data in meta["summary"]["cells"].items():
        print(cell, "ncu time TMA / cp.async", data["ncu_time_tma_over_cp_async"])
        for name, v in data["rows"].items():
            print(f"  {name}: {v}")
    return 0 if len(rows) == len(cases(args.quick)) else 1


if __name__ == "__main__":
    sys.exit(main())
