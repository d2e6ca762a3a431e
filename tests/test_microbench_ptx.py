"""The seed paper's microbenchmark kernels compiled for sm_90a on a CPU machine: each
variant issues the data movement it claims and none of the others', and reads the timers
it reports (compile-only; ``benchmarks/paper`` runs and checks them on the GPU)."""

import functools
import re
import sys
from pathlib import Path

import pytest

from cutetma import dsl
from cutetma.kernels import build
from cutetma.kernels import microbench as mb

BULK = "cp.async.bulk.tensor.2d"
BULK_CTA = "cp.async.bulk.tensor.2d.shared::cta.global.tile.mbarrier::complete_tx::bytes"
MCAST = "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes" \
        ".multicast::cluster"
CP_ASYNC = "cp.async.cg.shared.global"
NOINC = "cp.async.mbarrier.arrive.noinc"
REMOTE_ARRIVE = "mbarrier.arrive.release.cluster.shared::cluster"
DSM_LOAD = "ld.shared::cluster.v4"


def _fake_2d(dtype):
    cutlass, cute = dsl.cutlass()
    from cutlass.cute.runtime import make_fake_compact_tensor

    return make_fake_compact_tensor(dtype, (cute.sym_int32(), cute.sym_int32()),
                                    stride_order=(1, 0), assumed_align=16)


@functools.cache
def latency_ptx(cfg: mb.LatencyConfig) -> str:
    cutlass, _ = dsl.cutlass()
    from cutlass.cute.runtime import make_fake_stream

    return dsl.compile_ptx(mb.SingleShotLatency(cfg), build.fake_matrix(4),
                           _fake_2d(cutlass.Int64), _fake_2d(cutlass.Int32), cutlass.Int32(0),
                           cutlass.Int32(0), make_fake_stream()).ptx


@functools.cache
def stream_ptx(cfg: mb.StreamConfig) -> str:
    cutlass, _ = dsl.cutlass()
    from cutlass.cute.runtime import make_fake_stream

    return dsl.compile_ptx(mb.StreamingLoad(cfg), build.fake_matrix(4),
                           _fake_2d(cutlass.Int32), cutlass.Int32(0), cutlass.Int32(0),
                           make_fake_stream()).ptx


@functools.cache
def broadcast_ptx(cfg: mb.BroadcastConfig) -> str:
    cutlass, _ = dsl.cutlass()
    from cutlass.cute.runtime import make_fake_stream

    return dsl.compile_ptx(mb.ClusterBroadcast(cfg), build.fake_matrix(4),
                           _fake_2d(cutlass.Int32), cutlass.Int32(0), cutlass.Int32(0),
                           cutlass.Int32(0), make_fake_stream()).ptx


def _timers(text):
    return text.count("%globaltimer"), text.count("%clock64")


# ------------------------------------------------------------------ Figure 4 (a): latency
@pytest.mark.parametrize("rows", [1, 32, 256])
def test_latency_tma_is_one_box(rows):
    text = latency_ptx(mb.LatencyConfig("tma", rows))
    assert text.count(BULK_CTA) == 1  # the whole tile, up to 128 KiB, in one instruction
    assert CP_ASYNC not in text and "multicast::cluster" not in text
    assert "mbarrier.arrive.expect_tx" in text and "mbarrier.try_wait.parity" in text
    assert _timers(text) == (2, 2)


@pytest.mark.parametrize("rows,vectors", [(1, 1), (32, 4), (256, 32)])
def test_latency_cp_async_vectors_per_thread(rows, vectors):
    cfg = mb.LatencyConfig("cp_async", rows)
    assert cfg.vectors_per_thread == vectors
    text = latency_ptx(cfg)
    assert text.count(CP_ASYNC) == vectors
    assert NOINC in text and "cp.async.bulk" not in text
    assert _timers(text) == (2, 2)


def test_latency_timers_bracket_the_load():
    text = latency_ptx(mb.LatencyConfig("tma", 8))
    order = [m.group(0) for m in re.finditer(
        r"%globaltimer|%clock64|cp\.async\.bulk\.tensor|mbarrier\.try_wait", text)]
    assert order == ["%globaltimer", "%clock64", "cp.async.bulk.tensor",
                     "mbarrier.try_wait", "%clock64", "%globaltimer"]


