"""RackRemediation on a real dev server, the Kubernetes emulator and the lab BMCs: two racks of four servers (a
rack: Topograph's accelerator label and one clique ClusterUUID), one remediated whole."""

from __future__ import annotations

import pytest

from activities.kube.models import CORDONED_BY, JOB_NAMESPACE
from activities.kube.topology import CLIQUE_LABEL, TOPOGRAPH_ACCELERATOR_LABEL
from activities.node_health import QUARANTINE_TAINT
from activities.redfish import BmcRef
from starter.controls import budget_set
from tests.kube_helpers import read_node, wait_for
from tests.workflows.remediation.helpers import fleet
from workflows.remediation.rack_models import RackRemediationInput
from workflows.remediation.rack_remediation import RackRemediation

pytestmark = pytest.mark.timeout(120)

DOMAINS = {"rack-east": "0b5c6a2e-aaaa-4d6e-9d1f-000000000001", "rack-west": "0b5c6a2e-bbbb-4d6e-9d1f-000000000002"}


def racks(names: list[str]) -> dict[str, str]:
    """node -> rack: the first four servers rack-east, the next four rack-west."""
    return {n: "rack-east" if i < 4 else "rack-west" for i, n in enumerate(names[:8])}


async def seed_racks(k8s, names: list[str]) -> dict[str, str]:
    where = racks(names)
    labels = {n: {TOPOGRAPH_ACCELERATOR_LABEL: r, CLIQUE_LABEL: f"{DOMAINS[r]}.1"} for n, r in where.items()}
    await k8s.seed(fleet(list(where), labels=labels))
    await k8s.configure(jobs={"defaultSeconds": 0.2, "rules": []})
    return where


async def powered(hosts, bmc_admin, nodes: list[str]) -> None:
    """The servers on, and followed: their power changes show on their nodes."""
    for node in nodes:
        await bmc_admin.power(node, "On")
        await hosts.add(node, agent=False)


def rack_input(burnin_bmcs, nodes: list[str], **settings) -> RackRemediationInput:
    fast = {"drain": {"eviction_retry_interval": 0.5, "timeout": 60}, "ready_timeout": 60, "fabric_timeout": 10,
            "power_timeout": 30,
            "domain_check": {"image": "registry.local/nccl-tests", "version": "1", "timeout": 30}}  # fmt: skip
    return RackRemediationInput.model_validate({
        "cluster": "lab", "domain": "rack-east", "reason": "NVLink fabric down", **fast, **settings,
        "bmcs": {n: BmcRef(url=burnin_bmcs.bmc_urls[n]).model_dump() for n in nodes}})  # fmt: skip


async def phase(handle, wanted: str):
    status = await handle.query(RackRemediation.status)
    return status if status.phase == wanted else None


async def resets(bmc_admin, server: str) -> list[str]:
    return [e["reset_type"] for e in await bmc_admin.server_audit(server) if e.get("reset_type")]


async def test_a_rack_is_cycled_checked_and_returned_whole(client, rem_worker, k8s, core, hosts, bmc_admin, names,
                                                           burnin_bmcs):  # fmt: skip
    where = await seed_racks(k8s, names)
    rack_east = [n for n, r in where.items() if r == "rack-east"]
    await powered(hosts, bmc_admin, rack_east)
    await budget_set(client, "lab", count=3, nvlink_domains=1, by="sre", reason="3 nodes, 1 domain",
                     task_queue=rem_worker.task_queue)  # fmt: skip
    inp = rack_input(burnin_bmcs, rack_east)
    handle = await client.start_workflow(RackRemediation.run, inp, id=inp.workflow_id(),
                                         task_queue=rem_worker.task_queue)  # fmt: skip

    await wait_for(lambda: phase(handle, "waiting-for-budget"), what="the rack waiting for its budget, whole")
    assert not [n for n in rack_east if (await read_node(core, n)).spec.unschedulable]  # not one node taken meanwhile
    await budget_set(client, "lab", count=4, by="sre", reason="room for a rack", task_queue=rem_worker.task_queue)
    result = await handle.result()

    assert result.outcome == "healthy", result
    assert inp.workflow_id() == "rack-remediation/lab/rack-east"
    assert result.rack == "rack-east" and result.domain == DOMAINS["rack-east"]
    assert sorted(result.returned) == sorted(rack_east) and result.power_cycles == 4
    for node in rack_east:
        assert await resets(bmc_admin, node) == ["ForceOff", "On"], node
        n = await read_node(core, node)
        assert not n.spec.unschedulable and CORDONED_BY not in (n.metadata.annotations or {})
    for node in (n for n, r in where.items() if r == "rack-west"):
        assert await resets(bmc_admin, node) == []
        assert not (await read_node(core, node)).spec.unschedulable
    from kubernetes.aio import client as k8s_client

    jobs = await k8s_client.BatchV1Api(core.api_client).list_namespaced_job(JOB_NAMESPACE)
    checks = [j for j in jobs.items if j.metadata.name.startswith("rack-check-")]
    assert len(checks) == 1 and checks[0].spec.completions == 4 and checks[0].spec.completion_mode == "Indexed"
    assert "passed" in result.domain_check


async def test_a_failed_domain_check_holds_the_whole_rack_out(client, rem_worker, k8s, core, hosts, bmc_admin, names,
                                                              burnin_bmcs):  # fmt: skip
    where = await seed_racks(k8s, names)
    rack_east = [n for n, r in where.items() if r == "rack-east"]
    await powered(hosts, bmc_admin, rack_east)
    await k8s.configure(jobs={"defaultSeconds": 0.2, "rules": [
        {"stage": "rack-check", "outcome": "fail", "message": "all_reduce: bus bandwidth 12 GB/s below 400"}]})  # fmt: skip
    await budget_set(client, "lab", count=4, by="sre", reason="room for a rack", task_queue=rem_worker.task_queue)
    inp = rack_input(burnin_bmcs, rack_east)
    result = await (await client.start_workflow(RackRemediation.run, inp, id=inp.workflow_id(),
                                                task_queue=rem_worker.task_queue)).result()  # fmt: skip

    assert result.outcome == "held-out", result
    assert "domain-wide check failed" in result.note and "bus bandwidth" in result.note
    assert sorted(result.held_out) == sorted(rack_east) and not result.returned
    for node in rack_east:
        n = await read_node(core, node)
        assert n.spec.unschedulable, node
        assert any(t.key == QUARANTINE_TAINT for t in n.spec.taints or []), node


async def test_a_dry_run_touches_nothing(client, rem_worker, k8s, core, bmc_admin, names, burnin_bmcs):
    where = await seed_racks(k8s, names)
    rack_east = [n for n, r in where.items() if r == "rack-east"]
    inp = rack_input(burnin_bmcs, rack_east, dry_run=True, domain=DOMAINS["rack-east"])
    result = await (await client.start_workflow(RackRemediation.run, inp, id=inp.workflow_id(),
                                                task_queue=rem_worker.task_queue)).result()  # fmt: skip
    assert result.outcome == "dry-run" and result.rack == "rack-east", result
    assert sorted(result.nodes) == sorted(rack_east)
    assert "would lease, cordon and drain 4 nodes of rack rack-east" in result.note
    for node in rack_east:
        assert await resets(bmc_admin, node) == []
        assert not (await read_node(core, node)).spec.unschedulable
