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
    cutetma cache warm      [--gemm MxNxK,...] [--attention d[,causal] ...] [--paged P,...]
                            [--dtypes float16,bfloat16] [--load tma,cp_async] [--jobs N]
    cutetma --version

Every user mistake -- an argparse complaint, a ``ValueError`` naming the TMA rule the model
refuses, an output path that cannot be written -- becomes exactly one ``cutetma: error: ...``
line on stderr and exit code 2. Output paths are checked before anything is computed: no
folder is created except the one ``figures`` / ``tour`` / ``hardware --out`` names and the
compile cache's folder that ``cache warm`` fills (each announced), no file is written
anywhere but where it was asked to go, and every file written is named on the way out.

This package holds the parser and ``main``; the commands live below it, each importing only
the modules under it: ``args`` (argument types, output-path checks, ``UsageError``) <-
``swizzle_cmds`` (map, banks, figures, html, hardware) <- ``tour_cmd``; ``args`` <-
``cache_cmds`` (info, clear, warm).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys

from cutetma import __version__, swizzle
from cutetma.cli.args import (
    BOX,
    COLUMN,
    DTYPE,
    MAX_ROW_BYTES,
    MAX_ROWS,
    MODE,
    ROW_BYTES,
    ROWS,
    USAGE_ERROR,
    VALUE_OPTIONS,
    UsageError,
    _Parser,
    output_file,
    output_folder,
    writing,
)
from cutetma.cli.cache_cmds import (
    ATTENTION_SPEC,
    B_LAYOUTS,
    CACHE_DTYPES,
    CACHE_LOADS,
    GEMM_PROBLEMS,
    JOBS,
    PAGE_SIZES,
    _default_jobs,
    run_cache_clear,
    run_cache_info,
    run_cache_warm,
)
from cutetma.cli.swizzle_cmds import (
    CHAPTER_BANKS,
    CHAPTER_GROUPED,
    CHAPTER_MAP,
    FIGURE_NAMES,
    bank_figure_title,
    bank_reports,
    bank_text,
    run_banks,
    run_figures,
    run_hardware,
    run_html,
    run_map,
    sector_map_dict,
    sector_map_text,
    write_chapter_figures,
)
from cutetma.cli.tour_cmd import (
    TOUR_OUT,
    TOUR_STEPS,
    TourLog,
    _tour_algebra,
    _tour_banks,
    _tour_compile,
    _tour_figures,
    _tour_hardware,
    _tour_map,
    tour,
)

# re-exported: the names ``cutetma.cli`` had as one module. Patch a command's helpers where
# they are used (``cutetma.cli.tour_cmd._load_dsl``), not here.
__all__ = [
    "BOX", "CHAPTER_BANKS", "CHAPTER_GROUPED", "CHAPTER_MAP", "COLUMN", "DTYPE",
    "FIGURE_NAMES", "MAX_ROWS", "MAX_ROW_BYTES", "MODE", "ROWS", "ROW_BYTES", "TOUR_OUT",
    "TOUR_STEPS", "TourLog", "USAGE_ERROR", "UsageError", "bank_figure_title", "bank_reports",
    "bank_text", "build_parser", "main", "output_file", "output_folder", "run_banks",
    "run_cache_clear", "run_cache_info", "run_cache_warm", "run_figures", "run_hardware",
    "run_html", "run_map", "sector_map_dict", "sector_map_text", "tour", "write_chapter_figures",
    "writing", "_tour_algebra", "_tour_banks", "_tour_compile", "_tour_figures",
    "_tour_hardware", "_tour_map",
]


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
    warm_parser.add_argument(
        "--paged", type=PAGE_SIZES, metavar="PAGE[,PAGE...]",
        help="also cutetma.attention_with_kvcache's kernels for these page sizes (prefill, "
             "decode packed / split, varlen queries), for --attention's head dims")
    warm_parser.add_argument(
        "--backward", action="store_true",
        help="also the attention backward (training) for --attention's head dims")
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
