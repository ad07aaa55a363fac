"""Fault injection and the audit log: the one front the lab's HTTP emulators (Kubernetes, Redfish, UFM) share.

A test arms a fault with ``POST /_lab/faults`` ``{"match": {...}, "action": {...}, "count": 1, "skip": 0,
"after": <fault id>}``:

* ``match``: the request facts an emulator names (Kubernetes: verb, group, resource, subresource, namespace,
  name; Redfish: server, method, path; UFM: method, path). A key left out matches anything; ``path`` is a regular
  expression searched in the path, ``method`` is compared case-insensitively, everything else exactly (so the
  Kubernetes ``group: ""`` is the core group and ``subresource: ""`` the object itself).
* ``action``, the first of these it holds: ``{"delay": s}`` holds the request, then serves it; ``{"delayAfter":
  s}`` serves it, logs it, then holds the answer (a worker can be killed meanwhile); ``{"drop": "before"}`` cuts
  the connection before the request is served, ``{"drop": "after"}`` after (served, its answer lost);
  ``{"status": code, "message": ...}`` answers with that status in the emulator's own error shape (the
  emulator adds its own keys: Kubernetes ``reason``, ``retryAfterSeconds``, ``details``). A 2xx status is
  either served first and then answered with that code (Kubernetes) or answered without being served (UFM,
  Redfish): ``FaultFront(serve_2xx=...)``.
* ``count``: how many matching requests it answers (-1: until cleared); ``skip``: that many matching requests
  pass through untouched first (no later fault sees them either); ``after``: armed only once that fault was
  served, so a test places a fault by the audit order (the read that follows a lost write).

``GET /_lab/faults`` lists them (``remaining``, ``served``, ...), ``DELETE /_lab/faults`` clears them.
``GET /_lab/audit[?since=N&writes=1&limit=L&<filter>=V]`` ``{"entries": [...], "next": N}`` pages the audit log
(each entry has ``seq``, ``time``, ``write``, the emulator's request facts and its status under the emulator's
``code_key``; ``fault`` when one answered it); ``GET /_lab/audit/cursor`` ``{"next": N}`` is the latest ``seq``.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

ACTIONS = ("delay", "delayAfter", "drop", "status")  # in the order they take precedence


class FaultError(ValueError):
    """An armed fault the table refuses (the emulator answers 400 in its own shape)."""


class FaultTable:
    """The armed faults of one emulator, matched in the order they were armed."""

    def __init__(self, match_keys: tuple[str, ...], actions: tuple[str, ...] = ACTIONS) -> None:
        self.match_keys, self.actions = match_keys, actions
        self.faults: list[dict] = []
        self.seq = 0

    def arm(self, body: Any) -> dict:
        """A `POST /_lab/faults` body, checked: every mistake is a FaultError naming the field."""
        if not isinstance(body, dict):
            raise FaultError("a fault is a JSON object {match, action, count, skip, after}")
        unknown = set(body) - {"match", "action", "count", "skip", "after"}
        if unknown:
            raise FaultError(f"unknown fault fields {sorted(unknown)}")
        match, action = body.get("match") or {}, body.get("action")
        if not isinstance(match, dict) or set(match) - set(self.match_keys):
            raise FaultError(f"match: an object with keys among {', '.join(self.match_keys)}")
        if "path" in match:
            try:
                re.compile(match["path"])
            except (re.error, TypeError) as e:
                raise FaultError(f"match.path: not a regular expression: {e}") from None
        if not isinstance(action, dict) or not any(k in action for k in self.actions):
            raise FaultError(f"action needs one of {', '.join(self.actions)}")
        if "drop" in action and action["drop"] not in ("before", "after"):
            raise FaultError("action.drop: 'before' or 'after'")
        try:
            count, skip = int(body.get("count", 1)), int(body.get("skip", 0))
            after = None if body.get("after") is None else int(body["after"])
            for k in ("delay", "delayAfter", "status"):
                if k in action:
                    float(action[k])
        except (TypeError, ValueError) as e:
            raise FaultError(f"count, skip, after and action values are numbers: {e}") from None
        if after is not None and not any(f["id"] == after for f in self.faults):
            raise FaultError(f"after: no fault {after}")
        self.seq += 1
        fault = {
            "id": self.seq,
            "match": dict(match),
            "action": dict(action),
            "remaining": count,
            "skip": skip,
            "after": after,
            "served": 0,
        }
        self.faults.append(fault)
        return fault

    def clear(self) -> None:
        self.faults.clear()

    def match(self, facts: dict, *, status_only: bool = False) -> dict | None:
        """The fault that answers a request with these facts, its counters moved on; None: serve it as is.
        `status_only`: for an emulator's own internal calls, which only a status fault can answer."""
        if not self.faults:
            return None
        served = {f["id"]: f["served"] for f in self.faults}
        for f in self.faults:
            if f["remaining"] == 0 or (status_only and "status" not in f["action"]):
                continue
            if f["after"] is not None and not served.get(f["after"]):
                continue
            if not all(_matches(k, want, facts.get(k)) for k, want in f["match"].items()):
                continue
            if f["skip"] > 0:
                f["skip"] -= 1
                return None
            if f["remaining"] > 0:
                f["remaining"] -= 1
            f["served"] += 1
            return f
        return None


