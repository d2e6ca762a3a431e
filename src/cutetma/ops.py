"""The torch face: validate on the host, compile once per configuration, launch on the
current CUDA stream.

    smem_image(x, box, swizzle="128B", load="tma", tile=(0, 0))  -> uint8 shared-memory bytes
    tma_round_trip(x, box, swizzle="128B")                         -> a copy of x, by TMA

Every TMA rule (``cutetma.swizzle.check_box``) and every tensor property the kernels rely
on (device, rank, dtype, a contiguous inner dimension, 16-byte aligned base and row stride)
is checked before anything is compiled or launched; the error names the rule and the numbers.
Compiled kernels are cached in memory per configuration; tensor shapes are dynamic, so a new
shape does not recompile.
"""

from __future__ import annotations

import numpy as np
import torch

from cutetma import swizzle as hw

_WIDTH_VIEW = {1: torch.uint8, 2: torch.float16, 4: torch.float32}
_SUPPORTED = {
    torch.uint8, torch.int8, torch.float16, torch.bfloat16, torch.float32, torch.int32,
    getattr(torch, "float8_e4m3fn", torch.uint8), getattr(torch, "float8_e5m2", torch.uint8),
}
_COMPILED: dict = {}


def _check_tensor(x, name: str = "x") -> int:
    """The tensor rules shared by every TMA entry point; returns the element width."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.device.type != "cuda":
        raise ValueError(f"{name} is on {x.device}: TMA kernels need a CUDA tensor")
    if x.dtype not in _SUPPORTED:
        raise TypeError(f"{name} has dtype {x.dtype}: supported are 1-, 2- and 4-byte types "
                        f"({', '.join(sorted(str(d) for d in _SUPPORTED))})")
    if x.dim() != 2:
        raise ValueError(f"{name} must be 2D (rows, cols), got shape {tuple(x.shape)}")
    w = x.element_size()
    if x.stride(1) != 1:
        raise ValueError(f"{name} must be contiguous in its last dimension (stride {x.stride(1)})"
                         f"; call .contiguous()")
    hw.check_box((1, 16 // w), w, "none", global_strides_bytes=(x.stride(0) * w,),
                 global_base=x.data_ptr())
    return w


def _probe_config(x, box, swizzle, load, grouped, cluster):
    from cutetma.kernels.tile_copy import ProbeConfig

    rows, cols = (int(b) for b in box)
    if cluster is None:
        cluster = 2 if load in ("tma_multicast", "dsm") else 1
    return ProbeConfig(x.element_size(), swizzle, rows, cols, grouped, load, cluster)


def _compiled(key, make_kernel, *args):
    from cutetma import dsl

    _, cute = dsl.cutlass()
    if key not in _COMPILED:
        _COMPILED[key] = cute.compile(make_kernel(), *args)
    return _COMPILED[key]


def _cute_tensor(x: torch.Tensor):
    from cutlass.cute.runtime import from_dlpack

    view = x.view(_WIDTH_VIEW[x.element_size()])
    return from_dlpack(view, assumed_align=16).mark_layout_dynamic(leading_dim=1)


def _stream():
    from cuda.bindings import driver as cuda

    return cuda.CUstream(torch.cuda.current_stream().cuda_stream)


def smem_image(x: torch.Tensor, box, *, swizzle: str = "128B", load: str = "tma",
               tile=(0, 0), grouped: bool = False, cluster: int | None = None) -> torch.Tensor:
    """The raw shared-memory bytes after loading box ``tile`` of ``x`` (uint8, one row per CTA
    of the cluster for ``tma_multicast`` / ``dsm``, else a 1D tensor).

    ``box`` is (rows, cols) in elements; with ``grouped`` cols spans several swizzle-span
    groups loaded as one 3D box. ``tile`` counts boxes. TMA zero-fills what lies outside
    ``x``; cp.async and DSM take boxes inside ``x`` only.
    """
    w = _check_tensor(x)
    cfg = _probe_config(x, box, swizzle, load, grouped, cluster)
    tr, tc = (int(t) for t in tile)
    r0, c0 = tr * cfg.rows, tc * cfg.cols
    if tr < 0 or tc < 0 or r0 >= x.shape[0] or c0 >= x.shape[1]:
        raise ValueError(f"tile {tuple(tile)} of box {cfg.rows}x{cfg.cols} starts at "
                         f"({r0}, {c0}), outside the {tuple(x.shape)} tensor")
    inside = r0 + cfg.rows <= x.shape[0] and c0 + cfg.cols <= x.shape[1]
    if cfg.load == "cp_async" and not inside:
        raise ValueError(f"cp.async has no zero fill here: box rows {r0}..{r0 + cfg.rows} x "
                         f"cols {c0}..{c0 + cfg.cols} must lie inside {tuple(x.shape)}")
    if cfg.load == "cp_async":
        hw.check_box((1, 16 // w), w, "none", global_base=x[r0:, c0:].data_ptr())

    from cutetma.kernels.tile_copy import SmemProbe

    out = torch.full((cfg.cluster, cfg.smem_bytes), 0x5A, dtype=torch.uint8, device=x.device)
    args = (_cute_tensor(x), _cute_tensor(out), tr, tc, _stream())
    _compiled(("probe", cfg), lambda: SmemProbe(cfg), *args)(*args)
    return out if cfg.cluster > 1 else out[0]


def tma_round_trip(x: torch.Tensor, box=(64, 64), *, swizzle: str = "128B") -> torch.Tensor:
    """Copy ``x`` through shared memory, one box per CTA: TMA load, then TMA store."""
    w = _check_tensor(x)
    rows, cols = (int(b) for b in box)
    hw.check_box((rows, cols), w, swizzle)
    from cutetma.kernels.tile_copy import TmaRoundTrip

    dst = torch.empty_like(x)
    dst.view(torch.uint8).fill_(0xA5)  # poison: an unwritten element cannot pass
    args = (_cute_tensor(x), _cute_tensor(dst), _stream())
    key = ("round_trip", w, hw.mode(swizzle).name, rows, cols)
    _compiled(key, lambda: TmaRoundTrip(w, swizzle, rows, cols), *args)(*args)
    return dst


def model_image(box_data: np.ndarray, swizzle: str, grouped: bool = False) -> np.ndarray:
    """What the model says the shared-memory bytes of ``box_data`` are (uint8)."""
    box_data = np.ascontiguousarray(box_data)
    if not grouped:
        return hw.smem_image(box_data, swizzle)
    w = box_data.dtype.itemsize
    rows, cols = box_data.shape
    offsets = hw.grouped_box_offsets(rows, cols, w, swizzle)
    out = np.zeros(box_data.size * w, dtype=np.uint8)
    src = box_data.reshape(-1).view(np.uint8).reshape(-1, w)
    out[offsets.reshape(-1, 1) + np.arange(w)] = src
    return out
