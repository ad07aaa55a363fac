"""FleetFirmwareUpdate over the lab's servers (workflows/firmware/fleet.py): waves, the BMC concurrency limit, the
cluster's disruption budget, the failure threshold, pause/resume/abort, servers already current, and waves by NVLink
domain: a domain's nodes back in service only together, once it reads back one firmware set, or held out."""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest
from temporalio.client import WorkflowHandle

from activities.kube.models import CORDONED_BY
from activities.kube.topology import CLIQUE_LABEL
from activities.node_health import QUARANTINE_ANNOTATION, QUARANTINE_TAINT
from lab.fleet import Fleet
from starter.controls import Refused, budget_set, firmware_control, firmware_status
from tests.kube_helpers import wait_for
from tests.workflows.burnin.test_burnin_node import follow
from tests.workflows.firmware.test_firmware_update import BIOS_IMAGE, BUNDLE, IMAGES, updates_posted
from tests.workflows.maintenance.test_node_maintenance import record_history
from tests.workflows.rollout.helpers import max_unavailable, nodes_down_with_workload
from workflows.firmware.fleet import FleetFirmwareInput, FleetFirmwareStatus, FleetFirmwareUpdate, ServerFirmware
from workflows.firmware.waves import FirmwareWaves, WaveBook

DRAIN = {"delete_emptydir_data": True, "eviction_retry_interval": 0.5}
BIOS_ONLY = {"name": "bios-1.9.0", "components": [{"name": "BIOS", "image_uri": BIOS_IMAGE, "version": "1.9.0"}]}


def fleet_input(bmcs, servers: list[str], nodes: set[str], bundle: dict = BUNDLE, **fields) -> FleetFirmwareInput:
    """`servers` in order; those in `nodes` are Kubernetes nodes in service (budget 2), the rest bare servers."""
    kubernetes = {"cluster": "lab", "take_out_of_service": True, "disruption_budget": {"count": 2}, "drain": DRAIN}
    return FleetFirmwareInput.model_validate({
        "name": f"fw-{uuid.uuid4().hex[:6]}", "bundle": bundle,
        "servers": [{"name": n, "bmc": {"url": bmcs.bmc_urls[n]}, "kubernetes": kubernetes if n in nodes else None}
                    for n in servers],
        **fields,
    })  # fmt: skip


async def start(client, queue: str, inp: FleetFirmwareInput) -> WorkflowHandle:
    return await client.start_workflow(FleetFirmwareUpdate.run, inp, id=inp.workflow_id(), task_queue=queue)


async def update_windows(admin, servers: list[str]) -> dict[str, tuple[float, float]]:
    """Each server's time on its BMC's UpdateService: its first SimpleUpdate to its last write (the reset)."""
    windows = {}
    for name in servers:
        writes = await admin.server_audit(name, writes=True)
        posted = [e["time"] for e in writes if e["path"].endswith("SimpleUpdate")]
        if posted:
            windows[name] = (posted[0], writes[-1]["time"])
    return windows


def uncordons(audit: list[dict]) -> dict[str, list[float]]:
    """Node -> when a write took it from cordoned to schedulable, as the API server saw it."""
    cordoned: dict[str, bool] = {}
    out: dict[str, list[float]] = {}
    for entry in audit:
        after = entry.get("nodeAfter")
        if entry.get("resource") != "nodes" or not after:
            continue
        if cordoned.get(entry["name"]) and not after["unschedulable"]:
            out.setdefault(entry["name"], []).append(entry["time"])
        cordoned[entry["name"]] = after["unschedulable"]
    return out


async def inventory_reads(admin, servers: list[str]) -> dict[str, list[float]]:
    """Each server's reads of its BMC's FirmwareInventory."""
    return {n: [e["time"] for e in await admin.server_audit(n) if e["method"] == "GET" and "FirmwareInventory"
                in e["path"]] for n in servers}  # fmt: skip


