"""Workflow runners that wrap each instance another runner creates (worker/nondeterminism.py, worker/versioning.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from temporalio.bridge.proto.workflow_activation import WorkflowActivation
from temporalio.bridge.proto.workflow_completion import WorkflowActivationCompletion
from temporalio.worker import WorkflowInstance, WorkflowInstanceDetails, WorkflowRunner
from temporalio.workflow import Info, _Definition


class Wrapping(WorkflowRunner):
    """`runner`, each instance it creates wrapped by `wrap`."""

    def __init__(self, runner: WorkflowRunner, wrap: Callable[[WorkflowInstance], WorkflowInstance]) -> None:
        self._runner, self._wrap = runner, wrap

    def prepare_workflow(self, defn: _Definition) -> None:
        self._runner.prepare_workflow(defn)

    def create_instance(self, det: WorkflowInstanceDetails) -> WorkflowInstance:
        return self._wrap(self._runner.create_instance(det))

    def set_worker_level_failure_exception_types(self, types: Any) -> None:
        self._runner.set_worker_level_failure_exception_types(types)


class Delegating(WorkflowInstance):
    """Does what `instance` does; a subclass changes `activate`."""

    def __init__(self, instance: WorkflowInstance) -> None:
        self._instance = instance

    def activate(self, act: WorkflowActivation) -> WorkflowActivationCompletion:
        return self._instance.activate(act)

    def get_serialization_context(self, command_info: Any) -> Any:
        return self._instance.get_serialization_context(command_info)

    def get_external_store_context(self, command_info: Any) -> Any:
        return self._instance.get_external_store_context(command_info)

    def get_info(self) -> Info:
        return self._instance.get_info()

    def get_thread_id(self) -> int | None:
        return self._instance.get_thread_id()
