"""Isolation against each UFM release the emulator plays (lab/ufm_fabric.py profiles 6.17, 6.19, 6.22), judged from the
emulator's state and its request log: the posture refuses a fabric whose management PKey voids isolation; a
600-host tenant is isolated and released without a 414 from UFM's front; a PKey UFM deletes with its last member
is reported deleted; a missing PKey answered 200 {} is created; a membership repair is a PUT, read back.

Each test starts a worker of its own: the client reads UFM's version once per worker."""

from __future__ import annotations

import uuid

import pytest
import pytest_asyncio
from temporalio.client import Client, WorkflowFailureError
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.exceptions import ApplicationError, TemporalError
from temporalio.runtime import MetricBuffer, Runtime, TelemetryConfig
from temporalio.testing import ActivityEnvironment

from activities.ufm.activities import UfmActivities
from activities.ufm.models import AddGuids, EnsurePKey, PKeyRef
from lab.ufm import fleet_seed
from tests.workflows.fabric.conftest import SUFFIX, _worker, ufm_http
from workflows.fabric.audit import FabricAudit, FabricAuditInput
from workflows.fabric.fabric import Fabric
from workflows.fabric.isolation import IsolateTenant, IsolateTenantInput
from workflows.fabric.release import ReleaseTenant, ReleaseTenantInput

pytestmark = pytest.mark.timeout(240)
VERSIONS = ["6.17", "6.19", "6.22"]
FABRIC_WORKFLOWS = [Fabric, IsolateTenant, ReleaseTenant, FabricAudit]  # fewer to check: a worker starts sooner
UNREPORTED = ["default-membership-unreported"]


@pytest.fixture(scope="module")
def big_fleet():
    from lab.fleet import Fleet, InfiniBandSpec, NodeGenerator

    return Fleet(
        cluster="lab",
        nodes=[NodeGenerator(prefix=f"big{SUFFIX}-", count=600)],
        infiniband=InfiniBandSpec(fabric="lab-ib", ports_per_host=2, switches=2),
    )


@pytest.fixture(scope="module")
def metrics() -> MetricBuffer:
    return MetricBuffer(10_000)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def metered_client(client, temporal_address, metrics) -> Client:
    """A client on a runtime whose metrics land in `metrics`, so the gauges workflows set can be read."""
    return await Client.connect(
        temporal_address,
        namespace=client.namespace,
        data_converter=pydantic_data_converter,
        runtime=Runtime(telemetry=TelemetryConfig(metrics=metrics)),
    )


def gauge(metrics: MetricBuffer, name: str, fabric: str) -> list[float]:
    return [u.value for u in metrics.retrieve_updates()
            if u.metric.name == name and u.attributes.get("fabric") == fabric]  # fmt: skip


async def run(client, worker, wf, inp):
    return await client.execute_workflow(wf.run, inp, id=f"{inp.workflow_id()}/{uuid.uuid4().hex[:6]}",
                                         task_queue=worker.task_queue)  # fmt: skip


def accepted(version: str) -> list[str]:
    """What an isolation on this release must accept: 6.17 cannot show 0x7fff's membership."""
    return UNREPORTED if version == "6.17" else []


def root_cause(err: BaseException) -> BaseException:
    while isinstance(err, TemporalError) and err.cause is not None:
        err = err.cause
    return err


