"""Compile the kernels for sm_90a against fake tensors (no GPU needed), once per
configuration, and read what came out: the PTX's data-movement instructions, ptxas's log,
the SASS. The PTX tests and ``cutetma tour`` use it.
"""

from __future__ import annotations

import functools
import re

PTX_OPS = re.compile(
    r"(cp\.async\.bulk\.tensor\.\dd\.[\w:.]+|cp\.async\.bulk\.(?:commit|wait)_group[\w.]*|"
    r"cp\.async\.c[ag]\.shared\.global|cp\.async\.mbarrier\.arrive\.noinc|"
    r"mapa\.shared::cluster|ld\.shared::cluster|wgmma\.mma_async[\w.]*|setmaxnreg\.\w+)"
)


def gpu_unavailable() -> str | None:
    """Why no Hopper GPU can run kernels here, or None if one can."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA GPU on this machine"
    cc = torch.cuda.get_device_capability()
    if cc != (9, 0):
        return f"the GPU is sm_{cc[0]}{cc[1]}, not Hopper (sm_90)"
    return None


def ptx_ops(ptx: str) -> list[str]:
    """The distinct data-movement / MMA instructions in a PTX text, in first-seen order."""
    return list(dict.fromkeys(m.group(0) for m in PTX_OPS.finditer(ptx)))


def _ptxas(ptx: str, arch: str, cubin: str | None = None, verbose: bool = False) -> str:
    """Run ptxas (on the PATH) on a PTX text: its log; the cubin goes to ``cubin`` if given."""
    import os
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kernel.ptx")
        with open(path, "w") as f:
            f.write(ptx)
        out = subprocess.run(["ptxas", f"-arch={arch}", *(["-v"] if verbose else []),
                              "-o", cubin or os.devnull, path],
                             capture_output=True, text=True, check=True)
    return out.stdout + out.stderr


def ptxas_log(ptx: str, arch: str = "sm_90a") -> str:
    """What ``ptxas -v`` says about a PTX text (registers, spills, and warnings such as C7512
    / C7520, "wgmma.mma_async instructions are serialized ..."); needs ptxas on the PATH."""
    return _ptxas(ptx, arch, verbose=True)


def find_nvdisasm() -> str | None:
    """nvdisasm on the PATH, else the one pip's ``nvidia-cuda-nvdisasm`` wheel installs (the
    test extra), else None."""
    import importlib.util
    import shutil
    from pathlib import Path

    if shutil.which("nvdisasm"):
        return shutil.which("nvdisasm")
    spec = importlib.util.find_spec("nvidia")  # a namespace package: one or more roots
    roots = list(spec.submodule_search_locations or []) if spec else []
    found = [str(p) for root in roots for p in sorted(Path(root).glob("cu*/bin/nvdisasm"))]
    return found[0] if found else None


def sass(ptx: str, arch: str = "sm_90a") -> str:
    """The SASS ptxas makes of a PTX text (ptxas, then ``nvdisasm -c``): where ptxas put the
    waits is decided here, not in the PTX. Needs ptxas on the PATH and ``find_nvdisasm()``."""
    import os
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        cubin = os.path.join(tmp, "kernel.cubin")
        _ptxas(ptx, arch, cubin=cubin)
        return subprocess.run([find_nvdisasm(), "-c", cubin], capture_output=True, text=True,
                              check=True).stdout


def innermost_loop(sass_text: str, must_contain: tuple[str, ...]) -> list[str]:
    """The instructions of the shortest loop (a backward branch to a label) whose body holds
    every string of ``must_contain``; addresses and predicates stripped."""
    lines = sass_text.splitlines()
    labels = {m.group(1): i for i, line in enumerate(lines)
              if (m := re.match(r"\s*\.(L_x_\d+):", line))}
    best = None
    for i, line in enumerate(lines):
        m = re.search(r"BRA `\(\.(L_x_\d+)\)", line)
        start = labels.get(m.group(1)) if m else None
        if start is None or start > i:
            continue
        body = lines[start:i + 1]
        if all(any(s in b for b in body) for s in must_contain):
            if best is None or len(body) < len(best):
                best = body
    return [re.sub(r"^(@!?U?P\w+\s+)", "", re.sub(r"/\*[0-9a-f]+\*/", "", b).strip())
            for b in best or [] if b.strip() and not b.strip().startswith(".")]


def fake_matrix(elem_bytes: int):
    """A (rows, cols) row-major tensor of dynamic shape whose row stride is known to be a
    multiple of 16 bytes and whose base is 16-byte aligned: what TMA needs."""
    from cutetma import dsl
    from cutetma.kernels.tile_copy import cute_dtype

    _, cute = dsl.cutlass()
    from cutlass.cute.runtime import make_fake_tensor

    div = 16 // elem_bytes
    shape = (cute.sym_int32(), cute.sym_int32(divisibility=div))
    return make_fake_tensor(cute_dtype(elem_bytes), shape, (cute.sym_int64(divisibility=div), 1),
                            assumed_align=16)


@functools.cache
def compile_probe(cfg):
    from cutetma import dsl
    from cutetma.kernels.tile_copy import SmemProbe

    cutlass, _ = dsl.cutlass()
    from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

    out = make_fake_compact_tensor(cutlass.Uint8, (cfg.cluster, cfg.box_bytes))
    return dsl.compile_ptx(SmemProbe(cfg), fake_matrix(cfg.elem_bytes), out,
                           cutlass.Int32(0), cutlass.Int32(0), make_fake_stream())


@functools.cache
def compile_round_trip(elem_bytes: int, swizzle: str, rows: int, cols: int):
    from cutlass.cute.runtime import make_fake_stream

    from cutetma import dsl
    from cutetma.kernels.tile_copy import TmaRoundTrip

    return dsl.compile_ptx(TmaRoundTrip(elem_bytes, swizzle, rows, cols),
                           fake_matrix(elem_bytes), fake_matrix(elem_bytes), make_fake_stream())


def showcase_configs():
    from cutetma.kernels.tile_copy import ProbeConfig

    return {
        "probe tma 2d 128B": ProbeConfig(2, "128B", 64, 64),
        "probe tma 3d grouped 128B": ProbeConfig(2, "128B", 16, 128, grouped=True),
        "probe cp.async 128B": ProbeConfig(2, "128B", 64, 64, load="cp_async"),
        "probe tma multicast x2": ProbeConfig(2, "128B", 64, 64, load="tma_multicast", cluster=2),
        "probe dsm broadcast x2": ProbeConfig(2, "128B", 64, 64, load="dsm", cluster=2),
    }


def showcase_kernels():
    """The tour's kernels as ``(name, compile)`` pairs: ``compile()`` compiles one kernel for
    sm_90a and returns the data-movement and MMA instructions its PTX issues (one pair per
    kernel, so a caller can report progress kernel by kernel)."""
    from cutetma.kernels.attention import AttentionConfig
    from cutetma.kernels.attention.config import BackwardConfig
    from cutetma.kernels.gemm_config import GemmConfig

    def instructions(compile_fn, *args):
        return lambda: ptx_ops(compile_fn(*args).ptx)

    pairs = [(name, instructions(compile_probe, cfg))
             for name, cfg in showcase_configs().items()]
    pairs.append(("round trip tma load+store",
                  instructions(compile_round_trip, 2, "128B", 64, 64)))
    pairs += [(name, instructions(compile_gemm, cfg))
              for name, cfg in (("gemm tma 128x256", GemmConfig()),
                                ("gemm tma multicast (2,1)", GemmConfig(cluster_m=2)),
                                ("gemm cp.async 128x256", GemmConfig(load="cp_async")))]
    pairs += [(name, instructions(compile_attention, cfg))
              for name, cfg in (("attention d=128 tma", AttentionConfig()),
                                ("attention d=128 cp.async", AttentionConfig(load="cp_async")))]
    pairs += [("paged attention tma, page 64", instructions(
                   compile_paged_attention, AttentionConfig(page_size=64), "BFloat16")),
              ("paged decode (packed, split)", instructions(
                   compile_paged_attention, AttentionConfig(page_size=64, pack_gqa=True,
                                                            split_kv=True), "BFloat16")),
              ("gemm fp8 e4m3, row scales", instructions(
                   compile_scaled_gemm, GemmConfig(tile_n=128, tile_k=128, scaling="row"))),
              ("attention backward d=128 tma", instructions(
                   compile_attention_backward, BackwardConfig()))]
    return pairs


def fake_operand(dtype, k_major: bool = True, as_from_dlpack: bool = False):
    """A 2D fp16/bf16 GEMM operand of dynamic shape, 16-byte aligned: (rows, K) with K
    contiguous, or (rows, K) with rows contiguous (an N-major B). ``as_from_dlpack``: no
    divisibility claims on the inner size and the stride, the type ``from_dlpack(x).
    mark_layout_dynamic()`` gives a torch tensor."""
    from cutetma import dsl

    _, cute = dsl.cutlass()
    from cutlass.cute.runtime import make_fake_tensor

    div = 1 if as_from_dlpack else 8
    rows, inner = cute.sym_int32(), cute.sym_int32(divisibility=div)
    stride = cute.sym_int64(divisibility=div)
    if k_major:
        return make_fake_tensor(dtype, (rows, inner), (stride, 1), assumed_align=16)
    return make_fake_tensor(dtype, (inner, rows), (1, stride), assumed_align=16)


@functools.cache
def compile_gemm(cfg, dtype_name: str = "Float16", out_name: str | None = None,
                 b_k_major: bool = True, max_active_clusters: int = 132):
    from cutetma import dsl
    from cutetma.kernels.gemm_sm90 import HopperGemm

    cutlass, _ = dsl.cutlass()
    from cutlass.cute.runtime import make_fake_stream

    dtype = getattr(cutlass, dtype_name)
    out = getattr(cutlass, out_name or dtype_name)
    clusters = max_active_clusters // (cfg.cluster_m * cfg.cluster_n)
    workspace = ()
    if cfg.stream_k or cfg.split_k > 1:  # fp32 tile slots and int32 flags, sized at run time
        _, cute = dsl.cutlass()
        from cutlass.cute.runtime import make_fake_tensor

        tile = cfg.tile_m * cfg.tile_n
        workspace = (make_fake_tensor(cutlass.Float32, (cute.sym_int32(divisibility=tile),),
                                      (1,), assumed_align=16),
                     make_fake_tensor(cutlass.Int32, (cute.sym_int32(),), (1,), assumed_align=4))
    if cfg.order_table:  # one packed cluster coordinate per work index, sized at run time
        _, cute = dsl.cutlass()
        from cutlass.cute.runtime import make_fake_tensor

        order = make_fake_tensor(cutlass.Int32, (cute.sym_int32(),), (1,), assumed_align=4)
        workspace = (None, None, order)
    return dsl.compile_ptx(HopperGemm(cfg), fake_operand(dtype), fake_operand(dtype, b_k_major),
                           fake_operand(out), clusters, make_fake_stream(), *workspace)


def compile_scaled_gemm(cfg, out_name: str = "BFloat16", max_active_clusters: int = 132):
    """The FP8 GEMM (``HopperGemm.scaled_from_pointers``: e4m3 A (M, K) and B (N, K)
    K-major, C (M, N), the fp32 scales of ``cfg.scaling``) for sm_90a."""
    from cutetma import dsl
    from cutetma.kernels.gemm_sm90 import HopperGemm

    cutlass, cute = dsl.cutlass()
    from cutlass.cute.runtime import make_fake_stream, make_fake_tensor, make_ptr

    def pointer(dtype, align=16):
        return make_ptr(dtype, 16, cute.AddressSpace.gmem, assumed_align=align)

    clusters = max_active_clusters // (cfg.cluster_m * cfg.cluster_n)
    workspace = ()
    if cfg.split_k > 1:
        tile = cfg.tile_m * cfg.tile_n
        workspace = (make_fake_tensor(cutlass.Float32, (cute.sym_int32(divisibility=tile),),
                                      (1,), assumed_align=16),
                     make_fake_tensor(cutlass.Int32, (cute.sym_int32(),), (1,), assumed_align=4))
    if cfg.order_table:
        order = make_fake_tensor(cutlass.Int32, (cute.sym_int32(),), (1,), assumed_align=4)
        workspace = (None, None, order)
    fp8 = cutlass.Float8E4M3FN
    return dsl.compile_ptx(HopperGemm(cfg).scaled_from_pointers, pointer(fp8), pointer(fp8),
                           pointer(getattr(cutlass, out_name)),
                           pointer(cutlass.Float32, cfg.scale_a_align),
                           pointer(cutlass.Float32, 4), *(cutlass.Int32(128),) * 4,
                           *(cutlass.Int64(128),) * 3, clusters, make_fake_stream(),
                           *workspace)


@functools.cache
def compile_attention(cfg, dtype_name: str = "Float16", as_from_dlpack: bool = False):
    """The attention forward for sm_90a against fake (s, d, h, b) tensors of dynamic shape.

    ``as_from_dlpack``: the tensors look like what ``ops.attention`` passes (every stride
    dynamic with no divisibility claim, head_dim dynamic), so the kernel must restore the
    16-byte facts itself."""
    from cutetma import dsl
    from cutetma.kernels.attention import FlashAttentionSm90

    cutlass, cute = dsl.cutlass()
    from cutlass.cute.runtime import make_fake_stream, make_fake_tensor

    dtype = getattr(cutlass, dtype_name)

    def qkv(element=dtype):
        if as_from_dlpack:
            shape = (cute.sym_int32(),) * 4
            stride = (cute.sym_int64(), 1, cute.sym_int64(), cute.sym_int64())
        else:
            shape = (cute.sym_int32(), cfg.head_dim, cute.sym_int32(), cute.sym_int32())
            stride = (cute.sym_int64(divisibility=16), 1, cfg.head_dim,
                      cute.sym_int64(divisibility=16))
        return make_fake_tensor(element, shape, stride, assumed_align=16)

    def v_transposed():  # e4m3: V^T, keys contiguous (fp8_operands.transpose_v)
        shape = (cute.sym_int32(), cfg.head_dim, cute.sym_int32(), cute.sym_int32())
        stride = (1, cute.sym_int64(divisibility=16), cute.sym_int64(divisibility=16),
                  cute.sym_int64(divisibility=16))
        return make_fake_tensor(dtype, shape, stride, assumed_align=16)

    lse = make_fake_tensor(cutlass.Float32, (cute.sym_int32(),) * 3,
                           (1, cute.sym_int64(), cute.sym_int64()), assumed_align=4)
    kernel = FlashAttentionSm90(cfg)
    if dtype.width == 8:  # e4m3: V^T, a bf16 output and the (2, h_kv, b) descales
        descale = make_fake_tensor(cutlass.Float32, (2, cute.sym_int32(), cute.sym_int32()),
                                   (1, 2, cute.sym_int64()), assumed_align=4)
        return dsl.compile_ptx(kernel.fp8, qkv(), qkv(),
                               qkv() if cfg.transposes_v else v_transposed(),
                               qkv(cutlass.BFloat16), lse, descale, cutlass.Float32(0.125),
                               cutlass.Int32(132), make_fake_stream())
    return dsl.compile_ptx(kernel, qkv(), qkv(), qkv(), qkv(), lse, cutlass.Float32(0.125),
                           cutlass.Int32(132), make_fake_stream())


@functools.cache
def compile_paged_attention(cfg, dtype_name: str = "Float16"):
    """The paged attention forward (``FlashAttentionSm90.paged``) for sm_90a: Q, O (s_q, d,
    h, b) and the K / V pools (page_size, d, h_kv, pages) as ``ops`` passes them (dynamic
    sizes and strides), the page table (b, max_pages) and cache lengths (b,) int32;
    ``split_kv``: O and the LSE fp32 partials; ``varlen_q``: the query offsets (b + 1,)."""
    from cutetma import dsl
    from cutetma.kernels.attention import FlashAttentionSm90

    cutlass, cute = dsl.cutlass()
    from cutlass.cute.runtime import make_fake_stream, make_fake_tensor

    dtype = getattr(cutlass, dtype_name)

    def tensor(rows, element=dtype):
        return make_fake_tensor(element, (rows, cute.sym_int32(), cute.sym_int32(),
                                          cute.sym_int32()),
                                (cute.sym_int64(), 1, cute.sym_int64(), cute.sym_int64()),
                                assumed_align=16)

    lse = make_fake_tensor(cutlass.Float32, (cute.sym_int32(),) * 3,
                           (1, cute.sym_int64(), cute.sym_int64()), assumed_align=4)
    table = make_fake_tensor(cutlass.Int32, (cute.sym_int32(), cute.sym_int32()),
                             (cute.sym_int64(), 1), assumed_align=4)
    lengths = make_fake_tensor(cutlass.Int32, (cute.sym_int32(),), (1,), assumed_align=4)
    rows = cute.sym_int32()
    fp8 = dtype.width == 8  # e4m3 pools: a bf16 output and the (2, h_kv, b) descales
    out = tensor(rows, cutlass.Float32 if cfg.split_kv else (
        cutlass.BFloat16 if fp8 else dtype))
    offsets = make_fake_tensor(cutlass.Int32, (cute.sym_int32(),), (1,), assumed_align=4)
    descale = make_fake_tensor(cutlass.Float32, (2, cute.sym_int32(), cute.sym_int32()),
                               (1, 2, cute.sym_int64()), assumed_align=4) if fp8 else None
    return dsl.compile_ptx(FlashAttentionSm90(cfg).paged, tensor(rows), tensor(cfg.page_size),
                           tensor(cfg.page_size), out, lse, table, lengths,
                           cutlass.Float32(0.125), cutlass.Int32(132), cutlass.Int32(1),
                           offsets, cutlass.Int32(1), make_fake_stream(), descale)


def compile_split_combine(head_dim: int, dtype_name: str = "BFloat16"):
    """split_kv's merge (``SplitCombine.from_pointers``) for sm_90a."""
    from cutetma import dsl
    from cutetma.kernels.attention.combine import SplitCombine

    cutlass, cute = dsl.cutlass()
    from cutlass.cute.runtime import make_fake_stream, make_ptr

    def pointer(dtype, align):
        return make_ptr(dtype, 16, cute.AddressSpace.gmem, assumed_align=align)

    return dsl.compile_ptx(SplitCombine(head_dim).from_pointers,
                           pointer(cutlass.Float32, 16), pointer(cutlass.Float32, 4),
                           pointer(getattr(cutlass, dtype_name), 16),
                           pointer(cutlass.Float32, 4), *(cutlass.Int32(1),) * 4,
                           *(cutlass.Int64(8),) * 3, make_fake_stream())


