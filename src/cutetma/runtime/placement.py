"""Where this card puts a persistent grid's CTAs, probed once per process, and the GEMM's
tile order chosen for it (the model is ``cutetma.tuning.placement``).

``cta_gpcs`` runs ``PlacementProbe`` launches (``kernels.microbench``) that record each CTA's
SM; clusters share a GPC, so launches of 16-, 8- and 6-CTA clusters name every SM's GPC.
``ordered`` hands ``cutetma.gemm`` its configuration with the tile order for that map: an
order table from ``TABLE_MIN_M`` (built on a shape's first call, kept on the device), else
the raster band with the fewest modelled L2 reads. ``CUTETMA_PLACEMENT=0`` switches both
off. A wrong map costs speed, never results: every tile is computed whatever the order.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import os

import torch

from cutetma.runtime import device
from cutetma.tuning import placement as model
from cutetma.tuning.gemm import order_table_pays

# clusters whose CTAs are co-resident on one GPC, so each launch names GPCs' SMs: 16 fills a
# 16-18 SM GPC, 8 the H200's 8-SM GPC, 6 tiles 18 SMs exactly
GPC_PROBE_CLUSTERS = (16, 8, 6)
SPIN_CYCLES = 200_000  # each probe CTA stays ~0.1 ms: the whole grid is resident at once


def enabled() -> bool:
    return os.environ.get("CUTETMA_PLACEMENT", "1") not in ("0", "off", "false")


@contextlib.contextmanager
def switched_off():
    """``cutetma.gemm`` keeps the default raster order inside (A/B benchmarks)."""
    before = os.environ.get("CUTETMA_PLACEMENT")
    os.environ["CUTETMA_PLACEMENT"] = "0"
    try:
        yield
    finally:
        if before is None:
            del os.environ["CUTETMA_PLACEMENT"]
        else:
            os.environ["CUTETMA_PLACEMENT"] = before


def probe(cluster: int, ctas: int, device_index: int = 0) -> list[tuple[int, int, int]]:
    """``(smid, rank in cluster, start ns mod 2^32)`` of each CTA of one ``PlacementProbe``
    launch: ``ctas`` CTAs, one per SM, clusters of ``cluster`` along x, the clusters along z
    (the GEMM's grid)."""
    import torch

    from cutetma import dsl
    from cutetma.kernels import microbench as mb

    _, cute = dsl.cutlass()
    from cutlass.cute.runtime import from_dlpack

    with torch.cuda.device(device_index):
        out = torch.full((ctas, 4), -1, dtype=torch.int32, device="cuda")
        tensor = from_dlpack(out, assumed_align=16).mark_layout_dynamic(leading_dim=1)
        stream = device.stream(device_index)
        key = ("placement_probe", cluster)
        kernel = device.compiled(key, lambda: mb.PlacementProbe(cluster, True), tensor,
                               SPIN_CYCLES, stream)
        kernel(tensor, SPIN_CYCLES, stream)
        torch.cuda.synchronize()
        return [tuple(r) for r in out[:, :3].cpu().tolist()]


@functools.cache
def sm_gpcs(device_index: int = 0) -> tuple[int, ...]:
    """GPC of every SM of the device, from ``GPC_PROBE_CLUSTERS`` launches (an SM none of
    them reached: its own group, numbered past the GPCs)."""
    sm_count = device.sm_count(device_index)
    launches = []
    for size in GPC_PROBE_CLUSTERS:
        try:
            rows = probe(size, sm_count // size * size, device_index)
        except Exception:  # a cluster size this card or driver refuses names nothing
            continue
        launches.append((size, [sm for sm, _, _ in rows]))
    return model.apart(model.gpcs_from_clusters(launches, sm_count))


@functools.cache
def cta_gpcs(cluster_size: int, ctas: int, device_index: int = 0) -> tuple[int, ...]:
    """GPC of each CTA index of a persistent grid of ``ctas`` CTAs in clusters of
    ``cluster_size`` (the dispatcher's placement, probed)."""
    gpc = sm_gpcs(device_index)
    return tuple(gpc[sm] for sm, _, _ in probe(cluster_size, ctas, device_index))


_PLACED: dict = {}


def grid_gpcs(cfg, m: int, n: int, device_index: int, clusters: int) -> tuple[int, ...]:
    """GPC of each CTA of the persistent grid this configuration launches for an M x N
    output (its clusters: the output's, at most ``clusters``), probed on the device."""
    size = cfg.cluster_m * cfg.cluster_n
    grid = min(math.prod(model.cluster_grid(m, n, cfg)), clusters)
    return cta_gpcs(size, grid * size, device_index)


def placed(cfg, m: int, n: int, k: int, device_index: int, clusters: int):
    """``cfg`` with the raster order ``model.choose_raster`` picks for the CTA -> GPC map
    this device's dispatcher gives a grid of ``clusters`` clusters (probed once per process
    and grid; remembered per shape). Unchanged for split-K and stream-K (their work lists
    are not the plain raster), with ``CUTETMA_PLACEMENT=0``, and while a CUDA graph is
    being captured (the probe launches a kernel and waits for it; that shape is placed at
    its next call outside a capture)."""
    if cfg.split_k > 1 or cfg.stream_k or not enabled():
        return cfg
    key = (cfg, m, n, k, device_index, clusters)
    if key not in _PLACED:
        if torch.cuda.is_current_stream_capturing():
            return cfg
        gpcs = grid_gpcs(cfg, m, n, device_index, clusters)
        l2 = getattr(torch.cuda.get_device_properties(device_index), "L2_cache_size", 50 << 20)
        band, along_m = model.choose_raster(m, n, k, cfg, gpcs, l2)
        _PLACED[key] = dataclasses.replace(cfg, raster_swizzle=band, raster_along_m=along_m)
    return _PLACED[key]


def ordered(cfg, m: int, n: int, k: int, device_index: int, clusters: int):
    """``cfg`` with the tile order ``cutetma.gemm`` runs by default: the order table where
    ``order_table_pays`` (built from the probed placement on this shape's first call; a
    CUDA-graph capture that finds it unbuilt keeps the placed band), else the placed band
    (``_placed``). Both are off with ``CUTETMA_PLACEMENT=0``."""
    if enabled() and order_table_pays(m, n, cfg):
        table_cfg = with_order_table(cfg)
        if not torch.cuda.is_current_stream_capturing() or (
                (table_cfg, m, n, device_index, clusters) in _ORDER_TABLES):
            return table_cfg
    return placed(cfg, m, n, k, device_index, clusters)


@functools.lru_cache(maxsize=1024)
def with_order_table(cfg):
    """``cfg`` with ``order_table`` on, made once per configuration (a ``dataclasses.
    replace`` re-runs ``GemmConfig``'s checks: a tenth of an eager call's host cost)."""
    return dataclasses.replace(cfg, order_table=True)


_ORDER_TABLES: dict = {}


def order_table(cfg, m: int, n: int, device_index: int, clusters: int):
    """``GemmConfig.order_table``'s table for this output on this card (``placement.
    order_table`` over the probed CTA -> GPC map), as the kernel takes it; built once per
    (configuration, M, N, device), kept on the device."""
    key = (cfg, m, n, device_index, clusters)
    if key not in _ORDER_TABLES:
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError("order_table: call this shape once outside CUDA-graph capture "
                               "first (its table is built from a probe launch)")
        gpcs = grid_gpcs(cfg, m, n, device_index, clusters)
        packed = model.pack(model.order_table(m, n, cfg, gpcs))
        table = torch.from_numpy(packed).to(f"cuda:{device_index}")
        from cutlass.cute.runtime import from_dlpack

        _ORDER_TABLES[key] = (table, from_dlpack(table, assumed_align=4).mark_layout_dynamic())
    return _ORDER_TABLES[key][1]
