"""CreateCluster: a workload cluster through Cluster API v1beta2 (Metal3 infrastructure).

Discovery check → who owns what exists of its objects (another workflow's or a person's is refused before the
first write, workflows/clusters/owners.py) → namespace, templates, Cluster, KubeadmControlPlane, MachineDeployments
(create-or-compare; a differing object is an error, never adopted) — or, with `topology`, one `Cluster` with
`spec.topology` against an installed, existing ClusterClass (the topology controller derives the rest) → wait
the way clusterctl does (status.initialization, ControlPlaneInitialized, Available, phase Provisioned, every
Machine with a nodeRef),
with "machines ready x of y" in the `progress` query and the current details → the kubeconfig Secret
checked and kept only as a reference → a baseline on the new cluster (namespaces, KAI default queues,
node labels) → optionally the cluster in NetBox, and its machines' devices assigned to it.

A run that fails undoes what it created, whichever attempt wrote it: every object it writes carries its owner
annotation with this run's ID (activities/capi/ownership.py `Ownership`), so compensation reads the clusters for
what this run owns (objects whose create answer was lost included) and deletes exactly those, the `Cluster` first (Cluster
API then removes its Machines and infrastructure), the rest in reverse creation order; what existed before the
run, or another run or a person owns, stays. The failure keeps its cause's type and lists what was created and
removed (workflows/common/saga.py). NetBox records are not undone.

Machines map to NetBox devices by name: a Machine's `status.nodeRef.name` (the node's hostname, which a
Metal3 host keeps from its BareMetalHost/NetBox device name). A machine whose device NetBox does not know is
reported in the result (`netbox.missing`), not a failure: the cluster exists whatever the inventory says.

The new cluster's reference, `<management>:<namespace>/<name>`, is what later workflows (OnboardTenant)
take as `cluster`; the worker's ClusterConnector resolves it through the kubeconfig Secret.

The objects come from workflows/clusters/manifests.py; DeleteCluster (workflows/clusters/delete_cluster.py) removes
a cluster this workflow made.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ApplicationError

from activities.capi.activities import ClusterApiActivities
from activities.capi.models import (
    ApplyRequest,
    ApplyResult,
    CapiClusterRef,
    CapiClusterStatus,
    DeleteRequest,
    DiscoveryRequest,
    KindRef,
    ListRequest,
    MachineNode,
    NodeLabels,
    ObjectRef,
    OwnersRequest,
    SecretCheck,
)
from activities.capi.ownership import MANAGED_BY, MANAGED_BY_LABEL, Ownership
from activities.netbox.activities import NetBoxActivities
from activities.netbox.models import AssignmentResult, ClusterAssignment, ClusterSpec, DeviceLookup
from workflows.clusters.manifests import CLUSTER_CLASS, GPU_CLASS_LABEL, baseline_objects, cluster_objects
from workflows.clusters.models import CreateClusterInput, CreateClusterResult, NetBoxRecord
from workflows.clusters.owners import not_ours
from workflows.common import saga
from workflows.common import search_attributes as sa
from workflows.common.base import Phases, Progress
from workflows.common.call_options import API_CALL, LONG_CALL
from workflows.common.endpoints import NETBOX, Endpoints, kubernetes_api
from workflows.common.errors import root_cause
from workflows.common.polls import PollDeadline

# Retired patches (docs/patch-policy.md), recorded deprecated: a failed CreateCluster undoes what the run owns (read
# from the clusters); whose the objects it would write are is read before the first write, another's refused.
COMPENSATION = "create-cluster-compensates"
OWNERS_FIRST = "create-cluster-checks-owners-first"
# The ready wait gives up when its timer fires, not by the clock of the task that reads the cluster
# (workflows/common/polls.py); runs from before keep the clock.
READY_WAIT_BY_TIMER = "create-cluster-ready-wait-by-timer"


@workflow.defn
class CreateCluster:
    @workflow.init
    def __init__(self, inp: CreateClusterInput) -> None:
        self._inp = inp
        self._phases = Phases()
        self._calls = Endpoints(inp.retry_timeout, shown=self._phases.waiting)

    @workflow.query(description="Phase and machines ready x of y.")
    def progress(self) -> Progress:
        return self._phases.progress

    @workflow.run
    async def run(self, inp: CreateClusterInput) -> CreateClusterResult:
        acts = ClusterApiActivities
        mgmt = inp.management_cluster
        owner, run = workflow.info().workflow_id, workflow.info().run_id
        workflow.upsert_search_attributes([sa.CLUSTER.value_set(inp.ref())])
        objs = cluster_objects(inp)
        base = baseline_objects()
        self._wrote: dict[str, ApplyResult | None] = {}  # cluster → what its apply reported (None: it failed)
        try:
            self._phases.enter("checking-providers", "discovery of the Cluster API kinds")
            extra = [
                KindRef(
                    api_version=f"{p.infrastructure.api_group}/{p.infrastructure.api_version}",
                    kind=p.infrastructure.kind,
                )
                for p in inp.worker_pools or []
                if p.infrastructure
            ]
            if inp.topology is not None:
                extra.append(CLUSTER_CLASS)
            await self._calls.execute(
                acts.check_kinds_installed,
                DiscoveryRequest(cluster=mgmt, kinds=KindRef.of_objects(objs) + extra),
                **API_CALL,
                endpoint=kubernetes_api(mgmt),
            )
            if inp.topology is not None:
                await self._check_cluster_class(inp)
            workflow.deprecate_patch(OWNERS_FIRST)
            await self._check_owners(inp, objs)
            self._phases.enter("creating", f"{len(objs)} objects")
            self._wrote[mgmt] = None
            applied = await self._calls.execute(
                acts.apply_objects,
                ApplyRequest(cluster=mgmt, owner=owner, run=run, objects=objs, on_difference="error"),
                **LONG_CALL,
                endpoint=kubernetes_api(mgmt),
            )
            self._wrote[mgmt] = applied
            status = await self._wait_ready(inp)
            self._phases.enter("kubeconfig", "checking the kubeconfig Secret")
            kubeconfig = await self._calls.execute(
                acts.check_secret,
                SecretCheck(cluster=mgmt, namespace=inp.namespace, name=f"{inp.name}-kubeconfig", key="value"),
                **API_CALL,
                endpoint=kubernetes_api(mgmt),
            )
            self._phases.enter("baseline", "namespaces, KAI queues, node labels")
            ref = inp.ref()
            await self._calls.execute(
                acts.check_kinds_installed,
                DiscoveryRequest(cluster=ref, kinds=KindRef.of_objects(base)),
                **API_CALL,
                endpoint=kubernetes_api(ref),
            )
            self._wrote[ref] = None
            self._wrote[ref] = await self._calls.execute(
                acts.apply_objects,
                ApplyRequest(cluster=ref, owner=owner, run=run, objects=base, on_difference="update"),
                **LONG_CALL,
                endpoint=kubernetes_api(ref),
            )
            for deployment, gpu_class in inp.node_classes():
                await self._calls.execute(
                    acts.label_nodes,
                    NodeLabels(
                        cluster=ref,
                        labels={GPU_CLASS_LABEL: gpu_class},
                        label_selector=f"cluster.x-k8s.io/deployment-name={deployment}",
                    ),
                    **API_CALL,
                    endpoint=kubernetes_api(ref),
                )
            netbox = await self._record_in_netbox(inp, status) if inp.record_in_netbox else None
        except Exception as err:
            if not self._wrote:  # nothing written
                self._phases.enter("failed", str(err))
                raise
            workflow.deprecate_patch(COMPENSATION)
            failure = await self._compensate(inp, objs, base, err)
            self._phases.enter("failed", failure.message)
            raise failure from err
        self._phases.enter("completed", f"{status.machines_ready} machines ready")
        return CreateClusterResult(
            cluster=ref,
            kubeconfig=kubeconfig.ref,
            created=[str(o.ref) for o in applied.outcomes if o.outcome == "created"],
            unchanged=[str(o.ref) for o in applied.outcomes if o.outcome == "unchanged"],
            machines=status.machines_total,
            baseline=[f"{o['kind']} {o['metadata']['name']}" for o in base],
            netbox=netbox,
        )

    async def _compensate(
        self, inp: CreateClusterInput, objs: list[dict], base: list[dict], err: BaseException
    ) -> ApplicationError:
        """Undo what this run created, read from the clusters (its ownership), and say what that was: the
        baseline on the workload cluster unless the Cluster itself goes, then the Cluster first and the rest of
        the management objects in reverse creation order. Each delete is of the very object this run owns."""
        why = root_cause(err)
        self._phases.enter("compensating", str(why))
        mine = Ownership(workflow=workflow.info().workflow_id, created_by=workflow.info().run_id)
        mgmt, ref = inp.management_cluster, inp.ref()
        made, listed = await self._owned(mgmt, objs, mine)
        cluster = next((r for r in made if r.kind == "Cluster"), None)
        created, removed = [str(r) for r in made], []
        if ref in self._wrote and cluster is None:  # with the Cluster, its workload cluster goes too
            on_ref, there = await self._owned(ref, base, mine)
            created += [f"{r} in {ref}" for r in on_ref]
            if on_ref:
                order = list(reversed(on_ref))
                done = await self._calls.execute(
                    ClusterApiActivities.delete_objects,
                    DeleteRequest(cluster=ref, objects=order, owned_by=mine),
                    **LONG_CALL,
                    endpoint=kubernetes_api(ref),
                )
                removed += [f"{r} in {ref}" for r in done.account(order, there)[0]]
        order = ([cluster] if cluster else []) + [r for r in reversed(made) if r is not cluster]
        if order:
            timeout = inp.ready_timeout + timedelta(minutes=10)  # Machines deprovision before the Cluster goes
            done = await self._calls.execute(
                ClusterApiActivities.delete_objects,
                DeleteRequest(cluster=mgmt, objects=order, owned_by=mine, timeout_seconds=timeout.total_seconds()),
                start_to_close_timeout=timeout + timedelta(minutes=1),
                heartbeat_timeout=timedelta(seconds=30),
                retry_policy=API_CALL["retry_policy"],
                endpoint=kubernetes_api(mgmt),
            )
            removed += [str(r) for r in done.account(order, listed)[0]]
        return saga.failure(f"creating cluster {ref}", err, created, removed)

    async def _owned(self, cluster: str, objs: list[dict], mine: Ownership) -> tuple[list[ObjectRef], list[ObjectRef]]:
        """What this run created in one cluster, in creation order (the objects carrying its ownership, read from
        the cluster, and those its apply reported created), and the part of it the listing found there."""
        listed = await self._calls.execute(
            ClusterApiActivities.list_objects,
            ListRequest(
                cluster=cluster,
                kinds=KindRef.of_objects(objs),
                owned_by=mine,
                label_selector=f"{MANAGED_BY_LABEL}={MANAGED_BY}",
            ),
            **API_CALL,
            endpoint=kubernetes_api(cluster),
        )
        applied = self._wrote.get(cluster)
        keys = {r.key() for r in listed + (applied.created() if applied else [])}
        return [r for r in map(ObjectRef.of, objs) if r.key() in keys], listed

    async def _check_owners(self, inp: CreateClusterInput, objs: list[dict]) -> None:
        """Refuse, before the first write, to adopt or overwrite what another workflow or a person owns."""
        self._phases.enter("checking-owners", f"{len(objs)} objects in {inp.management_cluster}")
        existing = await self._calls.execute(
            ClusterApiActivities.read_owners,
            OwnersRequest(cluster=inp.management_cluster, objects=[ObjectRef.of(o) for o in objs]),
            **API_CALL,
            endpoint=kubernetes_api(inp.management_cluster),
        )
        refused = not_ours(existing, workflow.info().workflow_id, inp.management_cluster, inp.field_of)
        if refused:
            raise ApplicationError(
                "; ".join(refused) + ". CreateCluster adopts nothing: choose another name or namespace, or remove "
                "the object first. Nothing was written",
                type="ObjectConflict",
                non_retryable=True,
            )

    async def _check_cluster_class(self, inp: CreateClusterInput) -> None:
        topo = inp.topology
        assert topo is not None
        where = topo.class_namespace or inp.namespace
        found = await self._calls.execute(
            ClusterApiActivities.list_objects,
            ListRequest(cluster=inp.management_cluster, kinds=[CLUSTER_CLASS]),
            **API_CALL,
            endpoint=kubernetes_api(inp.management_cluster),
        )
        if not any(o.name == topo.class_ and o.namespace == where for o in found):
            raise ApplicationError(
                f"topology.class: no ClusterClass {where}/{topo.class_} in cluster "
                f"{inp.management_cluster}; create it (or fix the name) first",
                type="ClusterClassNotFound",
                non_retryable=True,
            )

    async def _record_in_netbox(self, inp: CreateClusterInput, status: CapiClusterStatus) -> NetBoxRecord:
        """Upsert the cluster record and assign each machine's device (by node name); idempotent."""
        self._phases.enter("netbox", "recording the cluster and its machines")
        ref = inp.ref()
        record = await self._calls.execute(
            NetBoxActivities.upsert_cluster,
            ClusterSpec(name=inp.name, description=f"Cluster API {ref}, {status.machines_total} machines"),
            **API_CALL,
            endpoint=NETBOX,
        )
        machines: list[MachineNode] = await self._calls.execute(
            ClusterApiActivities.list_machines,
            CapiClusterRef(cluster=inp.management_cluster, namespace=inp.namespace, name=inp.name),
            **API_CALL,
            endpoint=kubernetes_api(inp.management_cluster),
        )
        nodes = sorted({m.node for m in machines if m.node})
        assigned = AssignmentResult(cluster=inp.name)
        if nodes:
            assigned = await self._calls.execute(
                NetBoxActivities.assign_devices_to_cluster,
                ClusterAssignment(cluster=inp.name, devices=[DeviceLookup(name=n) for n in nodes], missing_ok=True),
                **API_CALL,
                endpoint=NETBOX,
            )
        return NetBoxRecord(
            cluster=inp.name,
            cluster_created=record.created,
            assigned=assigned.assigned,
            already=assigned.already,
            missing=assigned.missing,
        )

    async def _wait_ready(self, inp: CreateClusterInput) -> CapiClusterStatus:
        ref = CapiClusterRef(cluster=inp.management_cluster, namespace=inp.namespace, name=inp.name)
        summary = f"cluster {inp.ref()} ready within {inp.ready_timeout}"
        with PollDeadline(inp.ready_timeout, READY_WAIT_BY_TIMER, summary) as deadline:
            while True:
                st = await self._calls.execute(
                    ClusterApiActivities.read_capi_cluster,
                    ref,
                    **API_CALL,
                    endpoint=kubernetes_api(inp.management_cluster),
                )
                self._phases.enter(
                    "provisioning",
                    f"phase {st.phase or '-'}, machines ready {st.machines_ready} of {st.machines_total}",
                    st.machines_ready,
                    st.machines_total,
                )
                if st.exists and st.ready():
                    return st
                if deadline.passed():
                    raise ApplicationError(
                        f"cluster {inp.ref()} not ready after {inp.ready_timeout}: phase {st.phase}, {st.message}",
                        type="ClusterNotReady",
                        non_retryable=True,
                    )
                await deadline.sleep(inp.poll_interval)
