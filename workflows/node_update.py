"""NodeUpdate: one node's part of a rollout, NodeWright's node sequence as a child workflow.

non-interruptible check → cordon → drain → per package (dependency order):
apply|upgrade, config (each a Job with its `-check`) → one coalesced interrupt (a
reboot verified by a new bootID and the node Ready again) → post-interrupt →
record the packages on the node → uncordon.

A node whose non-interruptible pods are still running is not cordoned: it comes back
`blocked` at once, holding only itself, and the rollout retries it later. A node that
fails stays cordoned with the reason on the node, and comes back `erroring`.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError

from activities.kube import (
    CordonRequest,
    KubeActivities,
    NodeRef,
    NodeRolloutState,
    PackageInstalled,
    PodQuery,
    RebootWait,
    StageJobRequest,
)
from workflows.drain import API_CALL, API_RETRY, Drain
from workflows.leases import LEASE_PATCH, Lease, acquire_lease, release_lease
from workflows.rollout_models import NodeUpdateInput, NodeUpdateResult, NodeUpdateStatus, PackageStep, StageRecord
from workflows.rollout_spec import Interrupt

# Long waits heartbeat; a worker that dies mid-wait is noticed this fast and the wait resumes elsewhere.
HEARTBEAT = timedelta(seconds=10)


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

    @workflow.signal(description="Finish the current stage, then hold (never inside an interrupt).")
    def pause(self) -> None:
        self._paused = True
        self._status.paused = True

    @workflow.signal(description="Carry on after a pause.")
    def resume(self) -> None:
        self._paused = False
        self._status.paused = False

    @workflow.query(description="Current stage and package, drain progress, stages done.")
    def status(self) -> NodeUpdateStatus:
        return self._status

    @workflow.run
    async def run(self, inp: NodeUpdateInput) -> NodeUpdateResult:
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
                _record_duration("millwright_drain_duration_seconds", "Time to drain a node in a rollout", result.drain_seconds)
            info = await self._call(KubeActivities.inspect_node, NodeRef(cluster=t.cluster, node=node), f"inspect {node}")
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
                self._status.stages.append(StageRecord(package=package.name, stage=stage, succeeded=True, attempts=attempts))
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

        # Only a batch from before SIGNAL_PATCH starts a node without its lease. Paused, the node gives its place up.
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

    async def _call(self, method, arg, summary: str):
        return await workflow.execute_activity_method(method, arg, **API_CALL, summary=summary)

    async def _step(self, stage: str, package: str | None = None) -> None:
        """Hold here while paused, then record where the node is; the interrupt on the node too."""
        await workflow.wait_condition(lambda: not self._paused)
        self._status.stage, self._status.package = stage, package
        if stage == "interrupt":  # why a node goes NotReady, for whoever looks at it
            await self._state("in_progress", stage=stage, package=package)

    async def _state(self, state: str, *, stage: str | None = None, package: str | None = None, reason: str = "") -> None:
        t = self._inp.template
        await self._call(
            KubeActivities.set_node_rollout_state,
            NodeRolloutState(
                cluster=t.cluster, node=self._inp.node, rollout=t.rollout, state=state, package=package, stage=stage, reason=reason
            ),
            f"mark {self._inp.node} {state}",
        )

    async def _blocked(self, result: NodeUpdateResult, reason: str) -> NodeUpdateResult:
        await self._state("blocked", reason=reason)
        result.outcome, result.reason = "blocked", reason
        return result

    async def _erroring(self, result: NodeUpdateResult, reason: str) -> NodeUpdateResult:
        # The node keeps its cordon: it must not take work until someone looks.
        await self._state("erroring", stage=self._status.stage, package=self._status.package, reason=reason[:1000])
        result.outcome, result.reason = "erroring", reason
        return result


def _record_duration(name: str, description: str, seconds: float) -> None:
    workflow.metric_meter().create_histogram_float(name, description, "s").record(seconds)
