"""Alertmanager's webhook receiver, and `EventPath`: the receiver and one node watch per cluster, in the worker.

`POST /alerts` takes Alertmanager's own JSON payload (version 4), with `Authorization: Bearer <token>` (the token
from a secret reference, `env:NAME` or `file:/path`, read at each request so that it can be rotated). Each firing
alert names its node by the first of `NODE_LABELS` it carries (`instance` without its port) and its cluster by
the `cluster` label (default: the worker's only watched cluster); resolved alerts are ignored. The answer lists
each alert's outcome (started, already-running, ignored with why, refused with why); it is 503 when a
remediation could not be started (Alertmanager retries a 5xx), 400 for a payload that is not Alertmanager's
(not retried; a field it does not know is ignored, not refused), 401 without the token. `GET /healthz` (no token) shows when each watch last heard its API server;
`GET /events` (token) the counts and the recent outcomes.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
from datetime import UTC, datetime
from typing import Literal

from aiohttp import web
from pydantic import Field, ValidationError

from activities.models import ForeignModel
from activities.support.secrets import SecretRef
from worker.fault_events import FaultEvents, FaultOutcome
from worker.node_watch import watch_nodes

log = logging.getLogger("millwright.alert_receiver")

# The labels that name an alert's node, in order: Millwright's own `node` label (a relabelling in the alert rule),
# dcgm-exporter's `Hostname` (its releases) and `hostname` (its HEAD), then Prometheus' `instance` without the port.
NODE_LABELS = ("node", "Hostname", "hostname", "instance")
CLUSTER_LABEL = "cluster"
MAX_BODY = 4 * 1024 * 1024


class Alert(ForeignModel):
    """One alert of Alertmanager's webhook payload (field names as Alertmanager writes them; others ignored)."""

    status: Literal["firing", "resolved"]
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    startsAt: str = ""
    endsAt: str = ""
    generatorURL: str = ""
    fingerprint: str = ""


class AlertmanagerPayload(ForeignModel):
    """Alertmanager's webhook payload, version 4 (notify/webhook/webhook.go); fields a newer release adds are
    ignored."""

    version: Literal["4"]
    groupKey: str = ""
    truncatedAlerts: int = 0
    status: Literal["firing", "resolved"]
    receiver: str = ""
    groupLabels: dict[str, str] = Field(default_factory=dict)
    commonLabels: dict[str, str] = Field(default_factory=dict)
    commonAnnotations: dict[str, str] = Field(default_factory=dict)
    externalURL: str = ""
    notification_reason: str | None = None
    routeLabels: dict[str, str] | None = None
    alerts: list[Alert]


def alert_node(alert: Alert) -> str | None:
    for key in NODE_LABELS:
        value = alert.labels.get(key)
        if value:
            return value.rsplit(":", 1)[0] if key == "instance" and not value.startswith("[") else value
    return None


def alert_problem(alert: Alert) -> str:
    name = alert.labels.get("alertname", "alert")
    summary = alert.annotations.get("summary") or alert.annotations.get("description") or ""
    return f"alert {name}" + (f": {summary}" if summary else "")


class AlertReceiver:
    def __init__(self, events: FaultEvents, token: SecretRef) -> None:
        self._events, self._token = events, token

    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY)
        app.router.add_post("/alerts", self.alerts)
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/events", self.recent)
        return app

    def _authorized(self, request: web.Request) -> bool:
        """The request carries the token. A token that cannot be read (a Secret being rotated) raises
        HTTPServiceUnavailable: Alertmanager retries a 5xx."""
        given = request.headers.get("Authorization", "")
        scheme, _, credentials = given.partition(" ")
        try:
            token = self._token.resolve().strip()
        except Exception as err:
            log.error("the receiver's token %s cannot be read: %s", self._token, err)
            raise web.HTTPServiceUnavailable(text=f"the receiver's token {self._token} cannot be read") from None
        return scheme.lower() == "bearer" and hmac.compare_digest(credentials.strip().encode(), token.encode())

    async def alerts(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return web.json_response({"error": "a bearer token is required (Authorization: Bearer ...)"}, status=401,
                                     headers={"WWW-Authenticate": "Bearer"})  # fmt: skip
        try:
            payload = AlertmanagerPayload.model_validate_json(await request.read())
        except ValidationError as err:
            problems = [f"{'.'.join(str(p) for p in e['loc']) or '(payload)'}: {e['msg']}" for e in err.errors()]
            return web.json_response({"error": "not an Alertmanager version 4 payload", "problems": problems[:20]},
                                     status=400)  # fmt: skip
        outcomes = await asyncio.gather(*(self._one(a) for a in payload.alerts if a.status == "firing"))
        resolved = sum(1 for a in payload.alerts if a.status == "resolved")
        failed = any(o.status == "error" for o in outcomes)
        return web.json_response({"outcomes": [json.loads(o.model_dump_json()) for o in outcomes],
                                  "resolved_ignored": resolved}, status=503 if failed else 200)  # fmt: skip

    async def _one(self, alert: Alert) -> FaultOutcome:
        source = f"alert {alert.labels.get('alertname', '')}".strip()
        node = alert_node(alert)
        clusters = list(self._events.book)
        cluster = alert.labels.get(CLUSTER_LABEL) or (clusters[0] if len(clusters) == 1 else "")
        if node is None or not cluster:
            missing = f"none of the labels {', '.join(NODE_LABELS)}" if node is None else f"no {CLUSTER_LABEL} label"
            return FaultOutcome(cluster=cluster, node=node or "", source=source, status="ignored",
                                detail=f"{missing}: no node to act on", at=datetime.now(UTC))  # fmt: skip
        return await self._events.alert(cluster, node, source, alert_problem(alert))

    async def healthz(self, request: web.Request) -> web.Response:
        heard = {c: (t.isoformat() if t else None) for c, t in self._events.heard.items()}
        return web.json_response({"watches": heard, "nodes": {c: len(b) for c, b in self._events.book.items()}})

    async def recent(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return web.json_response({"error": "a bearer token is required"}, status=401)
        return web.json_response({"counts": dict(self._events.counts),
                                  "recent": [json.loads(o.model_dump_json()) for o in self._events.recent]})  # fmt: skip


@contextlib.asynccontextmanager
async def event_path(events: FaultEvents, connector, token: SecretRef | None, host: str, port: int):
    """The watches (one per cluster of `events`) and, with a token, the receiver on host:port; yields the port
    the receiver listens on (0: none)."""
    watches = [asyncio.create_task(watch_nodes(connector, c, events), name=f"watch {c}") for c in events.book]
    runner: web.AppRunner | None = None
    bound = 0
    try:
        if token is not None:
            runner = web.AppRunner(AlertReceiver(events, token).app(), access_log=None)
            await runner.setup()
            site = web.TCPSite(runner, host, port)
            await site.start()
            bound = runner.addresses[0][1]
            log.info("Alertmanager receiver on %s:%d (POST /alerts)", host, bound)
        yield bound
    finally:
        if runner is not None:
            await runner.cleanup()
        for task in watches:
            task.cancel()
        await asyncio.gather(*watches, return_exceptions=True)
        await events.close()
