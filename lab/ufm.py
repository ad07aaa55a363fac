"""An NVIDIA UFM REST emulator for the lab: ``python -m lab.ufm --port 0 --ready-file F [--fleet FILE] [--version V]``.

The endpoints Millwright uses, in UFM's own shapes (references: NVIDIA's UFM clients in
NVIDIA/bare-metal-manager-core ``crates/api/src/ib/ufmclient/`` and Mellanox/ib-kubernetes
``pkg/sm/plugins/ufm/ufm.go``; the UFM Enterprise REST API Guide 6.12-6.22):

* auth: HTTP Basic ``user:password`` on ``/ufmRest/...``; ``Authorization: Basic <token>`` on ``/ufmRestV3/...``
  (401 otherwise); with ``--tls-client-ca``, a client certificate whose DNS name is associated with a user
  (``client_cert_sans``, as UFM's ``manage_client_authentication.sh associate-user``) authenticates on
  ``/ufmRest/...`` without a password. Both prefixes serve the same resources.
* ``GET /app/ufm_version`` (``ufm_release_version`` and the component versions), ``GET /app/smconf[?param_name=K]``
  (the SM's keys and settings: ``m_key``, ``sm_key``, ``sa_key``, ``m_key_per_port``, ``subnet_prefix``, ...),
  ``GET /app/client_authentication/settings``.
* ``GET /resources/systems[?type=host]``, ``GET /resources/ports[?system=NAME&sys_type=Computer|Switch&active=true]``,
  ``GET /resources/vports`` (virtual SR-IOV ports: ``virtual_port_guid`` on the physical ``port_guid``).
* PKeys under ``/resources/pkeys``: ``POST /add`` (create empty), ``POST`` (add GUIDs, additive; creates the PKey;
  a GUID already a member keeps its membership: changing one this way is undocumented), ``PUT`` (replace the GUID
  set), ``DELETE /<pkey>/guids/<g1>,<g2>`` and ``POST /actions/remove_guids_from_pkey`` ``{"pkey", "guids"}``
  (absent GUIDs are a no-op; removing the last member deletes the PKey, as UFM does), ``GET /<pkey>[?guids_data=
  true][&qos_conf=true]``, ``GET [?guids_data=true|qos_conf=true]`` (a map; a list of keys without either),
  ``DELETE /<pkey>``, ``PUT /qos_conf``, ``GET /last_updated``. QoS reads as ``"qos_conf": {"mtu_limit",
  "rate_limit", "service_level"}`` only when asked for. The management PKey 0x7fff is read-only; read with
  ``guids_data=true`` it reports the fabric's default ``membership`` (``full`` out of the box) from UFM 6.19.
* Behind UFM's Apache front: a request line over 8,190 bytes (Apache's ``LimitRequestLine``) answers 414 with
  Apache's HTML page, before authentication.

Validation as UFM does it: PKey 0x1-0x7ffe, GUIDs of 16 hex digits (``0x`` optional; stored lowercase without
delimiters), membership ``full`` or ``limited``.

Version profiles (``--version``, ``UfmStub(version=...)``, ``POST /_lab/config``), for behaviour that differs
between UFM releases; every knob of a profile can be overridden on its own:

================  ==========  ================================  ==============  ==========
profile           release     missing PKey (GET /pkeys/<p>)     0x7fff reports  partition_
                                                                membership      name
================  ==========  ================================  ==============  ==========
``6.17``          6.17.0-5    200 ``{}``                        no              rejected
``6.19``          6.19.1-3    200 ``{}``                        yes             rejected
``6.22`` default  6.22.1-2    404                               yes             accepted
================  ==========  ================================  ==============  ==========

``6.17`` also answers successful writes with a plain-text body (``write_answer: "text"``), the others with ``{}``.
The guide documents ``partition_name`` from 6.22; older profiles answer 400 to it, the strict reading, so a client
that sends it to an older UFM is caught. Without a name UFM calls a PKey created through the API
``api_pkey_<pkey>``.

Lab admin API (same shape as the Kubernetes emulator's): ``POST /_lab/reset`` (an empty out-of-the-box fabric,
the startup configuration, no faults, an empty audit log); ``POST /_lab/seed`` ``{"hosts": [{"name", "guids":
[...]}], "switches": [{"name", "guid"}], "pkeys": {"0x10": {"partition", "guids": {g: m}}}, "vports": [{"host",
"port_guid", "guid"}], "default_membership": "full"|"limited", "smconf": {"m_key": "0x...", ...}}`` (replaces the
fabric; what it leaves out is as UFM ships: default membership ``full``, ``m_key`` 0x0, ``sm_key`` and ``sa_key``
0x1, ``m_key_per_port`` false); ``GET /_lab/state``; ``GET``/``POST /_lab/config`` ``{"version", "missing_pkey":
"404"|"empty", "reports_default_membership", "partition_name", "write_answer": "json"|"text",
"max_request_line", "client_cert_sans": [{"san", "user"}]}`` (the effective configuration; a POST changes the
given keys, a new ``version`` first resets the knobs to that profile); ``POST /_lab/faults`` ``{"match":
{"method", "path" (regex)}, "action": {"status": 503} | {"delay": s} | {"delayAfter": s} | {"drop":
"before"|"after"}, "count": 1, "after": <fault id>, "skip": 0}`` (``after``: armed only once that fault was
served, so a test places a fault by the audit order, e.g. on the read that follows a lost write; ``skip``: that many
matching requests pass first; lab/faults.py, the front the lab's emulators share), ``GET``/``DELETE
/_lab/faults``; ``GET /_lab/audit[?since=N&writes=1]``, ``GET /_lab/audit/cursor``. ``delayAfter`` carries the
write out, logs it, then holds the answer (a worker can be killed meanwhile). `fleet_seed` builds the seed of a
fleet, with the posture Millwright requires (docs/fabric.md).

``--tls-cert F --tls-key F`` (lab/tls.py) serves HTTPS instead of HTTP, the admin API included; ``--tls-client-ca
F`` also requires a client certificate issued by that CA (UFM's ``client_cert_authentication``).

This module is the REST front; the fabric it serves, UFM's value checks and the version profiles are
lab/ufm_fabric.py.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import dataclasses
import hashlib
import json
import logging
import ssl
import sys
import time
from pathlib import Path
from typing import Any

from aiohttp import web

from lab import faults as lab_faults
from lab import tls as lab_tls
from lab.faults import AuditLog, FaultFront, FaultTable
from lab.k8s.process import ChildProcess
from lab.loopback import AdminClient, serve_app
from lab.ufm_fabric import (
    CHOICES,
    DEFAULT_VERSION,
    PROFILES,
    QOS,
    Fabric,
    Profile,
    UfmError,
    membership,
    parse_guid,
    parse_pkey,
    pkey_str,
)

log = logging.getLogger("lab.ufm")

DEFAULT_USER = "admin"
DEFAULT_PASSWORD = "123456"
_SYS_TYPES = {"Computer": "host", "Switch": "switch"}
_APACHE_414 = """<!DOCTYPE HTML PUBLIC "-//IETF//DTD HTML 2.0//EN">
<html><head>
<title>414 Request-URI Too Long</title>
</head><body>
<h1>Request-URI Too Long</h1>
<p>The requested URL's length exceeds the capacity
limit for this server.<br />
</p>
</body></html>
"""


def fleet_seed(path_or_fleet: Any) -> dict:
    """The ``/_lab/seed`` body for a fleet (file or Fleet): its InfiniBand hosts and switches, on a fabric with the
    posture Millwright requires (default membership limited, SM keys set, an M_Key per port). The keys are lab
    values derived from the cluster's name, so a restarted lab has the same ones."""
    from lab.fleet import Fleet, load_fleet

    fleet = path_or_fleet if isinstance(path_or_fleet, Fleet) else load_fleet(path_or_fleet)

    def key(what: str) -> str:
        return "0x" + hashlib.sha256(f"{fleet.cluster}/{what}".encode()).hexdigest()[:16]

    return {"hosts": [{"name": h, "guids": g} for h, g in fleet.ib_ports().items()],
            "switches": [{"name": n, "guid": g} for n, g in fleet.ib_switches().items()],
            "default_membership": "limited",
            "smconf": {"m_key": key("m_key"), "sm_key": key("sm_key"), "sa_key": key("sa_key"),
                       "m_key_per_port": True}}  # fmt: skip


