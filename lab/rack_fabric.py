"""A domain-wide NVLink fault on the lab's GB200 NVL72 racks, cleared only by power-cycling the whole rack:
``python -m lab.rack_fabric --emulator-url K --bmc-admin B --racks 4 --seed 4 --ready-file F``.

On NVL72 the unit of failure is the NVLink domain: one GPU's ``Xid 149 NETIR_LINK_DOWN`` faulted every node of its
rack (../shared/reference/topology-and-gangs.md §5). `RackFabric.fault(rack)` plays it on every compute tray's node
at once: GPU Feature Discovery's clique label (``nvidia.com/gpu.clique``) goes, the node condition ``GpuHealthy``
turns False (reason ``NVLinkFabricDown``, its message naming the rack), and a few trays' BMCs log it in their SEL
(Critical: the tray where the link went down ``Xid 149 NETIR_LINK_DOWN``, the next two compute trays and, where the
lab models them, switch tray 0). The rack recovers once every one of its trays, compute and NVLink switch trays
alike, has booted after the fault, in any order: then each node whose tray is on gets its clique label back and
``GpuHealthy`` True, the others at their boot, and the fault's SEL entries are marked ``Resolved``. A tray that boots
before the whole rack has is Ready (lab/node_power.py) but still ``GpuHealthy`` False, without its clique. A second
`fault` of a rack still faulted changes nothing (it is counted in `repeats`).

The fabric hears the trays' power through `NodePowerLink` (its ``on_off``/``on_boot`` hooks; the switch trays as
``nodeless`` servers): `power_link()` makes the link that also sets each node Ready/NotReady. Times are the BMCs'
(``last_off``, ``last_boot``), so a power-off shorter than the link's poll is still in `history`. Run as a process it
serves the admin API, plain HTTP: ``GET /_lab/racks`` (every rack), ``GET /_lab/racks/{rack}`` (``{"rack",
"faulted", "nodes", "switch_trays", "bmcs": {tray: url}, "history": [RackHistory...]}``), ``POST
/_lab/racks/{rack}/fabric-fault`` (``{"origin": tray}`` optional; answers the fault's `RackHistory`), ``GET
/_lab/healthz``. A fault left on the nodes by an earlier run (the emulator keeps its objects) is taken up again at
start, from then.
"""

from __future__ import annotations

import asyncio
import logging
import random
import sys
import time
from datetime import UTC, datetime
from typing import Any, Literal

from aiohttp import web
from pydantic import Field

from activities.kube.topology import CLIQUE_LABEL
from lab.fleet import _M
from lab.k8s.process import ChildProcess
from lab.loopback import AdminClient, serve_app, server_arguments
from lab.node_power import NodePowerLink
from lab.nvl72 import Nvl72Fleet

log = logging.getLogger("lab.rack_fabric")

CONDITION = "GpuHealthy"  # one of Millwright's HealthChecks.gpu_conditions: a problem when False
FAULT_REASON = "NVLinkFabricDown"
UP_REASON = "NVLinkFabricUp"
SEL_MESSAGE_ID = "ResourceEvent.1.0.ResourceErrorsDetected"  # DMTF's registry: args (resource, error)
SEL_COMPUTE_TRAYS = 3  # the tray where the link went down and the next two log the fault


class TrayPower(_M):
    tray: str
    kind: Literal["compute", "switch"]
    power: Literal["Off", "On"]
    at: float = Field(description="When, by its BMC (epoch seconds).")


class RackHistory(_M):
    """One fault of a rack and what followed it."""

    rack: str
    faulted_at: float
    origin: str = Field(description="The compute tray where the link went down; empty for a fault taken up at start.")
    sel: dict[str, str] = Field(default_factory=dict, description="tray -> the SEL entry the fault logged.")
    power: list[TrayPower] = Field(default_factory=list, description="Each tray's power-offs and power-ons seen "
                                   "since the fault (until the next one), in time order.")  # fmt: skip
    pending: list[str] = Field(description="Trays not booted since the fault: the rack recovers once none is left.")
    recovered_at: float | None = None
    repeats: int = Field(0, description="fault() calls that found the rack still faulted.")


