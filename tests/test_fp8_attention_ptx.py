"""FP8 attention's operand orders on the CPU (``kernels.attention.fp8_operands``): the key
permutation that lets P's e4m3 A fragment be read where the fp32 accumulator left it,
checked against CuTe's partitions of both tiled MMAs for every thread, and V^T built in the
same order, so that the permuted product is the plain one."""

import re

import pytest

from cutetma.kernels.attention import fp8_operands as ops


def test_key_order_is_a_permutation_of_each_chunk():
    assert sorted(ops.KEY_ORDER) == list(range(ops.CHUNK))
    # FlashAttention-3's: A slots 4c .. 4c+3 hold keys 2c, 2c+1, 2c+8, 2c+9
    assert ops.KEY_ORDER[:8] == (0, 1, 8, 9, 2, 3, 10, 11)
    assert ops.KEY_ORDER[16:20] == (16, 17, 24, 25)


def _orders(block_n):
    from cutetma import dsl

    cutlass, cute = dsl.cutlass()
    import cutlass.utils.hopper_helpers as sm90
    from cutlass.cute.nvgpu import warpgroup

    found = []

    @cute.jit
    def trace():
        f8, k_major = cutlass.Float8E4M3FN, cute.nvgpu.OperandMajorMode.K
        qk = sm90.make_trivial_tiled_mma(f8, f8, k_major, k_major, cutlass.Float32, (1, 1, 1),
                                         tiler_mn=(64, block_n))
        pv = sm90.make_trivial_tiled_mma(f8, f8, k_major, k_major, cutlass.Float32, (1, 1, 1),
                                         tiler_mn=(64, 128),
                                         a_source=warpgroup.OperandSource.RMEM)
        found.append(ops.p_from_accumulator(qk, pv, 64, block_n))

    trace()
    return found[0]


