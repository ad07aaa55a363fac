"""A sweep's decision delayed past the end of the remediation it raced (issue 22): the sweep read the node while a
first NodeRemediation held it, its answer was held until that run had ended, and the second run the sweep then
started re-read the node and ended `skipped`, touching nothing. Judged from the emulators' audits: one Redfish power
cycle, one last-remediation mark. An operator's explicit request still remediates the quarantined node."""

from __future__ import annotations

import asyncio
import functools
import uuid

import pytest
import pytest_asyncio
from temporalio import activity

from activities.kube.models import CORDONED_BY
from activities.node_health import (
    LAST_REMEDIATION_ANNOTATION,
    QUARANTINE_ANNOTATION,
    NodeHealthActivities,
    NodesHealth,
    NodesHealthRequest,
)
from activities.redfish import BmcRef
from starter.questions import current_details
from tests.kube_helpers import declare_lab_budget, read_node, wait_for
from tests.workflows.maintenance.test_node_maintenance import record_history
from tests.workflows.remediation.conftest import remediation_worker
from tests.workflows.remediation.helpers import fast_settings, fleet
from tests.workflows.remediation.test_fault_events import cordoned_at, set_condition
from tests.workflows.remediation.test_node_remediation import awaiting_approval, power_resets
from workflows.budget.disruption_budget import DisruptionBudget
from workflows.budget.leases import LeaseRelease, LeaseRequest, budget_workflow_id
from workflows.remediation.health_sweep import FleetHealthSweep
from workflows.remediation.models import Approval, NodeRemediationInput
from workflows.remediation.node_remediation import NodeRemediation
from workflows.remediation.sweep_models import FleetHealthSweepInput

pytestmark = pytest.mark.timeout(180)
SICK = [{"type": "KernelDeadlock", "status": "True", "reason": "DockerHung"}]
NO_PROBES = {"host_agent": False, "bmc": False}
# A run that only looks at readiness: back Ready after its power cycle, the node is healthy.
READY_ONLY: dict[str, object] = {**NO_PROBES, "problem_conditions": [], "gpu_conditions": [], "gpu_health_label": None}


class HeldReads(NodeHealthActivities):
    """The node-health activities, with every slice's read answered only once `release` is set (heartbeating
    meanwhile): a sweep whose decision is made from facts read long before (as a worker kill delays it)."""

    def __init__(self, connector, *, holding: asyncio.Event, release: asyncio.Event) -> None:
        super().__init__(connector)
        self.holding, self.release = holding, release

    @activity.defn(name="read_nodes_health")
    async def read_nodes_health(self, req: NodesHealthRequest) -> NodesHealth:
        read = await super().read_nodes_health(req)
        self.holding.set()
        while not self.release.is_set():
            activity.heartbeat("held by the test")
            await asyncio.sleep(0.5)
        return read


class Reads:
    def __init__(self) -> None:
        self.holding, self.release = asyncio.Event(), asyncio.Event()


@pytest_asyncio.fixture(loop_scope="session")
async def held(client, kubeconfig_path, netbox, bmc_secret_file, prometheus):
    """(the worker, its held reads)."""
    reads = Reads()
    build = functools.partial(HeldReads, holding=reads.holding, release=reads.release)
    async with remediation_worker(client, kubeconfig_path, netbox, bmc_secret_file, prometheus, build) as worker:
        yield worker, reads


def marks(audit: list[dict], node: str) -> list[str]:
    """The last-remediation marks written on `node`, as the API server saw them."""
    path = f".metadata.annotations.{LAST_REMEDIATION_ANNOTATION}"
    return [c["new"] for e in audit if e.get("resource") == "nodes" and e.get("name") == node
            for c in e.get("changes") or [] if c["path"] == path and c["new"]]  # fmt: skip


async def race(client, worker, reads: Reads, bmcs, node: str, first_checks: dict, **sweep_fields):
    """A first run of `node` waits for approval of its power cycle (cordoned by it); a sweep reads the node and is
    held; the first run is approved and ends; then the sweep decides from what it read. The first run's result, the
    sweep's, and the handles of the sweep and of the remediation it started."""
    bmc = BmcRef(url=bmcs.bmc_urls[node])
    inp = NodeRemediationInput(cluster="lab", node=node, reason="first", bmc=bmc, checks=first_checks,
                               **fast_settings(steps=["power-cycle"], require_approval_for=["power-cycle"],
                                               approval_timeout=3600))  # fmt: skip
    first = await client.start_workflow(NodeRemediation.run, inp, id=inp.workflow_id(), task_queue=worker.task_queue)
    await awaiting_approval(first)

    sweep_inp = FleetHealthSweepInput(clusters=["lab"], checks=NO_PROBES, bmcs={node: bmc},
                                      remediation=fast_settings(steps=["power-cycle"]), **sweep_fields)  # fmt: skip
    sweep = await client.start_workflow(FleetHealthSweep.run, sweep_inp, task_queue=worker.task_queue,
                                        id=f"{sweep_inp.workflow_id()}/race-{uuid.uuid4().hex[:6]}")  # fmt: skip
    await asyncio.wait_for(reads.holding.wait(), 60)  # the sweep has read the node, cordoned by the first run
    await first.execute_update(NodeRemediation.approve, Approval(by="alice"))
    first_result = await first.result()
    reads.release.set()
    swept = await sweep.result()
    return first, first_result, sweep, swept, client.get_workflow_handle_for(NodeRemediation.run, inp.workflow_id())


