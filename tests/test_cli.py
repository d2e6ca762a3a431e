"""The ``cutetma`` CLI: the chapter's numbers come out of ``swizzle map`` / ``swizzle banks``,
every user mistake is one stderr line with exit code 2 (bad names, sizes out of bounds, output
paths that cannot be written), the PNGs get written, small, exactly where asked and said so,
and the tour says what it compiles while it compiles and what it did at the end."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from cutetma import __version__, cli
from cutetma.cli import FIGURE_NAMES, main, tour_cmd

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


def test_tour_renders_figures_and_prints_the_chapter(capsys, tmp_path, monkeypatch):
    from cutetma import layouts

    # the algebra step on one case per mode and width (test_layouts.py sweeps them all)
    sweep = layouts.sweep_cases
    monkeypatch.setattr(layouts, "sweep_cases", lambda **kw: list(
        {(c.mode, c.elem_bytes): c for c in sweep(**kw)}.values()))
    assert main(["tour", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert all((tmp_path / name).is_file() for name in FIGURE_NAMES)
    assert "row 7  7  6  5  4  3  2  1  0" in out
    assert "conflict degree 2" in out
    assert " 128B   16b     1  yes" in out
    # one progress line per kernel: "[ i/n] name  seconds s  instructions"
    progress = [re.fullmatch(r"\[\s*\d+/\d+\] (.+?)\s+\d+\.\d s  (.*)", line)
                for line in out.splitlines() if line.startswith("[")]
    lines = {m[1]: m[2] for m in progress if m}
    assert len(lines) == len(progress) >= 8
    # the compiled kernels' instructions: the GEMM's cluster multicasts, cp.async has no TMA
    assert "multicast::cluster" in lines["gemm tma multicast (2,1)"]
    assert "multicast::cluster" not in lines["attention d=128 tma"]
    assert "cp.async.bulk.tensor" not in lines["attention d=128 cp.async"]
    assert f"compiled: {len(lines)} kernels for sm_90a" in out


# --------------------------------------------------------------------------- new-user stumbles
def test_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"cutetma {__version__}\n"


def test_help_is_success(capsys):
    assert main(["swizzle", "banks", "--help"]) == 0
    assert "--rows A-B" in capsys.readouterr().out


MAP = "swizzle map --mode 128B --dtype fp16".split()
BANKS = "swizzle banks --mode 128B --dtype fp16 --row-bytes 256 --column 0".split()

# argv (``{tmp}``: a fresh folder holding ``afile``, a file) -> a phrase the one line must hold
STUMBLES = [
    ([*MAP, "--box", "-8x64"], "box rows must be positive"),
    ([*MAP, "--box=-8x64"], "box rows must be positive"),
    ([*MAP, "--box", "8x-64"], "box columns must be positive"),
    ([*MAP, "--box", "0x64"], "box rows must be positive"),
    ([*MAP, "--box", "100000000x64"], "box rows must be at most 256"),
    ([*MAP, "--box", "9" * 5000 + "x64"], "box rows must be at most 256"),
    ([*BANKS, "--rows", "0-100000000", "--grouped"], "last row must be at most 255"),
    ([*BANKS, "--rows", "-1-7", "--grouped"], "first row must be non-negative"),
    ([*BANKS[:-3], "0", "--column", "0", "--rows", "0-7", "--grouped"], "bytes must be positive"),
    ([*BANKS[:-3], "-16", "--column", "0", "--rows", "0-7", "--grouped"], "must be positive"),
    ([*BANKS[:-3], "24", "--column", "0", "--rows", "0-7", "--grouped"], "multiple of 16"),
    ([*BANKS[:-3], "10" * 9, "--column", "0", "--rows", "0-7", "--grouped"], "at most 32768"),
    ([*BANKS[:-3], "wide", "--column", "0", "--rows", "0-7", "--grouped"], "not a whole number"),
    ([*BANKS[:-1], "-1", "--rows", "0-7", "--grouped"], "column must be non-negative"),
    ([*BANKS[:-1], "x", "--rows", "0-7", "--grouped"], "not a 16-byte sector index"),
    (["swizzle", "banks", "--mode", "99B", *BANKS[4:], "--rows", "0-7", "--grouped"],
     "unknown swizzle mode"),
    (["swizzle", "banks", "--mode", "128B", "--dtype", "fp99", *BANKS[6:], "--rows", "0-7",
      "--grouped"], "unknown dtype"),
    (["swizzle", "mapp"], "invalid choice"),
    (["tuor"], "invalid choice"),
    ([*MAP, "--box", "8x64", "--png", "/proc/x.png"], "cannot write"),
    ([*MAP, "--box", "8x64", "--png", "{tmp}/missing/dir/x.png"], "does not exist"),
    ([*MAP, "--box", "8x64", "--png", "{tmp}"], "is a folder"),
    ([*MAP, "--box", "8x64", "--png", "{tmp}/afile/x.png"], "is not a folder"),
    ([*MAP, "--box", "8x64", "--png", "{tmp}/noext"], "must end in .png"),
    ([*MAP, "--box", "8x64", "--png", "{tmp}/x.jpg"], "must end in .png"),
    ([*MAP, "--box", "8x64", "--png", ""], "empty file name"),
    ([*BANKS, "--rows", "0-7", "--grouped", "--png", "{tmp}"], "is a folder"),
    (["swizzle", "figures", "--out", "{tmp}/afile"], "exists and is not a folder"),
    (["swizzle", "figures", "--out", "/proc/x"], "cannot write"),
    (["swizzle", "figures", "--out", "{tmp}/missing/child"], "does not exist"),
    (["swizzle", "figures", "--out", ""], "empty folder name"),
    (["swizzle", "html", "--out", "/proc/x.html"], "cannot write"),
    (["swizzle", "html", "--out", "{tmp}"], "is a folder"),
    (["swizzle", "html", "--out", "{tmp}/missing/x.html"], "does not exist"),
    (["tour", "--out", "/proc/x"], "cannot write"),
    (["tour", "--out", "{tmp}/afile"], "exists and is not a folder"),
    (["tour", "--out", "{tmp}/missing/child"], "does not exist"),
]


@pytest.mark.parametrize(("argv", "phrase"), STUMBLES, ids=lambda x: None)
def test_stumbles_are_one_line_exit_2_and_write_nothing(capsys, tmp_path, argv, phrase):
    if any(a.startswith("/proc/") for a in argv) and not Path("/proc/self").is_dir():
        pytest.skip("needs Linux's /proc, a folder nothing can be written into")
    (tmp_path / "afile").write_text("")
    assert main([a.replace("{tmp}", str(tmp_path)) for a in argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("cutetma: error: "), captured.err
    assert phrase in lines[0]
    assert len(lines[0]) < 300
    # nothing created: no missing folder made, nothing renamed (noext.png, x.jpg, tmp.png)
    assert [p.name for p in tmp_path.iterdir()] == ["afile"]
    assert not (tmp_path.parent / f"{tmp_path.name}.png").exists()
    assert not Path("/proc/x").exists()


def test_png_says_where_it_went_and_json_stays_json(capsys, tmp_path):
    png = tmp_path / "banks.png"
    assert main([*BANKS, "--rows", "0-7", "--grouped", "--json", "--png", str(png)]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["conflict_degree"] == 1
    assert captured.err == f"wrote {png}\n"
    assert_small_png(png)


def test_figures_creates_only_the_named_folder_and_says_so(capsys, tmp_path):
    out = tmp_path / "figs"
    assert main(["swizzle", "figures", "--out", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"created folder {out}"
    assert lines[1:] == [f"wrote {out / name}" for name in FIGURE_NAMES]


def test_banks_at_the_row_bound_is_quick(capsys):
    result = run_json(capsys, *BANKS, "--rows", f"0-{cli.MAX_ROWS - 1}", "--grouped", "--json")
    assert len(result["accesses"]) == cli.MAX_ROWS


def test_tour_progress_summary_and_default_folder(capsys, tmp_path, monkeypatch):
    """Without compiling: two stand-in kernels (one broken), no DSL load, no GPU."""

    def broken():
        raise RuntimeError("ptxas exploded\nsecond line")

    monkeypatch.chdir(tmp_path)
    # patched where the tour uses them (cutetma.cli re-exports the steps, not the seams)
    monkeypatch.setattr(tour_cmd, "TOUR_STEPS", [cli._tour_figures, cli._tour_map,
                                                 cli._tour_compile, cli._tour_hardware])
    monkeypatch.setattr(tour_cmd, "_load_dsl", lambda log, needed_by: True)
    monkeypatch.setattr(tour_cmd, "_showcase_kernels",
                        lambda: [("fake tma", lambda: ["cp.async.bulk.tensor"]),
                                 ("fake broken", broken)])
    monkeypatch.setattr(tour_cmd, "_gpu_unavailable", lambda: "no CUDA GPU on this machine")
    assert main(["tour"]) == 1  # a kernel failed to compile
    lines = capsys.readouterr().out.splitlines()
    out = (tmp_path / cli.TOUR_OUT).resolve()
    assert lines[0] == f"cutetma tour: files go into {out}/ (created; --out DIR to change)"
    assert sorted(p.name for p in out.iterdir()) == sorted(FIGURE_NAMES)
    assert [p.name for p in tmp_path.iterdir()] == [cli.TOUR_OUT]  # no ./docs, nothing else
    assert re.fullmatch(r"\[ 1/2\] fake tma\s+\d+\.\d s  cp\.async\.bulk\.tensor", lines[
        next(i for i, line in enumerate(lines) if line.startswith("[ 1/2]"))])
    assert any(re.fullmatch(r"\[ 2/2\] fake broken\s+FAILED after \d+\.\d s: "
                            r"RuntimeError: ptxas exploded", line) for line in lines)
    summary = lines[lines.index("== summary") + 1:]
    assert summary[0] == "ran: figures, map, compile"
    assert summary[1].startswith("compiled: 1 kernels for sm_90a in ")
    assert summary[1].endswith("; FAILED: fake broken")
    assert summary[2].startswith("skipped: the GPU step: no CUDA GPU on this machine")
    assert summary[3] == f"files: 3 in {out}/: {', '.join(FIGURE_NAMES)}"

    # a second run into the same folder says it exists, creates nothing
    assert main(["tour"]) == 1
    assert capsys.readouterr().out.startswith(f"cutetma tour: files go into {out}/ (exists;")


def test_broken_pipe_is_quiet():
    """``cutetma ... | head``: the reader leaves early; no BrokenPipeError traceback."""
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    argv = "swizzle map --mode none --dtype fp8 --box 256x256 --json".split()  # ~300 KB
    proc = subprocess.Popen([sys.executable, "-m", "cutetma", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env)
    assert proc.stdout.read(10)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    proc.stderr.close()
    assert proc.wait(timeout=60) != 0
    assert err == ""
