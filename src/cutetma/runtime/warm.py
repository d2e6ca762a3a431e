"""Fill the on-disk compile cache ahead of time (``cutetma cache warm``).

``gemm_entries``, ``attention_entries``, ``paged_entries`` and ``scaled_gemm_entries`` turn
problems into the kernels ``cutetma.gemm``, ``cutetma.attention``,
``cutetma.attention_with_kvcache`` and ``cutetma.scaled_gemm`` would launch for them
(``Entry``: dtypes, configuration, B's major, cluster count, workspace kind), one per
distinct kernel; ``warm`` compiles each through the very functions the ops launch through
(``runtime.gemm_launch``, ``runtime.attention_launch``, ``runtime.paged_attention_launch``,
``runtime.scaled_gemm_launch``), so the cache keys are the ops' own, in worker processes
(``multiprocessing``, spawn; ``import cutetma`` in each sets the arch), and reports each
entry as it finishes: compiled, or already on disk (a hit).

The GEMM's configuration is decided as ``ops.gemm`` decides it for a contiguous ``a`` (M, K)
and ``b`` (N, K) (``b_layout="kn"``: ``b`` (K, N), ``trans_b=False``), output in the input
dtype, outside ``torch.use_deterministic_algorithms``: ``tuning.select_gemm_config``, then
the tile order. Where a Hopper GPU is present, with its SM count, its clusters' occupancy
(``runtime.max_active_clusters``) and its probed placement (``runtime.placement.ordered``):
exactly what ``cutetma.gemm`` launches there. Without one, as on an H200: 132 SMs and
132 // cluster size clusters (the H200's occupancy for clusters of 2 can be lower, since a
cluster's CTAs share a GPC: on such a card those entries miss and compile at their first
call), the order table where ``placement.enabled()`` and ``order_table_pays`` (M >= 256,
unsplit; its workspace a DSL tensor of the device type the launch passes), and below that
the default raster band (the band ``placement.placed`` picks comes from a GPU probe: where
it picks another, that entry misses). Split-K and stream-K configurations are not placed,
so they always match. On a GPU, ``probe_entries`` adds the placement probes those GEMMs
launch at their first call (the probe kernels are cached like any other).
"""

from __future__ import annotations

import ctypes
import dataclasses
import itertools
import os
import time

H200_SMS = 132
DTYPES = ("float16", "bfloat16")
SHORT = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32", "float8_e4m3fn": "e4m3"}
LOADS = ("tma", "cp_async")
B_LAYOUTS = ("nk", "kn")
# the headline shapes and the linear layers of a Llama-3-8B-like model (fused QKV, attention
# output, fused gate/up, down) at 4096 and 128 tokens, some at 512 and 16 (decode batches)
GEMM_PRESET = (
    (4096, 4096, 4096), (8192, 8192, 8192),
    (4096, 6144, 4096), (4096, 28672, 4096), (4096, 4096, 14336),
    (512, 6144, 4096), (512, 4096, 4096),
    (128, 6144, 4096), (128, 4096, 4096), (128, 28672, 4096), (128, 4096, 14336),
    (16, 4096, 4096), (16, 4096, 14336),
)
ATTENTION_PRESET = tuple((d, causal) for d in (64, 128, 256) for causal in (False, True))


