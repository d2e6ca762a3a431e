"""Data movement compiled for sm_90a on a CPU machine: each mechanism issues the PTX it
claims and none of the others' (compile-only; the GPU tests check the bytes)."""

import re

import pytest

from cutetma.kernels import build
from cutetma.kernels.tile_copy import ProbeConfig

BULK_LOAD = "cp.async.bulk.tensor"
MCAST = ".multicast::cluster"
CP_ASYNC = "cp.async.cg.shared.global"


def ptx(cfg):
    return build.compile_probe(cfg).ptx


@pytest.mark.parametrize("mode", ["none", "32B", "64B", "128B"])
@pytest.mark.parametrize("elem_bytes", [1, 2, 4])
def test_tma_load_2d(mode, elem_bytes):
    text = ptx(ProbeConfig(elem_bytes, mode, 64, 32 // elem_bytes))
    assert "cp.async.bulk.tensor.2d.shared::cta.global.tile.mbarrier::complete_tx::bytes" in text
    assert "mbarrier.arrive.expect_tx" in text and "mbarrier.try_wait.parity" in text
    assert CP_ASYNC not in text and MCAST not in text


@pytest.mark.parametrize("mode", ["32B", "64B", "128B"])
def test_tma_grouped_box_is_one_3d_copy(mode):
    span = {"32B": 32, "64B": 64, "128B": 128}[mode]
    text = ptx(ProbeConfig(2, mode, 16, 2 * span // 2, grouped=True))
    assert text.count("cp.async.bulk.tensor.3d") == 1
    assert "cp.async.bulk.tensor.2d" not in text


def test_cp_async_variant_issues_no_bulk_copy():
    text = ptx(ProbeConfig(2, "128B", 64, 64, load="cp_async"))
    assert CP_ASYNC in text
    assert "cp.async.mbarrier.arrive.noinc" in text  # the loader arrives when its group lands
    assert BULK_LOAD not in text and "cp.async.bulk" not in text


def test_cp_async_writes_the_swizzle_in_software():
    # Swizzle<3,4,3> on byte addresses: (addr >> 3) & 0x70, XORed in: visible as 'and 112'
    text = ptx(ProbeConfig(2, "128B", 64, 64, load="cp_async"))
    assert "112" in text and "xor" in text


@pytest.mark.parametrize("cluster", [2, 4])
def test_multicast(cluster):
    text = ptx(ProbeConfig(2, "128B", 64, 64, load="tma_multicast", cluster=cluster))
    assert "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"\
        ".multicast::cluster" in text
    assert "barrier.cluster.arrive" in text and "barrier.cluster.wait" in text


def test_dsm_broadcast():
    text = ptx(ProbeConfig(2, "128B", 64, 64, load="dsm", cluster=2))
    assert "mapa.shared::cluster" in text and "ld.shared::cluster" in text
    assert BULK_LOAD in text and MCAST not in text


def test_tma_store_commit_and_wait():
    text = build.compile_round_trip(2, "128B", 64, 64).ptx
    assert "cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group" in text
    assert "cp.async.bulk.commit_group" in text
    assert re.search(r"cp\.async\.bulk\.wait_group\.read\s+0;", text)


@pytest.mark.parametrize("kwargs,match", [
    (dict(elem_bytes=2, swizzle="128B", rows=8, cols=128), "swizzle-span rule"),
    (dict(elem_bytes=2, swizzle="128B", rows=8, cols=64, load="tma_multicast"), "cluster"),
    (dict(elem_bytes=2, swizzle="128B", rows=8, cols=64, load="tma", cluster=2), "one CTA"),
    (dict(elem_bytes=2, swizzle="128B", rows=12, cols=64, load="tma_multicast", cluster=8),
     "do not divide"),
    (dict(elem_bytes=2, swizzle="128B", rows=8, cols=96, grouped=True), "whole groups"),
    (dict(elem_bytes=2, swizzle="128B", rows=8, cols=64, load="bulk"), "choose one of"),
])
def test_probe_config_refuses(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ProbeConfig(**kwargs)


@pytest.mark.parametrize("rows,at", [(8, 8), (16, 16), (4, 4), (12, 4)])
def test_paged_box_lands_rows_into_a_stage(rows, at):
    """A paged stage's later box: one 2D TMA whose shared-memory address is ``at`` rows (of
    128 bytes) into the buffer; a box of fewer than the atom's 8 rows is one copy too."""
    cfg = ProbeConfig(2, "128B", rows, 64, row_offset=at)
    assert cfg.smem_bytes == (rows + at) * 128
    text = ptx(cfg)
    loads = re.findall(r"cp\.async\.bulk\.tensor\.2d\.shared::cta\.global[^\[]*\[([^\]]+)\]",
                       text)
    assert len(loads) == 1 and loads[0].endswith(f"+{at * 128}")
    with pytest.raises(ValueError, match="row_offset"):
        ProbeConfig(2, "128B", rows, 64, load="cp_async", row_offset=at)


def test_paged_probe_cases_tell_the_two_phase_readings_apart():
    """The hardware check's paged cases: for boxes on whole 8-row atoms the buffer's swizzle
    phase and a phase restarting at the box agree (and CuTe's stage layout says the same);
    for a box that starts inside an atom they differ, so the card decides which it writes."""
    import numpy as np

    from cutetma import hardware

    for case in hardware.paged_cases():
        stage = hardware.model_offsets(case)
        assert np.array_equal(stage, hardware.algebra_offsets(case)), case.name
        same = np.array_equal(stage, hardware.box_phase_offsets(case))
        assert same == (case.row_offset % 8 == 0), case.name