# ------------------------------------------------------------------ Figure 4 (c): streaming
@pytest.mark.parametrize("stages", [1, 4])
def test_stream_tma(stages):
    text = stream_ptx(mb.StreamConfig("tma", 16, stages=stages))
    assert text.count(BULK_CTA) == stages + 1  # unrolled prologue + the refill in the loop
    assert text.count("mbarrier.init") == stages
    assert CP_ASYNC not in text and "multicast" not in text


def test_stream_cp_async():
    cfg = mb.StreamConfig("cp_async", 64, stages=2)  # 32 KiB: 8 vectors per thread
    text = stream_ptx(cfg)
    assert text.count(CP_ASYNC) == (cfg.stages + 1) * 8
    assert NOINC in text and "cp.async.bulk" not in text


# ------------------------------------------------------------------ Figures 6 and 7
@pytest.mark.parametrize("cluster", [2, 16])
def test_redundant_unicast(cluster):
    text = broadcast_ptx(mb.BroadcastConfig("tma", cluster, 16, 64))
    assert BULK_CTA in text and "multicast" not in text
    assert REMOTE_ARRIVE not in text and "ld.shared::cluster" not in text  # runs free
    assert text.count("barrier.cluster.arrive") == 2  # start and end only


@pytest.mark.parametrize("load", ["tma_multicast", "tma_multicast_split"])
@pytest.mark.parametrize("cluster", [2, 16])
def test_multicast(load, cluster):
    text = broadcast_ptx(mb.BroadcastConfig(load, cluster, 16, 64))
    assert MCAST in text and BULK_CTA not in text
    assert REMOTE_ARRIVE in text and "mapa.shared::cluster" in text  # release the stage
    assert "ld.shared::cluster" not in text


@pytest.mark.parametrize("cluster,mask", [(2, "3"), (16, "-1")])
def test_leader_multicast_mask_covers_the_cluster(cluster, mask):
    text = broadcast_ptx(mb.BroadcastConfig("tma_multicast", cluster, 16, 64))
    masks = re.findall(r"mov\.b16\s+(%rs\d+),\s*(-?\d+);", text)
    assert masks and all(value == mask for _, value in masks)
    for reg, _ in masks:  # the mask register is the multicast operand
        assert re.search(rf"multicast::cluster\S*\s.*\],\s*{reg},", text)


@pytest.mark.parametrize("cluster", [2, 16])
def test_dsm_broadcast(cluster):
    text = broadcast_ptx(mb.BroadcastConfig("dsm", cluster, 56, 256))
    assert BULK_CTA in text and "multicast" not in text  # the leader's unicast TMA
    assert "mapa.shared::cluster" in text and DSM_LOAD in text
    assert "st.shared.v4" in text  # into the peer's own stage
    assert text.count("barrier.cluster.arrive") == 4  # start, two per iteration, end


def test_timer_calibration():
    cutlass, _ = dsl.cutlass()
    from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

    text = dsl.compile_ptx(mb.TimerCalibration(), make_fake_compact_tensor(cutlass.Int64, (4,)),
                           cutlass.Int64(0), make_fake_stream()).ptx
    assert _timers(text) == (2, 2)  # globaltimer: start, end; clock64: start, the spin


@pytest.mark.parametrize("cluster", [1, 16])
def test_placement_probe_reads_the_sm_and_the_cluster_rank(cluster):
    cutlass, _ = dsl.cutlass()
    from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

    text = dsl.compile_ptx(mb.PlacementProbe(cluster),
                           make_fake_compact_tensor(cutlass.Int32, (132, 4)), cutlass.Int64(0),
                           make_fake_stream()).ptx
    assert "%smid" in text and "%cluster_ctarank" in text and "%globaltimer_lo" in text
    with pytest.raises(ValueError, match="cluster=17"):
        mb.PlacementProbe(17)


# ------------------------------------------------------------------ configs
def test_tile_shape():
    assert mb.tile_shape(512, cols=128) == (1, 128)
    assert mb.tile_shape(56 * 1024) == (56, 256)
    assert mb.tile_shape(2048, min_rows=16) == (16, 32)
    with pytest.raises(ValueError, match="no \\(rows, cols\\) box"):
        mb.tile_shape(1024, min_rows=16, cols=256)