@dataclasses.dataclass(frozen=True)
class Entry:
    """One compiled kernel: what ``runtime.gemm_launch`` / ``runtime.attention_launch`` is
    called with. ``workspace``: "" (none), "split" (split-K / stream-K slots and flags) or
    "order_table". ``problems``: the problems that launch it (for the progress line)."""

    op: str
    dtype: str
    cfg: object
    out_dtype: str = ""
    b_k_major: bool = True
    clusters: int = 0
    workspace: str = ""
    problems: tuple = ()

    @property
    def kernel(self) -> tuple:
        """What tells two entries apart (``problems`` does not)."""
        return (self.op, self.dtype, self.out_dtype, self.b_k_major, self.cfg, self.clusters,
                self.workspace)

    def name(self) -> str:
        cfg = self.cfg
        if self.op == "probe":
            return f"placement probe, clusters of {cfg}"
        if self.op == "combine":
            return f"split-KV merge {SHORT[self.dtype]} d={cfg}"
        if self.op == "append":
            return f"new-key append {SHORT[self.dtype]} d={cfg[0]}{', varlen' if cfg[1] else ''}"
        if self.op == "paged":
            kind = ("decode, packed and split" if cfg.pack_gqa and cfg.split_kv else
                    "decode, packed" if cfg.pack_gqa else
                    "decode, split" if cfg.split_kv else "prefill")
            kind += ", varlen" if cfg.varlen_q else ""
            return (f"paged attention {SHORT[self.dtype]} d={cfg.head_dim}"
                    f"{' causal' if cfg.causal else ''} page {cfg.page_size} {kind} "
                    f"{cfg.load}")
        if self.op in ("attention", "backward"):
            kind = "attention backward" if self.op == "backward" else "attention"
            return (f"{kind} {SHORT[self.dtype]} d={cfg.head_dim}"
                    f"{' causal' if cfg.causal else ''} {cfg.load}")
        parts = [f"gemm {SHORT[self.dtype]} {cfg.tile_m}x{cfg.tile_n}"]
        if self.op == "scaled_gemm":
            parts.append(f"{cfg.scaling} scales")
        if cfg.cluster_m * cfg.cluster_n > 1:
            parts.append(f"cluster {cfg.cluster_m}x{cfg.cluster_n}")
        if cfg.schedule != "cooperative":
            parts.append(cfg.schedule)
        if cfg.split_k > 1:
            parts.append(f"split {cfg.split_k} {cfg.split_sum}")
        if cfg.order_table:
            parts.append("order table")
        if not self.b_k_major:
            parts.append("B (K, N)")
        parts.append(cfg.load)
        shown = ", ".join("x".join(map(str, p)) for p in self.problems[:2])
        more = f" +{len(self.problems) - 2}" if len(self.problems) > 2 else ""
        return " ".join(parts) + (f" [{shown}{more}]" if shown else "")


def _distinct(entries) -> list[Entry]:
    """One entry per kernel, in first-seen order, with every problem that launches it."""
    merged: dict = {}
    for entry in entries:
        seen = merged.get(entry.kernel)
        if seen is None:
            merged[entry.kernel] = entry
        elif entry.problems and entry.problems[0] not in seen.problems:
            merged[entry.kernel] = dataclasses.replace(
                seen, problems=seen.problems + entry.problems)
    return list(merged.values())


def gpu_present() -> bool:
    """Whether a Hopper GPU can be asked for its counts and placement here."""
    from cutetma.kernels.build import gpu_unavailable

    return gpu_unavailable() is None


def gemm_entry(m: int, n: int, k: int, dtype: str = "bfloat16", load: str = "tma",
               b_layout: str = "nk", gpu: bool = False) -> Entry:
    """The kernel ``cutetma.gemm`` launches for this problem (the module docstring says how,
    with ``gpu`` and without)."""
    from cutetma.runtime import device, placement
    from cutetma.tuning import gemm as tuning

    # B (K, N) reaches the kernel N-major, unless its rows break TMA's 16-byte rule (N not a
    # multiple of 8): then ops copies it into a padded K-major buffer
    b_k_major = b_layout == "nk" or n % 8 != 0
    sms = device.sm_count(0) if gpu else H200_SMS
    cfg = tuning.select_gemm_config(m, n, k, load=tuning.check_load(load), sm_count=sms,
                                    b_k_major=b_k_major)
    tuning.check_tile_for_b(cfg, b_k_major)
    size = cfg.cluster_m * cfg.cluster_n
    if gpu:
        clusters = device.max_active_clusters(size, 0)
        cfg = placement.ordered(cfg, m, n, k, 0, clusters)
    else:
        clusters = H200_SMS // size
        if placement.enabled() and tuning.order_table_pays(m, n, cfg):
            cfg = placement.with_order_table(cfg)
    workspace = ("split" if cfg.stream_k or cfg.split_k > 1 else
                 "order_table" if cfg.order_table else "")
    return Entry("gemm", dtype, cfg, dtype, b_k_major, clusters, workspace, ((m, n, k),))


