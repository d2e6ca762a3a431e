"""The torch face of the attention backward: ``attention_backward`` (validate -> launch) and
the custom op behind ``cutetma.attention``'s autograd formula (registered in ``ops``, which
imports this module when a gradient is first asked for).

Given the forward's inputs, its output and LSE, and dO, one preprocessing kernel makes the
LSE in log2 and D = rowsum(dO * O) (fp32, (b, h, s_q) padded to whole query blocks; D minus
the LSE's own gradient where the LSE was used) and zeroes an fp32 dQ accumulator (in the dQ
MMA's fragment order: ``dq_from_fragments``); then ``FlashAttentionBackwardSm90`` runs (one
CTA per key block; dQ added into the accumulator, dK and dV written per query head, in k's
dtype or, under GQA / MQA, in fp32) and the conversions: dQ to q's dtype by
``DqPostprocess``, and under GQA dK and dV summed over each K/V head's group of query heads
and converted to k's::

    out, lse = cutetma.attention(q, k, v, causal=True, return_lse=True)
    dq, dk, dv = cutetma.attention_backward(dout, q, k, v, out, lse, causal=True)

Through autograd: ``cutetma.attention(q, k, v)`` with inputs that require grad.
"""

from __future__ import annotations

import dataclasses

import torch

from cutetma import runtime
from cutetma.checks import attention_config, check_operand, tma_rows_aligned
from cutetma.kernels.attention.config import (
    BACKWARD_HEAD_DIMS,
    BackwardConfig,
    dq_splits_rows,
)
from cutetma.tuning import gemm as gemm_tuning


