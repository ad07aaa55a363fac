"""No import cycles inside `lab/`: every import counts, the ones inside functions and under TYPE_CHECKING too (a
cycle hidden in a function is still a cycle: lab/k8s/api.py and seed.py, controllers and server had them)."""

from __future__ import annotations

import ast
from pathlib import Path

LAB = Path(__file__).resolve().parents[2] / "lab"


def _modules() -> dict[str, Path]:
    out = {}
    for p in LAB.rglob("*.py"):
        parts = p.relative_to(LAB.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return out


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = (
                ".".join([*package[: len(package) - node.level + 1], node.module or ""])
                if node.level
                else node.module or ""
            )
            base = base.rstrip(".")
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        # A package's own __init__ is empty: importing it (or a name through it) is no edge.
        found |= {t for t in targets if t in modules and t != name and modules[t].name != "__init__.py"}
    return found


def test_lab_has_no_import_cycles():
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    cycles: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        path.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                cycles.append([*path[path.index(n) :], n])
            elif n not in state:
                visit(n)
        path.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)
    assert cycles == [], "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)
    assert graph.get("lab.k8s.controllers.composite"), "the walk saw imports"
