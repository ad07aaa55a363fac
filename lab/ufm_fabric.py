"""The UFM emulator's fabric (lab/ufm.py serves it): systems, ports, virtual ports, PKeys and the SM's security
settings, UFM's value checks, and the version profiles that say how a UFM release answers where releases differ."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any

MANAGEMENT_PKEY = 0x7FFF
_GUID = re.compile(r"^(0x)?([0-9a-fA-F]{16})$")
MEMBERSHIPS = ("full", "limited")
MAX_REQUEST_LINE = 8190  # Apache httpd's LimitRequestLine default, in front of UFM's REST server
QOS = ("mtu_limit", "service_level", "rate_limit")
# The SM settings UFM ships with (UFM SM default properties; the REST API guide's GET /app/smconf example).
SMCONF_DEFAULTS: dict[str, Any] = {
    "m_key": "0x0", "sm_key": "0x1", "sa_key": "0x1", "m_key_lease_period": 60, "m_key_per_port": False,
    "subnet_prefix": "0xfe80000000000000", "no_partition_enforcement": False, "sm_priority": 15,
    "ignore_other_sm": False, "routing_engine_active": "minhop",
}  # fmt: skip


@dataclass(frozen=True)
class Profile:
    """How one UFM release answers where releases differ (see the module docstring's table)."""

    release: str
    missing_pkey: str  # "404", or "empty": 200 {}
    reports_default_membership: bool
    partition_name: bool
    write_answer: str  # "json" ({}) or "text"
    max_request_line: int = MAX_REQUEST_LINE


PROFILES = {
    "6.17": Profile("6.17.0-5", missing_pkey="empty", reports_default_membership=False, partition_name=False,
                    write_answer="text"),
    "6.19": Profile("6.19.1-3", missing_pkey="empty", reports_default_membership=True, partition_name=False,
                    write_answer="json"),
    "6.22": Profile("6.22.1-2", missing_pkey="404", reports_default_membership=True, partition_name=True,
                    write_answer="json"),
}  # fmt: skip
DEFAULT_VERSION = "6.22"
CHOICES = {"missing_pkey": ("404", "empty"), "write_answer": ("json", "text")}


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


def membership(value: Any) -> str:
    if value not in MEMBERSHIPS:
        raise UfmError(400, f"Invalid membership value: {value!r}, must be one of full, limited")
    return value


class Fabric:
    """The emulated fabric: systems, ports, virtual ports, PKeys, and the SM's security settings."""

    def __init__(self) -> None:
        self.systems: dict[str, dict] = {}
        self.ports: list[dict] = []
        self.vports: list[dict] = []
        self.pkeys: dict[int, dict] = {}
        self.default_membership = "full"
        self.smconf: dict[str, Any] = {}
        self.last_updated = time.time()
        self.clear()

    def clear(self) -> None:
        self.systems.clear()
        self.ports.clear()
        self.vports.clear()
        self.pkeys = {MANAGEMENT_PKEY: self._new_pkey("management")}
        self.default_membership = "full"  # UFM's default: every HCA port a full member of 0x7fff
        self.smconf = dict(SMCONF_DEFAULTS)
        self.touch()

    def touch(self) -> None:
        self.last_updated = time.time()

    @staticmethod
    def _new_pkey(name: str, **kw: Any) -> dict:
        return {"partition": name, "ip_over_ib": bool(kw.get("ip_over_ib", True)),
                "mtu_limit": kw.get("mtu_limit", 2), "service_level": kw.get("service_level", 0),
                "rate_limit": kw.get("rate_limit", 2.5), "guids": {}}  # fmt: skip

    def seed(self, body: dict) -> None:
        self.clear()
        for i, host in enumerate(body.get("hosts") or []):
            name = host["name"]
            guids = [parse_guid(g) for g in host.get("guids") or []]
            sys_guid = guids[0] if guids else f"{i:016x}"
            self.systems[name] = {
                "system_name": name,
                "guid": sys_guid,
                "type": "host",
                "state": "active",
                "description": f"{name} HCA-1",
                "ip": f"10.1.{i // 250}.{i % 250 + 10}",
                "model": "MT4129",
                "vendor": "Mellanox",
            }
            for n, g in enumerate(guids, 1):
                state = (host.get("states") or {}).get(g, "Active")
                self.ports.append(
                    {
                        "guid": g,
                        "name": f"{g}_1",
                        "system_name": name,
                        "system_guid": sys_guid,
                        "systemID": sys_guid,
                        "physical_port_number": 1,
                        "dname": f"mlx5_{n - 1}/1",
                        "logical_state": state,
                        "physical_state": "LinkUp" if state == "Active" else "Polling",
                        "speed": "NDR",
                        "width": "4x",
                        "external": False,
                        "tier": 1,
                        "lid": len(self.ports) + 1,
                    }
                )
        for i, sw in enumerate(body.get("switches") or []):
            g = parse_guid(sw["guid"])
            self.systems[sw["name"]] = {
                "system_name": sw["name"],
                "guid": g,
                "type": "switch",
                "state": "active",
                "description": "MQM9790",
                "ip": f"10.0.{i // 250}.{i % 250 + 10}",  # its management address, as UFM lists every system's
                "model": "MQM9790",
                "vendor": "Mellanox",
            }
            for p in range(1, 5):
                self.ports.append(
                    {
                        "guid": g,
                        "name": f"{g}_{p}",
                        "system_name": sw["name"],
                        "system_guid": g,
                        "systemID": g,
                        "physical_port_number": p,
                        "dname": str(p),
                        "logical_state": "Active",
                        "physical_state": "LinkUp",
                        "speed": "NDR",
                        "width": "4x",
                        "external": True,
                        "tier": 2,
                        "lid": len(self.ports) + 1,
                    }
                )
        by_guid = {p["guid"]: p for p in self.ports}
        for v in body.get("vports") or []:
            phys = by_guid.get(parse_guid(v["port_guid"]))
            if phys is None:
                raise UfmError(400, f"vport {v.get('guid')}: no physical port {v['port_guid']}")
            self.vports.append({"virtual_port_state": v.get("state", "Active"),
                                "virtual_port_lid": 0x1000 + len(self.vports), "system_name": phys["system_name"],
                                "node_description": f"{phys['system_name']} mlx5_0",
                                "system_guid": phys["system_guid"], "port_guid": phys["guid"],
                                "port_name": phys["name"], "physical_port_number": phys["physical_port_number"],
                                "virtual_port_guid": parse_guid(v["guid"])})  # fmt: skip
        for key, pk in (body.get("pkeys") or {}).items():
            n = parse_pkey(key)
            entry = self._new_pkey(pk.get("partition") or f"api_pkey_{pkey_str(n)}")
            entry["guids"] = {parse_guid(g): {"membership": membership(m), "index0": True}
                              for g, m in (pk.get("guids") or {}).items()}  # fmt: skip
            self.pkeys[n] = entry
        self.default_membership = membership(body.get("default_membership", "full"))
        unknown = set(body.get("smconf") or {}) - set(SMCONF_DEFAULTS)
        if unknown:
            raise UfmError(400, f"smconf: unknown SM settings {sorted(unknown)}")
        self.smconf.update(body.get("smconf") or {})
        self.touch()

    def pkey_view(self, n: int, profile: Profile, guids_data: bool, qos_conf: bool) -> dict:
        """One PKey as UFM answers it: partition and ip_over_ib; members with guids_data; QoS with qos_conf."""
        p = self.pkeys[n]
        out: dict[str, Any] = {"partition": p["partition"], "ip_over_ib": p["ip_over_ib"]}
        if guids_data:
            out["guids"] = [{"guid": g, "membership": v["membership"], "index0": v["index0"]}
                            for g, v in sorted(p["guids"].items())]  # fmt: skip
            if n == MANAGEMENT_PKEY:  # ports are not listed; the default membership is, from 6.19
                out["index0"] = False
                if profile.reports_default_membership:
                    out["membership"] = self.default_membership
        if qos_conf:
            out["qos_conf"] = {k: p[k] for k in QOS}
        return out

    def dump(self, profile: Profile) -> dict:
        return {
            "systems": self.systems,
            "ports": self.ports,
            "vports": self.vports,
            "default_membership": self.default_membership,
            "pkeys": {pkey_str(n): self.pkey_view(n, profile, True, True) for n in sorted(self.pkeys)},
        }

    def remove_guids(self, n: int, guids: list[str]) -> None:
        """Remove `guids` (absent ones are a no-op); a PKey whose last member goes is deleted, as UFM does."""
        members = self.pkeys[n]["guids"]
        removed = [g for g in guids if members.pop(g, None) is not None]
        if removed and not members:
            del self.pkeys[n]
        self.touch()
