"""Tenant onboarding and offboarding with InfiniBand isolation on the real dev server: the Kubernetes emulator
(the management cluster `lab`, with the KAI and Kyverno kinds) and the UFM emulator, with a worker built like
production (worker.registry.build). What happened is judged from the emulators' state and write audit logs."""

from __future__ import annotations

import uuid

import pytest
import pytest_asyncio
from temporalio.client import WorkflowFailureError

from lab.k8s.crds import TENANCY_CRDS
from tests.workflows.maintenance.test_node_maintenance import record_history
from tests.workflows.tenancy.test_tenants import parent_queue
from workflows.tenancy.models import OffboardTenantInput, OnboardTenantInput, QueueQuota
from workflows.tenancy.objects import IB_FABRIC_ANNOTATION
from workflows.tenancy.offboarding import OffboardTenant
from workflows.tenancy.onboarding import OnboardTenant

pytestmark = pytest.mark.timeout(300)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def ib_tenant_worker(client, kubeconfig_path, ufm_stub, ufm_secret_file):
    """Kubernetes (the `lab` emulator) and UFM configured, NetBox not (tenant records off); one for the module
    (the emulators are reset per test)."""
    from worker import registry
    from worker.config import WorkerSettings

    registration = registry.build(
        WorkerSettings(
            kubeconfig=str(kubeconfig_path),
            metrics_port=0,
            ufm_url=ufm_stub.url,
            ufm_credentials=f"file:{ufm_secret_file}",
        )
    )
    async with registry.new_worker(client, registration, f"ib-tenants-{uuid.uuid4().hex[:8]}") as worker:
        yield worker
    await registration.close()


def _fabric() -> str:
    return f"ib-{uuid.uuid4().hex[:6]}"


def _onboard(tenant: str, fabric: str, hosts: list[str]) -> OnboardTenantInput:
    return OnboardTenantInput(
        tenant=tenant,
        cluster="lab",
        isolation="namespace",
        gpu=QueueQuota(quota=0, limit=0),
        record_in_netbox=False,
        ib_isolation=True,
        ib_fabric=fabric,
        ib_hosts=hosts,
    )


async def _run(client, worker, wf, inp):
    return await client.execute_workflow(wf, inp, id=inp.workflow_id(), task_queue=worker.task_queue)


async def _fails(client, worker, wf, inp):
    with pytest.raises(WorkflowFailureError) as exc:
        await _run(client, worker, wf, inp)
    return exc.value.cause


async def _record(client, workflow_id: str, name: str) -> None:
    await record_history(client.get_workflow_handle(workflow_id), name)


def _tenant_objects(dump: list[dict], tenant: str) -> list[str]:
    return [
        f"{o['kind']} {o['metadata'].get('namespace', '')}/{o['metadata']['name']}"
        for o in dump
        if (o["metadata"].get("labels") or {}).get("millwright.dev/tenant") == tenant
    ]


def _guids(fleet, hosts: list[str]) -> set[str]:
    ports = fleet.ib_ports()
    return {g for h in hosts for g in ports[h]}


async def test_onboard_and_offboard_with_ib_isolation(client, k8s, ufm, fleet, ib_tenant_worker):
    await k8s.seed(TENANCY_CRDS + parent_queue())
    hosts = list(fleet.ib_ports())[0:2]
    fabric, tenant = _fabric(), f"ibt-{uuid.uuid4().hex[:5]}"
    inp = _onboard(tenant, fabric, hosts)

    on = await _run(client, ib_tenant_worker, OnboardTenant.run, inp)
    iso = on.infiniband
    assert on.changed and iso is not None and iso.pkey_created
    assert await ufm.members(iso.pkey) == {g: "full" for g in _guids(fleet, hosts)}
    assert {s.step for s in on.steps} >= {"namespaces", "queue", "infiniband"}
    queue = next(o for o in await k8s.dump() if o["kind"] == "Queue" and o["metadata"]["name"] == tenant)
    assert queue["metadata"]["annotations"][IB_FABRIC_ANNOTATION] == fabric
    writes = await ufm.audit(writes=True)
    assert not [w for w in writes if w["method"] == "PUT"], "never the replacing call"

    # A second onboarding changes nothing, in UFM either.
    cursor = await ufm.audit_cursor()
    again = await _run(client, ib_tenant_worker, OnboardTenant.run, inp)
    assert not again.changed and again.infiniband.pkey == iso.pkey and not again.infiniband.added
    assert await ufm.audit(since=cursor, writes=True) == []

    # Offboarding finds the fabric on the queue and releases the PKey: members removed, PKey deleted.
    off = await _run(
        client,
        ib_tenant_worker,
        OffboardTenant.run,
        OffboardTenantInput(tenant=tenant, cluster="lab", record_in_netbox=False),
    )
    assert off.infiniband is not None and off.infiniband.pkey == iso.pkey
    assert set(off.infiniband.removed) == _guids(fleet, hosts) and off.infiniband.pkey_deleted
    assert iso.pkey not in (await ufm.state())["pkeys"]
    assert _tenant_objects(await k8s.dump(), tenant) == []


