"""One node's part of a rollout, NodeWright's node sequence: `NodeSequence`, and `NodeUpdate`, a workflow of its own.

non-interruptible check → cordon → drain → the uninstall lane (each package whose `uninstall.apply` is set and
the node has: uninstall, then one coalesced uninstall-interrupt) → per package (dependency order):
apply|upgrade, config (each a Job with its `-check`) → one coalesced interrupt (a
reboot verified by a new bootID and the node Ready again) → post-interrupt →
the validation gate when asked (workflows/validation/gate.py: a node that fails stays cordoned, `erroring`) →
record the packages on the node (the uninstalled ones gone) → uncordon, and with `runtimeRequired` the
runtime-required taint removed, in the same write.

A node with a later version installed than the rollout's is refused at the start, before any write but its state
(`erroring`, the reason on the node), unless `allowDowngrade`. With `autoTaintNewNodes` the start gives a node no
rollout has touched NodeWright's runtime-required taint first. Every stage transition is a Kubernetes Event on the
node, and a drain that cannot progress shows as its `DrainBlocked` condition (activities/kube/node_marks.py): both are
written inside the calls below, so they cost no history event.

A node whose non-interruptible pods are still running is not cordoned: it comes back
`blocked` at once, holding only itself, and the rollout retries it later. A node that
fails stays cordoned with the reason on the node, and comes back `erroring`.

Three calls per node: `start_node_update` (its state, the non-interruptible check, the cordon,
the check again, the drain's plan) and `finish_node_update` (packages recorded, state, uncordon: one write) are
local activities, short and idempotent; between them the drain's evictions, and one heartbeating activity that
runs every stage's Job and waits for each (and for the reboot) itself: `run_node_stages`. When no validation gate
comes between, that activity makes the finish's write itself once its last stage has succeeded (STAGES_HAND_BACK),
so the node leaves as its last Job ends and costs no call of its own for it; and in a batch that holds the node's
lease, the same activity makes the start too (START_WITH_STAGES, `_start_with_stages`), so the node goes from its
cordon to its first Job at once. A pause cancels that
activity, which stops before its next stage, never inside one; on resume the stages left run as a new one. The
stage under way is on the node (the millwright.dev/rollout annotation); `status` shows the stages running.

`NodeSequence` is that sequence as workflow code: a RolloutBatch runs one per node beside its other nodes (a node
then costs its batch only its calls: about 6 history events, docs/rollouts.md), a `NodeUpdate` workflow one for a
node updated on its own.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError, CancelledError

from activities.kube.activities import KubeActivities
from activities.kube.models import (
    JOB_WAIT_SLACK_SECONDS,
    DrainPlan,
    NodeRolloutState,
    NodeStage,
    NodeStages,
    NodeStagesResult,
    NodeUpdateFinish,
    NodeUpdateStart,
    NodeUpdateStarted,
    StageRecord,
)
from activities.kube.node_plan import InterruptPlan, NodePlan, PackagePlan
from workflows.budget.leases import Lease, acquire_lease, release_lease
from workflows.common.call_options import API_CALL, API_RETRY
from workflows.common.patches import decide_early
from workflows.maintenance.drain import Drain
from workflows.maintenance.gang_drains import GangDrains
from workflows.rollout.models import (
    NodeUpdateInput,
    NodeUpdateResult,
    NodeUpdateStatus,
    NodeUpdateTemplate,
    PackageStep,
)
from workflows.rollout.spec.packages import Interrupt
from workflows.validation.gate import validate_node
from workflows.validation.models import ValidationSettings

# Long waits heartbeat; a worker that dies mid-wait is noticed this fast and the wait resumes elsewhere.
HEARTBEAT = timedelta(seconds=10)
# Retired patches (docs/patch-policy.md): every run records them deprecated, so a run that began on a build with
# `workflow.patched` replays here; the branches for runs from before them are gone.
FOLDED_CALLS = "node-update-folded-calls"  # the three calls (the module docstring)
VALIDATION = "node-update-validation"  # the validation gate between the stages and the finish
# workflow.patched() id: with no validation gate, the stages' activity hands the node back (no finish call of its own).
STAGES_HAND_BACK = "node-update-stages-hand-back"
# workflow.patched() id: a batch's node with its lease starts in its stages' activity (`_start_with_stages`).
START_WITH_STAGES = "node-update-starts-with-stages"


class ValidationFailed(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(f"validation failed: {reason}")


class StageFailed(Exception):
    def __init__(self, record: StageRecord) -> None:
        super().__init__(f"{record.package} {record.stage} failed after {record.attempts} attempts: {record.message}")
        self.record = record


@workflow.defn
class NodeUpdate:
    """One node's update as a workflow of its own: a node updated by hand, or by a batch from before INLINE_PATCH
    (workflows/rollout/rollout.py); a batch now runs each node's `NodeSequence` itself."""

    @workflow.init
    def __init__(self, inp: NodeUpdateInput) -> None:
        self._node = NodeSequence(inp, own_run=True)

    @workflow.signal(description="Finish the current stage, then hold (never inside an interrupt).")
    def pause(self) -> None:
        self._node.pause()

    @workflow.signal(description="Carry on after a pause.")
    def resume(self) -> None:
        self._node.resume()

    @workflow.query(description="Current stage and package, drain progress, stages done.")
    def status(self) -> NodeUpdateStatus:
        return self._node.status

    @workflow.run
    async def run(self, inp: NodeUpdateInput) -> NodeUpdateResult:
        return await self._node.run()


