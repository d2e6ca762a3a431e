"""The first call in a fresh process, with an empty compile cache and with a warm one.

    python benchmarks/cold_start.py [--out DIR]

Each measurement is a new Python process (``python -c``): it imports torch and cutetma, resolves
``cutetma.gemm`` / ``cutetma.attention`` (which imports the torch face and the DSL), makes its
inputs, synchronizes, then times its first ``cutetma.gemm`` (bf16 4096^3) or ``cutetma.attention``
(bf16 (2, 2048, 16, 128), causal) call to the end of its kernel: ``first_call_s`` (the first call
runs the placement probes and builds the tile order too); ``with_process_s`` the whole process,
start and imports included. "empty": a fresh ``CUTETMA_CACHE_DIR`` (the call compiles); "warm": the
same folder again (the call loads the compiled kernel). Writes ``cold_start.json``: rows
``{op, cache, first_call_s, with_process_s}``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

CHILD = r"""
import json, time, torch, cutetma
op = "{op}"
if op == "gemm":
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    gemm = cutetma.gemm  # imports the torch face and the DSL: not part of the call
    call = lambda: gemm(a, b)
else:
    q, k, v = (torch.randn(2, 2048, 16, 128, device="cuda", dtype=torch.bfloat16)
               for _ in range(3))
    attention = cutetma.attention
    call = lambda: attention(q, k, v, causal=True)
torch.cuda.synchronize()
start = time.perf_counter()
call()
torch.cuda.synchronize()
print(json.dumps({{"first_call_s": time.perf_counter() - start}}))
"""


def run_child(op: str, cache_dir: str) -> dict:
    env = dict(os.environ, CUTETMA_CACHE_DIR=cache_dir)
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", CHILD.format(op=op)], env=env,
                          capture_output=True, text=True, check=True)
    wall = time.perf_counter() - start
    child = json.loads(done.stdout.strip().splitlines()[-1])
    return {"first_call_s": round(child["first_call_s"], 4), "with_process_s": round(wall, 3)}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="benchmarks/results")
    args = ap.parse_args(argv)

    from cutetma import results

    rows = []
    for op in ("gemm", "attention"):
        with tempfile.TemporaryDirectory(prefix="cutetma-cold-") as cache_dir:
            for cache in ("empty", "warm", "warm"):
                rows.append({"op": op, "cache": cache, **run_child(op, cache_dir)})
                print(rows[-1], flush=True)
    results.write("cold_start", rows, args.out,
                  command="python benchmarks/cold_start.py " + " ".join(argv or sys.argv[1:]))


if __name__ == "__main__":
    main()
