"""TenantUsage over a short lab period: pods of three tenants and one outside every tenant, on the emulator's GPU
nodes, scraped by the real Prometheus; GPU-hours match the pods' lifetimes."""

from __future__ import annotations

import asyncio
import contextlib
import csv
import json
import math
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import pytest_asyncio

from activities.capi.ownership import TENANT_LABEL
from activities.prometheus import mig_share
from lab.fleet import Fleet
from lab.k8s.crds import TENANCY_CRDS
from tests.lab.test_lab_prometheus import namespace, pod, queue
from tests.workflows.maintenance.test_node_maintenance import record_history
from tests.workflows.usage.test_usage_sink import get
from workflows.usage.tenant_usage import UNATTRIBUTED, TenantUsage, TenantUsageInput

pytestmark = pytest.mark.timeout(120)

SCRAPE_SECONDS = 1.0  # the session's Prometheus (tests/conftest.py)
# tenant -> (namespace, pod, GPUs, seconds after the first start it starts, seconds it lives)
PODS = {
    "acme": [("acme-train", "acme-1", 2, 0, 5)],
    "beta": [("beta-train", "beta-1", 1, 1, 3), ("beta-serve", "beta-2", 1, 2, 3)],
    "gamma": [("gamma-train", "gamma-1", 4, 1, 2)],
    None: [("scratch", "loose-1", 1, 0, 4)],  # outside every tenant
}
QUOTAS = {"acme": 4, "beta": 2, "gamma": 8}


@contextlib.asynccontextmanager
async def worker_of(client, kubeconfig_path, prometheus, **sink: str):
    """A worker built like production, reading the session's Prometheus and writing reports to `sink`."""
    from worker import registry
    from worker.config import WorkerSettings

    settings = WorkerSettings.model_validate({"kubeconfig": str(kubeconfig_path), "metrics_port": 0,
                                              "prometheus_url": prometheus.url, **sink})  # fmt: skip
    registration = registry.build(settings)
    async with registry.new_worker(client, registration, f"usage-{uuid.uuid4().hex[:8]}") as worker:
        yield worker
    await registration.close()


@pytest_asyncio.fixture(loop_scope="session")
async def usage_worker(client, kubeconfig_path, prometheus, tmp_path):
    """Reports under tmp_path."""
    async with worker_of(client, kubeconfig_path, prometheus, usage_sink_dir=str(tmp_path / "usage")) as worker:
        yield worker


@pytest_asyncio.fixture(loop_scope="session")
async def s3_usage_worker(client, kubeconfig_path, prometheus, s3, monkeypatch):
    """Reports to the test S3 server's bucket, under `lab-usage/`, its keys in an environment variable."""
    monkeypatch.setenv("USAGE_S3_KEYS", f"{s3.access_key_id}:{s3.secret_access_key}")
    async with worker_of(client, kubeconfig_path, prometheus, usage_sink=f"s3://{s3.bucket}/lab-usage",
                         usage_sink_endpoint=s3.url, usage_sink_credentials="env:USAGE_S3_KEYS") as worker:  # fmt: skip
        yield worker


def tenant_objects() -> list[dict]:
    objects = []
    for tenant, quota in QUOTAS.items():
        q = queue(tenant, quota)
        q["metadata"]["labels"] = {TENANT_LABEL: tenant}
        objects.append(q)
        for ns in sorted({p[0] for p in PODS[tenant]}):
            objects.append(namespace(ns, {TENANT_LABEL: tenant, "kai.scheduler/queue": tenant}))
            objects.append({"apiVersion": "v1", "kind": "ResourceQuota",
                            "metadata": {"name": f"{tenant}-quota", "namespace": ns, "labels": {TENANT_LABEL: tenant}},
                            "spec": {"hard": {"requests.nvidia.com/gpu": str(quota)}}})  # fmt: skip
    return [*objects, namespace("scratch")]


Schedule = list[tuple[str | None, dict, float, float, float]]  # (tenant, pod, GPUs it holds, starts at, lives)


async def live_through(
    k8s, core, schedule: Schedule
) -> tuple[float, dict[str | None, list[tuple[float, float, float]]]]:
    """Start and end each pod on its schedule (seconds after the next whole second), noting when the API took each
    change: the first start, and per tenant the pods' (GPUs, began, gone)."""
    lived: dict[str | None, list[tuple[float, float, float]]] = {t: [] for t, *_ in schedule}
    events = sorted([(at, "start", i) for i, (_, _, _, at, _) in enumerate(schedule)]
                    + [(at + life, "end", i) for i, (_, _, _, at, life) in enumerate(schedule)])  # fmt: skip
    first = math.ceil(time.time()) + 1.0
    began: dict[int, float] = {}
    for at, what, i in events:
        tenant, obj, gpus, _, _ = schedule[i]
        await asyncio.sleep(max(0.0, first + at - time.time()))
        if what == "start":
            await k8s.seed([obj])
            began[i] = time.time()
        else:
            await core.delete_namespaced_pod(obj["metadata"]["name"], obj["metadata"]["namespace"],
                                             grace_period_seconds=0)  # fmt: skip
            lived[tenant].append((gpus, began[i], time.time()))
    await asyncio.sleep(2 * SCRAPE_SECONDS)  # the last deletion scraped
    return first, lived


