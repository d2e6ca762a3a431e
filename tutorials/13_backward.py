"""13 - The attention backward: one stage read two ways, five GEMMs per block, dQ by reduction.

Run: ``python tutorials/13_backward.py``. On any machine it checks the layout trick the
kernel rests on (a K-major stage and its transposed view are the same bytes, and the view is
a legal MN-major WGMMA operand), derives the backward's formulas against torch's autograd,
compiles the kernel for sm_90a to count its GEMMs and reductions in the PTX, and prints what
the GPU run measured. On a Hopper GPU it also runs ``cutetma.attention_backward`` against the
fp32 reference. From torch::

    out = cutetma.attention(q, k, v, causal=True)      # inputs with requires_grad: autograd
    out.backward(dout)
    # or: dq, dk, dv = cutetma.attention_backward(dout, q, k, v, out, lse, causal=True)

**What is computed.** With P = softmax(Q K^T scale) saved as its log-sum-exp L (the
forward's LSE), a key block j recomputes P_ij = exp(S_ij scale - L_i) and then
dV_j = sum_i P_ij^T dO_i, dP_ij = dO_i V_j^T, dS_ij = P_ij (dP_ij - D_i) with
D_i = rowsum(dO_i * O_i), dK_j = scale sum_i dS_ij^T Q_i, dQ_i = scale sum_j dS_ij K_j.
So a CTA that holds K_j and V_j walks every query block i that sees them (FlashAttention-2's
order): dK_j and dV_j stay in registers, dQ_i is added into an fp32 buffer from every key
block.

**One stage, two readings.** dK_j = dS^T Q needs Q as the B operand with d (its N) as the
contiguous mode, while S = Q K^T needs Q with d as K: TMA lands Q once, K-major, and the
kernel reads it a second time through ``composition(stage, (cols, rows) ordered (1, 0))``,
the transposed view. WGMMA accepts that as an MN-major operand because each 8-row x
128-byte swizzle atom of the stage is exactly an MN-major atom of the view (section 1
checks both facts with CuTe's algebra). The same holds for dO (dV = P^T dO) and K (dQ =
dS K). 16-bit operands only: WGMMA reads 8-bit ones K-major, so FP8 attention must
transpose V in shared memory instead (tutorial 12).

**Transposed GEMMs.** S and dP are computed as S^T = K Q^T (keys on WGMMA's M, 64 per
consumer warpgroup): then P^T and dS^T sit in registers exactly as the A fragment of the
next GEMMs wants them (the forward's P V argument), so dV += P^T dO and dK += dS^T Q need
no data movement. dQ = dS K needs all 128 keys of dS: each warpgroup writes its half to
shared memory, a named barrier, and each computes half of dQ's columns.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import cutetma  # noqa: F401  (sets sm_90a before anything imports the DSL)
from cutetma import layouts
from cutetma.kernels.build import gpu_unavailable

ROOT = Path(__file__).resolve().parents[1]


def heading(text: str) -> None:
    print(f"\n== {text}")


def transposed_views() -> bool:
    heading("1. A K-major stage read transposed: the same bytes, MN-major atoms (CuTe algebra)")
    ok = True
    for name, rows, cols in (("Q / dO stage (64 queries x d 128)", 64, 128),
                             ("K stage (128 keys x d 128)", 128, 128)):
        view = layouts.transposed_view(rows, cols, 2, "128B")
        print(f"{name}:\n  stage  {view.stage.text}\n  view   {view.view.text}\n"
              f"  same bytes at (c, r) as at (r, c): {view.same_bytes}; every 64 x 8 block an "
              f"MN-major atom: {view.atoms_are_mn_major}")
        ok &= view.same_bytes and view.atoms_are_mn_major
    return ok


def formulas() -> float:
    heading("2. The backward's formulas against torch's autograd (float64, CPU)")
    import torch

    g = torch.Generator().manual_seed(0)
    s_q, s_k, d = 5, 7, 4
    q, k, v, dout = (torch.randn(n, d, generator=g, dtype=torch.float64)
                     for n in (s_q, s_k, s_k, s_q))
    scale = d ** -0.5
    leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
    out = torch.softmax(leaves[0] @ leaves[1].t() * scale, -1) @ leaves[2]
    out.backward(dout)
    lse = torch.logsumexp(q @ k.t() * scale, -1)
    p = torch.exp(q @ k.t() * scale - lse[:, None])  # recomputed from the LSE
    o = p @ v
    dv = p.t() @ dout
    ds = p * (dout @ v.t() - (dout * o).sum(-1, keepdim=True))
    dq, dk = scale * ds @ k, scale * ds.t() @ q
    worst = max((a - b.grad).abs().max().item() for a, b in zip((dq, dk, dv), leaves,
                                                                 strict=True))
    print(f"dq, dk, dv from P = exp(S scale - LSE), D = rowsum(dO * O): max |difference| to "
          f"autograd {worst:.2g}")
    return worst


def compiled() -> dict:
    heading("3. The kernel for sm_90a: five GEMMs per query block and warpgroup (PTX)")
    from cutetma.kernels import build
    from cutetma.kernels.attention.config import BackwardConfig

    found = {}
    for load in ("tma", "cp_async"):
        cfg = BackwardConfig(head_dim=128, load=load)
        ptx = build.compile_attention_backward(cfg).ptx
        shapes = re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m64n\d+k16)", ptx)
        counts = {s: shapes.count(s) for s in sorted(set(shapes))}
        reductions = len(re.findall(r"cp\.reduce\.async\.bulk\.tensor\.2d", ptx))
        stmatrix = len(re.findall(r"stmatrix\.sync\.aligned\.m8n8\.x4\.trans", ptx))
        found[load] = (counts, reductions)
        print(f"{load:8s}: {counts} (S^T, dP^T: 8 steps of m64n64 each; dV, dK: 4 of "
              f"m64n128; dQ: 8 of m64n64); dS out by {stmatrix} transposed stmatrix, dQ by "
              f"{reductions} TMA reduction (a warpgroup's half, staged in fragment order); "
              f"shared memory {cfg.smem_bytes() // 1024} KiB")
    return found


def measured() -> str:
    heading("4. Measured (benchmarks/results/attention_bwd.json)")
    path = ROOT / "benchmarks" / "results" / "attention_bwd.json"
    if not path.exists():
        print("not measured yet: run benchmarks/attention.py --backward on a Hopper GPU")
        return ""
    doc = json.loads(path.read_text())
    card = doc["meta"].get("device", "a Hopper GPU").removeprefix("NVIDIA ")
    print(f"on the {card}, FA4 and cuDNN in the same run:")
    for r in doc["rows"]:
        cells = "  ".join(f"{key} {r[key]:.0f}" for key in ("tma", "cp_async", "fa4", "cudnn")
                          if r.get(key))
        print(f"d={r['d']} s={r['s']}{' causal' if r['causal'] else ''}: {cells} TFLOP/s")
    fa4 = doc["meta"].get("summary", {}).get("geomean_tma_over_fa4")
    return f"On the {card} it ran {fa4:.2f}x FlashAttention-4's backward (geomean)." if fa4 else ""


def on_gpu() -> str:
    heading("5. On this GPU: cutetma.attention_backward against the fp32 reference")
    reason = gpu_unavailable()
    if reason:
        print(f"skipped: {reason}")
        return ""
    import torch

    from cutetma.reference import attention_grads_ref

    q, k, v, dout = (torch.randn(2, 1000, 8, 128, device="cuda", dtype=torch.bfloat16)
                     for _ in range(4))
    out, lse = cutetma.attention(q, k, v, causal=True, return_lse=True)
    grads = cutetma.attention_backward(dout, q, k, v, out, lse, causal=True)
    ref = attention_grads_ref(dout, q, k, v, causal=True)
    errors = [(a.float() - b).abs().max().item() / b.abs().max().item()
              for a, b in zip(grads, ref, strict=True)]
    print("max relative error dq / dk / dv: " + " / ".join(f"{e:.2g}" for e in errors))
    return f"Here its gradients were within {max(errors):.1%} of the fp32 reference."


def main() -> int:
    print("13 - The attention backward: one stage read two ways, five GEMMs per block")
    views = transposed_views()
    worst = formulas()
    found = compiled()
    result = measured()
    here = on_gpu()
    heading("Takeaway:")
    print(f"Takeaway: TMA lands Q, dO and K once, K-major, and the backward reads each a "
          f"second time transposed in place (the same bytes, MN-major atoms: {views}), so "
          f"five GEMMs per block need no copies; P is recomputed from the forward's LSE and "
          f"dS needs only D = rowsum(dO * O) (the formulas match autograd to {worst:.0e}). "
          f"{result} {here}".rstrip())
    tma_counts = found["tma"][0]
    return 0 if views and worst < 1e-12 and tma_counts.get("m64n128k16") == 8 else 1


if __name__ == "__main__":
    sys.exit(main())
