"""The benchmark scripts' helpers (``benchmarks/``), on the CPU: the candidates and specs they
time, the configurations those name (``select_gemm_config`` options and ``GemmConfig``
fields), their summaries, plots and merges, and the plumbing around the profilers (stand-ins
for ``ncu`` and NVIDIA's example). Nothing here times or launches a kernel."""

import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))


def test_benchmark_offers_fitted_tiles_and_the_library_choice():
    """Where 128 x 256 tiles leave SMs idle the benchmark also times 128 x 192 / 160 (so the
    grid can show what fitting the tile gives), and every cell times what ``cutetma.gemm``
    itself would choose."""
    import gemm

    from cutetma.tuning.gemm import auto_tile_and_split

    for name in ("tma", "cp_async"):
        starved = [c.get("tile") for c in gemm.candidates(name, 512, 5120, 5120)]
        assert (128, 160) in starved and (128, 192) in starved
        full = [c.get("tile") for c in gemm.candidates(name, 8192, 8192, 8192)]
        assert (128, 160) not in full
        # the narrowest widths of one and two waves, as cuBLAS fits its tiles (both
        # mechanisms alike, so the TMA / cp.async comparison keeps one tile list)
        few = [c.get("tile") for c in gemm.candidates(name, 256, 5120, 5120)]
        assert (128, 80) in few and (128, 64) not in few
        assert (128, 112) in [c.get("tile") for c in gemm.candidates(name, 256, 14336, 4096)]
    shared_a = [c for c in gemm.candidates("tma_multicast", 256, 6144, 4096)
                if c.get("cluster") == (1, 2)]
    assert dict(load="tma", cluster=(1, 2), tile=(128, 96)) in shared_a
    assert all(c.get("tile") == (128, 256) for c in gemm.candidates("tma_multicast", 8192, 8192,
                                                                     8192))
    for mnk in [(512, 5120, 5120), (256, 512, 5120), (2048, 1536, 5120)]:
        tile, split = auto_tile_and_split(*mnk)
        chosen = [c for c in gemm.candidates("tma", *mnk)
                  if c.get("tile") == tile and c.get("split_k", 1) == split
                  and not c.get("schedule") and not c.get("stream_k")]
        assert chosen, mnk


def test_sustained_benchmark_reads_kernel_specs():
    """gemm_sustained.py --kernels: cuBLAS, ours with no options, or ours with cutetma.gemm
    keyword arguments (the configurations compared at the power cap)."""
    import gemm_sustained

    assert gemm_sustained.parse_kernel("cublas") is None
    assert gemm_sustained.parse_kernel("ours") == {}
    assert gemm_sustained.parse_kernel("ours:cluster=2x1,epi_stages=2") == {
        "cluster": (2, 1), "epi_stages": 2}
    assert gemm_sustained.parse_kernel("ours:tile=64x256,schedule=pingpong,split_k=2") == {
        "tile": (64, 256), "schedule": "pingpong", "split_k": 2}
    for bad in ("cudnn", "ours:tile", "ours:=2", "nvidia:cluster"):
        with pytest.raises(SystemExit):
            gemm_sustained.parse_kernel(bad)


def test_grid_plot_draws_the_default_and_its_geomean_per_m(tmp_path):
    """gemm.py's plot: ``cutetma.gemm`` with no options (``tma_default``) beside each
    mechanism's best, its per-M geometric mean over cuBLAS (the issue's target), and TMA over
    cp.async with the per-M median (the paper's table); cells missing a column are skipped."""
    import gemm
    rows = [dict(M=m, N=n, K=512, dtype="float16", cublas=100.0, tma_default=t, tma=t + 1,
                 tma_multicast=None, cp_async=80.0)
            for m, n, t in ((256, 512, 90.0), (256, 1024, 110.0), (8192, 512, 102.0))]
    rows.append(dict(M=512, N=512, K=512, dtype="float16", cublas=100.0, tma=95.0))
    means = gemm.default_geomeans(rows)
    assert list(means) == [256, 8192]
    assert means[256] == pytest.approx((0.9 * 1.1) ** 0.5)
    assert means[8192] == pytest.approx(1.02)
    path = tmp_path / "gemm.png"
    gemm.plot(rows, path)
    assert path.stat().st_size > 10_000


