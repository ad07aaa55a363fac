"""IsolateTenant / ReleaseTenant / FabricAudit on the real dev server with the UFM emulator.

What the workflows did is judged from the emulator's state and write audit log, not from their results.
"""

from __future__ import annotations

import asyncio
import base64
import uuid
from collections import Counter

import httpx
import pytest
from temporalio.client import WorkflowFailureError

from tests.workflows.fabric.conftest import PASSWORD, TOKEN, ufm_http
from tests.workflows.maintenance.test_node_maintenance import record_history
from workflows.fabric.audit import FabricAudit, FabricAuditInput
from workflows.fabric.isolation import IsolateTenant, IsolateTenantInput
from workflows.fabric.release import ReleaseTenant, ReleaseTenantInput

STARTED: list[str] = []


def _fabric() -> str:
    return f"ib-{uuid.uuid4().hex[:6]}"


async def run(client, worker, wf, inp, record: str | None = None):
    """Run `wf` to its result; `record` names the history kept for replay tests (tests/histories/README.md)."""
    wid = f"{inp.workflow_id()}/{uuid.uuid4().hex[:6]}"
    STARTED.append(wid)
    handle = await client.start_workflow(wf.run, inp, id=wid, task_queue=worker.task_queue)
    result = await handle.result()
    if record:
        await record_history(handle, record)
    return result


def guids_of(fleet, *hosts) -> set[str]:
    ports = fleet.ib_ports()
    return {g for h in hosts for g in ports[h]}


def hosts(fleet) -> list[str]:
    return list(fleet.ib_ports())


# ---------------------------------------------------------------- the emulator itself


async def test_emulator_validates_like_ufm(ufm, ufm_stub, fleet):
    g = sorted(guids_of(fleet, hosts(fleet)[0]))
    async with ufm_http(ufm_stub) as c:
        assert (await c.post("/resources/pkeys", json={"pkey": "0x7fff", "guids": g})).status_code == 400
        assert (await c.post("/resources/pkeys", json={"pkey": "0x8000", "guids": g})).status_code == 400
        assert (await c.post("/resources/pkeys", json={"pkey": "0x0", "guids": g})).status_code == 400
        assert (await c.post("/resources/pkeys", json={"pkey": "0x10", "guids": ["xyz"]})).status_code == 400
        r = await c.post("/resources/pkeys", json={"pkey": "0x10", "guids": g, "membership": "partial"})
        assert r.status_code == 400 and "membership" in r.json()["error"]
        assert (await c.post("/resources/pkeys/add", json={"pkey": "0x10"})).status_code == 200
        assert (await c.post("/resources/pkeys", json={"pkey": "0x10", "guids": g[:1]})).status_code == 200
        assert (
            await c.post("/resources/pkeys", json={"pkey": "0x10", "guids": g[1:], "membership": "limited"})
        ).status_code == 200
        one = (await c.get("/resources/pkeys/0x10", params={"guids_data": "true"})).json()
        assert {x["guid"]: x["membership"] for x in one["guids"]} == {g[0]: "full", g[1]: "limited"}
        assert (await c.delete(f"/resources/pkeys/0x10/guids/{g[0]},{'0' * 16}")).status_code == 200
        assert await ufm.members("0x10") == {g[1]: "limited"}
        assert "0x10" in (await c.get("/resources/pkeys")).json()
        # QoS only when asked for, in the guide's shape; the management PKey reports its default membership.
        assert set((await c.get("/resources/pkeys/0x10")).json()) == {"partition", "ip_over_ib"}
        qos = (await c.get("/resources/pkeys/0x10", params={"qos_conf": "true"})).json()["qos_conf"]
        assert qos == {"mtu_limit": 2, "service_level": 0, "rate_limit": 2.5}
        management = (await c.get("/resources/pkeys/0x7fff", params={"guids_data": "true"})).json()
        assert management["membership"] == "limited" and management["guids"] == []  # fleet_seed's posture
        assert (await c.get("/app/smconf", params={"param_name": "m_key_per_port"})).json() == {"m_key_per_port": True}
        # Removing the last member deletes the PKey, as UFM does.
        assert (
            await c.post("/actions/remove_guids_from_pkey", json={"pkey": "0x10", "guids": [g[1]]})
        ).status_code == 200
        assert "0x10" not in (await c.get("/resources/pkeys")).json()
        assert "last_updated" in (await c.get("/resources/pkeys/last_updated")).json()
        assert (await c.get("/app/ufm_version")).json()["ufm_release_version"] == "6.22.1-2"
        assert (await c.get("/resources/pkeys", auth=("admin", "wrong"))).status_code == 401
    async with httpx.AsyncClient(base_url=ufm_stub.url) as c:
        ok = await c.get("/ufmRestV3/resources/systems", headers={"Authorization": f"Basic {TOKEN}"})
        assert ok.status_code == 200 and {s["type"] for s in ok.json()} == {"host", "switch"}
        assert (await c.get("/ufmRestV3/resources/systems", headers={"Authorization": "Basic x"})).status_code == 401


