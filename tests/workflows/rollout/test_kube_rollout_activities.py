"""The rollout activities, each run through ActivityEnvironment against the Kubernetes emulator
(and the Prometheus stub): no Temporal server needed."""

from __future__ import annotations

import asyncio
import dataclasses
import json

import pytest
from aiohttp import web
from kubernetes.aio.client import BatchV1Api
from temporalio import activity
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.kube.models import (
    JOB_NAMESPACE,
    ROLLOUT_ANNOTATION,
    ROLLOUT_STATE_LABEL,
    ConditionGate,
    CordonRequest,
    NodePageRequest,
    NodeRef,
    NodeRolloutState,
    RebootWait,
    StageJobRequest,
    UnavailableRequest,
)
from activities.kube.stages import stage_job_name
from activities.prometheus import PrometheusActivities, PrometheusQuery
from lab.fleet import Fleet


def env(**info) -> ActivityEnvironment:
    e = ActivityEnvironment()
    if info:
        e.info = dataclasses.replace(e.info, **info)
    return e


def nodes(count: int, *, prefix: str = "node-", labels: dict | None = None, **extra) -> list[dict]:
    fleet = Fleet.model_validate({"nodes": [{"prefix": prefix, "count": count, "labels": labels or {}}], **extra})
    return fleet.to_objects()


async def writes_to_node(k8s, since: int, name: str) -> list[dict]:
    return [
        e
        for e in await k8s.audit(since=since, writes=True)
        if e["resource"] == "nodes" and e["name"] == name and e["userAgent"].startswith("millwright")
    ]


async def test_list_nodes_page_pages_with_continue(k8s, kube):
    await k8s.seed(nodes(25, labels={"pool": "a"}) + nodes(3, prefix="other-"))
    e = env()
    names, pages, token = [], 0, None
    while True:
        page = await e.run(
            kube.list_nodes_page,
            NodePageRequest(
                cluster="lab", label_selector="pool=a", label_keys=["pool", "missing"], limit=10, continue_token=token
            ),
        )
        pages += 1
        names += [n.name for n in page.nodes]
        assert all(n.labels == {"pool": "a"} and n.ready and not n.unschedulable for n in page.nodes)
        token = page.continue_token
        if not token:
            break
    assert pages == 3 and names == [f"node-{i:02d}" for i in range(1, 26)]
    page = await e.run(kube.list_nodes_page, NodePageRequest(cluster="lab", limit=100))
    assert len(page.nodes) == 28 and page.continue_token is None
    assert "kubernetes.io/hostname" in page.nodes[0].labels  # no label_keys: all labels


async def test_list_unavailable_nodes(k8s, kube, core):
    await k8s.seed(nodes(6, labels={"pool": "a"}))
    await core.patch_node("node-02", {"spec": {"unschedulable": True}})
    await core.patch_node_status(
        "node-05", {"status": {"conditions": [{"type": "Ready", "status": "False", "reason": "KubeletNotReady"}]}}
    )
    got = await env().run(kube.list_unavailable_nodes, UnavailableRequest(cluster="lab", label_selector="pool=a"))
    assert got == ["node-02", "node-05"]


