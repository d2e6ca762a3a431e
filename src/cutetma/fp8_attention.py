"""The torch face of FP8 attention: ``attention_fp8`` (validate -> transpose V -> launch).

e4m3 Q, K, V with descale factors, as FlashAttention-3's FP8 call takes them:
``softmax(dequant(q) dequant(k)^T * scale) dequant(v)`` in bf16 or fp16, where
``dequant(x) = x * x_descale`` and a descale is one number per tensor or one per
(batch, K/V head)::

    out = cutetma.attention_fp8(q8, k8, v8, q_descale=sq, k_descale=sk, v_descale=sv)

The kernel is the attention family's (``FlashAttentionSm90.fp8``) with 8-bit operands:
the descales go to the kernel as one (b, h_kv, 2) fp32 tensor, S's factor (q x k) joining
the softmax scale and V's multiplying O with the epilogue's 1 / rowsum; P is rounded to e4m3
for P V (FlashAttention-3's choice: P <= 1 keeps e4m3's range); V goes in as V^T, keys
contiguous, because WGMMA reads 8-bit B operands K-major only, its keys in the order P's
registers hold them (``kernels.attention.fp8_operands``): either transposed in shared memory
by the producer warpgroup from V as stored (``AttentionConfig.v_transpose="smem"``, what a
paged cache needs: ``kvcache.attention_with_kvcache`` takes e4m3 caches), or made once per
call by the ``VTranspose`` kernel ("global").
"""

from __future__ import annotations

import math

import torch

from cutetma import runtime
from cutetma.checks import attention_config, check_operand, tma_rows_aligned
from cutetma.tuning import gemm as gemm_tuning

# (block_n, stages) with e4m3 operands per (head dim, load); unnamed: the 16-bit tables'.
# 8-bit stages take half the bytes, so FP8 affords wider key blocks, and they are what it
# needs: with the GEMMs at twice the rate, the per-block softmax and barrier overhead is the
# cost, and a wider block amortises it. d = 128: three 192-key stages (FlashAttention-3's FP8
# block), 1.27x our bf16 at s >= 4k (attention_fp8.json) where 128-key stages gave 1.21x (224
# and 256 keys slower, 160 ties non-causal and loses causal); d = 256: two 128-key stages,
# 1.47x where 64-key ones gave 1.12x. cp.async at d = 256 keeps 96-key stages: with its
# 232-register consumers ptxas serializes the 128-key tile's WGMMAs (docs/design.md, "FP8
# attention")
FP8_TILE = {(128, "tma"): (192, 3), (128, "cp_async"): (192, 3),
            (256, "tma"): (128, 2), (256, "cp_async"): (96, 3)}
# where P V's wait goes late (PV_WAIT): only there it compiles without spills (the late wait
# keeps P_{j-1}'s registers alive across the next block's S) and it measured 4-8% faster
# (the early wait elsewhere: ties non-causal, and the late one spills 52-88 bytes)
FP8_PV_WAIT_LATE = {(128, "tma", True)}

FP8 = torch.float8_e4m3fn
OUT_DTYPES = (torch.bfloat16, torch.float16)
HEAD_DIMS = (64, 128, 256)


