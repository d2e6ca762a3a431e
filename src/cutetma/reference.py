"""fp32 references for tests, tutorials and the CLI: the same inputs, computed in float32
by torch, so a kernel's error can be compared with torch's own same-dtype error."""

from __future__ import annotations

import math


def gemm_ref(a, b, trans_b: bool = True):
    """``a @ b^T`` (``trans_b=False``: ``a @ b``) computed from the same inputs in float32."""
    b_nk = b if trans_b else b.T
    return a.float() @ b_nk.float().T


def attention_ref(q, k, v, causal: bool = False, softmax_scale: float | None = None,
                  p_dtype=None):
    """fp32 attention: q (b, s_q, h, d), k and v (b, s_k, h_kv, d); bottom-right causal
    alignment as FlashAttention. Returns (out, lse) with lse (b, h, s_q); a row with no key
    gets output 0 and lse -inf. ``p_dtype`` (say float8_e4m3fn): the unnormalised
    probabilities exp(s - rowmax) are rounded to it before P V, the row sums kept in fp32,
    as an FP8 kernel does: torch's result at the kernel's precision, the yardstick for its
    error."""
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
    if p_dtype is not None:
        p = torch.exp(s - s.amax(dim=-1, keepdim=True))
        p = p.to(p_dtype).float() / p.sum(dim=-1, keepdim=True)
        return (p.nan_to_num(0.0) @ vf).transpose(1, 2), lse
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)  # rows with no key: output 0
    return (p @ vf).transpose(1, 2), lse


def attention_grads_ref(dout, q, k, v, causal: bool = False,
                        softmax_scale: float | None = None, dtype=None):
    """(dq, dk, dv) of ``attention_ref`` at ``dout``, by autograd: in fp32 (``dtype`` None),
    or with q, k, v, dout in ``dtype`` and the math in it but the softmax (torch's own
    precision for that dtype: flash-attention's yardstick for its error). dk and dv are
    summed over each K/V head's group (GQA). Rows that see no key get zero gradients."""
    import torch

    cast = (lambda x: x.detach().float()) if dtype is None else (
        lambda x: x.detach().to(dtype))
    q, k, v, dout = (cast(x) for x in (q, k, v, dout))
    for x in (q, k, v):
        x.requires_grad_(True)
    if dtype is None:
        out, _ = attention_ref(q, k, v, causal, softmax_scale)
    else:
        b, s_q, h, d = q.shape
        s_k, h_kv = k.shape[1], k.shape[2]
        scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(d)
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
        kt = kt.repeat_interleave(h // h_kv, dim=1)
        vt = vt.repeat_interleave(h // h_kv, dim=1)
        s = (qt @ kt.transpose(-1, -2)).float() * scale
        if causal:
            i = torch.arange(s_q, device=q.device)[:, None]
            j = torch.arange(s_k, device=q.device)[None, :]
            s = s.masked_fill(j > i + s_k - s_q, float("-inf"))
        p = torch.softmax(s, dim=-1).nan_to_num(0.0).to(dtype)
        out = (p @ vt).transpose(1, 2)
    grads = torch.autograd.grad(out, (q, k, v), dout.to(out.dtype))
    return tuple(g.float().nan_to_num(0.0) for g in grads)


def paged_attention_ref(q, k_cache, v_cache, cache_seqlens, page_table, causal: bool = False,
                        softmax_scale: float | None = None, cu_seqlens_q=None):
    """fp32 attention over a paged cache (``cutetma.attention_with_kvcache``'s contract):
    sequence i's keys are rows 0 .. cache_seqlens[i] - 1 of its pages, in page-table order.
    Returns (out, lse) as ``attention_ref``; with ``cu_seqlens_q``, q (total_q, h, d) holds
    the sequences' queries end to end and out is (total_q, h, d), lse (h, total_q)."""
    import torch

    page_size = k_cache.shape[1]
    count = len(cu_seqlens_q) - 1 if cu_seqlens_q is not None else q.shape[0]
    outs, lses = [], []
    for i in range(count):
        n = int(cache_seqlens[i])
        pages = page_table[i, :(n + page_size - 1) // page_size].long()
        k = k_cache[pages].flatten(0, 1)[:n][None]
        v = v_cache[pages].flatten(0, 1)[:n][None]
        if cu_seqlens_q is None:
            queries = q[i:i + 1]
        else:
            queries = q[int(cu_seqlens_q[i]):int(cu_seqlens_q[i + 1])][None]
        out, lse = attention_ref(queries, k, v, causal, softmax_scale)
        outs.append(out)
        lses.append(lse)
    if cu_seqlens_q is not None:
        return torch.cat(outs, 1)[0], torch.cat(lses, 2)[0]
    return torch.cat(outs), torch.cat(lses)


def combine_splits_ref(o_parts, lse_parts, splits: int, out, lse) -> None:
    """fp32 merge of split_kv's partials (what ``kernels.attention.combine`` computes):
    ``o_parts`` (splits b, s_q, h, d) and ``lse_parts`` (splits b, h, s_q) fp32, each
    split's softmax over its own keys, into ``out`` (b, s_q, h, d) and ``lse`` (b, h, s_q):
    out = sum_s e^(lse_s - lse) o_s, lse = log sum_s e^(lse_s). A split without keys has
    lse -inf and weight 0; a row without any, out 0 and lse -inf."""
    import torch

    b, s_q, h, d = out.shape
    parts = lse_parts.view(splits, b, h, s_q)
    top = parts.amax(0)
    top = torch.where(torch.isinf(top), torch.zeros_like(top), top)  # every split empty
    weights = torch.exp(parts - top)
    total = weights.sum(0)
    torch.add(top, torch.log(total), out=lse)
    weights = (weights / total.clamp_min(torch.finfo(torch.float32).tiny)).transpose(2, 3)
    merged = (o_parts.view(splits, b, s_q, h, d) * weights[..., None]).sum(0)
    out.copy_(merged)


def append_to_cache_ref(k_cache, v_cache, k, v, cache_seqlens, page_table,
                        cu_seqlens_q=None) -> None:
    """torch's version of the new-key append (what ``kernels.attention.append`` does): sequence
    i's t-th new key at position p = ``cache_seqlens[i] + t``, i.e. page ``page_table[i, p //
    page_size]``, slot ``p % page_size``; ``k``, ``v`` (b, s_new, h_kv, d), or (total_q,
    h_kv, d) with ``cu_seqlens_q`` (row r of sequence i its (r - cu_seqlens_q[i])-th key).
    Index arithmetic on the (b, s_new) positions, then one index copy each for K and V (FP8
    as bytes: torch's index copies do not all take float8); any device."""
    import torch

    page_size = k_cache.shape[1]
    device = k_cache.device
    if cu_seqlens_q is None:
        position = cache_seqlens[:, None] + torch.arange(k.shape[1], device=device)
        page = torch.gather(page_table, 1, torch.div(position, page_size,
                                                     rounding_mode="floor"))
    else:
        row = torch.arange(k.shape[0], device=device, dtype=cu_seqlens_q.dtype)
        seq = torch.searchsorted(cu_seqlens_q[1:], row, right=True)
        position = (cache_seqlens[seq] + row - cu_seqlens_q[seq]).long()
        page = page_table[seq, torch.div(position, page_size, rounding_mode="floor")]
    slot = position % page_size
    for cache, new in ((k_cache, k), (v_cache, v)):
        if cache.dtype == torch.float8_e4m3fn:
            cache, new = cache.view(torch.uint8), new.view(torch.uint8)
        cache[page, slot] = new