def attention_backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       out: torch.Tensor, lse: torch.Tensor, *, causal: bool = False,
                       softmax_scale: float | None = None, load: str = "tma",
                       dlse: torch.Tensor | None = None,
                       config: BackwardConfig | None = None) -> tuple:
    """(dq, dk, dv) of ``cutetma.attention(q, k, v, causal=..., softmax_scale=...)`` at
    ``dout``, from its ``out`` (b, s_q, h, d) and ``lse`` (b, h, s_q) fp32; ``dlse``: the
    gradient of the LSE where the caller used it (None: not used). ``load``: the producer
    ("tma" or "cp_async"). Shapes and dtypes as the forward's; d in {64, 128, 256}. ``config``: a
    ``BackwardConfig`` to run (its head dim and causal flag must match; it overrides
    ``load``; its deterministic flag follows torch's deterministic mode)."""
    _check(dout, q, k, v, out, lse, dlse, load, config)
    b, s_q, h, d = q.shape
    s_k, h_kv = k.shape[1], k.shape[2]
    if q.numel() == 0 or s_k == 0:
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    # torch.use_deterministic_algorithms: dQ's key blocks added in order (the same bits)
    deterministic = gemm_tuning.deterministic_mode()
    q, k, v, dout, out = (x if tma_rows_aligned(x)
                          else x.clone(memory_format=torch.contiguous_format)
                          for x in (q, k, v, dout, out))
    config = attention_config(config, BackwardConfig, d, causal,
                              lambda: BackwardConfig(head_dim=d, causal=causal, load=load))
    cfg = dataclasses.replace(config, deterministic=deterministic)
    lse_log2, dsum, dq = _statistics(dout, out, lse, dlse, cfg.block_m)
    blocks = lse_log2.shape[-1] // cfg.block_m
    # dK and dV in k's dtype straight from the kernel, or fp32 where GQA sums them after
    grad_kv_dtype = k.dtype if h == h_kv else torch.float32
    dk = torch.empty(b, s_k, h, d, device=q.device, dtype=grad_kv_dtype)
    dv = torch.empty_like(dk)
    turns = torch.zeros(b, h, blocks, device=q.device, dtype=torch.int32) if deterministic \
        else dsum  # not read
    scale = softmax_scale if softmax_scale is not None else d ** -0.5
    launch = runtime.attention_backward_launch(q.dtype, cfg, grad_kv_dtype)
    strides = tuple(x.stride(i) for x in (q, k, v, dout) for i in (1, 2, 0))
    launch((q.data_ptr(), k.data_ptr(), v.data_ptr(), dout.data_ptr(), lse_log2.data_ptr(),
            dsum.data_ptr(), dq.data_ptr(), dk.data_ptr(), dv.data_ptr(), turns.data_ptr(),
            b, s_q, s_k, h, h_kv) + strides
           + (scale, torch.cuda.current_stream(q.device).cuda_stream))
    if h != h_kv:  # a K/V head's gradient is the sum over the query heads that read it
        dk = dk.view(b, s_k, h_kv, h // h_kv, d).sum(3)
        dv = dv.view(b, s_k, h_kv, h // h_kv, d).sum(3)
    return _dq_postprocess(dq, q, scale, cfg.block_m), dk.to(k.dtype), dv.to(v.dtype)


def _dq_postprocess(acc: torch.Tensor, q: torch.Tensor, scale: float,
                    block_m: int) -> torch.Tensor:
    """dQ (q's shape and dtype) from the fragment-ordered accumulator by ``DqPostprocess``
    (``dq_from_fragments`` is the same in torch: the reference the tests hold it to)."""
    b, s_q, h, d = q.shape
    dq = torch.empty(b, s_q, h, d, device=q.device, dtype=q.dtype)
    launch = runtime.dq_postprocess_launch(q.dtype, d, block_m)
    launch((acc.data_ptr(), dq.data_ptr(), b, s_q, h)
           + tuple(dq.stride(i) for i in (1, 2, 0))
           + (scale, torch.cuda.current_stream(q.device).cuda_stream))
    return dq


def dq_from_fragments(acc: torch.Tensor, b: int, s_q: int, h: int, d: int,
                      dtype: torch.dtype, scale: float = 1.0,
                      block_m: int = 64) -> torch.Tensor:
    """dQ (b, s_q, h, d) in ``dtype``, times ``scale``, from the kernel's fp32 accumulator,
    which holds each (batch, head, ``block_m``-query block) as the dQ MMA leaves it in
    registers: per consumer warpgroup w (columns w d/2 ..), per 4-value chunk (i, j), per
    thread (warp, lane row r, lane column c), the values (row half e1, column pair e0) of
    query 64 i + 16 warp + 8 e1 + r and column w d/2 + 8 j + 2 c + e0 (128-query blocks,
    ``dq_splits_rows``: query 64 w + 16 warp + 8 e1 + r and column 8 j + 2 c + e0). Each
    thread's chunk lies next to its neighbours' (16-byte shared stores without bank
    conflicts, one TMA reduction per warpgroup); this one pass puts the values back in place
    and applies the softmax scale. The backward runs the same as a kernel
    (``DqPostprocess``); this is its reference."""
    blocks, m64 = acc.numel() // (b * h * block_m * d), block_m // 64
    out = torch.empty(b, blocks * block_m, h, d, device=acc.device, dtype=dtype)
    if dq_splits_rows(block_m, 2):  # warpgroup w: queries 64 w .., every column
        frag = acc.view(b, h, blocks, 2, d // 8, 4, 8, 4, 2, 2)
        torch.mul(frag.permute(0, 2, 3, 5, 8, 6, 1, 4, 7, 9), scale,
                  out=out.view(b, blocks, 2, 4, 2, 8, h, d // 8, 4, 2))
    else:
        frag = acc.view(b, h, blocks, 2, m64, d // 16, 4, 8, 4, 2, 2)
        torch.mul(frag.permute(0, 2, 4, 6, 9, 7, 1, 3, 5, 8, 10), scale,
                  out=out.view(b, blocks, m64, 4, 2, 8, h, 2, d // 16, 4, 2))
    return out if out.shape[1] == s_q else out[:, :s_q].contiguous()


def _statistics(dout, out, lse, dlse, block_m: int) -> tuple:
    """The kernel's per-query inputs, (b, h, s_q padded to whole query blocks) fp32, from the
    preprocessing kernel (``BackwardPreprocess``): the LSE in log2 (+inf where a row saw no
    key, and in the padding: P = 0 there) and D = rowsum(dO * O) (0 in the padding), minus
    the LSE's own gradient where the caller used the LSE; and the dQ accumulator (in the
    kernel's fragment order), which the same kernel zeroes."""
    b, s_q, h, d = out.shape
    padded = -(-s_q // block_m) * block_m
    lse_log2 = torch.empty(b, h, padded, device=out.device, dtype=torch.float32)
    dsum = torch.empty_like(lse_log2)
    dq = torch.empty(b * h * padded * d, device=out.device, dtype=torch.float32)
    lse = lse.float().contiguous()
    launch = runtime.backward_preprocess_launch(out.dtype, d, block_m)
    launch((out.data_ptr(), dout.data_ptr(), lse.data_ptr(),
            lse_log2.data_ptr(), dsum.data_ptr(), dq.data_ptr(), b, s_q, h)
           + tuple(x.stride(i) for x in (out, dout) for i in (1, 2, 0))
           + (torch.cuda.current_stream(out.device).cuda_stream,))
    if dlse is not None:
        dsum[..., :s_q] -= dlse.float()
    return lse_log2, dsum, dq


def check_head_dim(d: int) -> None:
    """Refuse a head dim the backward has no kernel for."""
    if d not in BACKWARD_HEAD_DIMS:
        raise ValueError(f"head_dim {d}: the backward supports {BACKWARD_HEAD_DIMS}")


def _check(dout, q, k, v, out, lse, dlse, load, config=None) -> None:
    for name, t in (("dout", dout), ("q", q), ("k", k), ("v", v), ("out", out)):
        check_operand(name, t, "attention_backward", 4, "(batch, seqlen, heads, head_dim)")
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device}, q on {q.device}: one device")
    if not (q.dtype == k.dtype == v.dtype == dout.dtype == out.dtype):
        raise TypeError("dout, q, k, v and out must share one dtype")
    b, s_q, h, d = q.shape
    if dout.shape != q.shape or out.shape != q.shape:
        raise ValueError(f"dout and out must be shaped like q {tuple(q.shape)}, got "
                         f"{tuple(dout.shape)} and {tuple(out.shape)}")
    if k.shape != v.shape or k.shape[0] != b or k.shape[3] != d:
        raise ValueError(f"k and v must be (b={b}, s_k, h_kv, d={d}) alike, got "
                         f"{tuple(k.shape)} and {tuple(v.shape)}")
    if k.shape[2] == 0 or h % k.shape[2]:
        raise ValueError(f"{h} query heads are not a multiple of {k.shape[2]} key/value heads")
    check_head_dim(d)
    for name, t in (("lse", lse), ("dlse", dlse)):
        if t is None and name == "dlse":
            continue
        if not isinstance(t, torch.Tensor) or t.shape != (b, h, s_q) or t.device != q.device:
            raise ValueError(f"{name} must be a (b, h, s_q) = {(b, h, s_q)} tensor on "
                             f"{q.device}, as the forward returns it")
    if load not in ("tma", "cp_async"):
        raise ValueError(f"load={load!r}: 'tma' or 'cp_async'")


@torch.library.custom_op("cutetma::attention_backward", mutates_args=())
def _attention_backward_op(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                           v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                           dlse: torch.Tensor | None, causal: bool,
                           softmax_scale: float | None, load: str
                           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``torch.ops.cutetma.attention_backward(dout, q, k, v, out, lse, dlse, causal,
    softmax_scale, load) -> (dq, dk, dv)``."""
    return attention_backward(dout, q, k, v, out, lse, causal=causal,
                              softmax_scale=softmax_scale, load=load, dlse=dlse)


@_attention_backward_op.register_fake
def _(dout, q, k, v, out, lse, dlse, causal, softmax_scale, load):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)
