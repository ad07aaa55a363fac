"""The objects onboarding writes for a tenant, step by step, and the kinds its workflows manage.

Namespaces → KAI `Queue` → ResourceQuota + LimitRange → RBAC for the identity group → default-deny
NetworkPolicy → Kyverno policy (queue label + `schedulerName: kai-scheduler` on every tenant pod) → vCluster
(a declarative `VCluster` object). Every object carries the tenant label; onboarding records the InfiniBand
fabric on the tenant's KAI queue (annotation `millwright.dev/ib-fabric`), so offboarding finds it and releases
the PKey when the tenant holds one.
"""

from __future__ import annotations

from activities.capi.models import KindRef, ObjectRef
from activities.capi.ownership import TENANT_LABEL
from workflows.clusters.manifests import QUEUE_API
from workflows.tenancy.models import OnboardTenantInput, QueueQuota, TenantRef

QUEUE_LABEL = "kai.scheduler/queue"
KAI_SCHEDULER = "kai-scheduler"
VCLUSTER_API = "infrastructure.cluster.x-k8s.io/v1alpha1"
GPU_CAP = "requests.nvidia.com/gpu"
IB_FABRIC_ANNOTATION = "millwright.dev/ib-fabric"  # on the tenant's Queue: the fabric holding its PKey

# Every kind onboarding writes, in creation order; offboarding and compensation go in reverse.
TENANT_KINDS: list[KindRef] = [
    KindRef(api_version="v1", kind="Namespace"),
    KindRef(api_version=QUEUE_API, kind="Queue"),
    KindRef(api_version="v1", kind="ResourceQuota"),
    KindRef(api_version="v1", kind="LimitRange"),
    KindRef(api_version="rbac.authorization.k8s.io/v1", kind="RoleBinding"),
    KindRef(api_version="networking.k8s.io/v1", kind="NetworkPolicy"),
    KindRef(api_version="kyverno.io/v1", kind="ClusterPolicy"),
    KindRef(api_version=VCLUSTER_API, kind="VCluster"),
]
_KIND_ORDER = {k.kind: i for i, k in enumerate(TENANT_KINDS)}


def _labels(inp: TenantRef) -> dict[str, str]:
    return {TENANT_LABEL: inp.tenant}


