"""The work walk: which (query block, head, batch) tiles a CTA runs, and in what order.

Persistent (the default): one CTA per SM takes work items ``blockIdx, blockIdx + gridDim,
...``; ``persistent=False`` (experimental): one CTA per item. An item is one tile, or (causal
and persistent) query blocks M-1-i and i of one head, so every item costs the same key blocks
(``tile_coords``). Functions of the config, traced inside the kernel (``@cute.jit``); the
tests run them on plain ints through ``__wrapped__``.
"""

from __future__ import annotations

from cutetma import dsl

cutlass, cute = dsl.cutlass()


def paired(cfg) -> bool:
    """Causal + persistent: a work item is two query blocks of one head, M-1-i and i."""
    return cfg.causal and cfg.persistent


@cute.jit
def work_items(cfg, seqlen_q, heads, batch, splits=1):
    """How many work items the CTAs share (``worker``): every (query block, head, batch)
    tile, or (``paired``) every pair of them; ``split_kv``: each of them ``splits`` times,
    one per range of key blocks."""
    m_blocks = cute.ceil_div(seqlen_q, cfg.block_m)
    if cutlass.const_expr(paired(cfg)):
        m_blocks = (m_blocks + 1) // 2
    items = m_blocks * heads * batch
    if cutlass.const_expr(cfg.split_kv):
        items = items * splits
    return items


@cute.jit
def worker():
    """(this CTA, CTAs): CTA w takes items ``w, w + CTAs, ...``."""
    return cute.arch.block_idx()[0], cute.arch.grid_dim()[0]


@cute.jit
def my_item_count(cfg, items):
    """How many work items this CTA runs: ``blockIdx, blockIdx + gridDim, ...`` below
    ``items`` (persistent), or 1, a constant, so that one CTA per item compiles to
    straight-line code with no tile loop (the loop's extra live values cost ptxas the
    registers it needs to keep the WGMMAs asynchronous for bf16, d = 128, C7512)."""
    if cutlass.const_expr(not cfg.persistent):
        return 1
    me, workers = worker()
    return cute.ceil_div(items - me, workers)


@cute.jit
def item_tiles(cfg, item, seqlen_q):
    """Tiles in work item ``item``: 1, or (``paired``) 2, except a head's middle query
    block when it has an odd number of them, which is an item alone."""
    if cutlass.const_expr(not paired(cfg)):
        return 1
    m_blocks = cute.ceil_div(seqlen_q, cfg.block_m)
    i = item % ((m_blocks + 1) // 2)
    return 1 + cutlass.min(m_blocks - 1 - 2 * i, 1)  # M-1-i > i, else the lone middle


@cute.jit
def tile_coords(cfg, item, half, seqlen_q, heads, batch=1):
    """Tile ``half`` (0 or 1) of work item ``item`` as (m_block, head, batch, split): split
    0 unless ``split_kv``, whose splits are the outermost index (``batch`` sequences each).

    Query blocks are numbered fastest, so the CTAs in flight share one head's K/V in L2.
    Not causal: an item is one tile. Causal, one CTA per tile: a head's query blocks from
    the last (which sees the most keys), so long tiles start first and the hardware fills
    the end with short ones. Causal, persistent: a static round robin cannot fill in like
    that (numbered per head, one CTA got the long blocks of every head it visited, the
    next the short ones: 1.45x slower at 16k tokens, H200), so an item pairs query blocks
    M-1-i and i of one head; each pair costs the same M+1 key-block rows, and every CTA
    gets the same work up to one item."""
    m_blocks = cute.ceil_div(seqlen_q, cfg.block_m)
    m_block = item % m_blocks
    head_batch = item // m_blocks
    if cutlass.const_expr(paired(cfg)):
        pairs = (m_blocks + 1) // 2
        i = item % pairs
        m_block = m_blocks - 1 - i - half * (m_blocks - 1 - 2 * i)  # half 1: block i
        head_batch = item // pairs
    elif cutlass.const_expr(cfg.causal):
        m_block = m_blocks - 1 - m_block
    if cutlass.const_expr(cfg.split_kv):
        sequence = head_batch // heads
        return m_block, head_batch % heads, sequence % batch, sequence // batch
    return m_block, head_batch % heads, head_batch // heads, 0


@cute.jit
def key_blocks(cfg, m_block, seqlen_q, seqlen_k, group=1):
    """Key blocks this query block needs: all, or (causal, bottom-right aligned) up to the
    diagonal of its last row: key j is visible to query i iff j <= i + s_k - s_q.
    ``pack_gqa``: row r is query r // ``group`` (``seqlen_q`` counts queries, not rows)."""
    n = cute.ceil_div(seqlen_k, cfg.block_n)
    if cutlass.const_expr(cfg.causal):
        last_query = (m_block + 1) * cfg.block_m - 1
        if cutlass.const_expr(cfg.pack_gqa):
            last_query = last_query // group
        last_key = last_query + seqlen_k - seqlen_q
        n = cutlass.min(n, cute.ceil_div(cutlass.max(last_key + 1, 0), cfg.block_n))
    return n


@cute.jit
def block_range(cfg, n_blocks, split, splits):
    """The key blocks [lo, hi) of split ``split`` of a tile with ``n_blocks`` (``split_kv``:
    ``splits`` ranges of ceil(n / splits) blocks, the last ones shorter or empty; else
    [0, n), lo a constant)."""
    if cutlass.const_expr(cfg.split_kv):
        per = cute.ceil_div(n_blocks, splits)
        lo = cutlass.min(split * per, n_blocks)
        return lo, cutlass.min(lo + per, n_blocks)
    return 0, n_blocks
