"""CreateCluster and DeleteCluster: workload clusters through Cluster API v1beta2 (Metal3 infrastructure).

CreateCluster: discovery check → namespace, templates, Cluster, KubeadmControlPlane, MachineDeployments
(create-or-compare; a differing object is an error, never adopted) — or, with `topology`, one `Cluster` with
`spec.topology` against an installed, existing ClusterClass (the topology controller derives the rest) → wait the way clusterctl does
(status.initialization, ControlPlaneInitialized, Available, phase Provisioned, every Machine with a nodeRef),
with "machines ready x of y" in the `progress` query and the current details → the kubeconfig Secret
checked and kept only as a reference → a baseline on the new cluster (namespaces, KAI default queues,
node labels) → optionally the cluster in NetBox, and its machines' devices assigned to it.

A run that fails undoes what it created, whichever attempt wrote it: every object it writes carries its owner
annotation with this run's ID (activities/capi/ownership.py `Ownership`), so compensation reads the clusters for what this
run owns (objects whose create answer was lost included) and deletes exactly those, the `Cluster` first (Cluster
API then removes its Machines and infrastructure), the rest in reverse creation order; what existed before the
run, or another run or a person owns, stays. The failure keeps its cause's type and lists what was created and
removed (workflows/common/saga.py). NetBox records are not undone.

Machines map to NetBox devices by name: a Machine's `status.nodeRef.name` (the node's hostname, which a
Metal3 host keeps from its BareMetalHost/NetBox device name). A machine whose device NetBox does not know is
reported in the result (`netbox.missing`), not a failure: the cluster exists whatever the inventory says.

The new cluster's reference, `<management>:<namespace>/<name>`, is what later workflows (OnboardTenant)
take as `cluster`; the worker's ClusterConnector resolves it through the kubeconfig Secret.

DeleteCluster: refuses while tenants are onboarded (unless forced), deletes the Cluster and waits for its
finalizer (Cluster API removes Machines, control plane and infrastructure in order), then the templates. It
deletes only what its cluster's workflows manage (the owner annotation's workflow ID, `cluster/<reference>`):
a Cluster made by other means is refused (`ClusterNotManaged`), a template a person made is kept and reported.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from pydantic import ConfigDict, Field, field_validator, model_validator
from temporalio import workflow
from temporalio.common import SearchAttributePair
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
    SecretCheck,
)
from activities.capi.ownership import MANAGED_BY, MANAGED_BY_LABEL, TENANT_LABEL, Ownership
from activities.kube.validators import validate_object_name
from activities.models import BaseUrl, Host, StrictModel
from activities.netbox.activities import NetBoxActivities
from activities.netbox.models import AssignmentResult, ClusterAssignment, ClusterSpec, DeviceLookup
from workflows.common import saga
from workflows.common import search_attributes as sa
from workflows.common.base import Phases, Progress, WorkflowInput
from workflows.common.call_options import API_CALL, LONG_CALL
from workflows.common.endpoints import NETBOX, Endpoints, RetryTimeout, kubernetes_api
from workflows.common.errors import root_cause

CAPI = "cluster.x-k8s.io/v1beta2"
KCP = "controlplane.cluster.x-k8s.io/v1beta2"
BOOTSTRAP = "bootstrap.cluster.x-k8s.io/v1beta2"
METAL3 = "infrastructure.cluster.x-k8s.io/v1beta1"
QUEUE_API = "scheduling.run.ai/v2"
GPU_CLASS_LABEL = "millwright.dev/gpu-class"
TENANTS_PARENT_QUEUE = "tenants"
CLUSTER_CLASS = KindRef(api_version=CAPI, kind="ClusterClass")
# A failed CreateCluster undoes what the run owns (read from the clusters); before, it left everything.
COMPENSATION = "create-cluster-compensates"


class InfrastructureTemplate(StrictModel):
    """A machine template that already exists (another provider), by reference."""

    api_group: str = "infrastructure.cluster.x-k8s.io"
    api_version: str = Field("v1beta1", description="Its version, for the discovery check.")
    kind: str
    name: str


class WorkerPool(StrictModel):
    name: str = Field(description="MachineDeployment suffix: <cluster>-<name>.")
    replicas: int = Field(ge=0)
    gpu_node_class: str = Field("h100-sxm", description="Label millwright.dev/gpu-class on the pool's nodes.")
    gpus_per_node: int = Field(8, ge=0)
    infrastructure: InfrastructureTemplate | None = Field(
        None, description="Existing machine template; unset creates a Metal3MachineTemplate from `image_url`."
    )

    _name = field_validator("name")(validate_object_name)


class _Topo(StrictModel):
    """Cluster API's own field names (camelCase, `class`) in the topology input."""

    model_config = ConfigDict(populate_by_name=True)


