"""The Ironic tier: one real standalone Ironic (39.0.0 from PyPI, fake hardware, SQLite) per session.

Without a Python >= 3.11 the tier is skipped with one line saying why; with CI set it fails
instead, because CI must run it. The first run builds Ironic's venv (pip from PyPI, ~30 s on
2 cores, cached under ~/.cache/millwright/ironic-39.0.0); later runs start Ironic in ~3 s.
"""

from __future__ import annotations

import dataclasses
import os
import time
import uuid
from datetime import UTC, datetime

import httpx
import pytest
from temporalio.testing import ActivityEnvironment

# The first session start may build the venv: paid by whichever test of the tier runs first.
TIER_TIMEOUT = 600

_UNAVAILABLE: list[str] = []


def pytest_collection_modifyitems(config, items):
    """Give the tier a longer timeout; without the pieces it needs, leave it out with one line why."""
    from lab.ironic import IronicUnavailable, check_available
    from tests.tiers import leave_out_unavailable

    leave_out_unavailable(config, items, here=os.path.dirname(__file__), fixture="ironic_lab", check=check_available,
                          unavailable=IronicUnavailable, timeout=TIER_TIMEOUT, notes=_UNAVAILABLE)  # fmt: skip


def pytest_terminal_summary(terminalreporter):
    for line in _UNAVAILABLE:
        terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def ironic_lab(tmp_path_factory):
    from lab.ironic import IronicError, IronicLab, IronicUnavailable, check_available
    from tests.tiers import require

    require(check_available, IronicUnavailable, "Ironic")
    lab = IronicLab(tmp_path_factory.mktemp("ironic"), vendor_delay=1)
    started = time.monotonic()
    try:
        lab.start()
    except IronicError as err:
        pytest.fail(f"Ironic did not start: {err}", pytrace=False)
    print(f"\nIronic tier: Ironic ready in {time.monotonic() - started:.1f}s ({lab.timings})")
    yield lab
    lab.stop()
    assert not lab.alive(), "Ironic's process group (master or forked worker) outlived stop()"


@pytest.fixture(scope="session")
def ironic_config(ironic_lab):
    from activities.ironic.client import IronicConfig

    return IronicConfig(url=ironic_lab.url, poll_seconds=0.1)


@pytest.fixture(scope="session")
def ironic_http(ironic_lab):
    """The test's own client for seeding and checking (never through the activities)."""
    from lab.ironic import API_VERSION_HEADER

    with httpx.Client(base_url=ironic_lab.url + "/v1", headers={API_VERSION_HEADER: "latest"}, timeout=10) as c:
        yield c


@pytest.fixture
def enroll(ironic_http):
    """`enroll(**fields)` creates a fresh fake-hardware node (in enroll) and returns its name."""

    def make(**fields) -> str:
        name = f"burnin-{uuid.uuid4().hex[:8]}"
        r = ironic_http.post("/nodes", json={"name": name, "driver": "fake-hardware", **fields})
        assert r.status_code == 201, r.text
        return name

    return make


@dataclasses.dataclass
class Runner:
    """Runs one Ironic activity through ActivityEnvironment, recording its heartbeats."""

    acts: object
    heartbeats: list = dataclasses.field(default_factory=list)

    async def __call__(self, name: str, arg, *, attempt: int = 1, scheduled: datetime | None = None):
        env = ActivityEnvironment()
        env.info = dataclasses.replace(
            env.info, attempt=attempt, activity_type=name, scheduled_time=scheduled or datetime.now(UTC)
        )
        env.on_heartbeat = lambda *details: self.heartbeats.append(details[0] if details else None)
        return await env.run(getattr(self.acts, name), arg)


@pytest.fixture
def ironic(ironic_config):
    """`await ironic("ironic_manage", ManageRequest(...))`; `.heartbeats` holds what the activities reported."""
    from activities.ironic.activities import IronicActivities

    return Runner(IronicActivities(ironic_config))
