"""Waiting for a rollout's maintenance window, the wait's end an event in the history."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

from temporalio import workflow

from workflows.rollout.batching import next_window_open
from workflows.rollout.spec.admission import MaintenanceWindow

# workflow.patched() id: a wait for a maintenance window that ends because its timer fired (sized to the window's
# opening) lets the next look pass the window, where runs from before asked the clock again, which a worker resuming
# late (or a replay) may read differently. Decided when such a timer fired (the engine runs no local activity), or
# at a batch's start when it has windows (its nodes may run local activities: docs/patch-policy.md).
WINDOW_BY_TIMER = "rollout-window-opens-by-timer"


async def sleep_until_window(windows: list[MaintenanceWindow], wake: Callable[[], bool]) -> bool:
    """Until the next window opens (the clock sizes the timer) or `wake()`; True when the timer fired: the wait
    ended at the window's opening, an event in the history (WINDOW_BY_TIMER). No window within 8 days (invalid
    windows): an hour's wait, after which the clock is asked again."""
    opens = next_window_open(windows, workflow.now())
    wait = (opens - workflow.now()) if opens else timedelta(hours=1)
    try:
        await workflow.wait_condition(
            wake, timeout=max(wait, timedelta(seconds=1)), timeout_summary="maintenance window closed"
        )
    except TimeoutError:
        return opens is not None
    return False
