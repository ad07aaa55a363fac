"""How long a rollout's batch gate has been failing, per compartment, decided by a timer."""

from __future__ import annotations

from datetime import datetime, timedelta

from temporalio import workflow

from workflows.common.deadlines import Deadline

# workflow.patched() id: a failing batch gate pauses the run when a timer started at its first failing look fires,
# not by the clock of the look that follows; decided at that first failing look, after the gate's activities.
GATE_TIMEOUT_BY_TIMER = "rollout-gate-timeout-by-timer"


class GateClock:
    """Each compartment's failing gate: since its first failing look, by a timer started there
    (GATE_TIMEOUT_BY_TIMER), in runs from before by the clock."""

    def __init__(self) -> None:
        self._failing_since: dict[str, datetime] = {}  # runs from before GATE_TIMEOUT_BY_TIMER
        self._deadlines: dict[str, Deadline] = {}

    def deadline(self, name: str) -> Deadline | None:
        return self._deadlines.get(name)

    def timed_out(self, name: str, timeout: timedelta) -> bool:
        """The compartment's gate failed this look: whether it has failed for `timeout` since its first failing look."""
        if name not in self._deadlines and name not in self._failing_since:
            if workflow.patched(GATE_TIMEOUT_BY_TIMER):
                self._deadlines[name] = Deadline(timeout, f"batch gate of {name} failing for {timeout}")
            else:
                self._failing_since[name] = workflow.now()
        if (deadline := self._deadlines.get(name)) is not None:
            return deadline.passed
        return workflow.now() - self._failing_since[name] >= timeout

    def passed(self, name: str) -> None:
        """The gate passed, or the run paused on it: a later failing look counts from itself."""
        if (deadline := self._deadlines.pop(name, None)) is not None:
            deadline.cancel()
        self._failing_since.pop(name, None)