async def nvlink_domains(k8s, admin, power_link, client, queue: str, clique: dict[str, str]) -> None:
    """The servers of `clique` (server -> its clique label) Kubernetes nodes in service, the bundles' images served,
    and the cluster's budget letting five nodes out at once (a whole domain, its held nodes included)."""
    await k8s.seed(Fleet.model_validate({
        "cluster": "lab", "workloads": [],
        "nodes": [{"name": n, "gpus": 8, "labels": {CLIQUE_LABEL: clique[n]}} for n in sorted(clique)],
    }).to_objects())  # fmt: skip
    for name in sorted(clique):
        await follow(power_link, admin, name)
    await admin.set_images(IMAGES)
    await budget_set(client, "lab", count=5, by="sre", reason="a whole NVLink domain at once", task_queue=queue)


def most_at_once(windows: dict[str, tuple[float, float]]) -> int:
    edges = sorted([(start, 1) for start, _ in windows.values()] + [(end, -1) for _, end in windows.values()])
    at_once = most = 0
    for _, step in edges:
        at_once += step
        most = max(most, at_once)
    return most


async def _running_with_a_task(client, name: str) -> ServerFirmware | None:
    status = await firmware_status(client, name)
    return next((s for s in status.servers if s.state == "running" and any(c.task_state for c in s.components)), None)


async def status_where(handle, predicate, what: str) -> FleetFirmwareStatus:
    async def probe():
        s = await handle.query(FleetFirmwareUpdate.status)
        return s if predicate(s) else None

    return await wait_for(probe, what=what, timeout=60)


def test_waves_count_changed_servers_and_stop_at_the_threshold():
    book = WaveBook(FirmwareWaves(canary=1, batch_sizes=[3, 2], failure_threshold=2), max_concurrent=2)
    assert book.startable() and book.start("a") == 0 and not book.startable()  # the canary runs alone
    assert book.finished("a", changed=False, failed=False) is None and book.startable()  # already current: no place
    book.start("b")
    assert book.finished("b", changed=True, failed=False) is None and not book.startable() and book.next_wave()
    assert book.size == 3 and [book.start(s) for s in "cd"] == [1, 1] and not book.startable()  # BMC limit 2
    assert book.finished("c", changed=False, failed=True) is None  # one failure, threshold 2
    book.start("e")
    assert book.finished("d", changed=True, failed=False) is None and not book.startable()  # 3 of 3 changed or running
    assert book.finished("e", changed=False, failed=True) == "2 server(s) failed (threshold 2), the last e"
    book.resume()
    assert book.next_wave() and book.size == 2 and book.next_wave() is False
    assert WaveBook(FirmwareWaves(), 1).finished("x", changed=False, failed=True) == "the canary failed (x)"


