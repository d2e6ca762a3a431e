"""The ``cutetma`` CLI: the chapter's numbers come out of ``swizzle map`` / ``swizzle banks``,
every user mistake is one stderr line with exit code 2, and the PNGs get written, small."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from cutetma.cli import FIGURE_NAMES, main

SRC = Path(__file__).resolve().parents[1] / "src"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
MAX_PNG_BYTES = 100 * 1024
# the chapter's example, still missing --grouped / --ungrouped
CHAPTER_BANKS = (
    "swizzle banks --mode 128B --dtype fp16 --row-bytes 256 --column 0 --rows 0-7".split()
)


def run_json(capsys, *argv):
    assert main(list(argv)) == 0
    return json.loads(capsys.readouterr().out)


def assert_small_png(path: Path):
    data = path.read_bytes()
    assert data.startswith(PNG_MAGIC)
    assert len(data) < MAX_PNG_BYTES, f"{path.name} is {len(data)} bytes"


def test_map_128b_is_sector_xor_row(capsys):
    result = run_json(
        capsys, "swizzle", "map", "--mode", "128B", "--dtype", "fp16", "--box", "8x64", "--json"
    )
    assert (result["mode"], result["dtype"], result["box"]) == ("128B", "fp16", [8, 64])
    assert len(result["sectors"]) == 8 * 8
    for s in result["sectors"]:
        assert s["physical_row"] == s["row"]
        assert s["physical_sector"] == s["sector"] ^ s["row"]


def test_map_text_grid_shows_xor(capsys):
    assert main(["swizzle", "map", "--mode", "128b", "--dtype", "fp16", "--box", "8x64"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1].split() == ["row", "7", "7", "6", "5", "4", "3", "2", "1", "0"]


@pytest.mark.parametrize(
    ("layout", "distinct", "degree"),
    [
        ("--grouped", 8, 1),
        ("--ungrouped", 4, 2),
    ],
)
def test_banks_grouping_decides_the_conflict(capsys, layout, distinct, degree):
    result = run_json(capsys, *CHAPTER_BANKS, layout, "--json")
    assert result["distinct_bank_sectors"] == distinct
    assert result["conflict_degree"] == degree
    assert result["grouped"] is (layout == "--grouped")
    assert [a["row"] for a in result["accesses"]] == list(range(8))
    assert (result["mode"], result["row_bytes"], result["column"]) == ("128B", 256, 0)


def test_banks_text_ends_with_summary(capsys):
    assert main([*CHAPTER_BANKS, "--ungrouped"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len([line for line in lines if line.startswith("row ")]) == 8
    assert "4 distinct bank sectors, conflict degree 2" in lines[-1]


@pytest.mark.parametrize(
    "argv",
    [
        ["swizzle", "map", "--mode", "96B", "--dtype", "fp16", "--box", "8x64"],
        ["swizzle", "map", "--mode", "128B", "--dtype", "fp12", "--box", "8x64"],
        ["swizzle", "map", "--mode", "128B", "--dtype", "fp16", "--box", "8by64"],
        ["swizzle", "map", "--mode", "128B", "--dtype", "fp16", "--box", "8x128"],  # 256 B > span
        ["swizzle", "map", "--mode", "none", "--dtype", "fp16", "--box", "8x4"],  # 8 B inner box
        [*CHAPTER_BANKS[:-1], "7-3", "--grouped"],
        [*CHAPTER_BANKS[:-3], "16", "--rows", "0-7", "--grouped"],  # 256 B = 16 sectors
        CHAPTER_BANKS,  # neither --grouped nor --ungrouped
        ["swizzle"],
        [],
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(capsys, argv):
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("cutetma: error: ")
    assert "Traceback" not in captured.err


def test_module_entry_point_reports_errors_without_traceback():
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    good = subprocess.run(
        [sys.executable, "-m", "cutetma", *CHAPTER_BANKS, "--grouped", "--json"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert good.returncode == 0, good.stderr
    assert json.loads(good.stdout)["conflict_degree"] == 1

    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "cutetma",
            *"swizzle map --mode 128B --dtype fp16 --box 8by64".split(),
        ],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert bad.returncode == 2
    assert bad.stdout == ""
    assert bad.stderr.count("\n") == 1 and bad.stderr.startswith("cutetma: error: ")
    assert "Traceback" not in bad.stderr


def test_map_png_is_small(capsys, tmp_path):
    png = tmp_path / "map.png"
    argv = ["swizzle", "map", "--mode", "128B", "--dtype", "fp16", "--box", "8x64", "--png"]
    assert main([*argv, str(png)]) == 0
    assert_small_png(png)


def test_banks_png_is_small(capsys, tmp_path):
    png = tmp_path / "banks.png"
    assert main([*CHAPTER_BANKS, "--grouped", "--png", str(png)]) == 0
    assert_small_png(png)


def test_figures_writes_the_three_chapter_pngs(capsys, tmp_path):
    assert main(["swizzle", "figures", "--out", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(FIGURE_NAMES)
    for name in FIGURE_NAMES:
        assert_small_png(tmp_path / name)


def test_tour_renders_figures_and_prints_the_chapter(capsys, tmp_path):
    assert main(["tour", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert all((tmp_path / name).is_file() for name in FIGURE_NAMES)
    assert "row 7  7  6  5  4  3  2  1  0" in out
    assert "conflict degree 2" in out
    # the compiled kernels' instructions: attention's cluster multicasts K/V, cp.async none
    lines = dict(re.split(r"\s{2,}", line, maxsplit=1) for line in out.splitlines()
                 if line.startswith("attention d=128"))
    assert "multicast::cluster" in lines["attention d=128 tma cluster 2"]
    assert "multicast::cluster" not in lines["attention d=128 tma"]
    assert "cp.async.bulk" not in lines["attention d=128 cp.async"]
