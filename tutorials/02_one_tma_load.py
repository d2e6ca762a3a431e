"""02 - One TMA load and its mbarrier: descriptor vs per-copy arguments, expect-tx, phases.

Run: ``python tutorials/02_one_tma_load.py``. On an H200 it loads a box and reads back the
shared-memory bytes; on a CPU machine it compiles the same kernel for sm_90a and shows the
PTX instead (the GPU part is skipped, saying why).

**Two kinds of information.** The thread that issues a TMA copy never loops over elements.
It hands the hardware

* a *tensor map descriptor* (``CUtensorMap``, 128 bytes, built once on the host and passed
  to the kernel as a ``__grid_constant__`` parameter): element type, global shape and
  strides, the box shape of one copy, the swizzle mode. "How is this tensor organized?"
* per-copy *arguments*: the box's coordinates in the global tensor, the shared-memory
  destination, and the mbarrier to signal. "Where does this copy begin, and where does it
  land?"

In the PTX below the descriptor is the ``.param .align 64 .b8 ...[128]`` kernel parameter;
the copy itself is one ``cp.async.bulk.tensor.2d`` whose operands are exactly the per-copy
arguments: ``[smem], [descriptor, {col, row}], [mbarrier]`` (coordinates innermost first).

**The mbarrier handshake.** One phase of an mbarrier completes when both its pending arrival
count and its pending transaction bytes reach zero. The producer thread does one
``mbarrier.arrive.expect_tx(bytes)``: its arrival (the barrier was initialised with count 1)
plus the number of bytes the TMA unit will deliver. Each completed copy subtracts its bytes
(``complete_tx``). Consumers ``try_wait.parity`` on the phase: they may read the tile only
after every byte has landed. The chapter's example: tiles A and B of 2048 bytes each on one
barrier -> ``expect_tx(4096)``. Here: one 64x64 fp16 box -> ``expect_tx(8192)``.

**Phases.** A barrier is reused: phase 0, 1, 0, 1... A consumer waits for the parity of the
phase it needs, so in a ring of S stages, k-tile ``k`` uses stage ``k % S`` and waits for
parity ``(k // S) % 2``.

**The cp.async counterpart.** Without TMA, every one of 128 threads computes its own
(swizzled) shared-memory address and issues 16-byte ``cp.async.cg`` copies; the barrier is
initialised with 128 arrivals, one ``cp.async.mbarrier.arrive.noinc`` per thread when its
copies land. Same layout, same barrier wait; 512 instructions instead of one.

Kernels: ``cutetma.kernels.tile_copy.SmemProbe`` (through ``cutetma.smem_image`` on the GPU,
``cutetma.kernels.build.compile_probe`` on the CPU).

Measured on the H200 (NVIDIA H200, torch 2.11.0+cu130, nvidia-cutlass-dsl 4.8.1,
2026-11-30, `python benchmarks/gpu_session.py --only tutorials`), the GPU part:

    == 3. On the GPU: the bytes TMA and cp.async wrote, against the model
         tma: 8192 shared-memory bytes, equal to the model's: True
    cp_async: 8192 shared-memory bytes, equal to the model's: True

    Takeaway: one thread issues 1 cp.async.bulk.tensor for the whole 8192-byte box; cp.async needs 4 copies in each of 128 threads (512 x 16 B). The descriptor carries the tensor's shape, strides, box and swizzle; the copy carries only coordinates, the destination and the mbarrier, which completes when expect_tx(8192) bytes have arrived. on the H200 TMA and cp.async wrote the same 8192 bytes as the model: True.
"""

from __future__ import annotations

import re
import sys

from cutetma import swizzle as hw
from cutetma.kernels.build import compile_probe, gpu_unavailable
from cutetma.kernels.tile_copy import THREADS, ProbeConfig

BOX = (64, 64)  # rows x cols of fp16: 64 rows of 128 bytes, one 128B swizzle span wide
TMA = ProbeConfig(2, "128B", *BOX, load="tma")
CP_ASYNC = ProbeConfig(2, "128B", *BOX, load="cp_async")


def heading(title: str) -> None:
    print(f"\n== {title}")


def what_it_would_do() -> None:
    heading("1. What one TMA load needs")
    x_shape = (200, 136)
    print(f"global tensor: fp16 {x_shape[0]}x{x_shape[1]}, row stride {x_shape[1] * 2} B "
          f"(a multiple of 16: a TMA rule)")
    print("descriptor (host, once):  dtype fp16, dims (cols, rows) = "
          f"({x_shape[1]}, {x_shape[0]}), row stride {x_shape[1] * 2} B, box "
          f"{BOX[1]}x{BOX[0]} (cols x rows), swizzle 128B")
    print("per-copy arguments:       box (1, 1) -> coordinates {col 64, row 64}, shared-memory "
          "address of the tile, the mbarrier")
    print(f"expect_tx bytes:          {TMA.box_bytes} = {BOX[0]} x {BOX[1]} x 2 "
          f"(the chapter's A + B example: 2048 + 2048 = 4096)")
    print(f"shared memory:            {TMA.smem_bytes} B, aligned to {TMA.smem_alignment} B "
          f"(a 128B-swizzled box starts on a {hw.MODES['128B'].atom_bytes}-B atom)")
    stages = 2
    ring = ", ".join(f"k{k}: stage {k % stages} parity {(k // stages) % 2}" for k in range(6))
    print(f"phases in a {stages}-stage ring: {ring}")


