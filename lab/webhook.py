"""A webhook receiver for the lab: ``python -m lab.webhook --port 0 --ready-file F``.

``--tls-cert F --tls-key F`` (lab/tls.py) serves HTTPS instead of HTTP, the admin API included.

Takes any ``POST`` with a JSON body (a path of your choice, e.g. ``/hooks/ops``) and answers 204.
Deliveries with an ``Idempotency-Key`` already seen are answered 204 again and recorded as duplicates,
so tests can check that a retried notification reached the receiver once. With ``LAB_WEBHOOK_TOKEN`` in its
environment (``WebhookReceiver(token=...)``) a missing or wrong ``Authorization: Bearer`` gets 401.

Admin API: ``GET /_lab/received`` -> ``{"events": [...], "duplicates": n, "answers": [status, ...]}`` (one event
per idempotency key: path, headers of interest, body, deliveries; `answers`: every POST's status, in order);
``POST /_lab/reset``; ``POST /_lab/faults`` ``{"match": {"method", "path" (regex)}, "action": {"status": 503},
"count": 1}`` (the next matching deliveries get that status; lab/faults.py), ``GET``/``DELETE /_lab/faults``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import time
from typing import Any

from aiohttp import web

from lab import faults as lab_faults
from lab import tls as lab_tls
from lab.faults import FaultTable
from lab.k8s.process import ChildProcess
from lab.loopback import AdminClient, serve_app, server_arguments

log = logging.getLogger("lab.webhook")
IDEMPOTENCY_HEADER = "Idempotency-Key"


class WebhookServer:
    def __init__(self, token: str | None = None) -> None:
        self.token = token
        self.events: dict[str, dict[str, Any]] = {}  # idempotency key (or a sequence number) -> event
        self.duplicates = 0
        self.faults = FaultTable(("method", "path"), actions=("status",))  # lab/faults.py
        self.answers: list[int] = []
        self.app = web.Application()
        self.app.router.add_route("*", "/{tail:.*}", self.dispatch)

    def _fault(self, method: str, path: str) -> int | None:
        f = self.faults.match({"method": method, "path": path})
        return None if f is None else int(f["action"]["status"])

    async def dispatch(self, request: web.Request) -> web.StreamResponse:
        if request.path.startswith("/_lab/"):
            return await self.admin(request, request.path)
        status, response = self._receive(request, await request.read())
        self.answers.append(status)
        return response

    def _receive(self, request: web.Request, raw: bytes) -> tuple[int, web.StreamResponse]:
        def error(status: int, message: str) -> tuple[int, web.StreamResponse]:
            return status, web.json_response({"error": message}, status=status)

        injected = self._fault(request.method, request.path)
        if injected is not None:
            return error(injected, "injected fault")
        if request.method != "POST":
            return error(405, "POST only")
        if self.token and request.headers.get("Authorization") != f"Bearer {self.token}":
            return error(401, "unauthorized")
        try:
            body = json.loads(raw)
        except ValueError:
            return error(400, "body is not JSON")
        key = request.headers.get(IDEMPOTENCY_HEADER) or f"no-key-{len(self.answers) + 1}"
        if key in self.events:
            self.events[key]["deliveries"] += 1
            self.duplicates += 1
        else:
            self.events[key] = {
                "path": request.path, "key": request.headers.get(IDEMPOTENCY_HEADER), "body": body, "deliveries": 1,
                "received_at": time.time(),
                "headers": {h: request.headers[h] for h in ("Content-Type", "User-Agent", "X-Millwright-Event")
                            if h in request.headers},
            }  # fmt: skip
        return 204, web.Response(status=204)

    async def admin(self, request: web.Request, path: str) -> web.Response:
        m = request.method
        try:
            served = await lab_faults.admin(request, self.faults)
        except lab_faults.FaultError as e:
            return web.json_response({"error": str(e)}, status=400)
        if served is not None:
            return served
        if path == "/_lab/received" and m == "GET":
            return web.json_response({"events": list(self.events.values()), "duplicates": self.duplicates,
                                      "answers": self.answers})  # fmt: skip
        if path == "/_lab/reset" and m == "POST":
            self.events.clear()
            self.faults.clear()
            self.answers.clear()
            self.duplicates = 0
        elif path != "/_lab/healthz":
            return web.json_response({"error": f"no admin route {m} {path}"}, status=404)
        return web.json_response({"ok": True})


class WebhookReceiver(ChildProcess):
    """``with WebhookReceiver() as hook: hook.url + "/hooks/ops"`` — the receiver as a child process."""

    module = "lab.webhook"
    name = "lab-webhook"

    def __init__(self, *, token: str | None = None, tls: lab_tls.ServerCert | None = None, **kw: Any) -> None:
        super().__init__(**kw)
        self.tls = tls  # HTTPS with this certificate (lab/tls.py); its admin API too
        if token:  # in the environment, not the command line (visible in `ps`)
            self.env = {**(self.env or {}), "LAB_WEBHOOK_TOKEN": token}

    def extra_command(self) -> list[str]:
        return lab_tls.arguments(self.tls)


class WebhookAdmin(AdminClient):
    """The receiver's admin API: what it received, reset and faults (it keeps no audit log: `answers` instead)."""

    async def received(self) -> list[dict[str, Any]]:
        return (await self._req("GET", "/_lab/received"))["events"]

    async def answers(self) -> list[int]:
        """The status of every delivery, in order (injected faults included)."""
        return (await self._req("GET", "/_lab/received"))["answers"]


def main(argv: list[str] | None = None) -> int:
    a = server_arguments("python -m lab.webhook", "Webhook receiver for the lab").parse_args(argv)
    logging.basicConfig(level=a.log_level.upper(), stream=sys.stderr)
    server = WebhookServer(token=os.environ.get("LAB_WEBHOOK_TOKEN") or None)
    asyncio.run(serve_app("lab.webhook", server.app, a.host, a.port, a.ready_file, lab_tls.server_context(a)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
