"""OnboardTenant: a team on a shared GPU cluster with its own vCluster, KAI Scheduler queue (GPU quota) and
guard rails.

Onboarding first plans, writing nothing: every name it would write judged against what exists and whose it is,
the parent queue, the admin group and the queue tree's GPU guarantees (workflows/tenancy/plan.py); a refusal ends
the run there. Then a saga of idempotent steps: NetBox tenant → the objects of
workflows/tenancy/objects.py, step by step → vCluster ready + kubeconfig Secret `vc-<name>`, kept as a reference →
InfiniBand isolation (when `ib_isolation`: the `IsolateTenant` child workflow puts `ib_hosts` into the tenant's
PKey on `ib_fabric`; its compensation is the `ReleaseTenant` child). A step that fails for good undoes, in
reverse order, what this run created, and the run fails with a report of what was created and removed
(workflows/common/saga.py). What this run created is read from the cluster: every object it writes carries its
owner annotation with this run's ID (activities/capi/ownership.py `Ownership`), so an object whose create answer was lost
(the write done, the connection dropped) is undone too, and nothing another run or a person owns is ever
deleted. A second onboarding with the same input writes nothing; a changed input updates objects in place and
removes the tenant's objects no longer desired (only those this tenant's workflows manage).

The InfiniBand children have the IDs `isolate-tenant/<fabric>/<tenant>` and `release-tenant/<fabric>/<tenant>`
(the same as when they are started on their own, so a standalone run and an onboarding of the same tenant never
overlap).
"""

from __future__ import annotations

from datetime import timedelta

from pydantic import Field
from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError, ChildWorkflowError

from activities.capi.activities import ClusterApiActivities
from activities.capi.models import (
    ApplyRequest,
    DeleteRequest,
    DiscoveryRequest,
    KindRef,
    ListRequest,
    ObjectRef,
    VClusterRef,
)
from activities.capi.ownership import TENANT_LABEL, Ownership
from activities.models import StrictModel
from activities.netbox.activities import NetBoxActivities
from activities.netbox.models import TenantJournal, TenantSpec
from workflows.common import saga
from workflows.common import search_attributes as sa
from workflows.common.base import Phases, Progress
from workflows.common.call_options import API_CALL, LONG_CALL
from workflows.common.endpoints import NETBOX, Endpoints, kubernetes_api
from workflows.common.errors import root_cause
from workflows.common.polls import PollDeadline
from workflows.fabric.calls import call_fabric
from workflows.fabric.isolation import IsolateTenant, IsolateTenantInput, IsolateTenantResult
from workflows.fabric.release import release_as_child
from workflows.tenancy.capacity import read_capacity
from workflows.tenancy.models import OnboardTenantInput
from workflows.tenancy.objects import TENANT_KINDS, delete_order, tenant_steps
from workflows.tenancy.plan import EXACT, AdminGroupChanged, TenantPlan, plan_onboarding, survey_request


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
    plan: TenantPlan | None = Field(None, description="What the run found before its first write, and meant to do.")
    admin_group_changed: AdminGroupChanged | None = Field(None, description="Who moved the tenant's admin group.")


def isolation_of(inp: OnboardTenantInput) -> IsolateTenantInput:
    """The IsolateTenant child's input for an onboarding with ib_isolation."""
    assert inp.ib_fabric
    return IsolateTenantInput(
        fabric=inp.ib_fabric,
        tenant=inp.tenant,
        tenant_name=inp.display_name or None,
        hosts=inp.ib_hosts,
        netbox=inp.record_in_netbox,
        retry_timeout=inp.retry_timeout,
        accept_posture=inp.ib_accept_posture,
    )


# Retired patches (docs/patch-policy.md), recorded deprecated: compensation by ownership (read from the cluster);
# the plan before the first write (workflows/tenancy/plan.py).
OWNED_COMPENSATION = "compensate-what-the-run-owns"
PLAN_BEFORE_WRITES = "plan-before-first-write"
# The vCluster wait gives up when its timer fires, not by the clock of the task that reads the vCluster
# (workflows/common/polls.py); runs from before keep the clock.
VCLUSTER_WAIT_BY_TIMER = "onboard-tenant-vcluster-wait-by-timer"