async def test_a_fleet_updates_in_waves_under_the_budget_and_the_bmc_limit_then_a_rerun_changes_nothing(
    client, burnin_bmcs, bmc_admin, lab_hosts, burnin_worker, k8s, power_link
):
    servers = burnin_bmcs.names[:6]
    bare, current = servers[4], servers[1]  # a server no cluster knows; one already at the bundle's versions
    nodes = set(servers) - {bare}
    await k8s.seed(Fleet.model_validate({
        "cluster": "lab", "nodes": [{"name": n, "gpus": 8} for n in sorted(nodes)],
        "workloads": [{"name": f"trainer-{i}", "namespace": "training", "replicas": 1, "gpus": 8, "nodes": [n],
                       "emptyDir": True, "terminationGracePeriodSeconds": 1} for i, n in enumerate(sorted(nodes))],
    }).to_objects())  # fmt: skip
    for name in sorted(nodes):
        await follow(power_link, bmc_admin, name)
    await bmc_admin.set_images(IMAGES)
    await bmc_admin.set_firmware(current, {"BMC": "25.03", "BIOS": "1.9.0"})
    await bmc_admin.config(bmc_restart_seconds=0.5)
    waves = {"canary": 1, "batch_sizes": [3]}
    handle = await start(client, burnin_worker, fleet_input(burnin_bmcs, servers, nodes, waves=waves,
                                                            max_concurrent_bmcs=2))  # fmt: skip
    result = await handle.result()
    await record_history(handle, "fleet_firmware_update")

    assert result.counts == {"updated": 5, "up-to-date": 1} and result.aborted is None, result
    by_name = {s.server: s for s in result.servers}
    # The canary alone; the server already current took no place in wave 1, so it held three changed servers.
    assert {n: by_name[n].wave for n in servers} == {servers[0]: 0, current: 1, servers[2]: 1, servers[3]: 1,
                                                     bare: 1, servers[5]: 2}  # fmt: skip
    assert {c.state for c in by_name[current].components} == {"at-target"}
    assert {(c.name, c.state) for c in by_name[servers[5]].components} == {("BMC", "active"), ("BIOS", "active")}
    windows = await update_windows(bmc_admin, servers)
    assert set(windows) == set(servers) - {current}
    assert most_at_once(windows) <= 2  # the BMC limit, though wave 1 had three servers (one no lease held back)
    wave1 = [windows[n] for n in (servers[2], servers[3], bare)]
    assert windows[servers[0]][1] < min(start for start, _ in wave1)  # each wave after the one before finished
    assert max(end for _, end in wave1) < windows[servers[5]][0]
    audit = await k8s.audit()
    assert max_unavailable(audit, nodes) <= 2 and nodes_down_with_workload(audit) == []
    progress = await handle.query(FleetFirmwareUpdate.progress)
    assert (progress.phase, progress.done, progress.total) == ("completed", 6, 6)

    cursor = await k8s.audit_cursor()
    again = await (await start(client, burnin_worker, fleet_input(burnin_bmcs, servers, nodes))).result()
    assert again.counts == {"up-to-date": 6}
    assert [len(await updates_posted(bmc_admin, n)) for n in servers] == [2, 0, 2, 2, 2, 2]
    assert [e for e in await k8s.audit(since=cursor, writes=True) if e.get("resource") == "nodes"] == []


async def test_a_failure_stops_the_fleet_at_its_threshold_then_resume_pause_and_abort(
    client, burnin_bmcs, bmc_admin, lab_hosts, burnin_worker
):
    servers = burnin_bmcs.names[:4]
    await bmc_admin.set_images(IMAGES)
    await bmc_admin.set_update_faults(servers[1], {"BIOS": "flash write failed at block 42"})
    waves = {"canary": 1, "batch_sizes": [1], "failure_threshold": 1}
    inp = fleet_input(burnin_bmcs, servers, set(), BIOS_ONLY, waves=waves)
    handle = await start(client, burnin_worker, inp)

    stopped = await status_where(handle, lambda s: s.paused is not None and not any(
        x.state == "running" for x in s.servers), "the fleet stopped at its threshold")  # fmt: skip
    assert [x.state for x in stopped.servers] == ["updated", "failed", "pending", "pending"]
    assert "flash write failed at block 42" in stopped.servers[1].reason
    progress = await handle.query(FleetFirmwareUpdate.progress)
    assert progress.phase == "paused" and "stopped: 1 server(s) failed (threshold 1)" in progress.details
    assert "flash write failed at block 42" in progress.details

    name = inp.name  # the operator's controls, as the CLI sends them (starter/controls.py)
    await firmware_control(client, "resume", name, by="sre", reason="bad flash part on one server")
    await firmware_control(client, "pause", name, by="sre", reason="change freeze")
    running = await wait_for(lambda: _running_with_a_task(client, name), what="a running server's task state")
    assert running.server == servers[2] and [c.name for c in running.components] == ["BIOS"], running
    assert running.now.startswith(("updating: BIOS", "activating", "verifying")), running.now
    paused = await status_where(handle, lambda s: s.servers[2].state == "updated", "the running server finished")
    await asyncio.sleep(1)  # a paused fleet starts nothing
    assert (await handle.query(FleetFirmwareUpdate.status)).servers[3].state == "pending", paused
    with pytest.raises(Refused, match="already paused"):
        await firmware_control(client, "pause", name, by="sre", reason="twice")
    await firmware_control(client, "abort", name, by="sre", reason="postponed")
    result = await handle.result()
    await record_history(handle, "fleet_firmware_update_stop_abort")
    assert result.aborted == "postponed (by sre)" and result.counts == {"updated": 2, "failed": 1, "skipped": 1}
    assert (
        result.servers[3].reason == "fleet aborted: postponed (by sre)"
        and await updates_posted(bmc_admin, servers[3]) == []
    )
    status = await handle.query(FleetFirmwareUpdate.status)
    assert status.decisions == ["resume: bad flash part on one server (by sre)", "pause: change freeze (by sre)",
                                "abort: postponed (by sre)"]  # fmt: skip