async def test_emulator_lists_every_system_with_its_ip(ufm, ufm_stub):
    """UFM's Systems API gives every system, switches included, an ``ip`` (its management address)."""
    async with ufm_http(ufm_stub) as c:
        systems = (await c.get("/resources/systems")).json()
        switches = (await c.get("/resources/systems", params={"type": "switch"})).json()
    assert switches and all(s["type"] == "switch" for s in switches)
    ips = [s["ip"] for s in systems]
    assert all(ips) and len(set(ips)) == len(ips)


async def test_emulator_places_a_fault_by_the_audit_order(ufm, ufm_stub):
    """A fault `after` another is armed only once that one was served; `skip` lets matching requests through first."""
    write = await ufm.add_fault({"method": "POST", "path": r"/resources/pkeys/add$"}, {"status": 503})
    await ufm.add_fault(
        {"method": "GET", "path": r"/resources/pkeys/0x[0-9a-f]+$"}, {"status": 403}, after=write, skip=1
    )
    async with ufm_http(ufm_stub) as c:
        assert (await c.get("/resources/pkeys/0x20")).status_code == 404  # before the write's fault: not armed
        assert (await c.post("/resources/pkeys/add", json={"pkey": "0x20"})).status_code == 503
        assert (await c.get("/resources/pkeys/0x20")).status_code == 404  # skipped
        assert (await c.get("/resources/pkeys/0x20")).status_code == 403
        assert (await c.get("/resources/pkeys/0x20")).status_code == 404  # spent
    with pytest.raises(httpx.HTTPStatusError):
        await ufm.add_fault({"method": "GET"}, {"status": 500}, after=999)


# ---------------------------------------------------------------- isolate, with the NetBox cross-check


async def test_two_tenants_isolated_concurrently_get_distinct_pkeys(client, ufm_nb_worker, nb_fleet, ufm, fleet, nb):
    h = hosts(fleet)
    fabric = _fabric()
    a = IsolateTenantInput(fabric=fabric, tenant=f"t-a-{fabric}", tenant_name=f"A {fabric}", hosts=h[0:2])
    b = IsolateTenantInput(fabric=fabric, tenant=f"t-b-{fabric}", tenant_name=f"B {fabric}", hosts=h[2:4])
    ra, rb = await asyncio.gather(
        run(client, ufm_nb_worker, IsolateTenant, a), run(client, ufm_nb_worker, IsolateTenant, b)
    )
    assert ra.pkey != rb.pkey
    assert set(await ufm.members(ra.pkey)) == guids_of(fleet, *h[0:2])
    assert set(await ufm.members(rb.pkey)) == guids_of(fleet, *h[2:4])
    writes = await ufm.audit(writes=True)
    assert not [w for w in writes if w["method"] == "PUT"], "never the replacing call"
    # NetBox records the PKey on each tenant.
    for r in (ra, rb):
        tenant = nb.tenancy.tenants.get(slug=r.tenant)
        assert tenant.custom_fields["millwright_pkey"] == r.pkey
    # Isolating again changes nothing and reuses the PKey.
    again = await run(client, ufm_nb_worker, IsolateTenant, a)
    assert again.pkey == ra.pkey and not again.added and not again.pkey_created


