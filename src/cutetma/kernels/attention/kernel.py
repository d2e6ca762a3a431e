"""``FlashAttentionSm90``: the host entry points, the kernel's warp roles and the helpers its
producers (``producers.py``: TMA or cp.async) and consumer warpgroups (``consumers.py``)
share (the package docstring draws it)."""

from __future__ import annotations

from types import SimpleNamespace

from cutetma import dsl
from cutetma.copy import loader as loaders
from cutetma.copy import tma
from cutetma.kernels.attention import scheduler
from cutetma.kernels.attention.config import LOG2_E, WARPGROUP, AttentionConfig
from cutetma.kernels.attention.consumers import Consumers
from cutetma.kernels.attention.producers import Producers
from cutetma.kernels.attention.transposer import Transposer

cutlass, cute = dsl.cutlass()
import cutlass.utils.hopper_helpers as sm90  # noqa: E402
from cuda.bindings import driver as cuda  # noqa: E402
from cutlass import pipeline  # noqa: E402
from cutlass.cute.nvgpu import warpgroup  # noqa: E402
from cutlass.tensor_utils import LayoutEnum  # noqa: E402


class _Problem:
    """The launch's sizes as the tile walk reads them: ``rows`` of a (head, batch) tile
    column (s_q, or group x s_q packed; varlen_q: the longest sequence's), ``seqlen_q``
    (queries), ``group`` (packed rows per query: pack_gqa's group, else 1), ``heads`` (h,
    or h_kv packed), ``batches``, ``splits`` (split_kv), ``seqlen_k`` (dense keys),
    ``cu_seqlens_q`` (varlen_q's query offsets), ``descale`` (e4m3: the (2, h, b) descale
    factors, the scores' and the output's; else unread). A plain holder: the kernel's helpers are
    inlined, so it never crosses a compiled boundary."""

    def __init__(self, **sizes):
        self.__dict__.update(sizes)


