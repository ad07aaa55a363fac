"""OnboardTenant's plan: every name the onboarding would write, judged against what the cluster holds and who owns
it, before the first write (NetBox's included). Pure: the reads come from `survey_objects` and `gpu_capacity`.

A plan refuses, for good and naming the input field, the object and its owner:
* `ObjectConflict`: a name the onboarding derives or is given (a namespace, the queue, a RoleBinding, a
  NetworkPolicy, the Kyverno policy, the vCluster) is held by another workflow, or by a person and differs;
* `InvalidTenantInput`: a `parent_queue` that is not a parent Millwright manages for tenants, or a binding to a
  group the cluster's operator reserves (or a `system:` identity);
* `AdminGroupChange`: an onboarded tenant's admin group differs from the input's and no `admin_group_change`
  says who moves it and why;
* `QuotaExceedsCapacity`: the queue tree's guarantees past the cluster's GPUs (workflows/tenancy/capacity.py).
"""

from __future__ import annotations

from pydantic import Field
from temporalio.exceptions import ApplicationError

from activities.capi.models import SYSTEM_PREFIX, GpuCapacity, LiveObject, ObjectRef, SurveyRequest, SurveyResult
from activities.models import StrictModel
from workflows.clusters.manifests import QUEUE_API, TENANTS_PARENT_QUEUE
from workflows.tenancy.capacity import check_queue_tree, guaranteed_gpus
from workflows.tenancy.models import OnboardTenantInput

# The owner of what CreateCluster writes (CreateClusterInput.workflow_id) and of what the tenant workflows write.
CLUSTER_WORKFLOW = "cluster/"
TENANT_WORKFLOW = "tenant/"
# A queue an operator set aside as a further parent for tenants (besides CreateCluster's `tenants`).
QUEUE_ROLE_LABEL = "millwright.dev/queue-role"
TENANTS_PARENT_ROLE = "tenants-parent"
# A ResourceQuota's caps are exactly the desired ones: a cap the input drops is removed, not left behind.
EXACT = ["spec.hard"]


class AdminGroupChanged(StrictModel):
    tenant: str
    previous: list[str] = Field(description="The groups that administered the tenant before this run.")
    admin_group: str | None
    by: str
    reason: str

    def journal(self) -> str:
        before = ", ".join(self.previous) or "no group"
        return (
            f"Admin group of tenant `{self.tenant}` changed from {before} to {self.admin_group or 'no group'} "
            f"by {self.by}: {self.reason}"
        )


class TenantPlan(StrictModel):
    create: list[str] = Field(default_factory=list)
    update: list[str] = Field(default_factory=list)
    unchanged: list[str] = Field(default_factory=list)
    admin_groups: list[str] = Field(default_factory=list, description="Who administers the tenant now.")
    admin_group_change: AdminGroupChanged | None = None
    guaranteed_gpus: float = Field(description="The queue tree's GPU guarantees once this tenant's is in place.")
    gpus: float = Field(description="The cluster's allocatable GPUs.")

    def summary(self) -> str:
        change = f"; admin group moved by {self.admin_group_change.by}" if self.admin_group_change else ""
        return (
            f"create {len(self.create)}, update {len(self.update)}, unchanged {len(self.unchanged)}; "
            f"GPUs guaranteed {self.guaranteed_gpus:g} of {self.gpus:g}{change}"
        )


def parent_ref(inp: OnboardTenantInput) -> ObjectRef:
    return ObjectRef(api_version=QUEUE_API, kind="Queue", name=inp.parent_queue)


def survey_request(inp: OnboardTenantInput, every: list[dict]) -> SurveyRequest:
    return SurveyRequest(cluster=inp.cluster, objects=every, read=[parent_ref(inp)], exact=EXACT)


def owner_of(live: LiveObject) -> str:
    whose = f"managed by {live.owner}" if live.owner else "not created by Millwright"
    return whose + (f", tenant {live.tenant}" if live.tenant else "")


def _refuse(type_: str, problems: list[str]) -> ApplicationError:
    return ApplicationError("; ".join(problems), type=type_, non_retryable=True)


def _field(inp: OnboardTenantInput, ref: ObjectRef) -> str:
    """The input field a name derives from: a namespace given, or the tenant slug."""
    ns = ref.name if ref.kind == "Namespace" else ref.namespace
    if ns in inp.namespaces:
        return f"namespaces[{inp.namespaces.index(ns)}]"
    return "tenant"


