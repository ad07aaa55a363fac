"""The lab's Redfish BMCs: ``python -m lab.redfish --port 0 --ready-file F (--servers-file F | --count N)``.

One process emulates N HGX-class GPU servers, each with its own BMC: its own loopback port serving Redfish
(DMTF schema shapes, as the real ``sushy`` client reads them) with its own sessions, inventory and logs, plus one
admin port. With ``--tls-cert F --tls-key F`` (a certificate from the lab CA, lab/tls.py) every BMC answers HTTPS,
as real BMCs do; plain HTTP is the default. The admin port always answers plain HTTP. sushy-tools
(``lab/sushy.py``) is the real third-party Redfish server for power and boot; it has no processors, firmware
inventory, BIOS, logs or sessions, which is what this emulator adds.

Per server, under ``<bmc url>/redfish/v1`` (the bmc url is what ``sushy.Sushy(url, ...)`` takes):

* ``/`` (anonymous) ServiceRoot with Systems, Managers, Chassis, UpdateService, SessionService and
  ``Links.Sessions``; ``/redfish`` (anonymous) the version document.
* ``Systems/1``: PowerState (``On``, ``Off``, ``PoweringOn``, ``PoweringOff``), Boot (override target/enabled/mode
  and their AllowableValues; PATCH ``{"Boot": {...}}``), Status with HealthRollup (the worst SEL severity), BiosVersion,
  ProcessorSummary, MemorySummary, BootProgress, ``Actions/ComputerSystem.Reset`` (On, ForceOn, ForceOff,
  GracefulShutdown, GracefulRestart, ForceRestart, PowerCycle, PushPowerButton (toggles), Nmi (no power change)).
  Power changes land ``power_delay`` seconds later (restarts and PowerCycle: Off after one delay, On after another;
  a reset that changes nothing is accepted and does nothing). Each power-on is a boot: it consumes a ``Once``
  override (which then reads ``Disabled``/``None``), records ``booted_from`` (the override target, else ``Hdd``),
  increments ``boot_count`` and applies pending BIOS settings.
* ``Systems/1/Processors``: ``CPU_0``, ``CPU_1`` and ``GPU_SXM_1``.. (ProcessorType ``GPU``, Model, SerialNumber,
  UUID, FirmwareVersion).
* ``Systems/1/Bios`` (Attributes; ``@Redfish.Settings`` -> ``Bios/Settings``, PATCHed attributes apply at next boot).
* ``Systems/1/LogServices/SEL`` with ``Entries`` (LogEntry: Id, Created, EntryType SEL, Severity OK/Warning/Critical,
  Message, MessageId) and ``Actions/LogService.ClearLog``.
* ``UpdateService`` with ``FirmwareInventory/<key>`` (Id = the spec's firmware key: BMC, BIOS, GPU0.., NVSwitch0..).
* ``SessionService/Sessions``: POST ``{"UserName", "Password"}`` -> 201 with ``X-Auth-Token`` and ``Location``;
  DELETE logs out; at most ``max_sessions`` per BMC (then 503 SessionLimitExceeded); idle sessions expire after
  ``session_timeout``. Everything else needs HTTP Basic or a session token (401 otherwise).
* errors are Redfish error bodies: ``{"error": {"code": "Base.1.15.GeneralError", "message": ...,
  "@Message.ExtendedInfo": [{"MessageId": "Base.1.15.<Id>", "Message", "Severity", "Resolution"}]}}``.

Server spec (JSON, ``--servers-file`` holds a list or ``{"servers": [...]}``): ``{"name", "gpus": 8,
"gpu_model": "NVIDIA H200", "serial", "uuid", "firmware": {...}, "power": "Off", "bios": {...}, "manufacturer",
"model", "gpu_serials": [...], "gpu_uuids": [...], "port": 0}``; missing keys get defaults (``normalize_spec``;
identifiers derive from the name, so a server keeps them across restarts).

Admin API on the admin port (``BmcAdmin``): ``GET /_lab/servers[?fields=a,b]`` -> ``{"servers": {name: view}}``,
``GET /_lab/servers/{name}`` -> view, where a view is ``{"name", "url", "power": "On"|"Off", "power_state",
"booted_from": "Pxe"|"Hdd"|null, "boot_count", "last_boot", "boot_override": {"target", "enabled", "mode"},
"gpu_faults", "sel": [LogEntry...], "down_until": float|null, "sessions", "requests", "resets", "firmware", "bios",
"spec"}``; ``POST /_lab/servers/{name}/sel`` ``{"severity", "message", "message_id", "at": "now"|"next_boot",
"delay": s}`` appends an SEL entry now (returned) or arms one for ``delay`` s after now / after the next power-on;
``POST /_lab/servers/{name}/outage`` ``{"seconds": 5, "mode": "503"|"drop"}``; ``PUT /_lab/servers/{name}/gpu-faults``
(an opaque dict for lab/hosts.py); ``POST /_lab/servers/{name}/power`` ``{"state": "On"|"Off"}`` (lab side,
immediate); ``PUT /_lab/servers/{name}/firmware`` ``{key: version}``; ``GET``/``PUT /_lab/config``
``{"power_delay", "request_delay", "max_sessions", "session_timeout"}``; ``POST /_lab/reset`` (every server back to
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
import uuid as _uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from aiohttp import web

from lab import faults as lab_faults
from lab import tls as lab_tls
from lab.faults import AuditLog, FaultFront, FaultTable, drop
from lab.k8s.process import ChildProcess
from lab.loopback import AdminClient, announce_and_wait

log = logging.getLogger("lab.redfish")

ROOT = "/redfish/v1"
SYSTEM = f"{ROOT}/Systems/1"
BASE = "Base.1.15"
DEFAULT_USER = "admin"
DEFAULT_PASSWORD = "0penBmc"
DEFAULT_GPU_MODEL = "NVIDIA H200"
DEFAULT_CONFIG = {"power_delay": 0.2, "request_delay": 0.0, "max_sessions": 4, "session_timeout": 1800.0}
DEFAULT_FIRMWARE = {
    "BMC": "24.09", "BIOS": "1.8.2", "CPLD": "0.2.1.9",
    **{f"GPU{i}": "96.00.A5.00.01" for i in range(8)},
    **{f"NVSwitch{i}": "96.10.6D.00.01" for i in range(4)},
}
DEFAULT_BIOS = {
    "BootMode": "UEFI", "ProcessorHyperThreading": "Enabled", "IntelVTforDirectedIO": "Enabled",
    "SRIOVSupport": "Enabled", "Above4GDecoding": "Enabled", "ReBarSupport": "Enabled", "ACSControl": "Disabled",
    "NUMANodesPerSocket": "1", "PowerPerformanceTuning": "OS Controls EPB", "SecureBoot": "Disabled",
    "IPv4PXESupport": "Enabled", "PXEBootRetries": 3,
}
RESET_TYPES = ("On", "ForceOn", "ForceOff", "GracefulShutdown", "GracefulRestart", "ForceRestart", "PowerCycle",
               "PushPowerButton", "Nmi")
BOOT_TARGETS = ("None", "Pxe", "Hdd", "Cd", "Usb", "BiosSetup", "UefiHttp", "UefiShell")
BOOT_ENABLED = ("Disabled", "Once", "Continuous")
BOOT_MODES = ("UEFI", "Legacy")
SEVERITIES = ("OK", "Warning", "Critical")
SEL_MAX = 1000
PUBLIC_GETS = ("/redfish", ROOT, f"{ROOT}/odata")


def _derived_uuid(*parts: str) -> str:
    return str(_uuid.uuid5(_uuid.NAMESPACE_URL, "millwright-lab/" + "/".join(parts)))


def _derived_hex(*parts: str) -> str:
    return _derived_uuid(*parts).replace("-", "").upper()


def normalize_spec(spec: dict | str, index: int = 0) -> dict:
    """A server spec with every default filled in (identifiers derive from the name)."""
    s = {"name": spec} if isinstance(spec, str) else dict(spec)
    name = s.setdefault("name", f"gpu-node-{index + 1:03d}")
    gpus = int(s.setdefault("gpus", 8))
    s.setdefault("gpu_model", DEFAULT_GPU_MODEL)
    s.setdefault("manufacturer", "Supermicro")
    s.setdefault("model", "SYS-821GE-TNHR")
    s.setdefault("serial", "S" + _derived_hex(name, "serial")[:11])
    s.setdefault("uuid", _derived_uuid(name, "system"))
    s.setdefault("power", "Off")
    if s["power"] not in ("On", "Off"):
        raise ValueError(f"server {name}: power must be On or Off, not {s['power']!r}")
    s.setdefault("port", 0)
    fw = {k: v for k, v in DEFAULT_FIRMWARE.items() if not k.startswith("GPU") or int(k[3:]) < gpus}
    s["firmware"] = {**fw, **(s.get("firmware") or {})}
    s["bios"] = {**DEFAULT_BIOS, **(s.get("bios") or {})}
    s.setdefault("gpu_serials", [f"{1650000000000 + int(_derived_uuid(name, 'gpu', str(i))[:8], 16) % 10**9}"
                                 for i in range(gpus)])
    s.setdefault("gpu_uuids", [_derived_uuid(name, "gpu", str(i)) for i in range(gpus)])
    return s


def fleet_servers(fleet: Any) -> list[dict]:
    """Server specs for a lab Fleet's nodes (name and GPU count)."""
    return [normalize_spec({"name": n.name, "gpus": n.gpus}, i) for i, n in enumerate(fleet.node_specs())]