async def test_guid_mismatch_fails_closed_without_touching_ufm(client, ufm_nb_worker, nb_fleet, ufm, fleet):
    h = hosts(fleet)
    iface = nb_fleet[(h[4], 1)]
    iface.update({"custom_fields": {"millwright_ib_port_guid": "b8cef60300000bad"}})
    try:
        cursor = await ufm.audit_cursor()
        inp = IsolateTenantInput(fabric=_fabric(), tenant="t-mismatch", hosts=[h[3], h[4]])
        with pytest.raises(WorkflowFailureError) as info:
            await run(client, ufm_nb_worker, IsolateTenant, inp)
        cause = info.value.cause
        while getattr(cause, "cause", None) is not None:
            cause = cause.cause
        assert cause.type == "GuidMismatch" and h[4] in cause.message and h[3] not in cause.message
        assert await ufm.audit(since=cursor, writes=True) == []
    finally:
        iface.update({"custom_fields": {"millwright_ib_port_guid": fleet.ib_ports()[h[4]][1]}})


# ---------------------------------------------------------------- release and audit (UFM only)


async def test_release_leaves_other_members_intact(client, ufm_worker, ufm, ufm_stub, fleet):
    h = hosts(fleet)
    fabric = _fabric()
    ra = await run(
        client,
        ufm_worker,
        IsolateTenant,
        IsolateTenantInput(fabric=fabric, tenant="ta", hosts=h[0:2], netbox=False),
        record="isolate_tenant_created",
    )
    rb = await run(
        client, ufm_worker, IsolateTenant, IsolateTenantInput(fabric=fabric, tenant="tb", hosts=h[2:4], netbox=False)
    )
    storage = sorted(guids_of(fleet, h[5]))[0]
    async with ufm_http(ufm_stub) as c:  # a shared storage port joins tenant a's PKey out of band
        (await c.post("/resources/pkeys", json={"pkey": ra.pkey, "guids": [storage]})).raise_for_status()
    rel = await run(
        client,
        ufm_worker,
        ReleaseTenant,
        ReleaseTenantInput(fabric=fabric, tenant="ta", netbox=False),
        record="release_tenant_kept",
    )
    assert set(rel.removed) == guids_of(fleet, *h[0:2])
    assert not rel.pkey_deleted and rel.remaining == {storage: "full"}
    assert await ufm.members(ra.pkey) == {storage: "full"}
    assert set(await ufm.members(rb.pkey)) == guids_of(fleet, *h[2:4])
    # The kept PKey is retired: a new tenant gets another one.
    rc = await run(
        client, ufm_worker, IsolateTenant, IsolateTenantInput(fabric=fabric, tenant="tc", hosts=h[0:1], netbox=False)
    )
    assert rc.pkey not in (ra.pkey, rb.pkey)
    relb = await run(
        client,
        ufm_worker,
        ReleaseTenant,
        ReleaseTenantInput(fabric=fabric, tenant="tb", netbox=False),
        record="release_tenant_deleted",
    )
    assert relb.pkey_deleted and rb.pkey not in (await ufm.state())["pkeys"]
    # Releasing twice is a no-op.
    again = await run(client, ufm_worker, ReleaseTenant, ReleaseTenantInput(fabric=fabric, tenant="tb", netbox=False))
    assert again.pkey is None


async def test_release_reports_ufms_deletion_read_from_ufm_after_a_lost_answer(client, ufm_worker, ufm, fleet):
    """The removal's answer is lost after UFM removed the last members (deleting the PKey) and its read back
    fails: the retry finds nothing to remove, so its answer says nothing was deleted. The release reads UFM before
    and after, and reports the PKey deleted by UFM, and the ports as removed."""
    from starter.questions import current_details

    h = hosts(fleet)
    fabric = _fabric()
    iso = await run(
        client, ufm_worker, IsolateTenant, IsolateTenantInput(fabric=fabric, tenant="ta", hosts=h[0:1], netbox=False)
    )
    lost = await ufm.add_fault({"method": "POST", "path": r"/remove_guids_from_pkey$"}, {"drop": "after"})
    await ufm.add_fault({"method": "GET", "path": r"/resources/pkeys/0x[0-9a-f]+$"}, {"status": 503}, after=lost)
    inp = ReleaseTenantInput(fabric=fabric, tenant="ta", netbox=False)
    wid = f"{inp.workflow_id()}/{uuid.uuid4().hex[:6]}"
    STARTED.append(wid)
    handle = await client.start_workflow(ReleaseTenant.run, inp, id=wid, task_queue=ufm_worker.task_queue)
    rel = await handle.result()
    assert [f for f in (await ufm._req("GET", "/_lab/faults"))["faults"] if f["remaining"]] == [], "both faults hit"
    assert iso.pkey not in (await ufm.state())["pkeys"]
    assert rel.pkey_deleted and set(rel.removed) == guids_of(fleet, h[0]) and not rel.already_absent
    assert f"PKey {iso.pkey} deleted by UFM with its last member" in await current_details(handle)


