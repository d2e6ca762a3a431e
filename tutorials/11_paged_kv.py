"""11 - Paged KV: TMA boxes that each lie inside one page, against cp.async's row-by-row gather.

Run: ``python tutorials/11_paged_kv.py``. On any machine it shows how a key block of the
cache is cut into TMA boxes for each page size, compiles the paged kernel for sm_90a and
counts its boxes in the PTX, and prints what the H200 measured
(``benchmarks/results/paged.json``, from ``benchmarks/paged.py``). On a Hopper GPU it also
runs ``cutetma.attention_with_kvcache`` on a shuffled pool with both producers, checks them
against the fp32 reference and times them. From torch::

    out = cutetma.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens, page_table,
                                         causal=True)   # k_cache (num_pages, page, h_kv, d)
    # a decode step: its keys and values written at each sequence's end, then attended
    out = cutetma.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens, page_table,
                                         causal=True, k=k_new, v=v_new)

**The problem.** A serving engine stores keys and values in pages of ``page_size`` keys taken
from one pool; sequence b's i-th page is ``page_table[b, i]``. The attention kernel reads a
block of ``block_n`` = 128 keys per stage (80 at d = 256), so a stage spans several pages
(pages smaller than the block) or a part of one (pages larger).

**TMA: the page is a coordinate.** The pool is one tensor ``(page_size, d, h_kv, pages)``
and its tensor map is made once; a box of ``kv_box`` rows is addressed by (row in page, 0,
head, page). ``kv_box = gcd(page_size, block_n)``: every box then lies inside one page and a
stage is ``block_n / kv_box`` boxes, all completing on the stage's one mbarrier (the expected
bytes are the stage's, whatever the box count). A box must start on the 128-byte swizzle's
8-row atom, so ``kv_box`` must be a multiple of 8; ``load="auto"`` takes cp.async otherwise.
A box past the sequence gets page -1: an out-of-range coordinate, so the TMA writes zeros
and still counts the bytes. Rows of the last page past the sequence are inside the pool, so
the TMA brings whatever they hold; the consumers zero those rows of V before P V (0 * NaN
is NaN). The producer warp keeps 32 boxes' page ids in its lanes and passes them by shuffle.

**A box that starts mid-atom.** The 128-byte swizzle permutes 16-byte chunks by the row's
index within an 8-row atom. A box on whole atoms lands in the same phase whether the card
counts rows from the stage or from the box; a box of a 4-key page starting at row 4 does
not, so its bytes are right only if the card swizzles by the stage's address (section 1b;
the hardware check's paged cases answer it on a GPU). The kernel keeps to whole atoms:
gcd(page_size, block_n) a multiple of 8, cp.async for the rest.

**cp.async: the row is looked up.** 128 producer threads copy 16 bytes per instruction
into the same swizzled stage, 8 lanes side by side over a key's 128-byte segment. Each lane
looks up one key's page per key block and computes that line's address; the lanes copying
the line take it by shuffle and add their column (``cpasync.LineViews``):
a page-table load per line, not per 16 bytes.

**Decode: pack the query heads, split the keys.** With one query per sequence a tile of one
head is one useful row in 128, and every query head of a K/V head reads the same keys. The
decode kernel packs a K/V head's query heads into one tile (rows ``(group, s_q)``, Q gathered
row by row, an empty warpgroup passing its stages without GEMMs) and, when the (sequence,
K/V head) tiles are fewer than the SMs, cuts each tile's keys into splits whose fp32 partial
outputs a second small kernel merges by their log-sum-exps. Both are decided from shapes
(``tuning.attention.paged_pack_gqa``, ``paged_splits``), so a CUDA graph can capture the
call.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import cutetma  # noqa: F401  (sets sm_90a before anything imports the DSL)
from cutetma.kernels.build import gpu_unavailable

ROOT = Path(__file__).resolve().parents[1]


def heading(text: str) -> None:
    print(f"\n== {text}")


def boxes_per_page_size() -> dict:
    """kv_box and the boxes per stage for the page sizes serving engines use."""
    from cutetma.kernels.attention import AttentionConfig
    from cutetma.tuning.attention import paged_load

    heading("1. A key block as boxes: kv_box = gcd(page_size, block_n)")
    table = {}
    for page in (1, 12, 16, 48, 64, 128, 256, 1000):
        load = paged_load(page, 4096, 128, False)
        cfg = AttentionConfig(page_size=page, load=load)
        per_stage = cfg.block_n // cfg.kv_box if load == "tma" else None
        table[page] = (load, cfg.kv_box, per_stage)
        shown = (f"{per_stage} boxes of {cfg.kv_box} rows per stage" if per_stage
                 else f"gcd {math.gcd(page, cfg.block_n)} is not a multiple of 8: cp.async")
        print(f"page {page:5d}: load='auto' -> {load:8s} {shown}")
    return table


def mid_atom_phase() -> bool:
    heading("1b. A box that starts inside the 8-row atom: which swizzle phase?")
    import numpy as np

    from cutetma import hardware

    for case in hardware.paged_cases():
        stage = hardware.model_offsets(case)  # the stage's phase (absolute address bits)
        own = hardware.box_phase_offsets(case)  # a phase restarting at the box
        chunk = stage[0, ::8] // 16 % 8  # where the box's first row's 16-byte chunks land
        print(f"{case.rows:2d} rows at row {case.row_offset:2d}: first row's chunks -> "
              f"{' '.join(map(str, chunk))}; the two readings "
              f"{'agree' if np.array_equal(stage, own) else 'DIFFER'}")
    print("On whole atoms (pages that are multiples of 8 keys) both readings are one; a box "
          "starting mid-atom would need the card to apply the stage's phase. `cutetma swizzle "
          "hardware` runs these cases on a GPU (hardware.paged_cases).")
    return True


def compiled_boxes() -> dict:
    """The TMA instructions of the paged kernel at two page sizes (d = 128: a box is two
    64-column halves; the producer's code holds the K and V loads twice)."""
    from cutetma.kernels import build
    from cutetma.kernels.attention import AttentionConfig

    heading("2. The boxes in the PTX (d = 128)")
    counts = {}
    for page in (16, 128):
        ptx = build.compile_paged_attention(AttentionConfig(page_size=page)).ptx
        counts[page] = ptx.count("cp.async.bulk.tensor")
        print(f"page {page:3d}: {counts[page]} cp.async.bulk.tensor "
              f"(Q 2 + 2 x (K + V) x {128 // math.gcd(page, 128)} boxes x 2 halves)")
    cp = build.compile_paged_attention(AttentionConfig(page_size=16, load="cp_async")).ptx
    print(f"cp.async twin, page 16: {cp.count('cp.async.cg.shared.global')} 16-byte "
          "cp.async, no bulk tensor copy")
    return counts


def decode_choices() -> None:
    heading("3. Decode: packing and splits, decided from the shapes (h 32 / 8, d 128)")
    from cutetma.tuning.attention import paged_pack_gqa, paged_splits

    for b, context in ((64, 4096), (16, 16384), (4, 4096), (1, 65536)):
        pack = paged_pack_gqa(1, 4)
        tiles = b * (8 if pack else 32)  # one 128-row tile per (sequence, K/V head)
        splits = paged_splits(tiles, context // 128, 132)
        print(f"b {b:3d}, {context:6d} keys: pack {pack}, {tiles:4d} tiles, "
              f"{splits:2d} split{'s' if splits > 1 else ''} of "
              f"{context // 128 // splits} key blocks")


def new_keys_land() -> None:
    heading("3b. A step's new keys (k=, v=): written at each sequence's end, page by page")
    import torch

    from cutetma.kvcache import append_to_cache

    page = 16
    table = torch.tensor([[6, 2, 9], [4, 0, -1]], dtype=torch.int32)
    lens = torch.tensor([31, 16], dtype=torch.int32)
    k_cache = torch.zeros(10, page, 1, 8)
    # each new key marked by its own value, 1 .. 6, to find where it lands
    k_new = torch.arange(1.0, 7.0).view(2, 3, 1, 1).expand(2, 3, 1, 8).contiguous()
    append_to_cache(k_cache, torch.zeros_like(k_cache), k_new, k_new, lens, table)
    for i in range(2):
        spots = []
        for t in range(3):
            where = (k_cache[:, :, 0, 0] == k_new[i, t, 0, 0]).nonzero()[0].tolist()
            spots.append(f"key {int(lens[i]) + t} -> page {where[0]} slot {where[1]}")
        print(f"sequence {i} (pages {table[i].tolist()}, {int(lens[i])} keys): "
              + ", ".join(spots))
    print("On a GPU one small kernel (kernels.attention.append) writes them on the call's "
          "stream before the attention kernel, which then sees cache_seqlens + 3 keys; on "
          "the CPU torch's index copies do the same. The caller's cache_seqlens is not "
          "changed.")


def measured() -> str:
    heading("4. Measured on the H200 (benchmarks/results/paged.json)")
    path = ROOT / "benchmarks" / "results" / "paged.json"
    if not path.exists():
        print("no paged.json yet: run benchmarks/paged.py on a Hopper GPU")
        return ""
    data = json.loads(path.read_text())
    for r in data["rows"]:
        if r["phase"] == "prefill" and r["dtype"] == "bfloat16":
            cells = "  ".join(f"{k} {r[k]:.0f}" for k in ("tma", "cp_async", "fa4", "dense")
                              if r.get(k))
            print(f"prefill {'causal' if r['causal'] else 'full  '} page {r['page_size']:3d}: "
                  f"{cells} TFLOP/s")
        elif r["phase"] == "chunked":
            cells = "  ".join(f"{k} {r[k]:.0f}" for k in ("tma", "cp_async", "fa4", "dense")
                              if r.get(k))
            print(f"chunked {r['s_q']} over {r['ctx']} page {r['page_size']:3d}: {cells} "
                  "TFLOP/s")
        elif r["phase"] == "decode":
            cells = "  ".join(f"{k} {r[k]:.2f}" for k in ("tma", "cp_async", "fa4") if r.get(k))
            ceiling = f" (read ceiling {r['ceiling_tbps']:.2f})" if r.get("ceiling_tbps") else ""
            print(f"decode b{r['b']} ctx {r['s']} page {r['page_size']}: {cells} TB/s"
                  f"{ceiling}")
    s = data["meta"]["summary"]
    ratio = s.get("prefill_tma_over_cp_async")
    return f"On the H200, TMA-paged prefill runs {ratio:.2f}x its cp.async twin (geomean)." \
        if ratio else ""


def on_gpu() -> str:
    heading("5. On this GPU: a shuffled pool, both producers, the fp32 reference")
    reason = gpu_unavailable()
    if reason:
        print(f"skipped: {reason}")
        return ""
    import torch
    from _common import graph_time_ms

    from cutetma.reference import paged_attention_ref

    b, s_q, h, h_kv, d, page = 4, 512, 16, 4, 128, 16
    lens = torch.tensor([2048, 1000, 1, 1500], dtype=torch.int32, device="cuda")
    per_seq = 2048 // page
    pool = torch.randperm(b * per_seq, device="cuda").int()
    table = pool.view(b, per_seq)
    k_cache = torch.randn(b * per_seq, page, h_kv, d, device="cuda", dtype=torch.bfloat16)
    v_cache = torch.randn_like(k_cache)
    q = torch.randn(b, s_q, h, d, device="cuda", dtype=torch.bfloat16)
    ref, _ = paged_attention_ref(q, k_cache, v_cache, lens, table, causal=True)
    times = {}
    for load in ("tma", "cp_async"):
        def call(load=load):
            return cutetma.attention_with_kvcache(q, k_cache, v_cache, lens, table,
                                                  causal=True, load=load)
        err = (call().float() - ref).abs().max().item()
        times[load] = graph_time_ms(call)
        print(f"{load:8s}: max error {err:.2e}, {times[load] * 1e3:.0f} us")
    return f"Here TMA took {times['tma'] / times['cp_async']:.2f}x cp.async's time at page 16."


def main() -> int:
    print("11 - paged KV: TMA boxes per page against a cp.async gather")
    table = boxes_per_page_size()
    mid_atom_phase()
    counts = compiled_boxes()
    decode_choices()
    new_keys_land()
    result = measured()
    here = on_gpu()
    heading("Takeaway:")
    print(f"Takeaway: with the pool as one tensor map and the page as a coordinate, TMA "
          f"loads a paged stage as gcd(page_size, block_n)-row boxes on one mbarrier "
          f"({counts[16]} TMA instructions at page 16, {counts[128]} at 128), for every page "
          f"size that is a multiple of 8, not only the key block; cp.async takes the rest. "
          f"{result} {here}".rstrip())
    return 0 if table[16][0] == "tma" and table[12][0] == "cp_async" else 1


if __name__ == "__main__":
    sys.exit(main())
