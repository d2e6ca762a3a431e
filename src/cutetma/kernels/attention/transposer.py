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
copies they have just issued; hence two raw stages at least).
Keys past a paged sequence are written as zeros (a TMA box brings whatever the page holds
there; P is 0 there and 0 x NaN is NaN); dense TMA and cp.async bring zeros already.

A warp takes a 16 (d) x 32 (key slot) patch, lane l the 4 x 4 bytes at d 4 (l % 4), slots
4 (l / 4): with the raw stage's swizzle and V^T's, each of its 4-byte loads and stores meets
at most one other lane in a bank (2-way; V^T's stores 4-way at d = 256's 96-key tile), the
fewest of the patch shapes; a warp's 32 lanes along the slots meet 8 ways on the loads,
along d 16 on the stores (``patch_bank_conflicts`` evaluates them on the layouts).

The warps split a stage into equal runs of patches, along the slots or along d
(``transpose_plan``; where neither divides, fewer warps take them: 2 of TMA's 3 at d = 256's
128-key stage), so a thread's accesses are its origin plus offsets known at compile
time. A swizzle XORs low address bits with higher ones, so where the origin's and a step's
unswizzled offsets share no bit below the swizzle's span, the swizzled sum is the
origin's swizzled offset XOR the step's, plus the step's part above the span: a thread
evaluates the layouts once per stage and each access costs one XOR (the layout evaluated
per access cost ~20 integer instructions each, in warps that share the schedulers with the
consumers: FP8 attention ran at 40-45% of its speed). ``transpose_plan`` checks that
identity for every thread and access on the layouts themselves.
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
# the swizzles' span in words (S<3,4,3> on bytes: 1024 bytes; S<2,4,3>'s 512 lie inside it)
SPAN_WORDS = 256


def first_key(slot_word):
    """The first key of slots 4 ``slot_word`` .. + 3 (they hold it + ``KEY_STEP``)."""
    return slot_word // 4 * 16 + slot_word % 4 * 2


def stage_words(byte_layout):
    """A stage layout of 1-byte elements seen as 4-byte words (mode 0 / 4 where it is
    contiguous, the swizzle scaled with it: S<3,4,3> on bytes is S<3,2,3> on words). The
    kernel's word views are built on it over plain pointers: ``recast_tensor`` of a tensor
    whose swizzle sits in its pointer drops the swizzle."""
    return cute.recast_layout(32, 8, byte_layout)


def stage_layouts(head_dim: int, block_n: int):
    """(raw stage, V^T stage): one stage of each ring as the kernel lays it out (1-byte
    elements; the raw one d contiguous, V^T keys contiguous), for host evaluation inside a
    trace (``dsl.on_host``)."""
    import cutlass.utils.hopper_helpers as sm90
    from cutlass.tensor_utils import LayoutEnum

    shape, f8 = (128, head_dim, block_n), cutlass.Float8E4M3FN
    return tuple(cute.slice_(sm90.make_smem_layout_b(major, shape, f8, 1), (None, None, 0))
                 for major in (LayoutEnum.COL_MAJOR, LayoutEnum.ROW_MAJOR))


def host_plan(head_dim: int, block_n: int, threads: int):
    """The kernel's ``transpose_plan`` for these sizes, evaluated on the host."""
    def build():
        return transpose_plan(*(stage_words(x) for x in stage_layouts(head_dim, block_n)),
                              head_dim, block_n, threads)

    return dsl.on_host(build)


def patch_bank_conflicts(head_dim: int, block_n: int, d_lanes: int = D_LANES):
    """(loads, stores): the most lanes of one warp instruction that meet in a bank on
    distinct words, over a whole stage, when a warp's lanes take ``d_lanes`` 4-byte words
    along d and 32 / ``d_lanes`` along the key slots; evaluated on the two stage layouts
    the kernel uses (the raw ring's, d contiguous; V^T's, keys contiguous) on the host."""
    def offsets():
        raw, vt = stage_layouts(head_dim, block_n)
        return ([[raw((d, k)) for k in range(block_n)] for d in range(0, head_dim, 4)],
                [[vt((d, s)) for s in range(0, block_n, 4)] for d in range(head_dim)])

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


