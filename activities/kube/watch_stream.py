"""One Kubernetes watch response read as its events: the event path's node watch (worker/node_watch.py) and the
waits' shared watches (activities/kube/shared_watch.py) both read their streams with it."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

WATCH_SECONDS = 300  # one watch request's server-side timeout; the watch then resumes from its resourceVersion
BACKOFF = (1.0, 30.0)  # seconds: first and longest wait after a failed list or watch


class Expired(Exception):
    """The resourceVersion is too old (410 Gone): list again."""


async def watch_events(resp: Any, what: str) -> AsyncIterator[dict[str, Any]]:
    """The events of `resp` (an aiohttp response to a `watch=true` request, released at the end), one JSON object
    per line. An expired resourceVersion (the answer's status or an ERROR event) raises `Expired`; any other error
    a RuntimeError naming `what`."""
    try:
        if resp.status == 410:
            raise Expired()
        if resp.status != 200:
            raise RuntimeError(f"{what}: HTTP {resp.status}")
        buffer = b""
        async for chunk in resp.content.iter_any():  # lines can pass aiohttp's readline limit (64 KiB)
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                if not line.strip():
                    continue
                event = json.loads(line)
                if event.get("type") == "ERROR":
                    status = event.get("object") or {}
                    if status.get("code") == 410:
                        raise Expired()
                    raise RuntimeError(f"{what}: watch error: {status.get('message') or status}")
                yield event
    finally:
        resp.release()
