"""``FlashAttentionBackwardSm90``: dQ, dK, dV of ``softmax(Q K^T * scale) V`` on Hopper, the
load mechanism a parameter (FlashAttention-3's structure; ``BackwardConfig``).

One CTA per (key block n, head, batch): its 128 keys' K and V stay in shared memory while it
walks the query blocks that see them, 64 queries at a time (128 at d = 64, FA4's tile). Per
query block m::

    producer        Q_m, dO_m, LSE_m, D_m (TMA,  ---> Q / dO / LSE / D ring (full / empty
                    or cp.async by a warpgroup)        pairs); K_n, V_n once, own barrier
    consumer WG w   S^T  = K_w Q_m^T     dP^T = V_w dO_m^T           (SS WGMMA: keys on M,
      (w = 0, 1:                                                       so P^T and dS^T are
       keys 64 w ..  P^T  = exp2(S^T scale log2 e - LSE log2 e)        A fragments as they
       64 w + 63)    dS^T = P^T (dP^T - D)                               lie; RS WGMMA, B:
                    dV_w += P^T dO_m   (issued; ``dv_issue``)            dO, Q seen
                    dS^T -> shared memory (this warpgroup's 64 rows),   transposed in place)
                    DS_READY barrier
                    dQ_m[:, d half w] = dS K[:, d half w]   (SS WGMMA, all keys; at 128-query
                    blocks dQ_m[queries 64 w ..] = dS[64 w ..] K instead), then
                    dK_w += dS^T Q_m (RS); while dK runs, dQ_m goes to shared memory in the
                    MMA's fragment order and one TMA reduction adds it into the fp32
                    accumulator (same order; scaled and put in place by the conversion)
                    release Q_m / dO_m once dK is done
    end             dK_w * scale, dV_w to outputs, one per query head (fp32 under GQA: the
                    torch face sums a K/V head's group)

D = rowsum(dO * O) and the LSE (the forward's, as log2) come in as fp32 (b, h, s_q padded to
whole query blocks) tensors, +inf and 0 in the padding and +inf for rows that saw no key; the
torch face (``cutetma.backward``) makes them, zeroes the dQ accumulator and converts it.
Masking: keys past s_k, and (causal, bottom-right aligned) keys past a query's diagonal,
get P = 0; rows past s_q come in as zeros (TMA's out-of-bounds fill, cp.async's zero
vectors) with an LSE of +inf, so they add nothing. Both consumer warpgroups write their
half of dS into one of two buffers (alternating by query block), so a warpgroup never
overwrites a buffer the other may still read: to write block m + 2's dS it must have passed
block m + 1's DS_READY, which the other reaches only after finishing block m's dQ.

At d = 256 (``BackwardConfig.splits_d``) dK_w and dV_w of 64 keys x 256 would take all of a
warpgroup's registers, so a CTA holds 64 keys and the warpgroups split d instead::

    consumer WG w   S^T, dP^T of the 64 keys x queries 32 w .. 32 w + 31    (m64n32k16)
                    P^T and dS^T -> shared memory (two buffers each, by query block parity),
                    DS_READY barrier
                    dQ_m[:, d half w] = dS K[:, d half w], dV[:, d half w] += P^T dO_m,
                    dK[:, d half w] += dS^T Q_m       (SS WGMMA, m64n128k16, A from shared
                    memory, keys contiguous); dQ_m added into the accumulator from the
                    registers by 16-byte atomics in the same fragment order
    end             both halves of dK, dV through the freed Q / dO stage by one TMA store

That leaves no shared memory for a dQ staging beside two Q / dO stages (230 KB of 227 KiB's
232 KB), and the second stage is what keeps the producer ahead.

The first query block's dV and dK GEMMs start from zero (the MMA's accumulate flag), not from
zeroed registers: ptxas serializes every WGMMA when other instructions write an accumulator
while one is in flight, and a zero-fill placed by the scheduler is such a write.

Constraints: d in {64, 128, 256}. The fp32 reductions make dQ's low bits depend on the order
the key blocks arrive in; ``deterministic`` (what the torch face runs under
``torch.use_deterministic_algorithms``) adds them in key-block order instead: a turn counter
per (query block, head, batch), each warpgroup's half waiting for 2 n before its reduction
and counting itself once the reduction's writes are done (FlashAttention-3's semaphore).

The producers are ``backward_producers``'s, the dQ / dK / dV outputs ``backward_outputs``'s.
"""

from __future__ import annotations

from types import SimpleNamespace

from cutetma import dsl
from cutetma.copy import loader as loaders
from cutetma.copy import tma
from cutetma.kernels import accumulator
from cutetma.kernels.attention.backward_outputs import DQ_ROW, BackwardOutputs
from cutetma.kernels.attention.backward_producers import BackwardProducers
from cutetma.kernels.attention.config import (
    LOG2_E,
    WARPGROUP,
    BackwardConfig,
    dq_splits_rows,
)
from cutetma.kernels.attention.kernel import FlashAttentionSm90
from cutetma.kernels.barriers import BackwardBarrier

cutlass, cute = dsl.cutlass()
import cutlass.utils.hopper_helpers as sm90  # noqa: E402
from cuda.bindings import driver as cuda  # noqa: E402
from cutlass import pipeline  # noqa: E402
from cutlass.cute.nvgpu import warpgroup  # noqa: E402
from cutlass.tensor_utils import LayoutEnum  # noqa: E402


