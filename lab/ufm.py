"""An NVIDIA UFM REST emulator for the lab: ``python -m lab.ufm --port 0 --ready-file F [--fleet FILE]``.

The PKey and fabric endpoints Millwright uses, in UFM's own shapes (reference: hardware.md §5):

* auth: HTTP Basic ``user:password`` on ``/ufmRest/...``; ``Authorization: Basic <token>`` on ``/ufmRestV3/...``
  (401 otherwise). Both prefixes serve the same resources.
* ``GET /ufmRest/app/ufm_version``
* ``GET /ufmRest/resources/systems[?type=host]``, ``GET /ufmRest/resources/ports[?system=NAME&active=true]``
* PKeys under ``/ufmRest/resources/pkeys``: ``POST /add`` (create empty), ``POST`` (add GUIDs, additive;
  creates the PKey), ``PUT`` (replace the GUID set), ``DELETE /<pkey>/guids/<g1>,<g2>`` (absent GUIDs are a
  no-op), ``GET /<pkey>[?guids_data=true]``, ``GET [?guids_data=true]`` (a map with, a list of keys without),
  ``DELETE /<pkey>``, ``PUT /qos_conf``, ``GET /last_updated``.

Validation as UFM does it: PKey 0x1-0x7ffe (0x7fff is the read-only management key), GUIDs of 16 hex digits
(``0x`` optional; stored lowercase without delimiters), membership ``full`` or ``limited``.

Lab admin API (same shape as the Kubernetes emulator's): ``POST /_lab/reset``; ``POST /_lab/seed``
``{"hosts": [{"name", "guids": [...]}], "switches": [{"name", "guid"}], "pkeys": {"0x10": {"guids": {g: m}}}}``
(replaces the fabric); ``GET /_lab/state``; ``POST /_lab/faults`` ``{"match": {"method", "path" (regex)},
"action": {"status": 503} | {"delay": s} | {"delayAfter": s} | {"drop": "before"|"after"}, "count": 1,
"after": <fault id>, "skip": 0}`` (``after``: armed only once that fault was served, so a test places a fault by
the audit order, e.g. on the read that follows a lost write; ``skip``: that many matching requests pass first),
``GET``/``DELETE /_lab/faults``; ``GET /_lab/audit[?since=N&writes=1]``, ``GET /_lab/audit/cursor``.
``delayAfter`` carries the write out, logs it, then holds the answer (a worker can be killed meanwhile).

``--tls-cert F --tls-key F`` (lab/tls.py) serves HTTPS instead of HTTP, the admin API included.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import logging
import re
import ssl
import sys
import time
from pathlib import Path
from typing import Any

from aiohttp import web

from lab import tls as lab_tls
from lab.k8s.process import ChildProcess
from lab.loopback import AdminClient, serve_app

log = logging.getLogger("lab.ufm")

VERSION = "6.22.1-2"
MANAGEMENT_PKEY = 0x7FFF
_GUID = re.compile(r"^(0x)?([0-9a-fA-F]{16})$")
MEMBERSHIPS = ("full", "limited")
DEFAULT_USER = "admin"
DEFAULT_PASSWORD = "123456"


class UfmError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def parse_pkey(value: Any, *, writable: bool = True) -> int:
    if not isinstance(value, str) or not re.match(r"^0x[0-9a-fA-F]{1,4}$", value.strip()):
        raise UfmError(400, f"Invalid PKey value: {value!r}, PKey must be a hex string in the range 0x1-0x7ffe")
    n = int(value, 16)
    if n == MANAGEMENT_PKEY and writable:
        raise UfmError(400, "PKey 0x7fff is the default management PKey and cannot be modified")
    if not 0 < n <= MANAGEMENT_PKEY:
        raise UfmError(400, f"Invalid PKey value: {value}, PKey must be in the range 0x1-0x7ffe")
    return n


def pkey_str(n: int) -> str:
    return f"0x{n:x}"


def parse_guid(value: Any) -> str:
    m = _GUID.match(value.strip()) if isinstance(value, str) else None
    if not m:
        raise UfmError(400, f"Invalid GUID value: {value!r}, GUID must be a 16-digit hex string")
    return m.group(2).lower()


class Fabric:
    """The emulated fabric: systems, ports, PKeys."""

    def __init__(self) -> None:
        self.systems: dict[str, dict] = {}
        self.ports: list[dict] = []
        self.pkeys: dict[int, dict] = {}
        self.last_updated = time.time()
        self.clear()

    def clear(self) -> None:
        self.systems.clear()
        self.ports.clear()
        self.pkeys = {MANAGEMENT_PKEY: self._new_pkey("management", ip_over_ib=True)}
        self.touch()

    def touch(self) -> None:
        self.last_updated = time.time()

    @staticmethod
    def _new_pkey(name: str = "", **kw: Any) -> dict:
        return {"partition": name, "ip_over_ib": kw.get("ip_over_ib", True), "sharp_enabled": False,
                "index0": kw.get("index0", False), "mtu_limit": kw.get("mtu_limit", 2),
                "service_level": kw.get("service_level", 0), "rate_limit": kw.get("rate_limit", 2.5),
                "guids": {}}

    def seed(self, body: dict) -> None:
        self.clear()
        for i, host in enumerate(body.get("hosts") or []):
            name = host["name"]
            guids = [parse_guid(g) for g in host.get("guids") or []]
            sys_guid = guids[0] if guids else f"{i:016x}"
            self.systems[name] = {"system_name": name, "guid": sys_guid, "type": "host", "state": "active",
                                  "description": f"{name} HCA-1", "ip": f"10.1.{i // 250}.{i % 250 + 10}",
                                  "model": "MT4129", "vendor": "Mellanox"}
            for n, g in enumerate(guids, 1):
                state = (host.get("states") or {}).get(g, "Active")
                self.ports.append({"guid": g, "name": f"{g}_1", "system_name": name, "system_guid": sys_guid,
                                   "physical_port_number": 1, "dname": f"mlx5_{n - 1}/1",
                                   "logical_state": state, "physical_state": "LinkUp" if state == "Active" else "Polling",
                                   "speed": "NDR", "width": "4x", "external": False, "tier": 1})
        for sw in body.get("switches") or []:
            g = parse_guid(sw["guid"])
            self.systems[sw["name"]] = {"system_name": sw["name"], "guid": g, "type": "switch", "state": "active",
                                        "description": "MQM9790", "model": "MQM9790", "vendor": "Mellanox"}
            for p in range(1, 5):
                self.ports.append({"guid": g, "name": f"{g}_{p}", "system_name": sw["name"], "system_guid": g,
                                   "physical_port_number": p, "dname": str(p), "logical_state": "Active",
                                   "physical_state": "LinkUp", "speed": "NDR", "width": "4x", "external": True,
                                   "tier": 2})
        for key, pk in (body.get("pkeys") or {}).items():
            n = parse_pkey(key, writable=False)
            entry = self._new_pkey(pk.get("partition", ""))
            entry["guids"] = {parse_guid(g): {"membership": m, "index0": False} for g, m in (pk.get("guids") or {}).items()}
            self.pkeys[n] = entry
        self.touch()

    def pkey_view(self, n: int, guids_data: bool, qos: bool = True) -> dict:
        p = self.pkeys[n]
        out: dict[str, Any] = {"partition": p["partition"], "ip_over_ib": p["ip_over_ib"],
                               "sharp_enabled": p["sharp_enabled"]}
        if guids_data:
            out["guids"] = [{"guid": g, "membership": v["membership"], "index0": v["index0"]}
                            for g, v in sorted(p["guids"].items())]
        if qos:
            out.update({k: p[k] for k in ("mtu_limit", "service_level", "rate_limit")})
        return out

    def dump(self) -> dict:
        return {"systems": self.systems, "ports": self.ports,
                "pkeys": {pkey_str(n): self.pkey_view(n, True) for n in sorted(self.pkeys)}}


def fleet_seed(path_or_fleet: Any) -> dict:
    """The ``/_lab/seed`` body for a fleet (file or Fleet): its InfiniBand hosts and switches."""
    from lab.fleet import Fleet, load_fleet

    fleet = path_or_fleet if isinstance(path_or_fleet, Fleet) else load_fleet(path_or_fleet)
    return {"hosts": [{"name": h, "guids": g} for h, g in fleet.ib_ports().items()],
            "switches": [{"name": n, "guid": g} for n, g in fleet.ib_switches().items()]}


class UfmServer:
    def __init__(self, user: str = DEFAULT_USER, password: str = DEFAULT_PASSWORD, token: str | None = None) -> None:
        self.fabric = Fabric()
        self.user, self.password, self.token = user, password, token
        self.faults: list[dict] = []
        self.fault_seq = 0
        self.audit: list[dict] = []
        self.audit_seq = 0
        self.app = web.Application()
        self.app.router.add_route("*", "/{tail:.*}", self.dispatch)

    # ------------------------------------------------------------------ plumbing
    def _authorized(self, request: web.Request, prefix: str) -> bool:
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

    def _match_fault(self, method: str, path: str) -> dict | None:
        served = {f["id"]: f["served"] for f in self.faults}
        for f in self.faults:
            if f["remaining"] == 0 or (f["after"] is not None and not served.get(f["after"])):
                continue
            m = f["match"]
            if m.get("method") and m["method"].upper() != method:
                continue
            if m.get("path") and not re.search(m["path"], path):
                continue
            if f["skip"] > 0:
                f["skip"] -= 1
                continue
            if f["remaining"] > 0:
                f["remaining"] -= 1
            f["served"] += 1
            return f
        return None

    def _audit(self, entry: dict) -> None:
        self.audit_seq += 1
        entry["seq"] = self.audit_seq
        self.audit.append(entry)
        if len(self.audit) > 50_000:
            del self.audit[:10_000]

    async def dispatch(self, request: web.Request) -> web.StreamResponse:
        path = "/" + request.match_info["tail"]
        if path.startswith("/_lab"):
            try:
                return await self.admin(request, path)
            except (UfmError, KeyError, ValueError, TypeError) as e:
                return web.json_response({"error": getattr(e, "message", str(e))}, status=400)
        parts = [p for p in path.split("/") if p]
        method = request.method
        write = method in ("POST", "PUT", "DELETE")
        body: Any = None
        if write and request.can_read_body:
            try:
                body = await request.json()
            except (json.JSONDecodeError, UnicodeDecodeError):
                body = "<invalid json>"
        entry: dict[str, Any] = {"time": time.time(), "method": method, "path": request.path_qs[:500],
                                 "write": write, "userAgent": request.headers.get("User-Agent", ""),
                                 "body": body}
        if not parts or parts[0] not in ("ufmRest", "ufmRestV3"):
            entry["code"] = 404
            self._audit(entry)
            return web.json_response({"error": "Not Found"}, status=404)
        if not self._authorized(request, parts[0]):
            entry["code"] = 401
            self._audit(entry)
            return web.Response(status=401, text="Unauthorized", headers={"WWW-Authenticate": 'Basic realm="UFM"'})
        fault = self._match_fault(method, path)
        delay_after = 0.0
        drop_after = False
        if fault:
            action = fault["action"]
            entry["fault"] = {"id": fault["id"], **action}
            if "delay" in action:
                await asyncio.sleep(float(action["delay"]))
            elif "delayAfter" in action:
                delay_after = float(action["delayAfter"])
            elif action.get("drop") == "before":
                entry["code"] = 0
                self._audit(entry)
                return self._drop(request)
            elif action.get("drop") == "after":
                drop_after = True
            elif "status" in action:
                entry["code"] = int(action["status"])
                self._audit(entry)
                return web.json_response({"error": action.get("message") or "injected fault"},
                                         status=int(action["status"]))
        try:
            if body == "<invalid json>":
                raise UfmError(400, "Invalid JSON in request body")
            status, payload = self.handle(method, parts[1:], dict(request.query), body)
        except UfmError as e:
            status, payload = e.status, {"error": e.message}
        except Exception as e:  # an emulator bug: still answer
            log.exception("internal error on %s %s", method, path)
            status, payload = 500, {"error": f"{type(e).__name__}: {e}"}
        entry["code"] = status
        self._audit(entry)
        if drop_after:
            return self._drop(request)
        if delay_after:
            await asyncio.sleep(delay_after)
        return web.json_response(payload, status=status)

    def _drop(self, request: web.Request) -> web.StreamResponse:
        if request.transport is not None:
            request.transport.abort()
        raise ConnectionResetError("lab fault: connection dropped")

    # ------------------------------------------------------------------ UFM resources
    def handle(self, method: str, parts: list[str], query: dict, body: Any) -> tuple[int, Any]:
        fab = self.fabric
        truthy = lambda k: str(query.get(k, "")).lower() == "true"  # noqa: E731
        if parts == ["app", "ufm_version"] and method == "GET":
            return 200, {"ufm_release_version": VERSION}
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
            if truthy("active"):
                ports = [p for p in ports if p["logical_state"] == "Active"]
            return 200, ports
        if res != "pkeys":
            raise UfmError(404, "Not Found")
        if not rest:
            if method == "GET":
                if truthy("guids_data"):
                    return 200, {pkey_str(n): fab.pkey_view(n, True, truthy("qos_conf")) for n in sorted(fab.pkeys)}
                return 200, [pkey_str(n) for n in sorted(fab.pkeys)]
            if method in ("POST", "PUT"):
                return self._set_guids(body, replace=method == "PUT")
            raise UfmError(405, "Method Not Allowed")
        if rest == ["add"] and method == "POST":
            b = self._body(body)
            n = parse_pkey(b.get("pkey"))
            if n in fab.pkeys:
                raise UfmError(400, f"PKey {pkey_str(n)} already exists")
            fab.pkeys[n] = fab._new_pkey(str(b.get("partition_name") or ""), **b)
            fab.touch()
            return 200, {}
        if rest == ["last_updated"] and method == "GET":
            return 200, {"last_updated": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(fab.last_updated))
                         + f".{int(fab.last_updated * 1e6) % 1000000:06d}"}
        if rest == ["qos_conf"] and method == "PUT":
            b = self._body(body)
            n = parse_pkey(b.get("pkey"))
            if n not in fab.pkeys:
                raise UfmError(404, f"PKey {pkey_str(n)} does not exist")
            for k in ("mtu_limit", "service_level", "rate_limit"):
                if k in b:
                    fab.pkeys[n][k] = b[k]
            fab.touch()
            return 200, {}
        n = parse_pkey(rest[0], writable=method != "GET")
        if n not in fab.pkeys:
            raise UfmError(404, f"PKey {pkey_str(n)} does not exist")
        if len(rest) == 1:
            if method == "GET":
                return 200, fab.pkey_view(n, truthy("guids_data"), truthy("qos_conf") or True)
            if method == "DELETE":
                del fab.pkeys[n]
                fab.touch()
                return 200, {}
        if len(rest) == 3 and rest[1] == "guids" and method == "DELETE":
            guids = [parse_guid(g) for g in rest[2].split(",") if g]
            if not guids:
                raise UfmError(400, "No GUIDs given")
            for g in guids:
                fab.pkeys[n]["guids"].pop(g, None)
            fab.touch()
            return 200, {}
        raise UfmError(405, "Method Not Allowed")

    @staticmethod
    def _body(body: Any) -> dict:
        if not isinstance(body, dict):
            raise UfmError(400, "Request body must be a JSON object")
        return body

    def _set_guids(self, body: Any, *, replace: bool) -> tuple[int, Any]:
        b = self._body(body)
        n = parse_pkey(b.get("pkey"))
        guids = b.get("guids")
        if not isinstance(guids, list) or (not guids and not replace):
            raise UfmError(400, "guids must be a non-empty list of GUIDs")
        parsed = [parse_guid(g) for g in guids]
        if "memberships" in b:
            ms = b["memberships"]
            if not isinstance(ms, list) or len(ms) != len(parsed):
                raise UfmError(400, "memberships must be a list of the same length as guids")
        else:
            ms = [b.get("membership", "full")] * len(parsed)
        for m in ms:
            if m not in MEMBERSHIPS:
                raise UfmError(400, f"Invalid membership value: {m!r}, must be one of full, limited")
        fab = self.fabric
        entry = fab.pkeys.get(n)
        if entry is None:
            entry = fab.pkeys[n] = fab._new_pkey(str(b.get("partition_name") or ""), **b)
        index0 = bool(b.get("index0", False))
        if "ip_over_ib" in b:
            entry["ip_over_ib"] = bool(b["ip_over_ib"])
        if replace:
            entry["guids"] = {}
            for k in ("mtu_limit", "service_level", "rate_limit"):
                if k in b:
                    entry[k] = b[k]
        for g, m in zip(parsed, ms):
            entry["guids"][g] = {"membership": m, "index0": index0}
        fab.touch()
        return 200, {}

    # ------------------------------------------------------------------ lab admin
    async def admin(self, request: web.Request, path: str) -> web.Response:
        m = request.method
        if path == "/_lab/reset" and m == "POST":
            self.fabric.clear()
            self.faults.clear()
            self.audit.clear()
            return web.json_response({"ok": True})
        if path == "/_lab/seed" and m == "POST":
            self.fabric.seed(await request.json())
            return web.json_response({"ok": True, "systems": len(self.fabric.systems),
                                      "ports": len(self.fabric.ports)})
        if path == "/_lab/state" and m == "GET":
            return web.json_response(self.fabric.dump())
        if path == "/_lab/faults":
            if m == "GET":
                return web.json_response({"faults": self.faults})
            if m == "DELETE":
                self.faults.clear()
                return web.json_response({"ok": True})
            if m == "POST":
                b = await request.json()
                after = b.get("after")
                if after is not None and not any(f["id"] == int(after) for f in self.faults):
                    raise ValueError(f"after: no fault {after}")
                self.fault_seq += 1
                self.faults.append({"id": self.fault_seq, "match": dict(b.get("match") or {}),
                                    "action": dict(b["action"]), "remaining": int(b.get("count", 1)),
                                    "after": None if after is None else int(after), "skip": int(b.get("skip", 0)),
                                    "served": 0})
                return web.json_response({"id": self.fault_seq})
        if path == "/_lab/audit/cursor" and m == "GET":
            return web.json_response({"next": self.audit_seq})
        if path == "/_lab/audit" and m == "GET":
            since = int(request.query.get("since", 0))
            writes = request.query.get("writes") in ("1", "true")
            entries = [e for e in self.audit if e["seq"] > since and (e["write"] or not writes)]
            return web.json_response({"entries": entries, "next": self.audit_seq})
        if path == "/_lab/healthz":
            return web.json_response({"ok": True})
        return web.json_response({"error": f"no admin route {m} {path}"}, status=404)


async def serve(host: str, port: int, ready_file: str | None, server: UfmServer,
                ssl_context: ssl.SSLContext | None = None) -> None:  # fmt: skip
    await serve_app("lab.ufm", server.app, host, port, ready_file, ssl_context)


class UfmStub(ChildProcess):
    """``with UfmStub(password=..., token=...) as ufm: ufm.url`` — the emulator as a child process."""

    module = "lab.ufm"
    name = "lab-ufm"

    def __init__(self, *, user: str = DEFAULT_USER, password: str = DEFAULT_PASSWORD, token: str | None = None,
                 fleet: str | None = None, tls: lab_tls.ServerCert | None = None, **kw: Any) -> None:
        super().__init__(**kw)
        self.user, self.password, self.token, self.fleet = user, password, token, fleet
        self.tls = tls  # HTTPS with this certificate (lab/tls.py), as a real UFM serves; its admin API too
        # Credentials travel in the environment, not the command line (visible in `ps`).
        self.env = {**(self.env or {}), "LAB_UFM_USER": user, "LAB_UFM_PASSWORD": password,
                    **({"LAB_UFM_TOKEN": token} if token else {})}

    def extra_command(self) -> list[str]:
        return (["--fleet", str(self.fleet)] if self.fleet else []) + lab_tls.arguments(self.tls)


class UfmAdmin(AdminClient):
    """The UFM emulator's admin API: seed it and read its state, on top of faults and the audit log."""

    async def seed(self, body: dict) -> dict:
        return await self._req("POST", "/_lab/seed", json=body)

    async def state(self) -> dict:
        return await self._req("GET", "/_lab/state")

    async def add_fault(self, match: dict, action: dict, count: int = 1, *, after: int | None = None,
                        skip: int = 0) -> int:
        """The next `count` requests matching `match` get `action`; with `after` (a fault's id), only requests
        that come once that fault was served, and after `skip` matching ones are let through."""
        body = {"match": match, "action": action, "count": count, "after": after, "skip": skip}
        return (await self._req("POST", "/_lab/faults", json=body))["id"]

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
    p.add_argument("--log-level", default="WARNING")
    lab_tls.add_arguments(p)
    a = p.parse_args(argv)
    logging.basicConfig(level=a.log_level.upper(), stream=sys.stderr)
    server = UfmServer(user=os.environ.get("LAB_UFM_USER", DEFAULT_USER),
                       password=os.environ.get("LAB_UFM_PASSWORD", DEFAULT_PASSWORD),
                       token=os.environ.get("LAB_UFM_TOKEN") or None)
    if a.fleet:
        server.fabric.seed(fleet_seed(Path(a.fleet)))
    asyncio.run(serve(a.host, a.port, a.ready_file, server, lab_tls.server_context(a)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
