"""CRD bundles for the cluster-creation and tenancy simulators, and the admission checks those projects'
webhooks make.

* ``CAPI_CRDS``: Cluster API v1beta2 (core, kubeadm control plane and bootstrap) and Metal3 infrastructure,
  as a management cluster with `clusterctl init --infrastructure metal3` has them.
* ``KAI_CRDS``: KAI Scheduler's `Queue` (scheduling.run.ai/v2, cluster-scoped), `PodGroup` (scheduling.run.ai/v2alpha2,
  namespaced, short name `pg`: a gang, lab/k8s/controllers/kai.py) and `Topology` (kai.scheduler/v1alpha1,
  cluster-scoped), as KAI's chart installs them.
* ``TENANCY_CRDS``: KAI Scheduler `Queue`, Kyverno
  `ClusterPolicy`/`Policy` (kyverno.io/v1) and the Cluster API vCluster provider's `VCluster`
  (infrastructure.cluster.x-k8s.io/v1alpha1), as a workload cluster's add-ons install them.

Seed them through the admin API (`EmulatorAdmin.seed(CAPI_CRDS)`); a workload cluster the CAPI simulator
starts gets ``TENANCY_CRDS`` itself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .util import ApiError

if TYPE_CHECKING:
    from .resources import ResourceType
    from .store import Store

QUEUES = ("scheduling.run.ai", "queues")
POD_GROUPS = ("scheduling.run.ai", "podgroups")
VCLUSTERS = ("infrastructure.cluster.x-k8s.io", "vclusters")
CLUSTERS = ("cluster.x-k8s.io", "clusters")
MACHINES = ("cluster.x-k8s.io", "machines")
MACHINE_DEPLOYMENTS = ("cluster.x-k8s.io", "machinedeployments")
KCPS = ("controlplane.cluster.x-k8s.io", "kubeadmcontrolplanes")
METAL3_CLUSTERS = ("infrastructure.cluster.x-k8s.io", "metal3clusters")


def crd(
    group: str,
    kind: str,
    versions: list[str],
    *,
    namespaced: bool = True,
    plural: str | None = None,
    short_names: list[str] | None = None,
    categories: list[str] | None = None,
    printer_columns: dict[str, list[dict]] | None = None,
) -> dict:
    """A CRD with a schema that keeps every field; `printer_columns`: additionalPrinterColumns per version."""
    plural = plural or kind.lower() + "s"
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {
            "group": group,
            "scope": "Namespaced" if namespaced else "Cluster",
            "names": {
                "kind": kind,
                "plural": plural,
                "singular": kind.lower(),
                "listKind": f"{kind}List",
                **({"shortNames": short_names} if short_names else {}),
                **({"categories": categories} if categories else {}),
            },
            "versions": [
                {
                    "name": v,
                    "served": True,
                    "storage": i == len(versions) - 1,
                    "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
                    "subresources": {"status": {}},
                    **(
                        {"additionalPrinterColumns": (printer_columns or {})[v]} if v in (printer_columns or {}) else {}
                    ),
                }
                for i, v in enumerate(versions)
            ],
        },
    }


# `kubectl get clusters` columns of Cluster API v1beta2 (kubebuilder printcolumn markers of api/core/v1beta2 Cluster)
CLUSTER_COLUMNS_V1BETA2: list[dict] = [
    {
        "name": "ClusterClass",
        "type": "string",
        "jsonPath": ".spec.topology.classRef.name",
        "description": "ClusterClass of this Cluster, empty if the Cluster is not using a ClusterClass",
    },
    {
        "name": "Available",
        "type": "string",
        "jsonPath": '.status.conditions[?(@.type=="Available")].status',
        "description": "Cluster pass all availability checks",
    },
    {
        "name": "CP Desired",
        "type": "integer",
        "jsonPath": ".status.controlPlane.desiredReplicas",
        "description": "The desired number of control plane machines",
    },
    {
        "name": "CP Current",
        "type": "integer",
        "jsonPath": ".status.controlPlane.replicas",
        "description": "The number of control plane machines",
        "priority": 10,
    },
    {
        "name": "CP Ready",
        "type": "integer",
        "jsonPath": ".status.controlPlane.readyReplicas",
        "description": "The number of control plane machines with Ready condition true",
        "priority": 10,
    },
    {
        "name": "CP Available",
        "type": "integer",
        "jsonPath": ".status.controlPlane.availableReplicas",
        "description": "The number of control plane machines with Available condition true",
    },
    {
        "name": "CP Up-to-date",
        "type": "integer",
        "jsonPath": ".status.controlPlane.upToDateReplicas",
        "description": "The number of control plane machines with UpToDate condition true",
    },
    {
        "name": "W Desired",
        "type": "integer",
        "jsonPath": ".status.workers.desiredReplicas",
        "description": "The desired number of worker machines",
    },
    {
        "name": "W Current",
        "type": "integer",
        "jsonPath": ".status.workers.replicas",
        "description": "The number of worker machines",
        "priority": 10,
    },
    {
        "name": "W Ready",
        "type": "integer",
        "jsonPath": ".status.workers.readyReplicas",
        "description": "The number of worker machines with Ready condition true",
        "priority": 10,
    },
    {
        "name": "W Available",
        "type": "integer",
        "jsonPath": ".status.workers.availableReplicas",
        "description": "The number of worker machines with Available condition true",
    },
    {
        "name": "W Up-to-date",
        "type": "integer",
        "jsonPath": ".status.workers.upToDateReplicas",
        "description": "The number of worker machines with UpToDate condition true",
    },
    {
        "name": "Paused",
        "type": "string",
        "jsonPath": '.status.conditions[?(@.type=="Paused")].status',
        "description": "Reconciliation paused",
        "priority": 10,
    },
    {
        "name": "Phase",
        "type": "string",
        "jsonPath": ".status.phase",
        "description": "Cluster status such as Pending/Provisioning/Provisioned/Deleting/Failed",
    },
    {
        "name": "Age",
        "type": "date",
        "jsonPath": ".metadata.creationTimestamp",
        "description": "Time duration since creation of Cluster",
    },
    {
        "name": "Version",
        "type": "string",
        "jsonPath": ".spec.topology.version",
        "description": "Kubernetes version associated with this Cluster",
    },
]

CAPI_CRDS: list[dict] = [
    crd(
        "cluster.x-k8s.io",
        "Cluster",
        ["v1beta1", "v1beta2"],
        short_names=["cl"],
        categories=["cluster-api"],
        printer_columns={"v1beta2": CLUSTER_COLUMNS_V1BETA2},
    ),
    crd("cluster.x-k8s.io", "Machine", ["v1beta1", "v1beta2"], short_names=["ma"], categories=["cluster-api"]),
    crd(
        "cluster.x-k8s.io", "MachineDeployment", ["v1beta1", "v1beta2"], short_names=["md"], categories=["cluster-api"]
    ),
    crd("cluster.x-k8s.io", "ClusterClass", ["v1beta1", "v1beta2"], plural="clusterclasses", short_names=["cc"]),
    crd("controlplane.cluster.x-k8s.io", "KubeadmControlPlane", ["v1beta1", "v1beta2"], short_names=["kcp"]),
    crd("bootstrap.cluster.x-k8s.io", "KubeadmConfigTemplate", ["v1beta1", "v1beta2"]),
    crd("bootstrap.cluster.x-k8s.io", "KubeadmConfig", ["v1beta1", "v1beta2"]),
    crd("infrastructure.cluster.x-k8s.io", "Metal3Cluster", ["v1beta1"]),
    crd("infrastructure.cluster.x-k8s.io", "Metal3MachineTemplate", ["v1beta1"]),
]

QUEUE_CRD = crd("scheduling.run.ai", "Queue", ["v2"], namespaced=False)
KAI_CRDS: list[dict] = [
    QUEUE_CRD,
    crd("scheduling.run.ai", "PodGroup", ["v2alpha2"], short_names=["pg"]),
    crd("kai.scheduler", "Topology", ["v1alpha1"], namespaced=False, plural="topologies"),
]

TENANCY_CRDS: list[dict] = [
    QUEUE_CRD,
    crd("kyverno.io", "ClusterPolicy", ["v1"], namespaced=False, plural="clusterpolicies", short_names=["cpol"]),
    crd("kyverno.io", "Policy", ["v1"], plural="policies", short_names=["pol"]),
    crd("infrastructure.cluster.x-k8s.io", "VCluster", ["v1alpha1"]),
]


def _denied(webhook: str, rt: ResourceType, name: str, why: str) -> ApiError:
    details = {"name": name, "kind": rt.plural, "group": rt.group}
    return ApiError(400, f'admission webhook "{webhook}" denied the request: {why}', "BadRequest", details)


def admit(store: Store, rt: ResourceType, verb: str, obj: dict) -> None:
    """The validating webhooks of KAI (queues). Lock held; raises ApiError to deny."""
    if rt.key != QUEUES:
        return
    name = obj.get("metadata", {}).get("name", "")
    if verb in ("create", "update") and (obj.get("spec") or {}).get("resources") is None:
        raise _denied("queue-validation.kai.scheduler", rt, name, "resources must be specified")
    if verb == "delete" and (obj.get("status") or {}).get("childQueues"):
        raise _denied("queue-validation.kai.scheduler", rt, name, f"cannot delete queue {name}: it has child queues")
