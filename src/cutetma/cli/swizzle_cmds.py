"""``cutetma swizzle map | banks | figures | html | hardware``: the model's answers in text,
JSON, PNG or HTML, and (on a GPU) the hardware against the model. Also the chapter's worked
examples (``CHAPTER_*``) and figure names, shared with ``tour``.
"""

from __future__ import annotations

import json
from pathlib import Path

from cutetma import swizzle
from cutetma.cli.args import _announce_folder, _say, output_file, output_folder, writing
from cutetma.viz import text

# The chapter's three worked examples, shared by `swizzle figures` and `tour`.
CHAPTER_MAP = {"mode": "128B", "dtype": "fp16", "rows": 8, "cols": 64}
CHAPTER_GROUPED = {"dtype": "fp16", "rows": 16, "cols": 128, "col_offset": 0}
CHAPTER_BANKS = {"mode": "128B", "row_bytes": 256, "column": 0, "rows": range(8)}
FIGURE_NAMES = ("swizzle_map_128B.png", "grouped_3d.png", "bank_sectors.png")


# --------------------------------------------------------------------------- swizzle map
def sector_map_dict(mode, dtype: str, rows: int, cols: int) -> dict:
    """The ``--json`` answer of ``swizzle map``: one record per row and logical sector."""
    m = swizzle.mode(mode)
    physical_row, physical_sector = swizzle.sector_map(rows, cols, swizzle.dtype_bytes(dtype), m)
    return {
        "mode": m.name,
        "dtype": dtype,
        "box": [rows, cols],
        "sectors": [
            {"row": r, "sector": c, "physical_row": int(pr), "physical_sector": int(ps)}
            for (r, c), pr, ps in zip(
                ((r, c) for r in range(rows) for c in range(physical_sector.shape[1])),
                physical_row.ravel(),
                physical_sector.ravel(),
                strict=True,
            )
        ],
    }


def sector_map_text(mode, dtype: str, rows: int, cols: int) -> str:
    m = swizzle.mode(mode)
    elem_bytes = swizzle.dtype_bytes(dtype)
    physical_row, physical_sector = swizzle.sector_map(rows, cols, elem_bytes, m)
    rule = f"{m.swizzle} on byte addresses" if m.bits else "no swizzle"
    row_bytes = cols * elem_bytes
    return (
        f"{m.name} ({rule}), {dtype} box {rows}x{cols}: {row_bytes}-B rows of "
        f"{row_bytes // swizzle.SECTOR_BYTES} sectors, "
        f"{swizzle.SECTOR_BYTES // elem_bytes} {dtype} per 16-B sector\n"
        f"physical sector of logical sector cN in each row (row:sector where the row moves)\n"
        + text.sector_grid(physical_row, physical_sector)
    )


def run_map(args) -> int:
    rows, cols = args.box
    png_path = output_file(args.png, "--png", ".png") if args.png is not None else None
    if args.json:
        answer = json.dumps(sector_map_dict(args.mode, args.dtype, rows, cols))
    else:
        answer = sector_map_text(args.mode, args.dtype, rows, cols)
    if png_path is not None:
        from cutetma.viz import png

        with writing("--png", png_path):
            png.plot_swizzle_map(args.mode, args.dtype, rows, cols, png_path)
    print(answer)
    if png_path is not None:
        _say(f"wrote {png_path}", to_stderr=args.json)  # stdout stays pure JSON
    return 0


# --------------------------------------------------------------------------- swizzle banks
def bank_reports(mode, row_bytes: int, column: int, rows) -> dict[bool, swizzle.BankReport]:
    """Both layouts of the chapter's comparison, keyed by ``grouped``."""
    return {
        grouped: swizzle.column_access_banks(row_bytes, column, rows, mode, grouped=grouped)
        for grouped in (True, False)
    }


def bank_text(report: swizzle.BankReport, elem_bytes: int, dtype: str, column: int) -> str:
    per_sector = swizzle.SECTOR_BYTES // elem_bytes
    banks_per_sector = 32 // swizzle.BANK_SECTORS
    first = column * per_sector
    lines = [f"16-B sector column {column} = {dtype} elements {first}-{first + per_sector - 1}"]
    for row, address, sector in zip(
        report.rows, report.byte_addresses, report.bank_sectors, strict=True
    ):
        lo = sector * banks_per_sector
        lines.append(
            f"row {row}: smem byte {address:>5} -> bank sector S{sector} "
            f"(banks {lo}-{lo + banks_per_sector - 1})"
        )
    lines.append(f"{len(report.rows)} accesses: {text.conflict_summary(report)}")
    return "\n".join(lines)


def bank_figure_title(mode, row_bytes: int, column: int, rows) -> str:
    return (
        f"{swizzle.mode(mode).name} swizzle, {row_bytes}-B rows: "
        f"16-B column {column}, rows {rows[0]}-{rows[-1]}"
    )