async def test_audit_finds_drift_and_repairs_only_when_asked(client, ufm_worker, ufm, ufm_stub, fleet):
    h = hosts(fleet)
    fabric = _fabric()
    ra = await run(
        client, ufm_worker, IsolateTenant, IsolateTenantInput(fabric=fabric, tenant="ta", hosts=h[0:2], netbox=False)
    )
    rb = await run(
        client, ufm_worker, IsolateTenant, IsolateTenantInput(fabric=fabric, tenant="tb", hosts=h[2:4], netbox=False)
    )
    clean = await run(client, ufm_worker, FabricAudit, FabricAuditInput(fabric=fabric))
    assert clean.clean and set(clean.checked_pkeys) == {ra.pkey, rb.pkey}

    lost = sorted(guids_of(fleet, h[0]))[0]
    stranger = sorted(guids_of(fleet, h[5]))[0]
    leaked = sorted(guids_of(fleet, h[2]))[0]
    async with ufm_http(ufm_stub) as c:
        (await c.delete(f"/resources/pkeys/{ra.pkey}/guids/{lost}")).raise_for_status()
        (await c.post("/resources/pkeys", json={"pkey": ra.pkey, "guids": [stranger, leaked]})).raise_for_status()
    before = await ufm.state()
    cursor = await ufm.audit_cursor()
    found = await run(client, ufm_worker, FabricAudit, FabricAuditInput(fabric=fabric))
    kinds = {(d.kind, d.pkey, d.guid, d.host) for d in found.drift}
    assert kinds == {
        ("missing-member", ra.pkey, lost, h[0]),
        ("unknown-member", ra.pkey, stranger, h[5]),
        ("guid-in-two-tenants", ra.pkey, leaked, h[2]),
    }, found.drift
    assert not found.clean and not found.repaired
    assert await ufm.audit(since=cursor, writes=True) == [] and await ufm.state() == before

    fixed = await run(
        client,
        ufm_worker,
        FabricAudit,
        FabricAuditInput(fabric=fabric, repair=True),
        record="fabric_audit_by_pkey_repair",
    )
    assert len(fixed.repaired) == 3
    assert set(await ufm.members(ra.pkey)) == guids_of(fleet, *h[0:2])
    assert set(await ufm.members(rb.pkey)) == guids_of(fleet, *h[2:4])
    assert (await run(client, ufm_worker, FabricAudit, FabricAuditInput(fabric=fabric))).clean


async def test_audit_recognises_virtual_guids_and_repairs_only_those_of_no_tenant(client, ufm_worker, ufm, fleet,
                                                                                  ufm_stub):  # fmt: skip
    from lab.ufm import fleet_seed

    h, ports = hosts(fleet), fleet.ib_ports()
    on = {n: sorted(ports[h[n]])[0] for n in (0, 2, 5)}
    own, others, orphan, stray = (f"0002c90000000c0{i}" for i in range(1, 5))  # stray: no virtual port UFM knows
    await ufm.seed({**fleet_seed(fleet), "vports": [{"port_guid": on[0], "guid": own},
                                                    {"port_guid": on[2], "guid": others},
                                                    {"port_guid": on[5], "guid": orphan}]})  # fmt: skip
    fabric = _fabric()
    ra = await run(
        client, ufm_worker, IsolateTenant, IsolateTenantInput(fabric=fabric, tenant="ta", hosts=h[0:2], netbox=False)
    )
    await run(
        client, ufm_worker, IsolateTenant, IsolateTenantInput(fabric=fabric, tenant="tb", hosts=h[2:4], netbox=False)
    )
    async with ufm_http(ufm_stub) as c:  # VMs' virtual ports join tenant a's PKey
        (
            await c.post("/resources/pkeys", json={"pkey": ra.pkey, "guids": [own, others, orphan, stray]})
        ).raise_for_status()
    found = await run(client, ufm_worker, FabricAudit, FabricAuditInput(fabric=fabric))
    assert {(d.kind, d.guid, d.host) for d in found.drift} == {
        ("virtual-member-of-other-tenant", others, h[2]),
        ("unknown-virtual-member", orphan, h[5]),
        ("unknown-member", stray, "unknown host"),
    }, found.drift
    assert found.virtual_members == [f"{ra.pkey} (ta): virtual port {own} of {h[0]} (on port {on[0]})"]
    fixed = await run(
        client,
        ufm_worker,
        FabricAudit,
        FabricAuditInput(fabric=fabric, repair=True),
        record="fabric_audit_virtual_members",
    )
    assert sorted(fixed.repaired) == sorted(f"removed {g} from {ra.pkey}" for g in (orphan, stray))
    assert set(await ufm.members(ra.pkey)) == guids_of(fleet, *h[0:2]) | {own, others}  # tenants' VMs stay


