"""FP8 attention's operand orders: how P (registers) and V (shared memory) meet in O += P V
when both are e4m3.

Two rules of FP8 WGMMA shape the second GEMM. Its B operand must be K-major: for P V the K
dimension is the keys, so V is read as V^T, (d, keys) with keys contiguous, which a
(keys, d) cache row is not; the torch face hands the kernel V^T (``transpose_v``). And its A
operand from registers has another layout than the fp32 accumulator S came out in: for a
32-key chunk, a thread's accumulator holds keys {2c, 2c+1, 2c+8, 2c+9, 2c+16, 2c+17, 2c+24,
2c+25} of its rows (c = lane % 4), while the A fragment wants keys {4c .. 4c+3, 4c+16 ..
4c+19}. Rather than move values between threads, the kernel reads its P values as they lie
and gives them other names: A's key slot 4c + j is the accumulator's key ``KEY_ORDER[4c + j]``
(FlashAttention-3's permutation), and V^T's columns are stored in the same order, so the sum
over keys is unchanged. ``p_from_accumulator`` derives, from the two tiled MMAs' own
partitions, which accumulator value each A value takes (the same list for every thread, checked
for all 128 while tracing); ``transpose_v`` builds V^T with its keys in that order.
"""

from __future__ import annotations

CHUNK = 32  # keys per k-step of an e4m3 WGMMA

# KEY_ORDER[p]: the key (within a 32-key chunk) that A's slot p holds
KEY_ORDER = tuple(2 * (p // 4 % 4) + 8 * (p % 4 // 2) + p % 2 + 16 * (p // 16)
                  for p in range(CHUNK))


def key_of_slot(p: int) -> int:
    """The key (in the whole block) that A's k slot ``p`` holds."""
    return p // CHUNK * CHUNK + KEY_ORDER[p % CHUNK]


def p_from_accumulator(qk_mma, pv_mma, block_m: int, block_n: int, threads: int = 128):
    """For one warpgroup's (block_m, block_n) tile: ``order[i]``, the index of the S
    accumulator value (``qk_mma``'s partition) that value i of the A fragment of ``pv_mma``
    (P from registers) takes, with A's key slots named by ``key_of_slot``. Derived from
    thread 0 and checked against every thread of the warpgroup (a layout where one list does
    not serve all threads raises). Call while tracing."""
    from cutetma import dsl

    cutlass, cute = dsl.cutlass()
    ids = cute.make_identity_tensor((block_m, block_n))

    def coords(tensor):
        return [tuple(int(x) for x in tensor[i]) for i in range(cute.size(tensor))]

    order = None
    for t in range(threads):
        acc = coords(qk_mma.get_slice(t).partition_C(ids))
        a = coords(pv_mma.get_slice(t).partition_A(ids))
        where = {mn: i for i, mn in enumerate(acc)}
        mine = [where.get((m, key_of_slot(k))) for m, k in a]
        if None in mine or sorted(mine) != list(range(len(acc))):
            raise ValueError(f"thread {t}: its A fragment's keys are not its accumulator's")
        if order is None:
            order = mine
        elif mine != order:
            raise ValueError(f"thread {t} needs another order than thread 0")
    return order


def transpose_v(v, block_n: int):
    """V (b, s_k, h_kv, d) as the FP8 kernel reads it: V^T, (b, h_kv, d, s_k padded to whole
    ``block_n`` blocks), keys contiguous, each 32-key chunk's columns in ``KEY_ORDER``, zeros
    past s_k. ``KEY_ORDER`` only swaps two digits of a key's index within its chunk (slot
    16 a + 4 b + 2 c + e holds key 16 a + 8 c + 2 b + e), so the whole reordering is one
    permuted copy: no gather, no host copy, no sync (it runs inside a CUDA graph capture)."""
    import torch

    b, s_k, h_kv, d = v.shape
    padded = -(-s_k // block_n) * block_n
    # one-byte values move as bytes (torch's copy kernels do not all take float8)
    bytes_ = v.element_size() == 1
    src = v.view(torch.uint8) if bytes_ else v
    if padded != s_k:
        src = torch.nn.functional.pad(src, (0, 0, 0, 0, 0, padded - s_k))
    # keys as (chunk, a, c, b, e); slots as (chunk, a, b, c, e)
    keys = src.view(b, padded // CHUNK, 2, 2, 4, 2, h_kv, d)
    out = keys.permute(0, 6, 7, 1, 2, 4, 3, 5).reshape(b, h_kv, d, padded)
    return out.view(v.dtype) if bytes_ else out