def gemm_entries(problems, dtypes=DTYPES, loads=("tma",), b_layouts=("nk",),
                 gpu: bool = False) -> list[Entry]:
    """``gemm_entry`` of every (problem, dtype, load, B layout), one per distinct kernel."""
    return _distinct(gemm_entry(m, n, k, dtype, load, layout, gpu)
                     for dtype in dtypes for load in loads for layout in b_layouts
                     for m, n, k in problems)


def scaled_gemm_entries(problems, scalings=("tensor",), loads=("tma",),
                        out_dtype: str = "bfloat16", gpu: bool = False) -> list[Entry]:
    """The kernels ``cutetma.scaled_gemm`` launches for these problems (e4m3 A (M, K), B
    (K, N) column-major), per scaling and load, one per distinct kernel: the 16-bit model's
    choice made FP8's by ``tuning.gemm.fp8_config``, as ``fp8._plan`` does (no order table, so no
    placement; with ``gpu``, this GPU's SM and cluster counts)."""
    import torch

    from cutetma.runtime import device
    from cutetma.tuning import gemm as tuning

    sms = device.sm_count(0) if gpu else H200_SMS
    entries = []
    for scaling in scalings:
        for load in loads:
            for m, n, k in problems:
                cfg = tuning.fp8_config(tuning.select_gemm_config(
                    m, n, k, load=tuning.check_load(load), sm_count=sms, b_k_major=True),
                    scaling, getattr(torch, out_dtype))
                size = cfg.cluster_m * cfg.cluster_n
                clusters = device.max_active_clusters(size, 0) if gpu else H200_SMS // size
                workspace = "split" if cfg.stream_k or cfg.split_k > 1 else ""
                entries.append(Entry("scaled_gemm", "float8_e4m3fn", cfg, out_dtype, True,
                                     clusters, workspace, ((m, n, k),)))
    return _distinct(entries)


def probe_entries(gemms) -> list[Entry]:
    """The placement probes (``runtime.placement.probe``) the GEMMs of ``gemms`` launch on a
    GPU: one per cluster size that finds the SMs' GPCs (``GPC_PROBE_CLUSTERS``) and one per
    cluster size of a placed or order-table entry. Launched to compile them, so only where
    a GPU is (a probe is a kernel of a millisecond); none with placement off."""
    from cutetma.runtime import placement

    if not placement.enabled():
        return []
    sizes = set(placement.GPC_PROBE_CLUSTERS)
    sizes.update(e.cfg.cluster_m * e.cfg.cluster_n for e in gemms
                 if e.op == "gemm" and e.workspace != "split")
    return [Entry("probe", "", size) for size in sorted(sizes)]


def paged_entries(page_sizes, specs=ATTENTION_PRESET, dtypes=DTYPES,
                  loads=("tma",)) -> list[Entry]:
    """The kernels ``cutetma.attention_with_kvcache`` launches for these page sizes, per
    (head dim, causal), dtype and load: prefill (nothing packed or split), decode with
    the query heads packed, packed and split, and split alone (MHA), each also with varlen
    queries (``cu_seqlens_q``), the split merge and the new-key append (``k=`` / ``v=``,
    varlen or not) per (dtype, head dim). A combination the kernel refuses (a TMA box off
    the swizzle atom, split_kv where the DSL cannot compile it) is left out, as the call
    would not launch it."""
    from cutetma.kernels.attention import AttentionConfig

    entries = []
    for dtype in dtypes:
        for load in loads:
            for d, causal in specs:
                for page in page_sizes:
                    for pack, split, varlen in itertools.product((False, True), repeat=3):
                        try:
                            cfg = AttentionConfig(head_dim=d, causal=causal, load=load,
                                                  page_size=page, pack_gqa=pack,
                                                  split_kv=split, varlen_q=varlen)
                        except ValueError:
                            continue
                        entries.append(Entry("paged", dtype, cfg))
        head_dims = sorted({d for d, _ in specs})
        entries += [Entry("combine", dtype, d) for d in head_dims]
        entries += [Entry("append", dtype, (d, varlen)) for d in head_dims
                    for varlen in (False, True)]
    return _distinct(entries)


