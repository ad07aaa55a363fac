"""The lab's Redfish BMCs: ``python -m lab.redfish --port 0 --ready-file F (--servers-file F | --count N)``.

One process emulates N HGX-class GPU servers, each with its own BMC: its own loopback port serving Redfish
(DMTF schema shapes, as the real ``sushy`` client reads them) with its own sessions, inventory and logs, plus one
admin port. With ``--tls-cert F --tls-key F`` (a certificate from the lab CA, lab/tls.py) every BMC answers HTTPS,
as real BMCs do; plain HTTP is the default. The admin port always answers plain HTTP. sushy-tools
(``lab/sushy.py``) is the real third-party Redfish server for power and boot; it has no processors, firmware
inventory, BIOS, logs or sessions, which is what this emulator adds. This module is the HTTP front (routing,
authentication, outages, the admin API, the child process and its client); one BMC's state and documents are
lab/bmc.py. Longer than 600 lines because the front is one piece: routing, authentication, the outages (a closed
port included) and the admin routes all act on the same per-port listeners and servers.

Per server, under ``<bmc url>/redfish/v1`` (the bmc url is what ``sushy.Sushy(url, ...)`` takes):

* ``/`` (anonymous) ServiceRoot with Systems, Managers, Chassis, UpdateService, Tasks (the TaskService),
  SessionService and ``Links.Sessions``; ``/redfish`` (anonymous) the version document.
* ``Systems/1``: PowerState (``On``, ``Off``, ``PoweringOn``, ``PoweringOff``), Boot (override target/enabled/mode
  and their AllowableValues; PATCH ``{"Boot": {...}}``), Status with HealthRollup (the worst severity of the SEL's
  entries not ``Resolved``), BiosVersion, ProcessorSummary, MemorySummary, BootProgress,
  ``Actions/ComputerSystem.Reset`` (On, ForceOn, ForceOff, GracefulShutdown, GracefulRestart, ForceRestart,
  PowerCycle, PushPowerButton (toggles), Nmi (no power change)).
  Power changes land ``power_delay`` seconds later (restarts and PowerCycle: Off after one delay, On after another;
  a reset that changes nothing is accepted and does nothing). Each power-on is a boot: it consumes a ``Once``
  override (which then reads ``Disabled``/``None``), records ``booted_from`` (the override target, else ``Hdd``),
  increments ``boot_count`` and applies pending BIOS settings.
* ``Systems/1/Processors``: ``CPU_0``, ``CPU_1`` and ``GPU_SXM_1``.. (ProcessorType ``GPU``, Model, SerialNumber,
  UUID, FirmwareVersion).
* ``Systems/1/Bios`` (Attributes; ``@Redfish.Settings`` -> ``Bios/Settings``, PATCHed attributes apply at next boot).
* ``Systems/1/LogServices/SEL`` with ``Entries`` (LogEntry: Id, Created, EntryType SEL, Severity OK/Warning/Critical,
  Message, MessageId) and ``Actions/LogService.ClearLog``.
* ``UpdateService`` with ``FirmwareInventory/<key>`` (Id = the spec's firmware key: BMC, BIOS, GPU0.., NVSwitch0..),
  ``Actions/UpdateService.SimpleUpdate`` and ``TaskService/Tasks/<n>`` (with ``/Monitor``); ``Chassis/1/Actions/
  Chassis.Reset`` ``PowerCycle`` (an AC power cycle). What a task does and when a new version activates:
  lab/bmc_update.py.
* ``SessionService/Sessions``: POST ``{"UserName", "Password"}`` -> 201 with ``X-Auth-Token`` and ``Location``;
  DELETE logs out; at most ``max_sessions`` per BMC (then 503 SessionLimitExceeded); idle sessions expire after
  ``session_timeout``. At most ``max_sessions`` requests are served at once per BMC (a request on HTTP Basic holds
  a session while it is served); past either limit the answer is 503 with ``Retry-After: 2``. Every answer takes
  ``request_delay`` seconds (a real BMC's 0.2-2 s). Everything else needs HTTP Basic (unless the config's
  ``basic_auth`` is 0) or a session token (401 otherwise).
* query parameters (DSP0266): ``$expand=.`` (one level) everywhere, ``$skip``/``$top`` on the SEL's Entries; any
  other ``$`` parameter answers 501 ``QueryParameterUnsupported``, a bad ``$skip``/``$top`` 400; parameters without
  ``$`` are ignored.
* errors are Redfish error bodies: ``{"error": {"code": "Base.1.15.GeneralError", "message": ...,
  "@Message.ExtendedInfo": [{"MessageId": "Base.1.15.<Id>", "Message", "Severity", "Resolution"}]}}``.

Server spec (JSON, ``--servers-file`` holds a list or ``{"servers": [...]}``): ``{"name", "gpus": 8,
"gpu_model": "NVIDIA H200", "serial", "uuid", "firmware": {...}, "power": "Off", "bios": {...}, "manufacturer",
"model", "gpu_serials": [...], "gpu_uuids": [...], "port": 0, "tray": {...}}``; missing keys get defaults
(``normalize_spec``; identifiers derive from the name, so a server keeps them across restarts). ``tray`` makes the
server a tray of a GB200 NVL72 rack that knows its place (``Chassis/CBC_0`` of a compute tray, the NVLink switches of
a switch tray: lab/bmc_trays.py).

Admin API on the admin port (``BmcAdmin``): ``GET /_lab/servers[?fields=a,b]`` -> ``{"servers": {name: view}}``,
``GET /_lab/servers/{name}`` -> view, where a view is ``{"name", "url", "power": "On"|"Off", "power_state",
"booted_from": "Pxe"|"Hdd"|null, "boot_count", "last_boot", "last_off" (epoch seconds of the last power-on and
power-off), "boot_override": {"target", "enabled", "mode"},
"gpu_faults", "sel": [LogEntry...], "down_until": float|null, "sessions", "requests", "resets", "firmware", "bios",
"spec", "firmware_pending", "update_faults", "bad_flash", "ac_cycles", "tasks"}``; ``POST /_lab/servers/{name}/sel`` ``{"severity", "message", "message_id", "at": "now"|"next_boot",
"delay": s}`` appends an SEL entry now (returned) or arms one for ``delay`` s after now / after the next power-on; ``PATCH /_lab/servers/{name}/sel/{id}`` ``{"resolved": true}``
sets the entry's ``Resolved`` (the health rollup, the worst severity of the SEL, leaves it out);
``POST /_lab/servers/{name}/outage`` ``{"seconds": 5, "mode": "503"|"drop"|"closed"}`` (``closed``: the
port refuses connections, its listener closed and reopened after ``seconds`` or at a reset); ``PUT /_lab/servers/{name}/gpu-faults``
(an opaque dict for lab/hosts.py); ``POST /_lab/servers/{name}/power`` ``{"state": "On"|"Off"}`` (lab side,
immediate); ``PUT /_lab/servers/{name}/firmware`` ``{key: version}``; ``GET``/``PUT /_lab/config``
``{"power_delay", "request_delay", "max_sessions", "session_timeout", "update_seconds", "bmc_restart_seconds",
"multipart_push", "monitor_expires", "basic_auth"}`` (``basic_auth`` 0: Basic answers 401, only sessions work);
``PUT /_lab/images`` ``{uri: {"version", "seconds", "apply", "bad"}}`` (the firmware image server's catalogue);
``PUT /_lab/servers/{name}/update-faults`` ``{component: message}`` (the next update of it fails);
``PUT /_lab/servers/{name}/bad-flash`` ``{component: message}`` (the next flash of it never activates); ``POST /_lab/reset`` (every server back to
its spec, sessions, faults, audit and config cleared); ``POST /_lab/faults`` ``{"match": {"server", "method",
"path" (regex)}, "action": {"status": 503} | {"delay": s} | {"delayAfter": s} | {"drop": "before"|"after"},
"count": 1, "skip": 0, "after": <fault id>}`` (count -1: until cleared; the fault front and audit log of
lab/faults.py), ``GET``/``DELETE /_lab/faults``;
``GET /_lab/audit[?since=N&writes=1&server=S]`` (entries: seq, time, server, method, path, status (0: dropped),
write, auth ("basic"|"session"|null), ``reset_type`` for resets, ``body`` for other writes but logins, ``fault``),
``GET /_lab/audit/cursor``; ``GET /_lab/healthz``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import binascii
import json
import logging
import secrets
import ssl
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from aiohttp import web

from lab import faults as lab_faults
from lab import tls as lab_tls
from lab.bmc import (
    BUSY_RETRY_AFTER,
    DEFAULT_CONFIG,
    DEFAULT_PASSWORD,
    DEFAULT_USER,
    PUBLIC_GETS,
    ROOT,
    Bmc,
    check_query,
    normalize_spec,
    not_found,
)
from lab.bmc_update import APPLIES, MULTIPART_PARTS
from lab.faults import AuditLog, FaultFront, FaultTable, drop
from lab.k8s.process import ChildProcess
from lab.loopback import AdminClient, announce_and_wait
from lab.redfish_shapes import RedfishError

log = logging.getLogger("lab.redfish")


class BmcLab:
    """All the emulated BMCs, the admin API, faults and the audit log, in one aiohttp application."""

    def __init__(
        self,
        specs: Sequence[dict | str],
        user: str = DEFAULT_USER,
        password: str = DEFAULT_PASSWORD,
        config: dict | None = None,
    ) -> None:
        self.user, self.password = user, password
        self._basic = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        self.base_config = {**DEFAULT_CONFIG, **(config or {})}
        self.config = dict(self.base_config)
        self.images: dict[str, dict] = {}  # the firmware image server's catalogue (lab/bmc_update.py)
        self.servers: dict[str, Bmc] = {}
        for i, s in enumerate(specs):
            spec = normalize_spec(s, i)
            if spec["name"] in self.servers:
                raise ValueError(f"duplicate server name {spec['name']!r}")
            self.servers[spec["name"]] = Bmc(spec, self)
        self.by_port: dict[int, Bmc] = {}
        self.sites: dict[str, web.TCPSite] = {}  # each BMC's listener
        self.listen: tuple[web.AppRunner, str, ssl.SSLContext | None] | None = None  # how `serve` opened them
        self.closed: dict[str, asyncio.Task] = {}  # BMCs whose port is closed, with the task reopening it
        self.faults = FaultTable(("server", "method", "path"))  # lab/faults.py
        self.audit = AuditLog(200_000, filters=("server",))
        self.front = FaultFront(self.audit.add, code_key="status")
        self.app = web.Application(client_max_size=1 << 20)
        self.app.router.add_route("*", "/{tail:.*}", self.dispatch)

    def credentials_ok(self, user: str, password: str) -> bool:
        return secrets.compare_digest(user, self.user) and secrets.compare_digest(password, self.password)

    def _authenticate(self, bmc: Bmc, request: web.Request) -> str | None:
        token = request.headers.get("X-Auth-Token")
        if token:
            return "session" if bmc.session_for(token) else None
        header = request.headers.get("Authorization", "")
        if not self.config["basic_auth"]:
            return None
        if header == self._basic:
            return "basic"
        if header[:6].lower() != "basic ":
            return None
        try:
            user, _, password = base64.b64decode(header[6:].strip()).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return None
        return "basic" if self.credentials_ok(user, password) else None

    # ------------------------------------------------------------------ Redfish
    async def dispatch(self, request: web.Request) -> web.StreamResponse:
        sock = request.transport.get_extra_info("sockname") if request.transport is not None else None
        bmc = self.by_port.get(sock[1]) if sock else None
        if bmc is None:
            return await self.admin(request)
        bmc.requests += 1
        method, path = request.method, request.path
        norm = path.rstrip("/") or "/"
        write = method != "GET" and method != "HEAD"
        entry: dict[str, Any] = {
            "time": time.time(),
            "server": bmc.name,
            "method": method,
            "path": path,
            "write": write,
        }
        if bmc.down_until is not None:
            left = bmc.down_until - time.time()
            if left > 0:
                if bmc.down_mode in ("drop", "closed"):  # closed: a connection opened before goes too
                    entry["status"] = 0
                    self.audit.add(entry)
                    return drop(request)
                err = RedfishError(
                    503,
                    "ServiceTemporarilyUnavailable",
                    f"The service is temporarily unavailable. Retry in {int(left) + 1} seconds.",
                    "Wait for the indicated retry duration and retry the operation.",
                    headers={"Retry-After": str(int(left) + 1)},
                )
                entry["status"] = 503
                self.audit.add(entry)
                return err.response()
            bmc.down_until = None
        if bmc.in_flight >= int(self.config["max_sessions"]):  # a Basic request holds a slot while it is served
            entry["status"] = 503
            self.audit.add(entry)
            return RedfishError(
                503,
                "ServiceTemporarilyUnavailable",
                f"The service is serving {bmc.in_flight} requests, its limit. Retry in {BUSY_RETRY_AFTER} seconds.",
                "Wait for the indicated retry duration and retry the operation.",
                headers={"Retry-After": str(BUSY_RETRY_AFTER)},
            ).response()
        fault = self.faults.match({"server": bmc.name, "method": method, "path": path})

        async def serve() -> web.Response:
            if self.config["request_delay"]:
                await asyncio.sleep(float(self.config["request_delay"]))
            try:
                return await self._redfish(bmc, request, method, norm, entry)
            except RedfishError as e:
                return e.response()
            except Exception as e:  # an emulator bug: still answer in the Redfish shape
                log.exception("internal error on %s %s", method, path)
                return RedfishError(500, "InternalError", f"{type(e).__name__}: {e}").response()

        def refuse(f: dict) -> web.Response:
            status = int(f["action"]["status"])
            return RedfishError(
                status,
                "InternalError" if status >= 500 else "GeneralError",
                f["action"].get("message") or "Injected fault.",
            ).response()

        bmc.in_flight += 1
        try:
            return await self.front.handle(request, entry, fault, serve, refuse)
        finally:
            bmc.in_flight -= 1

    async def _redfish(self, bmc: Bmc, request: web.Request, method: str, path: str, entry: dict) -> web.Response:
        if not (path == "/redfish" or path == ROOT or path.startswith(ROOT + "/")):
            raise not_found(request.path)
        if method == "GET" and path == "/redfish":
            return web.json_response({"v1": f"{ROOT}/"})
        parts = path[len(ROOT) + 1 :].split("/") if path != ROOT else []
        login = method == "POST" and parts == ["SessionService", "Sessions"]
        if (method == "GET" and path in PUBLIC_GETS) or login:
            entry["auth"] = None
        else:
            entry["auth"] = self._authenticate(bmc, request)
            if entry["auth"] is None:
                raise RedfishError(
                    401,
                    "NoValidSession",
                    "There is no valid session established with the implementation.",
                    "Establish a session before retrying the operation.",
                    headers={"WWW-Authenticate": 'Basic realm="Redfish"'} if self.config["basic_auth"] else None,
                )
        if method == "GET":
            check_query(parts, request.query)
        if method == "GET" and len(parts) == 4 and parts[:2] == ["TaskService", "Tasks"] and parts[3] == "Monitor":
            return bmc.updates.monitor(parts[2]) or not_found(request.path).response()
        if method == "GET":
            return web.json_response(bmc.get(parts, request.path, dict(request.query)))
        if method == "POST" and parts == MULTIPART_PARTS:
            return await bmc.updates.multipart_push(request, entry)
        body: Any = None
        if request.can_read_body:
            try:
                body = await request.json()
            except (json.JSONDecodeError, UnicodeDecodeError):
                raise RedfishError(
                    400,
                    "MalformedJSON",
                    "The request body submitted was malformed JSON and could not be parsed by the receiving service.",
                ) from None
        if isinstance(body, dict):
            if "ResetType" in body:
                entry["reset_type"] = body["ResetType"]
            elif not login:
                entry["body"] = body
        return bmc.write(method, parts, request.path, body)

    # ------------------------------------------------------------------ lab admin
    async def admin(self, request: web.Request) -> web.Response:
        try:
            return await self._admin(request)
        except KeyError as e:
            return web.json_response({"error": f"not found: {e}"}, status=404)
        except (ValueError, TypeError, AttributeError) as e:
            return web.json_response({"error": f"{type(e).__name__}: {e}"}, status=400)

    async def _admin(self, request: web.Request) -> web.Response:
        m, path = request.method, request.path.rstrip("/")
        p = path.split("/")[2:] if path.startswith("/_lab/") else None
        body = await request.json() if request.can_read_body else {}
        ok = web.json_response({"ok": True})
        served = await lab_faults.admin(request, self.faults, self.audit)
        if served is not None:
            return served
        if p == ["healthz"]:
            return ok
        if p == ["reset"] and m == "POST":
            for bmc in self.servers.values():
                bmc.restore()
            for name in list(self.closed):
                await self.open_port(self.servers[name])
            self.faults.clear()
            self.audit.clear()
            self.images.clear()
            self.config = dict(self.base_config)
            return ok
        if p == ["images"] and m in ("GET", "PUT"):
            for uri, image in (body or {}).items():
                if not isinstance(image, dict) or not isinstance(image.get("version"), str):
                    raise ValueError(f"image {uri!r}: give at least its version")
                unknown = set(image) - {"version", "seconds", "apply", "bad"}
                if unknown or image.get("apply", "none") not in APPLIES:
                    raise ValueError(f"image {uri!r}: keys version, seconds, apply (one of {APPLIES}), bad")
                self.images[uri] = image
            return web.json_response(self.images)
        if p == ["config"] and m in ("GET", "PUT"):
            for k, v in (body or {}).items():
                if k not in DEFAULT_CONFIG:
                    raise ValueError(f"unknown config key {k!r}; known: {sorted(DEFAULT_CONFIG)}")
                if not isinstance(v, (int, float)) or v < 0:
                    raise ValueError(f"{k} must be a number >= 0")
                self.config[k] = v
            return web.json_response(self.config)
        if p and p[0] == "servers":
            return await self._admin_server(m, p[1:], body, request.query)
        return web.json_response({"error": f"no admin route {m} {path}"}, status=404)

    async def _admin_server(self, m: str, p: list[str], body: Any, query: Any) -> web.Response:  # noqa: C901 (one branch per lab admin endpoint)
        if not p and m == "GET":
            fields = [f for f in query.get("fields", "").split(",") if f]
            views = {n: b.view() for n, b in self.servers.items()}
            if fields:
                views = {n: {k: v[k] for k in fields if k in v} for n, v in views.items()}
            return web.json_response({"servers": views})
        bmc = self.servers[p[0]]
        op = p[1] if len(p) == 2 else None
        if len(p) == 1 and m == "GET":
            return web.json_response(bmc.view())
        if len(p) == 3 and p[1] == "sel" and m == "PATCH":
            if body != {"resolved": True}:
                raise ValueError('give {"resolved": true}')
            return web.json_response(bmc.resolve_sel(p[2]))
        if op == "sel" and m == "POST":
            at, delay = body.get("at", "now"), float(body.get("delay") or 0)
            if at == "next_boot":
                bmc.armed.append(body)
                return web.json_response({"armed": True})
            if at != "now":
                raise ValueError("at must be 'now' or 'next_boot'")
            if delay > 0:
                bmc.schedule_sel(body, delay)
                return web.json_response({"armed": True})
            return web.json_response(bmc.add_sel(body))
        if op == "outage" and m == "POST":
            mode = str(body.get("mode", "503"))
            if mode not in ("503", "drop", "closed"):
                raise ValueError("mode must be '503', 'drop' or 'closed'")
            seconds = float(body.get("seconds", 5))
            if mode == "closed":
                await self.close_port(bmc, seconds)
            bmc.down_mode = mode
            bmc.down_until = time.time() + seconds
            return web.json_response({"down_until": bmc.down_until})
        if op == "gpu-faults" and m in ("PUT", "GET"):
            if m == "PUT":
                if not isinstance(body, dict):
                    raise ValueError("gpu faults are a JSON object")
                bmc.gpu_faults = body
            return web.json_response(bmc.gpu_faults)
        if op == "power" and m == "POST":
            state = body.get("state")
            if state == "On":
                if bmc.power != "On":
                    bmc.power_on()
                bmc._cancel_power()
                bmc.transition = None
            elif state == "Off":
                bmc.power_off()
            else:
                raise ValueError("state must be On or Off")
            return web.json_response(bmc.view())
        if op == "firmware" and m == "PUT":
            for k, v in body.items():
                bmc.set_firmware(str(k), str(v))
            return web.json_response(bmc.firmware)
        if op == "update-faults" and m == "PUT":
            bmc.updates.faults.update({str(k): str(v) for k, v in body.items()})
            return web.json_response(bmc.updates.faults)
        if op == "bad-flash" and m == "PUT":
            bmc.updates.bad_flash.update({str(k): str(v) for k, v in body.items()})
            return web.json_response(bmc.updates.bad_flash)
        return web.json_response({"error": f"no admin route {m} /_lab/servers/{'/'.join(p)}"}, status=404)

    async def close_port(self, bmc: Bmc, seconds: float) -> None:
        """Close the BMC's listener (its web server is gone: connecting is refused) and reopen it `seconds` later."""
        reopening = self.closed.pop(bmc.name, None)
        if reopening is None:
            await self.sites.pop(bmc.name).stop()
        else:
            reopening.cancel()
        self.closed[bmc.name] = asyncio.create_task(self._reopen(bmc, seconds))

    async def _reopen(self, bmc: Bmc, seconds: float) -> None:
        await asyncio.sleep(seconds)
        await self.open_port(bmc)

    async def open_port(self, bmc: Bmc) -> None:
        """Listen on the BMC's closed port again, as `serve` did."""
        reopening = self.closed.pop(bmc.name, None)
        if reopening is None or self.listen is None:
            return
        if reopening is not asyncio.current_task():
            reopening.cancel()
        runner, host, ssl_context = self.listen
        site = web.TCPSite(runner, host, bmc.port, ssl_context=ssl_context)
        await site.start()
        self.sites[bmc.name] = site
        bmc.down_until = None


