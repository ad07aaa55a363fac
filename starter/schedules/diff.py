"""A file's schedule against the one the server describes: the Schedule an entry asks for, the fields a file
manages compared after normalisation, and the update that keeps what the file does not manage."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from pydantic import BaseModel
from temporalio.api.common.v1 import Payload
from temporalio.client import (
    Client,
    Schedule,
    ScheduleActionStartWorkflow,
    ScheduleCalendarSpec,
    ScheduleIntervalSpec,
    ScheduleOverlapPolicy,
    SchedulePolicy,
    ScheduleSpec,
    ScheduleState,
)

from starter.client import DEFAULT_TASK_QUEUE, search_attributes_of
from starter.schedules.cron import cron_calendars
from starter.schedules.file import ScheduleEntry
from workflows.common.base import WorkflowInput


def desired_schedule(entry: ScheduleEntry, task_queue: str = DEFAULT_TASK_QUEUE) -> Schedule:
    """The Schedule a validated entry asks for (state and catch-up window as on create)."""
    inp = entry.workflow_input
    assert entry._workflow is not None
    calendars = [cal for expression in entry.cron for cal in cron_calendars(expression)]
    intervals = (
        [ScheduleIntervalSpec(every=entry.interval.every, offset=entry.interval.offset or None)]
        if entry.interval
        else []
    )
    return Schedule(
        action=ScheduleActionStartWorkflow(
            entry._workflow.name,
            inp,
            id=entry.workflow_id or inp.workflow_id(),
            task_queue=entry.task_queue or task_queue,
            execution_timeout=entry.execution_timeout or None,
            typed_search_attributes=search_attributes_of(inp),
        ),
        spec=ScheduleSpec(
            calendars=calendars, intervals=intervals, jitter=entry.jitter or None, time_zone_name=entry.time_zone
        ),
        policy=SchedulePolicy(
            overlap=ScheduleOverlapPolicy[entry.overlap.upper()],
            catchup_window=entry.catchup_window,
            pause_on_failure=entry.pause_on_failure,
        ),
        state=ScheduleState(paused=bool(entry.paused), note=entry.note),
    )


def _seconds(value: timedelta | None) -> float:
    return value.total_seconds() if value else 0.0


def _human(value: timedelta | None) -> str:
    seconds = int(_seconds(value))
    if not seconds:
        return "0s"
    parts = [(seconds // 86400, "d"), (seconds % 86400 // 3600, "h"), (seconds % 3600 // 60, "m"), (seconds % 60, "s")]
    return "".join(f"{n}{unit}" for n, unit in parts if n)


def _ranges(ranges: Any) -> tuple[tuple[int, int, int], ...]:
    return tuple((r.start, max(r.end, r.start), r.step or 1) for r in ranges)


def _calendar_key(c: ScheduleCalendarSpec) -> tuple[Any, ...]:
    return (_ranges(c.second), _ranges(c.minute), _ranges(c.hour), _ranges(c.day_of_month), _ranges(c.month),
            _ranges(c.year), _ranges(c.day_of_week), c.comment or "")  # fmt: skip


def spec_text(spec: ScheduleSpec) -> str:
    """One line for people: the cron strings (from calendar comments), intervals, and anything else."""
    parts: list[str] = []
    for c in spec.calendars:
        text = (
            c.comment[len("cron: ") :]
            if c.comment and c.comment.startswith("cron: ")
            else "calendar " + _calendar_text(c)
        )
        if f"cron {text}" not in parts and f"calendar {text}" not in parts:
            parts.append(text if text.startswith("calendar") else f"cron {text}")
    parts += [f"cron {c}" for c in spec.cron_expressions]
    for i in spec.intervals:
        parts.append(f"every {_human(i.every)}" + (f" offset {_human(i.offset)}" if i.offset else ""))
    if spec.skip:
        parts.append(f"skip {len(spec.skip)} calendar(s)")
    if spec.start_at or spec.end_at:
        parts.append(f"between {spec.start_at or '-'} and {spec.end_at or '-'}")
    return "; ".join(parts) or "(none)"


def _calendar_text(c: ScheduleCalendarSpec) -> str:
    def one(ranges: Any) -> str:
        out = []
        for start, end, step in _ranges(ranges):
            out.append(str(start) if start == end else f"{start}-{end}" + (f"/{step}" if step > 1 else ""))
        return ",".join(out) or "*"

    return " ".join(one(r) for r in (c.second, c.minute, c.hour, c.day_of_month, c.month, c.day_of_week))


@dataclass(frozen=True)
class FieldChange:
    field: str
    old: str
    new: str


async def _input_json(client: Client, action: ScheduleActionStartWorkflow, model: type[WorkflowInput]) -> str:
    args = list(action.args)
    if not args:
        return "(none)"
    value = args[0]
    if isinstance(value, Payload):
        try:
            [value] = await client.data_converter.decode([value], [model])
        except Exception:
            return value.data.decode(errors="replace")
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json", by_alias=True)
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


async def _fields(client: Client, schedule: Schedule, model: type[WorkflowInput]) -> dict[str, tuple[Any, str]]:
    """Field -> (comparison key, display) for everything a schedules file manages."""
    action = schedule.action
    if not isinstance(action, ScheduleActionStartWorkflow):
        return {"action": (type(action).__name__, type(action).__name__)}
    spec, policy, state = schedule.spec, schedule.policy, schedule.state
    attrs = sorted((p.key.name, str(p.value)) for p in action.typed_search_attributes)
    spec_key = (
        sorted(_calendar_key(c) for c in spec.calendars),
        sorted(spec.cron_expressions),
        sorted((_seconds(i.every), _seconds(i.offset)) for i in spec.intervals),
        sorted(_calendar_key(c) for c in spec.skip),
        spec.start_at,
        spec.end_at,
    )
    input_json = await _input_json(client, action, model)
    catchup = policy.catchup_window
    return {
        "workflow": (action.workflow, action.workflow),
        "workflowId": (action.id, action.id),
        "taskQueue": (action.task_queue, action.task_queue),
        "input": (input_json, input_json),
        "searchAttributes": (attrs, ", ".join(f"{k}={v}" for k, v in attrs) or "(none)"),
        "executionTimeout": (
            _seconds(action.execution_timeout),
            _human(action.execution_timeout) if action.execution_timeout else "(none)",
        ),
        "spec": (spec_key, spec_text(spec)),
        "timeZone": (spec.time_zone_name or "", spec.time_zone_name or "UTC"),
        "jitter": (_seconds(spec.jitter), _human(spec.jitter)),
        "overlap": (policy.overlap.name, policy.overlap.name.lower()),
        "catchupWindow": (
            None if catchup is None else _seconds(catchup),
            "(server default)" if catchup is None else _human(catchup),
        ),
        "pauseOnFailure": (policy.pause_on_failure, str(policy.pause_on_failure).lower()),
        "paused": (state.paused, str(state.paused).lower()),
        "note": (state.note or "", repr(state.note or "")),
    }


def _managed_fields(entry: ScheduleEntry) -> list[str]:
    names = ["workflow", "workflowId", "taskQueue", "input", "searchAttributes", "executionTimeout", "spec", "timeZone",
             "jitter", "overlap", "pauseOnFailure"]  # fmt: skip
    names += [
        n
        for n, v in (("catchupWindow", entry.catchup_window), ("paused", entry.paused), ("note", entry.note))
        if v is not None
    ]
    return names


async def diff(
    client: Client, entry: ScheduleEntry, current: Schedule, task_queue: str = DEFAULT_TASK_QUEUE
) -> list[FieldChange]:
    """What applying ``entry`` would change on a schedule that is ``current`` (empty: nothing)."""
    assert entry._workflow is not None
    model = entry._workflow.input_model
    have = await _fields(client, current, model)
    want = await _fields(client, desired_schedule(entry, task_queue), model)
    if "action" in have:
        return [FieldChange("action", have["action"][1], "StartWorkflow")]
    return [FieldChange(f, have[f][1], want[f][1]) for f in _managed_fields(entry) if have[f][0] != want[f][0]]


def merged(entry: ScheduleEntry, current: Schedule, task_queue: str) -> Schedule:
    """The desired schedule, keeping what the file does not manage (pause state, note, catch-up window)."""
    new = desired_schedule(entry, task_queue)
    now = current.state
    new.state = ScheduleState(
        paused=now.paused if entry.paused is None else entry.paused,
        note=now.note if entry.note is None else entry.note,
        limited_actions=now.limited_actions,
        remaining_actions=now.remaining_actions,
    )
    if entry.catchup_window is None:
        new.policy.catchup_window = current.policy.catchup_window
    return new
