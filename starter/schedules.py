"""Schedules as code: Temporal Schedules from a declarative YAML file, applied idempotently.

    from starter.client import connect
    from starter.schedules import apply, load

    client = await connect()
    report = await apply(client, "examples/schedules.yaml", prune=False, dry_run=True)
    for line in report.lines():
        print(line)

The file (camelCase keys; durations as ``15m``, ``1h30m``, seconds or ISO 8601)::

    group: lab                      # optional (default "default"): what --prune may delete
    schedules:
      - id: fabric-audit/lab-ib     # the schedule ID
        workflow: FabricAudit       # a startable workflow type (workflows.catalog.STARTABLE)
        input: {fabric: lab-ib}     # validated against the workflow's input model
        cron: "*/15 * * * *"        # and/or: interval: 15m  (or {every: 1h, offset: 5m})
        timeZone: Europe/Berlin     # IANA name (default UTC)
        overlap: skip               # skip (default) | buffer_one | buffer_all | cancel_other | terminate_other | allow_all
        jitter: 30s
        catchupWindow: 10m          # omitted: the server's default, not managed
        pauseOnFailure: false
        paused: false               # omitted: not managed (operators pause in the UI)
        note: owner infra-ops       # omitted: not managed
        executionTimeout: 1h
        taskQueue: millwright       # default: the caller's (--task-queue / MILLWRIGHT_TASK_QUEUE)
        workflowId: ...             # default: the input's workflow_id(); Temporal appends the scheduled time

Everything is validated before anything is sent. Cron strings are converted here into calendar
specs (standard 5-field cron; when both day-of-month and day-of-week are restricted either one
matches), each with the cron string as its comment, because the server turns cron strings into
calendars and would otherwise leave nothing to compare a file with. A schedule is updated only
when its description differs from the file after normalisation; schedules this module creates
carry the memo ``millwright-managed: {"group": ...}``, which is what ``prune`` deletes by.
"""

from __future__ import annotations

import json
import re
import typing
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Annotated, Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import pydantic
import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PrivateAttr, field_validator, model_validator
from pydantic.alias_generators import to_camel
from temporalio.api.common.v1 import Payload
from temporalio.client import (
    Client,
    Schedule,
    ScheduleActionStartWorkflow,
    ScheduleAlreadyRunningError,
    ScheduleCalendarSpec,
    ScheduleDescription,
    ScheduleIntervalSpec,
    ScheduleOverlapPolicy,
    SchedulePolicy,
    ScheduleRange,
    ScheduleSpec,
    ScheduleState,
    ScheduleUpdate,
)
from temporalio.service import RPCError, RPCStatusCode

from activities.models import StrictModel
from starter.client import (
    DEFAULT_TASK_QUEUE,
    InputError,
    WorkflowSpec,
    parse_input,
    search_attributes_of,
    workflow_specs,
)
from workflows.common.base import WorkflowInput
from workflows.rollout.spec_fields import Duration

MANAGED_MEMO = "millwright-managed"
DEFAULT_GROUP = "default"

Overlap = Literal["skip", "buffer_one", "buffer_all", "cancel_other", "terminate_other", "allow_all"]


class ScheduleFileError(ValueError):
    """A schedules file that cannot be applied; ``errors`` holds one ``file: path: message`` line per problem."""

    def __init__(self, source: str, errors: list[str]) -> None:
        self.source, self.errors = source, errors
        super().__init__(f"invalid schedules file {source}:\n" + "\n".join(f"  {e}" for e in errors))


# ---------------------------------------------------------------- cron


_MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_MONTHS = {m: i + 1 for i, m in enumerate("jan feb mar apr may jun jul aug sep oct nov dec".split())}
_DAYS = {d: i for i, d in enumerate("sun mon tue wed thu fri sat".split())}
# name, low, high, names
_CRON_FIELDS = (("minute", 0, 59, {}), ("hour", 0, 23, {}), ("day-of-month", 1, 31, {}), ("month", 1, 12, _MONTHS),
                ("day-of-week", 0, 7, _DAYS))  # fmt: skip
