"""Which methods of an activities object the worker registers: those marked ``@activity.defn``, found, not listed.

A new activity is registered by its mark alone; an object that reuses another's activities by inheritance (the
firmware activities are Redfish activities) registers only what the other does not already.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from temporalio import activity


def activity_methods(obj: Any) -> list[Callable[..., Any]]:
    """The bound methods of `obj` marked ``@activity.defn`` (the mark temporalio's worker reads,
    ``activity._Definition``), its class's own and inherited ones, by name. Only functions are looked at: no
    property is evaluated."""
    names = {n for cls in type(obj).__mro__ for n, attr in vars(cls).items() if inspect.isfunction(attr)}
    found = [getattr(obj, name) for name in sorted(names)]
    return [method for method in found if activity._Definition.from_callable(method) is not None]


def activities_of(*objects: Any) -> list[Callable[..., Any]]:
    """Every activity of `objects` once: one inherited from an object already listed is left out; two different
    functions under one activity name are refused (the worker would refuse them, less clearly)."""
    by_name: dict[str, Callable[..., Any]] = {}
    for obj in objects:
        for method in activity_methods(obj):
            defn = activity._Definition.must_from_callable(method)
            name = defn.name or ""  # dynamic activities have no name; one per worker
            seen = by_name.get(name)
            if seen is None:
                by_name[name] = method
            elif getattr(seen, "__func__", seen) is not getattr(method, "__func__", method):
                raise ValueError(f"activity {name!r} is defined twice: {_where(seen)} and {_where(method)}")
    return list(by_name.values())


def _where(method: Callable[..., Any]) -> str:
    return getattr(method, "__qualname__", repr(method))
