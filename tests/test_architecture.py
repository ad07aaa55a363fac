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
# A module longer than MAX_LINES says why in its docstring, after this phrase; none may in the orchestration and
# side-effect layers, where a long module is a change hard to see (issue #24).
LONG_MODULE_MARKER = "Longer than 600 lines because"
NO_LONG_MODULES = ("workflows", "activities")


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


def test_the_starter_reaches_the_lab_through_one_function():
    """The worker image leaves lab/ out (deploy/Dockerfile, tests/deploy/test_image.py) yet installs the starter:
    its one way to the lab is `lab_runner()`, which imports it when a command asks and says when it is absent."""
    importers = sorted(
        m for m, targets in GRAPH.items() if _layer(m) == "starter" and any(_layer(t) == "lab" for t in targets)
    )
    assert importers == ["starter.cli.common"], importers
    tree = ast.parse(MODULES["starter.cli.common"].read_text())

    def lab_imports(node: ast.AST) -> set[int]:
        return {
            n.lineno
            for n in ast.walk(node)
            if (isinstance(n, ast.ImportFrom) and (n.module or "").split(".")[0] == "lab")
            or (isinstance(n, ast.Import) and any(a.name.split(".")[0] == "lab" for a in n.names))
        }  # fmt: skip

    [runner] = [f for f in ast.walk(tree) if isinstance(f, ast.FunctionDef) and f.name == "lab_runner"]
    assert lab_imports(tree) == lab_imports(runner) != set()


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
        if lines > MAX_LINES and (layer in NO_LONG_MODULES or LONG_MODULE_MARKER not in doc):
            long.append(f"{where}: {lines} lines")
    why = "" if layer in NO_LONG_MODULES else f", or say why in the docstring ({LONG_MODULE_MARKER!r} ...)"
    assert not long, f"split these{why}:\n" + "\n".join(long)


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


def test_no_hand_list_of_activities_or_of_passed_through_modules():
    """Registration is computed (issue #24): an activity is registered by its `@activity.defn` mark
    (activities/registration.py), a module is passed through the sandbox by defining no workflow
    (worker/passthrough.py). A list kept by hand is one a new module or activity can be forgotten in."""
    lists = []
    for module in (m for m in MODULES if m.split(".")[0] in ("activities", "worker")):
        for node in ast.walk(ast.parse(MODULES[module].read_text())):
            if isinstance(node, ast.FunctionDef) and node.name == "activities":
                lists.append(f"{module}: def activities (the @activity.defn marks say it)")
            named = (
                isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("workflows.")
            )
            if named and node.value != "workflows.catalog":  # the one module never shared, named for that
                lists.append(f"{module}: names {node.value!r} (worker/passthrough.py finds them)")
    assert not lists, "\n".join(lists)


async def test_every_activity_marked_is_registered(tmp_path):
    """Every method marked `@activity.defn` on a class under activities/ is registered by the worker or the host
    agent, once: a new activity needs only its mark."""
    import importlib
    import inspect

    from temporalio import activity

    from worker import registry
    from worker.config import WorkerSettings

    marked = set()
    for module in (m for m in MODULES if m.startswith("activities")):
        for cls in vars(importlib.import_module(module)).values():
            if inspect.isclass(cls) and cls.__module__ == module:
                marked |= {d.name for f in vars(cls).values() if (d := activity._Definition.from_callable(f))}
    (tmp_path / "kubeconfig").write_text("apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\nusers: []\n")
    worker = registry.build(WorkerSettings(kubeconfig=str(tmp_path / "kubeconfig"), metrics_port=0))
    agent = registry.build_host_agent("node-01")
    try:
        registered = [activity._Definition.must_from_callable(a).name for a in worker.activities + agent.activities]
    finally:
        await worker.close()
        await agent.close()
    assert len(registered) == len(set(registered)), "an activity registered twice"
    assert marked and marked <= set(registered), f"marked but not registered: {sorted(marked - set(registered))}"


HOST_AGENT_SYSTEMS = {"activities.gpu"}  # registered by the host agent alone (worker/registry.py build_host_agent)


def _system(module: str) -> str:
    """The external system an activities module belongs to: its package under activities/, or itself."""
    return ".".join(module.split(".")[:2])


def _marks_activities(module: str) -> bool:
    for node in ast.walk(ast.parse(MODULES[module].read_text())):
        if isinstance(node, ast.AsyncFunctionDef | ast.FunctionDef):
            for decorator in node.decorator_list:
                target = decorator.func if isinstance(decorator, ast.Call) else decorator
                if ast.unparse(target) == "activity.defn":
                    return True
    return False


def _integration_classes() -> set[str]:
    """Every integration class under activities/ (the bases in activities/support/ aside), by module and name."""
    import importlib
    import inspect

    from activities.support.integration import Integration

    found = set()
    for module in (m for m in MODULES if m.startswith("activities.") and not m.startswith("activities.support")):
        for cls in vars(importlib.import_module(module)).values():
            if inspect.isclass(cls) and issubclass(cls, Integration) and cls.__module__ == module:
                found.add(f"{module}.{cls.__name__}")
    return found


def _systems_without_integration(integrations) -> set[str]:
    covered = {package for integration in integrations for package in integration.packages}
    systems = {_system(m) for m in MODULES if m.startswith("activities.") and _marks_activities(m)}
    return systems - covered - HOST_AGENT_SYSTEMS


def test_every_system_with_activities_has_its_integration():
    """A new external system is its package with an integration, listed once in activities/integrations.py: the
    worker builds, logs and closes each system from that list, so a system with activities but no entry there would
    never be registered. Its settings are among `IntegrationSettings`' bases, so the worker reads them."""
    from activities.integrations import INTEGRATIONS, IntegrationSettings
    from activities.support.integration import NoSettings

    assert not _systems_without_integration(INTEGRATIONS), "activities with no integration"
    # The check sees a system left out: without NetBox's entry, NetBox is reported.
    assert _systems_without_integration([i for i in INTEGRATIONS if i.name != "NetBox"]) == {"activities.netbox"}
    packages = [package for integration in INTEGRATIONS for package in integration.packages]
    assert len(packages) == len(set(packages)), "a package in two integrations"
    assert all(p in MODULES for p in packages), "an integration names a module that does not exist"
    listed = {f"{type(i).__module__}.{type(i).__name__}" for i in INTEGRATIONS}
    assert _integration_classes() == listed, "an integration defined but not listed in activities/integrations.py"
    settings = {integration.settings for integration in INTEGRATIONS} - {NoSettings}
    assert set(IntegrationSettings.__bases__) == settings, "an integration's settings not read by the worker"


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