def test_grid_plot_draws_fp8_rows(tmp_path, monkeypatch):
    """An FP8-only grid (``--dtypes float8_e4m3fn``) plots its own rows: ours over
    ``torch._scaled_mm`` per scaling, and TMA over cp.async with the per-M median of the
    paper's cells; the title names the card given, not this machine's (a merge)."""
    import gemm
    import matplotlib.axes

    drawn = []
    real_scatter = matplotlib.axes.Axes.scatter
    monkeypatch.setattr(matplotlib.axes.Axes, "scatter", lambda self, x, y, *a, **k: (
        drawn.append((k.get("label"), list(y))), real_scatter(self, x, y, *a, **k))[1])
    n, k = gemm.PAPER_NK[0]
    rows = [dict(M=m, N=n, K=k, dtype="float8_e4m3fn", scaling="tensor", cutetma=t, tma=t,
                 cp_async=t / 1.2, torch_scaled_mm=100.0) for m, t in ((256, 90.0), (8192, 110.0))]
    path = tmp_path / "gemm_fp8_grid.png"
    gemm.plot(rows, path, "H200")
    fp8 = dict(drawn)["FP8 tensor scales / torch._scaled_mm"]
    assert fp8 == pytest.approx([0.9, 1.1])
    assert [y for label, y in drawn if label is None][-1] == pytest.approx([1.2, 1.2])
    assert path.stat().st_size > 10_000


def test_sustained_benchmark_sweeps_grid_cells_and_summarizes():
    """gemm_sustained.py --grid-m: the grid's 18 (N, K) at each M; its summary is the
    geometric mean over cells of each spec's mean phase against cuBLAS's and the first
    ours spec's (a cell without a cuBLAS phase counts for neither)."""
    import gemm
    import gemm_sustained

    cells = gemm_sustained.grid_cells([2048, 8192])
    assert len(cells) == 36 and cells[0] == (2048, *gemm.PAPER_NK[0])
    assert {m for m, _, _ in cells} == {2048, 8192}

    def phases(cell, kernel, *tflops):
        return [{"M": cell[0], "N": cell[1], "K": cell[2], "kernel": kernel, "tflops": t}
                for t in tflops]

    one, two = (1, 2, 3), (4, 5, 6)
    rows = (phases(one, "cublas", 100, 100) + phases(one, "ours", 90, 110)
            + phases(one, "ours:x=1", 120, 120) + phases(two, "cublas", 100)
            + phases(two, "ours", 50) + phases(two, "ours:x=1", 100)
            + phases((7, 8, 9), "ours", 1) + phases((7, 8, 9), "ours:x=1", 4))
    summary = gemm_sustained.summarize(rows, ["cublas", "ours", "ours:x=1"])
    assert summary["ours / cublas"] == pytest.approx((1.0 * 0.5) ** 0.5)
    assert summary["ours:x=1 / cublas"] == pytest.approx((1.2 * 1.0) ** 0.5)
    assert summary["ours:x=1 / ours"] == pytest.approx((1.2 * 2.0 * 4.0) ** (1 / 3))
    assert "ours / ours" not in summary


def test_kernel_times_fit_and_config_fields():
    """gemm_kernel_times.py: the fixed cost and the cost a k-tile come back from exact lines,
    and a spec's ``GemmConfig`` fields replace only themselves in the library's own choice
    for the shape (256 x 6144 x 4096: 128 x 96 in a (2, 1) cluster, 7 stages beside two
    epilogue buffers; ``epi_stages=4`` gives the 6 stages it had before)."""
    import gemm_kernel_times as kt

    fit = kt.fit_line([(16, 4.0 + 16 * 0.3), (64, 4.0 + 64 * 0.3), (128, 4.0 + 128 * 0.3)])
    assert fit == {"fixed_us": 4.0, "per_k_tile_us": 0.3, "points": 3}
    assert kt.spec_config({}, 256, 6144, 4096) is None
    assert kt.spec_config({"cluster": (2, 1)}, 256, 6144, 4096) is None
    auto = kt.spec_config({"epi_stages": 4}, 256, 6144, 4096)
    assert (auto.tile_n, auto.cluster_m, auto.epi_stages, auto.num_stages()) == (96, 2, 4, 6)
    default = kt.spec_config({"stages": 7}, 256, 6144, 4096)
    assert (default.tile_n, default.epi_buffers(), default.num_stages()) == (96, 2, 7)


