"""Tenant boundaries on a lab cluster (CreateCluster from examples/tenant-cluster.json, `nlp` onboarded from
examples/tenant-nlp.json with 8 of 16 GPUs): hostile and mistaken OnboardTenant / UpdateTenantQuota inputs are
refused before any write (judged from the workload cluster emulator's audit log), naming the field, the object
and its owner; the explicit operations they point to (an unlimited guarantee with both overrides, an admin-group
change with who and why) work and are recorded; offboarding still returns the cluster to its snapshot."""

from __future__ import annotations

import json
import re
from datetime import timedelta
from pathlib import Path

import pytest
from pydantic import ValidationError
from temporalio.client import WorkflowFailureError

from lab.k8s.crds import CAPI_CRDS
from starter.client import InputError, parse_input
from tests.workflows.maintenance.test_node_maintenance import record_history
from tests.workflows.tenancy.test_tenants import _cause, _keys, _tenant_objects, workload_cluster
from workflows.clusters.create_cluster import CreateCluster
from workflows.clusters.models import CreateClusterInput
from workflows.tenancy.models import (
    AdminGroupChange,
    OffboardTenantInput,
    OnboardTenantInput,
    QueueQuota,
    UpdateTenantQuotaInput,
)
from workflows.tenancy.offboarding import OffboardTenant
from workflows.tenancy.onboarding import OnboardTenant
from workflows.tenancy.quota import UpdateTenantQuota

pytestmark = pytest.mark.timeout(600)

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
GPU_CAP = "requests.nvidia.com/gpu"


def _example(name: str) -> dict:
    return json.loads((EXAMPLES / name).read_text())


def test_non_finite_and_negative_quotas_are_refused_at_the_edge():
    """The CLI and client library (parse_input) and the models themselves (the UI path) name the field."""
    nlp = _example("tenant-nlp.json")
    for number in ("NaN", "Infinity", "-Infinity"):
        text = json.dumps(nlp).replace('"quota": 8', f'"quota": {number}')
        with pytest.raises(InputError) as err:
            parse_input("OnboardTenant", text)
        assert any(e.startswith("gpu.quota: Input should be a finite number") for e in err.value.errors), err.value
    with pytest.raises(InputError) as err:
        parse_input("UpdateTenantQuota", '{"tenant": "nlp", "cluster": "c", "gpu": {"quota": 1, "limit": NaN}}')
    assert any(e.startswith("gpu.limit: Input should be a finite number") for e in err.value.errors), err.value
    for gpu, field in (({"quota": -5}, "gpu.quota"), ({"quota": 8, "limit": 4}, "gpu.limit")):
        with pytest.raises(ValidationError) as verr:
            OnboardTenantInput.model_validate({**nlp, "gpu": gpu})
        assert [".".join(map(str, e["loc"])) for e in verr.value.errors()] == [field], verr.value
    # -1 (KAI's unlimited guarantee) only with both overrides, in onboarding and in a quota change alike.
    for model, base in ((OnboardTenantInput, nlp), (UpdateTenantQuotaInput, {"tenant": "nlp", "cluster": "c"})):
        for flags in ({}, {"allow_oversubscription": True}, {"unlimited_gpu_guarantee": True}):
            with pytest.raises(ValidationError, match=re.escape("gpu.quota -1 is an unlimited guarantee")):
                model.model_validate({**base, "gpu": {"quota": -1}, **flags})
        both = {"allow_oversubscription": True, "unlimited_gpu_guarantee": True}
        assert model.model_validate({**base, "gpu": {"quota": -1}, **both}).gpu.quota == -1


@pytest.mark.parametrize("group", ["system:authenticated", "system:serviceaccounts", "system:masters", " "])
def test_system_groups_are_refused_at_the_edge(group):
    with pytest.raises(ValidationError) as err:
        OnboardTenantInput.model_validate({**_example("tenant-nlp.json"), "admin_group": group})
    assert [e["loc"] for e in err.value.errors()] == [("admin_group",)]


