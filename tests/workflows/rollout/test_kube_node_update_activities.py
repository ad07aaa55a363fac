"""A node's update in three calls (start, stages, finish), each run through ActivityEnvironment against the
Kubernetes emulator: what each writes, that a retry writes nothing twice, and what a pause does to the stages."""

from __future__ import annotations

import asyncio
import json

import pytest
from temporalio.activity import ActivityCancellationDetails
from temporalio.exceptions import ApplicationError

from activities.kube.models import (
    CORDONED_BY,
    PACKAGES_ANNOTATION,
    ROLLOUT_ANNOTATION,
    ROLLOUT_STATE_LABEL,
    DrainSettings,
    NodeRolloutState,
    NodeStage,
    NodeStages,
    NodeUpdateFinish,
    NodeUpdateStart,
)
from lab.fleet import Fleet
from tests.kube_helpers import read_node, single_pod_workload, wait_for
from tests.workflows.rollout.test_kube_rollout_activities import env, writes_to_node

ROLLOUT = "rollout/lab/kernel"
PROTECTED = "workload=training"


def fleet(*, protected_on: str | None = None) -> list[dict]:
    """node-01 and node-02, a web pod on node-01 (a drain evicts it), a DaemonSet; optionally a protected pod."""
    workloads = [
        {"name": "web", "namespace": "apps", "replicas": 1, "labels": {"app": "web"}, "nodes": ["node-01"]},
        {"name": "dcgm-exporter", "kind": "DaemonSet", "namespace": "gpu-operator", "labels": {"app": "dcgm"}},
    ]
    if protected_on:
        workloads.append(single_pod_workload("trainer", protected_on, {"workload": "training"}, None))
    return Fleet.model_validate({"nodes": [{"prefix": "node-", "count": 2}], "workloads": workloads}).to_objects()


def start(**fields) -> NodeUpdateStart:
    return NodeUpdateStart(
        **{
            "cluster": "lab",
            "node": "node-01",
            "rollout": ROLLOUT,
            "cordon": True,
            "non_interrupt_selector": PROTECTED,
            "drain": DrainSettings(),
            **fields,
        }
    )


def stage(name: str, **fields) -> NodeStage:
    return NodeStage(
        **{
            "package": "kernel",
            "version": "6.8.1",
            "image": "registry.local/millwright/kernel",
            "stage": name,
            "timeout_seconds": 60,
            **fields,
        }
    )


def stages(boot_id: str, *names: str, **fields) -> NodeStages:
    listed = [stage(n, interrupt="reboot") if n == "interrupt" else stage(n) for n in names]
    return NodeStages(
        **{
            "cluster": "lab",
            "node": "node-01",
            "rollout": ROLLOUT,
            "stages": listed,
            "tries": 2,
            "boot_id": boot_id,
            "reboot_timeout_seconds": 30,
            "reboot_poll_seconds": 0.1,
            **fields,
        }
    )


def rollout_record(node) -> dict:
    return json.loads(node.metadata.annotations[ROLLOUT_ANNOTATION])


async def job_creates(k8s, since: int) -> list[dict]:
    return [e for e in await k8s.audit(since=since, writes=True)
            if e["resource"] == "jobs" and e["verb"] == "create" and e["code"] == 201]  # fmt: skip


async def test_start_cordons_with_the_state_in_one_write_and_plans_the_drain(k8s, kube, core):
    await k8s.seed(fleet())
    since = await k8s.audit_cursor()
    started = await env().run(kube.start_node_update, start())
    assert not started.blocked and started.cordon.owned and started.node.boot_id
    [web] = started.drain.evict
    assert web.namespace == "apps" and web.name.startswith("web-")
    assert [s.reason for s in started.drain.skipped] == ["DaemonSet-managed"]
    node = await read_node(core, "node-01")
    assert node.spec.unschedulable and node.metadata.annotations[CORDONED_BY] == ROLLOUT
    assert node.metadata.labels[ROLLOUT_STATE_LABEL] == "in_progress"
    assert len(await writes_to_node(k8s, since, "node-01")) == 1, "cordon and state in one write"
    again = await env(attempt=2).run(kube.start_node_update, start())
    assert again.cordon.owned and again.drain == started.drain
    assert len(await writes_to_node(k8s, since, "node-01")) == 1, "a retry writes nothing"


