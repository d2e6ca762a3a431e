"""What an eager call costs the host: ``cutetma.gemm`` / ``cutetma.attention`` beside torch's
own op on the same inputs, in one run.

    python benchmarks/host_cost.py [--calls 400] [--rounds 7] [--out DIR]

Each contender runs ``--calls`` back-to-back calls between two synchronizations; on these
small problems the kernels are shorter than a call's Python, so the wall time per call is
the host's cost (a contender whose kernel were longer would read as its kernel time). The
contenders alternate round by round and the median of ``--rounds`` is kept. Peers:
``torch.matmul(a, b.T)`` (cuBLAS) and ``F.scaled_dot_product_attention`` (its fastest
backend). Writes ``host_cost.json``: rows ``{op, shape, ours_us, peer, peer_us}``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gemm import eager_us  # noqa: E402  (wall time of back-to-back calls)

GEMMS = [(256, 256, 256), (512, 512, 512), (1024, 1024, 256)]
ATTENTIONS = [(1, 128, 8, 128), (1, 256, 8, 64), (2, 128, 16, 128)]


def measure(ours, peer, calls: int, rounds: int) -> tuple[float, float]:
    for fn in (ours, peer):  # compile, plan, warm the caches
        for _ in range(20):
            fn()
    times = {"ours": [], "peer": []}
    for _ in range(rounds):
        times["ours"].append(eager_us(ours, calls))
        times["peer"].append(eager_us(peer, calls))
    return statistics.median(times["ours"]), statistics.median(times["peer"])


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=400)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--out", default="benchmarks/results")
    args = ap.parse_args(argv)

    import torch
    import torch.nn.functional as F

    import cutetma
    from cutetma import results

    rows = []
    for m, n, k in GEMMS:
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        ours, peer = measure(lambda a=a, b=b: cutetma.gemm(a, b),
                             lambda a=a, b=b: torch.matmul(a, b.T), args.calls, args.rounds)
        rows.append({"op": "gemm", "shape": f"{m}x{n}x{k} bf16", "ours_us": round(ours, 2),
                     "peer": "torch.matmul", "peer_us": round(peer, 2)})
        print(rows[-1], flush=True)
    for bsz, s, h, d in ATTENTIONS:
        q, k, v = (torch.randn(bsz, s, h, d, device="cuda", dtype=torch.bfloat16)
                   for _ in range(3))
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))  # SDPA's (b, h, s, d)
        ours, peer = measure(lambda q=q, k=k, v=v: cutetma.attention(q, k, v),
                             lambda qt=qt, kt=kt, vt=vt: F.scaled_dot_product_attention(
                                 qt, kt, vt),
                             args.calls, args.rounds)
        rows.append({"op": "attention", "shape": f"({bsz}, {s}, {h}, {d}) bf16",
                     "ours_us": round(ours, 2), "peer": "torch SDPA",
                     "peer_us": round(peer, 2)})
        print(rows[-1], flush=True)
    for row in rows:
        row["ratio"] = round(row["ours_us"] / row["peer_us"], 3)
    results.write("host_cost", rows, args.out,
                  command="python benchmarks/host_cost.py " + " ".join(argv or sys.argv[1:]))


if __name__ == "__main__":
    main()
