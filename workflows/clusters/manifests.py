"""The objects of a workload cluster, as CreateCluster writes them: Cluster API v1beta2 with Metal3
infrastructure (flat objects, or one `Cluster` with `spec.topology` against a ClusterClass), and the baseline
every new cluster gets (a system namespace, KAI's default queues and the tenants' parent queue).

Every builder is pure: the same input gives the same objects, in creation order.
"""

from __future__ import annotations

from activities.capi.models import KindRef
from workflows.clusters.models import CreateClusterInput

CAPI = "cluster.x-k8s.io/v1beta2"
KCP = "controlplane.cluster.x-k8s.io/v1beta2"
BOOTSTRAP = "bootstrap.cluster.x-k8s.io/v1beta2"
METAL3 = "infrastructure.cluster.x-k8s.io/v1beta1"
QUEUE_API = "scheduling.run.ai/v2"
GPU_CLASS_LABEL = "millwright.dev/gpu-class"
TENANTS_PARENT_QUEUE = "tenants"
CLUSTER_CLASS = KindRef(api_version=CAPI, kind="ClusterClass")
# Templates a Cluster's deletion leaves behind (not owned by it): DeleteCluster removes them after it is gone.
TEMPLATE_KINDS = [
    KindRef(api_version=METAL3, kind="Metal3MachineTemplate"),
    KindRef(api_version=BOOTSTRAP, kind="KubeadmConfigTemplate"),
    KindRef(api_version=KCP, kind="KubeadmControlPlane"),
    KindRef(api_version=CAPI, kind="MachineDeployment"),
    KindRef(api_version=METAL3, kind="Metal3Cluster"),
]


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