def compile_kv_append(head_bytes: int, varlen: bool):
    """``attention_with_kvcache``'s append of new keys and values (``KVAppend.from_pointers``)
    for sm_90a."""
    from cutetma import dsl
    from cutetma.kernels.attention.append import KVAppend

    cutlass, cute = dsl.cutlass()
    from cutlass.cute.runtime import make_fake_stream, make_ptr

    def pointer(align):
        return make_ptr(cutlass.Int32, 16, cute.AddressSpace.gmem, assumed_align=align)

    return dsl.compile_ptx(KVAppend(head_bytes, varlen).from_pointers,
                           *(pointer(16) for _ in range(4)), *(pointer(4) for _ in range(4)),
                           *(cutlass.Int32(1),) * 8, *(cutlass.Int64(16),) * 12,
                           make_fake_stream())


def compile_v_transpose(head_dim: int):
    """FP8 attention's V^T in the key order (``VTranspose.from_pointers``) for sm_90a."""
    from cutetma import dsl
    from cutetma.kernels.attention.v_transpose import VTranspose

    cutlass, cute = dsl.cutlass()
    from cutlass.cute.runtime import make_fake_stream, make_ptr

    def pointer(align):
        return make_ptr(cutlass.Uint8, 16, cute.AddressSpace.gmem, assumed_align=align)

    return dsl.compile_ptx(VTranspose(head_dim).from_pointers, pointer(1), pointer(16),
                           *(cutlass.Int32(1),) * 4, *(cutlass.Int64(8),) * 3,
                           make_fake_stream())


