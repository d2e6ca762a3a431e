"""Attention forward on Hopper (FlashAttention-3's structure), the load mechanism a parameter.

``load="cp_async"`` swaps only the producer: a warpgroup copies Q, K and V 16 bytes per
thread into the same swizzled stages (``cutetma.copy.cpasync``, the GEMM's tested path) and
arrives on the same barriers; the consumers are the same code.

O = softmax(Q K^T * scale) V and the log-sum-exp, Q (b, s_q, h, d), K and V (b, s_k, h_kv, d)
(h a multiple of h_kv: GQA / MQA), fp16 or bf16, head dim 64, 128 or 256, causal (bottom-right
aligned when s_q != s_k, as FlashAttention) or not.

Dataflow for one (Q block, head, batch) tile; a block is 128 query rows (or 192)::

    producer warp   Q per tile (TMA) --------------------------> sQ   (q full / q empty; one
                                                                  buffer, or two: q_stages)
                    K_j, V_j for every key block j (TMA) ------> K ring, V ring: the same depth,
                                                                  each stage a full / empty pair
                                                                  (K_j freed after S_j, V_j after
                                                                  P V)
    consumer WG w   S = Q_w K_j^T          (WGMMA, Q and K from shared memory)
      (w = 0, 1     mask the diagonal / the tail, online softmax in fp32 with exp2
       [, 2]:       P = exp2(S * scale log2 e - m)  -> fp16/bf16 in registers
       64 rows)     O += P V_j             (WGMMA, P from registers, V from shared memory)
                    release the stage; at the end O /= rowsum, LSE = m + ln(rowsum)

The consumers' schedule (``AttentionConfig.schedule``), FlashAttention-3's two overlaps::

    serial     [S_j = QK_j] wait softmax_j [O += P_j V_j] wait            (per block j)
    overlap    [S_j = QK_j][O += P_{j-1} V_{j-1}] wait S_j  softmax_j  ...  P_j = S_j
               with the wait for P V either before softmax_j ("early") or at the next
               iteration's start ("late": the tensor cores run P V while this warpgroup's
               softmax runs); ``pv_wait``, ``PV_WAIT`` says why it is a choice
    pingpong   overlap, with the issue of each iteration's two GEMMs taken in turns by the
               warpgroups (named barriers 1, 2 [, 3]), so one's softmax hides the others' GEMMs

``block_m=192`` (d = 64 only) runs three consumer warpgroups (FlashAttention-3's d = 64 tile:
its GEMMs are half as long per score as d = 128's while the softmax costs the same, so more
warpgroups' softmax could run under them; 4 x 128 threads then get 160 registers each). It
measured slower than two here, so the default block is 128 rows for every head dim.

Warp roles and barriers::

    warp 0 (producer)     q barrier: arrive.expect_tx(Q bytes)    K full: expect_tx(K bytes),
                                                                  V full: expect_tx(V bytes)
    consumer warpgroups   wait q, wait K / V full; release K / V empty (8 warps arrive per
                          stage); the producer takes the K and V stages of a block in turn

Why the WGMMA layouts line up: a warpgroup's m64nN fp32 accumulator holds, per 8 columns, the
pairs (row r, cols 2t..2t+1) and (row r+8, same cols); the m64nNk16 A operand in registers
holds, per 16 columns, the same four pairs of two such 8-column blocks. So P, converted
element by element, *is* the A fragment of P V: no data moves between threads (16-bit types).

Constraints: 16-byte aligned base and strides (d contiguous), h % h_kv == 0,
d in {64, 128, 256} (256 with 80-key stages: Q 64 KiB + 2 x (K + V) 160 KiB of shared memory,
a 64x256 fp32 O accumulator per warpgroup). Persistent by default: one CTA per SM (the
registers, 64K over 384 or 512 threads, allow no second) walks the work items round robin: a
(query block, head, batch) tile, or, causal, query blocks M-1-i and i of one head, so every
item costs the same key blocks (``_tile_coords``). Register pressure is at the edge: check
ptxas (C7512, spills) after any change to the consumer (tests/test_attention_ptx.py does).
O leaves by 16-byte stores from registers after a quad transpose (``_epilogue``).

``cluster=2`` (non-causal, opt-in): FlashAttention-3's K/V multicast. The two CTAs of a
cluster take neighbouring query blocks of one head; each loads half of every K and V box and
multicasts it to both (every full barrier counts the whole box), and each consumer warp
releases a stage in both CTAs, since both producers write into it. Correct on the H200 (its GPU
test), but 1-5% slower than one CTA there (by head dim, two passes, 2026-12-01; ahead in both
only at d = 64, 16k): not a default. Not here (FlashAttention-3 has it): a TMA-store epilogue.
"""

from __future__ import annotations

import dataclasses
import math

from cutetma import dsl
from cutetma.copy import cpasync as cpa
from cutetma.copy import loader as loaders
from cutetma.copy import tma

cutlass, cute = dsl.cutlass()
import cutlass.utils.hopper_helpers as sm90  # noqa: E402
from cuda.bindings import driver as cuda  # noqa: E402
from cutlass import pipeline  # noqa: E402
from cutlass._mlir.dialects import llvm  # noqa: E402
from cutlass.cute.nvgpu import warpgroup  # noqa: E402
from cutlass.tensor_utils import LayoutEnum  # noqa: E402

WARPGROUP = 128
LOG2_E = 1.4426950408889634
# setmaxnreg budgets (producer, each consumer) per (load, consumer warpgroups w): p + w c may
# not exceed what the launch gave the CTA's 1 + w warpgroups, 64K / threads per thread rounded
# down to 8 (168 for 384 threads: p + 2 c <= 504, not 512): setmaxnreg.inc waits for registers
# no warpgroup will free (48 / 232 hung the cp.async kernel on the H200). With three consumers
# 160 is the most they can have, and the cp.async producer must make do with 32 as well (at
# 56 / 152 ptxas serialized the WGMMAs of bf16 pingpong).
# cp.async with two consumers: 40 / 232 since the 16-byte-store epilogue (at 56 / 224 the bf16
# d = 128 causal consumers spilled 188 bytes; at 40 its producer spills 16 bytes, causal only).
# TMA with two consumers: 24 / 240, FlashAttention-3's split (one thread issues the loads):
# with it d = 256 at 80-key stages and every schedule compile without spills (at 40 / 232 bf16
# overlap spilled 72-640 bytes), and the default configurations measured 0.3% faster
# (2026-12-01, one pass of each build).
REGISTERS = {("tma", 2): (24, 240), ("cp_async", 2): (40, 232),
             ("tma", 3): (32, 160), ("cp_async", 3): (32, 160)}
SMEM_BYTES = 227 * 1024  # the most shared memory a CTA may have on sm_90
SCHEDULES = ("serial", "overlap", "pingpong")
# (block_m, block_n) per (head_dim, causal). d = 256: 80-key stages, as FlashAttention-3
# non-causal (shared memory: Q 64 KiB + 2 x (K + V) 160 KiB; registers: a 64 x 256 fp32 O per
# warpgroup); measured 2026-12-01 (one pass, both dtypes, s = 1k / 4k / 16k): non-causal
# 80-key overlap 0.86-0.97x cuDNN against 0.81-0.95x for 64-key serial, ahead in all 6 cells.
# Causal stayed on 64-key serial (80-key overlap 0.95-0.99x against 0.94-1.05x) until the
# overlap ran as written (PV_WAIT "late", session 10: one pass of 12 cells, both dtypes,
# geomean against cuDNN 80-key overlap 1.067, 80-key pingpong 1.051, 64-key overlap 1.028,
# 64-key serial 1.011; 80-key overlap 1.08-1.15x at s >= 2k, 0.93 at s = 512). d = 64 keeps two
# consumer warpgroups: FlashAttention-3's 192-row tile (three, at 160 registers each, which
# forces 96-key stages here: at 128 ptxas spills) measured slower on the H200 (2026-11-30,
# two interleaved runs of the grid against the two-warpgroup build: geomean vs cuDNN 0.85
# against 0.88 non-causal, 0.62 against 0.85 causal); it stays selectable (block_m=192).
BLOCKS = {(64, False): (128, 128), (64, True): (128, 128), (128, False): (128, 128),
          (128, True): (128, 128), (256, False): (128, 80), (256, True): (128, 80)}
