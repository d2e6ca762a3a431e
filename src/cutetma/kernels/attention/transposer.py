"""FP8 attention's V transposed in shared memory (``AttentionConfig.transposes_v``), a mixin of
``FlashAttentionSm90`` (``kernel.py`` holds the class).

WGMMA reads 8-bit B operands K-major only, so P V needs V^T: (d, keys), keys contiguous, in
``fp8_operands.KEY_ORDER``. A cache holds V as (keys, d) rows. So V is loaded as stored, by
either producer and dense or paged, into a raw ring laid out as the 16-bit kernel's V
stages (d contiguous), and the producer warpgroup rewrites each raw stage as V^T into the
ring P V reads (FlashAttention-3's in-shared-memory transpose)::

    loader      V_j (TMA boxes / cp.async) ------------------> raw ring   (raw full / empty)
    transposer  wait raw full and V^T empty; per 4 x 4 bytes: 4 words in (4 keys x 4 d),
                8 byte permutes, 4 words out (4 d x 4 key slots); proxy fence; arrive
                V^T full; release the raw stage
    consumers   wait V^T full, P V, release V^T (lane 0 of each warp: 8 arrivals)

Who transposes: under TMA, warps 1-3 of the producer warpgroup, walking the tiles as the
consumers do (warp 0 only issues loads, as in the 16-bit kernel); under cp.async the 128
copying threads, block j - 1 right after issuing block j's copies (so they never wait on
copies they have just issued; hence two raw stages at least). Keys past a paged sequence
are written as zeros (a TMA box brings whatever the page holds there; P is 0 there and
0 x NaN is NaN); dense TMA and cp.async bring zeros already.

A warp takes a 16 (d) x 32 (key slot) patch, lane l the 4 x 4 bytes at d 4 (l % 4), slots
4 (l / 4): with the raw stage's swizzle and V^T's, each of its 4-byte loads and stores meets
at most one other lane in a bank (2-way; V^T's stores 4-way at d = 256's 96-key tile), the
fewest of the patch shapes; a warp's 32 lanes along the slots meet 8 ways on the loads,
along d 16 on the stores (``patch_bank_conflicts`` evaluates them on the layouts).
"""

from __future__ import annotations

from cutetma import dsl
from cutetma.kernels.attention import scheduler

cutlass, cute = dsl.cutlass()
from cutlass import pipeline  # noqa: E402

