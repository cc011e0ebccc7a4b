"""Import cycles among octodsl's modules, from their source (ast), not by importing them: a cycle
closed only by an import inside a function (run late, after both modules have loaded) is still
two modules that need each other, and importing each module alone would not show it.

An edge A -> B is an import of B written in A, at any depth (in a function too), except under
`if TYPE_CHECKING:` (never run). `from P import x` is an edge to P.x when that is a module, else
to P. Importing a submodule also runs its package's __init__, but that edge is not counted:
every package whose __init__ imports its own submodules would be a cycle with each of them.

Run as a script (`python tests/test_import_cycles.py`) it prints every cycle; the test asserts
that none passes through the module pairs it names.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "octodsl"

MUST_NOT_CYCLE = [("octodsl.models.hf", "octodsl.models.load")]
"""Module pairs that must not be in one cycle (issue 28)."""


def _modules() -> dict[str, Path]:
    """octodsl's modules by dotted name (a package by its own name)."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_nodes(node: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            yield child
        elif isinstance(child, ast.If) and _is_type_checking(child.test):
            for other in child.orelse:
                yield from _import_nodes(ast.Module(body=[other], type_ignores=[]))
        else:
            yield from _import_nodes(child)


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The octodsl modules that module `name` (at `path`) imports."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in _import_nodes(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {alias.name for alias in node.names}
            continue
        base = node.module or ""
        if node.level:
            up = package.split(".")[: len(package.split(".")) - node.level + 1]
            base = ".".join(up + ([node.module] if node.module else []))
        for alias in node.names:
            out.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
    return {m for m in out if m in modules and m != name}


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _components(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
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
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every elementary cycle (each once, from its least module), component by component."""
    out: list[list[str]] = []
    for component in _components(graph):
        members = set(component)
        for start in component:  # cycles whose least module is `start`
            allowed = {m for m in members if m >= start}
            path = [start]

            def extend(
                v: str, path: list[str] = path, start: str = start, allowed: set[str] = allowed
            ) -> None:
                for w in sorted(graph[v] & allowed):
                    if w == start:
                        out.append([*path, start])
                    elif w not in path:
                        path.append(w)
                        extend(w)
                        path.pop()

            extend(start)
    return out


def test_hf_and_load_import_no_cycle():
    graph = import_graph()
    assert graph["octodsl.models.load"], "the graph must see load's imports"
    assert "octodsl.models.hf" in graph["octodsl.models.load"]
    for a, b in MUST_NOT_CYCLE:
        through = [c for c in cycles(graph) if a in c and b in c]
        assert not through, f"{a} and {b} are in import cycles: {through}"


def test_the_graph_sees_a_cycle_closed_inside_a_function(tmp_path, monkeypatch):
    """A cycle made only by function-level imports is found (what hf <-> load was)."""
    pkg = tmp_path / "octodsl"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .b import f\n")
    (pkg / "b.py").write_text("def f():\n    from . import a\n")
    (pkg / "c.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from . import a\nfrom . import b\n"
    )
    monkeypatch.setitem(globals(), "PACKAGE", pkg)
    assert cycles(import_graph()) == [["octodsl.a", "octodsl.b", "octodsl.a"]]


if __name__ == "__main__":
    for cycle in cycles(import_graph()):
        print(" -> ".join(cycle))
