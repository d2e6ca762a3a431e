"""Shared-memory capacity of one CTA on sm_90, from the DSL (not a constant copied around)."""

from __future__ import annotations

import functools

ARCH_FAMILY = "sm_90"


@functools.cache
def smem_capacity() -> int:
    """Bytes of shared memory one CTA may use on Hopper (227 KiB), as the DSL states it."""
    from cutetma import dsl

    dsl.cutlass()
    from cutlass.memory import get_smem_capacity_in_bytes

    return get_smem_capacity_in_bytes(ARCH_FAMILY)