class TopologyControlPlane(_Topo):
    replicas: int = Field(3, ge=1)

    @field_validator("replicas")
    @classmethod
    def _odd(cls, v: int) -> int:
        if v % 2 == 0:
            raise ValueError("must be odd (etcd quorum)")
        return v


class TopologyMachineDeployment(_Topo):
    class_: str = Field(alias="class", description="Worker class of the ClusterClass.")
    name: str = Field(description="Topology name; the MachineDeployment is <cluster>-<name>.")
    replicas: int = Field(ge=0)
    gpu_node_class: str | None = Field(
        None, alias="gpuNodeClass", description="Label millwright.dev/gpu-class on these nodes (unset: none)."
    )
    gpus_per_node: int = Field(8, ge=0, alias="gpusPerNode")

    _name = field_validator("name")(validate_object_name)


class TopologyWorkers(_Topo):
    machine_deployments: list[TopologyMachineDeployment] = Field(default_factory=list, alias="machineDeployments")


class TopologyVariable(_Topo):
    name: str = Field(min_length=1)
    value: Any


class ClusterTopology(_Topo):
    """`Cluster.spec.topology` (v1beta2): a ClusterClass and what varies per cluster."""

    class_: str = Field(alias="class", description="Name of the ClusterClass.")
    class_namespace: str | None = Field(
        None, alias="classNamespace", description="Its namespace; unset: the Cluster's namespace."
    )
    version: str = "v1.34.1"
    control_plane: TopologyControlPlane = Field(default_factory=TopologyControlPlane, alias="controlPlane")
    workers: TopologyWorkers = Field(default_factory=TopologyWorkers)
    variables: list[TopologyVariable] = Field(default_factory=list)

    _class = field_validator("class_")(validate_object_name)

    @model_validator(mode="after")
    def _unique(self) -> "ClusterTopology":
        names = [m.name for m in self.workers.machine_deployments]
        if len(names) != len(set(names)):
            raise ValueError("workers.machineDeployments: names must be unique")
        return self


class CreateClusterInput(WorkflowInput, RetryTimeout):
    """Create a workload cluster from burnt-in servers through Cluster API: flat objects (`worker_pools`,
    `control_plane_replicas`, `kubernetes_version`) or a ClusterClass (`topology`), exactly one of the two."""

    management_cluster: str = Field("lab", description="Kubeconfig context of the Cluster API management cluster.")
    namespace: str = Field("fleet", description="Namespace of the Cluster API objects.")
    name: str
    kubernetes_version: str = "v1.34.1"
    control_plane_replicas: int = Field(3, ge=1)
    worker_pools: list[WorkerPool] | None = Field(None, description="Flat objects; exclusive with `topology`.")
    topology: ClusterTopology | None = Field(
        None, description="A ClusterClass with topology variables; exclusive with `worker_pools`."
    )
    control_plane_endpoint: Host = Field("10.0.0.10", description="Metal3Cluster controlPlaneEndpoint host.")
    image_url: BaseUrl = "http://images.lab/ubuntu-24.04-k8s-v1.34.qcow2"
    image_checksum: str = "http://images.lab/ubuntu-24.04-k8s-v1.34.qcow2.sha256sum"
    record_in_netbox: bool = Field(
        False, description="Record the cluster in NetBox and assign its machines' devices to it (needs the bootstrap)."
    )
    ready_timeout: timedelta = timedelta(hours=1)
    poll_interval: timedelta = timedelta(seconds=2)

    _names = field_validator("namespace", "name")(validate_object_name)

    @field_validator("control_plane_replicas")
    @classmethod
    def _odd(cls, v: int) -> int:
        if v % 2 == 0:
            raise ValueError("must be odd (etcd quorum)")
        return v

    @model_validator(mode="after")
    def _one_shape(self) -> "CreateClusterInput":
        if self.topology is not None and self.worker_pools is not None:
            raise ValueError("topology: give either worker_pools (flat objects) or topology (ClusterClass), not both")
        if self.topology is None and not self.worker_pools:
            raise ValueError("worker_pools: at least one pool is required unless topology is given")
        if self.topology is not None:
            # Flat-only fields must keep their defaults (a serialized input carries them, so "set" is not enough).
            flat = [
                f
                for f in ("kubernetes_version", "control_plane_replicas")
                if getattr(self, f) != type(self).model_fields[f].default
            ]
            if flat:
                raise ValueError(f"{flat[0]}: with topology, set topology.version / topology.controlPlane.replicas")
        return self

    def ref(self) -> str:
        return f"{self.management_cluster}:{self.namespace}/{self.name}"

    def workflow_id(self) -> str:
        return f"cluster/{self.ref()}"

    def search_attributes(self) -> list[SearchAttributePair]:
        return [SearchAttributePair(sa.CLUSTER, self.ref())]

    def node_classes(self) -> list[tuple[str, str]]:
        """(MachineDeployment name, GPU node class) of every worker group that gets the class label."""
        if self.topology is not None:
            return [
                (f"{self.name}-{m.name}", m.gpu_node_class)
                for m in self.topology.workers.machine_deployments
                if m.gpu_node_class
            ]
        return [(f"{self.name}-{p.name}", p.gpu_node_class) for p in self.worker_pools or []]


