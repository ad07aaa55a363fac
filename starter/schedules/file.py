"""The schedules file: its models, and `load`, which validates all of it before anything is sent.

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

Everything is validated before anything is sent: the fields, the cron strings (starter/schedules/cron.py), the
workflow type, and its input against the workflow's model.
"""

from __future__ import annotations

import re
import typing
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import pydantic
import yaml
from pydantic import BeforeValidator, ConfigDict, Field, PrivateAttr, field_validator, model_validator
from pydantic.alias_generators import to_camel
from temporalio.client import ScheduleOverlapPolicy

from activities.models import StrictModel
from starter.client import InputError, WorkflowSpec, parse_input, workflow_specs
from starter.schedules.cron import cron_calendars
from workflows.common.base import WorkflowInput
from workflows.rollout.spec.spec_fields import Duration

DEFAULT_GROUP = "default"

Overlap = Literal["skip", "buffer_one", "buffer_all", "cancel_other", "terminate_other", "allow_all"]


class ScheduleFileError(ValueError):
    """A schedules file that cannot be applied; ``errors`` holds one ``file: path: message`` line per problem."""

    def __init__(self, source: str, errors: list[str]) -> None:
        self.source, self.errors = source, errors
        super().__init__(f"invalid schedules file {source}:\n" + "\n".join(f"  {e}" for e in errors))


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
            raise RuntimeError("entry not validated: use starter.schedules.file.load()")
        return self._input


class SchedulesFile(_Spec):
    group: str = Field(DEFAULT_GROUP, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$",
                       description="Owner of these schedules: --prune deletes only this group's.")  # fmt: skip
    schedules: list[ScheduleEntry] = Field(default_factory=list)


def _loc(loc: tuple[Any, ...]) -> str:
    return ".".join(str(p) for p in loc)


def _msg(error: Any) -> str:
    return str(error["msg"]).removeprefix("Value error, ")


def load(source: str | Path | dict[str, Any] | SchedulesFile, *, name: str | None = None) -> SchedulesFile:  # noqa: C901 (one check per way a schedules file can be given or be wrong, each with its message)
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
