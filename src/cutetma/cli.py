"""``cutetma`` on the command line: ask the TMA model where bytes land, in text, JSON or PNG.

Flow: argv -> argparse (``build_parser``; every argument is validated by the model's own
lookups, ``swizzle.mode`` and ``swizzle.dtype_bytes``, and sizes are bounded by what one TMA
box holds, so no answer can grow without limit) -> one ``run_*`` function per
subcommand -> ``cutetma.swizzle`` computes -> ``cutetma.viz.text`` words it for stdout,
``json`` serialises it, ``cutetma.viz.png`` draws it.

    cutetma swizzle map     --mode 128B --dtype fp16 --box 8x64 [--json] [--png FILE.png]
    cutetma swizzle banks   --mode 128B --dtype fp16 --row-bytes 256 --column 0 --rows 0-7
                            (--grouped | --ungrouped) [--json] [--png FILE.png]
    cutetma swizzle figures --out DIR
    cutetma swizzle html    --out FILE          (the interactive explorer, one file)
    cutetma swizzle hardware [--quick] [--out DIR]   (GPU: hardware vs model vs CuTe)
    cutetma tour            [--out DIR]         (default DIR: ./cutetma-tour)
    cutetma cache info      [--list] [--json]   (the on-disk compile cache)
    cutetma cache clear
    cutetma cache warm      [--gemm MxNxK,...] [--attention d[,causal] ...]
                            [--dtypes float16,bfloat16] [--load tma,cp_async] [--jobs N]
    cutetma --version

Every user mistake -- an argparse complaint, a ``ValueError`` naming the TMA rule the model
refuses, an output path that cannot be written -- becomes exactly one ``cutetma: error: ...``
line on stderr and exit code 2. Output paths are checked before anything is computed: no
folder is created except the one ``figures`` / ``tour`` / ``hardware --out`` names and the
compile cache's folder that ``cache warm`` fills (each announced), no file is written
anywhere but where it was asked to go, and every file written is named on the way out.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import re
import sys
import time
from pathlib import Path

from cutetma import __version__, swizzle
from cutetma.viz import text

USAGE_ERROR = 2
# Bounds that keep every answer small: a TMA box dimension holds at most MAX_BOX_DIM (256)
# elements, so the bank analysis reads at most that many rows of at most MAX_ROW_BYTES (the
# widest grouped tile: 256 groups of a 128-B span).
MAX_ROWS = swizzle.MAX_BOX_DIM
MAX_ROW_BYTES = swizzle.MAX_BOX_DIM * swizzle.mode("128B").span
# options whose value may start with '-' (argparse would take "-8x64" for an option)
VALUE_OPTIONS = ("--box", "--rows", "--row-bytes", "--column", "--gemm", "--jobs")
TOUR_OUT = "cutetma-tour"

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


def _shown(value: str, limit: int = 24) -> str:
    """A user's value, shortened if huge, for a one-line message."""
    return value if len(value) <= limit else f"{value[:12]}...({len(value)} characters)"


def _integer(digits: str, what: str, low: int, high: int, why: str = "") -> int:
    """``digits`` as an int in ``low..high``; the message names ``what`` and the bound."""
    sign = -1 if digits.startswith("-") else 1
    magnitude = digits.lstrip("+-")
    value = sign * int(magnitude) if len(magnitude) <= 9 else sign * 10**9  # no 10^5000
    if value < low:
        bound = {0: "non-negative", 1: "positive"}.get(low, f"at least {low}")
        raise ValueError(f"{what} must be {bound}, got {_shown(digits)}")
    if value > high:
        raise ValueError(f"{what} must be at most {high}{why}, got {_shown(digits)}")
    return value


_BOX_WHY = f" (a TMA box dimension holds 1..{swizzle.MAX_BOX_DIM} elements)"


def _box(value: str) -> tuple[int, int]:
    match = re.fullmatch(r"\s*([+-]?\d+)\s*[xX]\s*([+-]?\d+)\s*", value)
    if not match:
        raise ValueError(f"box {_shown(value)!r} is not ROWSxCOLS, e.g. 8x64")
    return (_integer(match[1], "box rows", 1, swizzle.MAX_BOX_DIM, _BOX_WHY),
            _integer(match[2], "box columns", 1, swizzle.MAX_BOX_DIM, _BOX_WHY))


