"""Where a thread's WGMMA accumulator values sit in their tile, known at trace time.

A thread's (row, column) coordinates in a tiled MMA's accumulator are its value 0's plus
offsets that are the same for every thread: thread 0's partition of the tile's coordinates.
So a per-row or per-column quantity (FP8's scales, attention's LSE and D) is loaded once per
distinct row or column a thread holds, not once per value, and each value finds its entry by
a trace-time index."""

from __future__ import annotations

from types import SimpleNamespace

from cutetma import dsl

cutlass, cute = dsl.cutlass()


def value_offsets(tiled_mma, tile_mn) -> SimpleNamespace:
    """For the (M, N) tile ``tile_mn`` of ``tiled_mma``'s accumulator: ``rows`` and ``cols``,
    a thread's distinct row and column offsets from its value 0, ``row_of`` / ``col_of``,
    each value's index among them, and ``values_of``, the values of each column (a 128 x 128
    two-warpgroup tile: 2 rows and 32 columns a thread, against 64 values). Call while
    tracing."""
    coords = tiled_mma.get_slice(0).partition_C(cute.make_identity_tensor(tile_mn))
    values = [tuple(int(x) for x in coords[i]) for i in range(cute.size(coords))]
    rows = sorted({r for r, _ in values})
    cols = sorted({c for _, c in values})
    col_of = [cols.index(c) for _, c in values]
    return SimpleNamespace(rows=rows, cols=cols, row_of=[rows.index(r) for r, _ in values],
                           col_of=col_of,
                           values_of=[[i for i, c in enumerate(col_of) if c == j]
                                      for j in range(len(cols))])