class FlashAttentionSm90(Producers, Consumers, Transposer):
    def __init__(self, config: AttentionConfig):
        self.cfg = config
        self.loader = loaders.make_loader(config.load)

    @property
    def v_load_stages(self) -> int:
        """Depth of the ring V is loaded into: the raw one where ``transposes_v``."""
        return self.cfg.raw_v_stages or self.cfg.stages

    # ------------------------------------------------------------------------ host
    @cute.jit
    def __call__(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mO: cute.Tensor,
                 mLSE: cute.Tensor, softmax_scale: cutlass.Float32, sm_count: cutlass.Int32,
                 stream: cuda.CUstream):
        """mQ, mO: (s_q, d, h, b); mK, mV: (s_k, d, h_kv, b); mLSE: (s_q, h, b) fp32.
        (The torch face permutes (b, s, h, d) tensors into these views; d is contiguous.)
        ``sm_count``: how many CTAs run at once, the persistent grid's size (one CTA per SM:
        its 384 or 512 threads fill the register file)."""
        self._launch(mQ, mK, mV, mO, mLSE, None, None, softmax_scale, sm_count, 1, stream)

    @cute.jit
    def fp8(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mO: cute.Tensor,
            mLSE: cute.Tensor, mDescale: cute.Tensor, softmax_scale: cutlass.Float32,
            sm_count: cutlass.Int32, stream: cuda.CUstream):
        """``__call__`` with e4m3 Q, K and V (``transposes_v``: mV as K; else V^T,
        ``fp8_operands.transpose_v``: mV (keys, d, h_kv, b), keys contiguous) and their
        descale factors: mDescale (2, h_kv, b)
        fp32, per (K/V head, batch) the factor of the scores (q_descale x k_descale) and of
        the output (v_descale), FlashAttention-3's per-(batch, kv-head) convention."""
        self._launch(mQ, mK, mV, mO, mLSE, None, None, softmax_scale, sm_count, 1, stream,
                     mDescale=mDescale)

    @cute.jit
    def paged(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mO: cute.Tensor,
              mLSE: cute.Tensor, mPageTable: cute.Tensor, mSeqlensK: cute.Tensor,
              softmax_scale: cutlass.Float32, sm_count: cutlass.Int32,
              num_splits: cutlass.Int32, mCuSeqlensQ: cute.Tensor, seqlen_q: cutlass.Int32,
              stream: cuda.CUstream, mDescale: cute.Tensor = None):
        """Paged K/V: mK, mV are the cache pools seen as (page_size, d, h_kv, pages) (the
        torch (pages, page_size, h_kv, d) permuted); mPageTable (b, max_pages) int32 maps a
        sequence's i-th page to a pool page; mSeqlensK (b,) int32 its number of keys. mQ,
        mO, mLSE as in ``__call__`` (s_q the same for every sequence). ``split_kv``: mO
        and mLSE are fp32 partials for ``num_splits`` x b sequences (split s of sequence i
        at batch index s b + i), for the combine to merge. ``varlen_q``: mQ, mO
        (total_q, d, h, 1), mLSE (total_q, h, 1) (split_kv: batch index s), sequence i's
        queries rows mCuSeqlensQ[i] .. mCuSeqlensQ[i + 1] - 1, at most ``seqlen_q`` of
        them (else ``seqlen_q`` is unused). e4m3 pools (``transposes_v``): mDescale as
        ``fp8``'s."""
        self._launch(mQ, mK, mV, mO, mLSE, mPageTable, mSeqlensK, softmax_scale, sm_count,
                     num_splits, stream, mCuSeqlensQ, seqlen_q, mDescale)

    @cute.jit
    def _launch(self, mQ, mK, mV, mO, mLSE, mPageTable, mSeqlensK, softmax_scale, sm_count,
                num_splits, stream, mCuSeqlensQ=None, max_seqlen_q=None, mDescale=None):
        cfg = self.cfg
        dtype = mQ.element_type
        if cutlass.const_expr((dtype.width == 8) != (mDescale is not None)):
            raise ValueError("descale factors go with e4m3 operands (FlashAttentionSm90.fp8)")
        # Q, K, V: strides checked by the torch face; O: made there like Q (empty_like), so
        # its strides are as aligned as Q's (the epilogue's 16-byte stores rely on it)
        mQ, mK, mV, mO = (self._aligned_strides(x) for x in (mQ, mK, mV, mO))
        group = mQ.shape[2] // mK.shape[2]  # query heads per key/value head
        mQ_heads = mQ  # TMA's view of Q (unused where Q rows are gathered)
        group_q = 1  # rows per query
        if cutlass.const_expr(cfg.pack_gqa):
            group_q = group
            # a tile's rows are (group, s_q): the query heads of one K/V head, packed
            mQ, mO = self._pack_rows(mQ, group, 2), self._pack_rows(mO, group, 2)
            mLSE = self._pack_rows(mLSE, group, 1)
            group = 1
        # GQA: head hq reads key/value head hq // group, a stride-0 mode over the group
        mK = self._broadcast_heads(mK, group)
        mV = self._broadcast_heads(mV, group)
        if cutlass.const_expr(mDescale is not None):
            # (2, h_kv, b) -> (2, (group, h_kv), b): indexed by the tile's query head
            mDescale = cute.make_tensor(mDescale.iterator, cute.make_layout(
                (2, (group, mDescale.shape[1]), mDescale.shape[2]),
                stride=(mDescale.stride[0], (0, mDescale.stride[1]), mDescale.stride[2])))
        mVt = cute.make_tensor(mV.iterator, cute.make_layout(
            (mV.shape[1], mV.shape[0], mV.shape[2], mV.shape[3]),
            stride=(mV.stride[1], mV.stride[0], mV.stride[2], mV.stride[3])))  # (d, s_k, h, b)

        qk_tiler = (64, cfg.block_n, cfg.head_dim)
        pv_tiler = (64, cfg.head_dim, cfg.block_n)
        k_major, mn_major = cute.nvgpu.OperandMajorMode.K, cute.nvgpu.OperandMajorMode.MN
        # e4m3: WGMMA reads 8-bit B operands K-major only, so P V reads V^T, keys
        # contiguous (in ``fp8_operands.KEY_ORDER``), as K is read: made before the call
        # (v_transpose="global") or in shared memory from V as stored ("smem", raw ring)
        fp8 = dtype.width == 8
        if cutlass.const_expr(fp8 != (cfg.element_bytes == 1)):
            raise ValueError(f"element_bytes={cfg.element_bytes} with {dtype} operands")
        qk_mma = sm90.make_trivial_tiled_mma(dtype, dtype, k_major, k_major, cutlass.Float32,
                                             (cfg.consumers, 1, 1), tiler_mn=qk_tiler[:2])
        pv_mma = sm90.make_trivial_tiled_mma(dtype, dtype, k_major,
                                             k_major if fp8 else mn_major, cutlass.Float32,
                                             (cfg.consumers, 1, 1), tiler_mn=pv_tiler[:2],
                                             a_source=warpgroup.OperandSource.RMEM)
        row_major = LayoutEnum.ROW_MAJOR
        sQ_layout = sm90.make_smem_layout_a(row_major, (cfg.block_m, cfg.block_n, cfg.head_dim),
                                            dtype, cfg.q_stages)
        sK_layout = sm90.make_smem_layout_b(row_major, (cfg.block_m, cfg.block_n, cfg.head_dim),
                                            dtype, cfg.stages)
        sV_layout = sm90.make_smem_layout_b(LayoutEnum.ROW_MAJOR if fp8 else LayoutEnum.COL_MAJOR,
                                            (cfg.block_m, cfg.head_dim, cfg.block_n), dtype,
                                            cfg.stages)
        # the ring V is loaded into: V's own (P V's), or (transposes_v) the raw ring, laid out
        # as the 16-bit kernel's V stages (d contiguous)
        sVload_layout = sV_layout
        if cutlass.const_expr(cfg.transposes_v):
            sVload_layout = sm90.make_smem_layout_b(
                LayoutEnum.COL_MAJOR, (cfg.block_m, cfg.head_dim, cfg.block_n), dtype,
                cfg.raw_v_stages)
        tma_q, mQ_tma = tma.load_atom(mQ_heads, cute.slice_(sQ_layout, (None, None, 0)),
                                      (cfg.block_m, cfg.head_dim))
        # a K / V box: a whole stage (dense), or kv_box rows of it, each inside one page
        # (paged): the stage's own layout cut to the box, so the box's swizzle phase is the
        # stage's (kv_box is a multiple of the swizzle atom's 8 rows)
        box = cfg.kv_box
        k_box = cute.slice_(sK_layout, (None, None, 0))
        v_box = cute.slice_(sVload_layout, (None, None, 0))
        if cutlass.const_expr(cfg.paged):
            # (box, d) inside the stage's (block_n, d) coordinates: d's stride is block_n
            k_box = cute.composition(k_box, cute.make_layout((box, cfg.head_dim),
                                                             stride=(1, cfg.block_n)))
            v_box = cute.composition(v_box, cute.make_layout((cfg.head_dim, box)))
        tma_k, mK_tma = tma.load_atom(mK, k_box, (box, cfg.head_dim))
        tma_v, mV_tma = tma.load_atom(mVt, v_box, (cfg.head_dim, box))

        self.storage = self._storage(dtype, sQ_layout, sK_layout, sV_layout, sVload_layout)
        walk_rows = max_seqlen_q * group_q if cutlass.const_expr(cfg.varlen_q) else (
            cute.size(mQ, mode=[0]))
        batches = mSeqlensK.shape[0] if cutlass.const_expr(cfg.varlen_q) else mQ.shape[3]
        items = scheduler.work_items(cfg, walk_rows, mQ.shape[2], batches, num_splits)
        grid = (cutlass.min(items, sm_count) if cutlass.const_expr(cfg.persistent) else items,
                1, 1)
        # dense: no page table or lengths; the kernel takes the LSE in their place, unread
        if cutlass.const_expr(not cfg.paged):
            mPageTable, mSeqlensK = mLSE, mLSE
            mCuSeqlensQ = mLSE
        # varlen_q: the longest sequence's queries set the tile walk; else the kernel reads s_q
        # from Q's shape and takes neither
        if cutlass.const_expr(not cfg.varlen_q):
            mCuSeqlensQ, max_seqlen_q = mSeqlensK, cutlass.Int32(0)
        if cutlass.const_expr(mDescale is None):  # 16-bit: none, the LSE in its place, unread
            mDescale = mLSE
        self.kernel(tma_q, mQ_tma, tma_k, mK_tma, tma_v, mV_tma, mQ, mK, mVt, mO, mLSE,
                    mPageTable, mSeqlensK, qk_mma, pv_mma, sQ_layout, sK_layout, sV_layout,
                    sVload_layout, mK.shape[0], softmax_scale * LOG2_E, num_splits, mCuSeqlensQ,
                    max_seqlen_q, mDescale).launch(
            grid=grid, block=(cfg.threads, 1, 1), min_blocks_per_mp=1, stream=stream)

    def _storage(self, dtype, sQ_layout, sK_layout, sV_layout, sVraw_layout):
        """The kernel's shared memory: barriers (Q full then empty per buffer, a full and an
        empty per stage), then Q, K and V (P V's) stages and, where ``transposes_v``, the
        raw V ring (``sVraw_layout``) and its barriers. (Built from an annotation dict:
        this module's annotations are strings, which ``cute.struct`` does not read.)"""
        cfg = self.cfg

        def barriers(count):
            return cute.struct.MemRange[cutlass.Int64, count]

        def buffer(layout):
            return cute.struct.Align[cute.struct.MemRange[dtype, cute.cosize(layout)], 1024]

        fields = {"q_barriers": barriers(2 * cfg.q_stages),
                  "k_barriers": barriers(2 * cfg.stages), "v_barriers": barriers(2 * cfg.stages)}
        if cfg.transposes_v:
            fields["v_raw_barriers"] = barriers(2 * cfg.raw_v_stages)
        fields.update(sQ=buffer(sQ_layout), sK=buffer(sK_layout), sV=buffer(sV_layout))
        if cfg.transposes_v:
            fields["sVraw"] = buffer(sVraw_layout)
        return cute.struct(type("Storage", (), {"__annotations__": fields}))

    @cute.jit
    def from_pointers(self, pQ: cute.Pointer, pK: cute.Pointer, pV: cute.Pointer,
                      pO: cute.Pointer, pLSE: cute.Pointer, batch: cutlass.Int32,
                      seqlen_q: cutlass.Int32, seqlen_k: cutlass.Int32, heads: cutlass.Int32,
                      heads_kv: cutlass.Int32, head_dim: cutlass.Int32,
                      q_s: cutlass.Int64, q_h: cutlass.Int64, q_b: cutlass.Int64,
                      k_s: cutlass.Int64, k_h: cutlass.Int64, k_b: cutlass.Int64,
                      v_s: cutlass.Int64, v_h: cutlass.Int64, v_b: cutlass.Int64,
                      o_s: cutlass.Int64, o_h: cutlass.Int64, o_b: cutlass.Int64,
                      softmax_scale: cutlass.Float32, sm_count: cutlass.Int32,
                      stream: cuda.CUstream):
        """``__call__`` from base pointers, sizes and the (seq, head, batch) strides of the
        (b, s, h, d) tensors (d contiguous); the LSE is a contiguous (b, h, s_q) fp32 tensor.
        The tensors it builds have the types ``from_dlpack(...).mark_layout_dynamic()``
        gives (every size a dynamic Int32, every stride but d's a dynamic Int64), so the
        kernel is the same; a launch then passes scalars instead of five DLPack tensors,
        which lets ``cutetma.attention`` skip the DSL's per-call argument conversion."""
        self(*self._dense_views(pQ, pK, pV, pO, pLSE, batch, seqlen_q, seqlen_k, heads,
                                heads_kv, head_dim, q_s, q_h, q_b, k_s, k_h, k_b, v_s, v_h, v_b,
                                o_s, o_h, o_b), softmax_scale, sm_count, stream)

    @cute.jit
    def fp8_from_pointers(self, pQ: cute.Pointer, pK: cute.Pointer, pV: cute.Pointer,
                          pO: cute.Pointer, pLSE: cute.Pointer, pDescale: cute.Pointer,
                          batch: cutlass.Int32, seqlen_q: cutlass.Int32,
                          seqlen_k: cutlass.Int32, heads: cutlass.Int32,
                          heads_kv: cutlass.Int32, head_dim: cutlass.Int32,
                          q_s: cutlass.Int64, q_h: cutlass.Int64, q_b: cutlass.Int64,
                          k_s: cutlass.Int64, k_h: cutlass.Int64, k_b: cutlass.Int64,
                          v_s: cutlass.Int64, v_h: cutlass.Int64, v_b: cutlass.Int64,
                          o_s: cutlass.Int64, o_h: cutlass.Int64, o_b: cutlass.Int64,
                          softmax_scale: cutlass.Float32, sm_count: cutlass.Int32,
                          stream: cuda.CUstream):
        """``fp8`` from pointers, as ``from_pointers``; the descales a contiguous
        (b, h_kv, 2) fp32 tensor."""
        mDescale = cute.make_tensor(pDescale, cute.make_layout(
            (2, heads_kv, batch), stride=(1, 2, 2 * heads_kv)))
        mQ, mK, mV, mO, mLSE = self._dense_views(pQ, pK, pV, pO, pLSE, batch, seqlen_q,
                                                 seqlen_k, heads, heads_kv, head_dim, q_s, q_h,
                                                 q_b, k_s, k_h, k_b, v_s, v_h, v_b, o_s, o_h,
                                                 o_b)
        self.fp8(mQ, mK, mV, mO, mLSE, mDescale, softmax_scale, sm_count, stream)

    def _dense_views(self, pQ, pK, pV, pO, pLSE, batch, seqlen_q, seqlen_k, heads, heads_kv,
                     head_dim, q_s, q_h, q_b, k_s, k_h, k_b, v_s, v_h, v_b, o_s, o_h, o_b):
        """Q, K, V, O as (s, d, h, b) views of (b, s, h, d) tensors (e4m3 V: V^T, keys
        contiguous, ``v_s`` d's stride) and the LSE (s_q, h, b) of a contiguous (b, h, s_q)
        one: what ``from_pointers`` and ``fp8_from_pointers`` hand their entries (e4m3 V
        as K where ``transposes_v``)."""
        def view(pointer, seqlen, count, s, h, b):  # (b, s, h, d) -> (s, d, h, b)
            return cute.make_tensor(pointer, cute.make_layout(
                (seqlen, head_dim, count, batch), stride=(s, 1, h, b)))

        per_head = cutlass.Int64(seqlen_q)
        mLSE = cute.make_tensor(pLSE, cute.make_layout(
            (seqlen_q, heads, batch), stride=(1, per_head, per_head * cutlass.Int64(heads))))
        mV = view(pV, seqlen_k, heads_kv, v_s, v_h, v_b)
        if cutlass.const_expr(pV.dtype.width == 8 and not self.cfg.transposes_v):
            # e4m3: V^T (b, h_kv, d, keys in whole 32-key chunks), keys contiguous, ``v_s``
            # d's stride (fp8_operands.transpose_v)
            keys = (seqlen_k + 31) // 32 * 32
            mV = cute.make_tensor(pV, cute.make_layout((keys, head_dim, heads_kv, batch),
                                                       stride=(1, v_s, v_h, v_b)))
        return (view(pQ, seqlen_q, heads, q_s, q_h, q_b),
                view(pK, seqlen_k, heads_kv, k_s, k_h, k_b), mV,
                view(pO, seqlen_q, heads, o_s, o_h, o_b), mLSE)

    @cute.jit
    def paged_from_pointers(self, pQ: cute.Pointer, pK: cute.Pointer, pV: cute.Pointer,
                            pO: cute.Pointer, pLSE: cute.Pointer, pPageTable: cute.Pointer,
                            pSeqlensK: cute.Pointer, batch: cutlass.Int32,
                            seqlen_q: cutlass.Int32, heads: cutlass.Int32,
                            heads_kv: cutlass.Int32, head_dim: cutlass.Int32,
                            pages: cutlass.Int32, max_pages: cutlass.Int32,
                            q_s: cutlass.Int64, q_h: cutlass.Int64, q_b: cutlass.Int64,
                            k_s: cutlass.Int64, k_h: cutlass.Int64, k_p: cutlass.Int64,
                            v_s: cutlass.Int64, v_h: cutlass.Int64, v_p: cutlass.Int64,
                            o_s: cutlass.Int64, o_h: cutlass.Int64, o_b: cutlass.Int64,
                            table_b: cutlass.Int64, softmax_scale: cutlass.Float32,
                            sm_count: cutlass.Int32, num_splits: cutlass.Int32,
                            pCuSeqlensQ: cute.Pointer, total_q: cutlass.Int32,
                            pDescale: cute.Pointer, stream: cuda.CUstream):
        """``paged`` from base pointers, sizes and strides: Q, O (b, s_q, h, d); the pools
        (pages, page_size, h_kv, d) with (row, head, page) strides; the page table
        (b, max_pages) with row stride ``table_b``; the cache lengths (b,) contiguous; the
        LSE a contiguous (b, h, s_q) fp32 tensor. ``split_kv``: O (num_splits b, s_q, h, d)
        and the LSE (num_splits b, h, s_q), both fp32 partials. ``varlen_q``: Q, O
        (total_q, h, d) (their batch stride unused), the LSE (h, total_q) (split_kv: O
        (num_splits, total_q, h, d), the LSE (num_splits, h, total_q)), the query offsets
        (b + 1,) contiguous, ``seqlen_q`` the longest sequence's queries; else the offsets
        and ``total_q`` are unused. e4m3 pools: the descales a contiguous (b, h_kv, 2) fp32
        tensor at ``pDescale`` (16-bit: unread)."""
        def view(pointer, rows, count, outer, s, h, b):  # -> (rows, d, h, outer)
            return cute.make_tensor(pointer, cute.make_layout(
                (rows, head_dim, count, outer), stride=(s, 1, h, b)))

        out_batch = batch * num_splits if cutlass.const_expr(self.cfg.split_kv) else batch
        q_rows, q_batch = seqlen_q, batch  # Q's and O's (rows, batch) modes
        if cutlass.const_expr(self.cfg.varlen_q):
            q_rows, q_batch = total_q, 1
            out_batch = num_splits if cutlass.const_expr(self.cfg.split_kv) else 1
        per_head = cutlass.Int64(q_rows)
        mLSE = cute.make_tensor(pLSE, cute.make_layout(
            (q_rows, heads, out_batch),
            stride=(1, per_head, per_head * cutlass.Int64(heads))))
        offsets = cute.make_tensor(pCuSeqlensQ, cute.make_layout((batch + 1,), stride=(1,)))
        table = cute.make_tensor(pPageTable, cute.make_layout((batch, max_pages),
                                                              stride=(table_b, 1)))
        lengths = cute.make_tensor(pSeqlensK, cute.make_layout((batch,), stride=(1,)))
        size = self.cfg.page_size
        mDescale = None
        if cutlass.const_expr(pQ.dtype.width == 8):
            mDescale = cute.make_tensor(pDescale, cute.make_layout(
                (2, heads_kv, batch), stride=(1, 2, 2 * heads_kv)))
        self.paged(view(pQ, q_rows, heads, q_batch, q_s, q_h, q_b),
                   view(pK, size, heads_kv, pages, k_s, k_h, k_p),
                   view(pV, size, heads_kv, pages, v_s, v_h, v_p),
                   view(pO, q_rows, heads, out_batch, o_s, o_h, o_b), mLSE, table, lengths,
                   softmax_scale, sm_count, num_splits, offsets, seqlen_q, stream, mDescale)

    @staticmethod
    def _aligned_strides(mX: cute.Tensor):
        """The same (s, d, h, b) tensor with its dynamic strides declared multiples of 16 bytes
        (the torch face checked them). ``mark_layout_dynamic`` strides carry no divisibility,
        so the (head, batch) slice the cp.async producer copies from would look 2-byte aligned
        and the 16-byte cp.async would be refused at compile time."""
        vec = 128 // mX.element_type.width
        stride = tuple(s if isinstance(s, int) else cute.assume(s, divby=vec)
                       for s in mX.stride)
        return cute.make_tensor(mX.iterator, cute.make_layout(mX.shape, stride=stride))

    @staticmethod
    def _pack_rows(mX: cute.Tensor, group, head_mode: int):
        """(s, ..., h, ...) -> ((group, s), ..., h // group, ...): row r of the packed mode is
        position r // group of head r % group of its K/V head's group (``pack_gqa``).
        ``head_mode``: where h is (2 for Q and O (s, d, h, b), 1 for the LSE (s, h, b))."""
        shape, stride = list(mX.shape), list(mX.stride)
        shape[0] = (group, mX.shape[0])
        stride[0] = (mX.stride[head_mode], mX.stride[0])
        shape[head_mode] = mX.shape[head_mode] // group
        stride[head_mode] = mX.stride[head_mode] * group
        return cute.make_tensor(mX.iterator, cute.make_layout(tuple(shape), stride=tuple(stride)))

    @staticmethod
    def _broadcast_heads(mX: cute.Tensor, group):
        """(s, d, h_kv, b) -> (s, d, (group, h_kv), b) with stride 0 over the group."""
        layout = cute.make_layout(
            (mX.shape[0], mX.shape[1], (group, mX.shape[2]), mX.shape[3]),
            stride=(mX.stride[0], mX.stride[1], (0, mX.stride[2]), mX.stride[3]))
        return cute.make_tensor(mX.iterator, layout)

    # ------------------------------------------------------------------------ device
    @cute.kernel
    def kernel(self, tma_q: cute.CopyAtom, mQ_tma: cute.Tensor, tma_k: cute.CopyAtom,
               mK_tma: cute.Tensor, tma_v: cute.CopyAtom, mV_tma: cute.Tensor,
               mQ: cute.Tensor, mK: cute.Tensor, mVt: cute.Tensor,
               mO: cute.Tensor, mLSE: cute.Tensor, mPageTable: cute.Tensor,
               mSeqlensK: cute.Tensor, qk_mma: cute.TiledMma,
               pv_mma: cute.TiledMma, sQ_layout: cute.ComposedLayout,
               sK_layout: cute.ComposedLayout, sV_layout: cute.ComposedLayout,
               sVload_layout: cute.ComposedLayout, seqlen_k: cutlass.Int32,
               scale_log2: cutlass.Float32, num_splits: cutlass.Int32,
               mCuSeqlensQ: cute.Tensor, max_seqlen_q: cutlass.Int32,
               mDescale: cute.Tensor):
        cfg = self.cfg
        tidx, _, _ = cute.arch.thread_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        # redux.sync, not make_warp_uniform (a shuffle, which ptxas folds back to tid / 128):
        # its result lands in a uniform register, so ptxas takes the role branch as
        # warp-uniform. With the shuffle, ptxas could treat the branch (and everything under
        # it) as divergent: the paged producer lost its uniform datapath and every TMA box
        # took a loop over lanes (BRA.U.ANY), 2x slower at page 16 non-causal
        wg = cute.arch.warp_redux_sync(tidx // WARPGROUP, "min")
        if cutlass.const_expr(cfg.split_kv):
            # the combine that follows (SplitCombine, a programmatic dependent launch) may be
            # scheduled now: it waits for this grid's end before reading, and its launch
            # runs under this kernel instead of after it
            cute.arch.griddepcontrol_launch_dependents()
        if warp == 0:
            tma.prefetch(tma_q)
            tma.prefetch(tma_k)
            tma.prefetch(tma_v)

        storage = cutlass.memory.SmemAllocator().allocate(self.storage)
        sQ = storage.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)
        sK = storage.sK.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)
        sV = storage.sV.get_tensor(sV_layout.outer, swizzle=sV_layout.inner)
        q_full = storage.q_barriers.data_ptr()  # buffer i: q_full + i, q_empty + i
        q_empty = q_full + cfg.q_stages
        k_bytes = cute.size_in_bytes(mQ.element_type, cute.slice_(sK_layout, (None, None, 0)))
        v_bytes = cute.size_in_bytes(mQ.element_type, cute.slice_(sVload_layout, (None, None, 0)))
        q_bytes = cute.size_in_bytes(mQ.element_type, cute.slice_(sQ_layout, (None, None, 0)))
        # K and V each have their own ring (same depth, filled in lockstep): a consumer frees
        # K_j as soon as S_j is computed and V_j after P V, so the producer can run ahead
        # even when an overlapped iteration holds V_{j-1} and K_j at once
        pipe_k = self.loader.make_pipeline(storage.k_barriers.data_ptr(), cfg.stages,
                                           WARPGROUP, 4 * cfg.consumers, k_bytes)
        # transposes_v: V lands in the raw ring (pipe_v_load) and P V reads the V^T ring
        # (pipe_v) the producer warpgroup fills from it (``transposer.py``)
        sVload = sV
        v_rings = None
        if cutlass.const_expr(cfg.transposes_v):
            sVload = storage.sVraw.get_tensor(sVload_layout.outer, swizzle=sVload_layout.inner)
            v_rings = self.word_rings(storage, sVload_layout, sV_layout)
            pipe_v_load, pipe_v = self.make_v_rings(storage, v_bytes)
        else:
            pipe_v = self.loader.make_pipeline(storage.v_barriers.data_ptr(), cfg.stages,
                                               WARPGROUP, 4 * cfg.consumers, v_bytes)
            pipe_v_load = pipe_v
        if warp == 0:
            with cute.arch.elect_one():
                for i in cutlass.range_constexpr(cfg.q_stages):
                    cute.arch.mbarrier_init(q_full + i, self._q_arrivals())
                    # every consumer thread arrives
                    cute.arch.mbarrier_init(q_empty + i, cfg.consumers * WARPGROUP)
        # the barriers must be initialized before anyone waits on them
        pipeline.pipeline_init_arrive()
        pipeline.pipeline_init_wait()

        # O's sizes (Q's: the same view), which the epilogue holds anyway; split_kv's O has
        # num_splits x b batches, Q has b
        rows = cute.size(mO, mode=[0])
        prob = _Problem(rows=rows, seqlen_q=rows, group=1, heads=mO.shape[2],
                        batches=mQ.shape[3] if cutlass.const_expr(cfg.split_kv) else mO.shape[3],
                        splits=num_splits, seqlen_k=seqlen_k, cu_seqlens_q=mCuSeqlensQ,
                        descale=mDescale)
        if cutlass.const_expr(cfg.pack_gqa):
            prob.group, prob.seqlen_q = mO.shape[0][0], mO.shape[0][1]
        if cutlass.const_expr(cfg.varlen_q):
            # Q is every sequence's queries end to end: the walk covers the longest
            prob.seqlen_q, prob.batches = max_seqlen_q, mSeqlensK.shape[0]
            prob.rows = max_seqlen_q * prob.group
        items = scheduler.work_items(cfg, rows, prob.heads, prob.batches, num_splits)
        producer_regs, consumer_regs = cfg.registers
        if wg == 0:
            cute.arch.setmaxregister_decrease(producer_regs)
            if cutlass.const_expr(cfg.load == "tma"):
                if warp == 0:
                    self.produce(pipe_k, pipe_v_load, q_full, q_empty, q_bytes, tma_q, mQ_tma,
                                 tma_k, mK_tma, tma_v, mV_tma, mQ, sQ, sK, sVload, mPageTable,
                                 mSeqlensK, items, prob)
                if cutlass.const_expr(cfg.transposes_v):
                    if warp > 0:  # warps 1-3 transpose what warp 0 loads
                        self.transpose_walk(pipe_v_load, pipe_v, v_rings, mSeqlensK, items,
                                            prob, tidx - 32)
            else:
                transpose = None
                if cutlass.const_expr(cfg.transposes_v):
                    def transpose(count):
                        self.transpose_block(pipe_v_load, pipe_v, v_rings, count,
                                             cfg.block_n, tidx)
                self.produce_cp_async(pipe_k, pipe_v_load, q_full, q_empty, mQ, mK, mVt, sQ, sK,
                                      sVload, mPageTable, mSeqlensK, items, prob, transpose)
        else:
            cute.arch.setmaxregister_increase(consumer_regs)
            self.consume(pipe_k, pipe_v, q_full, q_empty, qk_mma, pv_mma, sQ, sK, sV, mO, mLSE,
                         mSeqlensK, items, prob, scale_log2)

    @cute.jit
    def _v_wait(self, pipe_v, state):
        """A consumer's wait for P V's stage: the loader's, or (``transposes_v``) the V^T
        ring's (the transposer fenced its stores already)."""
        if cutlass.const_expr(self.cfg.transposes_v):
            pipe_v.consumer_wait(state)
        else:
            self.loader.consumer_wait(pipe_v, state)

    @cute.jit
    def _v_release(self, pipe_v, state):
        """A consumer's release of P V's stage: the loader's, or (``transposes_v``) lane 0
        of each warp on the V^T ring."""
        if cutlass.const_expr(self.cfg.transposes_v):
            if cute.arch.lane_idx() == 0:
                pipe_v.consumer_release(state)
        else:
            self.loader.consumer_release(pipe_v, state)

    def _q_arrivals(self) -> int:
        """Arrivals that fill a Q buffer: the loader's (TMA: one, with the bytes), or
        (Q gathered by rows under the TMA producer) the producer warp's 32 cp.async
        threads."""
        if self.cfg.gathers_q and self.cfg.load == "tma":
            return 32
        return self.loader.barrier_count(WARPGROUP)

    @cute.jit
    def _tile(self, item, half, prob, mSeqlensK):
        """Tile ``half`` of work item ``item`` as both roles walk it: its coordinates
        (m_block, head, batch, split), its keys (kv_len) and its sequence's queries
        (q_start, seqlen_q, rows: ``_tile_queries``); the caller adds its key blocks
        (``_key_blocks``: the producer once its loaders are traced, which keeps its
        instruction order)."""
        m_block, head, batch, split = scheduler.tile_coords(self.cfg, item, half, prob.rows,
                                                            prob.heads, prob.batches)
        kv_len = self._kv_len(mSeqlensK, batch, prob.seqlen_k)
        q_start, seqlen_q, rows = self._tile_queries(batch, prob)
        return SimpleNamespace(m_block=m_block, head=head, batch=batch, split=split,
                               kv_len=kv_len, q_start=q_start, seqlen_q=seqlen_q, rows=rows)

    @cute.jit
    def _key_blocks(self, tile, prob):
        """``tile`` with its key blocks [lo, hi) (``_key_range``)."""
        tile.lo, tile.hi = self._key_range(tile.m_block, tile.split, tile.kv_len, prob,
                                           tile.seqlen_q, tile.rows)
        return tile

    @cute.jit
    def _kv_len(self, mSeqlensK, batch, seqlen_k):
        """Keys of this tile's sequence: ``seqlen_k`` (dense), or its cache length (paged)."""
        if cutlass.const_expr(self.cfg.paged):
            return mSeqlensK[batch]
        return seqlen_k

    @cute.jit
    def _key_range(self, m_block, split, kv_len, prob, seqlen_q, rows):
        """The key blocks [lo, hi) a tile walks: those its rows see (``key_blocks``), or
        (split_kv) its split's range of them; none for a varlen_q tile past its sequence's
        rows (it still takes its Q buffer and stores nothing, like a tile without keys)."""
        n_blocks = scheduler.key_blocks(self.cfg, m_block, seqlen_q, kv_len, prob.group)
        if cutlass.const_expr(self.cfg.varlen_q):
            n_blocks = cutlass.select_(m_block * self.cfg.block_m < rows, n_blocks, 0)
        return scheduler.block_range(self.cfg, n_blocks, split, prob.splits)

    @cute.jit
    def _tile_queries(self, batch, prob):
        """(the sequence's first row in Q, its queries, its tile rows): (0, s_q, rows), or
        (varlen_q) from the query offsets."""
        if cutlass.const_expr(self.cfg.varlen_q):
            start = prob.cu_seqlens_q[batch]
            count = prob.cu_seqlens_q[batch + 1] - start
            return start, count, count * prob.group
        return 0, prob.seqlen_q, prob.rows

    @cute.jit
    def _sequence_rows(self, mX, q_start):
        """``mX`` (rows, ...) seen from a varlen_q sequence's first query (packed rows:
        the position sub-mode is offset); unchanged otherwise."""
        if cutlass.const_expr(not self.cfg.varlen_q):
            return mX
        offset = [0] * cute.rank(mX)
        offset[0] = (0, q_start) if cutlass.const_expr(self.cfg.pack_gqa) else q_start
        return cute.domain_offset(tuple(offset), mX)

    def _ring(self, done, producer: bool = False, stages: int = 0):
        """The pipeline state after ``done`` key blocks, rebuilt from that count at each
        tile: a state advanced inside a helper's or a branch's staged loop does not reliably
        come back out of it (the tracer rebuilds such objects), while a plain Int32 count
        does. Producers start on phase 1 (every stage empty), consumers on 0. ``stages``:
        the ring's depth where it is not the K ring's (the raw V ring of ``transposes_v``)."""
        stages = stages or self.cfg.stages
        phase = (done // stages) % 2
        if producer:
            phase = 1 - phase
        return pipeline.PipelineState(stages, done, done % stages, phase)

    @cute.jit
    def _q_slot(self, local):
        """Tile ``local``'s Q buffer and the phase of its full barrier (buffer i serves tiles
        i, i + q_stages, ...). One buffer: buffer 0, a constant, as before there were two."""
        if cutlass.const_expr(self.cfg.q_stages == 1):
            return 0, local % 2
        return local % self.cfg.q_stages, (local // self.cfg.q_stages) % 2
