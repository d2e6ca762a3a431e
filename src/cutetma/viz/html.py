"""The chapter's three interactive figures as one self-contained HTML page, from the model.

Flow: ``cutetma.swizzle`` places every 16-byte sector (``smem_byte_offsets``,
``grouped_box_offsets``, ``column_access_banks``, ``bank_report``) -> ``explorer_data``
turns the placements into plain tables, one per toggle combination -> ``render_html``
embeds them as JSON next to a small script that only *looks things up*: it draws the cells,
and on hover outlines the cell the table names. The page computes no address of its own,
so it can never disagree with the model the tests and the GPU probes check.

    figure   what it shows                                        toggles
    intro    an 8-row, 128-byte box of a 16x256-byte tensor ->    mode, dtype
             shared memory as 128-byte lines (= the 32 banks)
    grouped  a 16x256-byte slice of a 16x512-byte tensor as one   mode, dtype, column offset
             3D box: each span-wide group its own block
    banks    one 16-byte column of eight consecutive 256-byte     mode, dtype, tiling,
             rows: which bank sectors S0..S7 the reads hit         column, rows

The dtype only relabels: the model places bytes, so the generator places the box once per
element width and asserts that the sector mapping is the same for all of them (the
chapter's "changing dtype only changes how many elements fit in a sector").

    cutetma swizzle html --out FILE        (or ``write_html(path)``)
"""

from __future__ import annotations

import html
import json
from pathlib import Path

import numpy as np

from cutetma import swizzle as hw
from cutetma.viz.text import conflict_summary

DTYPES = ("fp8", "fp16", "fp32")
LINE_BYTES = hw.ROW_BYTES  # one line of shared memory: 128 bytes, all 32 banks
SECTOR = hw.SECTOR_BYTES

# The chapter's geometry, in bytes so that every dtype shows the same picture.
INTRO = {"rows": 8, "row_bytes": 128, "global_rows": 16, "global_row_bytes": 256}
GROUPED = {"rows": 16, "slice_bytes": 256, "global_row_bytes": 512}
BANKS = {"rows": 16, "row_bytes": 256, "window": 8}

MODE_LABELS = {"none": "None", "32B": "32B", "64B": "64B", "128B": "128B"}


def _rule(m: hw.SwizzleMode) -> str:
    if not m.bits:
        return "no swizzle: every byte lands at its linear offset"
    def bits(lo):
        return f"bit {lo}" if m.bits == 1 else f"bits {lo}..{lo + m.bits - 1}"

    return (f"{m.name} = {m.swizzle} on byte addresses: {bits(4)} (the 16-B sector inside a "
            f"{m.span}-B span) XORed with {bits(7)} (the row inside the 8-row atom of "
            f"{m.atom_bytes} B)")


def _dtype_controls():
    return {"name": "dtype", "label": "dtype", "kind": "radio", "default": "fp16",
            "options": [[d, d] for d in DTYPES]}


def _mode_control(default="128B", modes=hw.MODE_NAMES):
    return {"name": "mode", "label": "Swizzle", "kind": "radio", "default": default,
            "options": [[m, MODE_LABELS[m]] for m in modes]}


