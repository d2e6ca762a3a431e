"""The FP8 cells of ``benchmarks/gemm.py`` (``--dtypes float8_e4m3fn``): ``cutetma.scaled_gemm``
with each producer against ``torch._scaled_mm``, per-tensor, row-wise and blockwise scales
(torch's blockwise scales have their own layout: that column is ours alone), the same
quantised randn data (amax / 448 scales, as a recipe would set them).

A row per (cell, scaling): ``{M, N, K, dtype: "float8_e4m3fn", scaling, cutetma, tma,
cp_async, torch_scaled_mm}`` in TFLOP/s (``cutetma``: what the call picks by default, TMA),
null where a contender cannot run. Every output is checked against torch._scaled_mm's
before it is timed; times are medians of alternating rounds.
"""

from __future__ import annotations

import statistics

FP8 = "float8_e4m3fn"
SCALINGS = ("tensor", "row", "block")


def quantised(m: int, n: int, k: int, scaling: str, seed: int = 0):
    """e4m3 a (M, K), b (K, N) column-major and fp32 scales of the given kind."""
    import torch

    g = torch.Generator(device="cuda").manual_seed(seed)
    a32 = torch.randn(m, k, device="cuda", generator=g)
    b32 = torch.randn(n, k, device="cuda", generator=g)
    if scaling == "tensor":
        sa = (a32.abs().amax() / 448).reshape(1)
        sb = (b32.abs().amax() / 448).reshape(1)
        scale_a, scale_b = sa, sb
    elif scaling == "row":
        sa = a32.abs().amax(1, keepdim=True) / 448  # (M, 1)
        sb = b32.abs().amax(1, keepdim=True) / 448  # (N, 1)
        scale_a, scale_b = sa.contiguous(), sb.t().contiguous()
    else:  # blockwise: (M, K / 128) and (N / 128, K / 128); the shapes are multiples of 128
        kb, nb = -(-k // 128), -(-n // 128)
        pad_a = torch.nn.functional.pad(a32, (0, kb * 128 - k)).view(m, kb, 128)
        scale_a = pad_a.abs().amax(2) / 448 + 1e-12
        pad_b = torch.nn.functional.pad(b32, (0, kb * 128 - k, 0, nb * 128 - n))
        scale_b = pad_b.view(nb, 128, kb, 128).abs().amax((1, 3)) / 448 + 1e-12
        sa = scale_a.repeat_interleave(128, 1)[:, :k]
        sb = scale_b.repeat_interleave(128, 0).repeat_interleave(128, 1)[:n, :k]
    a8 = (a32 / sa).to(torch.float8_e4m3fn)
    b8 = (b32 / sb).to(torch.float8_e4m3fn)
    return a8, b8.t(), scale_a.float().contiguous(), scale_b.float().contiguous()


def measure_fp8_cell(m: int, n: int, k: int, scaling: str, bench, alternating_rounds,
                     rounds: int) -> dict:
    import torch

    import cutetma

    a, b, scale_a, scale_b = quantised(m, n, k, scaling)
    flops = 2 * m * n * k
    row = {"M": m, "N": n, "K": k, "dtype": FP8, "scaling": scaling, "cutetma": None,
           "tma": None, "cp_async": None, "torch_scaled_mm": None}
    contenders = {}

    def peer():
        return torch._scaled_mm(a, b, scale_a=scale_a, scale_b=scale_b,
                                out_dtype=torch.bfloat16)

    want = None
    if scaling == "block":  # checked against the dequantised fp32 product instead
        sa = scale_a.repeat_interleave(128, 1)[:, :k]
        sb = scale_b.repeat_interleave(128, 0).repeat_interleave(128, 1)[:n, :k]
        want = (a.float() * sa) @ (b.t().float() * sb).t()
        row["torch_scaled_mm_error"] = "blockwise scales: not compared (another layout)"
    else:
        try:
            want = peer().float()
            contenders["torch_scaled_mm"] = peer
        except Exception as exc:  # a mode or shape this torch refuses
            row["torch_scaled_mm_error"] = f"{type(exc).__name__}: {exc}"[:200]
    for load in ("tma", "cp_async"):
        def call(load=load):
            return cutetma.scaled_gemm(a, b, scale_a, scale_b, load=load)

        try:
            out = call().float()
        except Exception as exc:
            row[f"{load}_error"] = f"{type(exc).__name__}: {exc}"[:200]
            continue
        if want is not None:
            rel = (out - want).abs().max().item() / (want.abs().max().item() + 1e-6)
            if not rel < 2e-2:  # a wrong result is never timed
                row[f"{load}_error"] = f"rel. max error {rel:.3g} against torch._scaled_mm"
                continue
        contenders[load] = call
    for fn in contenders.values():
        bench(fn)  # compile and warm outside the rounds
    times = alternating_rounds(contenders, rounds)
    row.update({key: flops / statistics.median(ms) / 1e9 for key, ms in times.items()})
    row["cutetma"] = row["tma"]
    return row


def warm(cells, scalings, processes: int) -> None:
    """Compile the kernels of every (cell, scaling, producer) into the on-disk cache first
    (``cutetma.runtime.warm``, what ``cutetma cache warm`` runs: one compile per distinct
    kernel, in ``processes`` worker processes), so the timed run compiles nothing (the
    paper's grid per tensor is 47 configurations)."""
    from cutetma.runtime import warm as cache_warm

    entries = cache_warm.scaled_gemm_entries(cells, scalings, ("tma", "cp_async"), gpu=True)
    results = cache_warm.warm(entries, processes)
    failed = [e.name() for e, (status, _, _) in zip(entries, results, strict=True)
              if status == "failed"]
    print(f"compiled {len(entries)} FP8 kernels in {processes} processes"
          + (f"; failed: {failed[:4]}" if failed else ""), flush=True)


def summarize_fp8(rows) -> dict:
    """Per scaling that has rows: the geomean of cutetma / torch._scaled_mm over M >= 256,
    and of tma / cp_async over every cell."""
    import math

    def gmean(values):
        values = [v for v in values if v]
        return math.exp(sum(map(math.log, values)) / len(values)) if values else None

    out = {}
    for scaling in SCALINGS:
        mine = [r for r in rows if r.get("scaling") == scaling]
        if not mine:  # a run of other scalings (--scalings)
            continue
        out[f"fp8_{scaling}_vs_torch_scaled_mm_M>=256"] = gmean(
            r["cutetma"] / r["torch_scaled_mm"] for r in mine
            if r["M"] >= 256 and r.get("cutetma") and r.get("torch_scaled_mm"))
        out[f"fp8_{scaling}_tma_vs_cp_async"] = gmean(
            r["tma"] / r["cp_async"] for r in mine if r.get("tma") and r.get("cp_async"))
    return out
