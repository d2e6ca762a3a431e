"""cutetma: Hopper TMA made visible, measurable and usable.

Layers (data flows down, nothing imports upward): ``swizzle`` (the hardware as a numpy
model) -> ``layouts`` (CuTe layout algebra on the host, checked against it) -> ``copy``
(TMA / cp.async building blocks) -> ``kernels`` -> ``ops`` (the torch face) -> ``cli``.

The torch entry points are imported lazily so ``import cutetma`` (and the swizzle CLI)
stays light and works without the CuTe DSL or a GPU.
"""

__version__ = "0.1.0"

_OPS = ("smem_image", "tma_round_trip", "gemm", "attention")


def __getattr__(name):
    if name in _OPS:
        from cutetma import ops

        return getattr(ops, name)
    raise AttributeError(f"module 'cutetma' has no attribute {name!r}")