@pytest.mark.parametrize("make,match", [
    (lambda: mb.LatencyConfig("tma", 512), "rows 1..256"),
    (lambda: mb.LatencyConfig("bulk", 8), "choose one of"),
    (lambda: mb.StreamConfig("tma", 256, 256, stages=2), "shared memory"),
    (lambda: mb.BroadcastConfig("tma_multicast", 32, 16, 64), "cluster=32"),
    (lambda: mb.BroadcastConfig("tma_multicast_split", 16, 8, 64), "do not divide"),
    (lambda: mb.BroadcastConfig("tma", 4, 128, 256, stages=2), "shared memory"),
])
def test_configs_refuse(make, match):
    with pytest.raises(ValueError, match=match):
        make()


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_launch_smem_caps_ctas_per_sm(k):
    smem = mb.launch_smem(1024, k)
    per_cta = smem + mb.SMEM_RESERVED
    assert k * per_cta <= mb.SMEM_PER_SM < (k + 1) * per_cta and smem <= mb.SMEM_PER_CTA
    assert mb.launch_smem(1024, 0) is None
    with pytest.raises(ValueError, match="do not fit"):
        mb.StreamConfig("tma", 64, stages=2, ctas_per_sm=4)  # 64 KiB > 56 KiB a CTA


def test_benchmark_sweeps_are_valid_configs():
    """Every point the paper scripts sweep is a valid config (compiling them all takes about
    a minute: ``benchmarks/paper`` does that on the GPU); 256 KiB in flight per CTA in
    Figure 6 is reported as unsupported, not attempted."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "paper"))
    import fig4
    import fig6
    import fig7

    stream = fig4.stream_cases(quick=False)
    assert {c.ctas_per_sm for c in stream} == {1, 2, 4} and len(stream) % 2 == 0
    assert max(c.ctas_per_sm * c.smem_bytes for c in stream) == 128 * 1024
    refused = [why for _, why in fig6.cases(quick=False) if why]
    assert len(refused) == len(fig6.CLUSTERS) * len(fig6.LOADS)
    assert all("shared memory" in why for why in refused)
    assert len(fig7.cases(quick=False)) == 4 * 20 * 2


def _fig6_l2():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "paper"))
    import fig6_l2

    return fig6_l2


def _l2_row(load, n, bif, tex, other, dram, ns):
    fig6_l2 = _fig6_l2()
    return {"load": load, "cluster": n, "bytes_in_flight_per_cta": bif, fig6_l2.TEX: tex,
            fig6_l2.ALL: tex + other, fig6_l2.DRAM: dram, fig6_l2.TIME: ns}


def test_fig6_l2_summarize_reports_both_sector_ratios():
    """Figure 6 (b)'s summary (CPU): SM-requested, all-sources and DRAM sector ratios."""
    fig6_l2 = _fig6_l2()
    rows = [_l2_row("tma", 8, 8192, 2000.0, 500.0, 1000.0, 25.0),
            _l2_row("tma_multicast", 8, 8192, 1000.0, 500.0, 1000.0, 50.0),
            _l2_row("tma", 2, 8192, 1000.0, 500.0, 1000.0, 30.0)]  # no multicast row: skipped
    s = fig6_l2.summarize(rows)
    assert s["l2_read_sectors_from_sms_unicast_over_multicast"] == {"8": {"8 KiB": 2.0}}
    assert s["l2_read_sectors_all_sources_unicast_over_multicast"]["8"]["8 KiB"] == 2500 / 1500
    assert s["dram_read_sectors_unicast_over_multicast"]["8"]["8 KiB"] == 1.0
    assert s["ncu_gpu_time_unicast_over_multicast_range"]["8"] == [0.5, 0.5]
    assert s["other_source_sectors_over_dram_sectors_range"] == [0.5, 0.5]
    assert s["paper_h100_l2_sectors_unicast_over_multicast"] == {"8": 2.1, "16": 4.4}


