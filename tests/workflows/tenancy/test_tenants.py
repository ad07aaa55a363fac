"""Clusters and tenants end to end on a real dev server against the emulator: a workload cluster created
through Cluster API, three teams (NLP, Vision, Recommender) onboarded with GPU quotas, a half-way failure
fully compensated, a no-op second onboarding, an in-place quota change, offboarding that leaves nothing
behind, the cluster deleted; and no kubeconfig or token in any history."""

from __future__ import annotations

import base64
from datetime import timedelta

import pytest
import yaml
from temporalio.client import WorkflowFailureError
from temporalio.exceptions import ApplicationError, TemporalError

from activities.capi.ownership import OWNER_ANNOTATION, Ownership
from lab.k8s.admin import EmulatorAdmin
from lab.k8s.crds import CAPI_CRDS
from tests.workflows.maintenance.test_node_maintenance import record_history
from workflows.clusters.create_cluster import CreateCluster
from workflows.clusters.delete_cluster import DeleteCluster
from workflows.clusters.manifests import TENANTS_PARENT_QUEUE, baseline_objects
from workflows.clusters.models import CreateClusterInput, DeleteClusterInput, WorkerPool
from workflows.tenancy.models import OffboardTenantInput, OnboardTenantInput, QueueQuota, UpdateTenantQuotaInput
from workflows.tenancy.offboarding import OffboardTenant
from workflows.tenancy.onboarding import OnboardTenant
from workflows.tenancy.quota import UpdateTenantQuota

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.timeout(600)]

TEAMS = {  # NVIDIA's three-team walk-through, on a 16-GPU cluster
    "nlp": ("NLP", 8, "vcluster"),
    "vision": ("Vision", 4, "vcluster"),
    "recommender": ("Recommender", 2, "namespace"),
}
CAPI_KINDS = {
    "Cluster",
    "Machine",
    "MachineDeployment",
    "KubeadmControlPlane",
    "KubeadmConfigTemplate",
    "Metal3Cluster",
    "Metal3MachineTemplate",
}


def _cause(err: BaseException) -> ApplicationError:
    """The first ApplicationError in the chain (the workflow's or an activity's own)."""
    while not isinstance(err, ApplicationError) and isinstance(err, TemporalError) and err.cause is not None:
        err = err.cause
    assert isinstance(err, ApplicationError), f"no ApplicationError in the failure's chain: {err!r}"
    return err


def _tenant_objects(dump: list[dict], tenant: str | None = None) -> list[str]:
    """Every object (any kind) carrying a tenant label, or owned by a tenant's vCluster."""
    out = []
    for o in dump:
        md = o["metadata"]
        t = (md.get("labels") or {}).get("millwright.dev/tenant") or (md.get("labels") or {}).get("vcluster-name")
        if t and (tenant is None or t == tenant):
            out.append(f"{o['kind']} {md.get('namespace', '')}/{md['name']}")
    return out


async def workload_cluster(core, name: str, namespace: str = "fleet") -> tuple[dict, str, EmulatorAdmin]:
    """A workload cluster CreateCluster made: its kubeconfig, the Secret's value, and its emulator's admin API."""
    secret = await core.read_namespaced_secret(f"{name}-kubeconfig", namespace)
    kcfg = yaml.safe_load(base64.b64decode(secret.data["value"]).decode())
    return kcfg, secret.data["value"], EmulatorAdmin(kcfg["clusters"][0]["cluster"]["server"])


def parent_queue(cluster: str = "lab") -> list[dict]:
    """The tenants' parent queue as CreateCluster writes it (its baseline, its ownership): what onboarding onto a
    cluster the tests seed by hand needs."""
    queue = next(
        o for o in baseline_objects() if o["kind"] == "Queue" and o["metadata"]["name"] == TENANTS_PARENT_QUEUE
    )
    queue["metadata"]["annotations"] = {OWNER_ANNOTATION: Ownership(workflow=f"cluster/{cluster}").annotation()}
    return [queue]


