"""The torch face of paged attention: ``attention_with_kvcache`` (validate -> plan -> launch).

A serving engine keeps keys and values in a pool of fixed-size pages; each sequence owns a
list of them (its row of ``page_table``) and a length (``cache_seqlens``). The call maps onto
FlashAttention's ``flash_attn_with_kvcache``::

    flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=..., block_table=...,
                            softmax_scale=..., causal=..., return_softmax_lse=...)
    cutetma.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens, page_table, *,
                                   softmax_scale=..., causal=..., return_lse=..., load=...)

(its ``k=`` / ``v=``, the step's new keys and values written into the cache before the
attention, are this call's ``k=`` / ``v=``: ``append_to_cache``)

and, for ragged new tokens, onto ``flash_attn_varlen_func`` with a paged cache: its
``cu_seqlens_q``, ``max_seqlen_q``, ``seqused_k`` and ``page_table`` are this call's
``cu_seqlens_q``, ``max_seqlen_q``, ``cache_seqlens`` and ``page_table``.

``q`` (b, s_q, h, d), or (total_q, h, d) with ``cu_seqlens_q``; ``k_cache``, ``v_cache``
(num_pages, page_size, h_kv, d) with ``page_table`` (b, max_pages) int32, or (b, s_cache,
h_kv, d) without one (a dense cache is one page per sequence); ``cache_seqlens`` (b,) int32
(or an int for all). Causal masks are bottom-right aligned per sequence: query i of s_q
sees cache keys up to ``cache_seqlens - s_q + i``, so the new tokens' own keys must already
be in the cache. The table's and the lengths' contents are not read on the host (that
would be a synchronisation); ``check_contents=True`` reads them and raises on a page id out
of range, a negative length, a length past the table's pages or query offsets that do not
add up.

The kernel is ``FlashAttentionSm90`` with ``AttentionConfig.page_size`` set (one kernel,
paging a parameter): the TMA producer loads a stage as boxes that each lie inside one page,
the cp.async producer looks every 16-byte vector's row up in the page table.
``load="auto"`` picks the producer by ``tuning.attention.paged_load``. With few queries per
sequence (decode) the query heads of one K/V head share a tile (``pack_gqa``), and when
(sequence, K/V head) tiles are fewer than SMs each tile's keys are split
(``num_splits``): the splits write fp32 partial outputs and LSEs, which a second small
kernel (``kernels.attention.combine``) merges, weighted by their LSEs (FlashAttention's
split-KV decode).
"""

from __future__ import annotations

import dataclasses

import torch

from cutetma import runtime
from cutetma.fp8_attention import FP8, OUT_DTYPES, descales, fp8_config, fp8_paged_load
from cutetma.ops import (
    ATTENTION_HEAD_DIMS,
    GEMM_DTYPES,
    _current_stream,
    attention_outputs,
    plan_key,
)
from cutetma.reference import append_to_cache_ref
from cutetma.tuning import gemm as gemm_tuning


