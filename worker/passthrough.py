"""The workflows modules that define no workflow, found by reading the workflows package: what the sandbox
passes through (worker/registry.py), so that a new module is shared or sandboxed by what it is, not by a list.

Read from the source (a class decorated ``@workflow.defn``), not imported: the worker and the replayer build their
sandbox before anything imports the workflows. tests/test_sandbox.py checks the reading against the imported
modules' workflow definitions.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import workflows

CATALOG = "workflows.catalog"  # defines no workflow but imports every workflow module: never shared


def defines_workflow(source: str) -> bool:
    """A class in `source` is decorated ``@workflow.defn`` (with or without arguments)."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef):
            for decorator in node.decorator_list:
                target = decorator.func if isinstance(decorator, ast.Call) else decorator
                if isinstance(target, ast.Attribute) and target.attr == "defn" and _names_workflow(target.value):
                    return True
    return False


def _names_workflow(node: ast.expr) -> bool:
    return isinstance(node, ast.Name) and node.id == "workflow"


@cache
def workflow_free_modules() -> tuple[str, ...]:
    """Each package under workflows/ none of whose modules defines a workflow, by the package's name (all of it
    shared); in the other packages, each module that defines none; the catalog never."""
    root = Path(workflows.__file__).parent
    return tuple(sorted(_free(root, "workflows")))


def _free(package: Path, name: str) -> list[str]:
    """The names under `package` (called `name`) to pass through; [name] when all of it may be."""
    found: list[str] = []
    whole = True
    for path in sorted(package.iterdir()):
        child = f"{name}.{path.stem}"
        if path.is_dir() and (path / "__init__.py").exists():
            inner = _free(path, child)
            whole &= inner == [child]
            found += inner
        elif path.suffix == ".py" and path.stem != "__init__":
            if child == CATALOG or defines_workflow(path.read_text()):
                whole = False
            else:
                found.append(child)
    # The top package is never passed whole: its families' workflow modules live under it.
    return [name] if whole and name != "workflows" else found
