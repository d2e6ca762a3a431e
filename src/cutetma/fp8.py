"""The torch face of the FP8 GEMM: ``scaled_gemm`` (validate -> plan -> launch).

It follows ``torch._scaled_mm``'s conventions: ``a`` (M, K) row-major and ``b`` (K, N)
column-major, both ``torch.float8_e4m3fn`` (WGMMA reads 8-bit operands K-major only, so
``b.t()`` must be K-major), fp32 scales on the device: one value each (per tensor),
``scale_a`` (M, 1) and ``scale_b`` (1, N) (row-wise), or ``scale_a`` (M, ceil(K / 128)) and
``scale_b`` (ceil(N / 128), ceil(K / 128)) (blockwise, DeepSeek-V3's recipe: one scale per
128 values of an activation row, one per 128 x 128 block of weights; ``scale_a`` row- or
M-major, the latter torch's layout and used in place, a row-major one copied per call to the
M-major form the stages load); C = (scale_a scale_b) (a @ b) in ``out_dtype``::

    torch._scaled_mm(a, b, scale_a, scale_b, out_dtype=torch.bfloat16)
    cutetma.scaled_gemm(a, b, scale_a, scale_b, out_dtype=torch.bfloat16)

The kernel is the GEMM family's (``HopperGemm``) with 8-bit operands (a k-tile is still one
128-byte swizzle span: 128 elements, ``GemmConfig.tile_k``) and the scales applied to the
fp32 accumulator before C's conversion (``GemmConfig.scaling``; blockwise: each k-tile's
product promoted into the accumulator with its own scales). The tile comes from the 16-bit
model (``tuning.select_gemm_config``); promoted tiles (blockwise, an fp32 C) are at most 128
wide (the accumulator and a k-tile's fragment in registers; blockwise also a tile within one
128-column block of B's scales), and 256 tall (fp32 C, blockwise) where the model chose
128 x 256 (two 64-row waves a warpgroup through one fragment). Blockwise stages carry the
k-tile's scale_a of the tile's rows beside A and B (a TMA box of the M-major copy).
Row-wise tiles take any width: the tile's column scales pass through shared memory, not
registers.
"""

from __future__ import annotations

import dataclasses

import torch

from cutetma import runtime
from cutetma.kernels.gemm_config import GemmConfig
from cutetma.ops import (
    GEMM_OUT_DTYPES,
    _check_deterministic,
    _current_stream,
    _default_config,
    _gemm_workspace,
    plan_key,
)
from cutetma.tuning import gemm as tuning
from cutetma.tuning.gemm import fp8_config  # the FP8 configuration rules (runtime.warm's too)

FP8 = torch.float8_e4m3fn


def scaled_gemm(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor,
                scale_b: torch.Tensor, *, out_dtype: torch.dtype = torch.bfloat16,
                load: str = "tma", config: GemmConfig | None = None) -> torch.Tensor:
    """C = scale_a scale_b (a @ b): ``a`` (M, K), ``b`` (K, N) column-major (``b.t()``
    contiguous), both e4m3; ``scale_a``, ``scale_b`` fp32 with one element each, or (M, 1)
    and (1, N); C (M, N) ``out_dtype`` (bf16, fp16 or fp32). ``load``: "tma" or "cp_async"
    (the same kernel, producer swapped). ``config``: a ``GemmConfig`` with ``tile_k=128``
    (its ``scaling`` is set from the scales). Runs on the current CUDA stream; inside
    ``torch.compile`` the call is the custom op ``torch.ops.cutetma.scaled_gemm`` (no
    ``config`` there)."""
    if torch.compiler.is_compiling():
        if config is not None:
            raise ValueError("inside torch.compile, cutetma.scaled_gemm takes a, b, the "
                             "scales, out_dtype and load (the custom op's schema)")
        return torch.ops.cutetma.scaled_gemm(a, b, scale_a, scale_b, out_dtype, load)
    key = plan_key(a, b, scale_a, scale_b, out_dtype, load, config,
                   torch.are_deterministic_algorithms_enabled())
    plan = _PLANS.get(key) if key is not None else None
    if plan is None:
        plan = _plan(a, b, scale_a, scale_b, out_dtype, load, config)
        if key is not None:
            _PLANS[key] = plan
    return plan(a, b, scale_a, scale_b)


