"""The shape of the package (docs/architecture.md): no import cycles, data flowing
one way through the layers, in-package imports at module top, no heavy imports on
the light paths."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import ROOT

PACKAGE = ROOT / "harness"
# bottom to top: a module may import from its own layer and the layers below it
LAYERS = [
    ("harness.errors", "harness.registry",
     "harness.progress", "harness.streams", "harness.stats", "harness.criteria_stats", "harness.textfile",
     "harness.threads", "harness.interrupt",
     "harness.cost", "harness.memory", "harness.locations"),
    ("harness.spec", "harness.data.settings", "harness.data.text_settings"),
    ("harness.evidence",),
    ("harness.model",),
    ("harness.data",),
    ("harness.mech",),
    ("harness.claims",),
    ("harness.hypothesis",),
    ("harness.engine",),
    ("harness.report",),
    ("harness.sweep", "harness.tools"),
    ("harness.conformance", "harness.extend"),
    ("harness.cli", "harness.cli_args", "harness.pytest_plugin", "harness.__main__", "harness.entry",
     "harness"),
]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def layer(module: str) -> int:
    best = max((p for group in LAYERS for p in group if module == p or module.startswith(p + ".")), key=len)
    return next(i for i, group in enumerate(LAYERS) if best in group)


def imports(module: str) -> list[tuple[str, int, bool]]:
    """(imported harness module, line, at module top) for every import statement in `module`."""
    path = MODULES[module]
    tree = ast.parse(path.read_text())
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    top = {id(n) for n in tree.body}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        else:
            continue
        for t in targets:
            if t in MODULES and t != module:
                out.append((t, node.lineno, id(node) in top))
    return out


GRAPH = {m: sorted({t for t, _, _ in imports(m)}) for m in MODULES}


def test_the_layers_cover_every_module():
    listed = [p for group in LAYERS for p in group]
    for m in MODULES:
        assert any(m == p or m.startswith(p + ".") for p in listed), f"{m} is in no layer"


def test_no_import_cycles():
    """Tarjan's strongly connected components over every import (top-level or not)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in GRAPH:
        if v not in index:
            visit(v)
    assert cycles == []


def test_a_cycle_would_be_found(monkeypatch):
    """The detector is not vacuous: a back edge from the data model to the runner is a cycle."""
    monkeypatch.setitem(GRAPH, "harness.evidence.result", GRAPH["harness.evidence.result"] + ["harness.engine.runner"])
    with pytest.raises(AssertionError):
        test_no_import_cycles()


def test_data_flows_one_way():
    upward = [f"{m} imports {t} (line {line})" for m in MODULES for t, line, _ in imports(m) if layer(t) > layer(m)]
    assert upward == []


INSIDE_ALLOWED = {("harness.entry", "harness.cli")}  # the entry point catches Ctrl-C during the CLI's imports


def test_in_package_imports_are_at_module_top():
    inside = [f"{m}:{line} imports {t}" for m in MODULES for t, line, at_top in imports(m)
              if not at_top and (m, t) not in INSIDE_ALLOWED]
    assert inside == []


def test_light_paths_import_no_torch():
    """`import harness`, the CLI module and the hypothesis loader stay free of torch,
    TransformerLens and matplotlib (`harness validate` and `--help` must be fast)."""
    code = ("import sys, harness, harness.cli, harness.pytest_plugin; "
            "heavy = sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'transformer_lens', 'matplotlib'}); "
            "print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"


def test_no_reference_to_documents_outside_the_repository():
    """Code, docs and tests cite only what the repository holds (no design notes kept elsewhere)."""
    outside = "DESIGN" + ".md"
    for path in [*PACKAGE.rglob("*.py"), *(ROOT / "tests").rglob("*.py"), *(ROOT / "docs").glob("*.md"),
                 ROOT / "README.md"]:
        assert outside not in path.read_text(), path


def package_map() -> list[tuple[str, list[str]]]:
    """tests/package_map.txt: (path prefix, test files) per line."""
    out = []
    for line in (ROOT / "tests" / "package_map.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            prefix, files = line.split(":", 1)
            out.append((prefix.strip(), files.split()))
    return out


def test_the_package_map_lists_every_test_file_and_covers_every_module():
    rows = package_map()
    listed = {f for _, files in rows for f in files}
    tests = {p.stem for p in (ROOT / "tests").glob("test_*.py")}
    assert tests - listed == set(), "test files missing from tests/package_map.txt"
    assert listed - tests == set(), "tests/package_map.txt names test files that do not exist"
    prefixes = [p for p, _ in rows]
    unmapped = [m for m in (p.relative_to(ROOT).as_posix() for p in PACKAGE.rglob("*.py"))
                if not any(m.startswith(prefix) for prefix in prefixes)]
    assert unmapped == []


def test_the_slow_list_names_tests_that_exist():
    """Every line of tests/slow_tests.txt (what make test-quick leaves out) names a test function
    defined in its file: a renamed or deleted test does not leave a line that marks nothing."""
    from .conftest import slow_listed

    listed = slow_listed()
    assert listed and all(x.startswith("tests/test_") and x.count("::") == 1 for x in listed)
    missing = []
    for x in sorted(listed):
        path, name = x.split("::")
        file = ROOT / path
        defined = {n.name for n in ast.walk(ast.parse(file.read_text())) if isinstance(n, ast.FunctionDef)} \
            if file.exists() else set()
        if name not in defined:
            missing.append(x)
    assert missing == [], "tests/slow_tests.txt names tests that do not exist"
