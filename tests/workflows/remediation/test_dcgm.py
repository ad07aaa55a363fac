"""GPU faults from dcgm-exporter's series in Prometheus: the query (one a slice) against the lab's Prometheus, the
decision, and a sweep that starts a remediation for a node only an XID in Prometheus shows sick."""

from __future__ import annotations

import contextlib
import uuid
from datetime import UTC, datetime

import pytest
from temporalio.testing import ActivityEnvironment

from activities.node_health import NodeHealth
from activities.prometheus import (
    DcgmFaultsQuery,
    GpuFault,
    PrometheusActivities,
    dcgm_faults_promql,
)
from lab.k8s.dcgm import gpu_uuid
from tests.kube_helpers import wait_for
from tests.test_priorities import children, scheduled
from tests.workflows.maintenance.test_node_maintenance import record_history
from tests.workflows.remediation.helpers import fast_settings, fleet
from workflows.budget.disruption_budget import DisruptionBudget
from workflows.budget.leases import LeaseRelease, budget_workflow_id
from workflows.common import priorities
from workflows.remediation.health_sweep import FleetHealthSweep
from workflows.remediation.node_remediation import NodeRemediation
from workflows.remediation.policy import HealthChecks, decide
from workflows.remediation.sweep_models import FleetHealthSweepInput

pytestmark = pytest.mark.timeout(120)


FAULTS = 'count({__name__=~"DCGM_FI_DEV_XID_ERRORS|DCGM_FI_DEV_ECC_DBE_VOL_TOTAL|DCGM_FI_DEV_ROW_REMAP_FAILURE"} > 0)'


