"""The GEMM on the H200 against an fp32 reference, flash-attention's rule: the kernel's max
error is at most twice torch's same-dtype error plus the output's own rounding. Outputs are
poisoned with NaN first; shapes include sizes that are not multiples of any tile.

A variant (``tile``, ``cluster``, ``schedule``, ``split_k``, ...) runs as
``cutetma.gemm(a, b, config=select_gemm_config(m, n, k, **variant))`` (``gemm`` below); no
options, or ``load`` alone, is the library's own choice, its tile order placed on the card."""

import itertools
import random

import pytest

pytestmark = pytest.mark.gpu

SIZES = [1, 17, 127, 129, 1000, 4097]
VARIANTS = [
    dict(load="tma"), dict(load="tma", cluster=(2, 1)), dict(load="tma", cluster=(1, 2)),
    dict(load="tma", cluster=(2, 2)), dict(load="cp_async"),
    dict(load="tma", schedule="pingpong"), dict(load="tma", schedule="pingpong", cluster=(2, 1)),
    dict(load="tma", schedule="pingpong", tile=(64, 256)),
    dict(load="tma", schedule="pingpong", tile=(128, 128)),
    dict(load="tma", split_k=3, split_sum="ordered"), dict(load="cp_async", split_k=2),
    dict(load="cp_async", schedule="pingpong"),
    dict(load="tma", stream_k=True), dict(load="tma", stream_k=True, tile=(128, 128)),
    dict(load="cp_async", stream_k=True),
    dict(load="tma", schedule="pingpong", tile=(128, 128), split_k=2),
    # widths between the powers of two (tiles fitted to the SMs)
    dict(load="tma", tile=(128, 160)), dict(load="tma", tile=(128, 192), cluster=(2, 1)),
    dict(load="tma", tile=(128, 224), cluster=(1, 2)), dict(load="cp_async", tile=(128, 160)),
    dict(load="tma", tile=(128, 96), split_k=2), dict(load="tma", tile=(128, 160), stream_k=True),
    # split-K's slices added by vector atomics into one fp32 tile (written 2026-12-01)
    dict(load="tma", split_k=3, split_sum="atomic"),
    dict(load="cp_async", split_k=2, split_sum="atomic", tile=(128, 128)),
    # each tile's stores under the next tile's WGMMAs (K = 1, 17: tiles of one k-tile)
    dict(load="tma", store_under_mma=True), dict(load="tma", store_under_mma=True, cluster=(2, 1)),
    dict(load="cp_async", store_under_mma=True, tile=(128, 160)),
]
# the paper's (N, K) projection shapes at two of its M values
PAPER = [(2048, 6144, 4096), (512, 14336, 4096), (256, 8192, 28672), (64, 1536, 5120),
         (16, 512, 5120), (8192, 16384, 512)]


def _shapes(seed: int, count: int = 10):
    rng = random.Random(seed)
    return rng.sample(list(itertools.product(SIZES, SIZES, SIZES)), count)


def check(a, b, out, trans_b=True):
    import torch

    from cutetma.reference import gemm_ref

    ref = gemm_ref(a, b, trans_b)
    same = (a @ (b.T if trans_b else b)).float()
    assert not torch.isnan(out).any(), "NaN in the output (unwritten or wrong)"
    rounding = (ref.to(out.dtype).float() - ref).abs().max().item()
    err = (out.float() - ref).abs().max().item()
    bound = 2 * (same - ref).abs().max().item() + rounding + 1e-6
    assert err <= bound, f"max error {err:.3g} > bound {bound:.3g} for {tuple(out.shape)}"


def b_k_major(b, trans_b: bool = True) -> bool:
    """Whether ``cutetma.gemm`` reads B K-major: (N, K) with K contiguous, or an N-major B
    (given as (K, N)) whose rows or base break TMA's 16-byte rule, which it copies into an
    aligned (N, K) buffer first."""
    b_nk = b if trans_b else b.T
    if b_nk.stride(1) == 1:
        return True
    aligned = b_nk.stride(1) * b_nk.element_size() % 16 == 0 and b_nk.data_ptr() % 16 == 0
    return not (b_nk.stride(0) == 1 and aligned)


