"""The operator's controls and queries of a fleet run (pause, resume, abort, approvals, a node retried or skipped,
a compartment reset; `status` and `progress`), for any workflow that holds its `Compartments` as `self._fleet`."""

from __future__ import annotations

from temporalio import workflow

from workflows.common.base import Progress
from workflows.rollout.compartments import PROBLEM_STATES, Compartments
from workflows.rollout.models import ApproveRequest, CompartmentRequest, NodeRequest, ReasonRequest, RolloutStatus


class FleetControls:
    """The operator's controls and queries of a fleet workflow that holds its `Compartments` as `self._fleet`."""

    _fleet: Compartments

    @workflow.query(description="Run → compartment → batch → node → stage, with reasons.")
    def status(self) -> RolloutStatus:
        return self._fleet.status()

    @workflow.query(description="Short progress for pollers such as `millwright watch`.")
    def progress(self) -> Progress:
        return self._fleet.progress()

    @workflow.update(
        description="Stop admitting nodes; running nodes hold after their current stage (never mid-interrupt)."
    )
    async def pause(self, req: ReasonRequest) -> RolloutStatus:
        await self._fleet.pause(req.reason)
        return self._changed()

    @pause.validator
    def _validate_pause(self, req: ReasonRequest) -> None:
        self._fleet.require_active()
        if self._fleet.paused_reason is not None:
            raise ValueError(f"already paused: {self._fleet.paused_reason}")

    @workflow.update(description="Resume after a pause (also after a failing gate paused the run).")
    async def resume(self, req: ReasonRequest) -> RolloutStatus:
        await self._fleet.resume()
        return self._changed()

    @resume.validator
    def _validate_resume(self, req: ReasonRequest) -> None:
        self._fleet.require_active()
        if self._fleet.paused_reason is None:
            raise ValueError(f"the {self._fleet.noun} is not paused")

    @workflow.update(description="Finish the nodes in flight safely and leave every other node untouched.")
    async def abort(self, req: ReasonRequest) -> RolloutStatus:
        await self._fleet.abort(req.reason)
        return self._changed()

    @abort.validator
    def _validate_abort(self, req: ReasonRequest) -> None:
        self._fleet.require_active()

    @workflow.update(description="Approve the next batch of a compartment waiting for approval.")
    async def approve_batch(self, req: ApproveRequest) -> RolloutStatus:
        self._fleet.approve(req.compartment)
        return self._changed()

    @approve_batch.validator
    def _validate_approve(self, req: ApproveRequest) -> None:
        self._fleet.require_active()
        waiting = self._fleet.awaiting_approval()
        if not waiting:
            raise ValueError("no batch is waiting for approval")
        if req.compartment and req.compartment not in waiting:
            raise ValueError(f"compartment {req.compartment!r} is not waiting for approval; waiting: {sorted(waiting)}")

    @workflow.update(description="Put an erroring or blocked node back in line; it keeps its place in its compartment.")
    async def retry_node(self, req: NodeRequest) -> RolloutStatus:
        self._fleet.retry_node(req.node)
        return self._changed()

    @retry_node.validator
    def _validate_retry(self, req: NodeRequest) -> None:
        self._fleet.require_active()
        self._fleet.require_node(req.node, PROBLEM_STATES, "retried")

    @workflow.update(description="Never touch this node in this run (it keeps any cordon it has).")
    async def skip_node(self, req: NodeRequest) -> RolloutStatus:
        self._fleet.skip_node(req.node, req.reason)
        return self._changed()

    @skip_node.validator
    def _validate_skip(self, req: NodeRequest) -> None:
        self._fleet.require_active()
        self._fleet.require_node(req.node, ("waiting", "blocked", "erroring"), "skipped")

    @workflow.update(description="Reset a compartment's batch state (NodeWright's `dp reset`): clears a stop.")
    async def reset_batch_state(self, req: CompartmentRequest) -> RolloutStatus:
        self._fleet.reset_batch_state(req.compartment)
        return self._changed()

    @reset_batch_state.validator
    def _validate_reset(self, req: CompartmentRequest) -> None:
        self._fleet.require_active()
        if req.compartment not in self._fleet.cp.compartments:
            raise ValueError(f"unknown compartment {req.compartment!r}; known: {sorted(self._fleet.cp.compartments)}")

    # A campaign's controls of this run (workflows/campaign/): a workflow cannot send another an update, so the
    # campaign signals; a signal cannot be refused, so one the update's validator would refuse changes nothing. A
    # pause also holds a run still surveying (the campaign may pause it right after its start).
    @workflow.signal(description="The campaign's pause: as `pause`, sent by the campaign that started it.")
    async def pause_from_campaign(self, req: ReasonRequest) -> None:
        if self._fleet.aborted is None and self._fleet.paused_reason is None and not self._finished():
            await self._fleet.pause(req.reason)
            self._fleet.refresh()

    @workflow.signal(description="The campaign's resume: as `resume`, sent by the campaign that started it.")
    async def resume_from_campaign(self, req: ReasonRequest) -> None:
        if self._fleet.aborted is None and self._fleet.paused_reason is not None and not self._finished():
            await self._fleet.resume()
            self._fleet.refresh()

    @workflow.signal(description="The campaign's abort: as `abort`, sent by the campaign that started it.")
    async def abort_from_campaign(self, req: ReasonRequest) -> None:
        if self._fleet.aborted is None and not self._finished():
            await self._fleet.abort(req.reason)
            self._fleet.refresh()

    def _finished(self) -> bool:
        return self._fleet.phase in ("completed", "aborted", "planned")

    def _changed(self) -> RolloutStatus:
        self._fleet.refresh()
        return self._fleet.status()