_ITEM = re.compile(r"^(?:(\*)|([a-z0-9]+)(?:-([a-z0-9]+))?)(?:/(\d+))?$")


def _cron_field(text: str, name: str, low: int, high: int, names: dict[str, int]) -> list[ScheduleRange]:
    def number(token: str) -> int:
        value = names.get(token) if not token.isdigit() else int(token)
        if value is None:
            raise ValueError(
                f"{name} field: {token!r} is not a number" + (f" or a name ({', '.join(names)})" if names else "")
            )
        if not low <= value <= high:
            raise ValueError(f"{name} field: {value} is out of range {low}-{high}")
        return value

    ranges: list[ScheduleRange] = []
    for item in text.lower().split(","):
        m = _ITEM.match(item)
        if not m:
            raise ValueError(f"{name} field: cannot parse {item!r}")
        star, first, last, step_text = m.groups()
        step = int(step_text) if step_text else 1
        if step < 1:
            raise ValueError(f"{name} field: step must be at least 1 in {item!r}")
        if star:
            start, end = low, (6 if name == "day-of-week" else high)
        else:
            start = number(first)
            end = number(last) if last else (high if step_text else start)
            if end < start:
                raise ValueError(f"{name} field: range {item!r} ends before it starts")
        if name == "day-of-week" and end == 7:  # 7 is Sunday too: list the days
            days = sorted({v % 7 for v in range(start, end + 1, step)})
            ranges += [ScheduleRange(d) for d in days]
            continue
        ranges.append(ScheduleRange(start, end, step))
    return ranges


def cron_calendars(expression: str) -> list[ScheduleCalendarSpec]:
    """A 5-field cron string (or @hourly, @daily, ...) as calendar specs; ValueError says what is wrong."""
    text = " ".join(expression.split())
    fields = _MACROS.get(text.lower(), text).split(" ")
    if text.lower().startswith("@every"):
        raise ValueError("@every is not supported in cron; use interval: instead")
    if len(fields) != 5:
        raise ValueError(
            f"cron {expression!r} must have 5 fields (minute hour day-of-month month day-of-week), not {len(fields)}"
        )
    minute, hour, dom, month, dow = (_cron_field(f, *spec) for f, spec in zip(fields, _CRON_FIELDS))
    every_dom, every_dow = [ScheduleRange(1, 31)], [ScheduleRange(0, 6)]
    comment = f"cron: {text}"

    def cal(dom_: list[ScheduleRange], dow_: list[ScheduleRange]) -> ScheduleCalendarSpec:
        return ScheduleCalendarSpec(second=[ScheduleRange(0)], minute=minute, hour=hour, day_of_month=dom_, month=month,
                                    day_of_week=dow_, comment=comment)  # fmt: skip

    if not fields[2].startswith("*") and not fields[4].startswith("*"):  # cron: either day matches
        return [cal(dom, every_dow), cal(every_dom, dow)]
    return [cal(dom, dow)]


# ---------------------------------------------------------------- the file


class _Spec(StrictModel):
    model_config = ConfigDict(populate_by_name=True, alias_generator=to_camel, serialize_by_alias=True)


def _every(value: Any) -> Any:
    return {"every": value} if isinstance(value, (str, int, float, timedelta)) else value


def _cron_list(value: Any) -> Any:
    return [value] if isinstance(value, str) else value


def _overlap(value: Any) -> Any:
    if isinstance(value, ScheduleOverlapPolicy):
        return value.name.lower()
    if isinstance(value, str):  # Skip, BUFFER_ONE, buffer-one, bufferOne
        flat = re.sub(r"[-_\s]", "", value).lower()
        return {o.replace("_", ""): o for o in typing.get_args(Overlap)}.get(flat, value)
    return value