# Q buffers per (head_dim, causal), 1 where not named. Measured (attention_two_q.json, one
# pass, both dtypes, interleaved per cell): d = 64 non-causal (which keeps its 3 K/V stages)
# 1.007-1.051x with two in 11 of 12 cells (0.984 in the other); d = 64 causal 0.98-1.07
# (median 0.99); d = 128, which must give up a K/V stage for it, no gain at s <= 1k and
# 0.95-0.99x at s >= 4k (the lost stage alone costs as much). A second pass with two as the
# d = 64 non-causal default (attention_d64.json, fp16 tma_other_q): 0.997-1.047x, median 1.024.
# After session 8's consumer changes (attention.json of 2026-12-01, d = 64 non-causal still on
# overlap then): 0.957-1.001x, median 0.986, one buffer ahead in 5 of 6 fp16 cells. With
# pingpong (attention_cluster.json, both dtypes): two buffers ahead by 1-4% at s <= 4k, behind
# by 0-1.6% at 8k-16k. Kept.
Q_STAGES = {(64, False): 2}
# The default schedule per (head_dim, causal, dtype), from the ablation of all three on the
# H200 (benchmarks/attention.py --variants tma_serial tma_overlap tma_pingpong: both dtypes,
# 16k tokens, s = 512..16k; run of 21:12 UTC, 2026-11-30, after the 16-byte-store epilogue
# and the pingpong turn that runs on across tiles; the geometric mean over the six sequence
# lengths relative to cuDNN, fp16 and bf16 together):
#   d = 64:   serial 0.935, overlap 0.926, pingpong 0.917 (non-causal);
#             serial 0.951, overlap 0.892, pingpong 0.918 (causal)
#   d = 128:  serial 0.878, overlap 0.983, pingpong 0.970 (non-causal);
#             serial 0.959, overlap 1.029, pingpong 1.037 (causal: pingpong ahead at s <= 4k,
#             behind at 16k, +0.8%; +1.3% in the run before: within a cell's noise, kept)
#   d = 256:  serial 0.931, overlap 0.891, pingpong 0.899 (non-causal);
#             serial 1.003, overlap 0.989, pingpong 0.982 (causal)
# At d = 64 the dtypes part: bf16 serial beats overlap by 4-21% in every cell (pingpong by
# 4-13%), fp16 serial loses by 3-6% non-causal and 1-3% causal (the same source, a different
# ptxas allocation: bf16 needs more registers), so d = 64 picked per dtype. Single cells move by
# up to ~5% between runs: re-measure after any change to the consumer.
# Re-measured 2026-12-01 after the softmax's tree reductions, P converted at the top of the next
# iteration (one loop shape for both dtypes) and 24 / 240 registers (one pass, s = 1k / 4k /
# 16k, both dtypes, ratios to cuDNN): d = 64 overlap 0.92-1.03 in both dtypes, ahead of serial
# in 12 of 12 cells (serial, bf16's old choice, lost most with the trees: 0.83-0.93) and of
# pingpong in 7 (every causal one); d = 256 non-causal overlap at 80-key stages (BLOCKS)
# 0.86-0.97 against serial at 64 keys 0.81-0.95. Then d = 64 non-causal, pingpong against
# overlap, two passes (calls 1 and 3 of that session): pingpong ahead in 11 of 12 cells (by
# 0-6%), overlap ahead causal in 12 of 12 (by 1-6%). d = 256 causal: overlap since session 10
# (BLOCKS' note).
BEST_SCHEDULE = {
    (64, False, "float16"): "pingpong", (64, False, "bfloat16"): "pingpong",
    (64, True, "float16"): "overlap", (64, True, "bfloat16"): "overlap",
    (128, False, "float16"): "overlap", (128, False, "bfloat16"): "overlap",
    (128, True, "float16"): "overlap", (128, True, "bfloat16"): "overlap",
    (256, False, "float16"): "overlap", (256, False, "bfloat16"): "overlap",
    (256, True, "float16"): "overlap", (256, True, "bfloat16"): "overlap",
}
# Where overlap / pingpong wait for P_{j-1} V_{j-1}, per head dim (the SASS, not the source,
# decides what overlaps). ptxas (CUDA 13.0) moved the wgmma wait to the top of its basic
# block: written after block j's softmax, as FlashAttention-3 writes it, it ran before it in
# every build up to session 9 (nvdisasm: no exp2 between the two waits), so the softmax never ran
# under this warpgroup's own P V; at d = 256 ptxas also computed every exp2 twice there.
#   "early": the wait before the softmax, as those builds ran (the other warpgroup's GEMMs
#            fill the tensor cores during this one's softmax);
#   "late":  the wait at the top of the next iteration, behind the loop's back edge, which
#            ptxas does not hoist it across: the softmax of block j runs under P_{j-1} V_{j-1}.
# Measured 2026-12-01, one pass of the grid, both dtypes, ratios to cuDNN (geomean of 12
# cells): "late" d = 256 non-causal 1.018 against 0.929, d = 256 causal (overlap, 80-key
# stages) 1.067 against serial's 1.011; but d = 64 0.949 / 0.975 against 0.977 / 0.983 and
# d = 128 0.963 / 1.024 against 1.009 / 1.041 (non-causal / causal).
PV_WAIT = {64: "early", 128: "early", 256: "late"}
PV_WAITS = ("early", "late")
# exp2 on the FMA pipe (FlashAttention-4's offload, ``exp2_fma``): 2^x = 2^n 2^f with n = x
# rounded to the nearest integer and f in [-0.5, 0.5]; 2^f by the cubic 1 + c1 f + c2 f^2 +
# c3 f^3 (a relative-error minimax fit with p(0) = 1: at most 1.02e-4 off, under fp16's half
# ulp of 2.4e-4), and n added to the result's exponent bits. x is clamped at -127 first, so -inf
# (a masked score) gives +0 and the exponent never wraps. The rounding: adding 1.5 * 2^23
# leaves round(x) in the low mantissa bits of the sum, whose bits shifted left by 23 are
# n << 23 (the constant's own bits shift out).
EXP2_CUBIC = (0.6932829022407532, 0.24221020936965942, 0.05500861629843712)
EXP2_ROUNDER = 12582912.0  # 1.5 * 2^23
EXP2_FLOOR = -127.0
DTYPES = ("float16", "bfloat16")
# The epilogue's 4 x 4 transpose across the 4 lanes of a quad (word q of lane t <- word t of
# lane q), as butterfly steps (lane offset m, words a, b = a | m): lanes m apart swap, the lane
# with bit m set giving its word a for the partner's word b, the other its b for the partner's
# a (lane t's word q <- lane t^m's word q^m wherever bit m of q and t differ). Steps m = 1, 2.
QUAD_TRANSPOSE_STEPS = tuple((m, a, a | m) for m in (1, 2) for a in range(4) if not a & m)