class NetBoxRecord(StrictModel):
    """What CreateCluster wrote to NetBox."""

    cluster: str
    cluster_created: bool
    assigned: list[str] = Field(default_factory=list, description="Devices assigned to the cluster by this run.")
    already: list[str] = Field(default_factory=list, description="Devices already in the cluster.")
    missing: list[str] = Field(
        default_factory=list,
        description="Machines (node names) with no NetBox device of that name: reported, not a failure.",
    )


class CreateClusterResult(StrictModel):
    cluster: str = Field(description="The reference later workflows take: <management>:<namespace>/<name>.")
    kubeconfig: str = Field(description="Where the kubeconfig is (a secret reference, never its content).")
    created: list[str]
    unchanged: list[str]
    machines: int
    baseline: list[str]
    netbox: NetBoxRecord | None = None


CLUSTER_NETWORK = {
    "pods": {"cidrBlocks": ["192.168.0.0/16"]},
    "services": {"cidrBlocks": ["10.128.0.0/12"]},
    "serviceDomain": "cluster.local",
}


def topology_objects(inp: CreateClusterInput) -> list[dict]:
    """A ClusterClass cluster: its namespace and one `Cluster` with `spec.topology` (v1beta2 `classRef`)."""
    topo = inp.topology
    assert topo is not None
    mds = []
    for m in topo.workers.machine_deployments:
        md: dict = {"class": m.class_, "name": m.name, "replicas": m.replicas}
        ann = {"millwright.dev/gpus-per-node": str(m.gpus_per_node)}
        if m.gpu_node_class:
            ann["millwright.dev/gpu-class"] = m.gpu_node_class
        md["metadata"] = {"annotations": ann}
        mds.append(md)
    spec: dict = {
        "classRef": {"name": topo.class_, "namespace": topo.class_namespace or inp.namespace},
        "version": topo.version,
        "controlPlane": {"replicas": topo.control_plane.replicas},
        "workers": {"machineDeployments": mds},
    }
    if topo.variables:
        spec["variables"] = [{"name": v.name, "value": v.value} for v in topo.variables]
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": inp.namespace}},
        {
            "apiVersion": CAPI,
            "kind": "Cluster",
            "metadata": {
                "name": inp.name,
                "namespace": inp.namespace,
                "labels": {"cluster.x-k8s.io/cluster-name": inp.name},
            },
            "spec": {"clusterNetwork": CLUSTER_NETWORK, "topology": spec},
        },
    ]


