"""The house's layers, read from the source with ``ast`` (nothing is imported): every import points down.

Each package's ``__init__`` says what it owns and what it may import; :data:`LAYERS` is that promise as a table,
bottom first, and these tests hold it: ``graphs`` imports nothing of the project, ``solvers`` only ``graphs``,
``scheduler`` both; inside each package no import runs back up a layer, and no files import each other in a
circle. Every import counts, wherever it stands: at the top, inside a function, or under ``TYPE_CHECKING`` (a
lazy import that hides a loop is still a loop).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("graphs", "solvers", "scheduler")

#: Per package, its layers bottom first; a layer names modules or subpackages (a prefix covers what is under it).
#: A module may import its own layer (without a circle) and the layers below, never one above; a package's
#: ``__init__`` sits on top of its package. The packages themselves stack in the order of :data:`PACKAGES`.
LAYERS: dict[str, list[tuple[str, ...]]] = {
    "graphs": [
        ("graphs.errors", "graphs.reading"),  # the root error types; polling a deadline while reading
        ("graphs.schema", "graphs.files"),  # the JSON form's keys and limits; atomic files
        ("graphs.node",),
        ("graphs.graph",),
        ("graphs.io", "graphs.synthetic"),
    ],
    "solvers": [
        ("solvers.errors", "solvers.deadline", "solvers.options"),
        ("solvers.model",),  # what a plan is and what it costs: imports no solver and no menu
        ("solvers.merge",),  # fewer regions where a call costs more than it saves: a pass after every solver
        ("solvers.registry",),
        ("solvers.baselines", "solvers.chen", "solvers.brute_force", "solvers.dp", "solvers.blocks",
         "solvers.frontier", "solvers.cpsat", "solvers.ilp", "solvers.warm"),  # the solvers, by family
        ("solvers.menus",),  # plan-space menus (chunk counts, nestings): expand, ask the registry, pick the best
    ],
    "scheduler": [
        ("scheduler.progress", "scheduler.report"),
        ("scheduler.sizing",),  # budgets people write, a step's memory by category, the floor: no torch
        ("scheduler.distributed",),  # layouts, ranks, stages, in-flight micro-batches: memory arithmetic, no torch
        ("scheduler.models", "scheduler.tracing", "scheduler.measuring"),  # torch: build, trace, measure a step
        ("scheduler.applying",),
        # what composes the verbs below: proving a plan, measuring ranks, fit's search (one card, a layout), compare
        ("scheduler.measuring.verification", "scheduler.measuring.distributed", "scheduler.measuring.compiled",
         "scheduler.measuring.inductor", "scheduler.sizing.sized",
         "scheduler.sizing.search", "scheduler.sizing.fit", "scheduler.compiled", "scheduler.distributed.fit", "scheduler.comparing"),
        ("scheduler.api",),
        ("scheduler.commands", "scheduler.cli", "scheduler.launch", "scheduler.__main__"),
    ],
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for d in PACKAGES for p in sorted((ROOT / d).rglob("*.py"))}


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def imports() -> dict[str, set[str]]:
    """Module -> the project's modules it imports (``from pkg import mod`` is ``pkg.mod``; a name, ``pkg``)."""
    modules = _modules()
    out: dict[str, set[str]] = {}
    for name, path in modules.items():
        here = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                found.update(filter(None, (_resolve(a.name, modules) for a in node.names)))
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = here
                    for _ in range(node.level - 1):
                        up = up.rpartition(".")[0]
                    base = f"{up}.{base}" if base else up
                if base.split(".")[0] not in PACKAGES:
                    continue
                for a in node.names:
                    full = f"{base}.{a.name}"
                    found.add(full if full in modules else _resolve(base, modules) or base)
        found.discard(name)
        out[name] = found
    return out


def layer_of(module: str) -> tuple[int, int]:
    """``(package rank, layer)``; a package's ``__init__`` is above its package's layers."""
    package = module.split(".")[0]
    rank = PACKAGES.index(package)
    if module == package:
        return rank, len(LAYERS[package])
    best, where = -1, None
    for i, layer in enumerate(LAYERS[package]):
        for prefix in layer:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, where = len(prefix), i
    assert where is not None, f"{module} is in no layer of tests/test_layers.py's LAYERS: place it there"
    return rank, where


def upward() -> list[str]:
    """Every import that runs back up: to a later package, or a higher layer of its own."""
    bad = []
    for module, targets in sorted(imports().items()):
        for target in sorted(targets):
            if layer_of(target) > layer_of(module):
                bad.append(f"{module} -> {target}")
    return bad


def circles() -> list[list[str]]:
    """The circles of files: each strongly connected set of modules that import each other (Tarjan's)."""
    graph = imports()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def test_every_module_has_a_layer():
    for module in _modules():
        layer_of(module)  # raises, naming the module


def test_no_import_runs_back_up():
    assert upward() == []


def test_no_circle_of_files():
    assert circles() == []


def test_no_source_file_over_500_lines():
    long = {str(p.relative_to(ROOT)): n for p in _modules().values()
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > 500}
    assert long == {}


def test_the_checker_sees_a_loop_and_an_import_up(tmp_path, monkeypatch):
    """The checks themselves: a lazy import inside a function closing a loop, and one up a layer, are both found."""
    (tmp_path / "graphs").mkdir()
    (tmp_path / "graphs" / "__init__.py").write_text("")
    (tmp_path / "graphs" / "errors.py").write_text("def f():\n    from .schema import x\n")
    (tmp_path / "graphs" / "schema.py").write_text("from graphs.errors import f\nx = 1\n")
    for package in PACKAGES[1:]:
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert circles() == [["graphs.errors", "graphs.schema"]]
    assert upward() == ["graphs.errors -> graphs.schema"]


def _section(path: Path, heading: str) -> str:
    text = path.read_text(encoding="utf-8")
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end != -1 else len(text)]


def test_the_layout_pages_name_every_package_and_the_models_files():
    """The README's layout block names every subpackage and every module at the top of ``solvers/``;
    docs/execution-model.md's layout section every file of ``solvers/model/`` (the house as it is)."""
    readme = _section(ROOT / "README.md", "Layout")
    packages = sorted(str(p.parent.relative_to(ROOT)) for d in PACKAGES for p in (ROOT / d).glob("*/__init__.py"))
    assert [p for p in packages if f"{p.rpartition('/')[2]}/" not in readme] == []
    top = sorted(p.stem for p in (ROOT / "solvers").glob("*.py") if p.stem != "__init__")
    assert [m for m in top if m not in readme] == []
    model = _section(ROOT / "docs" / "execution-model.md", "Layout")
    files = sorted(p.name for p in (ROOT / "solvers" / "model").glob("*.py") if p.name != "__init__.py")
    assert [f for f in files if f not in model] == []


def test_every_package_says_what_it_may_import():
    """Each package's ``__init__`` docstring says what it may import (the promise :data:`LAYERS` holds)."""
    silent = []
    for init in sorted(p for d in PACKAGES for p in (ROOT / d).rglob("__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""
        if "May import" not in doc and "Imports nothing" not in doc:
            silent.append(str(init.relative_to(ROOT)))
    assert silent == []