def _short(line: str) -> str:
    line = re.sub(r"kernel_cutlass_\w*?(_param_\d+)", r"<kernel>\1", line.strip())
    return re.sub(r"\s+", " ", line)


def _first(ptx: str, pattern: str) -> str | None:
    for line in ptx.splitlines():
        if re.search(pattern, line):
            return _short(line)
    return None


def the_ptx() -> tuple[int, int]:
    heading("2. The PTX that matters (compiled for sm_90a, no GPU needed)")
    tma = compile_probe(TMA).ptx
    steps = [
        ("descriptor (kernel parameter)", r"\.param \.align 64 \.b8 \w+\[128\]"),
        ("barrier, count 1", r"mbarrier\.init"),
        ("one arrival + expected bytes", r"mbarrier\.arrive\.expect_tx"),
        ("the copy", r"cp\.async\.bulk\.tensor"),
        ("consumers wait on the phase", r"mbarrier\.try_wait\.parity"),
    ]
    notes = {"the copy": "operands: [smem dst], [descriptor, {col, row}], [mbarrier]"}
    expect = re.search(r"expect_tx\S*\s+\S+, \[[^\]]+\], (%r\d+);", tma)
    value = expect and re.search(rf"mov\.b32\s+{re.escape(expect.group(1))}, (\d+);", tma)
    if value:
        notes["one arrival + expected bytes"] = (f"{expect.group(1)} = {value.group(1)} bytes "
                                                 f"({_short(value.group(0))})")
    print("TMA:")
    for what, pattern in steps:
        print(f"  {what:<31} {_first(tma, pattern)}")
        if what in notes:
            print(f"  {'':<31}   ^ {notes[what]}")

    cp = compile_probe(CP_ASYNC).ptx
    per_thread = cp.count("cp.async.cg.shared.global")
    print(f"cp.async ({THREADS} threads, each its own swizzled addresses):")
    copy, arrive, wait = (_first(cp, p) for p in (
        r"cp\.async\.cg", r"cp\.async\.mbarrier\.arrive", r"mbarrier\.try_wait\.parity"))
    print(f"  {'16-byte copies, per thread':<31} {per_thread} x {copy}")
    print(f"  {'arrive when they land':<31} {arrive}")
    print(f"  {'consumers wait the same way':<31} {wait}")
    bulk = tma.count("cp.async.bulk.tensor")
    return bulk, per_thread


def on_the_gpu() -> str:
    heading("3. On the GPU: the bytes TMA and cp.async wrote, against the model")
    import torch

    import cutetma
    from cutetma.swizzle import model_image

    torch.manual_seed(0)
    x = torch.randn(200, 136, device="cuda", dtype=torch.float16)
    box = x[64:128, 64:128].cpu().numpy()  # box (1, 1)
    model = model_image(box, "128B")
    same = {}
    for load in ("tma", "cp_async"):
        image = cutetma.smem_image(x, BOX, swizzle="128B", load=load, tile=(1, 1))
        torch.cuda.synchronize()
        got = image.cpu().numpy()
        same[load] = bool((got == model).all())
        print(f"{load:>8}: {got.size} shared-memory bytes, equal to the model's: {same[load]}")
    return (f"on the H200 TMA and cp.async wrote the same {model.size} bytes as the model: "
            f"{same['tma'] and same['cp_async']}")


def main() -> int:
    print("02 - one TMA load and its mbarrier")
    what_it_would_do()
    bulk, per_thread = the_ptx()
    reason = gpu_unavailable()
    if reason:
        heading("3. On the GPU")
        print(f"skipped: {reason}. On an H200 this step loads box (1, 1) of a 200x136 fp16 "
              "tensor with cutetma.smem_image(load='tma' and 'cp_async') and compares the "
              "shared-memory bytes with the model.")
        measured = "GPU part skipped"
    else:
        measured = on_the_gpu()
    heading("Takeaway:")
    print(f"Takeaway: one thread issues {bulk} cp.async.bulk.tensor for the whole "
          f"{TMA.box_bytes}-byte box; cp.async needs {per_thread} copies in each of {THREADS} "
          f"threads ({per_thread * THREADS} x 16 B). The descriptor carries the tensor's shape, "
          f"strides, box and swizzle; the copy carries only coordinates, the destination and the "
          f"mbarrier, which completes when expect_tx({TMA.box_bytes}) bytes have arrived. "
          f"{measured}.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
