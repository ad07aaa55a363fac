"""TenantUsage over a short lab period: pods of three tenants and one outside every tenant, on the emulator's GPU
nodes, scraped by the real Prometheus; GPU-hours match the pods' lifetimes."""

from __future__ import annotations

import asyncio
import csv
import json
import math
import time
import uuid
from datetime import datetime, timedelta, timezone

import pytest
import pytest_asyncio

from activities.capi.ownership import TENANT_LABEL
from lab.fleet import Fleet
from lab.k8s.crds import TENANCY_CRDS
from tests.lab.test_lab_prometheus import namespace, pod, queue
from tests.maintenance.test_node_maintenance import record_history
from workflows.usage.tenant_usage import TenantUsage, TenantUsageInput

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


@pytest_asyncio.fixture(loop_scope="session")
async def usage_worker(client, kubeconfig_path, prometheus, tmp_path):
    """A worker built like production, reading the session's Prometheus and writing reports under tmp_path."""
    from worker import registry
    from worker.config import WorkerSettings

    settings = WorkerSettings(kubeconfig=str(kubeconfig_path), metrics_port=0, prometheus_url=prometheus.url,
                              usage_sink_dir=str(tmp_path / "usage"))  # fmt: skip
    registration = registry.build(settings)
    async with registry.new_worker(client, registration, f"usage-{uuid.uuid4().hex[:8]}") as worker:
        yield worker
    await registration.close()


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
    return objects + [namespace("scratch")]


async def test_gpu_hours_per_tenant_match_the_pods_lifetimes(client, usage_worker, k8s, core, prometheus, tmp_path):
    nodes = [{"name": "u-1", "gpus": 8}, {"name": "u-2", "gpus": 8}]
    await k8s.seed(TENANCY_CRDS)
    await k8s.seed(Fleet.model_validate({"cluster": "lab", "nodes": nodes}).to_objects() + tenant_objects())
    await prometheus.wait_for('count(DCGM_FI_DEV_GPU_UTIL{Hostname=~"u-.*"}) == 16', what="the GPU nodes' exporters")

    # Start and end each pod on its schedule, noting when the API took each change.
    lived: dict[str | None, list[tuple[int, float, float]]] = {t: [] for t in PODS}
    events = sorted([(p[3], "start", t, p) for t, ps in PODS.items() for p in ps]
                    + [(p[3] + p[4], "end", t, p) for t, ps in PODS.items() for p in ps], key=lambda e: e[:2])  # fmt: skip
    first = math.ceil(time.time()) + 1.0
    began: dict[str, float] = {}
    for at, what, tenant, (ns, name, gpus, _, _) in events:
        await asyncio.sleep(max(0.0, first + at - time.time()))
        if what == "start":
            node = "u-1" if tenant in ("acme", "beta") else "u-2"
            await k8s.seed([pod(name, ns, node, gpus)])
            began[name] = time.time()
        else:
            await core.delete_namespaced_pod(name, ns, grace_period_seconds=0)
            lived[tenant].append((gpus, began[name], time.time()))
    await asyncio.sleep(2 * SCRAPE_SECONDS)  # the last deletion scraped

    start = datetime.fromtimestamp(math.floor(first) - 2, timezone.utc)
    end = datetime.fromtimestamp(math.ceil(time.time()), timezone.utc)
    inp = TenantUsageInput(cluster="lab", start=start, end=end, step=timedelta(seconds=1),
                           page=timedelta(seconds=4))  # fmt: skip
    handle = await client.start_workflow(TenantUsage.run, inp, id=f"{inp.workflow_id()}-{uuid.uuid4().hex[:6]}",
                                         task_queue=usage_worker.task_queue)  # fmt: skip
    result = await handle.result()

    rows = {r.tenant: r for r in result.rows}
    assert list(rows) == ["acme", "beta", "gamma", "(unattributed) scratch"]
    assert result.pages == math.ceil((end - start).total_seconds() / 4)
    for tenant, pods in lived.items():
        row = rows[tenant or "(unattributed) scratch"]
        actual = sum(gpus * (gone - began_at) for gpus, began_at, gone in pods)
        # Each pod is seen from the first scrape after it starts to the first after it ends: within one scrape
        # interval of its lifetime, on each of its GPUs.
        slack = sum(gpus for gpus, _, _ in pods) * SCRAPE_SECONDS
        assert abs(row.gpu_hours * 3600 - actual) <= slack, (tenant, row.gpu_hours * 3600, actual)
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
    written = json.loads(open(result.report.json_path).read())
    assert [r["tenant"] for r in written["rows"]] == list(rows) and written["cluster"] == "lab"
    with open(result.report.csv_path) as f:
        table = list(csv.DictReader(f))
    assert [(r["tenant"], float(r["gpu_hours"])) for r in table] == [
        (t, pytest.approx(r.gpu_hours, abs=1e-6)) for t, r in rows.items()]  # fmt: skip
    assert str(tmp_path / "usage") in result.report.csv_path  # the usage_worker's usage_sink_dir
    # This worker has no NetBox: each tenant's journal entry is reported as not written (tests/netbox writes them).
    assert set(result.netbox_journal) == set(QUOTAS)
    assert all(why.startswith("not written: NetBox is not configured") for why in result.netbox_journal.values())
    await record_history(handle, "tenant_usage")
