"""Runtime: everything between a chosen configuration and a kernel running on the card.

* ``device``    -- SM count, clusters that run at once, the current stream, the in-process
                   registry of compiled kernels.
* ``launch``    -- prepared launches of compiled ``from_pointers`` entries (ctypes slots,
                   no per-call argument conversion): ``gemm_launch``, ``attention_launch``.
* ``workspace`` -- split-K's fp32 partials and tickets, kept across launches and graphs.
* ``placement`` -- the GPC probe and the GEMM tile order chosen for this card's placement.

Nothing here chooses a configuration (that is ``cutetma.tuning``) or validates user input
(that is ``cutetma.ops``).
"""

_NAMES = {
    "compiled": "device", "cute_tensor": "device", "max_active_clusters": "device",
    "sm_count": "device", "stream": "device",
    "AttentionLaunch": "launch", "GemmLaunch": "launch", "PointerLaunch": "launch",
    "ScaledGemmLaunch": "launch",
    "attention_launch": "launch", "gemm_launch": "launch", "typed_pointer": "launch",
    "paged_attention_launch": "launch", "fp8_attention_launch": "launch",
    "Fp8AttentionLaunch": "launch",
    "combine_launch": "launch", "append_launch": "launch", "AppendLaunch": "launch",
    "attention_backward_launch": "launch",
    "BackwardLaunch": "launch", "backward_preprocess_launch": "launch",
    "PreprocessLaunch": "launch", "PostprocessLaunch": "launch",
    "dq_postprocess_launch": "launch", "v_transpose_launch": "launch",
    "VTransposeLaunch": "launch",
    "scaled_gemm_launch": "launch",
    "split_workspace": "workspace",
}
__all__ = sorted(_NAMES)


def __getattr__(name):
    """The names above, imported on first use: ``runtime.cache`` (the CLI's ``cache info``)
    then loads without torch."""
    if name in _NAMES:
        import importlib

        return getattr(importlib.import_module(f"cutetma.runtime.{_NAMES[name]}"), name)
    raise AttributeError(f"module 'cutetma.runtime' has no attribute {name!r}")
