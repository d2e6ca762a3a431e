"""The package's layers (``cutetma/__init__.py``'s docstring): every module imports only from
its own layer or the ones below, and no two modules import each other, directly or round a
longer loop. Read from the sources with ``ast`` (module-level and function-level imports
alike), so nothing is imported and no GPU or DSL is needed.

``cutetma/__init__.py`` is exempt: it only names its lazy exports, imported on first use.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
ROOT = "cutetma"

# lowest first; a module may import from its own layer and the ones before it
LAYERS = [
    {"dsl", "swizzle", "layouts", "results", "reference"},
    {"viz"},
    {"copy"},
    {"kernels"},
    {"tuning"},
    {"runtime"},
    {"ops", "kvcache", "fp8", "fp8_attention", "backward", "checks"},
    {"hardware", "cli", "__main__"},  # "cli": the package cutetma.cli and its modules
]
RANK = {part: rank for rank, parts in enumerate(LAYERS) for part in parts}


def module_files(src: Path = SRC) -> dict[str, Path]:
    """Dotted module name -> source file, for every module of the package."""
    files = {}
    for path in sorted((src / ROOT).rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        files[".".join(parts)] = path
    return files


def _resolve(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The absolute module an ``ImportFrom`` names (relative imports resolved)."""
    if not node.level:
        return node.module or ""
    package = module.split(".") if is_package else module.split(".")[:-1]
    base = package[:len(package) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(source: str, module: str, modules, is_package: bool = False):
    """``(line, target)`` for each import of a package module in ``source``, at any depth
    (inside functions too). ``from a.b import c`` names the module ``a.b.c`` where that is
    a module, else ``a.b``; ``from cutetma import name`` of a non-module names the package
    root (``ROOT``)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names
                      if alias.name == ROOT or alias.name.startswith(ROOT + ".")]
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(node, module, is_package)
            if base != ROOT and not base.startswith(ROOT + "."):
                continue
            for alias in node.names:
                name = f"{base}.{alias.name}"
                found.append((node.lineno, name if name in modules else base))
    return found


def layer(module: str) -> int | None:
    """The rank of a module's layer (None: the exempt package root)."""
    parts = module.split(".")
    if parts == [ROOT]:
        return None
    return RANK.get(parts[1], -1)


def import_graph(src: Path = SRC):
    """``{module: [(line, imported module), ...]}`` over the package, the root exempt."""
    files = module_files(src)
    return {module: imports_of(path.read_text(), module, files, path.name == "__init__.py")
            for module, path in files.items() if module != ROOT}


def upward_imports(graph) -> list[str]:
    """Each import that points to a higher layer, to a module in no layer, or through the
    package root to a name that is not a module (a lazy export: import where it lives)."""
    bad = []
    for module, imports in sorted(graph.items()):
        own = layer(module)
        for line, target in imports:
            if own == -1:
                bad.append(f"{module} is in no layer (add it to LAYERS)")
                break
            there = layer(target)
            if there is None:
                continue
            if there == -1:
                bad.append(f"{module}:{line} imports {target}, which is in no layer")
            elif there > own:
                bad.append(f"{module}:{line} imports {target} (layer {there} > {own})")
    return bad


def _lazy_root_imports(src: Path = SRC) -> list[str]:
    """``from cutetma import name`` where ``name`` is neither a module nor a dunder."""
    files = module_files(src)
    bad = []
    for module, path in files.items():
        if module == ROOT:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and not node.level and node.module == ROOT:
                bad += [f"{module}:{node.lineno} imports {alias.name} from the package root"
                        for alias in node.names if f"{ROOT}.{alias.name}" not in files
                        and not alias.name.startswith("__")]
    return bad


def cycles(graph) -> list[list[str]]:
    """The import cycles of the module graph, each once, as the loop of modules (depth-first
    search; the first module of each loop the smallest name, so the report is stable)."""
    edges = {m: sorted({t for _, t in imports if t in graph and t != m})
             for m, imports in graph.items()}
    found, state, stack = set(), {}, []

    def visit(module):
        state[module] = "open"
        stack.append(module)
        for target in edges.get(module, ()):
            if state.get(target) == "open":
                loop = stack[stack.index(target):]
                first = loop.index(min(loop))
                found.add(tuple(loop[first:] + loop[:first]))
            elif target not in state:
                visit(target)
        stack.pop()
        state[module] = "done"

    for module in sorted(edges):
        if module not in state:
            visit(module)
    return [list(loop) for loop in sorted(found)]


# ------------------------------------------------------------------ the package itself
def test_every_module_is_in_a_layer():
    graph = import_graph()
    assert len(graph) > 20  # the sources were found
    assert [m for m in graph if layer(m) == -1] == []


def test_no_module_imports_from_a_higher_layer():
    bad = upward_imports(import_graph())
    assert not bad, "imports against the layers:\n" + "\n".join(bad)


def test_no_lazy_export_is_imported_inside_the_package():
    bad = _lazy_root_imports()
    assert not bad, "\n".join(bad)


def test_no_import_cycles():
    found = cycles(import_graph())
    assert not found, "import cycles:\n" + "\n".join(" -> ".join(c + c[:1]) for c in found)


# ------------------------------------------------------------------ the checks themselves
def _fake_package(tmp_path, sources: dict[str, str]) -> Path:
    for name, text in sources.items():
        path = tmp_path / ROOT / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def test_the_checks_catch_an_upward_import_and_a_cycle(tmp_path):
    """A fake package: ``swizzle`` imports ``ops`` inside a function (upward), ``kernels.a``
    and ``kernels.b`` import each other (one of them from a function), ``tuning`` imports
    ``kernels`` by a relative import (fine), and the root ``__init__`` imports anything."""
    src = _fake_package(tmp_path, {
        "__init__.py": "from cutetma import ops\n",
        "swizzle.py": "import os\n\ndef f():\n    from cutetma.ops import gemm\n",
        "ops.py": "from cutetma import swizzle\nimport cutetma.kernels.a\n",
        "kernels/__init__.py": "",
        "kernels/a.py": "from cutetma.kernels import b\n",
        "kernels/b.py": "def g():\n    from cutetma.kernels.a import x\n",
        "tuning/__init__.py": "from .gemm import y\n",
        "tuning/gemm.py": "from ..kernels import a\nfrom ..swizzle import z\n",
    })
    graph = import_graph(src)
    assert "cutetma" not in graph
    assert graph["cutetma.tuning"] == [(1, "cutetma.tuning.gemm")]
    assert graph["cutetma.tuning.gemm"] == [(1, "cutetma.kernels.a"), (2, "cutetma.swizzle")]
    assert upward_imports(graph) == ["cutetma.swizzle:4 imports cutetma.ops (layer 6 > 0)"]
    # the upward import closes a loop too
    assert cycles(graph) == [["cutetma.kernels.a", "cutetma.kernels.b"],
                             ["cutetma.ops", "cutetma.swizzle"]]


def test_the_checks_catch_a_longer_cycle_and_an_unknown_module(tmp_path):
    graph = {
        "cutetma.dsl": [(3, "cutetma.swizzle")],
        "cutetma.swizzle": [(5, "cutetma.layouts")],
        "cutetma.layouts": [(7, "cutetma.dsl")],
        "cutetma.ops": [(1, "cutetma.dsl"), (2, "cutetma")],
        "cutetma.extra": [(1, "cutetma.dsl")],
        "cutetma.cli": [(9, "cutetma.extra")],
    }
    assert cycles(graph) == [["cutetma.dsl", "cutetma.swizzle", "cutetma.layouts"]]
    assert upward_imports(graph) == ["cutetma.cli:9 imports cutetma.extra, which is in no layer",
                                     "cutetma.extra is in no layer (add it to LAYERS)"]
    src = _fake_package(tmp_path, {"__init__.py": "", "viz.py": "from cutetma import gemm\n"})
    assert _lazy_root_imports(src) == ["cutetma.viz:1 imports gemm from the package root"]


@pytest.mark.parametrize("module,expected", [
    ("cutetma.kernels.build", 3), ("cutetma.runtime", 5), ("cutetma.__main__", 7),
    ("cutetma.cli", 7), ("cutetma.cli.args", 7), ("cutetma.cli.tour_cmd", 7),
    ("cutetma", None), ("cutetma.nowhere", -1),
])
def test_layer_of_a_module(module, expected):
    assert layer(module) == expected
