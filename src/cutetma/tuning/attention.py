"""Attention choices made on the host: the producer for paged K/V (``paged_load``).

Pure functions of the problem; docs/design.md ("Paged attention: boxes per page") gives the
H200 measurements behind each rule.
"""

from __future__ import annotations

import math

from cutetma.kernels.attention.config import BLOCKS


def tma_page_sizes_ok(page_size: int, head_dim: int, causal: bool) -> bool:
    """Whether the TMA producer can load pages of ``page_size`` keys: each box of a K/V
    stage lies inside one page and starts on the 128-byte swizzle's 8-row atom, so
    gcd(page_size, keys per stage) must be a multiple of 8."""
    block_n = BLOCKS[(head_dim, causal)][1]
    return math.gcd(page_size, block_n) % 8 == 0


def paged_load(page_size: int, seqlen_q: int, head_dim: int, causal: bool) -> str:
    """``load="auto"`` for paged K/V: TMA wherever its boxes fit the pages
    (``tma_page_sizes_ok``), cp.async otherwise."""
    del seqlen_q  # one rule for prefill and decode until decode is measured with packing
    return "tma" if tma_page_sizes_ok(page_size, head_dim, causal) else "cp_async"
