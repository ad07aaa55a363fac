"""The Fabric entity continues as new and carries its allocations: a dev server that suggests it after 20 events.

Tenants are isolated and released through IsolateTenant/ReleaseTenant (NetBox off) until the Fabric's workflow
has more than one run; the allocations made before any continue-as-new must survive it, no PKey is held by two
tenants, and the Fabric's state query agrees with UFM.
"""

from __future__ import annotations

import asyncio
import uuid


from tests.conftest import SUGGEST_CONTINUE_AS_NEW_AFTER as SUGGEST_AFTER
from tests.ufm.conftest import _worker
from workflows.fabric import Fabric, IsolateTenant, IsolateTenantInput, ReleaseTenant, ReleaseTenantInput


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
