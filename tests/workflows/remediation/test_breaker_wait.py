"""A NodeRemediation handed its node cordoned (as a FirmwareUpdate whose node failed validation starts it) waits
while the circuit breaker refuses it, the node cordoned in its name and its progress saying why, and remediates the
node once an operator resets the breaker (workflows/remediation/breaker_wait.py)."""

from __future__ import annotations

import pytest

from activities.kube.models import CORDONED_BY
from starter.cli.questions import why_lines
from starter.questions import current_details, node_why
from tests.kube_helpers import declare_lab_budget, read_node, wait_for
from tests.workflows.maintenance.test_node_maintenance import record_history
from tests.workflows.remediation.helpers import fast_settings, fleet
from tests.workflows.remediation.test_node_remediation import start
from workflows.budget.breaker import BreakerReset, BreakerSettings
from workflows.budget.disruption_budget import DisruptionBudget
from workflows.budget.leases import LeaseRequest, budget_workflow_id
from workflows.remediation.node_remediation import NodeRemediation

pytestmark = pytest.mark.timeout(150)


async def test_a_handed_over_node_waits_for_the_breaker_reset_then_is_remediated(
        client, rem_worker, k8s, core, hosts, bmc_admin, names, burnin_bmcs):  # fmt: skip
    node, other = names[0], names[1]
    run_id, firmware = f"remediation/lab/{node}", f"firmware-update/{node}"
    # The FirmwareUpdate handed its cordon over: the node is cordoned in the remediation's name before it starts.
    await k8s.seed(fleet(names[:4], cordoned={node: run_id}))
    await hosts.add(node, {"pending_remaps": [3]})  # the GPU reset fixes it
    await declare_lab_budget(client, rem_worker.task_queue, {"count": 4})
    entity = client.get_workflow_handle(budget_workflow_id("lab"))
    # Another remediation trips the breaker (any share of the nodes is too much for it).
    trip = LeaseRequest(node=other, holder=f"remediation/lab/{other}", remediation=BreakerSettings(max_percent=1))
    assert (await entity.execute_update(DisruptionBudget.acquire, trip)).state == "refused"
    assert (await entity.query(DisruptionBudget.breaker)).tripped

    handle = await start(client, rem_worker, burnin_bmcs, node, "validation failed after firmware",
                         requested_by=firmware, breaker_retry_interval=1, **fast_settings())  # fmt: skip

    async def asked_twice():
        progress = await handle.query(NodeRemediation.progress)
        asking = progress.phase == "waiting-for-breaker" and "(1 asks so far" not in progress.details
        return progress if progress.finished or asking else None

    progress = await wait_for(asked_twice, what="the remediation refused, then asking again", timeout=60)
    assert progress.phase == "waiting-for-breaker", progress  # today's code ended `refused`, the node cordoned
    assert not progress.finished
    assert "waiting: the circuit breaker refuses remediations" in progress.details
    assert f"handed over cordoned by {firmware}" in progress.details
    assert "`millwright breaker reset lab --by <you> --reason <why>` lets it go on" in progress.details
    assert "waiting: the circuit breaker refuses" in await current_details(handle)
    n = await read_node(core, node)
    assert n.spec.unschedulable and n.metadata.annotations[CORDONED_BY] == run_id
    # `millwright node why` names the run holding the cordon, and why it waits.
    why = "\n".join(why_lines(await node_why(client, core, "lab", node), wide=True))
    assert f"cordoned by Millwright run {run_id}" in why and "held by this running run" in why
    assert "waiting-for-breaker" in why and "the circuit breaker refuses remediations" in why

    await entity.execute_update(DisruptionBudget.reset_breaker, BreakerReset(by="ops", reason="storm understood"))
    result = await handle.result()
    assert result.outcome == "healthy" and result.fixed_by == "reset-gpu", result
    assert result.uncordoned and result.note == f"fixed by reset-gpu; requested by {firmware}"  # the wait left no note
    n = await read_node(core, node)
    assert not n.spec.unschedulable and CORDONED_BY not in (n.metadata.annotations or {})
    await record_history(handle, "node_remediation_handed_over_waits_for_breaker")
