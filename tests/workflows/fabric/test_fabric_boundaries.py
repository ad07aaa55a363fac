"""What IsolateTenant and ReleaseTenant refuse before any write (docs/fabric.md, "What isolation refuses"): a host
whose ports are in another tenant's PKey (this fabric's, another fabric's on the same UFM, or one made by hand), a
tenant PKey outside the fabric's range, the management key. Judged from the UFM emulator's write audit log."""

from __future__ import annotations

import pytest
from pydantic import ValidationError
from temporalio.client import WorkflowFailureError

from tests.workflows.fabric.conftest import ufm_http
from tests.workflows.fabric.test_fabric import _fabric, guids_of, hosts, run
from workflows.fabric.fabric import Fabric
from workflows.fabric.isolation import IsolateTenant, IsolateTenantInput
from workflows.fabric.models import Allocation, FabricInput, FabricState
from workflows.fabric.release import ReleaseTenant, ReleaseTenantInput


async def refused(client, worker, wf, inp):
    """The run's failure, by its root cause (type, message)."""
    with pytest.raises(WorkflowFailureError) as info:
        await run(client, worker, wf, inp)
    cause = info.value.cause
    while getattr(cause, "cause", None) is not None:
        cause = cause.cause
    return cause.type, cause.message


async def test_hosts_in_another_tenants_pkey_are_refused_before_any_write(client, ufm_worker, ufm, ufm_stub, fleet):
    h = hosts(fleet)
    fabric, other = _fabric(), _fabric()
    a = await run(client, ufm_worker, IsolateTenant, IsolateTenantInput(fabric=fabric, tenant="ta", hosts=h[0:2],
                                                                       netbox=False))  # fmt: skip
    async with ufm_http(ufm_stub) as c:  # a partition someone made by hand
        (
            await c.post("/resources/pkeys", json={"pkey": "0x42", "guids": sorted(guids_of(fleet, h[4]))})
        ).raise_for_status()
    before = await ufm.state()
    cursor = await ufm.audit_cursor()
    for fab, tenant, asked, port_of, whose in (
        (fabric, "tb", [h[1], h[2]], h[1], f"PKey {a.pkey} (tenant ta's)"),  # the same fabric's books
        (other, "tc", [h[2], h[1]], h[1], f"PKey {a.pkey} (not this fabric's"),  # another fabric on this UFM
        (fabric, "td", [h[4]], h[4], "PKey 0x42 (not this fabric's"),  # made by hand
    ):
        kind, message = await refused(client, ufm_worker, IsolateTenant,
                                      IsolateTenantInput(fabric=fab, tenant=tenant, hosts=asked, netbox=False))  # fmt: skip
        assert kind == "HostOfAnotherTenant" and message.startswith("hosts: "), message
        assert f"host {port_of}'s port" in message and whose in message and "Nothing was changed" in message
        assert h[2] not in message  # a free host is not named
    assert await ufm.audit(since=cursor, writes=True) == [] and await ufm.state() == before
    # The tenant itself may isolate again: its own PKey is not another's.
    again = await run(client, ufm_worker, IsolateTenant, IsolateTenantInput(fabric=fabric, tenant="ta", hosts=h[0:2],
                                                                           netbox=False),
                      record="isolate_tenant_ports_checked")  # fmt: skip
    assert again.pkey == a.pkey and not again.added


async def test_a_tenant_pkey_outside_the_fabrics_range_is_never_written(client, ufm_worker, ufm, ufm_stub, fleet):
    h = hosts(fleet)
    fabric = _fabric()
    ports = {g: h[0] for g in guids_of(fleet, h[0])}
    async with ufm_http(ufm_stub) as c:
        (await c.post("/resources/pkeys", json={"pkey": "0x50", "guids": sorted(ports)})).raise_for_status()
    # The fabric's books say tenant "old" holds 0x50, below the range it hands out (0x100-0x7ffe).
    state = FabricState(allocations={"old": Allocation(tenant="old", pkey="0x50", members=ports, state="isolated")})
    entity = FabricInput(fabric=fabric, state=state)
    await client.start_workflow(Fabric.run, entity, id=entity.workflow_id(), task_queue=ufm_worker.task_queue)
    cursor = await ufm.audit_cursor()
    for wf, inp in (
        (ReleaseTenant, ReleaseTenantInput(fabric=fabric, tenant="old", netbox=False)),
        (IsolateTenant, IsolateTenantInput(fabric=fabric, tenant="old", hosts=[h[0]], netbox=False)),
    ):
        kind, message = await refused(client, ufm_worker, wf, inp)
        assert kind == "FabricRefused", (kind, message)
        assert "tenant old holds PKey 0x50 is outside this fabric's range 0x100-0x7ffe" in message, message
    assert await ufm.audit(since=cursor, writes=True) == []
    assert set(await ufm.members("0x50")) == set(ports)
    await client.get_workflow_handle(entity.workflow_id()).terminate("test over")


def test_the_management_key_and_a_reversed_range_are_refused_at_the_edge():
    with pytest.raises(ValidationError) as err:
        FabricInput(fabric="f", state={"allocations": {"x": {"tenant": "x", "pkey": "0x7fff"}}})
    assert "state.allocations.x.pkey" in str(err.value) and "management key" in str(err.value)
    with pytest.raises(ValidationError, match="0xffff"):
        Allocation(tenant="x", pkey="0xffff")
    with pytest.raises(ValidationError, match="pkey_first: 0x200 is above pkey_last 0x100"):
        FabricInput(fabric="f", pkey_first="0x200", pkey_last="0x100")
