"""One workflow type, two definitions whose commands differ: a run of the first replayed with the second is a
known nondeterminism (tests/test_history_replay.py, tests/worker/test_nondeterminism.py). Test-only; in a module of its
own so that the sandbox imports nothing else."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow

NAME = "ChangedShape"


@workflow.defn(name=NAME)
class Before:
    """After its `go` signal: a timer, then it waits for `finish`."""

    def __init__(self) -> None:
        self._go = self._finish = False

    @workflow.run
    async def run(self) -> str:
        await workflow.wait_condition(lambda: self._go)
        await workflow.sleep(timedelta(milliseconds=10))
        await workflow.wait_condition(lambda: self._finish)
        return "finished"

    @workflow.signal
    def go(self) -> None:
        self._go = True

    @workflow.signal
    def finish(self) -> None:
        self._finish = True


@workflow.defn(name=NAME)
class After(Before):
    """The same, its timer dropped: replaying a run of `Before` finds a TimerStarted no command scheduled."""

    @workflow.run
    async def run(self) -> str:
        await workflow.wait_condition(lambda: self._go)
        await workflow.wait_condition(lambda: self._finish)
        return "finished"