def cluster_objects(inp: CreateClusterInput) -> list[dict]:
    """The Cluster API objects of a cluster, in creation order (flat, or a ClusterClass topology)."""
    if inp.topology is not None:
        return topology_objects(inp)
    ns, name = inp.namespace, inp.name
    labels = {"cluster.x-k8s.io/cluster-name": name}

    def meta(n: str, annotations: dict | None = None) -> dict:
        m: dict = {"name": n, "namespace": ns, "labels": dict(labels)}
        if annotations:
            m["annotations"] = annotations
        return m

    def m3_template(n: str) -> dict:
        return {
            "apiVersion": METAL3,
            "kind": "Metal3MachineTemplate",
            "metadata": meta(n),
            "spec": {
                "nodeReuse": False,
                "template": {
                    "spec": {
                        "image": {
                            "url": inp.image_url,
                            "checksum": inp.image_checksum,
                            "checksumType": "sha256",
                            "format": "qcow2",
                        },
                        "automatedCleaningMode": "metadata",
                    }
                },
            },
        }

    objs: list[dict] = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
        {
            "apiVersion": METAL3,
            "kind": "Metal3Cluster",
            "metadata": meta(name),
            "spec": {
                "controlPlaneEndpoint": {"host": inp.control_plane_endpoint, "port": 6443},
                "cloudProviderEnabled": False,
            },
        },
        m3_template(f"{name}-cp"),
    ]
    pools = inp.worker_pools or []
    for pool in pools:
        md = f"{name}-{pool.name}"
        if pool.infrastructure is None:
            objs.append(m3_template(md))
        objs.append(
            {
                "apiVersion": BOOTSTRAP,
                "kind": "KubeadmConfigTemplate",
                "metadata": meta(md),
                "spec": {
                    "template": {
                        "spec": {
                            "joinConfiguration": {
                                "nodeRegistration": {
                                    "kubeletExtraArgs": [
                                        {"name": "node-labels", "value": f"{GPU_CLASS_LABEL}={pool.gpu_node_class}"}
                                    ]
                                }
                            }
                        }
                    }
                },
            }
        )
    objs.append(
        {
            "apiVersion": CAPI,
            "kind": "Cluster",
            "metadata": meta(name),
            "spec": {
                "clusterNetwork": CLUSTER_NETWORK,
                "controlPlaneRef": {
                    "apiGroup": "controlplane.cluster.x-k8s.io",
                    "kind": "KubeadmControlPlane",
                    "name": f"{name}-cp",
                },
                "infrastructureRef": {
                    "apiGroup": "infrastructure.cluster.x-k8s.io",
                    "kind": "Metal3Cluster",
                    "name": name,
                },
            },
        }
    )
    objs.append(
        {
            "apiVersion": KCP,
            "kind": "KubeadmControlPlane",
            "metadata": meta(f"{name}-cp"),
            "spec": {
                "replicas": inp.control_plane_replicas,
                "version": inp.kubernetes_version,
                "machineTemplate": {
                    "spec": {
                        "infrastructureRef": {
                            "apiGroup": "infrastructure.cluster.x-k8s.io",
                            "kind": "Metal3MachineTemplate",
                            "name": f"{name}-cp",
                        }
                    }
                },
                "kubeadmConfigSpec": {"clusterConfiguration": {}, "initConfiguration": {}, "joinConfiguration": {}},
            },
        }
    )
    for pool in pools:
        md = f"{name}-{pool.name}"
        infra = pool.infrastructure
        infra_ref = (
            {"apiGroup": infra.api_group, "kind": infra.kind, "name": infra.name}
            if infra
            else {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "Metal3MachineTemplate", "name": md}
        )
        selector = {"cluster.x-k8s.io/cluster-name": name, "cluster.x-k8s.io/deployment-name": md}
        objs.append(
            {
                "apiVersion": CAPI,
                "kind": "MachineDeployment",
                "metadata": meta(
                    md,
                    {
                        "millwright.dev/gpus-per-node": str(pool.gpus_per_node),
                        "millwright.dev/gpu-class": pool.gpu_node_class,
                    },
                ),
                "spec": {
                    "clusterName": name,
                    "replicas": pool.replicas,
                    "selector": {"matchLabels": selector},
                    "template": {
                        "metadata": {"labels": selector},
                        "spec": {
                            "clusterName": name,
                            "version": inp.kubernetes_version,
                            "bootstrap": {
                                "configRef": {
                                    "apiGroup": "bootstrap.cluster.x-k8s.io",
                                    "kind": "KubeadmConfigTemplate",
                                    "name": md,
                                }
                            },
                            "infrastructureRef": infra_ref,
                        },
                    },
                },
            }
        )
    return objs


def _queue(name: str, parent: str | None = None) -> dict:
    unlimited = {"quota": -1, "limit": -1, "overQuotaWeight": 1}
    spec: dict = {"resources": {"gpu": dict(unlimited), "cpu": dict(unlimited), "memory": dict(unlimited)}}
    if parent:
        spec["parentQueue"] = parent
    return {"apiVersion": QUEUE_API, "kind": "Queue", "metadata": {"name": name}, "spec": spec}