async def serve(host: str, port: int, ready_file: str | None, lab: BmcLab,
                ssl_context: ssl.SSLContext | None = None) -> None:  # fmt: skip
    """The admin port answers plain HTTP (it is the lab's, not a BMC's); each BMC answers HTTPS with
    `ssl_context`, else HTTP."""
    runner = web.AppRunner(lab.app, access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    admin = web.TCPSite(runner, host, port, backlog=512)
    await admin.start()
    admin_port = admin._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    scheme = "https" if ssl_context else "http"
    lab.listen = (runner, host, ssl_context)
    for bmc in lab.servers.values():
        site = web.TCPSite(runner, host, int(bmc.spec.get("port") or 0), ssl_context=ssl_context)
        await site.start()
        bmc.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        bmc.url = f"{scheme}://{host}:{bmc.port}"
        lab.by_port[bmc.port] = bmc
        lab.sites[bmc.name] = site
    await announce_and_wait("lab.redfish", f"http://{host}:{admin_port}", ready_file)
    await runner.cleanup()


def load_servers(path: str | Path) -> list[dict | str]:
    data = json.loads(Path(path).read_text())
    return data["servers"] if isinstance(data, dict) else data


class LabBmcs(ChildProcess):
    """``with LabBmcs(count=4, password=...) as bmcs: bmcs.url, bmcs.bmc_urls[name]`` — the BMCs as a child process.

    ``servers``: specs (dicts, or names); else ``count`` servers named ``f"{prefix}{i:03d}"`` from 1.
    Credentials travel in the environment, not the command line.
    """

    module = "lab.redfish"
    name = "lab-bmcs"

    def __init__(
        self,
        *,
        servers: Sequence[dict | str] | None = None,
        count: int = 4,
        prefix: str = "gpu-node-",
        user: str = DEFAULT_USER,
        password: str = DEFAULT_PASSWORD,
        power_delay: float | None = None,
        max_sessions: int | None = None,
        tls: lab_tls.ServerCert | None = None,
        **kw: Any,
    ) -> None:
        super().__init__(**kw)
        self.tls = tls  # the BMCs answer HTTPS with this certificate (lab/tls.py); the admin port stays HTTP
        self.specs = [
            normalize_spec(s, i)
            for i, s in enumerate(servers if servers is not None else [f"{prefix}{i:03d}" for i in range(1, count + 1)])
        ]
        self.user, self.password = user, password
        self.power_delay, self.max_sessions = power_delay, max_sessions
        self.bmc_urls: dict[str, str] = {}
        self.env = {**(self.env or {}), "LAB_BMC_USER": user, "LAB_BMC_PASSWORD": password}

    @property
    def names(self) -> list[str]:
        return [s["name"] for s in self.specs]

    def extra_command(self) -> list[str]:
        assert self._tmpdir is not None
        path = Path(self._tmpdir.name) / "servers.json"
        path.write_text(json.dumps(self.specs))
        cmd = ["--servers-file", str(path)]
        if self.power_delay is not None:
            cmd += ["--power-delay", str(self.power_delay)]
        if self.max_sessions is not None:
            cmd += ["--max-sessions", str(self.max_sessions)]
        return cmd + lab_tls.arguments(self.tls)

    def start(self):
        if self.proc is None:
            super().start()
            import httpx

            servers = httpx.get(f"{self.url}/_lab/servers", params={"fields": "url"}, timeout=30).json()["servers"]
            self.bmc_urls = {n: v["url"] for n, v in servers.items()}
        return self


class BmcAdmin(AdminClient):
    """The lab BMCs' admin API: server state, SEL injection, outages, GPU faults, lab-side power, config."""

    async def servers(self, fields: list[str] | None = None) -> dict[str, dict]:
        params = {"fields": ",".join(fields)} if fields else None
        return (await self._req("GET", "/_lab/servers", params=params))["servers"]

    async def server(self, name: str) -> dict:
        return await self._req("GET", f"/_lab/servers/{name}")

    async def add_sel(
        self,
        name: str,
        severity: str = "Critical",
        message: str | None = None,
        message_id: str | None = None,
        *,
        at: str = "now",
        delay: float = 0.0,
        **extra: Any,
    ) -> dict:
        """An SEL entry now (returned), or armed for `delay` s after now or after the next power-on (at='next_boot')."""
        body = {"severity": severity, "message": message, "message_id": message_id, "at": at, "delay": delay, **extra}
        return await self._req("POST", f"/_lab/servers/{name}/sel", json=body)

    async def resolve_sel(self, name: str, entry_id: str) -> dict:
        """Mark an SEL entry Resolved: its severity no longer counts in the server's health."""
        return await self._req("PATCH", f"/_lab/servers/{name}/sel/{entry_id}", json={"resolved": True})

    async def outage(self, name: str, seconds: float, mode: str = "503") -> float:
        """The BMC answers 503 (mode '503') or drops connections (mode 'drop') for `seconds`."""
        return (await self._req("POST", f"/_lab/servers/{name}/outage", json={"seconds": seconds, "mode": mode}))[
            "down_until"
        ]

    async def set_gpu_faults(self, name: str, faults: dict) -> dict:
        return await self._req("PUT", f"/_lab/servers/{name}/gpu-faults", json=faults)

    async def power(self, name: str, state: str) -> dict:
        """Lab-side power (an operator at the rack): immediate, no delay; On is a boot."""
        return await self._req("POST", f"/_lab/servers/{name}/power", json={"state": state})

    async def set_firmware(self, name: str, versions: dict[str, str]) -> dict:
        return await self._req("PUT", f"/_lab/servers/{name}/firmware", json=versions)

    async def set_images(self, images: dict[str, dict]) -> dict:
        """Add firmware images to the lab's image server: ``{uri: {"version", "seconds", "apply", "bad"}}``."""
        return await self._req("PUT", "/_lab/images", json=images)

    async def set_update_faults(self, name: str, faults: dict[str, str]) -> dict:
        """The next update of each component on this server fails with this message (once)."""
        return await self._req("PUT", f"/_lab/servers/{name}/update-faults", json=faults)

    async def set_bad_flash(self, name: str, flashes: dict[str, str]) -> dict:
        """The next flash of each component on this server is written bad (once): it never activates."""
        return await self._req("PUT", f"/_lab/servers/{name}/bad-flash", json=flashes)

    async def config(self, **changes: float) -> dict:
        """Read (no arguments) or change power_delay, request_delay, max_sessions, session_timeout, update_seconds,
        bmc_restart_seconds, multipart_push."""
        return await self._req("PUT", "/_lab/config", json=changes)

    async def server_audit(self, name: str, since: int = 0, writes: bool = False) -> list[dict]:
        params = {"since": since, "server": name, **({"writes": 1} if writes else {})}
        return (await self._req("GET", "/_lab/audit", params=params))["entries"]

    async def wait_power(self, name: str, power: str, timeout: float = 10.0, min_boots: int = 0) -> dict:
        """Poll until the server's power is `power` (and it has booted at least `min_boots` times)."""
        deadline = time.monotonic() + timeout
        while True:
            v = await self.server(name)
            if v["power"] == power and v["power_state"] == power and v["boot_count"] >= min_boots:
                return v
            if time.monotonic() > deadline:
                raise TimeoutError(f"{name}: power {v['power_state']} (boots {v['boot_count']}), wanted {power}")
            await asyncio.sleep(0.05)


def main(argv: list[str] | None = None) -> int:
    import os

    p = argparse.ArgumentParser(prog="python -m lab.redfish", description="Redfish BMCs of emulated HGX servers")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="the admin port (each BMC gets its own free port)")
    p.add_argument("--ready-file")
    p.add_argument("--servers-file", help="JSON list of server specs (or {'servers': [...]})")
    p.add_argument("--count", type=int, default=4, help="without --servers-file: this many default servers")
    p.add_argument("--prefix", default="gpu-node-")
    p.add_argument("--power-delay", type=float, default=DEFAULT_CONFIG["power_delay"])
    p.add_argument("--max-sessions", type=int, default=DEFAULT_CONFIG["max_sessions"])
    p.add_argument("--log-level", default="WARNING")
    lab_tls.add_arguments(p)
    a = p.parse_args(argv)
    logging.basicConfig(level=a.log_level.upper(), stream=sys.stderr)
    specs = load_servers(a.servers_file) if a.servers_file else [f"{a.prefix}{i:03d}" for i in range(1, a.count + 1)]
    lab = BmcLab(
        specs,
        user=os.environ.get("LAB_BMC_USER", DEFAULT_USER),
        password=os.environ.get("LAB_BMC_PASSWORD", DEFAULT_PASSWORD),
        config={"power_delay": a.power_delay, "max_sessions": a.max_sessions},
    )
    asyncio.run(serve(a.host, a.port, a.ready_file, lab, lab_tls.server_context(a)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
