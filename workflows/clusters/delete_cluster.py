"""DeleteCluster: removes a workload cluster that CreateCluster (workflows/clusters/create_cluster.py) made.

Refuses a Cluster another workflow or a person owns, before anything else (workflows/clusters/owners.py), and
while tenants are onboarded (unless forced); deletes the Cluster and waits for its
finalizer (Cluster API removes Machines, control plane and infrastructure in order), then the templates. It
deletes only what its cluster's workflows manage (the owner annotation's workflow ID, `cluster/<reference>`):
a Cluster made by other means is refused (`ClusterNotManaged`), a template a person made is kept and reported.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ApplicationError

from activities.capi.activities import ClusterApiActivities
from activities.capi.models import (
    CapiClusterRef,
    DeleteRequest,
    KindRef,
    ListRequest,
    ObjectRef,
    OwnersRequest,
)
from activities.capi.ownership import TENANT_LABEL, Ownership
from workflows.clusters.manifests import CAPI, QUEUE_API, TEMPLATE_KINDS
from workflows.clusters.models import DeleteClusterInput, DeleteClusterResult
from workflows.clusters.owners import not_ours
from workflows.common import search_attributes as sa
from workflows.common.base import Phases, Progress
from workflows.common.call_options import API_CALL, LONG_CALL
from workflows.common.endpoints import Endpoints, kubernetes_api

# The Cluster's owner is read first: another's is refused naming it, before anything else is read or deleted. A
# retired patch (docs/patch-policy.md), recorded deprecated.
OWNER_FIRST = "delete-cluster-checks-owner-first"


@workflow.defn
class DeleteCluster:
    @workflow.init
    def __init__(self, inp: DeleteClusterInput) -> None:
        self._phases = Phases()
        self._calls = Endpoints(inp.retry_timeout, shown=self._phases.waiting)

    @workflow.query(description="Phase of the deletion.")
    def progress(self) -> Progress:
        return self._phases.progress

    @workflow.run
    async def run(self, inp: DeleteClusterInput) -> DeleteClusterResult:
        acts = ClusterApiActivities
        ref, mgmt = inp.ref(), inp.management_cluster
        workflow.upsert_search_attributes([sa.CLUSTER.value_set(ref)])
        ours = Ownership(workflow=workflow.info().workflow_id)  # CreateCluster's and ours: the same ID
        target = ObjectRef(api_version=CAPI, kind="Cluster", name=inp.name, namespace=inp.namespace)
        workflow.deprecate_patch(OWNER_FIRST)
        self._phases.enter("checking-owner", str(target))
        existing = await self._calls.execute(
            acts.read_owners, OwnersRequest(cluster=mgmt, objects=[target]), **API_CALL,
            endpoint=kubernetes_api(mgmt),
        )  # fmt: skip
        refused = not_ours(existing, ours.workflow, mgmt, lambda _: "name")
        if refused:
            self._phases.enter("failed", refused[0])
            raise ApplicationError(
                f"{refused[0]}: DeleteCluster deletes only a Cluster that CreateCluster made for this reference; "
                "delete it with clusterctl or kubectl. Nothing was deleted",
                type="ClusterNotManaged",
                non_retryable=True,
            )
        self._phases.enter("checking-tenants")
        status = await self._calls.execute(
            acts.read_capi_cluster,
            CapiClusterRef(cluster=mgmt, namespace=inp.namespace, name=inp.name),
            **API_CALL,
            endpoint=kubernetes_api(mgmt),
        )
        tenants: list[str] = []
        if status.exists and status.control_plane_initialized:
            queues = await self._calls.execute(
                acts.list_objects,
                ListRequest(
                    cluster=ref, kinds=[KindRef(api_version=QUEUE_API, kind="Queue")], label_selector=TENANT_LABEL
                ),
                **API_CALL,
                endpoint=kubernetes_api(ref),
            )
            tenants = sorted(q.name for q in queues)
        if tenants and not inp.force:
            self._phases.enter("failed", f"tenants still onboarded: {', '.join(tenants)}")
            raise ApplicationError(
                f"cluster {ref} still has tenants onboarded ({', '.join(tenants)}): offboard them first, or set force",
                type="TenantsOnboarded",
                non_retryable=True,
            )
        self._phases.enter("deleting", "Cluster (Machines, control plane, infrastructure follow)")
        deleted = await self._calls.execute(
            acts.delete_objects,
            DeleteRequest(cluster=mgmt, objects=[target], owned_by=ours, timeout_seconds=inp.timeout.total_seconds()),
            start_to_close_timeout=inp.timeout + timedelta(minutes=1),
            heartbeat_timeout=timedelta(seconds=30),
            retry_policy=API_CALL["retry_policy"],
            endpoint=kubernetes_api(mgmt),
        )
        if deleted.kept:
            self._phases.enter("failed", f"{target} is not managed by {ours.workflow}")
            raise ApplicationError(
                f"{target} in {mgmt} is not managed by {ours.workflow} (it was not created by "
                "CreateCluster for this reference); delete it with clusterctl or kubectl",
                type="ClusterNotManaged",
                non_retryable=True,
            )
        self._phases.enter("deleting-templates")
        leftovers = await self._calls.execute(
            acts.list_objects,
            ListRequest(cluster=mgmt, kinds=TEMPLATE_KINDS, label_selector=f"cluster.x-k8s.io/cluster-name={inp.name}"),
            **API_CALL,
            endpoint=kubernetes_api(mgmt),
        )
        more = await self._calls.execute(
            acts.delete_objects,
            DeleteRequest(cluster=mgmt, objects=leftovers, owned_by=ours),
            **LONG_CALL,
            endpoint=kubernetes_api(mgmt),
        )
        self._phases.enter("completed")
        # What existed and is gone (read before the deletes), not what the delete answers said.
        templates, kept = more.account(leftovers, leftovers)
        gone = ([target] if status.exists or deleted.deleted else []) + templates
        return DeleteClusterResult(
            cluster=ref, tenants_left=tenants, deleted=[str(r) for r in gone], kept=[str(r) for r in kept]
        )
