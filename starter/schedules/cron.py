"""Cron strings as Temporal calendar specs (standard 5-field cron and the @hourly, @daily, ... macros).

Each calendar carries its cron string as its comment, because the server turns cron strings into calendars and
would otherwise leave nothing to compare a schedules file with. When both day-of-month and day-of-week are
restricted either one matches, as in cron.
"""

from __future__ import annotations

import re

from temporalio.client import ScheduleCalendarSpec, ScheduleRange

_MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_MONTHS = {
    m: i + 1 for i, m in enumerate(["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"])
}
_DAYS = {d: i for i, d in enumerate(["sun", "mon", "tue", "wed", "thu", "fri", "sat"])}
_NO_NAMES: dict[str, int] = {}
# name, low, high, names
_CRON_FIELDS = (("minute", 0, 59, _NO_NAMES), ("hour", 0, 23, _NO_NAMES), ("day-of-month", 1, 31, _NO_NAMES),
                ("month", 1, 12, _MONTHS), ("day-of-week", 0, 7, _DAYS))  # fmt: skip
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
