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


def tiled_copy(dtype, rows: int, cols: int, num_threads: int, contiguous: int = 1):
    """A tiled copy of a (rows, cols) tile, 16 bytes per thread per step.

    ``contiguous`` names the mode that is contiguous in memory (1: row-major, 0: column-
    major); threads walk it first, so a warp reads whole contiguous runs (coalesced).
    Returns ``(tiled_copy, threads_used)``; threads beyond ``threads_used`` have nothing to move.
    """
    vec = VECTOR_BYTES * 8 // dtype.width
    inner, outer = (cols, rows) if contiguous == 1 else (rows, cols)
    if inner % vec:
        raise ValueError(f"cp.async needs whole 16-byte vectors along the contiguous mode, "
                         f"got {inner} elements")
    per_line = inner // vec
    lines = max(1, min(outer, num_threads // per_line))
    while outer % lines:
        lines -= 1
    atom = cute.make_copy_atom(
        cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL), dtype,
        num_bits_per_copy=VECTOR_BYTES * 8,
    )
    if contiguous == 1:
        thr_layout = cute.make_ordered_layout((lines, per_line), order=(1, 0))
        val_layout = cute.make_layout((1, vec))
    else:
        thr_layout = cute.make_ordered_layout((per_line, lines), order=(0, 1))
        val_layout = cute.make_layout((vec, 1))
    return cute.make_tiled_copy_tv(atom, thr_layout, val_layout), lines * per_line


def aligned_rows(gmem):
    """The same 2D tensor with its non-unit stride declared a multiple of 16 bytes.

    A dynamic stride carries no divisibility, so a tile's start would look 1-element aligned
    and 16-byte cp.async would be refused; the host validated the stride (``cutetma.ops``).
    """
    vec = VECTOR_BYTES * 8 // gmem.element_type.width
    s0, s1 = gmem.stride
    if cutlass.const_expr(isinstance(s1, int) and s1 == 1):
        stride = (cute.assume(s0, divby=vec), 1)
    else:
        stride = (1, cute.assume(s1, divby=vec))
    return cute.make_tensor(gmem.iterator, cute.make_layout(gmem.shape, stride=stride))
