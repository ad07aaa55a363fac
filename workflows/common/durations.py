"""Durations as people read them in notes and reasons."""

from __future__ import annotations

from datetime import timedelta


def human_duration(d: timedelta) -> str:
    """Rounded down to one unit: 90s, 5m, 3h."""
    s = int(d.total_seconds())
    if s < 120:
        return f"{s}s"
    if s < 7200:
        return f"{s // 60}m"
    return f"{s // 3600}h"
