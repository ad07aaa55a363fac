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
from typing import Any

from temporalio.bridge.proto.workflow_activation import RemoveFromCache, WorkflowActivation
from temporalio.bridge.proto.workflow_completion import WorkflowActivationCompletion
from temporalio.worker import WorkflowInstance, WorkflowInstanceDetails, WorkflowRunner
from temporalio.workflow import Info, _Definition

log = logging.getLogger("millwright.worker.nondeterminism")

NONDETERMINISM = RemoveFromCache.EvictionReason.NONDETERMINISM


class NondeterminismLogged(WorkflowRunner):
    """`runner`, its instances logging an eviction for nondeterminism at ERROR."""

    def __init__(self, runner: WorkflowRunner) -> None:
        self._runner = runner

    def prepare_workflow(self, defn: _Definition) -> None:
        self._runner.prepare_workflow(defn)

    def create_instance(self, det: WorkflowInstanceDetails) -> WorkflowInstance:
        return _Logged(self._runner.create_instance(det))

    def set_worker_level_failure_exception_types(self, types: Any) -> None:
        self._runner.set_worker_level_failure_exception_types(types)


class _Logged(WorkflowInstance):
    def __init__(self, instance: WorkflowInstance) -> None:
        self._instance = instance

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

    def get_serialization_context(self, command_info: Any) -> Any:
        return self._instance.get_serialization_context(command_info)

    def get_external_store_context(self, command_info: Any) -> Any:
        return self._instance.get_external_store_context(command_info)

    def get_info(self) -> Info:
        return self._instance.get_info()

    def get_thread_id(self) -> int | None:
        return self._instance.get_thread_id()
