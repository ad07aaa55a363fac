"""NodeUpdate: one node's part of a rollout, NodeWright's node sequence as a child workflow.

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

Three calls per node (`FOLDED_CALLS`): `start_node_update` (its state, the non-interruptible check, the cordon,
the check again, the drain's plan) and `finish_node_update` (packages recorded, state, uncordon: one write) are
local activities, short and idempotent; between them the drain's evictions, and one heartbeating activity that
runs every stage's Job and waits for each (and for the reboot) itself: `run_node_stages`. A pause cancels that
activity, which stops before its next stage, never inside one; on resume the stages left run as a new one. The
stage under way is on the node (the millwright.dev/rollout annotation); `status` shows the stages running.

History events per node (W = a workflow task, 3 events), counted from tests/histories/:
  Before, one activity per Kubernetes call (`_run_per_call`, node_update_batch_lease.json): 96 for one package with
    a reboot and one pod to evict: 15 activities (3 events + W each: state, cordon, drain plan, eviction, wait for
    the pod, inspect, apply, config, state, interrupt, reboot wait, post-interrupt, record, uncordon, state) and
    the lease's release (1).
  After (node_update_folded.json): started 1 and W; FOLDED_CALLS' marker and search attribute 2; the start 1; the
    stages activity 3 + W; the finish and the release 1 each; completed 1: 16 with no pod to evict. Each pod
    evicted adds its eviction (3, and a W unless evictions share one) and the wait for the pods to go 3 + W once:
    one pod, 28. A pause adds the cancellation and a W, and a new stages activity (3 + W) for what is left.
  Its batch adds 3 per node (child initiated, started, completed) and a share of its workflow tasks.
  With `validation` (VALIDATION, node_update_validated.json): its marker and search attribute 2, the GPU check 3 + W,
    the verdict on the node 1: 9 more; a load window and a validation Job 3 + W each (that history: 21 more, 37).
    A node failing its GPU check ends there (node_update_validation_failed.json, 24).
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError, CancelledError

from activities.kube.activities import KubeActivities
from activities.kube.models import (
    JOB_WAIT_SLACK_SECONDS,
    CordonRequest,
    DrainPlan,
    NodeRef,
    NodeRolloutState,
    NodeStage,
    NodeStages,
    NodeStagesResult,
    NodeUpdateFinish,
    NodeUpdateStart,
    PackageInstalled,
    PodQuery,
    RebootWait,
    StageJobRequest,
    StageRecord,
)
from workflows.budget.leases import LEASE_PATCH, Lease, acquire_lease, release_lease
from workflows.common.call_options import API_CALL, API_RETRY
from workflows.maintenance.drain import Drain
from workflows.rollout.models import NodeUpdateInput, NodeUpdateResult, NodeUpdateStatus, PackageStep
from workflows.rollout.spec.packages import Interrupt
from workflows.validation.gate import validate_node
from workflows.validation.models import ValidationSettings

# Long waits heartbeat; a worker that dies mid-wait is noticed this fast and the wait resumes elsewhere.
HEARTBEAT = timedelta(seconds=10)
# workflow.patched() id of the three-call shape (module docstring); runs from before replay `_run_per_call`.
FOLDED_CALLS = "node-update-folded-calls"
# workflow.patched() id of the validation gate between the stages and the finish (workflows/validation/gate.py).
VALIDATION = "node-update-validation"


class ValidationFailed(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(f"validation failed: {reason}")


class StageFailed(Exception):
    def __init__(self, record: StageRecord) -> None:
        super().__init__(f"{record.package} {record.stage} failed after {record.attempts} attempts: {record.message}")
        self.record = record


@workflow.defn
class NodeUpdate:
    @workflow.init
    def __init__(self, inp: NodeUpdateInput) -> None:
        self._inp = inp
        self._status = NodeUpdateStatus()
        self._paused = False
        self._stages_run: workflow.ActivityHandle[NodeStagesResult] | None = None

    @workflow.signal(description="Finish the current stage, then hold (never inside an interrupt).")
    def pause(self) -> None:
        self._paused = True
        self._status.paused = True
        if self._stages_run is not None:
            self._stages_run.cancel()  # the stages activity stops before its next stage

    @workflow.signal(description="Carry on after a pause.")
    def resume(self) -> None:
        self._paused = False
        self._status.paused = False

    @workflow.query(description="Current stage and package, drain progress, stages done.")
    def status(self) -> NodeUpdateStatus:
        return self._status

    @workflow.run
    async def run(self, inp: NodeUpdateInput) -> NodeUpdateResult:
        if not workflow.patched(FOLDED_CALLS):
            return await self._run_per_call(inp)
        t, node = inp.template, inp.node
        result = NodeUpdateResult(node=node, outcome="complete")
        try:
            if t.out_of_service:
                if inp.lease is not None:  # granted to its batch, which asked for all its nodes at once
                    self._status.lease = inp.lease.id
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
            started = await self._call(KubeActivities.start_node_update, start, f"start updating {node}", local=True)
            if started.blocked or started.refused:  # left in service, untouched but for its state
                await self._release("blocked by non-interruptible pods" if started.blocked else "downgrade refused")
                result.outcome, result.reason = (
                    ("blocked", started.blocked) if started.blocked else ("erroring", started.refused)
                )
                return result
            if t.out_of_service:
                await self._drain(started.drain, result)
            installed = started.node.packages
            due = [p for p in t.packages if installed.get(p.name) != p.version]
            # What it uninstalls runs the scripts of the version the node has.
            removing = [p.model_copy(update={"version": installed[p.name]}) for p in t.uninstall if p.name in installed]
            stages = self._uninstall_stages(removing) + self._stages_of(due, installed)
            if stages:
                await self._run_stages(stages, started.node.boot_id or "", result)
            if t.validation is not None and t.validation.enabled and workflow.patched(VALIDATION):
                await self._validate(t.validation, result)
            finish = NodeUpdateFinish(cluster=t.cluster, node=node, rollout=t.rollout,
                                      packages={p.name: p.version for p in due}, removed=[p.name for p in removing],
                                      uncordon=t.out_of_service, untaint=t.runtime_required)  # fmt: skip
            await self._call(KubeActivities.finish_node_update, finish, f"record {len(due)} packages on {node}"
                             + (f", {len(removing)} uninstalled" if removing else "")
                             + (", uncordon it" if finish.uncordon else ""), local=True)  # fmt: skip
            self._status.stage, self._status.package = "complete", None
            if t.out_of_service:
                await self._release("uncordoned")
        except (StageFailed, ValidationFailed) as err:
            return await self._erroring(result, str(err), local=True)
        except (ActivityError, ApplicationError) as err:
            cause = err.cause if isinstance(err, ActivityError) and err.cause else err
            return await self._erroring(result, str(cause), local=True)
        finally:
            result.stages = self._status.stages
        return result

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
        await Drain(t.cluster, self._inp.node, t.drain, self._status, stopping=lambda: False, changed=lambda: None,
                    every_planned_pod=True).run(plan)  # fmt: skip
        result.drain_seconds = (workflow.now() - started).total_seconds()
        _record_duration("millwright_drain_duration_seconds", "Time to drain a node in a rollout", result.drain_seconds)

    def _stages_of(self, due: list[PackageStep], installed: dict[str, str]) -> list[NodeStage]:
        """NodeWright's order: each package's apply|upgrade and config, one interrupt, the post-interrupt stages."""
        interrupt = self._inp.template.interrupt
        stages = [_stage(p, s) for p in due for s in ("upgrade" if p.name in installed else "apply", "config")]
        if interrupt is not None and interrupt.type != "noop" and due:
            stages.append(_stage(next((p for p in due if p.has_interrupt), due[0]), "interrupt", interrupt))
        return stages + [_stage(p, "post-interrupt") for p in due if p.has_interrupt]

    def _uninstall_stages(self, removing: list[PackageStep]) -> list[NodeStage]:
        """NodeWright's uninstall lane, before the install lane: each package's uninstall (dependents first), then
        one uninstall-interrupt for those with an interrupt, their own interrupts coalesced."""
        interrupt = self._inp.template.uninstall_interrupt
        stages = [_stage(p, "uninstall") for p in removing]
        owner = next((p for p in removing if p.has_interrupt), None)
        if interrupt is not None and interrupt.type != "noop" and owner is not None:
            stages.append(_stage(owner, "uninstall-interrupt", interrupt))
        return stages

    async def _run_stages(self, stages: list[NodeStage], boot_id: str, result: NodeUpdateResult) -> None:
        """The stages as one activity; a pause holds the node between two of them, and the rest runs on resume."""
        t = self._inp.template
        while stages:
            await self._hold(stages[0].stage, stages[0].package)
            self._status.running = [f"{s.package} {s.stage}" for s in stages]
            tries = t.stage_retries + 1
            self._stages_run = workflow.start_activity_method(
                KubeActivities.run_node_stages,
                NodeStages(cluster=t.cluster, node=self._inp.node, rollout=t.rollout, ordinal=self._inp.ordinal,
                           stages=stages, tries=tries, boot_id=boot_id,
                           reboot_timeout_seconds=t.reboot_timeout.total_seconds()),
                # Each Job's own deadline bounds its stage; the activity waits a little longer for each verdict.
                start_to_close_timeout=t.reboot_timeout + sum(
                    (timedelta(seconds=s.timeout_seconds + JOB_WAIT_SLACK_SECONDS) * tries for s in stages),
                    timedelta(minutes=1)),
                heartbeat_timeout=HEARTBEAT,
                retry_policy=API_RETRY,
                cancellation_type=workflow.ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
                summary=", ".join(self._status.running),
            )  # fmt: skip
            try:
                ran = await self._stages_run
            except ActivityError as err:
                if not isinstance(err.cause, CancelledError):
                    raise
                ran = NodeStagesResult(stages=[], held=True)  # paused before it started
            finally:
                self._stages_run, self._status.running = None, []
            self._status.stages += ran.stages
            if ran.stages:
                self._status.stage, self._status.package = ran.stages[-1].stage, ran.stages[-1].package
            if ran.reboot_seconds is not None:
                result.reboot_seconds = ran.reboot_seconds
                _record_duration("millwright_reboot_duration_seconds", "Time for a node to reboot and be Ready",
                                 ran.reboot_seconds)  # fmt: skip
            failed = next((r for r in ran.stages if not r.succeeded), None)
            if failed is not None:
                raise StageFailed(failed)
            stages = stages[len(ran.stages) :]

    async def _hold(self, stage: str, package: str | None = None) -> None:
        """Hold here while paused, then record where the node is."""
        await workflow.wait_condition(lambda: not self._paused)
        self._status.stage, self._status.package = stage, package

    # ------------------------------------------------------------ the shape before FOLDED_CALLS

    async def _run_per_call(self, inp: NodeUpdateInput) -> NodeUpdateResult:
        """One activity per Kubernetes call: runs started before FOLDED_CALLS (their histories replay here)."""
        t, node = inp.template, inp.node
        cordon = CordonRequest(cluster=t.cluster, node=node, owner=t.rollout, reason=f"rollout {t.rollout}")
        result = NodeUpdateResult(node=node, outcome="complete")
        await self._state("in_progress")
        try:
            if t.interrupt is not None:
                if inp.lease is not None:  # granted to its batch, which asked for all its nodes at once
                    self._status.lease = inp.lease.id
                if await self._protected_pods_running():
                    await self._release("blocked by non-interruptible pods")
                    return await self._blocked(result, "non-interruptible pods running")
                if inp.lease is None and workflow.patched(LEASE_PATCH):
                    await self._lease()
                held = await self._call(KubeActivities.cordon_node, cordon, f"cordon {node}")
                # A pod may have landed between the check and the cordon: look again, now
                # that nothing new can.
                if await self._protected_pods_running():
                    if held.owned:
                        await self._call(KubeActivities.uncordon_node, cordon, f"uncordon {node}")
                    await self._release("blocked by non-interruptible pods")
                    return await self._blocked(result, "non-interruptible pods running")
                started = workflow.now()
                await self._step("drain")
                await Drain(t.cluster, node, t.drain, self._status, stopping=lambda: False, changed=lambda: None).run()
                result.drain_seconds = (workflow.now() - started).total_seconds()
                _record_duration(
                    "millwright_drain_duration_seconds", "Time to drain a node in a rollout", result.drain_seconds
                )
            info = await self._call(
                KubeActivities.inspect_node, NodeRef(cluster=t.cluster, node=node), f"inspect {node}"
            )
            due = [p for p in t.packages if info.packages.get(p.name) != p.version]
            for package in due:
                first = "upgrade" if package.name in info.packages else "apply"
                await self._stage(package, first)
                await self._stage(package, "config")
            if t.interrupt is not None and t.interrupt.type != "noop" and due:
                # Stages before the interrupt do not reboot: the boot ID read above is current.
                result.reboot_seconds = await self._interrupt(t.interrupt, due, info.boot_id or "")
            for package in due:
                if package.has_interrupt:
                    await self._stage(package, "post-interrupt")
            for package in due:
                await self._call(
                    KubeActivities.record_package_installed,
                    PackageInstalled(cluster=t.cluster, node=node, package=package.name, version=package.version),
                    f"record {package.name} {package.version}",
                )
            if t.interrupt is not None:
                await self._call(KubeActivities.uncordon_node, cordon, f"uncordon {node}")
                await self._release("uncordoned")
            await self._state("complete")
        except StageFailed as err:
            return await self._erroring(result, str(err))
        except (ActivityError, ApplicationError) as err:
            cause = err.cause if isinstance(err, ActivityError) and err.cause else err
            return await self._erroring(result, str(cause))
        finally:
            result.stages = self._status.stages
        return result

    # ------------------------------------------------------------ steps

    async def _protected_pods_running(self) -> bool:
        t = self._inp.template
        if not t.non_interrupt_selector:
            return False
        query = PodQuery(cluster=t.cluster, node=self._inp.node, label_selector=t.non_interrupt_selector)
        pods = await self._call(KubeActivities.list_unfinished_pods, query, "list non-interruptible pods")
        return bool(pods)

    async def _stage(self, package: PackageStep, stage: str, interrupt: Interrupt | None = None) -> None:
        """Run one stage Job, retried up to `stage_retries` times; raises StageFailed."""
        t = self._inp.template
        await self._step(stage, package.name)
        attempts, message = 0, ""
        while attempts <= t.stage_retries:
            attempts += 1
            job = await workflow.execute_activity_method(
                KubeActivities.run_stage_job,
                StageJobRequest(
                    cluster=t.cluster,
                    node=self._inp.node,
                    rollout=t.rollout,
                    package=package.name,
                    version=package.version,
                    image=package.image,
                    stage=stage,
                    interrupt=interrupt.type if interrupt else None,
                    services=interrupt.services if interrupt else [],
                    config=package.config,
                    ordinal=self._inp.ordinal,
                    timeout_seconds=package.stage_timeout.total_seconds(),
                    try_number=attempts,
                ),
                # The Job's own deadline bounds the stage; the activity waits a little longer.
                start_to_close_timeout=package.stage_timeout + timedelta(minutes=2),
                heartbeat_timeout=HEARTBEAT,
                retry_policy=API_RETRY,
                summary=f"{package.name} {stage} (try {attempts})",
            )
            message = job.message
            if job.succeeded:
                self._status.stages.append(
                    StageRecord(package=package.name, stage=stage, succeeded=True, attempts=attempts)
                )
                return
        record = StageRecord(package=package.name, stage=stage, succeeded=False, attempts=attempts, message=message)
        self._status.stages.append(record)
        raise StageFailed(record)

    async def _interrupt(self, interrupt: Interrupt, due: list[PackageStep], boot_id: str) -> float | None:
        """One interrupt for every package due on this node; a reboot is verified by bootID."""
        t, node = self._inp.template, self._inp.node
        owner = next((p for p in due if p.has_interrupt), due[0])
        if interrupt.type != "reboot":
            await self._stage(owner, "interrupt", interrupt)
            return None
        started = workflow.now()
        await self._stage(owner, "interrupt", interrupt)
        await workflow.execute_activity_method(
            KubeActivities.wait_node_rebooted,
            RebootWait(
                cluster=t.cluster,
                node=node,
                previous_boot_id=boot_id,
                timeout_seconds=t.reboot_timeout.total_seconds(),
            ),
            start_to_close_timeout=t.reboot_timeout + timedelta(minutes=1),
            heartbeat_timeout=HEARTBEAT,
            retry_policy=API_RETRY,
            summary=f"wait for {node} to come back with a new boot ID",
        )
        seconds = (workflow.now() - started).total_seconds()
        _record_duration("millwright_reboot_duration_seconds", "Time for a node to reboot and be Ready", seconds)
        return seconds

    async def _lease(self) -> Lease:
        """Wait for the cluster's disruption budget to let the node out of service (before the cordon)."""
        t = self._inp.template

        def waiting(lease: Lease) -> None:
            self._status.stage = "waiting-for-budget"
            self._status.waiting_for = f"{lease.id}: queued #{lease.position}; {lease.note}"

        # A node asks itself when started without its lease (by hand, or by a batch from before SIGNAL_PATCH).
        # Paused, the node gives its place up.
        lease = await acquire_lease(t.cluster, self._inp.node, reason=f"rollout {t.rollout}",
                                    budget=t.disruption_budget, paused=lambda: self._paused, waiting=waiting)  # fmt: skip
        assert lease is not None  # never cancelled
        self._status.lease, self._status.waiting_for = lease.id, ""
        return lease

    async def _release(self, reason: str) -> None:
        """Return the lease once the node is back in service; a node left cordoned keeps it."""
        if self._status.lease is not None:
            await release_lease(self._inp.template.cluster, self._inp.node, reason=reason)
            self._status.lease = None

    # ------------------------------------------------------------ bookkeeping

    async def _call(self, method, arg, summary: str, *, local: bool = False):
        if local:
            return await workflow.execute_local_activity_method(method, arg, **API_CALL, summary=summary)
        return await workflow.execute_activity_method(method, arg, **API_CALL, summary=summary)

    async def _step(self, stage: str, package: str | None = None) -> None:
        """Hold here while paused, then record where the node is; the interrupt on the node too."""
        await workflow.wait_condition(lambda: not self._paused)
        self._status.stage, self._status.package = stage, package
        if stage == "interrupt":  # why a node goes NotReady, for whoever looks at it
            await self._state("in_progress", stage=stage, package=package)

    async def _state(self, state: str, *, stage: str | None = None, package: str | None = None, reason: str = "",
                     local: bool = False) -> None:  # fmt: skip
        t = self._inp.template
        await self._call(
            KubeActivities.set_node_rollout_state,
            NodeRolloutState(
                cluster=t.cluster,
                node=self._inp.node,
                rollout=t.rollout,
                state=state,
                package=package,
                stage=stage,
                reason=reason,
            ),
            f"mark {self._inp.node} {state}",
            local=local,
        )

    async def _blocked(self, result: NodeUpdateResult, reason: str) -> NodeUpdateResult:
        await self._state("blocked", reason=reason)
        result.outcome, result.reason = "blocked", reason
        return result

    async def _erroring(self, result: NodeUpdateResult, reason: str, *, local: bool = False) -> NodeUpdateResult:
        # The node keeps its cordon: it must not take work until someone looks.
        await self._state("erroring", stage=self._status.stage, package=self._status.package, reason=reason[:1000],
                          local=local)  # fmt: skip
        result.outcome, result.reason = "erroring", reason
        return result


def _stage(package: PackageStep, name: str, interrupt: Interrupt | None = None) -> NodeStage:
    return NodeStage(package=package.name, version=package.version, image=package.image, stage=name,
                     interrupt=interrupt.type if interrupt else None, services=interrupt.services if interrupt else [],
                     config=package.config, timeout_seconds=package.stage_timeout.total_seconds())  # fmt: skip


def _record_duration(name: str, description: str, seconds: float) -> None:
    workflow.metric_meter().create_histogram_float(name, description, "s").record(seconds)