def _matches(key: str, want: Any, have: Any) -> bool:
    if want is None:
        return True
    if key == "path":
        return re.search(want, have or "") is not None
    if key == "method":
        return str(want).upper() == str(have or "").upper()
    return want == have


class AuditLog:
    """Every request an emulator answered, newest last; the oldest go once `keep` entries are held."""

    def __init__(self, keep: int, filters: tuple[str, ...] = ()) -> None:
        self.entries: deque = deque(maxlen=keep)
        self.seq = 0
        self.filters = filters  # entry keys `GET /_lab/audit` may filter on (Redfish: server)

    def add(self, entry: dict) -> dict:
        self.seq += 1
        entry["seq"] = self.seq
        self.entries.append(entry)
        return entry

    def clear(self) -> None:
        self.entries.clear()  # `seq` goes on: a cursor taken before a reset stays valid

    def page(self, query: Any) -> dict:
        """`GET /_lab/audit`: entries after `since` (writes only with `writes=1`, at most `limit`), and `next`, the
        `since` that continues where this page ends."""
        since, limit = int(query.get("since") or 0), int(query.get("limit") or 0)
        writes = (query.get("writes") or "").lower() in ("1", "true", "yes")
        where = {k: query[k] for k in self.filters if query.get(k) is not None}
        out = []
        # Entries are held in `seq` order, `seq` counting one by one: skip those up to `since` without looking at
        # them (a follower reading every few seconds made the emulator walk all 200,000 held entries each time).
        skip = max(0, min(len(self.entries), since - self.entries[0]["seq"] + 1)) if self.entries else 0
        for e in itertools.islice(self.entries, skip, None):
            if e["seq"] > since and (e.get("write") or not writes) and all(e.get(k) == v for k, v in where.items()):
                out.append(e)
                if limit and len(out) > limit:
                    break
        if limit and len(out) > limit:
            out = out[:limit]
            return {"entries": out, "next": out[-1]["seq"]}
        return {"entries": out, "next": max(since, self.seq)}


async def admin(request: web.Request, faults: FaultTable, audit: AuditLog | None = None) -> web.Response | None:
    """The `/_lab/faults` and (with `audit`) `/_lab/audit` routes; None for any other path. A refused fault raises
    FaultError."""
    path, m = request.path.rstrip("/"), request.method
    if path == "/_lab/faults":
        if m == "POST":
            raw = await request.read()
            try:
                body = json.loads(raw) if raw else {}
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise FaultError(f"the fault is not JSON: {e}") from None
            return web.json_response({"id": faults.arm(body)["id"]})
        if m == "DELETE":
            faults.clear()
            return web.json_response({"ok": True})
        return web.json_response({"faults": faults.faults})
    if audit is None:
        return None
    if path == "/_lab/audit/cursor" and m == "GET":
        return web.json_response({"next": audit.seq})
    if path == "/_lab/audit" and m == "GET":
        return web.json_response(audit.page(request.query))
    return None


class FaultFront:
    """Serves a request through the fault that matched it, and logs it: `serve` answers it as the emulator does,
    `refuse(fault)` is a status fault's answer in the emulator's error shape, `record(entry)` appends to the
    audit log (an emulator may add to the entry first). The entry's status goes under `code_key`."""

    def __init__(self, record: Callable[[dict], Any], *, code_key: str = "code", serve_2xx: bool = False) -> None:
        self.record, self.code_key, self.serve_2xx = record, code_key, serve_2xx

    async def handle(self, request: web.Request, entry: dict, fault: dict | None,
                     serve: Callable[[], Awaitable[web.StreamResponse]],
                     refuse: Callable[[dict], web.Response]) -> web.StreamResponse:  # fmt: skip
        action = fault["action"] if fault else {}
        delay_after, drop_after, answer_code = 0.0, False, None
        if fault:
            entry["fault"] = {"id": fault["id"], **action}
        if "delay" in action:
            await asyncio.sleep(float(action["delay"]))
        elif "delayAfter" in action:
            delay_after = float(action["delayAfter"])
        elif action.get("drop") == "before":
            entry[self.code_key] = 0
            self.record(entry)
            return drop(request)
        elif "drop" in action:
            drop_after = True
        elif fault and "status" in action:
            code = int(action["status"])
            if self.serve_2xx and 200 <= code < 300:
                answer_code = code
            else:
                refused = refuse(fault)
                entry[self.code_key] = refused.status
                self.record(entry)
                return refused
        resp = await serve()
        if not isinstance(resp, web.Response):  # a stream (a watch) logs itself
            return resp
        if answer_code is not None and 200 <= resp.status < 300:  # a request that failed keeps its own answer
            resp.set_status(answer_code)
        entry.setdefault(self.code_key, resp.status)
        self.record(entry)
        if drop_after:
            return drop(request)
        if delay_after:
            await asyncio.sleep(delay_after)
        return resp


def drop(request: web.Request) -> web.StreamResponse:
    """Cut the client's connection: it sees no answer at all."""
    if request.transport is not None:
        request.transport.abort()
    raise ConnectionResetError("lab fault: connection dropped")