async def test_failure_after_the_ib_step_releases_the_pkey(client, k8s, ufm, fleet, ib_tenant_worker):
    await k8s.seed(TENANCY_CRDS + parent_queue())
    hosts = list(fleet.ib_ports())[2:4]
    fabric, tenant = _fabric(), f"ibf-{uuid.uuid4().hex[:5]}"
    # Pruning (the step after InfiniBand) lists LimitRanges: refused for good.
    await k8s.add_fault(
        {"verb": "list", "resource": "limitranges"}, {"status": 403, "message": "injected: listing refused"}
    )
    cursor = await ufm.audit_cursor()
    inp = _onboard(tenant, fabric, hosts)
    err = await _fails(client, ib_tenant_worker, OnboardTenant.run, inp)
    await _record(client, inp.workflow_id(), "onboard_tenant_ib_compensated")
    await _record(client, f"release-tenant/{fabric}/{tenant}", "release_tenant")
    assert err.type == "OnboardingFailed", err
    report = err.details[0]
    pkey_entry = next(c for c in report["created"] if c.startswith("PKey "))
    pkey = pkey_entry.split()[1]
    assert report["created"][-1] == pkey_entry and report["removed"][0] == pkey_entry
    assert report["removed"] == list(reversed(report["created"]))  # undone in reverse order
    assert "listing refused" in str(err)
    # UFM: the members added, then removed (the compensation's removal of exactly them), the PKey gone.
    writes = await ufm.audit(since=cursor, writes=True)
    removes = [w for w in writes if w["path"].endswith("/actions/remove_guids_from_pkey")]
    assert len(removes) == 1, writes
    assert removes[0]["body"]["pkey"] == pkey and set(removes[0]["body"]["guids"]) == _guids(fleet, hosts)
    assert pkey not in (await ufm.state())["pkeys"]
    assert _tenant_objects(await k8s.dump(), tenant) == []


async def test_failure_in_the_ib_step_undoes_the_kubernetes_steps(client, k8s, ufm, ib_tenant_worker):
    await k8s.seed(TENANCY_CRDS + parent_queue())
    tenant = f"ibx-{uuid.uuid4().hex[:5]}"
    cursor = await ufm.audit_cursor()
    err = await _fails(client, ib_tenant_worker, OnboardTenant.run, _onboard(tenant, _fabric(), ["no-such-host"]))
    assert err.type == "OnboardingFailed" and "no-such-host" in str(err), err
    report = err.details[0]
    assert report["created"] and not [c for c in report["created"] if c.startswith("PKey")]
    assert report["removed"] == list(reversed(report["created"]))
    assert await ufm.audit(since=cursor, writes=True) == []
    assert _tenant_objects(await k8s.dump(), tenant) == []