class UfmServer:
    def __init__(self, user: str = DEFAULT_USER, password: str = DEFAULT_PASSWORD, token: str | None = None,
                 version: str = DEFAULT_VERSION, client_cert_sans: list[dict] | None = None) -> None:  # fmt: skip
        self.fabric = Fabric()
        self.user, self.password, self.token = user, password, token
        self._startup = {"version": version, "client_cert_sans": list(client_cert_sans or [])}
        self.profile = PROFILES[version]
        self.version = version
        self.client_cert_sans: list[dict] = []
        self.configure(dict(self._startup))
        self.faults = FaultTable(("method", "path"))  # lab/faults.py
        self.audit = AuditLog(50_000)
        self.front = FaultFront(self.audit.add)
        # Long request lines must reach `dispatch`, which answers 414 as UFM's Apache front does (aiohttp's own
        # limit, 8190, would answer 400 first).
        self.app = web.Application(handler_args={"max_line_size": 1 << 20, "max_field_size": 1 << 16},
                                   client_max_size=64 << 20)  # fmt: skip
        self.app.router.add_route("*", "/{tail:.*}", self.dispatch)

    # ------------------------------------------------------------------ configuration
    def configure(self, body: dict) -> dict:
        """Apply `/_lab/config`: a new version resets the knobs to its profile, then the given knobs override."""
        body = dict(body)
        if "version" in body:
            version = str(body.pop("version"))
            if version not in PROFILES:
                raise UfmError(400, f"version {version!r}: one of {', '.join(PROFILES)}")
            self.version, self.profile = version, PROFILES[version]
        if "client_cert_sans" in body:
            sans = body.pop("client_cert_sans")
            if not isinstance(sans, list) or not all(isinstance(s, dict) and {"san", "user"} <= set(s) for s in sans):
                raise UfmError(400, 'client_cert_sans: a list of {"san", "user"}')
            self.client_cert_sans = [{"san": str(s["san"]), "user": str(s["user"])} for s in sans]
        knobs = {f.name for f in dataclasses.fields(Profile)} - {"release"}
        unknown = set(body) - knobs
        if unknown:
            raise UfmError(400, f"unknown configuration keys {sorted(unknown)}; known: version, client_cert_sans, "
                                f"{', '.join(sorted(knobs))}")  # fmt: skip
        for k, v in body.items():
            if k in CHOICES and v not in CHOICES[k]:
                raise UfmError(400, f"{k}: one of {', '.join(CHOICES[k])}")
        self.profile = dataclasses.replace(self.profile, **body)
        return self.config()

    def config(self) -> dict:
        return {"version": self.version, **dataclasses.asdict(self.profile), "client_cert_sans": self.client_cert_sans}

    # ------------------------------------------------------------------ plumbing
    def _authorized(self, request: web.Request, prefix: str) -> bool:
        if prefix == "ufmRest" and self._certificate_user(request):
            return True
        header = request.headers.get("Authorization", "")
        if not header.startswith("Basic "):
            return False
        value = header[6:].strip()
        if prefix == "ufmRestV3":
            return self.token is not None and value == self.token
        try:
            user, _, password = base64.b64decode(value).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            return False
        return user == self.user and password == self.password

    def _certificate_user(self, request: web.Request) -> str | None:
        """The UFM user a verified client certificate's DNS name is associated with (mutual TLS)."""
        peer = request.transport.get_extra_info("peercert") if request.transport else None
        names = set(lab_tls.peer_names(peer))
        return next((s["user"] for s in self.client_cert_sans if s["san"] in names), None)

    async def dispatch(self, request: web.Request) -> web.StreamResponse:
        path = "/" + request.match_info["tail"]
        if path.startswith("/_lab"):
            try:
                return await self.admin(request, path)
            except (UfmError, KeyError, ValueError, TypeError) as e:
                return web.json_response({"error": getattr(e, "message", str(e))}, status=400)
        method = request.method
        write = method in ("POST", "PUT", "DELETE")
        entry: dict[str, Any] = {
            "time": time.time(),
            "method": method,
            "path": request.path_qs[:500],
            "write": write,
            "userAgent": request.headers.get("User-Agent", ""),
            "body": None,
        }
        line = len(f"{method} {request.raw_path} HTTP/{request.version.major}.{request.version.minor}")
        if line > self.profile.max_request_line:
            entry.update(code=414, requestLine=line)
            self.audit.add(entry)
            return web.Response(status=414, text=_APACHE_414, content_type="text/html")
        body: Any = None
        if write and request.can_read_body:
            try:
                body = await request.json()
            except (json.JSONDecodeError, UnicodeDecodeError):
                body = "<invalid json>"
        entry["body"] = body
        parts = [p for p in path.split("/") if p]
        if not parts or parts[0] not in ("ufmRest", "ufmRestV3"):
            entry["code"] = 404
            self.audit.add(entry)
            return web.json_response({"error": "Not Found"}, status=404)
        if not self._authorized(request, parts[0]):
            entry["code"] = 401
            self.audit.add(entry)
            return web.Response(status=401, text="Unauthorized", headers={"WWW-Authenticate": 'Basic realm="UFM"'})
        fault = self.faults.match({"method": method, "path": path})

        async def serve() -> web.Response:
            try:
                if body == "<invalid json>":
                    raise UfmError(400, "Invalid JSON in request body")
                status, payload = self.handle(method, parts[1:], dict(request.query), body)
            except UfmError as e:
                status, payload = e.status, {"error": e.message}
            except Exception as e:  # an emulator bug: still answer
                log.exception("internal error on %s %s", method, path)
                status, payload = 500, {"error": f"{type(e).__name__}: {e}"}
            if write and status == 200 and self.profile.write_answer == "text":
                return web.Response(status=200, text="OK", content_type="text/plain")
            return web.json_response(payload, status=status)

        def refuse(f: dict) -> web.Response:
            return web.json_response(
                {"error": f["action"].get("message") or "injected fault"}, status=int(f["action"]["status"])
            )

        return await self.front.handle(request, entry, fault, serve, refuse)

    # ------------------------------------------------------------------ UFM resources
    def handle(self, method: str, parts: list[str], query: dict, body: Any) -> tuple[int, Any]:  # noqa: C901 (one branch per UFM REST route)
        fab = self.fabric
        truthy = lambda k: str(query.get(k, "")).lower() == "true"
        if parts[:1] == ["app"] and method == "GET":
            return self._app(parts[1:], query)
        if parts == ["actions", "remove_guids_from_pkey"] and method == "POST":
            b = self._body(body)
            n = parse_pkey(b.get("pkey"))
            guids = b.get("guids")
            if not isinstance(guids, list) or not guids:
                raise UfmError(400, "guids must be a non-empty list of GUIDs")
            parsed = [parse_guid(g) for g in guids]
            if n not in fab.pkeys:
                raise UfmError(404, f"PKey {pkey_str(n)} does not exist")
            fab.remove_guids(n, parsed)
            return 200, {}
        if parts[:1] != ["resources"] or len(parts) < 2:
            raise UfmError(404, "Not Found")
        res, rest = parts[1], parts[2:]
        if res == "systems" and method == "GET":
            systems = list(fab.systems.values())
            if query.get("type"):
                systems = [s for s in systems if s["type"] == query["type"]]
            if rest:
                systems = [s for s in systems if s["system_name"] == rest[0]]
                if not systems:
                    raise UfmError(404, f"System {rest[0]} not found")
            return 200, systems
        if res == "ports" and method == "GET":
            ports = fab.ports
            if query.get("system"):
                ports = [p for p in ports if p["system_name"] == query["system"]]
            if query.get("sys_type"):
                kind = _SYS_TYPES.get(query["sys_type"])
                if kind is None:
                    raise UfmError(400, f"Invalid sys_type {query['sys_type']!r}: one of {', '.join(_SYS_TYPES)}")
                ports = [p for p in ports if fab.systems[p["system_name"]]["type"] == kind]
            if truthy("active"):
                ports = [p for p in ports if p["logical_state"] == "Active"]
            return 200, ports
        if res == "vports" and method == "GET":
            return 200, fab.vports
        if res != "pkeys":
            raise UfmError(404, "Not Found")
        return self._pkeys(method, rest, query, body)

    def _app(self, rest: list[str], query: dict) -> tuple[int, Any]:
        if rest == ["ufm_version"]:
            return 200, {"opensm": "5.20.0_ef1f438", "sharp": "3.8.0", "ibdiagnet": "2.18.0", "telemetry": "1.18.2",
                         "mft": "4.29.0-131", "ufm_webui": self.profile.release,
                         "ufm_release_version": self.profile.release, "plugins": {}}  # fmt: skip
        if rest == ["smconf"]:
            name = query.get("param_name")
            if not name:
                return 200, dict(self.fabric.smconf)
            if name not in self.fabric.smconf:
                raise UfmError(400, f"Unknown SM configuration parameter {name!r}")
            return 200, {name: self.fabric.smconf[name]}
        if rest == ["client_authentication", "settings"]:
            return 200, {"enable": bool(self.client_cert_sans), "client_cert_sans": self.client_cert_sans,
                         "ssl_cert_hostnames": [], "cert_auto_refresh": {}}  # fmt: skip
        raise UfmError(404, "Not Found")

    def _pkeys(self, method: str, rest: list[str], query: dict, body: Any) -> tuple[int, Any]:  # noqa: C901 (the PKey API's verbs and query options, one branch each)
        fab, profile = self.fabric, self.profile
        truthy = lambda k: str(query.get(k, "")).lower() == "true"
        if not rest:
            if method == "GET":
                if truthy("guids_data") or truthy("qos_conf"):
                    return 200, {pkey_str(n): fab.pkey_view(n, profile, truthy("guids_data"), truthy("qos_conf"))
                                 for n in sorted(fab.pkeys)}  # fmt: skip
                return 200, [pkey_str(n) for n in sorted(fab.pkeys)]
            if method in ("POST", "PUT"):
                return self._set_guids(body, replace=method == "PUT")
            raise UfmError(405, "Method Not Allowed")
        if rest == ["add"] and method == "POST":
            b = self._body(body)
            n = parse_pkey(b.get("pkey"))
            if n in fab.pkeys:
                raise UfmError(400, f"PKey {pkey_str(n)} already exists")
            fab.pkeys[n] = fab._new_pkey(self._partition_name(b, n), **b)
            fab.touch()
            return 200, {}
        if rest == ["last_updated"] and method == "GET":
            return 200, {
                "last_updated": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(fab.last_updated))
                + f".{int(fab.last_updated * 1e6) % 1000000:06d}"
            }
        if rest == ["qos_conf"] and method == "PUT":
            b = self._body(body)
            n = parse_pkey(b.get("pkey"))
            if n not in fab.pkeys:
                raise UfmError(404, f"PKey {pkey_str(n)} does not exist")
            for k in QOS:
                if k in b:
                    fab.pkeys[n][k] = b[k]
            fab.touch()
            return 200, {}
        n = parse_pkey(rest[0], writable=method != "GET")
        if n not in fab.pkeys:
            if method == "GET" and len(rest) == 1 and profile.missing_pkey == "empty":
                return 200, {}  # some UFM releases answer a missing PKey so
            raise UfmError(404, f"PKey {pkey_str(n)} does not exist")
        if len(rest) == 1:
            if method == "GET":
                return 200, fab.pkey_view(n, profile, truthy("guids_data"), truthy("qos_conf"))
            if method == "DELETE":
                del fab.pkeys[n]
                fab.touch()
                return 200, {}
        if len(rest) == 3 and rest[1] == "guids" and method == "DELETE":
            guids = [parse_guid(g) for g in rest[2].split(",") if g]
            if not guids:
                raise UfmError(400, "No GUIDs given")
            fab.remove_guids(n, guids)
            return 200, {}
        raise UfmError(405, "Method Not Allowed")

    @staticmethod
    def _body(body: Any) -> dict:
        if not isinstance(body, dict):
            raise UfmError(400, "Request body must be a JSON object")
        return body

    def _partition_name(self, b: dict, n: int) -> str:
        if "partition_name" in b and not self.profile.partition_name:
            raise UfmError(400, f"Invalid request: unexpected parameter 'partition_name' (UFM {self.profile.release})")
        return str(b.get("partition_name") or f"api_pkey_{pkey_str(n)}")

    def _set_guids(self, body: Any, *, replace: bool) -> tuple[int, Any]:
        b = self._body(body)
        n = parse_pkey(b.get("pkey"))
        guids = b.get("guids")
        if not isinstance(guids, list) or (not guids and not replace):
            raise UfmError(400, "guids must be a non-empty list of GUIDs")
        parsed = [parse_guid(g) for g in guids]
        name = self._partition_name(b, n)
        if "memberships" in b:
            ms = b["memberships"]
            if not isinstance(ms, list) or len(ms) != len(parsed):
                raise UfmError(400, "memberships must be a list of the same length as guids")
        else:
            ms = [b.get("membership", "full")] * len(parsed)
        ms = [membership(m) for m in ms]
        fab = self.fabric
        entry = fab.pkeys.get(n)
        if entry is None:
            entry = fab.pkeys[n] = fab._new_pkey(name, **b)
        index0 = bool(b.get("index0", False))
        if "ip_over_ib" in b:
            entry["ip_over_ib"] = bool(b["ip_over_ib"])
        if replace:
            entry["guids"] = {}
            for k in QOS:
                if k in b:
                    entry[k] = b[k]
        for g, m in zip(parsed, ms):
            # POST adds: a member keeps its membership (changing it by re-adding is undocumented); PUT sets.
            entry["guids"].setdefault(g, {"membership": m, "index0": index0})
        fab.touch()
        return 200, {}

    # ------------------------------------------------------------------ lab admin
    async def admin(self, request: web.Request, path: str) -> web.Response:
        m = request.method
        served = await lab_faults.admin(request, self.faults, self.audit)
        if served is not None:
            return served
        if path == "/_lab/reset" and m == "POST":
            self.fabric.clear()
            self.configure(dict(self._startup))
            self.faults.clear()
            self.audit.clear()
            return web.json_response({"ok": True})
        if path == "/_lab/seed" and m == "POST":
            self.fabric.seed(await request.json())
            return web.json_response({"ok": True, "systems": len(self.fabric.systems), "ports": len(self.fabric.ports)})
        if path == "/_lab/state" and m == "GET":
            return web.json_response(self.fabric.dump(self.profile))
        if path == "/_lab/config":
            if m == "GET":
                return web.json_response(self.config())
            if m == "POST":
                return web.json_response(self.configure(await request.json()))
        if path == "/_lab/healthz":
            return web.json_response({"ok": True})
        return web.json_response({"error": f"no admin route {m} {path}"}, status=404)