@dataclasses.dataclass(frozen=True)
class AttentionConfig:
    head_dim: int = 128
    # query rows per CTA, 64 per consumer warpgroup (128 or 192), and keys per K/V stage (a
    # multiple of 16); 0: BLOCKS' choice for the head dim
    block_m: int = 0
    block_n: int = 0
    stages: int = 0  # K/V stages; 0: as many as shared memory holds, at most 3
    # Q buffers: 2 lets the producer load the next tile's Q while this tile still reads its
    # own (at the cost of K/V stages: d = 128 then has room for 2, not 3; d = 256 for none);
    # 0: Q_STAGES' choice
    q_stages: int = 0
    causal: bool = False
    load: str = "tma"  # "tma" or "cp_async": only the producer differs
    # the consumers' schedule, each step adding to the one before (an ablation ladder):
    # "serial": S = QK^T, wait, softmax, O += PV, wait (nothing overlaps within a warpgroup);
    # "overlap": issue S_j = Q K_j^T and O += P_{j-1} V_{j-1} together, softmax S_j while
    #   P V runs (FlashAttention-3's intra-warpgroup overlap);
    # "pingpong": "overlap", and the warpgroups take turns issuing their GEMMs (named
    #   barriers), so one's softmax runs under the other's GEMMs.
    schedule: str = ""  # "": the one measured fastest for this head dim, mask and dtype
    # the element type the defaults are chosen for (BEST_SCHEDULE differs by dtype at d = 64);
    # the kernel is compiled for the tensors' own type whatever this says
    dtype: str = "float16"
    # persistent: one CTA per SM walks the (query block, head, batch) tiles, so the next
    # tile's Q and K/V loads run under this tile's epilogue; False: one CTA per tile
    persistent: bool = True
    # CTAs per cluster (1 or 2; TMA, non-causal, persistent): with 2, the cluster's CTAs take
    # query blocks 2i and 2i + 1 of one head, and each loads half of every K and V block and
    # multicasts it to both, halving the K/V traffic from L2 (FlashAttention-3 does this for
    # d >= 128 non-causal). On the H200 that traffic is not the limit (ncu: a third less of it
    # saved 1.3% at d = 256): 1-5% slower, ahead only at d = 64, 16k (2026-12-01)
    cluster: int = 1
    # overlap / pingpong: where this warpgroup waits for its P_{j-1} V_{j-1} (PV_WAIT):
    # "early", before block j's softmax, or "late", at the next iteration's start, so the
    # softmax runs under it; "": PV_WAIT's choice for the head dim
    pv_wait: str = ""
    # every n-th of a thread's scores in a row takes its exp2 from a cubic on the FMA pipe
    # instead of MUFU (FlashAttention-4's offload, ``exp2_on_fma``); 0: all on MUFU. At d = 64
    # the exp2s keep MUFU as busy as the GEMMs keep the tensor pipe (ncu, 2026-12-01), but on
    # the H200 the cubic's nine FMA / ALU instructions cost more issue slots than MUFU saves:
    # per cell, n = 8 / 4 / 2 ran at 0.97-1.05 / 0.87-0.98 / 0.82-0.93x the default at
    # d = 64 (geomean 1.00 / 0.93 / 0.89) and 0.85-1.01 / 0.80-0.93 / 0.79-0.92x at d = 128
    # (attention_exp2_fma.json, 2026-12-01)
    exp2_fma: int = 0
    # L2 eviction priorities on the TMA loads (FlashAttention-3's): Q, read by one CTA once,
    # evict_first; K and V, which every query block of the head reads again, evict_last.
    # Measured 2-3% slower than the DSL's default policy on the H200 (2026-12-01)
    l2_hints: bool = False

    def __post_init__(self):
        if self.head_dim not in (64, 128, 256):
            raise ValueError(f"head_dim={self.head_dim}: 64, 128 or 256")
        block_m, block_n = BLOCKS[(self.head_dim, self.causal)]
        if not self.block_m:
            object.__setattr__(self, "block_m", block_m)
        if not self.block_n:
            object.__setattr__(self, "block_n", block_n)
        if not self.q_stages:
            object.__setattr__(self, "q_stages", Q_STAGES.get((self.head_dim, self.causal), 1))
        if not self.stages:
            object.__setattr__(self, "stages", min(3, self.max_stages))
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype={self.dtype!r}: one of {DTYPES}")
        if not self.schedule:
            object.__setattr__(self, "schedule",
                               BEST_SCHEDULE[(self.head_dim, self.causal, self.dtype)])
        if not self.pv_wait:
            object.__setattr__(self, "pv_wait", PV_WAIT[self.head_dim])
        if self.pv_wait not in PV_WAITS:
            raise ValueError(f"pv_wait={self.pv_wait!r}: one of {PV_WAITS}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule={self.schedule!r}: one of {SCHEDULES}")
        if self.block_m not in (128, 192):
            raise ValueError(f"block_m={self.block_m}: 128 or 192 (64 rows per consumer "
                             "warpgroup)")
        if self.block_n % 16 or not 64 <= self.block_n <= 256:
            raise ValueError(f"block_n={self.block_n}: a multiple of 16 in [64, 256] (the k16 "
                             "steps of P V)")
        if self.block_m == 192 and self.head_dim != 64:
            raise ValueError("block_m=192 (three consumer warpgroups) only for head_dim 64: "
                             "a 64 x d fp32 O accumulator per thread group does not fit "
                             f"{REGISTERS[(self.load, 3)][1]} registers beside S and P")
        if self.load not in ("tma", "cp_async"):
            raise ValueError(f"load={self.load!r}: 'tma' or 'cp_async'")
        if self.q_stages not in (1, 2):
            raise ValueError(f"q_stages={self.q_stages}: 1 or 2")
        if not 2 <= self.stages <= self.max_stages:
            raise ValueError(f"stages={self.stages}: 2 .. {self.max_stages} (Q and the K/V "
                             f"stages share {SMEM_BYTES // 1024} KiB of shared memory)")
        if self.cluster not in (1, 2):
            raise ValueError(f"cluster={self.cluster}: 1 or 2")
        if self.cluster > 1 and (self.load != "tma" or self.causal or not self.persistent):
            raise ValueError("cluster=2 (K/V multicast) needs load='tma', causal=False and "
                             "persistent=True: cp.async cannot multicast, and the two CTAs "
                             "must walk the same key blocks in step")
        if not 0 <= self.exp2_fma <= 16:
            raise ValueError(f"exp2_fma={self.exp2_fma}: 0 (every exp2 on MUFU) or 1 .. 16 "
                             "(every n-th on the FMA pipe)")
        if self.l2_hints and self.load != "tma":
            raise ValueError("l2_hints=True: TMA loads only (load='tma')")

    @property
    def max_stages(self) -> int:
        """K/V stages that fit beside Q's buffers (2-byte elements; 1 KiB left for the
        barriers)."""
        q_bytes = 2 * self.block_m * self.head_dim * self.q_stages
        kv_bytes = 2 * 2 * self.block_n * self.head_dim
        return (SMEM_BYTES - 1024 - q_bytes) // kv_bytes

    @property
    def consumers(self) -> int:
        """Consumer warpgroups: 64 query rows each (WGMMA's M)."""
        return self.block_m // 64

    @property
    def threads(self) -> int:
        return (1 + self.consumers) * WARPGROUP

    @property
    def overlap(self) -> bool:
        return self.schedule != "serial"

    @property
    def pingpong(self) -> bool:
        return self.schedule == "pingpong"