def test_final_rounds_alternate_their_order(monkeypatch, tmp_path):
    """gemm.py / gemm_ab.py time their contenders in rounds whose order reverses every other
    round, so no contender always runs right after the same one (the card's clock follows
    what ran before); each key gets one time per round, each timed over the window asked
    for (gemm_ab.py's ``--window-ms``)."""
    import gemm
    import gemm_ab

    calls, windows = [], []

    def fake_bench(fn, window_ms=25):
        windows.append(window_ms)
        calls.append(fn())
        return float(len(calls))

    monkeypatch.setattr(gemm, "bench", fake_bench)
    times = gemm.alternating_rounds({k: (lambda k=k: k) for k in "abc"}, 3)
    assert "".join(calls) == "abccbaabc"
    assert times == {"a": [1.0, 6.0, 7.0], "b": [2.0, 5.0, 8.0], "c": [3.0, 4.0, 9.0]}
    assert set(windows) == {25}
    windows.clear()
    gemm.alternating_rounds({"a": lambda: "a"}, 2, window_ms=400)
    assert windows == [400, 400]
    seen = {}
    monkeypatch.setattr(gemm_ab, "measure",
                        lambda *a: seen.setdefault("window", a[-1]) and {"M": 1})
    monkeypatch.setattr(gemm_ab, "summarize", lambda rows, specs: {})
    gemm_ab.main(["--kernels", "ours", "--cells", "1x1x1", "--window-ms", "300",
                  "--out", str(tmp_path)])
    assert seen["window"] == 300


def test_nvidia_example_as_a_peer(tmp_path):
    """``nvidia:...`` specs name NVIDIA's CuTe DSL example, imported from the path given
    (never copied here); a missing file or one without the kernel class stops before any
    timing, and so does a spec with no path given."""
    import gemm_sustained
    import nvidia_peer
    import torch

    assert gemm_sustained.parse_kernel("nvidia:tile=128x256,cluster=1x2") == {
        "peer": "nvidia", "tile": (128, 256), "cluster": (1, 2)}
    assert gemm_sustained.load_peer(None) == {}
    with pytest.raises(SystemExit, match="no such file"):
        gemm_sustained.load_peer(str(tmp_path / "missing.py"))
    stand_in = tmp_path / "dense_gemm_persistent.py"
    stand_in.write_text("X = 1\n")
    with pytest.raises(SystemExit, match="HopperWgmmaGemmPersistentKernel"):
        nvidia_peer.load(stand_in)
    a = torch.zeros(8, 8, dtype=torch.float16)
    with pytest.raises(SystemExit, match="--nvidia-example"):
        gemm_sustained.contender({"peer": "nvidia"}, a, a)
    stand_in.write_text("class HopperWgmmaGemmPersistentKernel:\n    pass\n")
    meta = nvidia_peer.load(stand_in)
    assert meta["nvidia_example"] == str(stand_in) and len(meta["nvidia_example_sha256"]) == 16
    with pytest.raises(ValueError, match="fp16"):
        nvidia_peer.gemm_fn(a.float(), a.float())


