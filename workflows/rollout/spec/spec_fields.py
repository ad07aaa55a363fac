"""The field types and base model every section of the rollout spec shares.

NodeWright's camelCase in JSON, snake_case in Python (`SpecModel`), its Go durations (`Duration`), weekday
names (`Weekday`), and `zone`, a time zone that works inside the workflow sandbox. Pure: stdlib + pydantic.
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Annotated, Any, Literal
from zoneinfo import ZoneInfo

from pydantic import BeforeValidator, ConfigDict
from pydantic.alias_generators import to_camel

from activities.models import StrictModel

_GO_DURATION = re.compile(r"^(?:\d+(?:\.\d+)?(?:ns|us|µs|ms|s|m|h))+$")
_GO_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")
_GO_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}

WEEKDAYS: tuple[Weekday, ...] = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
_WEEKDAY_NAMES = {name: name for name in WEEKDAYS} | {
    "monday": "mon",
    "tuesday": "tue",
    "wednesday": "wed",
    "thursday": "thu",
    "friday": "fri",
    "saturday": "sat",
    "sunday": "sun",
}


def _go_duration(value: Any) -> Any:
    """Accept NodeWright's Go durations ("10m", "1h30m", "30s") besides pydantic's forms
    (seconds as a number, ISO 8601 such as "PT10M")."""
    if isinstance(value, str) and _GO_DURATION.match(value.strip()):
        seconds = sum(float(n) * _GO_UNITS[unit] for n, unit in _GO_DURATION_PART.findall(value.strip()))
        return timedelta(seconds=seconds)
    return value


Duration = Annotated[timedelta, BeforeValidator(_go_duration)]


def _weekday(value: Any) -> Any:
    if isinstance(value, str):
        return _WEEKDAY_NAMES.get(value.strip().lower(), value)
    return value


Weekday = Annotated[Literal["mon", "tue", "wed", "thu", "fri", "sat", "sun"], BeforeValidator(_weekday)]


def zone(name: str) -> ZoneInfo:
    """`ZoneInfo(name)`, also inside the Temporal workflow sandbox.

    The sandbox wraps `zoneinfo.ZoneInfo` (and whatever it returns) in a proxy, which
    `datetime.astimezone` refuses. The proxy forwards `__mro__`, whose first entry is the
    real class. Reading the tz database is deterministic for a given worker image.
    """
    real: type[ZoneInfo] = ZoneInfo.__mro__[0]
    return real(name)


class SpecModel(StrictModel):
    """NodeWright's camelCase in JSON, snake_case in Python; unknown fields rejected."""

    model_config = ConfigDict(populate_by_name=True, alias_generator=to_camel, serialize_by_alias=True)