def baseline_objects() -> list[dict]:
    """What every new workload cluster gets: system namespace, KAI's default queues and the tenants' parent."""
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "millwright-system"}},
        _queue("default-parent-queue"),
        _queue("default-queue", "default-parent-queue"),
        _queue(TENANTS_PARENT_QUEUE),
    ]


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
            if not self._wrote or not workflow.patched(COMPENSATION):  # nothing written, or an older run
                self._phases.enter("failed", str(err))
                raise
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
                done = await workflow.execute_activity_method(
                    ClusterApiActivities.delete_objects,
                    DeleteRequest(cluster=ref, objects=order, owned_by=mine),
                    **LONG_CALL,
                )
                removed += [f"{r} in {ref}" for r in done.account(order, there)[0]]
        order = ([cluster] if cluster else []) + [r for r in reversed(made) if r is not cluster]
        if order:
            timeout = inp.ready_timeout + timedelta(minutes=10)  # Machines deprovision before the Cluster goes
            done = await workflow.execute_activity_method(
                ClusterApiActivities.delete_objects,
                DeleteRequest(cluster=mgmt, objects=order, owned_by=mine, timeout_seconds=timeout.total_seconds()),
                start_to_close_timeout=timeout + timedelta(minutes=1),
                heartbeat_timeout=timedelta(seconds=30),
                retry_policy=API_CALL["retry_policy"],
            )
            removed += [str(r) for r in done.account(order, listed)[0]]
        return saga.failure(f"creating cluster {ref}", err, created, removed)

    async def _owned(self, cluster: str, objs: list[dict], mine: Ownership) -> tuple[list[ObjectRef], list[ObjectRef]]:
        """What this run created in one cluster, in creation order (the objects carrying its ownership, read from
        the cluster, and those its apply reported created), and the part of it the listing found there."""
        listed = await workflow.execute_activity_method(
            ClusterApiActivities.list_objects,
            ListRequest(
                cluster=cluster,
                kinds=KindRef.of_objects(objs),
                owned_by=mine,
                label_selector=f"{MANAGED_BY_LABEL}={MANAGED_BY}",
            ),
            **API_CALL,
        )
        applied = self._wrote.get(cluster)
        keys = {r.key() for r in listed + (applied.created() if applied else [])}
        return [r for r in map(ObjectRef.of, objs) if r.key() in keys], listed

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
        deadline = workflow.now() + inp.ready_timeout
        ref = CapiClusterRef(cluster=inp.management_cluster, namespace=inp.namespace, name=inp.name)
        while True:
            st = await self._calls.execute(
                ClusterApiActivities.read_capi_cluster, ref, **API_CALL, endpoint=kubernetes_api(inp.management_cluster)
            )
            self._phases.enter(
                "provisioning",
                f"phase {st.phase or '-'}, machines ready {st.machines_ready} of {st.machines_total}",
                st.machines_ready,
                st.machines_total,
            )
            if st.exists and st.ready():
                return st
            if workflow.now() >= deadline:
                raise ApplicationError(
                    f"cluster {inp.ref()} not ready after {inp.ready_timeout}: phase {st.phase}, {st.message}",
                    type="ClusterNotReady",
                    non_retryable=True,
                )
            await workflow.sleep(inp.poll_interval)


class DeleteClusterInput(WorkflowInput, RetryTimeout):
    management_cluster: str = "lab"
    namespace: str = "fleet"
    name: str
    force: bool = Field(False, description="Delete even while tenants are onboarded.")
    timeout: timedelta = timedelta(hours=1)

    def ref(self) -> str:
        return f"{self.management_cluster}:{self.namespace}/{self.name}"

    def workflow_id(self) -> str:
        return f"cluster/{self.ref()}"

    def search_attributes(self) -> list[SearchAttributePair]:
        return [SearchAttributePair(sa.CLUSTER, self.ref())]


class DeleteClusterResult(StrictModel):
    cluster: str
    tenants_left: list[str]
    deleted: list[str]
    kept: list[str] = Field(
        default_factory=list,
        description="Labelled for the cluster but not managed by its workflows (a person's template): left alone.",
    )


# Templates a Cluster's deletion leaves behind (not owned by it), removed after it is gone.
TEMPLATE_KINDS = [
    KindRef(api_version=METAL3, kind="Metal3MachineTemplate"),
    KindRef(api_version=BOOTSTRAP, kind="KubeadmConfigTemplate"),
    KindRef(api_version=KCP, kind="KubeadmControlPlane"),
    KindRef(api_version=CAPI, kind="MachineDeployment"),
    KindRef(api_version=METAL3, kind="Metal3Cluster"),
]


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
        ours = Ownership(workflow=workflow.info().workflow_id)  # CreateCluster's and ours: the same ID
        target = ObjectRef(api_version=CAPI, kind="Cluster", name=inp.name, namespace=inp.namespace)
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