def _now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


class RedfishError(Exception):
    """An answer in the Redfish error shape."""

    def __init__(self, status: int, message_id: str, message: str, resolution: str = "None.",
                 headers: dict | None = None) -> None:
        super().__init__(message)
        self.status, self.message_id, self.message = status, message_id, message
        self.resolution, self.headers = resolution, headers

    def response(self) -> web.Response:
        info = {"@odata.type": "#Message.v1_1_1.Message", "MessageId": f"{BASE}.{self.message_id}",
                "Message": self.message, "MessageArgs": [], "MessageSeverity": "Critical", "Severity": "Critical",
                "Resolution": self.resolution}
        body = {"error": {"code": f"{BASE}.GeneralError", "message": self.message,
                          "@Message.ExtendedInfo": [info]}}
        return web.json_response(body, status=self.status, headers=self.headers)


def _not_found(path: str) -> RedfishError:
    return RedfishError(404, "ResourceMissingAtURI", f"The resource at the URI '{path}' was not found.",
                        "Place a valid resource at the URI or correct the URI and resubmit the request.")


def _bad_value(prop: str, value: Any) -> RedfishError:
    return RedfishError(400, "PropertyValueNotInList",
                        f"The value '{value}' for the property {prop} is not in the list of acceptable values.",
                        "Choose a value from the enumeration list that the implementation can support and "
                        "resubmit the request if the operation failed.")


