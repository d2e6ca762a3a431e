"""05 - A two-stage, then an N-stage pipeline: what a bubble costs, measured.

Run: ``python tutorials/05_pipeline.py``. On a CPU machine it prints the shared-memory
arithmetic that decides how many stages fit and compiles the GEMM with 2 and with the most
stages (timing skipped, saying why); on an H200 it times the same GEMM with 2, 3, 4 and the
most stages, by TMA and by cp.async.

**The bubble.** In a GEMM mainloop the Tensor Cores consume one k-tile of A and B per step.
If the next k-tile is not in shared memory when the current one is finished, the Tensor
Cores idle: a *bubble*. A load takes roughly a fixed latency (hundreds of cycles from L2,
more from HBM); one k-tile of MMA takes a fixed compute time. With one buffer, every step
pays the whole latency. With two stages

    time t:    MMA reads stage 0    TMA fills stage 1
    time t+1:  MMA reads stage 1    TMA fills stage 0

the load of k+1 overlaps the MMA of k, and the bubble disappears only if one k-tile of MMA
takes longer than one load. When it does not, more stages let more loads be in flight:
roughly ``stages - 1 >= load latency / MMA time per k-tile`` (Little's law).

**The handshake per stage** is a (full, empty) pair of mbarriers: the producer waits *empty*,
arms *full* with the stage's bytes (``expect_tx``) and issues the TMA copies; the consumer
waits *full*, runs WGMMA, and arrives on *empty* when its WGMMA no longer reads the stage. The
GEMM keeps one WGMMA group in flight, so it releases the *previous* stage: it needs at least
two stages.

**How many stages fit.** Each stage holds one k-tile of A and of B:
``(tile_m + tile_n) x 64 x 2`` bytes of fp16; the epilogue keeps its own shared buffers (four
sub-tiles, or two where the two freed make room for one more stage: ``epi_buffers``); the
rest of the 227 KiB of shared memory per CTA becomes stages (``GemmConfig.num_stages``).
Depth matters most where B streams from DRAM: at M = 256 a seventh stage made 128 x 96
tiles about 10% faster on the H200 (``docs/design.md``, "Stages and epilogue buffers").

The cp.async counterpart: the same kernel with its producer swapped
(``GemmConfig(load="cp_async")``): 128 producer threads issue 16-byte copies instead of one
thread issuing TMA, which costs issue slots and registers, so it tends to need more stages
to hide the same latency.

Kernel: ``cutetma.kernels.gemm_sm90.HopperGemm``. ``cutetma.gemm`` chooses the most stages
by itself; this tutorial hands it ``config=GemmConfig(tile_m=128, tile_n=128, stages=s)``
instead, so the kernel runs with exactly ``s`` stages (compiled once per configuration, then
launched on the current stream), in the scheduler's default tile order
(``cutetma.runtime.placement.switched_off()``: no order chosen for the card).

Measured on the H200 (NVIDIA H200, torch 2.11.0+cu130, nvidia-cutlass-dsl 4.8.1,
2026-11-30, `python benchmarks/gpu_session.py --only tutorials`), the GPU part:

    == 3. On the GPU: C = A B^T, 8192x8192x8192 fp16, tile (128, 128), by stages
         tma stages=2:   3.740 ms   294.0 TFLOP/s  (max |C - A@B^T| = 0)
         tma stages=3:   2.005 ms   548.3 TFLOP/s  (max |C - A@B^T| = 0)
         tma stages=4:   1.688 ms   651.3 TFLOP/s  (max |C - A@B^T| = 0)
         tma stages=6:   2.009 ms   547.2 TFLOP/s  (max |C - A@B^T| = 0)
    cp_async stages=2:   4.562 ms   241.0 TFLOP/s  (max |C - A@B^T| = 0)
    cp_async stages=6:   2.228 ms   493.5 TFLOP/s  (max |C - A@B^T| = 0)

    Takeaway: a stage is (tile_m + tile_n) x 64 x 2 bytes, so a 128x128 tile fits 6 stages in 227 KiB (12 mbarriers: a full/empty pair each, vs 4 for two stages). Two stages overlap one load with one MMA step; more stages keep more loads in flight to cover the load latency. on the H200 two stages cost tma 122% over its best, cp_async 105% over its best.
"""

from __future__ import annotations

import sys

from _common import time_ms  # tutorials/_common.py: CUDA-event timing

from cutetma.kernels import build
from cutetma.kernels.build import gpu_unavailable
from cutetma.kernels.gemm_config import GemmConfig
from cutetma.kernels.smem import smem_capacity

SMEM_KIB = 227
TILES = [(128, 256), (128, 128), (64, 256), (64, 128)]
TIMED_TILE = (128, 128)  # the most stages (6) of the big tiles: room to see the trend
MNK = (8192, 8192, 8192)


def heading(title: str) -> None:
    print(f"\n== {title}")