def test_ab_benchmark_cells_and_summary():
    """gemm_ab.py: by default the two headline shapes and every grid shape with M >= 2048;
    the summary is each configuration's geomean over cuBLAS and over the first
    configuration, each over the cells where both were timed (a failed one drops out)."""
    import gemm_ab

    cells = gemm_ab.default_cells()
    assert cells[:2] == [(8192, 8192, 8192), (4096, 4096, 4096)] and len(cells) == 38
    assert all(m >= 2048 for m, _, _ in cells)
    rows = [{"cublas": 100.0, "a": 90.0, "b": 99.0}, {"cublas": 100.0, "a": 110.0, "b": 121.0},
            {"cublas": 100.0, "a": 50.0}]
    summary = gemm_ab.summarize(rows, ["a", "b"])
    assert summary["geomean b / a"] == pytest.approx(1.1)
    assert summary["geomean b / cublas"] == pytest.approx((0.99 * 1.21) ** 0.5)
    assert summary["geomean a / cublas"] == pytest.approx((0.9 * 1.1 * 0.5) ** (1 / 3))
    with pytest.raises(SystemExit):
        gemm_ab.main(["--kernels", "cublas"])
    # split_k=wave: the most slices whose units fit one wave, per cell; none: no sum to pick
    wave = {"tile": (64, 128), "split_k": "wave", "split_sum": "atomic"}
    assert gemm_ab.resolve(wave, 256, 512, 5120)["split_k"] == 8    # 16 tiles x 8
    assert gemm_ab.resolve(wave, 512, 512, 5120)["split_k"] == 4    # 32 tiles x 4
    assert gemm_ab.resolve(wave, 2048, 512, 5120) == {"tile": (64, 128), "split_k": 1}
    with pytest.raises(SystemExit, match="tile"):
        gemm_ab.resolve({"split_k": "wave"}, 256, 512, 5120)
    # fit=W: 128-row tiles of the narrowest width that makes at most W waves (cuBLAS's
    # tiles at these shapes are 80 and 96 wide); the rest of the spec is kept
    assert gemm_ab.resolve({"fit": 1}, 256, 5120, 5120) == {"tile": (128, 80)}
    spec = {"fit": 1, "cluster": (1, 2)}
    assert gemm_ab.resolve(spec, 256, 6144, 4096) == {"cluster": (1, 2), "tile": (128, 96)}
    with pytest.raises(ValueError, match="no tile width fits"):
        gemm_ab.resolve({"fit": 1}, 8192, 8192, 8192)
    # mirror=cublas: cuBLAS's tile and cluster, transposed into our terms (its M is our N)
    def nvjet(name):
        import cublas_kernels

        return [{"name": name, **cublas_kernels.parse_nvjet(name)}]
    assert gemm_ab.resolve({"mirror": "cublas"}, 256, 1536, 5120, nvjet(
        "nvjet_sm90_hsh_64x64_64x13_4x2_h_bz_TNT")) == {
            "tile": (64, 64), "load": "tma", "cluster": (2, 4)}
    assert gemm_ab.resolve({"mirror": "cublas"}, 512, 5120, 5120, nvjet(
        "nvjet_sm90_hsh_168x128_64x5_1x2_h_bz_TNN"))["tile"] == (128, 176)  # 168: up to 16s
    assert gemm_ab.resolve({"mirror": "cublas"}, 4096, 4096, 4096, nvjet(
        "nvjet_sm90_hsh_256x128_64x4_1x1_h_bz_TNT")) == {
            "tile": (128, 256), "load": "tma", "cluster": (1, 1)}
    for refused in ("nvjet_sm90_hsh_64x64_64x13_4x2_h_bz_splitK_TNT",  # slices unknown
                    "nvjet_sm90_hsh_256x256_64x4_1x2_h_bz_TNT"):       # 256 rows of ours
        with pytest.raises(ValueError, match="cannot run"):
            gemm_ab.resolve({"mirror": "cublas"}, 256, 512, 5120, nvjet(refused))


def test_width_ab_specs_resolve():
    """``gpu_session.py``'s ``gemm_widths`` step: every spec parses, and every ``fit=W`` spec
    gives each of its cells a tile or refuses it with the reason (reported, not fatal)."""
    import gemm_ab
    import gemm_sustained
    import gpu_session

    assert "gemm_widths" in gpu_session.STEPS
    for _, _, cells, specs in gpu_session.WIDTH_ABS:
        for spec in specs:
            kwargs = gemm_sustained.parse_kernel(spec)
            for m, n, k in cells:
                try:
                    resolved = gemm_ab.resolve(kwargs, m, n, k)
                except ValueError as exc:
                    assert "fit" in kwargs and "no tile width fits" in str(exc)
                    continue
                assert "fit" not in resolved and (resolved is kwargs or "tile" in resolved)