async def test_rollout_state_is_written_once(k8s, kube):
    await k8s.seed(nodes(1))
    e = env()
    req = NodeRolloutState(
        cluster="lab",
        node="node-01",
        rollout="rollout-1",
        state="in_progress",
        package="kernel",
        stage="apply",
        reason="batch 1",
    )
    since = await k8s.audit_cursor()
    await e.run(kube.set_node_rollout_state, req)
    await e.run(kube.set_node_rollout_state, req)
    assert len(await writes_to_node(k8s, since, "node-01")) == 1
    info = await e.run(kube.inspect_node, NodeRef(cluster="lab", node="node-01"))
    assert info.rollout_state == "in_progress" and info.packages == {}
    await e.run(kube.set_node_rollout_state, req.model_copy(update={"state": "complete"}))
    assert len(await writes_to_node(k8s, since, "node-01")) == 2
    (obj,) = [o for o in await k8s.dump() if o["kind"] == "Node"]
    assert obj["metadata"]["labels"][ROLLOUT_STATE_LABEL] == "complete"
    ann = json.loads(obj["metadata"]["annotations"][ROLLOUT_ANNOTATION])
    assert {k: ann[k] for k in ("rollout", "state", "package", "stage", "reason")} == {
        "rollout": "rollout-1",
        "state": "complete",
        "package": "kernel",
        "stage": "apply",
        "reason": "batch 1",
    }
    assert ann["updated"].endswith("Z")
    with pytest.raises(ApplicationError) as ei:
        await e.run(kube.set_node_rollout_state, req.model_copy(update={"state": "done"}))
    assert ei.value.type == "InvalidRolloutState" and ei.value.non_retryable


def stage(**kw) -> StageJobRequest:
    base = dict(
        cluster="lab",
        node="node-01",
        rollout="rollout-abc",
        package="kernel",
        version="6.8.1",
        image="registry.local/millwright/kernel",
        stage="apply",
        ordinal=3,
        timeout_seconds=60,
        config={"mode": "fast"},
    )
    return StageJobRequest(**{**base, **kw})


