"""Calls to external endpoints (BMCs, NetBox, UFM, Kubernetes APIs, webhooks), retried in visible, bounded rounds.

A call that fails for a reason a retry may fix (the endpoint does not answer, answers 5xx or 429) is not left
to retry silently inside one activity for an hour. `Endpoints.execute` schedules the activity with a few SDK
retries per round (`ROUND_ATTEMPTS`, the caller's backoff continued from round to round); when a round runs out,
the run shows the endpoint, the last error, the attempt count and since when (`Progress.waiting`, current
details) and starts the next round, until the call has failed for the input's `retry_timeout`. Then the run gets
a non-retryable `EndpointUnavailable` naming the endpoint and the setting that bounds the wait.

The run gives up when a timer started at the call's first failed round fires (sized by the clock to `retry_timeout`
from the first failing attempt), or when a round outlasts that time: the history decides it, never the clock of the
task that sees a round fail, which a worker resuming late reads past the bound (workflows/common/deadlines.py).

Event cost: nothing on the happy path (one activity, as before). While failing, 6 history events per round
(activity scheduled, started, failed; one workflow task), two patch markers per run (4 events), the deadline's
timer (2 events: started, then cancelled when the call answers or gives up, or fired), and a timer (5 events) only
when the endpoint asked for a delay (Retry-After). With the usual 1 s initial and 30 s maximum interval, rounds
last ~3 s, ~16 s, then ~60 s (3 attempts 30 s apart): about 6 events per failing minute, ~75 for a call that
gives up after 10 minutes (12 rounds and the marker).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from pydantic import Field, field_validator
from temporalio import workflow
from temporalio.common import Priority, RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, RetryState

from activities.kube.validators import validate_positive_duration
from activities.models import StrictModel
from activities.redfish import BmcRef
from workflows.common.deadlines import LEAST_WAIT, Deadline
from workflows.common.errors import error_text

# The endpoints' names as runs show them (an activity's error adds the URL the worker is configured with).
NETBOX, UFM, IRONIC = "NetBox", "UFM", "Ironic"


def kubernetes_api(cluster: str) -> str:
    return f"Kubernetes API of cluster {cluster}"


def bmc_endpoint(bmc: BmcRef) -> str:
    return f"BMC {bmc.url}"


ROUND_ATTEMPTS = 3
DEFAULT_RETRY_TIMEOUT = timedelta(minutes=10)
# Histories from before the rounds raised the activity's error where a round now ends; replays take that path.
RETRY_ROUNDS_PATCH = "endpoint-retry-rounds"
# A failing call gives up when its timer fires (workflows/common/deadlines.py), not by the clock of the task that
# sees its last round fail; histories from before decide on that clock.
GIVES_UP_BY_TIMER = "endpoint-gives-up-by-timer"
SHOWN_WAITS = 10  # current details and `progress` stay small however many calls fail at once
RETRYING = "**retrying**"  # how a wait's line starts in current details


def human(d: timedelta) -> str:
    """10m, 1h30m, 45s."""
    seconds = int(d.total_seconds())
    parts = [(seconds // 3600, "h"), (seconds % 3600 // 60, "m"), (seconds % 60, "s")]
    return "".join(f"{n}{unit}" for n, unit in parts if n) or "0s"


class RetryTimeout(StrictModel):
    """The bound on every call the workflow makes to an external endpoint."""

    retry_timeout: timedelta = Field(
        DEFAULT_RETRY_TIMEOUT,
        description="How long one call to an external endpoint (BMC, NetBox, UFM, Kubernetes API) may keep failing "
        "for a reason a retry may fix (no answer, 5xx, 429) before the run gives up with EndpointUnavailable. "
        "Meanwhile `progress.waiting` names the endpoint, the error, the attempts and since when.",
    )

    _positive = field_validator("retry_timeout")(validate_positive_duration)


class EndpointWait(StrictModel):
    """A call that keeps failing for a reason a retry may fix, while it is retried."""

    endpoint: str = Field(description="e.g. BMC https://10.0.0.5, NetBox, Kubernetes API of cluster lab.")
    call: str = Field(description="What the call does (the activity's summary).")
    error: str = Field(description="The last attempt's error.")
    attempts: int = Field(description="Attempts so far (at least).")
    since: datetime = Field(description="When the first failing attempt started.")
    gives_up_at: datetime = Field(description="When the run stops waiting and fails with EndpointUnavailable.")
    setting: str = Field("retry_timeout", description="The input setting that bounds the wait.")

    def line(self) -> str:
        return (f"{RETRYING} {self.endpoint} ({self.call}): {self.attempts} attempts failed since "
                f"{self.since:%H:%M:%S}Z, giving up at {self.gives_up_at:%H:%M:%S}Z ({self.setting}); "
                f"last error: {self.error}")  # fmt: skip


def with_waits(details: str, waits: list[EndpointWait]) -> str:
    """Current details with the failing calls' lines after them (any earlier such lines replaced)."""
    kept = [part for part in details.split("\n\n") if part and not part.startswith(RETRYING)]
    return "\n\n".join(kept + [w.line() for w in waits])


