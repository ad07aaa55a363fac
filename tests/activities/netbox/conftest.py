"""The NetBox tier: one real NetBox (PostgreSQL + Redis + NetBox 4.7 from PyPI) per session.

Without Python >= 3.12, PostgreSQL or redis-server the whole tier is skipped with one line
saying why; with CI set it fails instead, because CI must run it. The first run builds the
NetBox venv and migrates a database (minutes, cached under ~/.cache/millwright); later runs
restore the cached dump in seconds.
"""

from __future__ import annotations

import os
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import pytest
import pytest_asyncio
from temporalio.client import Client, WorkflowHandle

from activities.registration import activity_methods

# The first session start may build the venv and migrate (minutes): it is paid by whichever
# test of the tier runs first, inside that test's timeout.
TIER_TIMEOUT = 900


_UNAVAILABLE: list[str] = []


def pytest_collection_modifyitems(config, items):
    """Give the tier a longer timeout; without the pieces it needs, leave it out with one line why."""
    from lab.netbox import NetBoxUnavailable, check_available
    from tests.tiers import leave_out_unavailable

    leave_out_unavailable(config, items, here=os.path.dirname(__file__), fixture="netbox_lab", check=check_available,
                          unavailable=NetBoxUnavailable, timeout=TIER_TIMEOUT, notes=_UNAVAILABLE)  # fmt: skip


def pytest_terminal_summary(terminalreporter):
    for line in _UNAVAILABLE:
        terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def netbox_lab(tmp_path_factory):
    from lab.netbox import NetBoxError, NetBoxLab, NetBoxUnavailable, check_available
    from tests.tiers import require

    require(check_available, NetBoxUnavailable, "NetBox")
    lab = NetBoxLab(tmp_path_factory.mktemp("netbox"))
    started = time.monotonic()
    try:
        lab.start()
    except NetBoxError as err:
        pytest.fail(f"NetBox did not start: {err}", pytrace=False)
    print(f"\nNetBox tier: NetBox ready in {time.monotonic() - started:.1f}s ({lab.timings})")
    yield lab
    lab.stop()


@pytest.fixture(scope="session")
def netbox_token_file(netbox_lab):
    from lab.netbox import write_token_file

    return write_token_file(netbox_lab.root / "token", netbox_lab.token)


@pytest.fixture(scope="session")
def netbox_config(netbox_lab, netbox_token_file):
    from activities.netbox.client import NetBoxConfig
    from activities.support.secrets import SecretRef

    return NetBoxConfig(url=netbox_lab.url, token=SecretRef.parse(f"file:{netbox_token_file}"))


@pytest.fixture(scope="session")
def nb(netbox_lab):
    """The test's own pynetbox client, for seeding and checking (never through Temporal)."""
    import pynetbox

    return pynetbox.api(netbox_lab.url, token=netbox_lab.token)


@pytest.fixture(scope="session")
def netbox_task_queue() -> str:
    return f"netbox-test-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="session")
def netbox_activities(netbox_config):
    """The NetBox activities the worker runs, crash-injectable."""
    from tests.activities.netbox.helpers import CrashingNetBoxActivities

    return CrashingNetBoxActivities(netbox_config)


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def netbox_worker(client, netbox_activities, netbox_task_queue):
    """A real worker on a random task queue: the inventory workflows and (crash-injectable) NetBox activities."""
    from tests.activities.netbox.helpers import CallNetBox
    from worker import registry
    from workflows.catalog import WORKFLOWS

    registration = registry.Registration(
        workflows=[*WORKFLOWS, CallNetBox], activities=activity_methods(netbox_activities)
    )
    async with registry.new_worker(client, registration, netbox_task_queue) as worker:
        yield worker


@pytest_asyncio.fixture(loop_scope="session")
async def netbox_faults(netbox_worker, netbox_activities):
    """Arm crashes for one test (on the running worker's activities); disarmed afterwards."""
    acts = netbox_activities
    acts.crash_after.clear()
    acts.crashes.clear()
    yield acts
    acts.crash_after.clear()


@dataclass
class NetBoxCall:
    """`await call("activity_name", {...})` runs one NetBox activity through a workflow and returns its result;
    `handles` holds each run it started, the latest last."""

    client: Client
    task_queue: str
    handles: list[WorkflowHandle] = field(default_factory=list)

    async def __call__(self, activity: str, arg: dict, *, maximum_attempts: int = 5) -> Any:
        from tests.activities.netbox.helpers import CallInput, CallNetBox

        handle = await self.client.start_workflow(
            CallNetBox.run,
            CallInput(activity=activity, arg=arg, maximum_attempts=maximum_attempts),
            id=f"netbox-test/{activity}/{uuid.uuid4().hex[:8]}",
            task_queue=self.task_queue,
        )
        self.handles.append(handle)
        return (await handle.result()).result


@pytest_asyncio.fixture(loop_scope="session")
async def call(client, netbox_worker) -> NetBoxCall:
    return NetBoxCall(client, netbox_worker.task_queue)


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def bootstrapped(client, netbox_worker):
    """Millwright's NetBox objects in place (runs the real InventoryBootstrap workflow)."""
    from workflows.inventory.bootstrap import InventoryBootstrap, InventoryBootstrapInput

    return await client.execute_workflow(
        InventoryBootstrap.run,
        InventoryBootstrapInput(),
        id=f"inventory-bootstrap/{uuid.uuid4().hex[:8]}",
        task_queue=netbox_worker.task_queue,
    )