async def test_a_server_failing_validation_after_its_firmware_goes_to_remediation_and_counts_failed(
    client, burnin_bmcs, bmc_admin, lab_hosts, burnin_worker, k8s, core, power_link
):
    good, bad = burnin_bmcs.names[6:8]
    await k8s.seed(Fleet.model_validate({"cluster": "lab", "nodes": [{"name": n, "gpus": 8} for n in (good, bad)],
                                         "workloads": []}).to_objects())  # fmt: skip
    await bmc_admin.set_gpu_faults(bad, {"missing_gpus": 1})  # a GPU off the bus once it boots
    for name in (good, bad):
        await follow(power_link, bmc_admin, name)
    await bmc_admin.set_images(IMAGES)
    waves = {"canary": 1, "batch_sizes": [1]}
    remediation = {"steps": ["restart-gpu-services"], "settle_timeout": 5, "burn_in_seconds": 1}
    inp = fleet_input(burnin_bmcs, [good, bad], {good, bad}, BIOS_ONLY, waves=waves, validation={"expected_gpus": 8},
                      remediation=remediation)  # fmt: skip
    handle = await start(client, burnin_worker, inp)
    result = await handle.result()
    await record_history(handle, "fleet_firmware_update_validation_failed")
    await record_history(client.get_workflow_handle(f"firmware-update/{bad}"), "firmware_update_validation_remediation")

    by_name = {s.server: s for s in result.servers}
    assert (by_name[good].state, by_name[bad].state) == ("updated", "failed"), result
    assert by_name[bad].reason.startswith("validation failed: ") and "count" in by_name[bad].reason, by_name[bad]
    assert by_name[bad].reason.endswith(f"; handed to remediation/lab/{bad}")
    # Remediation took the node on, still cordoned: its ladder could not bring the GPU back, so it quarantined it.
    remedied = await client.get_workflow_handle(f"remediation/lab/{bad}").result()
    assert (remedied["outcome"], [s["outcome"] for s in remedied["steps"]]) == ("quarantined", ["not-fixed"]), remedied
    assert remedied["reason"].startswith("validation failed after firmware bios-1.9.0")
    assert (await bmc_admin.server(bad))["firmware"]["BIOS"] == "1.9.0"  # installed; the node is what failed
    status = await handle.query(FleetFirmwareUpdate.status)
    assert status.paused is not None and "1 server(s) failed (threshold 1)" in status.paused
    node = await core.read_node(bad)
    quarantine = json.loads(node.metadata.annotations[QUARANTINE_ANNOTATION])
    assert (
        node.spec.unschedulable and node.metadata.annotations["millwright.dev/cordoned-by"] == f"remediation/lab/{bad}"
    )
    assert quarantine["by"] == f"remediation/lab/{bad}" and "remediation exhausted" in quarantine["reason"]
    assert "requested by firmware-update/" in remedied["note"]
    assert not (await core.read_node(good)).spec.unschedulable  # validated, then back in service


