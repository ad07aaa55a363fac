"""Test tiers that run a real third-party service (NetBox, Ironic) from its own cached venv.

Where a piece the service needs is missing, the tier is left out with one line saying why; with CI
set it fails instead (the tier's fixture calls `require`), because CI must run it.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest


def leave_out_unavailable(
    config,
    items,
    *,
    here: str,
    fixture: str,
    check: Callable[[], None],
    unavailable: type[Exception],
    timeout: float,
    notes: list[str],
) -> None:
    """For pytest_collection_modifyitems: the tier's tests (those under `here` using `fixture`) get
    `timeout`; when `check()` raises `unavailable` (and CI is not set) they are deselected and the
    reason goes to `notes` for the terminal summary."""
    tier = [i for i in items if str(i.fspath).startswith(here) and fixture in getattr(i, "fixturenames", ())]
    for item in tier:
        if item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(timeout))
    if not tier or os.environ.get("CI"):
        return  # in CI the tier's fixture fails loudly instead
    try:
        check()
    except unavailable as err:
        notes.append(f"{err}; {len(tier)} tests of {os.path.relpath(here)} left out")
        config.hook.pytest_deselected(items=tier)
        items[:] = [i for i in items if i not in tier]


def require(check: Callable[[], None], unavailable: type[Exception], tier: str) -> None:
    """In the tier's session fixture: skip with the one-line reason, or fail when CI is set."""
    try:
        check()
    except unavailable as err:
        if os.environ.get("CI"):
            pytest.fail(f"{err} -- CI must run the {tier} tier (see .ci/run)", pytrace=False)
        pytest.skip(str(err))
