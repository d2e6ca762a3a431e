"""Masking of a block of scores: keys past s_k, and (causal, bottom-right aligned as
FlashAttention: key j is visible to query i iff j <= i + s_k - s_q) keys past the diagonal."""

from __future__ import annotations

from cutetma import dsl

cutlass, cute = dsl.cutlass()


@cute.jit
def apply_mask(cfg, acc_s, j, row0, col_in_tile, seqlen_q, seqlen_k, group=1):
    """-inf where a key of block ``j`` lies past s_k, or (causal) past the query's diagonal.
    ``row0``: this thread's first row (its second is row0 + 8); ``col_in_tile``: its first
    column inside a block (the WGMMA accumulator layout: value i sits in column
    8 (i // 4) + col_in_tile + i % 2 of row row0 + 8 ((i // 2) % 2)). Blocks that need no
    mask (every key visible to all 64 rows of the warpgroup) skip the test. ``pack_gqa``:
    row r is query r // ``group`` (``seqlen_q`` counts queries, not rows)."""
    col0 = j * cfg.block_n + col_in_tile
    needs = (j + 1) * cfg.block_n > seqlen_k
    if cutlass.const_expr(cfg.causal):
        first_query = row0 - (row0 % 64)  # the warpgroup's first row
        if cutlass.const_expr(cfg.pack_gqa):
            first_query = first_query // group
        needs = needs | ((j + 1) * cfg.block_n - 1 > first_query + seqlen_k - seqlen_q)
    if needs:
        for i in cutlass.range_constexpr(cute.size(acc_s)):
            col = col0 + (i // 4) * 8 + i % 2
            row = row0 + 8 * ((i // 2) % 2)
            if cutlass.const_expr(cfg.pack_gqa):
                row = row // group
            dead = col >= seqlen_k
            if cutlass.const_expr(cfg.causal):
                dead = dead | (col > row + seqlen_k - seqlen_q)
            # a select, not ``if dead:``: a branch per value yields the whole fragment, and
            # ptxas made that a cascade of ~1000 FSELs per masked block (PTX test)
            acc_s[i] = -cutlass.Float32.inf if dead else acc_s[i]
