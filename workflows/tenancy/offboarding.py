"""OffboardTenant: remove everything onboarding created for a tenant (only what the tenant's workflows manage),
after its workloads end or are evicted; release its InfiniBand PKey; mark it in NetBox."""

from __future__ import annotations

from pydantic import Field
from temporalio import workflow
from temporalio.exceptions import ApplicationError

from activities.capi.activities import ClusterApiActivities
from activities.capi.models import DeleteRequest, KindRef, ListRequest, WorkloadQuery
from activities.capi.ownership import TENANT_LABEL, Ownership
from activities.models import StrictModel
from activities.netbox.activities import NetBoxActivities
from activities.netbox.models import TenantSpec
from workflows.clusters.manifests import QUEUE_API
from workflows.common import search_attributes as sa
from workflows.common.base import Phases, Progress
from workflows.common.call_options import API_CALL, LONG_CALL
from workflows.common.endpoints import NETBOX, Endpoints, kubernetes_api
from workflows.common.polls import PollDeadline
from workflows.fabric.calls import call_fabric
from workflows.fabric.release import ReleaseTenantResult, release_as_child
from workflows.tenancy.models import OffboardTenantInput
from workflows.tenancy.objects import IB_FABRIC_ANNOTATION, TENANT_KINDS, delete_order

# The workloads wait gives up when its timer fires, not by the clock of the task that reads the pods
# (workflows/common/polls.py); runs from before keep the clock.
WORKLOADS_WAIT_BY_TIMER = "offboard-tenant-workloads-wait-by-timer"


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
        summary = f"{inp.tenant}'s pods gone within {inp.workloads_timeout}"
        with PollDeadline(inp.workloads_timeout, WORKLOADS_WAIT_BY_TIMER, summary) as deadline:
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
                if deadline.passed():
                    raise ApplicationError(
                        f"{w.active} tenant pods still running after {inp.workloads_timeout}; "
                        "offboard with force to evict them",
                        type="WorkloadsRunning",
                        non_retryable=True,
                    )
                await deadline.sleep(inp.poll_interval)
        released = await self._release_ib(inp)  # onboarding's last step, undone first
        self._phases.enter("removing", f"{len(live)} objects")
        order = delete_order(live)
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
        return await release_as_child(fabric, inp.tenant, inp.record_in_netbox)
