"""ServerBurnIn against a BMC that never answers (a closed port): the run says which endpoint fails, with what
error, how many attempts and since when (`progress`, current details, `millwright watch`), gives up within its
retry_timeout with a non-retryable error naming the BMC, and NetBox records the burn-in aborted with that cause."""

from __future__ import annotations

import asyncio
import socket
import uuid

import pytest
import pytest_asyncio
from temporalio import activity
from temporalio.client import WorkflowFailureError

from activities.netbox.models import BurnInRecord, BurnInRecorded, DeviceInfo
from activities.registration import activities_of
from starter.questions import current_details
from tests.cli_in_process import cli
from tests.kube_helpers import wait_for
from tests.workflows.maintenance.test_node_maintenance import record_history
from tests.workflows.remediation.conftest import FakeNetBox
from workflows.burnin.server_burnin import ServerBurnIn, ServerBurnInInput

RETRY_TIMEOUT = 20

# A call that never answers: replay what the run wrote (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("replay_histories")


def closed_port() -> int:
    """A port on 127.0.0.1 where nothing listens."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class BurnInNetBox(FakeNetBox):
    """The recording NetBox fake, with the burn-in's record."""

    @activity.defn(name="record_burnin")
    async def record_burnin(self, req: BurnInRecord) -> BurnInRecorded:
        self.calls.append(("record_burnin", req))
        return BurnInRecorded(device=req.device.name or "", updated_fields=["millwright_burnin_result"],
                              journal_entry_id=len(self.calls), journal_created=True)  # fmt: skip


@pytest_asyncio.fixture(loop_scope="session")
async def dead_bmc_worker(client, bmc_secret_file):
    """ServerBurnIn with the real Redfish activities and the NetBox fake, on a fresh queue."""
    from activities.redfish import RedfishActivities
    from activities.support.secrets import SecretRef
    from worker import registry

    netbox = BurnInNetBox()
    redfish = RedfishActivities(SecretRef.parse(f"file:{bmc_secret_file}"))
    registration = registry.Registration(workflows=[ServerBurnIn], activities=activities_of(redfish, netbox),
                                         resources=[redfish])  # fmt: skip
    queue = f"dead-bmc-{uuid.uuid4().hex[:8]}"
    async with registry.new_worker(client, registration, queue):
        yield queue, netbox
    await registration.close()


async def test_a_bmc_that_never_answers_is_shown_then_given_up(client, temporal_address, dead_bmc_worker):
    queue, netbox = dead_bmc_worker
    name = f"dead-{uuid.uuid4().hex[:6]}"
    bmc = f"http://127.0.0.1:{closed_port()}"
    netbox.devices[name] = DeviceInfo(id=1, name=name, status="planned")
    inp = ServerBurnInInput.model_validate({
        "server": {"name": name, "bmc": {"url": bmc}, "expected": {"gpus": 8}},
        "settings": {"stress_seconds": 1}, "retry_timeout": f"PT{RETRY_TIMEOUT}S",
    })  # fmt: skip
    handle = await client.start_workflow(ServerBurnIn.run, inp, id=f"{inp.workflow_id()}-{uuid.uuid4().hex[:6]}",
                                         task_queue=queue)  # fmt: skip
    watched = asyncio.create_task(cli("watch", handle.id, "--address", temporal_address, "--interval", "0.5",
                                      timeout=180))  # fmt: skip

    async def failing():
        waiting = (await handle.query(ServerBurnIn.progress)).waiting
        return waiting[0] if waiting else None

    wait = await wait_for(failing, what="the BMC's failure in progress", timeout=60)
    assert (wait.endpoint, wait.setting) == (f"BMC {bmc}", "retry_timeout")
    assert wait.call == "firmware and GPU inventory and SEL"
    assert "the BMC does not answer" in wait.error and bmc in wait.error and wait.attempts >= 3
    assert (wait.gives_up_at - wait.since).total_seconds() == RETRY_TIMEOUT
    details = await current_details(handle)
    assert f"**retrying** BMC {bmc} (firmware and GPU inventory and SEL)" in details and "does not answer" in details

    with pytest.raises(WorkflowFailureError) as failed:
        await handle.result()
    cause = failed.value.cause
    assert cause.type == "EndpointUnavailable" and cause.non_retryable, cause
    assert cause.message.startswith(f"BMC {bmc} kept failing for ")
    assert f"retry_timeout is {RETRY_TIMEOUT}s" in cause.message and "the BMC does not answer" in cause.message
    desc = await handle.describe()
    assert (desc.close_time - desc.start_time).total_seconds() < 300  # bounded: minutes, not the hour it was
    progress = await handle.query(ServerBurnIn.progress)
    assert progress.phase == "failed" and progress.waiting == []
    # NetBox: staged, then aborted with the cause; no verdict.
    assert [(n, getattr(r, "status", None) or getattr(r, "result", None)) for n, r in netbox.calls] == [
        ("set_device_status", "staged"),
        ("record_burnin", "aborted"),
    ]
    assert (
        f"Burn-in stopped before a verdict: EndpointUnavailable: BMC {bmc} kept failing" in netbox.calls[-1][1].summary
    )

    out = await watched
    assert out.returncode == 1, out
    assert f"retrying BMC {bmc} (firmware and GPU inventory and SEL)" in out.stderr and "does not answer" in out.stderr
    assert "retrying redfish_inventory_and_sel (attempt " in out.stderr  # the pending activity's last failure
    assert "EndpointUnavailable" in out.stderr and out.stdout == ""
    # Once `watch` is done: the in-process CLI runs without MILLWRIGHT_* variables (tests/cli_in_process.py).
    await record_history(handle, "server_burn_in_bmc_gives_up_by_timer")
