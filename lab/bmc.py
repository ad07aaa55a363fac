"""One emulated BMC (lab/redfish.py serves them): the server spec and its defaults, power and boot, the SEL,
sessions, and the Redfish documents it answers with, in the DMTF schema shapes the real ``sushy`` client reads.

Longer than 600 lines because `Bmc` is one server's state (power and its timers, the boot override, the SEL,
sessions) and every Redfish document it answers is drawn from or written to that state under one set of rules
(`get`/`write`); what stands alone, the server spec and the error and collection shapes, sits above it."""

from __future__ import annotations

import asyncio
import secrets
import time
import uuid as _uuid
from datetime import UTC, datetime
from typing import Any, Protocol

from aiohttp import web

from lab.bmc_trays import location, normalize_tray, nvswitches, tray_chassis, tray_chassis_ids
from lab.bmc_update import Updates
from lab.redfish_shapes import RedfishError, collection

ROOT = "/redfish/v1"
SYSTEM = f"{ROOT}/Systems/1"
DEFAULT_USER = "admin"
DEFAULT_PASSWORD = "0penBmc"
DEFAULT_GPU_MODEL = "NVIDIA H200"
EXPANDS = (".", ".($levels=1)")
SEL_ENTRIES = ["Systems", "1", "LogServices", "SEL", "Entries"]  # the one collection paged with $skip/$top
BUSY_RETRY_AFTER = 2  # seconds, in the Retry-After of a 503 for the session or request limit
DEFAULT_CONFIG = {
    "power_delay": 0.2,
    "request_delay": 0.0,
    "max_sessions": 4,
    "session_timeout": 1800.0,
    "update_seconds": 0.5,
    "bmc_restart_seconds": 1.0,
    "multipart_push": 1.0,  # 0: the UpdateService offers no MultipartHttpPushUri (SimpleUpdate only)
    "basic_auth": 1.0,  # 0: HTTP Basic refused (401), only X-Auth-Token sessions (a BMC with Basic turned off)
    "monitor_expires": 0.0,  # 1: an ended task's monitor answers 204, then 404 (OpenBMC bmcweb; lab/bmc_update.py)
}
DEFAULT_FIRMWARE = {
    "BMC": "24.09",
    "BIOS": "1.8.2",
    "CPLD": "0.2.1.9",
    **{f"GPU{i}": "96.00.A5.00.01" for i in range(8)},
    **{f"NVSwitch{i}": "96.10.6D.00.01" for i in range(4)},
}
DEFAULT_BIOS = {
    "BootMode": "UEFI",
    "ProcessorHyperThreading": "Enabled",
    "IntelVTforDirectedIO": "Enabled",
    "SRIOVSupport": "Enabled",
    "Above4GDecoding": "Enabled",
    "ReBarSupport": "Enabled",
    "ACSControl": "Disabled",
    "NUMANodesPerSocket": "1",
    "PowerPerformanceTuning": "OS Controls EPB",
    "SecureBoot": "Disabled",
    "IPv4PXESupport": "Enabled",
    "PXEBootRetries": 3,
}
RESET_TYPES = (
    "On",
    "ForceOn",
    "ForceOff",
    "GracefulShutdown",
    "GracefulRestart",
    "ForceRestart",
    "PowerCycle",
    "PushPowerButton",
    "Nmi",
)
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
    s: dict[str, Any] = {"name": spec} if isinstance(spec, str) else dict(spec)
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
    if s.get("tray") is not None:
        s["tray"] = normalize_tray(name, s["tray"])
    switches = nvswitches(s)
    fw = {
        k: v
        for k, v in DEFAULT_FIRMWARE.items()
        if not (k.startswith("GPU") and int(k[3:]) >= gpus)
        and not (k.startswith("NVSwitch") and int(k[8:]) >= switches)
    }
    s["firmware"] = {**fw, **(s.get("firmware") or {})}
    s["bios"] = {**DEFAULT_BIOS, **(s.get("bios") or {})}
    s.setdefault(
        "gpu_serials",
        [f"{1650000000000 + int(_derived_uuid(name, 'gpu', str(i))[:8], 16) % 10**9}" for i in range(gpus)],
    )
    s.setdefault("gpu_uuids", [_derived_uuid(name, "gpu", str(i)) for i in range(gpus)])
    return s


