"""Prepared launches: a compiled ``from_pointers`` entry called with plain scalars.

A compiled function's ``__call__`` turns every argument into a C pointer to its value on
each call (DLPack for tensors, adapters for streams): most of an eager call's host cost. A
launch here keeps the scalars in one buffer (``SLOTS``, a subclass's), writes the call's
values into it and hands their addresses to the compiled program, as the DSL's own call
does (``tests/test_gemm_ptx.py::test_launch_args_match_the_dsl`` and its attention twin
hold the lists equal, so a DSL whose convention changes fails there, not on the GPU).
Workspace tensors (split-K's slots, the order table) are DSL tensors made once and cached.
"""

from __future__ import annotations

import ctypes
import struct
import threading

import torch

from cutetma.runtime.device import cached

_CUTE_DTYPES = {torch.float16: "Float16", torch.bfloat16: "BFloat16", torch.float32: "Float32",
                torch.int32: "Int32", torch.float8_e4m3fn: "Float8E4M3FN",
                torch.uint8: "Uint8"}


_CODES = {ctypes.c_void_p: "P", ctypes.c_int32: "i", ctypes.c_int64: "q", ctypes.c_float: "f"}


class PointerLaunch:
    """One compiled kernel entry whose runtime arguments are scalars (pointers, sizes,
    strides, the stream), launched without the DSL's generic argument conversion.

    The scalars live in one buffer laid out like a C struct of ``SLOTS`` (a subclass's), so
    a call writes them with a single ``struct.pack_into``. The compiled program takes the
    slots' addresses (and the workspace descriptors'), which never move: the packed argument
    array is built once per workspace and the call hands it to the program's C entry
    directly (``run_compiled_program`` rebuilds it every time)."""

    SLOTS: tuple = ()

    def __init__(self, compiled):
        self.compiled = compiled
        codes = [_CODES[kind] for kind in self.SLOTS]
        self._struct = struct.Struct("@" + "".join(codes))
        self._buffer = ctypes.create_string_buffer(max(self._struct.size, 1))
        base = ctypes.addressof(self._buffer)
        self._addresses = [base + struct.calcsize("@" + "".join(codes[:i + 1]))
                           - struct.calcsize(code) for i, code in enumerate(codes)]
        self._executor = None  # made on the first launch (it loads the module)
        self._packed: dict = {}  # workspace -> the program's packed argument array
        self._lock = threading.Lock()  # the buffer is shared: one launch at a time

    def args(self, values, workspace=()) -> list:
        """The compiled program's argument list for ``values`` (the scalars in ``SLOTS``
        order, written into the buffer) and the workspace tensors (``None`` where absent)."""
        self._struct.pack_into(self._buffer, 0, *values)
        return self._addresses + [p for t in workspace if t is not None
                                  for p in t.__c_pointers__()]

    def __call__(self, values, workspace=()) -> None:
        with self._lock:
            self._struct.pack_into(self._buffer, 0, *values)
            key = tuple(map(id, workspace))
            entry = self._packed.get(key)
            if entry is None:
                entry = self._packed[key] = self._prepare(workspace)
            run, packed = entry
            run(packed)

    def _prepare(self, workspace):
        """(how to run, its argument) for this workspace: the program's C entry and a packed
        array made once, or, where the executor does not expose them (another DSL version),
        its ``run_compiled_program`` and the argument list."""
        if self._executor is None:
            self._executor = self.compiled.to()
        executor = self._executor
        exe_args = self._addresses + [p for t in workspace if t is not None
                                      for p in t.__c_pointers__()]
        try:
            total = len(exe_args) + executor._num_extra_args
            packed = executor._get_invoke_packed_args(exe_args)
            own = (ctypes.c_void_p * total)(*packed[:total])
            capi, result = executor.capi_func, executor.cuda_result
        except AttributeError:
            return executor.run_compiled_program, exe_args

        def run(packed_args):
            capi(packed_args)
            if result is not None and result.value:
                raise RuntimeError(f"{type(self).__name__}: the kernel launch failed with "
                                   f"CUDA error {result.value}")

        return run, own


