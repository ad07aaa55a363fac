"""Which schedules `apply` manages: those created with the memo ``millwright-managed: {"group": ...}``, which is
what ``prune`` deletes by."""

from __future__ import annotations

from typing import Any

from temporalio.client import Client, ScheduleDescription
from temporalio.service import RPCError, RPCStatusCode

from starter.schedules.file import DEFAULT_GROUP

MANAGED_MEMO = "millwright-managed"


async def describe(client: Client, schedule_id: str) -> ScheduleDescription | None:
    """The schedule as the server describes it; None when there is none."""
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
