"""NodeRemediation's approval gate: a step in `require_approval_for` waits, visibly (phase `awaiting-approval`, the
status's `awaiting_approval`), for an operator's `approve` / `reject` update, or `approval_timeout`, then
`default_on_timeout` applies. The updates are the workflow's; the book of decisions and the wait are here."""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from temporalio import workflow

from workflows.remediation.models import (
    Approval,
    AwaitingApproval,
    NodeRemediationInput,
    NodeRemediationStatus,
    Step,
)


class Rejected(Exception):
    """The step was rejected (by whom: the message)."""


class Approvals:
    def __init__(self, inp: NodeRemediationInput, status: NodeRemediationStatus,
                 enter: Callable[[str, str], None]) -> None:  # fmt: skip
        self._inp, self._status, self._enter = inp, status, enter
        self._decisions: dict[Step, tuple[Literal["approve", "reject"], Approval]] = {}

    def check(self, req: Approval) -> None:
        """An update's validator: a step waits, and it is the one named."""
        waiting = self._status.awaiting_approval
        if waiting is None:
            raise ValueError(f"no step is waiting for approval (phase {self._status.phase})")
        if req.step is not None and req.step != waiting.step:
            raise ValueError(f"step {req.step} is not waiting for approval; {waiting.step} is")

    def decide(self, decision: Literal["approve", "reject"], req: Approval) -> NodeRemediationStatus:
        waiting = self._status.awaiting_approval
        if waiting is not None and waiting.step not in self._decisions:
            self._decisions[waiting.step] = (decision, req)
        return self._status

    async def wait(self, step: Step, interrupted: Callable[[], bool]) -> str:
        """Until decided, `interrupted()` (the caller then ends the step), or the default after approval_timeout.
        Returns who approved; raises Rejected."""
        inp = self._inp
        deadline = workflow.now() + inp.approval_timeout
        self._status.awaiting_approval = AwaitingApproval(step=step, deadline=deadline.isoformat(),
                                                          default=inp.default_on_timeout)  # fmt: skip
        self._enter("awaiting-approval", f"{step}: `approve` or `reject` (default {inp.default_on_timeout} "
                                         f"at {deadline.isoformat()})")  # fmt: skip
        try:
            await workflow.wait_condition(lambda: step in self._decisions or interrupted(),
                                          timeout=inp.approval_timeout, timeout_summary=f"approval of {step}")  # fmt: skip
            if step not in self._decisions:
                return ""
            decision, req = self._decisions[step]
            who = f"{req.by}" + (f": {req.comment}" if req.comment else "")
        except TimeoutError:
            decision, who = inp.default_on_timeout, f"default on timeout ({inp.approval_timeout})"
        finally:
            self._status.awaiting_approval = None
        if decision == "reject":
            raise Rejected(who)
        return who
