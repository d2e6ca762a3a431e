"""``cutetma`` on the command line: ask the TMA model where bytes land, in text, JSON or PNG.

Flow: argv -> argparse (``build_parser``; every argument is validated by the model's own
lookups, ``swizzle.mode`` and ``swizzle.dtype_bytes``) -> one ``run_*`` function per
subcommand -> ``cutetma.swizzle`` computes -> ``cutetma.viz.text`` words it for stdout,
``json`` serialises it, ``cutetma.viz.png`` draws it.

    cutetma swizzle map     --mode 128B --dtype fp16 --box 8x64 [--json] [--png FILE]
    cutetma swizzle banks   --mode 128B --dtype fp16 --row-bytes 256 --column 0 --rows 0-7
                            (--grouped | --ungrouped) [--json] [--png FILE]
    cutetma swizzle figures --out DIR
    cutetma swizzle html    --out FILE          (the interactive explorer, one file)
    cutetma swizzle hardware [--quick] [--out DIR]   (GPU: hardware vs model vs CuTe)
    cutetma tour            [--out DIR]

Every user mistake -- an argparse complaint or a ``ValueError`` naming the TMA rule the
model refuses -- becomes exactly one ``cutetma: error: ...`` line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from cutetma import swizzle
from cutetma.viz import text

USAGE_ERROR = 2

# The chapter's three worked examples, shared by `swizzle figures` and `tour`.
CHAPTER_MAP = {"mode": "128B", "dtype": "fp16", "rows": 8, "cols": 64}
CHAPTER_GROUPED = {"dtype": "fp16", "rows": 16, "cols": 128, "col_offset": 0}
CHAPTER_BANKS = {"mode": "128B", "row_bytes": 256, "column": 0, "rows": range(8)}
FIGURE_NAMES = ("swizzle_map_128B.png", "grouped_3d.png", "bank_sectors.png")


class UsageError(Exception):
    """A command line argparse refused; reported like any other user mistake."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        # argparse would print the whole usage block and exit; one line is easier to read
        # (and to test), and main() decides the exit code.
        raise UsageError(f"{message} (see '{self.prog} --help')")


def _argument_type(convert, name):
    """Wrap a model lookup so argparse reports the model's own message, not 'invalid value'."""

    def parse(value):
        try:
            return convert(value)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    parse.__name__ = name
    return parse


def _box(value: str) -> tuple[int, int]:
    match = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+)\s*", value)
    if not match:
        raise ValueError(f"box {value!r} is not ROWSxCOLS, e.g. 8x64")
    return int(match[1]), int(match[2])


def _row_range(value: str) -> range:
    match = re.fullmatch(r"\s*(\d+)\s*-\s*(\d+)\s*", value)
    if not match or int(match[1]) > int(match[2]):
        raise ValueError(f"rows {value!r} is not A-B with A <= B, e.g. 0-7")
    return range(int(match[1]), int(match[2]) + 1)


def _dtype(value: str) -> str:
    swizzle.dtype_bytes(value)  # raises on unknown names
    return value.lower()


MODE = _argument_type(swizzle.mode, "mode")
DTYPE = _argument_type(_dtype, "dtype")
BOX = _argument_type(_box, "box")
ROWS = _argument_type(_row_range, "rows")


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
    if args.json:
        print(json.dumps(sector_map_dict(args.mode, args.dtype, rows, cols)))
    else:
        print(sector_map_text(args.mode, args.dtype, rows, cols))
    if args.png:
        from cutetma.viz import png

        png.plot_swizzle_map(args.mode, args.dtype, rows, cols, args.png)
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
    reports = bank_reports(args.mode, args.row_bytes, args.column, args.rows)
    report = reports[args.grouped]
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
    if args.png:
        from cutetma.viz import png

        title = bank_figure_title(args.mode, args.row_bytes, args.column, args.rows)
        png.plot_bank_sectors(reports[True], reports[False], args.png, title)
    return 0


# --------------------------------------------------------------------------- figures
def write_chapter_figures(out_dir) -> list[Path]:
    """The chapter's three figures, named FIGURE_NAMES, into ``out_dir``."""
    from cutetma.viz import png

    out = Path(out_dir)
    map_png, grouped_png, banks_png = (out / name for name in FIGURE_NAMES)
    reports = bank_reports(**CHAPTER_BANKS)
    return [
        png.plot_swizzle_map(**CHAPTER_MAP, path=map_png),
        png.plot_grouped_box(**CHAPTER_GROUPED, path=grouped_png),
        png.plot_bank_sectors(
            reports[True], reports[False], banks_png, bank_figure_title(**CHAPTER_BANKS)
        ),
    ]