def attention_with_kvcache(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           cache_seqlens: torch.Tensor | int,
                           page_table: torch.Tensor | None = None, *, causal: bool = False,
                           softmax_scale: float | None = None, return_lse: bool = False,
                           load: str = "auto", num_splits: int | None = None,
                           cu_seqlens_q: torch.Tensor | None = None,
                           max_seqlen_q: int | None = None, check_contents: bool = False,
                           q_descale=None, k_descale=None, v_descale=None,
                           out_dtype: torch.dtype | None = None,
                           k: torch.Tensor | None = None, v: torch.Tensor | None = None):
    """Attention of ``q`` over each sequence's cached keys and values (see the module).

    Returns ``out`` (b, s_q, h, d) and, with ``return_lse``, ``lse`` (b, h, s_q) fp32.
    Varlen queries (as ``flash_attn_varlen_func``): ``q`` (total_q, h, d) holds every
    sequence's new queries end to end, sequence i's at rows ``cu_seqlens_q[i] ..
    cu_seqlens_q[i + 1] - 1`` (int32, (b + 1,)); ``max_seqlen_q`` the longest (read from
    ``cu_seqlens_q`` when None, a host synchronisation); out (total_q, h, d), lse
    (h, total_q). A sequence with no cached keys gets output 0 and lse -inf. Page ids are
    read only for keys below ``cache_seqlens`` (they must lie in [0, num_pages) there;
    ``check_contents=True`` checks it, and the lengths, with a synchronisation); cache slots
    past a sequence's length may hold anything, NaN included. Inside ``torch.compile`` the
    call is the custom op ``torch.ops.cutetma.attention_with_kvcache``. ``load``: "auto",
    "tma" (page sizes whose TMA boxes start on a swizzle atom: gcd(page_size, keys per
    stage) a multiple of 8) or "cp_async" (any page size). ``num_splits``: how many ranges
    each sequence's keys are cut into (None: ``tuning.attention.paged_splits``, from the
    shapes). Runs on the current CUDA stream, with no host synchronisation (CUDA-graph
    capturable).

    FP8: ``q``, ``k_cache`` and ``v_cache`` all ``torch.float8_e4m3fn``, with descales as
    FlashAttention-3's (``flash_attn_with_kvcache(..., q_descale=, k_descale=,
    v_descale=)``): each None (1), a positive number, or a (b, h_kv) fp32 tensor (per
    sequence and K/V head); ``out_dtype`` bf16 (default) or fp16. The cache is read as
    stored: V is transposed in shared memory (``AttentionConfig.v_transpose``).

    ``k``, ``v`` (``flash_attn_with_kvcache``'s): this step's new keys and values, (b, s_new,
    h_kv, d), or (total_q, h_kv, d) with ``cu_seqlens_q`` (a sequence's new keys are its new
    queries'), in the cache's dtype. They are written into the cache in place at each
    sequence's end (``append_to_cache``), and the attention then sees ``cache_seqlens +
    s_new`` keys; ``cache_seqlens`` itself is not changed. The table must hold pages for
    the new positions (``check_contents=True`` checks them before anything is written)."""
    fp8 = isinstance(q, torch.Tensor) and q.dtype == FP8
    if not fp8 and (out_dtype is not None or any(
            x is not None for x in (q_descale, k_descale, v_descale))):
        raise TypeError("descales and out_dtype go with float8_e4m3fn q, k_cache, v_cache; "
                        f"q is {getattr(q, 'dtype', type(q).__name__)}")
    if isinstance(cache_seqlens, int):
        if not isinstance(q, torch.Tensor):
            raise TypeError(f"q must be a torch.Tensor, got {type(q).__name__}")
        count = q.shape[0] if cu_seqlens_q is None else len(cu_seqlens_q) - 1
        cache_seqlens = torch.full((count,), cache_seqlens, dtype=torch.int32,
                                   device=q.device)
    if (cu_seqlens_q is not None and max_seqlen_q is None
            and isinstance(cu_seqlens_q, torch.Tensor) and cu_seqlens_q.numel() > 1):
        max_seqlen_q = int((cu_seqlens_q[1:] - cu_seqlens_q[:-1]).max())
    if page_table is None and isinstance(k_cache, torch.Tensor) and k_cache.dim() == 4:
        # a dense cache: sequence i is page i of a pool whose pages are s_cache keys long
        page_table = torch.arange(k_cache.shape[0], dtype=torch.int32,
                                  device=k_cache.device)[:, None]
    appending = k is not None or v is not None
    # the append writes the lengths after it here (the plan needs only its shape)
    lens = cache_seqlens
    if appending:
        check_new_keys(q, k_cache, k, v, cu_seqlens_q)
        if isinstance(cache_seqlens, torch.Tensor) and (
                cu_seqlens_q is None or isinstance(cu_seqlens_q, torch.Tensor)):
            # (else the plan's checks refuse them, before anything is written)
            lens = torch.empty_like(cache_seqlens)
    if check_contents:  # with the lengths after the append: the new positions' pages too
        after = (cache_seqlens + new_key_counts(k, cache_seqlens, cu_seqlens_q)
                 if lens is not cache_seqlens else cache_seqlens)
        check_cache_contents(q, k_cache, after, page_table, cu_seqlens_q)
    def packed_descales():  # (b, h_kv, 2) fp32 from torch ops: torch.compile traces it too
        if not fp8:
            return None
        return descales(*(1.0 if x is None else x for x in (q_descale, k_descale, v_descale)),
                        len(cache_seqlens), k_cache.shape[2], q.device)

    if torch.compiler.is_compiling():
        if appending:
            lens = torch.ops.cutetma.append_to_cache(k_cache, v_cache, k, v, cache_seqlens,
                                                     page_table, cu_seqlens_q)
        out, lse = torch.ops.cutetma.attention_with_kvcache(
            q, k_cache, v_cache, lens, page_table, causal, softmax_scale, load,
            num_splits, cu_seqlens_q, max_seqlen_q, packed_descales(), out_dtype)
        return (out, lse) if return_lse else out
    # planned (every operand checked) before the append writes anything
    plan = _cached_plan(q, k_cache, v_cache, lens, page_table, causal, softmax_scale,
                        load, num_splits, cu_seqlens_q, max_seqlen_q, out_dtype)
    if appending:
        append_to_cache(k_cache, v_cache, k, v, cache_seqlens, page_table, cu_seqlens_q, lens)
    out, lse = plan(q, k_cache, v_cache, lens, page_table, cu_seqlens_q,
                    packed_descales())
    return (out, lse) if return_lse else out


