"""Every tutorial runs as a script on this machine (CPU: the GPU parts skip, saying why),
exits 0 and ends with its "Takeaway:"."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TUTORIALS = sorted((ROOT / "tutorials").glob("[0-9][0-9]_*.py"))
EXPECTED = [
    "01_layouts_and_swizzle.py", "02_one_tma_load.py", "03_3d_tma_grouping.py",
    "04_tma_store.py", "05_pipeline.py", "06_multicast.py", "07_gemm.py", "08_attention.py",
    "09_cutting_k.py", "10_where_ctas_land.py",
]


def test_all_tutorials_are_there_and_listed():
    assert [t.name for t in TUTORIALS] == EXPECTED
    readme = (ROOT / "tutorials" / "README.md").read_text(encoding="utf-8")
    for name in EXPECTED:
        assert name in readme, f"tutorials/README.md does not list {name}"


@pytest.mark.parametrize("script", TUTORIALS, ids=lambda p: p.stem)
def test_tutorial_runs(script):
    source = script.read_text(encoding="utf-8")
    assert "def main() -> int:" in source and "sys.exit(main())" in source
    assert "gpu_unavailable()" in source
    env = dict(os.environ, CUTE_DSL_ARCH="sm_90a",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT / "src"),
                                                        os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, str(script)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, f"{script.name} exited {proc.returncode}:\n{proc.stderr[-3000:]}"
    assert "Takeaway:" in proc.stdout, proc.stdout[-2000:]