def plan_onboarding(
    inp: OnboardTenantInput, owner: str, every: list[dict], seen: SurveyResult, cap: GpuCapacity
) -> TenantPlan:
    """The plan, or the refusal (every problem of its kind named at once)."""
    desired, parent = seen.objects[: len(every)], seen.objects[len(every)]
    # A person's object identical to the desired one (it carries this tenant's labels already) is left alone,
    # as apply_objects leaves it; anything else not this tenant's is refused.
    conflicts = [
        f"{_field(inp, o.ref)}: {o.ref} already exists on {inp.cluster} ({owner_of(o)})"
        for o in desired
        if o.exists and o.owner != owner and (o.differs or o.owner is not None)
    ]
    if conflicts:
        raise _refuse("ObjectConflict", [*conflicts, "nothing was written"])
    problems = _parent_problems(inp, parent) + _binding_problems(every, seen.reserved_groups)
    if problems:
        raise _refuse("InvalidTenantInput", [*problems, "nothing was written"])
    current = sorted({g for o in desired if o.exists and o.ref.kind == "RoleBinding" for g in o.groups})
    plan = TenantPlan(
        create=[str(o.ref) for o in desired if not o.exists],
        update=[str(o.ref) for o in desired if o.exists and o.differs],
        unchanged=[str(o.ref) for o in desired if o.exists and not o.differs],
        admin_groups=current,
        guaranteed_gpus=guaranteed_gpus(cap, inp.tenant, inp.parent_queue, inp.gpu.quota),
        gpus=cap.gpus,
    )
    onboarded = any(o.exists and o.ref.kind == "Queue" and o.ref.name == inp.tenant for o in desired)
    wanted = [inp.admin_group] if inp.admin_group else []
    if onboarded and current != wanted:
        plan.admin_group_change = _admin_change(inp, current)
    check_queue_tree(cap, inp.cluster, inp.tenant, inp.parent_queue, inp.gpu.quota, inp.allow_oversubscription)
    return plan


def _admin_change(inp: OnboardTenantInput, current: list[str]) -> AdminGroupChanged:
    change = inp.admin_group_change
    if change is None:
        raise _refuse(
            "AdminGroupChange",
            [
                f"admin_group: tenant {inp.tenant} on {inp.cluster} is administered by "
                f"{', '.join(current) or 'no group'}, and this input names {inp.admin_group or 'none'}; moving who "
                "administers a tenant is an explicit operation: submit it with admin_group_change {by, reason} "
                "(docs/clusters-and-tenants.md)",
                "nothing was written",
            ],
        )
    return AdminGroupChanged(
        tenant=inp.tenant, previous=current, admin_group=inp.admin_group, by=change.by, reason=change.reason
    )


def _parent_problems(inp: OnboardTenantInput, parent: LiveObject) -> list[str]:
    q = f"parent_queue: Queue {inp.parent_queue}"
    if not parent.exists:
        return [f"{q} does not exist on {inp.cluster} (CreateCluster makes {TENANTS_PARENT_QUEUE!r})"]
    if parent.tenant is not None or (parent.owner or "").startswith(TENANT_WORKFLOW):
        return [f"{q} is a tenant's queue ({owner_of(parent)}): a tenant never takes its GPUs out of another's"]
    created = (parent.owner or "").startswith(CLUSTER_WORKFLOW) and parent.ref.name == TENANTS_PARENT_QUEUE
    if not created and parent.labels.get(QUEUE_ROLE_LABEL) != TENANTS_PARENT_ROLE:
        return [
            f"{q} is not a parent Millwright manages for tenants ({owner_of(parent)}); use CreateCluster's "
            f"{TENANTS_PARENT_QUEUE!r} or a queue labelled {QUEUE_ROLE_LABEL}={TENANTS_PARENT_ROLE}"
        ]
    return []


def _binding_problems(every: list[dict], reserved: list[str]) -> list[str]:
    """Every user or group a desired RoleBinding names: never a `system:` identity nor a reserved group."""
    names = {
        f"{s.get('kind')} {s.get('name', '')}": None
        for o in every
        if o["kind"] == "RoleBinding"
        for s in o.get("subjects") or []
        if s.get("name", "").startswith(SYSTEM_PREFIX) or (s.get("kind") == "Group" and s.get("name") in reserved)
    }
    return [
        f"admin_group: {n} is reserved by Kubernetes or the cluster's operator (every {SYSTEM_PREFIX} identity, "
        "and the worker setting reserved_groups): no tenant binding names it"
        for n in names
    ]
