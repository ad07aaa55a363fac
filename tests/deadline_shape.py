"""A run that waits for an activity's answer with a `Deadline` (workflows/common/deadlines.py), for
tests/workflows/test_deadlines.py. Test-only; in a module of its own so that the sandbox imports nothing else."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ApplicationError

from activities.models import StrictModel
from workflows.common.deadlines import Deadline

ANSWER = "answer"  # the activity, run by a worker of its own on `activity_queue`


class AnswerDue(StrictModel):
    seconds: float
    activity_queue: str


class Answered(StrictModel):
    clock_past: bool  # what `workflow.now() >= deadline` (the code before the timer) would have decided on


@workflow.defn(name="AnswerDue")
class AnswerDueWorkflow:
    """Completes when the answer came before the deadline's timer fired; fails ("timed out") when it did not:
    another command, so a replay that decided otherwise would fail for nondeterminism."""

    @workflow.run
    async def run(self, inp: AnswerDue) -> Answered:
        deadline = Deadline(timedelta(seconds=inp.seconds), "the answer is due")
        answer = workflow.start_activity(ANSWER, task_queue=inp.activity_queue,
                                         start_to_close_timeout=timedelta(minutes=1))  # fmt: skip
        in_time = await deadline.wait(answer.done)
        clock_past = workflow.now() >= deadline.at
        if not in_time:
            raise ApplicationError(f"timed out (clock past the deadline: {clock_past})", type="TimedOut",
                                   non_retryable=True)  # fmt: skip
        deadline.cancel()
        return Answered(clock_past=clock_past)
