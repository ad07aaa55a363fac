"""The requests and results of the declarative-object activities (activities/capi/activities.py): which objects,
in which cluster, and what reading them found. No kubeconfig, token or Secret data is ever among them: a
credential comes back as a `SecretReference`, where it lives."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from activities.capi.ownership import Ownership
from activities.models import StrictModel


class KindRef(StrictModel):
    api_version: str
    kind: str

    def __str__(self) -> str:
        return f"{self.api_version}/{self.kind}"

    @classmethod
    def of_objects(cls, objs: list[dict[str, Any]]) -> list[KindRef]:
        """The distinct kinds of these objects, in first-seen order."""
        seen: dict[str, KindRef] = {}
        for o in objs:
            seen.setdefault(f"{o['apiVersion']}/{o['kind']}", cls(api_version=o["apiVersion"], kind=o["kind"]))
        return list(seen.values())


class ObjectRef(StrictModel):
    api_version: str
    kind: str
    name: str
    namespace: str | None = None

    def __str__(self) -> str:
        where = f"{self.namespace}/" if self.namespace else ""
        return f"{self.kind} {where}{self.name}"

    @classmethod
    def of(cls, obj: dict[str, Any]) -> ObjectRef:
        md = obj.get("metadata") or {}
        return cls(api_version=obj["apiVersion"], kind=obj["kind"], name=md["name"], namespace=md.get("namespace"))

    def key(self) -> tuple[str, str, str, str]:
        return self.api_version, self.kind, self.namespace or "", self.name


class DiscoveryRequest(StrictModel):
    cluster: str
    kinds: list[KindRef]


class DiscoveryResult(StrictModel):
    installed: list[str]


class ApplyRequest(StrictModel):
    cluster: str
    owner: str = Field(description="Who manages these objects (a workflow ID); written as an annotation.")
    run: str = Field(
        "",
        description="The writing run's ID: recorded as the creator of what it creates and the "
        "writer of what it changes (`Ownership`).",
    )
    objects: list[dict[str, Any]] = Field(description="Full desired objects, in creation order.")
    on_difference: Literal["error", "update"] = Field(
        "error", description="What to do with an existing object of ours that differs: fail, or replace it."
    )
    exact: list[str] = Field(
        default_factory=list,
        description="Dotted paths (e.g. spec.hard) whose keys must be exactly the desired ones: a key the desired "
        "object drops is a difference (elsewhere, extra live fields are server defaults and match).",
    )


class ApplyOutcome(StrictModel):
    ref: ObjectRef
    outcome: Literal["created", "unchanged", "updated"]
    uid: str = ""


class ApplyResult(StrictModel):
    outcomes: list[ApplyOutcome] = Field(default_factory=list)

    def created(self) -> list[ObjectRef]:
        return [o.ref for o in self.outcomes if o.outcome == "created"]

    def changed(self) -> bool:
        return any(o.outcome != "unchanged" for o in self.outcomes)


class DeleteRequest(StrictModel):
    cluster: str
    objects: list[ObjectRef] = Field(description="Deleted in this order; each waited for before the next.")
    timeout_seconds: float = 600
    poll_seconds: float = 0.5
    owned_by: Ownership | None = Field(
        None,
        description="Delete only objects this owner holds (read first; the "
        "delete is conditional on the UID read); others are kept.",
    )


class DeleteResult(StrictModel):
    deleted: list[ObjectRef] = Field(default_factory=list, description="Deleted by this attempt.")
    absent: list[ObjectRef] = Field(
        default_factory=list, description="Already gone (perhaps by an earlier attempt whose answer was lost)."
    )
    kept: list[ObjectRef] = Field(default_factory=list, description="Not held by `owned_by`: left alone.")

    def account(self, order: list[ObjectRef], existed: list[ObjectRef]) -> tuple[list[ObjectRef], list[ObjectRef]]:
        """(removed, kept) of a delete of `order`, from what a listing showed there before (`existed`) and this
        result, not from the delete answers alone (after a lost one, the retry finds the object absent). An
        object kept inside a namespace that was removed went with it."""
        there = {r.key() for r in existed + self.deleted}
        kept = {r.key() for r in self.kept}
        gone_ns = {r.name for r in order if r.kind == "Namespace" and r.key() in there and r.key() not in kept}
        removed = [r for r in order if r.key() in there and (r.key() not in kept or r.namespace in gone_ns)]
        return removed, [r for r in order if r.key() in kept and r.namespace not in gone_ns]


class OwnersRequest(StrictModel):
    cluster: str
    objects: list[ObjectRef] = Field(description="The objects a run is about to write or delete.")


class ExistingObject(StrictModel):
    """One of those objects that exists, and whose it is (its owner annotation)."""

    ref: ObjectRef
    owner: Ownership | None = Field(description="None: not created by Millwright.")


class ListRequest(StrictModel):
    cluster: str
    kinds: list[KindRef]
    label_selector: str = ""
    owned_by: Ownership | None = Field(None, description="Only objects this owner holds (see Ownership).")


class CapiClusterRef(StrictModel):
    cluster: str = Field(description="The management cluster (kubeconfig context).")
    namespace: str
    name: str


class CapiClusterStatus(StrictModel):
    exists: bool
    phase: str = ""
    infrastructure_provisioned: bool = False
    control_plane_initialized: bool = False
    available: bool = False
    machines_total: int = 0
    machines_ready: int = Field(0, description="Machines with a nodeRef.")
    message: str = ""

    def ready(self) -> bool:
        # The clusterctl move pre-check plus v1beta2 Available and the e2e framework's phase.
        return (
            self.infrastructure_provisioned
            and self.control_plane_initialized
            and self.available
            and self.phase == "Provisioned"
            and self.machines_ready == self.machines_total
        )


class MachineNode(StrictModel):
    machine: str
    node: str = Field("", description="status.nodeRef.name; empty until the machine has a node.")
    control_plane: bool = False


class SecretCheck(StrictModel):
    cluster: str
    namespace: str
    name: str
    key: str


class SecretReference(StrictModel):
    """Where a credential lives; never the credential."""

    ref: str = Field(description="secret:<cluster>/<namespace>/<name>#<key>")


class VClusterStatus(StrictModel):
    exists: bool
    ready: bool = False
    phase: str = ""
    kubeconfig: SecretReference | None = None


class VClusterRef(StrictModel):
    cluster: str
    namespace: str
    name: str


class CapacityRequest(StrictModel):
    cluster: str


class QueueGuarantee(StrictModel):
    """One KAI queue as the capacity check counts it."""

    name: str
    parent: str | None = Field(None, description="spec.parentQueue (None: a top-level queue).")
    gpu_quota: float = Field(description="spec.resources.gpu.quota, in GPUs (KAI's unit); -1 unlimited.")
    tenant: str | None = Field(None, description="The tenant label: the queue of a Millwright tenant.")


class GpuCapacity(StrictModel):
    gpus: float = Field(description="Sum of allocatable nvidia.com/gpu over the cluster's nodes.")
    quotas: dict[str, float] = Field(default_factory=dict, description="Tenant → its queue's GPU quota.")
    queues: list[QueueGuarantee] = Field(default_factory=list, description="Every KAI queue: the queue tree.")


# Kubernetes' own identities: `system:authenticated`, `system:serviceaccounts`, `system:masters`, ...
SYSTEM_PREFIX = "system:"
# Groups a tenant binding never names unless the operator's setting says otherwise
# (MILLWRIGHT_RESERVED_GROUPS, activities/kube/integration.py): kubeadm binds this one to cluster-admin.
DEFAULT_RESERVED_GROUPS = ("kubeadm:cluster-admins",)


class SurveyRequest(StrictModel):
    cluster: str
    objects: list[dict[str, Any]] = Field(description="Desired objects: each is read and compared.")
    read: list[ObjectRef] = Field(default_factory=list, description="Further objects only read (a parent queue).")
    exact: list[str] = Field(default_factory=list, description="As ApplyRequest.exact, for the comparison.")


class LiveObject(StrictModel):
    """What the cluster holds under one name, and whose it is; never an object's content beyond these fields."""

    ref: ObjectRef
    exists: bool
    owner: str | None = Field(None, description="The managing workflow its owner annotation names (None: not ours).")
    tenant: str | None = Field(None, description="Its tenant label.")
    differs: bool = Field(False, description="Writing the desired object would change it.")
    labels: dict[str, str] = Field(default_factory=dict)
    parent_queue: str | None = Field(None, description="A Queue's spec.parentQueue.")
    groups: list[str] = Field(default_factory=list, description="A RoleBinding's Group subjects.")


class SurveyResult(StrictModel):
    objects: list[LiveObject]
    reserved_groups: list[str] = Field(description="The groups this cluster's operator reserves (worker setting).")


class NodeLabels(StrictModel):
    cluster: str
    labels: dict[str, str]
    label_selector: str = ""


class WorkloadQuery(StrictModel):
    cluster: str
    namespaces: list[str]
    evict: bool = Field(False, description="Delete the tenant's running pods (forced offboarding).")


class WorkloadCount(StrictModel):
    active: int
    evicted: int = 0