async def test_onboarding_on_a_fabric_that_voids_isolation_refuses_unless_the_finding_is_accepted(
    client, k8s, ufm, fleet, ib_tenant_worker
):
    """UFM's own default, a management PKey of full members, makes every partition void: onboarding fails in the
    IsolateTenant step and undoes its Kubernetes steps; `ib_accept_posture` accepts the finding, named in the
    result."""
    from lab.ufm import fleet_seed

    await k8s.seed(TENANCY_CRDS + parent_queue())
    await ufm.seed({**fleet_seed(fleet), "default_membership": "full"})
    hosts, tenant = list(fleet.ib_ports())[:2], f"ibp-{uuid.uuid4().hex[:5]}"
    inp = _onboard(tenant, _fabric(), hosts)
    err = await _fails(client, ib_tenant_worker, OnboardTenant.run, inp)
    assert err.type == "OnboardingFailed" and "default-membership-full" in str(err), err
    assert _tenant_objects(await k8s.dump(), tenant) == []

    accepted = await _run(client, ib_tenant_worker, OnboardTenant.run,
                          inp.model_copy(update={"ib_accept_posture": ["default-membership-full"]}))  # fmt: skip
    iso = accepted.infiniband
    assert iso is not None and [f.split(":")[0] for f in iso.accepted_findings] == ["default-membership-full"]
    assert await ufm.members(iso.pkey) == {g: "full" for g in _guids(fleet, hosts)}


def test_accepting_a_posture_finding_needs_ib_isolation():
    with pytest.raises(ValueError, match="ib_accept_posture are only for ib_isolation=true"):
        OnboardTenantInput(tenant="t", cluster="lab", ib_accept_posture=["default-membership-full"])


PKEY_READ = r"/resources/pkeys/0x[0-9a-f]+$"  # GET of one PKey (every UFM write is read before and after)


@pytest.mark.parametrize("case", ["new-pkey", "grown-pkey", "in-onboarding"])
async def test_isolation_failing_after_lost_answers_undoes_its_own_writes(
    client, k8s, ufm, fleet, ib_tenant_worker, case
):
    """IsolateTenant (on its own, or as onboarding's last step): the answers of its PKey create and GUID add are
    lost (the writes done), then UFM refuses it for good. What this run created goes, whichever attempt wrote it,
    and the failure says so; what the tenant held stays."""
    from workflows.fabric.isolation import IsolateTenant, IsolateTenantInput

    hosts = list(fleet.ib_ports())[4:6]
    fabric, tenant = _fabric(), f"iso-{uuid.uuid4().hex[:5]}"
    held = case == "grown-pkey"
    if held:  # the tenant already holds a PKey with its first host: this run grows it by the second
        first = await _run(
            client,
            ib_tenant_worker,
            IsolateTenant.run,
            IsolateTenantInput(fabric=fabric, tenant=tenant, hosts=hosts[:1], netbox=False),
        )
    before = await ufm.state()
    if not held:
        await ufm.add_fault({"method": "POST", "path": r"/resources/pkeys/add$"}, {"drop": "after"})
    lost_add = await ufm.add_fault({"method": "POST", "path": r"/resources/pkeys$"}, {"drop": "after"})
    # Placed by the audit order, not by counting the reads before it: once the GUID add's answer is lost, the add
    # is read back in the same attempt (activities/ufm/pkeys.py `_write`: it lands, so the add is done), and the PKey
    # read after that, the run's verification, is refused for good (403: non-retryable).
    await ufm.add_fault(
        {"method": "GET", "path": PKEY_READ}, {"status": 403, "message": "injected: refused"}, after=lost_add, skip=1
    )
    cursor = await ufm.audit_cursor()
    if case == "in-onboarding":
        await k8s.seed(TENANCY_CRDS + parent_queue())
        onboarding = _onboard(tenant, fabric, hosts)
        err = await _fails(client, ib_tenant_worker, OnboardTenant.run, onboarding)
        assert err.type == "OnboardingFailed", err
        assert _tenant_objects(await k8s.dump(), tenant) == []
    else:
        inp = IsolateTenantInput(fabric=fabric, tenant=tenant, hosts=hosts, netbox=False)
        err = await _fails(client, ib_tenant_worker, IsolateTenant.run, inp)
        if case == "new-pkey":
            await _record(client, inp.workflow_id(), "isolate_tenant_failed")
    assert "injected: refused" in str(err), err
    assert [f for f in (await ufm._req("GET", "/_lab/faults"))["faults"] if f["remaining"]] == [], (
        "every injected fault was hit"
    )
    writes = await ufm.audit(since=cursor, writes=True)
    assert [w for w in writes if w.get("fault", {}).get("drop") == "after"], writes
    assert (await ufm.state())["pkeys"] == before["pkeys"], "UFM is back to its state before the run"

    report = err.details[0]
    pkey = first.pkey if held else next(c for c in report["created"] if c.startswith("PKey ")).split()[1]
    host_of = {g: h for h in (hosts[1:] if held else hosts) for g in fleet.ib_ports()[h]}
    ib = ([] if held else [f"PKey {pkey} on {fabric}"]) + [
        f"port {g} of {host_of[g]} in PKey {pkey}" for g in sorted(host_of)
    ]
    if case == "in-onboarding":  # the Kubernetes steps first, then the child's own account
        assert report["created"][-len(ib) :] == ib and report["created"][0] == f"Namespace {tenant}", report
    else:
        assert report["created"] == ib, report
    assert report["removed"] == list(reversed(report["created"])), report
    state = await client.get_workflow_handle(f"fabric/{fabric}").query("state", result_type=dict)
    if held:
        assert set(state["allocations"][tenant]["members"]) == _guids(fleet, hosts[:1])
    else:
        assert tenant not in state["allocations"]


