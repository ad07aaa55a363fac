"""NodeMaintenance's validation gate against the lab: the uncordon waits for the node's validation."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from activities.kube.node_marks import VALIDATED, VALIDATION_ANNOTATION
from tests.kube_helpers import read_node
from tests.workflows.maintenance.test_node_maintenance import maintenance, record_history, start
from tests.workflows.validation.test_rollout_validation import assert_cordoned_for_validation, lab
from workflows.maintenance.node_maintenance import NodeMaintenance


async def test_a_node_failing_validation_stays_cordoned_after_its_maintenance(
    client, kube_worker, k8s, core, bmc_admin, lab_hosts, burnin_bmcs
):
    node = burnin_bmcs.names[0]
    await lab(k8s, bmc_admin, lab_hosts, [node], faults={node: {"pcie_width": {"gpu": 3, "width": 8}}})
    inp = maintenance(node, uncordon_after=True, validation={"min_pcie_width": 16})
    handle = await start(client, kube_worker, inp)
    result = await handle.result()

    assert result.outcome == "validation-failed" and not result.uncordoned
    assert result.validation is not None and "x8" in result.validation.reason
    progress = await handle.query(NodeMaintenance.progress)
    assert progress.phase == "validation-failed" and progress.finished and "x8" in progress.details
    await assert_cordoned_for_validation(core, node, "x8")
    await record_history(handle, "node_maintenance_validation_failed")


async def test_a_node_passing_validation_is_uncordoned_after_its_maintenance(
    client, kube_worker, k8s, core, bmc_admin, lab_hosts, burnin_bmcs
):
    node = burnin_bmcs.names[0]
    await lab(k8s, bmc_admin, lab_hosts, [node])
    handle = await start(client, kube_worker, maintenance(node, uncordon_after=True, validation={"expected_gpus": 8}))
    result = await handle.result()

    assert result.outcome == "completed" and result.uncordoned and result.validation.passed
    found = await read_node(core, node)
    assert not found.spec.unschedulable and VALIDATION_ANNOTATION not in (found.metadata.annotations or {})
    assert next(c for c in found.status.conditions if c.type == VALIDATED).status == "True"


def test_validation_without_the_uncordon_is_refused_at_the_edge():
    with pytest.raises(ValidationError, match="validation: it gates the uncordon"):
        maintenance("node-01", validation={"expected_gpus": 8})
    maintenance("node-01", validation={"enabled": False})  # switched off: nothing to gate