def tenant_steps(inp: OnboardTenantInput) -> list[tuple[str, list[dict]]]:
    """The desired objects, step by step (pure: the workflow computes it deterministically)."""
    t, nss = inp.tenant, inp.all_namespaces()
    lab = _labels(inp)
    notes = {"millwright.dev/contacts": ",".join(inp.contacts)} if inp.contacts else {}
    steps: list[tuple[str, list[dict]]] = []
    steps.append(
        (
            "namespaces",
            [
                {
                    "apiVersion": "v1",
                    "kind": "Namespace",
                    "metadata": {
                        "name": ns,
                        "labels": {**lab, QUEUE_LABEL: t},
                        **({"annotations": notes} if notes else {}),
                    },
                }
                for ns in nss
            ],
        )
    )
    ib_note = {"annotations": {IB_FABRIC_ANNOTATION: inp.ib_fabric}} if inp.ib_isolation and inp.ib_fabric else {}
    steps.append(
        (
            "queue",
            [
                {
                    "apiVersion": QUEUE_API,
                    "kind": "Queue",
                    "metadata": {"name": t, "labels": lab, **ib_note},
                    "spec": {
                        "displayName": inp.display_name or t,
                        "parentQueue": inp.parent_queue,
                        "priority": inp.priority,
                        "resources": {"gpu": inp.gpu.kai(), "cpu": inp.cpu.kai(), "memory": inp.memory.kai()},
                    },
                }
            ],
        )
    )
    quotas: list[dict] = []
    for ns in nss:
        hard: dict[str, str] = {}
        set_gpu_cap(hard, inp.gpu)
        if inp.cpu_quota:
            hard["requests.cpu"] = inp.cpu_quota
        if inp.memory_quota:
            hard["requests.memory"] = inp.memory_quota
        quotas.append(
            {
                "apiVersion": "v1",
                "kind": "ResourceQuota",
                "metadata": {"name": f"{t}-quota", "namespace": ns, "labels": lab},
                "spec": {"hard": hard},
            }
        )
        quotas.append(
            {
                "apiVersion": "v1",
                "kind": "LimitRange",
                "metadata": {"name": f"{t}-limits", "namespace": ns, "labels": lab},
                "spec": {
                    "limits": [
                        {
                            "type": "Container",
                            "default": {"cpu": "1", "memory": "1Gi"},
                            "defaultRequest": {"cpu": "100m", "memory": "128Mi"},
                        }
                    ]
                },
            }
        )
    steps.append(("quotas", quotas))
    steps.append(
        (
            "rbac",
            [
                {
                    "apiVersion": "rbac.authorization.k8s.io/v1",
                    "kind": "RoleBinding",
                    "metadata": {"name": f"{t}-admins", "namespace": ns, "labels": lab},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "admin"},
                    "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": inp.admin_group}],
                }
                for ns in nss
            ]
            if inp.admin_group
            else [],
        )
    )
    net: list[dict] = []
    if inp.network_isolation:
        for ns in nss:
            net.append(
                {
                    "apiVersion": "networking.k8s.io/v1",
                    "kind": "NetworkPolicy",
                    "metadata": {"name": "default-deny", "namespace": ns, "labels": lab},
                    "spec": {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]},
                }
            )
            # What a vCluster (and any tenant workload) needs: its own namespaces, DNS, the host API server.
            net.append(
                {
                    "apiVersion": "networking.k8s.io/v1",
                    "kind": "NetworkPolicy",
                    "metadata": {"name": "allow-tenant-and-system", "namespace": ns, "labels": lab},
                    "spec": {
                        "podSelector": {},
                        "policyTypes": ["Ingress", "Egress"],
                        "ingress": [{"from": [{"namespaceSelector": {"matchLabels": lab}}]}],
                        "egress": [
                            {"to": [{"namespaceSelector": {"matchLabels": lab}}]},
                            {
                                "to": [
                                    {
                                        "namespaceSelector": {
                                            "matchLabels": {"kubernetes.io/metadata.name": "kube-system"}
                                        }
                                    }
                                ],
                                "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}],
                            },
                            {"ports": [{"protocol": "TCP", "port": 443}, {"protocol": "TCP", "port": 6443}]},
                        ],
                    },
                }
            )
    steps.append(("network", net))
    steps.append(
        (
            "policy",
            [
                {
                    "apiVersion": "kyverno.io/v1",
                    "kind": "ClusterPolicy",
                    "metadata": {"name": f"{t}-kai-queue", "labels": lab},
                    "spec": {
                        "background": False,
                        "rules": [
                            {
                                "name": "kai-queue-and-scheduler",
                                "match": {"any": [{"resources": {"kinds": ["Pod"], "namespaces": nss}}]},
                                "mutate": {
                                    "patchStrategicMerge": {
                                        "metadata": {"labels": {QUEUE_LABEL: t}},
                                        "spec": {"schedulerName": KAI_SCHEDULER},
                                    }
                                },
                            }
                        ],
                    },
                }
            ],
        )
    )
    vc: list[dict] = []
    if inp.isolation == "vcluster":
        vc.append(
            {
                "apiVersion": VCLUSTER_API,
                "kind": "VCluster",
                "metadata": {"name": t, "namespace": nss[0], "labels": lab},
                "spec": {
                    "helmRelease": {
                        "chart": {"name": "vcluster", "repo": "https://charts.loft.sh"},
                        "values": _vcluster_values(inp),
                    }
                },
            }
        )
    steps.append(("vcluster", vc))
    return steps


def set_gpu_cap(hard: dict[str, str], gpu: QueueQuota) -> None:
    """A namespace's GPU cap (ResourceQuota spec.hard) from the queue's limit, else its guarantee; none only when
    both are unlimited (an input that asked for it with both overrides: models.GpuQuotaChecks)."""
    if gpu.limit >= 0 or gpu.quota >= 0:
        hard[GPU_CAP] = quantity(gpu.limit if gpu.limit >= 0 else gpu.quota)
    else:
        hard.pop(GPU_CAP, None)


def quantity(v: float) -> str:
    """A count as a Kubernetes quantity: `8`, not `8.0`."""
    return str(int(v)) if float(v).is_integer() else str(v)


def _vcluster_values(inp: OnboardTenantInput) -> str:
    ns = inp.all_namespaces()[0]
    return (
        "sync:\n  fromHost:\n    nodes:\n      enabled: false\n"
        "exportKubeConfig:\n"
        f"  server: https://{inp.tenant}.{ns}.svc:443\n"
        "policies:\n  resourceQuota:\n    enabled: false\n  limitRange:\n    enabled: false\n"
    )


def delete_order(refs: list[ObjectRef]) -> list[ObjectRef]:
    """Reverse creation order: vCluster first, namespaces last."""
    return sorted(refs, key=lambda r: (-_KIND_ORDER.get(r.kind, -1), r.namespace or "", r.name))
