"""08 - Attention from the same pieces: TMA, mbarrier rings, WGMMA and warp specialization,
put together after FlashAttention-3 (FA3). The text also says where this kernel differs from FA3.

Run: ``python tutorials/08_attention.py``. It runs on any machine: it checks the arithmetic
in numpy, compiles the kernel for sm_90a and counts its instructions, and prints what the
H200 measured (``benchmarks/results/attention.json``). It launches nothing, even on a GPU.
The kernel is ``cutetma.kernels.attention.FlashAttentionSm90``, a package split as
FlashAttention-4's ``flash_attn/cute/`` is: ``config`` (``AttentionConfig`` and the tables of
its defaults), ``scheduler`` (the work walk), ``masking``, ``softmax``, ``epilogue`` and
``kernel`` (warp roles, producers, consumers). Its GPU tests are in
``tests/test_attention_gpu.py``: s_q = s_k in {1, 2, 113, 128, 203, 1023, 1024, 4224}
plus pairs with s_q != s_k (113/203 and 1/1024, both ways), d 64/128/256, causal or not,
MHA/GQA/MQA, both producers, all three schedules, and a persistent walk of many tiles per CTA
checked against one CTA per tile. All of them passed on the H200 (2026-12-01). The timings
come from
``benchmarks/attention.py`` (``attention.json``, ``attention.png``). From torch::

    out = cutetma.attention(q, k, v, causal=True)        # q (b, s_q, h, d); k, v (b, s_k, h_kv, d)
    out, lse = cutetma.attention(q, k, v, return_lse=True, load="cp_async")   # or load="tma"
    out, lse = torch.ops.cutetma.attention(q, k, v, causal, softmax_scale, load)  # custom op

The inputs are fp16 or bf16 with d in {64, 128, 256} and h a multiple of h_kv. ``lse`` has
shape (b, h, s_q) in fp32. The backward pass is tutorial 13.

**The computation.** For one head, ``O = softmax(Q K^T * scale) V``, with Q (s_q, d) and K, V
(s_k, d). FlashAttention never forms the (s_q, s_k) score matrix. A CTA works on a tile of 128
query rows and walks over K and V in blocks of block_n keys. For each query row it keeps a
running maximum ``m``, a running sum ``l`` and an unnormalised output ``O``:

    S   = Q_blk K_j^T * scale                   (WGMMA, fp32 accumulators)
    m'  = max(m, rowmax(S));   P = exp(S - m');   c = exp(m - m')
    l   = l * c + rowsum(P)
    O   = O * c + P V_j                         (WGMMA, P from registers)
    ... after the last block: O / l, and the log-sum-exp m + ln(l)

The result is exact, not an approximation: rescaling by ``c`` keeps every partial sum relative
to the current maximum (section 3 measures this). The kernel computes each exp as ``exp2``
with ``scale * log2 e`` folded in. Each thread keeps its share of ``l`` unreduced until the
epilogue, which reduces it.

**A persistent grid** (``AttentionConfig.persistent``, on by default). A tile is a (128-row
query block, head, batch). The grid is min(work items, SM count) CTAs of 384 threads: at most
one per SM, since 384 threads at 168 registers fill the register file. CTA b runs work items
b, b + gridDim, b + 2 gridDim, and so on. It first counts its items (``my_item_count``),
then loops over that count. With ``persistent=False`` (an experimental ablation option,
never the default) the grid has one CTA per item and the count is the constant 1, so the
kernel compiles to straight-line code with no item loop. A work item is (``scheduler``:
``work_items``, ``item_tiles``, ``tile_coords``):

* not causal: one tile. Query blocks are numbered fastest, so the CTAs in flight share one
  head's K and V in L2.
* causal and persistent: query blocks M-1-i and i of one head (M blocks per head), the longer
  first. With s_q = s_k every pair costs the same M + 1 rows of key blocks, so the static
  round robin gives every CTA the same work to within one item. (With M odd, the middle
  block is an item alone.) An earlier version numbered each head's blocks longest first.
  Under a round robin, CTA 0 then got the long blocks of every head it visited: 1.6x the
  mean work at 16k tokens, measured 1.45x slower on the H200.
* causal, one CTA per tile: one tile, each head's longest query blocks launched first, so the
  hardware fills the end with short ones.

The K and V rings run on across tiles. For each tile the producer (``_produce_tile``) loads
K_0 and V_0 into the next free stages, then waits for *Q empty*, then loads Q, then K_j and
V_j for the other key blocks. A consumer thread arrives on Q empty as soon as its tile's last
S = Q K^T has completed (``_release_q_after``), not at the end of the tile: so the next
tile's Q loads under the current tile's last softmax, its last P V and its epilogue, along
with K_0 and V_0. (Arriving after the epilogue left a TMA load's latency at every tile start;
moving the arrival lifted d = 128 at s <= 1k by 2-3% against cuDNN.)

    warpgroup 0 (producer)   warp 0, per tile: K_0 and V_0, then Q by TMA once Q is empty
                             (Q has its own full/empty pair), then K_j and V_j for every
                             other key block j, each into the next free stage of its own
                             ring; setmaxnreg.dec
    warpgroups 1 and 2       64 query rows each (WGMMA's M is 64), so block_m = 128. Each does
      (consumers)            S = Q_w K_j^T with Q and K from shared memory, the mask only where
                             needed, the online softmax in fp32, then O += P V_j; setmaxnreg.inc

The pieces, mapped (tutorial numbers in parentheses):

* *Q once per tile, by TMA* (02): Q is loaded once per tile on its own (full, empty) mbarrier
  pair and stays in shared memory for all of the tile's key blocks, 128B-swizzled for WGMMA
  (01). A row of d x 2 bytes is wider than the 128-byte swizzle span, so each block of Q, K
  or V is copied as d / 64 boxes (03).
* *K and V in two rings* (05): K and V each have a ring of ``stages`` stages, and each stage
  has its own (full, empty) mbarrier pair (``k_barriers``, ``v_barriers``). The rings have
  the same depth, and the producer fills them in lockstep: K_j, then V_j, each armed by one
  ``expect_tx`` of its own bytes. The 8 consumer warps free K_j's stage as soon as
  S_j = Q K_j^T is computed, and V_j's after P_j V_j. S_j waits only for K_j. At d = 64 and
  d = 128 each ring has 3 stages of 128 keys. At d = 256 a 128-key stage of K and V together
  would take 128 KiB, so the kernel uses FA3's 80-key stages, 2 of them: Q's 64 KiB plus
  2 x (40 + 40) KiB.
* *P stays in registers*: for 16-bit types, the WGMMA accumulator layout of S matches, element
  by element, the A-operand register layout of P V. So converting S gives the A fragment of
  P V directly, and no data moves between threads (the kernel's docstring shows why).
* *The mask runs only where it is needed*: causal masks are bottom-right aligned, as in
  FlashAttention: query i sees key j iff j <= i + s_k - s_q. Key blocks beyond the diagonal
  of the block's last row are never loaded, because the number of key blocks to load is
  computed first. The per-element mask runs only on a block that crosses s_k (the tail) or
  the diagonal of the warpgroup's first row; every other block skips it. Section 4 replays
  this bookkeeping in numpy.
* *GQA / MQA without copies*: K and V are viewed as (s_k, d, (group, h_kv), b) with stride 0
  over the group, so query head hq's tile reads key/value head hq // group. Each CTA still
  loads its K/V blocks itself; CTAs that share a head only share them through L2.
* *setmaxnreg* (07): ``REGISTERS`` gives the budgets. The cp.async producer keeps 40
  registers and each consumer gets 232: 128 x (40 + 2 x 232) = 64,512, which is exactly what
  the launch gave the CTA (168 per thread for 384 threads), not the SM's 65,536. The TMA
  producer, whose one thread only issues copies, keeps 24 and gives each consumer 240 (FA3's
  split). ``setmaxnreg.inc``
  waits until registers are free, so a budget over the launch's allocation never gets them:
  48 / 232 for the cp.async producer hung the kernel on the H200, and the test now checks the
  launch's figure. With three consumer warpgroups (``block_m=192``) every consumer gets 160
  and either producer 32.
* *The epilogue*: O / l is converted to fp16/bf16 and stored from registers, 16 bytes at a
  time. A thread holds columns 2t and 2t + 1 of each group of 8; the four threads of a row
  swap those 4-byte pairs in two butterfly shuffle steps (a 4 x 4 transpose inside each 32
  columns) so that each ends with 8 contiguous columns. That is d / 8 stores per thread
  instead of d / 2, each filling whole 32-byte sectors. The LSE is written by one thread per
  row. There is no TMA store: FA3 stages O in shared memory and stores it by TMA (04), and
  here shared memory is full with 3 K/V stages at d = 128.

**The consumers' schedule** (``AttentionConfig.schedule``) makes FA3's two overlaps optional.
Each schedule adds one step to the one before it, so the three form an ablation ladder:

    serial    [S_j = Q K_j^T] wait | release K_j | mask, softmax_j, O *= c_j |
              [O += P_j V_j] wait | release V_j
    overlap   [S_j = Q K_j^T]  O *= c_{j-1}  [O += P_{j-1} V_{j-1}] | wait for S_j |
              release K_j | mask, softmax_j while P V runs | wait for P V | release V_{j-1} |
              P_j to fp16 (where the wait for P V really sits: below)
    pingpong  overlap, plus the two warpgroups take turns issuing each iteration's pair of
              GEMMs (named barriers ``AttentionBarrier.TURN + w``, ids 1 and 2): one's
              softmax runs under the other's GEMMs

"overlap" is FA3's intra-warpgroup overlap. Three things move compared with "serial":

* The loop is peeled. S_0 is issued alone, and the last P V comes after the loop, which is
  why the PTX holds twice the WGMMAs.
* O's rescale waits. softmax_{j-1} computes c_{j-1} while P_{j-2} V_{j-2} is still
  accumulating into O, so O is multiplied by c_{j-1} at the next step, just before
  O += P_{j-1} V_{j-1} is issued.
* An iteration holds two stages, one in each ring: K_j's stage of the K ring for S_j, and
  V_{j-1}'s stage of the V ring, which the running P V reads. K_j's stage is freed as soon
  as S_j is in, before the softmax, so the producer can keep loading ahead.

"pingpong" is FA3's inter-warpgroup schedule; "serial" stays as an experimental ablation
option, never a default. The default for each (d, causal) is ``BEST_SCHEDULE``, chosen from
measured ablations (``docs/design.md``; the runs are in ``docs/perf-log.md``). The first, for
the build of 2026-11-30 (TMA, persistent, the 16-byte-store epilogue; the geometric mean over
the six sequence lengths, relative to serial), still chose per dtype at d = 64:

    d    mask         dtype   overlap  pingpong  default then
    64   non-causal   fp16     1.05      1.04    overlap
    64   non-causal   bf16     0.93      0.93    serial
    64   causal       fp16     1.01      1.02    pingpong
    64   causal       bf16     0.87      0.92    serial
    128  non-causal   both     1.12      1.09-1.12  overlap
    128  causal       both     1.07-1.08 1.08    overlap
    256  non-causal   both     0.95-0.97 0.95-0.98  serial
    256  causal       both     0.97-1.00 0.97-0.99  serial

Then the consumer itself changed (2026-12-01: each build timed against cuDNN in the same
cells, one device call per ladder), and the ranking with it, until fp16 and bf16 chose
alike:

* The softmax's row max and row sum became balanced trees (``pairwise``): the same 31
  instructions per row, 5 deep instead of a 32-long chain (ptxas does not reassociate
  them). d = 128 gained about 1%. But serial, bf16's d = 64 choice, lost 12% in all six
  cells, while overlap gained: d = 64 now runs overlap causal and pingpong non-causal (ahead
  of overlap in 11 of 12 cells over two passes), in both dtypes.
* P is converted at the top of the next iteration, just before S_j overwrites S_{j-1}.
  Left to itself the compiler did that for bf16 only, so fp16 and bf16 ran differently
  shaped loops from one source; now their PTX differs only in ``selp`` types.
* The TMA producer keeps 24 registers and each consumer gets 240 (FA3's split; the
  producer's one thread only issues copies). That made d = 256 with FA3's 80-key stages and
  overlap compile without spills, and it beat 64-key serial in all six non-causal cells
  (0.86-0.97x of cuDNN against 0.81-0.95x): d = 256 non-causal now runs that, causal stays
  64-key serial (until the wait for P V moved, below).
* FA3's 176-key stages at d = 128 compile too now, and lose (0.80-0.92x of cuDNN).
* "While P V runs" had never happened. ptxas (CUDA 13.0) moved the WGMMA wait
  to the top of its basic block: the wait for P V, written after the softmax as FA3 writes
  it, landed right after the mask's branch, before the softmax. Only the SASS shows it (``nvdisasm`` on
  ptxas's cubin; ``build.sass``): no MUFU.EX2 lay between the wait for S and the wait for
  P V at any head dim, and at d = 256 ptxas also computed every exp2 twice. An empty-asm
  register fence (CUTLASS's ``warpgroup_fence_operand``) changes nothing, since ptxas sees
  no instruction. What works is a wait ptxas cannot hoist: at the top of the next
  iteration, behind the loop's back edge (``pv_wait="late"``). It pays at d = 256: 0.93 ->
  1.02x of cuDNN non-causal, and causal moves to 80-key overlap at 1.08x (from 64-key serial
  at 1.01x). At d = 64 and 128, with two warpgroups taking turns on the tensor cores, it
  loses 2-5%, so they keep the hoisted wait (``pv_wait="early"``, the same PTX as before).
  ``tests/test_attention_ptx.py`` reads the SASS of every default to keep it that way.
* The same doubling came back at d = 64 with three consumer warpgroups (160 registers
  each): with the early wait ptxas wrote 122 MUFU.EX2 a block for 64 scores. With the late
  wait, one per score, FlashAttention-4's 192 x 128 tile beats 128 rows by 3-27%
  non-causal (s = 512-8k, bf16) and causal from 8k keys; it is the default there
  (``WIDE_ROWS``: pingpong, late wait).

* d = 128 gains the most from overlap. Causal pingpong is level with it (ahead at short s,
  behind at 16k), so the default stays overlap.
* Pingpong's turn runs on from one tile to the next. It used to be handed over at the next
  tile's start, which left the tensor cores idle for an epilogue per tile; fixing that moved
  pingpong up by about 1% (it had been 5% behind overlap at d = 128).
* The persistent grid beats one CTA per tile by a median 1.13x over all 72 cells (fp16 and
  bf16, the default schedule in both; attention.json). It matters most for causal d = 128:
  at 8k, fp16, one CTA per tile reaches 436 TFLOP/s against the persistent 603. It is not
  faster everywhere: one CTA per tile wins 4 of the 72 cells, fp16 at s >= 8k (d = 64, and
  d = 256 causal at 16k), by up to 2%.

The ranking follows ptxas's register allocation as much as the schedule. An earlier build of
the same persistent kernel walked its items with a strided loop,
``cutlass.range(blockIdx, items, gridDim)``. For bf16 at d = 128 ptxas then serialized the
WGMMAs (warning C7512, "wgmma.mma_async instructions are serialized due to insufficient
register resources"), and that kernel ran at 0.67x of its own fp16 speed. The PTX of the two
dtypes differed only in conversion types. With that loop, overlap also measured the same as
serial at fp16 d = 128 non-causal, in two runs; with the count-based loop it is 1.12x.
The count-based loop removed the warning, and ``tests/test_attention_ptx.py`` now runs ptxas
on every default configuration to catch C7512 and spills. Single cells are noisy: the same
kernel timed twice differs by up to 9% (the last line of section 6).

**What FA3 has that this kernel does not:**

* a dynamic tile scheduler: FA3's persistent CTAs can take their next tile from an atomic
  counter, while this kernel's round robin is static, fixed at launch;
* a TMA-store epilogue (this one stores 16 bytes per thread from registers, above);
* cluster multicast of K/V: FA3 pairs CTAs of neighbouring query blocks in a cluster and
  multicasts each K/V block to both (06). A version of it here (each CTA loading half of
  every K and V box and multicasting it) was correct on the H200 but 2-5% slower than one
  CTA: ncu showed the L2 traffic it saves was not what limited this kernel. FA3's L2
  eviction hints on the loads measured slower too; both were removed (``docs/perf-log.md``);
* FP8;
* paged and variable-length KV;
* the backward pass.

**The cp.async counterpart.** ``load="cp_async"`` swaps only the producer. All 128 threads of
warpgroup 0 copy Q, K_j and V_j with 16-byte ``cp.async`` into the same swizzled stages, in
the same order. They arrive on the same *full* barriers (Q's, and each stage's in the K and V
rings) with ``cp.async.mbarrier.arrive.noinc`` when their copies land, so a barrier counts
128 arrivals instead of 1 plus tx bytes. The consumers are the same code, plus a
``fence.proxy.async``: cp.async writes through the generic proxy, while WGMMA reads through
the async one. TMA zero-fills key rows past s_k. The cp.async producer writes zeros into V's
rows there, and K's rows there are masked to -inf anyway.

Measured on the H200 (NVIDIA H200, torch 2.11.0+cu130, nvidia-cutlass-dsl 4.8.1, 2026-12-04,
``python benchmarks/attention.py``; the GPU tests of that build passed then; cuDNN, FA4, tma
and cp_async are the medians of a single pass and two alternating rounds; the ablation
columns are single passes, each beside the default's). Section 6 of this script prints this
from the JSON.

    == 6. Measured on the H200 (benchmarks/results/attention.json, 2026-12-04)
    TFLOP/s (FLOPs 4 b h s^2 d, halved when causal; 16k tokens per batch, h = 2048 / d;
     cudnn, fa4, tma, cp_async: medians of a single pass and rounds alternating them)
    dtype      d      s  mask        cudnn    fa2    fa4    tma  cp_async  tma/cudnn
    float16   64  16384  non-causal    446    300    525    476       474       1.07
    float16  128    512  non-causal    508    299    438    508       466       1.00
    float16  128   8192  non-causal    607    333    675    627       554       1.03
    float16  128   8192  causal        557    293    660    567       511       1.02
    float16  256  16384  causal        572    274    757    627       576       1.10
    bfloat16 128  16384  causal        593    306    690    604       540       1.02
    over all 72 cells: tma/cudnn geomean 1.030 (0.929 to 1.176)
    geomean by s: 512 0.97, 1024 1.01, 2048 1.05, 4096 1.04, 8192 1.05, 16384 1.06
    d = 128, s >= 2k: 1.004 to 1.093, at or above cuDNN in 16 of 16 cells
    peak: 716 TFLOP/s (bfloat16, d = 256, non-causal, s = 16384)
    FlashAttention-4 (its SM90 forward, in the same rounds): tma/fa4 geomean 0.988 (lowest 0.829)
    TMA vs cp.async: TMA faster in 72 of 72 cells, median 1.114x
    ablation, fp16 TMA: serial / overlap / pingpong, persistent (default *) | one CTA per tile
      d= 64 s= 8192 non-causal  424  /  526  /  486* |  479
      d= 64 s= 8192 causal      437  /  461  /  439* |  474
      d=128 s= 8192 non-causal  539  /  663* /  630  |  612
      d=128 s= 8192 causal      512  /  618* /  600  |  565
      d=256 s= 8192 non-causal  598  /  696* /  661  |  691
      d=256 s=16384 causal      604  /  713* /  642  |  677
    the default over serial / overlap / pingpong, median over fp16 cells: 1.102 / 0.991 / 0.997
    the persistent grid over one CTA per tile, median over 36 fp16 cells: 1.103x (slower in 6)
    d = 64: the default block over the benchmark's alternative (ALT_BLOCKS), fp16: 0.99x to 1.55x
    d = 256: the default block over the benchmark's alternative (ALT_BLOCKS), fp16: 0.96x to 1.17x
    the tma column re-times the default kernel: 0.880x to 1.079x its ablation timing (median 0.993)

Over the 72 cells the TMA kernel reaches a geomean 1.030 of cuDNN and 0.988 of
FlashAttention-4's SM90 forward, timed in the same rounds (the grid before FA4 joined the
rounds measured 1.038 of cuDNN: the card runs every kernel slower beside FA4's, ours a
little more; ``docs/perf-log.md``). By sequence length it is 0.97 (512) to 1.06 (16k) of
cuDNN. At d = 128 and s >= 2k it runs at 1.004-1.093 of cuDNN, at or above it in all 16
cells. Against FA4 it leads at short lengths (1.17-1.36x at s = 512) and trails on long
causal walks (0.83-0.89x at s >= 8k), where FA4 runs fewer instructions per key block.
At d = 64 the exp2s keep the MUFU pipe as busy as the GEMMs keep the tensor pipe, and the
third consumer warpgroup is what hides one behind the other: the default tile there is
FlashAttention-4's 192 x 128 (``WIDE_ROWS``; causal from 8k keys). It only pays with P V's
wait late: at 160 registers a consumer, the early wait made ptxas compute every exp2 twice
(122 MUFU.EX2 a block for 64 scores), which is why this tile once measured slower than 128
rows. The ablation's single passes disagree with the alternating rounds on pingpong against
overlap at 192 rows (here overlap led at 8k; in rounds pingpong led by 2-4%,
``docs/perf-log.md``): on this power-capped card single passes drift 5-10%.

What closed most of the gap at short sequences was the epilogue. Nsight Compute's source
counters (d = 128, s = 512) put a quarter of the consumers' stall
samples in the old epilogue, which wrote O with d / 2 four-byte stores per thread: the stores
queued in the LSU, and the next tile's first instruction waited for them to read their
registers. Now the four threads of a row swap their pairs with two butterfly shuffle steps
(a 4 x 4 transpose inside each 32 columns), and each thread writes 8 contiguous columns with
one 16-byte store. The epilogue's samples fell from 3,726 to 1,443, and the kernel's time at
s = 512 from 155.6 to 134.7 us against cuDNN's 131.7 (``docs/perf-log.md``): the
tensor pipe is busy 61% of the time against cuDNN's 62% (it was 52%).

The ALT_BLOCKS line above measures the default tile against another: at d = 64
non-causal 192 rows against 128, causal the 96-key 192-row tile of FlashAttention-3.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np

from cutetma import swizzle as hw
from cutetma.kernels.build import gpu_unavailable
from cutetma.kernels.smem import smem_capacity

REGISTERS_PER_SM = 64 * 1024
RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "attention.json"
# (dtype, d, s, causal) cells of attention.json quoted in section 6 and the docstring
CELLS = [("float16", 64, 16384, False), ("float16", 128, 512, False),
         ("float16", 128, 8192, False), ("float16", 128, 8192, True),
         ("float16", 256, 16384, True), ("bfloat16", 128, 16384, True)]
ABLATION_CELLS = [(64, 8192, False), (64, 8192, True), (128, 8192, False), (128, 8192, True),
                  (256, 8192, False), (256, 16384, True)]


def heading(title: str) -> None:
    print(f"\n== {title}")


def shared_memory_plan() -> dict:
    """Bytes of each head dim's configuration (fp16), from ``AttentionConfig``'s defaults."""
    from cutetma.kernels.attention import AttentionConfig

    heading("1. Shared memory: Q once per tile, then a K ring and a V ring of equal depth (fp16)")
    w = 2
    smem = smem_capacity()  # the most shared memory one CTA may have on sm_90, from the DSL
    plans = {}
    print(f"{'d':>4} {'block_n':>7} {'Q (B)':>7} {'K+V stage (B)':>14} {'stages':>6} "
          f"{'in all (B)':>10} {'of 227 KiB':>10}")
    for d in (64, 128, 256):
        cfg = AttentionConfig(head_dim=d, causal=True)  # non-causal d = 64: two Q buffers
        q = cfg.block_m * d * w
        kv = 2 * cfg.block_n * d * w  # one K stage plus one V stage (two rings, two expect_tx)
        total = q + cfg.stages * kv
        plans[d] = {"q": q, "kv": kv, "stages": cfg.stages, "total": total,
                    "block_n": cfg.block_n}
        print(f"{d:>4} {cfg.block_n:>7} {q:>7} {kv:>14} {cfg.stages:>6} {total:>10} "
              f"{100 * total / smem:>9.0f}%")
    print("'K+V stage' is one stage of the K ring plus one of the V ring: each ring has "
          "'stages' of them, each stage its own (full, empty) mbarrier pair")
    wide = 2 * 128 * 256 * w
    two_q = AttentionConfig(head_dim=64)
    print(f"d = 64 non-causal keeps {two_q.q_stages} Q buffers (Q_STAGES: the producer loads "
          f"the next tile's Q during this one; measured 2.4% faster there): "
          f"{two_q.q_stages * two_q.block_m * 64 * w} B of Q, still {two_q.stages} K/V stages")
    print(f"d = 256 with 128-key stages: K + V of one key block is {wide} B, Q + 2 of them "
          f"{128 * 256 * w + 2 * wide} B > {smem}: hence {plans[256]['block_n']}-key "
          "stages")
    group = hw.group_size(w, "128B")
    print(f"a row of d = 128 is {128 * w} B, wider than the 128-B swizzle span: each tile is "
          f"copied as {128 // group} boxes of {group} columns (tutorial 03)")
    return plans


def register_budget() -> None:
    from cutetma.kernels.attention import REGISTERS, WARPGROUP

    heading("2. setmaxnreg: the producer gives registers back, the consumers take them")
    for (load, consumers), (producer, consumer) in REGISTERS.items():
        used = WARPGROUP * (producer + consumers * consumer)
        assert used <= REGISTERS_PER_SM, (load, consumers)  # else setmaxnreg.inc would hang
        print(f"load={load:<8}, {consumers} consumer warpgroups: producer {producer}, "
              f"consumers {consumer} each: 128 x ({producer} + {consumers} x {consumer}) = "
              f"{used} of {REGISTERS_PER_SM}")
    print("per consumer thread at d = 128: S 64 x 128 fp32 over 128 threads = 64 registers, "
          "O 64 x 128 fp32 = 64 more (d = 256: S 32, O 128)")


def online_softmax_check(lq: int = 128, lk: int = 1024, d: int = 64, bc: int = 128) -> float:
    """FlashAttention's block-by-block softmax against the full softmax, in float64."""
    heading(f"3. Online softmax, block by block (CPU, numpy): Lq={lq}, Lk={lk}, d={d}, "
            f"Bc={bc}")
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((n, d)) for n in (lq, lk, lk))
    scale = 1.0 / np.sqrt(d)

    scores = q @ k.T * scale
    p = np.exp(scores - scores.max(axis=1, keepdims=True))
    full = (p / p.sum(axis=1, keepdims=True)) @ v

    m = np.full((lq, 1), -np.inf)
    l_sum = np.zeros((lq, 1))
    o = np.zeros((lq, d))
    for j in range(0, lk, bc):
        s = q @ k[j:j + bc].T * scale
        m_new = np.maximum(m, s.max(axis=1, keepdims=True))
        p_blk = np.exp(s - m_new)
        correction = np.exp(m - m_new)
        l_sum = l_sum * correction + p_blk.sum(axis=1, keepdims=True)
        o = o * correction + p_blk @ v[j:j + bc]
        m = m_new
    online = o / l_sum
    err = float(np.abs(online - full).max())
    print(f"{lk // bc} K/V blocks, never more than {lq} x {bc} scores at once "
          f"(the full matrix is {lq} x {lk})")
    print(f"max |online - full| = {err:.2e}")
    return err


