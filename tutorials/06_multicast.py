"""06 - Multicast in a cluster: one L2 read, N shared-memory copies.

Run: ``python tutorials/06_multicast.py``. On a CPU machine it compiles the multicast probe
for clusters of 2 and 4 CTAs and shows the PTX and the mask arithmetic; on an H200 it also
loads a box into every CTA of the cluster and compares the images (skipped elsewhere).

**The idea.** In a GEMM, the CTAs of one row of output tiles all read the same tile of A;
those of one column, the same tile of B. On Hopper, CTAs launched as a *cluster* (up to 16,
co-scheduled on one GPC) can address each other's shared memory, and a TMA load can be
*multicast*: fetched from L2 once, written into the shared memory of every CTA named in a
16-bit mask (``.multicast::cluster``, bit i = CTA rank i of the cluster).

**How the probe does it.** A cluster of N CTAs loads one 64x64 fp16 box (8192 bytes). Each
CTA issues only its 1/N slice of the box (64/N rows), with the mask ``(1 << N) - 1``, so
every slice lands in all N CTAs. Every CTA therefore receives the *whole* box, and each one
arms its own mbarrier with ``expect_tx(8192)``, not 8192/N. One more rule: a CTA's barrier
must be initialised before a partner's multicast can land on it, hence a cluster barrier
(``barrier.cluster.arrive`` / ``wait``) after the init and before any copy.

    per CTA issued   8192 / N bytes         L2 -> SM traffic   8192 bytes (not N x 8192)
    per CTA received 8192 bytes             shared memory      N x 8192 bytes written

**The counterparts.** Without multicast each CTA loads the box itself: N x 8192 bytes read
from L2. The probe also has ``load="dsm"``: CTA 0 loads by TMA and the others copy it over
the cluster's distributed shared memory (``mapa`` + ``ld.shared::cluster``), a software
broadcast. cp.async cannot multicast at all: it writes only its own CTA's shared memory.

Kernel: ``cutetma.kernels.tile_copy.SmemProbe`` with ``ProbeConfig(load="tma_multicast")``
(through ``cutetma.smem_image(..., load="tma", cluster=N)`` on the GPU,
``cutetma.kernels.build.compile_probe`` on the CPU).

Measured on the H200 (NVIDIA H200, torch 2.11.0+cu130, nvidia-cutlass-dsl 4.8.1,
2026-11-30, `python benchmarks/gpu_session.py --only tutorials`), the GPU part:

    == 3. On the GPU: every CTA's shared memory, against the model
    single CTA, plain TMA: equal to the model: True
    tma_multicast x2: 2 CTAs x 8192 bytes, each equal to the model: [True, True]
    tma_multicast x4: 4 CTAs x 8192 bytes, each equal to the model: [True, True, True, True]
              dsm x2: 2 CTAs x 8192 bytes, each equal to the model: [True, True]

    Takeaway: with a cluster of N, each CTA issues 1/N of the box with mask (1 << N) - 1 (PTX: 3 for N=2, 15 for N=4) and still expects all 8192 bytes on its own barrier: L2 is read once, 8192 bytes instead of N x 8192, and N shared-memory copies appear. on the H200 8 of 8 CTA images equal the single-CTA model.
"""

from __future__ import annotations

import re
import sys

from cutetma.kernels.build import compile_probe, gpu_unavailable
from cutetma.kernels.tile_copy import ProbeConfig

BOX = (64, 64)
BOX_BYTES = BOX[0] * BOX[1] * 2
CLUSTERS = (2, 4)


def heading(title: str) -> None:
    print(f"\n== {title}")


def mask_arithmetic() -> None:
    heading("1. Masks and bytes for one 64x64 fp16 box")
    print(f"{'cluster':>7} {'mask':>8} {'rows per CTA':>12} {'issued per CTA':>14} "
          f"{'expect_tx per CTA':>17} {'L2 reads':>8} {'without multicast':>17}")
    for n in CLUSTERS:
        mask = (1 << n) - 1
        print(f"{n:>7} {mask:>#8b} {BOX[0] // n:>12} {BOX_BYTES // n:>14} {BOX_BYTES:>17} "
              f"{BOX_BYTES:>8} {n * BOX_BYTES:>17}")
    for n in CLUSTERS:
        slices = ", ".join(f"CTA {r}: rows {r * BOX[0] // n}-{(r + 1) * BOX[0] // n - 1}"
                           for r in range(n))
        print(f"cluster {n}: {slices}; each slice goes to every CTA of mask "
              f"{(1 << n) - 1:#06b}")


