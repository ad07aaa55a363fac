"""NodeRemediation's success check after a step: look again every `settle_poll_interval` until the node shows no
problem, for at most `settle_timeout`.

Runs since `PATCH` end the wait when a timer fires (workflows/common/deadlines.py), not by the clock of the workflow
task that looks: a worker resuming late looks again as the history reads. The timer starts once a look finds
problems (decided there, after the look's activities), so a node clear at the first look costs no event; one that
waits costs two (the timer's start, then its firing or cancel), and the run its patch marker and upsert once.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import timedelta

from temporalio import workflow

from workflows.common.deadlines import Deadline
from workflows.remediation.models import NodeRemediationInput

PATCH = "remediation-settle-timer"  # workflow.patched() id
SUMMARY = "let the node settle"


async def settled(inp: NodeRemediationInput, look: Callable[[], Awaitable[list[str]]],
                  waiting: Callable[[], None]) -> list[str]:  # fmt: skip
    """`look()` until it finds no problem or `settle_timeout` has passed; the last look's problems. `waiting()`:
    before each wait."""
    started = workflow.now()
    timer: Deadline | None = None
    while problems := await look():
        if timer is None and workflow.patched(PATCH):
            timer = Deadline(inp.settle_timeout, "the node settles", since=started)
        remaining = started + inp.settle_timeout - workflow.now()  # sizes the wait only, once `timer` runs
        if timer.passed if timer is not None else remaining <= timedelta(0):
            return problems
        waiting()
        if timer is not None:
            await timer.wait(lambda: False, at_most=inp.settle_poll_interval, summary=SUMMARY)
        else:
            await workflow.sleep(min(inp.settle_poll_interval, remaining), summary=SUMMARY)
    if timer is not None:
        timer.cancel()
    return []