def test_source_profile_plumbing_with_a_stand_in_ncu(tmp_path, monkeypatch):
    """``gemm_profile.py --source``: its specs, and the path from ncu's three calls (profile,
    source page, raw counters) to the summary JSON and the gzipped listing, driven by a
    stand-in ``ncu`` on PATH that prints what the real one prints (no GPU needed)."""
    import gzip
    import json
    import os

    import gemm_profile

    assert gemm_profile.parse_source_spec("256x512x5120/tile=128x128,split_k=4") == (
        (256, 512, 5120), "float16", {"tile": (128, 128), "split_k": 4})
    assert gemm_profile.parse_source_spec("64x64x64/dtype=bfloat16")[1] == "bfloat16"
    for bad in ("256x512", "axbxc", "1x2x3/tile"):
        with pytest.raises(SystemExit):
            gemm_profile.parse_source_spec(bad)
    fake = tmp_path / "bin" / "ncu"
    fake.parent.mkdir()
    fake.write_text("""#!/bin/sh
case "$*" in
  *"--page source"*) printf 'Kernel Name: k\\n"Address","Source","Instructions Executed",'
    printf '"Warp Stall Sampling (All Samples)","stall_long_sb"\\n'
    printf '"0x10","SYNCS.PHASECHK.TRANS64 P0, [R1]","7","90","80"\\n'
    printf '"0x20","HGMMA.64x128x16.F32 R24, gdesc[UR4], R24","64","10","0"\\n' ;;
  *"--page raw"*) printf '"ID","gpu__time_duration.sum","smsp__inst_executed.sum"\\n'
    printf '"0","17000","123"\\n' ;;
  *) : ;;
esac
""")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    assert gemm_profile.run_source(tmp_path / "out", ["256x512x5120/tile=128x128,split_k=4"]) == 0
    name = "gemm_sass_256x512x5120_tile128x128_split_k4"
    summary = json.loads((tmp_path / "out" / f"{name}.json").read_text())
    assert summary["M"] == 256 and summary["config"] == {"tile": [128, 128], "split_k": 4}
    assert summary["launch"]["gpu__time_duration.sum"] == "17000"
    assert summary["executed_by_opcode"] == {"HGMMA": 64.0, "SYNCS": 7.0}
    assert summary["top"][0]["sass"].startswith("SYNCS") and summary["samples_total"] == 100
    with gzip.open(tmp_path / "out" / f"{name}.csv.gz", "rt") as f:
        assert "HGMMA" in f.read()
    combined = json.loads((tmp_path / "out" / "gemm_sass.json").read_text())
    assert set(combined) == {"meta", "rows"} and len(combined["rows"]) == 1
    assert combined["rows"][0]["config"] == summary["config"] and "columns" not in combined
    assert combined["meta"]["command"].endswith("256x512x5120/tile=128x128,split_k=4")