def _collection(oid: str, kind: str, name: str, members: list[str]) -> dict:
    return {"@odata.id": oid, "@odata.type": f"#{kind}.{kind}", "Name": name,
            "Members@odata.count": len(members), "Members": [{"@odata.id": m} for m in members]}


class Bmc:
    """One emulated server and its BMC."""

    def __init__(self, spec: dict, lab: "BmcLab") -> None:
        self.spec, self.lab = spec, lab
        self.name: str = spec["name"]
        self.port = 0
        self.url = ""
        self.timers: list[asyncio.TimerHandle] = []
        self.power_timer: asyncio.TimerHandle | None = None
        self.sel_seq = 0
        self._processors: dict[str, dict] | None = None
        self.restore()

    def restore(self) -> None:
        """Back to the spec: power, override, logs, sessions, faults, counters."""
        for t in self.timers:
            t.cancel()
        self.timers = []
        self._cancel_power()
        self.power: str = self.spec["power"]
        self.transition: str | None = None
        self.override = {"target": "None", "enabled": "Disabled", "mode": "UEFI"}
        self.booted_from: str | None = "Hdd" if self.power == "On" else None
        self.boot_count = 0
        self.last_boot: float | None = None
        self.firmware = dict(self.spec["firmware"])
        self.bios = dict(self.spec["bios"])
        self.bios_pending: dict = {}
        self.sel: list[dict] = []
        self.armed: list[dict] = []
        self.gpu_faults: dict = {}
        self.down_until: float | None = None
        self.down_mode = "503"
        self.sessions: dict[str, dict] = {}  # token -> session
        self.session_seq = 0
        self.requests = 0
        self.resets = 0
        self._processors = None

    # ------------------------------------------------------------------ power
    def _cancel_power(self) -> None:
        if self.power_timer is not None:
            self.power_timer.cancel()
            self.power_timer = None

    def _later(self, transition: str, then) -> None:
        self.transition = transition
        self.power_timer = asyncio.get_running_loop().call_later(self.lab.config["power_delay"], then)

    def reset(self, reset_type: str) -> None:
        """A ComputerSystem.Reset: the change lands after power_delay (a restart after two)."""
        self.resets += 1
        if reset_type == "Nmi":
            return
        self._cancel_power()
        self.transition = None
        if reset_type == "PushPowerButton":  # the front-panel button toggles
            reset_type = "On" if self.power == "Off" else "GracefulShutdown"
        if reset_type in ("On", "ForceOn"):
            if self.power == "Off":
                self._later("PoweringOn", self.power_on)
        elif reset_type in ("ForceOff", "GracefulShutdown"):
            if self.power == "On":
                self._later("PoweringOff", self.power_off)
        elif self.power == "Off":  # restarts and PowerCycle of a server that is off: it comes on
            self._later("PoweringOn", self.power_on)
        else:
            self._later("PoweringOff", self._restart_off)

    def _restart_off(self) -> None:
        self.power_off()
        self._later("PoweringOn", self.power_on)

    def power_on(self) -> None:
        """The server powers on and boots: a Once override is consumed, pending BIOS settings apply."""
        self._cancel_power()
        self.power, self.transition = "On", None
        ov = self.override
        self.booted_from = ov["target"] if ov["enabled"] != "Disabled" and ov["target"] != "None" else "Hdd"
        if ov["enabled"] == "Once":
            self.override = {**ov, "target": "None", "enabled": "Disabled"}
        self.boot_count += 1
        self.last_boot = time.time()
        if self.bios_pending:
            self.bios.update(self.bios_pending)
            self.bios_pending = {}
        armed, self.armed = self.armed, []
        for a in armed:
            self.schedule_sel(a, float(a.get("delay") or 0))

    def power_off(self) -> None:
        self._cancel_power()
        self.power, self.transition = "Off", None

    @property
    def power_state(self) -> str:
        return self.transition or self.power

    # ------------------------------------------------------------------ SEL
    def add_sel(self, body: dict) -> dict:
        severity = body.get("severity", "Critical")
        if severity not in SEVERITIES:
            raise ValueError(f"severity must be one of {SEVERITIES}")
        self.sel_seq += 1
        entry = {"@odata.id": f"{SYSTEM}/LogServices/SEL/Entries/{self.sel_seq}",
                 "@odata.type": "#LogEntry.v1_15_0.LogEntry", "Id": str(self.sel_seq),
                 "Name": "System Event Log Entry", "Created": _now_iso(), "EntryType": "SEL", "Severity": severity,
                 "Message": str(body.get("message") or f"{severity} event"),
                 "MessageId": str(body.get("message_id") or "OpenBMC.0.4.SELEntryAdded"),
                 "MessageArgs": list(body.get("message_args") or []), "EntryCode": "Assert"}
        if body.get("sensor_type"):
            entry["SensorType"] = body["sensor_type"]
        self.sel.append(entry)
        if len(self.sel) > SEL_MAX:
            del self.sel[0]
        return entry

    def schedule_sel(self, body: dict, delay: float) -> None:
        self.timers = [t for t in self.timers if not t.cancelled() and t.when() > asyncio.get_running_loop().time()]
        self.timers.append(asyncio.get_running_loop().call_later(delay, self.add_sel, body))

    def health(self) -> str:
        worst = 0
        for e in self.sel:
            worst = max(worst, SEVERITIES.index(e["Severity"]))
        return SEVERITIES[worst]

    # ------------------------------------------------------------------ sessions
    def session_for(self, token: str) -> dict | None:
        s = self.sessions.get(token)
        if s is None:
            return None
        now = time.monotonic()
        if now - s["last"] > self.lab.config["session_timeout"]:
            del self.sessions[token]
            return None
        s["last"] = now
        return s

    def create_session(self, body: Any) -> web.Response:
        if not isinstance(body, dict) or "UserName" not in body or "Password" not in body:
            raise RedfishError(400, "PropertyMissing", "The property UserName or Password is a required property "
                               "and must be included in the request.")
        if not self.lab.credentials_ok(str(body["UserName"]), str(body["Password"])):
            raise RedfishError(401, "ResourceAtUriUnauthorized",
                               f"While accessing the resource at {ROOT}/SessionService/Sessions, the service "
                               "received an authorization error 'invalid credentials'.")
        for tok in list(self.sessions):
            self.session_for(tok)  # drop the expired ones
        if len(self.sessions) >= int(self.lab.config["max_sessions"]):
            raise RedfishError(503, "SessionLimitExceeded",
                               "The session establishment failed due to the number of simultaneous sessions "
                               "exceeding the limit of the implementation.",
                               "Reduce the number of other sessions before trying to establish the session or "
                               "increase the limit of simultaneous sessions (if supported).")
        self.session_seq += 1
        token = secrets.token_hex(16)
        sid = f"{self.session_seq}{secrets.token_hex(4)}"
        self.sessions[token] = {"id": sid, "user": body["UserName"], "created": _now_iso(), "last": time.monotonic()}
        oid = f"{ROOT}/SessionService/Sessions/{sid}"
        return web.json_response(self._session_body(self.sessions[token]), status=201,
                                 headers={"X-Auth-Token": token, "Location": oid})

    @staticmethod
    def _session_body(s: dict) -> dict:
        return {"@odata.id": f"{ROOT}/SessionService/Sessions/{s['id']}", "@odata.type": "#Session.v1_6_0.Session",
                "Id": s["id"], "Name": "User Session", "UserName": s["user"], "CreatedTime": s["created"]}

    def delete_session(self, sid: str, path: str) -> None:
        for tok, s in self.sessions.items():
            if s["id"] == sid:
                del self.sessions[tok]
                return
        raise _not_found(path)

    # ------------------------------------------------------------------ resources
    def processors(self) -> dict[str, dict]:
        if self._processors is None:
            sp = self.spec
            procs: dict[str, dict] = {}
            for i in range(2):
                procs[f"CPU_{i}"] = {
                    "ProcessorType": "CPU", "Socket": f"CPU{i}", "Manufacturer": "Intel(R) Corporation",
                    "Model": "Intel(R) Xeon(R) Platinum 8480+", "ProcessorArchitecture": "x86",
                    "InstructionSet": "x86-64", "MaxSpeedMHz": 3800, "TotalCores": 56, "TotalThreads": 112,
                    "SerialNumber": _derived_hex(self.name, "cpu", str(i))[:16]}
            for i in range(int(sp["gpus"])):
                procs[f"GPU_SXM_{i + 1}"] = {
                    "ProcessorType": "GPU", "Socket": f"SXM{i + 1}", "Manufacturer": "NVIDIA",
                    "Model": sp["gpu_model"], "MaxSpeedMHz": 1980, "SerialNumber": sp["gpu_serials"][i],
                    "UUID": sp["gpu_uuids"][i], "FirmwareVersion": self.firmware.get(f"GPU{i}"),
                    "Location": {"PartLocation": {"ServiceLabel": f"SXM{i + 1}", "LocationType": "Slot"}}}
            for pid, p in procs.items():
                p.update({"@odata.id": f"{SYSTEM}/Processors/{pid}", "@odata.type": "#Processor.v1_18_0.Processor",
                          "Id": pid, "Name": "Processor" if p["ProcessorType"] == "CPU" else "GPU",
                          "Status": {"State": "Enabled", "Health": "OK"}})
            self._processors = procs
        return self._processors

    def system(self) -> dict:
        sp, h = self.spec, self.health()
        return {
            "@odata.id": SYSTEM, "@odata.type": "#ComputerSystem.v1_20_0.ComputerSystem", "Id": "1",
            "Name": "System", "HostName": self.name, "SystemType": "Physical", "Manufacturer": sp["manufacturer"],
            "Model": sp["model"], "SerialNumber": sp["serial"], "UUID": sp["uuid"], "PartNumber": sp["model"],
            "BiosVersion": self.firmware.get("BIOS"), "PowerState": self.power_state,
            "Status": {"State": "Enabled", "Health": h, "HealthRollup": h},
            "Boot": {"BootSourceOverrideTarget": self.override["target"],
                     "BootSourceOverrideEnabled": self.override["enabled"],
                     "BootSourceOverrideMode": self.override["mode"],
                     "BootSourceOverrideTarget@Redfish.AllowableValues": list(BOOT_TARGETS),
                     "BootSourceOverrideEnabled@Redfish.AllowableValues": list(BOOT_ENABLED),
                     "BootSourceOverrideMode@Redfish.AllowableValues": list(BOOT_MODES)},
            "BootProgress": {"LastState": "OSRunning" if self.power == "On" and not self.transition else "None"},
            "ProcessorSummary": {"Count": 2, "Model": "Intel(R) Xeon(R) Platinum 8480+",
                                 "Status": {"State": "Enabled", "Health": "OK"}},
            "MemorySummary": {"TotalSystemMemoryGiB": 2048, "Status": {"State": "Enabled", "Health": "OK"}},
            "Processors": {"@odata.id": f"{SYSTEM}/Processors"}, "Bios": {"@odata.id": f"{SYSTEM}/Bios"},
            "LogServices": {"@odata.id": f"{SYSTEM}/LogServices"},
            "Links": {"Chassis": [{"@odata.id": f"{ROOT}/Chassis/1"}],
                      "ManagedBy": [{"@odata.id": f"{ROOT}/Managers/1"}]},
            "Actions": {"#ComputerSystem.Reset": {"target": f"{SYSTEM}/Actions/ComputerSystem.Reset",
                                                  "ResetType@Redfish.AllowableValues": list(RESET_TYPES)}},
        }

    def get(self, parts: list[str], path: str, query: dict) -> dict:
        """The resource at /redfish/v1/<parts> (GET)."""
        n = len(parts)
        if n == 0:
            return {"@odata.id": f"{ROOT}/", "@odata.type": "#ServiceRoot.v1_15_0.ServiceRoot", "Id": "RootService",
                    "Name": "Root Service", "RedfishVersion": "1.17.0", "UUID": _derived_uuid(self.name, "bmc"),
                    "Product": "Millwright lab BMC", "Vendor": "Millwright",
                    **{k: {"@odata.id": f"{ROOT}/{k}"} for k in ("Systems", "Managers", "Chassis", "UpdateService",
                                                                 "SessionService")},
                    "Links": {"Sessions": {"@odata.id": f"{ROOT}/SessionService/Sessions"}}}
        head = parts[0]
        if head == "odata" and n == 1:
            return {"value": [{"name": k, "kind": "Singleton", "url": f"{ROOT}/{k}"}
                              for k in ("Systems", "Managers", "Chassis", "UpdateService", "SessionService")]}
        if head == "Systems":
            if n == 1:
                return _collection(f"{ROOT}/Systems", "ComputerSystemCollection", "Computer System Collection",
                                   [SYSTEM])
            if parts[1] == "1":
                return self._get_system_part(parts[2:], path, query)
        if head == "Managers":
            if n == 1:
                return _collection(f"{ROOT}/Managers", "ManagerCollection", "Manager Collection",
                                   [f"{ROOT}/Managers/1"])
            if parts[1:] == ["1"]:
                return {"@odata.id": f"{ROOT}/Managers/1", "@odata.type": "#Manager.v1_17_0.Manager", "Id": "1",
                        "Name": "BMC", "ManagerType": "BMC", "FirmwareVersion": self.firmware.get("BMC"),
                        "Model": "AST2600", "Status": {"State": "Enabled", "Health": "OK"},
                        "Links": {"ManagerForServers": [{"@odata.id": SYSTEM}]}}
        if head == "Chassis":
            if n == 1:
                return _collection(f"{ROOT}/Chassis", "ChassisCollection", "Chassis Collection",
                                   [f"{ROOT}/Chassis/1"])
            if parts[1:] == ["1"]:
                return {"@odata.id": f"{ROOT}/Chassis/1", "@odata.type": "#Chassis.v1_23_0.Chassis", "Id": "1",
                        "Name": "Chassis", "ChassisType": "RackMount", "Manufacturer": self.spec["manufacturer"],
                        "Model": self.spec["model"], "SerialNumber": self.spec["serial"],
                        "PowerState": self.power_state, "Status": {"State": "Enabled", "Health": "OK"},
                        "Links": {"ComputerSystems": [{"@odata.id": SYSTEM}],
                                  "ManagedBy": [{"@odata.id": f"{ROOT}/Managers/1"}]}}
        if head == "UpdateService":
            us = f"{ROOT}/UpdateService"
            if n == 1:
                return {"@odata.id": us, "@odata.type": "#UpdateService.v1_11_0.UpdateService", "Id": "UpdateService",
                        "Name": "Update Service", "ServiceEnabled": True,
                        "Status": {"State": "Enabled", "Health": "OK"},
                        "FirmwareInventory": {"@odata.id": f"{us}/FirmwareInventory"},
                        "Actions": {"#UpdateService.SimpleUpdate": {
                            "target": f"{us}/Actions/UpdateService.SimpleUpdate",
                            "TransferProtocol@Redfish.AllowableValues": ["HTTP", "HTTPS"]}}}
            if parts[1] == "FirmwareInventory":
                if n == 2:
                    return _collection(f"{us}/FirmwareInventory", "SoftwareInventoryCollection",
                                       "Firmware Inventory Collection",
                                       [f"{us}/FirmwareInventory/{k}" for k in self.firmware])
                if n == 3 and parts[2] in self.firmware:
                    k = parts[2]
                    maker = "NVIDIA" if k.startswith(("GPU", "NVSwitch")) else self.spec["manufacturer"]
                    return {"@odata.id": f"{us}/FirmwareInventory/{k}",
                            "@odata.type": "#SoftwareInventory.v1_9_0.SoftwareInventory", "Id": k,
                            "Name": f"{k} Firmware", "Version": self.firmware[k], "Updateable": True,
                            "Manufacturer": maker,
                            "SoftwareId": k, "Status": {"State": "Enabled", "Health": "OK"}}
        if head == "SessionService":
            ss = f"{ROOT}/SessionService"
            if n == 1:
                return {"@odata.id": ss, "@odata.type": "#SessionService.v1_1_8.SessionService",
                        "Id": "SessionService", "Name": "Session Service", "ServiceEnabled": True,
                        "SessionTimeout": int(self.lab.config["session_timeout"]),
                        "Sessions": {"@odata.id": f"{ss}/Sessions"}}
            if parts[1] == "Sessions":
                by_id = {s["id"]: s for s in self.sessions.values()}
                if n == 2:
                    return _collection(f"{ss}/Sessions", "SessionCollection", "Session Collection",
                                       [f"{ss}/Sessions/{i}" for i in by_id])
                if n == 3 and parts[2] in by_id:
                    return self._session_body(by_id[parts[2]])
        raise _not_found(path)

    def _get_system_part(self, rest: list[str], path: str, query: dict) -> dict:
        if not rest:
            return self.system()
        head, n = rest[0], len(rest)
        if head == "Processors":
            procs = self.processors()
            if n == 1:
                return _collection(f"{SYSTEM}/Processors", "ProcessorCollection", "Processors Collection",
                                   [p["@odata.id"] for p in procs.values()])
            if n == 2 and rest[1] in procs:
                return procs[rest[1]]
        if head == "Bios":
            if n == 1:
                return {"@odata.id": f"{SYSTEM}/Bios", "@odata.type": "#Bios.v1_2_0.Bios", "Id": "BIOS",
                        "Name": "BIOS Configuration", "AttributeRegistry": "BiosAttributeRegistry.v1_0_0",
                        "Attributes": dict(self.bios),
                        "@Redfish.Settings": {"@odata.type": "#Settings.v1_3_5.Settings",
                                              "SettingsObject": {"@odata.id": f"{SYSTEM}/Bios/Settings"},
                                              "SupportedApplyTimes": ["OnReset"]}}
            if rest[1:] == ["Settings"]:
                return {"@odata.id": f"{SYSTEM}/Bios/Settings", "@odata.type": "#Bios.v1_2_0.Bios",
                        "Id": "Settings", "Name": "BIOS Pending Settings", "Attributes": dict(self.bios_pending)}
        if head == "LogServices":
            ls = f"{SYSTEM}/LogServices"
            if n == 1:
                return _collection(ls, "LogServiceCollection", "System Log Services", [f"{ls}/SEL"])
            if rest[1] == "SEL":
                if n == 2:
                    return {"@odata.id": f"{ls}/SEL", "@odata.type": "#LogService.v1_5_0.LogService", "Id": "SEL",
                            "Name": "System Event Log", "LogEntryType": "SEL", "MaxNumberOfRecords": SEL_MAX,
                            "OverWritePolicy": "WrapsWhenFull", "ServiceEnabled": True,
                            "DateTime": _now_iso(), "Status": {"State": "Enabled", "Health": "OK"},
                            "Entries": {"@odata.id": f"{ls}/SEL/Entries"},
                            "Actions": {"#LogService.ClearLog": {
                                "target": f"{ls}/SEL/Actions/LogService.ClearLog"}}}
                if rest[2:] == ["Entries"]:
                    skip, top = int(query.get("$skip", 0)), query.get("$top")
                    entries = self.sel[skip:skip + int(top)] if top is not None else self.sel[skip:]
                    return {"@odata.id": f"{ls}/SEL/Entries", "@odata.type": "#LogEntryCollection.LogEntryCollection",
                            "Name": "System Event Log Entries", "Members@odata.count": len(self.sel),
                            "Members": entries}
                if n == 4 and rest[2] == "Entries":
                    for e in self.sel:
                        if e["Id"] == rest[3]:
                            return e
        raise _not_found(path)

    def write(self, method: str, parts: list[str], path: str, body: Any) -> web.Response:
        """POST / PATCH / DELETE on /redfish/v1/<parts>."""
        if method == "POST" and parts == ["Systems", "1", "Actions", "ComputerSystem.Reset"]:
            rtype = body.get("ResetType") if isinstance(body, dict) else None
            if rtype is None:
                raise RedfishError(400, "ActionParameterMissing", "The action ComputerSystem.Reset requires the "
                                   "parameter ResetType to be present in the request body.")
            if rtype not in RESET_TYPES:
                raise RedfishError(400, "ActionParameterValueNotInList", f"The value '{rtype}' for the parameter "
                                   "ResetType in the action ComputerSystem.Reset is not in the list of acceptable "
                                   "values.")
            self.reset(rtype)
            return web.Response(status=204)
        if method == "PATCH" and parts == ["Systems", "1"]:
            self._patch_boot(body)
            return web.Response(status=204)
        if method == "PATCH" and parts == ["Systems", "1", "Bios", "Settings"]:
            attrs = body.get("Attributes") if isinstance(body, dict) else None
            if not isinstance(attrs, dict):
                raise RedfishError(400, "PropertyMissing", "The property Attributes is a required property and "
                                   "must be included in the request.")
            unknown = [k for k in attrs if k not in self.bios]
            if unknown:
                raise RedfishError(400, "PropertyUnknown", f"The property {unknown[0]} is not in the list of valid "
                                   "properties for the resource.")
            self.bios_pending.update(attrs)
            return web.Response(status=204)
        if method == "POST" and parts == ["Systems", "1", "LogServices", "SEL", "Actions", "LogService.ClearLog"]:
            self.sel.clear()
            return web.Response(status=204)
        if method == "POST" and parts == ["SessionService", "Sessions"]:
            return self.create_session(body)
        if method == "DELETE" and parts[:2] == ["SessionService", "Sessions"] and len(parts) == 3:
            self.delete_session(parts[2], path)
            return web.Response(status=204)
        if method == "POST" and parts == ["UpdateService", "Actions", "UpdateService.SimpleUpdate"]:
            raise RedfishError(400, "ActionNotSupported", "The action UpdateService.SimpleUpdate is not supported "
                               "by the resource (lab BMC: use PUT /_lab/servers/{name}/firmware).")
        self.get(parts, path, {})  # 404 for an unknown resource, else the method is the problem
        raise RedfishError(405, "OperationNotAllowed", f"The HTTP method {method} is not allowed on {path}.")

    def _patch_boot(self, body: Any) -> None:
        if not isinstance(body, dict) or not body:
            raise RedfishError(400, "MalformedJSON", "The request body submitted was malformed JSON and could not "
                               "be parsed by the receiving service.")
        for key in body:
            if key != "Boot":
                raise RedfishError(400, "PropertyNotWritable", f"The property {key} is a read only property and "
                                   "cannot be assigned a value.")
        boot = body["Boot"]
        if not isinstance(boot, dict):
            raise _bad_value("Boot", boot)
        new = dict(self.override)
        for prop, key, allowed in (("BootSourceOverrideTarget", "target", BOOT_TARGETS),
                                   ("BootSourceOverrideEnabled", "enabled", BOOT_ENABLED),
                                   ("BootSourceOverrideMode", "mode", BOOT_MODES)):
            if prop in boot:
                if boot[prop] not in allowed:
                    raise _bad_value(prop, boot[prop])
                new[key] = boot[prop]
        for prop in boot:
            if prop not in ("BootSourceOverrideTarget", "BootSourceOverrideEnabled", "BootSourceOverrideMode"):
                raise RedfishError(400, "PropertyUnknown", f"The property {prop} is not in the list of valid "
                                   "properties for the resource.")
        self.override = new

    def view(self) -> dict:
        return {"name": self.name, "url": self.url, "power": self.power, "power_state": self.power_state,
                "booted_from": self.booted_from, "boot_count": self.boot_count, "last_boot": self.last_boot,
                "boot_override": dict(self.override), "gpu_faults": self.gpu_faults, "sel": self.sel,
                "down_until": self.down_until, "sessions": len(self.sessions), "requests": self.requests,
                "resets": self.resets, "firmware": self.firmware, "bios": self.bios, "spec": self.spec}


