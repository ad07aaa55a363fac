"""Compensation by ownership: runs whose create answers are lost (the write done, the connection dropped) and
which then fail leave nothing behind, never touch what a person or another run owns, and report exactly what
they created and removed. Judged from the emulator's dumps (every kind back to its snapshot) and its faults."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from temporalio.client import WorkflowFailureError

from activities.capi.models import ObjectRef
from activities.capi.ownership import OWNER_ANNOTATION, Ownership
from lab.k8s.crds import CAPI_CRDS, TENANCY_CRDS
from tests.workflows.tenancy.test_tenants import _cause, parent_queue
from workflows.clusters.create_cluster import CreateCluster
from workflows.clusters.manifests import cluster_objects
from workflows.clusters.models import CreateClusterInput, WorkerPool
from workflows.tenancy.models import OnboardTenantInput, QueueQuota
from workflows.tenancy.objects import tenant_steps
from workflows.tenancy.onboarding import OnboardTenant

# Lost answers under the sagas: replay what they wrote (tests/conftest.py).
pytestmark = [
    pytest.mark.asyncio(loop_scope="session"),
    pytest.mark.timeout(300),
    pytest.mark.usefixtures("replay_histories"),
]

TENANT_RESOURCES = [
    ("", "namespaces"),
    ("scheduling.run.ai", "queues"),
    ("", "resourcequotas"),
    ("", "limitranges"),
    ("rbac.authorization.k8s.io", "rolebindings"),
    ("networking.k8s.io", "networkpolicies"),
    ("kyverno.io", "clusterpolicies"),
    ("infrastructure.cluster.x-k8s.io", "vclusters"),
]
CLUSTER_RESOURCES = [
    ("", "namespaces"),
    ("infrastructure.cluster.x-k8s.io", "metal3clusters"),
    ("infrastructure.cluster.x-k8s.io", "metal3machinetemplates"),
    ("bootstrap.cluster.x-k8s.io", "kubeadmconfigtemplates"),
    ("cluster.x-k8s.io", "clusters"),
    ("controlplane.cluster.x-k8s.io", "kubeadmcontrolplanes"),
    ("cluster.x-k8s.io", "machinedeployments"),
]


def snapshot(dump: list[dict]) -> dict[tuple[str, str, str], str]:
    """Every object (Events aside) → its UID: the same keys and UIDs mean nothing was added, removed or replaced."""
    return {
        (o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"]): o["metadata"].get("uid", "")
        for o in dump
        if o["kind"] != "Event"
    }


async def drop_create_answers(k8s, resources: list[tuple[str, str]]) -> None:
    """The first create of each resource is carried out, then its connection dropped before the answer."""
    for group, resource in resources:
        await k8s.add_fault({"verb": "create", "group": group, "resource": resource}, {"drop": "after"})


async def assert_faults_hit(k8s) -> None:
    assert [f["match"] for f in await k8s.faults() if f["remaining"]] == [], "every injected fault was hit"


async def fail(client, worker, wf, inp):
    h = await client.start_workflow(wf, inp, id=inp.workflow_id(), task_queue=worker.task_queue)
    with pytest.raises(WorkflowFailureError) as exc:
        await h.result()
    return _cause(exc.value)


def _shared_objects(tenant: str) -> list[dict]:
    """What exists before the onboarding and is not its own: the tenant's second namespace, made by a person
    exactly as onboarding wants it, and in it a NetworkPolicy an earlier run of the tenant's workflow created."""
    labels = {"millwright.dev/tenant": tenant}
    earlier = Ownership(workflow=f"tenant/lab/{tenant}", created_by="an-earlier-run", written_by="an-earlier-run")
    return [
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": f"{tenant}-shared", "labels": {**labels, "kai.scheduler/queue": tenant}},
        },
        {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": {
                "name": "default-deny",
                "namespace": f"{tenant}-shared",
                "labels": {**labels, "app.kubernetes.io/managed-by": "millwright"},
                "annotations": {OWNER_ANNOTATION: earlier.annotation()},
            },
            "spec": {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]},
        },
    ]


