"""``AttentionConfig`` and the tables its defaults come from (host only: no DSL at import).

Each table's choice was measured on the H200; docs/design.md says what was measured and
which results file shows it.
"""

from __future__ import annotations

import dataclasses
import math

from cutetma.kernels.smem import smem_capacity

WARPGROUP = 128
LOG2_E = 1.4426950408889634
# setmaxnreg budgets (producer, each consumer) per (load, consumer warpgroups w). p + w c may
# not exceed what the launch gave the CTA's 1 + w warpgroups, 64K / threads per thread rounded
# down to 8 (168 for 384 threads: p + 2 c <= 504, not 512): setmaxnreg.inc waits for registers
# no warpgroup will free (48 / 232 hung the cp.async kernel on the H200). With three consumers
# 160 is the most they can have. TMA with two: FlashAttention-3's 24 / 240 (one thread issues
# the loads); cp.async with two: 40 / 232, what its 128 copying threads need without spilling
# the consumers. ptxas decides C7512 / spills here: tests/test_attention_ptx.py checks them.
REGISTERS = {("tma", 2): (24, 240), ("cp_async", 2): (40, 232),
             ("tma", 3): (32, 160), ("cp_async", 3): (32, 160)}
# Paged TMA: the producer keeps a warp's cache of page ids and spilled at 24 registers; it
# takes cp.async's budget (ptxas -v on page sizes 16 and 64, causal and not).
REGISTERS_PAGED = {("tma", 2): (40, 232), ("cp_async", 2): (40, 232),
                   ("tma", 3): (32, 160), ("cp_async", 3): (32, 160)}
# ... except causal d = 128 TMA-paged tiles, not packed, whose boxes hold at least
# PAGED_FA3_BUDGET_MIN_BOX keys (at most 4 boxes a stage: the page-id cache fits 24 registers,
# ptxas spills nothing): they take the dense kernel's 24 / 240, and the consumers' 8 more
# registers ran causal prefill 2-3% faster at pages 64 / 128 (docs/design.md, "Paged
# attention"); non-causal was within 2.5% either way, and smaller boxes spill 40-120 bytes
PAGED_FA3_BUDGET_MIN_BOX = 32
# ``AttentionConfig.producer_registers``: a producer budget beside two consumers sharing
# what a 384-thread launch holds per (producer, consumer, consumer) thread triple
PAIR_REGISTERS = 504
PRODUCER_REGISTERS = (24, 32, 40, 48)
# (e4m3 with V transposed in shared memory, ``transposes_v``, keeps these budgets: its
# transposing steps fit the producer's 24 registers, a dense tile's walk parking 16-60
# bytes of addresses on the stack)
V_TRANSPOSES = ("smem", "global")
SCHEDULES = ("serial", "overlap", "pingpong")
# (head_dim, load, causal) where split_kv is refused: the DSL (4.8.1) crashes compiling it
# (a segmentation fault in its backend); decode there runs unsplit
SPLIT_KV_UNSUPPORTED = {(256, "cp_async", True)}
# (block_m, block_n) per (head_dim, causal): 128 query rows (two consumer warpgroups) at every
# head dim; d = 256 with FlashAttention-3's 80-key stages (Q 64 KiB + 2 x (K + V) 160 KiB of
# shared memory). What the paged and FP8 kernels and a bare AttentionConfig take; the dense
# torch face widens d = 64 to 192 rows (three consumer warpgroups, WIDE_ROWS).
BLOCKS = {(64, False): (128, 128), (64, True): (128, 128), (128, False): (128, 128),
          (128, True): (128, 128), (256, False): (128, 80), (256, True): (128, 80)}