class RackFabric:
    """The NVLink fabric of each rack of an `Nvl72Fleet` seeded in the Kubernetes emulator, its trays' BMCs in the
    BMC lab (`Nvl72Fleet.bmc_specs`)."""

    def __init__(self, core: Any, bmc_admin: Any, fleet: Nvl72Fleet, *, switch_trays: bool = True) -> None:
        """`core`: a kubernetes.aio CoreV1Api on the fleet's cluster; `bmc_admin`: a lab.redfish.BmcAdmin;
        `switch_trays`: whether the BMC lab has the switch trays' BMCs (then they too must be power-cycled)."""
        self.core, self.bmc_admin = core, bmc_admin
        self.nodes = fleet.layout()
        self.switch_trays = {rack: fleet.switch_tray_names(rack) if switch_trays else [] for rack in self.nodes}
        self.rack_of = {tray: rack for rack in self.nodes for tray in self.trays(rack)}
        self.cliques = {node: labels[CLIQUE_LABEL] for node, labels in fleet.node_labels().items()}
        self.histories: dict[str, list[RackHistory]] = {}
        self.bmc_urls: dict[str, str] = {}
        self._heal_at_boot: set[str] = set()  # nodes of a recovered rack that were off when it recovered
        self._lock = asyncio.Lock()

    def trays(self, rack: str) -> list[str]:
        return [*self.nodes[rack], *self.switch_trays[rack]]

    def history(self, rack: str) -> RackHistory | None:
        """The rack's latest fault, or None."""
        histories = self.histories.get(rack)
        return histories[-1] if histories else None

    def faulted(self, rack: str) -> bool:
        h = self.history(rack)
        return h is not None and h.recovered_at is None

    def view(self, rack: str) -> dict:
        return {"rack": rack, "faulted": self.faulted(rack), "nodes": self.nodes[rack],
                "switch_trays": self.switch_trays[rack],
                "bmcs": {t: self.bmc_urls[t] for t in self.trays(rack) if t in self.bmc_urls},
                "history": [h.model_dump(mode="json") for h in self.histories.get(rack, [])]}  # fmt: skip

    def power_link(self, poll_interval: float = 0.05) -> NodePowerLink:
        """The power link of every tray: nodes NotReady while off, rebooted at power-on, and the fabric told."""
        nodes = [n for rack in self.nodes for n in self.nodes[rack]]
        switches = [t for rack in self.nodes for t in self.switch_trays[rack]]
        return NodePowerLink(self.bmc_admin, self.core, nodes, nodeless=switches, poll_interval=poll_interval,
                             on_boot=self.on_boot, on_off=self.on_off)  # fmt: skip

    async def start(self) -> None:
        """Learn the trays' BMC URLs, and take up the faults an earlier run left on the nodes (from now)."""
        views = await self.bmc_admin.servers(["url"])
        self.bmc_urls = {name: v["url"] for name, v in views.items() if name in self.rack_of}
        for node in (await self.core.list_node()).items:
            rack = self.rack_of.get(node.metadata.name)
            broken = any(c.type == CONDITION and c.reason == FAULT_REASON for c in node.status.conditions or [])
            if rack is not None and broken and not self.faulted(rack):
                self.histories.setdefault(rack, []).append(
                    RackHistory(rack=rack, faulted_at=time.time(), origin="", pending=self.trays(rack)))  # fmt: skip

    # ------------------------------------------------------------------ the fault

    async def fault(self, rack: str, origin: str | None = None) -> RackHistory:
        """Fault the rack's NVLink fabric, the link of `origin` (a compute tray; default one drawn) going first."""
        if rack not in self.nodes:
            raise KeyError(f"no rack {rack!r}; the racks are {', '.join(self.nodes)}")
        async with self._lock:
            if self.faulted(rack):
                h = self.history(rack)
                assert h is not None
                h.repeats += 1
                return h
            nodes = self.nodes[rack]
            origin = origin or random.Random(f"{rack}/{len(self.histories.get(rack, []))}").choice(nodes)
            if origin not in nodes:
                raise KeyError(f"{origin!r} is not a compute tray of {rack}")
            h = RackHistory(rack=rack, faulted_at=time.time(), origin=origin, pending=self.trays(rack))
            self.histories.setdefault(rack, []).append(h)
            self._heal_at_boot -= set(nodes)
            await asyncio.gather(*(self._break(node, rack) for node in nodes))
            h.sel = await self._log(rack, origin)
            log.warning("%s: NVLink fabric down (origin %s)", rack, origin)
            return h

    async def _break(self, node: str, rack: str) -> None:
        labels = (await self.core.read_node(node)).metadata.labels or {}
        self.cliques[node] = labels.get(CLIQUE_LABEL) or self.cliques[node]  # what GFD labels it with once healed
        await self.core.patch_node(node, {"metadata": {"labels": {CLIQUE_LABEL: None}}})
        await self._condition(node, "False", FAULT_REASON, f"NVLink fabric of {rack} is down: power-cycle every "
                              "compute and NVLink switch tray of the rack")  # fmt: skip

    async def _log(self, rack: str, origin: str) -> dict[str, str]:
        nodes = self.nodes[rack]
        first = nodes.index(origin)
        gpu = random.Random(origin).randint(1, 4)
        events = {origin: (f"GPU_SXM_{gpu}", "Xid 149, NETIR_LINK_DOWN: NVLink link to the NVSwitch fabric down")}
        for i in range(1, SEL_COMPUTE_TRAYS):
            events[nodes[(first + i) % len(nodes)]] = ("GPU_SXM_1", f"NVLink fabric error: peers in {rack} lost")
        for switch in self.switch_trays[rack][:1]:
            events[switch] = ("NVSwitch_0", f"NVLink fabric down: links to the compute trays of {rack} lost")
        logged = {}
        for tray, (resource, error) in events.items():
            entry = await self.bmc_admin.add_sel(tray, "Critical", f"{resource}: {error}", SEL_MESSAGE_ID,
                                                 message_args=[resource, error])  # fmt: skip
            logged[tray] = entry["Id"]
        return logged

    # ------------------------------------------------------------------ power, from NodePowerLink

    async def on_off(self, tray: str) -> None:
        rack = self.rack_of[tray]
        async with self._lock:
            h = self.history(rack)
            if h is not None:
                at = (await self.bmc_admin.server(tray))["last_off"] or time.time()
                self._record(h, tray, "Off", at)

    async def on_boot(self, tray: str) -> None:
        rack = self.rack_of[tray]
        async with self._lock:
            h = self.history(rack)
            if h is None:
                return
            view = await self.bmc_admin.server(tray)
            if view["last_off"] and view["last_off"] < view["last_boot"]:  # in case it was too short to be seen
                self._record(h, tray, "Off", view["last_off"])
            self._record(h, tray, "On", view["last_boot"])
            if h.recovered_at is None and view["last_boot"] >= h.faulted_at and tray in h.pending:
                h.pending.remove(tray)
                if not h.pending:
                    await self._recover(h)
            elif tray in self._heal_at_boot:
                self._heal_at_boot.discard(tray)
                await self._heal(tray, rack)

    def _record(self, h: RackHistory, tray: str, power: Literal["Off", "On"], at: float) -> None:
        kind: Literal["compute", "switch"] = "switch" if tray in self.switch_trays[h.rack] else "compute"
        event = TrayPower(tray=tray, kind=kind, power=power, at=at)
        if event not in h.power:
            h.power.append(event)
            h.power.sort(key=lambda p: p.at)

    async def _recover(self, h: RackHistory) -> None:
        h.recovered_at = time.time()
        power = await self.bmc_admin.servers(["power"])
        on = [n for n in self.nodes[h.rack] if power[n]["power"] == "On"]
        self._heal_at_boot |= set(self.nodes[h.rack]) - set(on)
        await asyncio.gather(*(self._heal(node, h.rack) for node in on))
        for tray, entry in h.sel.items():
            await self.bmc_admin.resolve_sel(tray, entry)
        log.warning("%s: NVLink fabric up again", h.rack)

    async def _heal(self, node: str, rack: str) -> None:
        await self.core.patch_node(node, {"metadata": {"labels": {CLIQUE_LABEL: self.cliques[node]}}})
        await self._condition(node, "True", UP_REASON, f"NVLink fabric of {rack} is up")

    async def _condition(self, node: str, status: str, reason: str, message: str) -> None:
        """Set the node's GpuHealthy condition (a strategic merge: conditions merge by type)."""
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        condition = {"type": CONDITION, "status": status, "reason": reason, "message": message,
                     "lastTransitionTime": now, "lastHeartbeatTime": now}  # fmt: skip
        await self.core.patch_node_status(node, {"status": {"conditions": [condition]}})