@pytest.mark.parametrize("failure", ["after-the-last-step", "inside-a-step"])
async def test_onboarding_with_lost_create_answers_leaves_nothing(client, k8s, tenant_worker, failure):
    tenant = f"lost-{uuid.uuid4().hex[:5]}"
    nss = [tenant, f"{tenant}-shared"] + ([f"{tenant}-b"] if failure == "inside-a-step" else [])
    inp = OnboardTenantInput(
        tenant=tenant,
        cluster="lab",
        namespaces=nss,
        gpu=QueueQuota(quota=0, limit=0),
        admin_group=f"{tenant}-admins",
        record_in_netbox=False,
    )
    await k8s.seed(TENANCY_CRDS + parent_queue() + _shared_objects(tenant))
    before = snapshot(await k8s.dump())
    if failure == "after-the-last-step":  # every kind's create answer lost; then pruning is refused for good
        await drop_create_answers(k8s, TENANT_RESOURCES)
        await k8s.add_fault({"verb": "list", "resource": "limitranges"}, {"status": 403, "message": "injected"})
    else:  # the first namespace's answer lost, then the third refused: the step itself fails, with no result
        await drop_create_answers(k8s, TENANT_RESOURCES[:1])
        await k8s.add_fault({"verb": "create", "resource": "namespaces"}, {"status": 403, "message": "injected"})

    err = await fail(client, tenant_worker, OnboardTenant.run, inp)
    assert err.type == "OnboardingFailed" and "injected" in str(err), err
    await assert_faults_hit(k8s)
    assert snapshot(await k8s.dump()) == before, "every kind back to its snapshot"

    report = err.details[0]
    theirs = {("Namespace", "", f"{tenant}-shared"), ("NetworkPolicy", f"{tenant}-shared", "default-deny")}
    desired = [ObjectRef.of(o) for _, objs in tenant_steps(inp) for o in objs]
    ours = [str(r) for r in desired if (r.kind, r.namespace or "", r.name) not in theirs]
    assert report["created"] == (ours if failure == "after-the-last-step" else [f"Namespace {tenant}"]), report
    assert report["removed"] == list(reversed(report["created"])), report


async def test_cluster_creation_with_lost_create_answers_is_undone(client, k8s, tenant_worker):
    """The Cluster's and a template's create answers lost, then the wait for the cluster refused for good (its
    Machines cannot be listed): the run removes all it created (the Cluster first, Cluster API deprovisioning
    its Machines, then the rest in reverse order), and the namespace a person made stays."""
    await k8s.seed([*CAPI_CRDS, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "fleet"}}])
    before = snapshot(await k8s.dump())
    # Two, not all: the creates share one activity, whose retry backoff doubles with each lost answer.
    await drop_create_answers(k8s, [r for r in CLUSTER_RESOURCES if r[1] in ("metal3machinetemplates", "clusters")])
    await k8s.add_fault(
        {"verb": "list", "group": "cluster.x-k8s.io", "resource": "machines"}, {"status": 403, "message": "injected"}
    )
    inp = CreateClusterInput(
        name=f"lost-{uuid.uuid4().hex[:5]}",
        control_plane_replicas=1,
        worker_pools=[WorkerPool(name="gpu", replicas=1)],
        poll_interval=timedelta(seconds=0.3),
    )
    err = await fail(client, tenant_worker, CreateCluster.run, inp)
    assert err.type == "KubernetesRejected" and "injected" in str(err), err
    await assert_faults_hit(k8s)
    assert snapshot(await k8s.dump()) == before, "every kind back to its snapshot"

    report = err.details[0]
    ours = [str(ObjectRef.of(o)) for o in cluster_objects(inp)][1:]  # all but the person's namespace
    assert report["created"] == ours, report
    cluster = f"Cluster fleet/{inp.name}"
    assert report["removed"] == [cluster] + [r for r in reversed(ours) if r != cluster], report


async def test_compensation_waits_out_an_api_visibly_and_gives_up_at_the_bound(client, k8s, tenant_worker):
    """The undo's own calls are bounded like every other call: a cluster that answers 503 to every delete while
    onboarding undoes itself fails the run with EndpointUnavailable naming the cluster, after `retry_timeout`; what
    it could not undo stays, carrying the run's ownership, for a re-run or a person."""
    tenant = f"stuck-{uuid.uuid4().hex[:5]}"
    inp = OnboardTenantInput(tenant=tenant, cluster="lab", namespaces=[tenant, f"{tenant}-b"],
                             gpu=QueueQuota(quota=0, limit=0), record_in_netbox=False,
                             retry_timeout=timedelta(seconds=4))  # fmt: skip
    await k8s.seed(TENANCY_CRDS + parent_queue())
    await k8s.add_fault({"verb": "create", "resource": "namespaces"}, {"status": 403, "message": "injected"}, skip=1)
    await k8s.add_fault({"verb": "delete"}, {"status": 503, "message": "injected outage"}, count=-1)
    err = await fail(client, tenant_worker, OnboardTenant.run, inp)
    assert err.type == "EndpointUnavailable" and "Kubernetes API of cluster lab" in str(err), err
    assert "injected outage" in str(err) and "retry_timeout is 4s" in str(err), err
    left = [o for o in await k8s.dump() if o["kind"] == "Namespace" and o["metadata"]["name"] == tenant]
    assert left and OWNER_ANNOTATION in left[0]["metadata"]["annotations"]
