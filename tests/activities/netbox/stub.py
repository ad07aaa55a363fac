"""A few NetBox REST collections in memory, for client tests that need no real NetBox (the real one is the slow
tier): ``async with NetBoxStub(ssl_context) as stub: stub.url``.

Any ``/api/<app>/<endpoint>/``: GET lists (exact-match filters on top-level fields, ``q`` a substring of the
record's JSON; NetBox's paged shape), POST
creates (201), ``GET``/``PATCH /<id>/`` (custom_fields merged, as NetBox does). ``stub.drop(method, path_regex,
when)`` makes the next matching request lose its answer: ``"after"`` carries it out first, ``"before"`` does not.
``stub.requests`` lists (method, path) of every request served."""

from __future__ import annotations

import json
import re
import ssl
from typing import Any

from aiohttp import web

_PAGING = {"limit", "offset", "brief", "ordering"}


class NetBoxStub:
    def __init__(self, ssl_context: ssl.SSLContext | None = None) -> None:
        self.ssl_context = ssl_context
        self.objects: dict[str, dict[int, dict[str, Any]]] = {}
        self.requests: list[tuple[str, str]] = []
        self._drops: list[tuple[str, str, str]] = []
        self._next_id = 1
        self._runner: web.AppRunner | None = None
        self.url = ""

    def add(self, collection: str, record: dict[str, Any]) -> dict[str, Any]:
        """Seed an object, e.g. ``stub.add("tenancy/tenants", {...})``; returns it with its id."""
        record = {"id": self._next_id, "custom_fields": {}, **record}
        self.objects.setdefault(collection, {})[self._next_id] = record
        self._next_id += 1
        return record

    def drop(self, method: str, path: str, when: str) -> None:
        self._drops.append((method, path, when))

    async def __aenter__(self) -> NetBoxStub:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._dispatch)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=self.ssl_context)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"{'https' if self.ssl_context else 'http'}://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def _drop_for(self, method: str, path: str) -> str | None:
        for i, (m, p, when) in enumerate(self._drops):
            if m == method and re.search(p, path):
                del self._drops[i]
                return when
        return None

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        self.requests.append((request.method, request.path))
        body = await request.json() if request.can_read_body else None
        drop = self._drop_for(request.method, request.path)
        if drop == "before":
            return self._cut(request)
        status, payload = self._handle(request, body)
        if drop == "after":
            return self._cut(request)
        return web.json_response(payload, status=status)

    @staticmethod
    def _cut(request: web.Request) -> web.StreamResponse:
        if request.transport is not None:
            request.transport.abort()
        raise ConnectionResetError("stub: answer dropped")

    def _handle(self, request: web.Request, body: Any) -> tuple[int, Any]:
        m = re.fullmatch(r"/api/([a-z-]+/[a-z-]+)/(?:(\d+)/)?", request.path)
        if not m:
            return 404, {"detail": "Not found."}
        collection = self.objects.setdefault(m[1], {})
        base = f"{self.url}/api/{m[1]}/"
        if m[2] is None and request.method == "GET":
            wanted = {k: v for k, v in request.query.items() if k not in _PAGING | {"q"}}
            found = [o for o in collection.values() if all(str(o.get(k)) == v for k, v in wanted.items())
                     and request.query.get("q", "") in json.dumps(o)]  # fmt: skip
            return 200, {"count": len(found), "next": None, "previous": None, "results": found}
        if m[2] is None and request.method == "POST":
            return 201, self.add(m[1], {"url": f"{base}{self._next_id}/", **body})
        record = collection.get(int(m[2])) if m[2] else None
        if record is None:
            return 404, {"detail": "Not found."}
        if request.method == "PATCH":
            for key, value in body.items():
                record[key] = {**record[key], **value} if key == "custom_fields" else value
        return 200, record
