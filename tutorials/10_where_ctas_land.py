"""10 - Where CTAs land: the L2 merges reads within a GPC, so the tile order matters.

Run: ``python tutorials/10_where_ctas_land.py``. On a CPU machine it reads the H200's
measurements from ``benchmarks/results/`` (ncu's coalescer counters, where the CTAs ran)
and runs the model ``cutetma.gemm`` orders its tiles by; on an H200 it also probes the card
it runs on and times 2048 x 512 x 5120 in both orders against cuBLAS.

**Two CTAs, one k-tile.** In a GEMM every k-tile of A is read by each CTA of its tile row and
every k-tile of B by each CTA of its tile column: at 2048 x 512 x 5120 in 64 x 128 tiles, A
four times and B thirty-two times. A TMA multicast (06) makes the sharing explicit inside a
cluster. But Hopper's L2 has a second way: the **L2 request coalescer** (LRC) in front of the
L2 slices merges reads of one sector that arrive together. ncu counts both kinds
(``lrc__request_sectors_op_read_coalescing_achieved_type_programmatic`` / ``_hardware``,
section 1): cuBLAS's kernel there gets 1.9 M sectors merged by the hardware on top of its
multicast's 2.6 M; ours, with no cluster, 2.8 M, all by the hardware.

**Which reads merge.** Reads from SMs of **one GPC**: the L2 sectors a launch asks for are
close to the number of distinct (GPC, operand k-tile) pairs in each wave (section 3; within
5% for all seven orders at 512 x 1536 x 5120; 14-60% above it at 2048 x 512, the same
winner).
Which tiles share a GPC is the hardware's choice, not the kernel's: the dispatcher deals CTA
i, i + 1, ... round-robin over the GPCs (section 2: this H200's SMs sit in GPCs of 18, 16 and
8; ``PlacementProbe`` reads ``%smid`` in every CTA of a grid that fills the card, and a
cluster's CTAs always share a GPC, so clusters of 16, 8 and 6 name the GPCs). The persistent
scheduler gives CTA i the tiles i, i + grid, ... of its raster order, so the **raster order**
decides how many GPCs read each A row block and B column block at once::

    default: a band of 4 clusters along N    CTAs 0-3 share A's block 0 -> four GPCs read it
    a band of 1 along M                      CTAs 0-31 share B's block 0; CTAs i, i + 32,
                                             i + 64, i + 96 share A's: often one GPC

At 2048 x 512 x 5120 the second order asks for 4.0 M sectors instead of 5.3 M and the kernel
takes 20.4 us instead of 23.6 (cuBLAS 19.7). At 8192^3-like shapes the same order loses 4%:
a wave of 132 tiles then spans all of A (64 MB), more than the 50 MB L2 keeps for the next
wave, so DRAM reads triple. ``cutetma.gemm`` therefore takes the order with the fewest
modelled L2 sectors among those that read no more from DRAM than the default
(``cutetma.tuning.placement.choose_raster``, section 4), on the placement it probes on the
card it runs on (``cutetma.runtime.placement``, once per process; a chip's floorsweeping
decides its GPCs). From M = 256 (whole tiles) it goes one step further and deals each wave's
tiles from a table (``GemmConfig.order_table``), so that one GPC's CTAs get a compact block:
at the card's power cap that was 1-2% faster than the placed band over the grid's large
shapes (``docs/design.md``, "CTA placement and the order table"). The order only moves tiles
between CTAs: every tile is computed whatever the probe said.

Kernel: ``cutetma.kernels.gemm_sm90`` (``GemmConfig.raster_swizzle`` / ``raster_along_m``);
the model: ``cutetma.tuning.placement`` (pure, runs anywhere); the probe and the order
``cutetma.gemm`` runs: ``cutetma.runtime.placement``; the measurements: ``benchmarks/sm_placement.py``,
``benchmarks/gemm_profile.py --compare`` and ``benchmarks/gemm_kernel_times.py``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import graph_time_ms  # tutorials/_common.py: CUDA-graph replays, CUDA events

from cutetma.kernels.build import gpu_unavailable
from cutetma.kernels.gemm_config import GemmConfig
from cutetma.tuning import placement

RESULTS = Path(__file__).resolve().parent.parent / "benchmarks" / "results"
MERGED = "lrc__request_sectors_op_read_coalescing_achieved_type_"


def heading(title: str) -> None:
    print(f"\n== {title}")


def order_name(band: int, along_m: bool) -> str:
    """The scheduler's words for a raster order: a band of clusters walked along N (or M)."""
    if band == 1:
        return f"band 1: {'M' if along_m else 'N'} first"
    return f"band {band} along {'N' if along_m else 'M'}"


def gpc_line(gpcs, named: int) -> str:
    """GPC of each CTA as a digit ('.': an SM no probe cluster reached)."""
    return "".join(chr(48 + g) if g < named else "." for g in gpcs)


def number(text) -> float:
    return float(str(text).replace(",", ""))


def the_coalescer() -> None:
    heading("1. ncu at 2048 x 512 x 5120: sectors the L2 saw, and the merges in front of it")
    doc = json.loads((RESULTS / "gemm_ncu_lrc_2048x512.json").read_text())
    for spec, row in zip(doc["order"], doc["rows"][1:], strict=True):
        print(f"  {spec[:52]:52s} {number(row['gpu__time_duration.sum']) / 1e3:5.1f} us  "
              f"L2 {number(row['lts__t_sectors_srcunit_tex.sum']) / 1e6:4.2f} M  merged: "
              f"hardware {number(row[MERGED + 'hardware.sum']) / 1e6:4.2f} M, "
              f"multicast {number(row[MERGED + 'programmatic.sum']) / 1e6:4.2f} M")