@pytest.mark.parametrize("version", VERSIONS)
async def test_a_fabric_whose_management_pkey_is_full_refuses_isolation(version, metered_client, metrics, ufm,
                                                                        ufm_config, fleet):  # fmt: skip
    await ufm.seed({**fleet_seed(fleet), "default_membership": "full"})  # UFM's own default
    await ufm.configure(version=version)
    expected = "default-membership-full" if version != "6.17" else "default-membership-unreported"
    fabric = f"ib-{uuid.uuid4().hex[:6]}"
    cursor = await ufm.audit_cursor()
    async with await _worker(metered_client, ufm_config, None, FABRIC_WORKFLOWS) as worker:
        with pytest.raises(WorkflowFailureError) as failed:
            await run(
                metered_client,
                worker,
                IsolateTenant,
                IsolateTenantInput(fabric=fabric, tenant="t", hosts=list(fleet.ib_ports())[:2], netbox=False),
            )
        audit = await run(metered_client, worker, FabricAudit, FabricAuditInput(fabric=fabric))
    err = root_cause(failed.value)
    assert isinstance(err, ApplicationError) and err.type == "FabricInsecure" and err.non_retryable
    assert expected in err.message and "default_membership = limited" in err.message  # the finding and the remedy
    assert expected in [f["code"] for f in err.details[0]["findings"]]
    assert await ufm.audit(since=cursor, writes=True) == []  # closed before any write
    # FabricAudit reports the posture on every run, and its gauge.
    assert audit.insecure and expected in [f.code for f in audit.posture.findings] and audit.clean
    assert gauge(metrics, "millwright_fabric_insecure", fabric) == [1]


@pytest.mark.parametrize("version", VERSIONS)
async def test_a_600_host_tenant_is_isolated_and_released_without_a_414(version, client, ufm, ufm_stub, ufm_config,
                                                                        big_fleet):  # fmt: skip
    await ufm.seed(fleet_seed(big_fleet))
    await ufm.configure(version=version)
    hosts = list(big_fleet.ib_ports())
    want = {g for h in hosts for g in big_fleet.ib_ports()[h]}
    fabric = f"ib-{uuid.uuid4().hex[:6]}"
    cursor = await ufm.audit_cursor()
    async with await _worker(client, ufm_config, None, FABRIC_WORKFLOWS) as worker:
        iso = await run(
            client,
            worker,
            IsolateTenant,
            IsolateTenantInput(
                fabric=fabric, tenant="big", hosts=hosts, netbox=False, accept_posture=accepted(version)
            ),
        )
        assert set(await ufm.members(iso.pkey)) == want and len(want) == 1200
        assert iso.posture.default_membership == (None if version == "6.17" else "limited")
        assert [line.split(":")[0] for line in iso.accepted_findings] == accepted(version)
        rel = await run(client, worker, ReleaseTenant, ReleaseTenantInput(fabric=fabric, tenant="big", netbox=False))
    assert set(rel.removed) == want
    assert rel.pkey_deleted and iso.pkey not in (await ufm.state())["pkeys"]  # UFM deleted it with the last member
    log = await ufm.audit(since=cursor)
    assert not [e for e in log if e["code"] == 414]
    removals = [e for e in log if e["path"].endswith("/actions/remove_guids_from_pkey")]
    assert sorted(len(e["body"]["guids"]) for e in removals) == [200, 500, 500]
    async with ufm_http(ufm_stub) as c:  # the DELETE form Millwright no longer uses: UFM's front refuses it
        r = await c.delete(f"/resources/pkeys/0x10/guids/{','.join(sorted(want))}")
        assert r.status_code == 414 and "Request-URI Too Long" in r.text


@pytest.mark.parametrize("version", VERSIONS)
async def test_a_missing_pkey_is_created_whatever_ufm_answers_for_it(version, ufm, ufm_stub, ufm_config):
    await ufm.configure(version=version)
    async with ufm_http(ufm_stub) as c:
        r = await c.get("/resources/pkeys/0x61", params={"guids_data": "true"})
    if version in ("6.17", "6.19"):
        assert (r.status_code, r.json()) == (200, {})
    else:
        assert r.status_code == 404 and "does not exist" in r.json()["error"]
    env, acts = ActivityEnvironment(), UfmActivities(ufm_config)
    assert not (await env.run(acts.get_pkey, PKeyRef(pkey="0x61"))).exists
    cursor = await ufm.audit_cursor()
    created = await env.run(acts.ensure_pkey, EnsurePKey(pkey="0x61", partition_name="tenant-x"))
    assert created.created
    add = [e for e in await ufm.audit(since=cursor, writes=True) if e["path"].endswith("/pkeys/add")]
    assert len(add) == 1 and add[0]["body"]["index0"] is True
    named = version == "6.22"  # the API takes partition_name from 6.22 (older releases refuse it)
    assert ("partition_name" in add[0]["body"]) == named
    state = (await ufm.state())["pkeys"]["0x61"]
    assert state["partition"] == ("tenant-x" if named else "api_pkey_0x61")
    assert not (await env.run(acts.ensure_pkey, EnsurePKey(pkey="0x61", partition_name="tenant-x"))).created


