"""Paged attention compiled for sm_90a on a CPU machine: the TMA boxes per stage at each
page size, the cp.async twin, the configuration's rules, the producer choice, and the fp32
paged reference (tests/test_paged_gpu.py holds the numerical checks on the GPU)."""

import itertools
import re
import shutil

import pytest

from cutetma.kernels import build
from cutetma.kernels.attention import AttentionConfig


@pytest.mark.parametrize("page_size,box", [(16, 16), (48, 16), (64, 64), (128, 128),
                                           (256, 128), (1000, 8)])
def test_tma_boxes_per_stage(page_size, box):
    """A K or V stage of 128 keys is 128 / gcd(page_size, 128) boxes, each split in two 64-
    column halves by the 128-byte swizzle (d = 128): Q's 2 boxes plus K's and V's, written
    twice by the producer (a tile's first block, then the rest)."""
    cfg = AttentionConfig(page_size=page_size)
    assert cfg.kv_box == box
    ptx = build.compile_paged_attention(cfg).ptx
    per_stage = 2 * (128 // box)
    assert ptx.count("cp.async.bulk.tensor") == 2 + 2 * 2 * per_stage
    assert "cp.async.cg" not in ptx


@pytest.mark.parametrize("page_size", [1, 17, 64])
def test_cp_async_paged_takes_any_page_size(page_size):
    ptx = build.compile_paged_attention(AttentionConfig(page_size=page_size,
                                                        load="cp_async")).ptx
    assert "cp.async.bulk.tensor" not in ptx
    assert ptx.count("cp.async.cg.shared.global") > 0
    # the rows come from the page table: one load per lane per key block (K and V share
    # it), the line's address shuffled within the 8 lanes copying it (shfl.sync.idx with
    # the segment mask 0x181f = 6175: two 32-bit halves), not a dependent load per 16-byte
    # vector (that gather ran at a quarter of the dense cp.async kernel's speed)
    assert "ld.global" in ptx
    assert len(re.findall(r"ld\.global\.[bs]32", ptx)) <= 4  # 66 when looked up per vector
    segment = len(re.findall(r"shfl\.sync\.idx\.b32\s[^;]*, 6175, -1;", ptx))
    copies = ptx.count("cp.async.cg.shared.global")
    assert 0 < segment <= 2 * copies, (segment, copies)


def test_tma_page_sizes_must_start_boxes_on_a_swizzle_atom():
    with pytest.raises(ValueError, match="multiple of 8"):
        AttentionConfig(page_size=12)
    with pytest.raises(ValueError, match="page_size"):
        AttentionConfig(page_size=-1)
    assert AttentionConfig(page_size=12, load="cp_async").kv_box == 4
    assert AttentionConfig(head_dim=256, page_size=128).kv_box == 16  # 80-key stages
    assert not AttentionConfig().paged


def test_auto_load_rule():
    from cutetma.tuning.attention import paged_load

    assert paged_load(16, 1, 128, False) == "cp_async"  # decode at d = 128
    assert paged_load(16, 2, 128, False) == "tma" and paged_load(16, 1, 64, False) == "tma"
    assert paged_load(256, 4096, 128, True) == "tma"
    assert paged_load(12, 1, 128, False) == "cp_async"
    assert paged_load(1, 128, 64, True) == "cp_async"
    assert paged_load(40, 128, 256, False) == "tma"  # gcd(40, 80) = 40


@pytest.mark.skipif(shutil.which("ptxas") is None, reason="needs ptxas (CUDA toolkit)")
@pytest.mark.parametrize("page_size", [64, 128])
def test_paged_tma_keeps_wgmma_async_without_spills(page_size):
    """The page lookups live in the producer (cp.async's register budget); the consumers
    keep their WGMMAs asynchronous and nothing spills."""
    for causal in (False, True):
        cfg = AttentionConfig(page_size=page_size, causal=causal)
        log = build.ptxas_log(build.compile_paged_attention(cfg, "BFloat16").ptx)
        assert "C7512" not in log, log
        assert re.search(r"\b0 bytes spill stores, 0 bytes spill loads", log), log


@pytest.mark.skipif(shutil.which("ptxas") is None, reason="needs ptxas (CUDA toolkit)")
def test_producer_registers_give_the_consumers_the_rest():
    """``producer_registers``: the paged TMA producer at FlashAttention-3's 24 (where its
    page-id cache fits: a whole-stage page) hands the consumers 240, as the dense kernel's
    do, and still neither spills nor serializes; other budgets are refused. The default
    takes that budget for causal d = 128 tiles of 32-key boxes or larger (timed faster
    there), 40 / 232 elsewhere."""
    assert AttentionConfig(page_size=128, producer_registers=24).registers == (24, 240)
    assert AttentionConfig(page_size=128).registers == (40, 232)  # non-causal: tied
    assert AttentionConfig(page_size=16, causal=True).registers == (40, 232)  # 8 boxes
    assert AttentionConfig(page_size=16, causal=True, load="cp_async").registers == (40, 232)
    assert AttentionConfig(page_size=64, causal=True, pack_gqa=True).registers == (40, 232)
    cfg = AttentionConfig(page_size=64, causal=True)
    assert cfg.registers == (24, 240)
    ptx = build.compile_paged_attention(cfg, "BFloat16").ptx
    assert re.search(r"setmaxnreg\.dec\.sync\.aligned\.u32\s+24;", ptx)
    assert re.search(r"setmaxnreg\.inc\.sync\.aligned\.u32\s+240;", ptx)
    log = build.ptxas_log(ptx)
    assert "C7512" not in log and re.search(r"\b0 bytes spill stores", log), log
    for wrong in ({"page_size": 128, "producer_registers": 28},
                  {"head_dim": 64, "block_m": 192, "producer_registers": 24}):
        with pytest.raises(ValueError, match="producer_registers"):
            AttentionConfig(**wrong)


@pytest.mark.skipif(shutil.which("ptxas") is None or build.find_nvdisasm() is None,
                    reason="needs ptxas and nvdisasm (CUDA toolkit)")
@pytest.mark.parametrize("page_size,causal,decode", [(16, False, False), (16, True, False),
                                                     (128, False, False), (16, False, True)])
def test_paged_tma_boxes_issue_without_a_loop_over_lanes(page_size, causal, decode):
    """Every TMA box issues straight from uniform registers. With the warp role's index
    taken through a shuffle (which ptxas folds back to tid / 128), ptxas could treat the
    role branch as divergent in the non-causal kernels and wrapped each UTMALDG in a loop
    over the lanes' operands (BRA.U.ANY): at page 16's 32 boxes a key block the producer
    outlasted the consumers (360 against 640 TFLOP/s at page 128, H100)."""
    cfg = AttentionConfig(page_size=page_size, causal=causal, pack_gqa=decode,
                          split_kv=decode)
    sass = build.sass(build.compile_paged_attention(cfg, "BFloat16").ptx)
    assert sass.count("UTMALDG") > 0
    assert "BRA.U.ANY" not in sass


def test_paged_reference_is_attention_over_the_gathered_pages():
    import torch

    from cutetma.reference import attention_ref, paged_attention_ref

    torch.manual_seed(0)
    page, h_kv, d = 16, 2, 64
    lengths = [40, 0, 16]
    table = torch.tensor([[5, 2, 7], [0, 0, 0], [3, 0, 0]], dtype=torch.int32)
    k_cache = torch.randn(8, page, h_kv, d)
    v_cache = torch.randn(8, page, h_kv, d)
    q = torch.randn(3, 5, 4, d)
    out, lse = paged_attention_ref(q, k_cache, v_cache, torch.tensor(lengths), table, True)
    k0 = torch.cat([k_cache[5], k_cache[2], k_cache[7]])[:40][None]
    v0 = torch.cat([v_cache[5], v_cache[2], v_cache[7]])[:40][None]
    want, want_lse = attention_ref(q[:1], k0, v0, True)
    assert torch.allclose(out[:1], want) and torch.allclose(lse[:1], want_lse)
    assert (out[1] == 0).all() and (lse[1] == float("-inf")).all()


def test_errors_before_launch_on_the_host():
    import torch

    import cutetma

    q = torch.randn(1, 2, 4, 64)
    with pytest.raises(ValueError, match="CUDA"):
        cutetma.attention_with_kvcache(q, q, q, torch.ones(1, dtype=torch.int32),
                                       torch.zeros(1, 1, dtype=torch.int32))
    with pytest.raises(TypeError, match="torch.Tensor"):
        cutetma.attention_with_kvcache([1], q, q, 3, torch.zeros(1, 1, dtype=torch.int32))


def test_custom_op_fake_shapes():
    """The custom op's fake (what torch.compile traces with): out like q, lse (b, h, s_q)."""
    import torch

    import cutetma.kvcache  # noqa: F401  (registers cutetma::attention_with_kvcache)

    q = torch.empty(2, 3, 8, 64, device="meta", dtype=torch.bfloat16)
    cache = torch.empty(10, 16, 2, 64, device="meta", dtype=torch.bfloat16)
    lens = torch.empty(2, device="meta", dtype=torch.int32)
    table = torch.empty(2, 5, device="meta", dtype=torch.int32)
    out, lse = torch.ops.cutetma.attention_with_kvcache(q, cache, cache, lens, table, True,
                                                        None, "auto")
    assert out.shape == q.shape and lse.shape == (2, 8, 3) and lse.dtype == torch.float32
    varlen = torch.empty(7, 8, 64, device="meta", dtype=torch.bfloat16)  # (total_q, h, d)
    cu = torch.empty(3, device="meta", dtype=torch.int32)
    out, lse = torch.ops.cutetma.attention_with_kvcache(varlen, cache, cache, lens, table,
                                                        True, None, "auto", None, cu, 4)
    assert out.shape == varlen.shape and lse.shape == (8, 7)
    # e4m3: the descales travel packed (b, h_kv, 2); out in out_dtype (bf16 by default)
    q8, cache8 = q.to(torch.float8_e4m3fn), cache.to(torch.float8_e4m3fn)
    descale = torch.empty(2, 2, 2, device="meta")
    for out_dtype, expected in ((None, torch.bfloat16), (torch.float16, torch.float16)):
        out, lse = torch.ops.cutetma.attention_with_kvcache(
            q8, cache8, cache8, lens, table, True, None, "auto", None, None, None, descale,
            out_dtype)
        assert out.shape == q.shape and out.dtype == expected and lse.shape == (2, 8, 3)


def test_pack_gqa_gathers_q_rows_and_split_kv_writes_fp32_partials():
    """pack_gqa: Q arrives by cp.async row gathers (a packed row is no TMA box), the K/V
    stages still by TMA boxes, the Q barrier completed by the producer warp's arrivals;
    split_kv: the partial O leaves as fp32 pairs."""
    plain = build.compile_paged_attention(AttentionConfig(page_size=64)).ptx
    cfg = AttentionConfig(page_size=64, pack_gqa=True, split_kv=True)
    ptx = build.compile_paged_attention(cfg, "BFloat16").ptx
    per_stage = 2 * (128 // 64)
    assert ptx.count("cp.async.bulk.tensor") == 2 * 2 * per_stage  # K and V, no Q box
    assert plain.count("cp.async.bulk.tensor") == 2 + 2 * 2 * per_stage
    assert "cp.async.cg.shared.global" in ptx and "cp.async.mbarrier.arrive.noinc" in ptx
    # O's fp32 pairs (and one 4-byte LSE store per row pair, as in every variant)
    assert ptx.count("st.global.v2.b32") > 0 and "st.global.v4.b32" not in ptx
    assert plain.count("st.global.v4.b32") > 0 and "st.global.v2.b32" not in plain
    # split_kv lets its combine launch early (programmatic dependent launch); plain has none
    assert ptx.count("griddepcontrol.launch_dependents") == 1
    assert "griddepcontrol" not in plain


@pytest.mark.skipif(shutil.which("ptxas") is None or build.find_nvdisasm() is None,
                    reason="needs ptxas and nvdisasm (CUDA toolkit)")
@pytest.mark.parametrize("load", ["tma", "cp_async"])
def test_decode_kernels_keep_wgmma_async_and_the_key_loop_off_the_stack(load):
    """The decode variants (pack_gqa, split_kv, the idle warpgroup's pass) keep the
    consumers' WGMMAs asynchronous, and no local-memory access lies between the first and
    the last WGMMA (the key-block loops). Non-causal, ptxas spills a few tile-level
    scalars under the 232-register budget, outside those loops (docs/design.md)."""
    for causal in (False, True):
        cfg = AttentionConfig(page_size=64, causal=causal, load=load, pack_gqa=True,
                              split_kv=True)
        ptx = build.compile_paged_attention(cfg, "BFloat16").ptx
        assert "C7512" not in build.ptxas_log(ptx)
        lines = build.sass(ptx).splitlines()
        gemms = [i for i, line in enumerate(lines) if "HGMMA" in line]
        stack = [i for i, line in enumerate(lines) if re.search(r"\b(STL|LDL)\b", line)]
        assert gemms and not [i for i in stack if gemms[0] <= i <= gemms[-1]]


def test_decode_options_rules():
    with pytest.raises(ValueError, match="paged kernel"):
        AttentionConfig(pack_gqa=True)
    with pytest.raises(ValueError, match="paged kernel"):
        AttentionConfig(split_kv=True)
    with pytest.raises(ValueError, match="pingpong"):
        AttentionConfig(head_dim=64, page_size=64, pack_gqa=True, schedule="pingpong")
    # d = 64's pingpong default becomes overlap when packed; the idle warpgroup skips
    # its GEMMs only where no turns are taken
    assert AttentionConfig(head_dim=64, page_size=64, pack_gqa=True).schedule == "overlap"
    assert AttentionConfig(head_dim=64, page_size=64).pingpong
    assert not AttentionConfig(head_dim=64, page_size=64).skips_idle
    assert AttentionConfig(page_size=64, pack_gqa=True).skips_idle
    assert not AttentionConfig(page_size=64).skips_idle


def test_decode_rules_pack_and_split_from_shapes():
    from cutetma.tuning.attention import MIN_BLOCKS_PER_SPLIT, paged_pack_gqa, paged_splits

    assert paged_pack_gqa(1, 4) and paged_pack_gqa(16, 8) and not paged_pack_gqa(1, 1)
    assert not paged_pack_gqa(333, 4)
    assert paged_splits(tiles=512, key_blocks=32, sm_count=132) == 1  # b 64 x 8 K/V heads
    assert paged_splits(tiles=8, key_blocks=512, sm_count=132) == 16  # b 1, 64k keys
    assert paged_splits(tiles=8, key_blocks=8, sm_count=132) == 8 // MIN_BLOCKS_PER_SPLIT
    assert paged_splits(tiles=8, key_blocks=3, sm_count=132) == 1


@pytest.mark.parametrize("bounds", [(0, 5, 40, 97), (0, 0, 50, 97, 97), (0, 97)])
def test_combine_splits_is_attention_over_all_the_keys(bounds):
    """Splits of the keys, each attended on its own (empty ones included: lse -inf, out 0),
    merged by ``combine_splits_ref`` (the split-KV merge's fp32 statement): the attention
    over all the keys."""
    import torch

    from cutetma.reference import attention_ref, combine_splits_ref

    torch.manual_seed(0)
    b, s_q, h, h_kv, d = 2, 3, 4, 2, 64
    q = torch.randn(b, s_q, h, d)
    k, v = torch.randn(b, 97, h_kv, d), torch.randn(b, 97, h_kv, d)
    parts = [attention_ref(q, k[:, lo:hi], v[:, lo:hi]) for lo, hi in itertools.pairwise(bounds)]
    o_parts = torch.cat([o for o, _ in parts])  # split s of sequence i at s b + i
    lse_parts = torch.cat([lse for _, lse in parts])
    out, lse = torch.empty(b, s_q, h, d), torch.empty(b, h, s_q)
    combine_splits_ref(o_parts, lse_parts, len(parts), out, lse)
    want_out, want_lse = attention_ref(q, k, v)
    torch.testing.assert_close(out, want_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse, want_lse, atol=1e-5, rtol=1e-5)
    # no keys at all: out 0, lse -inf, no NaN
    empty = attention_ref(q, k[:, :0], v[:, :0])
    combine_splits_ref(torch.cat([empty[0]] * 2), torch.cat([empty[1]] * 2), 2, out, lse)
    assert torch.all(out == 0) and torch.all(lse == float("-inf"))


def test_split_combine_compiles_to_vector_loads():
    """The merge kernel: one warp per row, the partials read as whole 16-byte vectors at
    d = 128 and 256 (8 bytes at 64), the output stored once per lane, nothing read before
    the forward it depends on has finished."""
    for d, load in ((64, "ld.global.v2.b32"), (128, "ld.global.v4.b32"),
                    (256, "ld.global.v4.b32")):
        ptx = build.compile_split_combine(d, "BFloat16").ptx
        assert ptx.count(load) >= 2 and "shfl.sync.idx.b32" in ptx
        # launched as the forward's dependent: it waits for the forward before any read
        assert ptx.count("griddepcontrol.wait") == 1
        assert ptx.index("griddepcontrol.wait") < ptx.index("ld.global")


def test_kv_append_copies_16_byte_vectors_with_a_few_index_loads():
    """The new-key append (``KVAppend``): each (head, 16-byte column) of a row a vector load
    and a vector store for K and for V; per row one page-table load, the lengths' loads and
    (varlen) the sequence found by the CTA's threads together, one compare each and a
    barrier, not a chain of dependent loads."""
    for varlen in (False, True):
        ptx = build.compile_kv_append(256, varlen).ptx
        assert ptx.count("ld.global.v4.b32") == 2 and ptx.count("st.global.v4.b32") == 2
        scalar_loads = ptx.count("ld.global") - 2
        assert scalar_loads <= (8 if varlen else 4), scalar_loads
        assert ("bar.sync" in ptx) == varlen


def test_varlen_q_gathers_q_and_keeps_the_key_loop_off_the_stack():
    """varlen_q: Q rows gathered from each sequence's offset (no Q box), the key-block loop
    free of local memory (ptxas spills a few tile-level scalars outside it), both
    producers, packed or not."""
    for kw in (dict(load="tma"), dict(load="tma", pack_gqa=True, split_kv=True, causal=True),
               dict(load="cp_async", page_size=16, causal=True)):
        cfg = AttentionConfig(**{"page_size": 64, **kw, "varlen_q": True})
        ptx = build.compile_paged_attention(cfg, "BFloat16").ptx
        per_stage = 2 * (128 // cfg.kv_box) if cfg.load == "tma" else 0
        assert ptx.count("cp.async.bulk.tensor") == 2 * 2 * per_stage  # K, V only
        assert "cp.async.cg.shared.global" in ptx
        if shutil.which("ptxas") and build.find_nvdisasm():
            assert "C7512" not in build.ptxas_log(ptx)
            lines = build.sass(ptx).splitlines()
            gemms = [i for i, line in enumerate(lines) if "HGMMA" in line]
            stack = [i for i, line in enumerate(lines) if re.search(r"\b(STL|LDL)\b", line)]
            assert not [i for i in stack if gemms[0] <= i <= gemms[-1]], kw
    with pytest.raises(ValueError, match="paged kernel"):
        AttentionConfig(varlen_q=True)


def test_varlen_reference_is_the_per_sequence_reference():
    import torch

    from cutetma.reference import paged_attention_ref

    torch.manual_seed(1)
    lens_k, page = [40, 17, 1], 8  # queries per sequence: 3, 0, 5
    pool = torch.randn(12, page, 2, 64), torch.randn(12, page, 2, 64)
    table = torch.randperm(12).int().view(3, 4)
    cache_seqlens = torch.tensor(lens_k, dtype=torch.int32)
    cu = torch.tensor([0, 3, 3, 8], dtype=torch.int32)
    q = torch.randn(8, 4, 64)
    out, lse = paged_attention_ref(q, *pool, cache_seqlens, table, True, cu_seqlens_q=cu)
    assert out.shape == (8, 4, 64) and lse.shape == (4, 8)
    for i in (0, 2):
        rows = slice(int(cu[i]), int(cu[i + 1]))
        want, want_lse = paged_attention_ref(
            q[rows][None], *pool, cache_seqlens[i:i + 1], table[i:i + 1], True)
        torch.testing.assert_close(out[rows], want[0])
        torch.testing.assert_close(lse[:, rows], want_lse[0])


def test_check_contents_names_the_bad_entry():
    """``check_contents``: the checks that read the tensors (host side, CPU tensors here)."""
    import torch

    from cutetma.kvcache import check_cache_contents

    cache = torch.empty(6, 16, 2, 64)
    table = torch.tensor([[0, 1, 2], [3, -1, -1]], dtype=torch.int32)
    check_cache_contents(None, cache, torch.tensor([40, 16], dtype=torch.int32), table)
    with pytest.raises(ValueError, match=r"cache_seqlens\[1\] = -1"):
        check_cache_contents(None, cache, torch.tensor([40, -1], dtype=torch.int32), table)
    with pytest.raises(ValueError, match=r"cache_seqlens\[0\] = 49: outside \[0, 48\]"):
        check_cache_contents(None, cache, torch.tensor([49, 1], dtype=torch.int32), table)
    with pytest.raises(ValueError, match=r"page_table\[1, 1\] = -1"):
        check_cache_contents(None, cache, torch.tensor([40, 17], dtype=torch.int32), table)
    with pytest.raises(ValueError, match=r"page_table\[0, 2\] = 9"):
        check_cache_contents(None, cache, torch.tensor([33, 0], dtype=torch.int32),
                             torch.tensor([[0, 1, 9], [3, 4, 5]], dtype=torch.int32))
    q = torch.empty(5, 4, 64)
    lens = torch.tensor([40, 16], dtype=torch.int32)
    check_cache_contents(q, cache, lens, table, torch.tensor([0, 2, 5], dtype=torch.int32))
    for cu in ([1, 2, 5], [0, 3, 2], [0, 2, 6]):
        with pytest.raises(ValueError, match="cu_seqlens_q"):
            check_cache_contents(q, cache, lens, table, torch.tensor(cu, dtype=torch.int32))


def test_late_wait_computes_p_once_in_the_paged_causal_kernel():
    """``tuning.attention.PAGED_PV_WAIT``'s choice: with the wait for P V behind the
    loop's back edge ("late") the paged causal kernel computes exp2 as often as the dense
    one (P once per key block); with "early" its PTX has more (P computed again after the
    wait: docs/perf-log.md)."""
    dense = build.compile_attention(AttentionConfig(head_dim=128, causal=True), "BFloat16",
                                    as_from_dlpack=True).ptx.count("ex2.approx")
    late = build.compile_paged_attention(AttentionConfig(
        head_dim=128, causal=True, page_size=128, pv_wait="late"), "BFloat16").ptx
    early = build.compile_paged_attention(AttentionConfig(
        head_dim=128, causal=True, page_size=128), "BFloat16").ptx
    assert late.count("ex2.approx") == dense
    assert early.count("ex2.approx") > dense
    from cutetma.tuning import attention as attention_tuning

    assert attention_tuning.paged_pv_wait(128, True) == "late"  # timed: docs/design.md
    assert attention_tuning.paged_pv_wait(128, False) == "late"
    assert attention_tuning.paged_pv_wait(128, True, pack_gqa=True) == ""  # decode: not timed


def _line_walk(dtype_name, block_n, d):
    """Per warpgroup thread t, as the DSL lays the cp.async-paged producer's copies out
    (``cpasync.LineViews`` of K and of V^T): {"K": [(pass, key)] of its copies, "V": the
    same, "held": [key] whose page (and address) lane t looks up, one per entry}."""
    from cutetma import dsl
    from cutetma.copy import cpasync as cpa

    cutlass, cute = dsl.cutlass()
    dtype = getattr(cutlass, dtype_name)
    walk_of = {}

    @cute.jit
    def walk():
        ptr = cute.make_ptr(dtype, 0, cute.AddressSpace.smem, assumed_align=128)
        sK = cute.make_tensor(ptr, cute.make_layout((block_n, d, 2),
                                                    stride=(d, 1, block_n * d)))
        sVt = cute.make_tensor(ptr, cute.make_layout((d, block_n, 2),
                                                     stride=(1, d, block_n * d)))
        along = cpa.segment_lanes(dtype, d)
        for t in cutlass.range_constexpr(128):
            k = cpa.LineViews(sK, (block_n, d), t, 128, 0, along)
            v = cpa.LineViews(sVt, (d, block_n), t, 128, 1, along)
            copies = {}
            for name, views in (("K", k), ("V", v)):
                copies[name] = [
                    (views.pass_of(i, j), int(views.first_line + views.tXc0[(0, i, j)][
                        views.key_mode]))
                    for i in range(cute.size(views.tXsX, mode=[1]))
                    for j in range(cute.size(views.tXsX, mode=[2]))]
            held = [int(k.first_line + k.held_pass(e, t % 32) * k.lines_at_once)
                    for e in range(k.entries) if k.held_pass(e, t % 32) < k.passes]
            walk_of[t] = {**copies, "held": held, "along": along}

    walk()
    return walk_of


@pytest.mark.parametrize("dtype_name,d,block_n", [
    ("BFloat16", 64, 128), ("BFloat16", 128, 128), ("BFloat16", 128, 176),
    ("BFloat16", 256, 64), ("BFloat16", 256, 80), ("Float8E4M3FN", 128, 192),
    ("Float8E4M3FN", 64, 128), ("Float8E4M3FN", 256, 128)])
def test_cp_async_paged_lane_takes_its_keys_line(dtype_name, d, block_n):
    """The cp.async-paged producer looks a block's pages up once per lane and hands each
    copy its line's address by shuffle from lane p % along of its segment, entry p // along
    (``cpasync.LineViews``): the line a thread's copy of pass p receives must be the key that
    copy writes, in K and in V^T alike, for every thread of the warpgroup (a wrong lane reads
    another key's line: silently wrong output); each key is copied d * width / 16 times per
    operand, and each key's page looked up once."""
    walk = _line_walk(dtype_name, block_n, d)
    along = walk[0]["along"]
    width = 1 if dtype_name.startswith("Float8") else 2
    assert 32 % along == 0 and along == min(d * width // 16, 8)
    for t, mine in walk.items():
        segment = t - t % along
        for name in ("K", "V"):
            for p, key in mine[name]:
                owner = walk[segment + p % along]
                assert owner["held"][p // along] == key, (name, t, p)
        assert sorted(mine["K"]) == sorted(mine["V"])
    vectors = d * width // 16
    for name in ("K", "V"):
        copied = sorted(key for mine in walk.values() for _, key in mine[name])
        assert copied == sorted(list(range(block_n)) * vectors)
    looked_up = sorted(key for mine in walk.values() for key in mine["held"])
    assert looked_up == list(range(block_n))  # once per key: one segment copies it
