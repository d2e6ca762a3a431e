"""A helper two tutorials share (05 and 07 time kernels with it); not a tutorial step."""

from __future__ import annotations


def time_ms(fn, iters: int = 20) -> float:
    """Mean milliseconds per call of ``fn`` between two CUDA events around ``iters`` back-to-back
    calls, after a warm-up (the launches queue up, so host overhead hides behind the GPU)."""
    import torch

    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / iters
