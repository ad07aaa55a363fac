"""The tenant workflows' inputs: OnboardTenant, OffboardTenant and UpdateTenantQuota.

Each workflow's result lives beside it (workflows/tenancy/onboarding.py, offboarding.py, quota.py): the results
carry the InfiniBand children's results, which live beside those workflows; the inputs stay here, where the
objects onboarding writes (workflows/tenancy/objects.py) are built from them.

Every tenant workflow has the ID `tenant/<cluster>/<tenant>` (TenantRef.workflow_id), so double submissions
collapse and one tenant's onboarding, quota change and offboarding never run at once.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Literal

from pydantic import ConfigDict, Field, ValidationInfo, field_validator, model_validator
from temporalio.common import SearchAttributePair

from activities.capi.models import SYSTEM_PREFIX
from activities.kube.validators import validate_object_name
from activities.models import StrictModel
from activities.ufm.posture import BlockingCode
from workflows.clusters.manifests import TENANTS_PARENT_QUEUE
from workflows.common import search_attributes as sa
from workflows.common.base import WorkflowInput
from workflows.common.endpoints import RetryTimeout
from workflows.fabric.calls import validate_fabric_name

UNLIMITED = -1.0  # KAI's "no bound" for a queue's quota or limit


class QueueQuota(StrictModel):
    """One KAI resource: quota (guaranteed), limit (-1: none) and over-quota weight; finite numbers only (a NaN or
    Infinity reaches KAI as null)."""

    model_config = ConfigDict(allow_inf_nan=False)

    quota: float = Field(
        0, description="Guaranteed amount, at least 0; -1 unlimited (GPU: see unlimited_gpu_guarantee)."
    )
    limit: float = Field(-1, description="Ceiling, at least quota; -1 no limit (0 would mean: nothing beyond quota).")
    over_quota_weight: float = Field(1, ge=0)

    @field_validator("quota")
    @classmethod
    def _quota(cls, v: float) -> float:
        if v < 0 and v != UNLIMITED:
            raise ValueError(f"{v:g} is neither an amount (at least 0) nor -1 (unlimited)")
        return v

    @field_validator("limit")
    @classmethod
    def _limit(cls, v: float, info: ValidationInfo) -> float:
        quota = info.data.get("quota")
        if v == UNLIMITED or quota is None:
            return v
        if quota == UNLIMITED:
            raise ValueError(f"{v:g} is below the unlimited quota (-1); an unlimited quota takes limit -1")
        if v < quota:
            raise ValueError(f"{v:g} is below quota {quota:g}: a limit is -1 (none) or at least the quota")
        return v

    def kai(self) -> dict:
        return {"quota": self.quota, "limit": self.limit, "overQuotaWeight": self.over_quota_weight}


class GpuQuotaChecks(StrictModel):
    """The overrides a GPU guarantee beyond the cluster's capacity needs, shared by onboarding and a quota change."""

    allow_oversubscription: bool = Field(False, description="Allow the tenants' GPU quotas to exceed capacity.")
    unlimited_gpu_guarantee: bool = Field(
        False,
        description="Allow gpu.quota -1 (KAI's unlimited guarantee: the tenant may claim every GPU); needs "
        "allow_oversubscription too.",
    )

    def _check_unlimited(self, gpu: QueueQuota) -> None:
        if gpu.quota == UNLIMITED and not (self.unlimited_gpu_guarantee and self.allow_oversubscription):
            raise ValueError(
                "gpu.quota -1 is an unlimited guarantee (the tenant may claim every GPU of the cluster): it needs "
                "both unlimited_gpu_guarantee: true and allow_oversubscription: true"
            )
        if self.unlimited_gpu_guarantee and gpu.quota != UNLIMITED:
            raise ValueError(f"unlimited_gpu_guarantee is only for gpu.quota -1 (got {gpu.quota:g})")


class AdminGroupChange(StrictModel):
    """Who moves an onboarded tenant's administration to another group, and why (recorded in the result and in
    the tenant's NetBox journal)."""

    by: str = Field(min_length=1, description="Who asks for the change (a person or ticket system identity).")
    reason: str = Field(min_length=1, description="Why, e.g. the ticket that approved it.")


