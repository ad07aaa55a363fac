"""A patch decided for the first time right after a local activity returned, logged where operators look.

Since SDK 1.32 a local activity can wake its workflow while the workflow task stays open. A query that reaches
the run while one runs can make the worker complete the task with the activity's marker and hand the activity's
result to the workflow only in the next task. A replay hands that result back within the earlier task, before
the SDK has been told of the later task's patch markers: a `workflow.patched()` first decided there answers
False, and the replay fails for nondeterminism ("Non-deprecated patch marker encountered for change ..., but
there is no corresponding change command!"). From its next replay on (a worker restart, a cache eviction, a
query to a run no longer cached) the run is stuck. tests/worker/test_patch_placement.py reproduces it.

So a workflow decides its patches before it runs a local activity, never in the activation that resolves one
(workflows/common/patches.py). Every worker checks it on each instance: a live activation that resolves a
local activity and whose completion records a patch marker is logged at ERROR with the workflow type, ID and
patch, and the tests fail on that log (tests/conftest.py). A deprecated patch is not checked: a replay does
without its marker.
"""

from __future__ import annotations

import logging

from temporalio.bridge.proto.workflow_activation import WorkflowActivation
from temporalio.bridge.proto.workflow_completion import WorkflowActivationCompletion
from temporalio.worker import WorkflowRunner

from worker.runners import Delegating, Wrapping

log = logging.getLogger("millwright.worker.patch_placement")


def patch_placement_checked(runner: WorkflowRunner) -> WorkflowRunner:
    """`runner`, its instances logging a patch first decided where a local activity's result came in."""
    return Wrapping(runner, _Checked)


class _Checked(Delegating):
    def activate(self, act: WorkflowActivation) -> WorkflowActivationCompletion:
        completion = self._instance.activate(act)
        if act.is_replaying or not completion.HasField("successful"):
            return completion
        if not any(job.HasField("resolve_activity") and job.resolve_activity.is_local for job in act.jobs):
            return completion
        for command in completion.successful.commands:
            if command.HasField("set_patch_marker") and not command.set_patch_marker.deprecated:
                info = self._instance.get_info()
                log.error(
                    "patch %s decided first right after a local activity returned: %s workflow ID %s run ID %s "
                    "may not replay (worker/patch_placement.py)",
                    command.set_patch_marker.patch_id, info.workflow_type, info.workflow_id, act.run_id,
                    extra={"patch_id": command.set_patch_marker.patch_id, "workflow_type": info.workflow_type,
                           "workflow_id": info.workflow_id, "run_id": act.run_id},
                )  # fmt: skip
        return completion
