"""The lab's real Prometheus and what it scrapes from the emulator: dcgm-exporter per GPU node (label set, the GPUs
pods hold, readings a test sets) and KAI's queue metrics."""

from __future__ import annotations

import httpx

from lab.fleet import Fleet
from lab.k8s.crds import TENANCY_CRDS
from lab.k8s.dcgm import gpu_uuid


def pod(name: str, namespace: str, node: str, gpus: int, labels: dict | None = None) -> dict:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": labels or {}},
            "spec": {"nodeName": node, "containers": [{"name": "train", "image": "trainer",
                                                       "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]},
            "status": {"phase": "Running"}}  # fmt: skip


def namespace(name: str, labels: dict | None = None) -> dict:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels or {}}}


def queue(name: str, quota: int) -> dict:
    return {"apiVersion": "scheduling.run.ai/v2", "kind": "Queue", "metadata": {"name": name},
            "spec": {"resources": {"gpu": {"quota": quota, "limit": -1, "overQuotaWeight": 1},
                                   "cpu": {"quota": -1, "limit": -1, "overQuotaWeight": 1},
                                   "memory": {"quota": -1, "limit": -1, "overQuotaWeight": 1}}}}  # fmt: skip


async def test_dcgm_exporter_per_gpu_node_with_the_pods_holding_its_gpus(k8s, k8s_emulator, prometheus):
    nodes = [{"name": "g-1", "gpus": 4, "labels": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}},
             {"name": "cpu-1", "gpus": 0}]  # fmt: skip
    await k8s.seed([*Fleet.model_validate({"cluster": "lab", "nodes": nodes}).to_objects(), namespace("team-a"), pod("b-job", "team-a", "g-1", 1), pod("a-job", "team-a", "g-1", 2)])  # fmt: skip
    await k8s.set_gpu("g-1", {"DCGM_FI_DEV_GPU_UTIL": 97})
    await k8s.set_gpu("g-1", {"DCGM_FI_DEV_GPU_UTIL": 12, "DCGM_FI_DEV_XID_ERRORS": 79}, gpu=3)
    with httpx.Client(base_url=k8s_emulator.url) as http:
        assert [t["labels"]["node"] for t in http.get("/_lab/dcgm/targets").json()] == ["g-1"]  # GPU nodes only
        text = http.get("/_lab/dcgm/nodes/g-1/metrics").text
        assert "# TYPE DCGM_FI_DEV_XID_ERRORS gauge" in text
        assert "# TYPE DCGM_FI_DEV_ECC_DBE_VOL_TOTAL counter" in text
        assert (f'DCGM_FI_DEV_GPU_UTIL{{gpu="0",UUID="{gpu_uuid("g-1", 0)}",pci_bus_id="00000000:18:00.0",'
                'device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="g-1",DCGM_FI_DRIVER_VERSION="550.54.15",'
                'pod="a-job",namespace="team-a",container="train"} 97') in text  # fmt: skip
        assert http.get("/_lab/dcgm/nodes/nowhere/metrics").status_code == 404
        assert http.post("/_lab/dcgm", json={"node": "g-1", "values": {"DCGM_FI_NOPE": 1}}).status_code == 400
        assert http.post("/_lab/dcgm", json={"values": {}}).status_code == 400
        assert http.get("/_lab/dcgm").json() == {"g-1": {"all": {"DCGM_FI_DEV_GPU_UTIL": 97.0},
                                                         "3": {"DCGM_FI_DEV_GPU_UTIL": 12.0,
                                                               "DCGM_FI_DEV_XID_ERRORS": 79.0}}}  # fmt: skip

    # As scraped: pods in name order from GPU 0, a free GPU without pod labels, the cluster label the scrape adds.
    held = await prometheus.wait_for('DCGM_FI_DEV_GPU_UTIL{Hostname="g-1"}', what="g-1's GPUs")
    by_gpu = {s["metric"]["gpu"]: s for s in held}
    assert {g: (s["metric"].get("pod"), s["value"][1]) for g, s in by_gpu.items()} == {
        "0": ("a-job", "97"), "1": ("a-job", "97"), "2": ("b-job", "97"), "3": (None, "12")}  # fmt: skip
    assert {s["metric"]["cluster"] for s in held} == {"lab"} and by_gpu["3"]["metric"]["instance"] == "g-1"
    hot = 'count by (namespace) (DCGM_FI_DEV_GPU_UTIL{Hostname="g-1", pod!=""} > 50)'
    assert [(s["metric"]["namespace"], s["value"][1]) for s in await prometheus.vector(hot)] == [("team-a", "3")]

    await k8s.set_gpu("g-1", {"DCGM_FI_DEV_XID_ERRORS": None}, gpu=3)  # back to the default
    await prometheus.wait_for('DCGM_FI_DEV_XID_ERRORS{Hostname="g-1", gpu="3"} == 0', what="the XID cleared")


async def test_kai_queue_metrics_from_the_emulator_s_queues(k8s, prometheus):
    nodes = [{"name": "k-1", "gpus": 8}]
    await k8s.seed(TENANCY_CRDS + Fleet.model_validate({"cluster": "lab", "nodes": nodes}).to_objects())
    await k8s.seed([queue("acme", 4), queue("idle", 2), namespace("acme-train", {"kai.scheduler/queue": "acme"}),
                    pod("by-namespace", "acme-train", "k-1", 2),
                    pod("by-label", "default", "k-1", 1, {"kai.scheduler/queue": "acme"}),
                    pod("no-queue", "default", "k-1", 4)])  # fmt: skip
    allocated = await prometheus.wait_for('kai_queue_allocated_gpus{queue_name="acme"} == 3', what="acme's GPUs")
    assert allocated[0]["metric"]["cluster"] == "lab"
    deserved = await prometheus.vector("kai_queue_deserved_gpus")
    assert sorted((s["metric"]["queue_name"], s["value"][1]) for s in deserved) == [("acme", "4"), ("idle", "2")]
    assert (await prometheus.vector('kai_queue_allocated_gpus{queue_name="idle"}'))[0]["value"][1] == "0"
    assert prometheus.queries()[-1] == 'kai_queue_allocated_gpus{queue_name="idle"}'  # the query log
