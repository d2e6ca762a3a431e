"""Helpers the tutorials share (05, 07 and 09 time kernels with them); not a tutorial step."""

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


def graph_time_ms(fn, iters: int = 20) -> float:
    """Like ``time_ms``, but ``fn`` is captured once in a CUDA graph and the graph replayed:
    for kernels shorter than the Python call that launches them (host cost left out)."""
    import torch

    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return time_ms(graph.replay, iters)
