"""Two sites, each with its own Kubernetes emulator, BMCs and worker process given only its own kubeconfig and
credentials, and a central worker with neither (issue 42's Done-when): a rollout on each site's cluster completes,
each site's API server saw only its own worker, and a site whose worker is gone stalls alone, visibly, until its
worker is back."""

from __future__ import annotations

import uuid
from pathlib import Path

from temporalio.client import WorkflowExecutionStatus

from lab.k8s.admin import EmulatorAdmin
from starter.questions import run_status
from tests.kube_helpers import declare_lab_budget, wait_for
from tests.sites import TwoSites
from tests.workflows.rollout.helpers import JOBS_FAST, REBOOT_SECONDS, rollout_fleet, rollout_spec
from workflows.campaign.fleet_rollout import FleetRollout
from workflows.campaign.models import FleetRolloutInput, RolloutTemplate, WavePlan
from workflows.rollout.rollout import Rollout


async def seed(sites: TwoSites) -> None:
    for site in sites.sites.values():
        async with EmulatorAdmin(site.emulator.url) as admin:
            await admin.reset()
            await admin.seed(rollout_fleet({"a": 2}))
            await admin.configure(jobs=JOBS_FAST, rebootSeconds=REBOOT_SECONDS)


async def start_rollout(client, sites: TwoSites, site: str, name: str):
    queue, cluster = sites.central_queue, sites[site].cluster
    await declare_lab_budget(client, queue, cluster=cluster)
    spec = rollout_spec(name, cluster=cluster)
    return await client.start_workflow(
        Rollout.run, spec, id=f"{spec.workflow_id()}-{uuid.uuid4().hex[:6]}", task_queue=queue
    )


def environment(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


async def test_a_rollout_on_each_site_completes_and_each_site_saw_only_its_own_worker(client, two_sites):
    sites = two_sites
    await seed(sites)
    await sites.start_workers(client)
    for name, site in sites.sites.items():  # each worker was given its own site's settings and no other's
        assert site.worker is not None
        env = environment(site.worker.pid)
        assert env["MILLWRIGHT_SITE"] == name and env["MILLWRIGHT_KUBECONFIG"] == str(site.kubeconfig)
        assert env["MILLWRIGHT_BMC_CREDENTIALS"] == f"file:{site.bmc_credentials}"
        assert "KUBECONFIG" not in env and "MILLWRIGHT_SITE_MAP" not in env
    if sites.central is not None:
        env = environment(sites.central.pid)
        assert not {"MILLWRIGHT_KUBECONFIG", "KUBECONFIG", "MILLWRIGHT_BMC_CREDENTIALS", "MILLWRIGHT_SITE"} & set(env)
        assert env["MILLWRIGHT_SITE_MAP"] == str(sites.site_map)

    for site in sites.sites.values():
        await declare_lab_budget(client, sites.central_queue, cluster=site.cluster)
    spec = rollout_spec(f"campaign-{uuid.uuid4().hex[:6]}", cluster="unused")
    template = RolloutTemplate.model_validate(spec.model_dump(by_alias=True, exclude={"cluster", "checkpoint"}))
    campaign = FleetRolloutInput(name=spec.name, clusters=[s.cluster for s in sites.sites.values()],
                                 plan=WavePlan(wave_size=1), rollout=template)  # fmt: skip
    result = await client.execute_workflow(FleetRollout.run, campaign, id=campaign.workflow_id(),
                                           task_queue=sites.central_queue)  # fmt: skip
    assert result.outcome == "completed", result
    for site in sites.sites.values():
        assert result.clusters[site.cluster].state == "completed", result.clusters

    for name, site in sites.sites.items():
        assert await sites.callers(name) == {site.identity}, name  # nothing anonymous, nothing of another site


async def test_a_site_without_its_worker_stalls_alone_and_goes_on_when_the_worker_is_back(client, two_sites):
    sites = two_sites
    await seed(sites)
    await sites.start_workers(client)
    sites.stop_worker("site-2")
    since = await sites.audit_cursor("site-2")
    running = await start_rollout(client, sites, "site-1", "cut-off-1")
    stalled = await start_rollout(client, sites, "site-2", "cut-off-2")

    assert (await running.result()).outcome == "completed"
    # The other site's rollout is still running and its cluster has seen no call since its worker went.
    assert (await stalled.describe()).status == WorkflowExecutionStatus.RUNNING
    assert await sites.callers("site-2", since) == set()

    async def says_so() -> list[str] | None:  # `millwright status`: the run, or its batch where the call waits
        waits = (await run_status(client, stalled.id)).site_waits
        return waits if any(sites["site-2"].task_queue in line for line in waits) else None

    await wait_for(says_so, what="a stalled run's current details naming site-2's queue", timeout=30)

    await sites.start_worker(client, "site-2")
    result = await stalled.result()
    assert result.outcome == "completed" and result.counts == {"complete": 2}
    assert await sites.callers("site-2", since) == {sites["site-2"].identity}