class FlashAttentionSm90:
    def __init__(self, config: AttentionConfig):
        self.cfg = config
        # a cluster multicasts K and V: the loader's TMA multicast (each CTA its 1/N slice)
        self.loader = loaders.make_loader(
            "tma_multicast" if config.cluster > 1 else config.load, config.cluster)

    # ------------------------------------------------------------------------ host
    @cute.jit
    def __call__(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mO: cute.Tensor,
                 mLSE: cute.Tensor, softmax_scale: cutlass.Float32, sm_count: cutlass.Int32,
                 stream: cuda.CUstream):
        """mQ, mO: (s_q, d, h, b); mK, mV: (s_k, d, h_kv, b); mLSE: (s_q, h, b) fp32.
        (The torch face permutes (b, s, h, d) tensors into these views; d is contiguous.)
        ``sm_count``: how many CTAs run at once, the persistent grid's size (one CTA per SM:
        its 384 or 512 threads fill the register file; with a cluster, the CTAs of the
        clusters that fit, ``ops._max_active_clusters``)."""
        cfg = self.cfg
        dtype = mQ.element_type
        # Q, K, V: strides checked by the torch face; O: made there like Q (empty_like), so
        # its strides are as aligned as Q's (the epilogue's 16-byte stores rely on it)
        mQ, mK, mV, mO = (self._aligned_strides(x) for x in (mQ, mK, mV, mO))
        group = mQ.shape[2] // mK.shape[2]  # query heads per key/value head
        # GQA: head hq reads key/value head hq // group, a stride-0 mode over the group
        mK = self._broadcast_heads(mK, group)
        mV = self._broadcast_heads(mV, group)
        mVt = cute.make_tensor(mV.iterator, cute.make_layout(
            (mV.shape[1], mV.shape[0], mV.shape[2], mV.shape[3]),
            stride=(mV.stride[1], mV.stride[0], mV.stride[2], mV.stride[3])))  # (d, s_k, h, b)

        qk_tiler = (64, cfg.block_n, cfg.head_dim)
        pv_tiler = (64, cfg.head_dim, cfg.block_n)
        k_major, mn_major = warpgroup.OperandMajorMode.K, warpgroup.OperandMajorMode.MN
        qk_mma = sm90.make_trivial_tiled_mma(dtype, dtype, k_major, k_major, cutlass.Float32,
                                             (cfg.consumers, 1, 1), tiler_mn=qk_tiler[:2])
        pv_mma = sm90.make_trivial_tiled_mma(dtype, dtype, k_major, mn_major, cutlass.Float32,
                                             (cfg.consumers, 1, 1), tiler_mn=pv_tiler[:2],
                                             a_source=warpgroup.OperandSource.RMEM)
        row_major = LayoutEnum.ROW_MAJOR
        sQ_layout = sm90.make_smem_layout_a(row_major, (cfg.block_m, cfg.block_n, cfg.head_dim),
                                            dtype, cfg.q_stages)
        sK_layout = sm90.make_smem_layout_b(row_major, (cfg.block_m, cfg.block_n, cfg.head_dim),
                                            dtype, cfg.stages)
        sV_layout = sm90.make_smem_layout_b(LayoutEnum.COL_MAJOR,
                                            (cfg.block_m, cfg.head_dim, cfg.block_n), dtype,
                                            cfg.stages)
        tma_q, mQ_tma = tma.load_atom(mQ, cute.slice_(sQ_layout, (None, None, 0)),
                                      (cfg.block_m, cfg.head_dim))
        # K and V: with a cluster each CTA loads 1 / cluster of the box and multicasts it
        tma_k, mK_tma = tma.load_atom(mK, cute.slice_(sK_layout, (None, None, 0)),
                                      (cfg.block_n, cfg.head_dim), cfg.cluster)
        tma_v, mV_tma = tma.load_atom(mVt, cute.slice_(sV_layout, (None, None, 0)),
                                      (cfg.head_dim, cfg.block_n), cfg.cluster)

        @cute.struct
        class Storage:
            # Q full per buffer, then Q empty per buffer
            q_barriers: cute.struct.MemRange[cutlass.Int64, 2 * cfg.q_stages]
            k_barriers: cute.struct.MemRange[cutlass.Int64, cfg.stages * 2]
            v_barriers: cute.struct.MemRange[cutlass.Int64, cfg.stages * 2]
            sQ: cute.struct.Align[cute.struct.MemRange[dtype, cute.cosize(sQ_layout)], 1024]
            sK: cute.struct.Align[cute.struct.MemRange[dtype, cute.cosize(sK_layout)], 1024]
            sV: cute.struct.Align[cute.struct.MemRange[dtype, cute.cosize(sV_layout)], 1024]

        self.storage = Storage
        items = self._work_items(mQ.shape[0], mQ.shape[2], mQ.shape[3])
        # a cluster shares each item: items for at most sm_count // cluster clusters
        workers = cutlass.min(items, sm_count // cfg.cluster)
        grid = (cfg.cluster * workers if cutlass.const_expr(cfg.persistent) else items, 1, 1)
        # no cluster attribute without a cluster: the launch stays what was measured
        cluster = dict(cluster=(cfg.cluster, 1, 1)) if cfg.cluster > 1 else {}
        self.kernel(tma_q, mQ_tma, tma_k, mK_tma, tma_v, mV_tma, mQ, mK, mVt, mO, mLSE, qk_mma,
                    pv_mma, sQ_layout, sK_layout, sV_layout, mK.shape[0],
                    softmax_scale * LOG2_E).launch(
            grid=grid, block=(cfg.threads, 1, 1), min_blocks_per_mp=1, stream=stream,
            **cluster)

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
        def view(pointer, seqlen, count, s, h, b):  # (b, s, h, d) -> (s, d, h, b)
            return cute.make_tensor(pointer, cute.make_layout(
                (seqlen, head_dim, count, batch), stride=(s, 1, h, b)))

        per_head = cutlass.Int64(seqlen_q)
        mLSE = cute.make_tensor(pLSE, cute.make_layout(
            (seqlen_q, heads, batch), stride=(1, per_head, per_head * cutlass.Int64(heads))))
        self(view(pQ, seqlen_q, heads, q_s, q_h, q_b), view(pK, seqlen_k, heads_kv, k_s, k_h, k_b),
             view(pV, seqlen_k, heads_kv, v_s, v_h, v_b), view(pO, seqlen_q, heads, o_s, o_h, o_b),
             mLSE, softmax_scale, sm_count, stream)

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
               mO: cute.Tensor, mLSE: cute.Tensor, qk_mma: cute.TiledMma,
               pv_mma: cute.TiledMma, sQ_layout: cute.ComposedLayout,
               sK_layout: cute.ComposedLayout, sV_layout: cute.ComposedLayout,
               seqlen_k: cutlass.Int32, scale_log2: cutlass.Float32):
        cfg = self.cfg
        tidx, _, _ = cute.arch.thread_idx()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        wg = cute.arch.make_warp_uniform(tidx // WARPGROUP)
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
        k_bytes = cute.size_in_bytes(mO.element_type, cute.slice_(sK_layout, (None, None, 0)))
        v_bytes = cute.size_in_bytes(mO.element_type, cute.slice_(sV_layout, (None, None, 0)))
        q_bytes = cute.size_in_bytes(mO.element_type, cute.slice_(sQ_layout, (None, None, 0)))
        # K and V each have their own ring (same depth, filled in lockstep): a consumer frees
        # K_j as soon as S_j is computed and V_j after P V, so the producer can run ahead
        # even when an overlapped iteration holds V_{j-1} and K_j at once
        # With a cluster, a stage is written by both CTAs' producers (each its half, into both
        # CTAs), so each CTA's empty barrier counts the consumer warps of both, and a consumer
        # releases a stage in both CTAs (PipelineTmaAsync signals the cluster's other CTA)
        cta_layout = cute.make_layout((1, cfg.cluster, 1, 1))
        pipe_k = self.loader.make_pipeline(storage.k_barriers.data_ptr(), cfg.stages,
                                           WARPGROUP, 4 * cfg.consumers, k_bytes, cta_layout,
                                           cfg.cluster)
        pipe_v = self.loader.make_pipeline(storage.v_barriers.data_ptr(), cfg.stages,
                                           WARPGROUP, 4 * cfg.consumers, v_bytes, cta_layout,
                                           cfg.cluster)
        if warp == 0:
            with cute.arch.elect_one():
                for i in cutlass.range_constexpr(cfg.q_stages):
                    cute.arch.mbarrier_init(q_full + i, self.loader.barrier_count(WARPGROUP))
                    # every consumer thread arrives
                    cute.arch.mbarrier_init(q_empty + i, cfg.consumers * WARPGROUP)
        # the barriers must be initialized in both CTAs before either multicasts into them
        pipeline.pipeline_init_arrive(cluster_shape_mn=(cfg.cluster, 1), is_relaxed=True)
        pipeline.pipeline_init_wait(cluster_shape_mn=(cfg.cluster, 1))

        seqlen_q, heads = mO.shape[0], mO.shape[2]
        items = self._work_items(seqlen_q, heads, mO.shape[3])
        producer_regs, consumer_regs = REGISTERS[(cfg.load, cfg.consumers)]
        if wg == 0:
            cute.arch.setmaxregister_decrease(producer_regs)
            if cutlass.const_expr(cfg.load == "tma"):
                if warp == 0:
                    self.produce(pipe_k, pipe_v, q_full, q_empty, q_bytes, tma_q, mQ_tma, tma_k,
                                 mK_tma, tma_v, mV_tma, sQ, sK, sV, items, heads, seqlen_q,
                                 seqlen_k)
            else:
                self.produce_cp_async(pipe_k, pipe_v, q_full, q_empty, mQ, mK, mVt, sQ, sK, sV,
                                      items, heads, seqlen_q, seqlen_k)
        else:
            cute.arch.setmaxregister_increase(consumer_regs)
            self.consume(pipe_k, pipe_v, q_full, q_empty, qk_mma, pv_mma, sQ, sK, sV, mO, mLSE,
                         items, heads, seqlen_q, seqlen_k, scale_log2)

    @property
    def _paired(self) -> bool:
        """Causal + persistent: a work item is two query blocks of one head, M-1-i and i."""
        return self.cfg.causal and self.cfg.persistent

    @cute.jit
    def _work_items(self, seqlen_q, heads, batch):
        """How many work items the workers share (``_worker``): every (query block, head,
        batch) tile, or (``_paired``) every pair of them, or (a cluster of 2) every pair of
        neighbouring query blocks, one per CTA."""
        m_blocks = cute.ceil_div(seqlen_q, self.cfg.block_m)
        if cutlass.const_expr(self._paired or self.cfg.cluster > 1):
            m_blocks = (m_blocks + 1) // 2
        return m_blocks * heads * batch

    @cute.jit
    def _worker(self):
        """(this worker, workers): a worker is a CTA, or a cluster, which takes items ``w,
        w + workers, ...``."""
        if cutlass.const_expr(self.cfg.cluster == 1):
            return cute.arch.block_idx()[0], cute.arch.grid_dim()[0]
        return (cute.arch.block_idx()[0] // self.cfg.cluster,
                cute.arch.grid_dim()[0] // self.cfg.cluster)

    @cute.jit
    def _my_item_count(self, items):
        """How many work items this CTA runs: ``blockIdx, blockIdx + gridDim, ...`` below
        ``items`` (persistent), or 1, a constant, so that one CTA per item compiles to
        straight-line code with no tile loop (the loop's extra live values cost ptxas the
        registers it needs to keep the WGMMAs asynchronous for bf16, d = 128, C7512)."""
        if cutlass.const_expr(not self.cfg.persistent):
            return 1
        worker, workers = self._worker()
        return cute.ceil_div(items - worker, workers)

    @cute.jit
    def _item_tiles(self, item, seqlen_q):
        """Tiles in work item ``item``: 1, or (``_paired``) 2, except a head's middle query
        block when it has an odd number of them, which is an item alone."""
        if cutlass.const_expr(not self._paired):
            return 1
        m_blocks = cute.ceil_div(seqlen_q, self.cfg.block_m)
        i = item % ((m_blocks + 1) // 2)
        return 1 + cutlass.min(m_blocks - 1 - 2 * i, 1)  # M-1-i > i, else the lone middle

    @cute.jit
    def _cta_rank(self):
        """This CTA's rank in its cluster (0 without one)."""
        if cutlass.const_expr(self.cfg.cluster == 1):
            return 0
        return cute.arch.block_idx_in_cluster()

    @cute.jit
    def _tile_coords(self, item, half, seqlen_q, heads, rank=0):
        """Tile ``half`` (0 or 1) of work item ``item`` as (m_block, head, batch).

        Query blocks are numbered fastest, so the CTAs in flight share one head's K/V in L2.
        Not causal: an item is one tile. Causal, one CTA per tile: a head's query blocks from
        the last (which sees the most keys), so long tiles start first and the hardware fills
        the end with short ones. Causal, persistent: a static round robin cannot fill in like
        that (numbered per head, one CTA got the long blocks of every head it visited, the
        next the short ones: 1.45x slower at 16k tokens, H200), so an item pairs query blocks
        M-1-i and i of one head; each pair costs the same M+1 key-block rows, and every CTA
        gets the same work up to one item. A cluster of 2 (``rank``: the CTA's in it): an
        item is blocks 2 i and 2 i + 1 of one head, one per CTA, which share every K / V
        block."""
        m_blocks = cute.ceil_div(seqlen_q, self.cfg.block_m)
        m_block = item % m_blocks
        head_batch = item // m_blocks
        if cutlass.const_expr(self._paired):
            pairs = (m_blocks + 1) // 2
            i = item % pairs
            m_block = m_blocks - 1 - i - half * (m_blocks - 1 - 2 * i)  # half 1: block i
            head_batch = item // pairs
        elif cutlass.const_expr(self.cfg.cluster > 1):
            # CTA r of the cluster: block 2 i + r (past the end when m_blocks is odd: that
            # CTA computes on TMA's zero-filled Q rows, stores nothing, and keeps the cluster's
            # K/V ring in step)
            pairs = (m_blocks + 1) // 2
            m_block = 2 * (item % pairs) + rank
            head_batch = item // pairs
        elif cutlass.const_expr(self.cfg.causal):
            m_block = m_blocks - 1 - m_block
        return m_block, head_batch % heads, head_batch // heads

    @cute.jit
    def _key_blocks(self, m_block, seqlen_q, seqlen_k):
        """Key blocks this query block needs: all, or (causal, bottom-right aligned) up to the
        diagonal of its last row: key j is visible to query i iff j <= i + s_k - s_q."""
        cfg = self.cfg
        n = cute.ceil_div(seqlen_k, cfg.block_n)
        if cutlass.const_expr(cfg.causal):
            last_key = (m_block + 1) * cfg.block_m - 1 + seqlen_k - seqlen_q
            n = cutlass.min(n, cute.ceil_div(cutlass.max(last_key + 1, 0), cfg.block_n))
        return n

    @cute.jit
    def produce(self, pipe_k, pipe_v, q_full, q_empty, q_bytes, tma_q, mQ_tma, tma_k, mK_tma, tma_v,
                mV_tma, sQ, sK, sV, items, heads, seqlen_q, seqlen_k):
        """One warp, per tile: Q, and K_j and V_j of every key block into the next free stage
        (the ring runs on across tiles), in ``_produce_tile``'s order."""
        cfg = self.cfg
        rank = self._cta_rank()
        # both CTAs of a cluster receive every K / V box (each full barrier counts all of it)
        kv_mask = cutlass.Int16((1 << cfg.cluster) - 1) if cfg.cluster > 1 else None
        q_hint = {"cache_policy": cutlass.Int64(tma.EVICT_FIRST)} if cfg.l2_hints else {}
        kv_hint = tma.EVICT_LAST if cfg.l2_hints else None
        tQsQ, _ = tma.partition(tma_q, sQ, cute.local_tile(
            mQ_tma[(None, None, 0, 0)], (cfg.block_m, cfg.head_dim), (0, 0)), box_rank=2)

        def tile_loaders(m_block, head, batch):
            gQ = cute.local_tile(mQ_tma[(None, None, head, batch)], (cfg.block_m, cfg.head_dim),
                                 (m_block, 0))
            gK = cute.local_tile(mK_tma[(None, None, head, batch)], (cfg.block_n, cfg.head_dim),
                                 (None, 0))
            gV = cute.local_tile(mV_tma[(None, None, head, batch)], (cfg.head_dim, cfg.block_n),
                                 (0, None))
            _, tQgQ = tma.partition(tma_q, sQ, gQ, box_rank=2)
            # this CTA's share of each K / V box: all of it, or its half, multicast to both
            tKsK, tKgK = tma.partition(tma_k, sK, gK, rank, cfg.cluster, box_rank=2)
            tVsV, tVgV = tma.partition(tma_v, sV, gV, rank, cfg.cluster, box_rank=2)

            def load_q(q_stage):
                with cute.arch.elect_one():
                    cute.arch.mbarrier_arrive_and_expect_tx(q_full + q_stage, q_bytes)
                cute.copy(tma_q, tQgQ, tQsQ[(None, q_stage)], tma_bar_ptr=q_full + q_stage,
                          **q_hint)

            def load_k(j, state):
                self.loader.load(tma_k, tKgK[(None, j)], tKsK[(None, state.index)],
                                 pipe_k.producer_get_barrier(state), kv_mask, kv_hint)

            def load_v(j, state):
                self.loader.load(tma_v, tVgV[(None, j)], tVsV[(None, state.index)],
                                 pipe_v.producer_get_barrier(state), kv_mask, kv_hint)

            return load_q, load_k, load_v

        self._produce_walk(pipe_k, pipe_v, q_empty, items, heads, seqlen_q, seqlen_k,
                           tile_loaders)

    @cute.jit
    def produce_cp_async(self, pipe_k, pipe_v, q_full, q_empty, mQ, mK, mVt, sQ, sK, sV, items,
                         heads, seqlen_q, seqlen_k):
        """A warpgroup, per tile: Q, K_j and V_j (``_produce_tile``'s order), 16 bytes per
        cp.async into the same swizzled stages; each thread arrives (noinc) when its copies
        land. Key rows past s_k
        are zeros in V (P is 0 there, and 0 * garbage can be NaN); in K they are masked."""
        cfg = self.cfg
        tidx, _, _ = cute.arch.thread_idx()

        def tile_loaders(m_block, head, batch):
            gQ = mQ[(None, None, head, batch)]  # (s_q, d)
            gK = mK[(None, None, head, batch)]  # (s_k, d)
            gVt = mVt[(None, None, head, batch)]  # (d, s_k)
            q_part = cpa.partition_operand(gQ, sQ, (cfg.block_m, cfg.head_dim), tidx, WARPGROUP)
            k_part = cpa.partition_operand(gK, sK, (cfg.block_n, cfg.head_dim), tidx, WARPGROUP)
            v_part = cpa.partition_operand(gVt, sV, (cfg.head_dim, cfg.block_n), tidx, WARPGROUP)

            def load_q(q_stage):
                cpa.load_tile(q_part, m_block, 0, q_stage, gQ.shape,
                              (cfg.block_m, cfg.head_dim))
                self.loader.commit(q_full + q_stage)

            def load_k(j, state):
                cpa.load_tile(k_part, j, 0, state.index, gK.shape, (cfg.block_n, cfg.head_dim))

            def load_v(j, state):
                cpa.load_tile(v_part, 0, j, state.index, gVt.shape, (cfg.head_dim, cfg.block_n))

            return load_q, load_k, load_v

        self._produce_walk(pipe_k, pipe_v, q_empty, items, heads, seqlen_q, seqlen_k,
                           tile_loaders)

    @cute.jit
    def _produce_walk(self, pipe_k, pipe_v, q_empty, items, heads, seqlen_q, seqlen_k,
                      tile_loaders: cutlass.Constexpr):
        """The producer's walk over this CTA's tiles, both mechanisms: ``tile_loaders(m_block,
        head, batch)`` gives that tile's (load_q, load_k, load_v), traced once inside the
        iteration, so what they capture is this tile's; the ring position is carried as a
        plain count of key blocks (``_ring``), then the rings' tails."""
        local = cutlass.Int32(0)  # tiles this CTA has done
        done = cutlass.Int32(0)  # key blocks this CTA has loaded: the ring's position
        for k in cutlass.range(self._my_item_count(items), unroll=1):
            worker, workers = self._worker()
            item = worker + k * workers
            for half in cutlass.range(self._item_tiles(item, seqlen_q), unroll=1):
                m_block, head, batch = self._tile_coords(item, half, seqlen_q, heads,
                                                         self._cta_rank())
                load_q, load_k, load_v = tile_loaders(m_block, head, batch)
                n_blocks = self._key_blocks(m_block, seqlen_q, seqlen_k)
                self._produce_tile(pipe_k, pipe_v, q_empty, local, done, n_blocks, load_q,
                                   load_k, load_v)
                done += n_blocks
                local += 1
        pipe_k.producer_tail(self._ring(done, producer=True))
        pipe_v.producer_tail(self._ring(done, producer=True))

    @cute.jit
    def _produce_tile(self, pipe_k, pipe_v, q_empty, local, done, n_blocks,
                      load_q: cutlass.Constexpr, load_k: cutlass.Constexpr,
                      load_v: cutlass.Constexpr):
        """One tile's loads, the same order for every mechanism: K_0 and V_0 first (they
        need only a free stage, so they overlap the consumers' last blocks of the previous
        tile), then Q once the consumers have finished reading the Q that buffer held before
        (q empty: the previous tile's, or with two buffers the one before), then the
        remaining key blocks."""
        first = cutlass.min(n_blocks, 1)
        self._produce_kv(pipe_k, pipe_v, self._ring(done, producer=True), 0, first, load_k,
                         load_v)
        q_stage, q_phase = self._q_slot(local)
        if local >= self.cfg.q_stages:  # this buffer's previous tile has been read
            cute.arch.mbarrier_wait(q_empty + q_stage, 1 - q_phase)
        load_q(q_stage)
        self._produce_kv(pipe_k, pipe_v, self._ring(done + first, producer=True), first,
                         n_blocks, load_k, load_v)

    @cute.jit
    def _produce_kv(self, pipe_k, pipe_v, state, start, stop, load_k: cutlass.Constexpr,
                    load_v: cutlass.Constexpr):
        """The K/V schedule: for key blocks start..stop-1 take the next empty K stage,
        ``load_k`` into it, commit, then the same for V (TMA: the bytes complete the barrier,
        a no-op here; cp.async: each thread arrives when its copies land). ``state`` is the
        ring position of block ``start`` (the same in both rings); the caller rebuilds its own
        from counts (``_ring``)."""
        for j in cutlass.range(start, stop, unroll=1):
            pipe_k.producer_acquire(state)
            load_k(j, state)
            pipe_k.producer_commit(state)
            pipe_v.producer_acquire(state)
            load_v(j, state)
            pipe_v.producer_commit(state)
            state.advance()

    def _ring(self, done, producer: bool = False):
        """The pipeline state after ``done`` key blocks, rebuilt from that count at each
        tile: a state advanced inside a helper's or a branch's staged loop does not reliably
        come back out of it (the tracer rebuilds such objects), while a plain Int32 count
        does. Producers start on phase 1 (every stage empty), consumers on 0."""
        stages = self.cfg.stages
        phase = (done // stages) % 2
        if producer:
            phase = 1 - phase
        return pipeline.PipelineState(stages, done, done % stages, phase)

    @cute.jit
    def consume(self, pipe_k, pipe_v, q_full, q_empty, qk_mma, pv_mma, sQ, sK, sV, mO, mLSE, items,
                heads, seqlen_q, seqlen_k, scale_log2):
        """A consumer warpgroup, per tile: its 64 query rows against every key block."""
        cfg = self.cfg
        tidx, _, _ = cute.arch.thread_idx()
        ctid = tidx - WARPGROUP
        wg = ctid // WARPGROUP  # 0 .. consumers - 1: rows [64 wg, 64 wg + 64) of the block
        lane = tidx % 32
        warp_in_wg = (ctid % WARPGROUP) // 32
        qk_thr = qk_mma.get_slice(wg * WARPGROUP)
        pv_thr = pv_mma.get_slice(wg * WARPGROUP)
        tSrQ = qk_mma.make_fragment_A(qk_thr.partition_A(sQ))
        tSrK = qk_mma.make_fragment_B(qk_thr.partition_B(sK))
        tOrV = pv_mma.make_fragment_B(pv_thr.partition_B(sV))
        s_shape = qk_thr.partition_shape_C((cfg.block_m, cfg.block_n))
        o_shape = pv_thr.partition_shape_C((cfg.block_m, cfg.head_dim))
        # set once, here: a field set inside a staged loop cannot be read after it
        pv_mma.set(warpgroup.Field.ACCUMULATE, True)
        # this thread's rows (in its tile) and first column inside a tile (the WGMMA
        # accumulator layout)
        row_in_block = wg * 64 + warp_in_wg * 16 + lane // 4
        col_in_tile = (lane % 4) * 2
        p_steps = cfg.block_n // 16

        # pingpong: warpgroup w waits on barrier 1 + w before issuing its GEMMs and then
        # signals the next one's, round robin (ids 1 .. consumers are this kernel's only
        # named barriers). The turn runs on across tiles (all warpgroups walk the same tiles,
        # so they take the same number of turns): the first warpgroup starts its next tile's
        # GEMMs while the last one still finishes its softmax, P V and epilogue. (Passing the
        # turn only at the next tile's start left the tensor cores idle for an epilogue per
        # tile.) The last warpgroup opens the first turn, once; its final pass is left
        # unanswered when the CTA exits, as in FlashAttention-3.
        if cutlass.const_expr(cfg.pingpong):
            if wg == cfg.consumers - 1:
                self._turn(pass_on=True)  # warpgroup 0 goes first

        local = cutlass.Int32(0)
        done = cutlass.Int32(0)  # key blocks this CTA has consumed: the ring's position
        for k in cutlass.range(self._my_item_count(items), unroll=1):
            worker, workers = self._worker()
            item = worker + k * workers
            for half in cutlass.range(self._item_tiles(item, seqlen_q), unroll=1):
                m_block, head, batch = self._tile_coords(item, half, seqlen_q, heads,
                                                         self._cta_rank())
                n_blocks = self._key_blocks(m_block, seqlen_q, seqlen_k)
                row0 = m_block * cfg.block_m + row_in_block
                read = self._ring(done)
                # the register tensors are made per tile: nothing in them lives from one tile
                # to the next, so they need not be values carried around the tile loop (this
                # alone did not lift the C7512 of bf16, d = 128; the loop's form did, see
                # _my_item_count)
                acc_o = cute.make_rmem_tensor(o_shape, cutlass.Float32)
                acc_o.fill(0.0)
                row_max = cute.make_rmem_tensor((2,), cutlass.Float32)  # rows r and r + 8
                row_max.fill(-cutlass.Float32.inf)
                row_sum = cute.make_rmem_tensor((2,), cutlass.Float32)
                row_sum.fill(0.0)
                acc_s = cute.make_rmem_tensor(s_shape, cutlass.Float32)
                correction = cute.make_rmem_tensor((2,), cutlass.Float32)  # O's rescale
                # P, converted element by element, is the A operand of P V (see the docstring)
                tOrP = cute.make_rmem_tensor(cute.make_layout(
                    ((2, 2, 2), 1, p_steps), stride=((1, 2, 4), 0, 8)), mO.element_type)
                tOrP_as_s = cute.make_tensor(tOrP.iterator, acc_s.layout)
                q_stage, q_phase = self._q_slot(local)
                cute.arch.mbarrier_wait(q_full + q_stage, q_phase)
                if cutlass.const_expr(cfg.load == "cp_async"):
                    cute.arch.fence_view_async_shared()  # Q came through the generic proxy
                if cutlass.const_expr(not cfg.overlap):
                    for j in cutlass.range(n_blocks, unroll=1):
                        self.loader.consumer_wait(pipe_k, read)
                        self._issue_qk(qk_mma, acc_s, tSrQ, tSrK, q_stage, read.index)
                        warpgroup.wait_group(0)
                        self.loader.consumer_release(pipe_k, read)
                        self._release_q_after(j, n_blocks, q_empty + q_stage)
                        self._mask(acc_s, j, row0, col_in_tile, seqlen_q, seqlen_k)
                        self._online_softmax(acc_s, correction, row_max, row_sum, scale_log2)
                        self._rescale(acc_o, correction)
                        tOrP_as_s.store(acc_s.load().to(mO.element_type))
                        self.loader.consumer_wait(pipe_v, read)
                        self._issue_pv(pv_mma, acc_o, tOrP, tOrV, read.index)
                        warpgroup.wait_group(0)
                        self.loader.consumer_release(pipe_v, read)
                        read.advance()
                else:
                    if n_blocks > 0:
                        # V_{j-1} (this iteration's P V) is waited for and released one iteration
                        # behind K_j
                        release = read.clone()
                        # block 0: S_0 and its softmax; its P V is issued with S_1
                        self.loader.consumer_wait(pipe_k, read)
                        if cutlass.const_expr(cfg.pingpong):
                            self._turn(pass_on=False)
                        self._issue_qk(qk_mma, acc_s, tSrQ, tSrK, q_stage, read.index)
                        if cutlass.const_expr(cfg.pingpong):
                            self._turn(pass_on=True)
                        warpgroup.wait_group(0)
                        self.loader.consumer_release(pipe_k, read)
                        self._release_q_after(0, n_blocks, q_empty + q_stage)
                        self._mask(acc_s, 0, row0, col_in_tile, seqlen_q, seqlen_k)
                        self._online_softmax(acc_s, correction, row_max, row_sum, scale_log2)
                        read.advance()
                        for j in cutlass.range(1, n_blocks, unroll=1):
                            self.loader.consumer_wait(pipe_k, read)
                            if cutlass.const_expr(cfg.pv_wait == "late"):
                                # P_{j-2} V_{j-2}, issued in the last iteration, done (nothing
                                # is in flight at j = 1): waited for here, behind the loop's
                                # back edge, which ptxas does not hoist a wait across (PV_WAIT)
                                warpgroup.wait_group(0)
                                if j > 1:
                                    self.loader.consumer_release(pipe_v, release)  # V_{j-2}
                                    release.advance()
                            if cutlass.const_expr(cfg.pingpong):
                                self._turn(pass_on=False)
                            # P_{j-1} from S_{j-1}, just before S_j overwrites it (here, not
                            # after the softmax: left to itself the compiler sank it here for
                            # bf16 but not for fp16, two loop shapes for one source; this
                            # placement measured 1% faster at d = 128 in both dtypes)
                            tOrP_as_s.store(acc_s.load().to(mO.element_type))
                            # S_j, while O takes j-1's rescale
                            self._issue_qk(qk_mma, acc_s, tSrQ, tSrK, q_stage, read.index)
                            self._rescale(acc_o, correction)
                            self.loader.consumer_wait(pipe_v, release)
                            self._issue_pv(pv_mma, acc_o, tOrP, tOrV, release.index)  # P_{j-1} V
                            if cutlass.const_expr(cfg.pingpong):
                                self._turn(pass_on=True)
                            warpgroup.wait_group(1)  # S_j is in; P V may still run
                            self.loader.consumer_release(pipe_k, read)  # K_j is read
                            self._release_q_after(j, n_blocks, q_empty + q_stage)
                            self._mask(acc_s, j, row0, col_in_tile, seqlen_q, seqlen_k)
                            self._online_softmax(acc_s, correction, row_max, row_sum, scale_log2)
                            if cutlass.const_expr(cfg.pv_wait == "early"):
                                # written after the softmax, as FlashAttention-3 writes it;
                                # ptxas hoists it to the softmax's start (PV_WAIT), so P V is
                                # done before the softmax runs. Written before the softmax
                                # instead, the SASS differs: 2-4% slower at d = 128 (geomean)
                                warpgroup.wait_group(0)
                                self.loader.consumer_release(pipe_v, release)  # V_{j-1}
                                release.advance()
                            read.advance()
                        if cutlass.const_expr(cfg.pv_wait == "late"):
                            warpgroup.wait_group(0)  # the loop's last P V
                            if n_blocks > 1:
                                self.loader.consumer_release(pipe_v, release)
                                release.advance()
                        tOrP_as_s.store(acc_s.load().to(mO.element_type))
                        self._rescale(acc_o, correction)
                        self.loader.consumer_wait(pipe_v, release)
                        self._issue_pv(pv_mma, acc_o, tOrP, tOrV, release.index)
                        warpgroup.wait_group(0)
                        self.loader.consumer_release(pipe_v, release)
                if n_blocks == 0:  # no Q K^T read Q: free it for the next tile's all the same
                    cute.arch.mbarrier_arrive(q_empty + q_stage)
                self._epilogue(acc_o, row_max, row_sum, mO, mLSE, head, batch, row0, seqlen_q,
                               scale_log2)
                done += n_blocks
                local += 1

    @cute.jit
    def _turn(self, pass_on: cutlass.Constexpr):
        """pingpong: wait for this warpgroup's turn (its barrier, 1 + w), or pass the turn on to
        the next warpgroup (arrive on its barrier). The warpgroup is read from the thread index
        at each call rather than kept: a value live across the whole tile loop cost ptxas a
        few spilled registers at d = 128."""
        wg = cute.arch.thread_idx()[0] // WARPGROUP - 1
        if cutlass.const_expr(pass_on):
            wg = (wg + 1) % self.cfg.consumers
        turn = pipeline.NamedBarrier(barrier_id=1 + wg, num_threads=2 * WARPGROUP)
        if cutlass.const_expr(pass_on):
            turn.arrive()
        else:
            turn.arrive_and_wait()

    @cute.jit
    def _q_slot(self, local):
        """Tile ``local``'s Q buffer and the phase of its full barrier (buffer i serves tiles
        i, i + q_stages, ...). One buffer: buffer 0, a constant, as before there were two."""
        if cutlass.const_expr(self.cfg.q_stages == 1):
            return 0, local % 2
        return local % self.cfg.q_stages, (local // self.cfg.q_stages) % 2

    @cute.jit
    def _release_q_after(self, j, n_blocks, q_empty):
        """Once the tile's last Q K^T (block j = n_blocks - 1) has completed, Q is read: arrive
        on q empty there, not after the tile, so the next tile's Q loads under this tile's
        last softmax, P V and epilogue (a TMA load's latency, about a microsecond, is
        otherwise exposed at every tile start: 4 key blocks per tile at s = 512)."""
        if j == n_blocks - 1:
            cute.arch.mbarrier_arrive(q_empty)

    @cute.jit
    def _issue_qk(self, qk_mma, acc_s, tSrQ, tSrK, q_stage, stage):
        """S = Q K^T into acc_s, one commit group (not waited for)."""
        warpgroup.fence()  # the softmax read acc_s: order it before WGMMA writes it
        for kb in cutlass.range_constexpr(cute.size(tSrQ, mode=[2])):
            qk_mma.set(warpgroup.Field.ACCUMULATE, kb != 0)
            cute.gemm(qk_mma, acc_s, tSrQ[(None, None, kb, q_stage)], tSrK[(None, None, kb, stage)],
                      acc_s)
        warpgroup.commit_group()

    @cute.jit
    def _issue_pv(self, pv_mma, acc_o, tOrP, tOrV, stage):
        """O += P V, one commit group (not waited for)."""
        warpgroup.fence()  # P and the rescaled O come from ordinary register writes
        for kb in cutlass.range_constexpr(cute.size(tOrP, mode=[2])):
            cute.gemm(pv_mma, acc_o, tOrP[(None, None, kb)], tOrV[(None, None, kb, stage)],
                      acc_o)
        warpgroup.commit_group()

    @cute.jit
    def _mask(self, acc_s, j, row0, col_in_tile, seqlen_q, seqlen_k):
        """-inf where a key lies past s_k, or (causal) past the query's diagonal."""
        cfg = self.cfg
        col0 = j * cfg.block_n + col_in_tile
        needs = (j + 1) * cfg.block_n > seqlen_k
        if cutlass.const_expr(cfg.causal):
            needs = needs | ((j + 1) * cfg.block_n - 1 > row0 - (row0 % 64) + seqlen_k - seqlen_q)
        if needs:
            for i in cutlass.range_constexpr(cute.size(acc_s)):
                col = col0 + (i // 4) * 8 + i % 2
                row = row0 + 8 * ((i // 2) % 2)
                dead = col >= seqlen_k
                if cutlass.const_expr(cfg.causal):
                    dead = dead | (col > row + seqlen_k - seqlen_q)
                if dead:
                    acc_s[i] = -cutlass.Float32.inf

    @cute.jit
    def _online_softmax(self, acc_s, correction, row_max, row_sum, scale_log2):
        """Update the running max and sum of this thread's two rows, S -> P in place, and
        leave in ``correction`` the factor O must be rescaled by (``_rescale``): the caller
        decides when, so the rescale can wait for an in-flight P V to finish."""
        for r in cutlass.range_constexpr(2):
            row = [i for i in range(cute.size(acc_s)) if (i // 2) % 2 == r]
            new_max = cute.arch.fmax(row_max[r], pairwise([acc_s[i] for i in row],
                                                          cute.arch.fmax))
            new_max = cute.arch.warp_reduction_max(new_max, threads_in_group=4)
            # a fully masked row keeps max -inf: use 0 so exp2 gives 0, not NaN
            safe_max = new_max
            if new_max == -cutlass.Float32.inf:
                safe_max = 0.0
            corr = cute.math.exp2((row_max[r] - safe_max) * scale_log2, fastmath=True)
            if row_max[r] == -cutlass.Float32.inf:
                corr = 0.0
            correction[r] = corr
            row_max[r] = new_max
            max_scaled = safe_max * scale_log2
            every = self.cfg.exp2_fma
            for k, i in enumerate(row):
                x = acc_s[i] * scale_log2 - max_scaled
                if cutlass.const_expr(exp2_on_fma_at(k, every)):
                    acc_s[i] = exp2_on_fma(x)
                else:
                    acc_s[i] = cute.math.exp2(x, fastmath=True)
            block_sum = pairwise([acc_s[i] for i in row], lambda a, b: a + b)
            row_sum[r] = row_sum[r] * corr + block_sum  # per thread; reduced at the end

    @cute.jit
    def _rescale(self, acc_o, correction):
        for i in cutlass.range_constexpr(cute.size(acc_o)):
            acc_o[i] = acc_o[i] * correction[(i // 2) % 2]

    @cute.jit
    def _epilogue(self, acc_o, row_max, row_sum, mO, mLSE, head, batch, row0, seqlen_q,
                  scale_log2):
        """O /= rowsum, LSE = max * scale + ln(rowsum); O by 16-byte stores from registers.

        The accumulator gives a thread two columns of every 8 (2 quad, 2 quad + 1) of rows r and
        r + 8, so storing it as it lies takes d / 2 four-byte stores per thread, each writing
        half of eight 32-byte sectors. The four threads of a row (a quad) hold, between them,
        every column: a 4 x 4 transpose of their 4-byte pairs inside each 32 columns (two
        butterfly shuffle steps, ``_quad_transpose``) gives each thread 8 contiguous columns,
        stored as one 16 bytes: 4x fewer stores, whole sectors. (The SASS profile of
        2026-11-30 put a quarter of the consumers' stall samples at s = 512 in the old
        epilogue: stores queued in the LSU, and the next tile's first instruction waiting for
        them to read their registers.)"""
        cfg = self.cfg
        tidx, _, _ = cute.arch.thread_idx()
        quad = tidx % 4
        # both rows' sums first: the two shuffle chains' latencies overlap
        total = cute.make_rmem_tensor((2,), cutlass.Float32)
        for r in cutlass.range_constexpr(2):
            total[r] = cute.arch.warp_reduction_sum(row_sum[r], threads_in_group=4)
        for r in cutlass.range_constexpr(2):
            inv = 0.0
            if total[r] > 0.0:
                inv = cute.arch.rcp_approx(total[r])
            row = row0 + 8 * r
            # the row's d columns as 8-column chunks: chunk 4 k + quad is this thread's
            o_chunks = cute.zipped_divide(cute.local_tile(
                mO[(row, None, head, batch)], (cfg.head_dim,), (0,)), (8,))
            for k in cutlass.range_constexpr(cfg.head_dim // 32):
                # slot q: this thread's pair in 8-column group 4 k + q (accumulator index
                # 4 g + 2 r + c holds row r's column 8 g + 2 quad + c)
                chunk = cute.make_rmem_tensor((8,), mO.element_type)
                for q in cutlass.range_constexpr(4):
                    for c in cutlass.range_constexpr(2):
                        chunk[2 * q + c] = (acc_o[4 * (4 * k + q) + 2 * r + c] * inv).to(
                            mO.element_type)
                self._quad_transpose(cute.recast_tensor(chunk, cutlass.Int32), quad)
                if row < seqlen_q:
                    cute.autovec_copy(chunk, o_chunks[(None, 4 * k + quad)])
            if row < seqlen_q:
                if quad == 0:
                    lse = -cutlass.Float32.inf
                    if total[r] > 0.0:
                        lse = row_max[r] * (scale_log2 / LOG2_E) + cute.math.log(
                            total[r], fastmath=True)
                    mLSE[row, head, batch] = lse

    @staticmethod
    @cute.jit
    def _quad_transpose(words, quad):
        """Word q of lane ``quad`` (of 4 lanes) <- word ``quad`` of lane q, by the butterfly
        steps of ``QUAD_TRANSPOSE_STEPS``. Every lane shuffles the same register; a select
        picks which of its two words it sends and which the partner's word replaces."""
        for step in cutlass.range_constexpr(len(QUAD_TRANSPOSE_STEPS)):
            m, a, b = QUAD_TRANSPOSE_STEPS[step]
            upper = (quad & m) != 0  # this lane keeps word b and replaces word a
            send = cutlass.select_(upper, words[a], words[b])
            got = cute.arch.shuffle_sync_bfly(cutlass.Int32(send), offset=m)
            words[a] = cutlass.select_(upper, got, words[a])
            words[b] = cutlass.select_(upper, words[b], got)


def _f32_hex(value: float) -> str:
    """A PTX float literal's hex digits (0fXXXXXXXX) for ``value`` as fp32."""
    import struct

    return struct.pack(">f", value).hex().upper()


def exp2_on_fma_ptx() -> str:
    """The PTX of ``exp2_on_fma``, its constants written in (``EXP2_CUBIC``'s note)."""
    c1, c2, c3 = (_f32_hex(c) for c in EXP2_CUBIC)
    rounder = _f32_hex(EXP2_ROUNDER)
    return "\n".join([
        "{ .reg .f32 x, t, f, p; .reg .b32 ti, pi;",
        f"max.f32 x, $1, 0f{_f32_hex(EXP2_FLOOR)};",
        f"add.rn.f32 t, x, 0f{rounder};",   # round(x) into the low mantissa bits
        f"sub.rn.f32 f, t, 0f{rounder};",   # round(x) as a float
        "sub.rn.f32 f, x, f;",              # f in [-0.5, 0.5]
        f"fma.rn.f32 p, f, 0f{c3}, 0f{c2};",
        f"fma.rn.f32 p, p, f, 0f{c1};",
        "fma.rn.f32 p, p, f, 0f3F800000;",  # 2^f
        "mov.b32 ti, t;", "mov.b32 pi, p;", "shl.b32 ti, ti, 23;",
        "add.s32 pi, pi, ti;",              # 2^round(x) * 2^f
        "mov.b32 $0, pi; }"])


def exp2_on_fma_at(k: int, every: int) -> bool:
    """Whether a row's k-th score takes the cubic under ``exp2_fma=every`` (a plain function:
    traced code does not short-circuit ``and``)."""
    return every > 0 and k % every == every - 1


@cute.jit
def exp2_on_fma(x):
    """2^x for x <= 0 (a softmax's exponent) on the FMA and integer pipes, without MUFU: the
    steps of ``EXP2_CUBIC``'s note, in one asm block so nothing reassociates the rounding."""
    return cutlass.Float32(llvm.inline_asm(
        cutlass.Float32.mlir_type, [cutlass.Float32(x).ir_value()], exp2_on_fma_ptx(), "=f,f",
        has_side_effects=False, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT))


def pairwise(values, combine):
    """``combine`` over ``values`` as a balanced tree (traced: a plain Python function, so the
    loop unrolls). A row's max and sum of exps as one left-to-right chain are 32 dependent
    instructions at d = 128 (ptxas does not reassociate them), which the softmax of one warp
    waits out at the start of every block; as a tree the same 31 instructions are 5 deep."""
    while len(values) > 1:
        values = [combine(values[i], values[i + 1]) if i + 1 < len(values) else values[i]
                  for i in range(0, len(values), 2)]
    return values[0]


def attention_ref(q, k, v, causal: bool = False, softmax_scale: float | None = None):
    """fp32 reference (torch): q (b, s_q, h, d), k and v (b, s_k, h_kv, d); bottom-right
    causal alignment as FlashAttention. Returns (out, lse) with lse (b, h, s_q)."""
    import torch

    b, s_q, h, d = q.shape
    s_k, h_kv = k.shape[1], k.shape[2]
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(d)
    qf, kf, vf = (x.float().transpose(1, 2) for x in (q, k, v))  # (b, h, s, d)
    kf = kf.repeat_interleave(h // h_kv, dim=1)
    vf = vf.repeat_interleave(h // h_kv, dim=1)
    s = qf @ kf.transpose(-1, -2) * scale
    if causal:
        i = torch.arange(s_q, device=q.device)[:, None]
        j = torch.arange(s_k, device=q.device)[None, :]
        s = s.masked_fill(j > i + s_k - s_q, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)  # rows with no key: output 0
    return (p @ vf).transpose(1, 2), lse