def validate_group(value: str) -> str:
    """A group Millwright may bind: never one of Kubernetes' own (`system:*`: every authenticated user, every
    service account, the cluster's superusers). The groups an operator reserves are refused by the planning
    step (activities/capi/survey.py reads the worker's setting)."""
    if not value.strip():
        raise ValueError("an empty group name")
    if value.startswith(SYSTEM_PREFIX):
        raise ValueError(f"{value!r} is a Kubernetes system group ({SYSTEM_PREFIX}*): it spans other tenants")
    return value


class TenantRef(WorkflowInput, RetryTimeout):
    tenant: str = Field(description="Tenant slug: namespace, queue and vCluster names derive from it.")
    cluster: str = Field(description="Target cluster reference (a context, or <management>:<ns>/<name>).")

    _tenant = field_validator("tenant")(validate_object_name)

    def workflow_id(self) -> str:
        return f"tenant/{self.cluster}/{self.tenant}"

    def search_attributes(self) -> list[SearchAttributePair]:
        return [SearchAttributePair(sa.CLUSTER, self.cluster), SearchAttributePair(sa.TENANT, self.tenant)]


class OnboardTenantInput(TenantRef, GpuQuotaChecks):
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
    admin_group: str | None = Field(
        None,
        description="Identity group bound to the `admin` ClusterRole of the tenant's namespaces; never a `system:` "
        "group nor one the operator reserves. Changing it on an onboarded tenant needs admin_group_change.",
    )
    admin_group_change: AdminGroupChange | None = Field(
        None, description="Confirms, with who and why, that this run moves the tenant's admin group."
    )
    network_isolation: bool = True
    ib_isolation: bool = Field(False, description="InfiniBand partition isolation: a UFM PKey for ib_hosts.")
    ib_fabric: str | None = Field(None, description="The InfiniBand fabric (its UFM) when ib_isolation, e.g. lab-ib.")
    ib_hosts: list[str] = Field(
        default_factory=list,
        description="When ib_isolation: the hosts the tenant's workloads may use (UFM system names = NetBox "
                    "devices); all their HCA ports join the tenant's PKey.",
    )  # fmt: skip
    ib_accept_posture: list[BlockingCode] = Field(
        default_factory=list,
        description="When ib_isolation: isolate although the fabric has these blocking posture findings "
                    "(IsolateTenant's accept_posture, docs/fabric.md 'Fabric posture'); each is named in the result.",
    )  # fmt: skip
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

    @field_validator("admin_group")
    @classmethod
    def _group(cls, v: str | None) -> str | None:
        return validate_group(v) if v is not None else v

    @model_validator(mode="after")
    def _unlimited(self) -> OnboardTenantInput:
        self._check_unlimited(self.gpu)
        return self

    @model_validator(mode="after")
    def _ib(self) -> OnboardTenantInput:
        if self.ib_isolation:
            if not self.ib_fabric or not self.ib_hosts:
                raise ValueError("ib_isolation needs ib_fabric and ib_hosts (the hosts the tenant's workloads use)")
            validate_fabric_name(self.ib_fabric)
            if len(set(self.ib_hosts)) != len(self.ib_hosts) or not all(h.strip() for h in self.ib_hosts):
                raise ValueError("ib_hosts must be unique, non-empty host names")
        elif self.ib_fabric or self.ib_hosts or self.ib_accept_posture:
            raise ValueError("ib_fabric, ib_hosts and ib_accept_posture are only for ib_isolation=true")
        return self

    def all_namespaces(self) -> list[str]:
        return self.namespaces or [self.tenant]


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


class UpdateTenantQuotaInput(TenantRef, GpuQuotaChecks):
    """Change a tenant's GPU quota (KAI queue and ResourceQuota) in place."""

    gpu: QueueQuota

    @model_validator(mode="after")
    def _unlimited(self) -> UpdateTenantQuotaInput:
        self._check_unlimited(self.gpu)
        return self
