"""Split-K's workspace: fp32 partial tiles and int32 tickets that outlive a launch.

One pair of buffers per (device, stream, zeroed), grown by doubling and never freed: a CUDA
graph that captured a launch keeps pointing at them, and launches on one stream run in order,
so they never overlap.
"""

from __future__ import annotations

import torch

_K_WORKSPACE: dict = {}
_K_WORKSPACE_RETIRED: list = []  # outgrown workspaces, kept alive (doubling bounds them)


def split_workspace(device, slots: int, tile_elems: int, flags: int, zeroed: bool = False):
    """Split-K's (and stream-K's) workspace: fp32 tile slots and int32 flags, as DSL tensors of
    dynamic length (one compiled kernel serves every size), one pair per (device, stream,
    ``zeroed``): launches on one stream run in order, and every launch leaves the flags at
    zero as it found them (``zeroed``: the slots too, for ``split_sum="atomic"``, which adds
    into them; the ordered sums leave their partials behind, so they get their own pair).
    Grown by doubling and never freed, so a CUDA graph that captured a launch keeps valid
    pointers; a capture allocates its own pair (its zeroing replays with it)."""
    from cutlass.cute.runtime import from_dlpack

    key = (device, torch.cuda.current_stream(device).cuda_stream, zeroed)
    held = _K_WORKSPACE.get(key)
    need = (slots * tile_elems, flags)
    if held is None or held[0].numel() < need[0] or held[1].numel() < need[1]:
        if held is not None:  # a captured CUDA graph may still point at it: never free it
            _K_WORKSPACE_RETIRED.append(held)
        size = [max(n, 2 * held[i].numel() if held else 0) for i, n in enumerate(need)]
        partials = (torch.zeros if zeroed else torch.empty)(size[0], dtype=torch.float32,
                                                            device=device)
        flags_t = torch.zeros(size[1], dtype=torch.int32, device=device)
        held = (partials, flags_t,
                from_dlpack(partials, assumed_align=16).mark_layout_dynamic(),
                from_dlpack(flags_t, assumed_align=4).mark_layout_dynamic())
        _K_WORKSPACE[key] = held
    return held[2], held[3]
