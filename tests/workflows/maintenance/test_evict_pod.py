"""`evict_pod` and the other Kubernetes activities that decide "done" from an API answer, one answer at
a time, through ActivityEnvironment against the Kubernetes emulator (no Temporal server).

What each answer must come to is the table in docs/node-maintenance.md, "Draining a node": a pod is `gone` only when a
fresh read finds it missing or replaced, never from the eviction's answer alone.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.kube.models import (
    CORDONED_BY,
    JOB_NAMESPACE,
    PACKAGES_ANNOTATION,
    ROLLOUT_STATE_LABEL,
    CordonRequest,
    EvictOutcome,
    EvictRequest,
    NodeRolloutState,
    NodeUpdateFinish,
    PodRef,
    RebootWait,
    StageJobRequest,
)
from lab.fleet import Fleet

POD = "web-0"
EVICTION = {"verb": "create", "resource": "pods", "subresource": "eviction", "name": POD}
READ = {"verb": "get", "resource": "pods", "name": POD}
BUDGET_WRITE = {"verb": "update", "group": "policy", "resource": "poddisruptionbudgets", "subresource": "status"}
NAMESPACE_TERMINATING = {
    "name": POD,
    "kind": "pods",
    "causes": [
        {
            "reason": "NamespaceTerminating",
            "message": "namespace apps is being terminated",
            "field": "metadata.namespace",
        }
    ],
}
PRECONDITION = "Precondition failed: UID in precondition: x, UID in object meta: y"


def objects(*, pdb: dict | None = None, pods: int = 1) -> list[dict]:
    """node-01 with `pods` web pods of one ReplicaSet (web-0 first), optionally behind a PDB."""
    workload = {
        "name": "web",
        "namespace": "apps",
        "replicas": pods,
        "labels": {"app": "web"},
        "nodes": ["node-01"],
        "terminationGracePeriodSeconds": 30,
    }
    if pdb:
        workload["pdb"] = pdb
    fleet = Fleet.model_validate({"nodes": [{"prefix": "node-", "count": 1}], "workloads": [workload]})
    objs = fleet.to_objects()
    for i, o in enumerate(o for o in objs if o["kind"] == "Pod"):
        o["metadata"]["name"] = f"web-{i}"
    return objs


async def seeded(k8s, core, **kw) -> PodRef:
    await k8s.seed(objects(**kw))
    await k8s.configure(graceScale=1.0)  # an evicted pod stays terminating (30 s) while the test looks
    pod = await core.read_namespaced_pod(POD, "apps")
    return PodRef(namespace="apps", name=POD, uid=pod.metadata.uid)


async def replace_pod(k8s, core, ref: PodRef) -> None:
    """The pod's controller recreated it under the same name (a StatefulSet would): a new UID."""
    await core.delete_namespaced_pod(ref.name, ref.namespace, grace_period_seconds=0)
    fresh = next(o for o in objects() if o["kind"] == "Pod")
    fresh["metadata"].pop("uid", None)
    await k8s.seed([fresh])


async def delete_pod(k8s, core, ref: PodRef) -> None:
    await core.delete_namespaced_pod(ref.name, ref.namespace, grace_period_seconds=0)


async def while_eviction_waits(k8s, kube, ref: PodRef, change) -> EvictOutcome:
    """Hold the eviction in the API server (a delay fault) and change the pod meanwhile: what the eviction
    then answers is the real answer for a pod that changed under it."""
    await k8s.add_fault(EVICTION, {"delay": 2.0})
    since = await k8s.audit_cursor()
    task = asyncio.create_task(ActivityEnvironment().run(kube.evict_pod, EvictRequest(cluster="lab", pod=ref)))
    for _ in range(200):  # the activity's own read of the pod is done: the eviction is on its way
        if any(e.get("verb") == "get" and e.get("name") == POD for e in await k8s.audit(since=since)):
            break
        await asyncio.sleep(0.02)
    await change()
    return await task


