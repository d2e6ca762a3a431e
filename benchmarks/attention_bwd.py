"""Attention backward benchmark on the H200: ours (TMA and cp.async producers) against
FlashAttention-4's SM90 backward (``flash_attn.cute``, column ``fa4``) and cuDNN (torch SDPA's
backward), one run, the same randn data (``python benchmarks/attention.py --backward`` runs
this).

    python benchmarks/attention_bwd.py [--quick] [--out DIR] [--head-dims 128] [--seqlens ..]

The FlashAttention-3 grid: 16k tokens per batch (b = 16384 / s), h = 2048 / d, bf16, causal
and not. FLOPs counted as 2.5x the forward's (4 b h s^2 d, halved for causal). Each
contender's whole backward is timed from the forward's saved tensors (ours: D, the kernel,
dQ's conversion; the peers through autograd, every kernel they launch), as CUDA-graph replays
(``gemm.bench``), then again in alternating rounds (``attention.final_rounds``). Gradients are
checked against cuDNN's first. Writes ``attention_bwd.json`` and ``attention_bwd.png``.

``--layer``: a training layer's whole step instead, forward and backward through autograd
for every contender (ours: ``cutetma.attention``'s registered backward), FLOPs counted as
3.5x the forward's; writes ``attention_layer.json``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from attention import (  # noqa: E402
    FINAL_ROUNDS,
    SEQLENS,
    TOKENS,
    bar_plot,
    fa4,
    final_rounds,
    grid_parser,
    ratio_summary,
)
from gemm import bench, device_label, progress  # noqa: E402

HEAD_DIMS = (64, 128, 256)


def measure(dtype: str, d: int, s: int, causal: bool, rounds: int = FINAL_ROUNDS,
            shape=None, custom=(), layer: bool = False) -> dict:
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import cutetma
    from cutetma.kernels.attention.config import BackwardConfig

    t = getattr(torch, dtype)
    b, h = shape or (TOKENS // s, 2048 // d)
    q, k, v, dout = (torch.randn(b, s, h, d, device="cuda", dtype=t) for _ in range(4))
    flops = (3.5 if layer else 2.5) * 4 * b * h * s * s * d / (2 if causal else 1)
    row = {"dtype": dtype, "d": d, "s": s, "b": b, "h": h, "causal": causal}
    if layer:
        row["pass"] = "forward+backward"
    timed = {}

    def autograd_call(forward):
        leaves = [x.detach().clone().requires_grad_(True) for x in (q, k, v)]
        if layer:  # the forward inside the timed call
            def call():
                return torch.autograd.grad(forward(*leaves), leaves, dout)
            return call
        out = forward(*leaves)

        def call():
            return torch.autograd.grad(out, leaves, dout, retain_graph=True)
        return call

    def cudnn_forward(q, k, v):
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return torch.nn.functional.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                is_causal=causal).transpose(1, 2)

    ref = None
    try:
        call = autograd_call(cudnn_forward)
        ref = call()
        timed["cudnn"] = (call, [bench(call)])
    except Exception as exc:
        row["cudnn_error"] = f"{type(exc).__name__}: {exc}"[:200]
    contenders = []
    peer, why = fa4()
    if peer is not None:
        contenders.append(("fa4", lambda: autograd_call(
            lambda q, k, v: peer.flash_attn_func(q, k, v, causal=causal)[0])))
    else:
        row["fa4_error"] = why
    out, lse = cutetma.attention(q, k, v, causal=causal, return_lse=True)
    for load in ("tma", "cp_async"):
        if layer:
            contenders.append((load, lambda load=load: autograd_call(
                lambda q, k, v: cutetma.attention(q, k, v, causal=causal, load=load))))
            continue
        contenders.append((load, lambda load=load: lambda: cutetma.attention_backward(
            dout, q, k, v, out, lse, causal=causal, load=load)))
    for name, fields in custom if not layer else ():  # candidate BackwardConfigs
        config = BackwardConfig(head_dim=d, causal=causal, **fields)
        contenders.append((name, lambda config=config: lambda: cutetma.attention_backward(
            dout, q, k, v, out, lse, causal=causal, config=config)))
    for name, make in contenders:
        try:
            call = make()
            grads = call()
            if ref is not None:
                err = max(((a.float() - r.float()).abs().max() / r.float().abs().max()).item()
                          for a, r in zip(grads, ref, strict=True))
                if not err < 2e-2:  # a contender that computes something else is not one
                    row[f"{name}_error"] = f"max rel. |grad - cudnn| = {err:.3g}"
                    continue
            timed[name] = (call, [bench(call)])
        except Exception as exc:
            row[f"{name}_error"] = f"{type(exc).__name__}: {exc}"[:200]
    for name, (_, ms) in timed.items():
        row[name] = flops / ms[0] / 1e9
    final_rounds(row, timed, list(timed), rounds, flops)
    return row


def summarize(rows) -> dict:
    return {**ratio_summary(rows, "tma", "fa4"), **ratio_summary(rows, "tma", "cudnn")}


def plot(rows, path: Path, layer: bool = False):
    what, factor = ("forward + backward", 3.5) if layer else ("backward", 2.5)
    bar_plot(rows, path, ("tma", "cp_async", "fa4", "cudnn"),
             f"TFLOP/s ({factor}x forward FLOPs)", f"attention {what}, bf16, {device_label()}")


def main(argv=None):
    ap = grid_parser(__doc__.splitlines()[0], HEAD_DIMS, SEQLENS, "BackwardConfig",
                     "s1=stages:1")
    ap.add_argument("--causal-only", action="store_true")
    ap.add_argument("--layer", action="store_true",
                    help="forward + backward through autograd (attention_layer.json)")
    args = ap.parse_args(argv)
    from cutetma import results

    seqlens = [512, 2048, 8192] if args.quick else args.seqlens
    todo = [(d, s, causal) for d in args.head_dims for s in seqlens
            for causal in ((True,) if args.causal_only else (False, True))]
    out, rows, t0 = Path(args.out), [], time.time()
    name = "attention_layer" if args.layer else "attention_bwd"
    for d, s, causal in progress(todo, len(todo)):
        rows.append(measure("bfloat16", d, s, causal, args.rounds, custom=args.custom,
                            layer=args.layer))
        results.write(name, rows, out, extra_meta={"complete": False})
    plot(rows, out / f"{name}.png", args.layer)
    results.finish(name, rows, out, summarize(rows), t0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