def _row_range(value: str) -> range:
    match = re.fullmatch(r"\s*([+-]?\d+)\s*(?:-\s*([+-]?\d+)\s*)?", value)
    if not match:
        raise ValueError(f"rows {_shown(value)!r} is not A-B, e.g. 0-7")
    why = f" (the rows of one TMA box: {MAX_ROWS} at most, 0-{MAX_ROWS - 1})"
    first = _integer(match[1], "first row", 0, MAX_ROWS - 1, why)
    last = _integer(match[2] or match[1], "last row", 0, MAX_ROWS - 1, why)
    if first > last:
        raise ValueError(f"rows {_shown(value)!r} is not A-B with A <= B, e.g. 0-7")
    return range(first, last + 1)


def _row_bytes(value: str) -> int:
    if not re.fullmatch(r"\s*[+-]?\d+\s*", value):
        raise ValueError(f"row bytes {_shown(value)!r} is not a whole number of bytes, e.g. 256")
    why = " (256 groups of a 128-B swizzle span, the widest grouped TMA tile)"
    n = _integer(value.strip(), "row bytes", 1, MAX_ROW_BYTES, why)
    if n % swizzle.SECTOR_BYTES:
        raise ValueError(f"row bytes must be a multiple of 16 (whole 16-byte sectors), got {n}")
    return n


def _column(value: str) -> int:
    if not re.fullmatch(r"\s*[+-]?\d+\s*", value):
        raise ValueError(f"column {_shown(value)!r} is not a 16-byte sector index, e.g. 0")
    return _integer(value.strip(), "column", 0, MAX_ROW_BYTES // swizzle.SECTOR_BYTES - 1)


def _dtype(value: str) -> str:
    swizzle.dtype_bytes(value)  # raises on unknown names
    return value.lower()


MODE = _argument_type(swizzle.mode, "mode")
DTYPE = _argument_type(_dtype, "dtype")
BOX = _argument_type(_box, "box")
ROWS = _argument_type(_row_range, "rows")
ROW_BYTES = _argument_type(_row_bytes, "row bytes")
COLUMN = _argument_type(_column, "column")


# --------------------------------------------------------------------------- output paths
def _path_error(option: str, value, problem: str) -> UsageError:
    return UsageError(f"{option} {value}: {problem}")


def _check_folder(folder: Path, option: str, value) -> None:
    """``folder`` must already exist and take new files: cutetma creates no parents."""
    if not folder.exists():
        raise _path_error(option, value, f"folder {folder} does not exist (cutetma creates "
                                         f"no folders on the way; make it first)")
    if not folder.is_dir():
        raise _path_error(option, value, f"{folder} is not a folder")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise _path_error(option, value, f"cannot write into {folder} (permission denied)")


def output_file(value: str, option: str, suffix: str | None = None,
                example: str = "out.html") -> Path:
    """The file ``option`` names, checked before anything is computed: a name (not a folder)
    in a folder that exists and is writable, ending in ``suffix`` if one is required (the
    PNG writer would otherwise add or follow its own)."""
    if not value or not value.strip():
        raise _path_error(option, repr(value), "empty file name")
    path = Path(value)
    example = f"{value.rstrip('/' + os.sep)}/{'out' + suffix if suffix else example}"
    if path.is_dir() or value.endswith(("/", os.sep)):
        raise _path_error(option, value, f"is a folder; name a file in it, e.g. {example}")
    if suffix and path.suffix.lower() != suffix:
        raise _path_error(option, value, f"the file name must end in {suffix}")
    _check_folder(path.parent, option, value)
    if path.exists() and not os.access(path, os.W_OK):
        raise _path_error(option, value, "the file exists and cannot be overwritten")
    return path


def output_folder(value: str, option: str) -> tuple[Path, bool]:
    """The folder ``option`` names and whether this call created it. Only that folder itself
    may be created (its parent must exist); callers announce a creation."""
    if not value or not value.strip():
        raise _path_error(option, repr(value), "empty folder name")
    path = Path(value)
    if path.exists():
        if not path.is_dir():
            raise _path_error(option, value, "exists and is not a folder")
        if not os.access(path, os.W_OK | os.X_OK):
            raise _path_error(option, value, "cannot write into it (permission denied)")
        return path, False
    _check_folder(path.parent, option, value)
    with writing(option, path):
        path.mkdir()
    return path, True


@contextlib.contextmanager
def writing(option: str, path):
    """Report a write the operating system refuses (``/proc``, a full disk) as a user error."""
    try:
        yield
    except BrokenPipeError:
        raise  # stdout's reader left (main handles it); not the file's fault
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise _path_error(option, path, f"cannot write: {reason}") from None


def _say(message: str, *, to_stderr: bool = False) -> None:
    print(message, file=sys.stderr if to_stderr else sys.stdout)


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


def _announce_folder(path: Path, created: bool) -> None:
    if created:
        print(f"created folder {path}")


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


# --------------------------------------------------------------------------- tour
@dataclasses.dataclass
class TourLog:
    """What the tour did, for its closing summary."""

    out: Path
    ran: list[str] = dataclasses.field(default_factory=list)
    files: list[Path] = dataclasses.field(default_factory=list)
    compiled: list[tuple[str, float]] = dataclasses.field(default_factory=list)
    failed: list[str] = dataclasses.field(default_factory=list)
    skipped: list[str] = dataclasses.field(default_factory=list)
    dsl_seconds: float = 0.0
    status: int = 0


def _tour_figures(args, log: TourLog):
    """The chapter's figures"""
    for path in write_chapter_figures(log.out):
        log.files.append(path)
        print(f"wrote {path}")


def _tour_map(args, log: TourLog):
    """128B swizzle of an 8x64 fp16 box: physical sector = sector XOR row"""
    print(sector_map_text(**CHAPTER_MAP))


def _tour_banks(args, log: TourLog):
    """Eight rows of one column, 256-B rows: why 128-B grouping matters"""
    for grouped, report in bank_reports(**CHAPTER_BANKS).items():
        layout = "grouped  " if grouped else "ungrouped"
        print(
            f"{layout}: bank sectors {list(report.bank_sectors)}: {text.conflict_summary(report)}"
        )


def _tour_algebra(args, log: TourLog):
    """CuTe layout algebra vs the hardware model, byte for byte (the full sweep is in tests)"""
    if not _load_dsl(log, "the layout-algebra check"):
        return
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


def _build():
    """``cutetma.kernels.build``: the compile helpers and the GPU check (imports no DSL)."""
    from cutetma.kernels import build

    return build


def _showcase_kernels() -> list:
    """The tour's kernels as ``(name, compile)`` pairs (``kernels.build.showcase_kernels``)."""
    return _build().showcase_kernels()


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}".rstrip(": ")