# answer -> (setup, expected status or the error type, whether the pod must still run after it)
CASES = {
    "201 accepted": ({}, "evicted", False),
    "200 accepted": ({"fault": (EVICTION, {"status": 200})}, "evicted", False),
    "404 while the pod runs": (
        {"fault": (EVICTION, {"status": 404, "reason": "NotFound"})},
        "KubernetesUnavailable",
        True,
    ),
    "409 budget write conflict": (
        {"pdb": {"minAvailable": 1}, "pods": 3, "fault": (BUDGET_WRITE, {"status": 409}, 20)},
        "blocked",
        True,
    ),
    "409 precondition while the pod runs": (
        {"fault": (EVICTION, {"status": 409, "reason": "Conflict", "message": PRECONDITION})},
        "blocked",
        True,
    ),
    "429 budget": ({"pdb": {"minAvailable": 1}}, "blocked", True),
    "429 rate limit with Retry-After": (
        {"fault": (EVICTION, {"status": 429, "retryAfterSeconds": 7})},
        "blocked",
        True,
    ),
    "403 namespace terminating": (
        {"fault": (EVICTION, {"status": 403, "reason": "Forbidden", "details": NAMESPACE_TERMINATING})},
        "blocked",
        True,
    ),
    "403 forbidden": ({"fault": (EVICTION, {"status": 403, "reason": "Forbidden"})}, "KubernetesRejected", True),
    "500 more than one budget": (
        {"pdb": {"maxUnavailable": 1}, "extra_pdb": True},
        "MultiplePodDisruptionBudgets",
        True,
    ),
    "500 internal error": ({"fault": (EVICTION, {"status": 500})}, "KubernetesUnavailable", True),
    "503 with Retry-After": (
        {"fault": (EVICTION, {"status": 503, "retryAfterSeconds": 3})},
        "KubernetesUnavailable",
        True,
    ),
    "504 timeout": ({"fault": (EVICTION, {"status": 504, "reason": "Timeout"})}, "KubernetesUnavailable", True),
    "dropped before it was served": ({"fault": (EVICTION, {"drop": "before"})}, "KubernetesUnavailable", True),
    "dropped after it was served": ({"fault": (EVICTION, {"drop": "after"})}, "evicted", False),
    "read fails first": ({"fault": (READ, {"status": 500})}, "KubernetesUnavailable", True),
    "read 404 for the path, not the pod": (
        {
            "fault": (
                READ,
                {
                    "status": 404,
                    "reason": "NotFound",
                    "details": {},
                    "message": "the server could not find the requested resource",
                },
            )
        },
        "KubernetesUnavailable",
        True,
    ),
}


@pytest.mark.parametrize("answer", list(CASES))
async def test_evict_pod_outcome_per_answer(answer, k8s, kube, core):
    setup, expected, still_running = CASES[answer]
    ref = await seeded(k8s, core, pdb=setup.get("pdb"), pods=setup.get("pods", 1))
    if setup.get("extra_pdb"):
        await k8s.seed(
            [
                {
                    "apiVersion": "policy/v1",
                    "kind": "PodDisruptionBudget",
                    "metadata": {"name": "second", "namespace": "apps"},
                    "spec": {"selector": {"matchLabels": {"app": "web"}}, "maxUnavailable": 1},
                }
            ]
        )
    if "fault" in setup:
        match, action, *count = setup["fault"]
        await k8s.add_fault(match, action, count[0] if count else 1)
    try:
        outcome = await ActivityEnvironment().run(kube.evict_pod, EvictRequest(cluster="lab", pod=ref))
    except ApplicationError as err:
        assert err.type == expected, f"{answer}: {err}"
        assert err.non_retryable == (expected in ("KubernetesRejected", "MultiplePodDisruptionBudgets")), answer
        if "Retry-After" in answer:
            assert err.next_retry_delay and err.next_retry_delay.total_seconds() == 3
    else:
        assert outcome.status == expected, f"{answer}: {outcome}"
        if answer == "409 budget write conflict":
            assert outcome.budget == "apps/web" and "the object has been modified" in outcome.message
        if answer == "429 budget":
            assert outcome.budget == "apps/web" and "needs 1 healthy pods" in outcome.message
        if answer == "429 rate limit with Retry-After":
            assert outcome.budget is None and outcome.retry_after_seconds == 7
    pod = await core.read_namespaced_pod(POD, "apps")
    assert pod.metadata.uid == ref.uid
    assert (pod.metadata.deletion_timestamp is None) == still_running, answer


async def test_gone_only_from_a_fresh_read(k8s, kube, core):
    """The real 404 and 409 for a pod deleted or replaced under the eviction: gone, as the read after shows."""
    ref = await seeded(k8s, core)
    deleted = await while_eviction_waits(k8s, kube, ref, lambda: delete_pod(k8s, core, ref))
    assert deleted.status == "gone" and "no such pod" in deleted.message
    ref = await seeded(k8s, core)
    replaced = await while_eviction_waits(k8s, kube, ref, lambda: replace_pod(k8s, core, ref))
    assert replaced.status == "gone" and "new UID" in replaced.message
    evictions = [e for e in await k8s.audit() if e.get("subresource") == "eviction"]
    assert [e["code"] for e in evictions] == [404, 409]  # what the API server answered each time
    # Before any eviction: a pod already terminating is waited for, not evicted again.
    ref = await seeded(k8s, core)
    await core.delete_namespaced_pod(POD, "apps")
    again = await ActivityEnvironment().run(kube.evict_pod, EvictRequest(cluster="lab", pod=ref))
    assert again.status == "evicted" and again.message == "pod is terminating"
    assert len([e for e in await k8s.audit() if e.get("subresource") == "eviction"]) == 2