class GemmLaunch(PointerLaunch):
    """``HopperGemm.from_pointers``: A, B, C; m, n, ka, kb; lda, ldb, ldc; the stream."""

    SLOTS = ((ctypes.c_void_p,) * 3 + (ctypes.c_int32,) * 4 + (ctypes.c_int64,) * 3
             + (ctypes.c_void_p,))


class ScaledGemmLaunch(PointerLaunch):
    """``HopperGemm.scaled_from_pointers``: A, B, C, scale A, scale B; m, n, ka, kb; lda,
    ldb, ldc; the stream."""

    SLOTS = ((ctypes.c_void_p,) * 5 + (ctypes.c_int32,) * 4 + (ctypes.c_int64,) * 3
             + (ctypes.c_void_p,))


class AttentionLaunch(PointerLaunch):
    """``FlashAttentionSm90.from_pointers``: Q, K, V, O, LSE; batch, s_q, s_k, heads,
    kv heads, head dim; the (seq, head, batch) strides of Q, K, V, O; the softmax scale,
    the persistent grid's size; the stream."""

    SLOTS = ((ctypes.c_void_p,) * 5 + (ctypes.c_int32,) * 6 + (ctypes.c_int64,) * 12
             + (ctypes.c_float, ctypes.c_int32, ctypes.c_void_p))


class Fp8AttentionLaunch(PointerLaunch):
    """``FlashAttentionSm90.fp8_from_pointers``: ``AttentionLaunch``'s arguments with the
    descales (b, h_kv, 2) fp32 after the LSE (V: V^T, its strides (d, head, batch))."""

    SLOTS = ((ctypes.c_void_p,) * 6 + (ctypes.c_int32,) * 6 + (ctypes.c_int64,) * 12
             + (ctypes.c_float, ctypes.c_int32, ctypes.c_void_p))


class PagedAttentionLaunch(PointerLaunch):
    """``FlashAttentionSm90.paged_from_pointers``: Q, K pool, V pool, O, LSE, page table,
    cache lengths; batch, s_q, heads, kv heads, head dim, pages, max pages; the strides of
    Q (seq, head, batch), the pools (row, head, page), O, the page table's row; the softmax
    scale, the persistent grid's size, the number of splits (split_kv), the query offsets and
    the total of queries (varlen_q), the descales (e4m3: (b, h_kv, 2) fp32; else unread);
    the stream."""

    SLOTS = ((ctypes.c_void_p,) * 7 + (ctypes.c_int32,) * 7 + (ctypes.c_int64,) * 13
             + (ctypes.c_float, ctypes.c_int32, ctypes.c_int32, ctypes.c_void_p,
                ctypes.c_int32, ctypes.c_void_p, ctypes.c_void_p))


class BackwardLaunch(PointerLaunch):
    """``FlashAttentionBackwardSm90.from_pointers``: Q, K, V, dO, LSE, D, dQ, dK, dV, the
    turn counters (deterministic); batch, s_q, s_k, heads, kv heads; the (seq, head, batch)
    strides of Q, K, V, dO; the softmax scale; the stream."""

    SLOTS = ((ctypes.c_void_p,) * 10 + (ctypes.c_int32,) * 5 + (ctypes.c_int64,) * 12
             + (ctypes.c_float, ctypes.c_void_p))


class PreprocessLaunch(PointerLaunch):
    """``BackwardPreprocess.from_pointers``: O, dO, LSE, LSE (log2) and D outputs, the dQ
    accumulator it zeroes; batch, s_q, heads; the (seq, head, batch) strides of O and dO; the
    stream."""

    SLOTS = ((ctypes.c_void_p,) * 6 + (ctypes.c_int32,) * 3 + (ctypes.c_int64,) * 6
             + (ctypes.c_void_p,))


class PostprocessLaunch(PointerLaunch):
    """``DqPostprocess.from_pointers``: the accumulator, dQ; batch, s_q, heads; dQ's (seq,
    head, batch) strides; the scale; the stream."""

    SLOTS = ((ctypes.c_void_p,) * 2 + (ctypes.c_int32,) * 3 + (ctypes.c_int64,) * 3
             + (ctypes.c_float, ctypes.c_void_p))


