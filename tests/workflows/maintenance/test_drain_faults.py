"""The drain under every answer the Kubernetes API can give, judged from the emulator's audit log.

The fault matrix injects each answer into each call of the drain path (the pod list for the plan,
the cordon, the eviction's read of the pod, the eviction, the final wait's reads) of a node's
update (NodeUpdate: cordon, drain, stage Jobs, a reboot), one node per answer, every node of a call
at once; a rollout then runs under eviction 409s, 500s and dropped answers. The property, from what
the API server saw: no node goes down (a reboot stage Job created for it, or NotReady) while a pod
the drain should have evicted is still on it; and no pod's eviction is accepted twice.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass
from datetime import timedelta

import pytest
import pytest_asyncio

from activities.kube.models import DrainSettings
from lab.fleet import Fleet
from tests.kube_helpers import declare_lab_budget
from tests.workers import settings_worker
from tests.workflows.maintenance.test_node_maintenance import record_history
from tests.workflows.rollout.helpers import (
    JOBS_FAST,
    REBOOT_SECONDS,
    accepted_evictions,
    max_unavailable,
    nodes_down_with_workload,
    rebooted,
    rollout_fleet,
    rollout_spec,
)
from workflows.budget.budget import Budget
from workflows.rollout.models import NodeUpdateInput, NodeUpdateTemplate, PackageStep
from workflows.rollout.node_update import NodeUpdate
from workflows.rollout.rollout import Rollout
from workflows.rollout.spec.packages import Interrupt

PRECONDITION = "Precondition failed: UID in precondition: 0000, UID in object meta: 1111"
NAMESPACE_TERMINATING = [
    {"reason": "NamespaceTerminating", "message": "namespace apps is being terminated", "field": "metadata.namespace"}
]
BUDGET_CAUSE = [
    {"reason": "DisruptionBudget", "message": "The disruption budget w needs 1 healthy pods and has 1 currently"}
]
PATH_NOT_FOUND = {
    "status": 404,
    "reason": "NotFound",
    "details": {},
    "message": "the server could not find the requested resource",
}

# A worker killed or an API failing under the workflows: replay what they wrote (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("replay_histories")


@dataclass(frozen=True)
class Case:
    answer: str
    action: dict | None = None  # the fault on the call under test; None: its plain answer
    count: int = 1
    pdbs: int = 0  # PodDisruptionBudgets over the node's pod: 1, or 2 (the eviction's 500)
    budget_write: bool = False  # the fault answers the eviction's own write of the budget, not the eviction
    outcome: str = "complete"


TRANSIENT = [
    Case("500", {"status": 500}),
    Case("503 Retry-After", {"status": 503, "retryAfterSeconds": 1}),
    Case("429 Retry-After", {"status": 429, "retryAfterSeconds": 1}),
    Case("dropped before", {"drop": "before"}),
    Case("dropped after", {"drop": "after"}),
]
MATRIX: dict[str, list[Case]] = {
    "eviction": [
        Case("201"),
        Case("200", {"status": 200}),
        Case("404 for a running pod", {"status": 404, "reason": "NotFound"}),
        Case("409 budget write conflict", {"status": 409}, count=20, pdbs=1, budget_write=True),
        Case("409 precondition failed", {"status": 409, "reason": "Conflict", "message": PRECONDITION}),
        Case(
            "429 budget",
            {
                "status": 429,
                "reason": "TooManyRequests",
                "details": {"causes": BUDGET_CAUSE},
                "message": "Cannot evict pod as it would violate the pod's disruption budget.",
            },
            count=2,
        ),
        Case("429 Retry-After", {"status": 429, "retryAfterSeconds": 1}),
        Case(
            "403 namespace terminating",
            {"status": 403, "reason": "Forbidden", "details": {"causes": NAMESPACE_TERMINATING}},
        ),
        Case("500 more than one budget", pdbs=2, outcome="erroring"),
        Case("500", {"status": 500}, count=2),
        Case("503 Retry-After", {"status": 503, "retryAfterSeconds": 1}),
        Case("504 Timeout", {"status": 504, "reason": "Timeout"}),
        Case("dropped before", {"drop": "before"}),
        Case("dropped after", {"drop": "after"}),
    ],
    "pod read": [*TRANSIENT, Case("404 for the path", PATH_NOT_FOUND)],
    "wait reads": [*TRANSIENT, Case("404 for the path", PATH_NOT_FOUND)],
    "plan list": [*TRANSIENT, Case("410 Expired", {"status": 410, "reason": "Expired"}), Case("504", {"status": 504})],
    "cordon": [*TRANSIENT, Case("409 Conflict", {"status": 409, "reason": "Conflict"})],
}


def target(call: str, node: str, pod: str, case: Case) -> tuple[dict, int]:
    """The fault's match for `call` on this node, and how many matching requests it lets through first."""
    if case.budget_write:
        return {"verb": "update", "resource": "poddisruptionbudgets", "subresource": "status", "name": pod_app(node)}, 0
    return {
        "eviction": ({"verb": "create", "resource": "pods", "subresource": "eviction", "name": pod}, 0),
        "pod read": ({"verb": "get", "resource": "pods", "name": pod}, 0),  # evict_pod's read comes first
        "wait reads": ({"verb": "get", "resource": "pods", "name": pod}, 1),  # then the final wait's
        "plan list": ({"verb": "list", "resource": "pods"}, 0),  # whichever drain lists first
        "cordon": ({"verb": "patch", "resource": "nodes", "name": node}, 1),  # after the rollout-state patch
    }[call]


