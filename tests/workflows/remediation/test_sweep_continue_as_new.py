"""FleetHealthSweep in slices, on a dev server that suggests continue-as-new after 20 events: the sweep continues
as new mid-fleet while its slices keep probing, and no node is lost, swept twice, or remediated twice."""

from __future__ import annotations

import contextlib
import uuid

import pytest

from tests.carried_helpers import carried_waits, runs_of
from tests.conftest import SUGGEST_CONTINUE_AS_NEW_AFTER
from tests.workers import settings_worker
from tests.workflows.maintenance.test_node_maintenance import record_history
from tests.workflows.remediation.helpers import fast_settings, fleet
from workflows.remediation.health_sweep import FleetHealthSweep
from workflows.remediation.node_remediation import NodeRemediation
from workflows.remediation.sweep_models import FleetHealthSweepInput

pytestmark = pytest.mark.timeout(240)

SICK = [{"type": "KernelDeadlock", "status": "True", "reason": "DockerHung"}]
GPU_DOWN = [{"type": "GpuHealthy", "status": "False", "reason": "XidErrors"}]


async def test_sweep_continues_as_new_mid_fleet_and_loses_no_node(small_history_env, kubeconfig_path, k8s):
    client = small_history_env.client
    names = [f"sw-{i:02d}" for i in range(21)]
    sick, gpu_down, not_ready, theirs = names[1:6], names[8:10], [names[13]], names[17]
    await k8s.seed(fleet(names, conditions={**{n: SICK for n in sick}, **{n: GPU_DOWN for n in gpu_down},
                                            theirs: SICK}, not_ready=not_ready,
                         cordoned={theirs: "rollout/lab/r-9"}))  # fmt: skip
    remediate = sorted(sick + gpu_down + not_ready)
    # No host agents: every GPU check waits agent_timeout and is unknown, so slices take a while to probe.
    inp = FleetHealthSweepInput(
        clusters=["lab"], agent_timeout=1, concurrency=4, slice_size=3, slices_at_once=2, max_remediations=2,
        remediation=fast_settings(require_approval_for=["restart-gpu-services", "reset-gpu", "power-cycle"],
                                  approval_timeout=3600, disruption_budget=False))  # fmt: skip
    sweep_id = f"{inp.workflow_id()}/can-{uuid.uuid4().hex[:6]}"
    async with settings_worker(client, kubeconfig_path, "sweep-can") as queue:
        try:
            result = await client.execute_workflow(FleetHealthSweep.run, inp, id=sweep_id, task_queue=queue)
            running = [await client.get_workflow_handle(r.workflow_id).query(NodeRemediation.status)
                       for r in result.started()]  # fmt: skip
        finally:
            for node in remediate:
                with contextlib.suppress(Exception):  # not started
                    await client.get_workflow_handle(f"remediation/lab/{node}").terminate("test over")

    # Every node swept once, by one of 7 slices, and every unhealthy node found once.
    (c,) = result.clusters
    assert (c.nodes, c.slices, c.healthy + c.not_healthy, c.vanished, c.error) == (21, 7, 21, 0, None)
    found = [d.node for d in c.unhealthy]
    assert sorted(found) == sorted([*remediate, theirs]) and c.not_healthy == len(found)
    assert next(d for d in c.unhealthy if d.node == theirs).note == "cordoned by rollout/lab/r-9; left to them"
    assert c.agents_unavailable == 20  # the cordoned node is not probed
    # Each node to remediate considered once across the runs: two started (max_remediations is per sweep).
    assert sorted(e.node for e in result.remediations) == remediate
    assert result.remediation_counts == {"started": 2, "deferred": len(remediate) - 2}
    assert all(s.phase in ("starting", "cordoning", "draining", "diagnosing", "awaiting-approval") for s in running)

    # The sweep continued as new mid-fleet, and a later run waited for slices an earlier run had started: the
    # slices kept probing across the boundary. Each slice ran once.
    runs = await runs_of(client, sweep_id)
    assert len(runs) > 2 and max(r.history_length for r in runs) < 5 * SUGGEST_CONTINUE_AS_NEW_AFTER
    assert len(await carried_waits(client, sweep_id)) >= 2
    slices = [e async for e in client.list_workflows(f"WorkflowId STARTS_WITH '{sweep_id}/slice-'")]
    assert len(slices) == len({s.id for s in slices}) == 7
    # A run that waits for carried slices and starts remediations; one slice.
    await record_history(client.get_workflow_handle(sweep_id, run_id=runs[1].run_id), "fleet_health_sweep_carried")
    await record_history(client.get_workflow_handle(min(s.id for s in slices)), "fleet_health_sweep_slice")
