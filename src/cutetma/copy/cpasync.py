"""cp.async (LDGSTS): every thread moves 16 bytes per instruction into the *same* swizzled
shared-memory layout the TMA would write.

The destination is a CuTe tensor whose pointer carries the swizzle, so each thread's
``cp.async.cg`` address is the swizzled one: the software does, per thread, what the TMA
unit does in hardware. Completion is per thread (``commit_group`` / ``wait_group``, or an
mbarrier arrival when the group lands, see ``loader``).
"""

from cutetma import dsl

cutlass, cute = dsl.cutlass()
from cutlass.cute.nvgpu import cpasync  # noqa: E402

VECTOR_BYTES = 16  # cp.async.cg moves exactly 16 bytes


def tiled_copy(dtype, rows: int, cols: int, num_threads: int):
    """A tiled copy of a (rows, cols) row-major tile, 16 bytes per thread per step.

    Threads tile the box row-major (a warp reads whole rows: coalesced). Returns
    ``(tiled_copy, threads_used)``; threads beyond ``threads_used`` have nothing to move.
    """
    vec = VECTOR_BYTES * 8 // dtype.width
    if cols % vec:
        raise ValueError(f"cp.async needs rows of whole 16-byte vectors, got {cols} elements")
    per_row = cols // vec
    thr_rows = max(1, min(rows, num_threads // per_row))
    while rows % thr_rows:
        thr_rows -= 1
    atom = cute.make_copy_atom(
        cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL), dtype,
        num_bits_per_copy=VECTOR_BYTES * 8,
    )
    thr_layout = cute.make_ordered_layout((thr_rows, per_row), order=(1, 0))
    val_layout = cute.make_layout((1, vec))
    return cute.make_tiled_copy_tv(atom, thr_layout, val_layout), thr_rows * per_row


def aligned_rows(gmem):
    """The same (rows, cols) tensor with its row stride declared a multiple of 16 bytes.

    A dynamic stride carries no divisibility, so a tile's start would look 1-element aligned
    and 16-byte cp.async would be refused; the host validated the stride (``cutetma.ops``).
    """
    vec = VECTOR_BYTES * 8 // gmem.element_type.width
    stride = cute.assume(gmem.stride[0], divby=vec)
    layout = cute.make_layout(gmem.shape, stride=(stride, 1))
    return cute.make_tensor(gmem.iterator, layout)
