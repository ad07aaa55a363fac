"""FleetRollout across three small clusters (three Kubernetes emulators, one kubeconfig with a context each:
tests/workflows/campaign/conftest.py) on a real dev server: the canary, then waves in order, the failure threshold,
approval, pause, resume and abort."""

from __future__ import annotations

import asyncio
import contextlib
import re
import uuid
from datetime import timedelta
from typing import Any

import pytest
import pytest_asyncio
from temporalio.client import WorkflowUpdateFailedError

from lab.k8s.admin import EmulatorAdmin
from starter.client import InputError, parse_input
from tests.cli_in_process import cli
from tests.conftest import GRACE_SCALE, POD_START_SECONDS
from tests.kube_helpers import declare_lab_budget, wait_for
from tests.workflows.maintenance.test_node_maintenance import record_history
from tests.workflows.rollout.helpers import REBOOT_SECONDS, rollout_fleet
from workflows.campaign.fleet_rollout import FleetRollout
from workflows.campaign.models import ApproveRequest, CampaignStatus, FleetRolloutInput, WavePlan
from workflows.rollout.models import ReasonRequest
from workflows.rollout.rollout import Rollout

CLUSTERS = ["east", "west", "north"]  # the emulators (conftest.py)


@pytest_asyncio.fixture(loop_scope="session")
async def labs(emulators, client, campaign_worker):
    """Each cluster emptied, then three nodes, fast Jobs and its disruption budget declared."""
    admins = {c: EmulatorAdmin(e.url) for c, e in emulators.items()}
    for cluster, admin in admins.items():
        await admin.reset()
        await admin.configure(podStartSeconds=POD_START_SECONDS, graceScale=GRACE_SCALE)
        await admin.seed(rollout_fleet({"a": 3}))
        await admin.configure(jobs={"defaultSeconds": 0.1, "rules": []}, rebootSeconds=REBOOT_SECONDS)
        await declare_lab_budget(client, campaign_worker.task_queue, cluster=cluster)
    yield admins
    for admin in admins.values():
        await admin.aclose()


def campaign(plan: dict[str, Any], **fields: Any) -> FleetRolloutInput:
    tag = uuid.uuid4().hex[:6]
    template = {
        "name": f"kernel-{tag}",
        "nodeSelectors": {"matchLabels": {"gpu": "true"}},
        "packages": {"kernel-tuning": {"version": "1.2.0", "image": "registry.local/millwright/kernel-tuning"}},
        "deploymentPolicy": {"default": {"budget": {"count": 2}, "strategy": {"fixed": {"initialBatch": 2}}}},
        "stageRetries": 0,
    }
    return FleetRolloutInput.model_validate(
        {"name": f"cve-{tag}", "clusters": CLUSTERS, "plan": plan, "rollout": template} | fields
    )


async def start(client, worker, inp: FleetRolloutInput):
    return await client.start_workflow(FleetRollout.run, inp, id=inp.workflow_id(), task_queue=worker.task_queue)


async def refused(handle, update, request) -> str:
    """The validator's message refusing the update."""
    with pytest.raises(WorkflowUpdateFailedError) as failed:
        await handle.execute_update(update, request)
    return str(getattr(failed.value.cause, "message", failed.value))


async def status_where(handle, predicate, what: str, timeout: float = 60) -> CampaignStatus:
    async def probe():
        status = await handle.query(FleetRollout.status)
        return status if predicate(status) else None

    return await wait_for(probe, what=what, timeout=timeout)