def test_benchmark_merges_results_measured_in_separate_calls(tmp_path):
    """``gemm.py --merge`` joins per-dtype runs (the grid outgrows one device call) into one
    file with the summary over all rows and the meta of the machine that measured them."""
    import json

    import gemm

    def row(dtype, m, ours):
        return {"M": m, "N": 4096, "K": 4096, "dtype": dtype, "cublas": 100.0, "tma": ours,
                "cp_async": ours / 2}

    for dtype, ours in (("float16", 90.0), ("bfloat16", 110.0)):
        doc = {"meta": {"device": "NVIDIA H200", "date": "2026-11-30", "command": "gemm.py",
                        "complete": True}, "rows": [row(dtype, 512, ours)]}
        (tmp_path / f"{dtype}.json").write_text(json.dumps(doc))
    assert gemm.main(["--merge", str(tmp_path / "float16.json"), str(tmp_path / "bfloat16.json"),
                      "--out", str(tmp_path), "--name", "joined"]) == 0
    joined = json.loads((tmp_path / "joined.json").read_text())
    assert [r["dtype"] for r in joined["rows"]] == ["float16", "bfloat16"]
    assert joined["meta"]["device"] == "NVIDIA H200"
    assert joined["meta"]["summary"]["geomean_tma_vs_cublas_M>=256"] == pytest.approx(
        (0.9 * 1.1) ** 0.5)
    assert (tmp_path / "joined.png").exists()
    # a cell measured again in a later file replaces its row
    again = {"meta": {"device": "NVIDIA H200", "date": "2026-12-01", "command": "gemm.py",
                      "complete": True}, "rows": [row("float16", 512, 120.0)]}
    (tmp_path / "again.json").write_text(json.dumps(again))
    assert gemm.main(["--merge", str(tmp_path / "joined.json"), str(tmp_path / "again.json"),
                      "--out", str(tmp_path), "--name", "rejoined"]) == 0
    rejoined = json.loads((tmp_path / "rejoined.json").read_text())
    assert sorted((r["dtype"], r["tma"]) for r in rejoined["rows"]) == [("bfloat16", 110.0),
                                                                        ("float16", 120.0)]




def test_paged_benchmark_writes_every_row_and_updates_a_file_of_the_same_card(tmp_path,
                                                                              monkeypatch):
    """paged.py (its row functions stood in for, no GPU): the JSON is rewritten after every
    row (a run stopped part-way keeps its rows, ``complete`` false); ``--update`` keeps the
    file's rows of cells this run does not measure and replaces those it does; a file from
    another card is refused."""
    import json

    import paged

    def fake(phase, tma):
        def row_fn(*cell):
            rounds = cell[-1]
            b, ctx, page = (cell[1:4] if phase == "decode" else (4, 4096, cell[-2]))
            causal = cell[1] if phase == "prefill" else True
            return {**dict.fromkeys(paged.COLUMNS), "phase": phase, "dtype": cell[0],
                    "causal": causal, "page_size": page, "b": b, "s": ctx, "ctx": ctx,
                    "s_q": 1 if phase == "decode" else ctx, "h": 32, "h_kv": 8, "d": 128,
                    "tma": tma, "cp_async": tma / 2, "rounds": rounds}
        return row_fn

    path = tmp_path / "paged.json"
    monkeypatch.setattr(paged, "decode_row", fake("decode", 3.0))
    paged.main(["--phases", "decode", "--dtypes", "bfloat16", "--out", str(tmp_path)])
    doc = json.loads(path.read_text())
    assert len(doc["rows"]) == len(paged.DECODE) and doc["meta"]["complete"] is True
    monkeypatch.setattr(paged, "prefill_row", fake("prefill", 600.0))
    paged.main(["--phases", "prefill", "--dtypes", "bfloat16", "--out", str(tmp_path),
                "--update"])
    doc = json.loads(path.read_text())
    assert len(doc["rows"]) == len(paged.DECODE) + 2 * len(paged.PAGES)
    assert doc["meta"]["kept_rows_from"]["command"] is not None
    assert doc["meta"]["summary"]["prefill_tma_over_cp_async"] == pytest.approx(2.0)
    monkeypatch.setattr(paged, "decode_row", fake("decode", 4.0))  # decode measured again
    paged.main(["--phases", "decode", "--dtypes", "bfloat16", "--out", str(tmp_path),
                "--update"])
    rows = json.loads(path.read_text())["rows"]
    assert len(rows) == len(paged.DECODE) + 2 * len(paged.PAGES)
    assert {r["tma"] for r in rows if r["phase"] == "decode"} == {4.0}
    calls = []

    def stops_at_the_third(*cell):
        calls.append(cell)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return fake("decode", 5.0)(*cell)

    monkeypatch.setattr(paged, "decode_row", stops_at_the_third)
    with pytest.raises(KeyboardInterrupt):
        paged.main(["--phases", "decode", "--out", str(tmp_path), "--name", "cut"])
    cut = json.loads((tmp_path / "cut.json").read_text())
    assert len(cut["rows"]) == 2 and cut["meta"]["complete"] is False
    other = json.loads(path.read_text())
    other["meta"]["device"] = "NVIDIA H200"
    path.write_text(json.dumps(other))
    with pytest.raises(SystemExit, match="measured on NVIDIA H200"):
        paged.main(["--phases", "decode", "--out", str(tmp_path), "--update"])