async def test_start_without_an_interrupt_only_records_the_state(k8s, kube, core):
    await k8s.seed(fleet())
    started = await env().run(kube.start_node_update, start(cordon=False, drain=None))
    assert started.cordon is None and started.drain is None and not started.blocked
    node = await read_node(core, "node-01")
    assert not node.spec.unschedulable and node.metadata.labels[ROLLOUT_STATE_LABEL] == "in_progress"


async def test_a_node_with_non_interruptible_pods_is_left_in_service(k8s, kube, core):
    await k8s.seed(fleet(protected_on="node-01"))
    await asyncio.sleep(1)  # the trainer pod starts
    started = await env().run(kube.start_node_update, start())
    assert started.blocked == "non-interruptible pods running" and started.drain is None
    node = await read_node(core, "node-01")
    assert not node.spec.unschedulable and node.metadata.labels[ROLLOUT_STATE_LABEL] == "blocked"
    assert rollout_record(node)["reason"] == "non-interruptible pods running"


async def test_a_retry_that_finds_its_own_cordon_and_a_protected_pod_removes_the_cordon(k8s, kube, core):
    """A start that cordoned, then crashed, then finds a protected pod: the cordon is this start's, so it goes;
    a node this rollout left erroring keeps its cordon."""
    await k8s.seed(fleet(protected_on="node-02"))
    await asyncio.sleep(1)
    for node in ("node-01", "node-02"):
        await env().run(kube.start_node_update, start(node=node, non_interrupt_selector="app=none"))
    await env().run(
        kube.set_node_rollout_state,
        NodeRolloutState(
            cluster="lab", node="node-02", rollout=ROLLOUT, state="erroring", stage="apply", reason="failed"
        ),
    )
    await core.create_namespaced_pod(
        "training",
        {  # node-01's protected pod lands after its cordon
            "metadata": {"name": "late-trainer", "labels": {"workload": "training"}},
            "spec": {"nodeName": "node-01", "containers": [{"name": "c", "image": "trainer"}]},
        },
    )
    await asyncio.sleep(1)
    first = await env(attempt=2).run(kube.start_node_update, start())
    assert first.blocked and not (await read_node(core, "node-01")).spec.unschedulable
    second = await env().run(kube.start_node_update, start(node="node-02"))
    node = await read_node(core, "node-02")
    assert second.blocked and node.spec.unschedulable and node.metadata.annotations[CORDONED_BY] == ROLLOUT


async def test_run_node_stages_runs_each_stage_once_and_shows_it_on_the_node(k8s, kube, core):
    await k8s.seed(fleet())
    await k8s.configure(jobs={"defaultSeconds": 0.1, "rules": []}, rebootSeconds=0.3)
    before = (await read_node(core, "node-01")).status.node_info.boot_id
    since = await k8s.audit_cursor()
    request = stages(before, "apply", "config", "interrupt", "post-interrupt")
    beats: list = []
    e = env()
    e.on_heartbeat = lambda *d: beats.append(d[0])
    result = await e.run(kube.run_node_stages, request)
    assert [(r.stage, r.succeeded, r.attempts) for r in result.stages] == [
        ("apply", True, 1),
        ("config", True, 1),
        ("interrupt", True, 1),
        ("post-interrupt", True, 1),
    ]
    assert not result.held and result.reboot_seconds >= 0.3
    node = await read_node(core, "node-01")
    assert node.status.node_info.boot_id != before
    assert rollout_record(node)["stage"] == "post-interrupt", "each stage's start is on the node"
    assert len(await job_creates(k8s, since)) == 4
    # A retry from details its predecessor heartbeat midway adopts the Jobs made: no stage runs twice.
    midway = next(b for b in beats if b.get("index") == 2 and b.get("job"))
    retried = env(attempt=2, heartbeat_details=[midway])
    again = await retried.run(kube.run_node_stages, request)
    assert [r.stage for r in again.stages] == ["apply", "config", "interrupt", "post-interrupt"]
    assert all(r.succeeded for r in again.stages)
    assert len(await job_creates(k8s, since)) == 4