def _cached_plan(*args):
    """``_plan(*args)``, cached per problem (``plan_key``)."""
    key = plan_key(*args)
    plan = _PLANS.get(key) if key is not None else None
    if plan is None:
        plan = _plan(*args)
        if key is not None:
            _PLANS[key] = plan
    return plan


_PLANS: dict = {}


def check_new_keys(q, k_cache, k, v, cu_seqlens_q=None) -> None:
    """``attention_with_kvcache``'s ``k`` / ``v``: both given, one shape, (b, s_new, h_kv, d)
    with q's b (or (total_q, h_kv, d) with ``cu_seqlens_q``), the cache's dtype and device."""
    if k is None or v is None:
        raise ValueError("k and v go together: the new keys and their values")
    for name, t in (("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if not (isinstance(k_cache, torch.Tensor) and k_cache.dim() == 4
            and isinstance(q, torch.Tensor)):
        return  # the plan's checks say what is wrong with them
    h_kv, d = k_cache.shape[2:]
    if cu_seqlens_q is None:
        s_new = k.shape[1] if k.dim() == 4 else None
        want, form = (q.shape[0], s_new, h_kv, d), "(b, s_new, h_kv, d)"
    else:
        want, form = (q.shape[0], h_kv, d), "(total_q, h_kv, d), one key per new query,"
    if tuple(k.shape) != want or tuple(v.shape) != want:
        raise ValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)} must both be {form} "
                         f"here {tuple(x if x is not None else '?' for x in want)}")
    _check_new_key_types(k, v, k_cache)


def _check_new_key_types(k, v, k_cache) -> None:
    """The new keys' dtype and device are the cache's: they are copied as bytes."""
    for name, t in (("k", k), ("v", v)):
        if t.dtype != k_cache.dtype or t.device != k_cache.device:
            raise TypeError(f"{name} is {t.dtype} on {t.device}, the cache {k_cache.dtype} on "
                            f"{k_cache.device}: the new keys are written as they are")


def new_key_counts(k, cache_seqlens, cu_seqlens_q=None) -> torch.Tensor:
    """Each sequence's new keys, int32 like ``cache_seqlens``: s_new, or (varlen) its
    queries' count."""
    if cu_seqlens_q is None:
        return torch.full_like(cache_seqlens, k.shape[1])
    return (cu_seqlens_q[1:] - cu_seqlens_q[:-1]).to(cache_seqlens.dtype)


