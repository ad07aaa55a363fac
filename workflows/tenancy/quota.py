"""UpdateTenantQuota: change a tenant's GPU quota (its KAI queue and ResourceQuotas) in place, within the
cluster's GPU capacity. The queue and the namespaces' GPU caps always agree: the cap comes from the new limit,
else the new guarantee, and goes when both are unlimited (the input's overrides: models.GpuQuotaChecks)."""

from __future__ import annotations

from temporalio import workflow
from temporalio.exceptions import ApplicationError

from activities.capi.activities import ClusterApiActivities
from activities.capi.models import ApplyRequest, KindRef, ListRequest
from activities.capi.ownership import TENANT_LABEL, Ownership
from activities.models import StrictModel
from workflows.clusters.manifests import QUEUE_API
from workflows.common import search_attributes as sa
from workflows.common.base import Phases, Progress
from workflows.common.call_options import API_CALL, LONG_CALL
from workflows.common.endpoints import Endpoints, kubernetes_api
from workflows.tenancy.capacity import check_queue_tree, read_capacity
from workflows.tenancy.models import UpdateTenantQuotaInput
from workflows.tenancy.objects import set_gpu_cap
from workflows.tenancy.plan import EXACT

# The capacity check counts the queue tree's guarantees (an unlimited one as every GPU), after reading the tenant's
# queue (its parent): a retired patch (docs/patch-policy.md), recorded deprecated.
QUEUE_TREE_CAPACITY = "quota-checks-queue-tree"


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
        workflow.deprecate_patch(QUEUE_TREE_CAPACITY)
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
        queue = next((o for o in objs if o["kind"] == "Queue"), None)
        if queue is None:
            raise ApplicationError(
                f"tenant {inp.tenant} is not onboarded on {inp.cluster} (no queue)",
                type="TenantNotFound",
                non_retryable=True,
            )
        self._phases.enter("checking", "GPU capacity: the queue tree's guarantees")
        cap = await read_capacity(self._calls, inp.cluster)
        parent = queue["spec"].get("parentQueue") or ""
        check_queue_tree(cap, inp.cluster, inp.tenant, parent, inp.gpu.quota, inp.allow_oversubscription)
        desired = []
        for o in objs:
            if o["kind"] == "Queue":
                o["spec"]["resources"]["gpu"] = inp.gpu.kai()
            else:  # the cap follows the queue, a removed one included (EXACT: the update drops it)
                set_gpu_cap(o["spec"].setdefault("hard", {}), inp.gpu)
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
                cluster=inp.cluster,
                owner=owner,
                run=workflow.info().run_id,
                objects=desired,
                on_difference="update",
                exact=EXACT,
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
