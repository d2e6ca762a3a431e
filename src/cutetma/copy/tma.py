"""TMA: the descriptor (built on the host from a CuTe shared-memory layout) and the copies.

The TMA atom is derived from the CuTe layout of the destination: its swizzle picks the
hardware swizzle mode, its contiguous extent the box. So the layout the kernel reads with is,
by construction, the layout the hardware writes (``cutetma.layouts`` checks the algebra on
the host, the probe kernels check the hardware on the GPU).

* ``load_atom``: G2S, optionally multicast to ``multicast`` CTAs of a cluster.
* ``store_atom``: S2G; after ``cute.copy`` issue ``commit()`` and, before the shared buffer is
  written again, ``wait(0)``: a bulk async group, not an mbarrier. ``reduce_add_atom``: the
  same, adding into global memory.
* ``group_view``: the chapter's 3D view ``(groups, rows, G)`` of a (rows, cols) tensor, so one
  3D TMA moves a row wider than the swizzle span.
* ``partition``: (shared, global) views of one CTA's share of a box: all of it, or its
  1/N slice when N CTAs multicast the box together.
"""

from cutetma import dsl

cutlass, cute = dsl.cutlass()
from cutlass.cute.nvgpu import cpasync  # noqa: E402


def load_atom(gmem, smem_layout, tiler, multicast: int = 1):
    """TMA load atom and the coordinate tensor to partition (``(atom, tma_tensor)``)."""
    op = cpasync.CopyBulkTensorTileG2SMulticastOp() if multicast > 1 else (
        cpasync.CopyBulkTensorTileG2SOp())
    return cpasync.make_tiled_tma_atom(op, gmem, smem_layout, tiler, num_multicast=multicast)


def store_atom(gmem, smem_layout, tiler):
    return cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileS2GOp(), gmem, smem_layout, tiler)


def reduce_add_atom(gmem, smem_layout, tiler):
    """S2G with addition: the box is added into global memory (cp.reduce.async.bulk.tensor
    .add; fp32 adds in L2), a store otherwise (``commit``, then ``wait`` before the shared
    buffer is written again)."""
    return cpasync.make_tiled_tma_atom(cpasync.CopyReduceBulkTensorTileS2GOp(), gmem,
                                       smem_layout, tiler)


def group_view(gmem, group: int):
    """``global[row, j] == global3[j // G, row, j % G]``: only the tensor map changes."""
    rows, cols = gmem.shape
    row_stride = gmem.stride[0]
    layout = cute.make_layout((cols // group, rows, group), stride=(group, row_stride, 1))
    return cute.make_tensor(gmem.iterator, layout)


def partition(atom, smem, gmem, cta_rank=0, cta_count: int = 1, box_rank=None,
              gmem_box_rank=None):
    """Shared and global views of this CTA's TMA copies.

    The box is the leading ``box_rank`` modes of ``smem`` (default: all of them) and the
    leading ``gmem_box_rank`` modes of ``gmem`` (default: ``box_rank``); the remaining modes
    (stages; tile indices) stay indexable. With ``cta_count`` > 1 each CTA takes 1/N of the
    box and multicasts it to the others (``tma_partition`` does the split).
    """
    box_rank = cute.rank(smem) if box_rank is None else box_rank
    gmem_box_rank = box_rank if gmem_box_rank is None else gmem_box_rank
    s = cute.group_modes(smem, 0, box_rank)
    g = cute.group_modes(gmem, 0, gmem_box_rank)
    return cpasync.tma_partition(atom, cta_rank, cute.make_layout(cta_count), s, g)


def prefetch(atom):
    cpasync.prefetch_descriptor(atom)


def commit():
    """Close the TMA stores issued so far into one bulk async group."""
    cute.arch.cp_async_bulk_commit_group()


def wait(pending: int = 0):
    """Wait until at most ``pending`` bulk groups still *read* shared memory."""
    cute.arch.cp_async_bulk_wait_group(pending, read=True)