class VTransposeLaunch(PointerLaunch):
    """``VTranspose.from_pointers``: V, V^T (as bytes); batch, s_k, kv heads, keys padded;
    V's (seq, head, batch) strides; the stream."""

    SLOTS = ((ctypes.c_void_p,) * 2 + (ctypes.c_int32,) * 4 + (ctypes.c_int64,) * 3
             + (ctypes.c_void_p,))


class CombineLaunch(PointerLaunch):
    """``SplitCombine.from_pointers``: O and LSE partials, O, LSE; batch, s_q, heads,
    splits; O's (seq, head, batch) strides; the stream."""

    SLOTS = ((ctypes.c_void_p,) * 4 + (ctypes.c_int32,) * 4 + (ctypes.c_int64,) * 3
             + (ctypes.c_void_p,))


class AppendLaunch(PointerLaunch):
    """``KVAppend.from_pointers``: new K and V, the K and V caches, the page table, the
    lengths, cu_seqlens_q, the lengths out; rows, batch, s_new, h_kv, page size, the table's
    pages and row stride, the pool's pages; the byte strides of K, V (batch, row, head) and
    of the caches (page, slot, head); the stream."""

    SLOTS = ((ctypes.c_void_p,) * 8 + (ctypes.c_int32,) * 8 + (ctypes.c_int64,) * 12
             + (ctypes.c_void_p,))


def typed_pointer(dtype: torch.dtype, align: int = 16):
    """A global-memory pointer of ``dtype``'s DSL type for compiling a ``from_pointers``
    entry: only its type (and alignment) matters to the compiler, not its address."""
    from cutetma import dsl

    cutlass, cute = dsl.cutlass()
    from cutlass.cute.runtime import make_ptr

    return make_ptr(getattr(cutlass, _CUTE_DTYPES[dtype]), 16, cute.AddressSpace.gmem,
                    assumed_align=align)


def _dsl():
    """The DSL's ``cutlass`` module and a fake stream, to type a compile's arguments."""
    from cutetma import dsl

    cutlass, _ = dsl.cutlass()
    from cutlass.cute.runtime import make_fake_stream

    return cutlass, make_fake_stream()


def _compiled(launch_cls, module: str, entry: str, made_with: tuple, config: str, args):
    """``launch_cls`` around ``entry`` ("Class.method" of ``module``'s class, made with
    ``made_with``) compiled for ``args``: from the disk cache under (entry, ``config``, the
    arguments' types), or compiled and stored there (the kernel module is imported only on a
    miss)."""
    import importlib

    from cutetma import dsl
    from cutetma.runtime import cache

    _, cute = dsl.cutlass()
    class_name, method = entry.split(".")

    def compile_it():
        kernel = getattr(importlib.import_module(module), class_name)(*made_with)
        return cute.compile(getattr(kernel, method), *args)

    return launch_cls(cache.load_or_compile(
        {"entry": entry, "config": config, "args": cache.describe_args(*args)}, compile_it))


def gemm_launch(ab_dtype, c_dtype, b_k_major: bool, cfg, clusters: int, workspace=()):
    """The ``GemmLaunch`` of this configuration, compiled on its first use: one kernel per
    (dtypes, B's major, configuration, cluster count); sizes and strides are runtime
    values, so a new shape does not recompile."""

    def build():
        _, stream = _dsl()
        args = (typed_pointer(ab_dtype), typed_pointer(ab_dtype), typed_pointer(c_dtype),
                1, 1, 1, 1, 1, 1, 1, b_k_major, clusters, stream, *workspace)
        return _compiled(GemmLaunch, "cutetma.kernels.gemm_sm90", "HopperGemm.from_pointers",
                         (cfg,), repr(cfg), args)

    return cached(("gemm", ab_dtype, c_dtype, b_k_major, cfg, clusters), build)


