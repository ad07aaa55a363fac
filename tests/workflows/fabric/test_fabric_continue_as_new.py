"""The Fabric entity continues as new and carries its allocations: a dev server that suggests it after 20 events.

Tenants are isolated and released through IsolateTenant/ReleaseTenant (NetBox off) until the Fabric's workflow
has more than one run; the allocations made before any continue-as-new must survive it, no PKey is held by two
tenants, and the Fabric's state query agrees with UFM.
"""

from __future__ import annotations

import asyncio
import uuid

from tests.conftest import SUGGEST_CONTINUE_AS_NEW_AFTER as SUGGEST_AFTER
from tests.workflows.fabric.conftest import _worker
from tests.workflows.maintenance.test_node_maintenance import record_history
from workflows.fabric.fabric import Fabric
from workflows.fabric.isolation import IsolateTenant, IsolateTenantInput
from workflows.fabric.release import ReleaseTenant, ReleaseTenantInput


async def _run(client, worker, wf, inp):
    wid = f"{inp.workflow_id()}/{uuid.uuid4().hex[:6]}"
    return await client.execute_workflow(wf.run, inp, id=wid, task_queue=worker.task_queue)


async def test_fabric_continues_as_new_and_keeps_its_allocations(small_history_env, ufm, fleet, ufm_config):
    client = small_history_env.client
    fabric = f"can-{uuid.uuid4().hex[:6]}"
    hosts = list(fleet.ib_ports())
    ports = fleet.ib_ports()

    def isolate(tenant, *on):
        return _run(client, worker, IsolateTenant,
                    IsolateTenantInput(fabric=fabric, tenant=tenant, hosts=list(on), netbox=False))  # fmt: skip

    def release(tenant):
        return _run(client, worker, ReleaseTenant, ReleaseTenantInput(fabric=fabric, tenant=tenant, netbox=False))

    async with await _worker(client, ufm_config, None) as worker:
        first = await isolate("tenant-a", hosts[0])
        # Churn one host through isolate/release, then isolate several tenants at once: many Fabric updates.
        for i in range(4):
            churn = await isolate(f"churn-{i}", hosts[1])
            assert churn.pkey != first.pkey
            assert (await release(f"churn-{i}")).pkey_deleted
        together = await asyncio.gather(*(isolate(f"tenant-{h}", h) for h in hosts[2:]))
        last = await isolate("tenant-z", hosts[1])
        again = await isolate("tenant-a", hosts[0])  # idempotent: the same PKey, after the continue-as-new

        handle = client.get_workflow_handle(f"fabric/{fabric}")
        state = await handle.query(Fabric.state)

    runs = [e async for e in client.list_workflows(f"WorkflowId = 'fabric/{fabric}'")]
    assert len(runs) > 1, "the Fabric continued as new"
    assert max(e.history_length for e in runs) < 4 * SUGGEST_AFTER

    # The allocation made in the first run survived, and every live tenant holds its own PKey.
    assert again.pkey == first.pkey and again.already == sorted(ports[hosts[0]])
    held = {r.tenant: r.pkey for r in [first, *together, last]}
    assert len(set(held.values())) == len(held), f"a PKey handed out twice: {held}"
    assert {t: a.pkey for t, a in state.allocations.items()} == held
    assert all(a.state == "isolated" for a in state.allocations.values())
    assert state.changes > 2 * len(held), "the change counter was carried, not restarted"

    # The Fabric's desired state agrees with UFM (which also holds its default PKey, 0x7fff).
    ufm_pkeys = set((await ufm.state())["pkeys"]) - {"0x7fff"}
    assert ufm_pkeys == set(held.values())
    expected = {"tenant-a": hosts[0], "tenant-z": hosts[1], **{f"tenant-{h}": h for h in hosts[2:]}}
    for a in state.allocations.values():
        assert set(a.members) == set(ports[expected[a.tenant]])
        assert await ufm.members(a.pkey) == {g: "full" for g in a.members}