def _first_byte_of_sectors(offsets: np.ndarray, elem_bytes: int) -> np.ndarray:
    """Byte offset of each 16-byte sector (its first element), checking that the sector's
    elements stay together: the swizzle moves whole sectors, never bytes inside one."""
    per = SECTOR // elem_bytes
    rows, cols = offsets.shape
    sectors = offsets.reshape(rows, cols // per, per)
    first = sectors[..., 0]
    if not np.array_equal(sectors, first[..., None] + np.arange(per) * elem_bytes):
        raise AssertionError("a 16-byte sector was split: the model moved bytes, not sectors")
    return first


def _same_for_every_dtype(place) -> np.ndarray:
    """``place(elem_bytes)`` -> sector byte offsets, for every dtype; they must agree."""
    tables = {d: place(hw.dtype_bytes(d)) for d in DTYPES}
    first = tables[DTYPES[0]]
    for d, t in tables.items():
        if not np.array_equal(t, first):
            raise AssertionError(f"the sector mapping differs between {DTYPES[0]} and {d}")
    return first


def _element_labels(n_sectors: int) -> dict:
    """Per dtype: the element range of each 16-byte sector of a row ('40-47')."""
    out = {}
    for d in DTYPES:
        per = SECTOR // hw.dtype_bytes(d)
        out[d] = [f"{c * per}\u2013{c * per + per - 1}" for c in range(n_sectors)]
    return out


def _dtype_labels(n_sectors: int, tensor_rows: int, tensor_row_bytes: int, box_rows: int,
                  box_row_bytes: int) -> dict:
    """Per dtype: the column labels, the tensor's and the box's shapes in elements, and the
    elements per sector."""
    labels = {}
    for d, cols in _element_labels(n_sectors).items():
        w = hw.dtype_bytes(d)
        labels[d] = {"cols": cols, "tensor": f"{tensor_rows}x{tensor_row_bytes // w} {d}",
                     "box": f"{box_rows}x{box_row_bytes // w}", "per": SECTOR // w}
    return labels


def _block(name, rows, cols, cells, *, col_labels=None, row_sep=(), col_sep=(), caption=""):
    return {"name": name, "rows": rows, "cols": cols, "cells": cells, "caption": caption,
            "col_labels": col_labels, "row_sep": list(row_sep), "col_sep": list(col_sep)}


def _empty(rows, cols):
    return [[0] * cols for _ in range(rows)]


def _place_blocks(addresses: np.ndarray, blocks: list[dict], block_bytes: int, pitch: int):
    """(block, row, sector) of each byte address: block i covers ``block_bytes`` bytes, rows
    ``pitch`` bytes apart. Returns three integer arrays shaped like ``addresses``."""
    b, inside = np.divmod(addresses, block_bytes)
    r, byte = np.divmod(inside, pitch)
    return b, r, byte // SECTOR


def _fill(src_block, dst_blocks, src_rc, dst_brc, colour, text, addresses, extra=()):
    """Link source cell (r, c) and destination (b, r, c) both ways.

    A source cell is ``[colour, text, b, r, c, byte, bank sector, *extra]``; a destination
    cell ``[colour, text, r, c]`` (its source's row and column in the source block).
    """
    for i, ((sr, sc), (b, r, c)) in enumerate(zip(src_rc, dst_brc, strict=True)):
        a = int(addresses[i])
        src_block["cells"][sr][sc] = [int(colour[i]), str(text[i]), int(b), int(r), int(c), a,
                                      int(hw.bank_sector(a)), *[e[i] for e in extra]]
        dst_blocks[b]["cells"][r][c] = [int(colour[i]), str(text[i]), sr, sc]


def _bank_labels(addresses_by_position: dict) -> list[str] | None:
    """Column labels 'S0'.. for a destination block when each column position sits in one
    bank sector whatever the row (128-B lines), else None."""
    labels = []
    for _col, sectors in sorted(addresses_by_position.items()):
        if len(set(sectors)) != 1:
            return None
        labels.append(f"S{sectors[0]}")
    return labels


# --------------------------------------------------------------------------- figure 1
def intro_figure() -> dict:
    """An 8-row box of 128-byte rows, loaded from the top left of a 16x256-byte tensor.

    Shared memory is drawn as 128-byte lines. Modes whose span is narrower than the row take
    the row as one 3D box of span-wide groups (each group a dense block), the only legal way
    TMA moves such a row in one copy."""
    rows, row_bytes = INTRO["rows"], INTRO["row_bytes"]
    g_rows, g_sectors = INTRO["global_rows"], INTRO["global_row_bytes"] // SECTOR
    sectors = row_bytes // SECTOR
    combos = {}
    for name, m in hw.MODES.items():
        def place(w, m=m):
            cols = row_bytes // w
            if m.bits and m.span < row_bytes:
                offs = hw.grouped_box_offsets(rows, cols, w, m)
            else:
                offs = hw.smem_byte_offsets((rows, cols), w, m)
            return _first_byte_of_sectors(offs, w)

        first = _same_for_every_dtype(place)
        lines = int(first.max()) // LINE_BYTES + 1
        src = _block("global tensor", g_rows, g_sectors, _empty(g_rows, g_sectors),
                     col_labels=[str(c) for c in range(g_sectors)])
        dst = [_block("shared memory", lines, LINE_BYTES // SECTOR,
                      _empty(lines, LINE_BYTES // SECTOR),
                      col_labels=[f"S{s}" for s in range(LINE_BYTES // SECTOR)],
                      caption="one line = 128 B = all 32 banks; column = bank sector")]
        flat = first.reshape(-1)
        b, r, c = _place_blocks(flat, dst, lines * LINE_BYTES, LINE_BYTES)
        rc = [(i, j) for i in range(rows) for j in range(sectors)]
        logical = [j for _, j in rc]
        _fill(src, dst, rc, list(zip(b, r, c, strict=True)), logical, logical, flat)
        if m.bits and m.span < row_bytes:
            n = row_bytes // m.span
            how = (f"the {row_bytes}-B row is wider than the {m.span}-B span, so the box is one "
                   f"3D box of {n} span-wide groups, each a dense {rows}-row block "
                   f"({rows * m.span} B)")
            src["col_sep"] = list(range(m.span // SECTOR, sectors, m.span // SECTOR))
        else:
            how = f"one 2D box of {rows} rows x {row_bytes} B"
        combos[name] = {"rule": _rule(m), "how": how, "src": src, "dst": dst,
                        "box": [0, rows, 0, sectors]}
    labels = _dtype_labels(g_sectors, g_rows, INTRO["global_row_bytes"], rows, row_bytes)
    return {
        "id": "intro",
        "cell": 30,
        "title": "1. TMA writes a box into shared memory, swizzled on the way",
        "lead": ("The global tensor on the left holds 16 rows of 256 bytes; the blue box (8 rows "
                 "x 128 bytes) is one TMA copy. Each cell is one 16-byte sector. On the right, "
                 "shared memory as TMA writes it, one line of 128 bytes per row. Under 128B the "
                 "logical sector c of row r lands in physical sector c XOR r."),
        "hint": "Hover a source cell to see where its 16 bytes land (or a destination cell to "
                "see where it came from).",
        "controls": [_mode_control(), _dtype_controls()],
        "key": ["mode"],
        "labels": labels,
        "combos": combos,
    }


# --------------------------------------------------------------------------- figure 2
def grouped_figure() -> dict:
    """A 16-row slice of 256-byte rows out of a 16x512-byte tensor, at byte column 0 or 256,
    as one 3D TMA box ``(groups, rows, G)``: group g is its own block of span-wide rows."""
    rows = GROUPED["rows"]
    slice_sectors = GROUPED["slice_bytes"] // SECTOR
    g_sectors = GROUPED["global_row_bytes"] // SECTOR
    combos = {}
    for name, m in hw.MODES.items():
        def place(w, m=m):
            cols = GROUPED["slice_bytes"] // w
            if m.bits:
                offs = hw.grouped_box_offsets(rows, cols, w, m)
            else:
                offs = hw.smem_byte_offsets((rows, cols), w, m)
            return _first_byte_of_sectors(offs, w)

        first = _same_for_every_dtype(place)
        if m.bits:
            span_sectors = m.span // SECTOR
            n = GROUPED["slice_bytes"] // m.span
            block_rows_bytes = m.span
            names = [f"g{g}" for g in range(n)]
            row_sep = range(m.atom_bytes // m.span, rows, m.atom_bytes // m.span)
            how = (f"one 3D box ({n}, {rows}, G): {n} groups of {m.span} B; each group is a "
                   f"dense block of {rows} rows, the swizzle acts inside each "
                   f"{m.atom_bytes // m.span}-row atom (line)")
        else:
            span_sectors, n, block_rows_bytes = slice_sectors, 1, GROUPED["slice_bytes"]
            names, row_sep = ["2D box"], ()
            how = (f"no swizzle has no span limit: one 2D box of {rows} rows x "
                   f"{GROUPED['slice_bytes']} B, nothing to group")
        for offset in (0, 1):
            start = offset * slice_sectors
            src = _block("global tensor", rows, g_sectors, _empty(rows, g_sectors),
                         col_sep=[start + k for k in range(span_sectors, slice_sectors,
                                                           span_sectors)])
            dst = [_block(nm, rows, span_sectors, _empty(rows, span_sectors),
                          row_sep=row_sep) for nm in names]
            flat = first.reshape(-1)
            b, r, c = _place_blocks(flat, dst, rows * block_rows_bytes, block_rows_bytes)
            rc = [(i, start + j) for i in range(rows) for j in range(slice_sectors)]
            local = [j % span_sectors for i in range(rows) for j in range(slice_sectors)]
            colour = [j for i in range(rows) for j in range(slice_sectors)]
            group = [names[j // span_sectors] for i in range(rows) for j in range(slice_sectors)]
            _fill(src, dst, rc, list(zip(b, r, c, strict=True)), colour, local, flat,
                  extra=(group,))
            for blk, nm in zip(dst, names, strict=True):
                blk["caption"] = f"smem {nm}" if m.bits else "smem (one block)"
            combos[f"{name}|{offset}"] = {"rule": _rule(m), "how": how, "src": src, "dst": dst,
                                          "box": [0, rows, start, start + slice_sectors]}
    labels = _dtype_labels(g_sectors, rows, GROUPED["global_row_bytes"], rows,
                           GROUPED["slice_bytes"])
    for d, lab in labels.items():
        w = hw.dtype_bytes(d)
        lab["offsets"] = ["cols 0\u2013" + str(GROUPED["slice_bytes"] // w - 1),
                          f"cols {GROUPED['slice_bytes'] // w}\u2013"
                          f"{GROUPED['global_row_bytes'] // w - 1}"]
    return {
        "id": "grouped",
        "cell": 20,
        "title": "2. A 3D TMA moves a row wider than the swizzle span",
        "lead": ("A 256-byte row does not fit a 128-byte swizzle span, so the slice is viewed "
                 "as (groups, rows, G): global[row, j] = global3[j // G, row, j % G]. One 3D "
                 "TMA writes each group as its own block; under 128B each block holds two "
                 "8-row atoms, and sector c of row r lands in sector c XOR (r % 8)."),
        "hint": "Toggle the column offset to pick the first or second half of the tensor; "
                "hover a cell in the blue slice.",
        "controls": [_mode_control(), _dtype_controls(),
                     {"name": "offset", "label": "Col offset", "kind": "radio", "default": "0",
                      "options": [["0", "first half"], ["1", "second half"]]}],
        "key": ["mode", "offset"],
        "labels": labels,
        "combos": combos,
    }


# --------------------------------------------------------------------------- figure 3
def banks_figure() -> dict:
    """Eight consecutive rows of one 16-byte column of a 16x256-byte tile: the bank sectors
    the reads hit with the rows split into span-wide groups (a legal 3D box) or kept at their
    256-byte stride (the chapter's comparison, not a legal swizzled TMA box).

    The addresses are ``column_access_banks`` over all 16 rows of the tile (so the groups are
    16-row blocks whatever rows are read); each selection's verdict is ``bank_report`` of the
    eight selected addresses."""
    rows, row_bytes, window = BANKS["rows"], BANKS["row_bytes"], BANKS["window"]
    sectors = row_bytes // SECTOR
    starts = list(range(rows - window + 1))
    combos = {}
    for name, m in hw.MODES.items():
        for grouped in (True, False):
            reports = [hw.column_access_banks(row_bytes, c, range(rows), m, grouped=grouped)
                       for c in range(sectors)]
            addr = np.array([rep.byte_addresses for rep in reports]).T  # (rows, sectors)
            split = grouped and m.bits and row_bytes > m.span
            if split:
                span_sectors, pitch = m.span // SECTOR, m.span
                names = [f"g{g}" for g in range(row_bytes // m.span)]
                how = (f"grouped: each 256-B row split into {len(names)} groups of {m.span} B, "
                       f"each group a dense block of {rows} rows (a legal 3D TMA box)")
            else:
                span_sectors, pitch, names = sectors, row_bytes, ["256-B rows"]
                how = ("ungrouped: rows keep their 256-B stride (the chapter's comparison; "
                       "not a legal swizzled TMA box)" if m.bits and not grouped else
                       "no swizzle: nothing moves, grouped or not")
            row_sep = range(8, rows, 8) if m.bits else ()
            src = _block("tile", rows, sectors, _empty(rows, sectors),
                         col_labels=[str(c) for c in range(sectors)])
            dst = [_block(nm, rows, span_sectors, _empty(rows, span_sectors), row_sep=row_sep,
                          caption=f"smem {nm}" if split else "smem, 256-B rows")
                   for nm in names]
            flat = addr.reshape(-1)
            b, r, c = _place_blocks(flat, dst, rows * pitch, pitch)
            rc = [(i, j) for i in range(rows) for j in range(sectors)]
            logical = [j for _, j in rc]
            _fill(src, dst, rc, list(zip(b, r, c, strict=True)), logical, logical, flat)
            for k, blk in enumerate(dst):
                by_col: dict = {}
                for (bb, cc), a in zip(zip(b, c, strict=True), flat, strict=True):
                    if bb == k:
                        by_col.setdefault(int(cc), []).append(int(hw.bank_sector(a)))
                blk["col_labels"] = _bank_labels(by_col)
            selections = []
            for col in range(sectors):
                per_start = []
                for s in starts:
                    sel = list(range(s, s + window))
                    rep = hw.bank_report(addr[sel, col], sel)
                    counts = np.bincount(rep.bank_sectors, minlength=hw.BANK_SECTORS)
                    per_start.append({"banks": list(rep.bank_sectors),
                                      "counts": [int(x) for x in counts],
                                      "distinct": rep.distinct,
                                      "degree": rep.conflict_degree,
                                      "summary": conflict_summary(rep)})
                selections.append(per_start)
            combos[f"{name}|{'yes' if grouped else 'no'}"] = {
                "rule": _rule(m), "how": how, "src": src, "dst": dst, "box": [0, rows, 0, sectors],
                "selections": selections}
    labels = _dtype_labels(sectors, rows, row_bytes, rows, row_bytes)
    return {
        "id": "banks",
        "cell": 28,
        "title": "3. Why the 128-byte grouping matters: bank sectors",
        "lead": ("Eight rows read the same 16-byte column. A 16-byte access covers four of the "
                 "32 banks: one bank sector S0..S7. Grouped (each 256-B row split into two "
                 "128-B groups) the XOR sees row % 8 and the eight reads hit eight bank "
                 "sectors. Ungrouped, the 256-B stride advances the XOR input by two per row: "
                 "four bank sectors, each hit twice, a 2-way conflict."),
        "hint": "Pick a column and eight rows (or click a cell of the tile); toggle tiling. "
                "Outlined cells are the eight reads; the bar counts reads per bank sector.",
        "controls": [_mode_control(), _dtype_controls(),
                     {"name": "tiling", "label": "Tiling (128-B groups)", "kind": "radio",
                      "default": "yes", "options": [["yes", "Yes"], ["no", "No"]]},
                     {"name": "column", "label": "Column", "kind": "select", "default": "0",
                      "options": [[str(c), f"{c}"] for c in range(sectors)]},
                     {"name": "start", "label": "Rows", "kind": "select", "default": "0",
                      "options": [[str(s), f"{s}\u2013{s + window - 1}"] for s in starts]}],
        "key": ["mode", "tiling"],
        "labels": labels,
        "combos": combos,
        "window": window,
    }


def explorer_data() -> dict:
    """Everything the page shows, as JSON-ready tables."""
    return {"figures": [intro_figure(), grouped_figure(), banks_figure()],
            "palette": PALETTE}


# Hue = logical sector % 8, light shade for sectors 8..15 (tab20's pairs).
PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
           "#17becf", "#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5", "#c49c94",
           "#f7b6d2", "#9edae5"]


# --------------------------------------------------------------------------- page
CSS = """
:root { --cell: 30px; --ink: #1d2430; --muted: #5b6472; --blue: #1e63d6; }
* { box-sizing: border-box; }
body { font: 15px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif;
       color: var(--ink); margin: 0; background: #f6f7f9; }
main { max-width: 1240px; margin: 0 auto; padding: 24px 28px 48px; }
h1 { font-size: 24px; margin: 0 0 4px; }
h2 { font-size: 18px; margin: 0 0 6px; }
p { margin: 4px 0 10px; }
.sub { color: var(--muted); margin-bottom: 18px; }
section { background: #fff; border: 1px solid #dde1e7; border-radius: 10px;
          padding: 18px 20px 16px; margin: 18px 0; }
.controls { display: flex; flex-wrap: wrap; gap: 14px 22px; align-items: center;
            margin: 10px 0 12px; }
.ctl { display: flex; align-items: center; gap: 8px; }
.ctl > span { font-size: 13px; color: var(--muted); }
.seg { display: inline-flex; border: 1px solid #b8c0cc; border-radius: 7px; overflow: hidden; }
.seg input { position: absolute; opacity: 0; width: 1px; height: 1px; }
.seg label { padding: 3px 11px; cursor: pointer; font-size: 13px; background: #fff;
             border-left: 1px solid #d5dae2; user-select: none; }
.seg label:first-of-type { border-left: 0; }
.seg input:checked + label { background: var(--blue); color: #fff; }
select { font: inherit; font-size: 13px; padding: 2px 4px; }
.rule, .how { font-size: 13px; color: var(--muted); margin: 2px 0; }
.panels { display: flex; flex-wrap: wrap; gap: 28px; align-items: flex-start;
          margin-top: 12px; }
.panel h3 { font-size: 13px; font-weight: 600; margin: 0 0 4px; }
.blocks { display: flex; gap: 14px; align-items: flex-start; }
.block .cap { font-size: 12px; color: var(--muted); margin-bottom: 2px; text-align: center; }
.grid { display: grid; gap: 0; justify-content: start; }
.lab { font-size: 10px; color: var(--muted); display: flex; align-items: center;
       justify-content: center; }
.rlab { justify-content: flex-end; padding-right: 4px; }
.cell { width: var(--cell); height: var(--cell); display: flex; align-items: center;
        justify-content: center; font-size: 11px; border: 1px solid #fff;
        position: relative; }
.small .cell { font-size: 10px; }
.cell.empty { background: #eceef1; }
.cell.inbox { box-shadow: inset 0 0 0 1px rgba(30, 99, 214, .35); }
.cell.dark { color: #fff; }
.cell.rsep { border-top: 2px solid #222; }
.cell.csep { border-left: 2px dashed #222; }
.cell.btop { border-top: 3px solid var(--blue); }
.cell.bbot { border-bottom: 3px solid var(--blue); }
.cell.bleft { border-left: 3px solid var(--blue); }
.cell.bright { border-right: 3px solid var(--blue); }
.cell.sel, .cell.acc { outline: 2.5px solid #000; outline-offset: -3px; }
.cell.hl { outline: 3px solid #000; outline-offset: -1px; z-index: 2;
           box-shadow: 0 0 0 4px #ffd400; }
.info { min-height: 1.5em; margin-top: 10px; font-size: 14px; font-variant-numeric: tabular-nums; }
.info b { font-weight: 600; }
.bankbar { display: flex; gap: 4px; margin-top: 12px; align-items: center; }
.bank { width: 44px; text-align: center; border: 1px solid #ccd2da; border-radius: 5px;
        font-size: 12px; padding: 2px 0; background: #fff; }
.bank.n1 { background: #a6d96a; } .bank.n2 { background: #fdae61; }
.bank.n3 { background: #d7191c; color: #fff; }
.verdict { margin-left: 12px; font-size: 14px; }
footer { color: var(--muted); font-size: 12px; margin-top: 22px; }
"""

JS = r"""
const DATA = JSON.parse(document.getElementById('data').textContent);
const PAL = DATA.palette;
const DARK = [0, 1, 2, 3, 4, 5, 6, 7];

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}
function value(fig, name) {
  const c = fig.controls.find(k => k.name === name);
  if (c.kind === 'select') return document.getElementById(fig.id + '-' + name).value;
  return document.querySelector('input[name="' + fig.id + '-' + name + '"]:checked').value;
}
function setValue(fig, name, v) {
  const c = fig.controls.find(k => k.name === name);
  if (c.kind === 'select') document.getElementById(fig.id + '-' + name).value = v;
  else document.getElementById(fig.id + '-' + name + '-' + v).checked = true;
}

function buildControls(fig, box) {
  for (const c of fig.controls) {
    const wrap = el('div', 'ctl');
    wrap.appendChild(el('span', '', c.label));
    if (c.kind === 'select') {
      const s = el('select');
      s.id = fig.id + '-' + c.name;
      for (const [v, lab] of c.options) {
        const o = el('option', '', lab); o.value = v; s.appendChild(o);
      }
      s.value = c.default;
      s.addEventListener('change', () => draw(fig));
      wrap.appendChild(s);
    } else {
      const seg = el('div', 'seg');
      for (const [v, lab] of c.options) {
        const i = el('input');
        i.type = 'radio'; i.name = fig.id + '-' + c.name; i.value = v;
        i.id = fig.id + '-' + c.name + '-' + v;
        i.checked = v === c.default;
        i.addEventListener('change', () => draw(fig));
        const l = el('label', '', lab); l.htmlFor = i.id;
        seg.appendChild(i); seg.appendChild(l);
      }
      wrap.appendChild(seg);
    }
    box.appendChild(wrap);
  }
}

function gridOf(block, colLabels) {
  const wrap = el('div', 'block');
  if (block.caption) wrap.appendChild(el('div', 'cap', block.caption));
  const g = el('div', 'grid');
  g.style.gridTemplateColumns = 'auto repeat(' + block.cols + ', var(--cell))';
  g.appendChild(el('div', 'lab'));
  for (let c = 0; c < block.cols; c++)
    g.appendChild(el('div', 'lab', colLabels ? colLabels[c] : ''));
  const cells = [];
  for (let r = 0; r < block.rows; r++) {
    g.appendChild(el('div', 'lab rlab', String(r)));
    const row = [];
    for (let c = 0; c < block.cols; c++) {
      const v = block.cells[r][c];
      const d = el('div', 'cell');
      d.dataset.r = r; d.dataset.c = c;
      if (!v) d.classList.add('empty');
      else {
        d.style.background = PAL[v[0]];
        if (DARK.includes(v[0])) d.classList.add('dark');
        d.textContent = v[1];
      }
      if (block.row_sep.includes(r)) d.classList.add('rsep');
      if (block.col_sep.includes(c)) d.classList.add('csep');
      g.appendChild(d); row.push(d);
    }
    cells.push(row);
  }
  wrap.appendChild(g);
  return [wrap, cells];
}

function draw(fig) {
  const key = fig.key.map(n => value(fig, n)).join('|');
  const combo = fig.combos[key];
  const lab = fig.labels[value(fig, 'dtype')];
  const root = document.getElementById(fig.id);
  if (lab.offsets) lab.offsets.forEach((t, i) => {
    document.querySelector('label[for="' + fig.id + '-offset-' + i + '"]').textContent = t;
  });
  root.querySelector('.rule').textContent = combo.rule;
  root.querySelector('.how').textContent = combo.how;
  const srcBox = root.querySelector('.src .blocks'), dstBox = root.querySelector('.dst .blocks');
  srcBox.replaceChildren(); dstBox.replaceChildren();
  root.querySelector('.src h3').textContent =
    (fig.id === 'banks' ? 'tile ' + lab.tensor : 'global tensor ' + lab.tensor) +
    ' (one cell = 16 B = ' + lab.per + ' ' + value(fig, 'dtype') + ')' +
    (fig.id === 'banks' ? '' : '; box ' + lab.box);
  const [sw, src] = gridOf(combo.src, combo.src.col_labels);
  srcBox.appendChild(sw);
  const [b0, b1, c0, c1] = combo.box;
  for (let r = b0; r < b1; r++) for (let c = c0; c < c1; c++) {
    const d = src[r][c];
    d.classList.add('inbox');
    if (r === b0) d.classList.add('btop');
    if (r === b1 - 1) d.classList.add('bbot');
    if (c === c0) d.classList.add('bleft');
    if (c === c1 - 1) d.classList.add('bright');
  }
  const dst = [];
  combo.dst.forEach((blk, b) => {
    const [w, cells] = gridOf(blk, blk.col_labels);
    w.dataset.b = b;
    cells.forEach(row => row.forEach(d => { d.dataset.b = b; }));
    dstBox.appendChild(w); dst.push(cells);
  });
  const info = root.querySelector('.info');
  const clear = () => {
    root.querySelectorAll('.hl').forEach(e => e.classList.remove('hl'));
    info.textContent = '';
  };
  const show = (r, c) => {
    const v = combo.src.cells[r][c];
    if (!v) { clear(); return; }
    clear();
    src[r][c].classList.add('hl');
    dst[v[2]][v[3]][v[4]].classList.add('hl');
    const where = combo.dst.length > 1 ? combo.dst[v[2]].name + ' ' : '';
    info.innerHTML = '';
    info.append('row ' + r + ', 16-B sector ' + c + ' (' + value(fig, 'dtype') +
                ' elements ' + lab.cols[c] + (v[7] ? ', group ' + v[7] : '') + ')  \u2192  ');
    const b = el('b', '', where + 'row ' + v[3] + ', sector ' + v[4]);
    info.append(b, '  (shared-memory byte ' + v[5] + ', bank sector S' + v[6] + ')');
  };
  src.forEach((row, r) => row.forEach((d, c) => {
    d.addEventListener('mouseenter', () => show(r, c));
    d.addEventListener('mouseleave', clear);
    if (fig.id === 'banks') d.addEventListener('click', () => {
      setValue(fig, 'column', String(c));
      setValue(fig, 'start', String(Math.min(r, combo.selections[c].length - 1)));
      draw(fig);
    });
  }));
  dst.forEach(cells => cells.forEach(row => row.forEach(d => {
    const v = combo.dst[d.dataset.b].cells[d.dataset.r][d.dataset.c];
    if (!v) return;
    d.addEventListener('mouseenter', () => show(v[2], v[3]));
    d.addEventListener('mouseleave', clear);
  })));
  if (fig.id === 'banks') drawBanks(fig, combo, src, dst, root);
}

function drawBanks(fig, combo, src, dst, root) {
  const col = Number(value(fig, 'column')), start = Number(value(fig, 'start'));
  const sel = combo.selections[col][start];
  for (let r = start; r < start + fig.window; r++) {
    const v = combo.src.cells[r][col];
    src[r][col].classList.add('sel');
    dst[v[2]][v[3]][v[4]].classList.add('acc');
  }
  const bar = root.querySelector('.bankbar');
  bar.replaceChildren(el('span', 'lab', 'bank sectors'));
  sel.counts.forEach((n, s) => {
    const b = el('div', 'bank n' + Math.min(n, 3), 'S' + s + ': ' + n);
    b.dataset.sector = s; b.dataset.count = n;
    bar.appendChild(b);
  });
  const v = el('span', 'verdict', fig.window + ' reads: ' + sel.summary);
  v.dataset.distinct = sel.distinct; v.dataset.degree = sel.degree;
  bar.appendChild(v);
}

for (const fig of DATA.figures) {
  buildControls(fig, document.querySelector('#' + fig.id + ' .controls'));
  draw(fig);
}
document.body.dataset.ready = '1';
"""


def _section(fig: dict) -> str:
    bank_bar = '<div class="bankbar"></div>' if fig["id"] == "banks" else ""
    return f"""
<section id="{fig['id']}" style="--cell: {fig['cell']}px"
         class="{'small' if fig['cell'] < 24 else ''}">
  <h2>{html.escape(fig['title'])}</h2>
  <p>{html.escape(fig['lead'])}</p>
  <div class="controls"></div>
  <div class="rule"></div><div class="how"></div>
  <div class="panels">
    <div class="panel src" id="{fig['id']}-src"><h3></h3><div class="blocks"></div></div>
    <div class="panel dst" id="{fig['id']}-dst">
      <h3>shared memory, as TMA writes it</h3><div class="blocks"></div>
    </div>
  </div>
  {bank_bar}
  <div class="info"></div>
  <p class="sub">{html.escape(fig['hint'])}</p>
</section>"""


def render_html(data: dict | None = None) -> str:
    """The whole page: CSS, the data as JSON, and the lookup script, inline."""
    data = explorer_data() if data is None else data
    payload = json.dumps(data, separators=(",", ":")).replace("</", "<\\/")
    sections = "".join(_section(f) for f in data["figures"])
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>TMA swizzle explorer (cutetma)</title>
<style>{CSS}</style>
</head>
<body>
<main>
<h1>TMA swizzle explorer</h1>
<p class="sub">Where the Tensor Memory Accelerator puts every 16-byte sector of a box in shared
memory: the TMA chapter's three figures, generated by <code>cutetma swizzle html</code> from
the numpy model in <code>cutetma.swizzle</code> (the same model the tests check against CuTe's
layout algebra and the H200's bytes). The page only looks the answers up.</p>
{sections}
<footer>Generated by cutetma; self-contained: no network, no external files.</footer>
</main>
<script id="data" type="application/json">{payload}</script>
<script>{JS}</script>
</body>
</html>
"""


def write_html(path) -> Path:
    """Write the explorer page to ``path`` (parent folders made); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_html(), encoding="utf-8")
    return path