@pytest.mark.asyncio(loop_scope="session")
async def test_onboarding_refuses_before_any_write(client, k8s, core, tenant_worker, tenant_netbox):
    tq = tenant_worker.task_queue
    netbox = tenant_netbox

    async def run(wf, inp, *, record: str | None = None):
        h = await client.start_workflow(wf, inp, id=inp.workflow_id(), task_queue=tq)
        try:
            return await h.result()
        finally:
            if record:
                await record_history(h, record)

    await k8s.seed(CAPI_CRDS)
    cin = CreateClusterInput.model_validate(
        {**_example("tenant-cluster.json"), "poll_interval": timedelta(milliseconds=300)}
    )
    cluster = (await run(CreateCluster.run, cin)).cluster
    _, _, wl = await workload_cluster(core, cin.name)
    try:
        before = _keys(await wl.dump())
        nlp_in = OnboardTenantInput.model_validate({**_example("tenant-nlp.json"), "record_in_netbox": bool(netbox)})
        nlp = await run(OnboardTenant.run, nlp_in)
        assert nlp.plan is not None and "Namespace nlp" in nlp.plan.create and nlp.plan.guaranteed_gpus == 8

        async def refused(inp, kind: str, *phrases: str, record: str | None = None) -> None:
            cursor = await wl.audit_cursor()
            with pytest.raises(WorkflowFailureError) as exc:
                await run(OnboardTenant.run if isinstance(inp, OnboardTenantInput) else UpdateTenantQuota.run, inp,
                          record=record)  # fmt: skip
            err = _cause(exc.value)
            assert err.type == kind and all(p in str(err) for p in phrases), err
            writes = [e for e in await wl.audit(since=cursor, writes=True) if "millwright" in e.get("userAgent", "")]
            assert writes == [], f"{inp.tenant}: refused after writing {writes}"

        def evil(**kw) -> OnboardTenantInput:
            base = {"tenant": "evil", "cluster": cluster, "gpu": {"quota": 4}, "record_in_netbox": bool(netbox)}
            return OnboardTenantInput.model_validate({**base, **kw})

        # 1. A tenant's queue is never a parent: evil's GPUs would come out of nlp's.
        await refused(
            evil(parent_queue="nlp"), "InvalidTenantInput", "parent_queue: Queue nlp", f"tenant/{cluster}/nlp",
            record="onboard_tenant_refused",
        )  # fmt: skip
        await refused(evil(parent_queue="default-parent-queue"), "InvalidTenantInput", "parent_queue", "not a parent")
        # 2. A group the operator reserves (system:* is refused by the model itself).
        await refused(evil(admin_group="kubeadm:cluster-admins"), "InvalidTenantInput", "admin_group: Group kubeadm")
        # 4. Names another tenant or the cluster holds, refused by the plan, not mid-saga.
        await refused(
            evil(tenant="tenants"), "ObjectConflict", "tenant: Queue tenants already exists", f"cluster/{cluster}"
        )
        await refused(
            evil(namespaces=["evil-mixed", "nlp"]),
            "ObjectConflict",
            "namespaces[1]: Namespace nlp already exists",
            f"managed by tenant/{cluster}/nlp, tenant nlp",
        )
        # 6. Resubmitting nlp with another group never moves its administration.
        await refused(
            nlp_in.model_copy(update={"admin_group": "other-admins"}),
            "AdminGroupChange",
            "admin_group: tenant nlp",
            "administered by nlp-admins",
            "admin_group_change",
        )

        # 3. An unlimited guarantee, asked for with both overrides, counts as every GPU: no one else fits.
        unl = await run(OnboardTenant.run, evil(tenant="unl", gpu={"quota": -1}, allow_oversubscription=True,
                                                unlimited_gpu_guarantee=True, isolation="namespace"))  # fmt: skip
        assert unl.plan is not None and unl.plan.guaranteed_gpus == 16 + 8
        dump = await wl.dump()
        rq = next(o for o in dump if o["kind"] == "ResourceQuota" and o["metadata"]["namespace"] == "unl")
        assert GPU_CAP not in (rq["spec"].get("hard") or {})
        await refused(evil(gpu={"quota": 1}, isolation="namespace"), "QuotaExceedsCapacity", "gpu.quota", "total 25")
        await refused(
            UpdateTenantQuotaInput(tenant="nlp", cluster=cluster, gpu=QueueQuota(quota=9, limit=9)),
            "QuotaExceedsCapacity",
            "total 25",
        )
        await run(OffboardTenant.run, OffboardTenantInput(tenant="unl", cluster=cluster, record_in_netbox=False))

        # UpdateTenantQuota: the cap goes with the queue's bounds, and comes back.
        upd = await run(
            UpdateTenantQuota.run,
            UpdateTenantQuotaInput(tenant="nlp", cluster=cluster, gpu=QueueQuota(quota=-1),
                                   allow_oversubscription=True, unlimited_gpu_guarantee=True),
            record="update_tenant_quota_unlimited",
        )  # fmt: skip
        assert "ResourceQuota nlp/nlp-quota" in upd.updated and "Queue nlp" in upd.updated
        dump = await wl.dump()
        q = next(o for o in dump if o["kind"] == "Queue" and o["metadata"]["name"] == "nlp")
        rq = next(o for o in dump if o["kind"] == "ResourceQuota" and o["metadata"]["namespace"] == "nlp")
        assert q["spec"]["resources"]["gpu"]["quota"] == -1 and q["spec"]["resources"]["gpu"]["limit"] == -1
        assert GPU_CAP not in rq["spec"]["hard"] and rq["spec"]["hard"]["requests.cpu"] == "64"
        await run(UpdateTenantQuota.run, UpdateTenantQuotaInput(tenant="nlp", cluster=cluster, gpu=nlp_in.gpu))
        rq = next(o for o in await wl.dump() if o["kind"] == "ResourceQuota" and o["metadata"]["namespace"] == "nlp")
        assert rq["spec"]["hard"][GPU_CAP] == "8"

        # 6. The explicit change: who and why, in the result (and NetBox's journal when it runs here).
        change = AdminGroupChange(by="alice@example.com", reason="TICKET-42: team reorganised")
        moved = await run(
            OnboardTenant.run,
            nlp_in.model_copy(update={"admin_group": "nlp-platform", "admin_group_change": change}),
            record="onboard_tenant_admin_group_change",
        )
        assert moved.admin_group_changed is not None
        assert moved.admin_group_changed.previous == ["nlp-admins"] and moved.admin_group_changed.by == change.by
        rb = next(o for o in await wl.dump() if o["kind"] == "RoleBinding" and o["metadata"]["name"] == "nlp-admins")
        assert [s["name"] for s in rb["subjects"]] == ["nlp-platform"]
        if netbox:
            import pynetbox

            nb = pynetbox.api(netbox[0], token=netbox[2])
            tenant = nb.tenancy.tenants.get(slug="nlp")
            notes = [e.comments for e in nb.extras.journal_entries.filter(assigned_object_id=tenant.id)]
            assert any("alice@example.com" in n and "nlp-platform" in n for n in notes), notes

        # Offboarding still returns the cluster to its snapshot.
        await run(OffboardTenant.run, OffboardTenantInput(tenant="nlp", cluster=cluster, record_in_netbox=False))
        dump = await wl.dump()
        assert _tenant_objects(dump) == []
        assert _keys(dump) == before, sorted(_keys(dump) ^ before)
    finally:
        await wl.aclose()