def test_fig6_l2_resummarize_keeps_meta(tmp_path):
    """``--resummarize`` rewrites meta.summary and the PNG from the rows, nothing else."""
    pytest.importorskip("matplotlib")
    import json

    fig6_l2 = _fig6_l2()
    rows = [_l2_row("tma", 16, 32768, 4400.0, 10.0, 1000.0, 25.0),
            _l2_row("tma_multicast", 16, 32768, 1000.0, 10.0, 1000.0, 50.0)]
    path = tmp_path / "paper_fig6_l2.json"
    path.write_text(json.dumps({"meta": {"date": "d", "command": "c", "summary": {"x": 1}},
                                "rows": rows}))
    assert fig6_l2.main(["--resummarize", str(path)]) == 0
    doc = json.loads(path.read_text())
    assert doc["rows"] == rows
    assert doc["meta"]["date"] == "d" and doc["meta"]["command"] == "c"
    assert doc["meta"]["summary"]["l2_read_sectors_from_sms_unicast_over_multicast"] == {
        "16": {"32 KiB": 4.4}}
    assert (tmp_path / "paper_fig6_l2.png").stat().st_size > 0


def test_table2_reads_the_counters_ncu_lists_and_sums_the_load_opcodes(tmp_path, monkeypatch):
    """Table 2 (CPU, a stand-in ``ncu`` on PATH): the counters it asks for are the listed
    ones (an unlisted counter costs its row, not the run), the memory issues are the
    TMA-load and LDGSTS counters summed (not their predicated variants), one row per (cell,
    load) in ``cases`` order, and the summary's ratios are TMA over cp.async beside the
    paper's."""
    import json
    import os

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "paper"))
    import table2

    fake = tmp_path / "bin" / "ncu"
    fake.parent.mkdir()
    listing = ("gpu__time_duration Counter nsecond # of ns\n"
               "smsp__inst_executed Counter inst # of warp instructions executed\n"
               "smsp__inst_executed_op_ldgsts Counter inst # of LDGSTS\n"
               "smsp__inst_executed_op_ldgsts_pred_on_any Counter inst # of LDGSTS\n"
               "smsp__inst_executed_op_tma_ld Counter inst # of UTMALDG\n"
               "dram__bytes_read Counter byte # of bytes read\n")
    header = '"ID","Kernel Name","gpu__time_duration.sum","smsp__inst_executed.sum",' \
             '"smsp__inst_executed_op_ldgsts.sum","smsp__inst_executed_op_tma_ld.sum",' \
             '"dram__bytes_read.sum"'
    lines = [header, '"","","ns","inst","inst","inst","byte"']
    for i in range(len(table2.cases(quick=True))):
        tma = i % 2 == 0
        lines.append(f'"{i}","FlashAttentionSm90_kernel","{900 if tma else 1000}",'
                     f'"{"1,000" if tma else "1,300"}","{0 if tma else 3400}",'
                     f'"{100 if tma else 0}","5000"')
    table = "\\n".join(lines)
    fake.write_text(f"""#!/bin/sh
case "$*" in
  *--query-metrics*) printf '{listing}' ;;
  *) printf '==PROF== done\\n{table}\\nTABLE2_GAPS {{"tc_bound": 0.0}}\\n' ;;
esac
""")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    assert table2.main(["--quick", "--out", str(tmp_path / "out")]) == 0
    doc = json.loads((tmp_path / "out" / "paper_table2.json").read_text())
    assert doc["meta"]["opcode_counters"] == ["smsp__inst_executed_op_tma_ld.sum",
                                              "smsp__inst_executed_op_ldgsts.sum"]
    assert "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active" \
        not in doc["meta"]["counters"]
    assert [(r["cell"], r["load"]) for r in doc["rows"]] == [
        (c[0], load) for c, load in table2.cases(quick=True)]
    cell = doc["meta"]["summary"]["cells"]["tc_bound"]
    issues = cell["rows"][table2.MEMORY_ISSUES]
    assert (issues["tma"], issues["cp_async"]) == (100.0, 3400.0)
    assert abs(issues["paper_ratio"] - 1.3 / 34.1) < 1e-9
    assert abs(cell["rows"]["instructions executed"]["ratio"] - 1000 / 1300) < 1e-9
    assert cell["rows"]["tensor pipe (% of peak, active)"]["tma"] is None
    assert abs(cell["ncu_time_tma_over_cp_async"] - 0.9) < 1e-9
    assert doc["meta"]["arm_max_abs_difference"] == {"tc_bound": 0.0}
    assert (tmp_path / "out" / "paper_table2.png").stat().st_size > 0
