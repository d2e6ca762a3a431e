"""Device queries and the in-process compile registry: what a launch needs to know about
the card (SM count, how many clusters run at once, the current stream) and the kernels
already compiled in this process, one per configuration."""

from __future__ import annotations

import functools

import torch

_COMPILED: dict = {}
_WIDTH_VIEW = {1: torch.uint8, 2: torch.float16, 4: torch.float32}


def compiled(key, make_kernel, *args):
    """The kernel compiled for ``key`` (``cute.compile(make_kernel(), *args)`` on first use,
    through the on-disk compile cache: the probes a first call runs load in milliseconds)."""
    if key not in _COMPILED:
        _COMPILED[key] = _compile(key, make_kernel, args)
    return _COMPILED[key]


def _compile(key, make_kernel, args):
    from cutlass.cute.runtime import make_fake_stream

    from cutetma import dsl
    from cutetma.runtime import cache

    _, cute = dsl.cutlass()
    # compiled against a fake stream (only its type matters), called with the real one
    compile_args = tuple(make_fake_stream() if type(a).__name__ == "CUstream" else a
                         for a in args)
    try:
        parts = {"entry": repr(key), "args": cache.describe_args(*compile_args)}
    except TypeError:  # an argument that cannot key an entry: compile in this process only
        return cute.compile(make_kernel(), *args)
    return cache.load_or_compile(parts, lambda: cute.compile(make_kernel(), *compile_args))


def cached(key, make):
    """``make()`` once per process for ``key`` (compiled launches, device facts)."""
    value = _COMPILED.get(key)
    if value is None:
        value = _COMPILED[key] = make()
    return value


def cute_tensor(x: torch.Tensor):
    """``x`` as a DSL tensor of dynamic shape, viewed as an unsigned type of its width."""
    from cutlass.cute.runtime import from_dlpack

    view = x.view(_WIDTH_VIEW[x.element_size()])
    return from_dlpack(view, assumed_align=16).mark_layout_dynamic(leading_dim=1)


def stream(device=None):
    """The current CUDA stream of ``device`` (default: the current device) as the DSL
    takes it."""
    from cuda.bindings import driver as cuda

    return cuda.CUstream(torch.cuda.current_stream(device).cuda_stream)


@functools.cache
def sm_count(device_index=None) -> int:
    """Streaming multiprocessors of the device (132 on the H200)."""
    return torch.cuda.get_device_properties(device_index or 0).multi_processor_count


def max_active_clusters(cluster_size: int, device_index: int | None = None) -> int:
    """Clusters of this many CTAs (one per SM) the card runs at once: a persistent grid's
    size. Not simply SMs / size: a cluster's CTAs must share a GPC."""
    device = torch.cuda.current_device() if device_index is None else device_index

    def ask():
        from cutetma import dsl

        dsl.cutlass()
        import cutlass.utils as utils

        # the DSL asks the driver in the current context: make torch create the device's
        # (a process that has touched no CUDA tensor yet, e.g. `cutetma cache warm`, has none)
        torch.cuda.synchronize(device)
        return utils.HardwareInfo(device).get_max_active_clusters(cluster_size)

    return cached(("max_active_clusters", cluster_size, device), ask)
