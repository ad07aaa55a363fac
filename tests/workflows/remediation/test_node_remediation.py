"""NodeRemediation on a real dev server: the Kubernetes emulator, the lab BMCs, simulated hosts with their agents,
the lab webhook receiver and the cluster's DisruptionBudget entity."""

from __future__ import annotations

import pytest
from temporalio.client import WorkflowUpdateFailedError
from temporalio.service import RPCError, RPCStatusCode

from activities.kube.models import CORDONED_BY
from activities.node_health import QUARANTINE_ANNOTATION, QUARANTINE_TAINT
from activities.redfish import BmcRef
from starter.questions import current_details
from tests.kube_helpers import pods_on, read_node, wait_for
from tests.workflows.maintenance.test_node_maintenance import record_history
from tests.workflows.remediation.helpers import fast_settings, fleet
from workflows.budget.disruption_budget import DisruptionBudget
from workflows.budget.leases import budget_workflow_id
from workflows.remediation.models import Approval, NodeRemediationInput
from workflows.remediation.node_remediation import NodeRemediation

pytestmark = pytest.mark.timeout(120)


async def start(client, worker, bmcs, node: str, reason: str, **settings):
    """A NodeRemediation of `node` (its BMC: the lab server of that name; credentials: the worker's default)."""
    inp = NodeRemediationInput(cluster="lab", node=node, reason=reason, bmc=BmcRef(url=bmcs.bmc_urls[node]),
                               **settings)  # fmt: skip
    return await client.start_workflow(NodeRemediation.run, inp, id=inp.workflow_id(), task_queue=worker.task_queue)


async def awaiting_approval(handle):
    async def probe():
        status = await handle.query(NodeRemediation.status)
        return status if status.awaiting_approval else None

    return await wait_for(probe, what="a step waiting for approval")


async def leases(client, cluster: str = "lab") -> list:
    """Granted leases of the cluster's budget (none when no run has asked it yet)."""
    try:
        state = await client.get_workflow_handle(budget_workflow_id(cluster)).query(DisruptionBudget.state)
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            return []
        raise
    return [lease for lease in state.leases if lease.state == "granted"]


async def power_resets(bmc_admin, server: str) -> list[str]:
    return [e["reset_type"] for e in await bmc_admin.server_audit(server) if e.get("reset_type")]


async def test_soft_fix_works_and_the_node_is_uncordoned(client, rem_worker, k8s, core, hosts, bmc_admin, names,
                                                         burnin_bmcs):  # fmt: skip
    node = names[0]
    await k8s.seed(fleet(names[:4]))
    trainers_before = {p.metadata.name for p in await pods_on(core, node) if p.metadata.labels.get("app") == "trainer"}
    assert trainers_before
    probe = await hosts.add(node, {"pending_remaps": [3]})

    handle = await start(client, rem_worker, burnin_bmcs, node, "GPU check: remap_pending GPU3", **fast_settings())
    result = await handle.result()
    await record_history(handle, "node_remediation_soft_fix_decided_early")

    assert result.outcome == "healthy", result
    assert result.fixed_by == "reset-gpu"
    assert [(s.step, s.outcome) for s in result.steps] == [
        ("restart-gpu-services", "not-fixed"),
        ("reset-gpu", "fixed"),
    ]
    assert "remap_pending" in result.steps[0].detail
    assert probe.resets == [3] and probe.service_restarts == 1 and probe.loads == 1  # one burn-in, after the fix
    assert result.uncordoned
    n = await read_node(core, node)
    assert not n.spec.unschedulable and CORDONED_BY not in (n.metadata.annotations or {})
    remaining = {p.metadata.name for p in await pods_on(core, node)}
    assert not trainers_before & remaining, "the trainer pods were drained off the node"
    assert await power_resets(bmc_admin, node) == []  # no power cycle needed
    assert not [lease for lease in await leases(client) if lease.node == node]
    progress = await handle.query(NodeRemediation.progress)
    assert progress.phase == "healthy" and progress.finished
    assert "reset-gpu: fixed" in await current_details(handle)


