"""FleetBurnIn: burn in many servers, a bounded number at a time, and stop when the failures look systemic.

Servers come as a list or from a NetBox query (role, site, status `planned`). Each runs as a
`ServerBurnIn` child (`burn-in/<server>`), at most `max_concurrent` at once and at most
`max_concurrent_per_group` per site or vendor (a rack's power, a vendor's BMC firmware and
a site's PXE servers have limits of their own), and one at a time behind one BMC URL
(`max_concurrent_per_bmc`: a chassis BMC serving several servers serves a handful of clients). When more than `pause_when_failed_share`
of the finished servers failed, no new server starts until an operator decides through the
`decide` update: that pattern means a bad image or a bad rack, not bad servers.

At fleet scale (10,000 servers) the run continues as new before its history grows large, without idling the
fleet: children are started with `ParentClosePolicy.ABANDON`, the run carries the running ones by workflow ID and
run ID (so it continues only once each child it asked to start has been answered), and the next run waits for them
(`EntityActivities.workflow_outcome`, workflows/common/carried.py) while it starts new servers up to
`max_concurrent`. Results are summarized, not carried whole: counts of every outcome, and the
servers that did not pass with why (the first 1,000).

History events per server: the child's start (initiated, started), its close (one event) and two workflow tasks
(3 each): ~9; a child running across a continue-as-new costs ~6 more (the outcome activity and a workflow task).
The run continues as new past `HISTORY_LIMIT` events or at the server's suggestion (4,096 by default), checked
before each start, while paused and while the last servers finish; between two checks at most the children closing
together add events (one each and a workflow task), so no run passes 8,000 + max_concurrent (≤ 1,000) + 9 ≈ 9,000
events. At 10,000 servers and max_concurrent 50: ~90,000 events in 12 to 22 runs; ~9 events a server.
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

from activities.entities import FailureCause, RunOutcome, RunRef, failed_outcome
from activities.kube.validators import validate_object_name
from activities.models import StrictModel
from activities.netbox.activities import NetBoxActivities
from activities.netbox.models import DeviceInfo, DevicePage, DevicePageQuery, DeviceQuery
from workflows.burnin.server_burnin import (
    BurnInSettings,
    ServerBurnIn,
    ServerBurnInInput,
    ServerBurnInResult,
    ServerTarget,
)
from workflows.common.base import Phases, Progress, WorkflowInput, history_is_long
from workflows.common.call_options import NETBOX_CALL
from workflows.common.carried import outcome_of
from workflows.common.endpoints import Endpoints, RetryTimeout

HISTORY_LIMIT = 8000
# Runs from before carried children across continue-as-new (their children end with the run; it drains them first).
CARRY_CHILDREN_PATCH = "fleet-burn-in-carries-children"
# Runs from before servers sharing a BMC URL took turns (max_concurrent_per_bmc).
PER_BMC_PATCH = "fleet-burn-in-per-bmc"
# Runs from before a run waited for its children's starts to be answered before it continued as new: a child whose
# start was still in flight was carried by neither run, and the server, its parent closed, never started it.
SETTLED_STARTS_PATCH = "fleet-burn-in-settles-starts"
LISTED = 1000  # servers that did not pass listed with why (counts stay exact)


class FleetOutcome(StrictModel):
    server: str
    result: Literal["passed", "failed", "error", "skipped"]
    reason: str = ""
    group: str = ""


class FleetTally(StrictModel):
    passed: int = 0
    failed: int = 0
    error: int = 0
    skipped: int = 0

    def add(self, result: str) -> None:
        setattr(self, result, getattr(self, result) + 1)


class RunningServer(StrictModel):
    """A server's burn-in child, as a later run of the fleet finds it again."""

    server: str
    group: str = ""
    workflow_id: str
    run_id: str
    bmc: str | None = Field(None, description="The server's BMC URL, when the fleet's input gave it.")


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
    max_concurrent_per_bmc: int = Field(1, ge=1, description="Servers burned in at once behind one BMC URL (servers "
                                        "whose BMC comes from NetBox are not counted).")  # fmt: skip
    pause_when_failed_share: float = Field(0.25, gt=0, le=1, description="Pause when more than this share failed.")
    min_finished_before_pause: int = Field(4, ge=1, description="Judge the share only after this many finished.")
    # Carried across continue-as-new; not for callers.
    outcomes: list[FleetOutcome] = Field(default_factory=list, description="Internal: servers that did not pass "
                                         f"(the first {LISTED}).")  # fmt: skip
    tally: FleetTally | None = Field(None, description="Internal: every outcome counted (None: count `outcomes`, "
                                     "as a run from before the tally carried every outcome).")  # fmt: skip
    running: list[RunningServer] = Field(default_factory=list, description="Internal: children still running.")
    decisions: list[str] = Field(default_factory=list, description="Internal: operators' decisions so far.")
    aborted: bool = Field(False, description="Internal: an operator aborted; the carried servers finish.")
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
    failures: list[FleetOutcome] = Field(default_factory=list, description=f"Failed servers and errors, with why "
                                         f"(the first {LISTED}).")  # fmt: skip


