"""OnboardTenant, OffboardTenant, UpdateTenantQuota: a team on a shared GPU cluster with its own vCluster,
KAI Scheduler queue (GPU quota) and guard rails.

Onboarding is a saga of idempotent steps: NetBox tenant → GPU capacity check → namespaces → KAI `Queue`
→ ResourceQuota + LimitRange → RBAC for the identity group → default-deny NetworkPolicy → Kyverno policy
(queue label + `schedulerName: kai-scheduler` on every tenant pod) → vCluster (a declarative `VCluster`
object; ready + kubeconfig Secret `vc-<name>`, kept as a reference) → InfiniBand isolation (when
`ib_isolation`: the `IsolateTenant` child workflow puts `ib_hosts` into the tenant's PKey on `ib_fabric`; its
compensation is the `ReleaseTenant` child). A step that fails for good undoes, in reverse order, what this run
created, and the run fails with a report of what was created and removed (workflows/common/saga.py). What this run
created is read from the cluster: every object it writes carries its owner annotation with this run's ID
(activities/capi.py `Ownership`), so an object whose create answer was lost (the write done, the connection
dropped) is undone too, and nothing another run or a person owns is ever deleted. A second onboarding with
the same input writes nothing; a changed input updates objects in place and removes the tenant's objects no
longer desired (only those this tenant's workflows manage).

Every tenant workflow has the ID `tenant/<cluster>/<tenant>`, so double submissions collapse and one
tenant's onboarding, quota change and offboarding never run at once. The InfiniBand children have the IDs
`isolate-tenant/<fabric>/<tenant>` and `release-tenant/<fabric>/<tenant>` (the same as when they are started
on their own, so a standalone run and an onboarding of the same tenant never overlap). Onboarding records the
fabric on the tenant's KAI queue (annotation `millwright.dev/ib-fabric`), so offboarding finds it and releases
the PKey when the tenant holds one.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Literal

from pydantic import Field, field_validator, model_validator
from temporalio import workflow
from temporalio.common import SearchAttributePair
from temporalio.exceptions import ActivityError, ApplicationError, ChildWorkflowError

from activities.capi.activities import ClusterApiActivities
from activities.capi.models import (
    ApplyRequest,
    CapacityRequest,
    DeleteRequest,
    DiscoveryRequest,
    KindRef,
    ListRequest,
    ObjectRef,
    VClusterRef,
    WorkloadQuery,
)
from activities.capi.ownership import TENANT_LABEL, Ownership
from activities.kube.validators import validate_object_name
from activities.models import StrictModel
from activities.netbox.activities import NetBoxActivities
from activities.netbox.models import TenantSpec
from workflows.clusters.manifests import QUEUE_API, TENANTS_PARENT_QUEUE
from workflows.common import saga
from workflows.common import search_attributes as sa
from workflows.common.base import Phases, Progress, WorkflowInput
from workflows.common.call_options import API_CALL, LONG_CALL
from workflows.common.endpoints import NETBOX, Endpoints, RetryTimeout, kubernetes_api
from workflows.common.errors import root_cause
from workflows.fabric.calls import call_fabric, validate_fabric_name
from workflows.fabric.isolation import IsolateTenant, IsolateTenantInput, IsolateTenantResult
from workflows.fabric.release import ReleaseTenant, ReleaseTenantInput, ReleaseTenantResult

QUEUE_LABEL = "kai.scheduler/queue"
KAI_SCHEDULER = "kai-scheduler"
VCLUSTER_API = "infrastructure.cluster.x-k8s.io/v1alpha1"
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
# Compensation by ownership (read from the cluster), not only by the list of `created` outcomes a run kept.
OWNED_COMPENSATION = "compensate-what-the-run-owns"


class QueueQuota(StrictModel):
    """One KAI resource: quota (guaranteed), limit (-1: none) and over-quota weight."""

    quota: float = Field(0, description="Guaranteed amount; -1 unlimited.")
    limit: float = Field(-1, description="Ceiling; -1 no limit (0 would mean: nothing beyond quota).")
    over_quota_weight: float = Field(1, ge=0)

    def kai(self) -> dict:
        return {"quota": self.quota, "limit": self.limit, "overQuotaWeight": self.over_quota_weight}


class TenantRef(WorkflowInput, RetryTimeout):
    tenant: str = Field(description="Tenant slug: namespace, queue and vCluster names derive from it.")
    cluster: str = Field(description="Target cluster reference (a context, or <management>:<ns>/<name>).")

    _tenant = field_validator("tenant")(validate_object_name)

    def workflow_id(self) -> str:
        return f"tenant/{self.cluster}/{self.tenant}"

    def search_attributes(self) -> list[SearchAttributePair]:
        return [SearchAttributePair(sa.CLUSTER, self.cluster), SearchAttributePair(sa.TENANT, self.tenant)]


class OnboardTenantInput(TenantRef):
    """Onboard one team onto a shared cluster."""

    display_name: str = Field("", description="Human name (NetBox tenant name); defaults to the slug.")
    contacts: list[str] = Field(default_factory=list, description="Team contacts (e-mail), recorded as annotations.")
    isolation: Literal["vcluster", "namespace"] = Field("vcluster", description="Own control plane, or namespaces.")
    gpu: QueueQuota = Field(default_factory=QueueQuota, description="KAI queue GPU resource (devices).")
    cpu: QueueQuota = Field(default_factory=lambda: QueueQuota(quota=-1), description="KAI queue CPU (millicores).")
    memory: QueueQuota = Field(default_factory=lambda: QueueQuota(quota=-1), description="KAI queue memory (MB).")
    parent_queue: str = Field(TENANTS_PARENT_QUEUE, description="Parent KAI queue (CreateCluster makes 'tenants').")
    priority: int = Field(100, description="KAI queue priority.")
    cpu_quota: str | None = Field(None, description="ResourceQuota requests.cpu per namespace, e.g. '64'.")
    memory_quota: str | None = Field(None, description="ResourceQuota requests.memory per namespace, e.g. '512Gi'.")
    namespaces: list[str] = Field(default_factory=list, description="Tenant namespaces; default: [tenant].")
    admin_group: str | None = Field(None, description="Identity group bound to the `admin` ClusterRole.")
    network_isolation: bool = True
    ib_isolation: bool = Field(False, description="InfiniBand partition isolation: a UFM PKey for ib_hosts.")
    ib_fabric: str | None = Field(None, description="The InfiniBand fabric (its UFM) when ib_isolation, e.g. lab-ib.")
    ib_hosts: list[str] = Field(
        default_factory=list,
        description="When ib_isolation: the hosts the tenant's workloads may use (UFM system names = NetBox "
                    "devices); all their HCA ports join the tenant's PKey.",
    )  # fmt: skip
    allow_oversubscription: bool = Field(False, description="Allow the tenants' GPU quotas to exceed capacity.")
    record_in_netbox: bool = True
    vcluster_ready_timeout: timedelta = timedelta(minutes=10)

    @field_validator("namespaces")
    @classmethod
    def _ns(cls, v: list[str]) -> list[str]:
        for n in v:
            validate_object_name(n)
        if len(set(v)) != len(v):
            raise ValueError("namespaces must be unique")
        return v

    @model_validator(mode="after")
    def _ib(self) -> "OnboardTenantInput":
        if self.ib_isolation:
            if not self.ib_fabric or not self.ib_hosts:
                raise ValueError("ib_isolation needs ib_fabric and ib_hosts (the hosts the tenant's workloads use)")
            validate_fabric_name(self.ib_fabric)
            if len(set(self.ib_hosts)) != len(self.ib_hosts) or not all(h.strip() for h in self.ib_hosts):
                raise ValueError("ib_hosts must be unique, non-empty host names")
        elif self.ib_fabric or self.ib_hosts:
            raise ValueError("ib_fabric and ib_hosts are only for ib_isolation=true")
        return self

    def all_namespaces(self) -> list[str]:
        return self.namespaces or [self.tenant]

    def isolate_input(self) -> IsolateTenantInput:
        assert self.ib_fabric
        return IsolateTenantInput(
            fabric=self.ib_fabric,
            tenant=self.tenant,
            tenant_name=self.display_name or None,
            hosts=self.ib_hosts,
            netbox=self.record_in_netbox,
            retry_timeout=self.retry_timeout,
        )


class StepReport(StrictModel):
    step: str
    created: list[str] = Field(default_factory=list)
    updated: list[str] = Field(default_factory=list)
    unchanged: list[str] = Field(default_factory=list)


class OnboardTenantResult(StrictModel):
    tenant: str
    cluster: str
    changed: bool = Field(description="False when the run wrote nothing (already onboarded as asked).")
    steps: list[StepReport]
    removed: list[str] = Field(default_factory=list, description="Objects no longer desired, removed.")
    vcluster_kubeconfig: str | None = Field(None, description="A secret reference, never the kubeconfig.")
    infiniband: IsolateTenantResult | None = Field(None, description="The tenant's PKey and verified members.")


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
        hard = {"requests.nvidia.com/gpu": _num(inp.gpu.limit if inp.gpu.limit >= 0 else inp.gpu.quota)}
        if inp.cpu_quota:
            hard["requests.cpu"] = inp.cpu_quota
        if inp.memory_quota:
            hard["requests.memory"] = inp.memory_quota
        if inp.gpu.limit < 0 and inp.gpu.quota < 0:
            hard.pop("requests.nvidia.com/gpu")
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


def _num(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else str(v)


def _vcluster_values(inp: OnboardTenantInput) -> str:
    ns = inp.all_namespaces()[0]
    return (
        "sync:\n  fromHost:\n    nodes:\n      enabled: false\n"
        "exportKubeConfig:\n"
        f"  server: https://{inp.tenant}.{ns}.svc:443\n"
        "policies:\n  resourceQuota:\n    enabled: false\n  limitRange:\n    enabled: false\n"
    )


def _delete_order(refs: list[ObjectRef]) -> list[ObjectRef]:
    """Reverse creation order: vCluster first, namespaces last."""
    return sorted(refs, key=lambda r: (-_KIND_ORDER.get(r.kind, -1), r.namespace or "", r.name))


async def _capacity_check(calls: Endpoints, cluster: str, tenant: str, gpu_quota: float, allow: bool) -> None:
    cap = await calls.execute(
        ClusterApiActivities.gpu_capacity,
        CapacityRequest(cluster=cluster),
        **API_CALL,
        endpoint=kubernetes_api(cluster),
    )
    others = sum(q for t, q in cap.quotas.items() if t != tenant)
    total = others + max(0.0, gpu_quota)
    if total > cap.gpus and not allow:
        raise ApplicationError(
            f"GPU quotas would total {total:g} on cluster {cluster} (other tenants {others:g} + {tenant} "
            f"{gpu_quota:g}) but it has {cap.gpus:g} GPUs; lower the quota or set allow_oversubscription",
            type="QuotaExceedsCapacity",
            non_retryable=True,
        )


@workflow.defn
class OnboardTenant:
    @workflow.init
    def __init__(self, inp: OnboardTenantInput) -> None:
        self._phases = Phases(finished=("completed", "compensated", "failed"))
        self._calls = Endpoints(inp.retry_timeout, shown=self._phases.waiting)

    @workflow.query(description="Current step, steps done of total.")
    def progress(self) -> Progress:
        return self._phases.progress

    @workflow.run
    async def run(self, inp: OnboardTenantInput) -> OnboardTenantResult:
        acts = ClusterApiActivities
        owner, run = workflow.info().workflow_id, workflow.info().run_id
        workflow.upsert_search_attributes([sa.CLUSTER.value_set(inp.cluster), sa.TENANT.value_set(inp.tenant)])
        steps = tenant_steps(inp)
        every = [o for _, objs in steps for o in objs]
        ib = 1 if inp.ib_isolation else 0
        self._phases.progress.total = len(steps) + 3 + ib
        reports: list[StepReport] = []
        created: list[ObjectRef] = []  # what this run saw itself create; compensation also reads the cluster
        self._ib_release = False  # the IB step ran for a tenant that held no PKey before: undo it
        self._ib_created: list[str] = []
        self._ib_child: tuple[list[str], list[str]] | None = None  # a failed IsolateTenant's own compensation
        result = OnboardTenantResult(tenant=inp.tenant, cluster=inp.cluster, changed=False, steps=reports)
        try:
            if inp.record_in_netbox:
                self._phases.enter("netbox", "tenant record")
                nb = await self._calls.execute(
                    NetBoxActivities.upsert_tenant,
                    TenantSpec(
                        name=inp.display_name or inp.tenant, slug=inp.tenant, description=f"onboarded on {inp.cluster}"
                    ),
                    **API_CALL,
                    endpoint=NETBOX,
                )
                reports.append(
                    StepReport(
                        step="netbox",
                        created=[f"tenant {nb.name}"] if nb.created else [],
                        updated=[f"tenant {nb.name}"] if nb.updated else [],
                        unchanged=[] if nb.created or nb.updated else [f"tenant {nb.name}"],
                    )
                )
                result.changed |= bool(nb.created or nb.updated)
            self._phases.enter("checking", "kinds installed, GPU capacity", 1)
            await self._calls.execute(
                acts.check_kinds_installed,
                DiscoveryRequest(cluster=inp.cluster, kinds=KindRef.of_objects(every)),
                **API_CALL,
                endpoint=kubernetes_api(inp.cluster),
            )
            await _capacity_check(self._calls, inp.cluster, inp.tenant, inp.gpu.quota, inp.allow_oversubscription)
            for i, (name, objs) in enumerate(steps):
                self._phases.enter(name, f"{len(objs)} objects", i + 2)
                if not objs:
                    continue
                applied = await self._calls.execute(
                    acts.apply_objects,
                    ApplyRequest(cluster=inp.cluster, owner=owner, run=run, objects=objs, on_difference="update"),
                    endpoint=kubernetes_api(inp.cluster),
                    summary=f"{name}: {len(objs)} objects",
                    **LONG_CALL,
                )
                created += applied.created()
                result.changed |= applied.changed()
                reports.append(
                    StepReport(
                        step=name,
                        **{
                            k: [str(o.ref) for o in applied.outcomes if o.outcome == v]
                            for k, v in (("created", "created"), ("updated", "updated"), ("unchanged", "unchanged"))
                        },
                    )
                )
                if name == "vcluster":
                    result.vcluster_kubeconfig = await self._wait_vcluster(inp)
            if inp.ib_isolation:
                result.infiniband = await self._isolate(inp, len(steps) + 2)
                iso = result.infiniband
                pkey = f"PKey {iso.pkey} on {inp.ib_fabric}"
                reports.append(
                    StepReport(
                        step="infiniband",
                        created=[pkey] if iso.pkey_created else [],
                        updated=[f"{pkey}: added {g}" for g in iso.added],
                        unchanged=[] if iso.pkey_created or iso.added else [pkey],
                    )
                )
                result.changed |= bool(iso.pkey_created or iso.added)
            # Changed input: the tenant's objects no longer desired go.
            self._phases.enter("pruning", "objects no longer desired", len(steps) + 2 + ib)
            want = {(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]) for o in every}
            live = await self._calls.execute(
                acts.list_objects,
                ListRequest(cluster=inp.cluster, kinds=TENANT_KINDS, label_selector=f"{TENANT_LABEL}={inp.tenant}"),
                **API_CALL,
                endpoint=kubernetes_api(inp.cluster),
            )
            stale = _delete_order([r for r in live if (r.kind, r.namespace, r.name) not in want])
            if stale:
                pruned = await self._calls.execute(
                    acts.delete_objects,
                    DeleteRequest(cluster=inp.cluster, objects=stale, owned_by=Ownership(workflow=owner)),
                    **LONG_CALL,
                    endpoint=kubernetes_api(inp.cluster),
                )
                gone, _ = pruned.account(stale, stale)  # a person's object labelled for the tenant stays
                result.removed = [str(r) for r in gone]
                result.changed |= bool(result.removed)
        except (ActivityError, ApplicationError, ChildWorkflowError) as err:
            why = str(root_cause(err))
            self._phases.enter("compensating", why)
            if workflow.patched(OWNED_COMPENSATION):
                made, removed = await self._compensate_owned(inp, created, every)
            else:  # runs that began before compensation by ownership
                removed = await self._compensate(inp, created)
                made = [str(r) for r in created] + self._ib_created
            failure = saga.failure(
                f"onboarding {inp.tenant} on {inp.cluster}", err, made, removed, type="OnboardingFailed"
            )
            self._phases.enter("compensated", failure.message)
            raise failure from err
        result.steps = reports  # the model copied the list it was given
        self._phases.enter(
            "completed",
            "changed" if result.changed else "already onboarded: nothing changed",
            self._phases.progress.total,
        )
        return result

    async def _wait_vcluster(self, inp: OnboardTenantInput) -> str:
        ref = VClusterRef(cluster=inp.cluster, namespace=inp.all_namespaces()[0], name=inp.tenant)
        deadline = workflow.now() + inp.vcluster_ready_timeout
        delay = timedelta(milliseconds=250)
        while True:
            st = await self._calls.execute(
                ClusterApiActivities.read_vcluster, ref, **API_CALL, endpoint=kubernetes_api(inp.cluster)
            )
            if st.ready and st.kubeconfig:
                return st.kubeconfig.ref
            self._phases.enter("vcluster", f"waiting for vCluster {inp.tenant}: {st.phase or 'pending'}")
            if workflow.now() >= deadline:
                raise ApplicationError(
                    f"vCluster {inp.tenant} not ready after {inp.vcluster_ready_timeout}",
                    type="VClusterNotReady",
                    non_retryable=True,
                )
            await workflow.sleep(delay)
            delay = min(delay * 2, timedelta(seconds=10))

    async def _isolate(self, inp: OnboardTenantInput, done: int) -> IsolateTenantResult:
        """The InfiniBand step: the IsolateTenant child. Compensation releases the PKey only when the tenant held
        none before this run (a failed re-onboarding never cuts an isolated tenant's running jobs off)."""
        assert inp.ib_fabric
        self._phases.enter("infiniband", f"PKey on {inp.ib_fabric} for {', '.join(inp.ib_hosts)}", done)
        before = await call_fabric(inp.ib_fabric, "state")
        self._ib_release = inp.tenant not in (before.get("allocations") or {})
        child = inp.isolate_input()
        try:
            iso: IsolateTenantResult = await workflow.execute_child_workflow(
                IsolateTenant.run, child, id=child.workflow_id(), static_summary=f"IB isolation of {inp.tenant}"
            )
        except ChildWorkflowError as err:
            self._ib_child = saga.report_of(err)  # it undid its own writes: its report joins ours
            raise
        if self._ib_release:
            self._ib_created.append(f"PKey {iso.pkey} on {inp.ib_fabric}")
        return iso

    async def _compensate_owned(
        self, inp: OnboardTenantInput, created: list[ObjectRef], every: list[dict]
    ) -> tuple[list[str], list[str]]:
        """Undo, last step first, everything this run created: the InfiniBand PKey, then every object that
        carries this run's ownership (read from the cluster: those whose create answer was lost included) or
        that the run saw itself create; only the very objects this run owns are deleted. Returns (created,
        removed), both read from the cluster and UFM rather than from the writes' answers."""
        made_ib, removed = self._ib_child or ([], [])
        removed = list(removed)
        removed += await self._release_ib_step(inp)
        mine = Ownership(workflow=workflow.info().workflow_id, created_by=workflow.info().run_id)
        owned = await workflow.execute_activity_method(
            ClusterApiActivities.list_objects,
            ListRequest(
                cluster=inp.cluster, kinds=TENANT_KINDS, label_selector=f"{TENANT_LABEL}={inp.tenant}", owned_by=mine
            ),
            **API_CALL,
        )
        position = {ObjectRef.of(o).key(): i for i, o in enumerate(every)}
        refs = list({r.key(): r for r in created + owned}.values())
        refs.sort(key=lambda r: position.get(r.key(), len(position)))  # creation order
        made = [str(r) for r in refs] + made_ib + [p for p in self._ib_created if p not in made_ib]
        if refs:
            order = list(reversed(refs))
            done = await workflow.execute_activity_method(
                ClusterApiActivities.delete_objects,
                DeleteRequest(cluster=inp.cluster, objects=order, owned_by=mine),
                **LONG_CALL,
            )
            removed += [str(r) for r in done.account(order, owned)[0]]
        return made, removed

    async def _release_ib_step(self, inp: OnboardTenantInput) -> list[str]:
        """The InfiniBand step undone (ReleaseTenant) when this run gave the tenant its PKey."""
        if not (self._ib_release and inp.ib_fabric):
            return []
        rel = await release_ib(inp.ib_fabric, inp.tenant, inp.record_in_netbox)
        if not rel.pkey:
            return []
        what = f"PKey {rel.pkey} on {inp.ib_fabric}"
        if what not in self._ib_created:  # IsolateTenant failed after allocating it
            self._ib_created.append(what)
        return [what]

    async def _compensate(self, inp: OnboardTenantInput, created: list[ObjectRef]) -> list[str]:
        """The compensation of runs that began before OWNED_COMPENSATION: the kept list only."""
        removed = await self._release_ib_step(inp)  # the last step: undone first
        if not created:
            return removed
        order = list(reversed(created))
        await workflow.execute_activity_method(
            ClusterApiActivities.delete_objects, DeleteRequest(cluster=inp.cluster, objects=order), **LONG_CALL
        )
        return removed + [str(r) for r in order]


async def release_ib(fabric: str, tenant: str, netbox: bool) -> ReleaseTenantResult:
    """The ReleaseTenant child (no-op when the tenant holds no PKey on the fabric)."""
    child = ReleaseTenantInput(fabric=fabric, tenant=tenant, netbox=netbox)
    return await workflow.execute_child_workflow(
        ReleaseTenant.run, child, id=child.workflow_id(), static_summary=f"IB release of {tenant}"
    )


# ---------------------------------------------------------------- offboarding


class OffboardTenantInput(TenantRef):
    """Remove everything onboarding created for a tenant and mark it in NetBox."""

    force: bool = Field(False, description="Evict the tenant's running pods instead of waiting for them to end.")
    workloads_timeout: timedelta = timedelta(hours=2)
    poll_interval: timedelta = timedelta(seconds=10)
    record_in_netbox: bool = True
    display_name: str = Field("", description="NetBox tenant name, as onboarded; defaults to the slug.")
    ib_fabric: str | None = Field(
        None,
        description="InfiniBand fabric to release the tenant's PKey on; default: "
        "the one onboarding recorded on the tenant's queue.",
    )

    @field_validator("ib_fabric")
    @classmethod
    def _fabric(cls, v: str | None) -> str | None:
        return validate_fabric_name(v) if v is not None else v


class OffboardTenantResult(StrictModel):
    tenant: str
    cluster: str
    removed: list[str]
    kept: list[str] = Field(
        default_factory=list,
        description="Labelled for the tenant but owned by another workflow or a person: left alone.",
    )
    evicted: int = 0
    infiniband: ReleaseTenantResult | None = Field(None, description="The PKey released, when the tenant had one.")


@workflow.defn
class OffboardTenant:
    @workflow.init
    def __init__(self, inp: OffboardTenantInput) -> None:
        self._phases = Phases()
        self._calls = Endpoints(inp.retry_timeout, shown=self._phases.waiting)

    @workflow.query(description="Phase of the offboarding.")
    def progress(self) -> Progress:
        return self._phases.progress

    @workflow.run
    async def run(self, inp: OffboardTenantInput) -> OffboardTenantResult:
        acts = ClusterApiActivities
        workflow.upsert_search_attributes([sa.CLUSTER.value_set(inp.cluster), sa.TENANT.value_set(inp.tenant)])
        self._phases.enter("listing")
        live = await self._calls.execute(
            acts.list_objects,
            ListRequest(cluster=inp.cluster, kinds=TENANT_KINDS, label_selector=f"{TENANT_LABEL}={inp.tenant}"),
            **API_CALL,
            endpoint=kubernetes_api(inp.cluster),
        )
        namespaces = [r.name for r in live if r.kind == "Namespace"]
        evicted = 0
        deadline = workflow.now() + inp.workloads_timeout
        while namespaces:
            w = await self._calls.execute(
                acts.tenant_workloads,
                WorkloadQuery(cluster=inp.cluster, namespaces=namespaces, evict=inp.force),
                **API_CALL,
                endpoint=kubernetes_api(inp.cluster),
            )
            evicted += w.evicted
            if w.active == 0 or inp.force:
                break
            self._phases.enter("waiting-for-workloads", f"{w.active} pods still running")
            if workflow.now() >= deadline:
                raise ApplicationError(
                    f"{w.active} tenant pods still running after {inp.workloads_timeout}; "
                    "offboard with force to evict them",
                    type="WorkloadsRunning",
                    non_retryable=True,
                )
            await workflow.sleep(inp.poll_interval)
        released = await self._release_ib(inp)  # onboarding's last step, undone first
        self._phases.enter("removing", f"{len(live)} objects")
        order = _delete_order(live)
        removed: list[str] = []
        kept: list[str] = []
        if order:  # only what the tenant's workflows manage (every run of them has this workflow ID)
            done = await self._calls.execute(
                acts.delete_objects,
                DeleteRequest(
                    cluster=inp.cluster, objects=order, owned_by=Ownership(workflow=workflow.info().workflow_id)
                ),
                **LONG_CALL,
                endpoint=kubernetes_api(inp.cluster),
            )
            gone, left = done.account(order, order)
            removed, kept = [str(r) for r in gone], [str(r) for r in left]
        if inp.record_in_netbox:
            self._phases.enter("netbox", "marking the tenant")
            await self._calls.execute(
                NetBoxActivities.upsert_tenant,
                TenantSpec(
                    name=inp.display_name or inp.tenant, slug=inp.tenant, description=f"offboarded from {inp.cluster}"
                ),
                **API_CALL,
                endpoint=NETBOX,
            )
        self._phases.enter(
            "completed",
            f"removed {len(removed)} objects"
            + (f", kept {len(kept)} not managed by {workflow.info().workflow_id}" if kept else ""),
        )
        return OffboardTenantResult(
            tenant=inp.tenant, cluster=inp.cluster, removed=removed, kept=kept, evicted=evicted, infiniband=released
        )

    async def _release_ib(self, inp: OffboardTenantInput) -> ReleaseTenantResult | None:
        fabric = inp.ib_fabric
        if fabric is None:
            queues = await self._calls.execute(
                ClusterApiActivities.read_tenant_quota_objects,
                ListRequest(
                    cluster=inp.cluster,
                    kinds=[KindRef(api_version=QUEUE_API, kind="Queue")],
                    label_selector=f"{TENANT_LABEL}={inp.tenant}",
                ),
                **API_CALL,
                endpoint=kubernetes_api(inp.cluster),
            )
            fabric = next(
                (
                    q["metadata"].get("annotations", {}).get(IB_FABRIC_ANNOTATION)
                    for q in queues
                    if (q["metadata"].get("annotations") or {}).get(IB_FABRIC_ANNOTATION)
                ),
                None,
            )
        if fabric is None:
            return None
        state = await call_fabric(fabric, "state")
        if inp.tenant not in (state.get("allocations") or {}):
            return None  # never isolated (or already released)
        self._phases.enter("infiniband", f"releasing the tenant's PKey on {fabric}")
        return await release_ib(fabric, inp.tenant, inp.record_in_netbox)


# ---------------------------------------------------------------- quota changes


class UpdateTenantQuotaInput(TenantRef):
    """Change a tenant's GPU quota (KAI queue and ResourceQuota) in place."""

    gpu: QueueQuota
    allow_oversubscription: bool = False


class UpdateTenantQuotaResult(StrictModel):
    tenant: str
    cluster: str
    updated: list[str]
    unchanged: list[str]


@workflow.defn
class UpdateTenantQuota:
    @workflow.init
    def __init__(self, inp: UpdateTenantQuotaInput) -> None:
        self._phases = Phases()
        self._calls = Endpoints(inp.retry_timeout, shown=self._phases.waiting)

    @workflow.query(description="Phase of the quota change.")
    def progress(self) -> Progress:
        return self._phases.progress

    @workflow.run
    async def run(self, inp: UpdateTenantQuotaInput) -> UpdateTenantQuotaResult:
        acts = ClusterApiActivities
        owner = workflow.info().workflow_id
        workflow.upsert_search_attributes([sa.CLUSTER.value_set(inp.cluster), sa.TENANT.value_set(inp.tenant)])
        self._phases.enter("checking", "GPU capacity")
        await _capacity_check(self._calls, inp.cluster, inp.tenant, inp.gpu.quota, inp.allow_oversubscription)
        objs = await self._calls.execute(
            acts.read_tenant_quota_objects,
            ListRequest(
                cluster=inp.cluster,
                kinds=[KindRef(api_version=QUEUE_API, kind="Queue"), KindRef(api_version="v1", kind="ResourceQuota")],
                label_selector=f"{TENANT_LABEL}={inp.tenant}",
            ),
            **API_CALL,
            endpoint=kubernetes_api(inp.cluster),
        )
        if not any(o["kind"] == "Queue" for o in objs):
            raise ApplicationError(
                f"tenant {inp.tenant} is not onboarded on {inp.cluster} (no queue)",
                type="TenantNotFound",
                non_retryable=True,
            )
        desired = []
        for o in objs:
            if o["kind"] == "Queue":
                o["spec"]["resources"]["gpu"] = inp.gpu.kai()
            else:
                hard = o["spec"].setdefault("hard", {})
                if inp.gpu.limit >= 0 or inp.gpu.quota >= 0:
                    hard["requests.nvidia.com/gpu"] = _num(inp.gpu.limit if inp.gpu.limit >= 0 else inp.gpu.quota)
                else:
                    hard.pop("requests.nvidia.com/gpu", None)
            holder = Ownership.of(o)
            if holder is not None and holder.workflow != owner:
                raise ApplicationError(
                    f"{o['kind']} {o['metadata']['name']} is not managed by {owner} "
                    f"({Ownership(workflow=owner).describe(o)})",
                    type="ObjectConflict",
                    non_retryable=True,
                )
            desired.append(o)
        self._phases.enter("updating", f"GPU quota {inp.gpu.quota:g}, limit {inp.gpu.limit:g}")
        applied = await self._calls.execute(
            acts.apply_objects,
            ApplyRequest(
                cluster=inp.cluster, owner=owner, run=workflow.info().run_id, objects=desired, on_difference="update"
            ),
            **LONG_CALL,
            endpoint=kubernetes_api(inp.cluster),
        )
        self._phases.enter("completed")
        return UpdateTenantQuotaResult(
            tenant=inp.tenant,
            cluster=inp.cluster,
            updated=[str(o.ref) for o in applied.outcomes if o.outcome != "unchanged"],
            unchanged=[str(o.ref) for o in applied.outcomes if o.outcome == "unchanged"],
        )
