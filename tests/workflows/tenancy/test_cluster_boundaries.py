"""What CreateCluster and DeleteCluster refuse before any write (docs/clusters-and-tenants.md, "What cluster
workflows refuse"): an object of the cluster's name that another workflow or a person owns, a tenant's namespace,
a system namespace. Judged from the Kubernetes emulator's audit log and object dumps."""

from __future__ import annotations

import copy
import uuid

import pytest
from pydantic import ValidationError

from activities.capi.ownership import OWNER_ANNOTATION, Ownership
from lab.k8s.crds import CAPI_CRDS
from tests.workflows.maintenance.test_node_maintenance import record_history
from tests.workflows.tenancy.test_compensation import fail, snapshot
from workflows.clusters.create_cluster import CreateCluster
from workflows.clusters.delete_cluster import DeleteCluster
from workflows.clusters.manifests import CAPI, cluster_objects
from workflows.clusters.models import CreateClusterInput, DeleteClusterInput, WorkerPool

pytestmark = pytest.mark.timeout(300)


def owned(obj: dict, workflow: str | None) -> dict:
    """A copy of `obj` as another workflow (or, with None, a person) left it."""
    obj = copy.deepcopy(obj)
    if workflow is not None:
        notes = obj["metadata"].setdefault("annotations", {})
        notes[OWNER_ANNOTATION] = Ownership(workflow=workflow, created_by="r1", written_by="r1").annotation()
    return obj


async def millwright_writes(k8s, since: int) -> list[str]:
    return [
        f"{e['verb']} {e['resource']} {e.get('name', '')}"
        for e in await k8s.audit(since=since, writes=True)
        if "millwright" in e.get("userAgent", "")
    ]


def test_system_namespaces_are_refused_at_the_edge():
    for ns in ("kube-system", "kube-public", "kube-node-lease", "millwright-system"):
        with pytest.raises(ValidationError) as err:
            CreateClusterInput(name="gpu-a", namespace=ns, worker_pools=[WorkerPool(name="gpu", replicas=1)])
        assert "namespace" in str(err.value) and "system namespace" in str(err.value)


async def test_create_cluster_adopts_nothing_and_refuses_before_its_first_write(client, k8s, tenant_worker):
    name = f"taken-{uuid.uuid4().hex[:5]}"
    inp = CreateClusterInput(name=name, worker_pools=[WorkerPool(name="gpu", replicas=1)])
    objs = {o["kind"]: o for o in cluster_objects(inp)}
    cases = [  # (what exists, the field named, its owner as named)
        ([owned(objs["Cluster"], None)], "name: Cluster fleet/" + name, "not created by Millwright"),
        ([owned(objs["MachineDeployment"], "cluster/lab:fleet/other")], f"worker_pools[0].name: MachineDeployment "
         f"fleet/{name}-gpu", "managed by cluster/lab:fleet/other"),
        ([owned(objs["Namespace"], "tenant/lab/nlp")], "namespace: Namespace fleet", "managed by tenant/lab/nlp"),
    ]  # fmt: skip
    for there, field, whose in cases:
        await k8s.reset()
        await k8s.seed(CAPI_CRDS + there)
        before, cursor = snapshot(await k8s.dump()), await k8s.audit_cursor()
        err = await fail(client, tenant_worker, CreateCluster.run, inp)
        assert err.type == "ObjectConflict" and err.non_retryable, err
        assert f"{field} exists in cluster lab, {whose}" in str(err) and "Nothing was written" in str(err), err
        assert await millwright_writes(k8s, cursor) == [] and snapshot(await k8s.dump()) == before
        if field.startswith("name"):
            await record_history(client.get_workflow_handle(inp.workflow_id()), "create_cluster_refused_owner")
    # A person's namespace holds the cluster (the Namespace is shared, not adopted).
    await k8s.reset()
    await k8s.seed([*CAPI_CRDS, owned(objs["Namespace"], None)])
    h = await client.start_workflow(CreateCluster.run, inp, id=inp.workflow_id(), task_queue=tenant_worker.task_queue)
    await h.result()


async def test_delete_cluster_refuses_a_cluster_it_did_not_make_before_anything(client, k8s, tenant_worker):
    name = f"theirs-{uuid.uuid4().hex[:5]}"
    theirs = {"apiVersion": CAPI, "kind": "Cluster", "metadata": {"name": name, "namespace": "fleet"}, "spec": {}}
    for workflow, whose in ((None, "not created by Millwright"), ("tenant/lab/x", "managed by tenant/lab/x")):
        await k8s.reset()
        await k8s.seed([*CAPI_CRDS, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "fleet"}}, owned(theirs, workflow)])  # fmt: skip
        before, cursor = snapshot(await k8s.dump()), await k8s.audit_cursor()
        err = await fail(client, tenant_worker, DeleteCluster.run, DeleteClusterInput(name=name, force=True))
        assert err.type == "ClusterNotManaged" and err.non_retryable, err
        assert f"name: Cluster fleet/{name} exists in cluster lab, {whose}" in str(err), err
        assert "Nothing was deleted" in str(err)
        assert await millwright_writes(k8s, cursor) == [] and snapshot(await k8s.dump()) == before
        if workflow is None:
            handle = client.get_workflow_handle(DeleteClusterInput(name=name).workflow_id())
            await record_history(handle, "delete_cluster_refused_owner")