def attention_fp8(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
                  softmax_scale: float | None = None, q_descale=1.0, k_descale=1.0,
                  v_descale=1.0, out_dtype: torch.dtype = torch.bfloat16,
                  return_lse: bool = False, load: str = "tma", config=None):
    """FP8 attention forward. ``q`` (b, s_q, h, d), ``k`` and ``v`` (b, s_k, h_kv, d), all
    ``torch.float8_e4m3fn``, h % h_kv == 0, d in {64, 128, 256}; causal masks bottom-right
    aligned. Descales: per tensor, a positive finite Python number or a one-element tensor;
    or per (batch, K/V head), a (b, h_kv) float tensor on q's device, FlashAttention-3's
    convention (tensors are not read on the host, which would synchronize: their values are
    the caller's to keep positive and finite). Returns ``out`` (b, s_q, h, d) in
    ``out_dtype`` and, with ``return_lse``, the LSE (b, h, s_q) fp32 of the descaled scores.
    ``load``: "tma" or "cp_async" (the producer). ``config``: an ``AttentionConfig`` to run
    as it is (its head dim and causal flag must match, its key block whole 32-key steps; it
    overrides ``load``)."""
    from cutetma.kernels.attention import AttentionConfig

    for name, t in (("q", q), ("k", k), ("v", v)):
        check_operand(name, t, "attention_fp8", 4, "(batch, seqlen, heads, head_dim)",
                      dtypes=(FP8,))
    if not (q.device == k.device == v.device):
        raise ValueError("q, k and v must be on one device")
    if out_dtype not in OUT_DTYPES:
        raise TypeError(f"out_dtype={out_dtype}: one of {OUT_DTYPES}")
    b, s_q, h, d = q.shape
    if k.shape != v.shape or k.shape[0] != b or k.shape[3] != d:
        raise ValueError(f"k and v must be (b={b}, s_k, h_kv, d={d}) alike, got "
                         f"{tuple(k.shape)} and {tuple(v.shape)}")
    s_k, h_kv = k.shape[1], k.shape[2]
    if h_kv == 0 or h % h_kv:
        raise ValueError(f"{h} query heads are not a multiple of {h_kv} key/value heads")
    if d not in HEAD_DIMS:
        raise ValueError(f"head_dim {d}: supported are {HEAD_DIMS}")
    descale = descales(q_descale, k_descale, v_descale, b, h_kv, q.device)
    cfg = attention_config(config, AttentionConfig, d, causal, lambda: fp8_config(
        d, causal, gemm_tuning.check_load(load)))
    if cfg.block_n % 32:
        raise ValueError(f"config block_n={cfg.block_n}: e4m3 takes whole 32-key steps")
    out = torch.empty(b, s_q, h, d, device=q.device, dtype=out_dtype)
    lse = torch.empty(b, h, s_q, device=q.device, dtype=torch.float32)
    if q.numel() == 0 or s_k == 0:
        out.zero_()
        lse.fill_(float("-inf"))
        return (out, lse) if return_lse else out
    q, k, v = (x if tma_rows_aligned(x) else x.clone(memory_format=torch.contiguous_format)
               for x in (q, k, v))
    if cfg.transposes_v:  # V read as stored, transposed in shared memory
        v_in, v_strides = v, (v.stride(1), v.stride(2), v.stride(0))
    else:  # V^T (b, h_kv, d, keys padded), keys contiguous
        v_in = v_operand(v, cfg.block_n)
        v_strides = (v_in.stride(2), v_in.stride(1), v_in.stride(0))
    scale = softmax_scale if softmax_scale is not None else d ** -0.5
    strides = (*(q.stride(i) for i in (1, 2, 0)), *(k.stride(i) for i in (1, 2, 0)),
               *v_strides, *(out.stride(i) for i in (1, 2, 0)))
    launch = runtime.fp8_attention_launch(cfg, out_dtype)
    launch((q.data_ptr(), k.data_ptr(), v_in.data_ptr(), out.data_ptr(), lse.data_ptr(),
            descale.data_ptr(), b, s_q, s_k, h, h_kv, d, *strides, scale,
            runtime.sm_count(q.device.index), torch.cuda.current_stream(q.device).cuda_stream))
    return (out, lse) if return_lse else out


def fp8_config(head_dim: int, causal: bool = False, load: str = "tma", **fields):
    """The ``AttentionConfig`` FP8 attention runs by default (``FP8_TILE``, 1-byte
    stages), with any ``fields`` changed."""
    from cutetma.kernels.attention import AttentionConfig

    tile = {}
    # paged: the producer keeps page ids (40 registers), so the consumers have cp.async's
    # 232 and take its tiles (d = 256's 128-key one spills and serializes there)
    budget = "cp_async" if fields.get("page_size") else load
    if (head_dim, budget) in FP8_TILE:
        block_n, stages = FP8_TILE[head_dim, budget]
        late = (head_dim, load, causal) in FP8_PV_WAIT_LATE
        tile = {"block_n": block_n, "stages": stages, "pv_wait": "late" if late else "early"}
    return AttentionConfig(**{"head_dim": head_dim, "causal": causal, "load": load,
                              "element_bytes": 1, **tile, **fields})


