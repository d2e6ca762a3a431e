"""The torch face: validate on the host, select a configuration, launch on the current
CUDA stream. Nothing here chooses tiles (``cutetma.tuning``) or compiles and launches by
itself (``cutetma.runtime``)::

    gemm(a, b)                     validate -> tuning.select_gemm_config -> runtime placement
                                   (tile order) -> runtime.gemm_launch
    attention(q, k, v)             validate -> AttentionConfig -> runtime.attention_launch
    smem_image(x, box)             the raw shared-memory bytes a TMA / cp.async load writes
    tma_round_trip(x, box)         a copy of x through shared memory, by TMA

Every rule TMA and the kernels rely on (device, rank, dtype, a contiguous inner dimension,
16-byte aligned base and strides, sizes below 2^31, head dim) is checked before anything is
compiled or launched; the error names the rule and the numbers. Compiled kernels are kept per
configuration; shapes are runtime values, so a new shape does not recompile.
"""

from __future__ import annotations

import dataclasses
import functools

import torch

from cutetma import dsl, runtime
from cutetma import swizzle as hw
from cutetma.checks import (
    attention_config,
    check_operand,
    refuse_nondeterministic,
    tma_rows_aligned,
)
from cutetma.kernels.gemm_config import GemmConfig
from cutetma.runtime import placement
from cutetma.tuning import gemm as tuning

dsl.cutlass()  # the DSL loads with the torch face, not inside a first call

_SUPPORTED = {
    torch.uint8, torch.int8, torch.float16, torch.bfloat16, torch.float32, torch.int32,
    getattr(torch, "float8_e4m3fn", torch.uint8), getattr(torch, "float8_e5m2", torch.uint8),
}
PROBE_LOADS = ("tma", "cp_async", "dsm")


