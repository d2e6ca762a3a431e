"""``cutetma tour``: the chapter step by step (``TOUR_STEPS``), each step printing its part
into a ``TourLog``, then a summary of what ran, compiled, failed and was skipped.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import sys
import time
from pathlib import Path

from cutetma import swizzle
from cutetma.cli.args import output_folder
from cutetma.cli.swizzle_cmds import (
    CHAPTER_BANKS,
    CHAPTER_MAP,
    _build,
    _gpu_unavailable,
    bank_reports,
    run_hardware,
    sector_map_text,
    write_chapter_figures,
)
from cutetma.viz import text

TOUR_OUT = "cutetma-tour"


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