def run_figures(args) -> int:
    for path in write_chapter_figures(args.out):
        print(path)
    return 0


# --------------------------------------------------------------------------- html
def run_html(args) -> int:
    """The chapter's three figures as one interactive, self-contained HTML page."""
    from cutetma.viz import html

    print(html.write_html(args.out))
    return 0


# --------------------------------------------------------------------------- tour
def _tour_figures(args):
    """The chapter's figures"""
    for path in write_chapter_figures(args.out):
        print(f"wrote {path}")


def _tour_map(args):
    """128B swizzle of an 8x64 fp16 box: physical sector = sector XOR row"""
    print(sector_map_text(**CHAPTER_MAP))


def _tour_banks(args):
    """Eight rows of one column, 256-B rows: why 128-B grouping matters"""
    for grouped, report in bank_reports(**CHAPTER_BANKS).items():
        layout = "grouped  " if grouped else "ungrouped"
        print(
            f"{layout}: bank sectors {list(report.bank_sectors)}: {text.conflict_summary(report)}"
        )


def _tour_algebra(args):
    """CuTe layout algebra vs the hardware model, byte for byte (the full sweep is in tests)"""
    from cutetma import layouts

    cases = layouts.sweep_cases(rows=(8, 64))
    print(f"{'mode':>5} {'width':>5} {'cases':>5}  all bytes equal")
    for mode in swizzle.MODE_NAMES:
        for w in layouts.WIDTHS:
            mine = [c for c in cases if c.mode == mode and c.elem_bytes == w]
            results = [layouts.compare_case(c) for c in mine]
            ok = all(r.ok for r in results)
            print(f"{mode:>5} {8 * w:>4}b {len(results):>5}  {'yes' if ok else 'NO'}")
    trap = layouts.compare_units("128B", 2, 8, 64)
    print(f"unit trap, fp16 8x64 128B: CuTe's atom as a pointer (byte) swizzle matches: "
          f"{trap.pointer_matches}; as an element-offset layout swizzle: {trap.layout_matches} "
          f"({trap.misplaced_fraction:.0%} of elements misplaced); rewritten as "
          f"Swizzle<3,3,3> on elements: {trap.converted_matches}")


def _tour_compile(args):
    """Data movement, GEMM and attention kernels compiled for sm_90a: instructions issued"""
    from cutetma import kernels

    for name, ptx_ops in kernels.compile_showcase():
        print(f"{name:<30}  {', '.join(ptx_ops)}")


