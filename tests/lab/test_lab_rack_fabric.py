"""The NVL72 trays' BMCs (lab/bmc_trays.py) and the domain-wide NVLink fault (lab/rack_fabric.py), on the real
Kubernetes emulator and a real BMC lab of 4 racks: 72 compute trays and 36 switch trays, each its own Redfish port.
Power goes through Redfish, as a remediation's would; what the fabric did is read from the nodes, the BMCs and
`RackFabric.history`."""

from __future__ import annotations

import asyncio
import time
import uuid

import httpx
import pytest
import pytest_asyncio
import sushy

from activities.kube.topology import CLIQUE_LABEL
from lab.k8s.admin import kubeconfig
from lab.nvl72 import Nvl72Fleet, tray_slot
from lab.rack_fabric import CONDITION, FAULT_REASON, LabRackFabric, RackFabric, RackFabricAdmin

USER, PASSWORD = "admin", f"rack-{uuid.uuid4().hex}"
FLEET = Nvl72Fleet(racks=4, seed=7, split_racks=1)
RACK = "rack-002"
POWER_DELAY = 0.05


@pytest.fixture(scope="module")
def tray_bmcs():
    from lab.redfish import LabBmcs

    with LabBmcs(servers=FLEET.bmc_specs(), user=USER, password=PASSWORD, power_delay=POWER_DELAY) as bmcs:
        yield bmcs


@pytest_asyncio.fixture
async def bmc_admin(tray_bmcs):
    from lab.redfish import BmcAdmin

    async with BmcAdmin(tray_bmcs.url) as admin:
        await admin.reset()
        yield admin


@pytest_asyncio.fixture
async def core(lab, emulator):
    """The NVL72 fleet's nodes seeded; the asyncio client the fabric takes."""
    from kubernetes.aio import client as k8s_client
    from kubernetes.aio import config as k8s_config

    lab.seed(FLEET.to_objects())
    api = await k8s_config.new_client_from_config_dict(kubeconfig(emulator.url, FLEET.cluster))
    yield k8s_client.CoreV1Api(api)
    await api.close()


@pytest_asyncio.fixture
async def fabric(core, bmc_admin):
    fabric = RackFabric(core, bmc_admin, FLEET)
    await fabric.start()
    async with fabric.power_link(poll_interval=0.02):
        yield fabric


async def nodes(core) -> dict[str, dict]:
    """node -> {"clique", "gpu" (GpuHealthy status, reason, message), "ready", "boot"}"""
    out = {}
    for n in (await core.list_node()).items:
        conds = {c.type: c for c in n.status.conditions or []}
        gpu = conds.get(CONDITION)
        out[n.metadata.name] = {"clique": n.metadata.labels.get(CLIQUE_LABEL), "ready": conds["Ready"].status,
                                "gpu": (gpu.status, gpu.reason, gpu.message) if gpu else None,
                                "boot": n.status.node_info.boot_id}  # fmt: skip
    return out