def scaled_gemm_launch(c_dtype, cfg, clusters: int, workspace=()):
    """The FP8 GEMM's ``ScaledGemmLaunch`` (e4m3 A and B, K-major; ``cfg.scaling``),
    compiled on its first use."""

    def build():
        _, stream = _dsl()
        fp8 = typed_pointer(torch.float8_e4m3fn)
        args = (fp8, fp8, typed_pointer(c_dtype),
                typed_pointer(torch.float32, cfg.scale_a_align),
                typed_pointer(torch.float32, 4), 1, 1, 1, 1, 1, 1, 1, clusters, stream,
                *workspace)
        return _compiled(ScaledGemmLaunch, "cutetma.kernels.gemm_sm90",
                         "HopperGemm.scaled_from_pointers", (cfg,), repr(cfg), args)

    return cached(("scaled_gemm", c_dtype, cfg, clusters), build)


def attention_launch(dtype: torch.dtype, cfg) -> AttentionLaunch:
    """The ``AttentionLaunch`` of this (dtype, configuration), compiled on its first use
    (``FlashAttentionSm90.from_pointers``); sizes and strides are runtime values."""

    def build():
        cutlass, stream = _dsl()
        args = (*[typed_pointer(dtype) for _ in range(4)], typed_pointer(torch.float32, 4),
                *(1,) * 18, cutlass.Float32(1.0), cutlass.Int32(1), stream)
        return _compiled(AttentionLaunch, "cutetma.kernels.attention",
                         "FlashAttentionSm90.from_pointers", (cfg,), repr(cfg), args)

    return cached(("attention", dtype, cfg), build)


def fp8_attention_launch(cfg, out_dtype: torch.dtype) -> Fp8AttentionLaunch:
    """The ``Fp8AttentionLaunch`` of this configuration with e4m3 operands and an
    ``out_dtype`` (bf16 or fp16) output, compiled on its first use."""

    def build():
        cutlass, stream = _dsl()
        args = (*[typed_pointer(torch.float8_e4m3fn) for _ in range(3)],
                typed_pointer(out_dtype), typed_pointer(torch.float32, 4),
                typed_pointer(torch.float32, 4),
                *(1,) * 18, cutlass.Float32(1.0), cutlass.Int32(1), stream)
        return _compiled(Fp8AttentionLaunch, "cutetma.kernels.attention",
                         "FlashAttentionSm90.fp8_from_pointers", (cfg,), repr(cfg), args)

    return cached(("fp8_attention", cfg, out_dtype), build)


def paged_attention_launch(dtype: torch.dtype, cfg,
                           out_dtype: torch.dtype | None = None) -> PagedAttentionLaunch:
    """The ``PagedAttentionLaunch`` of this (dtype, configuration; the page size is the
    configuration's), compiled on its first use; sizes and strides are runtime values.
    ``out_dtype``: the output's where it is not ``dtype`` (e4m3 inputs)."""

    def build():
        cutlass, stream = _dsl()
        # split: fp32 partials
        out = typed_pointer(torch.float32 if cfg.split_kv else (out_dtype or dtype))
        args = (*[typed_pointer(dtype) for _ in range(3)], out, typed_pointer(torch.float32, 4),
                typed_pointer(torch.int32, 4), typed_pointer(torch.int32, 4),
                *(1,) * 20, cutlass.Float32(1.0), cutlass.Int32(1), cutlass.Int32(1),
                typed_pointer(torch.int32, 4), cutlass.Int32(1),
                typed_pointer(torch.float32, 4), stream)
        return _compiled(PagedAttentionLaunch, "cutetma.kernels.attention",
                         "FlashAttentionSm90.paged_from_pointers", (cfg,), repr(cfg), args)

    return cached(("paged_attention", dtype, cfg) + ((out_dtype,) if out_dtype else ()),
                  build)


def combine_launch(dtype: torch.dtype, head_dim: int) -> CombineLaunch:
    """The ``CombineLaunch`` merging split_kv's partials into a ``dtype`` output of this
    head dim, compiled on its first use."""

    def build():
        _, stream = _dsl()
        args = (typed_pointer(torch.float32), typed_pointer(torch.float32, 4),
                typed_pointer(dtype), typed_pointer(torch.float32, 4), *(1,) * 7, stream)
        return _compiled(CombineLaunch, "cutetma.kernels.attention.combine",
                         "SplitCombine.from_pointers", (head_dim,), f"head_dim={head_dim}",
                         args)

    return cached(("split_combine", dtype, head_dim), build)