def test_candidates_and_specs_name_valid_configurations():
    """``gemm.gemm_config``: a candidate's ``select_gemm_config`` options, then its
    ``GemmConfig`` fields replaced (no options: the library's own choice); any other key is
    refused; every candidate of every mechanism names a configuration the kernel runs."""
    import gemm

    from cutetma import select_gemm_config

    cfg = gemm.gemm_config({"tile": (128, 128), "cluster": (2, 1), "epi_stages": 2,
                            "raster_along_m": 0}, 256, 8192, 8192)
    assert (cfg.tile_n, cfg.cluster_m, cfg.epi_stages, cfg.raster_along_m) == (128, 2, 2, False)
    assert gemm.gemm_config({}, 256, 6144, 4096) == select_gemm_config(256, 6144, 4096)
    with pytest.raises(ValueError, match="multicast_a"):  # an option that is gone
        gemm.gemm_config({"multicast_a": 0}, 256, 256, 256)
    for name in gemm.MECHANISMS:
        for m, n, k in [(16, 512, 5120), (256, 6144, 4096), (512, 5120, 5120),
                        (8192, 8192, 8192)]:
            for candidate in gemm.candidates(name, m, n, k):
                gemm.gemm_config(candidate, m, n, k)


def test_fp8_rows_summarize_apart_from_the_16_bit_grid():
    """The FP8 rows (a row per scaling mode) get their own geomeans: against
    torch._scaled_mm over M >= 256, and TMA over cp.async; a missing contender is skipped."""
    import gemm_fp8

    rows = [dict(M=4096, N=4096, K=4096, dtype=gemm_fp8.FP8, scaling="tensor", cutetma=1300.0,
                 tma=1300.0, cp_async=650.0, torch_scaled_mm=1300.0),
            dict(M=64, N=4096, K=4096, dtype=gemm_fp8.FP8, scaling="tensor", cutetma=100.0,
                 tma=100.0, cp_async=100.0, torch_scaled_mm=400.0),
            dict(M=4096, N=4096, K=4096, dtype=gemm_fp8.FP8, scaling="row", cutetma=None,
                 tma=None, cp_async=None, torch_scaled_mm=1200.0)]
    s = gemm_fp8.summarize_fp8(rows)
    assert s["fp8_tensor_vs_torch_scaled_mm_M>=256"] == 1.0  # the M = 64 row is left out
    assert abs(s["fp8_tensor_tma_vs_cp_async"] - 2 ** 0.5) < 1e-12
    assert s["fp8_row_vs_torch_scaled_mm_M>=256"] is None
    assert not any(key.startswith("fp8_block") for key in s)  # no rows of that scaling


def test_paged_summary_keeps_float8_apart():
    """paged.py's summary: the 16-bit keys from 16-bit rows only, float8's suffixed and only
    where float8 rows ran; TMA over our dense kernel where a row has it."""
    import paged

    def row(dtype, tma, cp_async, dense=None):
        return dict(phase="prefill", dtype=dtype, tma=tma, cp_async=cp_async, dense=dense)

    s = paged.summarize([row("bfloat16", 600.0, 300.0), row(paged.FP8, 900.0, 450.0, 1000.0),
                         row(paged.FP8, 800.0, 800.0, 800.0)])
    assert s["prefill_tma_over_cp_async"] == 2.0 and "prefill_tma_over_dense" not in s
    assert abs(s[f"prefill_tma_over_cp_async_{paged.FP8}"] - 2 ** 0.5) < 1e-12
    assert abs(s[f"prefill_tma_over_dense_{paged.FP8}"] - 0.9 ** 0.5) < 1e-12
    assert not any(key.startswith("decode") and key.endswith(paged.FP8) for key in s)
    assert paged.summarize([row("bfloat16", 1.0, 1.0)]).keys().isdisjoint(
        {f"prefill_tma_over_cp_async_{paged.FP8}"})
    decode = dict(row("bfloat16", 4.0, 4.1), phase="decode", tma_append=3.6)
    assert abs(paged.summarize([decode])["decode_append_over_tma"] - 0.9) < 1e-12
    assert "prefill_append_over_tma" not in s