async def until(check, what: str, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while not (seen := await check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)
    return seen


async def reset(tray_bmcs, trays: list[str], reset_type: str = "PowerCycle") -> None:
    """ComputerSystem.Reset on each tray's BMC, all at once, as a client of the BMCs."""
    async with httpx.AsyncClient(auth=(USER, PASSWORD), timeout=10) as http:
        answers = await asyncio.gather(*(
            http.post(f"{tray_bmcs.bmc_urls[t]}/redfish/v1/Systems/1/Actions/ComputerSystem.Reset",
                      json={"ResetType": reset_type}) for t in trays))  # fmt: skip
    assert [a.status_code for a in answers] == [204] * len(trays)


async def booted(bmc_admin, trays: list[str], times: int = 1) -> None:
    async def done():
        views = await bmc_admin.servers(["power", "power_state", "boot_count"])
        return all(views[t]["power_state"] == "On" and views[t]["boot_count"] >= times for t in trays)

    await until(done, f"{len(trays)} trays booted")


def test_tray_bmcs_know_their_rack_and_slot(tray_bmcs):
    layout = FLEET.layout()
    node = layout[RACK][14]
    root = sushy.Sushy(tray_bmcs.bmc_urls[node], username=USER, password=PASSWORD)
    members = root.get_chassis_collection().members_identities
    assert sorted(members) == ["/redfish/v1/Chassis/1", "/redfish/v1/Chassis/CBC_0"]
    cbc = root.get_chassis("/redfish/v1/Chassis/CBC_0")
    assert (cbc.name, cbc.model, cbc.json["ChassisType"]) == ("18x1RU CBL Cartridge",) * 2 + ("Component",)
    assert cbc.json["Oem"]["Nvidia"] == {"@odata.type": "#NvidiaChassis.v1_4_0.NvidiaCBCChassis",
                                         "ChassisPhysicalSlotNumber": 24, "ComputeTrayIndex": 14, "RevisionId": 2,
                                         "TopologyId": 1}  # fmt: skip
    system = root.get_system("/redfish/v1/Systems/1")
    assert system.power_state == sushy.PowerState.ON and len(system.processors.get_members()) == 2 + 4

    # every compute tray of a rack: its own index, the rack's one cartridge serial; the switch trays between
    serials, slots = set(), {}
    with httpx.Client(auth=(USER, PASSWORD), timeout=10) as http:
        for rack, names in layout.items():
            for i, name in enumerate(names):
                oem = http.get(f"{tray_bmcs.bmc_urls[name]}/redfish/v1/Chassis/CBC_0").json()
                serials.add((rack, oem["SerialNumber"]))
                assert oem["Oem"]["Nvidia"]["ComputeTrayIndex"] == i
                slots[oem["Oem"]["Nvidia"]["ChassisPhysicalSlotNumber"]] = f"compute {i}"
            for i, name in enumerate(FLEET.switch_tray_names(rack)):
                base = f"{tray_bmcs.bmc_urls[name]}/redfish/v1"
                listed = [m["@odata.id"] for m in http.get(f"{base}/Chassis").json()["Members"]]
                assert listed == [f"/redfish/v1/Chassis/{c}" for c in ("1", "MGX_NVSwitch_0", "MGX_NVSwitch_1")]
                asic = http.get(f"{base}/Chassis/MGX_NVSwitch_1").json()
                assert asic["Model"] == "N5200_LD" and asic["Location"]["Placement"]["Rack"] == rack
                slot = http.get(f"{base}/Chassis/1").json()["Location"]["PartLocation"]["LocationOrdinalValue"]
                slots[slot] = f"switch {i}"
                assert slot == tray_slot("switch", i)
                assert http.get(f"{base}/Systems/1").json()["PowerState"] == "On"
                assert http.get(f"{base}/Systems/1/Processors").json()["Members@odata.count"] == 2  # no GPUs
            assert len({s for r, s in serials if r == rack}) == 1
    assert len({s for _, s in serials}) == 4
    assert [slots[s] for s in sorted(slots)] == [f"compute {i}" for i in range(10)] + \
        [f"switch {i}" for i in range(9)] + [f"compute {i}" for i in range(10, 18)]  # fmt: skip


async def test_a_fabric_fault_takes_the_rack_down_until_every_tray_is_power_cycled(fabric, core, bmc_admin,
                                                                                  tray_bmcs, lab):  # fmt: skip
    before = await nodes(core)
    rack = FLEET.layout()[RACK]
    switches = FLEET.switch_tray_names(RACK)
    others = {n: v for n, v in before.items() if n not in rack}

    fault = await fabric.fault(RACK)
    after = await nodes(core)
    assert all(after[n]["clique"] is None for n in rack)
    assert {after[n]["gpu"] for n in rack} == {("False", FAULT_REASON, f"NVLink fabric of {RACK} is down: "
                                                "power-cycle every compute and NVLink switch tray of the rack")}  # fmt: skip
    assert {n: v for n, v in after.items() if n not in rack} == others  # the other racks untouched
    logged = {t: (await bmc_admin.server(t))["sel"] for t in fault.sel}
    assert fault.origin in logged and switches[0] in logged and len(logged) == 4
    assert "Xid 149, NETIR_LINK_DOWN" in logged[fault.origin][0]["Message"]
    assert all(len(e) == 1 and e[0]["Severity"] == "Critical" for e in logged.values())
    with httpx.Client(auth=(USER, PASSWORD), timeout=10) as http:
        health = http.get(f"{tray_bmcs.bmc_urls[fault.origin]}/redfish/v1/Systems/1").json()["Status"]
    assert health["HealthRollup"] == "Critical"

    cursor = lab.audit(writes=True)[-1]["seq"]
    again = await fabric.fault(RACK)  # while faulted: nothing new
    assert again.repeats == 1 and again.faulted_at == fault.faulted_at and len(fabric.histories[RACK]) == 1
    assert lab.audit(cursor, writes=True) == []
    assert {t: len((await bmc_admin.server(t))["sel"]) for t in fault.sel} == dict.fromkeys(fault.sel, 1)

    await reset(tray_bmcs, rack[:17] + switches)  # every tray but one
    await booted(bmc_admin, rack[:17] + switches)
    await until(lambda: _all(core, rack[:17], lambda v, n: v["ready"] == "True" and v["boot"] != before[n]["boot"]),
                "17 nodes back Ready with a new boot ID")  # fmt: skip
    await asyncio.sleep(0.1)  # the link has seen every boot: still down
    still = await nodes(core)
    assert all(still[n]["clique"] is None and still[n]["gpu"][0] == "False" for n in rack)
    assert fabric.faulted(RACK) and fabric.history(RACK).pending == [rack[17]]

    await reset(tray_bmcs, [rack[17]])
    healed = await until(lambda: _all(core, rack, lambda v, n: v["gpu"][0] == v["ready"] == "True"), "the rack healed")
    assert all(healed[n]["clique"] == before[n]["clique"] for n in rack)
    assert {n: v for n, v in healed.items() if n not in rack} == others
    assert {(await bmc_admin.server(t))["sel"][0].get("Resolved") for t in fault.sel} == {True}
    with httpx.Client(auth=(USER, PASSWORD), timeout=10) as http:
        health = http.get(f"{tray_bmcs.bmc_urls[fault.origin]}/redfish/v1/Systems/1").json()["Status"]
    assert health["HealthRollup"] == "OK"

    history = fabric.history(RACK)
    assert history.recovered_at is not None and not history.pending and not fabric.faulted(RACK)
    for tray in rack + switches:  # each tray off, then on, once, after the fault
        seen = [(p.power, p.kind) for p in history.power if p.tray == tray]
        assert seen == [("Off", "switch" if tray in switches else "compute"), ("On", seen[0][1])], (tray, seen)
    assert history.faulted_at < history.power[0].at and history.power[-1].tray == rack[17]
    assert history.power[-1].at <= history.recovered_at
    for other in FLEET.rack_names():
        assert other == RACK or fabric.history(other) is None


async def test_a_tray_off_when_the_rack_recovers_is_healed_at_its_boot(fabric, core, bmc_admin, tray_bmcs):
    rack = FLEET.layout()[RACK]
    switches = FLEET.switch_tray_names(RACK)
    await fabric.fault(RACK, origin=rack[3])
    assert fabric.history(RACK).origin == rack[3]
    await reset(tray_bmcs, [rack[0]])
    await booted(bmc_admin, [rack[0]])
    await reset(tray_bmcs, [rack[0]], "ForceOff")  # cycled already, and off again
    await until(lambda: _all(core, [rack[0]], lambda v, n: v["ready"] == "False"), "its node NotReady")
    await reset(tray_bmcs, rack[1:] + switches)
    await until(lambda: _all(core, rack[1:], lambda v, n: v["gpu"][0] == "True" and v["clique"]), "the rack healed")
    off = (await nodes(core))[rack[0]]
    assert off["clique"] is None and off["gpu"][0] == "False" and not fabric.faulted(RACK)
    await reset(tray_bmcs, [rack[0]], "On")
    back = await until(lambda: _all(core, [rack[0]], lambda v, n: v["gpu"][0] == v["ready"] == "True"),
                       "healed at its boot")  # fmt: skip
    assert back[rack[0]]["clique"]
    offs = [p.at for p in fabric.history(RACK).power if p.tray == rack[0] and p.power == "Off"]
    assert len(offs) == 2 and offs[1] < fabric.history(RACK).recovered_at


async def test_the_power_link_hears_a_boot_and_a_power_off_between_two_polls(core, bmc_admin):
    """lab/node_power.py, as the fabric uses it: a switch tray's power reaches only the hooks (it plays no node)."""
    from lab.node_power import NodePowerLink

    node, switch = FLEET.layout()[RACK][0], FLEET.switch_tray_names(RACK)[0]
    heard: list[tuple[str, str]] = []

    async def on(name: str) -> None:
        heard.append(("On", name))

    async def off(name: str) -> None:
        heard.append(("Off", name))

    link = NodePowerLink(bmc_admin, core, [node], nodeless=[switch], on_boot=on, on_off=off)
    await link.poll_once(first=True)
    boot = (await nodes(core))[node]["boot"]
    for tray in (node, switch):
        for state in ("Off", "On", "Off"):  # lab-side power: at once, no poll between
            await bmc_admin.power(tray, state)
    cursor = (await nodes(core))[node]
    await link.poll_once()
    seen = (await nodes(core))[node]
    assert seen["ready"] == "False" and seen["boot"] != boot and cursor["ready"] == "True"
    assert heard == [("On", node), ("Off", node), ("On", switch), ("Off", switch)]
    assert link.reboots == {node: 1, switch: 1}


async def test_a_fault_left_on_the_nodes_is_taken_up_by_the_next_fabric(core, bmc_admin, tray_bmcs):
    """As after a restart of the lab, whose emulator keeps its objects: the new fabric knows the rack is down."""
    before = await nodes(core)
    rack = FLEET.layout()[RACK]
    await RackFabric(core, bmc_admin, FLEET).fault(RACK)
    fabric = RackFabric(core, bmc_admin, FLEET)
    await fabric.start()
    assert [r for r in FLEET.rack_names() if fabric.faulted(r)] == [RACK] and fabric.history(RACK).origin == ""
    async with fabric.power_link(poll_interval=0.02):
        await reset(tray_bmcs, fabric.trays(RACK))
        healed = await until(lambda: _all(core, rack, lambda v, n: v["gpu"][0] == "True"), "the rack healed")
    assert all(healed[n]["clique"] == before[n]["clique"] for n in rack)  # the fleet's, the one seeded


async def test_the_fabric_process_serves_faults_and_each_trays_bmc(lab, emulator, tray_bmcs, bmc_admin, core):
    rack = FLEET.layout()[RACK]
    switches = FLEET.switch_tray_names(RACK)
    with LabRackFabric(emulator_url=emulator.url, bmc_admin=tray_bmcs.url, fleet=FLEET, poll_interval=0.02) as proc:
        async with RackFabricAdmin(proc.url) as admin:
            view = await admin.rack(RACK)
            assert view["nodes"] == rack and view["switch_trays"] == switches and not view["faulted"]
            assert view["bmcs"] == {t: tray_bmcs.bmc_urls[t] for t in rack + switches}
            fault = await admin.fault(RACK, origin=rack[5])
            assert fault["origin"] == rack[5] and (await admin.fault(RACK))["repeats"] == 1
            assert [r for r, v in (await admin.racks()).items() if v["faulted"]] == [RACK]
            with pytest.raises(httpx.HTTPStatusError) as err:
                await admin.fault("rack-404")
            assert err.value.response.status_code == 404
            await until(lambda: _all(core, rack, lambda v, n: v["clique"] is None), "the clique labels gone")
            for tray in rack + switches:  # lab-side power, as an operator at the rack
                await bmc_admin.power(tray, "Off")
                await bmc_admin.power(tray, "On")

            async def recovered():
                return not (await admin.rack(RACK))["faulted"]

            await until(recovered, "the rack recovered")
            await until(lambda: _all(core, rack, lambda v, n: v["gpu"][0] == "True" and v["clique"]), "healed")
            (history,) = (await admin.rack(RACK))["history"]
            assert len(history["power"]) == 2 * 27 and history["recovered_at"] >= history["power"][-1]["at"]


async def _all(core, names: list[str], check) -> dict | None:
    seen = await nodes(core)
    return seen if all(check(seen[n], n) for n in names) else None