async def test_an_nvlink_domain_returns_to_service_only_once_every_tray_reads_back_one_firmware_set(
    client, burnin_bmcs, bmc_admin, lab_hosts, burnin_worker, k8s, core, power_link
):
    servers = burnin_bmcs.names[:5]
    x, y = [servers[0], servers[2], servers[4]], [servers[1], servers[3]]  # listed interleaved
    await nvlink_domains(k8s, bmc_admin, power_link, client, burnin_worker,
                         {**dict.fromkeys(x, "dom-x.1"), **dict.fromkeys(y, "dom-y.1")})  # fmt: skip
    inp = fleet_input(burnin_bmcs, servers, set(servers), BIOS_ONLY, batch_by="nvlinkDomain",
                      waves={"batch_sizes": [3]}, max_concurrent_bmcs=1)  # fmt: skip
    handle = await start(client, burnin_worker, inp)
    result = await handle.result()
    await record_history(handle, "fleet_firmware_update_nvlink_domain_hold")
    await record_history(client.get_workflow_handle(f"firmware-update/{x[0]}"), "firmware_update_node_handed_over")

    by_name = {s.server: s for s in result.servers}
    assert result.counts == {"updated": 5} and result.domains_held_out == [], result
    assert {n: by_name[n].wave for n in servers} == {**dict.fromkeys(y, 0), **dict.fromkeys(x, 1)}
    assert not any(s.held for s in result.servers)
    # One BMC at a time, so each domain's first tray was done long before its last one started: its node stayed
    # out until the last tray's versions were read back, then the domain's nodes came back together.
    reads, back = await inventory_reads(bmc_admin, servers), uncordons(await k8s.audit())
    windows = await update_windows(bmc_admin, servers)
    for domain in (x, y):
        assert max(reads[domain[0]]) < windows[domain[-1]][0], (reads, windows)
        assert min(back[n][0] for n in domain) > max(t for n in domain for t in reads[n]), (domain, reads, back)
        assert all(len(back[n]) == 1 for n in domain), back
    assert max(back[n][0] for n in y) < min(windows[n][0] for n in x)  # the canary domain back before the next wave
    first = await client.get_workflow_handle(f"firmware-update/{x[0]}").result()
    assert first["node_handed_to"] == inp.workflow_id(), first
    for name in servers:
        assert not (await core.read_node(name)).spec.unschedulable
    # History: a child (3 events) and an uncordon (3) a server, and at most a workflow task (3) for each of their
    # three ends; the rest (start, the topology read, the patch marker, phases, close) is the same for any fleet.
    events = [e async for e in handle.fetch_history_events()]
    assert len(events) <= 15 * len(servers) + 20, len(events)