async def test_undo_keeps_the_tenants_pkey_that_ufm_deletes_with_its_last_member(
    client, ufm, ufm_stub, fleet, ib_tenant_worker
):
    """The tenant's PKey is in UFM but empty (its members were removed outside Millwright); an isolation adding a
    host to it fails after the add. Removing that host's ports, the undo empties the PKey, which UFM deletes with
    its last member: the undo puts it back, as it was before the run, and reports only the ports."""
    from tests.workflows.fabric.conftest import ufm_http
    from workflows.fabric.isolation import IsolateTenant, IsolateTenantInput

    hosts = list(fleet.ib_ports())[0:2]
    fabric, tenant = _fabric(), f"iso-{uuid.uuid4().hex[:5]}"
    first = await _run(
        client,
        ib_tenant_worker,
        IsolateTenant.run,
        IsolateTenantInput(fabric=fabric, tenant=tenant, hosts=hosts[:1], netbox=False),
    )
    partition = (await ufm.state())["pkeys"][first.pkey]["partition"]
    async with ufm_http(ufm_stub) as c:  # UFM deletes the PKey with these, its last members; then made again, empty
        (
            await c.post(
                "/actions/remove_guids_from_pkey", json={"pkey": first.pkey, "guids": sorted(_guids(fleet, hosts[:1]))}
            )
        ).raise_for_status()
        (
            await c.post(
                "/resources/pkeys/add",
                json={"pkey": first.pkey, "partition_name": partition, "index0": True, "ip_over_ib": True},
            )
        ).raise_for_status()
    before = await ufm.state()
    assert before["pkeys"][first.pkey]["guids"] == []
    lost_add = await ufm.add_fault({"method": "POST", "path": r"/resources/pkeys$"}, {"drop": "after"})
    await ufm.add_fault(
        {"method": "GET", "path": PKEY_READ}, {"status": 403, "message": "injected: refused"}, after=lost_add, skip=1
    )  # the verification read (see the test above)
    cursor = await ufm.audit_cursor()
    err = await _fails(
        client,
        ib_tenant_worker,
        IsolateTenant.run,
        IsolateTenantInput(fabric=fabric, tenant=tenant, hosts=hosts[1:], netbox=False),
    )
    assert "injected: refused" in str(err), err

    writes = [(w["method"], w["path"]) for w in await ufm.audit(since=cursor, writes=True)]
    assert writes[-2:] == [
        ("POST", "/ufmRest/actions/remove_guids_from_pkey"),
        ("POST", "/ufmRest/resources/pkeys/add"),
    ], writes
    assert (await ufm.state())["pkeys"] == before["pkeys"], "UFM is back to its state before the run"
    ports = [f"port {g} of {hosts[1]} in PKey {first.pkey}" for g in sorted(_guids(fleet, hosts[1:]))]
    assert err.details[0] == {"created": ports, "removed": list(reversed(ports))}, err.details
    state = await client.get_workflow_handle(f"fabric/{fabric}").query("state", result_type=dict)
    assert set(state["allocations"][tenant]["members"]) == _guids(fleet, hosts[:1])
