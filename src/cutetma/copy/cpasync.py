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
SEGMENT_BYTES = 128  # one coalesced global-memory request of a warp's lanes


def thread_shape(vectors: int, lines_total: int, num_threads: int,
                 along: int = 0) -> tuple[int, int]:
    """How a tiled copy lays ``num_threads`` over a tile of ``lines_total`` lines of
    ``vectors`` 16-byte vectors: ``(along, lines)``, threads along a line and lines at once.

    A whole line, unless the threads do not split into whole lines; then the widest part of a
    line that they do (a 160-element fp16 line is 20 vectors: 128 threads would take 6 whole
    lines, 4 after rounding to divide 64, leaving 48 idle; as 4-vector parts, 32 lines at a
    time, all 128 work). ``along`` (when given) fixes the threads along a line instead (a
    divisor of ``vectors``: ``segment_lanes``). ``lines`` divides ``lines_total`` (fewer
    threads work otherwise)."""
    if along:
        assert vectors % along == 0 and num_threads % along == 0, (vectors, along)
    else:
        along = vectors
        if num_threads % vectors and num_threads > vectors:
            along = max(d for d in range(1, vectors + 1)
                        if vectors % d == 0 and num_threads % d == 0)
    lines = max(1, min(lines_total, num_threads // along))
    while lines_total % lines:
        lines -= 1
    return along, lines


def segment_lanes(dtype, line: int) -> int:
    """Lanes that copy one line of ``line`` elements side by side in ``load_lines``: a
    128-byte segment's 8 vectors (each lane then copies ``line`` / 8 vectors of its line,
    128 bytes apart), or the whole line where it is shorter."""
    return min(line * dtype.width // 8 // VECTOR_BYTES, SEGMENT_BYTES // VECTOR_BYTES)


def tiled_copy(dtype, rows: int, cols: int, num_threads: int, contiguous: int = 1,
               every_thread: bool = False, along: int = 0):
    """A tiled copy of a (rows, cols) tile, 16 bytes per thread per step.

    ``contiguous`` names the mode that is contiguous in memory (1: row-major, 0: column-
    major); threads walk it first, so a warp reads whole contiguous runs (coalesced).
    Returns ``(tiled_copy, threads_used)``; threads beyond ``threads_used`` have nothing to
    move (``every_thread``: refuse such a tile, for callers where every thread copies).
    ``along``: threads along the contiguous mode (``thread_shape``).
    """
    vec = VECTOR_BYTES * 8 // dtype.width
    inner, outer = (cols, rows) if contiguous == 1 else (rows, cols)
    if inner % vec:
        raise ValueError(f"cp.async needs whole 16-byte vectors along the contiguous mode, "
                         f"got {inner} elements")
    along, lines = thread_shape(inner // vec, outer, num_threads, along)
    if every_thread and lines * along != num_threads:  # the others would copy past the tile
        raise ValueError(f"a {rows}x{cols} tile does not share out over {num_threads} threads "
                         f"in 16-byte vectors ({lines * along} would have work)")
    atom = cute.make_copy_atom(
        cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL), dtype,
        num_bits_per_copy=VECTOR_BYTES * 8,
    )
    if contiguous == 1:
        thr_layout = cute.make_ordered_layout((lines, along), order=(1, 0))
        val_layout = cute.make_layout((1, vec))
    else:
        thr_layout = cute.make_ordered_layout((along, lines), order=(0, 1))
        val_layout = cute.make_layout((vec, 1))
    return cute.make_tiled_copy_tv(atom, thr_layout, val_layout), lines * along


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


@cute.jit
def partition_operand(mX, sX, tile, tidx, num_threads: int):
    """One thread's cp.async views of a 2D operand tiled by ``tile``: ``(tiled copy, global
    tiles, shared stages, coordinates)``, the global and coordinate views indexed by tile
    (t0, t1) and the shared one by stage. The copy walks whichever mode is contiguous."""
    contiguous_inner = isinstance(mX.stride[1], int) and mX.stride[1] == 1
    tiled, _ = tiled_copy(mX.element_type, tile[0], tile[1], num_threads,
                          1 if cutlass.const_expr(contiguous_inner) else 0, every_thread=True)
    thr = tiled.get_slice(tidx)
    gX = cute.local_tile(aligned_rows(mX), tile, (None, None))
    cX = cute.local_tile(cute.make_identity_tensor(mX.shape), tile, (None, None))
    return tiled, thr.partition_S(gX), thr.partition_D(sX), thr.partition_S(cX)


@cute.jit
def load_tile(views, t0, t1, stage, bounds, tile):
    """Copy tile (t0, t1) of an operand into shared-memory stage ``stage``.

    Interior tiles take one unpredicated copy. On the edge, vectors past ``bounds[0]`` (rows)
    are skipped, since they feed only outputs nobody stores, and vectors past ``bounds[1]``
    are written as zeros, since they meet real data in a product (0 * garbage can be NaN).
    """
    tiled, tXgX, tXsX, tXcX = views
    src = tXgX[(None, None, None, t0, t1)]
    dst = tXsX[(None, None, None, stage)]
    interior = ((t0 + 1) * tile[0] <= bounds[0]) & ((t1 + 1) * tile[1] <= bounds[1])
    if interior:
        cute.copy(tiled, src, dst)
    else:
        crd = tXcX[(None, None, None, t0, t1)]
        for i in cutlass.range_constexpr(cute.size(dst, mode=[1])):
            for j in cutlass.range_constexpr(cute.size(dst, mode=[2])):
                row, col = crd[(0, i, j)]
                if row < bounds[0]:
                    if col < bounds[1]:
                        cute.copy(tiled, src[(None, i, j)], dst[(None, i, j)])
                    else:
                        dst[(None, i, j)].fill(0)


@cute.jit
def partition_stage(sX, tile, tidx, num_threads: int, contiguous: int):
    """One thread's cp.async views of a (rows, cols) shared-memory stage whose global source
    is gathered row by row (``load_gathered``): ``(tiled copy, shared stages, coordinates
    in the tile)``. ``contiguous``: the mode contiguous in global memory (1: rows, 0:
    columns), the one the threads walk."""
    tiled, _ = tiled_copy(sX.element_type, tile[0], tile[1], num_threads, contiguous,
                          every_thread=True)
    thr = tiled.get_slice(tidx)
    return tiled, thr.partition_D(sX), thr.partition_S(cute.make_identity_tensor(tile))


@cute.jit
def load_gathered(views, stage, valid, key_mode: int, source, zero_past: bool,
                  rolled: bool = False):
    """Copy one tile into shared-memory stage ``stage``, each 16-byte vector from
    ``source(row, col)`` (a global tensor of one vector: the caller looks its row up).
    Vectors whose coordinate along ``key_mode`` is ``valid`` or more are skipped, or
    (``zero_past``) written as zeros: they meet real data in a product (0 * garbage can be
    NaN). ``rolled``: the passes as a loop, not unrolled (ptxas would otherwise hoist every
    pass's 64-bit source address ahead of the copies and, in a small register budget, spill
    them)."""
    tiled, tXsX, tXcX = views
    dst = tXsX[(None, None, None, stage)]
    rows = cute.size(dst, mode=[1])
    # the two walks repeat their body: the DSL refuses a helper closing over `dst` inside
    # the runtime loop
    if cutlass.const_expr(rolled):
        for p in cutlass.range(rows * cute.size(dst, mode=[2]), unroll=2):
            i, j = p % rows, p // rows
            crd = tXcX[(0, i, j)]
            if crd[key_mode] < valid:
                src = source(crd[0], crd[1])
                cute.copy(tiled, cute.make_tensor(src.iterator, dst[(None, i, j)].layout),
                          dst[(None, i, j)])
            elif cutlass.const_expr(zero_past):
                dst[(None, i, j)].fill(0)
    else:
        for i in cutlass.range_constexpr(rows):
            for j in cutlass.range_constexpr(cute.size(dst, mode=[2])):
                crd = tXcX[(0, i, j)]
                if crd[key_mode] < valid:
                    src = source(crd[0], crd[1])
                    cute.copy(tiled, cute.make_tensor(src.iterator, dst[(None, i, j)].layout),
                              dst[(None, i, j)])
                elif cutlass.const_expr(zero_past):
                    dst[(None, i, j)].fill(0)


class LineViews:
    """One thread's share of a stage of ``tile`` whose lines (the rows along ``key_mode``,
    each contiguous in global memory along the other mode) come from anywhere, a page table's
    rows for instance (``load_lines``). ``along`` lanes (``segment_lanes``) copy a line side
    by side, so the warpgroup copies ``lines_at_once`` lines per pass and each thread
    ``passes`` lines, pass p's at ``first_line + p * lines_at_once``: all lanes of a segment
    (``along`` neighbours) share ``first_line``. Lane l of a segment keeps the source of its
    segment's passes l, l + along, ... (``entries`` of them, ``held_pass``), and pass p's
    copies take it by shuffle from lane p % along (``shuffle_in_segment``): one lookup per
    line, not per vector."""

    def __init__(self, sX, tile, tidx, num_threads: int, key_mode: int, along: int):
        self.key_mode, self.along, self.tile = key_mode, along, tile
        self.tiled, used = tiled_copy(sX.element_type, tile[0], tile[1], num_threads,
                                      1 - key_mode, every_thread=True, along=along)
        thr = self.tiled.get_slice(tidx)
        identity = cute.make_identity_tensor(tile)
        self.tXsX = thr.partition_D(sX)
        # thread 0's coordinates: compile-time offsets; this thread's are its first + those
        self.tXc0 = self.tiled.get_slice(0).partition_S(identity)
        self.first = thr.partition_S(identity)[(0, 0, 0)]
        self.first_line = self.first[key_mode]
        self.lines_at_once = used // along
        self.passes = tile[key_mode] // self.lines_at_once
        self.entries = (self.passes + along - 1) // along

    def held_pass(self, entry: int, lane):
        """The pass whose line lane ``lane`` looks up in its ``entry``-th lookup."""
        return lane % self.along + entry * self.along

    def pass_of(self, i: int, j: int) -> int:
        """The pass (a constant) of the thread's copy (i, j) of ``tXsX``."""
        return self.tXc0[(0, i, j)][self.key_mode] // self.lines_at_once


@cute.jit
def shuffle_in_segment(value, source: int, along: int):
    """``value`` (32 or 64 bits) of lane ``source`` of this lane's segment of ``along``
    neighbouring lanes (shfl.sync.idx with a segment mask: one shuffle per 32 bits)."""
    mask_and_clamp = (32 - along) << 8 | 31
    held = cute.make_rmem_tensor(cute.make_layout((1,), stride=(1,)), type(value))
    held[0] = value
    words = cute.recast_tensor(held, cutlass.Int32)
    for w in cutlass.range_constexpr(cute.size(words)):
        words[w] = cute.arch.shuffle_sync(words[w], source, mask_and_clamp=mask_and_clamp)
    return held[0]


@cute.jit
def load_lines(views: LineViews, stage, valid, line_address, zero_past: bool):
    """Copy one stage of lines into shared-memory stage ``stage``: pass p's line starts at
    global address ``line_address(p)`` (an Int64, the same in the lanes of a segment; the
    caller shuffles it from the lane that looked it up), each lane's vectors at constant
    offsets from it. Lines ``valid`` and past are skipped, or (``zero_past``) written as
    zeros (0 * garbage can be NaN)."""
    tiled, dst = views.tiled, views.tXsX[(None, None, None, stage)]
    key, col = views.key_mode, 1 - views.key_mode
    dtype = dst.element_type
    vec = VECTOR_BYTES * 8 // dtype.width
    addresses = {}  # one shuffle per pass, however many of the line's vectors a lane copies
    for i in cutlass.range_constexpr(cute.size(dst, mode=[1])):
        for j in cutlass.range_constexpr(cute.size(dst, mode=[2])):
            at = views.tXc0[(0, i, j)]
            p = views.pass_of(i, j)
            if cutlass.const_expr(p not in addresses):
                addresses[p] = line_address(p)
            address = addresses[p]
            line = cute.make_tensor(cute.make_ptr(dtype, address, cute.AddressSpace.gmem,
                                                  assumed_align=VECTOR_BYTES),
                                    cute.make_layout((views.tile[col],)))
            src = cute.tiled_divide(line, (vec,))[(None, (views.first[col] + at[col]) // vec)]
            src = cute.make_tensor(src.iterator, dst[(None, i, j)].layout)
            if views.first_line + at[key] < valid:
                cute.copy(tiled, src, dst[(None, i, j)])
            elif cutlass.const_expr(zero_past):
                dst[(None, i, j)].fill(0)
