"""Every tutorial runs as a script, as a reader runs it: ``python tutorials/NN_x.py`` from a
fresh shell with no cutetma or CuTe DSL variables set (CPU: the GPU parts skip, saying why),
exits 0 and ends with its "Takeaway:".

The clean environment is the point: the DSL reads ``CUTE_DSL_ARCH`` once, when ``cutlass``
is first imported, and on a machine without a GPU it would target sm_100a; ``import
cutetma`` sets sm_90a first, so a tutorial must import cutetma before anything that imports
the DSL (``test_tutorials_import_cutetma_before_the_dsl`` holds that on any machine, the runs
on a CPU machine).

On a machine without a GPU the runs take about 45 s of CPU in all (most of it importing
torch and the DSL and compiling the GEMM and attention kernels for sm_90a), so they go as
many at a time as there are cores, each test waiting for its own script; with a GPU (whose
parts time kernels) or under pytest-xdist, one at a time, each in its own test.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TUTORIALS = sorted((ROOT / "tutorials").glob("[0-9][0-9]_*.py"))
EXPECTED = [
    "01_layouts_and_swizzle.py", "02_one_tma_load.py", "03_3d_tma_grouping.py",
    "04_tma_store.py", "05_pipeline.py", "06_multicast.py", "07_gemm.py", "08_attention.py",
    "09_cutting_k.py", "10_where_ctas_land.py", "11_paged_kv.py", "12_fp8.py",
    "13_backward.py",
]
DSL_MODULES = ("cutlass", "cuda")  # importing either before cutetma fixes the DSL's arch


def clean_env() -> dict:
    """A fresh shell's environment: where programs and the package are, nothing else (no
    CUTE_DSL_ARCH, no CUTETMA_*)."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"),
           "HOME": os.environ.get("HOME", str(ROOT)),
           "PYTHONPATH": str(ROOT / "src")}
    if "TMPDIR" in os.environ:  # the DSL's file cache lives there
        env["TMPDIR"] = os.environ["TMPDIR"]
    return env


def test_all_tutorials_are_there_and_listed():
    assert [t.name for t in TUTORIALS] == EXPECTED
    readme = (ROOT / "tutorials" / "README.md").read_text(encoding="utf-8")
    for name in EXPECTED:
        assert name in readme, f"tutorials/README.md does not list {name}"


def _cutetma_names(tree: ast.Module) -> set[str]:
    """Names a module binds to cutetma modules or objects by its imports."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names
                      if a.name.split(".")[0] == "cutetma"}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("cutetma"):
            names |= {a.asname or a.name for a in node.names}
    return names


@pytest.mark.parametrize("script", TUTORIALS, ids=lambda p: p.stem)
def test_tutorials_import_cutetma_before_the_dsl(script):
    """Module level: a cutetma import comes before any of the DSL's (function bodies run
    later, so they may import the DSL where they need it); no private cutetma name is used;
    no history words."""
    source = script.read_text(encoding="utf-8")
    tree = ast.parse(source)
    first = {}
    for node in tree.body:
        if isinstance(node, ast.Import):
            modules = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            modules = [node.module or ""]
        else:
            continue
        for module in modules:
            first.setdefault(module.split(".")[0], node.lineno)
    assert "cutetma" in first, f"{script.name} imports no cutetma module at module level"
    for dsl in DSL_MODULES:
        assert first.get(dsl, 1 << 30) > first["cutetma"], (
            f"{script.name}:{first[dsl]} imports {dsl} before cutetma (line "
            f"{first['cutetma']}): the DSL would pick its arch before cutetma sets sm_90a")

    bound = _cutetma_names(tree)
    private = sorted(
        f"{node.lineno}: {a.name}" for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("cutetma")
        for a in node.names if a.name.startswith("_")
    ) + sorted(
        f"{node.lineno}: {node.value.id}.{node.attr}" for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
        and node.value.id in bound and node.attr.startswith("_")
        and not node.attr.startswith("__")
    )
    assert not private, f"{script.name} uses private cutetma names: {private}"
    history = re.findall(r"(?i).{0,30}\b(?:session \d+|this session|sessions? \d+)\b.{0,30}",
                         source)
    assert not history, f"{script.name} names working sessions: {history}"


def run_script(script: Path) -> subprocess.CompletedProcess:
    env = clean_env()
    assert not any(k.startswith(("CUTE_", "CUTETMA")) for k in env)
    return subprocess.run([sys.executable, str(script)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def runs(request):
    """The selected tutorials' runs, started together in test order on a pool of one
    worker per core, as futures by script (none where they should run one at a time)."""
    from cutetma.kernels.build import gpu_unavailable

    if gpu_unavailable() is None or "PYTEST_XDIST_WORKER" in os.environ:
        yield {}
        return
    selected = [item.callspec.params["script"] for item in request.session.items
                if getattr(item, "originalname", "") == "test_tutorial_runs"
                and hasattr(item, "callspec")]
    with ThreadPoolExecutor(max_workers=max(1, min(len(selected), os.cpu_count() or 1))) as pool:
        futures = {script: pool.submit(run_script, script) for script in selected}
        yield futures
        for future in futures.values():
            future.cancel()


@pytest.mark.parametrize("script", TUTORIALS, ids=lambda p: p.stem)
def test_tutorial_runs(script, runs):
    from cutetma.kernels.build import gpu_unavailable

    source = script.read_text(encoding="utf-8")
    assert "def main() -> int:" in source and "sys.exit(main())" in source
    assert "gpu_unavailable()" in source
    proc = runs[script].result() if script in runs else run_script(script)
    assert proc.returncode == 0, f"{script.name} exited {proc.returncode}:\n{proc.stderr[-3000:]}"
    assert "Takeaway:" in proc.stdout, proc.stdout[-2000:]
    if gpu_unavailable() and '"cuda"' in source:  # it has a GPU part: it must say why not
        assert "skipped: " in proc.stdout, f"{script.name} says nothing of its GPU part"