@pytest.mark.parametrize("version", VERSIONS)
async def test_a_membership_repair_is_a_put_read_back(version, client, ufm, ufm_stub, ufm_config, fleet):
    h = list(fleet.ib_ports())
    port = sorted(fleet.ib_ports()[h[0]])[0]
    vf = "0002c90000000a01"  # a virtual port of the tenant's own port, limited: a PUT must keep it as it is
    await ufm.seed({**fleet_seed(fleet), "vports": [{"port_guid": port, "guid": vf}]})
    await ufm.configure(version=version)
    fabric = f"ib-{uuid.uuid4().hex[:6]}"
    async with await _worker(client, ufm_config, None, FABRIC_WORKFLOWS) as worker:
        iso = await run(
            client,
            worker,
            IsolateTenant,
            IsolateTenantInput(fabric=fabric, tenant="t", hosts=h[:2], netbox=False, accept_posture=accepted(version)),
        )
        wrong = sorted(iso.members[h[1]])[0]
        async with ufm_http(ufm_stub) as c:  # out of band: one port made limited
            removal = {"pkey": iso.pkey, "guids": [wrong]}
            (await c.post("/actions/remove_guids_from_pkey", json=removal)).raise_for_status()
            (
                await c.post("/resources/pkeys", json={"pkey": iso.pkey, "guids": [wrong, vf], "membership": "limited"})
            ).raise_for_status()
        cursor = await ufm.audit_cursor()
        fixed = await run(client, worker, FabricAudit, FabricAuditInput(fabric=fabric, repair=True))
        again = await run(client, worker, FabricAudit, FabricAuditInput(fabric=fabric))
    assert [(d.kind, d.guid) for d in fixed.drift] == [("wrong-membership", wrong)]
    assert fixed.repaired == [f"changed {wrong} ({h[1]}) to full in {iso.pkey}"]
    members = await ufm.members(iso.pkey)
    assert members == {**{g: "full" for gs in iso.members.values() for g in gs}, vf: "limited"}
    log = await ufm.audit(since=cursor)
    puts = [i for i, e in enumerate(log) if e["method"] == "PUT" and e["path"].endswith("/resources/pkeys")]
    assert len(puts) == 1, log
    assert "memberships" in log[puts[0]]["body"]  # the merged set is mixed: per-GUID memberships, on every release
    assert any(
        e["method"] == "GET" and e["path"].startswith(f"/ufmRest/resources/pkeys/{iso.pkey}?")
        for e in log[puts[0] + 1 :]
    )  # read back
    assert not [e for e in log if e["method"] == "POST" and wrong in (e["body"] or {}).get("guids", [])]
    assert again.clean and again.virtual_members == [f"{iso.pkey} (t): virtual port {vf} of {h[0]} (on port {port})"]
    # A change to one member's membership in a mixed PKey is a PUT with per-GUID memberships, on every release.
    await ActivityEnvironment().run(
        UfmActivities(ufm_config).add_guids, AddGuids(pkey=iso.pkey, guids=[wrong], membership="limited")
    )
    assert await ufm.members(iso.pkey) == {**members, wrong: "limited"}