@pytest.mark.parametrize("block_n", [128, 192])
def test_p_fragment_reads_the_accumulator_in_place(block_n):
    """Every one of the 128 threads finds each A value among its own accumulator values
    under the key order, with one index list for all (the kernel's conversion is then a
    trace-time reordering inside each thread, no shuffles)."""
    order = _orders(block_n)
    assert sorted(order) == list(range(block_n // 2))
    first = [0, 1, 4, 5, 2, 3, 6, 7, 8, 9, 12, 13, 10, 11, 14, 15]
    assert order[:16] == first
    assert order[16:32] == [i + 16 for i in first]


def test_transposed_v_in_key_order_keeps_the_product():
    """P V with P's columns renamed by the key order and V^T stored in it equals P V; keys
    past s_k are zeros in V^T; e4m3 stays e4m3."""
    import torch

    b, s_k, h_kv, d, block_n = 2, 100, 3, 16, 64
    v = torch.randn(b, s_k, h_kv, d, dtype=torch.float64)
    p = torch.randn(b, h_kv, 5, s_k, dtype=torch.float64)
    vt = ops.transpose_v(v, block_n)
    assert vt.shape == (b, h_kv, d, 128)
    keys = torch.tensor([ops.key_of_slot(s) for s in range(128)])
    a = torch.zeros(b, h_kv, 5, 128, dtype=torch.float64)
    a[..., keys < s_k] = p[..., keys[keys < s_k]]  # A's slot s holds P's key key_of_slot(s)
    want = torch.einsum("bhqk,bkhd->bhqd", p, v)
    assert torch.allclose(a @ vt.transpose(-1, -2), want, rtol=0, atol=1e-12)
    assert vt[..., keys >= s_k].abs().sum() == 0
    assert vt.stride(3) == 1  # keys contiguous: the kernel's K-major B operand
    v8 = v.to(torch.float8_e4m3fn)
    vt8 = ops.transpose_v(v8, block_n)
    assert vt8.dtype == torch.float8_e4m3fn
    assert torch.equal(vt8.double(), ops.transpose_v(v8.double(), block_n))


# cp.async where its tile or wait differs from TMA's (d = 256's 96 keys, d = 128 causal's
# early wait); elsewhere the two share the consumer and differ only in the producer, which
# the 16-bit PTX tests cover
@pytest.mark.parametrize("d,causal,load", [
    (64, False, "tma"), (128, True, "tma"), (256, True, "tma"),
    (128, True, "cp_async"), (256, True, "cp_async")])
def test_fp8_attention_ptx(d, causal, load):
    """The attention kernel with e4m3 operands: both GEMMs are e4m3 WGMMAs (k = 32 steps),
    V is read K-major from V^T, P's conversion moves no value between threads (no shuffles
    beyond the 16-bit kernel's row reductions), and ptxas neither spills nor serializes."""
    import collections
    import re
    import shutil

    from cutetma.fp8_attention import fp8_config
    from cutetma.kernels import build
    from cutetma.kernels.attention.config import AttentionConfig

    cfg = fp8_config(d, causal, load)
    ptx = build.compile_attention(cfg, "Float8E4M3FN").ptx
    half = build.compile_attention(AttentionConfig(head_dim=d, causal=causal, load=load),
                                   "BFloat16", as_from_dlpack=True).ptx  # the defaults' build
    shapes = re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n(\d+)k32\.f32\.e4m3\.e4m3", ptx)
    assert set(shapes) == {str(cfg.block_n), str(d)} and "bf16" not in " ".join(shapes)
    assert not re.search(r"wgmma[^\n]*bf16", ptx)
    assert ptx.count("shfl.sync") == half.count("shfl.sync")
    # P converts as pairs of its own values (each value once per conversion site: the loop's
    # and its tail's, which read the same registers; no shared zero partner, no byte
    # shuffles after): the vector conversion of _to_p
    pairs = re.findall(r"cvt\.rn\.satfinite\.e4m3x2\.f32\s+%\w+, (%\w+), (%\w+);", ptx)
    uses = collections.Counter(r for pair in pairs for r in pair)
    assert pairs and all(a != b for a, b in pairs)
    assert max(uses.values()) <= 2, uses.most_common(3)
    # the descales: two loads per tile (the scores' and the output's factor); 16-bit reads
    # none
    assert len(re.findall(r"ld\.global", ptx)) == 2
    assert "ld.global" not in half
    if shutil.which("ptxas"):
        log = build.ptxas_log(ptx)
        assert "serialized" not in log
        # d = 256's 128-key TMA tile spills one register (4 bytes) and measured 1.47x our
        # bf16 against 1.12x for the spill-free 64-key tile (docs/design.md, "FP8 attention")
        allowed = 4 if (d, load) == (256, "tma") else 0
        assert max(int(x) for x in re.findall(r"(\d+) bytes spill stores", log)) <= allowed


# V transposed in shared memory: dense under both producers, paged under TMA (a 192-key
# stage of 16-key page boxes) and cp.async (page 17)
@pytest.mark.parametrize("d,causal,load,page_size", [
    (128, True, "cp_async", 0), (256, True, "tma", 0),
    (128, True, "tma", 16), (128, False, "cp_async", 17)])
def test_fp8_v_transposed_in_shared_memory_ptx(d, causal, load, page_size):
    """``v_transpose="smem"``: P V still reads a K-major e4m3 V^T, which the producer
    warpgroup writes from the raw ring: per step of its ``transpose_plan`` 4-byte shared
    loads, 8 byte permutes and 4-byte shared stores (the steps unrolled), then a proxy fence
    before it signals the consumers (their WGMMA reads through the async proxy). One
    transposing site under TMA (warps 1-3 walk the tiles), three under cp.async (after the
    copies of a tile's first block, of its other blocks, and the last block's after the
    walk). ptxas serializes no WGMMA; it spills only where the transposing warps hold 24
    registers beside the TMA walk of a dense tile (a few addresses it parks)."""
    import shutil

    from cutetma.fp8_attention import fp8_config
    from cutetma.kernels import build
    from cutetma.kernels.attention.transposer import split_patches

    cfg = fp8_config(d, causal, load, page_size=page_size, v_transpose="smem")
    assert cfg.transposes_v and cfg.raw_v_stages >= 2
    ptx = (build.compile_paged_attention(cfg, "Float8E4M3FN") if page_size else
           build.compile_attention(cfg, "Float8E4M3FN")).ptx
    shapes = re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n(\d+)k32\.f32\.e4m3\.e4m3", ptx)
    assert set(shapes) == {str(cfg.block_n), str(d)}
    _, _, d_patches, slot_patches = split_patches(d, cfg.block_n, 96 if load == "tma" else 128)
    steps = d_patches * slot_patches
    lines = ptx.splitlines()
    sites: dict = {}  # the transposing sites, by the barrier wait that opens each
    for at in [i for i, line in enumerate(lines) if "prmt.b32" in line]:
        wait = max(i for i in range(at) if "mbarrier.try_wait" in lines[i])
        sites.setdefault(wait, []).append(at)
    assert len(sites) == (1 if load == "tma" else 3)
    for wait, permutes in sites.items():
        site = lines[wait:permutes[-1] + 12]
        assert len(permutes) == 8 * steps
        assert sum(bool(re.search(r"ld\.shared\.[bu]32", line)) for line in site) == 4 * steps
        assert sum("st.shared.b32" in line for line in site) == 4 * steps
        # both rings are swizzled: the addresses carry the XOR (a view whose swizzle sat in
        # its pointer lost it in a recast: every V^T byte misplaced)
        assert sum("xor.b32" in line for line in site) >= 2
    assert "fence.proxy.async.shared::cta" in ptx
    if shutil.which("ptxas"):
        log = build.ptxas_log(ptx)
        assert "serialized" not in log
        spilled = max(int(x) for x in re.findall(r"(\d+) bytes spill stores", log))
        assert spilled <= (64 if (load, page_size) == ("tma", 0) else 0)


def test_attention_fp8_refuses_before_launch():
    """Clear errors before any launch (the ones a CPU tensor reaches: the device is checked
    right after the dtype): a 16-bit input, a 3D one, a CPU one; bad descales."""
    import torch

    import cutetma

    q = torch.zeros(1, 8, 2, 64, dtype=torch.float8_e4m3fn)
    with pytest.raises(TypeError, match="float8_e4m3fn"):
        cutetma.attention_fp8(q.to(torch.bfloat16), q, q)
    with pytest.raises(ValueError, match="must be"):
        cutetma.attention_fp8(q[0], q, q)
    with pytest.raises(ValueError, match="CUDA"):
        cutetma.attention_fp8(q, q, q)
    from cutetma.fp8_attention import _descale

    cpu = torch.device("cpu")
    for bad in (0.0, -1.0, float("nan"), float("inf"), True, "1", torch.ones(2),
                torch.ones(3, 2)):
        with pytest.raises(ValueError):
            _descale("v_descale", bad, 2, 3, cpu)
    with pytest.raises(TypeError, match="float32"):
        _descale("v_descale", torch.ones(2, 3, dtype=torch.int32), 2, 3, cpu)
    with pytest.raises(ValueError, match="is on"):
        _descale("v_descale", torch.ones(2, 3), 2, 3, torch.device("cuda", 0))
    assert _descale("q_descale", 0.5, 2, 3, cpu) == 0.5
    assert _descale("q_descale", torch.tensor([0.5]), 2, 3, cpu).shape == ()
    assert _descale("q_descale", torch.ones(2, 3, dtype=torch.bfloat16), 2, 3,
                    cpu).dtype == torch.float32


def test_descales_tensor_layout():
    """The kernel's (b, h_kv, 2) descales: the scores' factor q x k and the output's v per
    (batch, K/V head), from floats, one-element tensors and (b, h_kv) tensors alike."""
    import torch

    from cutetma.fp8_attention import descales

    cpu = torch.device("cpu")
    per = torch.arange(1.0, 7.0).reshape(2, 3)
    got = descales(per, torch.tensor(0.5), 4.0, 2, 3, cpu)
    assert got.shape == (2, 3, 2) and got.dtype == torch.float32 and got.is_contiguous()
    assert torch.equal(got[..., 0], per * 0.5)
    assert torch.equal(got[..., 1], torch.full((2, 3), 4.0))
    assert torch.equal(descales(2.0, 3.0, 0.25, 1, 1, cpu), torch.tensor([[[6.0, 0.25]]]))


def test_fp8_benchmark_summary():
    """``benchmarks/attention_fp8.py``'s summary: FP8 over bf16 at s >= 4k only, and TMA
    over cp.async."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import attention_fp8

    rows = [dict(d=128, s=s, causal=False, tma=t, cp_async=c, bf16=b)
            for s, t, c, b in ((2048, 100.0, 50.0, 100.0), (4096, 900.0, 600.0, 600.0),
                               (8192, 800.0, 500.0, 500.0))]
    summary = attention_fp8.summarize(rows)
    assert summary["geomean_tma_over_bf16_s>=4k"] == pytest.approx((1.5 * 1.6) ** 0.5)
    assert summary["min_tma_over_bf16_s>=4k"] == pytest.approx(1.5)
    assert summary["median_tma_over_cp_async"] == pytest.approx(1.6)


def test_v_transpose_kernel_ptx():
    """``VTranspose``: a thread's 32 bytes of a column read one byte per key row, with no
    branch around the loads (rows past s_k are clamped, their values zeroed by selects),
    and written as two 16-byte stores."""
    from cutetma.kernels import build

    ptx = build.compile_v_transpose(128).ptx
    assert len(re.findall(r"ld\.global\.b8", ptx)) == 32
    assert set(re.findall(r"st\.global[.\w]*", ptx)) == {"st.global.v4.b32"}
    assert len(re.findall(r"st\.global\.v4", ptx)) == 2
    assert not re.search(r"\bbra\b", ptx)


@pytest.mark.parametrize("d,block_n", [(128, 192), (256, 128), (64, 128)])
def test_transposer_patch_meets_two_lanes_per_bank(d, block_n):
    """The transposer's warp patch (4 lanes along d, 8 along the key slots), evaluated on
    the raw and V^T stage layouts: no load or store instruction has more than 2 lanes on
    distinct words of one bank; a warp laid along the slots has 8 on its loads, one laid
    along d 16 on its stores."""
    from cutetma.kernels.attention.transposer import D_LANES, patch_bank_conflicts

    assert patch_bank_conflicts(d, block_n) == (2, 2) and D_LANES == 4
    along_d = min(32, d // 4)  # as many lanes along d as a patch can take
    assert patch_bank_conflicts(d, block_n, along_d)[1] >= 8
    if block_n % 128 == 0:  # 32 lanes along the slots fit whole patches
        assert patch_bank_conflicts(d, block_n, 1)[0] >= 8


def _prmt(a, b, selector):
    """PTX's prmt.b32 (default mode): byte i of the result is byte (selector >> 4 i) & 7 of
    the pair (b:a)."""
    pool = [(a >> 8 * i) & 255 for i in range(4)] + [(b >> 8 * i) & 255 for i in range(4)]
    return sum(pool[(selector >> 4 * i) & 7] << 8 * i for i in range(4))


@pytest.mark.parametrize("d,block_n,threads", [(128, 192, 96), (256, 128, 96),
                                               (256, 96, 128), (64, 128, 96)])
def test_transposer_writes_v_transposed_in_key_order(d, block_n, threads):
    """The transposer's addressing (its ``transpose_plan``: a thread's origin on the stage
    layouts' 4-byte views, ``stage_words``, then one XOR and one add per access) and byte
    permutes, replayed on the host: every byte of the V^T stage is written exactly once,
    with the value of the key its slot names (``key_of_slot``), for TMA's 96 transposing
    threads and cp.async's 128."""
    from cutetma import dsl
    from cutetma.kernels.attention import transposer as t
    from cutetma.kernels.attention.fp8_operands import key_of_slot

    def layouts():
        raw, vt = t.stage_layouts(d, block_n)
        words = (t.stage_words(raw), t.stage_words(vt))
        return ({(x, k): raw((x, k)) for x in range(d) for k in range(block_n)},
                {(x, w): words[0]((x, w)) for x in range(d // 4) for w in range(block_n)},
                {(x, s): vt((x, s)) for x in range(d) for s in range(block_n)},
                {(x, w): words[1]((x, w)) for x in range(d) for w in range(block_n // 4)},
                t.transpose_plan(*words, d, block_n, threads))

    raw, raw_words, vt, vt_words, plan = dsl.on_host(layouts)
    assert plan.warps * plan.d_patches * plan.slot_patches * 512 == d * block_n
    value = {(x, k): (7 * x + 13 * k) % 251 + 1 for x in range(d) for k in range(block_n)}
    memory = bytearray(d * block_n)
    for at, offset in raw.items():
        memory[offset] = value[at]
    written = bytearray(d * block_n)
    stores = 0
    for warp in range(plan.warps):
        for lane in range(32):
            d_word, slot_word = plan.origin(warp, lane)
            raw_at = raw_words[d_word, t.first_key(slot_word)]
            vt_at = vt_words[4 * d_word, slot_word]
            for step in range(len(plan.loads)):
                words = [int.from_bytes(memory[4 * ((raw_at ^ xor) + add):][:4], "little")
                         for xor, add in plan.loads[step]]
                low = (_prmt(words[0], words[1], t.PAIR_LOW),
                       _prmt(words[2], words[3], t.PAIR_LOW))
                high = (_prmt(words[0], words[1], t.PAIR_HIGH),
                        _prmt(words[2], words[3], t.PAIR_HIGH))
                for b, (pair, select) in enumerate(((low, t.ROW_EVEN), (low, t.ROW_ODD),
                                                    (high, t.ROW_EVEN), (high, t.ROW_ODD))):
                    xor, add = plan.stores[step][b]
                    offset = 4 * ((vt_at ^ xor) + add)
                    assert not any(written[offset:offset + 4]), "a V^T word written twice"
                    written[offset:offset + 4] = _prmt(*pair, select).to_bytes(4, "little")
                    stores += 1
    assert 4 * stores == d * block_n
    assert all(written[vt[x, s]] == value[x, key_of_slot(s)]
               for x in range(d) for s in range(block_n))