async def test_one_query_maps_the_slice_s_fault_series_to_its_nodes(k8s, prometheus):
    await k8s.seed(fleet(["gpu-a.1", "gpu-b", "gpu-c", "gpu-a-1"]))
    await k8s.set_gpu("gpu-a.1", {"DCGM_FI_DEV_XID_ERRORS": 79}, gpu=3)
    await k8s.set_gpu("gpu-b", {"DCGM_FI_DEV_ROW_REMAP_FAILURE": 1, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": 2}, gpu=1)
    await k8s.set_gpu("gpu-b", {"DCGM_FI_DEV_GPU_TEMP": 60})  # not a fault
    await k8s.set_gpu("gpu-c", {"DCGM_FI_DEV_XID_ERRORS": 48})  # not in the slice
    await k8s.set_gpu("gpu-a-1", {"DCGM_FI_DEV_XID_ERRORS": 79}, gpu=0)  # a `.` in a name is not a regex wildcard
    await prometheus.wait_for(f"{FAULTS} == 12", what="the four nodes' faults")  # gpu-c: 8 GPUs
    query = DcgmFaultsQuery(cluster="lab", nodes=["gpu-b", "gpu-a.1"])
    asked = len(prometheus.queries())
    acts = PrometheusActivities(url=prometheus.url)
    try:
        seen = await ActivityEnvironment().run(acts.dcgm_faults, query)
        elsewhere = await ActivityEnvironment().run(acts.dcgm_faults, elsewhere_query(query))
    finally:
        await acts.close()
    assert seen.configured and seen.url == prometheus.url and seen.series == 3
    assert [(f.node, f.metric, f.gpu, f.value) for f in seen.faults] == [
        ("gpu-a.1", "DCGM_FI_DEV_XID_ERRORS", "3", 79.0),
        ("gpu-b", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "1", 2.0),
        ("gpu-b", "DCGM_FI_DEV_ROW_REMAP_FAILURE", "1", 1.0),
    ]
    assert seen.faults[0].uuid == gpu_uuid("gpu-a.1", 3)
    assert elsewhere.faults == [], "the scrape labels these series cluster=lab"
    assert prometheus.queries()[asked:] == [dcgm_faults_promql(query), dcgm_faults_promql(elsewhere_query(query))]
    assert dcgm_faults_promql(query) == (
        '{__name__=~"DCGM_FI_DEV_XID_ERRORS|DCGM_FI_DEV_ECC_DBE_VOL_TOTAL|DCGM_FI_DEV_ROW_REMAP_FAILURE|'
        'DCGM_FI_DEV_ROW_REMAP_PENDING", cluster="lab", Hostname=~"gpu\\\\-a\\\\.1|gpu\\\\-b"} > 0'
    )
    # No MILLWRIGHT_PROMETHEUS_URL: nothing asked, and the answer says so.
    assert not (await ActivityEnvironment().run(PrometheusActivities().dcgm_faults, query)).configured


def elsewhere_query(query: DcgmFaultsQuery) -> DcgmFaultsQuery:
    return query.model_copy(update={"cluster": "other"})


def test_the_decision_acts_on_hardware_xids_ecc_and_row_remaps_only():
    now = datetime(2026, 1, 1, tzinfo=UTC)
    node = NodeHealth(name="n1", ready=True)
    checks = HealthChecks(host_agent=False, bmc=False)

    def fault(metric: str, value: float, gpu: str = "0") -> GpuFault:
        return GpuFault(node="n1", metric=metric, value=value, gpu=gpu, uuid=f"GPU-{gpu}")

    app = decide("lab", node, checks, now, dcgm=[fault("DCGM_FI_DEV_XID_ERRORS", 13)])
    assert app.action == "healthy" and app.note == "not acted on: DCGM: XID 13 on GPU0 (GPU-0)"
    sick = decide("lab", node, checks, now, dcgm=[fault("DCGM_FI_DEV_XID_ERRORS", 79, "3"),
                                                  fault("DCGM_FI_DEV_ROW_REMAP_PENDING", 1, "1")])  # fmt: skip
    assert sick.action == "remediate"
    assert sick.reasons == ["DCGM: XID 79 on GPU3 (GPU-3)", "DCGM: row remap pending on GPU1 (GPU-1)"]
    off = HealthChecks(host_agent=False, bmc=False, dcgm={"row_remap": False, "xid_codes": []})
    faults = [fault("DCGM_FI_DEV_XID_ERRORS", 79), fault("DCGM_FI_DEV_ROW_REMAP_FAILURE", 1)]
    assert decide("lab", node, off, now, dcgm=faults).action == "healthy"
    assert decide("lab", node, checks, now, dcgm=faults).reasons[1] == "DCGM: row remap failed on GPU0 (GPU-0)"
    assert decide("lab", node, checks, now, dcgm=None).action == "healthy"  # not read: unknown, not unhealthy


async def test_an_xid_in_prometheus_starts_a_remediation(client, rem_worker, k8s, prometheus, names):
    sick, app_fault, healthy = names[:3]
    await k8s.seed(fleet(names[:3]))
    await k8s.set_gpu(sick, {"DCGM_FI_DEV_XID_ERRORS": 79}, gpu=3)
    await k8s.set_gpu(app_fault, {"DCGM_FI_DEV_XID_ERRORS": 13}, gpu=0)  # an application's XID: not acted on
    await prometheus.wait_for(f'count(DCGM_FI_DEV_XID_ERRORS{{Hostname=~"{sick}|{app_fault}|{healthy}"}}) == 24 '
                              f'and {FAULTS} == 2', what="the three nodes' GPUs, two with an XID")  # fmt: skip
    # The child waits for an operator at its first step, so the test sees it running and ends it.
    inp = FleetHealthSweepInput(clusters=["lab"], checks={"host_agent": False, "bmc": False}, max_remediations=5,
                                remediation=fast_settings(require_approval_for=["restart-gpu-services"],
                                                          approval_timeout=3600))  # fmt: skip
    wf_id = f"remediation/lab/{sick}"
    asked = len(prometheus.queries())
    try:
        sweep_id = f"sweep-dcgm-{uuid.uuid4().hex[:6]}"
        result = await client.execute_workflow(FleetHealthSweep.run, inp, id=sweep_id,
                                               task_queue=rem_worker.task_queue)  # fmt: skip
        (c,) = result.clusters
        assert (c.nodes, c.healthy, c.not_healthy, c.gpu_faults) == (3, 2, 1, 2)
        assert c.dcgm == f"read from {prometheus.url}"
        (decision,) = c.unhealthy
        assert decision.node == sick and decision.reasons == [f"DCGM: XID 79 on GPU3 ({gpu_uuid(sick, 3)})"]
        assert [(e.node, e.status) for e in result.remediations] == [(sick, "started")]
        assert len(prometheus.queries()) == asked + 1  # one query for the slice, not one a node

        async def waiting():
            status = await client.get_workflow_handle(wf_id).query(NodeRemediation.status)
            return status if status.awaiting_approval else None

        await wait_for(waiting, what="the remediation at its first step")
        desc = await client.get_workflow_handle(wf_id).describe()
        assert "XID 79" in (await desc.static_summary() or "")

        # Remediation's priority, with the cluster's fairness key (workflows/common/priorities.py), on what it scheduled.
        want = (priorities.REMEDIATION_KEY, "remediation/lab")
        sweep = await scheduled(client, sweep_id)
        assert sweep["list_node_names"] == sweep["child FleetHealthSweep"] == sweep["child NodeRemediation"] == want
        (part,) = await children(client, sweep_id, "FleetHealthSweep")
        assert (await scheduled(client, part))["dcgm_faults"] == want
        await record_history(client.get_workflow_handle(part), "fleet_health_sweep_slice_dcgm")  # the patched shape
        remediation = await scheduled(client, wf_id)
        assert remediation["cordon_node"] == remediation["plan_drain"] == want
    finally:
        with contextlib.suppress(Exception):
            await client.get_workflow_handle(wf_id).terminate("test over")
        with contextlib.suppress(Exception):
            await client.get_workflow_handle(budget_workflow_id("lab")).execute_update(
                DisruptionBudget.release, LeaseRelease(node=sick, holder=wf_id, reason="test over")
            )


async def test_without_a_prometheus_url_the_sweep_says_the_signal_is_not_used(client, k8s, names, kubeconfig_path):
    from activities.kube.connector import ClusterConnector
    from activities.node_health import NodeHealthActivities
    from activities.registration import activities_of
    from worker import registry

    await k8s.seed(fleet(names[:2]))
    connector = ClusterConnector([str(kubeconfig_path)])
    registration = registry.Registration(
        workflows=[FleetHealthSweep, NodeRemediation],
        activities=activities_of(NodeHealthActivities(connector), PrometheusActivities()),
        resources=[connector])  # fmt: skip
    async with registry.new_worker(client, registration, f"rem-{uuid.uuid4().hex[:8]}") as worker:
        result = await client.execute_workflow(
            FleetHealthSweep.run, FleetHealthSweepInput(clusters=["lab"], checks={"host_agent": False, "bmc": False},
                                                        dry_run=True),
            id=f"sweep-noprom-{uuid.uuid4().hex[:6]}", task_queue=worker.task_queue)  # fmt: skip
    await registration.close()
    (c,) = result.clusters
    assert c.healthy == 2 and c.dcgm == "not used: the worker has no MILLWRIGHT_PROMETHEUS_URL"