# ---------------------------------------------------------------- a worker SIGKILLed between add and verify


async def test_worker_killed_between_add_and_verify(
    client, temporal_address, ufm, ufm_stub, ufm_secret_file, fleet, tmp_path
):
    import yaml

    from lab.k8s.admin import kubeconfig
    from tests.worker_process import spawn_worker, stop_worker, wait_polling, worker_env

    kube = tmp_path / "kubeconfig"
    kube.write_text(yaml.safe_dump(kubeconfig("http://127.0.0.1:9", "lab")))
    task_queue = f"ufm-crash-{uuid.uuid4().hex[:8]}"
    env = worker_env(
        tmp_path,
        temporal_address,
        kube,
        MILLWRIGHT_TASK_QUEUE=task_queue,
        MILLWRIGHT_UFM_URL=ufm_stub.url,
        MILLWRIGHT_UFM_CREDENTIALS=f"file:{ufm_secret_file}",
    )
    h = hosts(fleet)
    # The add is carried out and logged, then its answer is held: the worker dies before it can verify.
    await ufm.add_fault({"method": "POST", "path": r"/resources/pkeys$"}, {"delayAfter": 30})
    log = tmp_path / "worker.log"
    worker = spawn_worker(env, log)
    try:
        await wait_polling(client, task_queue, worker, log)
        inp = IsolateTenantInput(fabric=_fabric(), tenant="tk", hosts=h[1:4], netbox=False)
        wid = f"{inp.workflow_id()}/{uuid.uuid4().hex[:6]}"
        STARTED.append(wid)
        handle = await client.start_workflow(IsolateTenant.run, inp, id=wid, task_queue=task_queue)
        for _ in range(200):
            if [w for w in await ufm.audit(writes=True) if w["method"] == "POST" and w["path"].endswith("/pkeys")]:
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError(f"the add never reached UFM:\n{log.read_text()}")
        worker.kill()
        worker.wait(10)
        worker = spawn_worker(env, log)
        result = await asyncio.wait_for(handle.result(), timeout=60)
    finally:
        stop_worker(worker)
    want = guids_of(fleet, *h[1:4])
    assert await ufm.members(result.pkey) == {g: "full" for g in want}
    adds = [w for w in await ufm.audit(writes=True) if w["method"] == "POST" and w["path"].endswith("/pkeys")]
    assert len(adds) == 1, adds  # the retry found the members present: no second add
    assert Counter(g for w in adds for g in w["body"]["guids"]) == Counter(want)
    # This run added them (its first attempt did): the report says so, read from UFM before the first write.
    assert set(result.added) == want and not result.already and result.pkey_created


# ---------------------------------------------------------------- secrecy (keep last)


async def test_ufm_credentials_and_sm_keys_absent_from_every_history(client, fleet):
    from lab.ufm import fleet_seed

    sm_keys = [v for k, v in fleet_seed(fleet)["smconf"].items() if k.endswith("_key")]  # read by every posture check
    secrets = [PASSWORD, TOKEN, base64.b64encode(f"admin:{PASSWORD}".encode()).decode(), *sm_keys]
    scanned = 0
    async for wf in client.list_workflows():
        history = await client.get_workflow_handle(wf.id, run_id=wf.run_id).fetch_history()
        text = history.to_json()
        assert not any(s in text for s in secrets), f"a UFM credential or SM key in the history of {wf.id}"
        scanned += 1
    assert scanned >= len(STARTED) > 0
