"""What a drain costs the GPU work on its node (workflows/maintenance/drain.py), on a real dev server against the
Kubernetes emulator: the gangs whose pods it evicted, each counted once, and their GPU-hours at risk, in the run's
status and result and in the worker's metrics."""

from __future__ import annotations

from datetime import timedelta

import pytest
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.runtime import MetricBuffer, Runtime, TelemetryConfig

from activities.kube.topology import KAI_POD_GROUP_ANNOTATION
from lab.fleet import Fleet
from tests.kube_helpers import pods_on
from tests.workflows.budget.test_budget_signals import worker_on
from tests.workflows.maintenance.test_node_maintenance import maintenance, start
from workflows.maintenance.drain import GANGS_INTERRUPTED, GPU_HOURS_AT_RISK
from workflows.maintenance.node_maintenance import NodeMaintenance

pytestmark = pytest.mark.timeout(120)
CHECKPOINT = timedelta(minutes=30)


def gang_fleet() -> list[dict]:
    """Four 8-GPU nodes: a KAI gang of three 4-GPU pods on node-01..03 (its PodGroup named by annotation, no
    PodGroup object: its minimum is all its pods), a lone 4-GPU pod beside it on node-01, a pod using no GPU there.
    The emulator's pods started on 2026-01-01: each gang has run longer than the checkpoint interval."""
    workloads = [
        {"name": "trainer", "namespace": "training", "replicas": 3, "gpus": 4, "labels": {"app": "trainer"},
         "nodes": ["node-01", "node-02", "node-03"], "annotations": {KAI_POD_GROUP_ANNOTATION: "pg-trainer"}},
        {"name": "solo", "namespace": "training", "replicas": 1, "gpus": 4, "labels": {"app": "solo"},
         "nodes": ["node-01"]},
        {"name": "web", "namespace": "default", "replicas": 1, "labels": {"app": "web"}, "nodes": ["node-01"]},
    ]  # fmt: skip
    fleet = Fleet.model_validate({"cluster": "lab", "nodes": [{"prefix": "node-", "count": 4, "gpus": 8}],
                                  "workloads": workloads})  # fmt: skip
    return fleet.to_objects()


async def test_a_drain_reports_the_gangs_it_interrupted_and_their_gpu_hours_at_risk(
        client, temporal_address, k8s, core, kubeconfig_path):  # fmt: skip
    await k8s.seed(gang_fleet())
    assert len(await pods_on(core, "node-01")) == 3
    metrics = MetricBuffer(10_000)
    metered = await Client.connect(temporal_address, namespace=client.namespace, data_converter=pydantic_data_converter,
                                   runtime=Runtime(telemetry=TelemetryConfig(metrics=metrics)))  # fmt: skip
    async with worker_on(metered, kubeconfig_path) as worker:
        drain = {"eviction_retry_interval": 0.5, "timeout": 60, "checkpoint_interval": CHECKPOINT.total_seconds()}
        handle = await start(metered, worker, maintenance("node-01", drain=drain))
        result = await handle.result()
        status = await handle.query(NodeMaintenance.status)

    assert result.outcome == "completed" and len(result.evicted) == 3
    # The gang (12 GPUs) and the lone pod (4), each capped by the 30-minute checkpoint; the pod without GPUs is none.
    want = {"kai:training/pg-trainer": 6.0, f"pod:training/{solo_pod(result.evicted)}": 2.0}
    assert result.interrupted_gangs == want
    assert (result.gangs_interrupted, result.gpu_hours_at_risk) == (2, 8.0)
    assert (status.gangs_interrupted, status.gpu_hours_at_risk, status.interrupted_gangs) == (2, 8.0, want)

    updates = [u for u in metrics.retrieve_updates() if u.metric.name in (GANGS_INTERRUPTED, GPU_HOURS_AT_RISK)]
    labels = {"cluster": "lab", "workflow_type": "NodeMaintenance"}
    assert all(labels.items() <= dict(u.attributes).items() for u in updates)
    assert sum(u.value for u in updates if u.metric.name == GANGS_INTERRUPTED) == 2
    assert sorted(u.value for u in updates if u.metric.name == GPU_HOURS_AT_RISK) == [2.0, 6.0]


def solo_pod(evicted: list[str]) -> str:
    return next(p.split("/", 1)[1] for p in evicted if p.startswith("training/solo"))