class IntervalSpec(_Spec):
    every: Duration
    offset: Duration = timedelta(0)

    @model_validator(mode="after")
    def _bounds(self) -> IntervalSpec:
        if self.every < timedelta(seconds=1):
            raise ValueError("every must be at least 1s")
        if not timedelta(0) <= self.offset < self.every:
            raise ValueError("offset must be at least 0 and less than every")
        return self


class ScheduleEntry(_Spec):
    """One schedule: when, what, and how runs may overlap."""

    id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/@-]{0,199}$", description="Schedule ID.")
    workflow: str = Field(description="Startable workflow type, e.g. FleetHealthSweep.")
    input: dict[str, Any] = Field(
        default_factory=dict, description="The workflow's input (validated against its model)."
    )
    workflow_id: str | None = Field(None, min_length=1, description="Default: the input's workflow_id().")
    cron: Annotated[list[str], BeforeValidator(_cron_list)] = Field(default_factory=list)
    interval: Annotated[IntervalSpec | None, BeforeValidator(_every)] = None
    time_zone: str | None = Field(None, description="IANA time zone for cron (default UTC).")
    overlap: Annotated[Overlap, BeforeValidator(_overlap)] = "skip"
    jitter: Duration | None = None
    catchup_window: Duration | None = None
    pause_on_failure: bool = False
    execution_timeout: Duration | None = None
    task_queue: str | None = Field(None, min_length=1)
    paused: bool | None = None
    note: str | None = None

    _workflow: WorkflowSpec | None = PrivateAttr(None)
    _input: WorkflowInput | None = PrivateAttr(None)

    @field_validator("cron")
    @classmethod
    def _valid_cron(cls, value: list[str]) -> list[str]:
        for expression in value:
            cron_calendars(expression)
        return [" ".join(e.split()) for e in value]

    @field_validator("time_zone")
    @classmethod
    def _valid_zone(cls, value: str | None) -> str | None:
        if value:
            try:
                ZoneInfo(value)
            except (ZoneInfoNotFoundError, ValueError):
                raise ValueError(f"unknown time zone {value!r} (an IANA name such as UTC or Europe/Berlin)") from None
        return value or None

    @field_validator("jitter", "catchup_window", "execution_timeout")
    @classmethod
    def _not_negative(cls, value: timedelta | None) -> timedelta | None:
        if value is not None and value < timedelta(0):
            raise ValueError("must not be negative")
        return value

    @model_validator(mode="after")
    def _when(self) -> ScheduleEntry:
        if not self.cron and self.interval is None:
            raise ValueError("give cron or interval (or both)")
        return self

    @property
    def workflow_input(self) -> WorkflowInput:
        if self._input is None:
            raise RuntimeError("entry not validated: use starter.schedules.load()")
        return self._input


class SchedulesFile(_Spec):
    group: str = Field(DEFAULT_GROUP, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$",
                       description="Owner of these schedules: --prune deletes only this group's.")  # fmt: skip
    schedules: list[ScheduleEntry] = Field(default_factory=list)


def _loc(loc: tuple[Any, ...]) -> str:
    return ".".join(str(p) for p in loc)


def _msg(error: Any) -> str:
    return str(error["msg"]).removeprefix("Value error, ")


