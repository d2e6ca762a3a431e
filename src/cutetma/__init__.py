"""cutetma: Hopper's Tensor Memory Accelerator (TMA) made visible, measurable and usable.

Layers (data flows down, nothing imports upward; ``tests/test_layering.py`` holds it)::

    swizzle, layouts        the hardware as a numpy model; CuTe layout algebra on the host
    viz                     PNG figures and the HTML explorer
    copy                    TMA / cp.async building blocks and the one loader interface
    kernels                 HopperGemm, FlashAttentionSm90, probes; frozen configs
    tuning                  problem -> config, on the host (the H200 wave and L2 models)
    runtime                 compile registry, prepared launches, workspaces, the GPC probe
    ops, kvcache, fp8,      the torch face: validate -> select -> launch (``checks``: the
    fp8_attention,          operand checks they share)
    backward, checks
    cli, hardware           the ``cutetma`` command and the model-vs-hardware check

``import cutetma`` is light (no torch, no DSL); the torch entry points load on first use.
The CuTe DSL reads ``CUTE_DSL_ARCH`` once, when it is first imported, and on a machine
without a GPU it would otherwise target another architecture: importing cutetma sets
sm_90a (Hopper) unless the variable is already set, before anything can import the DSL.
"""

import os as _os
import sys as _sys

__version__ = "0.1.0"

if "cutlass" not in _sys.modules:
    _os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

_LAZY = {
    "gemm": "cutetma.ops", "attention": "cutetma.ops", "smem_image": "cutetma.ops",
    "tma_round_trip": "cutetma.ops", "attention_with_kvcache": "cutetma.kvcache",
    "scaled_gemm": "cutetma.fp8", "attention_backward": "cutetma.backward",
    "attention_fp8": "cutetma.fp8_attention",
    "GemmConfig": "cutetma.kernels.gemm_config",
    "AttentionConfig": "cutetma.kernels.attention",
    "select_gemm_config": "cutetma.tuning.gemm",
    "gemm_ref": "cutetma.reference", "attention_ref": "cutetma.reference",
    "paged_attention_ref": "cutetma.reference", "attention_grads_ref": "cutetma.reference",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'cutetma' has no attribute {name!r}")