def append_launch(head_bytes: int, varlen: bool) -> AppendLaunch:
    """The ``AppendLaunch`` writing new keys and values of ``head_bytes`` a head into a paged
    cache (any element type: it copies bytes), compiled on its first use."""

    def build():
        _, stream = _dsl()
        args = (*[typed_pointer(torch.int32) for _ in range(4)],
                *[typed_pointer(torch.int32, 4) for _ in range(4)], *(1,) * 20, stream)
        return _compiled(AppendLaunch, "cutetma.kernels.attention.append",
                         "KVAppend.from_pointers", (head_bytes, varlen),
                         f"head_bytes={head_bytes},varlen={varlen}", args)

    return cached(("kv_append", head_bytes, varlen), build)


def backward_preprocess_launch(dtype: torch.dtype, head_dim: int,
                               block_m: int = 64) -> PreprocessLaunch:
    """The backward's preprocessing pass (``BackwardPreprocess``) for O and dO of ``dtype``,
    this head dim and the backward's query block, compiled on its first use."""

    def build():
        _, stream = _dsl()
        args = (typed_pointer(dtype), typed_pointer(dtype),
                *[typed_pointer(torch.float32, 4) for _ in range(3)],
                typed_pointer(torch.float32), *(1,) * 9, stream)
        return _compiled(PreprocessLaunch, "cutetma.kernels.attention.preprocess",
                         "BackwardPreprocess.from_pointers", (head_dim, block_m),
                         f"head_dim={head_dim},block_m={block_m}", args)

    return cached(("backward_preprocess", dtype, head_dim, block_m), build)


def dq_postprocess_launch(dtype: torch.dtype, head_dim: int,
                          block_m: int = 64) -> PostprocessLaunch:
    """dQ's conversion from the backward's fragment-ordered accumulator (``DqPostprocess``)
    into ``dtype``, compiled on its first use."""

    def build():
        cutlass, stream = _dsl()
        args = (typed_pointer(torch.float32), typed_pointer(dtype, 16), *(1,) * 6,
                cutlass.Float32(1.0), stream)
        return _compiled(PostprocessLaunch, "cutetma.kernels.attention.preprocess",
                         "DqPostprocess.from_pointers", (head_dim, block_m),
                         f"head_dim={head_dim},block_m={block_m}", args)

    return cached(("dq_postprocess", dtype, head_dim, block_m), build)


def v_transpose_launch(head_dim: int) -> VTransposeLaunch:
    """FP8 attention's V^T in the key order (``VTranspose``, one-byte values moved as
    bytes), compiled on its first use."""

    def build():
        _, stream = _dsl()
        args = (typed_pointer(torch.uint8, 1), typed_pointer(torch.uint8, 16), *(1,) * 7,
                stream)
        return _compiled(VTransposeLaunch, "cutetma.kernels.attention.v_transpose",
                         "VTranspose.from_pointers", (head_dim,), f"head_dim={head_dim}", args)

    return cached(("v_transpose", head_dim), build)


def attention_backward_launch(dtype: torch.dtype, cfg,
                              grad_kv_dtype: torch.dtype | None = None) -> BackwardLaunch:
    """The attention backward's ``BackwardLaunch`` of this (dtype, ``BackwardConfig``),
    compiled on its first use; sizes and strides are runtime values. dK and dV are written
    in ``grad_kv_dtype`` (default ``dtype``; fp32 where GQA sums them afterwards)."""
    grad_kv_dtype = grad_kv_dtype or dtype

    def build():
        cutlass, stream = _dsl()
        args = (*[typed_pointer(dtype) for _ in range(4)],
                *[typed_pointer(torch.float32, 16) for _ in range(3)],
                *[typed_pointer(grad_kv_dtype, 16) for _ in range(2)],
                typed_pointer(torch.int32, 4), *(1,) * 17, cutlass.Float32(1.0), stream)
        return _compiled(BackwardLaunch, "cutetma.kernels.attention.backward",
                         "FlashAttentionBackwardSm90.from_pointers", (cfg,), repr(cfg), args)

    return cached(("attention_backward", dtype, cfg, grad_kv_dtype), build)
