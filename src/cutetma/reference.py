"""fp32 references for tests, tutorials and the CLI: the same inputs, computed in float32
by torch, so a kernel's error can be compared with torch's own same-dtype error."""

from __future__ import annotations

import math


def gemm_ref(a, b, trans_b: bool = True):
    """``a @ b^T`` (``trans_b=False``: ``a @ b``) computed from the same inputs in float32."""
    b_nk = b if trans_b else b.T
    return a.float() @ b_nk.float().T


def attention_ref(q, k, v, causal: bool = False, softmax_scale: float | None = None):
    """fp32 attention: q (b, s_q, h, d), k and v (b, s_k, h_kv, d); bottom-right causal
    alignment as FlashAttention. Returns (out, lse) with lse (b, h, s_q); a row with no key
    gets output 0 and lse -inf."""
    import torch

    b, s_q, h, d = q.shape
    s_k, h_kv = k.shape[1], k.shape[2]
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(d)
    qf, kf, vf = (x.float().transpose(1, 2) for x in (q, k, v))  # (b, h, s, d)
    kf = kf.repeat_interleave(h // h_kv, dim=1)
    vf = vf.repeat_interleave(h // h_kv, dim=1)
    s = qf @ kf.transpose(-1, -2) * scale
    if causal:
        i = torch.arange(s_q, device=q.device)[:, None]
        j = torch.arange(s_k, device=q.device)[None, :]
        s = s.masked_fill(j > i + s_k - s_q, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)  # rows with no key: output 0
    return (p @ vf).transpose(1, 2), lse


def paged_attention_ref(q, k_cache, v_cache, cache_seqlens, page_table, causal: bool = False,
                        softmax_scale: float | None = None):
    """fp32 attention over a paged cache (``cutetma.attention_with_kvcache``'s contract):
    sequence i's keys are rows 0 .. cache_seqlens[i] - 1 of its pages, in page-table order.
    Returns (out, lse) as ``attention_ref``."""
    import torch

    b, s_q, h, d = q.shape
    page_size = k_cache.shape[1]
    outs, lses = [], []
    for i in range(b):
        n = int(cache_seqlens[i])
        pages = page_table[i, :(n + page_size - 1) // page_size].long()
        k = k_cache[pages].flatten(0, 1)[:n][None]
        v = v_cache[pages].flatten(0, 1)[:n][None]
        out, lse = attention_ref(q[i:i + 1], k, v, causal, softmax_scale)
        outs.append(out)
        lses.append(lse)
    return torch.cat(outs), torch.cat(lses)
