"""Schedules as code: Temporal Schedules from a declarative YAML file (starter/schedules/file.py), applied
idempotently.

    from starter.client import connect
    from starter.schedules.apply import apply

    client = await connect()
    report = await apply(client, "examples/schedules.yaml", prune=False, dry_run=True)
    for line in report.lines():
        print(line)

A schedule is updated only when its description differs from the file after normalisation
(starter/schedules/diff.py); schedules this module creates carry the memo ``millwright-managed: {"group": ...}``,
which is what ``prune`` deletes by (starter/schedules/managed.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from temporalio.client import Client, ScheduleAlreadyRunningError, ScheduleUpdate
from temporalio.service import RPCError, RPCStatusCode

from starter.client import DEFAULT_TASK_QUEUE
from starter.schedules.diff import FieldChange, desired_schedule, diff, merged, spec_text
from starter.schedules.file import ScheduleEntry, SchedulesFile, load
from starter.schedules.managed import MANAGED_MEMO, describe, managed_group

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


async def _apply_one(
    client: Client, entry: ScheduleEntry, group: str, task_queue: str, dry_run: bool
) -> ScheduleResult:
    for _ in range(3):
        desc = await describe(client, entry.id)
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
                lambda u: ScheduleUpdate(schedule=merged(entry, u.description.schedule, task_queue))
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
            desc = await describe(client, listed.id)  # the list is eventually consistent
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