def compile_dq_postprocess(head_dim: int, block_m: int = 64, dtype_name: str = "BFloat16"):
    """The backward's dQ conversion (``DqPostprocess.from_pointers``, as
    ``runtime.dq_postprocess_launch`` compiles it) for sm_90a."""
    from cutetma import dsl
    from cutetma.kernels.attention.preprocess import DqPostprocess

    cutlass, cute = dsl.cutlass()
    from cutlass.cute.runtime import make_fake_stream, make_ptr

    def pointer(dtype):
        return make_ptr(dtype, 16, cute.AddressSpace.gmem, assumed_align=16)

    return dsl.compile_ptx(DqPostprocess(head_dim, block_m).from_pointers,
                           pointer(cutlass.Float32), pointer(getattr(cutlass, dtype_name)),
                           *(cutlass.Int32(1),) * 3, *(cutlass.Int64(8),) * 3,
                           cutlass.Float32(0.5), make_fake_stream())


@functools.cache
def compile_attention_backward(cfg, dtype_name: str = "BFloat16"):
    """The attention backward (``FlashAttentionBackwardSm90.from_pointers``, as
    ``runtime.attention_backward_launch`` compiles it) for sm_90a."""
    from cutetma import dsl
    from cutetma.kernels.attention.backward import FlashAttentionBackwardSm90

    cutlass, cute = dsl.cutlass()
    from cutlass.cute.runtime import make_fake_stream, make_ptr

    def pointer(dtype, align):
        return make_ptr(dtype, 16, cute.AddressSpace.gmem, assumed_align=align)

    dtype = getattr(cutlass, dtype_name)
    return dsl.compile_ptx(FlashAttentionBackwardSm90(cfg).from_pointers,
                           *(pointer(dtype, 16),) * 4, *(pointer(cutlass.Float32, 16),) * 3,
                           *(pointer(dtype, 16),) * 2, pointer(cutlass.Int32, 4),
                           *(cutlass.Int32(1),) * 5,
                           *(cutlass.Int64(8),) * 12, cutlass.Float32(0.125),
                           make_fake_stream())


NESTED_ELECT = re.compile(r"elect\.sync[^\n]*\n\s*not\.pred[^\n]*\n\s*@%p\d+ bra[^\n]*\n\s*"
                          r"elect\.sync")


def nested_elects(ptx: str) -> int:
    """How often one lane, already elected (``elect_one``), runs another ``elect.sync`` over
    the full warp: a DSL TMA copy elects its own lane, so a copy inside ``elect_one`` does
    this, and elect.sync with lanes of its mask missing is undefined (it hung a kernel on the
    H200). 0 for a sound kernel."""
    return len(NESTED_ELECT.findall(ptx))