# Key blocks by the keys' length (``dense_tile``): non-causal at d = 64 / 128, a length that
# is not whole 128-key blocks runs 160-key blocks where that saves a block and the walk is
# short (at most ODD_KEY_BLOCK_MAX 160-key blocks): each block costs its barriers, reductions
# and masked tail beyond its GEMMs, and a short odd length pays it for a mostly empty last
# block (s = 257: 3 blocks of 128, the last with one key; 2 of 160). Measured (H200, bf16,
# 16k tokens, 160 vs 128 keys): d = 64 s = 257 / 577 / 1000 191 / 333 / 381 vs 160 / 315 /
# 386 TFLOP/s; d = 128 253 / 444 / 521 vs 230 / 459 / 559. Where 128 divides the length 160
# lost (d = 64 s = 1024 372 vs 424) or tied (4k, 16k); causal lost (the diagonal no longer
# falls on block edges: d = 64 s = 577 144 vs 188).
ODD_KEY_BLOCK = {64: 160, 128: 160}
ODD_KEY_BLOCK_MAX = {64: 4, 128: 2}
# Query rows of the dense tile where three consumer warpgroups win (``dense_tile``; the
# 160-key odd-length tiles keep 128 rows: 192 x 160 spills): d = 64, FA4's 192 x 128, with
# pingpong and P V's wait late (at 160 registers the early wait made ptxas compute every
# exp2 twice: 122 MUFU.EX2 a block for 64 scores). bf16, 192 vs 128 rows, non-causal:
# s = 512 / 2k / 4k / 8k 380 / 481 / 496 / 524 vs 370 / 409 / 413 / 412 TFLOP/s. Causal only
# from WIDE_ROWS_MIN_KEYS keys: s = 8k / 16k 458 / 475 vs 430 / 449, but 2k 337 vs 382 (a
# 192-row tile's diagonal spans two or three key blocks, and short walks pay for it).
WIDE_ROWS = {(64, False): 192, (64, True): 192}
WIDE_ROWS_MIN_KEYS = {(64, True): 8192}
# Q buffers per (head_dim, causal), 1 where not named: two only where they measured faster
# (at d = 128 the second buffer costs a K/V stage; d = 256 has no room for it).
Q_STAGES = {(64, False): 2}
# The default schedule per (head_dim, causal), from the ablation of all three on the H200
# (fp16 and bf16 chose alike).
BEST_SCHEDULE = {
    (64, False): "pingpong", (64, True): "overlap",
    (128, False): "overlap", (128, True): "overlap",
    (256, False): "overlap", (256, True): "overlap",
}
# Where overlap / pingpong wait for P_{j-1} V_{j-1}, per head dim. The SASS, not the source,
# decides what overlaps: ptxas hoists a wgmma wait written after block j's softmax to the top
# of its basic block, so
#   "early": the wait comes before the softmax (the other warpgroup's GEMMs fill the tensor
#            cores during this one's softmax);
#   "late":  the wait at the top of the next iteration, behind the loop's back edge, which
#            ptxas does not hoist it across: the softmax of block j runs under P_{j-1} V_{j-1}.
PV_WAIT = {64: "early", 128: "early", 256: "late"}
PV_WAITS = ("early", "late")
# e4m3, dense K/V: where V is transposed (``AttentionConfig.v_transpose``); the two tie
# at d = 128, s 4k-8k (docs/design.md, "V^T in shared memory")
FP8_V_TRANSPOSE = "global"