def pod_app(node: str) -> str:
    return f"w-{node}"


def matrix_fleet(nodes: list[str], cases: list[Case]) -> list[dict]:
    """One node per case, each with its own one-pod ReplicaSet (and its PDBs), and a DaemonSet everywhere."""
    workloads: list[dict] = [
        {"name": "dcgm-exporter", "kind": "DaemonSet", "namespace": "gpu-operator", "labels": {"app": "dcgm"}}
    ]
    extra = []
    for node, case in zip(nodes, cases):
        app = pod_app(node)
        w: dict = {
            "name": app,
            "namespace": "apps",
            "labels": {"app": app},
            "nodes": [node],
            "terminationGracePeriodSeconds": 5,
        }
        if case.pdbs:
            w["pdb"] = {"maxUnavailable": 1}
        if case.pdbs > 1:
            extra.append(
                {
                    "apiVersion": "policy/v1",
                    "kind": "PodDisruptionBudget",
                    "metadata": {"name": f"{app}-second", "namespace": "apps"},
                    "spec": {"selector": {"matchLabels": {"app": app}}, "minAvailable": 0},
                }
            )
        workloads.append(w)
    fleet = Fleet.model_validate(
        {"cluster": "lab", "nodes": [{"name": n} for n in nodes], "workloads": workloads, "objects": extra}
    )
    return fleet.to_objects()


def template(rollout: str) -> NodeUpdateTemplate:
    return NodeUpdateTemplate(
        cluster="lab",
        rollout=rollout,
        packages=[PackageStep(name="kernel-tuning", version="1.2.0", image="registry.local/millwright/kernel-tuning")],
        interrupt=Interrupt(type="reboot"),
        drain=DrainSettings(timeout=timedelta(seconds=45), eviction_retry_interval=timedelta(milliseconds=200)),
        stage_retries=0,
        reboot_timeout=timedelta(seconds=30),
        disruption_budget=Budget(count=50),
    )


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def queue(client, kubeconfig_path):
    """One worker for the whole matrix."""
    async with settings_worker(client, kubeconfig_path, "drain-faults") as task_queue:
        yield task_queue


def assert_no_node_went_down_with_a_workload(audit: list[dict]) -> None:
    violations = nodes_down_with_workload(audit)
    assert not violations, "nodes went down with workload pods still on them:\n" + "\n".join(violations)
    twice = {pod: n for pod, n in accepted_evictions(audit).items() if n > 1}
    assert not twice, f"evictions accepted more than once: {twice}"


