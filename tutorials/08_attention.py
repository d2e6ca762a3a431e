"""08 - Attention from the same pieces: how FlashAttention-3 composes TMA, mbarrier pipelines,
WGMMA and warp specialization. (The kernel, ``cutetma.kernels.attention_sm90``, compiles for
sm_90a but has not been validated on a GPU yet (issue 5). This tutorial explains the design,
checks the online-softmax arithmetic on the CPU and shows the instructions the kernel
compiles to; it launches nothing.)

Run: ``python tutorials/08_attention.py`` (any machine; no GPU kernel is launched).

**The computation.** For one head, ``O = softmax(Q K^T / sqrt(d)) V`` with Q (Lq, d), K and
V (Lk, d). FlashAttention never forms the (Lq, Lk) score matrix: a CTA owns a block of
Br query rows and walks over K and V in blocks of Bc keys, keeping for each query row a
running maximum ``m``, a running sum ``l`` and an unnormalised output ``O``:

    S   = Q_blk K_j^T / sqrt(d)                (WGMMA, fp32 accumulators)
    m'  = max(m, rowmax(S));   P = exp(S - m')
    l   = l * exp(m - m') + rowsum(P)
    O   = O * exp(m - m') + P V_j               (WGMMA, P from registers)
    ... after the last block: O / l, then the epilogue

This is exact, not an approximation: rescaling by ``exp(m - m')`` keeps every partial sum
relative to the current maximum (the check at the end of this script measures it).

**The pieces, mapped.**

* *Q once, by TMA* (tutorial 02): the Q block is loaded once per CTA with its own mbarrier
  and stays in shared memory, 128B-swizzled for WGMMA (01).
* *K and V through the pipeline* (05): a producer warp walks j = 0, 1, 2... and fills a
  ring of stages, each stage one K block or one V block, armed with ``expect_tx`` of its
  bytes; consumers release a stage on its *empty* barrier when their WGMMA has read it.
  K and V have separate rings so S = QK^T can start before V_j has arrived.
* *Multicast* (06): CTAs of a cluster that work on different query blocks of the same head
  read the same K and V blocks; with a cluster of 2 along the query dimension each K/V
  block is read from L2 once and written into both CTAs (FA3 does this for head dim >= 128).
* *Two consumer warpgroups, pingpong*: each owns half of the query rows (WGMMA's M is 64)
  and both read the same K/V stages. Softmax (exp, max, sum on the CUDA cores) is slow next
  to WGMMA, so the two warpgroups take turns through a pair of named barriers: while
  warpgroup 1 runs the softmax of its rows for block j, warpgroup 2 runs its WGMMAs, and
  then they swap, keeping the Tensor Cores busy:

      WG1:  [QK^T j] [softmax j ] [PV j]  [QK^T j+1] [softmax j+1] ...
      WG2:           [QK^T j ]  [softmax j] [PV j]    [QK^T j+1] ...

  Inside one warpgroup FA3 also overlaps the softmax of block j with the QK^T of block j+1.
* *setmaxnreg* (07): the producer warpgroup gives registers back, the consumers, who hold
  S, P and O in registers, take them.
* *The epilogue* (04): O / l is written to shared memory and stored by TMA, with
  ``commit_group`` / ``wait_group.read`` before the buffer is reused.

The cp.async counterpart: the same pipeline with a cp.async producer (as the GEMM's
``load="cp_async"``), the path paged KV caches take when a page is smaller than a K/V
block and cannot be described by one TMA box.

Nothing in this script claims a kernel speed: there is no kernel to time yet.
"""

from __future__ import annotations

import sys

import numpy as np

from cutetma import swizzle as hw
from cutetma.kernels import gpu_unavailable

SMEM_BYTES = 227 * 1024
ISSUE = "issue 5"


def heading(title: str) -> None:
    print(f"\n== {title}")


def shared_memory_plan(d: int = 128, br: int = 128, bc: int = 128, stages: int = 2) -> dict:
    """Bytes of one FA3-like forward configuration (fp16): what a stage would carry."""
    heading(f"1. Shared-memory arithmetic of one planned configuration (fp16, head dim {d})")
    w = 2
    q = br * d * w
    kv = bc * d * w
    total = q + 2 * stages * kv
    group = hw.group_size(w, "128B")
    print(f"Q block  {br} x {d}: {q:>6} B, loaded once (expect_tx {q})")
    print(f"K block  {bc} x {d}: {kv:>6} B per stage (expect_tx {kv}); V block the same")
    print(f"{stages} stages of K and V: {2 * stages * kv} B; with Q: {total} B of "
          f"{SMEM_BYTES} ({100 * total / SMEM_BYTES:.0f}%); O can reuse Q's buffer")
    print(f"rows of {d * w} B are wider than the 128-B swizzle span: each tile is a 3D box of "
          f"{d // group} groups of {group} (tutorial 03)")
    return {"q": q, "kv": kv, "total": total}


def online_softmax_check(lq: int = 128, lk: int = 1024, d: int = 64, bc: int = 128) -> float:
    """FlashAttention's block-by-block softmax against the full softmax, in float64."""
    heading(f"2. Online softmax, block by block (CPU, numpy): Lq={lq}, Lk={lk}, d={d}, "
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


def compiled_kernel() -> None:
    """The kernel as it compiles today: what each role issues (sm_90a PTX, no GPU)."""
    from cutetma import kernels
    from cutetma.kernels.attention_sm90 import AttentionConfig

    for load in ("tma", "cp_async"):
        ptx = kernels.compile_attention(AttentionConfig(head_dim=128, load=load)).ptx
        loads = ptx.count("cp.async.bulk.tensor") if load == "tma" else ptx.count("cp.async.cg")
        print(f"load={load:<8}: {loads} {'TMA' if load == 'tma' else 'cp.async.cg'} copies, "
              f"{ptx.count('wgmma.mma_async.sync')} wgmma (8 for Q K^T, 8 for P V per key "
              f"block), {ptx.count('ex2.approx')} exp2, "
              f"{ptx.count('shfl.sync.bfly')} quad shuffles (row max and sum)")


def main() -> int:
    print("08 - attention (design walkthrough; the kernel is validated with " + ISSUE + ")")
    reason = gpu_unavailable()
    where = reason if reason else "the kernel is not validated on a GPU yet"
    plan = shared_memory_plan()
    err = online_softmax_check()
    heading("3. The kernel, compiled for sm_90a (not yet run on a GPU)")
    compiled_kernel()
    print(f"nothing is launched or timed here ({where}); {ISSUE} validates and times it.")
    heading("Takeaway:")
    print(f"Takeaway: attention reuses every piece of the chapter: Q by one TMA, K/V through "
          f"an mbarrier ring ({plan['kv']} B per stage, {plan['total']} B in all for 2 "
          f"stages at head dim 128), two consumer warpgroups pingponging WGMMA against "
          f"softmax, a TMA-store epilogue. The online softmax that lets it stream K/V is "
          f"exact up to rounding: {err:.1e} from the full softmax here (float64). The kernel "
          f"compiles; its validation and timings come with {ISSUE}.")
    return 0 if err < 1e-10 else 1


if __name__ == "__main__":
    sys.exit(main())