def append_to_cache(k_cache, v_cache, k, v, cache_seqlens, page_table, cu_seqlens_q=None,
                    lens_out=None) -> torch.Tensor:
    """Write ``k`` and ``v`` into the cache in place at each sequence's end: sequence i's
    t-th new key at position p = ``cache_seqlens[i] + t``, i.e. page ``page_table[i, p //
    page_size]``, slot ``p % page_size`` (what ``flash_attn_with_kvcache`` does with its
    ``k=`` / ``v=`` before attending). ``k``, ``v``: (b, s_new, h_kv, d), or (total_q, h_kv,
    d) with ``cu_seqlens_q``, row r of sequence i then its (r - cu_seqlens_q[i])-th key.
    Returns the lengths after it, ``cache_seqlens`` + each sequence's new keys (into
    ``lens_out`` when given); ``cache_seqlens`` is not changed. CUDA tensors: one kernel
    (``kernels.attention.append``), no host synchronisation, CUDA-graph capturable; other
    devices: torch's index copies (``reference.append_to_cache_ref``). Shapes, dtypes and
    layouts are checked first (nothing is written when one is wrong)."""
    _check_append_operands(k_cache, v_cache, k, v, cache_seqlens, page_table, cu_seqlens_q)
    if k_cache.device.type != "cuda":
        append_to_cache_ref(k_cache, v_cache, k, v, cache_seqlens, page_table, cu_seqlens_q)
        after = cache_seqlens + new_key_counts(k, cache_seqlens, cu_seqlens_q)
        if lens_out is None:
            return after
        lens_out.copy_(after)
        return lens_out
    if lens_out is None:
        lens_out = torch.empty_like(cache_seqlens)
    varlen = cu_seqlens_q is not None
    # the kernel copies 16-byte vectors: a view whose strides are not multiples of 16 bytes
    # is copied first
    k, v = (x if _aligned(x) else x.contiguous() for x in (k, v))
    b = cache_seqlens.shape[0]
    rows, s_new = (k.shape[0], 0) if varlen else (k.shape[0] * k.shape[1], k.shape[1])
    if max(rows, b) == 0:
        return lens_out
    size = k.element_size()
    _, page_size, h_kv, d = k_cache.shape

    def byte_strides(t, dims):
        return [t.stride(i) * size for i in dims]

    new_dims = (0, 0, 1) if varlen else (0, 1, 2)  # (batch, row, head); varlen: no batch
    strides = [*byte_strides(k, new_dims), *byte_strides(v, new_dims),
               *byte_strides(k_cache, (0, 1, 2)), *byte_strides(v_cache, (0, 1, 2))]
    if varlen:
        strides[0] = strides[3] = 0
    cu = cu_seqlens_q if varlen else cache_seqlens  # unread without varlen
    runtime.append_launch(d * size, varlen)(
        (k.data_ptr(), v.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(),
         page_table.data_ptr(), cache_seqlens.data_ptr(), cu.data_ptr(), lens_out.data_ptr(),
         rows, b, s_new, h_kv, page_size, page_table.shape[1], page_table.stride(0),
         k_cache.shape[0], *strides, _current_stream(k_cache.device)))
    return lens_out


