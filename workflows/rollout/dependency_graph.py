"""A dependency graph in waves (Kahn's topological sort) and its cycles: the one ordering function, which spec
validation uses to reject cycles and `workflows.rollout.batching.package_order` to order the packages. Pure."""

from __future__ import annotations

from collections.abc import Iterable, Mapping


class DependencyCycle(ValueError):
    """The packages' `dependsOn` graph has a cycle; `cycle` lists it, first name repeated last."""

    def __init__(self, cycle: list[str]):
        self.cycle = cycle
        super().__init__("dependency cycle: " + " -> ".join(cycle))


def dependency_levels(dependencies: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """Kahn's topological sort in waves: each wave depends only on earlier waves.

    `dependencies` maps every name to the names it depends on; names that are not keys
    are ignored (unknown dependencies are reported by spec validation, not here).
    Deterministic: each wave is sorted. Raises `DependencyCycle` naming one cycle.
    """
    deps = {name: sorted({d for d in needs if d in dependencies}) for name, needs in dependencies.items()}
    waiting = {name: len(needs) for name, needs in deps.items()}
    dependents: dict[str, list[str]] = {name: [] for name in deps}
    for name, needs in deps.items():
        for d in needs:
            dependents[d].append(name)
    wave = sorted(name for name, n in waiting.items() if n == 0)
    levels: list[list[str]] = []
    while wave:
        levels.append(wave)
        ready: list[str] = []
        for name in wave:
            for child in dependents[name]:
                waiting[child] -= 1
                if waiting[child] == 0:
                    ready.append(child)
        wave = sorted(ready)
    placed = sum(len(level) for level in levels)
    if placed != len(deps):
        raise DependencyCycle(_find_cycle({n: deps[n] for n, w in waiting.items() if w > 0}))
    return levels


def topological_order(dependencies: Mapping[str, Iterable[str]]) -> list[str]:
    """Dependencies first; ties by name. Raises `DependencyCycle`."""
    return [name for level in dependency_levels(dependencies) for name in level]


def _find_cycle(graph: Mapping[str, list[str]]) -> list[str]:
    """One cycle in a graph where every node lies on or leads to a cycle."""
    start = min(graph)
    path: list[str] = [start]
    seen = {start: 0}
    node = start
    while True:
        node = next(d for d in graph[node] if d in graph)
        if node in seen:
            return [*path[seen[node] :], node]
        seen[node] = len(path)
        path.append(node)