async def test_audit_continues_as_new_between_pkeys_and_reports_every_drift_once(small_history_env, ufm, fleet,
                                                                                 ufm_config):  # fmt: skip
    """FabricAudit one PKey at a time: it continues as new between PKeys and its drift report (and repair) is the
    one a single run would give: every item once, the counts exact."""
    from lab.ufm import fleet_seed
    from workflows.fabric.audit import FabricAudit, FabricAuditInput
    from workflows.fabric.models import Allocation, FabricInput, FabricState

    client = small_history_env.client
    fabric = f"aud-{uuid.uuid4().hex[:6]}"
    ports = fleet.ib_ports()
    h = list(ports)
    g = {host: sorted(ports[host]) for host in h}
    tenants = {f"t{i}": (f"0x{0x101 + i:x}", h[i]) for i in range(5)}  # h[5] belongs to no tenant
    state = FabricState(allocations={t: Allocation(tenant=t, pkey=p, members={x: host for x in g[host]},
                                                   state="isolated") for t, (p, host) in tenants.items()})  # fmt: skip
    full = lambda *guids: {x: "full" for x in guids}
    await ufm.seed({**fleet_seed(fleet), "pkeys": {
        "0x101": {"guids": full(g[h[0]][0])},                              # missing-member g[h0][1]
        "0x102": {"guids": full(*g[h[1]], g[h[5]][0])},                    # unknown-member g[h5][0]
        "0x103": {"guids": full(*g[h[2]], g[h[3]][0])},                    # guid-in-two-tenants g[h3][0] (t3's)
        "0x104": {"guids": {g[h[3]][0]: "full", g[h[3]][1]: "limited"}},   # wrong-membership g[h3][1]
        "0x7000": {"guids": {}},                                           # no tenant's; 0x105 absent
    }})  # fmt: skip
    expected = {
        ("missing-member", "0x101", g[h[0]][1], h[0]), ("unknown-member", "0x102", g[h[5]][0], h[5]),
        ("guid-in-two-tenants", "0x103", g[h[3]][0], h[3]), ("wrong-membership", "0x104", g[h[3]][1], h[3]),
        ("missing-pkey", "0x105", None, None), *{("missing-pkey", "0x105", x, h[4]) for x in g[h[4]]},
    }  # fmt: skip

    async with await _worker(client, ufm_config, None) as worker:
        await client.start_workflow(Fabric.run, FabricInput(fabric=fabric, state=state), id=f"fabric/{fabric}",
                                    task_queue=worker.task_queue)  # fmt: skip

        async def audit(repair: bool):
            inp = FabricAuditInput(fabric=fabric, repair=repair, concurrency=1)
            wid = f"{inp.workflow_id()}/{uuid.uuid4().hex[:6]}"
            return wid, await client.execute_workflow(FabricAudit.run, inp, id=wid, task_queue=worker.task_queue)

        wid, found = await audit(repair=False)
        assert {(d.kind, d.pkey, d.guid, d.host) for d in found.drift} == expected and len(found.drift) == 7
        assert (found.drift_total, found.clean, found.repaired) == (7, False, [])
        assert found.drift_counts == {"missing-member": 1, "unknown-member": 1, "guid-in-two-tenants": 1,
                                      "wrong-membership": 1, "missing-pkey": 3}  # fmt: skip
        assert found.checked_pkeys == [p for p, _ in tenants.values()]
        assert "0x7000" in found.unmanaged_pkeys and not set(found.unmanaged_pkeys) & set(found.checked_pkeys)
        runs = sorted([e async for e in client.list_workflows(f"WorkflowId = '{wid}'")], key=lambda e: e.start_time)
        assert len(runs) > 2, "the audit continued as new between PKeys"
        first = client.get_workflow_handle(wid, run_id=runs[0].run_id)
        await record_history(first, "fabric_audit_posture_by_pkey")

        _, fixed = await audit(repair=True)
        assert fixed.drift_total == 7 and fixed.repaired_total == len(fixed.repaired) == 7
        _, clean = await audit(repair=False)
    assert clean.clean and clean.drift_total == 0
    for t, (pkey, host) in tenants.items():
        assert await ufm.members(pkey) == full(*g[host]), t
