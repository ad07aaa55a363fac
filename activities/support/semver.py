"""Semantic version precedence (semver.org 2.0.0 §11), to tell an upgrade from a downgrade.

The spec checks the syntax (workflows/rollout/spec/packages.py); this only orders versions already checked. A version
that does not parse orders as unknown: `is_downgrade` then says no, and the update proceeds as before.
"""

from __future__ import annotations

import re

_VERSION = re.compile(r"^(\d+)\.(\d+)\.(\d+)(?:-([0-9A-Za-z.-]+))?(?:\+[0-9A-Za-z.-]+)?$")


def precedence(version: str) -> tuple | None:
    """A key that sorts versions by semver precedence; None when `version` is not a semantic version."""
    m = _VERSION.match(version)
    if m is None:
        return None
    core = tuple(int(p) for p in m.group(1, 2, 3))
    if m.group(4) is None:
        return core, (1,)  # a release ranks above any of its pre-releases
    # Pre-release identifiers: numeric ones rank below alphanumeric ones, numbers numerically.
    ids = tuple((0, int(i), "") if i.isdigit() else (1, 0, i) for i in m.group(4).split("."))
    return core, (0, ids)


def is_downgrade(installed: str, wanted: str) -> bool:
    """`wanted` ranks below `installed` (both semantic versions)."""
    have, want = precedence(installed), precedence(wanted)
    return have is not None and want is not None and want < have