async def test_a_stages_start_mark_goes_beside_its_job_and_one_that_fails_never_runs_the_stage_twice(k8s, kube, core):
    await k8s.seed(fleet())
    await k8s.configure(jobs={"defaultSeconds": 0.5, "rules": []})
    # The mark held up for a second: the Job is made meanwhile, not after it.
    await k8s.add_fault({"verb": "patch", "resource": "nodes"}, {"delay": 1.0}, count=1)
    since = await k8s.audit_cursor()
    result = await env().run(kube.run_node_stages, stages("boot-1", "apply"))
    assert [(r.stage, r.succeeded) for r in result.stages] == [("apply", True)]
    [job] = await job_creates(k8s, since)
    [mark] = await writes_to_node(k8s, since, "node-01")
    assert job["seq"] < mark["seq"], "the Job was created while the stage's mark was held up"
    # The mark refused: the stage's Job still runs to its verdict, then the activity fails; its retry from the
    # heartbeat details marks the stage again and adopts the Job, never making a second one.
    await k8s.add_fault({"verb": "patch", "resource": "nodes"}, {"status": 500}, count=1)
    since = await k8s.audit_cursor()
    beats: list = []
    first = env()
    first.on_heartbeat = lambda *d: beats.append(d[0])
    with pytest.raises(ApplicationError) as err:
        await first.run(kube.run_node_stages, stages("boot-1", "config"))
    assert not err.value.non_retryable and "recording rollout state of node node-01" in str(err.value)
    assert len(await job_creates(k8s, since)) == 1
    retried = env(attempt=2, heartbeat_details=[beats[-1]])
    again = await retried.run(kube.run_node_stages, stages("boot-1", "config"))
    assert [(r.stage, r.succeeded) for r in again.stages] == [("config", True)]
    assert len(await job_creates(k8s, since)) == 1
    assert rollout_record(await read_node(core, "node-01"))["stage"] == "config"


async def test_the_first_stage_that_fails_its_tries_ends_the_stages(k8s, kube):
    await k8s.seed(fleet())
    await k8s.configure(
        jobs={
            "defaultSeconds": 0.1,
            "rules": [
                {"node": "node-01", "stage": "apply", "outcome": "fail", "times": 1, "message": "flaky mirror"},
                {"node": "node-01", "stage": "config", "outcome": "fail", "message": "bad config"},
            ],
        },
        rebootSeconds=0.3,
    )
    since = await k8s.audit_cursor()
    result = await env().run(kube.run_node_stages, stages("boot-1", "apply", "config", "interrupt"))
    assert [(r.stage, r.succeeded, r.attempts) for r in result.stages] == [("apply", True, 2), ("config", False, 2)]
    assert "bad config" in result.stages[-1].message
    assert len(await job_creates(k8s, since)) == 4, "two tries each of apply and config; no interrupt"


async def test_a_pause_stops_the_stages_before_the_next_one_never_inside_one(k8s, kube):
    await k8s.seed(fleet())
    await k8s.configure(jobs={"defaultSeconds": 1.0, "rules": []}, rebootSeconds=0.3)
    since = await k8s.audit_cursor()
    e = env()
    running = asyncio.ensure_future(e.run(kube.run_node_stages, stages("boot-1", "apply", "config")))
    await asyncio.sleep(0.5)
    e.cancel()  # the workflow asks: the pause
    result = await running
    assert result.held and [(r.stage, r.succeeded) for r in result.stages] == [("apply", True)]
    assert len(await job_creates(k8s, since)) == 1
    # The worker shutting down is no pause: the activity ends at once, for its retry elsewhere.
    shutdown = env()
    running = asyncio.ensure_future(shutdown.run(kube.run_node_stages, stages("boot-1", "config")))
    await asyncio.sleep(0.3)
    shutdown.cancel(ActivityCancellationDetails(cancel_requested=True, worker_shutdown=True))
    with pytest.raises(asyncio.CancelledError):
        await running