def _load_dsl(log: TourLog, needed_by: str) -> bool:
    """Import the CuTe DSL for sm_90a once, saying so while it takes its seconds; False (and
    a skip in the log) where it cannot be imported."""
    from cutetma import dsl

    if "cutlass" in sys.modules:
        dsl.cutlass()  # already loaded: only the arch check
        return True
    print("loading the CuTe DSL (sm_90a) ... ", end="", flush=True)
    start = time.perf_counter()
    try:
        dsl.cutlass()
    except (ImportError, dsl.DSLArchError) as exc:
        print("not available")
        log.skipped.append(f"{needed_by}: the CuTe DSL does not load ({_first_line(exc)})")
        return False
    log.dsl_seconds = time.perf_counter() - start
    print(f"{log.dsl_seconds:.1f} s")
    return True


def _tour_compile(args, log: TourLog):
    """Data movement, GEMM and attention kernels compiled for sm_90a: instructions issued"""
    if not _load_dsl(log, "the kernel compiles"):
        return
    try:
        kernels = _showcase_kernels()
    except Exception as exc:  # a broken install: say so in one line and let the tour go on
        print(f"FAILED to list the kernels: {_first_line(exc)}")
        log.failed.append("the kernel list")
        log.status = 1
        return
    width = max(len(name) for name, _ in kernels)
    for number, (name, compile_ops) in enumerate(kernels, 1):
        # the name first, so a slow compile shows which kernel it is
        print(f"[{number:>2}/{len(kernels)}] {name:<{width}}  ", end="", flush=True)
        start = time.perf_counter()
        try:
            ops = compile_ops()
        except Exception as exc:  # one broken kernel should not hide the others
            print(f"FAILED after {time.perf_counter() - start:.1f} s: {_first_line(exc)}")
            log.failed.append(name)
            log.status = 1
            continue
        seconds = time.perf_counter() - start
        log.compiled.append((name, seconds))
        print(f"{seconds:5.1f} s  {', '.join(ops)}", flush=True)