# ---------------------------------------------------------------------- the process and its clients


def admin_app(fabric: RackFabric) -> web.Application:
    async def racks(request: web.Request) -> web.Response:
        return web.json_response({"racks": {rack: fabric.view(rack) for rack in fabric.nodes}})

    async def rack(request: web.Request) -> web.Response:
        name = request.match_info["rack"]
        if name not in fabric.nodes:
            return web.json_response({"error": f"no rack {name!r}"}, status=404)
        return web.json_response(fabric.view(name))

    async def fault(request: web.Request) -> web.Response:
        try:
            body = await request.json() if request.can_read_body else {}
        except ValueError:
            return web.json_response({"error": 'the body is JSON: {"origin": "<compute tray>"} or nothing'}, status=400)
        try:
            h = await fabric.fault(request.match_info["rack"], (body or {}).get("origin"))
        except KeyError as err:
            return web.json_response({"error": str(err.args[0])}, status=404)
        return web.json_response(h.model_dump(mode="json"))

    async def healthz(request: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_get("/_lab/healthz", healthz)
    app.router.add_get("/_lab/racks", racks)
    app.router.add_get("/_lab/racks/{rack}", rack)
    app.router.add_post("/_lab/racks/{rack}/fabric-fault", fault)
    return app


class LabRackFabric(ChildProcess):
    """``with LabRackFabric(emulator_url=..., bmc_admin=..., fleet=Nvl72Fleet(...)) as fabric: fabric.url`` — the
    fabric and the trays' power link as a child process, its admin API at `url`."""

    module = "lab.rack_fabric"
    name = "lab-rack-fabric"

    def __init__(self, *, emulator_url: str, bmc_admin: str, fleet: Nvl72Fleet, switch_trays: bool = True,
                 poll_interval: float = 0.05, **kw: Any) -> None:  # fmt: skip
        super().__init__(**kw)
        self.arguments = ["--emulator-url", emulator_url, "--bmc-admin", bmc_admin, "--cluster", fleet.cluster,
                          "--racks", str(fleet.racks), "--seed", str(fleet.seed), "--split-racks",
                          str(fleet.split_racks), "--poll-interval", str(poll_interval),
                          *([] if switch_trays else ["--no-switch-trays"])]  # fmt: skip

    def extra_command(self) -> list[str]:
        return self.arguments


class RackFabricAdmin(AdminClient):
    """The fabric's admin API."""

    async def fault(self, rack: str, origin: str | None = None) -> dict:
        """Fault the rack's NVLink fabric (a RackHistory, as JSON)."""
        return await self._req("POST", f"/_lab/racks/{rack}/fabric-fault", json={"origin": origin} if origin else {})

    async def rack(self, rack: str) -> dict:
        return await self._req("GET", f"/_lab/racks/{rack}")

    async def racks(self) -> dict[str, dict]:
        return (await self._req("GET", "/_lab/racks"))["racks"]


async def serve(args: Any) -> None:
    from kubernetes.aio import client as k8s_client
    from kubernetes.aio import config as k8s_config

    from lab.k8s.admin import kubeconfig
    from lab.redfish import BmcAdmin

    fleet = Nvl72Fleet(cluster=args.cluster, racks=args.racks, seed=args.seed, split_racks=args.split_racks)
    api = await k8s_config.new_client_from_config_dict(kubeconfig(args.emulator_url, args.cluster))
    try:
        async with BmcAdmin(args.bmc_admin) as bmc_admin:
            fabric = RackFabric(k8s_client.CoreV1Api(api), bmc_admin, fleet, switch_trays=args.switch_trays)
            await fabric.start()
            async with fabric.power_link(args.poll_interval):
                await serve_app("lab.rack_fabric", admin_app(fabric), args.host, args.port, args.ready_file)
    finally:
        await api.close()


def main(argv: list[str] | None = None) -> int:
    p = server_arguments("python -m lab.rack_fabric", "NVLink fabric faults of the lab's NVL72 racks")
    p.add_argument("--emulator-url", required=True, help="the Kubernetes emulator holding the NVL72 cluster")
    p.add_argument("--bmc-admin", required=True, help="the admin URL of the BMC lab holding its trays' BMCs")
    p.add_argument("--cluster", default="nvl72")
    p.add_argument("--racks", type=int, required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--split-racks", type=int, default=0)
    p.add_argument("--no-switch-trays", dest="switch_trays", action="store_false",
                   help="the BMC lab has no switch trays' BMCs: compute trays alone clear a fault")  # fmt: skip
    p.add_argument("--poll-interval", type=float, default=0.5, help="seconds between reads of the trays' power")
    args = p.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr)
    asyncio.run(serve(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
