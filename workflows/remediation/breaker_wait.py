"""A remediation holding a node handed over to it cordoned waits out a tripped circuit breaker instead of ending.

A run that another one passed its cordon to (a FirmwareUpdate whose node failed validation: the node is cordoned
in `remediation/<cluster>/<node>`'s name before this run starts) is the only run holding that node. Refused by the
cluster's circuit breaker it would end `refused` and leave the node cordoned with nobody holding it. So it asks
the disruption budget again every `breaker_retry_interval`, in phase `waiting-for-breaker`, its note (status,
progress, current details) saying why and who lets it go on (`millwright breaker reset`), for at most
`breaker_wait_limit`; then it ends `left-cordoned`, saying who must act. Each ask costs about 12 history events
(its timer, the lease request's local activity and repoll timer, the decision signal, two workflow tasks); at most
`MAX_BREAKER_ASKS` (500, about 6,000 events) are made.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import timedelta

from temporalio import workflow

from activities.node_health import NodeHealth
from workflows.budget.leases import Lease
from workflows.common.deadlines import Deadline
from workflows.remediation.models import MAX_BREAKER_ASKS, NodeRemediationInput, NodeRemediationStatus

PATCH = "remediation-handed-over-waits-for-breaker"  # workflow.patched() id: such a run waits instead of ending
# workflow.patched() id: `breaker_wait_limit` is a timer (workflows/common/deadlines.py), not the clock of the task
# that looks: a worker resuming late asks again as the history reads.
DEADLINE_PATCH = "remediation-breaker-wait-timer"
RETRY = "ask the disruption budget again"
PHASE = "waiting-for-breaker"


def handed_over(health: NodeHealth, owner: str) -> bool:
    """The node is cordoned in this run's name at its start (a cordon passed to it), and not quarantined."""
    return health.unschedulable and health.cordoned_by == owner and health.quarantined is None


class BreakerWait:
    """Ask again on a timer while the breaker refuses, the reason in the run's note meanwhile."""

    def __init__(self, inp: NodeRemediationInput, owner: str, status: NodeRemediationStatus,
                 enter: Callable[[str], None]) -> None:  # fmt: skip
        self.inp, self.owner, self.status, self.enter = inp, owner, status, enter
        self.handed_by = inp.requested_by or "another run"
        self.asks = 1
        self.waited = timedelta(0)

    def reset_command(self) -> str:
        return f"`millwright breaker reset {self.inp.cluster} --by <you> --reason <why>`"

    async def wait(self, lease: Lease | None, ask: Callable[[], Awaitable[Lease | None]]) -> Lease | None:
        """Until a lease is granted (or withdrawn: None), or breaker_wait_limit has passed or MAX_BREAKER_ASKS were
        made: then the last refusal."""
        inp, note = self.inp, self.status.note
        deadline = workflow.now() + inp.breaker_wait_limit
        # Decided early, at the run's start, where PATCH is; runs without it end the wait by the clock.
        limit = Deadline(inp.breaker_wait_limit, "the wait for the breaker ends") \
            if workflow.patched(DEADLINE_PATCH) else None  # fmt: skip
        while lease is not None and lease.state == "refused":
            remaining = deadline - workflow.now()  # for the waits and the text only, once `limit` runs
            if (limit.passed if limit is not None else remaining <= timedelta(0)) or self.asks >= MAX_BREAKER_ASKS:
                self.waited = inp.breaker_wait_limit - max(remaining, timedelta(0))
                break
            self.status.note = self.waiting(lease)
            self.enter(PHASE)
            if limit is not None:
                await limit.wait(lambda: False, at_most=inp.breaker_retry_interval, summary=RETRY)
            else:
                await workflow.sleep(min(inp.breaker_retry_interval, remaining), summary=RETRY)
            lease = await ask()
            self.asks += 1
        if limit is not None:
            limit.cancel()
        self.status.note = note
        return lease

    def waiting(self, lease: Lease) -> str:
        return (f"waiting: the circuit breaker refuses remediations ({lease.note}); this node was handed over cordoned "
                f"by {self.handed_by} and {self.owner} holds its cordon; {self.reset_command()} lets it go on "
                f"({self.asks} asks so far, again every {self.inp.breaker_retry_interval}, for at most "
                f"{self.inp.breaker_wait_limit})")  # fmt: skip

    def gave_up(self, lease: Lease) -> str:
        return (f"the circuit breaker refused remediations for {self.waited} ({self.asks} asks; "
                f"{lease.note}): node {self.inp.node} is still cordoned in {self.owner}'s name (handed over by "
                f"{self.handed_by}) and no run holds it; an operator must act: {self.reset_command()}, then start "
                f"NodeRemediation for it with requested_by, or uncordon it")  # fmt: skip
