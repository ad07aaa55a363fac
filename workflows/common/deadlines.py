"""A deadline decided by a timer's firing, never by the clock a workflow task sees.

`workflow.now()` is the time of the task that runs the code, not part of the history: a worker that resumes a run
late (it was down, or its task timed out and another worker took it) sees a clock past a deadline that the history
had not reached when the awaited activity ended, and a replay may see another clock again
(docs/disruption-budget.md, "Determinism"). `Deadline` starts one timer for the whole wait; it has passed once
that timer fired, an event ordered in the history against the activity results and signals the wait is for, so a
live run and its replay decide the same. The clock only sizes the waits inside the deadline (`left`) and the text
that shows it (`at`).

Cost: two history events per deadline (TimerStarted, then TimerFired or TimerCanceled); a timer started and
cancelled in the same workflow task costs none. A wait that often ends at its first look (no pod to wait for, a
node already healthy) starts its deadline only once that look says it must wait, counted from the wait's start
(`since`), so it costs nothing then.

What came in the same workflow task as the timer's firing (a worker that was down while both happened) is in time
for `wait`, whatever their order in that task: the condition is read once the task's events are all applied.
"""

from __future__ import annotations

import asyncio
import contextlib
from datetime import datetime, timedelta

from temporalio import workflow

# The least a wait sized by `left` may be: a timer of zero is no wait, and the deadline's own timer decides anyway.
LEAST_WAIT = timedelta(seconds=1)


class Deadline:
    """``deadline = Deadline(timeout, "why")``; ``deadline.passed`` once its timer fired; ``deadline.cancel()``
    when the wait is over before it (else the timer fires later, three events more)."""

    def __init__(self, after: timedelta, summary: str, *, since: datetime | None = None) -> None:
        """`since`: when the wait began, if earlier than now (its timer runs for what is left, sized by the clock)."""
        self.after = after
        self.at: datetime = (since or workflow.now()) + after  # for display; `passed` decides
        rest = self.at - workflow.now()
        self._passed = rest <= timedelta(0)
        self._timer: asyncio.Future[None] | None = None
        if not self._passed:
            self._timer = asyncio.ensure_future(self._fire(rest, summary))

    async def _fire(self, after: timedelta, summary: str) -> None:
        await workflow.sleep(after, summary=summary)
        self._passed = True

    @property
    def passed(self) -> bool:
        """True once the deadline's timer fired (in the history), whatever the clock says."""
        return self._passed

    def left(self, least: timedelta = LEAST_WAIT) -> timedelta:
        """What is left by the clock, at least `least`: to size a wait or an activity's timeout, never to decide."""
        return max(self.at - workflow.now(), least)

    async def wait(self, condition, *, at_most: timedelta | None = None, summary: str | None = None) -> bool:
        """Until `condition()`, the deadline passes or `at_most` (a poll interval); True when `condition()`."""
        with contextlib.suppress(TimeoutError):
            await workflow.wait_condition(lambda: condition() or self._passed,
                                          timeout=at_most, timeout_summary=summary)  # fmt: skip
        return bool(condition())

    def cancel(self) -> None:
        """The wait ended first: cancel the timer (in the same task as its start, no event at all)."""
        if self._timer is not None and not self._timer.done():
            self._timer.cancel()