async def serve(host: str, port: int, ready_file: str | None, server: UfmServer,
                ssl_context: ssl.SSLContext | None = None) -> None:  # fmt: skip
    await serve_app("lab.ufm", server.app, host, port, ready_file, ssl_context)


class UfmStub(ChildProcess):
    """``with UfmStub(password=..., token=...) as ufm: ufm.url`` — the emulator as a child process.

    ``version`` picks the startup profile (what ``/_lab/reset`` returns to); ``tls`` serves HTTPS with that
    certificate; ``client_ca`` with it requires client certificates issued by that CA, and ``client_cert_sans``
    ``[{"san", "user"}]`` says which certificate names authenticate as which UFM user."""

    module = "lab.ufm"
    name = "lab-ufm"

    def __init__(self, *, user: str = DEFAULT_USER, password: str = DEFAULT_PASSWORD, token: str | None = None,
                 fleet: str | None = None, tls: lab_tls.ServerCert | None = None, version: str = DEFAULT_VERSION,
                 client_ca: Path | str | None = None, client_cert_sans: list[dict] | None = None,
                 **kw: Any) -> None:  # fmt: skip
        super().__init__(**kw)
        self.user, self.password, self.token, self.fleet = user, password, token, fleet
        self.tls, self.version, self.client_ca = tls, version, client_ca
        # Credentials travel in the environment, not the command line (visible in `ps`).
        self.env = {
            **(self.env or {}),
            "LAB_UFM_USER": user,
            "LAB_UFM_PASSWORD": password,
            **({"LAB_UFM_TOKEN": token} if token else {}),
            **({"LAB_UFM_CLIENT_CERT_SANS": json.dumps(client_cert_sans)} if client_cert_sans else {}),
        }

    def extra_command(self) -> list[str]:
        return ((["--fleet", str(self.fleet)] if self.fleet else []) + ["--version", self.version]
                + lab_tls.arguments(self.tls, self.client_ca))  # fmt: skip