async def usage_since(client, usage_worker, first: float):
    """A TenantUsage run over the whole seconds from just before `first` to now, at 1 s steps and 4 s pages."""
    start = datetime.fromtimestamp(math.floor(first) - 2, UTC)
    end = datetime.fromtimestamp(math.ceil(time.time()), UTC)
    inp = TenantUsageInput(cluster="lab", start=start, end=end, step=timedelta(seconds=1),
                           page=timedelta(seconds=4))  # fmt: skip
    handle = await client.start_workflow(TenantUsage.run, inp, id=f"{inp.workflow_id()}-{uuid.uuid4().hex[:6]}",
                                         task_queue=usage_worker.task_queue)  # fmt: skip
    return handle, await handle.result()


def assert_lifetimes(rows: dict, lived: dict, attr: str = "gpu_hours") -> None:
    """Each pod is seen from the first scrape after it starts to the first after it ends: its GPU-seconds are
    within one scrape interval of its lifetime, on each GPU (or share of one) it holds."""
    for tenant, pods in lived.items():
        row = rows[tenant if tenant in rows else UNATTRIBUTED + "scratch"]
        actual = sum(gpus * (gone - began_at) for gpus, began_at, gone in pods)
        slack = sum(gpus for gpus, _, _ in pods) * SCRAPE_SECONDS
        assert abs(getattr(row, attr) * 3600 - actual) <= slack, (tenant, attr, getattr(row, attr) * 3600, actual)


async def test_gpu_hours_per_tenant_match_the_pods_lifetimes(client, usage_worker, k8s, core, prometheus, tmp_path):
    nodes = [{"name": "u-1", "gpus": 8}, {"name": "u-2", "gpus": 8}]
    await k8s.seed(TENANCY_CRDS)
    await k8s.seed(Fleet.model_validate({"cluster": "lab", "nodes": nodes}).to_objects() + tenant_objects())
    await prometheus.wait_for('count(DCGM_FI_DEV_GPU_UTIL{Hostname=~"u-.*"}) == 16', what="the GPU nodes' exporters")

    schedule: Schedule = [(tenant, pod(name, ns, "u-1" if tenant in ("acme", "beta") else "u-2", gpus), gpus, at, life)
                          for tenant, ps in PODS.items() for ns, name, gpus, at, life in ps]  # fmt: skip
    first, lived = await live_through(k8s, core, schedule)
    handle, result = await usage_since(client, usage_worker, first)
    start, end = result.start, result.end

    rows = {r.tenant: r for r in result.rows}
    assert list(rows) == ["acme", "beta", "gamma", "(unattributed) scratch"]
    assert result.pages == math.ceil((end - start).total_seconds() / 4)
    assert_lifetimes(rows, lived)
    assert all(r.mig_gpu_hours == 0 for r in result.rows) and result.unweighted_mig_models == []
    assert (rows["acme"].peak_gpus, rows["beta"].peak_gpus, rows["gamma"].peak_gpus) == (2, 2, 4)
    assert rows["beta"].namespaces == ["beta-serve", "beta-train"]
    assert {t: (rows[t].guaranteed_gpus, rows[t].allocated_peak_gpus) for t in QUOTAS} == {
        "acme": (4, 2), "beta": (2, 2), "gamma": (8, 4)}  # fmt: skip
    assert result.unattributed_gpu_hours == rows["(unattributed) scratch"].gpu_hours > 0
    assert result.total_gpu_hours == pytest.approx(sum(r.gpu_hours for r in result.rows))

    # The table in the queries, the report in the sink.
    assert await handle.query(TenantUsage.usage) == result
    progress = await handle.query(TenantUsage.progress)
    assert progress.phase == "completed" and f"acme {rows['acme'].gpu_hours:.2f}" in progress.details
    assert result.report is not None and result.report.written
    written = json.loads(Path(result.report.json_path).read_text())
    assert [r["tenant"] for r in written["rows"]] == list(rows) and written["cluster"] == "lab"
    with open(result.report.csv_path) as f:
        table = list(csv.DictReader(f))
    assert [(r["tenant"], float(r["gpu_hours"])) for r in table] == [
        (t, pytest.approx(r.gpu_hours, abs=1e-6)) for t, r in rows.items()]  # fmt: skip
    assert str(tmp_path / "usage") in result.report.csv_path  # the usage_worker's usage_sink_dir
    # This worker has no NetBox: each tenant's journal entry is reported as not written (tests/activities/netbox writes them).
    assert set(result.netbox_journal) == set(QUOTAS)
    assert all(why.startswith("not written: NetBox is not configured") for why in result.netbox_journal.values())
    await record_history(handle, "tenant_usage")


