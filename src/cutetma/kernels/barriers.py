"""Named-barrier ids (``bar.sync id, threads``) the kernels use beside their mbarriers.

Id 0 is ``__syncthreads``; the DSL's pipelines use none of these. Each kernel's ids are an
enum so a reader sees who synchronises with whom; a warpgroup-indexed barrier is
``FIRST + wg``.
"""

import enum


class GemmBarrier(enum.IntEnum):
    # the epilogue's consumers: all of them (cooperative), or each warpgroup its own
    # (pingpong: EPILOGUE + wg)
    EPILOGUE = 1
    # pingpong: warpgroup wg waits on TURN + wg for the other to issue its mainloop and
    # signals TURN + (1 - wg)
    TURN = 3


class AttentionBarrier(enum.IntEnum):
    # pingpong: warpgroup wg's turn to issue its two GEMMs (TURN + wg)
    TURN = 1
    # TMA-paged: warpgroup wg's zeros in a V stage's rows past the sequence are written
    # before its P V reads them (V_TAIL + wg, 128 threads)
    V_TAIL = 4


class BackwardBarrier(enum.IntEnum):
    # the attention backward: both consumer warpgroups' halves of dS are in shared memory
    # before either reads all of it for dQ (256 threads)
    DS_READY = 1
    # consumer warpgroup wg's dQ staging buffer: free (its last TMA reduction has read it)
    # and then written (DQ_STAGED + wg, 128 threads)
    DQ_STAGED = 2
