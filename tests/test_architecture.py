"""The architecture holds by test (docs/architecture.md): imports flow one way, no module imports itself round a
cycle, and no module grows past ~600 lines without saying why.

The module graph is read with `ast` from the source, imports inside functions included (an import moved into a
function to break a cycle still counts), so a violation fails here before it reaches a worker.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LAYERS = ("starter", "workflows", "activities", "worker", "lab")
# What each layer may import, besides itself (docs/architecture.md). The starter is the CLI and the client library:
# it starts workflows and reads their models; only its `lab` commands reach the emulated factory.
MAY_IMPORT = {
    "starter": {"workflows", "activities", "worker", "lab"},
    "worker": {"workflows", "activities"},
    "workflows": {"activities"},
    "activities": set(),
    "lab": {"activities", "workflows"},  # the emulators speak the product's models (e.g. lab/netbox.py bootstraps)
}
# The layers the cycle check covers. lab/k8s's two cycles (api <-> seed, controllers <-> server) are being removed
# on their own branch (issue #16); add "lab" here once they are gone.
CYCLE_FREE_LAYERS = ("starter", "workflows", "activities", "worker")
MAX_LINES = 600
# A module longer than MAX_LINES says why in its docstring, after this phrase.
LONG_MODULE_MARKER = "Longer than 600 lines because"


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _project_modules() -> dict[str, Path]:
    return {_module_name(p): p for layer in LAYERS for p in sorted((REPO / layer).rglob("*.py"))}


MODULES = _project_modules()


def _resolve(name: str) -> str | None:
    """The project module `name` refers to: itself, or the module that holds it (`workflows.x.Name` -> workflows.x)."""
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


def _imports(module: str) -> set[str]:
    """The project modules `module` imports, at any depth (function bodies included)."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's own package up
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            names = [f"{base}.{alias.name}" for alias in node.names] + [base]
        else:
            continue
        found |= {m for m in map(_resolve, names) if m and m != module}
    return found


GRAPH = {module: _imports(module) for module in MODULES}


def _layer(module: str) -> str:
    return module.split(".", 1)[0]


@pytest.mark.parametrize("layer", [layer for layer in LAYERS if layer != "lab"])
def test_imports_flow_one_way(layer):
    wrong = sorted(
        f"{module} imports {target}"
        for module, targets in GRAPH.items()
        if _layer(module) == layer
        for target in targets
        if _layer(target) != layer and _layer(target) not in MAY_IMPORT[layer]
    )
    assert not wrong, "\n".join(wrong)


def test_only_the_cli_and_the_lab_import_the_lab():
    wrong = sorted(
        f"{module} imports {target}"
        for module, targets in GRAPH.items()
        if _layer(module) in {"workflows", "activities", "worker"}
        for target in targets
        if _layer(target) == "lab"
    )
    assert not wrong, "\n".join(wrong)


def test_no_import_cycles():
    """Tarjan's strongly connected components over the project's module graph: every component is one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for target in sorted(GRAPH[module]):
            if _layer(target) not in CYCLE_FREE_LAYERS:
                continue
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in on_stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == module:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for module in sorted(GRAPH):
        if module not in index and _layer(module) in CYCLE_FREE_LAYERS:
            visit(module)
    assert not cycles, "import cycles: " + "; ".join(" <-> ".join(c) for c in cycles)


@pytest.mark.parametrize("layer", [*LAYERS, "bench", "tests"])
def test_no_module_over_600_lines_without_a_reason(layer):
    long = []
    for path in sorted((REPO / layer).rglob("*.py")):
        lines = len(path.read_text().splitlines())
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        where = str(path.relative_to(REPO))
        if lines > MAX_LINES and LONG_MODULE_MARKER not in doc:
            long.append(f"{where}: {lines} lines")
    assert not long, f"split these, or say why in the docstring ({LONG_MODULE_MARKER!r} ...):\n" + "\n".join(long)


def test_the_checks_see_the_graph():
    """The graph is the real one: a workflow module reaches its activities, the worker reaches the catalog."""
    assert "activities.models" in GRAPH["workflows.common.base"]
    assert "workflows.catalog" in GRAPH["worker.registry"]  # an import inside a function counts
    assert all(p.read_text().strip() == "" for m, p in MODULES.items() if p.name == "__init__.py"
               and _layer(m) in {"workflows", "activities"})  # fmt: skip


def test_the_phase_search_attribute_is_written_in_one_place():
    """Every workflow publishes its MillwrightPhase through `workflows.common.base.publish_phase` (issue #16)."""
    writers = sorted(
        module
        for module, path in MODULES.items()
        if _layer(module) == "workflows"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Attribute) and node.attr == "value_set"
        and isinstance(node.value, ast.Attribute) and node.value.attr == "PHASE"
    )  # fmt: skip
    assert writers == ["workflows.common.base"], writers


def test_the_budget_imports_no_other_family():
    """Every family that takes a node out of service builds on the disruption budget, so the budget imports no
    workflow family but `common` (a lower family importing a higher one is how cycles and hidden couplings start)."""
    wrong = sorted(
        f"{module} imports {target}"
        for module, targets in GRAPH.items()
        if module.startswith("workflows.budget")
        for target in targets
        if target.startswith("workflows.") and not target.startswith(("workflows.budget", "workflows.common"))
    )
    assert not wrong, "\n".join(wrong)


def test_only_the_entities_move_to_a_new_build_before_they_end():
    """Under Worker Versioning a run stays on the build that started it (the worker's default, PINNED) unless its
    workflow declares AUTO_UPGRADE: exactly the entities (workflows/catalog.py ENTITIES), which never end, do. A
    bounded run that auto-upgraded would replay on code it did not start with; an entity left pinned would hold its
    build, which could then never be retired (docs/production.md, Upgrades)."""
    from temporalio.common import VersioningBehavior, WorkerDeploymentVersion
    from temporalio.workflow import _Definition

    from worker.versioning import deployment_config
    from workflows.catalog import ENTITIES, WORKFLOWS

    assert deployment_config(WorkerDeploymentVersion("d", "b")).default_versioning_behavior == VersioningBehavior.PINNED
    upgrading = {cls.__name__ for cls in WORKFLOWS
                 if _Definition.must_from_class(cls).versioning_behavior == VersioningBehavior.AUTO_UPGRADE}  # fmt: skip
    assert upgrading == {cls.__name__ for cls in ENTITIES}
    assert set(ENTITIES) <= set(WORKFLOWS)