async def test_soft_fixes_fail_and_the_power_cycle_fixes(client, rem_worker, k8s, core, hosts, bmc_admin, names,
                                                         burnin_bmcs):  # fmt: skip
    node = names[1]
    await k8s.seed(fleet(names[:4]))
    boot_before = (await read_node(core, node)).status.node_info.boot_id
    # No driver: neither a service restart nor a GPU reset helps; the reboot does.
    await hosts.add(node, {"nvml_unavailable": True}, reboot_fixes=True)

    handle = await start(client, rem_worker, burnin_bmcs, node, "NVML unavailable", **fast_settings())
    result = await handle.result()

    assert result.outcome == "healthy", result
    assert result.fixed_by == "power-cycle"
    assert [(s.step, s.outcome) for s in result.steps] == [
        ("restart-gpu-services", "not-fixed"),
        ("reset-gpu", "unavailable"),
        ("power-cycle", "fixed"),
    ]
    assert "nvml_unavailable" in result.steps[0].detail
    assert await power_resets(bmc_admin, node) == ["ForceOff", "On"]
    assert hosts.reboots[node] == 1
    n = await read_node(core, node)
    assert n.status.node_info.boot_id != boot_before
    assert not n.spec.unschedulable


async def test_ladder_exhausted_quarantines_records_and_notifies(client, rem_worker, k8s, core, hosts, bmc_admin, names,
                                                                 burnin_bmcs, webhook, webhook_receiver, netbox):  # fmt: skip
    node = names[2]
    await k8s.seed(fleet(names[:4]))
    # A link trained at x8: permanent, nothing on the ladder fixes it.
    await hosts.add(node, {"pcie_width": {"gpu": 2, "width": 8}})

    handle = await start(
        client,
        rem_worker,
        burnin_bmcs,
        node,
        "PCIe link degraded",
        **fast_settings(f"{webhook_receiver.url}/hooks/ops", netbox=True),
    )
    result = await handle.result()

    assert result.outcome == "quarantined", result
    assert [(s.step, s.outcome) for s in result.steps] == [
        ("restart-gpu-services", "not-fixed"),
        ("reset-gpu", "not-fixed"),
        ("power-cycle", "not-fixed"),
    ]
    assert await power_resets(bmc_admin, node) == ["ForceOff", "On"]
    # The node stays cordoned, with the reason, and tainted.
    n = await read_node(core, node)
    assert n.spec.unschedulable and n.metadata.annotations[CORDONED_BY] == handle.id
    assert "pcie_link" in n.metadata.annotations[QUARANTINE_ANNOTATION]
    assert any(t.key == QUARANTINE_TAINT and t.effect == "NoSchedule" for t in n.spec.taints)
    # NetBox: failed with a journal entry (the reason), and the quarantine tag.
    status = [req for name, req in netbox.calls if name == "set_device_status"]
    tags = [req for name, req in netbox.calls if name == "set_device_tags"]
    assert len(status) == 1 and status[0].status == "failed" and status[0].device.name == node
    assert "pcie_link" in status[0].reason and handle.id in status[0].reason
    assert len(tags) == 1 and tags[0].add == ["millwright-quarantine"]
    assert result.netbox and "journal entry" in result.netbox
    # The webhook got the event once, with an idempotency key.
    events = await webhook.received()
    assert len(events) == 1 and result.notified
    body = events[0]["body"]
    assert events[0]["path"] == "/hooks/ops" and events[0]["key"].startswith(f"{handle.id}/")
    assert body["event"] == "node-quarantined" and body["node"] == node and body["cluster"] == "lab"
    assert [s["outcome"] for s in body["steps"]] == ["not-fixed"] * 3
    # The lease went back: the cordon keeps the node counted as out of service.
    assert not [lease for lease in await leases(client) if lease.node == node]

    # Repaired by hand, remediated again at an operator's request: the quarantine is lifted everywhere.
    await bmc_admin.set_gpu_faults(node, {})
    netbox.calls.clear()
    again = await start(client, rem_worker, burnin_bmcs, node, "retry after the repair", requested_by="oncall",
                        **fast_settings(netbox=True, steps=["restart-gpu-services"]))  # fmt: skip
    result = await again.result()
    assert result.outcome == "healthy" and result.uncordoned and "quarantine lifted" in result.note
    n = await read_node(core, node)
    assert not n.spec.unschedulable and QUARANTINE_ANNOTATION not in (n.metadata.annotations or {})
    assert not any(t.key == QUARANTINE_TAINT for t in n.spec.taints or [])
    assert [(name, getattr(req, "status", None) or req.remove) for name, req in netbox.calls] == [
        ("set_device_status", "active"),
        ("set_device_tags", ["millwright-quarantine"]),
    ]


