"""Attention forward on Hopper (FlashAttention-3's structure), the load mechanism a parameter.

Modules, as FlashAttention-4's ``flash_attn/cute/`` splits them: ``config``
(``AttentionConfig`` and the tables its defaults come from), ``scheduler`` (the persistent
work walk), ``masking``, ``softmax`` (online softmax and O's rescale), ``epilogue`` (O and
the LSE out), ``kernel`` (``FlashAttentionSm90``: host entry points, the kernel's warp
roles), ``producers`` (TMA and cp.async) and ``consumers`` (the key-block loop), the two
mixins it is made of, and ``combine`` (``SplitCombine``: the paged decode's split_kv merge).

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
               warpgroups (named barriers ``AttentionBarrier.TURN + w``), so one's softmax
               hides the others' GEMMs

``schedule="serial"`` and ``persistent=False`` (one CTA per tile) are experimental ablation
options, kept for tutorial 08's comparisons; never the defaults.

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
item costs the same key blocks (``scheduler.tile_coords``). Register pressure is at the edge:
check ptxas (C7512, spills) after any change to the consumer (tests/test_attention_ptx.py
does). O leaves by 16-byte stores from registers after a quad transpose (``epilogue``).
Not here (FlashAttention-3 has them): K/V multicast across a cluster and L2 eviction hints
(both measured slower on the H200: docs/perf-log.md), a TMA-store epilogue.

Importing this package loads no DSL; ``FlashAttentionSm90`` (``kernel``) does, on first use.
"""

from cutetma.kernels.attention.config import (
    BEST_SCHEDULE,
    BLOCKS,
    PV_WAIT,
    Q_STAGES,
    REGISTERS,
    SCHEDULES,
    WARPGROUP,
    AttentionConfig,
)

__all__ = ["AttentionConfig", "FlashAttentionSm90", "BEST_SCHEDULE", "BLOCKS", "PV_WAIT",
           "Q_STAGES", "REGISTERS", "SCHEDULES", "WARPGROUP"]


def __getattr__(name):
    if name == "FlashAttentionSm90":
        from cutetma.kernels.attention.kernel import FlashAttentionSm90

        return FlashAttentionSm90
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
