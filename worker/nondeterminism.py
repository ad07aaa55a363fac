"""A workflow task failed for nondeterminism, logged where operators look.

The SDK's core detects it (history and code disagree, e.g. "No command scheduled for event ... TimerStarted"),
fails the workflow task and evicts the run with reason NONDETERMINISM; it logs that at WARN once, without the
workflow ID, and the task then fails on every attempt: the run is stuck until its code or its history is fixed
(docs/production.md, "A workflow task fails for nondeterminism"). The eviction reaches the workflow instance, so
the runner every worker uses wraps each instance and logs the eviction at ERROR with the workflow's type, ID and
run ID. The count per workflow type is the SDK's own counter:
``temporal_workflow_task_execution_failed{failure_reason="NonDeterminismError", workflow_type=...}``.
"""

from __future__ import annotations

import logging

from temporalio.bridge.proto.workflow_activation import RemoveFromCache, WorkflowActivation
from temporalio.bridge.proto.workflow_completion import WorkflowActivationCompletion
from temporalio.worker import WorkflowRunner

from worker.runners import Delegating, Wrapping

log = logging.getLogger("millwright.worker.nondeterminism")

NONDETERMINISM = RemoveFromCache.EvictionReason.NONDETERMINISM


def nondeterminism_logged(runner: WorkflowRunner) -> WorkflowRunner:
    """`runner`, its instances logging an eviction for nondeterminism at ERROR."""
    return Wrapping(runner, _Logged)


class _Logged(Delegating):
    def activate(self, act: WorkflowActivation) -> WorkflowActivationCompletion:
        for job in act.jobs:
            if job.HasField("remove_from_cache") and job.remove_from_cache.reason == NONDETERMINISM:
                info = self._instance.get_info()
                log.error(
                    "workflow task failed for nondeterminism: %s workflow ID %s run ID %s: %s",
                    info.workflow_type, info.workflow_id, act.run_id, job.remove_from_cache.message,
                    extra={"workflow_type": info.workflow_type, "workflow_id": info.workflow_id,
                           "run_id": act.run_id},
                )  # fmt: skip
        return self._instance.activate(act)