class Endpoints:
    """A workflow's calls to external endpoints: each retried in rounds, bounded, and shown while it fails.

    `shown(waits)` is called whenever the failing calls change; without it the waits' lines are kept at the end
    of the run's current details (the `progress` query then adds `waiting()` itself). `priority`: every call's
    (workflows/common/priorities.py; None: the workflow's own)."""

    def __init__(self, retry_timeout: timedelta, shown: Callable[[list[EndpointWait]], None] | None = None,
                 priority: Priority | None = None) -> None:  # fmt: skip
        self.retry_timeout = retry_timeout
        self._priority = priority
        self._shown = shown
        self._waits: dict[int, EndpointWait] = {}
        self._calls = 0

    def waiting(self) -> list[EndpointWait]:
        return sorted(self._waits.values(), key=lambda w: w.since)[:SHOWN_WAITS]

    def _show(self) -> None:
        if self._shown is not None:
            self._shown(self.waiting())
        else:
            workflow.set_current_details(with_waits(workflow.get_current_details(), self.waiting()))

    async def execute(self, activity: Callable, arg: Any, *, endpoint: str, summary: str | None = None,
                      retry_policy: RetryPolicy | None = None, retry_timeout: timedelta | None = None,
                      setting: str = "retry_timeout", **options: Any) -> Any:  # fmt: skip
        """`workflow.execute_activity_method(activity, arg, ...)` in bounded, visible rounds (module docstring).

        `retry_policy` gives the backoff (its attempt limit is replaced by the rounds); `retry_timeout` (default:
        this workflow's) bounds how long the call may keep failing, counted from its first failing attempt."""
        call = summary or getattr(activity, "__name__", "call")
        base = retry_policy or RetryPolicy()
        bound = retry_timeout or self.retry_timeout
        ceiling = base.maximum_interval or base.initial_interval * 100
        key, self._calls = self._calls, self._calls + 1
        wait: EndpointWait | None = None
        deadline: Deadline | None = None  # started only once the call fails, cancelled when it ends
        attempts = 0
        try:
            while True:
                started = workflow.now()
                if wait is None:  # the caller's backoff; the round may outlast the bound by one slow attempt
                    interval, coefficient = base.initial_interval, base.backoff_coefficient
                    first = options.get("start_to_close_timeout")
                    left = first + bound if first else None
                else:  # the backoff reached so far, steady within the round, whose attempts fit in the bound
                    left = max(wait.gives_up_at - started, timedelta(seconds=1))
                    grown = min(base.initial_interval * base.backoff_coefficient**attempts, ceiling)
                    interval, coefficient = max(min(grown, left / ROUND_ATTEMPTS), timedelta(seconds=1)), 1.0
                policy = RetryPolicy(initial_interval=interval, backoff_coefficient=coefficient,
                                     maximum_interval=max(ceiling, interval), maximum_attempts=ROUND_ATTEMPTS,
                                     non_retryable_error_types=base.non_retryable_error_types)  # fmt: skip
                if self._priority is not None:
                    options.setdefault("priority", self._priority)
                try:
                    return await workflow.execute_activity_method(
                        activity, arg, retry_policy=policy, schedule_to_close_timeout=left, summary=summary, **options
                    )
                except ActivityError as err:
                    if err.retry_state not in (RetryState.MAXIMUM_ATTEMPTS_REACHED, RetryState.TIMEOUT):
                        raise
                    if wait is None and not workflow.patched(RETRY_ROUNDS_PATCH):
                        raise  # a history from before the rounds
                    attempts += ROUND_ATTEMPTS if err.retry_state == RetryState.MAXIMUM_ATTEMPTS_REACHED else 1
                    since = wait.since if wait else started
                    first_failure = wait is None
                    wait = EndpointWait(endpoint=endpoint, call=call, error=error_text(err), attempts=attempts,
                                        since=since, gives_up_at=since + bound, setting=setting)  # fmt: skip
                    if first_failure and workflow.patched(GIVES_UP_BY_TIMER):  # the clock only sizes its timer
                        deadline = Deadline(max(wait.gives_up_at - workflow.now(), LEAST_WAIT),
                                            f"{endpoint} given up on after {human(bound)} ({setting})")  # fmt: skip
                    passed = deadline.passed if deadline else workflow.now() >= wait.gives_up_at
                    if err.retry_state == RetryState.TIMEOUT or passed:
                        raise self._gave_up(wait) from err
                    self._waits[key] = wait
                    self._show()
                    delay = _asked_delay(err)
                    summary = f"{endpoint} asked to retry after {human(delay)}" if delay is not None else None
                    if delay is not None and deadline is not None:
                        await deadline.wait(lambda: False, at_most=min(delay, deadline.left()), summary=summary)
                    elif delay is not None:
                        await workflow.sleep(min(delay, wait.gives_up_at - workflow.now()), summary=summary)
        finally:
            if deadline is not None:
                deadline.cancel()
            if self._waits.pop(key, None) is not None:
                self._show()

    @staticmethod
    def _gave_up(wait: EndpointWait) -> ApplicationError:
        return ApplicationError(
            f"{wait.endpoint} kept failing for {human(workflow.now() - wait.since)} ({wait.attempts} attempts since "
            f"{wait.since:%Y-%m-%d %H:%M:%S}Z) during '{wait.call}'; gave up ({wait.setting} is "
            f"{human(wait.gives_up_at - wait.since)}). Last error: {wait.error}",
            wait.model_dump(mode="json"), type="EndpointUnavailable", non_retryable=True,
        )  # fmt: skip


def gave_up_on(err: BaseException, endpoint: str) -> bool:
    """Whether `err` is this run giving up on `endpoint` (raised by `Endpoints.execute` in this workflow)."""
    details = err.details if isinstance(err, ApplicationError) and err.type == "EndpointUnavailable" else ()
    return bool(details) and isinstance(details[0], dict) and details[0].get("endpoint") == endpoint


def _asked_delay(err: ActivityError) -> timedelta | None:
    cause = err.cause
    return cause.next_retry_delay if isinstance(cause, ApplicationError) else None