def stage_layout(dtype, rows: int, cols: int, stages: int, atom_cols: int):
    """A (rows, cols, stages) row-major shared-memory layout (cols contiguous) whose swizzle
    atom spans ``atom_cols`` columns: the widest atom that keeps a transposed view's slices
    atom-aligned (K seen as K^T is split by column halves between the dQ warpgroups)."""
    atom = warpgroup.make_smem_layout_atom(
        sm90.get_smem_layout_atom(LayoutEnum.ROW_MAJOR, dtype, atom_cols), dtype)
    return cute.tile_to_shape(atom, (rows, cols, stages), order=(0, 1, 2))


def dq_tiled_mma(dtype, head_dim: int, block_m: int, consumers: int):
    """dQ = dS K's tiled MMA, (queries, d), A (dS) K-major, B (K) seen transposed: the
    consumer warpgroups split the rows or the columns (``dq_splits_rows``). Its partition
    is the fragment order of the fp32 accumulator (``cutetma.backward.dq_from_fragments``)."""
    k_major, mn_major = cute.nvgpu.OperandMajorMode.K, cute.nvgpu.OperandMajorMode.MN
    if dq_splits_rows(block_m, consumers):
        atoms, tiler = (consumers, 1, 1), (64, head_dim)
    else:
        atoms, tiler = (1, consumers, 1), (64, head_dim // consumers)
    return sm90.make_trivial_tiled_mma(dtype, dtype, k_major, mn_major, cutlass.Float32, atoms,
                                       tiler_mn=tiler)


def stores_kv_tma(cfg, same_dtype: bool) -> bool:
    """Whether dK and dV leave by TMA through the freed Q and dO buffers, seen as 64-row
    stages (one per consumer warpgroup's 64 keys): 16-bit outputs, and room for them (a
    128-query stage at d = 64 is two 64-row stages, its swizzle atoms stacked by rows)."""
    return same_dtype and cfg.block_m * cfg.stages >= 64 * cfg.kv_out_stages and (
        cfg.block_m == 64 or cfg.head_dim <= 64)


def _transposed(sX):
    """The (rows, cols, stages) shared-memory tensor ``sX`` seen as (cols, rows, stages): the
    same bytes, so a K-major operand is also the MN-major operand of its transpose."""
    shape = (sX.shape[1], sX.shape[0], sX.shape[2])
    return cute.composition(sX, cute.make_ordered_layout(shape, order=(1, 0, 2)))


class FlashAttentionBackwardSm90(BackwardProducers, BackwardOutputs):
    def __init__(self, config: BackwardConfig):
        self.cfg = config
        self.loader = loaders.make_loader(config.load)

    # ------------------------------------------------------------------------ host
    @cute.jit
    def __call__(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mdO: cute.Tensor,
                 mLSE: cute.Tensor, mD: cute.Tensor, mdQ: cute.Tensor, mdK: cute.Tensor,
                 mdV: cute.Tensor, mTurns: cute.Tensor, softmax_scale: cutlass.Float32,
                 stream: cuda.CUstream):
        """mQ, mdO: (s_q, d, h, b); mK, mV: (s_k, d, h_kv, b); mLSE, mD: (s_q padded, h, b)
        fp32; mdQ: (rows, 256) fp32, dQ in the dQ MMA's fragment order
        (``cutetma.backward.dq_from_fragments``), added into (zeros on entry); mdK, mdV:
        (s_k, d, h, b), one per query head (the inputs' dtype, or fp32 for GQA's sums).
        ``deterministic``: mTurns (query blocks, h, b) int32, zeros on entry (unused
        otherwise)."""
        cfg = self.cfg
        dtype = mQ.element_type
        aligned = FlashAttentionSm90._aligned_strides
        mQ, mK, mV, mdO = (aligned(x) for x in (mQ, mK, mV, mdO))
        d, bm, bn = cfg.head_dim, cfg.block_m, cfg.block_n
        k_major, mn_major = cute.nvgpu.OperandMajorMode.K, cute.nvgpu.OperandMajorMode.MN
        f32 = cutlass.Float32
        if cutlass.const_expr(cfg.splits_d):
            # S^T and dP^T: (keys, queries), the 64 keys split by queries between the
            # warpgroups; dV and dK: (keys, d), split by d, the A operand (P^T, dS^T, keys
            # contiguous) from shared memory, where both warpgroups' halves meet
            sdp_mma = sm90.make_trivial_tiled_mma(dtype, dtype, k_major, k_major, f32,
                                                  (1, cfg.consumers, 1),
                                                  tiler_mn=(64, bm // cfg.consumers))
            dkv_mma = sm90.make_trivial_tiled_mma(dtype, dtype, mn_major, mn_major, f32,
                                                  (1, cfg.consumers, 1),
                                                  tiler_mn=(64, d // cfg.consumers))
        else:
            # S^T and dP^T: (keys, queries), a warpgroup per 64 keys
            sdp_mma = sm90.make_trivial_tiled_mma(dtype, dtype, k_major, k_major, f32,
                                                  (cfg.consumers, 1, 1), tiler_mn=(64, bm))
            # dV and dK: (keys, d), the A operand (P^T, dS^T) from registers
            dkv_mma = sm90.make_trivial_tiled_mma(dtype, dtype, k_major, mn_major, f32,
                                                  (cfg.consumers, 1, 1), tiler_mn=(64, d),
                                                  a_source=warpgroup.OperandSource.RMEM)
        dq_mma = dq_tiled_mma(dtype, d, bm, cfg.consumers)
        # K^T's slices as dQ's B operand: column halves where the warpgroups split d
        dq_cols = d if dq_splits_rows(bm, cfg.consumers) else d // cfg.consumers
        sK_layout = stage_layout(dtype, bn, d, 1, min(dq_cols, 64))
        sQ_layout = stage_layout(dtype, bm, d, cfg.stages, min(d, 64))
        sdS_layout = stage_layout(dtype, bm, bn, 2, 64)
        # dQ's staging: each consumer warpgroup's (64, d / 2) fp32 half in fragment order (a
        # thread's 4-value chunks side by side: 16-byte stores, no bank conflicts), added into
        # the same order in mdQ by a TMA reduction of a plain (d / 8, 256) box
        # TMA reduction
        dq_rows = cfg.dq_box_rows
        sdQ_layout = cute.make_layout((dq_rows, DQ_ROW, cfg.consumers),
                                      stride=(DQ_ROW, 1, dq_rows * DQ_ROW))
        tma_q, mQ_tma = tma.load_atom(mQ, cute.slice_(sQ_layout, (None, None, 0)), (bm, d))
        tma_do, mdO_tma = tma.load_atom(mdO, cute.slice_(sQ_layout, (None, None, 0)), (bm, d))
        tma_k, mK_tma = tma.load_atom(mK, cute.slice_(sK_layout, (None, None, 0)), (bn, d))
        tma_v, mV_tma = tma.load_atom(mV, cute.slice_(sK_layout, (None, None, 0)), (bn, d))
        tma_dq, mdQ_tma = tma.reduce_add_atom(mdQ, cute.slice_(sdQ_layout, (None, None, 0)),
                                              (dq_rows, DQ_ROW))
        # the LSE and D of a query block ride with its Q and dO: (block_m, stages) fp32
        sStat_layout = cute.make_layout((bm, cfg.stages))
        tma_lse, mLSE_tma = tma.load_atom(mLSE, cute.make_layout(bm), (bm,))
        tma_d, mD_tma = tma.load_atom(mD, cute.make_layout(bm), (bm,))
        # 16-bit dK and dV leave through the freed Q and dO stages (stage w: warpgroup w's 64
        # keys; one stage per warpgroup needed) by TMA stores; fp32 ones (GQA's, summed on
        # the host) from the registers. (The
        # store atoms are built from Q's view where they go unused: an fp32 view has no
        # 16-bit box.)
        stores_kv = stores_kv_tma(cfg, mdK.element_type == dtype)
        mdK_box, mdV_box = (aligned(x) for x in (mdK, mdV)) if stores_kv else (mQ, mQ)
        sKV_layout = stage_layout(dtype, 64, d, cfg.kv_out_stages, min(d, 64))
        tma_dk, mdK_tma = tma.store_atom(mdK_box, cute.slice_(sKV_layout, (None, None, 0)),
                                         (64, d))
        tma_dv, mdV_tma = tma.store_atom(mdV_box, cute.slice_(sKV_layout, (None, None, 0)),
                                         (64, d))

        @cute.struct
        class Storage:
            kv_full: cute.struct.MemRange[cutlass.Int64, 1]
            qdo_barriers: cute.struct.MemRange[cutlass.Int64, 2 * cfg.stages]
            sK: cute.struct.Align[cute.struct.MemRange[dtype, cute.cosize(sK_layout)], 1024]
            sV: cute.struct.Align[cute.struct.MemRange[dtype, cute.cosize(sK_layout)], 1024]
            sQ: cute.struct.Align[cute.struct.MemRange[dtype, cute.cosize(sQ_layout)], 1024]
            sdO: cute.struct.Align[cute.struct.MemRange[dtype, cute.cosize(sQ_layout)], 1024]
            sdS: cute.struct.Align[cute.struct.MemRange[dtype, cute.cosize(sdS_layout)], 1024]
            if cutlass.const_expr(cfg.splits_d):  # P^T's buffers; dQ by atomics, no staging
                sP: cute.struct.Align[cute.struct.MemRange[dtype, cute.cosize(sdS_layout)], 1024]
            else:
                sdQ: cute.struct.Align[cute.struct.MemRange[f32, cute.cosize(sdQ_layout)], 1024]
            sLSE: cute.struct.Align[cute.struct.MemRange[f32, cute.cosize(sStat_layout)], 128]
            sD: cute.struct.Align[cute.struct.MemRange[f32, cute.cosize(sStat_layout)], 128]

        self.storage = Storage
        grid = (cute.ceil_div(mK.shape[0], bn), mQ.shape[2], mQ.shape[3])
        self.kernel(tma_q, mQ_tma, tma_do, mdO_tma, tma_k, mK_tma, tma_v, mV_tma, tma_dq,
                    mdQ_tma, tma_lse, mLSE_tma, tma_d, mD_tma, tma_dk, mdK_tma, tma_dv, mdV_tma,
                    mQ, mK, mV, mdO, mLSE, mD, mdQ, mdK, mdV, mTurns, sdp_mma, dkv_mma, dq_mma,
                    sK_layout, sQ_layout, sdS_layout, sdQ_layout, sStat_layout, sKV_layout,
                    softmax_scale).launch(
            grid=grid, block=(cfg.threads, 1, 1), min_blocks_per_mp=1, stream=stream)

    @cute.jit
    def from_pointers(self, pQ: cute.Pointer, pK: cute.Pointer, pV: cute.Pointer,
                      pdO: cute.Pointer, pLSE: cute.Pointer, pD: cute.Pointer,
                      pdQ: cute.Pointer, pdK: cute.Pointer, pdV: cute.Pointer,
                      pTurns: cute.Pointer,
                      batch: cutlass.Int32, seqlen_q: cutlass.Int32, seqlen_k: cutlass.Int32,
                      heads: cutlass.Int32, heads_kv: cutlass.Int32,
                      q_s: cutlass.Int64, q_h: cutlass.Int64, q_b: cutlass.Int64,
                      k_s: cutlass.Int64, k_h: cutlass.Int64, k_b: cutlass.Int64,
                      v_s: cutlass.Int64, v_h: cutlass.Int64, v_b: cutlass.Int64,
                      do_s: cutlass.Int64, do_h: cutlass.Int64, do_b: cutlass.Int64,
                      softmax_scale: cutlass.Float32, stream: cuda.CUstream):
        """``__call__`` from base pointers, sizes and the (seq, head, batch) strides of the
        (b, s, h, d) inputs Q, K, V, dO (d contiguous); the LSE (log2) and D contiguous
        (b, h, s_q padded to whole query blocks) fp32; dQ in fragment order
        (``cutetma.backward.dq_from_fragments``), dK and dV (b, s_k, h, d) contiguous."""
        d = self.cfg.head_dim

        def view(pointer, seqlen, count, s, h, b):  # (b, s, h, d) -> (s, d, h, b)
            return cute.make_tensor(pointer, cute.make_layout(
                (seqlen, d, count, batch), stride=(s, 1, h, b)))

        def packed(pointer, seqlen):  # contiguous (b, s, h, d) fp32 -> (s, d, h, b)
            row = cutlass.Int64(heads) * d
            return view(pointer, seqlen, heads, row, cutlass.Int64(d),
                        row * cutlass.Int64(seqlen))

        blocks = (seqlen_q + self.cfg.block_m - 1) // self.cfg.block_m
        dq_rows = cute.make_tensor(pdQ, cute.make_layout(
            (batch * heads * blocks * self.cfg.consumers * self.cfg.dq_box_rows, DQ_ROW),
            stride=(DQ_ROW, 1)))
        turns = cute.make_tensor(pTurns, cute.make_layout(  # contiguous (b, h, query blocks)
            (blocks, heads, batch), stride=(1, blocks, blocks * heads)))

        def stats(pointer):  # contiguous (b, h, query blocks x block_m) -> (s_q padded, h, b)
            per_head = cute.assume(cutlass.Int64(blocks * self.cfg.block_m),
                                   divby=self.cfg.block_m)
            return cute.make_tensor(pointer, cute.make_layout(
                (blocks * self.cfg.block_m, heads, batch),
                stride=(1, per_head, per_head * cutlass.Int64(heads))))

        self(view(pQ, seqlen_q, heads, q_s, q_h, q_b), view(pK, seqlen_k, heads_kv, k_s, k_h, k_b),
             view(pV, seqlen_k, heads_kv, v_s, v_h, v_b),
             view(pdO, seqlen_q, heads, do_s, do_h, do_b), stats(pLSE), stats(pD),
             dq_rows, packed(pdK, seqlen_k), packed(pdV, seqlen_k),
             turns, softmax_scale, stream)

    # ------------------------------------------------------------------------ device
    @cute.kernel
    def kernel(self, tma_q: cute.CopyAtom, mQ_tma: cute.Tensor, tma_do: cute.CopyAtom,
               mdO_tma: cute.Tensor, tma_k: cute.CopyAtom, mK_tma: cute.Tensor,
               tma_v: cute.CopyAtom, mV_tma: cute.Tensor, tma_dq: cute.CopyAtom,
               mdQ_tma: cute.Tensor, tma_lse: cute.CopyAtom, mLSE_tma: cute.Tensor,
               tma_d: cute.CopyAtom, mD_tma: cute.Tensor, tma_dk: cute.CopyAtom,
               mdK_tma: cute.Tensor, tma_dv: cute.CopyAtom, mdV_tma: cute.Tensor,
               mQ: cute.Tensor, mK: cute.Tensor,
               mV: cute.Tensor, mdO: cute.Tensor, mLSE: cute.Tensor, mD: cute.Tensor,
               mdQ: cute.Tensor, mdK: cute.Tensor, mdV: cute.Tensor, mTurns: cute.Tensor,
               sdp_mma: cute.TiledMma, dkv_mma: cute.TiledMma, dq_mma: cute.TiledMma,
               sK_layout: cute.ComposedLayout, sQ_layout: cute.ComposedLayout,
               sdS_layout: cute.ComposedLayout, sdQ_layout: cute.Layout,
               sStat_layout: cute.Layout, sKV_layout: cute.ComposedLayout,
               softmax_scale: cutlass.Float32):
        cfg = self.cfg
        tidx, _, _ = cute.arch.thread_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        wg = cute.arch.make_warp_uniform(tidx // WARPGROUP)
        if cutlass.const_expr(cfg.load == "tma"):
            if warp == 0:
                for atom in (tma_q, tma_do, tma_k, tma_v, tma_lse, tma_d):
                    tma.prefetch(atom)
        if cutlass.const_expr(not cfg.splits_d):
            if warp == 4:
                tma.prefetch(tma_dq)
        storage = cutlass.memory.SmemAllocator().allocate(self.storage)
        smem = SimpleNamespace(
            sK=storage.sK.get_tensor(sK_layout.outer, swizzle=sK_layout.inner),
            sV=storage.sV.get_tensor(sK_layout.outer, swizzle=sK_layout.inner),
            sQ=storage.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner),
            sdO=storage.sdO.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner),
            # the same buffers as dK / dV's 64-row stages (the epilogue's)
            sQ_kv=storage.sQ.get_tensor(sKV_layout.outer, swizzle=sKV_layout.inner),
            sdO_kv=storage.sdO.get_tensor(sKV_layout.outer, swizzle=sKV_layout.inner),
            sdS=storage.sdS.get_tensor(sdS_layout.outer, swizzle=sdS_layout.inner),
            sLSE=storage.sLSE.get_tensor(sStat_layout), sD=storage.sD.get_tensor(sStat_layout))
        if cutlass.const_expr(cfg.splits_d):
            smem.sP = storage.sP.get_tensor(sdS_layout.outer, swizzle=sdS_layout.inner)
        else:
            smem.sdQ = storage.sdQ.get_tensor(sdQ_layout)
        kv_full = storage.kv_full.data_ptr()
        dtype = mQ.element_type
        tile_bytes = cute.size_in_bytes(dtype, cute.slice_(sQ_layout, (None, None, 0)))
        stat_bytes = cute.size_in_bytes(cutlass.Float32, cute.slice_(sStat_layout, (None, 0)))
        pipe = self.loader.make_pipeline(storage.qdo_barriers.data_ptr(), cfg.stages,
                                         WARPGROUP, 4 * cfg.consumers,
                                         2 * tile_bytes + 2 * stat_bytes)
        if warp == 0:
            with cute.arch.elect_one():
                cute.arch.mbarrier_init(kv_full, self.loader.barrier_count(WARPGROUP))
        pipeline.pipeline_init_arrive()
        pipeline.pipeline_init_wait()

        # the launch order, key blocks fastest: CTAs resident together share Q and dO in L2,
        # and key block n - 1 launches before n (the deterministic turns rely on it)
        n_block, head, batch = cute.arch.block_idx()
        seqlen_q, seqlen_k = mQ.shape[0], mK.shape[0]
        kv_head = head // (mQ.shape[2] // mK.shape[2])  # GQA: the query head's K/V head
        m_lo, m_hi = self._query_blocks(n_block, seqlen_q, seqlen_k)
        tile = SimpleNamespace(n_block=n_block, head=head, batch=batch, kv_head=kv_head,
                               heads=mQ.shape[2],
                               seqlen_q=seqlen_q, seqlen_k=seqlen_k, m_lo=m_lo, m_hi=m_hi)
        producer_regs, consumer_regs = cfg.registers
        if wg == 0:
            cute.arch.setmaxregister_decrease(producer_regs)
            if cutlass.const_expr(cfg.load == "tma"):
                if warp == 0:
                    self.produce(pipe, kv_full, tma_q, mQ_tma, tma_do, mdO_tma, tma_k, mK_tma,
                                 tma_v, mV_tma, tma_lse, mLSE_tma, tma_d, mD_tma, smem, tile,
                                 2 * cute.size_in_bytes(dtype, cute.slice_(sK_layout,
                                                                           (None, None, 0))))
            else:
                self.produce_cp_async(pipe, kv_full, mQ, mdO, mK, mV, mLSE, mD, smem, tile)
        else:
            cute.arch.setmaxregister_increase(consumer_regs)
            self.consume(pipe, kv_full, sdp_mma, dkv_mma, dq_mma, smem, tma_dq, mdQ_tma, mdQ,
                         mdK, mdV, mTurns, tile, softmax_scale,
                         (tma_dk, mdK_tma, tma_dv, mdV_tma))

    @cute.jit
    def _query_blocks(self, n_block, seqlen_q, seqlen_k):
        """The query blocks [lo, hi) that see key block ``n_block``: all of them, or
        (causal, bottom-right: query q sees key k iff k <= q + s_k - s_q) those from the
        first query whose diagonal reaches the block's first key."""
        cfg = self.cfg
        hi = cute.ceil_div(seqlen_q, cfg.block_m)
        lo = cutlass.Int32(0)
        if cutlass.const_expr(cfg.causal):
            first_query = n_block * cfg.block_n - (seqlen_k - seqlen_q)
            lo = cutlass.min(cutlass.max(first_query, 0) // cfg.block_m, hi)
        return lo, hi

    # ------------------------------------------------------------------------ consumers
    @cute.jit
    def consume(self, pipe, kv_full, sdp_mma, dkv_mma, dq_mma, smem, tma_dq, mdQ_tma, mdQ, mdK,
                mdV, mTurns, tile, softmax_scale, kv_stores):
        """A consumer warpgroup: its 64 keys (or, ``splits_d``, its half of d) against every
        query block (the module docstring's loop), then its part of dK and dV."""
        cfg = self.cfg
        dtype = smem.sK.element_type
        tidx, _, _ = cute.arch.thread_idx()
        ctid = tidx - WARPGROUP
        # warp-uniform, so the operand descriptors built from it stay in uniform registers
        wg = cute.arch.make_warp_uniform(ctid // WARPGROUP)
        first = wg * WARPGROUP  # the warpgroup's slice of each tiled MMA (its operands)
        sdp_wg, dkv_wg, dq_wg = (m.get_slice(first) for m in (sdp_mma, dkv_mma, dq_mma))
        sQt, sdOt, sKt = _transposed(smem.sQ), _transposed(smem.sdO), _transposed(smem.sK)
        tSrK = sdp_mma.make_fragment_A(sdp_wg.partition_A(smem.sK))
        tSrV = sdp_mma.make_fragment_A(sdp_wg.partition_A(smem.sV))
        tSrQ = sdp_mma.make_fragment_B(sdp_wg.partition_B(smem.sQ))
        tSrdO = sdp_mma.make_fragment_B(sdp_wg.partition_B(smem.sdO))
        tVrdOt = dkv_mma.make_fragment_B(dkv_wg.partition_B(sdOt))
        tKrQt = dkv_mma.make_fragment_B(dkv_wg.partition_B(sQt))
        tVrPt = tKrdSt = None  # splits_d: P^T and dS^T as dV's and dK's A, (keys, queries)
        if cutlass.const_expr(cfg.splits_d):
            tVrPt = dkv_mma.make_fragment_A(dkv_wg.partition_A(_transposed(smem.sP)))
            tKrdSt = dkv_mma.make_fragment_A(dkv_wg.partition_A(_transposed(smem.sdS)))
        tQrdS = dq_mma.make_fragment_A(dq_wg.partition_A(smem.sdS))
        tQrKt = dq_mma.make_fragment_B(dq_wg.partition_B(sKt))
        # this thread's values: (key, query) of S^T
        sdp_thr = sdp_mma.get_slice(ctid)
        tScS = sdp_thr.partition_C(cute.make_identity_tensor((cfg.block_n, cfg.block_m)))
        # dS^T goes into shared memory as it lies in the accumulator: (keys, queries, buffer)
        # ... and leaves through stmatrix, transposed (keys are contiguous in a dS row): four
        # 8 x 8 matrices per instruction, a few addresses a thread, not one per value
        r2s_ds = cute.make_tiled_copy_C(cute.make_copy_atom(
            cute.nvgpu.warp.StMatrix8x8x16bOp(transpose=True, num_matrices=4), dtype), sdp_mma)
        r2s_ds_thr = r2s_ds.get_slice(ctid)
        tSsdS = r2s_ds_thr.partition_D(_transposed(smem.sdS))  # (.., buffer)
        tSsP = None
        if cutlass.const_expr(cfg.splits_d):
            tSsP = r2s_ds_thr.partition_D(_transposed(smem.sP))  # P^T the same way
        s_shape = sdp_wg.partition_shape_C((cfg.block_n, cfg.block_m))
        acc_s = cute.make_rmem_tensor(s_shape, cutlass.Float32)
        acc_dp = cute.make_rmem_tensor(s_shape, cutlass.Float32)
        kv_shape = dkv_wg.partition_shape_C((cfg.block_n, cfg.head_dim))
        acc_dv = cute.make_rmem_tensor(kv_shape, cutlass.Float32)
        acc_dk = cute.make_rmem_tensor(kv_shape, cutlass.Float32)
        acc_dq = cute.make_rmem_tensor(dq_wg.partition_shape_C((cfg.block_m, cfg.head_dim)),
                                       cutlass.Float32)
        # P^T and dS^T in 16 bits, element by element: the A fragments of dV and dK (the
        # forward's P V argument: the m64nNk16 A layout is the accumulator's; splits_d:
        # what stmatrix takes to shared memory)
        steps = cute.size(acc_s) // 8
        frag_a = cute.make_layout(((2, 2, 2), 1, steps), stride=((1, 2, 4), 0, 8))
        tPr = cute.make_rmem_tensor(frag_a, dtype)
        tdSr = cute.make_rmem_tensor(frag_a, dtype)
        tPr_as_s = cute.make_tensor(tPr.iterator, acc_s.layout)
        tdSr_as_s = cute.make_tensor(tdSr.iterator, acc_s.layout)
        # this thread's distinct query columns (16 of 64), for the LSE and D
        cols = accumulator.value_offsets(sdp_mma, (cfg.block_n, cfg.block_m))
        scale_log2 = softmax_scale * LOG2_E
        ds_ready = pipeline.NamedBarrier(barrier_id=int(BackwardBarrier.DS_READY),
                                         num_threads=cfg.consumers * WARPGROUP)

        cute.arch.mbarrier_wait(kv_full, 0)
        if cutlass.const_expr(cfg.load == "cp_async"):
            cute.arch.fence_view_async_shared()  # K, V came through the generic proxy
        read = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, cfg.stages)
        key0 = tile.n_block * cfg.block_n
        # this warpgroup's half of dQ: its staging buffer and the TMA reduction's boxes, one
        # per (batch, head, query block, warpgroup) in that order (splits_d: the same boxes
        # of mdQ, added into by atomics)
        tDsD = tDgD = None
        if cutlass.const_expr(not cfg.splits_d):
            tDsD, tDgD = tma.partition(tma_dq, smem.sdQ, cute.local_tile(
                mdQ_tma, (cfg.dq_box_rows, DQ_ROW), (None, 0)), box_rank=2)
        dq_box0 = ((tile.batch * tile.heads + tile.head) * cute.ceil_div(
            tile.seqlen_q, cfg.block_m)) * cfg.consumers + wg
        dq_free = pipeline.NamedBarrier(barrier_id=int(BackwardBarrier.DQ_STAGED) + wg,
                                        num_threads=WARPGROUP)
        leader = (ctid % WARPGROUP) // 32 == 0  # the warp whose lane issues the reductions
        ops = SimpleNamespace(
            sdp_mma=sdp_mma, dkv_mma=dkv_mma, dq_mma=dq_mma, smem=smem, tile=tile,
            acc_s=acc_s, acc_dp=acc_dp, acc_dv=acc_dv, acc_dk=acc_dk, acc_dq=acc_dq,
            tSrK=tSrK, tSrQ=tSrQ, tSrV=tSrV, tSrdO=tSrdO, tVrdOt=tVrdOt, tKrQt=tKrQt,
            tQrdS=tQrdS, tQrKt=tQrKt, tPr=tPr, tdSr=tdSr, tPr_as_s=tPr_as_s,
            tdSr_as_s=tdSr_as_s, tScS=tScS, cols=cols, scale_log2=scale_log2, key0=key0,
            r2s_ds=r2s_ds, r2s_ds_thr=r2s_ds_thr, tSsdS=tSsdS, ds_ready=ds_ready,
            tVrPt=tVrPt, tKrdSt=tKrdSt, tSsP=tSsP, mdQ=mdQ,
            tma_dq=tma_dq, tDsD=tDsD, tDgD=tDgD, dq_box0=dq_box0, dq_free=dq_free,
            leader=leader, wg=wg, thread=ctid % WARPGROUP, mTurns=mTurns)
        for m in cutlass.range(tile.m_lo, tile.m_hi, unroll=1):
            stage = read.index
            self.loader.consumer_wait(pipe, read)
            self._issue_scores(ops, stage)
            self._scores_to_ds(ops, m, stage)
            self._issue_grads(ops, m, stage)
            if cutlass.const_expr(cfg.splits_d):
                warpgroup.wait_group(2)  # dQ done
                self._add_dq(ops, m)
            else:
                warpgroup.wait_group(1)  # dV and dQ done
                self._send_dq(ops, m)
            warpgroup.wait_group(0)  # dK has read Q's stage
            self.loader.consumer_release(pipe, read)
            read.advance()
        if tile.m_lo == tile.m_hi:  # no query sees these keys: no GEMM wrote dK, dV
            acc_dk.fill(0.0)
            acc_dv.fill(0.0)
        if cutlass.const_expr(stores_kv_tma(cfg, mdK.element_type == dtype)):
            self._store_kv_tma(acc_dk, acc_dv, dkv_mma, ctid, smem, kv_stores, ds_ready,
                               dq_free, leader, tile, softmax_scale)
        else:
            self._store_kv(acc_dk, acc_dv, dkv_mma.get_slice(ctid), mdK, mdV, key0, tile,
                           softmax_scale)
        if leader:
            tma.wait(0)  # the last reduction and stores have read their buffers

    @cute.jit
    def _issue_scores(self, ops, stage):
        """S^T = K Q^T and dP^T = V dO^T of the query block in ``stage``: two groups, so P
        is computed while dP^T still runs."""
        self._issue_ss(ops.sdp_mma, ops.acc_s, ops.tSrK, ops.tSrQ, 0, stage)
        warpgroup.commit_group()
        self._issue_ss(ops.sdp_mma, ops.acc_dp, ops.tSrV, ops.tSrdO, 0, stage)
        warpgroup.commit_group()

    @cute.jit
    def _scores_to_ds(self, ops, m, stage):
        """Block m's S^T and dP^T (issued) -> P^T (into dV += P^T dO, issued; ``splits_d``:
        into the block's P^T buffer) and dS^T into this warpgroup's half of the block's dS
        buffer, both halves in on return."""
        cfg = self.cfg
        dtype = ops.smem.sK.element_type
        acc_s, acc_dp = ops.acc_s, ops.acc_dp
        # 64-query blocks have the registers to read the LSE while S^T still runs and D
        # while dP^T does (read where used, each shared-memory latency stalled the exp2 or
        # the subtraction), and to run dV under the dS math (``dv_issue="early"``); 128-query
        # blocks (d = 64) read them where used and issue dV after it
        narrow = cfg.block_m == 64
        dv_early = cfg.dv_issue == "early"
        lses = self._per_column(ops.smem.sLSE, ops.tScS, ops.cols, stage) if narrow else None
        warpgroup.wait_group(1)  # S^T done
        self._mask(acc_s, ops.tScS, ops.key0, m * cfg.block_m, ops.tile)
        if cutlass.const_expr(not narrow):
            lses = self._per_column(ops.smem.sLSE, ops.tScS, ops.cols, stage)
        for j, lse in lses:
            for i in ops.cols.values_of[j]:
                acc_s[i] = cute.math.exp2(acc_s[i] * ops.scale_log2 - lse, fastmath=True)
        dsums = self._per_column(ops.smem.sD, ops.tScS, ops.cols, stage) if narrow else None
        ops.tPr_as_s.store(acc_s.load().to(dtype))
        buf = (m - ops.tile.m_lo) % 2
        if cutlass.const_expr(cfg.splits_d):
            # P^T into the block's buffer: each warpgroup's dV needs both warpgroups' queries
            cute.copy(ops.r2s_ds, ops.r2s_ds_thr.retile(ops.tPr_as_s),
                      ops.tSsP[(None, None, None, buf)])
            warpgroup.wait_group(0)  # dP^T done
        elif cutlass.const_expr(dv_early):
            self._issue_dv(ops, m, stage)
            warpgroup.wait_group(1)  # dP^T done
        else:
            warpgroup.wait_group(0)  # dP^T done
            if cutlass.const_expr(not narrow):
                dsums = self._per_column(ops.smem.sD, ops.tScS, ops.cols, stage)
        for j, dsum in dsums:
            for i in ops.cols.values_of[j]:
                acc_dp[i] = acc_s[i] * (acc_dp[i] - dsum)
        ops.tdSr_as_s.store(acc_dp.load().to(dtype))
        if cutlass.const_expr(not dv_early and not cfg.splits_d):
            self._issue_dv(ops, m, stage)
        cute.copy(ops.r2s_ds, ops.r2s_ds_thr.retile(ops.tdSr_as_s),
                  ops.tSsdS[(None, None, None, buf)])
        cute.arch.fence_view_async_shared()  # dS: generic writes, WGMMA reads
        ops.ds_ready.arrive_and_wait()  # both halves of dS are in

    @cute.jit
    def _issue_dv(self, ops, m, stage):
        """dV += P^T dO, P^T from registers (a group of its own)."""
        warpgroup.fence()
        self._issue_rs(ops.dkv_mma, ops.acc_dv, ops.tPr, ops.tVrdOt, stage, m > ops.tile.m_lo)
        warpgroup.commit_group()

    @cute.jit
    def _issue_grads(self, ops, m, stage):
        """dQ_m = dS K (this warpgroup's half of d) and dK += dS^T Q, two groups: dQ is
        staged and sent while dK's GEMM runs. ``splits_d``: dQ, dV += P^T dO and dK += dS^T
        Q, three groups, this warpgroup's half of d each, every A from shared memory."""
        buf = (m - ops.tile.m_lo) % 2
        later = m > ops.tile.m_lo
        self._issue_ss(ops.dq_mma, ops.acc_dq, ops.tQrdS, ops.tQrKt, buf, 0)
        warpgroup.commit_group()
        if cutlass.const_expr(self.cfg.splits_d):
            self._issue_ss(ops.dkv_mma, ops.acc_dv, ops.tVrPt, ops.tVrdOt, buf, stage, later)
            warpgroup.commit_group()
            self._issue_ss(ops.dkv_mma, ops.acc_dk, ops.tKrdSt, ops.tKrQt, buf, stage, later)
        else:
            warpgroup.fence()
            self._issue_rs(ops.dkv_mma, ops.acc_dk, ops.tdSr, ops.tKrQt, stage, later)
        warpgroup.commit_group()

    @staticmethod
    def _per_column(sX, tScS, cols, stage):
        """(j, value) for each of this thread's distinct query columns: the query's LSE (log2;
        +inf past s_q and for rows that saw no key) or D (0 past s_q), read from the stage's
        shared copy where it is used (held in registers across the loop, 2 x 32 of them at a
        128-query block, they pushed the WGMMAs' registers over the edge). Plain Python,
        unrolled while tracing."""
        base = tScS[0][1]
        return [(j, sX[base + col, stage]) for j, col in enumerate(cols.cols)]

    @cute.jit
    def _mask(self, acc_s, tScS, key0, q0, tile):
        """-inf for keys past s_k and (causal) past a query's diagonal; only where the block
        has such keys."""
        cfg = self.cfg
        offset = tile.seqlen_k - tile.seqlen_q
        needs = key0 + cfg.block_n > tile.seqlen_k
        if cutlass.const_expr(cfg.causal):
            needs = needs | (key0 + cfg.block_n - 1 > q0 + offset)
        if needs:
            for i in cutlass.range_constexpr(cute.size(acc_s)):
                key, query = tScS[i]
                key = key0 + key
                dead = key >= tile.seqlen_k
                if cutlass.const_expr(cfg.causal):
                    dead = dead | (key > q0 + query + offset)
                if dead:
                    acc_s[i] = -cutlass.Float32.inf

    @cute.jit
    def _issue_ss(self, mma, acc, tA, tB, a_stage, b_stage, accumulate=False):
        """acc = A B^T (acc += A B^T where ``accumulate``) over the k-steps, both operands
        in shared memory (not committed)."""
        warpgroup.fence()
        # a fresh atom, not the tiled MMA's field: a field set inside a branch or loop does
        # not reach uses outside it (IR dominance)
        atom = cute.make_mma_atom(mma.op)
        # each operand's stage sliced once: its k-steps are then constant offsets of one
        # descriptor (a 64-bit add each), not descriptors rebuilt from the runtime stage
        rA, rB = tA[(None, None, None, a_stage)], tB[(None, None, None, b_stage)]
        for kb in cutlass.range_constexpr(cute.size(tA, mode=[2])):
            atom.set(warpgroup.Field.ACCUMULATE, accumulate if kb == 0 else True)
            cute.gemm(atom, acc, rA[(None, None, kb)], rB[(None, None, kb)], acc)

    @cute.jit
    def _issue_rs(self, mma, acc, tA, tB, b_stage, accumulate):
        """acc += A B^T (acc = A B^T where ``accumulate`` is false: the first query block's,
        so no instruction but the WGMMAs ever writes the dK / dV accumulators, which ptxas
        needs to keep WGMMAs in flight across other code), A from registers (not
        committed)."""
        atom = cute.make_mma_atom(mma.op)
        rB = tB[(None, None, None, b_stage)]
        for kb in cutlass.range_constexpr(cute.size(tA, mode=[2])):
            atom.set(warpgroup.Field.ACCUMULATE, accumulate if kb == 0 else True)
            cute.gemm(atom, acc, tA[(None, None, kb)], rB[(None, None, kb)], acc)