_PLANS: dict = {}


@dataclasses.dataclass
class _ScaledPlan:
    m: int
    n: int
    out_dtype: torch.dtype
    device: torch.device
    launch: object = None  # None: nothing to launch (an empty output, or K = 0)
    cfg: GemmConfig | None = None
    clusters: int = 0
    workspace: tuple | None = None  # None: per call (split-K's belongs to the stream)
    scale_a_in_place: bool = False  # blockwise: scale_a already as the stages load it

    def __call__(self, a, b, scale_a, scale_b):
        per = 16 // self.out_dtype.itemsize  # C's rows padded to 16 bytes (a TMA store)
        padded = -(-self.n // per) * per
        out = torch.empty(self.m, padded, dtype=self.out_dtype, device=self.device)
        out = out[:, :self.n] if padded != self.n else out
        if self.launch is None:
            return out.zero_()
        b_nk = b.t()
        if self.cfg.scaling == "block" and not self.scale_a_in_place:
            # the stages load scale_a's column of the tile's rows (a TMA box, 16-byte
            # cp.async): an M-major copy, columns padded to 16 bytes
            scale_a = torch.nn.functional.pad(scale_a.t(), (0, -self.m % 4)).contiguous()
        workspace = self.workspace
        if workspace is None:
            workspace = _gemm_workspace(self.cfg, self.m, self.n, self.device, self.clusters)
        self.launch((a.data_ptr(), b_nk.data_ptr(), out.data_ptr(), scale_a.data_ptr(),
                     scale_b.data_ptr(), self.m, self.n, a.shape[1], b_nk.shape[1],
                     a.stride(0), b_nk.stride(0), out.stride(0),
                     _current_stream(self.device)), workspace)
        return out


def scaling_mode(scale_a: torch.Tensor, scale_b: torch.Tensor, m: int, n: int,
                 k: int) -> str:
    """"tensor" (one fp32 value each), "row" ((M, 1) and (1, N)) or "block" ((M, K / 128)
    and (N / 128, K / 128), rounded up); anything else raises."""
    for name, s in (("scale_a", scale_a), ("scale_b", scale_b)):
        if not isinstance(s, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(s).__name__}")
        if s.dtype != torch.float32:
            raise TypeError(f"{name} has dtype {s.dtype}: the scales are float32")
    if scale_a.numel() == 1 and scale_b.numel() == 1:
        return "tensor"
    contiguous = scale_a.is_contiguous() and scale_b.is_contiguous()
    if tuple(scale_a.shape) == (m, 1) and tuple(scale_b.shape) == (1, n) and contiguous:
        return "row"
    kb, nb = -(-k // 128), -(-n // 128)
    # blockwise scale_a: row-major, or M-major as torch._scaled_mm takes it (stride (1, >= M))
    a_layout_ok = scale_a.is_contiguous() or (scale_a.stride(0) == 1 and scale_a.stride(1) >= m)
    if (tuple(scale_a.shape) == (m, kb) and tuple(scale_b.shape) == (nb, kb) and a_layout_ok
            and scale_b.is_contiguous()):
        return "block"
    raise ValueError(f"scales {tuple(scale_a.shape)} and {tuple(scale_b.shape)}: one value "
                     f"each (per tensor), contiguous ({m}, 1) and (1, {n}) (row-wise), or "
                     f"({m}, {kb}) row- or M-major and contiguous ({nb}, {kb}) (blockwise, "
                     "128 of K and N)")


def _scale_a_in_place(scale_a: torch.Tensor, m: int) -> bool:
    """Whether the kernel's stages can load a blockwise scale_a as it is: M-major and packed
    (stride (1, M)), M a multiple of 4 (the cp.async twin reads 16-byte vectors, which then
    stay inside the tensor), on a 16-byte base."""
    return (scale_a.stride(0) == 1 and m % 4 == 0
            and (scale_a.shape[1] == 1 or scale_a.stride(1) == m)
            and scale_a.data_ptr() % 16 == 0)


def _plan(a, b, scale_a, scale_b, out_dtype, load, config) -> _ScaledPlan:
    for name, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype != FP8:
            other = " (mixed FP8 formats are not supported)" if t.dtype.itemsize == 1 else ""
            raise TypeError(f"{name} has dtype {t.dtype}: scaled_gemm takes "
                            f"torch.float8_e4m3fn{other}")
        if t.dim() != 2:
            raise ValueError(f"{name} must be 2D, got shape {tuple(t.shape)}")
    (m, k), (k_b, n) = a.shape, b.shape
    if k != k_b:
        raise ValueError(f"inner dimensions differ: a (M, K) = {tuple(a.shape)}, b (K, N) = "
                         f"{tuple(b.shape)}")
    if out_dtype not in GEMM_OUT_DTYPES:
        raise TypeError(f"out_dtype {out_dtype}: bfloat16, float16 or float32")
    mode = scaling_mode(scale_a, scale_b, m, n, k)
    if a.stride(1) != 1:
        raise ValueError(f"a must be row-major (M, K) (strides {a.stride()}): WGMMA reads "
                         "8-bit operands K-major only")
    if b.stride(0) != 1:
        raise ValueError(f"b must be column-major (K, N), b.t() contiguous (strides "
                         f"{b.stride()}), as torch._scaled_mm takes it: WGMMA reads 8-bit "
                         "operands K-major only")
    for name, t, rows in (("a", a, a.stride(0)), ("b", b, b.stride(1))):
        if rows % 16 or t.data_ptr() % 16:
            raise ValueError(f"{name}: its K rows must start on 16 bytes (K a multiple of "
                             f"16, row stride {rows}, base at {t.data_ptr() % 16} mod 16) "
                             "for TMA")
    for name, t in (("a", a), ("b", b), ("scale_a", scale_a), ("scale_b", scale_b)):
        if t.device.type != "cuda":
            raise ValueError(f"{name} is on {t.device}: scaled_gemm needs CUDA tensors")
        if t.device != a.device:
            raise ValueError(f"{name} is on {t.device}, a on {a.device}: one device")
    if config is not None and not isinstance(config, GemmConfig):
        raise TypeError(f"config must be a GemmConfig, got {type(config).__name__}")
    tuning.check_load(load)
    plan = _ScaledPlan(m, n, out_dtype, a.device)
    if m == 0 or n == 0 or k == 0:
        return plan
    device_index = a.device.index or 0
    cfg = config or _default_config(m, n, k, load, runtime.sm_count(device_index), True,
                                    tuning.deterministic_mode())
    cfg = fp8_config(cfg, mode, out_dtype)
    _check_deterministic(cfg)
    plan.cfg = cfg
    plan.scale_a_in_place = mode == "block" and _scale_a_in_place(scale_a, m)
    plan.clusters = runtime.max_active_clusters(cfg.cluster_m * cfg.cluster_n, a.device.index)
    workspace = _gemm_workspace(cfg, m, n, a.device, plan.clusters)
    if cfg.split_k == 1 and not cfg.stream_k:
        plan.workspace = workspace
    plan.launch = runtime.scaled_gemm_launch(out_dtype, cfg, plan.clusters, workspace)
    return plan


def clear_plans() -> None:
    _PLANS.clear()


@torch.library.custom_op("cutetma::scaled_gemm", mutates_args=())
def _scaled_gemm_op(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor,
                    scale_b: torch.Tensor, out_dtype: torch.dtype = torch.bfloat16,
                    load: str = "tma") -> torch.Tensor:
    """``torch.ops.cutetma.scaled_gemm(a, b, scale_a, scale_b, out_dtype, load)``."""
    return scaled_gemm(a, b, scale_a, scale_b, out_dtype=out_dtype, load=load).contiguous()


@_scaled_gemm_op.register_fake
def _(a, b, scale_a, scale_b, out_dtype=torch.bfloat16, load="tma"):
    return a.new_empty((a.shape[0], b.shape[1]), dtype=out_dtype)