@workflow.defn
class OnboardTenant:
    @workflow.init
    def __init__(self, inp: OnboardTenantInput) -> None:
        self._phases = Phases(finished=("completed", "compensated", "failed", "refused"))
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
        workflow.deprecate_patch(PLAN_BEFORE_WRITES)
        result.plan = await self._plan(inp, every)  # a refusal ends the run here, nothing written: no saga to undo
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
            for i, (name, objs) in enumerate(steps):
                self._phases.enter(name, f"{len(objs)} objects", i + 2)
                if not objs:
                    continue
                applied = await self._calls.execute(
                    acts.apply_objects,
                    ApplyRequest(
                        cluster=inp.cluster, owner=owner, run=run, objects=objs, on_difference="update", exact=EXACT
                    ),
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
            stale = delete_order([r for r in live if (r.kind, r.namespace, r.name) not in want])
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
            workflow.deprecate_patch(OWNED_COMPENSATION)
            made, removed = await self._compensate_owned(inp, created, every)
            failure = saga.failure(
                f"onboarding {inp.tenant} on {inp.cluster}", err, made, removed, type="OnboardingFailed"
            )
            self._phases.enter("compensated", failure.message)
            raise failure from err
        if result.plan is not None and result.plan.admin_group_change is not None:
            result.admin_group_changed = await self._record_admin_change(inp, result.plan.admin_group_change)
        result.steps = reports  # the model copied the list it was given
        self._phases.enter(
            "completed",
            "changed" if result.changed else "already onboarded: nothing changed",
            self._phases.progress.total,
        )
        return result

    async def _check_kinds(self, inp: OnboardTenantInput, every: list[dict]) -> None:
        await self._calls.execute(
            ClusterApiActivities.check_kinds_installed,
            DiscoveryRequest(cluster=inp.cluster, kinds=KindRef.of_objects(every)),
            **API_CALL,
            endpoint=kubernetes_api(inp.cluster),
        )

    async def _plan(self, inp: OnboardTenantInput, every: list[dict]) -> TenantPlan:
        """Read what every name holds and the queue tree, and judge them (workflows/tenancy/plan.py); shows the
        plan, or ends the run refused."""
        self._phases.enter("planning", f"{len(every)} objects, parent queue {inp.parent_queue}, GPU capacity", 0)
        await self._check_kinds(inp, every)
        seen = await self._calls.execute(
            ClusterApiActivities.survey_objects,
            survey_request(inp, every),
            **API_CALL,
            endpoint=kubernetes_api(inp.cluster),
        )
        cap = await read_capacity(self._calls, inp.cluster)
        try:
            plan = plan_onboarding(inp, workflow.info().workflow_id, every, seen, cap)
        except ApplicationError as refusal:
            self._phases.enter("refused", refusal.message)
            raise
        self._phases.enter("planned", plan.summary(), 1)
        return plan

    async def _record_admin_change(self, inp: OnboardTenantInput, change: AdminGroupChanged) -> AdminGroupChanged:
        """The admin group moved: journaled on the NetBox tenant, with who and why."""
        if inp.record_in_netbox:
            await self._calls.execute(
                NetBoxActivities.journal_tenant,
                TenantJournal(tenant=inp.tenant, text=change.journal(), kind="warning"),
                **API_CALL,
                endpoint=NETBOX,
            )
        return change

    async def _wait_vcluster(self, inp: OnboardTenantInput) -> str:
        ref = VClusterRef(cluster=inp.cluster, namespace=inp.all_namespaces()[0], name=inp.tenant)
        delay = timedelta(milliseconds=250)
        summary = f"vCluster {inp.tenant} ready within {inp.vcluster_ready_timeout}"
        with PollDeadline(inp.vcluster_ready_timeout, VCLUSTER_WAIT_BY_TIMER, summary) as deadline:
            while True:
                st = await self._calls.execute(
                    ClusterApiActivities.read_vcluster, ref, **API_CALL, endpoint=kubernetes_api(inp.cluster)
                )
                if st.ready and st.kubeconfig:
                    return st.kubeconfig.ref
                self._phases.enter("vcluster", f"waiting for vCluster {inp.tenant}: {st.phase or 'pending'}")
                if deadline.passed():
                    raise ApplicationError(
                        f"vCluster {inp.tenant} not ready after {inp.vcluster_ready_timeout}",
                        type="VClusterNotReady",
                        non_retryable=True,
                    )
                await deadline.sleep(delay)
                delay = min(delay * 2, timedelta(seconds=10))

    async def _isolate(self, inp: OnboardTenantInput, done: int) -> IsolateTenantResult:
        """The InfiniBand step: the IsolateTenant child. Compensation releases the PKey only when the tenant held
        none before this run (a failed re-onboarding never cuts an isolated tenant's running jobs off)."""
        assert inp.ib_fabric
        self._phases.enter("infiniband", f"PKey on {inp.ib_fabric} for {', '.join(inp.ib_hosts)}", done)
        before = await call_fabric(inp.ib_fabric, "state")
        self._ib_release = inp.tenant not in (before.get("allocations") or {})
        child = isolation_of(inp)
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
        owned = await self._calls.execute(
            ClusterApiActivities.list_objects,
            ListRequest(
                cluster=inp.cluster, kinds=TENANT_KINDS, label_selector=f"{TENANT_LABEL}={inp.tenant}", owned_by=mine
            ),
            **API_CALL,
            endpoint=kubernetes_api(inp.cluster),
        )
        position = {ObjectRef.of(o).key(): i for i, o in enumerate(every)}
        refs = list({r.key(): r for r in created + owned}.values())
        refs.sort(key=lambda r: position.get(r.key(), len(position)))  # creation order
        made = [str(r) for r in refs] + made_ib + [p for p in self._ib_created if p not in made_ib]
        if refs:
            order = list(reversed(refs))
            done = await self._calls.execute(
                ClusterApiActivities.delete_objects,
                DeleteRequest(cluster=inp.cluster, objects=order, owned_by=mine),
                **LONG_CALL,
                endpoint=kubernetes_api(inp.cluster),
            )
            removed += [str(r) for r in done.account(order, owned)[0]]
        return made, removed

    async def _release_ib_step(self, inp: OnboardTenantInput) -> list[str]:
        """The InfiniBand step undone (ReleaseTenant) when this run gave the tenant its PKey."""
        if not (self._ib_release and inp.ib_fabric):
            return []
        rel = await release_as_child(inp.ib_fabric, inp.tenant, inp.record_in_netbox)
        if not rel.pkey:
            return []
        what = f"PKey {rel.pkey} on {inp.ib_fabric}"
        if what not in self._ib_created:  # IsolateTenant failed after allocating it
            self._ib_created.append(what)
        return [what]