async def test_waves_by_nvlink_domain_take_whole_domains_and_a_failed_tray_keeps_its_domain_out_until_a_rerun(
    client, burnin_bmcs, bmc_admin, lab_hosts, burnin_worker, k8s, core, power_link
):
    servers = burnin_bmcs.names[:6]
    bare = servers[5]  # no Kubernetes node: an NVLink domain of its own, the smallest, so the canary
    x, y = [servers[0], servers[2], servers[4]], [servers[1], servers[3]]  # listed interleaved
    await nvlink_domains(k8s, bmc_admin, power_link, client, burnin_worker,
                         {**dict.fromkeys(x, "dom-x.1"), **dict.fromkeys(y, "dom-y.1")})  # fmt: skip
    await bmc_admin.set_update_faults(x[1], {"BIOS": "flash write failed at block 7"})
    inp = fleet_input(burnin_bmcs, servers, set(x + y), BIOS_ONLY, batch_by="nvlinkDomain",
                      waves={"batch_sizes": [2], "failure_threshold": 1}, max_concurrent_bmcs=1)  # fmt: skip
    handle = await start(client, burnin_worker, inp)

    stopped = await status_where(handle, lambda s: s.paused is not None and not any(
        v.state == "running" for v in s.servers), "the fleet stopped inside domain x")  # fmt: skip
    states = {s.server: s.state for s in stopped.servers}
    assert [states[n] for n in x] == ["updated", "failed", "pending"] and states[bare] == "updated", states
    assert stopped.domains_left_mixed == ["dom-x"] and stopped.wave_domains == [[f"node:{bare}"], ["dom-x"]]
    assert stopped.topology == f"waves take whole NVLink domains; 1 server(s) each a NVLink domain of its own: " \
                               f"{bare} (no Kubernetes node)"  # fmt: skip
    # x's updated tray waits, out of service in the fleet's name, for the rest of its domain.
    assert [s.held for s in stopped.servers if s.server in x] == [True, False, False]
    held = await core.read_node(x[0])
    assert held.spec.unschedulable and held.metadata.annotations[CORDONED_BY] == inp.workflow_id()
    progress = await handle.query(FleetFirmwareUpdate.progress)
    assert "NVLink domains left on mixed firmware: dom-x" in progress.details, progress.details
    assert "1 node(s) held out until their NVLink domain is on one firmware set" in progress.details
    await firmware_control(client, "resume", inp.name, by="sre", reason="one bad flash part")
    result = await handle.result()
    await record_history(handle, "fleet_firmware_update_nvlink_domain_held_out")

    by_name = {s.server: s for s in result.servers}
    assert {n: (by_name[n].domain, by_name[n].wave) for n in servers} == {
        bare: (f"node:{bare}", 0), **{n: ("dom-x", 1) for n in x}, **{n: ("dom-y", 2) for n in y},
    }  # fmt: skip
    assert result.counts == {"updated": 5, "failed": 1} and result.domains_left_mixed == ["dom-x"], result
    status = await firmware_status(client, inp.name)  # `millwright firmware status`
    assert status.wave_domains == [[f"node:{bare}"], ["dom-x"], ["dom-y"]]
    assert status.domains_held_out == result.domains_held_out
    # On the BMCs: no server of a later wave started before every server of the wave before it had finished.
    windows = await update_windows(bmc_admin, servers)
    for earlier, later in ([bare], x), (x, y):
        assert max(windows[n][1] for n in earlier) < min(windows[n][0] for n in later), windows
    # The failed tray keeps its whole domain out, named in the result: the trays the fleet updated stay cordoned
    # and quarantined in its name, the failed one in its own update's; the other domain came back.
    [out] = result.domains_held_out
    assert (out.domain, out.nodes) == ("dom-x", [x[0], x[2]]), out
    assert f"{x[1]} failed (" in out.reason and "flash write failed at block 7" in out.reason, out.reason
    assert by_name[x[0]].reason == out.reason and by_name[x[0]].held and by_name[x[2]].held
    for name in x:
        node = await core.read_node(name)
        holder = f"firmware-update/{x[1]}" if name == x[1] else inp.workflow_id()
        quarantine = json.loads(node.metadata.annotations[QUARANTINE_ANNOTATION])
        assert node.spec.unschedulable and node.metadata.annotations[CORDONED_BY] == holder, name
        assert quarantine["by"] == holder and (quarantine["reason"] == out.reason) == (name != x[1]), quarantine
    for name in y:
        assert not (await core.read_node(name)).spec.unschedulable
    progress = await handle.query(FleetFirmwareUpdate.progress)
    assert "NVLink domains held out of service: dom-x" in progress.details, progress.details

    # The operator fixes the tray (the lab's fault fails one flash only) and runs the same fleet again: it finds the
    # domain whole and returns all of it, the quarantines gone.
    rerun = await start(client, burnin_worker, inp)
    again = await rerun.result()
    await record_history(rerun, "fleet_firmware_update_nvlink_domain_returned")
    assert again.counts == {"up-to-date": 5, "updated": 1} and again.domains_held_out == [], again
    for name in x:
        node = await core.read_node(name)
        assert not node.spec.unschedulable and QUARANTINE_ANNOTATION not in (node.metadata.annotations or {}), name
        assert not any(t.key == QUARANTINE_TAINT for t in node.spec.taints or []), name