async def test_the_stages_hand_the_node_back_once_the_last_has_succeeded(k8s, kube, core):
    await k8s.seed(fleet())
    await k8s.configure(jobs={"defaultSeconds": 0.5, "rules": [
        {"node": "node-02", "stage": "config", "outcome": "fail", "message": "bad config"}]})  # fmt: skip
    for node in ("node-01", "node-02"):
        await env().run(kube.start_node_update, start(node=node, non_interrupt_selector=""))
    finish = NodeUpdateFinish(cluster="lab", node="node-01", rollout=ROLLOUT, packages={"kernel": "6.8.1"},
                              uncordon=True)  # fmt: skip
    beats: list = []
    e = env()
    e.on_heartbeat = lambda *d: beats.append(d[0])
    running = asyncio.ensure_future(e.run(kube.run_node_stages, stages("boot-1", "apply", "config", finish=finish)))

    async def config_job_made() -> bool:
        return any(b.get("index") == 1 and b.get("job") for b in beats)

    await wait_for(config_job_made, what="the config stage's Job", interval=0.05)
    e.cancel()  # a pause during the last stage: the stage ends, and the hand-back starts nothing
    result = await running
    assert result.finished and not result.held and [r.stage for r in result.stages] == ["apply", "config"]
    node = await read_node(core, "node-01")
    assert not node.spec.unschedulable and CORDONED_BY not in (node.metadata.annotations or {})
    assert node.metadata.labels[ROLLOUT_STATE_LABEL] == "complete"
    assert json.loads(node.metadata.annotations[PACKAGES_ANNOTATION]) == {"kernel": "6.8.1"}
    # Its retry from the last beat (every stage done) writes nothing and makes no Job.
    since = await k8s.audit_cursor()
    again = await env(attempt=2, heartbeat_details=[beats[-1]]).run(
        kube.run_node_stages, stages("boot-1", "apply", "config", finish=finish)
    )
    assert again.finished and await writes_to_node(k8s, since, "node-01") == [] and await job_creates(k8s, since) == []
    # A stage that fails leaves the node cordoned, erroring for its workflow to record.
    failing = stages("boot-1", "apply", "config", node="node-02", tries=1,
                     finish=finish.model_copy(update={"node": "node-02"}))  # fmt: skip
    failed = await env().run(kube.run_node_stages, failing)
    assert not failed.finished and not failed.stages[-1].succeeded
    assert (await read_node(core, "node-02")).spec.unschedulable
    with pytest.raises(ValueError, match="finish: names another"):
        stages("boot-1", "apply", finish=finish.model_copy(update={"node": "node-02"}))


async def test_a_retry_after_the_hand_back_writes_nothing_whatever_beat_it_resumes_from(k8s, kube, core):
    # Issue 43: the server down as the stages' activity ended, its retry resumed from an earlier beat, marked the
    # handed-back (uncordoned) node `in_progress` again, walked its stages and wrote `complete` once more.
    await k8s.seed(fleet())
    await k8s.configure(jobs={"defaultSeconds": 0.2})
    await env().run(kube.start_node_update, start(non_interrupt_selector=""))
    finish = NodeUpdateFinish(cluster="lab", node="node-01", rollout=ROLLOUT, packages={"kernel": "6.8.1"},
                              uncordon=True)  # fmt: skip
    beats: list = []
    e = env()
    e.on_heartbeat = lambda *d: beats.append(d[0])
    assert (await e.run(kube.run_node_stages, stages("boot-1", "apply", "config", finish=finish))).finished
    since = await k8s.audit_cursor()
    for details in ([], [beats[0]]):  # no beat reached the server, or only one from the first stage
        again = await env(attempt=2, heartbeat_details=details).run(
            kube.run_node_stages, stages("boot-1", "apply", "config", finish=finish)
        )
        assert again.finished and [(r.stage, r.succeeded) for r in again.stages] == [("apply", True), ("config", True)]
    written = [e for e in await k8s.audit(since=since, writes=True) if e["userAgent"].startswith("millwright")]
    assert written == []
    node = await read_node(core, "node-01")
    assert node.metadata.labels[ROLLOUT_STATE_LABEL] == "complete" and not node.spec.unschedulable


