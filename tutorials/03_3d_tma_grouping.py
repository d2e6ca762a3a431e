"""03 - A 3D TMA and the 128-byte grouping: the chapter's 16x256 example and its bank sectors.

Run: ``python tutorials/03_3d_tma_grouping.py``. The model part runs anywhere; on an H200 the
last step loads the slice with one 3D TMA and compares the shared-memory bytes with the
model (skipped elsewhere, saying why).

**Why a 3D box.** ``SWIZZLE_128B`` permutes 16-byte sectors inside an 8-row x 128-byte atom,
so the inner dimension of a TMA box may be at most 128 bytes: 64 fp16 values. A 16x128 fp16
slice has 256-byte rows. The chapter's trick is a second view of the same memory,

    group = j // 64,  col = j % 64,   global[row, j] == global3[group, row, col]

a (2, 16, 64) tensor whose inner dimension is 128 bytes again. Only the tensor map changes:
no byte moves in global memory. One 3D copy then writes group 0 as a dense 16x128-byte block
(``g0``) and group 1 right after it (``g1``); each block holds two 8-row atoms, and inside
each atom sector c of row r lands in sector ``c XOR (r % 8)``.

**Why it matters for banks.** Shared memory has 32 four-byte banks; a 16-byte access covers
four of them, one *bank sector* S0..S7 of a 128-byte line. Read one 16-byte column from eight
consecutive rows:

* grouped: row r of a group is 128 bytes after row r-1, the XOR sees ``r % 8``: eight
  different bank sectors, conflict-free;
* ungrouped (256-byte rows, not a legal 128B box, only the chapter's comparison): each row
  is *two* atom rows further, so the XOR input advances by 2: four bank sectors, each hit
  twice, a 2-way conflict.

Functions used: ``cutetma.swizzle`` (``check_box``, ``group_view``, ``grouped_box_offsets``,
``column_access_banks``), ``cutetma.layouts.compare_case`` (CuTe's own layout for the 3D box),
``cutetma.kernels.build.compile_probe`` and, on the GPU, ``cutetma.smem_image(..., grouped=True)``.

Measured on the H200 (NVIDIA H200, torch 2.11.0+cu130, nvidia-cutlass-dsl 4.8.1,
2026-11-30, `python benchmarks/gpu_session.py --only tutorials`), the GPU part:

    == 6. On the GPU: the bytes one 3D TMA (and cp.async) wrote, against the model
    col offset   0,      tma: 4096 bytes equal to the model's: True
    col offset   0, cp_async: 4096 bytes equal to the model's: True
    col offset 128,      tma: 4096 bytes equal to the model's: True
    col offset 128, cp_async: 4096 bytes equal to the model's: True

    Takeaway: splitting 256-byte rows into two 128-byte groups makes the slice one legal 3D box (1 cp.async.bulk.tensor.3d) whose column reads hit 8 bank sectors (conflict degree 1); kept at the 256-byte stride they hit 4 (a 2-way conflict). CuTe's grouped layout agrees with the model: True. on the H200 4/4 images matched the model byte for byte.
"""

from __future__ import annotations

import sys

import numpy as np

from cutetma import layouts
from cutetma import swizzle as hw
from cutetma.kernels.build import compile_probe, gpu_unavailable, ptx_ops
from cutetma.kernels.tile_copy import ProbeConfig
from cutetma.viz import text

ROWS, COLS, W = 16, 128, 2  # the slice: 16 rows x 128 fp16 = 256-byte rows
GLOBAL = (16, 256)  # the chapter's global matrix, fp16


def heading(title: str) -> None:
    print(f"\n== {title}")