def fp8_paged_load(page_size: int, head_dim: int, causal: bool) -> str:
    """``load="auto"`` for an e4m3 paged cache: TMA wherever its boxes fit the pages (a
    box of gcd(page_size, block_n) keys starts on a swizzle atom: a multiple of 8), cp.async
    otherwise; the 16-bit rule (``tuning.attention.paged_load``) at FP8's key block."""
    block_n = fp8_config(head_dim, causal, "tma").block_n
    return "tma" if math.gcd(page_size, block_n) % 8 == 0 else "cp_async"


def v_operand(v: torch.Tensor, block_n: int) -> torch.Tensor:
    """V (b, s_k, h_kv, d) e4m3 as the FP8 kernel reads it (V^T, keys in the key order,
    zero-padded to whole ``block_n`` blocks), by the ``VTranspose`` kernel on the GPU
    (``fp8_operands.transpose_v``, the same in torch, is its reference and the CPU path)."""
    from cutetma.kernels.attention.fp8_operands import transpose_v

    if not v.is_cuda:
        return transpose_v(v, block_n)
    if v.stride(3) != 1:
        v = v.contiguous()
    b, s_k, h_kv, d = v.shape
    padded = -(-s_k // block_n) * block_n
    vt = torch.empty(b, h_kv, d, padded, device=v.device, dtype=torch.uint8)
    launch = runtime.v_transpose_launch(d)
    launch((v.data_ptr(), vt.data_ptr(), b, s_k, h_kv, padded, v.stride(1), v.stride(2),
            v.stride(0), torch.cuda.current_stream(v.device).cuda_stream))
    return vt.view(v.dtype)


def descales(q_descale, k_descale, v_descale, b: int, h_kv: int,
             device: torch.device) -> torch.Tensor:
    """The kernel's descales: a (b, h_kv, 2) fp32 tensor on ``device``, per (batch, K/V
    head) the scores' factor (q x k) and the output's (v). Each input is a Python number
    (checked positive and finite), a one-element tensor or a (b, h_kv) tensor (checked for
    shape, dtype and device only: its values stay on the device, no synchronization)."""
    factors = [_descale(name, x, b, h_kv, device) for name, x in (
        ("q_descale", q_descale), ("k_descale", k_descale), ("v_descale", v_descale))]
    out = torch.empty(b, h_kv, 2, device=device, dtype=torch.float32)
    for slot, value in ((0, factors[0] * factors[1]), (1, factors[2])):
        if isinstance(value, torch.Tensor):
            out[..., slot].copy_(value)
        else:
            out[..., slot].fill_(value)
    return out


def _descale(name: str, x, b: int, h_kv: int, device: torch.device):
    """One descale input as a Python float (positive and finite) or an fp32 tensor that
    broadcasts to (b, h_kv) on ``device``; a clear error otherwise."""
    if isinstance(x, torch.Tensor):
        if x.numel() != 1 and tuple(x.shape) != (b, h_kv):
            raise ValueError(f"{name}: one value (per tensor) or one per (batch, K/V head), "
                             f"shape ({b}, {h_kv}); got {tuple(x.shape)}")
        if not x.is_floating_point() or x.dtype in (FP8, torch.float8_e5m2):
            raise TypeError(f"{name}: a float32 (or 16-bit float) tensor, got {x.dtype}")
        if x.device != device:
            raise ValueError(f"{name} is on {x.device}, q on {device}")
        return x.reshape(()) if x.numel() == 1 else x.float()
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or x <= 0:
        raise ValueError(f"{name}={x!r}: a positive finite number (or a tensor)")
    return float(x)