class TransposePlan:
    """How the transposing warps split a stage (``transpose_plan``): warp w < ``warps``
    takes ``d_patches`` x ``slot_patches`` patches, its run along the slots or along d;
    each step (slot patch, then d patch, d fastest) is 4 loads and 4 stores at the
    thread's origin plus (xor, add) word offsets: ``loads[step][i]`` of key
    ``first_key + keys[step][i]``, ``stores[step][b]`` of d row 4 d_word + b.
    (A plain class: the DSL would carry a dataclass's fields through its control flow as
    runtime values.)"""

    def __init__(self, warps, along_slots, d_patches, slot_patches, loads, stores, keys):
        self.warps, self.along_slots = warps, along_slots
        self.d_patches, self.slot_patches = d_patches, slot_patches
        self.loads, self.stores, self.keys = loads, stores, keys

    def origin(self, warp, lane):
        """(d_word, slot_word) of a thread's first 4 x 4 bytes (Python or DSL integers)."""
        d_word, slot_word = lane % D_LANES, lane // D_LANES
        if self.along_slots:
            return d_word, slot_word + warp * (self.slot_patches * PATCH_SLOTS // 4)
        return d_word + warp * (self.d_patches * D_LANES), slot_word


def split_patches(head_dim: int, block_n: int, threads: int):
    """(warps, along_slots, d patches, slot patches per warp): the most warps of
    ``threads`` // 32 that split the stage's patches evenly, along the slots first (each
    warp's raw rows then start on a swizzle atom)."""
    if head_dim % PATCH_D or block_n % PATCH_SLOTS:
        raise ValueError(f"v_transpose='smem' transposes {PATCH_D} x {PATCH_SLOTS} patches: "
                         f"head_dim={head_dim}, block_n={block_n} must be multiples")
    d_patches, slot_patches = head_dim // PATCH_D, block_n // PATCH_SLOTS
    for warps in range(threads // 32, 0, -1):
        if slot_patches % warps == 0:
            return warps, True, d_patches, slot_patches // warps
        if d_patches % warps == 0:
            return warps, False, d_patches // warps, slot_patches
    raise AssertionError("one warp always divides")


def transpose_plan(raw_words, vt_words, head_dim: int, block_n: int, threads: int):
    """The ``TransposePlan`` of one raw stage and one V^T stage as words (``stage_words``,
    static layouts, evaluated to Python ints: call it inside a trace). Raises where some
    thread's access is not its origin's offset XOR the step's low part plus its high part
    (``SPAN_WORDS``)."""
    warps, along_slots, d_patches, slot_patches = split_patches(head_dim, block_n, threads)
    span = SPAN_WORDS
    steps = [(sp, dp) for sp in range(slot_patches) for dp in range(d_patches)]

    def split(offset):
        return offset % span, offset - offset % span

    loads = tuple(tuple(split(raw_words((4 * dp, 32 * sp + k))) for k in KEY_STEP)
                  for sp, dp in steps)
    stores = tuple(tuple(split(vt_words((16 * dp + b, 8 * sp))) for b in range(4))
                   for sp, dp in steps)
    keys = tuple(tuple(32 * sp + k for k in KEY_STEP) for sp, _ in steps)
    plan = TransposePlan(warps, along_slots, d_patches, slot_patches, loads, stores, keys)
    for warp in range(warps):
        for lane in range(32):
            d_word, slot_word = plan.origin(warp, lane)
            key0 = first_key(slot_word)
            raw0, vt0 = raw_words((d_word, key0)), vt_words((4 * d_word, slot_word))
            for step, (sp, dp) in enumerate(steps):
                for i, k in enumerate(KEY_STEP):
                    xor, add = loads[step][i]
                    if raw_words((d_word + 4 * dp, key0 + 32 * sp + k)) != (raw0 ^ xor) + add:
                        raise ValueError(_NOT_SEPARABLE.format("raw", head_dim, block_n))
                for b in range(4):
                    xor, add = stores[step][b]
                    if vt_words((4 * d_word + 16 * dp + b, slot_word + 8 * sp)) != \
                            (vt0 ^ xor) + add:
                        raise ValueError(_NOT_SEPARABLE.format("V^T", head_dim, block_n))
    return plan


_NOT_SEPARABLE = ("v_transpose='smem': the {} stage's swizzle at head_dim={}, block_n={} does "
                  "not separate a thread's origin from its steps (transpose_plan)")


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

    def word_rings(self, storage, raw_layout, vt_layout):
        """The raw ring and the V^T ring as flat 4-byte words over plain pointers, with the
        stage layouts as words (``stage_words``) and this kernel's ``transpose_plan``: a
        trace-time object the transposing calls take."""
        raw_stage = stage_words(cute.slice_(raw_layout, (None, None, 0)))
        vt_stage = stage_words(cute.slice_(vt_layout, (None, None, 0)))
        raw_words, vt_words = stage_words(raw_layout), stage_words(vt_layout)

        def flat(buffer, words):
            return cute.make_tensor(cute.recast_ptr(buffer.data_ptr(), dtype=cutlass.Int32),
                                    cute.make_layout(cute.cosize(words)))

        cfg = self.cfg
        if raw_words((0, 0, 1)) % SPAN_WORDS or vt_words((0, 0, 1)) % SPAN_WORDS:
            raise ValueError(f"v_transpose='smem': head_dim={cfg.head_dim} x "
                             f"block_n={cfg.block_n} stages are not whole swizzle spans")
        return WordRings(
            raw=flat(storage.sVraw, raw_words), vt=flat(storage.sV, vt_words),
            raw_stage=raw_stage, vt_stage=vt_stage,
            raw_stride=raw_words((0, 0, 1)), vt_stride=vt_words((0, 0, 1)),
            plan=transpose_plan(raw_stage, vt_stage, cfg.head_dim, cfg.block_n,
                                self.transposing_threads))

    @property
    def transposing_threads(self) -> int:
        """TMA: warps 1-3 of the producer warpgroup; cp.async: all four."""
        return 96 if self.cfg.load == "tma" else 128

    @cute.jit
    def transpose_walk(self, pipe_raw, pipe_vt, rings, mSeqlensK, items, prob, tid):
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
                    self.transpose_block(pipe_raw, pipe_vt, rings, done + j - tile.lo,
                                         tile.kv_len - j * cfg.block_n, tid)
                done += tile.hi - tile.lo
        pipe_vt.producer_tail(self._ring(done, producer=True))

    @cute.jit
    def transpose_block(self, pipe_raw, pipe_vt, rings, count, keys, tid):
        """The ``count``-th key block of this CTA: raw stage -> V^T stage. ``keys``: the
        block's keys inside its sequence (paged TMA: slots of keys past them get zeros)."""
        raw_state = self._ring(count, stages=self.cfg.raw_v_stages)
        vt_state = self._ring(count, producer=True)
        self.loader.consumer_wait(pipe_raw, raw_state)
        pipe_vt.producer_acquire(vt_state)
        self._transpose_stage(rings, raw_state.index, vt_state.index, keys, tid)
        # st.shared is the generic proxy, WGMMA reads through the async one
        cute.arch.fence_view_async_shared()
        pipe_vt.producer_commit(vt_state)
        self.loader.consumer_release(pipe_raw, raw_state)

    @cute.jit
    def _transpose_stage(self, rings, raw_index, vt_index, keys, tid):
        """Raw stage ``raw_index`` (d / 4 words, block_n keys) -> V^T stage ``vt_index`` (d,
        block_n / 4 words), slot s holding key ``key_of_slot(s)``, by
        ``transposing_threads`` threads as ``rings.plan`` splits it (module docstring);
        warps past the plan's only arrive."""
        if cutlass.const_expr(rings.plan.warps == self.transposing_threads // 32):
            self._transpose_patches(rings, raw_index, vt_index, keys, tid)
        else:
            if tid // 32 < rings.plan.warps:
                self._transpose_patches(rings, raw_index, vt_index, keys, tid)

    @cute.jit
    def _transpose_patches(self, rings, raw_index, vt_index, keys, tid):
        """One thread's share of ``_transpose_stage``: its origin's offsets once, then each
        step's 4 loads, 8 byte permutes and 4 stores at one XOR and one add each."""
        plan, raw, vt = rings.plan, rings.raw, rings.vt
        d_word, slot_word = plan.origin(tid // 32, tid % 32)
        key0 = first_key(slot_word)
        # stages lie whole spans apart, so the stage's base passes through the XOR
        raw_at = raw_index * rings.raw_stride + rings.raw_stage((d_word, key0))
        vt_at = vt_index * rings.vt_stride + rings.vt_stage((4 * d_word, slot_word))
        masks = self.cfg.paged and self.cfg.load == "tma"
        left = keys - key0  # paged TMA: loads at key offsets past it read zeros
        for step in cutlass.range_constexpr(len(plan.loads)):
            words = [raw[(raw_at ^ xor) + add] for xor, add in plan.loads[step]]
            if cutlass.const_expr(masks):
                for i in cutlass.range_constexpr(4):
                    words[i] = cutlass.select_(plan.keys[step][i] < left, words[i],
                                               cutlass.Int32(0))
            # byte b of word i is (d 4 d_word + b, key i): out word b gathers byte b of
            # each, key i into byte i
            low01 = cutlass.Int32(cute.arch.prmt(words[0], words[1], PAIR_LOW))
            low23 = cutlass.Int32(cute.arch.prmt(words[2], words[3], PAIR_LOW))
            high01 = cutlass.Int32(cute.arch.prmt(words[0], words[1], PAIR_HIGH))
            high23 = cutlass.Int32(cute.arch.prmt(words[2], words[3], PAIR_HIGH))
            for b, (pair, select) in enumerate(((0, ROW_EVEN), (0, ROW_ODD), (1, ROW_EVEN),
                                                (1, ROW_ODD))):
                halves = (low01, low23) if pair == 0 else (high01, high23)
                xor, add = plan.stores[step][b]
                vt[(vt_at ^ xor) + add] = cutlass.Int32(
                    cute.arch.prmt(halves[0], halves[1], select))


class WordRings:
    """``Transposer.word_rings``: both rings as flat words, one stage of each as a word
    layout, the words between stages, and the plan (a plain class, as ``TransposePlan``)."""

    def __init__(self, raw, vt, raw_stage, vt_stage, raw_stride, vt_stride, plan):
        self.raw, self.vt, self.raw_stage, self.vt_stage = raw, vt, raw_stage, vt_stage
        self.raw_stride, self.vt_stride, self.plan = raw_stride, vt_stride, plan
