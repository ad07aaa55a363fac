"""Every schedule in the namespace for people: its spec, pause state, next run times and its last run's status."""

from __future__ import annotations

from datetime import datetime

from temporalio.client import Client, ScheduleActionExecutionStartWorkflow, ScheduleActionStartWorkflow
from temporalio.service import RPCError

from activities.models import StrictModel
from starter.schedules.diff import spec_text
from starter.schedules.managed import describe, managed_group


class LastRun(StrictModel):
    workflow_id: str
    run_id: str
    scheduled_at: datetime
    started_at: datetime
    status: str  # RUNNING, COMPLETED, FAILED, ... (UNKNOWN when the run is gone)


class ScheduleRow(StrictModel):
    id: str
    workflow: str
    spec: str
    time_zone: str
    overlap: str
    paused: bool
    note: str
    group: str | None  # the managed group, None when not created by apply
    next_runs: list[datetime]
    last_run: LastRun | None
    num_actions: int


async def list_schedules(client: Client, *, next_runs: int = 3) -> list[ScheduleRow]:
    """Every schedule in the namespace with its next run times and its last run's status, by ID."""
    rows: list[ScheduleRow] = []
    async for listed in await client.list_schedules():
        desc = await describe(client, listed.id)
        if desc is None:
            continue
        s = desc.schedule
        action = s.action
        last = None
        recent = desc.info.recent_actions[-1] if desc.info.recent_actions else None
        # Millwright's schedules only start workflows; any other action has no run to show.
        if recent is not None and isinstance(recent.action, ScheduleActionExecutionStartWorkflow):
            wid, rid = recent.action.workflow_id, recent.action.first_execution_run_id
            try:
                status = (await client.get_workflow_handle(wid, run_id=rid).describe()).status
                status_name = status.name if status else "UNKNOWN"
            except RPCError:
                status_name = "UNKNOWN"
            last = LastRun(
                workflow_id=wid,
                run_id=rid,
                scheduled_at=recent.scheduled_at,
                started_at=recent.started_at,
                status=status_name,
            )
        rows.append(
            ScheduleRow(
                id=desc.id,
                workflow=action.workflow if isinstance(action, ScheduleActionStartWorkflow) else type(action).__name__,
                spec=spec_text(s.spec),
                time_zone=s.spec.time_zone_name or "UTC",
                overlap=s.policy.overlap.name.lower(),
                paused=s.state.paused,
                note=s.state.note or "",
                group=await managed_group(desc),
                next_runs=list(desc.info.next_action_times[:next_runs]),
                last_run=last,
                num_actions=desc.info.num_actions,
            )
        )
    return sorted(rows, key=lambda r: r.id)


def rows_table(rows: list[ScheduleRow]):
    """A rich Table of ``list_schedules`` rows."""
    from rich.table import Table

    table = Table("ID", "workflow", "spec", "paused", "next runs (UTC)", "last run", "group")
    for r in rows:
        paused = f"yes ({r.note})" if r.paused and r.note else ("yes" if r.paused else "no")
        nexts = "\n".join(t.strftime("%Y-%m-%d %H:%M:%S") for t in r.next_runs) or "-"
        last = (
            f"{r.last_run.status} {r.last_run.started_at:%Y-%m-%d %H:%M:%S}\n{r.last_run.workflow_id}"
            if r.last_run
            else "-"
        )
        spec = r.spec + (f" ({r.time_zone})" if r.time_zone != "UTC" else "")
        table.add_row(r.id, r.workflow, spec, paused, nexts, last, r.group or "-")
    return table