async def test_run_stage_job_succeeds_and_rerun_adopts(k8s, kube, kubeconfig_path):
    await k8s.seed(nodes(2))
    await k8s.configure(jobs={"defaultSeconds": 0.2, "rules": []})
    e = env()
    since = await k8s.audit_cursor()
    first = await e.run(kube.run_stage_job, stage())
    assert first.succeeded and first.attempt == 1 and first.message == ""
    assert first.job.startswith("mw-kernel-apply-") and len(first.job) <= 63
    again = await e.run(kube.run_stage_job, stage())  # the same attempt: adopts the Job
    assert again.job == first.job and again.succeeded
    creates = [
        x
        for x in await k8s.audit(since=since, writes=True)
        if x["resource"] == "jobs" and x["verb"] == "create" and x["code"] == 201
    ]
    assert len(creates) == 1
    objs = await k8s.dump()
    (job,) = [o for o in objs if o["kind"] == "Job"]
    md, spec = job["metadata"], job["spec"]
    assert md["namespace"] == JOB_NAMESPACE
    assert md["labels"]["millwright.dev/node"] == "node-01" and md["labels"]["millwright.dev/stage"] == "apply"
    assert md["labels"]["millwright.dev/package"] == "kernel" and len(md["labels"]["millwright.dev/rollout"]) == 16
    assert spec["backoffLimit"] == 0 and spec["activeDeadlineSeconds"] == 60 and spec["ttlSecondsAfterFinished"] == 600
    pod_spec = spec["template"]["spec"]
    assert pod_spec["nodeName"] == "node-01" and pod_spec["restartPolicy"] == "Never"
    assert [c["name"] for c in pod_spec["initContainers"]] == ["apply"]
    assert [c["name"] for c in pod_spec["containers"]] == ["apply-check"]
    assert pod_spec["containers"][0]["image"] == "registry.local/millwright/kernel:6.8.1"
    env_vars = {v["name"]: v["value"] for v in pod_spec["initContainers"][0]["env"]}
    assert env_vars["MILLWRIGHT_NODE_ORDER"] == "3" and env_vars["MILLWRIGHT_STAGE"] == "apply"
    (cm,) = [o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"] == first.job]
    assert cm["data"] == {"mode": "fast"} and cm["metadata"]["ownerReferences"][0]["uid"] == md["uid"]
    # the workflow trying the stage again, or a new run for the node, gets its own Job
    other = await env().run(kube.run_stage_job, stage(try_number=2))
    assert other.job != first.job and other.succeeded
    rerun = await env(workflow_run_id="another-run").run(kube.run_stage_job, stage())
    assert rerun.job not in (first.job, other.job)
    # a retry after a crash, even one before any heartbeat, adopts the same Job: the stage never runs twice
    retried = await env(attempt=2).run(kube.run_stage_job, stage())
    assert retried.job == first.job and retried.succeeded


async def test_run_stage_job_failure_carries_the_message(k8s, kube):
    await k8s.seed(nodes(2))
    await k8s.configure(
        jobs={
            "defaultSeconds": 0.2,
            "rules": [
                {
                    "node": "node-01",
                    "package": "kernel",
                    "stage": "apply",
                    "outcome": "fail",
                    "times": 1,
                    "message": "dkms: build of nvidia 550 failed",
                }
            ],
        }
    )
    result = await env().run(kube.run_stage_job, stage(config={}))
    assert not result.succeeded
    assert "BackoffLimitExceeded" in result.message and "dkms: build of nvidia 550 failed" in result.message
    assert "container apply" in result.message
    # the workflow tries again: a new Job, and the rule is used up
    retry = await env().run(kube.run_stage_job, stage(config={}, try_number=2))
    assert retry.succeeded and retry.job != result.job


async def test_adopting_a_foreign_job_is_a_conflict(k8s, kube, core):
    await k8s.seed(nodes(1))
    await k8s.configure(jobs={"defaultSeconds": 0.2, "rules": []})
    done = await env().run(kube.run_stage_job, stage())
    # Someone relabels the Job: it no longer is this stage's run.
    batch = BatchV1Api(core.api_client)
    await batch.patch_namespaced_job(
        done.job, JOB_NAMESPACE, {"metadata": {"labels": {"millwright.dev/node": "node-09"}}}
    )
    with pytest.raises(ApplicationError) as ei:
        await env(attempt=2).run(kube.run_stage_job, stage())
    assert ei.value.type == "JobConflict" and ei.value.non_retryable


async def test_reboot_interrupt_then_wait_node_rebooted(k8s, kube):
    await k8s.seed(nodes(1))
    await k8s.configure(jobs={"defaultSeconds": 0.1, "rules": []}, rebootSeconds=0.5)
    e = env()
    before = (await e.run(kube.inspect_node, NodeRef(cluster="lab", node="node-01"))).boot_id
    waiting = e.run(
        kube.wait_node_rebooted,
        RebootWait(cluster="lab", node="node-01", previous_boot_id=before, timeout_seconds=20, poll_seconds=0.1),
    )
    result = await e.run(kube.run_stage_job, stage(stage="interrupt", interrupt="reboot", services=["kubelet"]))
    assert result.succeeded
    new_boot = await waiting
    assert new_boot != before
    objs = await k8s.dump()
    (job,) = [o for o in objs if o["kind"] == "Job"]
    assert job["metadata"]["labels"]["millwright.dev/interrupt"] == "reboot"
    pod_spec = job["spec"]["template"]["spec"]
    assert pod_spec["restartPolicy"] == "OnFailure" and "initContainers" not in pod_spec
    assert [c["name"] for c in pod_spec["containers"]] == ["interrupt"]
    # an unchanged boot ID past the deadline is a non-retryable RebootTimeout
    with pytest.raises(ApplicationError) as ei:
        await e.run(
            kube.wait_node_rebooted,
            RebootWait(cluster="lab", node="node-01", previous_boot_id=new_boot, timeout_seconds=0.3, poll_seconds=0.1),
        )
    assert ei.value.type == "RebootTimeout" and ei.value.non_retryable


async def test_check_node_conditions(k8s, kube, core):
    await k8s.seed(nodes(4, labels={"pool": "a"}))
    await core.patch_node_status(
        "node-02",
        {
            "status": {
                "conditions": [
                    {
                        "type": "KernelDeadlock",
                        "status": "True",
                        "reason": "DockerHung",
                        "message": "task docker blocked",
                    }
                ]
            }
        },
    )
    await core.patch_node_status(
        "node-03",
        {
            "status": {
                "conditions": [
                    {"type": "Ready", "status": "False", "reason": "KubeletNotReady", "message": "PLEG is not healthy"}
                ]
            }
        },
    )
    e = env()
    gate = ConditionGate(cluster="lab", label_selector="pool=a", conditions=["Ready", "KernelDeadlock", "GpuUnhealthy"])
    got = await e.run(kube.check_node_conditions, gate)
    assert got == [
        "node node-02: KernelDeadlock is True (DockerHung: task docker blocked)",
        "node node-03: Ready is False (KubeletNotReady: PLEG is not healthy)",
    ]
    assert await e.run(kube.check_node_conditions, gate.model_copy(update={"label_selector": "pool=b"})) == []


def test_every_stage_has_its_traits_and_only_interrupts_reboot():
    from activities.kube.models import STAGE_TRAITS, Stage

    assert set(STAGE_TRAITS) == set(Stage)
    assert {s for s in Stage if s.is_interrupt} == {Stage.INTERRUPT, Stage.UNINSTALL_INTERRUPT}
    assert [s for s in Stage if s.needs_reboot("reboot")] == [Stage.INTERRUPT, Stage.UNINSTALL_INTERRUPT]
    assert not Stage.INTERRUPT.needs_reboot("service") and Stage.named("reimage") is None
    assert Stage.named("uninstall-interrupt").event_reason == "Interrupt" and Stage.CONFIG.event_reason == "Apply"


def test_stage_job_names_are_dns_safe():
    name = stage_job_name("a" * 43, "post-interrupt", "0123456789")
    assert len(name) <= 63 and name.endswith("-0123456789") and name.startswith("mw-aaa")


async def test_query_prometheus_against_the_real_server(k8s, prometheus):
    await k8s.seed(Fleet.model_validate({"cluster": "lab", "nodes": [{"name": "q-1"}, {"name": "q-2", "gpus": 4}]})
                   .to_objects())  # fmt: skip
    await k8s.set_gpu("q-2", {"DCGM_FI_DEV_GPU_TEMP": 88}, gpu=1)
    await prometheus.wait_for('DCGM_FI_DEV_GPU_TEMP{Hostname="q-2", gpu="1"} == 88', what="q-2's hot GPU")
    await prometheus.wait_for('DCGM_FI_DEV_GPU_TEMP{Hostname="q-1"}', what="q-1's GPUs")
    acts = PrometheusActivities()
    e = env()

    async def ask(query: str, url: str = prometheus.url) -> list[float]:
        return await e.run(acts.query_prometheus, PrometheusQuery(url=url, query=query))

    try:
        assert await ask('count(DCGM_FI_DEV_GPU_TEMP{Hostname=~"q-.*"})') == [12.0]
        hottest = 'max by (Hostname) (DCGM_FI_DEV_GPU_TEMP{Hostname=~"q-.*"})'
        assert sorted(await ask(hottest, prometheus.url + "/")) == [34.0, 88.0]
        assert await ask(f"{hottest} > 85") == [88.0]
        assert await ask("absent_metric") == []
        assert await ask("2 * 3") == [6.0]  # a scalar
        with pytest.raises(ApplicationError) as ei:
            await ask("sum(rate(DCGM_FI_DEV_ECC_DBE_VOL_TOTAL[1m]) > ")
        assert ei.value.non_retryable and ei.value.type == "PrometheusRejected" and "bad_data" in str(ei.value)
        with pytest.raises(ApplicationError) as ei:
            await ask("DCGM_FI_DEV_GPU_TEMP[1m]")  # a range vector: no number to compare
        assert ei.value.non_retryable and ei.value.type == "PrometheusBadResponse"
        with pytest.raises(ApplicationError) as ei:  # nothing listens there
            await ask("up", "http://127.0.0.1:9")
        assert not ei.value.non_retryable
    finally:
        await acts.close()


async def test_a_prometheus_that_times_out_is_asked_again():
    """A server answering 503 as Prometheus does when a query times out: retryable (the real server cannot be made
    to time out on demand, so this one is a few lines here)."""

    async def timed_out(request: web.Request) -> web.Response:
        return web.json_response({"status": "error", "errorType": "timeout", "error": "query timed out in "
                                  "expression evaluation"}, status=503)  # fmt: skip

    app = web.Application()
    app.router.add_route("*", "/api/v1/query", timed_out)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    acts = PrometheusActivities()
    try:
        with pytest.raises(ApplicationError) as ei:
            await env().run(acts.query_prometheus, PrometheusQuery(url=url, query="up"))
        assert not ei.value.non_retryable and ei.value.type == "PrometheusUnavailable" and "timed out" in str(ei.value)
    finally:
        await acts.close()
        await runner.cleanup()


async def test_activities_are_registered(kubeconfig_path):
    from worker import registry
    from worker.config import WorkerSettings

    registration = registry.build(WorkerSettings(kubeconfig=str(kubeconfig_path), metrics_port=0))
    names = {activity._Definition.must_from_callable(a).name for a in registration.activities}
    await registration.close()
    assert {
        "list_nodes_page",
        "run_stage_job",
        "wait_node_rebooted",
        "check_node_conditions",
        "query_prometheus",
    } <= names


async def job_requests(k8s, since: int) -> dict[str, int]:
    """The requests for Jobs since `since`, by verb."""
    counts: dict[str, int] = {}
    for x in await k8s.audit(since=since):
        if x["resource"] == "jobs" and x["userAgent"].startswith("millwright"):
            counts[x["verb"]] = counts.get(x["verb"], 0) + 1
    return counts


async def test_stage_job_waits_learn_their_verdicts_from_one_watch(k8s, kube):
    """Twenty stages waiting together read their Jobs about once each: the verdicts come on the cluster's one
    watch (a wait that read every tenth of the time waited made about ten reads each here)."""
    await k8s.seed(nodes(20))
    await k8s.configure(jobs={"defaultSeconds": 2.0, "rules": []})
    since = await k8s.audit_cursor()
    results = await asyncio.gather(
        *(env().run(kube.run_stage_job, stage(node=f"node-{i:02d}", config={})) for i in range(1, 21))
    )
    assert all(r.succeeded for r in results)
    counts = await job_requests(k8s, since)
    assert counts["create"] == 20 and counts["watch"] == 1 and counts["list"] == 1
    assert counts.get("get", 0) <= 20  # the waits that began before the watch did read once when it began


async def test_stage_job_waits_outlast_a_watch_that_fails(k8s, kube):
    """No watch to vouch for a Job: the wait reads it on its own schedule and still gets its verdict."""
    await k8s.seed(nodes(1))
    await k8s.configure(jobs={"defaultSeconds": 1.5, "rules": []})
    await k8s.add_fault({"verb": "watch", "resource": "jobs"}, {"status": 500}, count=-1)
    since = await k8s.audit_cursor()
    result = await env().run(kube.run_stage_job, stage(config={}))
    assert result.succeeded
    counts = await job_requests(k8s, since)
    assert counts["get"] >= 3 and counts["watch"] >= 1  # read while the watch failed (backing off between tries)
    # Expired (410) then served: the watch lists again, the waits read once more, the verdict comes on the stream.
    await k8s.clear_faults()
    await k8s.add_fault({"verb": "watch", "resource": "jobs"}, {"status": 410}, count=2)
    since = await k8s.audit_cursor()
    result = await env().run(kube.run_stage_job, stage(config={}, try_number=2))
    assert result.succeeded
    assert (await job_requests(k8s, since))["list"] >= 2


async def test_a_stage_job_deleted_under_its_wait_is_seen_at_once(k8s, kube, core):
    await k8s.seed(nodes(1))
    await k8s.configure(jobs={"defaultSeconds": 60.0, "rules": []})
    waiting = asyncio.ensure_future(env().run(kube.run_stage_job, stage(config={})))
    batch = BatchV1Api(core.api_client)
    for _ in range(100):
        jobs = (await batch.list_namespaced_job(JOB_NAMESPACE)).items
        if jobs:
            break
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.5)  # the wait follows it on the watch by now
    await batch.delete_namespaced_job(jobs[0].metadata.name, JOB_NAMESPACE, propagation_policy="Background")
    result = await asyncio.wait_for(waiting, 5)  # long before the 30 s backstop read
    assert not result.succeeded and "disappeared" in result.message


