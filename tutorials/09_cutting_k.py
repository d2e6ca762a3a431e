"""09 - Cutting K (or fitting the tile): when whole tiles leave SMs idle.

Run: ``python tutorials/09_cutting_k.py``. On a CPU machine it shows the wave arithmetic,
stream-K's work list from the kernel's own function, the hand-over instructions in the PTX
and the H200's measurements from ``benchmarks/results/``; on an H200 it also checks split-K
and stream-K against torch and times them against whole tiles.

**Wave quantization.** The persistent GEMM (07) gives each of the 132 SMs whole output tiles
in turn. 512 x 5120 in 128 x 256 tiles is 4 x 20 = 80 tiles: one wave that keeps 80 SMs busy
and 52 idle, so the kernel can reach at most 80 / 132 = 61% of the card however fast its
mainloop is. Halving the tile helps a little (160 tiles of 128 x 128: 2 waves, the second
21% full), at a lower rate per tile. Two cures: fit the tile's width to the SMs (128 x 160 is
4 x 32 = 128 tiles, 97% of the card in one wave: a WGMMA's N may be any multiple of 8 up to
256, and the kernel takes any multiple of 16, up to 384 with two WGMMAs a k-step), or cut
along K, which every tile has plenty of. cuBLAS fits: at M = 256 / 512 in the paper's shapes
it cut K only in the four cells where its tiles made half a wave or less, and its tiles are
80, 96, 112, 168, 176 or 320 wide where that makes about one wave (section 5b).

**Two ways to cut, one kernel.** Both keep the producer, the stages, the WGMMAs and the
epilogue of 07; only the list of work units and the hand-over of fp32 partial sums differ
(``GemmConfig.split_k`` / ``GemmConfig.stream_k``)::

    split-K (S slices)   every tile's K in S equal units, dealt out like tiles. Each unit
                         stores its partial in a workspace slot, then one thread takes a
                         ticket (atom.add.acq_rel on the tile's counter). The unit with the
                         last ticket sums all the partials (slot order) and stores C;
                         nobody waits. (``split_sum="atomic"``: each unit adds its
                         partial into the tile's one slot with red.global.add.v4.f32
                         instead, and the last reads that slot once and zeroes it: one
                         tile read however many slices. The default for 64-row tiles from
                         3 slices on; not bitwise reproducible, so never under
                         ``torch.use_deterministic_algorithms(True)``.)
    stream-K             whole waves stay whole; the k-tiles of the rest are cut into one
                         equal range per CTA (``stream_k_unit``). The CTA holding a tile's
                         first k-tile owns it: it spins (ld.acquire) on the flags of the CTAs
                         that hold the rest (they st.release after storing their partial)
                         and adds their partials. Those CTAs start with that piece, so the
                         owner rarely waits and no wait can form a cycle.

Both leave their flags at zero after every launch, so one workspace per stream serves every
call, and a CUDA graph replays correctly (tests/test_gemm_gpu.py checks both).

**What it costs.** A cut unit's hand-over (16-byte partial stores, a gpu-scope fence, the
ticket or flag, the last unit's loads) measured 8 us at two slices and 11-13 us at three on
the H200: latency while both consumer warpgroups wait, not bandwidth. So cutting pays only
where a wave's tail is long: ``cutetma.tuning.gemm.grid_time`` models waves x (k-tiles per unit + hand-over)
x the tile's k-tile time, and ``cutetma.gemm`` picks the tile (``AUTO_TILES``: 128 x 256,
192, 160, 128, and 64 x 128 for outputs of a few tiles) and slices it predicts fastest; at
M <= 512 an unsplit 128 x 256 narrows to the width with as many waves (128 x 224 at
256 x 14336), and at 128 < M <= 512 it may instead put 128 x 128 tiles, or the narrowest
(64-112 wide) that fill one wave, as cuBLAS does, in (2, 1) clusters that multicast B, which
cuts each SM's loads by a quarter (``multicast_tile``; section 4 lists a few choices).
A fitted tile needs no hand-over at all, so
it wins wherever one exists (512 x 5120 x 5120: 0.77 -> 1.0x cuBLAS); K is cut where no
width fits (N = 512 or 1536), and there the 64-row tiles narrow too, to the width that makes
as many waves of units (64 x 96 at N = 1536: 0.88 -> 0.96x cuBLAS at M = 256 and 512, in
(2, 1) clusters where K is cut, ``small_tile_cluster``).

Kernel: ``cutetma.kernels.gemm_sm90``; entry point ``cutetma.gemm(a, b)`` (the model's
choice, ``cutetma.select_gemm_config(m, n, k)``), or ``cutetma.gemm(a, b,
config=select_gemm_config(m, n, k, tile=..., split_k=...))`` to cut K yourself
(``stream_k=True``: the experimental stream-K schedule, which the model never picks). The
model's functions live in ``cutetma.tuning.gemm``. ``benchmarks/gemm.py --every`` records
every candidate per cell.

Measured on the H200 (NVIDIA H200, torch 2.11.0+cu130, nvidia-cutlass-dsl 4.8.1,
2026-11-30, ``python tutorials/09_cutting_k.py``), the GPU part, before the fitted widths
existed (the default was then split_k=3; it is now one wave of 128 x 160 tiles, which
``gemm.json`` measured at 670-684 TFLOP/s here, 0.98-0.99x cuBLAS in the same run):

    == 6. On the GPU: 512x5120x12288 fp16, against an fp32 reference, CUDA-graph timing
    torch.matmul (cuBLAS)      0.092 ms   698.6 TFLOP/s  max error 0.242
    whole tiles 128x256        0.117 ms   552.6 TFLOP/s  max error 0.242
    split_k=3                  0.108 ms   593.9 TFLOP/s  max error 0.242
    stream_k                   0.162 ms   397.4 TFLOP/s  max error 0.242
    cutetma.gemm default       0.108 ms   596.6 TFLOP/s  max error 0.242
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import torch
from _common import graph_time_ms  # tutorials/_common.py: CUDA-graph replays, CUDA events

from cutetma.kernels import build
from cutetma.kernels.build import gpu_unavailable
from cutetma.kernels.gemm_config import GemmConfig
from cutetma.kernels.gemm_producers import stream_k_unit
from cutetma.tuning import gemm as model
from cutetma.tuning.gemm import select_gemm_config

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
SM_COUNT = 132
SHAPE = (512, 5120, 12288)  # 80 tiles of 128 x 256, 192 k-tiles; 128 of 128 x 160


def heading(title: str) -> None:
    print(f"\n== {title}")


def waves() -> float:
    heading("1. Wave quantization: the share of 132 SMs whole tiles can keep busy")
    widths = (256, 160, 128)
    print(f"{'M x N':>13}" + "".join(f"{f'128x{w} tiles':>14} {'filled':>7}" for w in widths))
    worst = 1.0
    for m, n in [(512, 5120), (256, 10240), (2048, 5120), (512, 1536), (8192, 8192)]:
        line = f"{m:>6} x {n:<6}"
        for w in widths:
            tiles = -(-m // 128) * -(-n // w)
            filled = model.wave_efficiency(m, n, (128, w), SM_COUNT)
            if w == 256:  # the usual tile: how idle it leaves the card
                worst = min(worst, filled)
            line += f"{tiles:>14} {filled:>7.0%}"
        print(line)
    return worst


def stream_k_timeline(tiles: int = 6, k_tiles: int = 8, ctas: int = 4) -> int:
    heading(f"2. Stream-K's work list: {tiles} tiles x {k_tiles} k-tiles on {ctas} CTAs "
            "(stream_k_unit, the kernel's own arithmetic)")
    print("whole waves first (data-parallel), then one equal k-range per CTA; "
          "W = leaves a partial, O = owns the tile (adds its peers' partials)")
    covered = set()
    writes = 0
    for cta in range(ctas):
        units = []
        j = 0
        while True:
            tile, k0, kn, valid, writer, first_peer, peers = stream_k_unit(
                j, cta, ctas, tiles, k_tiles)
            if not valid:
                break
            role = "W" if writer else "O"
            peer_note = f" + CTA {first_peer}..{first_peer + peers - 1}" if peers else ""
            units.append(f"t{tile} k{k0}-{k0 + kn - 1} {role}{peer_note}")
            covered |= {(tile, k) for k in range(k0, k0 + kn)}
            writes += writer
            j += 1
        print(f"  CTA {cta}: " + " | ".join(units))
    assert covered == {(t, k) for t in range(tiles) for k in range(k_tiles)}
    print(f"every (tile, k-tile) once: yes; partials written: {writes} (at most one per CTA)")
    return writes


HAND_OVER = [
    ("partial out (16 B)", r"st\.global\.v4\.b32"),
    ("partial in (16 B)", r"ld\.global\.v4\.b32"),
    ("gpu-scope fence", r"fence\.acq_rel\.gpu"),
    ("split-K ticket", r"atom\.global\.acq_rel\.add"),
    ("stream-K flag set", r"st\.release\.gpu"),
    ("stream-K flag wait", r"ld\.acquire\.gpu"),
]


def the_ptx() -> dict:
    heading("3. The hand-over in the PTX (static counts)")
    variants = {"whole tiles": GemmConfig(), "split_k=3": GemmConfig(split_k=3),
                "stream_k": GemmConfig(stream_k=True)}
    ptx = {name: build.compile_gemm(cfg).ptx for name, cfg in variants.items()}
    print(f"{'':<20}" + "".join(f"{name:>13}" for name in variants))
    counts = {}
    for role, pattern in HAND_OVER:
        counts[role] = {name: len(re.findall(pattern, text)) for name, text in ptx.items()}
        print(f"{role:<20}" + "".join(f"{counts[role][name]:>13}" for name in variants))
    return counts


def describe(shape) -> str:
    cfg = select_gemm_config(*shape, sm_count=SM_COUNT)
    sliced = f"{cfg.split_k} slices, {cfg.split_sum}" if cfg.split_k > 1 else "whole K"
    return (f"{cfg.tile_m}x{cfg.tile_n} {cfg.schedule}, {sliced}, cluster "
            f"{cfg.cluster_m}x{cfg.cluster_n}")


def the_model() -> str:
    heading("4. The model cutetma.gemm chooses by, and the H200's winners")
    m, n, k = SHAPE
    print(f"grid_time of {m}x{n}x{k} (k-tile times of a 128x256 tile; lower is better):")
    for tile in model.AUTO_TILES:
        times = {s: model.grid_time(m, n, k, tile, s, SM_COUNT) for s in (1, 2, 3, 4)}
        print(f"  {tile[0]}x{tile[1]}: " + ", ".join(f"{s} slice(s) {t:.0f}"
                                                    for s, t in times.items()))
    tile, split = model.auto_tile_and_split(m, n, k, SM_COUNT)
    print(f"  chosen: {tile[0]}x{tile[1]}, split_k={split}")
    print("what cutetma.gemm(a, b) runs with no options (tile, slices, how they meet, cluster):")
    for shape in [(8192, 8192, 8192), SHAPE, (2048, 512, 5120), (256, 512, 5120),
                  (512, 1536, 5120), (256, 1536, 5120), (16, 1536, 5120), (256, 8192, 8192),
                  (256, 5120, 5120), (256, 14336, 4096)]:
        print(f"  {'x'.join(map(str, shape)):>16}: {describe(shape)}")
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)  # the atomic sum's bits depend on arrival order
    try:
        print(f"  {'256x512x5120':>16}: {describe((256, 512, 5120))}"
              "   <- under torch.use_deterministic_algorithms(True)")
    finally:
        torch.use_deterministic_algorithms(before)
    path = RESULTS / "gemm.json"
    if not path.exists():
        return "no gemm.json to compare with"
    agree = total = 0
    for row in json.loads(path.read_text())["rows"]:
        best = row.get("tma_config", {})
        if row["M"] < 256 or best.get("stream_k") or best.get("schedule"):
            continue
        total += 1
        chosen = model.auto_tile_and_split(row["M"], row["N"], row["K"], SM_COUNT)
        agree += (tuple(best["tile"]), best.get("split_k", 1)) == chosen
    print(f"gemm.json: the model picks the measured fastest (tile, slices) in {agree} of "
          f"{total} cells with M >= 256")
    return f"{agree} of {total}"


def measured() -> str:
    heading("5. Measured on the H200: the candidates of wave-starved and full cells "
            "(gemm_narrow_every.json, fp16, TFLOP/s, TMA)")
    path = RESULTS / "gemm_narrow_every.json"
    if not path.exists():
        print("(no results file)")
        return "no ablation"
    kinds = ("128x256", "128x128", "fitted", "split", "stream")
    fitted_wins = split_wins = 0
    rows = json.loads(path.read_text())["rows"]
    print(f"{'M x N x K':>20} {'cuBLAS':>7}" + "".join(f"{kind:>9}" for kind in kinds))
    for row in rows:
        best = dict.fromkeys(kinds, 0.0)
        for entry in row.get("tma_every", []):
            cfg = entry["config"]
            if cfg.get("schedule") or cfg.get("cluster"):
                continue  # the cooperative, single-CTA candidates only
            kind = ("split" if cfg.get("split_k") else "stream" if cfg.get("stream_k")
                    else "x".join(map(str, cfg["tile"])))
            kind = kind if kind in kinds else "fitted"  # 128 x 160 or 128 x 192
            best[kind] = max(best[kind], entry["tflops"])
        whole = max(best["128x256"], best["128x128"])
        fitted_wins += best["fitted"] > max(whole, best["split"], best["stream"])
        split_wins += best["split"] > whole
        print(f"{row['M']:>6}x{row['N']}x{row['K']:<6} {row['cublas']:>7.0f}"
              + "".join(f"{best[kind]:>9.0f}" for kind in kinds))
    return (f"a fitted width was the fastest in {fitted_wins} of {len(rows)} ablation cells "
            f"(split-K beat the power-of-two tiles in {split_wins})")


def cublas_choices() -> str:
    heading("5b. What cuBLAS ran for the same problems on the H200 (cublas_kernels.json, fp16)")
    path = RESULTS / "cublas_kernels.json"
    if not path.exists():
        print("(no results file)")
        return "no cuBLAS record"
    print("cuBLAS names its tile in its own column-major view, C^T = B A^T: the first number "
          "runs along our N")
    print(f"{'M x N x K':>17} {'cuBLAS tile':>12} {'cluster':>8} {'tiles':>6} {'waves':>6}"
          f"   cutetma.gemm: tile, cluster, slices -> units, waves")
    fitted = 0
    for row in json.loads(path.read_text())["rows"]:
        kernel = row["kernels"][0] if row["kernels"] else {}
        if row["dtype"] != "float16" or "tile" not in kernel or row["M"] not in (256, 512):
            continue
        n_tile, m_tile = kernel["tile"]  # cuBLAS's (its M, its N) = our (N, M)
        tiles = -(-row["M"] // m_tile) * -(-row["N"] // n_tile)
        cfg = select_gemm_config(row["M"], row["N"], row["K"], sm_count=SM_COUNT)
        ours = -(-row["M"] // cfg.tile_m) * -(-row["N"] // cfg.tile_n) * cfg.split_k
        fitted += n_tile % 32 != 0 or n_tile > 256
        if row["N"] in (5120, 6144, 14336, 10240) and row["K"] in (4096, 5120, 8192):
            cluster = "x".join(map(str, kernel["cluster"][::-1]))
            split = " split-K" if "splitK" in kernel["name"] else ""
            shape = f"{row['M']}x{row['N']}x{row['K']}"
            print(f"{shape:>17} {m_tile:>6}x{n_tile:<5} {cluster:>8} "
                  f"{tiles:>6} {tiles / SM_COUNT:>6.2f}{split}   {cfg.tile_m}x{cfg.tile_n}, "
                  f"{cfg.cluster_m}x{cfg.cluster_n}, {cfg.split_k} -> {ours}, "
                  f"{ours / SM_COUNT:.2f}")
    return f"cuBLAS's tile was no multiple of 32 or wider than 256 in {fitted} of its M = 256 / 512 cells"


def on_the_gpu() -> str:
    import cutetma
    from cutetma.reference import gemm_ref

    torch.backends.cuda.matmul.allow_tf32 = False
    m, n, k = SHAPE
    heading(f"6. On the GPU: {m}x{n}x{k} fp16, against an fp32 reference, CUDA-graph timing")
    torch.manual_seed(0)
    a = torch.randn(m, k, device="cuda", dtype=torch.float16)
    b = torch.randn(n, k, device="cuda", dtype=torch.float16)
    ref = gemm_ref(a, b)
    torch_err = ((a @ b.T).float() - ref).abs().max().item()
    flops = 2 * m * n * k
    configs = {  # 128 x 256 tiles: whole, K cut in 3 slices, stream-K (experimental)
        "whole tiles 128x256": select_gemm_config(m, n, k, tile=(128, 256), split_k=1),
        "split_k=3": select_gemm_config(m, n, k, tile=(128, 256), split_k=3),
        "stream_k": select_gemm_config(m, n, k, tile=(128, 256), stream_k=True),
    }
    runs = {"torch.matmul (cuBLAS)": lambda: a @ b.T}
    runs.update({name: lambda cfg=cfg: cutetma.gemm(a, b, config=cfg)
                 for name, cfg in configs.items()})
    runs["cutetma.gemm default"] = lambda: cutetma.gemm(a, b)
    tflops = {}
    for name, fn in runs.items():
        err = (fn().float() - ref).abs().max().item()
        assert err <= 2 * torch_err + 1e-3, f"{name}: error {err:.3g} vs torch's {torch_err:.3g}"
        ms = graph_time_ms(fn)
        tflops[name] = flops / ms / 1e9
        print(f"{name:<24} {ms:7.3f} ms  {tflops[name]:6.1f} TFLOP/s  max error {err:.3g}")
    return (f"here split_k=3 ran at {tflops['split_k=3']:.0f} TFLOP/s against "
            f"{tflops['whole tiles 128x256']:.0f} for whole tiles "
            f"(cuBLAS {tflops['torch.matmul (cuBLAS)']:.0f})")


def main() -> int:
    print("09 - cutting K")
    worst = waves()
    writes = stream_k_timeline()
    counts = the_ptx()
    agreement = the_model()
    ablation = measured()
    peer = cublas_choices()
    reason = gpu_unavailable()
    if reason:
        heading("6. On the GPU")
        print(f"skipped: {reason}. On an H200 this step checks split-K and stream-K on "
              f"{SHAPE[0]}x{SHAPE[1]}x{SHAPE[2]} against an fp32 reference and times them "
              "against whole tiles and cuBLAS (CUDA graphs).")
        gpu = "GPU part skipped"
    else:
        gpu = on_the_gpu()
    heading("Takeaway:")
    print(f"Takeaway: whole tiles can leave most of the card idle (as little as {worst:.0%} "
          f"of it busy above). A tile width fitted to the SMs fills it for free where one "
          f"exists; cutting K fills it at the price of a hand-over of fp32 partials "
          f"({counts['partial out (16 B)']['split_k=3']} 16-byte stores, one ticket or flag, "
          f"and the last unit's {counts['partial in (16 B)']['split_k=3']} loads in the "
          f"split-K PTX; stream-K's list here writes {writes} partials). That hand-over costs "
          f"8-13 us a unit, so the model cuts only long wave tails and matches the H200's "
          f"winners in {agreement} cells; {ablation}; {peer}. {gpu}.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
