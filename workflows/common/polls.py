"""A poll for a state (a cluster ready, a tenant's pods gone) bounded by a timeout, decided by a timer's firing.

Runs with the wait's patch decide the timeout by a `Deadline` (workflows/common/deadlines.py), started at the first
answer that is not the awaited one: a run whose first answer is costs no event, one that polls costs four (the
patch's marker and its search attribute; the timer's start, then its cancel or firing). Runs from before the patch
keep the clock, counted from the wait's start, as their histories hold. The patch is decided at that first answer,
after an activity, never after a local one (docs/patch-policy.md).

    with PollDeadline(timeout, PATCH, "why") as deadline:
        while not ready(await read()):
            if deadline.passed():
                raise ...
            await deadline.sleep(interval)
"""

from __future__ import annotations

from datetime import timedelta
from types import TracebackType

from temporalio import workflow

from workflows.common.deadlines import Deadline


class PollDeadline:
    def __init__(self, timeout: timedelta, patch: str, summary: str) -> None:
        self.timeout, self._patch, self._summary = timeout, patch, summary
        self._by_clock = workflow.now() + timeout  # runs from before the patch
        self._deadline: Deadline | None = None
        self._decided = False

    def passed(self) -> bool:
        """After an answer that is not the awaited one: whether the poll gives up."""
        if not self._decided:
            self._decided = True
            if workflow.patched(self._patch):
                self._deadline = Deadline(self.timeout, self._summary)
        if self._deadline is None:
            return workflow.now() >= self._by_clock
        return self._deadline.passed

    async def sleep(self, interval: timedelta) -> None:
        """Until the next look; cut short when the deadline passes (the look after it is the last)."""
        if self._deadline is None:
            await workflow.sleep(interval)
        else:
            await self._deadline.wait(lambda: False, at_most=interval)

    def __enter__(self) -> PollDeadline:
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        if self._deadline is not None:  # the poll is over: its timer would fire for nothing (three events)
            self._deadline.cancel()
