"""The inputs and results of CreateCluster and DeleteCluster: a workload cluster's flat objects (worker pools) or
its ClusterClass topology, and what a run made, found and recorded.

Both workflows of one cluster have the ID `cluster/<management>:<namespace>/<name>` (`workflow_id`), the one the
owner annotation of every object CreateCluster writes carries: DeleteCluster deletes what that ID manages.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from pydantic import ConfigDict, Field, field_validator, model_validator
from temporalio.common import SearchAttributePair

from activities.capi.models import ObjectRef
from activities.kube.validators import validate_object_name
from activities.models import BaseUrl, Host, StrictModel
from workflows.clusters.owners import validate_cluster_namespace
from workflows.common import search_attributes as sa
from workflows.common.base import WorkflowInput
from workflows.common.endpoints import RetryTimeout


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
    def _unique(self) -> ClusterTopology:
        names = [m.name for m in self.workers.machine_deployments]
        if len(names) != len(set(names)):
            raise ValueError("workers.machineDeployments: names must be unique")
        return self


class ClusterWorkflowInput(WorkflowInput, RetryTimeout):
    """The cluster a workflow is about: its reference, and from it the workflow ID and search attribute, the same
    for CreateCluster and DeleteCluster. Each input declares these fields' defaults and checks itself."""

    management_cluster: str
    namespace: str
    name: str

    def ref(self) -> str:
        return f"{self.management_cluster}:{self.namespace}/{self.name}"

    def workflow_id(self) -> str:
        return f"cluster/{self.ref()}"

    def search_attributes(self) -> list[SearchAttributePair]:
        return [SearchAttributePair(sa.CLUSTER, self.ref())]


class CreateClusterInput(ClusterWorkflowInput):
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
    _system = field_validator("namespace")(validate_cluster_namespace)

    @field_validator("control_plane_replicas")
    @classmethod
    def _odd(cls, v: int) -> int:
        if v % 2 == 0:
            raise ValueError("must be odd (etcd quorum)")
        return v

    @model_validator(mode="after")
    def _one_shape(self) -> CreateClusterInput:
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

    def field_of(self, ref: ObjectRef) -> str:
        """The input field an object's name comes from, for a refusal."""
        if ref.kind == "Namespace":
            return "namespace"
        for i, pool in enumerate(self.worker_pools or []):
            if ref.name == f"{self.name}-{pool.name}":
                return f"worker_pools[{i}].name"
        return "name"

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


class DeleteClusterInput(ClusterWorkflowInput):
    management_cluster: str = "lab"
    namespace: str = "fleet"
    name: str
    force: bool = Field(False, description="Delete even while tenants are onboarded.")
    timeout: timedelta = timedelta(hours=1)


class DeleteClusterResult(StrictModel):
    cluster: str
    tenants_left: list[str]
    deleted: list[str]
    kept: list[str] = Field(
        default_factory=list,
        description="Labelled for the cluster but not managed by its workflows (a person's template): left alone.",
    )