async def test_cordon_and_uncordon_after_a_lost_answer(k8s, kube, core):
    await k8s.seed(objects())
    req = CordonRequest(cluster="lab", node="node-01", owner="run-1", reason="test")
    patch = {"verb": "patch", "resource": "nodes", "name": "node-01"}
    await k8s.add_fault(patch, {"drop": "after"})
    with pytest.raises(ApplicationError):
        await ActivityEnvironment().run(kube.cordon_node, req)
    held = await ActivityEnvironment().run(kube.cordon_node, req)  # the retry reads it back: ours
    assert held.owned
    since = await k8s.audit_cursor()
    await k8s.add_fault(patch, {"drop": "after"})
    env = ActivityEnvironment()
    beats: list = []
    env.on_heartbeat = lambda *d: beats.append(d[0] if d else None)
    with pytest.raises(ApplicationError):
        await env.run(kube.uncordon_node, req)
    retry = ActivityEnvironment()
    retry.info = dataclasses.replace(retry.info, attempt=2, heartbeat_details=[beats[-1]])
    done = await retry.run(kube.uncordon_node, req)
    assert done.uncordoned and "read back" in done.note
    node = await core.read_node("node-01")
    assert not node.spec.unschedulable and CORDONED_BY not in (node.metadata.annotations or {})
    writes = [e for e in await k8s.audit(since=since, writes=True) if e["resource"] == "nodes"]
    assert len(writes) == 1  # one uncordon, never a second


async def test_node_records_and_stage_jobs_after_a_lost_answer_are_read_back_not_redone(k8s, kube, core):
    await k8s.seed(objects())
    await k8s.configure(jobs={"defaultSeconds": 0.1, "rules": []})
    patch = {"verb": "patch", "resource": "nodes", "name": "node-01"}
    calls = [
        (
            kube.set_node_rollout_state,
            NodeRolloutState(cluster="lab", node="node-01", rollout="r1", state="in_progress"),
            patch,
        ),
        (
            kube.run_stage_job,
            StageJobRequest(
                cluster="lab",
                node="node-01",
                rollout="r1",
                package="p",
                version="1",
                image="img",
                stage="apply",
                timeout_seconds=60,
            ),
            {"verb": "create", "resource": "jobs"},
        ),
        (
            kube.finish_node_update,
            NodeUpdateFinish(cluster="lab", node="node-01", rollout="r1", packages={"p": "1"}, uncordon=False),
            patch,
        ),
    ]
    for method, arg, match in calls:
        since = await k8s.audit_cursor()
        await k8s.add_fault(match, {"drop": "after"})
        with pytest.raises(ApplicationError) as err:
            await ActivityEnvironment().run(method, arg)
        assert err.value.type == "KubernetesUnavailable" and not err.value.non_retryable
        retry = ActivityEnvironment()
        retry.info = dataclasses.replace(retry.info, attempt=2)
        result = await retry.run(method, arg)  # the retry (attempt 2): reads what the lost answer did
        if method == kube.run_stage_job:
            assert result.succeeded
        writes = [
            e
            for e in await k8s.audit(since=since, writes=True)
            if e["userAgent"].startswith("millwright") and e["resource"] in ("nodes", "jobs")
        ]
        assert len(writes) == 1, f"{method.__name__} wrote twice: {writes}"
    node = await core.read_node("node-01")
    assert node.metadata.labels[ROLLOUT_STATE_LABEL] == "complete"
    assert json.loads(node.metadata.annotations[PACKAGES_ANNOTATION]) == {"p": "1"}


async def test_a_vanished_stage_job_is_not_created_again(k8s, kube, core):
    from kubernetes.aio.client import BatchV1Api

    await k8s.seed(objects())
    await k8s.configure(jobs={"defaultSeconds": 30, "rules": []})
    req = StageJobRequest(
        cluster="lab",
        node="node-01",
        rollout="r1",
        package="p",
        version="1",
        image="img",
        stage="apply",
        timeout_seconds=60,
    )
    env = ActivityEnvironment()
    beats: list = []
    env.on_heartbeat = lambda *d: beats.append(d[0] if d else None)
    task = asyncio.create_task(env.run(kube.run_stage_job, req))
    for _ in range(200):
        if beats:
            break
        await asyncio.sleep(0.02)
    batch = BatchV1Api(core.api_client)
    await batch.delete_namespaced_job(beats[0]["job"], JOB_NAMESPACE, propagation_policy="Background")
    result = await task
    assert not result.succeeded and "disappeared" in result.message
    # A retry of that attempt (its heartbeat saw the Job) does not create it again either.
    retry = ActivityEnvironment()
    retry.info = dataclasses.replace(retry.info, attempt=2, heartbeat_details=[beats[0]])
    again = await retry.run(kube.run_stage_job, req)
    assert not again.succeeded and "not created again" in again.message
    creates = [e for e in await k8s.audit(writes=True) if e["resource"] == "jobs" and e["verb"] == "create"]
    assert len(creates) == 1


async def test_a_reboot_without_the_boot_id_before_it_is_unverifiable(k8s, kube):
    await k8s.seed(objects())
    with pytest.raises(ApplicationError) as err:
        await ActivityEnvironment().run(
            kube.wait_node_rebooted, RebootWait(cluster="lab", node="node-01", previous_boot_id="")
        )
    assert err.value.type == "RebootUnverifiable" and err.value.non_retryable