class FleetBurnInResult(StrictModel):
    report: FleetReport
    outcomes: list[FleetOutcome] = Field(description=f"Servers that did not pass (failed, error, skipped) with why, "
                                         f"the first {LISTED}; the report counts every outcome.")  # fmt: skip
    aborted: bool = False


@workflow.defn
class FleetBurnIn:
    @workflow.init
    def __init__(self, inp: FleetBurnInInput) -> None:
        self._inp = inp
        self._tally = inp.tally.model_copy() if inp.tally is not None else _tally(inp.outcomes)
        self._outcomes: list[FleetOutcome] = [o for o in inp.outcomes if o.result != "passed"][:LISTED]
        self._pending: list[ServerTarget] = []
        self._running: dict[str, str] = {r.server: r.group for r in inp.running}  # server -> group
        self._children: dict[str, RunningServer] = {r.server: r for r in inp.running}
        self._starting: set[str] = set()  # servers whose child this run asked to start, not yet acknowledged
        self._bmcs: dict[str, str] = {r.server: r.bmc for r in inp.running if r.bmc}  # running server -> BMC URL
        self._per_bmc = False  # servers sharing a BMC take turns (PER_BMC_PATCH)
        self._decision: FleetDecision | None = None
        self._paused: str | None = None
        self._decisions: list[str] = list(inp.decisions)
        self._accepted_failures = inp.accepted_failures
        self._aborted = inp.aborted
        self._carry = False  # children outlive this run and the next one waits for them (CARRY_CHILDREN_PATCH)
        self._progressed = False  # this run started or finished a server (so continuing as new moves on)
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
        t = self._tally
        return FleetReport(
            total=t.passed + t.failed + t.error + t.skipped + len(self._running) + len(self._pending),
            passed=t.passed, failed=t.failed, errors=t.error, skipped=t.skipped, running=sorted(self._running),
            pending=len(self._pending), paused=self._paused, decisions=self._decisions,
            failures=[o for o in self._outcomes if o.result in ("failed", "error")],
        )  # fmt: skip

    @workflow.query(description="Short progress for pollers such as `millwright watch`.")
    def progress(self) -> Progress:
        return self._phases.progress

    def _show(self, phase: str) -> None:
        r = self.report()
        done = r.passed + r.failed + r.errors + r.skipped
        details = (
            f"{r.passed} passed, {r.failed} failed, {r.errors} errors, {len(r.running)} running, {r.pending} to go"
        )
        if r.paused:
            details = f"{r.paused} — {details}"
        self._phases.enter(phase, details, done=done, total=r.total)

    # ------------------------------------------------------------ the run

    @workflow.run
    async def run(self, inp: FleetBurnInInput) -> FleetBurnInResult:
        self._carry = workflow.patched(CARRY_CHILDREN_PATCH)
        self._per_bmc = workflow.patched(PER_BMC_PATCH)
        targets = list(inp.servers)
        if inp.netbox_query is not None and not inp.resolved:
            self._phases.enter("listing", "NetBox query")
            listed = {t.name for t in targets}
            targets += [ServerTarget(name=d.name, site=d.site) for d in await self._from_netbox(inp.netbox_query)
                        if d.name and d.name not in listed]  # fmt: skip
        finished = {o.server for o in self._outcomes}
        self._pending = [t for t in targets if t.name not in finished and t.name not in self._running]
        tasks = [asyncio.create_task(self._carried(r, inp.settings)) for r in inp.running]
        started_here = 0
        self._check_failures()  # a share over the threshold carried across continue-as-new pauses at once
        self._show("running")
        while self._pending and not self._aborted:
            if self._time_to_continue():
                break
            if not self._carry and (history_is_long(HISTORY_LIMIT) or started_here >= HISTORY_LIMIT // 10):
                break  # a run from before CARRY_CHILDREN_PATCH: its children finish first
            await workflow.wait_condition(
                lambda: self._startable() is not None or self._paused is not None or self._time_to_continue()
            )
            if self._time_to_continue():
                break
            if self._paused is not None:
                await self._wait_for_decision()
                continue
            target = self._startable()
            assert target is not None
            self._pending.remove(target)
            self._running[target.name] = self._group(target)
            if target.bmc is not None:
                self._bmcs[target.name] = target.bmc.url
            self._starting.add(target.name)
            tasks.append(asyncio.create_task(self._burn_in(target, inp.settings)))
            started_here += 1
            self._show("running")
        if self._aborted:
            for t in self._pending:
                self._count(FleetOutcome(server=t.name, result="skipped", reason="fleet burn-in aborted",
                                         group=self._group(t)))  # fmt: skip
            self._pending = []
        continuing = bool(self._pending)
        if not self._carry:
            await asyncio.gather(*tasks)
        elif not continuing:  # the last servers (an abort lets the running ones finish), unless the history is long
            await workflow.wait_condition(lambda: not self._running or self._time_to_continue())
            continuing = bool(self._running)
        if continuing:  # the children still running are carried by ID; the next run waits for them
            if self._starting and workflow.patched(SETTLED_STARTS_PATCH):  # a start not yet answered has no run ID
                await workflow.wait_condition(lambda: not self._starting)
            await workflow.wait_condition(workflow.all_handlers_finished)
            workflow.continue_as_new(inp.model_copy(update={
                "servers": self._pending, "netbox_query": None, "resolved": True, "outcomes": self._outcomes,
                "tally": self._tally, "running": list(self._children.values()), "decisions": self._decisions,
                "accepted_failures": self._accepted_failures, "aborted": self._aborted,
            }))  # fmt: skip
        self._show("aborted" if self._aborted else "completed")
        await workflow.wait_condition(workflow.all_handlers_finished)
        return FleetBurnInResult(report=self.report(), outcomes=self._outcomes, aborted=self._aborted)

    def _time_to_continue(self) -> bool:
        return self._carry and self._progressed and history_is_long(HISTORY_LIMIT)

    async def _from_netbox(self, query: DeviceQuery) -> list[DeviceInfo]:
        """The devices the query finds, at most `query.limit`: page by page (a run from before
        CARRY_CHILDREN_PATCH read them in one activity)."""
        if not self._carry:
            return await self._calls.execute(NetBoxActivities.list_devices, query, **NETBOX_CALL,
                                             summary="servers from NetBox")  # fmt: skip
        devices: list[DeviceInfo] = []
        after: int | None = 0
        while after is not None and len(devices) < query.limit:
            page: DevicePage = await self._calls.execute(
                NetBoxActivities.list_devices_page,
                DevicePageQuery(**query.model_dump(exclude={"limit"}), after_id=after,
                                limit=min(1000, query.limit - len(devices))),
                **NETBOX_CALL, summary=f"servers from NetBox after device {after}")  # fmt: skip
            devices += page.devices
            after = page.next_after_id
        return devices

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
        per_bmc = Counter(self._bmcs.values()) if self._per_bmc else Counter[str]()
        limit = self._inp.max_concurrent_per_group
        for target in self._pending:
            if limit is not None and per_group[self._group(target)] >= limit:
                continue
            if target.bmc is not None and per_bmc[target.bmc.url] >= self._inp.max_concurrent_per_bmc:
                continue
            return target
        return None

    def _check_failures(self) -> None:
        t = self._tally
        failed = t.failed + t.error - self._accepted_failures
        judged = t.passed + t.failed + t.error
        if (
            self._paused is None
            and judged >= self._inp.min_finished_before_pause
            and failed > self._inp.pause_when_failed_share * judged
        ):
            self._paused = (
                f"{failed} of {judged} finished servers failed (more than "
                f"{self._inp.pause_when_failed_share:.0%}): waiting for an operator's decision"
            )

    async def _wait_for_decision(self) -> None:
        """Until an operator decides, or until it is time to continue as new (the next run pauses again, from the
        carried counts)."""
        self._show("paused")
        await workflow.wait_condition(lambda: self._decision is not None or self._time_to_continue())
        decision, self._decision = self._decision, None
        if decision is None:
            return
        if decision.action == "abort":
            self._aborted = True
        else:
            # Go past the failures seen so far; pause again only on new ones.
            self._accepted_failures = self._tally.failed + self._tally.error
        self._paused = None
        self._show("running")

    async def _burn_in(self, target: ServerTarget, settings: BurnInSettings) -> None:
        group = self._running[target.name]
        child = ServerBurnInInput(server=target, settings=settings, retry_timeout=self._inp.retry_timeout)
        try:
            handle = await workflow.start_child_workflow(
                ServerBurnIn.run, child, id=child.workflow_id(), id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
                static_summary=f"burn-in of {target.name}", execution_timeout=_child_timeout(settings),
                # Carried by ID across continue-as-new, so a server's burn-in never waits for the fleet's history.
                parent_close_policy=workflow.ParentClosePolicy.ABANDON if self._carry
                else workflow.ParentClosePolicy.TERMINATE,
            )  # fmt: skip
        except WorkflowAlreadyStartedError:
            self._record(FleetOutcome(server=target.name, result="skipped", group=group,
                                      reason="a burn-in of this server is already running"))  # fmt: skip
            return
        finally:
            self._starting.discard(target.name)
        self._children[target.name] = RunningServer(server=target.name, group=group, workflow_id=child.workflow_id(),
                                                    run_id=handle.first_execution_run_id or "",
                                                    bmc=self._bmcs.get(target.name))  # fmt: skip
        self._progressed = True
        try:
            self._record(_outcome(target.name, group, await handle))
        except ChildWorkflowError as err:
            self._record(_outcome(target.name, group, failed_outcome(err.cause)))

    async def _carried(self, ref: RunningServer, settings: BurnInSettings) -> None:
        """A server's burn-in that a previous run started: its outcome, once it closes."""
        outcome = await outcome_of(RunRef(workflow_id=ref.workflow_id, run_id=ref.run_id),
                                   longest=_child_timeout(settings), summary=f"burn-in of {ref.server}")  # fmt: skip
        if outcome.status == "completed":
            self._record(_outcome(ref.server, ref.group, ServerBurnInResult.model_validate(outcome.result)))
        else:
            self._record(_outcome(ref.server, ref.group, outcome))

    def _count(self, outcome: FleetOutcome) -> None:
        self._tally.add(outcome.result)
        if outcome.result != "passed" and len(self._outcomes) < LISTED:
            self._outcomes.append(outcome)

    def _record(self, outcome: FleetOutcome) -> None:
        """A running server's outcome: counted, judged (it may pause the fleet) and shown."""
        self._count(outcome)
        self._running.pop(outcome.server, None)
        self._children.pop(outcome.server, None)
        self._bmcs.pop(outcome.server, None)
        self._progressed = True
        self._check_failures()
        self._show("paused" if self._paused else "running")


def _child_timeout(settings: BurnInSettings) -> timedelta:
    return settings.boot_timeout * 3 + timedelta(seconds=settings.stress_seconds * 3) + timedelta(hours=2)


def _tally(outcomes: list[FleetOutcome]) -> FleetTally:
    tally = FleetTally()
    for o in outcomes:
        tally.add(o.result)
    return tally


def _outcome(server: str, group: str, closed: ServerBurnInResult | RunOutcome) -> FleetOutcome:
    """A server's burn-in result, or why its run did not complete: the innermost cause, or where the server's run
    gave up on an endpoint (that error names it)."""
    if isinstance(closed, ServerBurnInResult):
        reason = (
            ""
            if closed.result == "passed"
            else next((f"{f.check} {f.subject}: {f.evidence}" for f in closed.findings if f.severity == "fail"), "")
        )
        return FleetOutcome(server=server, result=closed.result, reason=reason[:500], group=group)
    causes = closed.causes or [FailureCause(type=closed.status, message=f"burn-in {closed.status}")]
    cause = next((c for c in causes if c.type == "EndpointUnavailable"), causes[-1])
    return FleetOutcome(server=server, result="error", reason=cause.message[:500], group=group)