async def test_a_rebooting_node_is_followed_on_the_nodes_watch(k8s, kube):
    """The wait reads the node when it begins and once the watch starts, then learns the new boot ID from the
    stream (read every 0.25 s to 2 s, it made about six reads here)."""
    await k8s.seed(nodes(1))
    await k8s.configure(jobs={"defaultSeconds": 0.1, "rules": []}, rebootSeconds=3.0)
    e = env()
    before = (await e.run(kube.inspect_node, NodeRef(cluster="lab", node="node-01"))).boot_id
    since = await k8s.audit_cursor()
    waiting = asyncio.ensure_future(env().run(
        kube.wait_node_rebooted,
        RebootWait(cluster="lab", node="node-01", previous_boot_id=before, timeout_seconds=20, poll_seconds=2.0),
    ))  # fmt: skip
    assert (await e.run(kube.run_stage_job, stage(stage="interrupt", interrupt="reboot", config={}))).succeeded
    assert await waiting != before
    reads = [
        x["verb"]
        for x in await k8s.audit(since=since)
        if x["resource"] == "nodes" and x["userAgent"].startswith("millwright") and x["verb"] in ("get", "watch")
    ]
    assert reads.count("watch") == 1 and reads.count("get") <= 2


async def test_the_whole_clusters_availability_comes_from_the_nodes_watch(k8s, kube, core):
    """The disruption budget's read (every node, no selector): listed page by page the first time, then from what
    the shared watch of nodes keeps, as each change arrives on its stream; a selector's read is always listed."""
    await k8s.seed(nodes(6, labels={"pool": "a"}))
    req = UnavailableRequest(cluster="lab")
    first = await env().run(kube.node_availability, req)
    assert first.total == 6 and first.unavailable == {}
    await asyncio.sleep(0.5)  # the watch lists and starts its stream meanwhile
    since = await k8s.audit_cursor()
    await core.patch_node("node-02", {"spec": {"unschedulable": True}})
    await core.patch_node_status(
        "node-05", {"status": {"conditions": [{"type": "Ready", "status": "False", "reason": "KubeletNotReady"}]}}
    )
    await core.delete_node("node-06")
    await asyncio.sleep(0.3)
    got = await env().run(kube.node_availability, req)
    assert got.total == 5 and got.unavailable == {"node-02": "cordoned", "node-05": "NotReady"}
    assert await node_lists(k8s, since) == 0
    selected = await env().run(kube.node_availability, UnavailableRequest(cluster="lab", label_selector="pool=a"))
    assert selected.unavailable == got.unavailable and await node_lists(k8s, since) == 1


