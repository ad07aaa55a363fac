"""Issue #8 end to end: a FleetHealthSweep over a seeded cluster with three kinds of unhealthy nodes, while a
Rollout runs on the same cluster. The fixable nodes are fixed, the broken one is quarantined with evidence in the
real NetBox and a webhook, and — read from the Kubernetes emulator's audit log — never more nodes were out of
service at once than the cluster's disruption budget."""

from __future__ import annotations

import uuid

import pytest
import pytest_asyncio

from activities.redfish import BmcRef
from tests.kube_helpers import declare_lab_budget
from tests.workflows.burnin import conftest as burnin_tier
from tests.workflows.remediation import conftest as remediation_tier
from tests.workflows.remediation.helpers import fast_settings, fleet
from tests.workflows.rollout.helpers import JOBS_FAST, REBOOT_SECONDS, max_unavailable, rollout_spec
from workflows.remediation.health_sweep import FleetHealthSweep
from workflows.remediation.node_remediation import NodeRemediation
from workflows.remediation.sweep_models import FleetHealthSweepInput
from workflows.rollout.rollout import Rollout

pytestmark = pytest.mark.timeout(600)
BUDGET = 2

# The lab pieces of the burn-in and remediation tiers, as fixtures of this module.
burnin_bmcs, bmc_admin, lab_hosts = burnin_tier.burnin_bmcs, burnin_tier.bmc_admin, burnin_tier.lab_hosts
bmc_secret_file, hosts = burnin_tier.bmc_secret_file, remediation_tier.hosts
webhook_receiver, webhook = remediation_tier.webhook_receiver, remediation_tier.webhook


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def e2e_worker(client, kubeconfig_path, netbox_lab, netbox_token_file, bootstrapped, bmc_secret_file):
    from tests.workers import settings_worker

    async with settings_worker(client, kubeconfig_path, "rem-e2e", netbox_url=netbox_lab.url,
                               netbox_token=f"file:{netbox_token_file}",
                               bmc_credentials=f"file:{bmc_secret_file}") as queue:  # fmt: skip
        yield queue


@pytest.fixture(scope="module")
def devices(nb, bootstrapped, burnin_bmcs):
    suffix = uuid.uuid4().hex[:6]
    site = nb.dcim.sites.create(name=f"remed-{suffix}", slug=f"remed-{suffix}", status="active")
    maker = nb.dcim.manufacturers.get(slug="nvidia")
    dtype = nb.dcim.device_types.create(manufacturer=maker.id, model=f"HGX r {suffix}", slug=f"hgx-r-{suffix}")
    role = nb.dcim.device_roles.get(slug="gpu-server")
    return {n: nb.dcim.devices.create(name=n, site=site.id, role=role.id, device_type=dtype.id, status="active")
            for n in burnin_bmcs.names}  # fmt: skip


async def test_sweep_remediates_and_quarantines_within_the_budget_while_a_rollout_runs(
        client, nb, devices, k8s, core, hosts, bmc_admin, burnin_bmcs, webhook, webhook_receiver, e2e_worker):  # fmt: skip
    names = burnin_bmcs.names
    wedged, remapping, broken = names[:3]  # fixed by a power cycle, by a GPU reset; only an RMA helps
    rollout_nodes = names[3:]
    await k8s.seed(fleet(names, labels={n: {"gpu": "true"} for n in rollout_nodes}))
    await k8s.configure(jobs=JOBS_FAST, rebootSeconds=REBOOT_SECONDS)
    await hosts.add(wedged, {"nvml_unavailable": True}, reboot_fixes=True)
    await hosts.add(remapping, {"pending_remaps": [4]})
    await hosts.add(broken, {"remap_failure": [6]})

    spec = rollout_spec(
        f"r-{uuid.uuid4().hex[:6]}",
        policy={"default": {"budget": {"count": BUDGET}, "strategy": {"fixed": {"initialBatch": BUDGET}}}},
    )
    await declare_lab_budget(client, e2e_worker, {"count": BUDGET})  # the lab's operator's, as the rollout's own
    rollout = await client.start_workflow(Rollout.run, spec, id=spec.workflow_id(), task_queue=e2e_worker)
    sweep_input = FleetHealthSweepInput(
        clusters=["lab"], bmcs={n: BmcRef(url=burnin_bmcs.bmc_urls[n]) for n in names}, agent_timeout=2,
        max_remediations=10, remediation=fast_settings(webhook_receiver.url + "/hook", netbox=True,
                                                       budget={"count": BUDGET}),
    )  # fmt: skip
    sweep = await client.execute_workflow(FleetHealthSweep.run, sweep_input,
                                          id=f"{sweep_input.workflow_id()}/{uuid.uuid4().hex[:6]}",
                                          task_queue=e2e_worker)  # fmt: skip

    (found,) = sweep.clusters
    assert {d.node for d in found.unhealthy} == {wedged, remapping, broken}
    assert {e.node: e.status for e in sweep.remediations} == {n: "started" for n in (wedged, remapping, broken)}
    outcomes = {n: await client.get_workflow_handle_for(NodeRemediation.run, f"remediation/lab/{n}").result()
                for n in (wedged, remapping, broken)}  # fmt: skip
    assert (outcomes[wedged].outcome, outcomes[wedged].fixed_by) == ("healthy", "power-cycle"), outcomes[wedged]
    assert (outcomes[remapping].outcome, outcomes[remapping].fixed_by) == ("healthy", "reset-gpu"), outcomes[remapping]
    assert outcomes[broken].outcome == "quarantined", outcomes[broken]
    done = await rollout.result()
    assert done.outcome == "completed", done

    # The broken node: cordoned with the reason, NetBox `failed` + quarantine tag + evidence, a webhook.
    node = await core.read_node(broken)
    assert node.spec.unschedulable
    bad = nb.dcim.devices.get(devices[broken].id)
    assert bad.status.value == "failed" and "millwright-quarantine" in {t.slug for t in bad.tags}
    journal = "\n".join(e.comments for e in nb.extras.journal_entries.filter(
        assigned_object_type="dcim.device", assigned_object_id=bad.id))  # fmt: skip
    assert "remap_failure" in journal and "GPU6" in journal
    assert any(broken in str(hook) for hook in await webhook.received())
    for fixed in (wedged, remapping):
        assert not (await core.read_node(fixed)).spec.unschedulable
        assert nb.dcim.devices.get(devices[fixed].id).status.value == "active"

    # Remediations and the rollout together: never more than the budget out of service at once.
    audit = await k8s.audit(writes=True)
    peak = max_unavailable(audit, set(names))
    print(f"peak out of service: {peak} of budget {BUDGET}")
    assert 0 < peak <= BUDGET