def _keys(dump: list[dict]) -> set[tuple[str, str, str]]:
    return {
        (o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"]) for o in dump if o["kind"] != "Event"
    }


async def test_cluster_and_three_tenants(client, k8s, core, tenant_worker, tenant_netbox):
    tq = tenant_worker.task_queue
    netbox = tenant_netbox
    handles = []

    async def run(wf, inp, *, fail: bool = False, record: str | None = None):
        h = await client.start_workflow(wf, inp, id=inp.workflow_id(), task_queue=tq, search_attributes=None)
        handles.append(h)
        if fail:
            with pytest.raises(WorkflowFailureError) as exc:
                await h.result()
            if record:
                await record_history(h, record)
            return _cause(exc.value)
        result = await h.result()
        if record:
            await record_history(h, record)
        return result

    await k8s.seed(CAPI_CRDS)

    # ---- the cluster
    cin = CreateClusterInput(
        name="gpu-a",
        control_plane_replicas=1,
        worker_pools=[WorkerPool(name="gpu", replicas=2, gpus_per_node=8, gpu_node_class="h100-sxm")],
        poll_interval=timedelta(milliseconds=300),
    )
    created = await run(CreateCluster.run, cin, record="create_cluster_ready_by_timer")
    assert created.cluster == "lab:fleet/gpu-a"
    assert created.machines == 3 and "Cluster fleet/gpu-a" in created.created
    assert created.kubeconfig == "secret:lab/fleet/gpu-a-kubeconfig#value"
    again = await run(CreateCluster.run, cin)
    assert again.created == [] and "Cluster fleet/gpu-a" in again.unchanged
    # A differing existing object is a conflict, never adopted.
    err = await run(
        CreateCluster.run,
        cin.model_copy(update={"kubernetes_version": "v1.35.0"}),
        fail=True,
        record="create_cluster_conflict",
    )
    assert err.type == "ObjectConflict" and "KubeadmControlPlane fleet/gpu-a-cp" in str(err)

    kcfg, secret_value, wl = await workload_cluster(core, "gpu-a")
    secrets_seen = {kcfg["users"][0]["user"]["token"], secret_value}
    try:
        wl_dump = await wl.dump()
        nodes = [o for o in wl_dump if o["kind"] == "Node"]
        assert len(nodes) == 3
        assert sum(int(n["status"]["allocatable"].get("nvidia.com/gpu", 0)) for n in nodes) == 16
        assert {n["metadata"]["labels"].get("millwright.dev/gpu-class") for n in nodes} == {"h100-sxm", None}
        assert {q["metadata"]["name"] for q in wl_dump if q["kind"] == "Queue"} == {
            "default-parent-queue",
            "default-queue",
            "tenants",
        }
        before = _keys(wl_dump)

        cluster = created.cluster

        def onboard(t: str, **kw) -> OnboardTenantInput:
            name, gpus, iso = TEAMS[t]
            return OnboardTenantInput(
                tenant=t,
                display_name=name,
                cluster=cluster,
                isolation=iso,
                gpu=QueueQuota(quota=gpus, limit=gpus),
                admin_group=f"{t}-admins",
                contacts=[f"{t}-lead@example.com"],
                cpu_quota="64",
                memory_quota="512Gi",
                record_in_netbox=bool(netbox),
                **kw,
            )

        # ---- NLP onboarded
        nlp = await run(OnboardTenant.run, onboard("nlp"), record="onboard_tenant_vcluster_by_timer")
        assert nlp.changed and nlp.vcluster_kubeconfig == f"secret:{cluster}/nlp/vc-nlp#config"
        assert tenant_worker  # the same worker serves everything

        # ---- Vision fails half-way (Kyverno rejects its policy): fully compensated
        await wl.add_fault(
            {"verb": "create", "group": "kyverno.io", "resource": "clusterpolicies"},
            {"status": 403, "message": "injected: policy engine refuses"},
        )
        err = await run(OnboardTenant.run, onboard("vision"), fail=True, record="onboard_tenant_compensated")
        assert err.type == "OnboardingFailed", err
        assert "policy engine refuses" in str(err) and "Queue vision" in str(err)
        report = err.details[0]
        assert report["removed"] == list(reversed(report["created"]))  # undone in reverse order
        assert report["created"][0] == "Namespace vision" and report["removed"][0].startswith("NetworkPolicy")
        assert _tenant_objects(await wl.dump(), "vision") == []
        vision = await run(OnboardTenant.run, onboard("vision"))
        assert vision.changed

        # ---- Recommender: namespaces only
        rec = await run(OnboardTenant.run, onboard("recommender"))
        assert rec.vcluster_kubeconfig is None

        dump = await wl.dump()
        queues = {q["metadata"]["name"]: q for q in dump if q["kind"] == "Queue"}
        assert queues["tenants"]["status"]["childQueues"] == ["nlp", "recommender", "vision"]
        assert queues["nlp"]["spec"]["resources"]["gpu"] == {"quota": 8, "limit": 8, "overQuotaWeight": 1}
        assert {o["metadata"]["name"] for o in dump if o["kind"] == "ClusterPolicy"} == {
            "nlp-kai-queue",
            "vision-kai-queue",
            "recommender-kai-queue",
        }
        vc_secret = next(o for o in dump if o["kind"] == "Secret" and o["metadata"]["name"] == "vc-nlp")
        secrets_seen |= {
            vc_secret["data"]["config"],
            yaml.safe_load(base64.b64decode(vc_secret["data"]["config"]))["users"][0]["user"]["token"],
        }

        # KAI's webhook: no spec.resources → rejected; a parent with children cannot go.
        import kubernetes.aio.client as kc
        from kubernetes.aio import config as kconf

        wl_api = await kconf.new_client_from_config_dict(kcfg)
        try:
            co = kc.CustomObjectsApi(wl_api)
            with pytest.raises(kc.ApiException) as e:
                await co.create_cluster_custom_object(
                    "scheduling.run.ai",
                    "v2",
                    "queues",
                    {"apiVersion": "scheduling.run.ai/v2", "kind": "Queue", "metadata": {"name": "bad"}, "spec": {}},
                )
            assert e.value.status == 400 and "resources must be specified" in e.value.body
            with pytest.raises(kc.ApiException) as e:
                await co.delete_cluster_custom_object("scheduling.run.ai", "v2", "queues", "tenants")
            assert e.value.status == 400 and "child queues" in e.value.body
        finally:
            await wl_api.close()

        # ---- a second onboarding changes nothing (no write at all)
        cursor = await wl.audit_cursor()
        nlp2 = await run(OnboardTenant.run, onboard("nlp"))
        assert not nlp2.changed
        writes = [e for e in await wl.audit(since=cursor, writes=True) if "millwright" in e.get("userAgent", "")]
        assert writes == []

        # ---- quota: over capacity refused; a change applies in place
        err = await run(
            UpdateTenantQuota.run,
            UpdateTenantQuotaInput(tenant="nlp", cluster=cluster, gpu=QueueQuota(quota=12, limit=12)),
            fail=True,
        )
        assert err.type == "QuotaExceedsCapacity", err
        uid = queues["nlp"]["metadata"]["uid"]
        upd = await run(
            UpdateTenantQuota.run,
            UpdateTenantQuotaInput(tenant="nlp", cluster=cluster, gpu=QueueQuota(quota=6, limit=10)),
        )
        assert "Queue nlp" in upd.updated
        dump = await wl.dump()
        q = next(o for o in dump if o["kind"] == "Queue" and o["metadata"]["name"] == "nlp")
        assert q["metadata"]["uid"] == uid and q["spec"]["resources"]["gpu"]["quota"] == 6
        rq = next(o for o in dump if o["kind"] == "ResourceQuota" and o["metadata"]["namespace"] == "nlp")
        assert rq["spec"]["hard"]["requests.nvidia.com/gpu"] == "10"

        # ---- the cluster cannot go while tenants are on it
        err = await run(DeleteCluster.run, DeleteClusterInput(name="gpu-a"), fail=True)
        assert err.type == "TenantsOnboarded", err

        # ---- a tenant pod still running: offboarding gives up once its workloads_timeout's timer fired
        wl_api = await kconf.new_client_from_config_dict(kcfg)
        try:
            pods = kc.CoreV1Api(wl_api)
            pod = {"metadata": {"name": "trainer"}, "spec": {"containers": [{"name": "train", "image": "train"}]}}
            await pods.create_namespaced_pod("nlp", pod)
            waited = OffboardTenantInput(tenant="nlp", cluster=cluster, display_name="NLP", record_in_netbox=False,
                                         workloads_timeout=timedelta(seconds=2),
                                         poll_interval=timedelta(milliseconds=500))  # fmt: skip
            err = await run(OffboardTenant.run, waited, fail=True, record="offboard_tenant_workloads_by_timer")
            assert err.type == "WorkloadsRunning" and "1 tenant pods still running after 0:00:02" in str(err), err
            assert _tenant_objects(await wl.dump(), "nlp"), "nothing removed while the pod runs"
            await pods.delete_namespaced_pod("trainer", "nlp", grace_period_seconds=0)
        finally:
            await wl_api.close()

        # ---- offboarding leaves nothing behind (every kind listed)
        for t, (name, _, _) in TEAMS.items():
            off = await run(
                OffboardTenant.run,
                OffboardTenantInput(tenant=t, cluster=cluster, display_name=name, record_in_netbox=bool(netbox)),
            )
            assert off.removed
        dump = await wl.dump()
        assert _tenant_objects(dump) == []
        assert _keys(dump) == before, sorted(_keys(dump) ^ before)
    finally:
        await wl.aclose()

    if netbox:
        import pynetbox

        nb = pynetbox.api(netbox[0], token=netbox[2])
        for t, (name, _, _) in TEAMS.items():
            rec = nb.tenancy.tenants.get(slug=t)
            assert rec is not None and rec.name == name and rec.description == f"offboarded from {cluster}"

    # ---- the cluster deleted: no Cluster API object left, the kubeconfig Secret gone
    deleted = await run(DeleteCluster.run, DeleteClusterInput(name="gpu-a"))
    assert "Cluster fleet/gpu-a" in deleted.deleted
    mgmt = await k8s.dump()
    assert [o["metadata"]["name"] for o in mgmt if o["kind"] in CAPI_KINDS] == []
    assert not [o for o in mgmt if o["kind"] == "Secret" and o["metadata"]["name"].startswith("gpu-a")]

    # ---- no kubeconfig or token in any history
    for h in handles:
        # The raw event bytes: payloads (JSON) appear verbatim, so nothing hides behind an encoding.
        raw = b"".join(e.SerializeToString() for e in (await h.fetch_history()).events)
        assert raw
        for s in secrets_seen:
            assert s.encode() not in raw, f"{h.id}: a secret in its history"
        for marker in (b"current-context", b"client-key-data", b"kind: Config", b"lab-token"):
            assert marker not in raw, f"{h.id}: {marker!r} in its history"


async def test_create_cluster_without_cluster_api_fails_clearly(client, k8s, tenant_worker):
    """No Cluster API CRDs installed: a non-retryable error naming what is missing, nothing written."""
    inp = CreateClusterInput(name="gpu-b", worker_pools=[WorkerPool(name="gpu", replicas=1)])
    h = await client.start_workflow(CreateCluster.run, inp, id=inp.workflow_id(), task_queue=tenant_worker.task_queue)
    with pytest.raises(WorkflowFailureError) as exc:
        await h.result()
    err = _cause(exc.value)
    assert err.type == "KindNotInstalled" and "cluster.x-k8s.io/v1beta2/Cluster" in str(err)
    assert not [o for o in await k8s.dump() if o["metadata"].get("name", "").startswith("gpu-b")]