def fleet_servers(fleet: Any) -> list[dict]:
    """Server specs for a lab Fleet's nodes (name and GPU count)."""
    return [normalize_spec({"name": n.name, "gpus": n.gpus}, i) for i, n in enumerate(fleet.node_specs())]


def _now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def not_found(path: str) -> RedfishError:
    return RedfishError(
        404,
        "ResourceMissingAtURI",
        f"The resource at the URI '{path}' was not found.",
        "Place a valid resource at the URI or correct the URI and resubmit the request.",
    )


def check_query(parts: list[str], query: Any) -> None:
    """DSP0266's query parameter rules: a ``$`` parameter this resource does not support answers 501, a supported
    one with a bad value 400; any other parameter is ignored."""
    supported = {"$expand", "$skip", "$top"} if parts == SEL_ENTRIES else {"$expand"}
    unsupported = sorted(k for k in query if k.startswith("$") and k not in supported)
    if unsupported:
        raise RedfishError(
            501,
            "QueryParameterUnsupported",
            f"The query parameter '{unsupported[0]}' is not supported on this resource.",
            "Correct or remove the query parameter and resubmit the request.",
        )
    for k in sorted({"$skip", "$top"} & set(query)):
        if not query[k].isdigit():
            raise RedfishError(
                400,
                "QueryParameterValueFormatError",
                f"The value '{query[k]}' for the query parameter {k} is of a different format than it can accept.",
                "Correct the value for the query parameter in the request and resubmit the request.",
            )


def _bad_value(prop: str, value: Any) -> RedfishError:
    return RedfishError(
        400,
        "PropertyValueNotInList",
        f"The value '{value}' for the property {prop} is not in the list of acceptable values.",
        "Choose a value from the enumeration list that the implementation can support and "
        "resubmit the request if the operation failed.",
    )


class BmcHost(Protocol):
    """What a BMC asks of the lab that hosts it (lab/redfish.py `BmcLab`): its settings, the credentials and the
    catalogue of firmware images its updates fetch (lab/bmc_update.py)."""

    config: dict
    images: dict[str, dict]

    def credentials_ok(self, user: str, password: str) -> bool: ...