def the_ptx() -> dict:
    heading("2. Compiled for sm_90a")
    masks = {}
    for n in CLUSTERS:
        ptx = compile_probe(ProbeConfig(2, "128B", *BOX, load="tma_multicast", cluster=n)).ptx
        copy = next(ln.strip() for ln in ptx.splitlines() if ".multicast::cluster" in ln)
        operand = re.search(r"\],\s*(%rs\d+),", copy)
        value = operand and re.search(rf"mov\.b16\s+{re.escape(operand.group(1))}, (\d+);", ptx)
        expect = re.search(r"mov\.b32\s+%r\d+, (\d+);\s*\n\s*mbarrier\.arrive\.expect_tx", ptx)
        masks[n] = int(value.group(1)) if value else None
        print(f"cluster {n}:")
        print("  " + re.sub(r"[ \t]+", " ", copy))
        if masks[n] is None:
            print("  mask operand: not found")
        else:
            print(f"  mask operand {operand.group(1)} = {masks[n]} ({masks[n]:#06b})")
        print(f"  expect_tx per CTA = {expect.group(1) if expect else '?'} bytes; cluster "
              f"barriers: {ptx.count('barrier.cluster.arrive')} arrive / "
              f"{ptx.count('barrier.cluster.wait')} wait")
    return masks


def on_the_gpu() -> str:
    heading("3. On the GPU: every CTA's shared memory, against the model")
    import numpy as np
    import torch

    import cutetma
    from cutetma.swizzle import model_image

    torch.manual_seed(0)
    x = torch.randn(200, 136, device="cuda", dtype=torch.float16)
    model = model_image(x[64:128, 64:128].cpu().numpy(), "128B")
    single = cutetma.smem_image(x, BOX, load="tma", tile=(1, 1)).cpu().numpy()
    print(f"single CTA, plain TMA: equal to the model: {bool((single == model).all())}")
    ok = []
    for load, n in [("tma", 2), ("tma", 4), ("dsm", 2)]:  # tma with a cluster: multicast
        images = cutetma.smem_image(x, BOX, load=load, cluster=n, tile=(1, 1))
        torch.cuda.synchronize()
        images = images.cpu().numpy()
        same = [bool(np.array_equal(im, model)) for im in images]
        ok += same
        name = "tma_multicast" if load == "tma" else load
        print(f"{name:>13} x{n}: {images.shape[0]} CTAs x {images.shape[1]} bytes, each equal "
              f"to the model: {same}")
    return f"on the H200 {sum(ok)} of {len(ok)} CTA images equal the single-CTA model"


def main() -> int:
    print("06 - multicast in a cluster")
    mask_arithmetic()
    masks = the_ptx()
    reason = gpu_unavailable()
    if reason:
        heading("3. On the GPU")
        print(f"skipped: {reason}. On an H200 this step loads box (1, 1) of a 200x136 fp16 "
              "tensor with cutetma.smem_image(load='tma', cluster=2 and 4: "
              "multicast) and load='dsm', and compares every CTA's image with the model.")
        measured = "GPU part skipped"
    else:
        measured = on_the_gpu()
    heading("Takeaway:")
    print(f"Takeaway: with a cluster of N, each CTA issues 1/N of the box with mask "
          f"(1 << N) - 1 (PTX: {', '.join(f'{masks[n]} for N={n}' for n in CLUSTERS)}) and "
          f"still expects all {BOX_BYTES} bytes on its own barrier: L2 is read once, "
          f"{BOX_BYTES} bytes instead of N x {BOX_BYTES}, and N shared-memory copies appear. "
          f"{measured}.")
    ok = all(masks[n] == (1 << n) - 1 for n in CLUSTERS)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