def mig_pod(name: str, namespace: str, node: str, profile: str, count: int) -> dict:
    """A pod asking the device plugin's mixed strategy for `count` MIG instances of `profile`."""
    obj = pod(name, namespace, node, 0)
    obj["spec"]["containers"][0]["resources"] = {"limits": {f"nvidia.com/mig-{profile}": str(count)}}
    return obj


async def test_mig_instances_count_as_their_share_of_a_gpu(client, s3_usage_worker, k8s, core, prometheus, s3):
    # m-1's two H100s are moved to all-balanced by the lab's mig-manager: per GPU 2 x 1g.10gb, 2g.20gb, 3g.40gb.
    nodes = [{"name": "m-1", "gpus": 2, "labels": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
                                                   "nvidia.com/mig.config": "all-balanced"}},
             {"name": "w-1", "gpus": 2}]  # fmt: skip
    await k8s.seed(TENANCY_CRDS)
    await k8s.seed(Fleet.model_validate({"cluster": "lab", "nodes": nodes}).to_objects() + tenant_objects())
    await prometheus.wait_for('count(DCGM_FI_DEV_GPU_UTIL{Hostname="m-1", GPU_I_PROFILE!=""}) == 8',
                              what="m-1's GPU instances")  # fmt: skip

    schedule: Schedule = [
        ("acme", mig_pod("acme-small", "acme-train", "m-1", "1g.10gb", 3), 3 / 7, 0, 3),
        ("acme", pod("acme-whole", "acme-train", "w-1", 1), 1, 1, 2),
        ("beta", mig_pod("beta-infer", "beta-serve", "m-1", "3g.40gb", 2), 2 * 3 / 7, 1, 2),
        (None, mig_pod("loose-small", "scratch", "m-1", "1g.10gb", 1), 1 / 7, 0, 2),
    ]
    first, lived = await live_through(k8s, core, schedule)
    handle, result = await usage_since(client, s3_usage_worker, first)

    rows = {r.tenant: r for r in result.rows}
    assert list(rows) == ["acme", "beta", "gamma", "(unattributed) scratch"]
    assert_lifetimes(rows, lived)
    on_mig = {t: [p for p in pods if p[0] < 1] for t, pods in lived.items()}  # all but acme-whole
    assert_lifetimes(rows, on_mig, "mig_gpu_hours")
    assert rows["beta"].gpu_hours == rows["beta"].mig_gpu_hours and rows["gamma"].gpu_hours == 0
    assert rows["acme"].peak_gpus == pytest.approx(1 + 3 / 7) and rows["beta"].peak_gpus == pytest.approx(6 / 7)
    assert result.unweighted_mig_models == []

    # The report in the object store; its keys never in the run's history.
    assert result.report is not None and result.report.json_path is not None
    assert result.report.json_path.startswith(f"s3://{s3.bucket}/lab-usage/lab/")
    written = json.loads(get(s3, result.report.json_path.removeprefix(f"s3://{s3.bucket}/")).text)
    assert {r["tenant"]: r["mig_gpu_hours"] for r in written["rows"]} == {
        r.tenant: r.mig_gpu_hours for r in rows.values()
    }
    history = (await handle.fetch_history()).to_json()
    assert s3.secret_access_key not in history and s3.access_key_id not in history


@pytest.mark.parametrize(
    ("profile", "model", "share"),
    [
        ("1g.10gb", "NVIDIA H100 80GB HBM3", 1 / 7),
        ("1g.10gb+me", "NVIDIA H100 80GB HBM3", 1 / 7),
        ("3g.40gb", "NVIDIA A100-SXM4-80GB", 3 / 7),
        ("1g.5gb", "NVIDIA A100-SXM4-40GB", 1 / 7),
        ("2g.35gb", "NVIDIA H200", 2 / 7),
        ("7g.141gb", "NVIDIA H200 NVL", 1.0),
        ("1g.6gb", "NVIDIA A30", None),  # 4 compute slices: not in the profile table Millwright follows
        ("weird", "NVIDIA H100 80GB HBM3", None),
    ],
)
def test_a_mig_instance_is_its_compute_slices_over_its_gpus(profile, model, share):
    assert mig_share(profile, model) == (share if share is None else pytest.approx(share))