class UfmAdmin(AdminClient):
    """The UFM emulator's admin API: seed it, configure it and read its state, on top of faults and the audit log."""

    async def seed(self, body: dict) -> dict:
        return await self._req("POST", "/_lab/seed", json=body)

    async def state(self) -> dict:
        return await self._req("GET", "/_lab/state")

    async def configure(self, **knobs: Any) -> dict:
        """``configure(version="6.19")``, ``configure(missing_pkey="empty")``: see the module docstring."""
        return await self._req("POST", "/_lab/config", json=knobs)

    async def config(self) -> dict:
        return await self._req("GET", "/_lab/config")

    async def members(self, pkey: str) -> dict[str, str]:
        p = (await self.state())["pkeys"].get(pkey)
        return {g["guid"]: g["membership"] for g in p["guids"]} if p else {}


def main(argv: list[str] | None = None) -> int:
    import os

    p = argparse.ArgumentParser(prog="python -m lab.ufm", description="NVIDIA UFM REST emulator (PKeys, ports)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--ready-file")
    p.add_argument("--fleet", help="seed hosts, port GUIDs and switches from this fleet file's infiniband part")
    p.add_argument(
        "--version",
        default=DEFAULT_VERSION,
        choices=sorted(PROFILES),
        help="the UFM release whose behaviour to play (see the module docstring)",
    )
    p.add_argument("--log-level", default="WARNING")
    lab_tls.add_arguments(p)
    a = p.parse_args(argv)
    logging.basicConfig(level=a.log_level.upper(), stream=sys.stderr)
    server = UfmServer(
        user=os.environ.get("LAB_UFM_USER", DEFAULT_USER),
        password=os.environ.get("LAB_UFM_PASSWORD", DEFAULT_PASSWORD),
        token=os.environ.get("LAB_UFM_TOKEN") or None,
        version=a.version,
        client_cert_sans=json.loads(os.environ.get("LAB_UFM_CLIENT_CERT_SANS") or "[]"),
    )
    if a.fleet:
        server.fabric.seed(fleet_seed(Path(a.fleet)))
    asyncio.run(serve(a.host, a.port, a.ready_file, server, lab_tls.server_context(a)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
