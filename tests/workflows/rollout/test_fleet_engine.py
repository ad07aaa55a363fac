"""The rollout's engine runs another fleet workflow's per-node child (tests/workflows/rollout/fleet_probe.py): the policy's
batches, the child's input per node, its result read as the fleet says, an erroring node retried once, and the
operator's controls, with nothing of packages."""

from __future__ import annotations

import uuid

from tests.kube_helpers import wait_for
from tests.workflows.rollout.fleet_probe import ProbeFleet, ProbeFleetInput, ProbeNode
from tests.workflows.rollout.helpers import rollout_fleet
from worker import registry
from worker.config import WorkerSettings
from workflows.rollout.models import ApproveRequest, RolloutStatus


async def test_another_fleet_workflow_runs_its_own_child_per_node_in_the_policy_batches(client, k8s, kubeconfig_path):
    await k8s.seed(rollout_fleet({"p": 5}))
    built = registry.build(WorkerSettings(kubeconfig=str(kubeconfig_path), metrics_port=0))
    registration = registry.Registration(workflows=[*built.workflows, ProbeFleet, ProbeNode],
                                         activities=built.activities)  # fmt: skip
    spec = ProbeFleetInput.model_validate({
        "cluster": "lab",
        "name": "probe",
        "node_selectors": {"matchLabels": {"pool": "p"}},
        "deployment_policy": {"default": {"budget": {"count": 2}, "strategy": {"fixed": {"initialBatch": 2}}}},
        "approval": "compartment",
        "setting": "mig-1g",
        "refuse": ["p-03"],
    })  # fmt: skip
    try:
        async with registry.new_worker(client, registration, f"test-{uuid.uuid4().hex[:8]}") as worker:
            handle = await client.start_workflow(
                ProbeFleet.run, spec, id=f"probe/lab/{uuid.uuid4().hex[:6]}", task_queue=worker.task_queue
            )

            async def waiting() -> RolloutStatus | None:
                status = await handle.query(ProbeFleet.status)
                view = status.compartments.get("__default__")
                return status if view and view.phase == "waiting-for-approval" else None

            # The operator's controls come with FleetControls: nothing runs before the compartment is approved.
            assert (await wait_for(waiting, what="the approval gate")).counts == {"waiting": 5}
            await handle.execute_update(ProbeFleet.approve_batch, ApproveRequest(approver="ops"))
            problems = await handle.result()
            status: RolloutStatus = await handle.query(ProbeFleet.status)
            first = await client.get_workflow_handle(f"{handle.id}/p-01", result_type=dict).result()
    finally:
        await built.close()

    # p-03 refused, twice (the policy retries an erroring node once); the others complete, two at a time.
    assert problems == {"p-03": "p-03 refused mig-1g"}
    assert status.phase == "completed" and status.counts == {"complete": 4, "erroring": 1}
    assert [b.order for b in status.recent_batches] == [["p-01", "p-02"], ["p-03", "p-04"], ["p-05", "p-03"]]
    assert status.problems["p-03"].retries == 1 and status.problems["p-03"].stages[0].message == "p-03 refused mig-1g"
    assert first == {"done": True, "note": "mig-1g on p-01 as #0"}
