"""FleetBurnIn: burn in many servers, a bounded number at a time, and stop when the failures look systemic.

Servers come as a list or from a NetBox query (role, site, status `planned`). Each runs as a
`ServerBurnIn` child (`burn-in/<server>`), at most `max_concurrent` at once and at most
`max_concurrent_per_group` per site or vendor (a rack's power, a vendor's BMC firmware and
a site's PXE servers have limits of their own). When more than `pause_when_failed_share`
of the finished servers failed, no new server starts until an operator decides through the
`decide` update: that pattern means a bad image or a bad rack, not bad servers.

Before its history grows large the run lets its running children finish and continues as
new with what is left and the outcomes so far.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from datetime import timedelta
from typing import Literal

from pydantic import Field, field_validator, model_validator
from temporalio import workflow
from temporalio.common import WorkflowIDReusePolicy
from temporalio.exceptions import ChildWorkflowError, WorkflowAlreadyStartedError

from workflows.base import Phases, Progress, WorkflowInput, history_is_long
from workflows.burnin import NETBOX_CALL, BurnInSettings, ServerBurnIn, ServerBurnInInput, ServerTarget
from workflows.endpoints import Endpoints, RetryTimeout

from activities.kube import validate_object_name
from activities.models import StrictModel
from activities.netbox import DeviceQuery, NetBoxActivities

HISTORY_LIMIT = 8000


class FleetOutcome(StrictModel):
    server: str
    result: Literal["passed", "failed", "error", "skipped"]
    reason: str = ""
    group: str = ""


class FleetDecision(StrictModel):
    action: Literal["continue", "abort"]
    reason: str = Field(min_length=1, max_length=1000)


class FleetBurnInInput(WorkflowInput, RetryTimeout):
    """Burn in a list of servers, or the NetBox devices a query finds (`retry_timeout` also bounds each server's
    calls)."""

    name: str = Field(min_length=1, max_length=63, description="Names this fleet run (its workflow ID).")
    servers: list[ServerTarget] = Field(default_factory=list)
    netbox_query: DeviceQuery | None = Field(
        None, description="Add NetBox's devices matching this query, e.g. {role: gpu-server, status: planned}."
    )
    settings: BurnInSettings = Field(default_factory=BurnInSettings)
    max_concurrent: int = Field(10, ge=1, le=1000)
    group_by: Literal["site", "vendor"] | None = None
    max_concurrent_per_group: int | None = Field(None, ge=1)
    pause_when_failed_share: float = Field(0.25, gt=0, le=1, description="Pause when more than this share failed.")
    min_finished_before_pause: int = Field(4, ge=1, description="Judge the share only after this many finished.")
    # Carried across continue-as-new; not for callers.
    outcomes: list[FleetOutcome] = Field(default_factory=list)
    resolved: bool = Field(False, description="Internal: the NetBox query was already expanded into servers.")
    accepted_failures: int = Field(0, description="Internal: failures an operator already decided to go past.")

    _name = field_validator("name")(validate_object_name)

    @model_validator(mode="after")
    def _something(self) -> FleetBurnInInput:
        if not self.servers and self.netbox_query is None and not self.resolved:
            raise ValueError("give servers, a netbox_query, or both")
        if self.netbox_query is not None and not self.settings.record_in_netbox:
            raise ValueError("netbox_query needs settings.record_in_netbox")
        names = [s.name for s in self.servers]
        dupes = sorted(n for n, c in Counter(names).items() if c > 1)
        if dupes:
            raise ValueError(f"servers listed twice: {', '.join(dupes)}")
        return self

    def workflow_id(self) -> str:
        return f"fleet-burn-in/{self.name}"


class FleetReport(StrictModel):
    total: int
    passed: int = 0
    failed: int = 0
    errors: int = 0
    skipped: int = 0
    running: list[str] = Field(default_factory=list)
    pending: int = 0
    paused: str | None = Field(None, description="Why no new server starts, while waiting for a decision.")
    decisions: list[str] = Field(default_factory=list)
    failures: list[FleetOutcome] = Field(default_factory=list)


class FleetBurnInResult(StrictModel):
    report: FleetReport
    outcomes: list[FleetOutcome]
    aborted: bool = False


@workflow.defn
class FleetBurnIn:
    @workflow.init
    def __init__(self, inp: FleetBurnInInput) -> None:
        self._inp = inp
        self._outcomes: list[FleetOutcome] = list(inp.outcomes)
        self._pending: list[ServerTarget] = []
        self._running: dict[str, str] = {}  # server -> group
        self._decision: FleetDecision | None = None
        self._paused: str | None = None
        self._decisions: list[str] = []
        self._accepted_failures = inp.accepted_failures
        self._aborted = False
        self._phases = Phases(finished=("completed", "aborted", "failed"))
        self._calls = Endpoints(inp.retry_timeout, shown=self._phases.waiting)

    # ------------------------------------------------------------ operator controls and views

    @workflow.update(description="After a pause for too many failures: continue, or abort (running servers finish).")
    def decide(self, decision: FleetDecision) -> FleetReport:
        self._decision = decision
        self._decisions.append(f"{decision.action}: {decision.reason}")
        return self.report()

    @decide.validator
    def _decide_ok(self, decision: FleetDecision) -> None:
        if self._paused is None:
            raise ValueError("the fleet burn-in is not paused; there is nothing to decide")

    @workflow.query(description="Aggregate report: counts, running servers, failures with reasons.")
    def report(self) -> FleetReport:
        c = Counter(o.result for o in self._outcomes)
        return FleetReport(
            total=len(self._outcomes) + len(self._running) + len(self._pending), passed=c["passed"],
            failed=c["failed"], errors=c["error"], skipped=c["skipped"], running=sorted(self._running),
            pending=len(self._pending), paused=self._paused, decisions=self._decisions,
            failures=[o for o in self._outcomes if o.result in ("failed", "error")],
        )  # fmt: skip

    @workflow.query(description="Short progress for pollers such as `millwright watch`.")
    def progress(self) -> Progress:
        return self._phases.progress

    def _show(self, phase: str) -> None:
        r = self.report()
        done = r.passed + r.failed + r.errors + r.skipped
        details = f"{r.passed} passed, {r.failed} failed, {r.errors} errors, {len(r.running)} running, {r.pending} to go"
        if r.paused:
            details = f"{r.paused} — {details}"
        self._phases.enter(phase, details, done=done, total=r.total)

    # ------------------------------------------------------------ the run

    @workflow.run
    async def run(self, inp: FleetBurnInInput) -> FleetBurnInResult:
        targets = list(inp.servers)
        if inp.netbox_query is not None and not inp.resolved:
            self._phases.enter("listing", "NetBox query")
            devices = await self._calls.execute(
                NetBoxActivities.list_devices, inp.netbox_query, **NETBOX_CALL, summary="servers from NetBox")
            listed = {t.name for t in targets}
            targets += [ServerTarget(name=d.name, site=d.site) for d in devices if d.name and d.name not in listed]
        finished = {o.server for o in self._outcomes}
        self._pending = [t for t in targets if t.name not in finished]
        tasks: list[asyncio.Task] = []
        started_here = 0
        self._check_failures()  # a share over the threshold carried across continue-as-new pauses at once
        self._show("running")
        while self._pending and not self._aborted:
            if history_is_long(HISTORY_LIMIT) or started_here >= HISTORY_LIMIT // 10:
                break
            await workflow.wait_condition(lambda: self._startable() is not None or self._paused is not None)
            if self._paused is not None:
                await self._wait_for_decision()
                continue
            target = self._startable()
            assert target is not None
            self._pending.remove(target)
            self._running[target.name] = self._group(target)
            tasks.append(asyncio.create_task(self._burn_in(target, inp.settings)))
            started_here += 1
            self._show("running")
        if tasks:
            await asyncio.gather(*tasks)
        if self._pending and not self._aborted:
            await workflow.wait_condition(workflow.all_handlers_finished)
            workflow.continue_as_new(inp.model_copy(update={
                "servers": self._pending, "netbox_query": None, "resolved": True, "outcomes": self._outcomes,
                "accepted_failures": self._accepted_failures,
            }))  # fmt: skip
        if self._aborted:
            self._outcomes += [FleetOutcome(server=t.name, result="skipped", reason="fleet burn-in aborted",
                                            group=self._group(t)) for t in self._pending]  # fmt: skip
            self._pending = []
        self._show("aborted" if self._aborted else "completed")
        await workflow.wait_condition(workflow.all_handlers_finished)
        return FleetBurnInResult(report=self.report(), outcomes=self._outcomes, aborted=self._aborted)

    def _group(self, target: ServerTarget) -> str:
        if self._inp.group_by == "site":
            return target.site or "(no site)"
        if self._inp.group_by == "vendor":
            return target.vendor or "(no vendor)"
        return ""

    def _startable(self) -> ServerTarget | None:
        """The next pending server that fits the global and its group's concurrency; None when none does."""
        if len(self._running) >= self._inp.max_concurrent:
            return None
        per_group = Counter(self._running.values())
        limit = self._inp.max_concurrent_per_group
        for target in self._pending:
            if limit is None or per_group[self._group(target)] < limit:
                return target
        return None

    def _check_failures(self) -> None:
        finished = [o for o in self._outcomes if o.result != "skipped"]
        failed = sum(o.result in ("failed", "error") for o in finished) - self._accepted_failures
        judged = len(finished)
        if self._paused is None and judged >= self._inp.min_finished_before_pause and \
                failed > self._inp.pause_when_failed_share * judged:
            self._paused = (f"{failed} of {judged} finished servers failed (more than "
                            f"{self._inp.pause_when_failed_share:.0%}): waiting for an operator's decision")

    async def _wait_for_decision(self) -> None:
        self._show("paused")
        await workflow.wait_condition(lambda: self._decision is not None)
        decision, self._decision = self._decision, None
        assert decision is not None
        if decision.action == "abort":
            self._aborted = True
        else:
            # Go past the failures seen so far; pause again only on new ones.
            self._accepted_failures = sum(o.result in ("failed", "error") for o in self._outcomes)
        self._paused = None
        self._show("running")

    async def _burn_in(self, target: ServerTarget, settings: BurnInSettings) -> None:
        group = self._running[target.name]
        child = ServerBurnInInput(server=target, settings=settings, retry_timeout=self._inp.retry_timeout)
        try:
            result = await workflow.execute_child_workflow(
                ServerBurnIn.run, child, id=child.workflow_id(), id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
                static_summary=f"burn-in of {target.name}",
                execution_timeout=settings.boot_timeout * 3 + timedelta(seconds=settings.stress_seconds * 3)
                + timedelta(hours=2),
            )  # fmt: skip
            reason = "" if result.result == "passed" else next(
                (f"{f.check} {f.subject}: {f.evidence}" for f in result.findings if f.severity == "fail"), "")
            outcome = FleetOutcome(server=target.name, result=result.result, reason=reason[:500], group=group)
        except WorkflowAlreadyStartedError:
            outcome = FleetOutcome(server=target.name, result="skipped", group=group,
                                   reason="a burn-in of this server is already running")  # fmt: skip
        except ChildWorkflowError as err:
            cause = err.cause  # the innermost error, or where the server's run gave up on an endpoint (it names it)
            while getattr(cause, "cause", None) is not None and getattr(cause, "type", None) != "EndpointUnavailable":
                cause = cause.cause
            outcome = FleetOutcome(server=target.name, result="error", reason=str(cause or err)[:500], group=group)
        self._outcomes.append(outcome)
        del self._running[target.name]
        self._check_failures()
        self._show("paused" if self._paused else "running")