def the_box_rule() -> None:
    heading("1. A 256-byte row is not a legal 128B box; three dimensions are")
    try:
        hw.check_box((ROWS, COLS), W, "128B")
    except ValueError as exc:
        print(f"2D box ({ROWS}, {COLS}) fp16: {exc}")
    g = hw.group_size(W, "128B")
    box3 = (COLS // g, ROWS, g)
    hw.check_box(box3, W, "128B")
    print(f"3D box {box3} (groups, rows, G = {g}): legal, inner {g * W} B")

    x = np.arange(np.prod(GLOBAL), dtype=np.int32).reshape(GLOBAL)
    for offset in (0, COLS):
        slice_ = x[:, offset:offset + COLS]
        g3 = hw.group_view(slice_, W, "128B")
        j = np.arange(COLS)
        same = all(np.array_equal(slice_[r, j], g3[j // g, r, j % g]) for r in range(ROWS))
        print(f"col offset {offset:>3}: global3 shape {g3.shape}, global[row, j] == "
              f"global3[j // {g}, row, j % {g}] for every element: {same}; "
              f"a view of the same memory: {np.shares_memory(g3, x)}")


def where_it_lands() -> np.ndarray:
    heading("2. One 3D copy: g0 and g1, each two 8-row atoms")
    print("physical sector (within its 128-byte row) of each logical sector: c XOR (r % 8)")
    offsets = hw.grouped_box_offsets(ROWS, COLS, W, "128B")[:, ::hw.SECTOR_BYTES // W]
    block = ROWS * 128  # one group: 16 rows of 128 bytes
    group, inside = np.divmod(offsets, block)
    row, byte = np.divmod(inside, 128)
    sector = byte // hw.SECTOR_BYTES
    assert np.array_equal(row, np.broadcast_to(np.arange(ROWS)[:, None], row.shape))
    groups = COLS * W // 128
    print(f"smem: g0 = bytes 0..{block - 1}, g1 = bytes {block}..{2 * block - 1}; a line "
          f"between the two 8-row atoms of each group")
    print("        " + " | ".join(f"g{g}: slice sectors {8 * g:>2}..{8 * g + 7:<2}"
                                  for g in range(groups)))
    for r in range(ROWS):
        if r == 8:
            print("        " + " | ".join("-" * 24 for _ in range(groups)))
        cells = [" ".join(f"{s:>2}" for s in sector[r, group[r] == g]) for g in range(groups)]
        print(f"row {r:>2}: " + " | ".join(cells))
    return offsets


def bank_sectors() -> dict:
    heading("3. One 16-byte column, rows 0-7: bank sectors with and without grouping")
    found = {}
    for column in (0, 9):
        for grouped in (True, False):
            report = hw.column_access_banks(COLS * W, column, range(8), "128B", grouped=grouped)
            name = "grouped  " if grouped else "ungrouped"
            print(f"column {column:>2} {name}: S{list(report.bank_sectors)} -> "
                  f"{text.conflict_summary(report)}")
            found[(column, grouped)] = report
    return found


def cute_agrees() -> bool:
    heading("4. CuTe's layout for the 3D box vs the model")
    case = layouts.Case("grouped", "128B", W, (ROWS, COLS // hw.group_size(W, "128B")))
    result = layouts.compare_case(case)
    print(f"{case}: CuTe's atom tiled rows-first then groups ({result.spec.text}) places "
          f"{result.elements - result.mismatches} of {result.elements} elements where the "
          f"model does")
    return result.ok


def the_ptx() -> int:
    heading("5. Compiled for sm_90a: one 3D bulk copy")
    ptx = compile_probe(ProbeConfig(W, "128B", ROWS, COLS, grouped=True)).ptx
    line = next(ln.strip() for ln in ptx.splitlines() if "cp.async.bulk.tensor" in ln)
    print(f"instructions: {', '.join(ptx_ops(ptx))}")
    print(f"the copy: {line}")
    print("          coordinates {col in group, row, group}: innermost first")
    return ptx.count("cp.async.bulk.tensor.3d")


def on_the_gpu() -> str:
    heading("6. On the GPU: the bytes one 3D TMA (and cp.async) wrote, against the model")
    import torch

    import cutetma

    torch.manual_seed(0)
    x = torch.randn(*GLOBAL, device="cuda", dtype=torch.float16)
    results = []
    for tile_c in (0, 1):
        box = x[:, tile_c * COLS:(tile_c + 1) * COLS].cpu().numpy()
        model = hw.model_image(box, "128B", grouped=True)
        for load in ("tma", "cp_async"):
            image = cutetma.smem_image(x, (ROWS, COLS), swizzle="128B", load=load,
                                       tile=(0, tile_c), grouped=True)
            torch.cuda.synchronize()
            same = bool((image.cpu().numpy() == model).all())
            results.append(same)
            print(f"col offset {tile_c * COLS:>3}, {load:>8}: {model.size} bytes equal to the "
                  f"model's: {same}")
    return f"on the H200 {sum(results)}/{len(results)} images matched the model byte for byte"


def main() -> int:
    print("03 - a 3D TMA and the 128-byte grouping")
    the_box_rule()
    where_it_lands()
    banks = bank_sectors()
    agrees = cute_agrees()
    copies = the_ptx()
    reason = gpu_unavailable()
    if reason:
        heading("6. On the GPU")
        print(f"skipped: {reason}. On an H200 this step loads both 16x128 halves of a "
              "16x256 fp16 tensor with cutetma.smem_image(..., grouped=True), by TMA and by "
              "cp.async, and compares each image with the model.")
        measured = "GPU part skipped"
    else:
        measured = on_the_gpu()
    g, u = banks[(0, True)], banks[(0, False)]
    heading("Takeaway:")
    print(f"Takeaway: splitting 256-byte rows into two 128-byte groups makes the slice one "
          f"legal 3D box ({copies} cp.async.bulk.tensor.3d) whose column reads hit "
          f"{g.distinct} bank sectors (conflict degree {g.conflict_degree}); kept at the "
          f"256-byte stride they hit {u.distinct} (a {u.conflict_degree}-way conflict). "
          f"CuTe's grouped layout agrees with the model: {agrees}. {measured}.")
    return 0 if agrees else 1


if __name__ == "__main__":
    sys.exit(main())
