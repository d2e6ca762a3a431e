"""The attention backward compiled for sm_90a on the CPU: its GEMMs, reductions and loads in
the PTX, ptxas's verdict (no serialized WGMMA, spills bounded), its configuration's rules, the
prepared launch's argument list, and the torch face's checks before any launch."""

import re
import shutil

import pytest

from cutetma.kernels import build
from cutetma.kernels.attention.config import BackwardConfig


@pytest.mark.parametrize("load,d,block_m", [("tma", 64, 0), ("tma", 128, 0), ("cp_async", 64, 0),
                                             ("cp_async", 128, 0), ("tma", 64, 128)])
def test_backward_ptx(d, load, block_m):
    """Per query block of m rows and consumer warpgroup: S^T and dP^T (d / 16 m64n{m}k16
    steps each), dV and dK (m / 16 m64n{d}k16 steps each), dQ (8 m64n{d/2}k16 steps per 64
    rows, the warpgroups splitting d; at 128 rows 8 m64n{d}k16, each warpgroup its 64
    rows); dQ leaves through shared memory in fragment order, one 2D TMA reduction (add)
    per warpgroup; the LSE and D ride with Q and dO (3D TMA boxes, or 16-byte cp.async);
    the producer is TMA's or cp.async's."""
    cfg = BackwardConfig(head_dim=d, load=load, block_m=block_m)
    m = cfg.block_m
    ptx = build.compile_attention_backward(cfg).ptx
    shapes = re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m64n\d+k16)\.f32\.bf16\.bf16", ptx)
    counts = {s: shapes.count(s) for s in set(shapes)}
    want: dict = {}
    dq = (f"m64n{d}k16", 8) if m == 128 else (f"m64n{d // 2}k16", 8 * m // 64)
    for shape, steps in ((f"m64n{m}k16", 2 * d // 16), (f"m64n{d}k16", 2 * m // 16), dq):
        want[shape] = want.get(shape, 0) + steps
    assert counts == want
    reductions = re.findall(r"cp\.reduce\.async\.bulk\.tensor\.2d\.global\.shared::cta\.add",
                            ptx)
    assert len(reductions) == 1
    # Q, dO, K, V: 4D boxes; the LSE and D: one 3D box each
    if load == "tma":
        assert len(re.findall(r"cp\.async\.bulk\.tensor\.3d\.shared", ptx)) == 2
    tma_loads = len(re.findall(r"cp\.async\.bulk\.tensor\.\dd\.shared", ptx))
    # dK and dV (16-bit here) leave by TMA stores from the freed Q / dO stages, stmatrix in
    tma_stores = re.findall(r"cp\.async\.bulk\.tensor\.4d\.global\.shared", ptx)
    assert len(tma_stores) == 2 * d // 64
    assert len(re.findall(r"stmatrix\.sync\.aligned\.m8n8\.x4\.shared", ptx)) == 2 * d // 16
    assert "st.global" not in ptx
    cp_async = len(re.findall(r"cp\.async\.cg\.shared\.global", ptx))
    assert (tma_loads > 0, cp_async > 0) == ((True, False) if load == "tma" else (False, True))


@pytest.mark.skipif(shutil.which("ptxas") is None, reason="needs ptxas (CUDA toolkit)")
@pytest.mark.parametrize("load", ["tma", "cp_async"])
@pytest.mark.parametrize("causal", [False, True])
def test_backward_ptxas(causal, load):
    """No WGMMA serialized (C7512 / C7520); no spills with the TMA producer at d = 128, and
    at most 240 bytes with cp.async's (212 measured)."""
    log = build.ptxas_log(build.compile_attention_backward(
        BackwardConfig(head_dim=128, causal=causal, load=load)).ptx)
    assert "serialized" not in log
    spills = [int(x) for x in re.findall(r"(\d+) bytes spill stores", log)]
    assert spills and max(spills) <= (0 if load == "tma" else 240), log


@pytest.mark.skipif(shutil.which("ptxas") is None, reason="needs ptxas (CUDA toolkit)")
@pytest.mark.parametrize("causal", [False, True])
def test_128_query_tile_fits_at_d64(causal):
    """FA4's 128 x 128 tile at d = 64 with TMA: no WGMMA serialized and no spills, which
    needs dV / dK started by the accumulate flag (a zero-fill under an in-flight WGMMA
    serializes them all), dV issued after the dS math and dK / dV stored through 64-row
    views of the Q / dO stage (docs/design.md)."""
    log = build.ptxas_log(build.compile_attention_backward(
        BackwardConfig(head_dim=64, causal=causal, block_m=128)).ptx)
    assert "serialized" not in log
    assert "0 bytes spill stores" in log, log


@pytest.mark.skipif(shutil.which("ptxas") is None or build.find_nvdisasm() is None,
                    reason="needs ptxas and nvdisasm (the test extra's nvidia-cuda-nvdisasm)")
def test_backward_key_loop_builds_descriptors_in_uniform_registers():
    """The consumer's warpgroup index is marked warp-uniform, so the WGMMA descriptors of its
    slices (K's and V's rows) are built in uniform registers: no R2UR in the query-block loop.
    Unmarked, the d = 128 loop had 50 R2UR moves among 571 instructions (462 marked)."""
    cfg = BackwardConfig(head_dim=128, causal=False, load="tma")
    loop = build.innermost_loop(build.sass(build.compile_attention_backward(cfg).ptx),
                                ("HGMMA", "MUFU.EX2"))
    assert loop and not any(op.startswith("R2UR") for op in loop), len(loop)


def test_backward_config_rules():
    with pytest.raises(ValueError, match="head_dim=96"):
        BackwardConfig(head_dim=96)
    wide = BackwardConfig(head_dim=256)
    assert (wide.block_m, wide.block_n, wide.consumers, wide.splits_d) == (64, 64, 2, True)
    assert wide.smem_bytes() <= 227 * 1024 and wide.stages == 2
    with pytest.raises(ValueError, match="64 x 64 at d = 256"):
        BackwardConfig(head_dim=256, block_n=128)
    with pytest.raises(ValueError, match="load"):
        BackwardConfig(load="ldgsts")
    with pytest.raises(ValueError, match="64 queries x 128 keys"):
        BackwardConfig(block_m=128)
    cfg = BackwardConfig()
    assert (cfg.threads, cfg.registers) == (384, (24, 240))
    # dV after the dS math by default; under it only where 64-row blocks hold it
    assert cfg.dv_issue == "late" and BackwardConfig(dv_issue="early").dv_issue == "early"
    with pytest.raises(ValueError, match="dv_issue"):
        BackwardConfig(head_dim=64, dv_issue="early")
    with pytest.raises(ValueError, match="dv_issue"):
        BackwardConfig(head_dim=256, dv_issue="early")
    assert BackwardConfig(load="cp_async").registers == (24, 240)
    assert cfg.smem_bytes() <= 227 * 1024


def test_backward_launch_args_match_the_dsl():
    """``runtime.BackwardLaunch`` hands the compiled program the argument list the DSL's own
    call builds (each value checked behind its address)."""
    import ctypes

    import torch
    from cuda.bindings import driver as cuda
    from cutlass.cute.runtime import make_ptr

    from cutetma import dsl, runtime

    cutlass, cute = dsl.cutlass()
    launch = runtime.attention_backward_launch(torch.bfloat16, BackwardConfig(head_dim=64))
    bases = [0x7F0000000000 + i * 0x100000 for i in range(10)]
    big = 1 << 33
    sizes = (2, 1000, 4097, 16, 4)
    strides = tuple(big + 16 * i for i in range(12))
    values = (*bases, *sizes, *strides, 0.125, 0xABC)
    ours = launch.args(values)

    def ptr(address, dtype, align):
        return make_ptr(getattr(cutlass, dtype), address, cute.AddressSpace.gmem,
                        assumed_align=align)

    keep = ([ptr(a, "BFloat16", 16) for a in bases[:4]]
            + [ptr(a, "Float32", 4) for a in bases[4:6]]
            + [ptr(a, "Float32", 16) for a in bases[6:9]] + [ptr(bases[9], "Int32", 4)])
    theirs, _ = launch.compiled.generate_execution_args(
        *keep, *sizes, *strides, cutlass.Float32(0.125), cuda.CUstream(0xABC))
    assert len(ours) == len(theirs) == len(runtime.BackwardLaunch.SLOTS) == 29

    def address(p):
        return p.value if isinstance(p, ctypes.c_void_p) else int(p)

    for i, (mine, dsl_arg) in enumerate(zip(ours, theirs, strict=True)):
        kind = runtime.BackwardLaunch.SLOTS[i]
        assert kind.from_address(address(mine)).value == values[i], i
        assert kind.from_address(address(dsl_arg)).value == values[i], i


def test_backward_head_dims():
    """The backward runs for d = 64, 128 and 256 and refuses a head dim it has no kernel
    for, before any launch; at d = 64 the TMA producer takes 128-query blocks, cp.async 64."""
    from cutetma.backward import check_head_dim

    for d in (64, 128, 256):
        check_head_dim(d)
    with pytest.raises(ValueError, match="head_dim 96"):
        check_head_dim(96)
    assert BackwardConfig(head_dim=64).block_m == 128
    assert BackwardConfig(head_dim=64, load="cp_async").block_m == 64
    assert BackwardConfig(head_dim=128).block_m == BackwardConfig(head_dim=256).block_m == 64


@pytest.mark.parametrize("load", ["tma", "cp_async"])
def test_backward_ptx_d256(load):
    """d = 256 (``splits_d``): a CTA of 64 keys, each warpgroup S^T and dP^T for its 32
    queries (16 m64n32k16 steps each), then dQ, dV and dK for its half of d (4 m64n128k16
    steps each, A from shared memory); P^T and dS^T leave by transposing stmatrix (2 each),
    dQ by 16 vector atomics a thread (no TMA reduction), dK and dV by 16 stmatrix and one
    (64, 256) TMA store each (4 boxes of 64 columns)."""
    ptx = build.compile_attention_backward(BackwardConfig(head_dim=256, load=load)).ptx
    shapes = re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m64n\d+k16)\.f32\.bf16\.bf16", ptx)
    assert {s: shapes.count(s) for s in set(shapes)} == {"m64n32k16": 32, "m64n128k16": 12}
    assert len(re.findall(r"red\.relaxed\.gpu\.global\.add\.v4\.f32", ptx)) == 16
    assert "cp.reduce.async.bulk" not in ptx
    assert len(re.findall(r"stmatrix\.sync\.aligned\.m8n8\.x4\.trans\.shared", ptx)) == 4
    assert len(re.findall(r"stmatrix\.sync\.aligned\.m8n8\.x4\.shared", ptx)) == 16
    assert len(re.findall(r"cp\.async\.bulk\.tensor\.4d\.global\.shared", ptx)) == 8
    cp_async = len(re.findall(r"cp\.async\.cg\.shared\.global", ptx))
    assert (cp_async > 0) == (load == "cp_async")


@pytest.mark.skipif(shutil.which("ptxas") is None, reason="needs ptxas (CUDA toolkit)")
@pytest.mark.parametrize("load", ["tma", "cp_async"])
@pytest.mark.parametrize("causal", [False, True])
def test_backward_ptxas_d256(causal, load):
    """d = 256: no WGMMA serialized; no spills with TMA, at most 16 bytes with cp.async's
    producer (8 measured non-causal: its gather runs as a loop, unrolled it spilled 1 KB)."""
    log = build.ptxas_log(build.compile_attention_backward(
        BackwardConfig(head_dim=256, causal=causal, load=load)).ptx)
    assert "serialized" not in log
    spills = [int(x) for x in re.findall(r"(\d+) bytes spill stores", log)]
    assert spills and max(spills) <= (0 if load == "tma" else 16), log


def test_backward_checks_before_launch():
    """Bad input is refused on the host, before any kernel: no GPU needed."""
    import torch

    import cutetma

    def t(*shape, dtype=torch.bfloat16):
        return torch.zeros(*shape, dtype=dtype)

    q, k = t(1, 8, 2, 64), t(1, 8, 2, 64)
    lse = t(1, 2, 8, dtype=torch.float32)
    with pytest.raises(ValueError, match="CUDA"):
        cutetma.attention_backward(q, q, k, k, q, lse)
    with pytest.raises(TypeError, match="float16 or bfloat16"):
        cutetma.attention_backward(q.float(), q, k, k, q, lse)
    with pytest.raises(ValueError, match="CUDA|head_dim"):
        cutetma.attention_backward(t(1, 8, 2, 256), t(1, 8, 2, 256), t(1, 8, 2, 256),
                                   t(1, 8, 2, 256), t(1, 8, 2, 256), lse)
    # the differentiable call reaches the same checks through the custom op
    with pytest.raises(ValueError, match="CUDA"):
        cutetma.attention(q.requires_grad_(True), k, k)
    with pytest.raises(ValueError, match="no config"):
        cutetma.attention(q, k, k, config=cutetma.AttentionConfig(head_dim=64))


def test_no_lane_elected_twice():
    """A TMA copy elects its own lane; issued inside ``elect_one`` the lone elected lane runs
    a full-warp ``elect.sync`` (undefined: it hung a backward on the H200). None in the
    backward, the forward or the GEMM; the detector finds the pattern where it is."""
    from cutetma.kernels.attention import AttentionConfig
    from cutetma.kernels.gemm_config import GemmConfig

    for ptx in (build.compile_attention_backward(BackwardConfig()).ptx,
                build.compile_attention(AttentionConfig(head_dim=128), "BFloat16").ptx,
                build.compile_gemm(GemmConfig(), "BFloat16").ptx):
        assert build.nested_elects(ptx) == 0
    nested = ("elect.sync %r1|%p1, -1;\n\tnot.pred %p2, %p1;\n\t@%p2 bra $L1;\n\t"
              "elect.sync %r2|%p3, -1;\n")
    assert build.nested_elects(nested) == 1


@pytest.mark.parametrize("causal,s_q,s_k", [(False, 37, 53), (True, 41, 41), (True, 20, 45)])
def test_grads_reference_matches_sdpa_in_float64(causal, s_q, s_k):
    """``reference.attention_grads_ref``, the GPU tests' yardstick, against torch SDPA's own
    backward in float64 on the CPU (GQA by repeated K/V heads; causal bottom-right, which
    is SDPA's top-left mask shifted by s_k - s_q)."""
    import torch

    from cutetma.reference import attention_grads_ref

    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, s_q, 4, 16, generator=g, dtype=torch.float64)
    k, v = (torch.randn(2, s_k, 2, 16, generator=g, dtype=torch.float64) for _ in range(2))
    dout = torch.randn(2, s_q, 4, 16, generator=g, dtype=torch.float64)
    ours = attention_grads_ref(dout, q, k, v, causal)
    leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
    qt, kt, vt = (x.transpose(1, 2) for x in (leaves[0], leaves[1].repeat_interleave(2, 2),
                                              leaves[2].repeat_interleave(2, 2)))
    mask = None
    if causal:
        i = torch.arange(s_q)[:, None]
        j = torch.arange(s_k)[None, :]
        mask = j <= i + s_k - s_q
    out = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask)
    out.transpose(1, 2).backward(dout)
    for mine, leaf in zip(ours, leaves, strict=True):
        assert torch.allclose(mine.double(), leaf.grad, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("d", [64, 128])
def test_dq_staging_covers_each_value_once(d):
    """The dQ MMA's partition of the staging buffers seen as one (64, (d / 2, 2)) tile puts
    value (r, c) of dQ at (r, c mod d / 2) of warpgroup c // (d / 2)'s buffer, each of the
    tile's values exactly once (CuTe's layouts evaluated on the host)."""
    import numpy as np

    from cutetma import dsl
    from cutetma.kernels.attention.backward import stage_layout
    from cutetma.layouts import LayoutSpec

    cutlass, cute = dsl.cutlass()
    import cutlass.utils.hopper_helpers as sm90

    def spec(layout):
        return LayoutSpec(tuple(layout.shape), tuple(layout.stride))

    half = d // 2

    def build():
        f32 = cutlass.Float32
        k, mn = cute.nvgpu.OperandMajorMode.K, cute.nvgpu.OperandMajorMode.MN
        mma = sm90.make_trivial_tiled_mma(cutlass.BFloat16, cutlass.BFloat16, k, mn, f32,
                                          (1, 2, 1), tiler_mn=(64, half))
        outer = stage_layout(f32, 64, half, 2, min(half, 32)).outer
        return spec(outer), spec(cute.group_modes(outer, 1, 3)), spec(mma.tv_layout_C_tiled)

    outer, grouped, tv = dsl.on_host(build)
    t, v = np.meshgrid(np.arange(256), np.arange(d // 4), indexing="ij")
    idx = tv.outer((t, v))
    r, c = idx % 64, idx // 64
    assert len(set(zip(r.ravel().tolist(), c.ravel().tolist(), strict=True))) == 64 * d
    w = c // half
    assert (grouped.outer((r, c)) == outer.outer((r, c - w * half, w))).all()


def test_deterministic_mode_takes_turns():
    """``deterministic``: each half of dQ_m waits for its turn (an acquire-load loop), adds,
    waits for the bulk group's writes and counts itself (release); without it, none of that."""
    plain = build.compile_attention_backward(BackwardConfig()).ptx
    ordered = build.compile_attention_backward(BackwardConfig(deterministic=True)).ptx
    assert "ld.acquire" not in plain and not re.search(r"atom\.\S*release", plain)
    assert re.search(r"ld\.acquire\.gpu\S*\.b32", ordered)
    assert re.search(r"atom\.\S*release\S*\.add", ordered)
    assert re.search(r"cp\.async\.bulk\.wait_group\s+0", ordered)
    assert build.nested_elects(ordered) == 0


@pytest.mark.parametrize("d", [64, 128, 256])
def test_turn_wait_compares_by_order(d):
    """The turn count only grows, and the two halves of key block n both wait for 2 n: the
    first to finish makes it 2 n + 1 while the other may not have polled yet. The wait
    compares by order (``setp.lt`` / ``setp.ge``); an equality test would hang that half."""
    ordered = build.compile_attention_backward(
        BackwardConfig(head_dim=d, deterministic=True)).ptx
    polls = re.findall(r"ld\.acquire\.gpu\S*\.b32\s+(%r\d+)", ordered)
    assert polls
    for reg in polls:
        compare = re.search(rf"setp\.(\w+)\.s32\s+%p\d+, {reg},", ordered)
        assert compare and compare.group(1) in ("lt", "ge"), (reg, compare)


@pytest.mark.parametrize("d,block_m", [(64, 64), (128, 64), (256, 64), (64, 128),
                                       (128, 128)])
def test_dq_fragment_order_is_the_mmas(d, block_m):
    """``dq_from_fragments`` puts each value where the dQ MMA's own partition (CuTe's
    algebra, traced for every thread) says it belongs: a dQ whose every value names its
    (query, column) comes back in place, padding rows dropped, times the scale."""
    import torch

    from cutetma.backward import dq_from_fragments

    coords = _dq_fragment_coordinates(d, block_m)  # (threads, values, 2): (query, column)
    b, h, s_q = 2, 3, 200
    blocks = -(-s_q // block_m)
    values = coords.shape[1]
    acc = torch.empty(b, h, blocks, 2 * 128 * values)
    for t in range(coords.shape[0]):
        wg, thread = divmod(t, 128)
        for i in range(values):
            slot = wg * 128 * values + (i // 4 * 128 + thread) * 4 + i % 4
            query, col = coords[t, i]
            acc[:, :, :, slot] = float(query * 1000 + col)
    acc += (torch.arange(blocks) * block_m * 1000).view(1, 1, -1, 1)
    acc += (torch.arange(h) * 1e6).view(1, -1, 1, 1) + (torch.arange(b) * 1e7).view(-1, 1, 1, 1)
    dq = dq_from_fragments(acc.flatten(), b, s_q, h, d, torch.float64, 0.5, block_m)
    want = (torch.arange(s_q).view(1, -1, 1, 1) * 1000 + torch.arange(d).view(1, 1, 1, -1)
            + torch.arange(h).view(1, 1, -1, 1) * 1e6 + torch.arange(b).view(-1, 1, 1, 1) * 1e7)
    assert dq.shape == (b, s_q, h, d)
    assert torch.equal(dq, 0.5 * want.double().expand(b, s_q, h, d))


def _dq_fragment_coordinates(d, block_m):
    """(256 threads, values, 2): each consumer thread's (query, column) of every value of the
    backward's dQ accumulator, from the dQ tiled MMA's partition traced on the CPU."""
    import torch

    from cutetma import dsl

    cutlass, cute = dsl.cutlass()
    from cutetma.kernels.attention.backward import dq_tiled_mma

    found = []

    def every_thread(mma):  # plain Python, run while tracing (the DSL rewrites only trace)
        for t in range(256):
            c = mma.get_slice(t).partition_C(cute.make_identity_tensor((block_m, d)))
            found.append([[int(x) for x in c[i]] for i in range(cute.size(c))])

    @cute.jit
    def trace():
        every_thread(dq_tiled_mma(cutlass.BFloat16, d, block_m, 2))

    trace()
    return torch.tensor(found)


@pytest.mark.parametrize("d", [64, 128, 256])
def test_preprocess_ptx(d):
    """The preprocessing pass reads O and dO 16 bytes a thread (64 rows per CTA: d / 8
    threads a row) and sums a row by shuffles; no spills."""
    import torch

    from cutetma import dsl
    from cutetma.kernels.attention.preprocess import BackwardPreprocess
    from cutetma.runtime.launch import typed_pointer

    cutlass, cute = dsl.cutlass()
    from cutlass.cute.runtime import make_fake_stream

    ptx = dsl.compile_ptx(BackwardPreprocess(d).from_pointers,
                          *(typed_pointer(torch.bfloat16),) * 2,
                          *(typed_pointer(torch.float32, 4),) * 3,
                          typed_pointer(torch.float32), *(cutlass.Int32(1),) * 3,
                          *(cutlass.Int64(8),) * 6, make_fake_stream()).ptx
    assert len(re.findall(r"ld\.global[^\n]*\.v4", ptx)) == 2 * 64 // (128 // (d // 8))
    assert re.search(r"shfl\.sync\.bfly", ptx)
    if shutil.which("ptxas"):
        assert "0 bytes spill stores" in build.ptxas_log(ptx)


@pytest.mark.parametrize("d,block_m", [(64, 64), (128, 64), (256, 64), (64, 128)])
def test_dq_conversion_stores_16_bytes(d, block_m):
    """dQ's conversion: every accumulator load and every dQ store 16 bytes (a quad's
    transpose gives each lane 8 neighbouring columns), the loads all before the first
    store; per thread, block_m x d / 256 values in, as many bf16 out."""
    ptx = build.compile_dq_postprocess(d, block_m).ptx
    values = block_m * d // 256
    assert re.findall(r"ld\.global\S*", ptx) == ["ld.global.v4.b32"] * (values // 4)
    assert re.findall(r"st\.global\S*", ptx) == ["st.global.v4.b32"] * (values // 8)
    assert ptx.rindex("ld.global") < ptx.index("st.global")
    assert len(re.findall(r"shfl\.sync\.bfly", ptx)) == 4 * values // 8