async def test_a_decision_delayed_past_a_quarantine_is_skipped_and_an_operator_still_remediates(
        client, held, k8s, core, hosts, bmc_admin, names, burnin_bmcs):  # fmt: skip
    worker, reads = held
    node = names[2]
    await k8s.seed(fleet(names[:4], conditions={node: SICK}))
    await hosts.add(node)

    # The first run power cycles; the deadlock stays: quarantined.
    first, first_result, sweep, swept, second = await race(client, worker, reads, burnin_bmcs, node, NO_PROBES)
    assert first_result.outcome == "quarantined", first_result
    assert [(e.node, e.status) for e in swept.remediations] == [(node, "started")]  # decided from the old read
    result = await second.result()
    assert result.outcome == "skipped" and result.steps == [], result
    assert result.note.startswith("left alone: quarantined (") and "waiting for an operator" in result.note
    progress = await second.query(NodeRemediation.progress)
    assert progress.phase == "skipped" and "left alone: quarantined (" in progress.details
    assert "left alone: quarantined (" in await current_details(second)
    # Touched nothing: one power cycle, one mark (the first run's), the quarantine and cordon still the first run's.
    assert await power_resets(bmc_admin, node) == ["ForceOff", "On"]
    assert len(marks(await k8s.audit(), node)) == 1 and '"outcome":"quarantined"' in marks(await k8s.audit(), node)[0]
    n = await read_node(core, node)
    assert n.spec.unschedulable and n.metadata.annotations[CORDONED_BY] == first.id
    first_run = client.get_workflow_handle(first.id, run_id=first.first_execution_run_id)  # not the latest run
    await record_history(first_run, "node_remediation_fresh_facts_quarantined")
    await record_history(second, "node_remediation_fresh_facts_skipped")
    await record_history(sweep, "fleet_health_sweep_decision_delayed")

    # An operator asks explicitly, after a repair: remediated all the same, and released from quarantine.
    inp = NodeRemediationInput(cluster="lab", node=node, reason="repaired by hand", requested_by="alice",
                               bmc=BmcRef(url=burnin_bmcs.bmc_urls[node]), checks=READY_ONLY,
                               **fast_settings(steps=["power-cycle"]))  # fmt: skip
    asked = await client.start_workflow(NodeRemediation.run, inp, id=inp.workflow_id(), task_queue=worker.task_queue)
    result = await asked.result()
    assert result.outcome == "healthy" and result.fixed_by == "power-cycle", result
    assert "requested by alice" in result.note and "quarantine lifted" in result.note
    assert await power_resets(bmc_admin, node) == ["ForceOff", "On"] * 2
    assert len(marks(await k8s.audit(), node)) == 2
    n = await read_node(core, node)
    assert not n.spec.unschedulable and QUARANTINE_ANNOTATION not in (n.metadata.annotations or {})
    await record_history(asked, "node_remediation_fresh_facts_requested")


async def test_a_decision_older_than_the_nodes_last_remediation_is_skipped_without_a_cooldown(
        client, held, k8s, hosts, bmc_admin, names, burnin_bmcs):  # fmt: skip
    worker, reads = held
    node = names[3]
    await k8s.seed(fleet(names[:4], conditions={node: SICK}))
    await hosts.add(node)

    # The first run judges by readiness alone: fixed by its power cycle, uncordoned, not quarantined. The sweep
    # has no cooldown, so only its decision's age can stop a second power cycle.
    _, first_result, _, swept, second = await race(client, worker, reads, burnin_bmcs, node, READY_ONLY, cooldown=0)
    assert first_result.outcome == "healthy" and first_result.uncordoned, first_result
    assert [(e.node, e.status) for e in swept.remediations] == [(node, "started")]
    result = await second.result()
    assert result.outcome == "skipped", result
    assert "from older facts: since, the node was marked remediated (healthy)" in result.note
    assert await power_resets(bmc_admin, node) == ["ForceOff", "On"]
    assert len(marks(await k8s.audit(), node)) == 1


async def test_a_node_that_recovers_while_its_run_waits_for_a_lease_is_left_alone(client, rem_worker, k8s, core, names):
    node, other = names[:2]
    await k8s.seed(fleet(names[:4], conditions={node: SICK}))
    await declare_lab_budget(client, rem_worker.task_queue, {"count": 1})
    entity = client.get_workflow_handle(budget_workflow_id("lab"))
    full = LeaseRequest(node=other, holder=entity.id, reason="the budget's one node, taken")  # a running holder
    assert (await entity.execute_update(DisruptionBudget.acquire, full)).state == "granted"
    inp = NodeRemediationInput(cluster="lab", node=node, reason="KernelDeadlock (DockerHung)", checks=NO_PROBES,
                               **fast_settings())  # fmt: skip
    handle = await client.start_workflow(NodeRemediation.run, inp, id=inp.workflow_id(),
                                         task_queue=rem_worker.task_queue)  # fmt: skip

    async def queued():
        return node in [q.node for q in (await entity.query(DisruptionBudget.state)).queue]

    await wait_for(queued, what=f"{node}'s remediation queued for a lease")
    await set_condition(core, node, "KernelDeadlock", "False")  # Node Problem Detector: recovered
    await entity.execute_update(DisruptionBudget.release, LeaseRelease(node=other, holder=entity.id))
    result = await handle.result()

    assert result.outcome == "healthy" and result.steps == [] and result.fixed_by is None, result
    assert "recovered while waiting for its lease" in result.note
    assert await cordoned_at(k8s, node) is None  # never cordoned, drained or marked
    assert LAST_REMEDIATION_ANNOTATION not in ((await read_node(core, node)).metadata.annotations or {})
    assert not [lease for lease in (await entity.query(DisruptionBudget.state)).leases if lease.node == node]
    await record_history(handle, "node_remediation_recovered_in_queue")
