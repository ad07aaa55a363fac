"""NodeWright v0.20's per-node behaviour in a rollout, on a real dev server against the Kubernetes emulator: explicit
uninstall and a refused downgrade, the runtime-required taint of new nodes, the DrainBlocked condition (as real
kubectl describes the node) and an Event per stage transition."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess

from kubernetes.aio.client import BatchV1Api, PolicyV1Api

from activities.kube.models import (
    CORDONED_BY,
    JOB_NAMESPACE,
    JOB_NODE_LABEL,
    PACKAGES_ANNOTATION,
    ROLLOUT_ANNOTATION,
    ROLLOUT_STATE_LABEL,
    NodeStage,
    NodeStages,
    PodRef,
    WaitPodsGoneRequest,
)
from activities.kube.node_marks import AUTO_TAINT_ANNOTATION, DRAIN_BLOCKED, RUNTIME_REQUIRED_TAINT
from tests.kube_helpers import read_node, wait_for
from tests.workflows.maintenance.test_node_maintenance import record_history
from tests.workflows.rollout.helpers import batch_handle, node_result, rollout_fleet, rollout_spec
from tests.workflows.rollout.test_kube_rollout_activities import env
from tests.workflows.rollout.test_rollout import lab_ready, start

BOTH_AT_ONCE = {"default": {"budget": {"count": 3}, "strategy": {"fixed": {"initialBatch": 3}}}}
AGENT = {
    "version": "0.9.0",
    "image": "registry.local/millwright/old-agent",
    "interrupt": {"type": "reboot"},
    "uninstall": {"enabled": True, "apply": True},
}


async def node_events(core, node: str) -> list[tuple[str, str, str]]:
    """(type, reason, message) of the node's Events in the order made (the emulator's resourceVersions grow)."""
    listed = await core.list_event_for_all_namespaces(
        field_selector=f"involvedObject.kind=Node,involvedObject.name={node}"
    )
    return [(e.type, e.reason, e.message) for e in sorted(listed.items, key=lambda e: int(e.metadata.resource_version))]


async def set_packages(core, node: str, packages: dict[str, str]) -> None:
    await core.patch_node(node, {"metadata": {"annotations": {PACKAGES_ANNOTATION: json.dumps(packages)}}})


def runtime_tainted(node) -> bool:
    return any(t.key == RUNTIME_REQUIRED_TAINT["key"] and t.value == RUNTIME_REQUIRED_TAINT["value"]
               and t.effect == "NoSchedule" for t in node.spec.taints or [])  # fmt: skip


async def test_uninstall_runs_its_lane_and_a_downgrade_is_refused(client, kube_worker, k8s, core):
    await lab_ready(k8s, rollout_fleet({"a": 2}))
    await set_packages(core, "a-01", {"kernel-tuning": "1.2.0", "old-agent": "0.8.1"})
    await set_packages(core, "a-02", {"kernel-tuning": "1.10.0"})  # later than the spec's 1.2.0 (semver, not text)
    boot = (await read_node(core, "a-01")).status.node_info.boot_id
    spec = rollout_spec(
        "uninstall",
        policy=BOTH_AT_ONCE,
        packages={
            "kernel-tuning": {"version": "1.2.0", "image": "registry.local/millwright/kernel-tuning"},
            "old-agent": AGENT,
        },
    )
    handle = await start(client, kube_worker, spec)
    result = await handle.result()
    assert result.counts == {"complete": 1, "erroring": 1}
    assert "downgrade refused: kernel-tuning 1.10.0 is installed, the rollout has 1.2.0" in result.problems["a-02"]

    # a-01: the uninstall lane only (kernel-tuning is current), with the old version's scripts and its reboot.
    child = await node_result(client, handle.id, "a-01")
    assert [(s.package, s.stage) for s in child.stages] == [
        ("old-agent", "uninstall"),
        ("old-agent", "uninstall-interrupt"),
    ]
    a01 = await read_node(core, "a-01")
    assert a01.status.node_info.boot_id != boot and not a01.spec.unschedulable
    assert json.loads(a01.metadata.annotations[PACKAGES_ANNOTATION]) == {"kernel-tuning": "1.2.0"}
    jobs = await BatchV1Api(core.api_client).list_namespaced_job(JOB_NAMESPACE, label_selector=f"{JOB_NODE_LABEL}=a-01")
    assert {j.spec.template.spec.containers[0].image for j in jobs.items} == {
        "registry.local/millwright/old-agent:0.8.1"
    }

    # a-02: refused before any write but its state: never cordoned, its packages as they were.
    a02 = await read_node(core, "a-02")
    assert not a02.spec.unschedulable and CORDONED_BY not in a02.metadata.annotations
    assert a02.metadata.labels[ROLLOUT_STATE_LABEL] == "erroring"
    assert "allowDowngrade" in json.loads(a02.metadata.annotations[ROLLOUT_ANNOTATION])["reason"]
    assert json.loads(a02.metadata.annotations[PACKAGES_ANNOTATION]) == {"kernel-tuning": "1.10.0"}

    # An Event per transition on a-01, in order; the refusal is a Warning on a-02.
    events = await node_events(core, "a-01")
    assert [reason for _, reason, _ in events] == ["State", "Drain", "Apply", "Interrupt", "Reboot", "State"]
    assert "old-agent 0.8.1 uninstall started" in events[2][2] and "uninstall-interrupt" in events[3][2]
    assert (
        events[-1][2].startswith("complete")
        and "old-agent uninstalled" in events[-1][2]
        and "uncordoned" in events[-1][2]
    )
    [(kind, reason, message)] = await node_events(core, "a-02")
    assert (kind, reason) == ("Warning", "State") and "downgrade refused" in message
    await record_history(await batch_handle(client, handle.id, "a-01"), "rollout_batch_hand_back_uninstall")

    # With allowDowngrade the same node takes the earlier version.
    again = rollout_spec(
        "downgrade",
        policy=BOTH_AT_ONCE,
        allowDowngrade=True,
        nodeSelectors={"matchLabels": {"kubernetes.io/hostname": "a-02"}},
        packages={"kernel-tuning": {"version": "1.2.0", "image": "registry.local/millwright/kernel-tuning"}},
    )
    assert (await (await start(client, kube_worker, again)).result()).counts == {"complete": 1}
    assert json.loads((await read_node(core, "a-02")).metadata.annotations[PACKAGES_ANNOTATION]) == {
        "kernel-tuning": "1.2.0"
    }


async def test_new_nodes_stay_tainted_until_their_packages_complete(client, kube_worker, k8s, core):
    await lab_ready(
        k8s,
        rollout_fleet({"a": 3}),
        [{"node": "a-02", "stage": "apply", "outcome": "fail", "message": "dkms build failed"}],
    )
    # a-01 registered with the taint (kubelet --register-with-taints); a-02 is new; a-03 has had a rollout before.
    await core.patch_node("a-01", {"spec": {"taints": [dict(RUNTIME_REQUIRED_TAINT)]}})
    await set_packages(core, "a-03", {"base": "1.0.0"})
    seen_tainted: set[str] = set()

    async def watch_taints():
        while True:
            for name in ("a-01", "a-02", "a-03"):
                if runtime_tainted(await read_node(core, name)):
                    seen_tainted.add(name)
            await asyncio.sleep(0.05)

    watcher = asyncio.ensure_future(watch_taints())
    try:
        spec = rollout_spec("gate", policy=BOTH_AT_ONCE, runtimeRequired=True, autoTaintNewNodes=True)
        result = await (await start(client, kube_worker, spec)).result()
    finally:
        watcher.cancel()
    assert result.counts == {"complete": 2, "erroring": 1}
    a01, a02, a03 = [await read_node(core, n) for n in ("a-01", "a-02", "a-03")]
    assert not runtime_tainted(a01) and not a01.spec.unschedulable  # complete: schedulable again
    # Failed: keeps the taint Millwright placed (and its cordon), with NodeWright's auto-taint annotation.
    assert runtime_tainted(a02) and a02.spec.unschedulable and a02.metadata.annotations[AUTO_TAINT_ANNOTATION]
    assert not runtime_tainted(a03) and "a-03" not in seen_tainted  # not new: never tainted
    assert "a-02" in seen_tainted and "a-01" in seen_tainted
    assert "runtime-required taint removed" in (await node_events(core, "a-01"))[-1][2]


async def test_drain_blocked_condition_appears_and_clears(client, kube_worker, k8s, core, kubeconfig_path, tmp_path):
    await lab_ready(k8s, rollout_fleet({"a": 1}, web_pdb_min_available=1))
    handle = await start(client, kube_worker, rollout_spec("drain-blocked"))

    async def drain_blocked():
        node = await read_node(core, "a-01")
        return next((c for c in node.status.conditions or [] if c.type == DRAIN_BLOCKED and c.status == "True"), None)

    cond = await wait_for(drain_blocked, what="DrainBlocked on a-01")
    assert cond.reason == "PodDisruptionBudget" and "apps/web" in cond.message
    assert any(c.type == "Ready" and c.status == "True" for c in (await read_node(core, "a-01")).status.conditions)
    if shutil.which("kubectl"):  # what an operator sees
        env = {**os.environ, "KUBECONFIG": str(kubeconfig_path), "HOME": str(tmp_path)}
        described = subprocess.run(["kubectl", "--context", "lab", "describe", "node", "a-01"], env=env, text=True,
                                   capture_output=True, timeout=60, check=True).stdout  # fmt: skip
        assert "DrainBlocked" in described and "PodDisruptionBudget" in described
        assert "DrainBlocked" in described.split("Events:")[1]
    await PolicyV1Api(core.api_client).patch_namespaced_pod_disruption_budget(
        "web", "apps", {"spec": {"minAvailable": 0}}
    )
    assert (await handle.result()).counts == {"complete": 1}
    node = await read_node(core, "a-01")
    [cond] = [c for c in node.status.conditions if c.type == DRAIN_BLOCKED]
    assert cond.status == "False"
    assert [r for _, r, _ in await node_events(core, "a-01")][:3] == ["State", "Drain", "DrainBlocked"]
    assert (await node_result(client, handle.id, "a-01")).outcome == "complete"


async def test_a_pod_not_leaving_shows_the_drain_blocked_until_it_goes(k8s, kube, core):
    await k8s.seed(rollout_fleet({"a": 1}))
    [pod] = (await core.list_namespaced_pod("apps", label_selector="app=web")).items
    await core.patch_namespaced_pod(pod.metadata.name, "apps", {"metadata": {"finalizers": ["example.com/hold"]}})
    await core.delete_namespaced_pod(pod.metadata.name, "apps", grace_period_seconds=0)
    ref = PodRef(namespace="apps", name=pod.metadata.name, uid=pod.metadata.uid)
    wait = asyncio.ensure_future(
        env().run(
            kube.wait_pods_gone,
            WaitPodsGoneRequest(
                cluster="lab", pods=[ref], node="a-01", not_leaving_after_seconds=0, poll_interval_seconds=0.1
            ),
        )
    )

    async def condition(status: str):
        node = await read_node(core, "a-01")
        assert node.status is not None
        return next((c for c in node.status.conditions or [] if c.type == DRAIN_BLOCKED and c.status == status), None)

    cond = await wait_for(lambda: condition("True"), what="DrainBlocked for a pod held by its finalizer")
    assert cond.reason == "PodNotTerminating" and f"apps/{pod.metadata.name}" in cond.message
    assert not wait.done()
    await core.patch_namespaced_pod(pod.metadata.name, "apps", {"metadata": {"finalizers": None}})
    assert await asyncio.wait_for(wait, 30) == 1
    assert (await condition("False")).reason == "Drained"
    [(kind, reason, _)] = await node_events(core, "a-01")
    assert (kind, reason) == ("Warning", DRAIN_BLOCKED)


async def test_two_reboots_on_one_node_each_need_a_new_boot_id(k8s, kube, core):
    """An uninstall's reboot, then the install's: the second must change the boot ID the first one left."""
    await lab_ready(k8s, rollout_fleet({"a": 1}))
    boot = (await read_node(core, "a-01")).status.node_info.boot_id
    reboot = {"interrupt": "reboot", "image": "registry.local/millwright/kernel", "timeout_seconds": 60}
    ran = await env().run(
        kube.run_node_stages,
        NodeStages(
            cluster="lab",
            node="a-01",
            rollout="rollout/lab/two-reboots",
            boot_id=boot,
            reboot_timeout_seconds=30,
            reboot_poll_seconds=0.1,
            stages=[
                NodeStage(package="old-agent", version="0.8.1", stage="uninstall-interrupt", **reboot),
                NodeStage(package="kernel", version="6.8.1", stage="interrupt", **reboot),
            ],
        ),
    )
    assert [(r.stage, r.succeeded) for r in ran.stages] == [("uninstall-interrupt", True), ("interrupt", True)]
    reboots = [m for _, reason, m in await node_events(core, "a-01") if reason == "Reboot"]
    assert len(reboots) == 2 and reboots[0].startswith("rebooted for old-agent 0.8.1 uninstall-interrupt")
    first, second = (m.rsplit(": boot ID ", 1)[1].split(" -> ") for m in reboots)
    assert first[0] == boot and second[0] == first[1] and second[1] != first[1]
    assert (await read_node(core, "a-01")).status.node_info.boot_id == second[1]