async def test_a_reboot_that_cannot_be_verified_runs_no_stage(k8s, kube):
    await k8s.seed(fleet())
    since = await k8s.audit_cursor()
    with pytest.raises(ApplicationError) as err:
        await env().run(kube.run_node_stages, stages("", "apply", "interrupt"))
    assert err.value.type == "RebootUnverifiable" and err.value.non_retryable
    assert await job_creates(k8s, since) == []


async def test_an_unknown_stage_is_refused_before_any_stage_runs(k8s, kube, core):
    await k8s.seed(fleet())
    since = await k8s.audit_cursor()
    with pytest.raises(ApplicationError) as err:
        await env().run(kube.run_node_stages, stages("boot-1", "apply", "reimage"))
    assert err.value.type == "InvalidStage" and err.value.non_retryable and "reimage" in str(err.value)
    assert await job_creates(k8s, since) == []
    assert ROLLOUT_ANNOTATION not in ((await read_node(core, "node-01")).metadata.annotations or {})


async def test_finish_records_packages_and_state_and_uncordons_in_one_write(k8s, kube, core):
    await k8s.seed(fleet())
    await core.patch_node("node-01", {"metadata": {"annotations": {PACKAGES_ANNOTATION: '{"dcgm":"3.1.0"}'}}})
    await env().run(kube.start_node_update, start())
    since = await k8s.audit_cursor()
    finish = NodeUpdateFinish(
        cluster="lab", node="node-01", rollout=ROLLOUT, packages={"kernel": "6.8.1"}, uncordon=True
    )
    await env().run(kube.finish_node_update, finish)
    await env(attempt=2).run(kube.finish_node_update, finish)
    assert len(await writes_to_node(k8s, since, "node-01")) == 1
    node = await read_node(core, "node-01")
    assert not node.spec.unschedulable and CORDONED_BY not in (node.metadata.annotations or {})
    assert json.loads(node.metadata.annotations[PACKAGES_ANNOTATION]) == {"dcgm": "3.1.0", "kernel": "6.8.1"}
    assert node.metadata.labels[ROLLOUT_STATE_LABEL] == "complete"
    # Someone else's cordon stays.
    await core.patch_node("node-02", {"spec": {"unschedulable": True}})
    await env().run(kube.finish_node_update, finish.model_copy(update={"node": "node-02"}))
    node = await read_node(core, "node-02")
    assert node.spec.unschedulable and node.metadata.labels[ROLLOUT_STATE_LABEL] == "complete"
    # A packages annotation that is not a JSON object is not overwritten: a retry cannot fix it, a person can.
    await core.patch_node("node-01", {"metadata": {"annotations": {PACKAGES_ANNOTATION: "not json"}}})
    with pytest.raises(ApplicationError) as ei:
        await env().run(kube.finish_node_update, finish)
    assert ei.value.type == "MalformedNodeAnnotation" and ei.value.non_retryable


async def test_the_api_client_reads_the_proxy_environment_once(tmp_path, monkeypatch):
    """aiohttp would read the proxy environment and ~/.netrc for every request: the client takes the proxy the
    environment names for its API server once, as kubectl honours it, and NO_PROXY still exempts a server."""
    from activities.kube.connector import ClusterConnector

    config = {"apiVersion": "v1", "kind": "Config", "current-context": "prod",
              "clusters": [{"name": "prod", "cluster": {"server": "https://10.0.0.1:6443"}}],
              "users": [{"name": "prod", "user": {"token": "t"}}],
              "contexts": [{"name": "prod", "context": {"cluster": "prod", "user": "prod"}}]}  # fmt: skip
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps(config))
    for no_proxy, expected in (("", "http://proxy.example:3128"), ("10.0.0.1", None)):
        monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
        monkeypatch.setenv("NO_PROXY", no_proxy)
        connector = ClusterConnector([str(path)])
        api = await connector.api("prod")
        assert api.configuration.proxy == expected
        assert api.configuration.client_session_kwargs == {"trust_env": False}
        await connector.close()