def gemm(a, b, *, trans_b=True, out=None, out_dtype=None, pdl=False, config=None, **options):
    """``cutetma.gemm`` with a variant's options (those given as None dropped): none, or
    ``load`` alone, is the library's own choice; else ``config=select_gemm_config(m, n, k,
    **options)`` for this card's SMs and the B ``cutetma.gemm`` reads (the configuration
    then runs as it is, in the scheduler's default tile order)."""
    import cutetma
    from cutetma import runtime, select_gemm_config

    options = {key: value for key, value in options.items() if value is not None}
    if config is None and not set(options) <= {"load"}:
        m, k = a.shape
        n = b.shape[0] if trans_b else b.shape[1]
        config = select_gemm_config(m, n, k, b_k_major=b_k_major(b, trans_b),
                                    sm_count=runtime.sm_count(a.device.index or 0), **options)
        options = {}
    return cutetma.gemm(a, b, trans_b=trans_b, out=out, out_dtype=out_dtype, pdl=pdl,
                        config=config, **options)


def _named(options: dict) -> str:
    return ",".join(f"{k}={x}" for k, x in options.items())


def replay_and_check(graph, a, b, out, times: int):
    """Replay a captured GEMM on fresh inputs into a poisoned output, checking each time."""
    import torch

    for _ in range(times):
        a.normal_()
        b.normal_()
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        check(a, b, out)


@pytest.fixture(autouse=True)
def _exact_reference():
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    yield


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("variant", VARIANTS,
                         ids=_named)