@pytest.mark.parametrize("call", list(MATRIX))
async def test_fault_matrix(call, client, queue, k8s, core):
    cases = MATRIX[call]
    nodes = [f"m-{i:02d}" for i in range(1, len(cases) + 1)]
    await k8s.seed(matrix_fleet(nodes, cases))
    await k8s.configure(jobs=JOBS_FAST, rebootSeconds=REBOOT_SECONDS)
    pods = {p.spec.node_name: p.metadata.name for p in (await core.list_namespaced_pod("apps")).items}
    since = await k8s.audit_cursor()
    for node, case in zip(nodes, cases):
        if case.action is not None:
            match, skip = target(call, node, pods[node], case)
            await k8s.add_fault(match, case.action, count=case.count, skip=skip)
    await declare_lab_budget(client, queue)  # every node of the call at once
    rollout = f"matrix-{uuid.uuid4().hex[:6]}"
    handles = [
        await client.start_workflow(
            NodeUpdate.run,
            NodeUpdateInput(node=node, ordinal=i, template=template(rollout)),
            id=f"{rollout}/{node}",
            task_queue=queue,
        )
        for i, node in enumerate(nodes)
    ]
    results = await asyncio.gather(*(h.result() for h in handles))
    audit = await k8s.audit(since=since)

    assert_no_node_went_down_with_a_workload(audit)
    for case, result in zip(cases, results):
        assert result.outcome == case.outcome, f"{call} answered {case.answer}: {result.outcome} {result.reason}"
    assert rebooted(audit) == {n for n, c in zip(nodes, cases) if c.outcome == "complete"}
    unfired = [f for f in await k8s.faults() if f["remaining"] != 0]
    assert not unfired, f"faults that never met their call: {unfired}"
    erroring = [r for r, c in zip(results, cases) if c.outcome == "erroring"]
    assert all("more than one PodDisruptionBudget" in r.reason for r in erroring)
    if call == "eviction":  # a drain blocked by a conflict, then waiting for every planned pod (patched)
        await record_history(
            handles[[c.answer for c in cases].index("409 budget write conflict")], "node_update_drain_conflict"
        )
    left = {p.metadata.name for p in (await core.list_namespaced_pod("apps")).items}
    for node, case in zip(nodes, cases):  # a drained node's pod is gone; the one the drain refused runs on
        assert (pods[node] in left) == (case.outcome != "complete"), f"{call} answered {case.answer}"


async def test_rollout_under_eviction_conflicts_errors_and_lost_answers_reboots_no_node_with_a_workload(
    client, queue, k8s, core
):
    members = {f"a-{i:02d}" for i in range(1, 5)}
    await k8s.seed(rollout_fleet({"a": 4}, web_pdb_min_available=2))
    await k8s.configure(jobs=JOBS_FAST, rebootSeconds=REBOOT_SECONDS)
    since = await k8s.audit_cursor()
    eviction = {"verb": "create", "resource": "pods", "subresource": "eviction"}
    # Faults meet evictions in this order: two 409s for a failed precondition, two 500s, two evictions served
    # with their answers lost (their budget writes let through), one dropped before it is served; then the
    # next two evictions served conflict on the budget write (20 tries each) and are answered its 409.
    await k8s.add_fault(
        {"verb": "update", "resource": "poddisruptionbudgets", "subresource": "status", "name": "web"},
        {"status": 409},
        count=40,
        skip=2,
    )
    await k8s.add_fault(eviction, {"status": 409, "reason": "Conflict", "message": PRECONDITION}, count=2)
    await k8s.add_fault(eviction, {"status": 500}, count=2)
    await k8s.add_fault(eviction, {"drop": "after"}, count=2)
    await k8s.add_fault(eviction, {"drop": "before"})
    policy = {"default": {"budget": {"count": 2}, "strategy": {"fixed": {"initialBatch": 2}}}}
    spec = rollout_spec("evictions-under-faults", policy=policy)
    await declare_lab_budget(client, queue)
    handle = await client.start_workflow(
        Rollout.run, spec, id=f"{spec.workflow_id()}-{uuid.uuid4().hex[:6]}", task_queue=queue
    )
    result = await handle.result()
    audit = await k8s.audit(since=since)

    assert result.outcome == "completed" and result.counts == {"complete": 4}, result
    assert_no_node_went_down_with_a_workload(audit)
    assert rebooted(audit) == members
    assert max_unavailable(audit, members) <= 2
    assert not [f for f in await k8s.faults() if f["remaining"] != 0], "every fault met an eviction"
    answered = [e["code"] for e in audit if e.get("subresource") == "eviction"]
    assert answered.count(409) == 4 and answered.count(500) == 2 and 0 in answered
