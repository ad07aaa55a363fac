"""What a new workflow run costs the sandbox, and which modules it shares between runs.

The sandbox imports a run's workflow module afresh for every new run, with every module under it that is not
passed through. A rollout starts one run per node and one per batch, so that import is paid thousands of times:
the worker passes every module that defines no workflow through once (found by worker/passthrough.py), and each workflow
module imports only what it needs (no package ``__init__`` imports them all; workflows/catalog.py lists them).
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest
from temporalio import workflow

from worker.passthrough import defines_workflow
from worker.registry import SANDBOX_PASSTHROUGH
from workflows.budget.disruption_budget import DisruptionBudget
from workflows.catalog import WORKFLOWS
from workflows.maintenance.node_maintenance import NodeMaintenance
from workflows.rollout.node_update import NodeUpdate
from workflows.rollout.rollout import Rollout, RolloutBatch

WORKFLOWS_DIR = Path(__file__).resolve().parents[1] / "workflows"
# The runs a fleet starts by the thousand (one per node or per batch), and the rollout and budget behind them.
FLEET_RUNS = [NodeUpdate, RolloutBatch, NodeMaintenance, Rollout, DisruptionBudget]


def _modules() -> dict[str, Path]:
    """Every module under workflows/, its family packages' modules included (package ``__init__``s are empty)."""
    return {
        ".".join(p.relative_to(WORKFLOWS_DIR.parent).with_suffix("").parts): p
        for p in sorted(WORKFLOWS_DIR.rglob("*.py"))
        if p.stem != "__init__"
    }


def _defines_workflow(module: str) -> bool:
    mod = importlib.import_module(module)
    return any(isinstance(v, type) and v.__module__ == module and workflow._Definition.from_class(v) is not None
               for v in vars(mod).values())  # fmt: skip


def _imports(path: Path) -> set[str]:
    """The project modules `path` imports (`from workflows import x` counts as workflows.x)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
    return found


def _passed_through(module: str) -> bool:
    return any(module == p or module.startswith(f"{p}.") for p in SANDBOX_PASSTHROUGH)


def test_package_init_is_empty():
    for init in [WORKFLOWS_DIR / "__init__.py", *WORKFLOWS_DIR.glob("*/__init__.py")]:
        assert init.read_text().strip() == "", f"{init} is not empty"


def test_workflow_modules_stay_sandboxed_and_every_other_module_passes_through():
    modules = _modules()
    workflow_modules = {m for m in modules if _defines_workflow(m)}
    assert {cls.__module__ for cls in WORKFLOWS} <= workflow_modules
    for module in sorted(modules):
        if module == "workflows.catalog":
            assert not _passed_through(module), "the catalog imports every workflow module"
        elif module in workflow_modules:
            assert not _passed_through(module), f"{module} defines a workflow: it must stay sandboxed"
        else:
            assert _passed_through(module), f"{module} defines no workflow but is not passed through"


def test_the_source_reading_finds_the_workflows_the_modules_define():
    """worker/passthrough.py reads `@workflow.defn` from the source; the imported modules' definitions agree."""
    for module, path in _modules().items():
        assert defines_workflow(path.read_text()) == _defines_workflow(module), module


def test_shared_modules_import_no_workflow_module_and_no_workflow_imports_the_catalog():
    """A passed-through module that imported a workflow module would share that workflow's module between runs."""
    modules = _modules()
    workflow_modules = {m for m in modules if _defines_workflow(m)} | {"workflows.catalog"}
    for module, path in modules.items():
        imported = _imports(path)
        if _passed_through(module):
            assert not imported & workflow_modules, f"{module} imports {sorted(imported & workflow_modules)}"
        if module != "workflows.catalog":
            assert "workflows.catalog" not in imported, f"{module} imports the catalog"


@pytest.mark.parametrize("cls", FLEET_RUNS, ids=[c.__name__ for c in FLEET_RUNS])
def test_a_new_run_imports_afresh_only_workflow_modules(cls):
    """What a new run re-imports is its own workflow module and the workflow modules it names (children it
    starts), nothing else: every other project module it reaches is passed through and shared. What that costs in
    CPU is measured, not asserted, by `python -m bench.sandbox`."""
    modules = _modules()
    workflow_modules = {m for m in modules if _defines_workflow(m)}
    afresh, todo = set(), [cls.__module__]
    while todo:
        module = todo.pop()
        if module in afresh or module not in modules or _passed_through(module):
            continue
        afresh.add(module)
        todo.extend(_imports(modules[module]))
    assert afresh <= workflow_modules, f"{cls.__name__} re-imports {sorted(afresh - workflow_modules)} every run"
    assert len(afresh) <= 2, f"{cls.__name__} re-imports {sorted(afresh)} every run"