@dataclasses.dataclass(frozen=True)
class AttentionConfig:
    """One compiled variant of ``FlashAttentionSm90`` (0 / "" fields: the tables' choice).

    ``persistent=False`` and ``schedule="serial"`` are experimental ablation options (tutorial
    08 compares them with the defaults); they are never the defaults."""

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
    # "serial" (experimental): S = QK^T, wait, softmax, O += PV, wait (nothing overlaps
    #   within a warpgroup);
    # "overlap": issue S_j = Q K_j^T and O += P_{j-1} V_{j-1} together, softmax S_j while
    #   P V runs (FlashAttention-3's intra-warpgroup overlap);
    # "pingpong": "overlap", and the warpgroups take turns issuing their GEMMs (named
    #   barriers), so one's softmax runs under the other's GEMMs.
    schedule: str = ""  # "": BEST_SCHEDULE's choice (pingpong at block_m=192, WIDE_ROWS)
    # persistent: one CTA per SM walks the (query block, head, batch) tiles, so the next
    # tile's Q and K/V loads run under this tile's epilogue; False (experimental): one CTA per
    # tile
    persistent: bool = True
    # overlap / pingpong: where this warpgroup waits for its P_{j-1} V_{j-1} (PV_WAIT):
    # "early", before block j's softmax, or "late", at the next iteration's start, so the
    # softmax runs under it; "": PV_WAIT's choice for the head dim (late at block_m=192)
    pv_wait: str = ""
    # paged K/V (``attention_with_kvcache``): keys per page of the cache pool, 0 for dense
    # K/V. A compile-time constant (a deployment fixes its page size), so a key's page and
    # its row in the page are a shift or a multiply, not a division.
    page_size: int = 0
    # paged only. pack_gqa: the query heads of one K/V head share a tile, their rows packed
    # as (group, s_q) (row r is query r // group of head r % group of the group), so a
    # decode step or a short chunk reads each K/V block once per K/V head, not once per
    # query head (FlashAttention-3's PackGQA); its Q is gathered row by row, and a consumer
    # warpgroup whose 64 rows are all past the tile's rows skips its GEMMs.
    pack_gqa: bool = False
    # paged only. split_kv: a tile's key blocks are cut into ``num_splits`` (a runtime
    # value) ranges; each writes an fp32 partial O and its LSE, which a combine merges
    # (decode with fewer (sequence, K/V head) tiles than SMs)
    split_kv: bool = False
    # paged only. varlen_q: the queries of every sequence end to end, (total_q, h, d), with
    # their offsets (cu_seqlens_q); the tile walk covers the longest sequence's, and a tile
    # past a shorter one's does no work. Q is gathered by rows (a sequence starts anywhere)
    varlen_q: bool = False
    # bytes per Q / K / V element: 2 (fp16, bf16) or 1 (e4m3, ``attention_fp8``): how many
    # K/V stages fit in shared memory (the kernel itself takes the dtype from its tensors)
    element_bytes: int = 2
    # e4m3 only: where V becomes V^T (WGMMA reads 8-bit B operands K-major only, so P V
    # needs V with its keys contiguous). "smem": V is read as stored, dense or paged, into
    # a raw ring, and the producer warpgroup transposes each stage into the ring P V reads
    # (FlashAttention-3's choice; ``transposer.py``); "global": the torch face makes V^T once
    # per call (``VTranspose``), dense only. "": "smem" where paged, else FP8_V_TRANSPOSE's
    v_transpose: str = ""
    # the producer warpgroup's setmaxnreg budget with two consumer warpgroups, which take the
    # rest of the launch's 504 per (producer, consumer) pair (24 -> 240, 40 -> 232); 0:
    # REGISTERS / REGISTERS_PAGED's. A/Bs of the paged TMA producer's 40 (docs/design.md)
    producer_registers: int = 0

    def __post_init__(self):
        if self.head_dim not in (64, 128, 256):
            raise ValueError(f"head_dim={self.head_dim}: 64, 128 or 256")
        if self.element_bytes not in (1, 2):
            raise ValueError(f"element_bytes={self.element_bytes}: 2 (16-bit) or 1 (e4m3)")
        if self.element_bytes == 2 and self.v_transpose:
            raise ValueError("v_transpose is an option of e4m3 operands (element_bytes=1)")
        if self.element_bytes == 1 and not self.v_transpose:
            object.__setattr__(self, "v_transpose", "smem" if self.paged else FP8_V_TRANSPOSE)
        if self.v_transpose and self.v_transpose not in V_TRANSPOSES:
            raise ValueError(f"v_transpose={self.v_transpose!r}: one of {V_TRANSPOSES}")
        if self.v_transpose == "global" and self.paged:
            raise ValueError("v_transpose='global' makes V^T of a dense V; a paged cache is "
                             "transposed in shared memory ('smem')")
        block_m, block_n = BLOCKS[(self.head_dim, self.causal)]
        if not self.block_m:
            object.__setattr__(self, "block_m", block_m)
        if not self.block_n:
            object.__setattr__(self, "block_n", block_n)
        if not self.q_stages:
            object.__setattr__(self, "q_stages", Q_STAGES.get((self.head_dim, self.causal), 1))
        if not self.stages:
            object.__setattr__(self, "stages", min(3, self.max_stages))
        if not self.schedule:  # three consumer warpgroups: pingpong (WIDE_ROWS)
            schedule = ("pingpong" if self.consumers == 3 else
                        BEST_SCHEDULE[(self.head_dim, self.causal)])
            if self.pack_gqa and schedule == "pingpong":
                schedule = "overlap"  # an idle warpgroup takes no turns
            object.__setattr__(self, "schedule", schedule)
        if not self.pv_wait:  # three consumer warpgroups: late (WIDE_ROWS)
            object.__setattr__(self, "pv_wait",
                               "late" if self.consumers == 3 else PV_WAIT[self.head_dim])
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
        if self.load not in ("tma", "cp_async"):
            raise ValueError(f"load={self.load!r}: 'tma' or 'cp_async'")
        if self.block_m == 192 and self.head_dim != 64:
            raise ValueError("block_m=192 (three consumer warpgroups) only for head_dim 64: "
                             "a 64 x d fp32 O accumulator per thread group does not fit "
                             f"{REGISTERS[(self.load, 3)][1]} registers beside S and P")
        if self.q_stages not in (1, 2):
            raise ValueError(f"q_stages={self.q_stages}: 1 or 2")
        if self.page_size < 0:
            raise ValueError(f"page_size={self.page_size}: a positive number of keys, or 0")
        if self.paged and self.load == "tma" and self.kv_box % 8:
            raise ValueError(
                f"page_size={self.page_size} with block_n={self.block_n}: a TMA box of K/V "
                f"rows must start on a swizzle atom (8 rows); gcd(page_size, block_n) = "
                f"{self.kv_box} is not a multiple of 8. load='cp_async' takes any page size")
        if (self.pack_gqa or self.split_kv or self.varlen_q) and not self.paged:
            raise ValueError("pack_gqa, split_kv and varlen_q are options of the paged "
                             "kernel (page_size > 0)")
        if self.split_kv and (self.head_dim, self.load, self.causal) in SPLIT_KV_UNSUPPORTED:
            raise ValueError(f"split_kv with head_dim={self.head_dim}, load={self.load!r}, "
                             f"causal={self.causal}: not available (the DSL's compiler "
                             "crashes on it); use load='tma' or num_splits=1")
        if self.pack_gqa and self.pingpong:
            raise ValueError("pack_gqa with schedule='pingpong': a warpgroup with no rows "
                             "skips its GEMMs and cannot take turns; use 'overlap'")
        if not 2 <= self.stages <= self.max_stages:
            raise ValueError(f"stages={self.stages}: 2 .. {self.max_stages} (Q and the K/V "
                             f"stages share {smem_capacity() // 1024} KiB of shared memory)")
        if self.producer_registers and (self.consumers != 2 or self.producer_registers
                                        not in PRODUCER_REGISTERS):
            raise ValueError(f"producer_registers={self.producer_registers}: one of "
                             f"{PRODUCER_REGISTERS}, with two consumer warpgroups")
        if self.transposes_v and self.consumers != 2:
            raise ValueError("v_transpose='smem' runs with two consumer warpgroups "
                             "(block_m=128)")

    @property
    def max_stages(self) -> int:
        """K/V stages that fit beside Q's buffers (``element_bytes`` each; 1 KiB left for
        the barriers) and, where ``transposes_v``, two raw V stages."""
        return (smem_capacity() - 1024 - self._q_bytes
                - 2 * self._stage_bytes * self.transposes_v) // (2 * self._stage_bytes)

    @property
    def raw_v_stages(self) -> int:
        """``transposes_v``: the depth of the raw V ring (V as stored, before its transpose),
        as many as fit beside Q and the K / V^T stages, 2 to ``stages`` (the cp.async
        producer transposes block j - 1 after issuing block j's copies, so it holds two); 0
        otherwise."""
        if not self.transposes_v:
            return 0
        left = smem_capacity() - 1024 - self._q_bytes - 2 * self.stages * self._stage_bytes
        return min(self.stages, left // self._stage_bytes)

    @property
    def _q_bytes(self) -> int:
        return self.element_bytes * self.block_m * self.head_dim * self.q_stages

    @property
    def _stage_bytes(self) -> int:
        """One K or V stage (block_n x d)."""
        return self.element_bytes * self.block_n * self.head_dim

    @property
    def transposes_v(self) -> bool:
        """Whether V is transposed in shared memory (e4m3, ``v_transpose="smem"``)."""
        return self.v_transpose == "smem"

    @property
    def paged(self) -> bool:
        return self.page_size > 0

    @property
    def kv_box(self) -> int:
        """Key rows per TMA box: a stage of ``block_n`` keys is ``block_n // kv_box`` boxes,
        each inside one page (gcd(page_size, block_n): a stage may span several pages, and a
        page several stages); dense K/V: the whole stage."""
        return math.gcd(self.page_size, self.block_n) if self.paged else self.block_n

    @property
    def registers(self) -> tuple[int, int]:
        """setmaxnreg's (producer, each consumer) budget (``REGISTERS``, or
        ``producer_registers`` and the rest)."""
        if self.producer_registers:
            producer = self.producer_registers
            return producer, (PAIR_REGISTERS - producer) // 2 // 8 * 8
        if (self.paged and self.causal and self.head_dim == 128 and self.load == "tma"
                and not self.gathers_q and self.kv_box >= PAGED_FA3_BUDGET_MIN_BOX):
            return REGISTERS[(self.load, self.consumers)]
        return (REGISTERS_PAGED if self.paged else REGISTERS)[(self.load, self.consumers)]

    @property
    def gathers_q(self) -> bool:
        """Whether Q arrives by 16-byte cp.async row gathers (packed rows, or a varlen_q
        sequence starting at any row), not a TMA box."""
        return self.pack_gqa or self.varlen_q

    @property
    def skips_idle(self) -> bool:
        """Whether a consumer warpgroup whose rows all lie past the tile's skips the tile's
        GEMMs (it still takes and frees every stage): pack_gqa, where a decode tile's rows
        fill one warpgroup at most. (The extra path cost the plain paged kernel 16 bytes of
        spills under its 232-register budget, for tails only.)"""
        return self.pack_gqa

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


# setmaxnreg budgets of the backward (producer, each of its two consumer warpgroups): 24 / 240
# (FlashAttention-3's) for both producers. At 232 the consumers' five GEMMs no longer fit
# (ptxas C7512: every WGMMA serialized, d = 128); the cp.async producer's 128 threads then
# spill instead, off the tensor cores' path
BACKWARD_REGISTERS = {"tma": (24, 240), "cp_async": (24, 240)}
BACKWARD_HEAD_DIMS = (64, 128, 256)
# query rows of the backward's block per (head dim, producer), 64 where not named: FA4's
# 128-row tile at d = 64 with TMA, faster in every cell of the grid (docs/design.md,
# "Attention backward"); cp.async keeps 64 rows (its producer spills at 128)
BACKWARD_BLOCK_M: dict = {(64, "tma"): 128}


@dataclasses.dataclass(frozen=True)
class BackwardConfig:
    """One compiled variant of ``FlashAttentionBackwardSm90`` (``backward.py``): a CTA holds
    ``block_n`` keys (64 per consumer warpgroup) and walks the query blocks of ``block_m``
    rows that see them, Q and dO through ``stages`` buffers. FlashAttention-3's tile at
    d = 128 (64 x 128, two consumer warpgroups, S and dP computed transposed); at d = 64 its
    128 x 128 tile fits too, with dV issued after the dS math and the LSE and D read where
    used (``backward.py``). At d = 256 (``splits_d``) the CTA holds 64 keys and its
    warpgroups split d instead: dK and dV of 64 keys x 256 would not fit one warpgroup's
    registers (FlashAttention-3's layout there)."""

    head_dim: int = 128
    causal: bool = False
    load: str = "tma"  # "tma" or "cp_async": only the producer differs
    block_m: int = 0  # 0: BACKWARD_BLOCK_M's, else 64
    block_n: int = 0  # 0: 64 at d = 256, else 128
    stages: int = 2
    # when dV += P^T dO is issued: "late", after the dS math (FlashAttention-3's order), or
    # "early", right after P, to run under the dS math (64-row blocks that do not split d:
    # their registers hold it). Late: 2-8% faster at d = 128 on the H200 (docs/design.md,
    # "Attention backward"); where ``splits_d``, dV is issued with dK either way
    dv_issue: str = "late"
    # dQ's key-block contributions added in key-block order (each CTA waits for the one
    # before it at every query block: a turn counter per (query block, head, batch)), so
    # the gradients are the same bits every run (torch.use_deterministic_algorithms)
    deterministic: bool = False

    def __post_init__(self):
        if self.head_dim not in BACKWARD_HEAD_DIMS:
            raise ValueError(f"head_dim={self.head_dim}: the backward is built for "
                             f"{BACKWARD_HEAD_DIMS}")
        if self.load not in ("tma", "cp_async"):
            raise ValueError(f"load={self.load!r}: 'tma' or 'cp_async'")
        if not self.block_m:
            object.__setattr__(self, "block_m",
                               BACKWARD_BLOCK_M.get((self.head_dim, self.load), 64))
        if not self.block_n:
            object.__setattr__(self, "block_n", 64 if self.splits_d else 128)
        if self.block_n != (64 if self.splits_d else 128) or self.block_m not in (64, 128) or (
                self.block_m == 128 and self.head_dim != 64):
            raise ValueError(f"block_m={self.block_m}, block_n={self.block_n}: the backward's "
                             "tile is 64 queries x 128 keys (128 x 128 at d = 64, 64 x 64 at "
                             "d = 256)")
        if self.stages not in (1, 2):
            raise ValueError(f"stages={self.stages}: 1 or 2")
        narrow = self.block_m == 64 and not self.splits_d
        if self.dv_issue not in ("early", "late") or (self.dv_issue == "early" and not narrow):
            raise ValueError(f"dv_issue={self.dv_issue!r}: 'late', or 'early' with 64-row "
                             "blocks that do not split d")

    @property
    def splits_d(self) -> bool:
        """Whether the consumer warpgroups split d (d = 256: each its half of dK and dV for
        all 64 keys, P^T and dS^T shared through shared memory, dQ added by vector atomics:
        the shared memory a dQ staging would take holds the second Q / dO stage), not the
        keys (each its 64 keys over all of d)."""
        return self.head_dim == 256

    @property
    def consumers(self) -> int:
        return 2  # a warpgroup per 64 keys, or (splits_d) per half of d

    @property
    def kv_out_stages(self) -> int:
        """64-row stages dK and dV leave through (``stores_kv_tma``): one per warpgroup's 64
        keys, or (splits_d) one the two warpgroups' column halves share."""
        return 1 if self.splits_d else self.consumers

    @property
    def threads(self) -> int:
        return (1 + self.consumers) * WARPGROUP

    @property
    def registers(self) -> tuple[int, int]:
        return BACKWARD_REGISTERS[self.load]

    @property
    def dq_box_rows(self) -> int:
        """Rows of 256 fp32 in one consumer warpgroup's fragment-ordered dQ (its block_m x
        d / 2 half): the TMA reduction's box."""
        return self.block_m * self.head_dim // 2 // 256

    def smem_bytes(self, elem_bytes: int = 2) -> int:
        """K, V (block_n x d), Q and dO stages (block_m x d each), two dS buffers (and two
        P^T buffers where ``splits_d``), the fp32 dQ staging (block_m x d, not where
        ``splits_d``) and the LSE and D stages."""
        d = self.head_dim
        score_buffers = 4 if self.splits_d else 2
        return (elem_bytes * (2 * self.block_n * d + 2 * self.stages * self.block_m * d
                              + score_buffers * self.block_m * self.block_n)
                + (0 if self.splits_d else 4 * self.block_m * d)
                + 2 * 4 * self.stages * self.block_m)


def dense_tiles(head_dim: int, causal: bool) -> tuple[tuple[int, int], ...]:
    """Every (block_m, block_n) ``cutetma.attention`` may run for this head dim and mask
    (``dense_tile``)."""
    block_m, block_n = BLOCKS[(head_dim, causal)]
    tiles = [(WIDE_ROWS.get((head_dim, causal), block_m), block_n)]
    if (head_dim, causal) in WIDE_ROWS_MIN_KEYS:
        tiles.append((block_m, block_n))
    if ODD_KEY_BLOCK.get(head_dim) and not causal:
        tiles.append((block_m, ODD_KEY_BLOCK[head_dim]))
    return tuple(tiles)


def dense_tile(head_dim: int, causal: bool, seqlen_k: int) -> tuple[int, int]:
    """The (block_m, block_n) ``cutetma.attention`` runs for keys of this length:
    ``ODD_KEY_BLOCK``'s where it saves a block of a short odd length, else ``BLOCKS``' with
    ``WIDE_ROWS``' query rows (from ``WIDE_ROWS_MIN_KEYS`` keys where that names a minimum)."""
    block_m, block_n = BLOCKS[(head_dim, causal)]
    if not causal and head_dim in ODD_KEY_BLOCK and seqlen_k % block_n:
        odd = ODD_KEY_BLOCK[head_dim]
        blocks = math.ceil(seqlen_k / odd)
        if blocks < math.ceil(seqlen_k / block_n) and blocks <= ODD_KEY_BLOCK_MAX[head_dim]:
            return block_m, odd
    if seqlen_k >= WIDE_ROWS_MIN_KEYS.get((head_dim, causal), 0):
        return WIDE_ROWS.get((head_dim, causal), block_m), block_n
    return block_m, block_n


def dq_splits_rows(block_m: int, consumers: int) -> bool:
    """Whether the consumer warpgroups split dQ's query rows (each its 64: 128-query blocks,
    FA4's layout at d = 64), not its columns (64-query blocks: each a half of d). Split by
    columns at 128 rows, each warpgroup issued twice the WGMMAs at half the width (n = d /
    2, for both 64-row slabs)."""
    return block_m == 64 * consumers