def stage_arithmetic():
    heading("1. Shared memory per stage, and how many stages fit (fp16 in, fp16 out)")
    capacity = smem_capacity()  # 227 KiB, as the DSL states it
    print(f"capacity {capacity} B ({SMEM_KIB} KiB), 1024 B reserved for barriers/alignment")
    print(f"{'tile':>9} {'stage bytes':>11} {'epilogue':>9} {'stages':>6} "
          f"{'flop per loaded byte':>20}")
    for tm, tn in TILES:
        cfg = GemmConfig(tile_m=tm, tile_n=tn)
        stage, epi, n = cfg.stage_bytes(), cfg.epi_bytes(2), cfg.num_stages(2)
        intensity = 2 * tm * tn * cfg.tile_k / stage
        print(f"{tm:>4}x{tn:<4} {stage:>11} {epi:>9} {n:>6} {intensity:>20.1f}"
              f"   = ({capacity} - 1024 - {epi}) // {stage}")
    return GemmConfig(tile_m=TIMED_TILE[0], tile_n=TIMED_TILE[1]).num_stages(2)


def barriers_in_the_ptx(most: int) -> dict:
    heading(f"2. The ring in the PTX: one (full, empty) mbarrier pair per stage "
            f"(tile {TIMED_TILE[0]}x{TIMED_TILE[1]})")
    found = {}
    for stages in (2, most):
        cfg = GemmConfig(tile_m=TIMED_TILE[0], tile_n=TIMED_TILE[1], stages=stages)
        ptx = build.compile_gemm(cfg).ptx
        found[stages] = ptx.count("mbarrier.init")
        print(f"stages={stages}: {found[stages]} mbarrier.init, "
              f"{ptx.count('mbarrier.arrive.expect_tx')} expect_tx (one per k-tile, in the "
              f"producer loop), {ptx.count('wgmma.mma_async')} wgmma per k-tile (64 / 16)")
    return found


def on_the_gpu(most: int) -> str:
    import torch

    import cutetma
    from cutetma.runtime import placement

    m, n, k = MNK
    heading(f"3. On the GPU: C = A B^T, {m}x{n}x{k} fp16, tile {TIMED_TILE}, by stages")
    torch.manual_seed(0)
    a = torch.randn(m, k, device="cuda", dtype=torch.float16)
    b = torch.randn(n, k, device="cuda", dtype=torch.float16)
    c = torch.empty(m, n, device="cuda", dtype=torch.float16)
    ref = (a @ b.T).float()
    flops = 2 * m * n * k
    rows = []
    plan = [("tma", s) for s in sorted({2, 3, 4, most})] + [("cp_async", 2), ("cp_async", most)]
    for load, stages in plan:
        cfg = GemmConfig(tile_m=TIMED_TILE[0], tile_n=TIMED_TILE[1], load=load, stages=stages)

        def run(cfg=cfg):
            return cutetma.gemm(a, b, out=c, config=cfg)

        with placement.switched_off():  # the default tile order, the same for every row
            run()
            torch.cuda.synchronize()
            err = (c.float() - ref).abs().max().item()
            ms = time_ms(run)
        rows.append((load, stages, ms))
        print(f"{load:>8} stages={stages}: {ms:7.3f} ms  {flops / ms / 1e9:6.1f} TFLOP/s  "
              f"(max |C - A@B^T| = {err:.3g})")
    best = {load: min(ms for ld, _, ms in rows if ld == load) for load in ("tma", "cp_async")}
    two = {load: next(ms for ld, s, ms in rows if ld == load and s == 2)
           for load in ("tma", "cp_async")}
    return ("on the H200 two stages cost "
            + ", ".join(f"{load} {100 * (two[load] / best[load] - 1):.0f}% over its best"
                        for load in ("tma", "cp_async")))


def main() -> int:
    print("05 - pipelines: two stages, then N")
    most = stage_arithmetic()
    found = barriers_in_the_ptx(most)
    reason = gpu_unavailable()
    if reason:
        heading("3. On the GPU")
        print(f"skipped: {reason}. On an H200 this step times C = A B^T ({MNK[0]}^3 fp16, tile "
              f"{TIMED_TILE}) with 2, 3, 4 and {most} stages (TMA) and 2 and {most} (cp.async) "
              "with CUDA events.")
        measured = "Timing skipped: no Hopper GPU here"
    else:
        measured = on_the_gpu(most)
    heading("Takeaway:")
    print(f"Takeaway: a stage is (tile_m + tile_n) x 64 x 2 bytes, so a {TIMED_TILE[0]}x"
          f"{TIMED_TILE[1]} tile fits {most} stages in {SMEM_KIB} KiB "
          f"({found[most]} mbarriers: a full/empty pair each, vs {found[2]} for two stages). "
          f"Two stages overlap one load with one MMA step; more stages keep more loads in "
          f"flight to cover the load latency. {measured}.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