def run_banks(args) -> int:
    png_path = output_file(args.png, "--png", ".png") if args.png is not None else None
    reports = bank_reports(args.mode, args.row_bytes, args.column, args.rows)
    report = reports[args.grouped]
    if png_path is not None:
        from cutetma.viz import png

        title = bank_figure_title(args.mode, args.row_bytes, args.column, args.rows)
        with writing("--png", png_path):
            png.plot_bank_sectors(reports[True], reports[False], png_path, title)
    if args.json:
        print(
            json.dumps(
                {
                    "mode": args.mode.name,
                    "dtype": args.dtype,
                    "row_bytes": args.row_bytes,
                    "column": args.column,
                    "grouped": args.grouped,
                    **report.as_dict(),
                }
            )
        )
    else:
        layout = "grouped (3D box)" if args.grouped else "ungrouped (full row stride)"
        print(f"{args.mode.name} swizzle, {args.row_bytes}-B rows, {layout}")
        print(bank_text(report, swizzle.dtype_bytes(args.dtype), args.dtype, args.column))
    if png_path is not None:
        _say(f"wrote {png_path}", to_stderr=args.json)  # stdout stays pure JSON
    return 0


# --------------------------------------------------------------------------- figures
def write_chapter_figures(out_dir) -> list[Path]:
    """The chapter's three figures, named FIGURE_NAMES, into ``out_dir``."""
    from cutetma.viz import png

    out = Path(out_dir)
    map_png, grouped_png, banks_png = (out / name for name in FIGURE_NAMES)
    reports = bank_reports(**CHAPTER_BANKS)
    with writing("--out", out):
        return [
            png.plot_swizzle_map(**CHAPTER_MAP, path=map_png),
            png.plot_grouped_box(**CHAPTER_GROUPED, path=grouped_png),
            png.plot_bank_sectors(
                reports[True], reports[False], banks_png, bank_figure_title(**CHAPTER_BANKS)
            ),
        ]


def run_figures(args) -> int:
    out, created = output_folder(args.out, "--out")
    _announce_folder(out, created)
    for path in write_chapter_figures(out):
        print(f"wrote {path}")
    return 0


# --------------------------------------------------------------------------- html
def run_html(args) -> int:
    """The chapter's three figures as one interactive, self-contained HTML page."""
    from cutetma.viz import html

    path = output_file(args.out, "--out")
    with writing("--out", path):
        html.write_html(path)
    print(f"wrote {path}")
    return 0


# --------------------------------------------------------------------------- hardware
def _build():
    """``cutetma.kernels.build``: the compile helpers and the GPU check (imports no DSL)."""
    from cutetma.kernels import build

    return build


def _gpu_unavailable() -> str | None:
    return _build().gpu_unavailable()


def run_hardware(args) -> int:
    from cutetma import hardware, results

    reason = _gpu_unavailable()
    if reason:
        raise ValueError(f"swizzle hardware needs a Hopper GPU: {reason}")
    if args.out:
        out, created = output_folder(args.out, "--out")  # checked before the long sweep
        _announce_folder(out, created)
    cases = hardware.hardware_cases(quick=args.quick)
    print(f"{'case':<44} {'model':>5} {'cute':>5} {'ctas':>5}")

    def progress(done, total, row):
        flags = [row.get(k) for k in ("matches_model", "matches_algebra", "ctas_identical")]
        cells = " ".join(f"{('ok' if f else 'NO') if f is not None else '-':>5}" for f in flags)
        extra = f"  {row['error']}" if "error" in row else ""
        if "matches_box_phase" in row:  # a paged box: which swizzle phase it got
            extra += f"  box's own phase: {'ok' if row['matches_box_phase'] else 'NO'}"
        print(f"[{done:>3}/{total}] {row['name']:<36} {cells}{extra}", flush=True)

    rows = hardware.run(cases, progress)
    matched = sum(r["match"] for r in rows)
    print(f"{matched} of {len(rows)} cases match the model and the CuTe algebra byte for byte")
    # a paged box that starts inside an atom asks which phase the card writes: either
    # reading holding is an answer; neither (or no load) is not
    mid_atom = [r for r in rows if r.get("row_offset", 0) % 8]
    answered = [r for r in mid_atom if r.get("matches_model") or r.get("matches_box_phase")]
    if mid_atom:
        print(f"paged boxes starting inside an atom: {len(answered)} of {len(mid_atom)} "
              "written in one of the two phases (see matches_model / matches_box_phase)")
    if args.out:
        with writing("--out", out):
            path = results.write("hw_swizzle", rows, out)
        print(f"wrote {path}")
    return 0 if matched + len(answered) - sum(r["match"] for r in answered) == len(rows) \
        else 1