def attention_entries(specs=ATTENTION_PRESET, dtypes=DTYPES, loads=("tma",)) -> list[Entry]:
    """The kernels ``cutetma.attention`` launches for each (head dim, causal), dtype and load
    (``AttentionConfig(head_dim, causal, load)``: its shapes are runtime values), every tile
    the keys' length may pick (``dense_tiles``: d = 64's 192 rows, short odd lengths' 160
    keys)."""
    from cutetma.kernels.attention import AttentionConfig
    from cutetma.kernels.attention.config import dense_tiles

    return _distinct(Entry("attention", dtype, AttentionConfig(
        head_dim=d, causal=causal, load=load, block_m=block_m, block_n=block_n))
                     for dtype in dtypes for load in loads for d, causal in specs
                     for block_m, block_n in dense_tiles(d, causal))


def backward_entries(specs=ATTENTION_PRESET, dtypes=DTYPES, loads=("tma",)) -> list[Entry]:
    """The attention backward's kernel (``cutetma.attention_backward``, autograd through
    ``cutetma.attention``) for each (head dim, causal), dtype and load."""
    from cutetma.kernels.attention.config import BACKWARD_HEAD_DIMS, BackwardConfig
    return _distinct(Entry("backward", dtype, BackwardConfig(head_dim=d, causal=causal,
                                                             load=load))
                     for dtype in dtypes for load in loads for d, causal in specs
                     if d in BACKWARD_HEAD_DIMS)


# ---------------------------------------------------------------------------- compiling
class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):
    pass


_DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(_DLManagedTensor))
_DLManagedTensor._fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p),
                             ("deleter", _DELETER)]
_NO_DELETE = _DELETER(lambda _: None)  # the memory is the _DeviceVector's own
_DL_CUDA, _DL_INT, _DL_FLOAT = 2, 0, 2
_CAPSULE = ctypes.pythonapi.PyCapsule_New
_CAPSULE.restype = ctypes.py_object
_CAPSULE.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


class _DeviceVector:
    """A DLPack producer describing a 1D CUDA vector (no memory behind it): what
    ``from_dlpack`` reads of a torch CUDA tensor, on a machine without a GPU. Compiling needs
    only the type (element, address space: a CUDA tensor is ``gmem``, a CPU one
    ``generic``, which is another key and another kernel), never the data."""

    def __init__(self, float32: bool, length: int = 64):
        self._shape = (ctypes.c_int64 * 1)(length)
        self._strides = (ctypes.c_int64 * 1)(1)
        self._managed = _DLManagedTensor()
        t = self._managed.dl_tensor
        t.data, t.device, t.ndim = 1 << 40, _DLDevice(_DL_CUDA, 0), 1
        t.dtype = _DLDataType(_DL_FLOAT if float32 else _DL_INT, 32, 1)
        t.shape, t.strides = self._shape, self._strides
        self._managed.deleter = _NO_DELETE

    def __dlpack__(self, stream=None):
        return _CAPSULE(ctypes.addressof(self._managed), b"dltensor", None)

    def __dlpack_device__(self):
        return (_DL_CUDA, 0)


_KEEP: list = []  # the producers behind the workspace tensors, alive for the process


def device_vector(float32: bool, align: int):
    """A DSL tensor of the type ``from_dlpack(t, assumed_align=align).mark_layout_dynamic()``
    gives a 1D fp32 (``float32``) or int32 CUDA tensor ``t``: the workspaces' type."""
    from cutlass.cute.runtime import from_dlpack

    producer = _DeviceVector(float32)
    _KEEP.append(producer)
    return from_dlpack(producer, assumed_align=align).mark_layout_dynamic()


def workspace_tensors(kind: str) -> tuple:
    """The workspace argument ``ops.gemm`` passes for this kind (``ops._gemm_workspace``):
    split-K's fp32 slots (16-byte aligned) and int32 flags, or the int32 order table."""
    if kind == "split":
        return device_vector(True, 16), device_vector(False, 4)
    if kind == "order_table":
        return None, None, device_vector(False, 4)
    return ()


