"""The GPU session's test step (``benchmarks/gpu_session.py``) and the ``--shard I/N`` option
it hands to pytest (``tests/conftest.py``): shards split what would run, none twice, none
left out; a child past its budget is killed and counted as such. Run here with the CPU tests
(``-m "not gpu"``), since the GPU ones skip on this machine."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
# a file of quick tests that imports neither torch nor the DSL, so each pytest child starts
# in a second; ``-k`` leaves some out, as a session's ``-m "not gpu"`` would
TARGET = "tests/test_layering.py"
SELECT = ("-k", "not catch")


def _collected(*extra: str) -> list[str]:
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                          "-p", "no:cacheprovider", *extra], cwd=ROOT, capture_output=True,
                         text=True)
    return [line for line in out.stdout.splitlines() if "::" in line]


def test_shards_cover_every_selected_test_once():
    whole = _collected(TARGET, *SELECT)
    parts = [_collected(TARGET, *SELECT, f"--shard={i}/3") for i in range(3)]
    assert sorted(sum(parts, [])) == sorted(whole) and len(whole) > 6
    assert all(parts) and max(map(len, parts)) - min(map(len, parts)) <= 1
    bad = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                          "--shard=3/3", TARGET], cwd=ROOT, capture_output=True, text=True)
    assert bad.returncode != 0 and "0 <= I < N" in bad.stderr


def test_run_shards_counts_results_and_kills_past_the_budget(tmp_path):
    import gpu_session

    cmd = [sys.executable, "-m", "pytest", "-m", "not gpu", "-v", "-p", "no:cacheprovider",
           TARGET, *SELECT]
    expected = len(_collected(*cmd[6:]))
    summary = gpu_session.run_shards(cmd, 2, 120, tmp_path)
    assert f"{expected} passed" in summary and "killed" not in summary, summary
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pytest_gpu_0.txt",
                                                          "pytest_gpu_1.txt"]

    slow = tmp_path / "slow" / "test_slow.py"
    slow.parent.mkdir()
    slow.write_text("import time\n\ndef test_fast():\n    pass\n\n"
                    "def test_slow():\n    time.sleep(60)\n")
    cmd = [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", str(slow)]
    summary = gpu_session.run_shards(cmd, 1, 8, tmp_path / "slow")
    assert "1 passed" in summary and "1 of 1 killed after 8 s" in summary, summary


def test_one_shard_where_the_gpu_takes_one_process(monkeypatch):
    import subprocess as sp

    import gpu_session

    def smi(mode):
        def run(argv, **kwargs):
            assert argv[0] == "nvidia-smi"
            return sp.CompletedProcess(argv, 0, stdout=mode + "\n")
        return run

    monkeypatch.setattr(sp, "run", smi("Exclusive_Process"))
    assert gpu_session.shards_allowed(4) == 1
    monkeypatch.setattr(sp, "run", smi("Default"))
    assert gpu_session.shards_allowed(4) == 4

    def missing(argv, **kwargs):
        raise FileNotFoundError(argv[0])

    monkeypatch.setattr(sp, "run", missing)
    assert gpu_session.shards_allowed(3) == 3
