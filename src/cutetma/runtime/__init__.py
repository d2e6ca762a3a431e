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

from cutetma.runtime.device import (
    compiled,
    cute_tensor,
    max_active_clusters,
    sm_count,
    stream,
)
from cutetma.runtime.launch import (
    AttentionLaunch,
    GemmLaunch,
    PointerLaunch,
    attention_launch,
    gemm_launch,
    typed_pointer,
)
from cutetma.runtime.workspace import split_workspace

__all__ = [
    "AttentionLaunch", "GemmLaunch", "PointerLaunch", "attention_launch", "compiled",
    "cute_tensor", "gemm_launch", "max_active_clusters", "sm_count", "split_workspace",
    "stream", "typed_pointer",
]