def _launch(entry: Entry) -> None:
    import torch

    from cutetma.runtime import launch

    if entry.op == "probe":
        from cutetma.runtime import placement

        placement.probe(entry.cfg, entry.cfg)
        return
    dtype = getattr(torch, entry.dtype)
    if entry.op == "paged":
        launch.paged_attention_launch(dtype, entry.cfg)
        return
    if entry.op == "combine":
        launch.combine_launch(dtype, entry.cfg)
        return
    if entry.op == "append":  # it copies bytes: one kernel per head's row of bytes
        head_dim, varlen = entry.cfg
        launch.append_launch(head_dim * dtype.itemsize, varlen)
        return
    if entry.op == "backward":
        launch.attention_backward_launch(dtype, entry.cfg)  # dK, dV in the inputs' dtype
        launch.backward_preprocess_launch(dtype, entry.cfg.head_dim, entry.cfg.block_m)
        launch.dq_postprocess_launch(dtype, entry.cfg.head_dim, entry.cfg.block_m)
        return
    if entry.op == "scaled_gemm":
        launch.scaled_gemm_launch(getattr(torch, entry.out_dtype), entry.cfg, entry.clusters,
                                  workspace_tensors(entry.workspace))
        return
    if entry.op == "attention":
        launch.attention_launch(dtype, entry.cfg)
    else:
        launch.gemm_launch(dtype, getattr(torch, entry.out_dtype), entry.b_k_major, entry.cfg,
                           entry.clusters, workspace_tensors(entry.workspace))


def compile_entry(entry: Entry) -> tuple[str, float, str]:
    """Compile one entry into the cache (or find it there): ``(status, seconds, error)``,
    status ``"compiled"``, ``"hit"`` or ``"failed"``. A worker process's task."""
    from cutetma.runtime import cache

    compiled = []
    original = cache.load_or_compile

    def counting(key_parts, compile_fn):  # a compile_fn that runs is a miss
        def compile_and_count():
            compiled.append(True)
            return compile_fn()

        return original(key_parts, compile_and_count)

    start = time.perf_counter()
    cache.load_or_compile = counting
    try:
        _launch(entry)
    except Exception as e:  # noqa: BLE001 - one failed entry should not stop the others
        lines = str(e).strip().splitlines()
        return "failed", time.perf_counter() - start, (
            f"{type(e).__name__}: {lines[0] if lines else ''}")
    finally:
        cache.load_or_compile = original
    return ("compiled" if compiled else "hit"), time.perf_counter() - start, ""


def prepare() -> None:
    """Load what every entry needs (torch, the DSL, the cache key's environment), so an
    entry's seconds are its own compile or load. A pool's initializer: it never raises (a
    worker whose initializer fails is restarted forever); what fails here fails again, and
    is reported, in each entry's ``compile_entry``."""
    try:
        from cutetma import dsl
        from cutetma.runtime import cache, launch  # noqa: F401 - imported for its import time

        dsl.cutlass()
        cache.environment()
    except Exception:  # noqa: BLE001
        pass


def _task(indexed):
    index, entry = indexed
    return index, compile_entry(entry)


def default_jobs() -> int:
    return max(1, min(4, os.cpu_count() or 1))


def warm(entries, jobs: int | None = None, progress=None) -> list[tuple[str, float, str]]:
    """Compile ``entries`` into the cache in ``jobs`` worker processes (spawned; 1: in this
    process), calling ``progress(done, total, entry, result)`` as each finishes; the results
    in ``entries``' order."""
    entries = list(entries)
    jobs = max(1, min(jobs or default_jobs(), len(entries) or 1))
    results: list = [None] * len(entries)

    def finished(done, index, result):
        results[index] = result
        if progress is not None:
            progress(done, len(entries), entries[index], result)

    if jobs == 1:
        prepare()
        for done, indexed in enumerate(enumerate(entries), 1):
            finished(done, *_task(indexed))
        return results
    import multiprocessing

    with multiprocessing.get_context("spawn").Pool(jobs, prepare) as pool:
        for done, (index, result) in enumerate(
                pool.imap_unordered(_task, enumerate(entries)), 1):
            finished(done, index, result)
    return results