async def node_lists(k8s, since: int) -> int:
    """The node lists this worker sent since `since`."""
    return sum(
        1
        for x in await k8s.audit(since=since)
        if x["resource"] == "nodes" and x["verb"] == "list" and x["userAgent"].startswith("millwright")
    )


async def survey(kube, limit: int) -> tuple[list, int]:
    """A rollout's re-read of its targeted nodes (pool=a), page by page: the nodes and how many pages."""
    e, found, pages, token = env(), [], 0, None
    while True:
        page = await e.run(kube.list_nodes_page, NodePageRequest(
            cluster="lab", label_selector="pool=a", label_keys=["pool"], limit=limit, continue_token=token))  # fmt: skip
        found += page.nodes
        pages += 1
        token = page.continue_token
        if not token:
            return found, pages


async def test_a_rollouts_reread_comes_from_the_nodes_watch_and_sees_its_own_writes(k8s, kube, core):
    """The re-read before each batch: its pages come from what the shared watch of nodes keeps (in name order,
    the selector and label keys applied), and it shows this worker's own cordon written just before it."""
    await k8s.seed(nodes(25, labels={"pool": "a"}) + nodes(3, prefix="other-"))
    listed, _ = await survey(kube, 10)  # the first one lists: the watch starts meanwhile
    assert [n.name for n in listed] == [f"node-{i:02d}" for i in range(1, 26)]
    await asyncio.sleep(0.5)
    await core.patch_node("node-07", {"spec": {"unschedulable": True}})  # someone else's cordon
    await asyncio.sleep(0.3)
    since = await k8s.audit_cursor()
    await env().run(kube.cordon_node, CordonRequest(cluster="lab", node="node-03", owner="run-1", reason="test"))
    kept, pages = await survey(kube, 10)
    assert pages == 3 and [n.name for n in kept] == [n.name for n in listed]
    assert {n.name for n in kept if n.unschedulable} == {"node-03", "node-07"}
    assert all(n.labels == {"pool": "a"} and n.ready and n.created for n in kept)
    assert await node_lists(k8s, since) == 0