def _check_append_operands(k_cache, v_cache, k, v, cache_seqlens, page_table, cu_seqlens_q):
    """What the append kernel relies on, checked before it writes: the new keys' shapes and
    dtype against the cache's (it copies their bytes), the caches' 16-byte layout and the
    int32 tables (the attention's plan checks these too, but under ``torch.compile`` the
    append runs first, and ``append_to_cache`` may be called alone)."""
    varlen = cu_seqlens_q is not None
    form = "(total_q, h_kv, d)" if varlen else "(b, s_new, h_kv, d)"
    for name, t in (("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != (3 if varlen else 4):
            raise ValueError(f"{name} must be {form}, got {tuple(getattr(t, 'shape', ()))}")
        if t.shape[-2:] != k_cache.shape[2:] or t.shape != k.shape:
            raise ValueError(f"{name} {tuple(t.shape)}: k and v one shape, ending in the "
                             f"cache's (h_kv, d) = {tuple(k_cache.shape[2:])}")
    _check_new_key_types(k, v, k_cache)
    if not varlen and k.shape[0] != cache_seqlens.shape[0]:
        raise ValueError(f"k has {k.shape[0]} sequences, cache_seqlens "
                         f"{cache_seqlens.shape[0]}")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        # the kernel's 16-byte vectors (torch's copies on other devices take any layout)
        if t.dim() != 4 or (t.device.type == "cuda" and not _aligned(t)):
            raise ValueError(f"{name} must be (num_pages, page_size, h_kv, d) with head_dim "
                             f"contiguous and 16-byte strides, got {tuple(t.shape)} strides "
                             f"{t.stride()}")
    ints = [("cache_seqlens", cache_seqlens, 1), ("page_table", page_table, 2)]
    if cu_seqlens_q is not None:
        ints.append(("cu_seqlens_q", cu_seqlens_q, 1))
    for name, t, dims in ints:
        if (not isinstance(t, torch.Tensor) or t.dtype != torch.int32 or t.dim() != dims
                or t.stride(-1) != 1 or t.device != k_cache.device):
            raise ValueError(f"{name} must be a {dims}-D int32 tensor on {k_cache.device} "
                             "with its last dimension contiguous")
    if page_table.shape[0] != cache_seqlens.shape[0]:
        raise ValueError(f"page_table has {page_table.shape[0]} rows, cache_seqlens "
                         f"{cache_seqlens.shape[0]} sequences")


@torch.library.custom_op("cutetma::append_to_cache", mutates_args=("k_cache", "v_cache"))
def _append_op(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor,
               v: torch.Tensor, cache_seqlens: torch.Tensor, page_table: torch.Tensor,
               cu_seqlens_q: torch.Tensor | None = None) -> torch.Tensor:
    """``torch.ops.cutetma.append_to_cache(k_cache, v_cache, k, v, cache_seqlens, page_table,
    cu_seqlens_q) -> lengths``: the append inside ``torch.compile`` (it writes the caches)."""
    return append_to_cache(k_cache, v_cache, k, v, cache_seqlens, page_table, cu_seqlens_q)


@_append_op.register_fake
def _(k_cache, v_cache, k, v, cache_seqlens, page_table, cu_seqlens_q=None):
    return torch.empty_like(cache_seqlens)


def check_cache_contents(q, k_cache, cache_seqlens, page_table, cu_seqlens_q=None) -> None:
    """What the kernel trusts but the shapes cannot show (reads the tensors: a host
    synchronisation): every length in [0, max_pages x page_size], every page id a sequence
    reads in [0, num_pages), and (varlen) offsets from 0, non-decreasing, ending at
    total_q."""
    lens = cache_seqlens.detach().cpu().long()
    pages, page_size = k_cache.shape[0], k_cache.shape[1]
    table = page_table.detach().cpu().long()
    capacity = table.shape[1] * page_size
    bad = ((lens < 0) | (lens > capacity)).nonzero().flatten().tolist()
    if bad:
        i = bad[0]
        raise ValueError(f"cache_seqlens[{i}] = {int(lens[i])}: outside [0, {capacity}] "
                         f"(max_pages {table.shape[1]} x page_size {page_size})")
    for i, n in enumerate(lens.tolist()):
        used = table[i, :(n + page_size - 1) // page_size]
        wrong = ((used < 0) | (used >= pages)).nonzero().flatten().tolist()
        if wrong:
            j = wrong[0]
            raise ValueError(f"page_table[{i}, {j}] = {int(used[j])}: sequence {i} reads it "
                             f"(length {n}) but the pool has pages 0 .. {pages - 1}")
    if cu_seqlens_q is not None:
        cu = cu_seqlens_q.detach().cpu().long()
        if cu[0] != 0 or (cu[1:] < cu[:-1]).any() or cu[-1] != q.shape[0]:
            raise ValueError(f"cu_seqlens_q must rise from 0 to total_q = {q.shape[0]}, got "
                             f"{cu.tolist()[:8]}{' ...' if len(cu) > 8 else ''}")


@dataclasses.dataclass
class _PagedPlan:
    """One paged problem's launch, decided once: the compiled launch and every scalar the
    kernel takes but the pointers and the stream."""

    launch: object = None  # None: nothing to compute
    scalars: tuple = ()
    splits: int = 1  # > 1: the kernel writes fp32 partials, ``combine`` merges them
    combine: object = None
    combine_scalars: tuple = ()  # batch, s_q, heads, splits, out's (seq, head, batch) strides
    varlen: bool = False  # q (total_q, h, d): handled as one batch of total_q rows
    out_dtype: torch.dtype | None = None  # e4m3: the output's; else q's

    def __call__(self, q, k_cache, v_cache, cache_seqlens, page_table, cu_seqlens_q=None,
                 descale=None):
        if self.varlen:
            out, lse = self._run(q[None], k_cache, v_cache, cache_seqlens, page_table,
                                 cu_seqlens_q, descale)
            return out[0], lse[0]
        return self._run(q, k_cache, v_cache, cache_seqlens, page_table, None, descale)

    def _run(self, q, k_cache, v_cache, cache_seqlens, page_table, cu_seqlens_q, descale):
        out, lse = attention_outputs(q, empty=self.launch is None, dtype=self.out_dtype)
        if self.launch is None:
            return out, lse
        o_into, lse_into = out, lse
        if self.splits > 1:
            b, s_q, h, d = q.shape
            o_into = torch.empty((self.splits * b, s_q, h, d), device=q.device,
                                 dtype=torch.float32)
            lse_into = torch.empty((self.splits * b, h, s_q), device=q.device,
                                   dtype=torch.float32)
        offsets = (cu_seqlens_q if cu_seqlens_q is not None else cache_seqlens).data_ptr()
        # 16-bit: no descales, the LSE's address in their place (unread)
        descales_at = (descale if descale is not None else lse_into).data_ptr()
        self.launch((q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), o_into.data_ptr(),
                     lse_into.data_ptr(), page_table.data_ptr(), cache_seqlens.data_ptr())
                    + self.scalars + (offsets, q.shape[1], descales_at,
                                      _current_stream(q.device)))
        if self.splits > 1:
            self.combine((o_into.data_ptr(), lse_into.data_ptr(), out.data_ptr(),
                          lse.data_ptr()) + self.combine_scalars
                         + (_current_stream(q.device),))
        return out, lse


def _aligned(x: torch.Tensor) -> bool:
    """TMA's and cp.async's 16-byte rule: the base and every stride but the last (which is
    1) multiples of 16 bytes."""
    return (x.stride(-1) == 1 and x.data_ptr() % 16 == 0
            and all(s * x.element_size() % 16 == 0 for s in x.stride()[:-1]))


def _plan(q, k_cache, v_cache, cache_seqlens, page_table, causal, softmax_scale, load,
          num_splits, cu_seqlens_q=None, max_seqlen_q=None, out_dtype=None):
    from cutetma.kernels.attention import AttentionConfig
    from cutetma.kernels.attention.config import SPLIT_KV_UNSUPPORTED
    from cutetma.tuning import attention as attention_tuning

    varlen = cu_seqlens_q is not None
    tensors = [("q", q), ("k_cache", k_cache), ("v_cache", v_cache),
               ("cache_seqlens", cache_seqlens), ("page_table", page_table)]
    for name, t in tensors + ([("cu_seqlens_q", cu_seqlens_q)] if varlen else []):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.device.type != "cuda":
            raise ValueError(f"{name} is on {t.device}: attention_with_kvcache needs CUDA "
                             "tensors")
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device}, q on {q.device}: one device")
    if varlen:
        if q.dim() != 3:
            raise ValueError(f"with cu_seqlens_q, q is (total_q, h, d), got {tuple(q.shape)}")
        if (cu_seqlens_q.dtype != torch.int32 or cu_seqlens_q.dim() != 1
                or cu_seqlens_q.stride(0) != 1 or len(cu_seqlens_q) < 1):
            raise ValueError(f"cu_seqlens_q must be a contiguous (b + 1,) int32 tensor, got "
                             f"{tuple(cu_seqlens_q.shape)} {cu_seqlens_q.dtype}")
        if not isinstance(max_seqlen_q, int) or max_seqlen_q < 0:
            raise ValueError(f"max_seqlen_q={max_seqlen_q!r}: the longest sequence's "
                             "number of queries, an int")
    for name, t in (("q", q[None] if varlen else q), ("k_cache", k_cache),
                    ("v_cache", v_cache)):
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D, got {tuple(t.shape)}")
        if t.dtype not in GEMM_DTYPES + (FP8,):
            raise TypeError(f"{name} has dtype {t.dtype}: float16, bfloat16 or "
                            "float8_e4m3fn")
    if not q.dtype == k_cache.dtype == v_cache.dtype:
        raise TypeError(f"q, k_cache, v_cache must share one dtype, got {q.dtype}, "
                        f"{k_cache.dtype}, {v_cache.dtype}")
    fp8 = q.dtype == FP8
    if fp8:
        out_dtype = torch.bfloat16 if out_dtype is None else out_dtype
        if out_dtype not in OUT_DTYPES:
            raise TypeError(f"out_dtype={out_dtype}: one of {OUT_DTYPES}")
    q4 = q[None] if varlen else q  # varlen: one batch of total_q rows
    b, s_q, h, d = q4.shape
    if varlen:
        # the kernel walks b sequences of at most max_seqlen_q queries
        b, s_q = len(cu_seqlens_q) - 1, max_seqlen_q
    pages, page_size, h_kv, d_kv = k_cache.shape
    if v_cache.shape != k_cache.shape:
        raise ValueError(f"k_cache {tuple(k_cache.shape)} and v_cache {tuple(v_cache.shape)} "
                         "must have one shape (num_pages, page_size, h_kv, d)")
    if d_kv != d:
        raise ValueError(f"the cache's head dim {d_kv} is not q's {d}")
    if d not in ATTENTION_HEAD_DIMS:
        raise ValueError(f"head_dim {d}: supported are {ATTENTION_HEAD_DIMS}")
    if h_kv == 0 or h % h_kv:
        raise ValueError(f"{h} query heads are not a multiple of {h_kv} key/value heads")
    if page_size == 0:
        raise ValueError("page_size 0: the cache has no room for a key")
    if page_table.dtype != torch.int32 or page_table.dim() != 2 or page_table.shape[0] != b:
        raise ValueError(f"page_table must be (b={b}, max_pages) int32, got "
                         f"{tuple(page_table.shape)} {page_table.dtype}")
    if page_table.stride(1) != 1 or page_table.data_ptr() % 4:
        raise ValueError("page_table's rows must be contiguous")
    if (cache_seqlens.dtype != torch.int32 or tuple(cache_seqlens.shape) != (b,)
            or cache_seqlens.stride(0) != 1):
        raise ValueError(f"cache_seqlens must be a contiguous (b={b},) int32 tensor, got "
                         f"{tuple(cache_seqlens.shape)} {cache_seqlens.dtype}")
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if not _aligned(t):
            raise ValueError(f"{name}: its base and strides must be multiples of 16 bytes "
                             f"with head_dim contiguous (strides {t.stride()}); "
                             ".contiguous() makes them so")
    if num_splits is not None and (not isinstance(num_splits, int) or num_splits < 1):
        raise ValueError(f"num_splits={num_splits!r}: a positive int, or None (automatic)")
    if load == "auto":
        load = (fp8_paged_load(page_size, d, causal) if fp8 else
                attention_tuning.paged_load(page_size, s_q, d, causal))
    gemm_tuning.check_load(load)
    pack = attention_tuning.paged_pack_gqa(s_q, h // h_kv)
    shape = fp8_config(d, causal, load) if fp8 else AttentionConfig(head_dim=d, causal=causal)
    rows, heads = (s_q * (h // h_kv), h_kv) if pack else (s_q, h)
    tiles = -(-rows // shape.block_m) * heads * b
    key_blocks = -(-page_table.shape[1] * page_size // shape.block_n)
    sms = runtime.sm_count(q.device.index)
    splits = num_splits or attention_tuning.paged_splits(tiles, key_blocks, sms)
    if num_splits is None and (d, load, causal) in SPLIT_KV_UNSUPPORTED:
        splits = 1
    paging = {"page_size": page_size, "pack_gqa": pack, "split_kv": splits > 1,
              "varlen_q": varlen}
    if fp8:
        config = fp8_config(d, causal, load, **paging)
    else:
        config = AttentionConfig(head_dim=d, causal=causal, load=load,
                                 pv_wait=attention_tuning.paged_pv_wait(d, causal, pack),
                                 **paging)
    plan = _PagedPlan(splits=splits, varlen=varlen, out_dtype=out_dtype)
    if q.numel() == 0 or page_table.shape[1] == 0 or b == 0:
        return plan
    # O's strides: out is made like q; split_kv's partial is a contiguous (splits b, s_q,
    # h, d) fp32 tensor (varlen: (splits, total_q, h, d))
    out_b, out_s = q4.shape[:2]
    out_like = torch.empty((out_b * splits, out_s, h, d), device="meta") if splits > 1 else (
        torch.empty_like(q4, device="meta"))
    strides = [q4.stride(1), q4.stride(2), q4.stride(0),
               k_cache.stride(1), k_cache.stride(2), k_cache.stride(0),
               v_cache.stride(1), v_cache.stride(2), v_cache.stride(0),
               *(out_like.stride(i) for i in (1, 2, 0)), page_table.stride(0)]
    scale = softmax_scale if softmax_scale is not None else d ** -0.5
    plan.scalars = (b, s_q, h, h_kv, d, pages, page_table.shape[1], *strides, scale, sms,
                    splits)
    plan.launch = runtime.paged_attention_launch(q.dtype, config, out_dtype)
    if splits > 1:
        out_strides = torch.empty_like(q4, device="meta").stride()
        plan.combine = runtime.combine_launch(out_dtype or q.dtype, d)
        plan.combine_scalars = (out_b, out_s, h, splits, *(out_strides[i] for i in (1, 2, 0)))
    return plan


def clear_plans() -> None:
    _PLANS.clear()


@torch.library.custom_op("cutetma::attention_with_kvcache", mutates_args=())
def _kvcache_op(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                cache_seqlens: torch.Tensor, page_table: torch.Tensor, causal: bool = False,
                softmax_scale: float | None = None, load: str = "auto",
                num_splits: int | None = None, cu_seqlens_q: torch.Tensor | None = None,
                max_seqlen_q: int | None = None, descale: torch.Tensor | None = None,
                out_dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch.ops.cutetma.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens,
    page_table, causal, softmax_scale, load, num_splits, cu_seqlens_q, max_seqlen_q,
    descale, out_dtype) -> (out, lse)``: the call inside ``torch.compile``; ``descale`` the
    FP8 kernel's (b, h_kv, 2) factors (``fp8_attention.descales``), None for 16-bit."""
    plan = _cached_plan(q, k_cache, v_cache, cache_seqlens, page_table, causal, softmax_scale,
                        load, num_splits, cu_seqlens_q, max_seqlen_q, out_dtype)
    return plan(q, k_cache, v_cache, cache_seqlens, page_table, cu_seqlens_q, descale)


@_kvcache_op.register_fake
def _(q, k_cache, v_cache, cache_seqlens, page_table, causal=False, softmax_scale=None,
      load="auto", num_splits=None, cu_seqlens_q=None, max_seqlen_q=None, descale=None,
      out_dtype=None):
    dtype = (out_dtype or torch.bfloat16) if q.dtype == FP8 else q.dtype
    if cu_seqlens_q is not None:  # q (total_q, h, d)
        return (q.new_empty(q.shape, dtype=dtype),
                q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32))
    b, s_q, h, _ = q.shape
    return q.new_empty(q.shape, dtype=dtype), q.new_empty((b, h, s_q), dtype=torch.float32)