class Bmc:
    """One emulated server and its BMC."""

    def __init__(self, spec: dict, lab: BmcHost) -> None:
        self.spec, self.lab = spec, lab
        self.name: str = spec["name"]
        self.port = 0
        self.url = ""
        self.timers: list[asyncio.TimerHandle] = []
        self.power_timer: asyncio.TimerHandle | None = None
        self.sel_seq = 0
        self._processors: dict[str, dict] | None = None
        self.in_flight = 0  # requests being served now (the lab's request limit; a reset does not end them)
        self.updates = Updates(self)
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
        self.last_off: float | None = None
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
        self.updates.cancel()
        self.updates = Updates(self)

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
        self.updates.activate("reset")
        armed, self.armed = self.armed, []
        for a in armed:
            self.schedule_sel(a, float(a.get("delay") or 0))

    def power_off(self) -> None:
        self._cancel_power()
        if self.power != "Off":
            self.last_off = time.time()
        self.power, self.transition = "Off", None

    @property
    def power_state(self) -> str:
        return self.transition or self.power

    # ------------------------------------------------------------------ firmware
    def set_firmware(self, component: str, version: str) -> None:
        self.firmware[component] = version
        self._processors = None  # GPUs show their firmware version

    def restart_bmc(self, seconds: float) -> None:
        """The BMC reboots into new firmware: no answer for `seconds`, then its sessions and tasks are gone."""
        self.down_until, self.down_mode = time.time() + seconds, "drop"
        self.sessions.clear()
        self.updates.tasks.clear()

    # ------------------------------------------------------------------ SEL
    def add_sel(self, body: dict) -> dict:
        severity = body.get("severity", "Critical")
        if severity not in SEVERITIES:
            raise ValueError(f"severity must be one of {SEVERITIES}")
        self.sel_seq += 1
        entry = {
            "@odata.id": f"{SYSTEM}/LogServices/SEL/Entries/{self.sel_seq}",
            "@odata.type": "#LogEntry.v1_15_0.LogEntry",
            "Id": str(self.sel_seq),
            "Name": "System Event Log Entry",
            "Created": _now_iso(),
            "EntryType": "SEL",
            "Severity": severity,
            "Message": str(body.get("message") or f"{severity} event"),
            "MessageId": str(body.get("message_id") or "OpenBMC.0.4.SELEntryAdded"),
            "MessageArgs": list(body.get("message_args") or []),
            "EntryCode": "Assert",
        }
        if body.get("sensor_type"):
            entry["SensorType"] = body["sensor_type"]
        self.sel.append(entry)
        if len(self.sel) > SEL_MAX:
            del self.sel[0]
        return entry

    def schedule_sel(self, body: dict, delay: float) -> None:
        self.timers = [t for t in self.timers if not t.cancelled() and t.when() > asyncio.get_running_loop().time()]
        self.timers.append(asyncio.get_running_loop().call_later(delay, self.add_sel, body))

    def resolve_sel(self, entry_id: str) -> dict:
        """LogEntry ``Resolved`` (v1_8): the cause was repaired; the entry stays, the health no longer counts it."""
        for e in self.sel:
            if e["Id"] == entry_id:
                e["Resolved"] = True
                return e
        raise KeyError(f"SEL entry {entry_id} of {self.name}")

    def health(self) -> str:
        """The worst severity of the SEL's entries not resolved."""
        worst = 0
        for e in self.sel:
            if not e.get("Resolved"):
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
            raise RedfishError(
                400,
                "PropertyMissing",
                "The property UserName or Password is a required property and must be included in the request.",
            )
        if not self.lab.credentials_ok(str(body["UserName"]), str(body["Password"])):
            raise RedfishError(
                401,
                "ResourceAtUriUnauthorized",
                f"While accessing the resource at {ROOT}/SessionService/Sessions, the service "
                "received an authorization error 'invalid credentials'.",
            )
        for tok in list(self.sessions):
            self.session_for(tok)  # drop the expired ones
        if len(self.sessions) >= int(self.lab.config["max_sessions"]):
            raise RedfishError(
                503,
                "SessionLimitExceeded",
                "The session establishment failed due to the number of simultaneous sessions "
                "exceeding the limit of the implementation.",
                "Reduce the number of other sessions before trying to establish the session or "
                "increase the limit of simultaneous sessions (if supported).",
                headers={"Retry-After": str(BUSY_RETRY_AFTER)},
            )
        self.session_seq += 1
        token = secrets.token_hex(16)
        sid = f"{self.session_seq}{secrets.token_hex(4)}"
        self.sessions[token] = {"id": sid, "user": body["UserName"], "created": _now_iso(), "last": time.monotonic()}
        oid = f"{ROOT}/SessionService/Sessions/{sid}"
        return web.json_response(
            self._session_body(self.sessions[token]), status=201, headers={"X-Auth-Token": token, "Location": oid}
        )

    @staticmethod
    def _session_body(s: dict) -> dict:
        return {
            "@odata.id": f"{ROOT}/SessionService/Sessions/{s['id']}",
            "@odata.type": "#Session.v1_6_0.Session",
            "Id": s["id"],
            "Name": "User Session",
            "UserName": s["user"],
            "CreatedTime": s["created"],
        }

    def delete_session(self, sid: str, path: str) -> None:
        for tok, s in self.sessions.items():
            if s["id"] == sid:
                del self.sessions[tok]
                return
        raise not_found(path)

    # ------------------------------------------------------------------ resources
    def processors(self) -> dict[str, dict]:
        if self._processors is None:
            sp = self.spec
            procs: dict[str, dict] = {}
            for i in range(2):
                procs[f"CPU_{i}"] = {
                    "ProcessorType": "CPU",
                    "Socket": f"CPU{i}",
                    "Manufacturer": "Intel(R) Corporation",
                    "Model": "Intel(R) Xeon(R) Platinum 8480+",
                    "ProcessorArchitecture": "x86",
                    "InstructionSet": "x86-64",
                    "MaxSpeedMHz": 3800,
                    "TotalCores": 56,
                    "TotalThreads": 112,
                    "SerialNumber": _derived_hex(self.name, "cpu", str(i))[:16],
                }
            for i in range(int(sp["gpus"])):
                procs[f"GPU_SXM_{i + 1}"] = {
                    "ProcessorType": "GPU",
                    "Socket": f"SXM{i + 1}",
                    "Manufacturer": "NVIDIA",
                    "Model": sp["gpu_model"],
                    "MaxSpeedMHz": 1980,
                    "SerialNumber": sp["gpu_serials"][i],
                    "UUID": sp["gpu_uuids"][i],
                    "FirmwareVersion": self.firmware.get(f"GPU{i}"),
                    "Location": {"PartLocation": {"ServiceLabel": f"SXM{i + 1}", "LocationType": "Slot"}},
                }
            for pid, p in procs.items():
                p.update(
                    {
                        "@odata.id": f"{SYSTEM}/Processors/{pid}",
                        "@odata.type": "#Processor.v1_18_0.Processor",
                        "Id": pid,
                        "Name": "Processor" if p["ProcessorType"] == "CPU" else "GPU",
                        "Status": {"State": "Enabled", "Health": "OK"},
                    }
                )
            self._processors = procs
        return self._processors

    def system(self) -> dict:
        sp, h = self.spec, self.health()
        return {
            "@odata.id": SYSTEM,
            "@odata.type": "#ComputerSystem.v1_20_0.ComputerSystem",
            "Id": "1",
            "Name": "System",
            "HostName": self.name,
            "SystemType": "Physical",
            "Manufacturer": sp["manufacturer"],
            "Model": sp["model"],
            "SerialNumber": sp["serial"],
            "UUID": sp["uuid"],
            "PartNumber": sp["model"],
            "BiosVersion": self.firmware.get("BIOS"),
            "PowerState": self.power_state,
            "Status": {"State": "Enabled", "Health": h, "HealthRollup": h},
            "Boot": {
                "BootSourceOverrideTarget": self.override["target"],
                "BootSourceOverrideEnabled": self.override["enabled"],
                "BootSourceOverrideMode": self.override["mode"],
                "BootSourceOverrideTarget@Redfish.AllowableValues": list(BOOT_TARGETS),
                "BootSourceOverrideEnabled@Redfish.AllowableValues": list(BOOT_ENABLED),
                "BootSourceOverrideMode@Redfish.AllowableValues": list(BOOT_MODES),
            },
            "BootProgress": {"LastState": "OSRunning" if self.power == "On" and not self.transition else "None"},
            "ProcessorSummary": {
                "Count": 2,
                "Model": "Intel(R) Xeon(R) Platinum 8480+",
                "Status": {"State": "Enabled", "Health": "OK"},
            },
            "MemorySummary": {"TotalSystemMemoryGiB": 2048, "Status": {"State": "Enabled", "Health": "OK"}},
            "Processors": {"@odata.id": f"{SYSTEM}/Processors"},
            "Bios": {"@odata.id": f"{SYSTEM}/Bios"},
            "LogServices": {"@odata.id": f"{SYSTEM}/LogServices"},
            "Links": {
                "Chassis": [{"@odata.id": f"{ROOT}/Chassis/1"}],
                "ManagedBy": [{"@odata.id": f"{ROOT}/Managers/1"}],
            },
            "Actions": {
                "#ComputerSystem.Reset": {
                    "target": f"{SYSTEM}/Actions/ComputerSystem.Reset",
                    "ResetType@Redfish.AllowableValues": list(RESET_TYPES),
                }
            },
        }

    def get(self, parts: list[str], path: str, query: dict) -> dict:
        """The resource at /redfish/v1/<parts> (GET); ``$expand=.`` (one level, as the root advertises) answers a
        collection with its members' documents in place of their links."""
        expand = query.get("$expand")
        if expand is None:
            return self._get(parts, path, query)
        if expand not in EXPANDS:
            raise RedfishError(501, "QueryNotSupported", f"$expand={expand} is not supported (only '.', one level).")
        doc = self._get(parts, path, {k: v for k, v in query.items() if k != "$expand"})
        if isinstance(doc.get("Members"), list):
            doc["Members"] = [
                self._get(m["@odata.id"][len(ROOT) + 1 :].split("/"), m["@odata.id"], {})
                if set(m) == {"@odata.id"}
                else m
                for m in doc["Members"]
            ]
        return doc

    def _get(self, parts: list[str], path: str, query: dict) -> dict:  # noqa: C901 (one branch per Redfish resource the BMC serves, as its tree lists them)
        n = len(parts)
        if n == 0:
            return {
                "@odata.id": f"{ROOT}/",
                "@odata.type": "#ServiceRoot.v1_15_0.ServiceRoot",
                "Id": "RootService",
                "Name": "Root Service",
                "RedfishVersion": "1.17.0",
                "UUID": _derived_uuid(self.name, "bmc"),
                "Product": "Millwright lab BMC",
                "Vendor": "Millwright",
                **{
                    k: {"@odata.id": f"{ROOT}/{k}"}
                    for k in ("Systems", "Managers", "Chassis", "UpdateService", "SessionService")
                },
                "Tasks": {"@odata.id": f"{ROOT}/TaskService"},
                "Links": {"Sessions": {"@odata.id": f"{ROOT}/SessionService/Sessions"}},
                "ProtocolFeaturesSupported": {
                    "ExpandQuery": {"ExpandAll": False, "Levels": True, "MaxLevels": 1, "Links": False, "NoLinks": True}
                },
            }
        head = parts[0]
        if head == "odata" and n == 1:
            return {
                "value": [
                    {"name": k, "kind": "Singleton", "url": f"{ROOT}/{k}"}
                    for k in ("Systems", "Managers", "Chassis", "UpdateService", "SessionService")
                ]
                + [{"name": "Tasks", "kind": "Singleton", "url": f"{ROOT}/TaskService"}]
            }
        if head == "Systems":
            if n == 1:
                return collection(f"{ROOT}/Systems", "ComputerSystemCollection", "Computer System Collection", [SYSTEM])
            if parts[1] == "1":
                return self._get_system_part(parts[2:], path, query)
        if head == "Managers":
            if n == 1:
                return collection(f"{ROOT}/Managers", "ManagerCollection", "Manager Collection", [f"{ROOT}/Managers/1"])
            if parts[1:] == ["1"]:
                return {
                    "@odata.id": f"{ROOT}/Managers/1",
                    "@odata.type": "#Manager.v1_17_0.Manager",
                    "Id": "1",
                    "Name": "BMC",
                    "ManagerType": "BMC",
                    "FirmwareVersion": self.firmware.get("BMC"),
                    "Model": "AST2600",
                    "Status": {"State": "Enabled", "Health": "OK"},
                    "Links": {"ManagerForServers": [{"@odata.id": SYSTEM}]},
                }
        if head == "Chassis":
            if n == 1:
                ids = ["1", *tray_chassis_ids(self.spec)]
                return collection(f"{ROOT}/Chassis", "ChassisCollection", "Chassis Collection",
                                  [f"{ROOT}/Chassis/{i}" for i in ids])  # fmt: skip
            if n == 2 and (tray := tray_chassis(self.spec, parts[1], ROOT)) is not None:
                return tray
            if parts[1:] == ["1"]:
                return {
                    "@odata.id": f"{ROOT}/Chassis/1",
                    "@odata.type": "#Chassis.v1_23_0.Chassis",
                    "Id": "1",
                    "Name": "Chassis",
                    "ChassisType": "RackMount",
                    "Manufacturer": self.spec["manufacturer"],
                    "Model": self.spec["model"],
                    "SerialNumber": self.spec["serial"],
                    "PowerState": self.power_state,
                    "Status": {"State": "Enabled", "Health": "OK"},
                    **({"Location": where} if (where := location(self.spec)) else {}),
                    "Links": {
                        "ComputerSystems": [{"@odata.id": SYSTEM}],
                        "ManagedBy": [{"@odata.id": f"{ROOT}/Managers/1"}],
                    },
                    "Actions": {
                        "#Chassis.Reset": {  # AC power cycle: what a CPLD update waits for
                            "target": f"{ROOT}/Chassis/1/Actions/Chassis.Reset",
                            "ResetType@Redfish.AllowableValues": ["PowerCycle"],
                        }
                    },
                }
        if head in ("UpdateService", "TaskService"):
            doc = self.updates.get(parts)
            if doc is not None:
                return doc
        if head == "SessionService":
            ss = f"{ROOT}/SessionService"
            if n == 1:
                return {
                    "@odata.id": ss,
                    "@odata.type": "#SessionService.v1_1_8.SessionService",
                    "Id": "SessionService",
                    "Name": "Session Service",
                    "ServiceEnabled": True,
                    "SessionTimeout": int(self.lab.config["session_timeout"]),
                    "Sessions": {"@odata.id": f"{ss}/Sessions"},
                }
            if parts[1] == "Sessions":
                by_id = {s["id"]: s for s in self.sessions.values()}
                if n == 2:
                    return collection(
                        f"{ss}/Sessions",
                        "SessionCollection",
                        "Session Collection",
                        [f"{ss}/Sessions/{i}" for i in by_id],
                    )
                if n == 3 and parts[2] in by_id:
                    return self._session_body(by_id[parts[2]])
        raise not_found(path)

    def _get_system_part(self, rest: list[str], path: str, query: dict) -> dict:  # noqa: C901 (one branch per subresource of a ComputerSystem)
        if not rest:
            return self.system()
        head, n = rest[0], len(rest)
        if head == "Processors":
            procs = self.processors()
            if n == 1:
                return collection(
                    f"{SYSTEM}/Processors",
                    "ProcessorCollection",
                    "Processors Collection",
                    [p["@odata.id"] for p in procs.values()],
                )
            if n == 2 and rest[1] in procs:
                return procs[rest[1]]
        if head == "Bios":
            if n == 1:
                return {
                    "@odata.id": f"{SYSTEM}/Bios",
                    "@odata.type": "#Bios.v1_2_0.Bios",
                    "Id": "BIOS",
                    "Name": "BIOS Configuration",
                    "AttributeRegistry": "BiosAttributeRegistry.v1_0_0",
                    "Attributes": dict(self.bios),
                    "@Redfish.Settings": {
                        "@odata.type": "#Settings.v1_3_5.Settings",
                        "SettingsObject": {"@odata.id": f"{SYSTEM}/Bios/Settings"},
                        "SupportedApplyTimes": ["OnReset"],
                    },
                }
            if rest[1:] == ["Settings"]:
                return {
                    "@odata.id": f"{SYSTEM}/Bios/Settings",
                    "@odata.type": "#Bios.v1_2_0.Bios",
                    "Id": "Settings",
                    "Name": "BIOS Pending Settings",
                    "Attributes": dict(self.bios_pending),
                }
        if head == "LogServices":
            ls = f"{SYSTEM}/LogServices"
            if n == 1:
                return collection(ls, "LogServiceCollection", "System Log Services", [f"{ls}/SEL"])
            if rest[1] == "SEL":
                if n == 2:
                    return {
                        "@odata.id": f"{ls}/SEL",
                        "@odata.type": "#LogService.v1_5_0.LogService",
                        "Id": "SEL",
                        "Name": "System Event Log",
                        "LogEntryType": "SEL",
                        "MaxNumberOfRecords": SEL_MAX,
                        "OverWritePolicy": "WrapsWhenFull",
                        "ServiceEnabled": True,
                        "DateTime": _now_iso(),
                        "Status": {"State": "Enabled", "Health": "OK"},
                        "Entries": {"@odata.id": f"{ls}/SEL/Entries"},
                        "Actions": {"#LogService.ClearLog": {"target": f"{ls}/SEL/Actions/LogService.ClearLog"}},
                    }
                if rest[2:] == ["Entries"]:
                    skip, top = int(query.get("$skip", 0)), query.get("$top")
                    entries = self.sel[skip : skip + int(top)] if top is not None else self.sel[skip:]
                    return {
                        "@odata.id": f"{ls}/SEL/Entries",
                        "@odata.type": "#LogEntryCollection.LogEntryCollection",
                        "Name": "System Event Log Entries",
                        "Members@odata.count": len(self.sel),
                        "Members": entries,
                    }
                if n == 4 and rest[2] == "Entries":
                    for e in self.sel:
                        if e["Id"] == rest[3]:
                            return e
        raise not_found(path)

    def write(self, method: str, parts: list[str], path: str, body: Any) -> web.Response:
        """POST / PATCH / DELETE on /redfish/v1/<parts>."""
        if method == "POST" and parts == ["Systems", "1", "Actions", "ComputerSystem.Reset"]:
            rtype = body.get("ResetType") if isinstance(body, dict) else None
            if rtype is None:
                raise RedfishError(
                    400,
                    "ActionParameterMissing",
                    "The action ComputerSystem.Reset requires the "
                    "parameter ResetType to be present in the request body.",
                )
            if rtype not in RESET_TYPES:
                raise RedfishError(
                    400,
                    "ActionParameterValueNotInList",
                    f"The value '{rtype}' for the parameter "
                    "ResetType in the action ComputerSystem.Reset is not in the list of acceptable "
                    "values.",
                )
            self.reset(rtype)
            return web.Response(status=204)
        if method == "PATCH" and parts == ["Systems", "1"]:
            self._patch_boot(body)
            return web.Response(status=204)
        if method == "PATCH" and parts == ["Systems", "1", "Bios", "Settings"]:
            attrs = body.get("Attributes") if isinstance(body, dict) else None
            if not isinstance(attrs, dict):
                raise RedfishError(
                    400,
                    "PropertyMissing",
                    "The property Attributes is a required property and must be included in the request.",
                )
            unknown = [k for k in attrs if k not in self.bios]
            if unknown:
                raise RedfishError(
                    400,
                    "PropertyUnknown",
                    f"The property {unknown[0]} is not in the list of valid properties for the resource.",
                )
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
            return self.updates.simple_update(body)
        if method == "POST" and parts == ["Chassis", "1", "Actions", "Chassis.Reset"]:
            rtype = body.get("ResetType") if isinstance(body, dict) else None
            if rtype != "PowerCycle":
                raise RedfishError(
                    400,
                    "ActionParameterValueNotInList",
                    f"The value '{rtype}' for the parameter ResetType in the action Chassis.Reset is not in the "
                    "list of acceptable values.",
                )
            self.resets += 1
            self.updates.ac_power_cycle()
            return web.Response(status=204)
        self.get(parts, path, {})  # 404 for an unknown resource, else the method is the problem
        raise RedfishError(405, "OperationNotAllowed", f"The HTTP method {method} is not allowed on {path}.")

    def _patch_boot(self, body: Any) -> None:
        if not isinstance(body, dict) or not body:
            raise RedfishError(
                400,
                "MalformedJSON",
                "The request body submitted was malformed JSON and could not be parsed by the receiving service.",
            )
        for key in body:
            if key != "Boot":
                raise RedfishError(
                    400,
                    "PropertyNotWritable",
                    f"The property {key} is a read only property and cannot be assigned a value.",
                )
        boot = body["Boot"]
        if not isinstance(boot, dict):
            raise _bad_value("Boot", boot)
        new = dict(self.override)
        for prop, key, allowed in (
            ("BootSourceOverrideTarget", "target", BOOT_TARGETS),
            ("BootSourceOverrideEnabled", "enabled", BOOT_ENABLED),
            ("BootSourceOverrideMode", "mode", BOOT_MODES),
        ):
            if prop in boot:
                if boot[prop] not in allowed:
                    raise _bad_value(prop, boot[prop])
                new[key] = boot[prop]
        for prop in boot:
            if prop not in ("BootSourceOverrideTarget", "BootSourceOverrideEnabled", "BootSourceOverrideMode"):
                raise RedfishError(
                    400,
                    "PropertyUnknown",
                    f"The property {prop} is not in the list of valid properties for the resource.",
                )
        self.override = new

    def view(self) -> dict:
        return {
            "name": self.name,
            "url": self.url,
            "power": self.power,
            "power_state": self.power_state,
            "booted_from": self.booted_from,
            "boot_count": self.boot_count,
            "last_boot": self.last_boot,
            "last_off": self.last_off,
            "boot_override": dict(self.override),
            "gpu_faults": self.gpu_faults,
            "sel": self.sel,
            "down_until": self.down_until,
            "sessions": len(self.sessions),
            "requests": self.requests,
            "resets": self.resets,
            "firmware": self.firmware,
            "bios": self.bios,
            "spec": self.spec,
            **self.updates.view(),
        }
