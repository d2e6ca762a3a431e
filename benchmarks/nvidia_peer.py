"""NVIDIA's own CuTe DSL Hopper GEMM example as a peer, timed beside cuBLAS and ours.

The example is not part of this project and is not copied into it: ``--nvidia-example PATH``
names the file in a CUTLASS checkout
(``examples/python/CuTeDSL/cute/hopper/kernel/dense_gemm/dense_gemm_persistent.py``; its
path and a hash of the file go into the results' ``meta``, the CUTLASS commit into the notes
that cite them). It is imported from there, its
``HopperWgmmaGemmPersistentKernel`` compiled once per (dtype, tile, cluster, rasterization)
with dynamic layouts, as its own ``run()`` does, and called on torch tensors on the current
stream. Its operands are batched (M, K, L): ours and cuBLAS's (M, K) become L = 1 views, so
all three read the same memory.

Spec (``gemm_ab.py`` / ``gemm_sustained.py`` ``--kernels``):
``nvidia:tile=128x256,cluster=1x2[,swizzle=1][,raster=m]``, the example's command-line
defaults except the tile and cluster given.
"""

from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path

_MODULE = None
_COMPILED: dict = {}


def load(path: str | Path):
    """Import the example from ``path`` once; its file hash goes into the results."""
    global _MODULE
    path = Path(path)
    if not path.is_file():
        raise SystemExit(f"--nvidia-example {path}: no such file (a CUTLASS checkout's "
                         "examples/python/CuTeDSL/cute/hopper/kernel/dense_gemm/"
                         "dense_gemm_persistent.py)")
    spec = importlib.util.spec_from_file_location("nvidia_dense_gemm_persistent", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not hasattr(module, "HopperWgmmaGemmPersistentKernel"):
        raise SystemExit(f"{path} has no HopperWgmmaGemmPersistentKernel")
    _MODULE = module
    return {"nvidia_example": str(path),
            "nvidia_example_sha256": hashlib.sha256(path.read_bytes()).hexdigest()[:16]}


def _batched(x):
    """(rows, K) torch tensor -> the example's (rows, K, 1) cute tensor, K contiguous."""
    from cutlass.cute.runtime import from_dlpack

    return from_dlpack(x.unsqueeze(-1), assumed_align=16).mark_layout_dynamic(leading_dim=1)


def gemm_fn(a, b, *, tile=(128, 256), cluster=(1, 2), swizzle=1, raster="m"):
    """A callable computing C = A B^T with the example's kernel into a fresh C each call
    (as ``a @ b.T`` allocates its output)."""
    import cutlass
    import cutlass.cute as cute
    import torch
    from cuda.bindings import driver as cuda

    if _MODULE is None:
        raise SystemExit("an nvidia: spec needs --nvidia-example PATH")
    if a.dtype != torch.float16 or b.dtype != torch.float16:
        raise ValueError("the example takes fp16 A and B (its is_valid_dtypes)")
    tile, cluster = tuple(tile), tuple(cluster)
    m, n = a.shape[0], b.shape[0]
    key = (a.dtype, tile, cluster, int(swizzle), raster)
    a_t, b_t = _batched(a), _batched(b)

    def call():
        c = torch.empty(m, n, dtype=a.dtype, device=a.device)
        c_t = _batched(c)
        stream = cuda.CUstream(torch.cuda.current_stream().cuda_stream)
        if key not in _COMPILED:
            kernel = _MODULE.HopperWgmmaGemmPersistentKernel(
                cutlass.Float32, tile, cluster, int(swizzle), raster == "m")
            clusters = cutlass.utils.HardwareInfo().get_max_active_clusters(
                cluster[0] * cluster[1])
            _COMPILED[key] = cute.compile(kernel, a_t, b_t, c_t, clusters, stream)
        _COMPILED[key](a_t, b_t, c_t, stream)
        return c

    return call