async def test_canary_then_waves_in_order_each_cluster_its_own_rollout(client, campaign_worker, labs):
    inp = campaign({"canary": "west", "wave_size": 2, "soak": "PT1S"})
    handle = await start(client, campaign_worker, inp)
    result = await handle.result()

    assert result.outcome == "completed" and result.waves == [["west"], ["east", "north"]]
    west, east, north = (result.clusters[c] for c in ("west", "east", "north"))
    assert all(o.state == "completed" and o.counts == {"complete": 3} for o in result.clusters.values())
    # The canary ended and soaked before the wave started; the wave's two started together.
    for o in (east, north):
        assert o.started - west.ended >= timedelta(seconds=1), result
    assert abs(east.started - north.started) < timedelta(seconds=1)
    # Each cluster's child is the Rollout the CLI would start, and it wrote to its own cluster only.
    for cluster, admin in labs.items():
        assert result.clusters[cluster].workflow_id == f"rollout/{cluster}/{inp.rollout.name}"
        child = await client.get_workflow_handle(result.clusters[cluster].workflow_id).describe()
        assert child.workflow_type == "Rollout" and child.task_queue == campaign_worker.task_queue
        writes = [e for e in await admin.audit() if e.get("resource") == "nodes" and e.get("nodeAfter")]
        assert {e["name"] for e in writes} == {"a-01", "a-02", "a-03"}, cluster
    progress = await handle.query(FleetRollout.progress)
    assert progress.finished and progress.done == progress.total == 3
    await record_history(handle, "fleet_rollout")


async def test_failure_threshold_stops_new_starts(client, campaign_worker, labs):
    rule = {"node": "a-02", "stage": "apply", "outcome": "fail", "message": "dkms build failed"}
    await labs["east"].configure(jobs={"defaultSeconds": 0.1, "rules": [rule]})
    inp = campaign({"wave_size": 1, "max_failed_clusters": 0})
    result = await (await start(client, campaign_worker, inp)).result()

    assert result.outcome == "failed"
    east = result.clusters["east"]
    assert east.state == "failed" and "dkms build failed" in east.error and east.counts["erroring"] == 1
    for cluster in ("west", "north"):
        assert result.clusters[cluster].state == "skipped" and result.clusters[cluster].workflow_id == ""
        assert "more than 0 failed" in result.clusters[cluster].error
        assert not [e for e in await labs[cluster].audit() if e.get("resource") == "nodes" and e.get("nodeAfter")]


async def test_approval_after_the_canary_and_a_pause_hold_the_waves(client, campaign_worker, labs, temporal_address):
    inp = campaign({"canary": "north", "wave_size": 2, "approve_after_canary": True})
    handle = await start(client, campaign_worker, inp)
    assert await refused(handle, FleetRollout.approve, ApproveRequest(approver="alice")) == (
        "the campaign is not waiting for approval"
    )
    status = await status_where(handle, lambda s: s.phase == "waiting-for-approval", "the wait for approval")
    assert status.clusters["north"].state == "completed"
    assert [status.clusters[c].state for c in ("east", "west")] == ["pending", "pending"]
    assert "approval" in status.waiting_for

    # Every cluster in one view, from the CLI; the controls as an operator types them.
    shown = await cli("status", handle.id, "--address", temporal_address)
    assert shown.returncode == 0 and re.search(r"north +0 +completed +rollout/north/\S+ +complete=3", shown.stdout)
    assert re.search(r"east +1 +pending", shown.stdout) and "waiting for: approval" in shown.stdout, shown.stdout
    listed = await cli("ls", "--family", "FleetRollout", "--address", temporal_address)
    assert "north=completed east=pending west=pending" in listed.stdout, listed.stdout
    control = ["--address", temporal_address, "--reason"]
    paused = await cli("campaign", "pause", inp.name, "--by", "bob", *control, "change freeze")
    assert paused.returncode == 0, paused.stderr
    assert await refused(handle, FleetRollout.pause, ReasonRequest(reason="again")) == (
        "already paused: change freeze (by bob)"
    )
    dry = await cli("campaign", "approve", inp.name, "--by", "alice", "--dry-run", *control, "canary fine")
    assert dry.returncode == 0 and "nothing was sent" in dry.stderr, dry.stderr
    approved = await cli("campaign", "approve", inp.name, "--by", "alice", *control, "canary fine")
    assert approved.returncode == 0 and "approved by: alice" in approved.stdout, approved.stdout
    status = await status_where(handle, lambda s: s.phase == "paused", "the pause after the approval")
    assert "change freeze (by bob)" in status.waiting_for
    await asyncio.sleep(1)  # paused: nothing starts
    assert (await handle.query(FleetRollout.status)).clusters["east"].state == "pending"

    resumed = await cli("campaign", "resume", inp.name, "--by", "bob", *control, "freeze over")
    assert resumed.returncode == 0, resumed.stderr
    result = await handle.result()
    assert result.outcome == "completed"
    assert result.clusters["east"].started >= result.clusters["north"].ended