def load(source: str | Path | dict[str, Any] | SchedulesFile, *, name: str | None = None) -> SchedulesFile:
    """Read and validate a schedules file (path, parsed dict or model); ScheduleFileError lists every problem."""
    if isinstance(source, SchedulesFile):
        data: Any = source.model_dump(mode="json", exclude_none=True)
        name = name or "<schedules>"
    elif isinstance(source, dict):
        data, name = source, name or "<schedules>"
    else:
        name = name or str(source)
        try:
            text = Path(source).read_text()
        except OSError as e:
            raise ScheduleFileError(name, [f"{name}: cannot read: {e.strerror or e}"]) from None
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise ScheduleFileError(name, [f"{name}: not valid YAML: {e}"]) from None
    if not isinstance(data, dict):
        raise ScheduleFileError(
            name, [f"{name}: expected a mapping with a 'schedules' list, got {type(data).__name__}"]
        )

    errors: list[str] = []
    raw = data.get("schedules")
    if not isinstance(raw, list):
        errors.append(f"{name}: schedules: expected a list of schedules")
        raw = []
    try:
        top = SchedulesFile.model_validate({k: v for k, v in data.items() if k != "schedules"})
    except pydantic.ValidationError as e:
        errors += [f"{name}: {_loc(x['loc']) or '(file)'}: {_msg(x)}" for x in e.errors(include_url=False)]
        top = SchedulesFile()

    specs = workflow_specs()
    first_at: dict[str, int] = {}
    entries: list[ScheduleEntry] = []
    for i, item in enumerate(raw):
        ident = item.get("id") if isinstance(item, dict) else None
        where = f"{name}: schedules[{i}]" + (f" ({ident})" if isinstance(ident, str) else "")
        if isinstance(ident, str):
            if ident in first_at:
                errors.append(f"{where}.id: duplicate schedule ID (first at schedules[{first_at[ident]}])")
            first_at.setdefault(ident, i)
        entry: ScheduleEntry | None = None
        try:
            entry = ScheduleEntry.model_validate(item)
        except pydantic.ValidationError as e:
            errors += [
                f"{where}{'.' if x['loc'] else ''}{_loc(x['loc'])}: {_msg(x)}" for x in e.errors(include_url=False)
            ]
        workflow = item.get("workflow") if isinstance(item, dict) else None
        spec = specs.get(workflow) if isinstance(workflow, str) else None
        if isinstance(workflow, str) and spec is None:
            errors.append(f"{where}.workflow: unknown workflow {workflow!r}; startable: {', '.join(sorted(specs))}")
        inp = None
        if spec is not None and isinstance(item.get("input", {}), dict):
            try:
                inp = parse_input(spec, item.get("input") or {})
            except InputError as e:
                errors += [f"{where}.input.{line}".replace(".input.(input):", ".input:") for line in e.errors]
        if entry is None or spec is None or inp is None:
            continue
        if entry.workflow_id is None:
            try:
                inp.workflow_id()
            except NotImplementedError:
                errors.append(f"{where}.workflowId: {spec.name}'s input has no workflow_id(); give workflowId")
                continue
        entry._workflow, entry._input = spec, inp
        entries.append(entry)
    if errors:
        raise ScheduleFileError(name, errors)
    top.schedules = entries
    return top


# ---------------------------------------------------------------- desired vs described


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


def _merged(entry: ScheduleEntry, current: Schedule, task_queue: str) -> Schedule:
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


# ---------------------------------------------------------------- apply


Action = Literal["created", "updated", "unchanged", "deleted"]


@dataclass
class ScheduleResult:
    id: str
    action: Action
    changes: list[FieldChange] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "action": self.action,
            "changes": [{"field": c.field, "old": c.old, "new": c.new} for c in self.changes],
            "warnings": self.warnings,
        }


@dataclass
class ApplyReport:
    group: str
    dry_run: bool
    results: list[ScheduleResult] = field(default_factory=list)

    def by_action(self, action: Action) -> list[str]:
        return [r.id for r in self.results if r.action == action]

    @property
    def changed(self) -> bool:
        return any(r.action != "unchanged" for r in self.results)

    def as_dict(self) -> dict[str, Any]:
        return {
            "group": self.group,
            "dryRun": self.dry_run,
            "changed": self.changed,
            "results": [r.as_dict() for r in self.results],
        }

    def lines(self) -> list[str]:
        """The report for people: one line per schedule, one per changed field, then a summary."""
        verb = {"created": "would create", "updated": "would update", "deleted": "would delete"} if self.dry_run else {}
        out: list[str] = []
        for r in self.results:
            out.append(f"{verb.get(r.action, r.action):<12} {r.id}")
            out += [f"    {c.field}: {c.old} -> {c.new}" for c in r.changes]
            out += [f"    warning: {w}" for w in r.warnings]
        counts = ", ".join(
            f"{len(self.by_action(a))} {a}" for a in ("created", "updated", "unchanged", "deleted") if self.by_action(a)
        )
        tail = " (dry run: nothing applied)" if self.dry_run else ""
        out.append(f"{len(self.results)} schedule(s) in group {self.group}: {counts or 'none'}{tail}")
        return out