# slot 4 g + i of a 16-slot group holds key 2 g + KEY_STEP[i] (``fp8_operands.KEY_ORDER``)
KEY_STEP = (0, 1, 8, 9)
# prmt selectors: a pair of words (keys i, i + 1) -> their bytes 0 and 1 (LOW) or 2 and 3
# (HIGH) interleaved; two such pairs -> the words of d rows 4 w + 0, 1 (from LOW) and 2, 3
# (from HIGH): byte i of row b's word is key i's byte b
PAIR_LOW, PAIR_HIGH = 0x5140, 0x7362
ROW_EVEN, ROW_ODD = 0x5410, 0x7632
# a warp's patch: D_LANES lanes along d (4 bytes each), 32 / D_LANES along the slots (4 each)
D_LANES = 4
PATCH_D, PATCH_SLOTS = 4 * D_LANES, 4 * (32 // D_LANES)


def first_key(slot_word):
    """The first key of slots 4 ``slot_word`` .. + 3 (they hold it + ``KEY_STEP``)."""
    return slot_word // 4 * 16 + slot_word % 4 * 2


def stage_words(byte_layout):
    """A stage layout of 1-byte elements seen as 4-byte words (mode 0 / 4 where it is
    contiguous, the swizzle scaled with it: S<3,4,3> on bytes is S<3,2,3> on words). The
    kernel's word views are built on it over plain pointers: ``recast_tensor`` of a tensor
    whose swizzle sits in its pointer drops the swizzle."""
    return cute.recast_layout(32, 8, byte_layout)


def patch_bank_conflicts(head_dim: int, block_n: int, d_lanes: int = D_LANES):
    """(loads, stores): the most lanes of one warp instruction that meet in a bank on
    distinct words, over a whole stage, when a warp's lanes take ``d_lanes`` 4-byte words
    along d and 32 / ``d_lanes`` along the key slots; evaluated on the two stage layouts
    the kernel uses (the raw ring's, d contiguous; V^T's, keys contiguous) on the host."""
    import cutlass.utils.hopper_helpers as sm90
    from cutlass.tensor_utils import LayoutEnum

    def offsets():
        shape, f8 = (128, head_dim, block_n), cutlass.Float8E4M3FN
        raw = sm90.make_smem_layout_b(LayoutEnum.COL_MAJOR, shape, f8, 1)
        vt = sm90.make_smem_layout_b(LayoutEnum.ROW_MAJOR, shape, f8, 1)
        return ([[raw((d, k, 0)) for k in range(block_n)] for d in range(0, head_dim, 4)],
                [[vt((d, s, 0)) for s in range(0, block_n, 4)] for d in range(head_dim)])

    raw, vt = dsl.on_host(offsets)

    def ways(byte_offsets):
        banks: dict = {}
        for offset in byte_offsets:
            banks.setdefault(offset // 4 % 32, set()).add(offset // 4)
        return max(len(words) for words in banks.values())

    slot_lanes = 32 // d_lanes
    loads = stores = 1
    for d0 in range(0, head_dim // 4, d_lanes):
        for s0 in range(0, block_n // 4, slot_lanes):
            lanes = [(d0 + lane % d_lanes, s0 + lane // d_lanes) for lane in range(32)]
            for step in KEY_STEP:
                loads = max(loads, ways(raw[dw][first_key(sw) + step] for dw, sw in lanes))
            for byte in range(4):
                stores = max(stores, ways(vt[4 * dw + byte][sw] for dw, sw in lanes))
    return loads, stores


class Transposer:
    def make_v_rings(self, storage, raw_bytes: int):
        """(raw ring, V^T ring) of a ``transposes_v`` kernel: the raw ring completes as the
        loader's (TMA bytes or cp.async arrivals) and is released by the transposing warps;
        the V^T ring is a plain one, every transposing thread arriving on its full barrier
        and lane 0 of each consumer warp on its empty one (``_v_release``)."""
        cfg = self.cfg
        threads = self.transposing_threads
        raw = self.loader.make_pipeline(storage.v_raw_barriers.data_ptr(), cfg.raw_v_stages,
                                        threads, threads // 32, raw_bytes)
        vt = pipeline.PipelineAsync.create(
            barrier_storage=storage.v_barriers.data_ptr(), num_stages=cfg.stages,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, threads),
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread,
                                                     4 * cfg.consumers),
            defer_sync=True)
        return raw, vt

    @cute.jit
    def word_views(self, storage, raw_layout, vt_layout):
        """The raw ring and the V^T ring as 4-byte words (``stage_words``)."""
        raw = cute.make_tensor(cute.recast_ptr(storage.sVraw.data_ptr(), dtype=cutlass.Int32),
                               stage_words(raw_layout))
        vt = cute.make_tensor(cute.recast_ptr(storage.sV.data_ptr(), dtype=cutlass.Int32),
                              stage_words(vt_layout))
        return raw, vt

    @property
    def transposing_threads(self) -> int:
        """TMA: warps 1-3 of the producer warpgroup; cp.async: all four."""
        return 96 if self.cfg.load == "tma" else 128

    @cute.jit
    def transpose_walk(self, pipe_raw, pipe_vt, raw_words, vt_words, mSeqlensK, items, prob,
                       tid):
        """TMA: the transposing warps (``tid`` 0 .. 95) walk this CTA's tiles as the
        consumers do and transpose every key block's V as it lands."""
        cfg = self.cfg
        done = cutlass.Int32(0)  # key blocks transposed: both rings' position
        for k in cutlass.range(scheduler.my_item_count(cfg, items), unroll=1):
            worker, workers = scheduler.worker()
            item = worker + k * workers
            for half in cutlass.range(scheduler.item_tiles(cfg, item, prob.rows), unroll=1):
                tile = self._key_blocks(self._tile(item, half, prob, mSeqlensK), prob)
                for j in cutlass.range(tile.lo, tile.hi, unroll=1):
                    self.transpose_block(pipe_raw, pipe_vt, raw_words, vt_words, done + j - tile.lo,
                                         tile.kv_len - j * cfg.block_n, tid)
                done += tile.hi - tile.lo
        pipe_vt.producer_tail(self._ring(done, producer=True))

    @cute.jit
    def transpose_block(self, pipe_raw, pipe_vt, raw_words, vt_words, count, keys, tid):
        """The ``count``-th key block of this CTA: raw stage -> V^T stage. ``keys``: the
        block's keys inside its sequence (paged TMA: slots of keys past them get zeros)."""
        raw_state = self._ring(count, stages=self.cfg.raw_v_stages)
        vt_state = self._ring(count, producer=True)
        self.loader.consumer_wait(pipe_raw, raw_state)
        pipe_vt.producer_acquire(vt_state)
        self._transpose_stage(raw_words[(None, None, raw_state.index)],
                              vt_words[(None, None, vt_state.index)], keys, tid)
        # st.shared is the generic proxy, WGMMA reads through the async one
        cute.arch.fence_view_async_shared()
        pipe_vt.producer_commit(vt_state)
        self.loader.consumer_release(pipe_raw, raw_state)

    @cute.jit
    def _transpose_stage(self, raw_words, vt_words, keys, tid):
        """``raw_words`` (d / 4, block_n) -> ``vt_words`` (d, block_n / 4), slot s holding key
        ``key_of_slot(s)``, by ``transposing_threads`` threads (the module docstring)."""
        cfg = self.cfg
        lane, warp = tid % 32, tid // 32
        warps = self.transposing_threads // 32
        d_patches = cfg.head_dim // PATCH_D
        patches = d_patches * (cfg.block_n // PATCH_SLOTS)
        masks = cfg.paged and cfg.load == "tma"
        for step in cutlass.range((patches + warps - 1) // warps, unroll=1):
            patch = warp + step * warps
            if patch < patches:
                d_word = patch % d_patches * D_LANES + lane % D_LANES
                slot_word = patch // d_patches * (PATCH_SLOTS // 4) + lane // D_LANES
                key0 = first_key(slot_word)
                words = [raw_words[d_word, key0 + KEY_STEP[i]] for i in range(4)]
                if cutlass.const_expr(masks):
                    for i in cutlass.range_constexpr(4):
                        words[i] = cutlass.select_(key0 + KEY_STEP[i] < keys, words[i],
                                                   cutlass.Int32(0))
                # byte b of word i is (d 4 d_word + b, key i): out word b gathers byte b of
                # each, key i into byte i
                low01 = cutlass.Int32(cute.arch.prmt(words[0], words[1], PAIR_LOW))
                low23 = cutlass.Int32(cute.arch.prmt(words[2], words[3], PAIR_LOW))
                high01 = cutlass.Int32(cute.arch.prmt(words[0], words[1], PAIR_HIGH))
                high23 = cutlass.Int32(cute.arch.prmt(words[2], words[3], PAIR_HIGH))
                row = 4 * d_word
                for b, (pair, select) in enumerate(((0, ROW_EVEN), (0, ROW_ODD), (1, ROW_EVEN),
                                                    (1, ROW_ODD))):
                    halves = (low01, low23) if pair == 0 else (high01, high23)
                    vt_words[row + b, slot_word] = cutlass.Int32(
                        cute.arch.prmt(halves[0], halves[1], select))