async def test_pause_resume_and_abort_reach_the_running_clusters(client, campaign_worker, labs):
    for admin in labs.values():  # stages slow enough to be caught running
        await admin.configure(jobs={"defaultSeconds": 1.5, "rules": []})
    inp = campaign({"canary": "east", "wave_size": 2})
    handle = await start(client, campaign_worker, inp)
    child = client.get_workflow_handle(f"rollout/east/{inp.rollout.name}")
    await status_where(handle, lambda s: s.clusters["east"].state == "running", "the canary's start")

    await handle.execute_update(FleetRollout.pause, ReasonRequest(reason="incident 4711 (by alice)"))

    async def child_paused(reason: str | None):
        async def probe():
            with contextlib.suppress(Exception):  # not started yet
                s = await child.query(Rollout.status)
                return s if s.paused_reason == reason else None
            return None

        return await wait_for(probe, what=f"the canary's rollout paused={reason}", timeout=30)

    await child_paused("incident 4711 (by alice)")
    await handle.execute_update(FleetRollout.resume, ReasonRequest(reason="mitigated"))
    await child_paused(None)
    await handle.execute_update(FleetRollout.abort, ReasonRequest(reason="wrong kernel"))
    assert await refused(handle, FleetRollout.pause, ReasonRequest(reason="late")) == (
        "the campaign is aborting: wrong kernel"
    )
    result = await handle.result()

    assert result.outcome == "aborted"
    assert result.clusters["east"].state == "aborted"
    assert [result.clusters[c].state for c in ("west", "north")] == ["skipped", "skipped"]
    assert (await child.query(Rollout.status)).aborted == "wrong kernel"


# ---------------------------------------------------------------- the input, and the waves, without a server


def refusal(data: dict[str, Any]) -> list[str]:
    with pytest.raises(InputError) as refused:
        parse_input("FleetRollout", data)
    return refused.value.errors


def test_the_input_is_refused_naming_the_field_path():
    valid = campaign({}).model_dump(mode="json")
    deep = valid | {"rollout": valid["rollout"] | {"drainConfig": {"timeot": "2m"}}}
    assert refusal(deep) == ["rollout.drainConfig.timeot: Extra inputs are not permitted; did you mean 'timeout'?"]
    assert refusal(valid | {"plan": {"canary": "south"}}) == [
        "(input): plan.canary: 'south' is not one of clusters ['east', 'west', 'north']"
    ]
    assert refusal(valid | {"clusters": ["east", "west", "east"]}) == ["clusters: 'east' is listed twice (at 0 and 2)"]
    assert refusal(valid | {"plan": {"wave_size": 0}}) == ["plan.wave_size: Input should be greater than or equal to 1"]
    assert refusal(valid | {"clusters": ["East"]})[0].startswith("clusters: 'East' is not a valid Kubernetes")
    assert refusal({k: v for k, v in valid.items() if k != "rollout"}) == ["rollout: Field required"]


@pytest.mark.parametrize(
    ("clusters", "plan", "waves"),
    [
        (["a"], {}, [["a"]]),
        (["a", "b", "c"], {}, [["a"], ["b"], ["c"]]),
        (["a", "b", "c", "d", "e"], {"canary": "c", "wave_size": 2}, [["c"], ["a", "b"], ["d", "e"]]),
        (["a", "b", "c"], {"wave_size": 5}, [["a"], ["b", "c"]]),
    ],
)
def test_the_canary_goes_alone_then_waves_in_the_inputs_order(clusters, plan, waves):
    assert WavePlan.model_validate(plan).waves(clusters) == waves
