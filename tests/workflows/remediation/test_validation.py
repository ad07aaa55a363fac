"""NodeRemediation's validation gate: a step whose own success check passes has fixed the node only once the node
passes its validation too; the ladder goes on until one does (or quarantine)."""

from __future__ import annotations

import pytest

from activities.kube.node_marks import VALIDATED, VALIDATION_ANNOTATION
from tests.kube_helpers import read_node
from tests.workflows.maintenance.test_node_maintenance import record_history
from tests.workflows.remediation.helpers import fast_settings, fleet
from tests.workflows.remediation.test_node_remediation import start
from tests.workflows.rollout.helpers import JOBS_FAST

pytestmark = pytest.mark.timeout(120)


async def test_a_fix_that_fails_validation_is_not_a_fix(client, rem_worker, k8s, core, hosts, names, burnin_bmcs):
    node = names[2]
    await k8s.seed(fleet(names[:4]))
    # The validation Job fails once: after the GPU reset, which clears the pending remap; it passes after the next.
    why = "all_reduce_perf: busbw 40 GB/s"
    await k8s.configure(jobs={**JOBS_FAST, "rules": [{"node": node, "stage": "validate", "outcome": "fail",
                                                      "message": why, "times": 1}]})  # fmt: skip
    await hosts.add(node, {"pending_remaps": [3]})
    validation = {"expected_gpus": 8, "job": {"image": "registry.local/nccl-tests", "version": "2.13.8"}}
    handle = await start(client, rem_worker, burnin_bmcs, node, "GPU check: remap_pending GPU3",
                         **fast_settings(validation=validation))  # fmt: skip
    result = await handle.result()
    await record_history(handle, "node_remediation_validation_not_fixed")

    assert result.outcome == "healthy" and result.fixed_by == "power-cycle", result.steps
    assert [(s.step, s.outcome) for s in result.steps] == [
        ("restart-gpu-services", "not-fixed"),
        ("reset-gpu", "not-fixed"),
        ("power-cycle", "fixed"),
    ]
    assert "validation failed" in result.steps[1].detail and why in result.steps[1].detail
    found = await read_node(core, node)
    assert not found.spec.unschedulable and VALIDATION_ANNOTATION not in (found.metadata.annotations or {})
    assert next(c for c in found.status.conditions if c.type == VALIDATED).status == "True"
