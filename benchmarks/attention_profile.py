"""Nsight Compute counters for the attention forward: ours (TMA, the default configuration)
and cuDNN (torch SDPA) side by side, d = 128 fp16, at a short and a middle sequence length
(s = 512 and 2k, 16k tokens, 16 heads), non-causal: where the gap to cuDNN is widest and where
it closes.

    source .gpu/prelude.sh && python benchmarks/attention_profile.py OUT.json

The launches inside the NVTX range "profile" are measured (compiles and warm-ups are
outside it); ``gemm_profile.run_ncu`` builds the ncu command and writes the table.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gemm_profile import METRICS, run_ncu  # noqa: E402

# what the attention gap could be: tensor pipe idle (bubbles between tiles, the first
# block's softmax), warps waiting on barriers (mbarrier waits show as long scoreboard or
# barrier), or the softmax's instructions themselves (issue-bound: math pipe throttle)
ATTENTION_METRICS = METRICS + [
    "smsp__average_warps_issue_stalled_wait_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio",
    "smsp__issue_active.avg.pct_of_peak_sustained_active",
]
SEQLENS = (512, 2048)
ORDER = [f"{who}_s{s}" for s in SEQLENS for who in ("ours_tma", "cudnn")]


def workload():
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from cutetma import ops

    calls = []
    for s in SEQLENS:
        q, k, v = (torch.randn(16384 // s, s, 16, 128, device="cuda", dtype=torch.float16)
                   for _ in range(3))
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))

        def cudnn(qt=qt, kt=kt, vt=vt):
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return torch.nn.functional.scaled_dot_product_attention(qt, kt, vt)

        calls += [lambda q=q, k=k, v=v: ops.attention(q, k, v), cudnn]
    for fn in calls:  # compile and warm up outside the profiled range
        fn()
        fn()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_push("profile")
    for fn in calls:  # in ORDER
        fn()
        torch.cuda.synchronize()
    torch.cuda.nvtx.range_pop()


if __name__ == "__main__":
    if "--workload" in sys.argv:
        workload()
    else:
        out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("attention_profile.json")
        sys.exit(run_ncu(out, __file__, ATTENTION_METRICS, ORDER))