def key_blocks(m_block: int, s_q: int, s_k: int, bm: int, bn: int, causal: bool) -> int:
    """The kernel's ``scheduler.key_blocks``: every key block, or (causal) up to the diagonal of the
    query block's last row."""
    n = -(-s_k // bn)
    if causal:
        last_key = (m_block + 1) * bm - 1 + s_k - s_q
        n = min(n, -(-max(last_key + 1, 0) // bn))
    return n


def needs_mask(j: int, first_row: int, s_q: int, s_k: int, bn: int, causal: bool) -> bool:
    """The kernel's ``masking.apply_mask`` test, per warpgroup: block j crosses s_k, or (causal) its last
    key lies past the diagonal of the warpgroup's first row."""
    needs = (j + 1) * bn > s_k
    if causal:
        needs = needs or (j + 1) * bn - 1 > first_row + s_k - s_q
    return needs


def kernel_order_check(s_q: int = 700, s_k: int = 1000, d: int = 64) -> float:
    """The kernel's bookkeeping in numpy: causal (bottom-right), the key-block count, the mask
    only where needed, and the "overlap" order (O += P_{j-1} V_{j-1} issued with S_j, O's
    rescale by c_{j-1} deferred to just before it), against the full causal softmax."""
    from cutetma.kernels.attention import AttentionConfig

    cfg = AttentionConfig(head_dim=d, causal=True)
    bm, bn = cfg.block_m, cfg.block_n
    heading(f"4. The kernel's order in numpy: causal, s_q={s_q}, s_k={s_k}, d={d}, "
            f"block_m={bm}, block_n={bn} (schedule 'overlap')")
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((n, d)) for n in (s_q, s_k, s_k))
    scale = 1.0 / np.sqrt(d)
    n_q, n_k = -(-s_q // bm), -(-s_k // bn)
    # TMA zero-fills rows past the tensor's end: pad, as the boxes do
    qp = np.zeros((n_q * bm, d))
    qp[:s_q] = q
    kp, vp = np.zeros((n_k * bn, d)), np.zeros((n_k * bn, d))
    kp[:s_k], vp[:s_k] = k, v

    out = np.zeros((n_q * bm, d))
    counts, masked, wg_blocks = [], 0, 0
    for m_block in range(n_q):
        n = key_blocks(m_block, s_q, s_k, bm, bn, causal=True)
        counts.append(n)
        for wg in range(2):  # the two consumer warpgroups, 64 rows each
            r0 = m_block * bm + wg * 64
            rows = np.arange(r0, r0 + 64)[:, None]
            m = np.full((64, 1), -np.inf)
            l_sum = np.zeros((64, 1))
            o = np.zeros((64, d))
            p_prev = c_prev = None
            for j in range(n):
                s = qp[r0:r0 + 64] @ kp[j * bn:(j + 1) * bn].T * scale  # S_j issued ...
                if j > 0:  # ... with O += P_{j-1} V_{j-1}, after O's deferred rescale
                    o = o * c_prev + p_prev @ vp[(j - 1) * bn:j * bn]
                wg_blocks += 1
                if needs_mask(j, r0, s_q, s_k, bn, causal=True):
                    masked += 1
                    cols = np.arange(j * bn, (j + 1) * bn)[None, :]
                    s = np.where((cols >= s_k) | (cols > rows + s_k - s_q), -np.inf, s)
                m_new = np.maximum(m, s.max(axis=1, keepdims=True))
                safe = np.where(m_new == -np.inf, 0.0, m_new)  # a fully masked row: no NaN
                c_prev = np.exp(m - safe)
                p_prev = np.exp(s - safe)
                l_sum = l_sum * c_prev + p_prev.sum(axis=1, keepdims=True)
                m = m_new
            if n:
                o = o * c_prev + p_prev @ vp[(n - 1) * bn:n * bn]  # the last P V, after the loop
            out[r0:r0 + 64] = np.divide(o, l_sum, out=np.zeros_like(o), where=l_sum > 0)

    scores = q @ k.T * scale
    i, jj = np.arange(s_q)[:, None], np.arange(s_k)[None, :]
    scores = np.where(jj > i + s_k - s_q, -np.inf, scores)
    p = np.exp(scores - scores.max(axis=1, keepdims=True))
    full = (p / p.sum(axis=1, keepdims=True)) @ v
    err = float(np.abs(out[:s_q] - full).max())
    print(f"query i sees keys j <= i + {s_k - s_q} (bottom-right); key blocks per query block: "
          f"{counts} of {n_k}")
    print(f"{sum(counts)} of {n_q * n_k} (query block, key block) pairs are loaded; the others "
          f"lie past the diagonal")
    print(f"the per-element mask runs in {masked} of {wg_blocks} warpgroup-blocks (the tail "
          f"block and the diagonal), the others skip it")
    print(f"max |kernel order - full causal softmax| = {err:.2e}")
    return err


def count(pattern: str, ptx: str) -> int:
    return len(re.findall(pattern, ptx))


def compiled_kernel() -> dict:
    """The kernel compiled for sm_90a (no GPU): the three schedules, the two producers."""
    from cutetma.kernels import build
    from cutetma.kernels.attention import WARPGROUP, AttentionConfig

    heading("5. The kernel compiled for sm_90a, d = 128 non-causal (static counts in the PTX)")
    ptx = {s: build.compile_attention(AttentionConfig(head_dim=128, schedule=s)).ptx
           for s in ("serial", "overlap", "pingpong")}
    ptx["cp_async"] = build.compile_attention(AttentionConfig(head_dim=128,
                                                                load="cp_async")).ptx
    cfg = AttentionConfig(head_dim=128)
    qk, pv = cfg.head_dim // 16, cfg.block_n // 16
    print(f"one S = Q K^T is {qk} wgmma (k = d / 16), one O += P V {pv} (k = block_n / 16); "
          f"default schedule here: {cfg.schedule}")
    print(f"{'schedule':<9} {'wgmma':>5} {'wait_group 1':>12} {'named bar.sync':>14} "
          f"{'named bar.arrive':>16}")
    wgmma = {}
    for s in ("serial", "overlap", "pingpong"):
        wgmma[s] = count(r"wgmma\.mma_async", ptx[s])
        in_flight = count(r"wgmma\.wait_group\.sync\.aligned\s+1;", ptx[s])
        named_sync = count(r"bar\.sync\s+%r", ptx[s])  # bar.sync 0 is the CTA-wide one
        named_arrive = count(r"bar\.arrive\s+%r", ptx[s])
        print(f"{s:<9} {wgmma[s]:>5} {in_flight:>12} {named_sync:>14} {named_arrive:>16}")
    print(f"serial: {qk} + {pv}; overlap peels the loop (S_0 alone, S_j with P_(j-1) V_(j-1), "
          f"the last P V after it): 2 x ({qk} + {pv})")

    tma_ptx, cpa_ptx = ptx["pingpong"], ptx["cp_async"]
    rows = [
        ("TMA load boxes (Q; K, V at 2 sites)", r"cp\.async\.bulk\.tensor\.\dd\.shared"),
        ("arrive.expect_tx (Q; K, V at 2 sites)", r"mbarrier\.arrive\.expect_tx"),
        ("cp.async.cg (16 B)", r"cp\.async\.cg\.shared\.global"),
        ("cp.async.mbarrier.arrive.noinc", r"cp\.async\.mbarrier\.arrive\.noinc"),
        ("fence.proxy.async (cp.async -> WGMMA)", r"fence\.proxy\.async"),
        ("mbarrier.init (Q pair; K, V rings)", r"mbarrier\.init"),
        ("st.global (O's 16-byte chunks, the LSE)", r"st\.global"),
        ("TMA store", r"cp\.async\.bulk\.tensor\.\dd\.global\.shared"),
        ("multicast", r"multicast::cluster"),
    ]
    print(f"\n{'producer side (pingpong)':<42} {'tma':>5} {'cp_async':>8}")
    found = {}
    for name, pattern in rows:
        found[name] = (count(pattern, tma_ptx), count(pattern, cpa_ptx))
        print(f"{name:<42} {found[name][0]:>5} {found[name][1]:>8}")
    boxes = cfg.head_dim // 64
    print(f"two sites: K_0 and V_0 are loaded before the wait for Q empty, the other blocks "
          f"after Q: {boxes} boxes (d / 64) x (Q + 2 x K + 2 x V) = {boxes * 5} boxes, "
          f"1 + 2 x 2 = 5 expect_tx")
    print(f"mbarrier.init: Q full + Q empty, then {cfg.stages} stages x (full, empty) in the K "
          f"ring and again in the V ring: 2 + 2 x {2 * cfg.stages} = {2 + 4 * cfg.stages}")
    o_regs = 64 * cfg.head_dim // WARPGROUP
    print(f"st.global: a thread holds {o_regs} fp32 values of O (64 x {cfg.head_dim} over 128 "
          f"threads), stored after the quad transpose as {o_regs // 8} 16-byte chunks of 8 "
          f"columns, plus the LSE of its 2 rows (one thread in 4 stores it): {o_regs // 8 + 2}")
    for name, text in (("tma", tma_ptx), ("cp_async", cpa_ptx)):
        regs = re.findall(r"setmaxnreg\.(dec|inc)\.sync\.aligned\.u32\s+(\d+)", text)
        print(f"setmaxnreg ({name}): " + ", ".join(f"{op} {n}" for op, n in regs))
    return {"wgmma": wgmma, "tma_store": found["TMA store"][0],
            "multicast": found["multicast"][0]}


def measured() -> str:
    """What the H200 measured, read from benchmarks/results/attention.json."""
    from cutetma.kernels.attention import AttentionConfig
    from cutetma.kernels.attention.config import dense_tile

    def default_schedule(d, s, causal):  # the schedule of the tile the default runs
        block_m, block_n = dense_tile(d, causal, s)
        return AttentionConfig(head_dim=d, causal=causal, block_m=block_m,
                               block_n=block_n).schedule

    if not RESULTS.exists():
        heading("6. Measured on the H200")
        print(f"skipped: {RESULTS} is not here (run benchmarks/attention.py on an H200)")
        return ""
    data = json.loads(RESULTS.read_text(encoding="utf-8"))
    meta, rows, summary = data["meta"], data["rows"], data["meta"]["summary"]
    heading(f"6. Measured on the H200 (benchmarks/results/attention.json, {meta['date'][:10]})")
    by_cell = {(r["dtype"], r["d"], r["s"], r["causal"]): r for r in rows}
    mask = {False: "non-causal", True: "causal"}
    print("TFLOP/s (FLOPs 4 b h s^2 d, halved when causal; 16k tokens per batch, h = 2048 / d;")
    print(" cudnn, fa4, tma, cp_async: medians of a single pass and rounds alternating them)")
    print(f"{'dtype':<8} {'d':>3} {'s':>6}  {'mask':<10} {'cudnn':>6} {'fa2':>6} {'fa4':>6} "
          f"{'tma':>6} {'cp_async':>9} {'tma/cudnn':>10}")
    for cell in CELLS:
        r = by_cell[cell]
        print(f"{r['dtype']:<8} {r['d']:>3} {r['s']:>6}  {mask[r['causal']]:<10} "
              f"{r['cudnn']:>6.0f} {r['fa2']:>6.0f} {r.get('fa4', float('nan')):>6.0f} "
              f"{r['tma']:>6.0f} {r['cp_async']:>9.0f} {r['tma'] / r['cudnn']:>10.2f}")
    timed = [r for r in rows if r.get("tma") and r.get("cudnn")]
    ratios = [r["tma"] / r["cudnn"] for r in timed]
    geomean = summary["geomean_tma_over_cudnn"]
    print(f"over all {len(ratios)} cells: tma/cudnn geomean {geomean:.3f} "
          f"({min(ratios):.3f} to {max(ratios):.3f})")
    by_s = {s: float(np.exp(np.mean([np.log(r["tma"] / r["cudnn"]) for r in timed
                                     if r["s"] == s])))
            for s in sorted({r["s"] for r in timed})}
    print("geomean by s: " + ", ".join(f"{s} {g:.2f}" for s, g in by_s.items()))
    d128 = [r["tma"] / r["cudnn"] for r in timed if r["d"] == 128 and r["s"] >= 2048]
    print(f"d = 128, s >= 2k: {min(d128):.3f} to {max(d128):.3f}, at or above cuDNN in "
          f"{sum(x >= 1 for x in d128)} of {len(d128)} cells")
    peak = max(timed, key=lambda r: r["tma"])
    print(f"peak: {peak['tma']:.0f} TFLOP/s ({peak['dtype']}, d = {peak['d']}, "
          f"{mask[peak['causal']]}, s = {peak['s']})")
    if "geomean_tma_over_fa4" in summary:
        print(f"FlashAttention-4 (its SM90 forward, in the same rounds): tma/fa4 geomean "
              f"{summary['geomean_tma_over_fa4']:.3f} (lowest {summary['min_tma_over_fa4']:.3f})")
    print(f"TMA vs cp.async: TMA faster in {summary['cells_tma_beats_cp_async']} of "
          f"{summary['cells_timed_both']} cells, median "
          f"{summary['median_tma_over_cp_async']:.3f}x")
    print("ablation, fp16 TMA: serial / overlap / pingpong, persistent (default *) | "
          "one CTA per tile")
    for d, s, causal in ABLATION_CELLS:
        r = by_cell[("float16", d, s, causal)]
        best = default_schedule(d, s, causal)
        cols = [f"{r['tma_' + x]:4.0f}{'*' if x == best else ' '}"
                for x in ("serial", "overlap", "pingpong")]
        print(f"  d={d:>3} s={s:>5} {mask[causal]:<10} " + " / ".join(cols)
              + f" | {r['tma_one_cta_per_tile']:4.0f}")
    print("the default over serial / overlap / pingpong, median over fp16 cells: "
          f"{summary['median_default_over_serial']:.3f} / "
          f"{summary['median_default_over_overlap']:.3f} / "
          f"{summary['median_default_over_pingpong']:.3f}")
    def single(r):  # the default's single-pass timing, beside which the ablations ran
        return r.get("selection", {}).get("tma", r["tma"])

    ablated = [r for r in timed if r.get("tma_one_cta_per_tile")]
    slower = sum(single(r) < r["tma_one_cta_per_tile"] for r in ablated)
    print(f"the persistent grid over one CTA per tile, median over {len(ablated)} fp16 cells: "
          f"{summary['median_default_over_one_cta_per_tile']:.3f}x (slower in {slower})")
    alt = [(r["d"], single(r) / r["tma_alt_blocks"]) for r in rows if r.get("tma_alt_blocks")]
    for d in sorted({d for d, _ in alt}):
        gains = [g for dd, g in alt if dd == d]
        print(f"d = {d}: the default block over the benchmark's alternative (ALT_BLOCKS), fp16: "
              f"{min(gains):.2f}x to {max(gains):.2f}x")
    repeat = sorted(single(r) / r["tma_" + default_schedule(r["d"], r["s"], r["causal"])]
                    for r in rows if r.get("tma_serial"))
    print(f"the tma column re-times the default kernel: {repeat[0]:.3f}x to {repeat[-1]:.3f}x "
          f"its ablation timing (median {float(np.median(repeat)):.3f})")
    return (f"On the H200 the TMA kernel reaches a geomean {geomean:.2f} of cuDNN over "
            f"{len(ratios)} cells and beats its cp.async twin in "
            f"{summary['cells_tma_beats_cp_async']} of {summary['cells_timed_both']}.")


def key_blocks_by_length() -> str:
    """Section 7: the tile ``cutetma.attention`` picks from the keys' length (``dense_tile``),
    with the peer cells the H200 measured at short odd lengths."""
    import math

    from cutetma.kernels.attention.config import ODD_KEY_BLOCK, ODD_KEY_BLOCK_MAX, dense_tile

    heading("7. Tiles by length: a short odd length pays per block, not per key")
    print("A block costs its barriers, its row max / sum reductions and (the last) a mask,")
    print("beyond its GEMMs. Non-causal at d = 64 / 128, a length that whole 128-key blocks")
    print(f"do not cover runs {ODD_KEY_BLOCK[64]}-key blocks when that saves a block of a short")
    print(f"walk (at most {ODD_KEY_BLOCK_MAX[64]} / {ODD_KEY_BLOCK_MAX[128]} blocks at d = 64 / "
          "128); otherwise d = 64 runs three consumer warpgroups (192 query rows):")
    print(f"{'s_k':>6} {'128-key blocks':>15} {'160-key blocks':>15} {'d=64 tile':>10} "
          f"{'d=128 tile':>11}")
    for s in (197, 257, 577, 1000, 1024, 4096):
        tiles = ["x".join(map(str, dense_tile(d, False, s))) for d in (64, 128)]
        print(f"{s:>6} {math.ceil(s / 128):>15} {math.ceil(s / 160):>15} {tiles[0]:>10} "
              f"{tiles[1]:>11}")
    peers = RESULTS.with_name("attention_peers.json")
    if not peers.exists():
        print(f"skipped the H200 figures: {peers.name} is not here")
        return ""
    rows = json.loads(peers.read_text(encoding="utf-8"))["rows"]
    odd = [r for r in rows if r["s"] % 128 and not r["causal"] and r.get("fa4")]
    print("measured (attention_peers.json, bf16, TFLOP/s): ours / FA4 / cuDNN")
    for r in odd:
        print(f"  d = {r['d']:>3} s = {r['s']:>4} b = {r['b']:>2}: {r['tma']:.0f} / "
              f"{r['fa4']:.0f} / {r['cudnn']:.0f}")
    return (f"At short odd lengths the length-aware key block puts it ahead of FA4 in "
            f"{sum(r['tma'] > r['fa4'] for r in odd)} of {len(odd)} cells.")


def main() -> int:
    print("08 - attention: FlashAttention-3's structure from the chapter's pieces")
    reason = gpu_unavailable()
    print(f"This script launches nothing on any machine ({reason or 'a GPU is present'}). "
          "The GPU tests are tests/test_attention_gpu.py, the timings benchmarks/attention.py "
          "(section 6).")
    plans = shared_memory_plan()
    register_budget()
    err = online_softmax_check()
    err_causal = kernel_order_check()
    ptx = compiled_kernel()
    result = measured()
    odd = key_blocks_by_length()
    p = plans[128]
    w = ptx["wgmma"]
    heading("Takeaway:")
    print(f"Takeaway: attention reuses the chapter's pieces. Q comes by one TMA per tile on "
          f"its own full/empty mbarrier pair. K_j and V_j go through two rings of "
          f"{p['stages']} stages each ({p['kv'] // 2} B and one expect_tx per stage of each at "
          f"d = 128), so K_j is freed once S_j is computed. Two consumer warpgroups keep P in "
          f"registers, and FA3's overlaps are schedules ({w['serial']} wgmma serial, "
          f"{w['overlap']} overlapped). A persistent grid of at most one CTA per SM walks the "
          f"work items round robin. O leaves by 16-byte stores from registers after a quad "
          f"transpose ({ptx['tma_store']} TMA stores, {ptx['multicast']} multicasts). The "
          f"online softmax "
          f"is exact up to rounding: {err:.1e} from the full softmax, {err_causal:.1e} in the "
          f"kernel's causal order (float64). {result} {odd}")
    return 0 if max(err, err_causal) < 1e-10 else 1


if __name__ == "__main__":
    sys.exit(main())