@pytest.mark.parametrize("name", ["paged", "paged_fp8"])
def test_paged_rows_carry_every_column(name):
    """paged.json's rows read back by the keys the paged-KV issue names: every row has
    each contender's column (None where it did not run) and its shape, phase and unit."""
    import json

    import paged

    keys = {"phase", "dtype", "causal", "b", "s_q", "ctx", "h", "h_kv", "d", "page_size",
            "unit", *paged.COLUMNS}
    rows = json.loads((BENCHMARKS / "results" / f"{name}.json").read_text())["rows"]
    assert rows and all(keys <= row.keys() for row in rows)
    assert all(row["tma"] for row in rows)  # TMA ran everywhere


def test_peer_columns_summarize_and_peer_cells_join_the_grid():
    """The peers' geomeans: cutetma's default over QuACK (gemm.py) and TMA over
    FlashAttention-4 (attention.py); ``--peer-cells`` adds the cells where they led."""
    import attention
    import gemm

    rows = [dict(M=4096, N=4096, K=4096, dtype="bfloat16", cublas=700.0, tma=700.0,
                 tma_default=684.0, quack=718.0),
            dict(M=3000, N=5000, K=3000, dtype="bfloat16", cublas=600.0, tma=560.0,
                 tma_default=560.0, quack=600.0)]
    s = gemm.summarize(rows)
    assert abs(s["geomean_default_vs_quack"] - ((684 / 718) * (560 / 600)) ** 0.5) < 1e-12
    assert s["min_default_vs_quack"] == 560 / 600
    assert set(gemm.PEER_CELLS) <= set(gemm.cells(False, peer_cells=True))
    assert not set(gemm.PEER_CELLS) & set(gemm.cells(False))
    rows = [dict(d=128, s=2048, causal=False, tma=600.0, fa4=590.0, cudnn=570.0),
            dict(d=64, s=577, causal=False, tma=300.0, fa4=345.0, cudnn=366.0)]
    s = attention.summarize(rows)
    assert s["min_tma_over_fa4"] == 300 / 345 and 0.9 < s["geomean_tma_over_fa4"] < 1.0
    assert all(len(cell) == 6 for cell in attention.PEER_CELLS)


def test_a_failed_capture_is_closed_and_tried_again(monkeypatch):
    """``captured``: a capture that fails is followed by a trivial one (closing what the
    failure left open) and tried once more; a second failure is raised, closed as well."""
    import gemm

    calls, closed = [], []
    outcomes = iter([RuntimeError("capture invalidated"), "replay"])

    def as_graph(fn):
        calls.append(fn)
        outcome = next(outcomes)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    monkeypatch.setattr(gemm, "as_graph", as_graph)
    monkeypatch.setattr(gemm, "end_failed_capture", lambda: closed.append(1))
    assert gemm.captured(len) == "replay" and calls == [len, len] and closed == [1]
    outcomes = iter([RuntimeError("a"), RuntimeError("b")])
    with pytest.raises(RuntimeError, match="b"):
        gemm.captured(len)
    assert closed == [1, 1, 1]


def test_a_capture_failure_is_not_masked_by_the_closing_capture(monkeypatch):
    """Where the closing capture fails too (a GPU in error), the capture's own error is the
    one raised, at once."""
    import gemm

    def as_graph(fn):
        raise RuntimeError("illegal address")

    def end_failed_capture():
        raise RuntimeError("closing capture failed")

    monkeypatch.setattr(gemm, "as_graph", as_graph)
    monkeypatch.setattr(gemm, "end_failed_capture", end_failed_capture)
    with pytest.raises(RuntimeError, match="illegal address"):
        gemm.captured(len)
