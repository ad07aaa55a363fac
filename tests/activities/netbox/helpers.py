"""Test-only pieces for the NetBox tier: a workflow that calls one activity by name, and
NetBox activities that can crash an attempt right after a write (to prove retries are safe)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from pydantic import BaseModel, Field
from temporalio import activity, workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from activities.netbox.activities import NetBoxActivities


class CallInput(BaseModel):
    activity: str
    arg: dict[str, Any]
    maximum_attempts: int = 5


class CallOutput(BaseModel):
    result: Any = None


@workflow.defn
class CallNetBox:
    """Runs one NetBox activity through Temporal, as a real workflow would (retries included)."""

    @workflow.run
    async def run(self, inp: CallInput) -> CallOutput:
        result = await workflow.execute_activity(
            inp.activity,
            inp.arg,
            start_to_close_timeout=timedelta(seconds=60),
            retry_policy=RetryPolicy(
                initial_interval=timedelta(milliseconds=200), backoff_coefficient=1.0,
                maximum_attempts=inp.maximum_attempts,
            ),
        )  # fmt: skip
        return CallOutput(result=result)


class InjectedCrash(Exception):
    """Stands for a worker dying mid-activity: raised after a write, on the first attempt only."""


class CrashingNetBoxActivities(NetBoxActivities):
    """NetBox activities whose first attempt fails right after a chosen write, when armed."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.crash_after: set[str] = set()
        self.crashes: list[str] = []

    def _after_write(self, what: str) -> None:
        if what in self.crash_after and activity.info().attempt == 1:
            self.crashes.append(what)
            raise InjectedCrash(f"injected crash after writing {what}")


class Seen(BaseModel):
    """Every workflow run the tier started, for the history scan."""

    ids: list[str] = Field(default_factory=list)