async def _describe(client: Client, schedule_id: str) -> ScheduleDescription | None:
    try:
        return await client.get_schedule_handle(schedule_id).describe()
    except RPCError as e:
        if e.status == RPCStatusCode.NOT_FOUND:
            return None
        raise


async def managed_group(desc: Any) -> str | None:
    """The group of a schedule created by ``apply`` (a ScheduleDescription or list entry), else None."""
    try:
        marker = await desc.memo_value(MANAGED_MEMO, None)
    except Exception:
        return None
    if isinstance(marker, dict):
        return str(marker.get("group") or DEFAULT_GROUP)
    return None


async def _apply_one(
    client: Client, entry: ScheduleEntry, group: str, task_queue: str, dry_run: bool
) -> ScheduleResult:
    for _ in range(3):
        desc = await _describe(client, entry.id)
        if desc is None:
            if not dry_run:
                try:
                    await client.create_schedule(
                        entry.id, desired_schedule(entry, task_queue), memo={MANAGED_MEMO: {"group": group}}
                    )
                except ScheduleAlreadyRunningError:
                    continue  # created meanwhile: compare with it
            return ScheduleResult(entry.id, "created")
        warnings = []
        owner = await managed_group(desc)
        if owner is None:
            warnings.append(
                "was not created by `schedules apply` (no millwright-managed memo): --prune will never delete it"
            )
        elif owner != group:
            warnings.append(f"belongs to group {owner!r}, not {group!r}: only a prune of group {owner!r} deletes it")
        changes = await diff(client, entry, desc.schedule, task_queue)
        if not changes:
            return ScheduleResult(entry.id, "unchanged", warnings=warnings)
        if not dry_run:
            await client.get_schedule_handle(entry.id).update(
                lambda u: ScheduleUpdate(schedule=_merged(entry, u.description.schedule, task_queue))
            )
        return ScheduleResult(entry.id, "updated", changes, warnings)
    raise RuntimeError(f"schedule {entry.id}: created and deleted concurrently, try again")


async def apply(
    client: Client,
    file_or_model: str | Path | dict[str, Any] | SchedulesFile,
    prune: bool = False,
    dry_run: bool = False,
    *,
    task_queue: str = DEFAULT_TASK_QUEUE,
) -> ApplyReport:
    """Create or update the file's schedules so Temporal matches it; with ``prune``, delete this group's others.

    The whole file is validated first (ScheduleFileError: nothing is applied). ``dry_run`` reports
    what would change and writes nothing. ``task_queue`` is for entries without ``taskQueue``.
    """
    model = load(file_or_model)
    report = ApplyReport(model.group, dry_run)
    for entry in model.schedules:
        report.results.append(await _apply_one(client, entry, model.group, task_queue, dry_run))
    if prune:
        wanted = {e.id for e in model.schedules}
        async for listed in await client.list_schedules():
            if listed.id in wanted or await managed_group(listed) != model.group:
                continue
            desc = await _describe(client, listed.id)  # the list is eventually consistent
            if desc is None or await managed_group(desc) != model.group:
                continue
            if not dry_run:
                try:
                    await client.get_schedule_handle(listed.id).delete()
                except RPCError as e:
                    if e.status != RPCStatusCode.NOT_FOUND:
                        raise
            report.results.append(
                ScheduleResult(
                    listed.id, "deleted", [FieldChange("schedule", spec_text(desc.schedule.spec), "(deleted)")]
                )
            )
    return report


# ---------------------------------------------------------------- list


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
        desc = await _describe(client, listed.id)
        if desc is None:
            continue
        s = desc.schedule
        action = s.action
        last = None
        if desc.info.recent_actions:
            recent = desc.info.recent_actions[-1]
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