async def test_a_finding_only_an_rma_fixes_quarantines_without_trying_the_ladder(
        client, rem_worker, k8s, hosts, bmc_admin, names, burnin_bmcs, webhook, webhook_receiver):  # fmt: skip
    node = names[3]
    await k8s.seed(fleet(names[:4]))
    await hosts.add(node, {"remap_failure": [5]})
    await webhook.add_fault({"method": "POST"}, {"status": 503}, count=1)  # the first delivery fails: retried

    handle = await start(
        client, rem_worker, burnin_bmcs, node, "remap failure", **fast_settings(f"{webhook_receiver.url}/hooks/ops")
    )
    result = await handle.result()

    assert result.outcome == "quarantined" and result.steps == []
    assert "needs an RMA" in result.note and "remap_failure" in result.note
    assert await power_resets(bmc_admin, node) == []
    events = await webhook.received()
    assert len(events) == 1 and result.notified


async def test_approval_timeout_applies_the_default(client, rem_worker, k8s, hosts, bmc_admin, names, burnin_bmcs):
    node = names[0]
    await k8s.seed(fleet(names[:4]))
    await hosts.add(node, {"nvml_unavailable": True}, reboot_fixes=True)

    handle = await start(client, rem_worker, burnin_bmcs, node, "NVML unavailable",
                         **fast_settings(steps=["power-cycle"], require_approval_for=["power-cycle"],
                                         approval_timeout=2, default_on_timeout="approve"))  # fmt: skip
    status = await awaiting_approval(handle)
    assert status.awaiting_approval.step == "power-cycle" and status.awaiting_approval.default == "approve"
    assert "approve" in await current_details(handle)
    result = await handle.result()

    assert result.outcome == "healthy" and result.fixed_by == "power-cycle"
    assert result.steps[0].approval.startswith("default on timeout")
    assert await power_resets(bmc_admin, node) == ["ForceOff", "On"]


async def test_an_operator_rejects_the_power_cycle(client, rem_worker, k8s, hosts, bmc_admin, names, burnin_bmcs):
    node = names[1]
    await k8s.seed(fleet(names[:4]))
    await hosts.add(node, {"nvml_unavailable": True}, reboot_fixes=True)

    handle = await start(client, rem_worker, burnin_bmcs, node, "NVML unavailable",
                         **fast_settings(steps=["restart-gpu-services", "power-cycle"],
                                         require_approval_for=["power-cycle"], approval_timeout=3600))  # fmt: skip

    # Nothing waits for approval yet (the soft fix runs first): refused by the validator.
    with pytest.raises(WorkflowUpdateFailedError) as refused:
        await handle.execute_update(NodeRemediation.approve, Approval(by="alice"))
    assert "no step is waiting for approval" in str(refused.value.cause)

    await awaiting_approval(handle)
    with pytest.raises(WorkflowUpdateFailedError) as wrong:
        await handle.execute_update(NodeRemediation.approve, Approval(step="reset-gpu", by="alice"))
    assert "reset-gpu is not waiting" in str(wrong.value.cause)
    await handle.execute_update(NodeRemediation.reject, Approval(step="power-cycle", by="bob", comment="not now"))
    result = await handle.result()

    assert result.outcome == "quarantined"
    assert [(s.step, s.outcome, s.approval) for s in result.steps] == [
        ("restart-gpu-services", "not-fixed", None),
        ("power-cycle", "rejected", "bob: not now"),
    ]
    assert await power_resets(bmc_admin, node) == []