def h200_placement():
    doc = json.loads((RESULTS / "sm_placement.json").read_text())
    gpc = placement.apart(doc["gpc_of_sm"])  # an SM no cluster reached: a group of its own
    row = next(r for r in doc["rows"] if r["cluster"] == 1 and r["ctas"] == 132)
    return tuple(gpc[sm] for sm in row["sm"]), doc


def where_ctas_land() -> tuple:
    heading("2. Where the H200 put the 132 CTAs of a persistent grid (GPC of CTA 0, 1, ...)")
    gpcs, doc = h200_placement()
    print("  SMs per GPC:", {g: n for g, n in doc["sms_per_gpc"].items() if g != "-1"},
          f"({doc['sms_per_gpc'].get('-1', 0)} SMs no cluster of 16 reached)")
    print("  CTA -> GPC:", gpc_line(gpcs, max(doc["gpc_of_sm"]) + 1))
    return gpcs


def the_model(gpcs) -> None:
    heading("3. The model against ncu, 2048 x 512 x 5120 in 64 x 128 tiles (one wave)")
    cfg = GemmConfig(tile_m=64, tile_n=128)
    doc = json.loads((RESULTS / "gemm_ncu_raster_2048x512x5120.json").read_text())
    print(f"  {'order':34s} {'model':>7s} {'ncu':>7s} {'kernel':>8s}")
    for spec, row in zip(doc["order"], doc["rows"][1:], strict=True):
        if spec == "cublas":
            print(f"  {'cuBLAS':34s} {'':7s} {number(row['lts__t_sectors_srcunit_tex.sum']) / 1e6:5.2f} M"
                  f" {number(row['gpu__time_duration.sum']) / 1e3:6.1f} us")
            continue
        fields = dict(f.split("=") for f in spec.partition(":")[2].split(",") if f)
        band = int(fields.get("raster_swizzle", 4))
        along_m = bool(int(fields.get("raster_along_m", 1)))
        modelled = placement.l2_sectors(2048, 512, 5120, cfg, gpcs[:128],
                                        placement.band_order(2048, 512, cfg, band, along_m))
        print(f"  {order_name(band, along_m):34s} {modelled / 1e6:5.2f} M {number(row['lts__t_sectors_srcunit_tex.sum']) / 1e6:5.2f} M"
              f" {number(row['gpu__time_duration.sum']) / 1e3:6.1f} us")


CHOICES = [((2048, 512, 5120), (64, 128), 4), ((512, 1536, 5120), (64, 128), 4),
           ((2048, 6144, 4096), (128, 256), 8), ((8192, 8192, 4096), (128, 256), 8)]


def the_choice(gpcs) -> None:
    heading("4. The order cutetma.gemm takes (fewest L2 sectors, no more DRAM than the default)")
    for (m, n, k), tile, band in CHOICES:
        cfg = GemmConfig(tile_m=tile[0], tile_n=tile[1], raster_swizzle=band)
        clusters_m, clusters_n = placement.cluster_grid(m, n, cfg)
        grid = gpcs[:min(clusters_m * clusters_n, len(gpcs))]
        chosen = placement.choose_raster(m, n, k, cfg, grid, 50 << 20)
        orders = [placement.band_order(m, n, cfg, *o) for o in ((band, True), chosen)]
        mb = [placement.dram_bytes(m, n, k, cfg, len(grid), o, 50 << 20) / 1e6 for o in orders]
        sectors = [placement.l2_sectors(m, n, k, cfg, grid, o) / 1e6 for o in orders]
        print(f"  {m}x{n}x{k} {tile[0]}x{tile[1]}: {order_name(band, True)} -> "
              f"{order_name(*chosen)}; L2 {sectors[0]:.1f} -> {sectors[1]:.1f} M sectors, "
              f"DRAM {mb[0]:.0f} -> {mb[1]:.0f} MB")


def on_the_gpu() -> None:
    heading("5. This card: its GPCs, and 2048 x 512 x 5120 in both orders")
    why = gpu_unavailable()
    if why:
        print(f"  skipped: {why}")
        return
    import torch

    import cutetma
    from cutetma.reference import gemm_ref
    from cutetma.runtime import placement as card  # the probe, and the order gemm runs

    gpcs = card.sm_gpcs(0)
    named = sum(1 for g in set(gpcs) if gpcs.count(g) > 1)  # GPCs; the rest single SMs
    print(f"  {named} GPCs; CTA -> GPC of a {len(gpcs)}-CTA grid:",
          gpc_line(card.cta_gpcs(1, len(gpcs)), named))
    a = torch.randn(2048, 5120, device="cuda", dtype=torch.float16)
    b = torch.randn(512, 5120, device="cuda", dtype=torch.float16)
    ref = gemm_ref(a, b)
    with card.switched_off():
        default = graph_time_ms(lambda: cutetma.gemm(a, b))
    placed_out = cutetma.gemm(a, b)
    placed = graph_time_ms(lambda: cutetma.gemm(a, b))
    cublas = graph_time_ms(lambda: a @ b.T)
    err = (placed_out.float() - ref).abs().max().item()
    print(f"  default order {default * 1e3:.1f} us, cutetma.gemm's order (here the table) "
          f"{placed * 1e3:.1f} us, cuBLAS {cublas * 1e3:.1f} us (graph replays); max error of "
          f"its run {err:.3g}")


def main() -> int:
    the_coalescer()
    gpcs = where_ctas_land()
    the_model(gpcs)
    the_choice(gpcs)
    on_the_gpu()
    print("\nTakeaway: identical reads merge in front of the L2 when they come from one GPC, "
          "and the CTA index decides the GPC, so the raster order is a knob on L2 traffic: "
          "pick it by a model of the card's placement, and keep DRAM in view.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
