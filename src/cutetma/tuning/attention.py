"""Attention choices made on the host for paged K/V: the producer (``paged_load``), packing
a K/V head's query heads into one tile (``paged_pack_gqa``) and splitting the keys
(``paged_splits``).

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
    (``tma_page_sizes_ok``), cp.async otherwise, except decode (one query) at d = 128, where
    cp.async led TMA by 1-6% in every cell of an H200 run and by up to 1.7% in 3 of 4 cells of
    an H100 run, TMA 0.3% ahead in the fourth (docs/design.md, "Paged decode"). At
    prefill and chunked prefill TMA-paged leads 1.21x (geomeans, ``paged.json``)."""
    if seqlen_q == 1 and head_dim == DECODE_CP_ASYNC_HEAD_DIM:
        return "cp_async"
    return "tma" if tma_page_sizes_ok(page_size, head_dim, causal) else "cp_async"


# decode's producer: cp.async at this head dim (d = 256 causal cp.async cannot split:
# SPLIT_KV_UNSUPPORTED; d = 64 was not timed)
DECODE_CP_ASYNC_HEAD_DIM = 128


# pack_gqa up to this many queries per sequence: decode (1), speculative steps, short chunks
PACK_GQA_MAX_SEQLEN_Q = 64
# split_kv: at least this many key blocks per split (a split's pipeline fills, and the
# combine's partials stay few), at most this many splits
MIN_BLOCKS_PER_SPLIT = 4
MAX_SPLITS = 64


# where the paged kernel waits for P V, per (head dim, causal), where it differs from the dense
# kernel's ``PV_WAIT``: "late" at d = 128, whose "early" PTX computes P twice per key block
# (causal: 184 exp instructions against 130; non-causal: 89 for 64 scores against 66).
# H200, b 4, s 4k, h 32 / 8, bf16, TMA, late vs early: causal 600 / 598 TFLOP/s at pages 16 /
# 64 against 422 / 469 (dense: 610 / 621; FA4's paged 528 / 550); non-causal 668 / 670 at
# pages 64 / 128 against 559 / 571 (dense 638 / 666, FA4's paged 569 / 646). ``benchmarks/
# paged.py`` times each prefill row's other wait beside the default (``tma_early``)
PAGED_PV_WAIT: dict = {(128, True): "late", (128, False): "late"}


def paged_pv_wait(head_dim: int, causal: bool, pack_gqa: bool = False) -> str:
    """``AttentionConfig.pv_wait`` for the paged kernel ("": the head dim's ``PV_WAIT``).
    Decode's packed tiles keep the dense kernel's choice: only unpacked prefill was timed."""
    return "" if pack_gqa else PAGED_PV_WAIT.get((head_dim, causal), "")


def paged_pack_gqa(seqlen_q: int, group: int) -> bool:
    """Pack the ``group`` query heads of each K/V head into one tile (``AttentionConfig.
    pack_gqa``): with few queries a tile of one head is mostly empty rows, and each of the
    group's tiles reads the same keys again."""
    return group > 1 and seqlen_q <= PACK_GQA_MAX_SEQLEN_Q


def paged_splits(tiles: int, key_blocks: int, sm_count: int) -> int:
    """Splits of each tile's key blocks (``AttentionConfig.split_kv``) when the ``tiles``
    alone leave SMs idle: about one work item per SM, each at least
    ``MIN_BLOCKS_PER_SPLIT`` blocks long. From shapes only (no host synchronisation:
    ``key_blocks`` counts the page table's capacity, not the cache lengths)."""
    if tiles >= sm_count:
        return 1
    return max(1, min(sm_count // max(tiles, 1), key_blocks // MIN_BLOCKS_PER_SPLIT,
                      MAX_SPLITS))