class BmcLab:
    """All the emulated BMCs, the admin API, faults and the audit log, in one aiohttp application."""

    def __init__(self, specs: list[dict | str], user: str = DEFAULT_USER, password: str = DEFAULT_PASSWORD,
                 config: dict | None = None) -> None:
        self.user, self.password = user, password
        self._basic = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        self.base_config = {**DEFAULT_CONFIG, **(config or {})}
        self.config = dict(self.base_config)
        self.servers: dict[str, Bmc] = {}
        for i, s in enumerate(specs):
            spec = normalize_spec(s, i)
            if spec["name"] in self.servers:
                raise ValueError(f"duplicate server name {spec['name']!r}")
            self.servers[spec["name"]] = Bmc(spec, self)
        self.by_port: dict[int, Bmc] = {}
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
        entry: dict[str, Any] = {"time": time.time(), "server": bmc.name, "method": method, "path": path,
                                 "write": write}
        if bmc.down_until is not None:
            left = bmc.down_until - time.time()
            if left > 0:
                if bmc.down_mode == "drop":
                    entry["status"] = 0
                    self.audit.add(entry)
                    return drop(request)
                err = RedfishError(503, "ServiceTemporarilyUnavailable", f"The service is temporarily unavailable. "
                                   f"Retry in {int(left) + 1} seconds.", "Wait for the indicated retry duration "
                                   "and retry the operation.", headers={"Retry-After": str(int(left) + 1)})
                entry["status"] = 503
                self.audit.add(entry)
                return err.response()
            bmc.down_until = None
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
            return RedfishError(status, "InternalError" if status >= 500 else "GeneralError",
                                f["action"].get("message") or "Injected fault.").response()

        return await self.front.handle(request, entry, fault, serve, refuse)

    async def _redfish(self, bmc: Bmc, request: web.Request, method: str, path: str, entry: dict) -> web.Response:
        if not (path == "/redfish" or path == ROOT or path.startswith(ROOT + "/")):
            raise _not_found(request.path)
        if method == "GET" and path == "/redfish":
            return web.json_response({"v1": f"{ROOT}/"})
        parts = path[len(ROOT) + 1:].split("/") if path != ROOT else []
        login = method == "POST" and parts == ["SessionService", "Sessions"]
        if method == "GET" and path in PUBLIC_GETS or login:
            entry["auth"] = None
        else:
            entry["auth"] = self._authenticate(bmc, request)
            if entry["auth"] is None:
                raise RedfishError(401, "NoValidSession", "There is no valid session established with the "
                                   "implementation.", "Establish a session before retrying the operation.",
                                   headers={"WWW-Authenticate": 'Basic realm="Redfish"'})
        if method == "GET":
            return web.json_response(bmc.get(parts, request.path, dict(request.query)))
        body: Any = None
        if request.can_read_body:
            try:
                body = await request.json()
            except (json.JSONDecodeError, UnicodeDecodeError):
                raise RedfishError(400, "MalformedJSON", "The request body submitted was malformed JSON and could "
                                   "not be parsed by the receiving service.")
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
            self.faults.clear()
            self.audit.clear()
            self.config = dict(self.base_config)
            return ok
        if p == ["config"] and m in ("GET", "PUT"):
            for k, v in (body or {}).items():
                if k not in DEFAULT_CONFIG:
                    raise ValueError(f"unknown config key {k!r}; known: {sorted(DEFAULT_CONFIG)}")
                if not isinstance(v, (int, float)) or v < 0:
                    raise ValueError(f"{k} must be a number >= 0")
                self.config[k] = v
            return web.json_response(self.config)
        if p and p[0] == "servers":
            return self._admin_server(m, p[1:], body, request.query)
        return web.json_response({"error": f"no admin route {m} {path}"}, status=404)

    def _admin_server(self, m: str, p: list[str], body: Any, query: Any) -> web.Response:
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
            if mode not in ("503", "drop"):
                raise ValueError("mode must be '503' or 'drop'")
            bmc.down_mode = mode
            bmc.down_until = time.time() + float(body.get("seconds", 5))
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
            bmc.firmware.update({str(k): str(v) for k, v in body.items()})
            bmc._processors = None
            return web.json_response(bmc.firmware)
        return web.json_response({"error": f"no admin route {m} /_lab/servers/{'/'.join(p)}"}, status=404)


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
    for bmc in lab.servers.values():
        site = web.TCPSite(runner, host, int(bmc.spec.get("port") or 0), ssl_context=ssl_context)
        await site.start()
        bmc.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        bmc.url = f"{scheme}://{host}:{bmc.port}"
        lab.by_port[bmc.port] = bmc
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

    def __init__(self, *, servers: list[dict | str] | None = None, count: int = 4, prefix: str = "gpu-node-",
                 user: str = DEFAULT_USER, password: str = DEFAULT_PASSWORD, power_delay: float | None = None,
                 max_sessions: int | None = None, tls: lab_tls.ServerCert | None = None, **kw: Any) -> None:
        super().__init__(**kw)
        self.tls = tls  # the BMCs answer HTTPS with this certificate (lab/tls.py); the admin port stays HTTP
        self.specs = [normalize_spec(s, i) for i, s in enumerate(
            servers if servers is not None else [f"{prefix}{i:03d}" for i in range(1, count + 1)])]
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

    async def add_sel(self, name: str, severity: str = "Critical", message: str | None = None,
                      message_id: str | None = None, *, at: str = "now", delay: float = 0.0, **extra: Any) -> dict:
        """An SEL entry now (returned), or armed for `delay` s after now or after the next power-on (at='next_boot')."""
        body = {"severity": severity, "message": message, "message_id": message_id, "at": at, "delay": delay, **extra}
        return await self._req("POST", f"/_lab/servers/{name}/sel", json=body)

    async def outage(self, name: str, seconds: float, mode: str = "503") -> float:
        """The BMC answers 503 (mode '503') or drops connections (mode 'drop') for `seconds`."""
        return (await self._req("POST", f"/_lab/servers/{name}/outage",
                                json={"seconds": seconds, "mode": mode}))["down_until"]

    async def set_gpu_faults(self, name: str, faults: dict) -> dict:
        return await self._req("PUT", f"/_lab/servers/{name}/gpu-faults", json=faults)

    async def power(self, name: str, state: str) -> dict:
        """Lab-side power (an operator at the rack): immediate, no delay; On is a boot."""
        return await self._req("POST", f"/_lab/servers/{name}/power", json={"state": state})

    async def set_firmware(self, name: str, versions: dict[str, str]) -> dict:
        return await self._req("PUT", f"/_lab/servers/{name}/firmware", json=versions)

    async def config(self, **changes: float) -> dict:
        """Read (no arguments) or change power_delay, request_delay, max_sessions, session_timeout."""
        return await self._req("PUT", "/_lab/config", json=changes)

    async def faults(self) -> list[dict]:
        return (await self._req("GET", "/_lab/faults"))["faults"]

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
    lab = BmcLab(specs, user=os.environ.get("LAB_BMC_USER", DEFAULT_USER),
                 password=os.environ.get("LAB_BMC_PASSWORD", DEFAULT_PASSWORD),
                 config={"power_delay": a.power_delay, "max_sessions": a.max_sessions})
    asyncio.run(serve(a.host, a.port, a.ready_file, lab, lab_tls.server_context(a)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
