"""CreateCluster with a ClusterClass topology, and the cluster and its machines recorded in NetBox: input
validation, the discovery and ClusterClass checks, the emulator's topology Cluster, machines assigned to the
NetBox cluster by node name (a machine without a device reported, not failed), idempotent on a second run."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from pydantic import ValidationError
from temporalio.client import WorkflowFailureError

from lab.k8s.admin import EmulatorAdmin
from lab.k8s.crds import CAPI_CRDS
from tests.workflows.tenancy.test_tenants import _cause
from workflows.clusters.create_cluster import CreateCluster
from workflows.clusters.delete_cluster import DeleteCluster
from workflows.clusters.models import CreateClusterInput, DeleteClusterInput, WorkerPool

TOPOLOGY = {
    "class": "gpu-quick-start",
    "classNamespace": "capi-classes",
    "version": "v1.34.1",
    "controlPlane": {"replicas": 1},
    "workers": {
        "machineDeployments": [
            {"class": "gpu-worker", "name": "gpu", "replicas": 2, "gpuNodeClass": "h200-sxm", "gpusPerNode": 8}
        ]
    },
    "variables": [
        {"name": "imageURL", "value": "http://images.lab/ubuntu.qcow2"},
        {"name": "ntp", "value": {"servers": ["10.0.0.1"]}},
    ],
}
CLUSTER_CLASS = {
    "apiVersion": "cluster.x-k8s.io/v1beta2",
    "kind": "ClusterClass",
    "metadata": {"name": "gpu-quick-start", "namespace": "capi-classes"},
    "spec": {
        "controlPlane": {
            "templateRef": {
                "apiVersion": "controlplane.cluster.x-k8s.io/v1beta2",
                "kind": "KubeadmControlPlaneTemplate",
                "name": "cp",
            }
        },
        "workers": {"machineDeployments": [{"class": "gpu-worker"}]},
    },
}


def test_input_is_flat_or_topology_exactly():
    ok = CreateClusterInput.model_validate({"name": "t", "topology": TOPOLOGY})
    assert ok.topology.class_ == "gpu-quick-start" and ok.topology.workers.machine_deployments[0].replicas == 2
    assert CreateClusterInput.model_validate_json(ok.model_dump_json()) == ok  # the converter's round trip
    with pytest.raises(ValidationError, match="topology: give either worker_pools"):
        CreateClusterInput(name="t", topology=TOPOLOGY, worker_pools=[WorkerPool(name="gpu", replicas=1)])
    with pytest.raises(ValidationError, match="worker_pools: at least one pool"):
        CreateClusterInput(name="t")
    with pytest.raises(ValidationError, match="control_plane_replicas: with topology"):
        CreateClusterInput(name="t", topology=TOPOLOGY, control_plane_replicas=5)
    with pytest.raises(ValidationError, match=r"topology\.controlPlane\.replicas|must be odd"):
        CreateClusterInput.model_validate({"name": "t", "topology": {**TOPOLOGY, "controlPlane": {"replicas": 2}}})
    with pytest.raises(ValidationError, match="class"):
        CreateClusterInput.model_validate({"name": "t", "topology": {"version": "v1.34.1"}})


def _seed_devices(netbox, names: list[str]) -> None:
    import pynetbox

    nb = pynetbox.api(netbox[0], token=netbox[2])
    suffix = uuid.uuid4().hex[:6]
    site = nb.dcim.sites.create(name=f"topo-{suffix}", slug=f"topo-{suffix}", status="active")
    maker = nb.dcim.manufacturers.get(slug="nvidia")
    dtype = nb.dcim.device_types.create(manufacturer=maker.id, model=f"HGX {suffix}", slug=f"hgx-{suffix}")
    role = nb.dcim.device_roles.get(slug="gpu-server")
    for n in names:
        nb.dcim.devices.create(name=n, site=site.id, role=role.id, device_type=dtype.id, status="active")


@pytest.mark.asyncio(loop_scope="session")
@pytest.mark.timeout(300)
async def test_topology_cluster_recorded_in_netbox(client, k8s, tenant_worker, tenant_netbox):
    tq = tenant_worker.task_queue
    netbox = tenant_netbox
    name = "gpu-t"
    inp = CreateClusterInput.model_validate(
        {
            "name": name,
            "topology": TOPOLOGY,
            "record_in_netbox": bool(netbox),
            "poll_interval": timedelta(milliseconds=300),
        }
    )

    async def run(wf, arg, *, fail: bool = False):
        h = await client.start_workflow(wf, arg, id=arg.workflow_id(), task_queue=tq)
        if fail:
            with pytest.raises(WorkflowFailureError) as exc:
                await h.result()
            return _cause(exc.value)
        return await h.result()

    await k8s.seed(CAPI_CRDS)
    # The ClusterClass kind is installed but the named class is not there: a clear, non-retryable error.
    err = await run(CreateCluster.run, inp, fail=True)
    assert err.type == "ClusterClassNotFound" and "capi-classes/gpu-quick-start" in str(err), err
    assert not [o for o in await k8s.dump() if o["kind"] == "Cluster"]

    await k8s.seed([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "capi-classes"}}, CLUSTER_CLASS])
    if netbox:
        from workflows.inventory.bootstrap import InventoryBootstrap, InventoryBootstrapInput

        await client.execute_workflow(
            InventoryBootstrap.run,
            InventoryBootstrapInput(),
            id=f"inventory-bootstrap/{uuid.uuid4().hex[:8]}",
            task_queue=tq,
        )
        _seed_devices(netbox, [f"{name}-cp-0", f"{name}-gpu-0"])  # gpu-1 has no device in NetBox

    created = await run(CreateCluster.run, inp)
    assert created.cluster == f"lab:fleet/{name}" and created.machines == 3
    assert created.created == ["Namespace fleet", f"Cluster fleet/{name}"]
    mgmt = await k8s.dump()
    cluster = next(o for o in mgmt if o["kind"] == "Cluster")
    assert cluster["spec"]["topology"]["classRef"] == {"name": "gpu-quick-start", "namespace": "capi-classes"}
    assert cluster["spec"]["topology"]["variables"][1]["value"] == {"servers": ["10.0.0.1"]}
    assert "controlPlaneRef" not in cluster["spec"]
    assert {c["type"]: c["status"] for c in cluster["status"]["conditions"]}["TopologyReconciled"] == "True"
    assert {o["metadata"]["name"] for o in mgmt if o["kind"] == "MachineDeployment"} == {f"{name}-gpu"}
    assert {o["metadata"]["name"] for o in mgmt if o["kind"] == "KubeadmControlPlane"} == {f"{name}-cp"}
    machines = {o["metadata"]["name"]: o for o in mgmt if o["kind"] == "Machine"}
    assert set(machines) == {f"{name}-cp-0", f"{name}-gpu-0", f"{name}-gpu-1"}
    assert all(m["status"]["nodeRef"]["name"] == n for n, m in machines.items())

    kubeconfig = next(o for o in mgmt if o["kind"] == "Secret" and o["metadata"]["name"] == f"{name}-kubeconfig")
    import base64

    import yaml

    url = yaml.safe_load(base64.b64decode(kubeconfig["data"]["value"]))["clusters"][0]["cluster"]["server"]
    wl = EmulatorAdmin(url)
    try:
        nodes = [o for o in await wl.dump() if o["kind"] == "Node"]
    finally:
        await wl.aclose()
    assert sum(int(n["status"]["allocatable"].get("nvidia.com/gpu", 0)) for n in nodes) == 16
    assert sorted(str(n["metadata"]["labels"].get("millwright.dev/gpu-class")) for n in nodes) == [
        "None",
        "h200-sxm",
        "h200-sxm",
    ]

    if netbox:
        import pynetbox

        assert created.netbox is not None and created.netbox.cluster_created
        assert created.netbox.assigned == [f"{name}-cp-0", f"{name}-gpu-0"]
        assert created.netbox.missing == [f"{name}-gpu-1"]
        nb = pynetbox.api(netbox[0], token=netbox[2])
        rec = nb.virtualization.clusters.get(name=name)
        assert rec is not None
        assert {d.name for d in nb.dcim.devices.filter(cluster_id=rec.id)} == {f"{name}-cp-0", f"{name}-gpu-0"}
    else:
        assert created.netbox is None

    # Idempotent: nothing created, nothing reassigned, the same device still missing.
    again = await run(CreateCluster.run, inp)
    assert again.created == [] and f"Cluster fleet/{name}" in again.unchanged
    if netbox:
        assert again.netbox.assigned == [] and not again.netbox.cluster_created
        assert again.netbox.already == [f"{name}-cp-0", f"{name}-gpu-0"]
        assert again.netbox.missing == [f"{name}-gpu-1"]

    deleted = await run(DeleteCluster.run, DeleteClusterInput(name=name))
    assert f"Cluster fleet/{name}" in deleted.deleted
    left = [
        f"{o['kind']} {o['metadata']['name']}"
        for o in await k8s.dump()
        if o["kind"] in ("Cluster", "Machine", "MachineDeployment", "KubeadmControlPlane")
    ]
    assert left == []


@pytest.mark.asyncio(loop_scope="session")
async def test_topology_without_cluster_class_kind(client, k8s, tenant_worker):
    """Cluster API installed without the ClusterClass kind: KindNotInstalled naming it, nothing written."""
    await k8s.seed([c for c in CAPI_CRDS if c["spec"]["names"]["kind"] != "ClusterClass"])
    inp = CreateClusterInput.model_validate({"name": "gpu-u", "topology": TOPOLOGY})
    h = await client.start_workflow(
        CreateCluster.run, inp, id=f"{inp.workflow_id()}/{uuid.uuid4().hex[:6]}", task_queue=tenant_worker.task_queue
    )
    with pytest.raises(WorkflowFailureError) as exc:
        await h.result()
    err = _cause(exc.value)
    assert err.type == "KindNotInstalled" and "cluster.x-k8s.io/v1beta2/ClusterClass" in str(err), err
    assert not [o for o in await k8s.dump() if o["metadata"].get("name", "").startswith("gpu-u")]