async def test_a_reread_whose_watch_stops_between_pages_lists_the_rest(k8s, kube):
    await k8s.seed(nodes(25, labels={"pool": "a"}))
    await survey(kube, 10)
    await asyncio.sleep(0.5)
    e = env()
    first = await e.run(kube.list_nodes_page, NodePageRequest(cluster="lab", label_selector="pool=a", limit=10))
    assert first.continue_token and first.continue_token.startswith("kept-after:")
    await kube.close()  # the shared watches stop (a worker shutting down, a stream that broke)
    since = await k8s.audit_cursor()
    rest, token = [], first.continue_token
    while token:
        page = await e.run(
            kube.list_nodes_page,
            NodePageRequest(cluster="lab", label_selector="pool=a", limit=10, continue_token=token),
        )
        rest += [n.name for n in page.nodes]
        token = page.continue_token
    assert [n.name for n in first.nodes] + rest == [f"node-{i:02d}" for i in range(1, 26)]
    assert await node_lists(k8s, since) >= 1


@pytest.mark.parametrize("lag", [1.0, 3.0])
async def test_a_read_of_the_kept_nodes_waits_for_the_stream_to_bring_this_workers_write(k8s, kube, lag):
    """The watch's stream lags (its request held up): a read just after this worker's cordon waits for the stream
    to bring it rather than answer from what the watch kept before it; a stream more than 2 s behind, and the read
    lists (and the watch lists again)."""
    await k8s.seed(nodes(6))
    req = UnavailableRequest(cluster="lab")
    await env().run(kube.node_availability, req)
    await asyncio.sleep(0.5)
    await kube.close()
    await k8s.add_fault({"verb": "watch", "resource": "nodes"}, {"delay": lag})
    await env().run(kube.node_availability, req)  # lists; the watch lists, then its stream waits a second
    await asyncio.sleep(0.3)
    since = await k8s.audit_cursor()
    await env().run(kube.cordon_node, CordonRequest(cluster="lab", node="node-02", owner="run-1", reason="test"))
    got = await env().run(kube.node_availability, req)
    assert got.unavailable == {"node-02": "cordoned"}
    # From the watch once its stream brought the cordon; else listed (and the watch starts over).
    assert (await node_lists(k8s, since) == 0) == (lag < 2)