def _tour_hardware(args):
    """On the GPU: what the hardware wrote into shared memory vs the model"""
    from cutetma import kernels

    reason = kernels.gpu_unavailable()
    if reason:
        print(f"skipped: {reason} (run `cutetma swizzle hardware` on an H200)")
        return
    run_hardware(argparse.Namespace(quick=True, out=None))
    import torch

    from cutetma import ops

    a = torch.randn(1000, 4096, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(3000, 4096, device="cuda", dtype=torch.bfloat16)
    ref = ops.gemm_ref(a, b)
    for load in ("tma", "tma_multicast", "cp_async"):
        err = (ops.gemm(a, b, load=load).float() - ref).abs().max().item()
        print(f"gemm 1000x3000x4096 bf16, load={load}: max |C - fp32 ref| = {err:.3g}")
    from cutetma.kernels.attention_sm90 import attention_ref

    q = torch.randn(2, 1000, 8, 128, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(2, 1000, 2, 128, device="cuda", dtype=torch.bfloat16) for _ in "kv")
    ref, _ = attention_ref(q, k, v, causal=True)
    for load in ("tma", "cp_async"):
        err = (ops.attention(q, k, v, causal=True, load=load).float() - ref).abs().max().item()
        print(f"attention 2x1000x8x128 bf16 causal GQA, load={load}: max |O - fp32 ref| = "
              f"{err:.3g}")


# Each step takes the parsed args and prints its part; its docstring is its heading.
TOUR_STEPS = [_tour_figures, _tour_map, _tour_banks, _tour_algebra, _tour_compile,
              _tour_hardware]


# --------------------------------------------------------------------------- hardware
def run_hardware(args) -> int:
    from cutetma import hardware, kernels, results

    reason = kernels.gpu_unavailable()
    if reason:
        raise ValueError(f"swizzle hardware needs a Hopper GPU: {reason}")
    cases = hardware.hardware_cases(quick=args.quick)
    print(f"{'case':<44} {'model':>5} {'cute':>5} {'ctas':>5}")

    def progress(done, total, row):
        flags = [row.get(k) for k in ("matches_model", "matches_algebra", "ctas_identical")]
        cells = " ".join(f"{('ok' if f else 'NO') if f is not None else '-':>5}" for f in flags)
        extra = f"  {row['error']}" if "error" in row else ""
        print(f"[{done:>3}/{total}] {row['name']:<36} {cells}{extra}", flush=True)

    rows = hardware.run(cases, progress)
    matched = sum(r["match"] for r in rows)
    print(f"{matched} of {len(rows)} cases match the model and the CuTe algebra byte for byte")
    if args.out:
        print(f"wrote {results.write('hw_swizzle', rows, args.out)}")
    return 0 if matched == len(rows) else 1


def tour(args) -> int:
    """Walk through the chapter: each of TOUR_STEPS in order."""
    for number, step in enumerate(TOUR_STEPS, 1):
        print(f"== {number}. {step.__doc__}")
        step(args)
        print()
    return 0


# --------------------------------------------------------------------------- parser
def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="cutetma", description="Where TMA puts bytes in shared memory.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    swizzle_parser = commands.add_parser("swizzle", help="swizzle placement and bank conflicts")
    swizzle_commands = swizzle_parser.add_subparsers(dest="what", required=True, metavar="WHAT")

    def add_mode_and_dtype(p):
        p.add_argument("--mode", type=MODE, required=True, help=", ".join(swizzle.MODE_NAMES))
        p.add_argument(
            "--dtype", type=DTYPE, required=True, help=", ".join(sorted(swizzle.DTYPE_BYTES))
        )
        p.add_argument("--json", action="store_true", help="print JSON instead of text")
        p.add_argument("--png", metavar="FILE", help="also draw a picture into FILE")

    map_parser = swizzle_commands.add_parser(
        "map", help="physical sector of every 16-byte sector of a 2D box"
    )
    add_mode_and_dtype(map_parser)
    map_parser.add_argument(
        "--box",
        type=BOX,
        required=True,
        metavar="ROWSxCOLS",
        help="box in elements, inner dimension last, e.g. 8x64",
    )
    map_parser.set_defaults(run=run_map)

    banks_parser = swizzle_commands.add_parser(
        "banks", help="bank sectors hit by one 16-byte column read over several rows"
    )
    add_mode_and_dtype(banks_parser)
    banks_parser.add_argument(
        "--row-bytes",
        type=int,
        required=True,
        metavar="N",
        help="tile row width in bytes, e.g. 256",
    )
    banks_parser.add_argument(
        "--column",
        type=int,
        required=True,
        metavar="C",
        help="16-byte sector column read in every row",
    )
    banks_parser.add_argument(
        "--rows", type=ROWS, required=True, metavar="A-B", help="rows read, inclusive, e.g. 0-7"
    )
    layout = banks_parser.add_mutually_exclusive_group(required=True)
    layout.add_argument(
        "--grouped",
        dest="grouped",
        action="store_true",
        help="rows split into span-wide groups (the 3D TMA box)",
    )
    layout.add_argument(
        "--ungrouped",
        dest="grouped",
        action="store_false",
        help="full row stride (the chapter's illegal comparison)",
    )
    banks_parser.set_defaults(run=run_banks)

    figures_parser = swizzle_commands.add_parser("figures", help="write the chapter's PNGs")
    figures_parser.add_argument("--out", required=True, metavar="DIR")
    figures_parser.set_defaults(run=run_figures)

    html_parser = swizzle_commands.add_parser(
        "html", help="write the chapter's three figures as one interactive HTML page"
    )
    html_parser.add_argument("--out", required=True, metavar="FILE")
    html_parser.set_defaults(run=run_html)

    hw_parser = swizzle_commands.add_parser(
        "hardware", help="(GPU) what the hardware writes vs the model and the CuTe algebra"
    )
    hw_parser.add_argument("--quick", action="store_true", help="one box per mode and width")
    hw_parser.add_argument("--out", default="benchmarks/results", metavar="DIR",
                           help="where hw_swizzle.json goes (default: benchmarks/results)")
    hw_parser.set_defaults(run=run_hardware)

    tour_parser = commands.add_parser("tour", help="the chapter step by step")
    tour_parser.add_argument(
        "--out", default="docs", metavar="DIR", help="where the figures go (default: docs)"
    )
    tour_parser.set_defaults(run=tour)
    return parser


def main(argv=None) -> int:
    try:
        args = build_parser().parse_args(argv)
        return args.run(args)
    except (UsageError, ValueError) as exc:
        # ValueError is how cutetma.swizzle names a broken TMA rule: a user mistake too.
        message = " ".join(str(exc).split())
        print(f"cutetma: error: {message}", file=sys.stderr)
        return USAGE_ERROR