def _check_tensor(x, name: str = "x") -> int:
    """The tensor rules shared by every TMA entry point; returns the element width."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.device.type != "cuda":
        raise ValueError(f"{name} is on {x.device}: TMA kernels need a CUDA tensor")
    if x.dtype not in _SUPPORTED:
        raise TypeError(f"{name} has dtype {x.dtype}: supported are 1-, 2- and 4-byte types "
                        f"({', '.join(sorted(str(d) for d in _SUPPORTED))})")
    if x.dim() != 2:
        raise ValueError(f"{name} must be 2D (rows, cols), got shape {tuple(x.shape)}")
    w = x.element_size()
    if x.stride(1) != 1:
        raise ValueError(f"{name} must be contiguous in its last dimension (stride {x.stride(1)})"
                         f"; call .contiguous()")
    hw.check_box((1, 16 // w), w, "none", global_strides_bytes=(x.stride(0) * w,),
                 global_base=x.data_ptr())
    return w


# =========================================================================== probes
def smem_image(x: torch.Tensor, box, *, swizzle: str = "128B", load: str = "tma",
               tile=(0, 0), grouped: bool = False, cluster: int = 1,
               row_offset: int = 0) -> torch.Tensor:
    """The raw shared-memory bytes after loading box ``tile`` of ``x`` (uint8, one row per CTA
    of the cluster when ``cluster`` > 1, else a 1D tensor).

    ``box`` is (rows, cols) in elements; with ``grouped`` cols spans several swizzle-span
    groups loaded as one 3D box. ``tile`` counts boxes. ``load``: ``"tma"`` (with
    ``cluster`` > 1: each CTA issues its 1/N slice, multicast to all), ``"cp_async"``, or
    ``"dsm"`` (``cluster`` > 1: the leader loads by TMA, the others copy from its shared
    memory). TMA zero-fills what lies outside ``x``; cp.async and DSM take boxes inside ``x``
    only. ``row_offset`` (one TMA): the box lands that many rows into a larger buffer, as a
    paged K/V stage's later boxes do; the image is the whole buffer.
    """
    from cutetma.kernels.tile_copy import ProbeConfig, SmemProbe

    w = _check_tensor(x)
    if load not in PROBE_LOADS:
        raise ValueError(f"load={load!r}: one of {PROBE_LOADS} (multicast: load='tma', "
                         "cluster=N)")
    if load == "dsm" and cluster == 1:
        cluster = 2
    mechanism = "tma_multicast" if load == "tma" and cluster > 1 else load
    rows, cols = (int(b) for b in box)
    cfg = ProbeConfig(x.element_size(), swizzle, rows, cols, grouped, mechanism, cluster,
                      row_offset)
    tr, tc = (int(t) for t in tile)
    r0, c0 = tr * cfg.rows, tc * cfg.cols
    if tr < 0 or tc < 0 or r0 >= x.shape[0] or c0 >= x.shape[1]:
        raise ValueError(f"tile {tuple(tile)} of box {cfg.rows}x{cfg.cols} starts at "
                         f"({r0}, {c0}), outside the {tuple(x.shape)} tensor")
    inside = r0 + cfg.rows <= x.shape[0] and c0 + cfg.cols <= x.shape[1]
    if cfg.load == "cp_async" and not inside:
        raise ValueError(f"cp.async has no zero fill here: box rows {r0}..{r0 + cfg.rows} x "
                         f"cols {c0}..{c0 + cfg.cols} must lie inside {tuple(x.shape)}")
    if cfg.load == "cp_async":
        hw.check_box((1, 16 // w), w, "none", global_base=x[r0:, c0:].data_ptr())

    out = torch.full((cfg.cluster, cfg.smem_bytes), 0x5A, dtype=torch.uint8, device=x.device)
    args = (runtime.cute_tensor(x), runtime.cute_tensor(out), tr, tc, runtime.stream())
    runtime.compiled(("probe", cfg), lambda: SmemProbe(cfg), *args)(*args)
    return out if cfg.cluster > 1 else out[0]


def tma_round_trip(x: torch.Tensor, box=(64, 64), *, swizzle: str = "128B") -> torch.Tensor:
    """Copy ``x`` through shared memory, one box per CTA: TMA load, then TMA store."""
    from cutetma.kernels.tile_copy import TmaRoundTrip

    w = _check_tensor(x)
    rows, cols = (int(b) for b in box)
    hw.check_box((rows, cols), w, swizzle)
    dst = torch.empty_like(x)
    dst.view(torch.uint8).fill_(0xA5)  # poison: an unwritten element cannot pass
    args = (runtime.cute_tensor(x), runtime.cute_tensor(dst), runtime.stream())
    key = ("round_trip", w, hw.mode(swizzle).name, rows, cols)
    runtime.compiled(key, lambda: TmaRoundTrip(w, swizzle, rows, cols), *args)(*args)
    return dst


# =========================================================================== GEMM
GEMM_DTYPES = (torch.float16, torch.bfloat16)
GEMM_OUT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_ALIGN_ELEMS = 8  # 16 bytes of fp16 / bf16


def _aligned_operand(x: torch.Tensor, name: str, allow_copy: bool) -> torch.Tensor:
    """``x`` (rows, k) as TMA needs it: one unit-stride dimension, the other stride and the
    base 16-byte aligned. A contiguous-but-misaligned operand (k % 8 != 0, an offset view) is
    copied into a zero-padded aligned buffer when ``allow_copy``, else refused."""
    if x.stride(1) == 1 and x.shape[1] > 0:
        lead = 0
    elif x.stride(0) == 1 and x.shape[0] > 0:
        lead = 1
    else:
        raise ValueError(f"{name}: one dimension must have stride 1 (strides {tuple(x.stride())}"
                         f"); call .contiguous()")
    outer_stride = x.stride(lead) * x.element_size()
    if outer_stride % 16 == 0 and x.data_ptr() % 16 == 0:
        return x
    if not allow_copy:
        hw.check_box((1, 8), 2, "none", global_strides_bytes=(outer_stride,),
                     global_base=x.data_ptr())
    return _padded(x)


@functools.lru_cache(maxsize=4096)
def _default_config(m: int, n: int, k: int, load: str, sm_count: int, b_k_major: bool,
                    deterministic: bool) -> GemmConfig:
    """``select_gemm_config`` remembered per problem: the model costs tens of microseconds
    of Python, more than some of the kernels it chooses for, and a model's layers call one
    shape over and over. ``deterministic`` (torch's mode, which picks the split sum) is only
    part of the key."""
    del deterministic
    return tuning.select_gemm_config(m, n, k, load=load, sm_count=sm_count,
                                     b_k_major=b_k_major)


def _check_deterministic(cfg: GemmConfig) -> None:
    """Refuse (or, in torch's warn-only mode, warn about) split-K's atomic sum under
    ``torch.use_deterministic_algorithms(True)``: its last bits depend on arrival order."""
    if cfg.split_k > 1 and cfg.split_sum == "atomic" and tuning.deterministic_mode():
        refuse_nondeterministic(
            "cutetma.gemm with split_sum='atomic' adds split-K's slices in the order they "
            "arrive, which is not deterministic, but torch.use_deterministic_algorithms(True) "
            "is set: use split_sum='ordered' (the same bits every launch)", stacklevel=4)


@functools.lru_cache(maxsize=1024)
def _with_pdl(cfg: GemmConfig) -> GemmConfig:
    """``cfg`` with ``pdl`` on, made once per configuration (``dataclasses.replace`` re-runs
    the config's checks)."""
    return dataclasses.replace(cfg, pdl=True)


def gemm(a: torch.Tensor, b: torch.Tensor, *, out: torch.Tensor | None = None,
         out_dtype: torch.dtype | None = None, trans_b: bool = True, load: str = "tma",
         config: GemmConfig | None = None, pdl: bool = False,
         allow_copy: bool = True) -> torch.Tensor:
    """``C = A @ B^T`` on Hopper (``trans_b=False``: ``C = A @ B``, torch.matmul's layout).

    ``a`` (M, K); ``b`` (N, K), or (K, N) with ``trans_b=False``; fp16 or bf16, fp32
    accumulation, output ``out_dtype`` (default: the input dtype) or into ``out`` (M, N,
    row-major). Runs on the current CUDA stream.

    ``load``: ``"tma"`` or ``"cp_async"``, the same kernel with its producer swapped (the
    seed paper's forced cp.async variant). The tile, K split, cluster multicast and schedule
    come from a model measured on the H200 (``cutetma.tuning.select_gemm_config``), and the
    tiles' order from where this card puts the grid's CTAs (the first call on a device runs
    a few probe kernels; ``CUTETMA_PLACEMENT=0`` keeps the scheduler's default order).
    ``config``: a ``GemmConfig`` to run instead of the model's choice, e.g.
    ``select_gemm_config(m, n, k, tile=(128, 128), cluster=(2, 1))``; it overrides ``load``
    (its tile order is still placed for the card, as above). ``pdl``: programmatic
    dependent launch, so a chain of GEMMs overlaps each launch and prologue with the previous
    kernel's tail. Operands whose strides or base break TMA's 16-byte rule are copied into
    an aligned buffer (``allow_copy=False`` refuses them instead). Under
    ``torch.use_deterministic_algorithms(True)`` every K split is summed in a fixed order.
    Inside ``torch.compile`` the call is the custom op ``torch.ops.cutetma.gemm`` (no
    ``out``, ``config`` or ``pdl`` there).

    Every call is a plan (the checks' verdicts, the configuration, the compiled launch)
    remembered per problem: shapes, strides, dtypes, device, options, 16-byte alignment and
    torch's deterministic mode. A call that finds its plan skips the checks and the choice.
    """
    if torch.compiler.is_compiling():
        if out is not None or config is not None or pdl:
            raise ValueError("inside torch.compile, cutetma.gemm takes a, b, trans_b, load "
                             "and out_dtype (the custom op's schema)")
        return torch.ops.cutetma.gemm(a, b, trans_b, load, out_dtype)
    b_nk = b if trans_b else b.T
    try:
        key = (a.shape, b_nk.shape, a.stride(), b_nk.stride(), a.dtype, b.dtype, a.device,
               b.device, a.data_ptr() % 16, b.data_ptr() % 16, out_dtype, load, config, pdl,
               allow_copy, None if out is None else (out.shape, out.stride(), out.dtype,
                                                     out.device, out.data_ptr() % 16),
               torch.are_deterministic_algorithms_enabled(),
               torch.is_deterministic_algorithms_warn_only_enabled())
        hash(key)
    except (AttributeError, TypeError):  # not tensors, or an option that cannot key a plan
        key = None
    plan = _GEMM_PLANS.get(key) if key is not None else None
    if plan is None:
        plan = _gemm_plan(a, b, b_nk, out, out_dtype, trans_b, load, config, pdl, allow_copy)
        if key is not None and plan.reusable:
            _GEMM_PLANS[key] = plan
    return plan(a, b_nk, out)


_GEMM_PLANS: dict = {}


def plan_counts() -> dict:
    """How many per-problem plans this process keeps: ``{"gemm": n, "attention": n}``."""
    return {"gemm": len(_GEMM_PLANS), "attention": len(_ATTENTION_PLANS)}


def clear_plans() -> None:
    """Forget every plan (the compiled kernels stay): the next calls check and choose again."""
    _GEMM_PLANS.clear()
    _ATTENTION_PLANS.clear()


@dataclasses.dataclass
class _GemmPlan:
    """What one GEMM problem needs at launch, decided once: sizes, the output's dtype, the
    configuration and its compiled launch, which operands need an aligned copy."""

    m: int
    n: int
    k: int
    out_dtype: torch.dtype
    device: torch.device
    cfg: GemmConfig | None = None  # None: nothing to launch (an empty output or K = 0)
    launch: object = None
    clusters: int = 0
    b_k_major: bool = True
    copy_a: bool = False
    copy_b: bool = False
    workspace: tuple | None = None  # None: per call (split-K's belongs to the stream)
    reusable: bool = True  # False when chosen during a CUDA-graph capture (unplaced)

    n_padded: int = 0  # the output's row length in memory: N rounded up to 16 bytes

    def __post_init__(self):
        per = 16 // self.out_dtype.itemsize
        self.n_padded = -(-self.n // per) * per

    def __call__(self, a, b_nk, out):
        result = out
        if result is None:  # pad the row so its stride is 16-byte aligned; return the view
            result = torch.empty(self.m, self.n_padded, dtype=self.out_dtype,
                                 device=self.device)
            if self.n_padded != self.n:
                result = result[:, :self.n]
        if self.cfg is None:
            return result if self.k else result.zero_()
        a_ok = _padded(a) if self.copy_a else a
        b_ok = _padded(b_nk) if self.copy_b else b_nk
        workspace = self.workspace
        if workspace is None:
            workspace = _gemm_workspace(self.cfg, self.m, self.n, self.device, self.clusters)
        self.launch((a_ok.data_ptr(), b_ok.data_ptr(), result.data_ptr(), self.m, self.n,
                     a_ok.shape[1], b_ok.shape[1], a_ok.stride(0),
                     b_ok.stride(0 if self.b_k_major else 1), result.stride(0),
                     _current_stream(self.device)), workspace)
        return result


def plan_key(*args):
    """A hashable key of a call's arguments for a per-problem plan cache: each tensor by its
    shape, strides, dtype, device and base address mod 16 (its 16-byte alignment), every
    other argument as it is; None where an argument cannot key a plan."""
    try:
        key = tuple((x.shape, x.stride(), x.dtype, x.device, x.data_ptr() % 16)
                    if isinstance(x, torch.Tensor) else x for x in args)
        hash(key)
        return key
    except (AttributeError, TypeError):
        return None


def _current_stream(device: torch.device) -> int:
    """The raw handle of ``device``'s current stream (torch's C entry where it has one:
    a tenth of ``torch.cuda.current_stream``'s cost)."""
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return raw(device.index if device.index is not None else torch.cuda.current_device())
    return torch.cuda.current_stream(device).cuda_stream


def _gemm_plan(a, b, b_nk, out, out_dtype, trans_b, load, config, pdl, allow_copy):
    """Check a GEMM call and decide everything its launch needs (``_GemmPlan``)."""
    for name, t in (("a", a), ("b", b)):
        check_operand(name, t, "gemm", 2)
    if a.dtype != b.dtype:
        raise TypeError(f"a is {a.dtype} but b is {b.dtype}: both must have one dtype")
    if a.device != b.device:
        raise ValueError(f"a is on {a.device} but b on {b.device}")
    if config is not None and not isinstance(config, GemmConfig):
        raise TypeError(f"config must be a GemmConfig, got {type(config).__name__}")
    tuning.check_load(load)
    (m, k), (n, k_b) = a.shape, b_nk.shape
    if k != k_b:
        shape_b = "(N, K)" if trans_b else "(K, N)"
        raise ValueError(f"inner dimensions differ: a is (M, K) = {tuple(a.shape)}, b {shape_b} "
                         f"= {tuple(b.shape)}")
    if max(m, n, k) >= 2**31:  # the kernel takes sizes as Int32
        raise ValueError(f"gemm sizes must be below 2**31, got M, N, K = {m}, {n}, {k}")
    out_dtype = out.dtype if out is not None else (out_dtype or a.dtype)
    if out_dtype not in GEMM_OUT_DTYPES:
        raise TypeError(f"out dtype {out_dtype}: float16, bfloat16 or float32")
    if out is not None:
        if out.shape != (m, n) or out.device != a.device:
            raise ValueError(f"out must be ({m}, {n}) on {a.device}, got {tuple(out.shape)} "
                             f"on {out.device}")
        if out.stride(1) != 1:
            raise ValueError(f"out must be row-major (stride {tuple(out.stride())})")
        hw.check_box((1, 16 // out.element_size()), out.element_size(), "none",
                     global_strides_bytes=(out.stride(0) * out.element_size(),),
                     global_base=out.data_ptr())
    plan = _GemmPlan(m, n, k, out_dtype, a.device)
    if m == 0 or n == 0 or k == 0:
        return plan
    plan.copy_a = _aligned_operand(a, "a", allow_copy) is not a
    b_ok = _aligned_operand(b_nk, "b", allow_copy)
    plan.copy_b = b_ok is not b_nk
    if a.stride(1) != 1 and not plan.copy_a:
        raise ValueError("a must be K-major (row-major (M, K)): an M-major A is not supported")
    plan.b_k_major = b_ok.stride(1) == 1
    device_index = a.device.index or 0
    cfg = config or _default_config(m, n, k, load, runtime.sm_count(device_index),
                                    plan.b_k_major, tuning.deterministic_mode())
    _check_deterministic(cfg)
    tuning.check_tile_for_b(cfg, plan.b_k_major)
    if pdl and not cfg.pdl:
        cfg = _with_pdl(cfg)
    plan.clusters = runtime.max_active_clusters(cfg.cluster_m * cfg.cluster_n, a.device.index)
    # the tile order for where this card puts the grid's CTAs (an explicit config's too:
    # the order moves tiles between CTAs, never results; runtime.placement.switched_off()
    # keeps a config's own raster order). During a CUDA-graph capture an unplaced shape
    # keeps the scheduler's order (placing launches a probe); its plan is not kept.
    plan.reusable = not torch.cuda.is_current_stream_capturing()
    plan.cfg = placement.ordered(cfg, m, n, k, device_index, plan.clusters)
    workspace = _gemm_workspace(plan.cfg, m, n, a.device, plan.clusters)
    if plan.cfg.split_k == 1 and not plan.cfg.stream_k:
        plan.workspace = workspace  # the order table, or nothing: the same on every stream
    plan.launch = runtime.gemm_launch(a.dtype, out_dtype, plan.b_k_major, plan.cfg,
                                      plan.clusters, workspace)
    return plan


def _padded(x: torch.Tensor) -> torch.Tensor:
    """``x`` (rows, k) copied into a zero-padded buffer whose rows are 16-byte aligned."""
    rows, k = x.shape
    padded = torch.zeros(rows, -(-k // _ALIGN_ELEMS) * _ALIGN_ELEMS, dtype=x.dtype,
                         device=x.device)
    padded[:, :k] = x
    return padded


def _gemm_workspace(cfg: GemmConfig, m: int, n: int, device, clusters: int) -> tuple:
    """The DSL tensors a configuration's kernel takes besides A, B and C: split-K's slots and
    tickets, stream-K's slots and flags, or the order table (none otherwise)."""
    tile_elems = cfg.tile_m * cfg.tile_n
    if cfg.stream_k:  # a slot and a ready flag per CTA
        return runtime.split_workspace(device, clusters, tile_elems, clusters)
    if cfg.split_k > 1:  # a slot per (tile, slice), a ticket counter per tile
        tiles = -(-m // cfg.tile_m) * -(-n // cfg.tile_n)
        tuning.check_split_workspace(m, n, cfg,
                                     torch.cuda.get_device_properties(device).total_memory)
        if cfg.split_sum == "atomic":  # one slot per tile, kept at zero between launches
            return runtime.split_workspace(device, tiles, tile_elems, tiles, zeroed=True)
        return runtime.split_workspace(device, tiles * cfg.split_k, tile_elems, tiles)
    if cfg.order_table:  # the tiles' order as a table
        return (None, None, placement.order_table(cfg, m, n, device.index or 0, clusters))
    return ()


@torch.library.custom_op("cutetma::gemm", mutates_args=())
def _gemm_op(a: torch.Tensor, b: torch.Tensor, trans_b: bool = True, load: str = "tma",
             out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """``torch.ops.cutetma.gemm(a, b, trans_b=True, load="tma", out_dtype=None)``."""
    return gemm(a, b, trans_b=trans_b, load=load, out_dtype=out_dtype).contiguous()


@_gemm_op.register_fake
def _(a, b, trans_b=True, load="tma", out_dtype=None):
    n = b.shape[0] if trans_b else b.shape[1]
    return a.new_empty((a.shape[0], n), dtype=out_dtype or a.dtype)


# =========================================================================== attention
ATTENTION_HEAD_DIMS = (64, 128, 256)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
              softmax_scale: float | None = None, return_lse: bool = False,
              load: str = "tma", config=None):
    """FlashAttention-style forward: ``softmax(q k^T * scale) v`` (and the log-sum-exp).

    ``q`` (b, s_q, h, d), ``k`` and ``v`` (b, s_k, h_kv, d) with h % h_kv == 0, fp16 or bf16,
    d in {64, 128, 256}; causal masks are bottom-right aligned when s_q != s_k (FlashAttention's
    convention, not torch SDPA's). Returns ``out`` (b, s_q, h, d), and ``lse`` (b, h, s_q)
    fp32 with ``return_lse``. Runs on the current CUDA stream. ``load="cp_async"`` runs the
    same kernel with its producer swapped (the paper's forced cp.async variant). ``config``:
    an ``AttentionConfig`` to run as it is (its head dim and causal flag must match; it
    overrides ``load``). Inputs whose head dim is not contiguous, or whose base or strides
    break TMA's 16-byte rule, are copied into a fresh contiguous tensor first (views of a
    packed qkv tensor are fine as they are). Inside ``torch.compile`` the call is the custom
    op ``torch.ops.cutetma.attention`` (no ``config`` there). Like ``gemm``, every call is a
    plan remembered per problem (shapes, strides, dtype, device, options, alignment).
    Differentiable: with inputs that require grad (grad mode on), the call is the custom op,
    whose autograd formula runs ``cutetma.backward.attention_backward`` (d 64, 128 or 256).
    """
    grad = torch.is_grad_enabled() and any(
        isinstance(x, torch.Tensor) and x.requires_grad for x in (q, k, v))
    if torch.compiler.is_compiling() or grad:
        if config is not None:
            raise ValueError("inside torch.compile, or with inputs that require grad, "
                             "cutetma.attention takes no config")
        out, lse = torch.ops.cutetma.attention(q, k, v, causal, softmax_scale, load)
        return (out, lse) if return_lse else out
    out, lse = _attention_forward(q, k, v, causal, softmax_scale, load, config)
    return (out, lse) if return_lse else out


def _attention_forward(q, k, v, causal, softmax_scale, load, config) -> tuple:
    """``attention``'s eager path: the plan of this problem, run; (out, lse)."""
    try:
        key = (q.shape, k.shape, v.shape, q.stride(), k.stride(), v.stride(), q.dtype, k.dtype,
               v.dtype, q.device, k.device, v.device, q.data_ptr() % 16, k.data_ptr() % 16,
               v.data_ptr() % 16, causal, softmax_scale, load, config)
        hash(key)
    except (AttributeError, TypeError):
        key = None
    plan = _ATTENTION_PLANS.get(key) if key is not None else None
    if plan is None:
        plan = _attention_plan(q, k, v, causal, softmax_scale, load, config)
        if key is not None:
            _ATTENTION_PLANS[key] = plan
    return plan(q, k, v)


_ATTENTION_PLANS: dict = {}


@dataclasses.dataclass
class _AttentionPlan:
    """One attention problem's launch, decided once: the configuration and its compiled
    launch, which inputs need a fresh copy, and every scalar the kernel takes but the
    pointers and the stream (sizes, the (seq, head, batch) strides of Q, K, V, O, the
    scale, the persistent grid's size)."""

    launch: object = None  # None: nothing to compute (an empty problem, or no keys)
    copies: tuple = (False, False, False)
    scalars: tuple = ()

    def __call__(self, q, k, v):
        if True in self.copies:
            # a fresh copy, not .contiguous(): that returns a misaligned base, or a size-1
            # dim's odd stride, unchanged whenever torch already calls the tensor contiguous
            q, k, v = (x.clone(memory_format=torch.contiguous_format) if copy else x
                       for x, copy in zip((q, k, v), self.copies, strict=True))
        out, lse = attention_outputs(q, empty=self.launch is None)
        if self.launch is None:
            return out, lse
        self.launch((q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(),
                     lse.data_ptr()) + self.scalars + (_current_stream(q.device),))
        return out, lse


def attention_outputs(q: torch.Tensor, empty: bool = False,
                      dtype: torch.dtype | None = None) -> tuple:
    """``out`` like ``q`` (b, s_q, h, d; in ``dtype`` where given) and ``lse`` (b, h, s_q)
    fp32, for a kernel to fill; ``empty`` (nothing to compute: no query or no key): out 0
    and lse -inf, as a row with no key gets."""
    b, s_q, h, _ = q.shape
    out = torch.empty_like(q, dtype=dtype)
    lse = torch.empty(b, h, s_q, device=q.device, dtype=torch.float32)
    if empty:
        out.zero_()
        lse.fill_(float("-inf"))
    return out, lse


def _attention_plan(q, k, v, causal, softmax_scale, load, config) -> _AttentionPlan:
    """Check an attention call and decide what its launch needs (``_AttentionPlan``)."""
    from cutetma.kernels.attention import AttentionConfig
    from cutetma.kernels.attention.config import dense_tile

    for name, t in (("q", q), ("k", k), ("v", v)):
        check_operand(name, t, "attention", 4, "(batch, seqlen, heads, head_dim)")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError("q, k and v must be on one device")
    b, s_q, h, d = q.shape
    if k.shape != v.shape or k.shape[0] != b or k.shape[3] != d:
        raise ValueError(f"k and v must be (b={b}, s_k, h_kv, d={d}) alike, got "
                         f"{tuple(k.shape)} and {tuple(v.shape)}")
    h_kv = k.shape[2]
    if h_kv == 0 or h % h_kv:
        raise ValueError(f"{h} query heads are not a multiple of {h_kv} key/value heads")
    if d not in ATTENTION_HEAD_DIMS:
        raise ValueError(f"head_dim {d}: supported are {ATTENTION_HEAD_DIMS}")
    block_m, block_n = dense_tile(d, causal, k.shape[1])
    config = attention_config(config, AttentionConfig, d, causal, lambda: AttentionConfig(
        head_dim=d, causal=causal, load=tuning.check_load(load), block_m=block_m,
        block_n=block_n))
    plan = _AttentionPlan()
    plan.copies = tuple(not tma_rows_aligned(x) for x in (q, k, v))
    if q.numel() == 0 or k.shape[1] == 0:  # b, s_q or h of 0 (a 0 grid dimension), or no keys
        return plan
    # the strides the launch will see: a copy's are contiguous; the output is empty_like(q)
    seen = [torch.empty_strided(x.shape, x.stride(), device="meta").clone(
                memory_format=torch.contiguous_format) if copy else x
            for x, copy in zip((q, k, v), plan.copies, strict=True)]
    seen.append(torch.empty_like(seen[0], device="meta"))
    strides = [x.stride(i) for x in seen for i in (1, 2, 0)]  # (seq, head, batch)
    scale = softmax_scale if softmax_scale is not None else d ** -0.5
    sms = runtime.sm_count(q.device.index)  # the persistent grid: one CTA per SM
    plan.scalars = (b, s_q, k.shape[1], h, h_kv, d, *strides, scale, sms)
    plan.launch = runtime.attention_launch(q.dtype, config)
    return plan


@torch.library.custom_op("cutetma::attention", mutates_args=())
def _attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                  softmax_scale: float | None = None,
                  load: str = "tma") -> tuple[torch.Tensor, torch.Tensor]:
    """``torch.ops.cutetma.attention(q, k, v, causal, softmax_scale, load) -> (out, lse)``."""
    return _attention_forward(q, k, v, causal, softmax_scale, load, None)


@_attention_op.register_fake
def _(q, k, v, causal=False, softmax_scale=None, load="tma"):
    b, s_q, h, _ = q.shape
    return q.new_empty(q.shape), q.new_empty((b, h, s_q), dtype=torch.float32)


def _attention_setup_context(ctx, inputs, output):
    q, k, v, causal, softmax_scale, load = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.options = (causal, softmax_scale, load)


def _attention_grad(ctx, dout, dlse):
    """The autograd formula of ``torch.ops.cutetma.attention``: the backward's custom op
    (``cutetma.backward``), so ``torch.compile`` traces it too."""
    import cutetma.backward  # noqa: F401  (defines torch.ops.cutetma.attention_backward)

    q, k, v, out, lse = ctx.saved_tensors
    causal, softmax_scale, load = ctx.options
    if dout is None:
        dout = torch.zeros_like(out)
    dq, dk, dv = torch.ops.cutetma.attention_backward(
        dout.contiguous(), q, k, v, out, lse, dlse, causal, softmax_scale, load)
    return dq, dk, dv, None, None, None


_attention_op.register_autograd(_attention_grad, setup_context=_attention_setup_context)