def _gpu_unavailable() -> str | None:
    return _build().gpu_unavailable()


def _tour_hardware(args, log: TourLog):
    """On the GPU: what the hardware wrote into shared memory vs the model"""
    reason = _gpu_unavailable()
    if reason:
        log.skipped.append(f"the GPU step: {reason} (on an H200: `cutetma swizzle hardware`)")
        print(f"skipped: {reason} (run `cutetma swizzle hardware` on an H200)")
        return
    if run_hardware(argparse.Namespace(quick=True, out=None)):
        log.status = 1
    import torch

    import cutetma

    a = torch.randn(1000, 4096, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(3000, 4096, device="cuda", dtype=torch.bfloat16)
    ref = cutetma.gemm_ref(a, b)
    multicast = cutetma.select_gemm_config(1000, 3000, 4096, cluster=(2, 1))
    for label, how in (("load=tma", {"load": "tma"}),
                       ("load=tma, cluster (2,1) multicast", {"config": multicast}),
                       ("load=cp_async", {"load": "cp_async"})):
        err = (cutetma.gemm(a, b, **how).float() - ref).abs().max().item()
        print(f"gemm 1000x3000x4096 bf16, {label}: max |C - fp32 ref| = {err:.3g}")
    q = torch.randn(2, 1000, 8, 128, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(2, 1000, 2, 128, device="cuda", dtype=torch.bfloat16) for _ in "kv")
    ref, _ = cutetma.attention_ref(q, k, v, causal=True)
    for load in ("tma", "cp_async"):
        out = cutetma.attention(q, k, v, causal=True, load=load)
        err = (out.float() - ref).abs().max().item()
        print(f"attention 2x1000x8x128 bf16 causal GQA, load={load}: max |O - fp32 ref| = "
              f"{err:.3g}")


# Each step takes the parsed args and the tour's log and prints its part; its docstring is
# its heading, its name (without _tour_) its word in the summary.
TOUR_STEPS = [_tour_figures, _tour_map, _tour_banks, _tour_algebra, _tour_compile,
              _tour_hardware]


# --------------------------------------------------------------------------- hardware
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
        print(f"[{done:>3}/{total}] {row['name']:<36} {cells}{extra}", flush=True)

    rows = hardware.run(cases, progress)
    matched = sum(r["match"] for r in rows)
    print(f"{matched} of {len(rows)} cases match the model and the CuTe algebra byte for byte")
    if args.out:
        with writing("--out", out):
            path = results.write("hw_swizzle", rows, out)
        print(f"wrote {path}")
    return 0 if matched == len(rows) else 1


def _tour_summary(log: TourLog) -> None:
    print("== summary")
    print(f"ran: {', '.join(log.ran)}")
    if log.compiled or log.failed:
        total = sum(seconds for _, seconds in log.compiled)
        failed = f"; FAILED: {', '.join(log.failed)}" if log.failed else ""
        print(f"compiled: {len(log.compiled)} kernels for sm_90a in {total:.1f} s "
              f"(the CuTe DSL took {log.dsl_seconds:.1f} s to load){failed}")
    for skipped in log.skipped:
        print(f"skipped: {skipped}")
    names = ", ".join(path.name for path in log.files) or "none"
    print(f"files: {len(log.files)} in {log.out.resolve()}/: {names}")


def tour(args) -> int:
    """Walk through the chapter: each of TOUR_STEPS in order, then what happened."""
    out, created = output_folder(args.out, "--out")
    with contextlib.suppress(AttributeError, ValueError):
        sys.stdout.reconfigure(line_buffering=True)  # progress shows through a pipe, too
    log = TourLog(out=out)
    where = "created" if created else "exists"
    print(f"cutetma tour: files go into {out.resolve()}/ ({where}; --out DIR to change)")
    print()
    for number, step in enumerate(TOUR_STEPS, 1):
        print(f"== {number}. {step.__doc__}")
        skipped_before = len(log.skipped)
        step(args, log)
        if len(log.skipped) == skipped_before:
            log.ran.append(step.__name__.removeprefix("_tour_"))
        print()
    _tour_summary(log)
    return log.status


# --------------------------------------------------------------------------- cache
GEMM_SIZE_WHY = " (the GEMM takes sizes as Int32)"


def _gemm_problems(value: str) -> list[tuple[int, int, int]]:
    """``MxNxK[,MxNxK...]`` (or ``preset``) as a list of (M, N, K)."""
    from cutetma.runtime import warm

    if value.strip().lower() == "preset":
        return list(warm.GEMM_PRESET)
    problems = []
    for part in value.split(","):
        match = re.fullmatch(r"\s*([+-]?\d+)\s*[xX]\s*([+-]?\d+)\s*[xX]\s*([+-]?\d+)\s*", part)
        if not match:
            raise ValueError(f"GEMM problem {_shown(part)!r} is not MxNxK, e.g. 4096x4096x4096")
        problems.append(tuple(_gemm_size(match[i], name)
                              for i, name in ((1, "M"), (2, "N"), (3, "K"))))
    return problems


def _gemm_size(digits: str, name: str) -> int:
    """A GEMM size in 1..2^31 - 1 (``_integer`` reads at most 9 digits, below that bound)."""
    magnitude = digits.lstrip("+-").lstrip("0") or "0"
    if len(magnitude) > 9 and not digits.startswith("-"):
        value = int(magnitude) if len(magnitude) <= 10 else 2**31
        if value > 2**31 - 1:
            raise ValueError(f"GEMM {name} must be at most {2**31 - 1}{GEMM_SIZE_WHY}, got "
                             f"{_shown(digits)}")
        return value
    return _integer(digits, f"GEMM {name}", 1, 2**31 - 1, GEMM_SIZE_WHY)


def _attention_spec(value: str) -> list[tuple[int, bool]]:
    """``d`` or ``d,causal`` (or ``preset``) as a list of (head dim, causal)."""
    from cutetma.runtime import warm

    if value.strip().lower() == "preset":
        return list(warm.ATTENTION_PRESET)
    match = re.fullmatch(r"\s*([+-]?\d+)\s*(?:,\s*(causal)\s*)?", value, re.IGNORECASE)
    if not match:
        raise ValueError(f"attention spec {_shown(value)!r} is not d or d,causal, e.g. "
                         "128,causal")
    d = _integer(match[1], "head dim", 1, 256)
    if d not in (64, 128, 256):
        raise ValueError(f"head dim {d}: the attention kernel takes 64, 128 or 256")
    return [(d, bool(match[2]))]


def _choices(allowed: tuple, aliases: dict, what: str):
    """A parser of ``a,b,...`` over ``allowed`` (and ``aliases``), repeats dropped."""

    def parse(value: str) -> list[str]:
        chosen = []
        for part in value.split(","):
            name = aliases.get(part.strip().lower(), part.strip().lower())
            if name not in allowed:
                raise ValueError(f"{what} {_shown(part.strip())!r}: one of {', '.join(allowed)}")
            if name not in chosen:
                chosen.append(name)
        return chosen

    return parse


def _jobs(value: str) -> int:
    if not re.fullmatch(r"\s*[+-]?\d+\s*", value):
        raise ValueError(f"--jobs {_shown(value)!r} is not a whole number of processes")
    return _integer(value.strip(), "--jobs", 1, 64)


GEMM_PROBLEMS = _argument_type(_gemm_problems, "GEMM problems")
ATTENTION_SPEC = _argument_type(_attention_spec, "attention spec")
CACHE_DTYPES = _argument_type(_choices(("float16", "bfloat16"), {
    "fp16": "float16", "half": "float16", "bf16": "bfloat16"}, "dtype"), "dtypes")
CACHE_LOADS = _argument_type(_choices(("tma", "cp_async"), {"cp.async": "cp_async"}, "load"),
                             "loads")
B_LAYOUTS = _argument_type(_choices(("nk", "kn"), {}, "B layout"), "B layouts")
JOBS = _argument_type(_jobs, "jobs")


def _default_jobs() -> int:
    return max(1, min(4, os.cpu_count() or 1))


def _cache():
    from cutetma.runtime import cache

    return cache


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def _entry_dtypes(parts: dict) -> str:
    """The distinct element types of an entry's pointer arguments, in order (A, B, C)."""
    names = []
    for arg in parts.get("kernel", {}).get("args", []):
        match = re.match(r"Pointer\[(\w+)", arg) if isinstance(arg, str) else None
        if match and match[1] not in names:
            names.append(match[1])
    return ",".join(names) or "-"


def run_cache_info(args) -> int:
    """Where the compile cache is, whether it is on, what it holds (``--list``: each entry)."""
    cache = _cache()
    facts = cache.info()
    listed = cache.entries() if args.list else []
    current = cache.environment() if any("parts" in e for e in listed) else None
    rows = [{"key": e.get("key", Path(e["path"]).stem), "bytes": e.get("bytes", 0),
             "entry": e.get("parts", {}).get("kernel", {}).get("entry", "?"),
             "dtypes": _entry_dtypes(e.get("parts", {})),
             "config": e.get("parts", {}).get("kernel", {}).get("config", "?"),
             "current": e.get("parts", {}).get("env") == current,
             **({"error": e["error"]} if "error" in e else {})} for e in listed]
    if args.json:
        print(json.dumps({**facts, **({"list": rows} if args.list else {})}))
        return 0
    where = ("CUTETMA_CACHE_DIR" if os.environ.get("CUTETMA_CACHE_DIR")
             else "default; CUTETMA_CACHE_DIR moves it")
    print(f"folder:  {facts['dir']} ({where})")
    print("enabled: " + ("yes (CUTETMA_CACHE=0 turns it off)" if facts["enabled"]
                         else f"no (CUTETMA_CACHE={os.environ.get('CUTETMA_CACHE', '')})"))
    print(f"entries: {facts['entries']}, {_size(facts['bytes'])}")
    for row in rows:
        if "error" in row:
            print(f"{row['key'][:12]}  unreadable: {row['error']}")
            continue
        other = "" if row["current"] else "  (another build: never loaded by this one)"
        print(f"{row['key'][:12]}  {_size(row['bytes']):>8}  {row['entry']}  {row['dtypes']}  "
              f"{row['config']}{other}")
    return 0


def run_cache_clear(args) -> int:
    cache = _cache()
    removed = cache.clear()
    print(f"removed {removed} entr{'y' if removed == 1 else 'ies'} from {cache.cache_dir()}")
    return 0


def run_cache_warm(args) -> int:
    """Compile what ``cutetma.gemm`` / ``cutetma.attention`` would launch for the given
    problems (``runtime.warm``), in worker processes, into the compile cache."""
    cache = _cache()
    if not cache.enabled():
        raise UsageError(f"the compile cache is off (CUTETMA_CACHE="
                         f"{os.environ.get('CUTETMA_CACHE', '')}): nothing would be kept; "
                         "unset CUTETMA_CACHE to warm it")
    from cutetma.runtime import warm

    folder = cache.cache_dir()
    created = not folder.exists()
    with writing("cache folder", folder):
        folder.mkdir(parents=True, exist_ok=True)
        if not os.access(folder, os.W_OK | os.X_OK):
            raise PermissionError(13, "permission denied")
    if created:
        _say(f"created folder {folder}", to_stderr=True)
    neither = args.gemm is None and args.attention is None
    gpu = warm.gpu_present()
    entries = []
    if args.gemm is not None or neither:
        entries += warm.gemm_entries(args.gemm or warm.GEMM_PRESET, args.dtypes, args.load,
                                     args.b_layout, gpu)
    if args.attention is not None or neither:
        specs = [spec for group in args.attention or () for spec in group]
        entries += warm.attention_entries(specs or warm.ATTENTION_PRESET, args.dtypes,
                                          args.load)
    jobs = min(args.jobs, len(entries)) if entries else 1
    machine = ("this GPU's SM count, cluster occupancy and probed tile order" if gpu else
               f"no GPU here: GEMMs as on an H200 ({warm.H200_SMS} SMs, {warm.H200_SMS} // "
               "cluster size clusters, the default raster band below M = 256)")
    _say(f"warming {len(entries)} entries into {folder} with {jobs} worker"
         f"{'s' if jobs > 1 else ''} ({machine})", to_stderr=True)
    width = max((len(e.name()) for e in entries), default=0)
    counts = {"compiled": 0, "hit": 0, "failed": 0}

    def progress(done, total, entry, result):
        status, seconds, error = result
        counts[status] += 1
        shown = {"hit": "hit", "compiled": "compiled"}.get(status, f"FAILED: {error}")
        _say(f"[{done:>{len(str(total))}}/{total}] {entry.name():<{width}} {seconds:6.1f} s "
             f"{shown}", to_stderr=True)

    start = time.perf_counter()
    warm.warm(entries, jobs, progress)
    seconds = time.perf_counter() - start
    failed = f", {counts['failed']} FAILED" if counts["failed"] else ""
    print(f"{len(entries)} entries: {counts['compiled']} compiled, {counts['hit']} already "
          f"there{failed}; {seconds:.1f} s with {jobs} worker{'s' if jobs > 1 else ''} "
          f"({folder})")
    return 1 if counts["failed"] else 0


# --------------------------------------------------------------------------- parser
def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="cutetma", description="Where TMA puts bytes in shared memory.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    swizzle_parser = commands.add_parser("swizzle", help="swizzle placement and bank conflicts")
    swizzle_commands = swizzle_parser.add_subparsers(dest="what", required=True, metavar="WHAT")

    def add_mode_and_dtype(p):
        p.add_argument("--mode", type=MODE, required=True, help=", ".join(swizzle.MODE_NAMES))
        p.add_argument(
            "--dtype", type=DTYPE, required=True, help=", ".join(sorted(swizzle.DTYPE_BYTES))
        )
        p.add_argument("--json", action="store_true", help="print JSON instead of text")
        p.add_argument("--png", metavar="FILE.png", help="also draw a picture into FILE.png")

    map_parser = swizzle_commands.add_parser(
        "map", help="physical sector of every 16-byte sector of a 2D box"
    )
    add_mode_and_dtype(map_parser)
    map_parser.add_argument(
        "--box",
        type=BOX,
        required=True,
        metavar="ROWSxCOLS",
        help=f"box in elements, inner dimension last, each 1..{swizzle.MAX_BOX_DIM}, e.g. 8x64",
    )
    map_parser.set_defaults(run=run_map)

    banks_parser = swizzle_commands.add_parser(
        "banks", help="bank sectors hit by one 16-byte column read over several rows"
    )
    add_mode_and_dtype(banks_parser)
    banks_parser.add_argument(
        "--row-bytes",
        type=ROW_BYTES,
        required=True,
        metavar="N",
        help=f"tile row width in bytes, a multiple of 16 up to {MAX_ROW_BYTES}, e.g. 256",
    )
    banks_parser.add_argument(
        "--column",
        type=COLUMN,
        required=True,
        metavar="C",
        help="16-byte sector column read in every row",
    )
    banks_parser.add_argument(
        "--rows", type=ROWS, required=True, metavar="A-B",
        help=f"rows read, inclusive, within 0-{MAX_ROWS - 1}, e.g. 0-7",
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
    figures_parser.add_argument(
        "--out", required=True, metavar="DIR",
        help="folder for the PNGs (created if only it is missing, and said so)")
    figures_parser.set_defaults(run=run_figures)

    html_parser = swizzle_commands.add_parser(
        "html", help="write the chapter's three figures as one interactive HTML page"
    )
    html_parser.add_argument("--out", required=True, metavar="FILE",
                             help="the page to write, in a folder that exists")
    html_parser.set_defaults(run=run_html)

    hw_parser = swizzle_commands.add_parser(
        "hardware", help="(GPU) what the hardware writes vs the model and the CuTe algebra"
    )
    hw_parser.add_argument("--quick", action="store_true", help="one box per mode and width")
    hw_parser.add_argument("--out", metavar="DIR",
                           help="also write the rows to DIR/hw_swizzle.json "
                                "(e.g. benchmarks/results; default: print only)")
    hw_parser.set_defaults(run=run_hardware)

    tour_parser = commands.add_parser("tour", help="the chapter step by step")
    tour_parser.add_argument(
        "--out", default=TOUR_OUT, metavar="DIR",
        help=f"folder for the figures, created if only it is missing (default: ./{TOUR_OUT})",
    )
    tour_parser.set_defaults(run=tour)

    cache_parser = commands.add_parser(
        "cache", help="the on-disk compile cache: info, clear, warm")
    cache_commands = cache_parser.add_subparsers(dest="what", required=True, metavar="WHAT")
    info_parser = cache_commands.add_parser(
        "info", help="the folder, whether it is on, entries and bytes")
    info_parser.add_argument("--list", action="store_true",
                             help="one line per entry: key, size, entry point, dtypes, config")
    info_parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    info_parser.set_defaults(run=run_cache_info)
    clear_parser = cache_commands.add_parser("clear", help="remove every entry")
    clear_parser.set_defaults(run=run_cache_clear)
    warm_parser = cache_commands.add_parser(
        "warm", help="compile what cutetma.gemm / cutetma.attention launch for given problems",
        description="Compile the kernels cutetma.gemm and cutetma.attention would launch for "
                    "these problems into the compile cache, so later processes load them from "
                    "disk. With neither --gemm nor --attention: both preset lists; with one of "
                    "them: only that one ('preset' names its preset list).")
    warm_parser.add_argument(
        "--gemm", type=GEMM_PROBLEMS, action="extend", metavar="MxNxK[,MxNxK...]",
        help="GEMM problems, A (M, K) and B (N, K) (default: 4096^3, 8192^3 and the linear "
             "layers of a Llama-3-8B-like model at 16 to 4096 tokens)")
    warm_parser.add_argument(
        "--attention", type=ATTENTION_SPEC, action="extend", nargs="+", metavar="d[,causal]",
        help="attention head dims, each optionally causal, e.g. 128 128,causal (default: "
             "64, 128 and 256, causal and not)")
    warm_parser.add_argument("--dtypes", type=CACHE_DTYPES, default=["float16", "bfloat16"],
                             metavar="float16,bfloat16", help="(default: both)")
    warm_parser.add_argument("--load", type=CACHE_LOADS, default=["tma"], metavar="tma,cp_async",
                             help="producers (default: tma)")
    warm_parser.add_argument(
        "--b-layout", type=B_LAYOUTS, default=["nk"], metavar="nk,kn",
        help="B as (N, K), gemm's default trans_b=True, or (K, N), trans_b=False "
             "(torch.matmul's layout) (default: nk)")
    warm_parser.add_argument("--jobs", type=JOBS, default=_default_jobs(), metavar="N",
                             help=f"worker processes (default: {_default_jobs()}, "
                                  "at most 4 and the CPU count)")
    warm_parser.set_defaults(run=run_cache_warm)
    return parser


def _attach_dash_values(argv: list[str]) -> list[str]:
    """``--box -8x64`` -> ``--box=-8x64``: argparse takes a value starting with '-' for an
    option; joined, it reaches the type check and gets a message about the number."""
    joined: list[str] = []
    i = 0
    while i < len(argv):
        if argv[i] in VALUE_OPTIONS and i + 1 < len(argv) and re.match(r"-\d", argv[i + 1]):
            joined.append(f"{argv[i]}={argv[i + 1]}")
            i += 2
        else:
            joined.append(argv[i])
            i += 1
    return joined


def _error(message) -> int:
    message = " ".join(str(message).split())
    print(f"cutetma: error: {message}", file=sys.stderr)
    return USAGE_ERROR


def main(argv=None) -> int:
    argv = _attach_dash_values(list(sys.argv[1:] if argv is None else argv))
    try:
        try:
            args = build_parser().parse_args(argv)
        except SystemExit as exc:  # --help and --version print and stop: that is success
            return exc.code if isinstance(exc.code, int) else 0
        return args.run(args)
    except (UsageError, ValueError) as exc:
        # ValueError is how cutetma.swizzle names a broken TMA rule: a user mistake too.
        return _error(exc)
    except KeyboardInterrupt:
        print("\ncutetma: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # `cutetma ... | head`: the reader left; stop quietly, as other command-line tools do
        with contextlib.suppress(OSError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        return 141