def test_random_shapes(variant, dtype):
    import torch

    t = getattr(torch, dtype)
    for m, n, k in _shapes(sum(map(ord, str(variant) + dtype))) + PAPER[:2]:
        a = torch.randn(m, k, device="cuda", dtype=t)
        b = torch.randn(n, k, device="cuda", dtype=t)
        out = torch.full((m, -(-n // 8) * 8), float("nan"), device="cuda", dtype=t)[:, :n]
        gemm(a, b, out=out, **variant)
        check(a, b, out)


@pytest.mark.parametrize("load", ["tma", "cp_async"])
@pytest.mark.parametrize("out_dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("tile", [None, (128, 160)], ids=str)  # 160: a 64-byte swizzle for B
def test_b_as_k_by_n_and_out_dtypes(load, out_dtype, tile):
    import torch

    for m, n, k in [(1000, 129, 4097), (129, 1000, 64), (4097, 256, 512)]:
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        out = gemm(a, b, trans_b=False, load=load, out_dtype=getattr(torch, out_dtype),
                       tile=tile)
        assert out.shape == (m, n)
        check(a, b, out, trans_b=False)


@pytest.mark.parametrize("mnk", PAPER, ids=lambda s: "x".join(map(str, s)))
def test_paper_shapes_all_mechanisms(mnk):
    import torch

    m, n, k = mnk
    a = torch.randn(m, k, device="cuda", dtype=torch.float16)
    b = torch.randn(n, k, device="cuda", dtype=torch.float16)
    for variant in VARIANTS:
        check(a, b, gemm(a, b, **variant))


def test_custom_op_and_stream():
    import torch

    import cutetma.ops  # noqa: F401

    a = torch.randn(300, 200, device="cuda", dtype=torch.float16)
    b = torch.randn(136, 200, device="cuda", dtype=torch.float16)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        c = torch.ops.cutetma.gemm(a, b, True, "tma", torch.float16)
    s.synchronize()
    check(a, b, c)


def test_errors_before_launch():
    import torch

    import cutetma
    from cutetma import select_gemm_config

    a = torch.randn(64, 64, device="cuda", dtype=torch.float16)
    with pytest.raises(TypeError, match="one dtype"):
        cutetma.gemm(a, a.to(torch.bfloat16))
    with pytest.raises(ValueError, match="inner dimensions"):
        cutetma.gemm(a, torch.randn(64, 32, device="cuda", dtype=torch.float16))
    with pytest.raises(TypeError, match="float16 or bfloat16"):
        cutetma.gemm(a.float(), a.float())
    with pytest.raises(ValueError, match="stride rule|alignment rule"):
        odd = torch.randn(64, 60, device="cuda", dtype=torch.float16)  # rows of 120 bytes
        cutetma.gemm(odd, odd, allow_copy=False)
    with pytest.raises(ValueError, match="CUDA"):
        cutetma.gemm(a.cpu(), a.cpu())
    with pytest.raises(ValueError, match="cluster"):  # multicast is a cluster of the config
        cutetma.gemm(a, a, load="tma_multicast")
    with pytest.raises(TypeError, match="GemmConfig"):
        cutetma.gemm(a, a, config=dict(tile=(128, 128)))
    with pytest.raises(ValueError, match="multiple of 64"):  # 160-column WGMMAs, N-major B
        b_kn = torch.randn(64, 4096, device="cuda", dtype=torch.float16)
        cutetma.gemm(a, b_kn, trans_b=False,
                     config=select_gemm_config(64, 4096, 64, tile=(128, 320)))
    with pytest.raises(ValueError, match="workspace"):  # 64 GiB: refused, not allocated
        big = torch.empty(16384, 64, device="cuda", dtype=torch.float16)
        cutetma.gemm(big, big, config=select_gemm_config(16384, 16384, 64, tile=(128, 128),
                                                         split_k=64))


def test_deterministic_mode_refuses_the_atomic_sum():
    """Under ``torch.use_deterministic_algorithms(True)`` ``cutetma.gemm`` refuses, when it
    is called, a configuration whose K slices meet by atomic adds (their last bits depend on
    the order they arrive in), as torch's own nondeterministic ops do, and warns with
    ``warn_only``; its own choice there is the ordered sum, which runs."""
    import torch

    import cutetma
    from cutetma import runtime, select_gemm_config

    m, n, k = 16, 4096, 14336
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    atomic = select_gemm_config(m, n, k, split_k=4, split_sum="atomic",
                                sm_count=runtime.sm_count(0))
    check(a, b, cutetma.gemm(a, b, config=atomic))
    before = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    try:
        torch.use_deterministic_algorithms(True)
        with pytest.raises(RuntimeError, match="split_sum='ordered'"):
            cutetma.gemm(a, b, config=atomic)
        check(a, b, cutetma.gemm(a, b))
        torch.use_deterministic_algorithms(True, warn_only=True)
        with pytest.warns(UserWarning, match="not deterministic"):
            out = cutetma.gemm(a, b, config=atomic)
        check(a, b, out)
    finally:
        torch.use_deterministic_algorithms(before, warn_only=warn_only)


@pytest.mark.parametrize("load", ["tma", "cp_async"])
@pytest.mark.parametrize("cut", [dict(stream_k=True), dict(split_k=3, split_sum="ordered"),
                                 dict(split_k=2, tile=(128, 128)),
                                 dict(split_k=4, tile=(128, 128), split_sum="atomic")],
                         ids=_named)
def test_k_cuts_relaunch_and_graph_replay(load, cut):
    """Split-K's tickets and stream-K's flags must be back at zero after every launch: the
    same workspace serves eager launches of different shapes and CUDA-graph replays, each
    checked with fresh data and a poisoned output (a stale count would let the wrong slice
    store the tile: a wrong result, not a hang). With ``split_sum="atomic"`` the fp32 slots
    too: a slot not zeroed by the last slice would add the previous launch's tile in."""
    import torch

    shapes = [(1000, 1000, 4097), (512, 5120, 5120), (4097, 1000, 129), (256, 512, 5120)]
    for m, n, k in shapes * 2:
        a = torch.randn(m, k, device="cuda", dtype=torch.float16)
        b = torch.randn(n, k, device="cuda", dtype=torch.float16)
        out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float16)
        gemm(a, b, out=out, load=load, **cut)
        check(a, b, out)
    m, n, k = 512, 5120, 5120
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    gemm(a, b, out=out, load=load, **cut)  # compile and allocate outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        gemm(a, b, out=out, load=load, **cut)
    replay_and_check(graph, a, b, out, 3)


@pytest.mark.parametrize("tile", [(128, 256), (128, 128)], ids=str)
def test_store_under_mma_many_tiles_relaunch_and_graph_replay(tile):
    """Each CTA holds a tile while it starts the next: every tile of a CTA's walk (the last
    one stored after the loop), outputs of both 16-bit types, fp32 output (which stores
    serially), eager launches and CUDA-graph replays on fresh data into poisoned outputs."""
    import torch

    for dtype in (torch.float16, torch.bfloat16):
        for m, n, k in [(4097, 4097, 129), (8192, 2048, 64), (1000, 4097, 1000)]:
            a = torch.randn(m, k, device="cuda", dtype=dtype)
            b = torch.randn(n, k, device="cuda", dtype=dtype)
            for out_dtype in (dtype, torch.float32):
                out = torch.full((m, -(-n // 8) * 8), float("nan"), device="cuda",
                                 dtype=out_dtype)[:, :n]
                gemm(a, b, out=out, tile=tile, store_under_mma=True)
                check(a, b, out)
    a = torch.randn(2048, 1536, device="cuda", dtype=torch.float16)
    b = torch.randn(4096, 1536, device="cuda", dtype=torch.float16)
    out = torch.empty(2048, 4096, device="cuda", dtype=torch.float16)
    gemm(a, b, out=out, tile=tile, store_under_mma=True)  # compile outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        gemm(a, b, out=out, tile=tile, store_under_mma=True)
    replay_and_check(graph, a, b, out, 3)


@pytest.mark.parametrize("cut", [dict(split_k=3, split_sum="ordered"),
                                 dict(split_k=2, tile=(128, 160)),
                                 dict(split_k=2, tile=(128, 128), schedule="pingpong"),
                                 dict(deterministic=True)],
                         ids=_named)
def test_split_k_is_bitwise_reproducible(cut):
    """The last slice to arrive sums every slice's partial in slot order, so which slice
    that is (it varies from launch to launch) does not change a bit of the result; with
    ``torch.use_deterministic_algorithms(True)`` the automatic choice (here 64 x 80 tiles in
    4 ordered slices over (2, 1) clusters; without it 64 x 128 in 8 atomic ones) keeps that
    promise."""
    import torch

    cut = dict(cut)
    deterministic = cut.pop("deterministic", False)
    shape = (256, 512, 5120) if deterministic else (512, 1536, 5120)
    a = torch.randn(shape[0], shape[2], device="cuda", dtype=torch.bfloat16)
    b = torch.randn(shape[1], shape[2], device="cuda", dtype=torch.bfloat16)
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(deterministic or before)
    try:
        first = gemm(a, b, **cut)
        check(a, b, first)
        for _ in range(20):
            assert torch.equal(gemm(a, b, **cut), first)
    finally:
        torch.use_deterministic_algorithms(before)


# widths that are odd multiples of 16 (their epilogue stores 16-column sub-tiles), as cuBLAS
# fits its tiles to the SMs' waves: alone, in clusters that multicast A or B, by cp.async,
# with split-K; store_under_mma is on by default for each unsplit one
FITTED_WIDTHS = [
    dict(load="tma", tile=(128, 80)), dict(load="tma", tile=(128, 112), cluster=(1, 2)),
    dict(load="tma", tile=(128, 176), cluster=(2, 1)), dict(load="tma", tile=(128, 240)),
    dict(load="cp_async", tile=(128, 80)), dict(load="cp_async", tile=(128, 144)),
    dict(load="tma", tile=(128, 208), split_k=2), dict(load="tma", tile=(128, 80),
                                                       store_under_mma=False),
]
# past 256 columns: two WGMMAs per warpgroup and k-step, B's box split in two TMA copies
WIDE_TILES = [
    dict(load="tma", tile=(128, 320)), dict(load="tma", tile=(128, 320), cluster=(2, 1)),
    dict(load="cp_async", tile=(128, 320)), dict(load="tma", tile=(128, 384), cluster=(1, 2)),
    dict(load="tma", tile=(64, 288)),
]


@pytest.mark.parametrize("variant", FITTED_WIDTHS + WIDE_TILES, ids=_named)
def test_new_tile_widths(variant):
    """Tile widths past the powers of two: odd multiples of 16 and tiles wider than one WGMMA.
    Random shapes that are not multiples of the tile, into poisoned buffers: fp16 with fp16 and fp32
    outputs and B given as (N, K) and as (K, N) (an N-major B of 80 columns is 160 bytes a row: a
    32-byte swizzle), bf16 with its own output (four compiled kernels a variant)."""
    import torch

    for dtype in (torch.float16, torch.bfloat16):
        fp16 = dtype == torch.float16
        for m, n, k in _shapes(sum(map(ord, str(variant))), 6) + [(256, 5120, 5120)]:
            a = torch.randn(m, k, device="cuda", dtype=dtype)
            b = torch.randn(n, k, device="cuda", dtype=dtype)
            for out_dtype in (dtype, torch.float32) if fp16 else (dtype,):
                out = torch.full((m, -(-n // 8) * 8), float("nan"), device="cuda",
                                 dtype=out_dtype)[:, :n]
                gemm(a, b, out=out, **variant)
                check(a, b, out)
            if not fp16:
                continue
            b_kn = b.T.contiguous()
            # refused before launch where B stays N-major: not where N breaks the 16-byte
            # rule (gemm copies B into an aligned (N, K) buffer, which any width reads) nor at
            # K = 1 (a (1, N) tensor is K-major too)
            if variant["tile"][1] > 256 and variant["tile"][1] % 128 and n % 8 == 0 and k > 1:
                with pytest.raises(ValueError, match="multiple of 64"):
                    gemm(a, b_kn, trans_b=False, **variant)
                continue
            check(a, b_kn, gemm(a, b_kn, trans_b=False, **variant), trans_b=False)


# clusters of 4 and 8 CTAs (written 2026-12-02): cuBLAS runs 64 x 64 tiles in (2, 4)
# clusters (ours: A multicast to 4 CTAs, B to 2) where the output is narrow
BIG_CLUSTERS = [
    dict(tile=(64, 64), cluster=(2, 4)), dict(tile=(64, 128), cluster=(4, 2)),
    dict(tile=(128, 128), cluster=(1, 4)), dict(tile=(128, 256), cluster=(4, 1)),
    dict(tile=(128, 96), cluster=(2, 4)),
]


@pytest.mark.parametrize("variant", BIG_CLUSTERS, ids=_named)
def test_clusters_of_four_and_eight(variant):
    """Multicast to 4 CTAs (each issues a quarter of the box) and clusters of 8, on random
    shapes that are not multiples of the tile (partial clusters at the edges), a narrow one
    like cuBLAS's, fp16 / bf16 inputs, fp16 and fp32 outputs, B as (N, K) and (K, N)."""
    import torch

    for dtype in (torch.float16, torch.bfloat16):
        for m, n, k in _shapes(sum(map(ord, str(variant))), 5) + [(256, 1536, 5120)]:
            a = torch.randn(m, k, device="cuda", dtype=dtype)
            b = torch.randn(n, k, device="cuda", dtype=dtype)
            for out_dtype in (dtype, torch.float32):
                out = torch.full((m, -(-n // 8) * 8), float("nan"), device="cuda",
                                 dtype=out_dtype)[:, :n]
                gemm(a, b, out=out, **variant)
                check(a, b, out)
            b_kn = b.T.contiguous()
            check(a, b_kn, gemm(a, b_kn, trans_b=False, **variant), trans_b=False)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_automatic_wide_multicast(dtype):
    """Where ``cutetma.gemm`` runs 128 x 320 tiles in (2, 1) clusters by itself (M > 512,
    128 x 256 tiles filling the last wave badly; written 2026-12-02), shapes that are not
    multiples of the tile, into poisoned fp16 / bf16 and fp32 outputs; B as (K, N) takes a
    narrower tile (a 160-column WGMMA cannot read an N-major B) and is checked too."""
    import torch

    from cutetma.tuning import gemm as tuning

    t = getattr(torch, dtype)
    for m, n, k in [(2048, 5120, 1000), (2000, 5000, 777), (2048, 7680, 136)]:
        assert tuning.wide_multicast_pays(m, n, k), (m, n, k)
        _default_into_poisoned(m, n, k, t)
        a = torch.randn(m, k, device="cuda", dtype=t)
        b_kn = torch.randn(k, n, device="cuda", dtype=t)
        check(a, b_kn, gemm(a, b_kn, trans_b=False), trans_b=False)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_fitted_64_row_tiles(dtype):
    """Where ``cutetma.gemm`` narrows 64 x 128 tiles to fill the SMs (written 2026-12-02):
    64 x 96 alone (512 x 1536, the order table) and in two K slices multicast over (2, 1)
    clusters (256 x 1536), at the measured shapes and at sizes that are not multiples of
    the tile, into poisoned fp16 / bf16 and fp32 outputs."""
    import torch

    from cutetma import runtime, select_gemm_config

    t = getattr(torch, dtype)
    for m, n, k, width, cluster in [
            (512, 1536, 5120, 96, (1, 1)), (256, 1536, 5120, 96, (2, 1)),
            (200, 1528, 5000, 96, (2, 1)), (208, 432, 3000, 112, (2, 1)),
            (208, 256, 1000, 80, (2, 1)), (136, 520, 3000, 112, (1, 1))]:
        cfg = select_gemm_config(m, n, k, sm_count=runtime.sm_count(0))
        assert (cfg.tile_m, cfg.tile_n) == (64, width), (m, n, k, cfg)
        assert (cfg.cluster_m, cfg.cluster_n) == cluster, (m, n, k, cfg)
        _default_into_poisoned(m, n, k, t)


@pytest.mark.parametrize("options", [dict(load="tma"), dict(cluster=(2, 1)), dict(split_k=2),
                                     dict(load="cp_async")], ids=_named)
def test_programmatic_dependent_launch_chain(options):
    """``pdl=True``: a chain of GEMMs, each reading the
    previous one's output, launched so that each may start while the one before finishes;
    eager and as a CUDA graph replayed on fresh inputs, every link checked against the fp32
    reference (a kernel that read its input before the previous kernel finished writing it
    would read NaN poison or stale values)."""
    import torch

    m, n, k = 1000, 1032, 1032  # n = k: each output is the next one's A
    a = torch.randn(m, k, device="cuda", dtype=torch.float16)
    bs = [torch.randn(n, k, device="cuda", dtype=torch.float16) / 32 for _ in range(4)]
    outs = [torch.full((m, n), float("nan"), device="cuda", dtype=torch.float16)
            for _ in bs]

    def chain():
        x = a
        for b, out in zip(bs, outs, strict=True):
            x = gemm(x, b, out=out, pdl=True, **options)

    def check_chain():
        x = a
        for b, out in zip(bs, outs, strict=True):
            check(x, b, out)
            x = out

    chain()
    torch.cuda.synchronize()
    check_chain()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        chain()
    for _ in range(3):
        a.normal_()
        for out in outs:
            out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        check_chain()


def _default_into_poisoned(m, n, k, dtype, out_dtypes=None, **options):
    """``cutetma.gemm(a, b, **options)`` (none: the library's own choice) on fresh randn
    inputs, into NaN-filled outputs of the input dtype and of fp32 (or ``out_dtypes``), each
    checked against the fp32 reference."""
    import torch

    a = torch.randn(m, k, device="cuda", dtype=dtype)
    b = torch.randn(n, k, device="cuda", dtype=dtype)
    for out_dtype in out_dtypes or (dtype, torch.float32):
        out = torch.full((m, -(-n // 8) * 8), float("nan"), device="cuda",
                         dtype=out_dtype)[:, :n]
        gemm(a, b, out=out, **options)
        check(a, b, out)


@pytest.mark.parametrize("load", ["tma", "cp_async"])
def test_raster_order_placed_on_this_cards_gpcs(load):
    """``cutetma.gemm`` probes where the card puts its CTAs and reorders the tiles
    (``cutetma.runtime.placement``; written 2026-12-02): the shapes where the H200's order
    changes (one wave of 64 x 128 at 2048 x 512, several waves at 2048 x 6144, a 128 x 320
    (2, 1) grid), cut to odd sizes, into poisoned outputs; both mechanisms get the same
    order."""
    import torch

    from cutetma import runtime
    from cutetma.runtime import placement

    for m, n, k in [(2048, 512, 5120), (2000, 6100, 1000), (2048, 5120, 777)]:
        _default_into_poisoned(m, n, k, torch.float16, load=load)
    gpcs = placement.sm_gpcs(0)
    assert len(gpcs) == runtime.sm_count(0) and len(set(gpcs)) >= 2


@pytest.mark.parametrize("fields", [
    dict(tile_m=64, tile_n=128), dict(tile_m=128, tile_n=256, raster_swizzle=2),
    dict(tile_m=128, tile_n=128, load="cp_async"),
    dict(tile_m=128, tile_n=128, cluster_m=2), dict(tile_m=128, tile_n=128, schedule="pingpong"),
    dict(tile_m=128, tile_n=320, cluster_m=2),
], ids=_named)
def test_order_table(fields):
    """``GemmConfig.order_table`` (written 2026-12-02): the tiles' order read from a table
    built on this card's probed placement, several waves and one, clusters and pingpong, on
    shapes that are not multiples of the tile, into poisoned outputs; graph replays reuse
    the table."""
    import torch

    from cutetma import GemmConfig

    cfg = GemmConfig(order_table=True, **fields)
    for m, n, k in [(2048, 512, 5120), (3000, 5000, 333), (8192, 8192, 64), (129, 17, 1000)]:
        _default_into_poisoned(m, n, k, torch.float16, (torch.float16,), config=cfg)
    a = torch.randn(1000, 640, device="cuda", dtype=torch.float16)
    b = torch.randn(3000, 640, device="cuda", dtype=torch.float16)
    out = torch.empty(1000, 3000, device="cuda", dtype=torch.float16)
    gemm(a, b, out=out, config=cfg)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        gemm(a, b, out=out, config=cfg)
    replay_and_check(graph, a, b, out, 2)


@pytest.fixture
def order_tables(monkeypatch):
    """``(configuration, M, N)`` of every order table ``cutetma.gemm`` launches with: a spy
    on ``cutetma.runtime.placement.order_table`` (which builds each table once and keeps it
    on the device), called for every launch whose configuration has ``order_table`` on."""
    from cutetma import ops
    from cutetma.runtime import placement

    ops.clear_plans()  # a kept plan holds its table: no call would reach the spy
    seen = []
    real = placement.order_table

    def spy(cfg, m, n, device_index, clusters):
        seen.append((cfg, m, n))
        return real(cfg, m, n, device_index, clusters)

    monkeypatch.setattr(placement, "order_table", spy)
    return seen


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_default_order_table_from_m_256(dtype, order_tables):
    """From M = 256 ``cutetma.gemm`` deals whole tiles from an order table by itself
    (``TABLE_MIN_M``): its default configurations there
    (cooperative 128 x 256, pingpong 128 x 128 at short K, a (2, 1) multicast, 128 x 320 in
    (2, 1), the fitted widths below M = 512: 128 x 96 in (2, 1), 128 x 160) on shapes
    that are not multiples of the tile, into poisoned outputs, each with its table built; a
    shape whose first call is inside a CUDA-graph capture runs the placed band there (the
    table needs a probe launch) and is still right on replay."""
    import torch

    from cutetma import runtime, select_gemm_config

    t = getattr(torch, dtype)
    for m, n, k in [(2000, 6100, 1000), (600, 16000, 500), (512, 4100, 4096),
                    (2048, 5120, 5120), (8192, 1000, 64), (300, 7000, 2000),
                    (256, 6144, 4096), (400, 9000, 1500)]:
        _default_into_poisoned(m, n, k, t, (t,))
        assert any(cfg.order_table and tuple(shape) == (m, n) for cfg, *shape in order_tables), (
            m, n, k)
    a = torch.randn(777, 640, device="cuda", dtype=t)
    b = torch.randn(3001, 640, device="cuda", dtype=t)
    out = torch.empty(777, 3008, device="cuda", dtype=t)[:, :3001]  # 16-byte rows
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):  # compile outside the capture
        # the library's choice before its tile order: what a capture that finds no table and
        # no placed band yet runs
        gemm(a, b, out=out, config=select_gemm_config(777, 3001, 640,
                                                      sm_count=runtime.sm_count(0)))
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        gemm(a, b, out=out)
    replay_and_check(graph, a, b, out, 2)
    out.fill_(float("nan"))
    gemm(a, b, out=out)  # outside a capture the table is built now
    check(a, b, out)
    assert any(cfg.order_table and tuple(shape) == (777, 3001) for cfg, *shape in order_tables)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_automatic_multicast_at_small_m(dtype):
    """Where ``cutetma.gemm`` puts tiles in (2, 1) clusters by itself (M = 129..512, about
    one wave of tiles; 128 x 128, or 64 to 112 wide: 200 x 5000 and 250 x 7000 run 128 x 80
    and 128 x 112): shapes that are not multiples of the tile (M = 129: the second CTA of
    each cluster gets one row), fp16 / fp32 outputs into poisoned buffers."""
    import torch

    from cutetma import select_gemm_config

    t = getattr(torch, dtype)
    for m, n, k in [(256, 7680, 5120), (250, 7000, 5000), (500, 4000, 4097), (129, 8192, 1000),
                    (200, 5000, 5000), (256, 4096, 4096)]:
        cfg = select_gemm_config(m, n, k)
        assert (cfg.cluster_m, cfg.cluster_n) == (2, 1), (m, n, k)
        _default_into_poisoned(m, n, k, t)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_automatic_pingpong_below_m_512(dtype):
    """Where ``cutetma.gemm`` runs pingpong 128 x 128 by itself below M = 512 (up to 24
    k-tiles where its tiles fill a wave): shapes that are
    not multiples of the tile (a partial last tile row and column, K not a multiple of 64),
    fp16 / fp32 outputs into poisoned buffers."""
    import torch

    from cutetma import select_gemm_config

    t = getattr(torch, dtype)
    for m, n, k in [(256, 16384, 512), (300, 17000, 500), (257, 24577, 1504)]:
        cfg = select_gemm_config(m, n, k)
        assert (cfg.schedule, cfg.tile_m, cfg.tile_n) == ("pingpong", 128, 128), (m, n, k)
        _default_into_poisoned(m, n, k, t)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_automatic_fitted_widths(dtype):
    """Where ``cutetma.gemm`` narrows 128 x 256 tiles to the width with as many waves (M <=
    512: 300 x 9000 in 128 x 208, 500 x 14000 in 128 x 224): shapes that are not multiples
    of the tile, fp16 / fp32 outputs into poisoned buffers."""
    import torch

    from cutetma import select_gemm_config

    t = getattr(torch, dtype)
    for (m, n, k), width in [((300, 9000, 4000), 208), ((500, 14000, 3001), 224)]:
        cfg = select_gemm_config(m, n, k)
        assert (cfg.tile_n, cfg.cluster_m, cfg.split_k) == (width, 1, 1), (m, n, k)
        _default_into_poisoned(m, n, k, t)


@pytest.mark.parametrize("load", ["tma", "cp_async"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_automatic_choices_for_small_outputs(load, dtype):
    """What ``cutetma.gemm`` picks by itself where the output has few tiles (64 x 128 tiles,
    K split into up to 8 slices added atomically, since 2026-12-01), on shapes that are not
    multiples of its tiles, relaunched into poisoned outputs (a slot left non-zero by one
    launch would add into the next)."""
    import torch

    from cutetma import select_gemm_config

    t = getattr(torch, dtype)
    shapes = [(256, 512, 5120), (255, 509, 5111), (512, 512, 5120), (2047, 511, 5120),
              (200, 1536, 5000), (64, 1536, 5120), (17, 4096, 14336), (129, 1000, 4097)]
    for m, n, k in shapes * 2:
        cfg = select_gemm_config(m, n, k, load=load)
        a = torch.randn(m, k, device="cuda", dtype=t)
        b = torch.randn(n, k, device="cuda", dtype=t)
        out = torch.full((m, -(-n // 8) * 8), float("nan"), device="cuda", dtype=t)[:, :n]
        gemm(a, b, out=out, load=load)
        try:
            check(a, b, out)
        except AssertionError as exc:
            raise AssertionError(f"{(m, n, k)} with {cfg}: {exc}") from None


def test_graph_survives_workspace_growth():
    """A graph captured with a small split-K workspace keeps working after a larger split
    GEMM outgrew it on the same stream (the outgrown buffers are never freed)."""
    import torch

    a = torch.randn(256, 1024, device="cuda", dtype=torch.float16)
    b = torch.randn(512, 1024, device="cuda", dtype=torch.float16)
    out = torch.empty(256, 512, device="cuda", dtype=torch.float16)
    gemm(a, b, out=out, split_k=2)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        gemm(a, b, out=out, split_k=2)
    big_a = torch.randn(2048, 4096, device="cuda", dtype=torch.float16)
    big_b = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
    gemm(big_a, big_b, split_k=4)  # compiled outside any capture
    later = torch.cuda.CUDAGraph()
    with torch.cuda.graph(later):  # the same capture stream: outgrows the first graph's pair
        gemm(big_a, big_b, split_k=4)
    torch.cuda.synchronize()
    replay_and_check(graph, a, b, out, 2)


# two epilogue buffers where they free a mainloop stage (the
# default for 96 / 192-wide tiles and most fp32 outputs), one buffer, pingpong's one buffer
# each, alone, multicast, split and persistent (many tiles a CTA)
EPILOGUE_BUFFERS = [
    dict(tile=(128, 96), cluster=(2, 1)), dict(tile=(128, 192)), dict(tile=(128, 192),
                                                                      cluster=(1, 2)),
    dict(tile=(128, 160), epi_stages=1), dict(tile=(128, 128), split_k=3, epi_stages=2),
    dict(tile=(128, 128), schedule="pingpong", epi_stages=2),
]


@pytest.mark.parametrize("variant", EPILOGUE_BUFFERS, ids=_named)
def test_epilogue_buffers(variant):
    """Each configuration (``epi_stages``, a ``GemmConfig`` field, beside the tile) on
    random shapes that are not multiples of the tile plus one with many
    tiles a CTA, fp16 into poisoned fp16 and fp32 outputs (the fp32 epilogue takes two
    buffers by itself at most widths), bf16 into bf16."""
    import dataclasses

    import torch

    from cutetma import select_gemm_config

    fields = {key: variant[key] for key in ("epi_stages",) if key in variant}
    cluster = variant.get("cluster", (1, 1))
    for dtype in (torch.float16, torch.bfloat16):
        outs = (dtype, torch.float32) if dtype == torch.float16 else (dtype,)
        for m, n, k in _shapes(sum(map(ord, str(variant))), 5) + [(4097, 3000, 1000)]:
            cfg = select_gemm_config(m, n, k, cluster=cluster, tile=variant["tile"],
                                     schedule=variant.get("schedule"),
                                     split_k=variant.get("split_k", 1))
            cfg = dataclasses.replace(cfg, **fields)
            a = torch.randn(m, k, device="cuda", dtype=dtype)
            b = torch.randn(n, k, device="cuda", dtype=dtype)
            for out_dtype in outs:
                out = torch.full((m, -(-n // 8) * 8), float("nan"), device="cuda",
                                 dtype=out_dtype)[:, :n]
                gemm(a, b, out=out, config=cfg)
                check(a, b, out)