class NodeSequence:
    """One node's update, workflow code without a workflow (as workflows/maintenance/drain.py's `Drain`): run by
    its batch, beside the batch's other nodes, or by a NodeUpdate. `own_run`: the run is the node's own, which
    records the retired patches where runs from older builds had them."""

    def __init__(self, inp: NodeUpdateInput, *, own_run: bool = False, together: GangDrains | None = None) -> None:
        """`together`: the drains of the batch's nodes run at once (workflows/maintenance/gang_drains.py)."""
        self._inp = inp
        self._own_run = own_run
        self._together = together
        self.status = NodeUpdateStatus()
        self._paused = False
        self._stages_run: workflow.ActivityHandle[NodeStagesResult] | None = None

    def pause(self) -> None:
        """Finish the current stage, then hold (never inside an interrupt)."""
        self._paused = True
        self.status.paused = True
        if self._stages_run is not None:
            self._stages_run.cancel()  # the stages activity stops before its next stage

    def resume(self) -> None:
        self._paused = False
        self.status.paused = False

    async def run(self) -> NodeUpdateResult:
        inp = self._inp
        if self._own_run:
            workflow.deprecate_patch(FOLDED_CALLS)
            decide_early(STAGES_HAND_BACK)  # else decided right after the start's local activity (no drain)
        t, node = inp.template, inp.node
        result = NodeUpdateResult(node=node, outcome="complete")
        try:
            if t.out_of_service:
                if inp.lease is not None:  # granted to its batch, which asked for all its nodes at once
                    self.status.lease = inp.lease.id
                else:  # started on its own: it asks, before the cordon
                    await self._lease()
            start = NodeUpdateStart(
                cluster=t.cluster,
                node=node,
                rollout=t.rollout,
                cordon=t.out_of_service,
                non_interrupt_selector=t.non_interrupt_selector,
                drain=t.drain,
                packages={p.name: p.version for p in t.packages},
                allow_downgrade=t.allow_downgrade,
                auto_taint=t.auto_taint_new_nodes,
            )
            plan = node_plan(t)
            finish = NodeUpdateFinish(cluster=t.cluster, node=node, rollout=t.rollout, uncordon=t.out_of_service,
                                      untaint=t.runtime_required)  # fmt: skip
            validation = t.validation if t.validation is not None and t.validation.enabled else None
            first, started = await self._start(start, plan, finish if validation is None else None)
            if started is None:  # an earlier attempt of its stages' activity handed it back, its result lost
                return await self._handed_back(result)
            if started.blocked or started.refused:  # left in service, untouched but for its state
                await self._release("blocked by non-interruptible pods" if started.blocked else "downgrade refused")
                result.outcome, result.reason = (
                    ("blocked", started.blocked) if started.blocked else ("erroring", started.refused)
                )
                return result
            if t.out_of_service:
                if self._together is not None:
                    self._together.cordoned(node)
                if first is None or (started.drain is not None and started.drain.evict):  # else none to drain
                    await self._drain(started.drain, result)
            finish, handed_back = await self._stages(first, started, plan, finish, validation is None, result)
            if validation is not None:
                if self._own_run:
                    workflow.deprecate_patch(VALIDATION)
                await self._validate(validation, result)
            if not handed_back:
                await self._call(KubeActivities.finish_node_update, finish,
                                 f"record {len(finish.packages)} packages on {node}"
                                 + (f", {len(finish.removed)} uninstalled" if finish.removed else "")
                                 + (", uncordon it" if finish.uncordon else ""))  # fmt: skip
            self.status.stage, self.status.package = "complete", None
            if t.out_of_service:
                await self._release("uncordoned")
        except (StageFailed, ValidationFailed) as err:
            return await self._erroring(result, str(err))
        except (ActivityError, ApplicationError) as err:
            cause = err.cause if isinstance(err, ActivityError) and err.cause else err
            return await self._erroring(result, str(cause))
        finally:
            result.stages = self.status.stages
            result.add(self.status)
        return result

    async def _start(self, start: NodeUpdateStart, plan: NodePlan,
                     finish: NodeUpdateFinish | None) -> tuple[NodeStagesResult | None, NodeUpdateStarted | None]:  # fmt: skip
        """The node's start: in its stages' activity where it can (`_start_with_stages`, the result returned), else
        the local activity. `finish`: what hands the node back when nothing comes between its stages and it. The
        start None: an earlier attempt of that activity handed the node back already."""
        first = await self._start_with_stages(start, plan, finish)
        if first is not None:
            return first, first.started
        return None, await self._call(KubeActivities.start_node_update, start, f"start updating {self._inp.node}")

    async def _stages(self, first: NodeStagesResult | None, started: NodeUpdateStarted, plan: NodePlan,
                      finish: NodeUpdateFinish, carry_finish: bool,
                      result: NodeUpdateResult) -> tuple[NodeUpdateFinish, bool]:  # fmt: skip
        """The node's stages from the packages it was started with, after those `first` ran already; `finish` with
        its packages, and whether the stages' activity handed the node back (`carry_finish`: it may)."""
        stages, installs, removed = plan.stages_for(started.node.packages)
        finish = finish.model_copy(update={"packages": installs, "removed": removed})
        handed_back = False
        if first is not None:
            stages, handed_back = stages[len(first.stages) :], first.finished
            self._took(first, result)
        if stages and not handed_back:
            # Nothing between the stages and the finish: the stages' activity hands the node back itself.
            carried = finish if carry_finish and workflow.patched(STAGES_HAND_BACK) else None
            handed_back = await self._run_stages(stages, started.node.boot_id or "", result, carried)
        return finish, handed_back

    async def _validate(self, settings: ValidationSettings, result: NodeUpdateResult) -> None:
        """The validation gate before the uncordon; a node that fails it stays cordoned, its lease kept."""
        await self._hold("validate")
        t = self._inp.template
        result.validation = await validate_node(t.cluster, self._inp.node, settings, by=t.rollout,
                                                ordinal=self._inp.ordinal)  # fmt: skip
        if not result.validation.passed:
            raise ValidationFailed(result.validation.reason)

    async def _drain(self, plan: DrainPlan | None, result: NodeUpdateResult) -> None:
        t = self._inp.template
        await self._hold("drain")
        started = workflow.now()
        try:
            await Drain(t.cluster, self._inp.node, t.drain, self.status, stopping=lambda: False, changed=lambda: None,
                        every_planned_pod=True, together=self._together).run(plan)  # fmt: skip
        finally:
            if self._together is not None:
                await self._together.rejoin(self._inp.node)
        result.drain_seconds = (workflow.now() - started).total_seconds()
        _record_duration("millwright_drain_duration_seconds", "Time to drain a node in a rollout", result.drain_seconds)

    async def _run_stages(self, stages: list[NodeStage], boot_id: str, result: NodeUpdateResult,
                          finish: NodeUpdateFinish | None) -> bool:  # fmt: skip
        """The stages as one activity; a pause holds the node between two of them, and the rest runs on resume.
        With `finish`, the activity that runs the last stage hands the node back too: True when it did."""
        t = self._inp.template
        finished = False
        while stages:
            await self._hold(stages[0].stage, stages[0].package)
            self.status.running = [f"{s.package} {s.stage}" for s in stages]
            tries = t.stage_retries + 1
            self._stages_run = workflow.start_activity_method(
                KubeActivities.run_node_stages,
                NodeStages(cluster=t.cluster, node=self._inp.node, rollout=t.rollout, ordinal=self._inp.ordinal,
                           stages=stages, tries=tries, boot_id=boot_id,
                           reboot_timeout_seconds=t.reboot_timeout.total_seconds(), finish=finish),
                start_to_close_timeout=self._stages_timeout(stages),
                heartbeat_timeout=HEARTBEAT,
                retry_policy=API_RETRY,
                cancellation_type=workflow.ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
                summary=", ".join(self.status.running),
            )  # fmt: skip
            ran = await self._stages_activity() or NodeStagesResult(stages=[], held=True)  # paused before it started
            self._took(ran, result)
            stages, finished = stages[len(ran.stages) :], ran.finished
        return finished

    async def _stages_activity(self) -> NodeStagesResult | None:
        """The stages' activity started in `_stages_run`, awaited; None when a pause cancelled it before it started."""
        assert self._stages_run is not None
        try:
            return await self._stages_run
        except ActivityError as err:
            if not isinstance(err.cause, CancelledError):
                raise
            return None
        finally:
            self._stages_run, self.status.running = None, []

    def _took(self, ran: NodeStagesResult, result: NodeUpdateResult) -> None:
        """What a stages' activity ran, in the status and the result; the first failed stage raised."""
        self.status.stages += ran.stages
        if ran.stages:
            self.status.stage, self.status.package = ran.stages[-1].stage, ran.stages[-1].package
        if ran.reboot_seconds is not None:
            result.reboot_seconds = ran.reboot_seconds
            _record_duration("millwright_reboot_duration_seconds", "Time for a node to reboot and be Ready",
                             ran.reboot_seconds)  # fmt: skip
        failed = next((r for r in ran.stages if not r.succeeded), None)
        if failed is not None:
            raise StageFailed(failed)

    async def _start_with_stages(self, start: NodeUpdateStart, plan: NodePlan,
                                 finish: NodeUpdateFinish | None) -> NodeStagesResult | None:  # fmt: skip
        """The node's start and its stages in one activity (START_WITH_STAGES), in a batch's runs that have it and
        with the node's lease held: a node then goes from its cordon to its first Job at once, where the start as a
        local activity held every node of the batch until the last one's start was done (the workflow task that
        schedules their stages waits for all its local activities). It runs the stages only when the start left
        nothing to drain; else it returns after the start, and the node drains and goes on as before. None: not
        asked here, or a pause cancelled it before it started."""
        t = self._inp.template
        if self._own_run or self._paused or (t.out_of_service and self._inp.lease is None):
            return None
        if not workflow.patched(START_WITH_STAGES):
            return None
        finish = finish if finish is not None and workflow.patched(STAGES_HAND_BACK) else None
        # The most the plan can make: every package due, every uninstall due, two reboots.
        worst = plan.stages_for({})[0] + plan.stages_for({p.name: "" for p in plan.uninstall})[0]
        self._stages_run = workflow.start_activity_method(
            KubeActivities.run_node_stages,
            NodeStages(cluster=t.cluster, node=self._inp.node, rollout=t.rollout, ordinal=self._inp.ordinal,
                       tries=t.stage_retries + 1, reboot_timeout_seconds=t.reboot_timeout.total_seconds(),
                       finish=finish, start=start, plan=plan),
            start_to_close_timeout=self._stages_timeout(worst) + t.reboot_timeout + API_CALL["start_to_close_timeout"],
            heartbeat_timeout=HEARTBEAT,
            retry_policy=API_RETRY,
            cancellation_type=workflow.ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
            summary=f"start {self._inp.node}, then its stages",
        )  # fmt: skip
        return await self._stages_activity()

    def _stages_timeout(self, stages: list[NodeStage]) -> timedelta:
        """Each Job's own deadline bounds its stage; the activity waits a little longer for each verdict."""
        t = self._inp.template
        tries = t.stage_retries + 1
        return t.reboot_timeout + sum(
            (timedelta(seconds=s.timeout_seconds + JOB_WAIT_SLACK_SECONDS) * tries for s in stages),
            timedelta(minutes=1))  # fmt: skip

    async def _handed_back(self, result: NodeUpdateResult) -> NodeUpdateResult:
        """The node's update was done by an earlier attempt of its stages' activity, its result lost."""
        self.status.stage, self.status.package = "complete", None
        if self._inp.template.out_of_service:
            await self._release("uncordoned")
        return result

    async def _hold(self, stage: str, package: str | None = None) -> None:
        """Hold here while paused, then record where the node is."""
        await workflow.wait_condition(lambda: not self._paused)
        self.status.stage, self.status.package = stage, package

    async def _lease(self) -> Lease:
        """Wait for the cluster's disruption budget to let the node out of service (before the cordon)."""
        t = self._inp.template

        def waiting(lease: Lease) -> None:
            self.status.stage = "waiting-for-budget"
            self.status.waiting_for = f"{lease.id}: queued #{lease.position}; {lease.note}"

        # A node asks itself when started without its lease (by hand, or by a batch from before SIGNAL_PATCH).
        # Paused, the node gives its place up.
        lease = await acquire_lease(t.cluster, self._inp.node, reason=f"rollout {t.rollout}",
                                    budget=t.disruption_budget, paused=lambda: self._paused, waiting=waiting)  # fmt: skip
        assert lease is not None  # never cancelled
        self.status.lease, self.status.waiting_for = lease.id, ""
        return lease

    async def _release(self, reason: str) -> None:
        """Return the lease once the node is back in service; a node left cordoned keeps it."""
        if self.status.lease is not None:
            await release_lease(self._inp.template.cluster, self._inp.node, reason=reason)
            self.status.lease = None

    # ------------------------------------------------------------ bookkeeping

    async def _call(self, method, arg, summary: str):
        """A short, idempotent Kubernetes call, as a local activity."""
        return await workflow.execute_local_activity_method(method, arg, **API_CALL, summary=summary)

    async def _erroring(self, result: NodeUpdateResult, reason: str) -> NodeUpdateResult:
        # The node keeps its cordon: it must not take work until someone looks.
        t, status = self._inp.template, self.status
        state = NodeRolloutState(cluster=t.cluster, node=self._inp.node, rollout=t.rollout, state="erroring",
                                 package=status.package, stage=status.stage, reason=reason[:1000])  # fmt: skip
        await self._call(KubeActivities.set_node_rollout_state, state, f"mark {self._inp.node} erroring")
        result.outcome, result.reason = "erroring", reason
        return result


def node_plan(t: NodeUpdateTemplate) -> NodePlan:
    """The template's packages as the stages' plan (activities/kube/node_plan.py)."""

    def package(p: PackageStep) -> PackagePlan:
        return PackagePlan(name=p.name, version=p.version, image=p.image, config=p.config,
                           has_interrupt=p.has_interrupt, timeout_seconds=p.stage_timeout.total_seconds())  # fmt: skip

    def interrupt(i: Interrupt | None) -> InterruptPlan | None:
        return None if i is None else InterruptPlan(type=i.type, services=i.services)

    return NodePlan(packages=[package(p) for p in t.packages], uninstall=[package(p) for p in t.uninstall],
                    interrupt=interrupt(t.interrupt), uninstall_interrupt=interrupt(t.uninstall_interrupt))  # fmt: skip


def _record_duration(name: str, description: str, seconds: float) -> None:
    workflow.metric_meter().create_histogram_float(name, description, "s").record(seconds)
