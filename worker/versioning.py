"""Worker Versioning for a Millwright worker (docs/production.md, "Upgrades").

A versioned worker polls as one version of its Worker Deployment; a workflow that declares no behavior is pinned,
so a bounded run finishes on the build that started it; the entities declare AUTO_UPGRADE (workflows/catalog.py
ENTITIES). An unversioned worker (the lab, the tests, MILLWRIGHT_BUILD_ID unset) sends no behavior: the server
refuses a workflow task completion that carries one from a worker without deployment options ("versioning
behavior cannot be specified without deployment options being set with versioned mode"), so the entities could
not run there.
"""

from __future__ import annotations

from typing import Any

from temporalio.bridge.proto.workflow_activation import WorkflowActivation
from temporalio.bridge.proto.workflow_completion import WorkflowActivationCompletion
from temporalio.common import VersioningBehavior, WorkerDeploymentVersion
from temporalio.worker import WorkerDeploymentConfig, WorkflowInstance, WorkflowInstanceDetails, WorkflowRunner
from temporalio.workflow import Info, _Definition


def deployment_config(version: WorkerDeploymentVersion) -> WorkerDeploymentConfig:
    return WorkerDeploymentConfig(
        version=version, use_worker_versioning=True, default_versioning_behavior=VersioningBehavior.PINNED
    )


class Unversioned(WorkflowRunner):
    """`runner`, its instances' completions carrying no versioning behavior."""

    def __init__(self, runner: WorkflowRunner) -> None:
        self._runner = runner

    def prepare_workflow(self, defn: _Definition) -> None:
        self._runner.prepare_workflow(defn)

    def create_instance(self, det: WorkflowInstanceDetails) -> WorkflowInstance:
        return _Unversioned(self._runner.create_instance(det))

    def set_worker_level_failure_exception_types(self, types: Any) -> None:
        self._runner.set_worker_level_failure_exception_types(types)


class _Unversioned(WorkflowInstance):
    def __init__(self, instance: WorkflowInstance) -> None:
        self._instance = instance

    def activate(self, act: WorkflowActivation) -> WorkflowActivationCompletion:
        completion = self._instance.activate(act)
        if completion.HasField("successful"):
            completion.successful.ClearField("versioning_behavior")
        return completion

    def get_serialization_context(self, command_info: Any) -> Any:
        return self._instance.get_serialization_context(command_info)

    def get_external_store_context(self, command_info: Any) -> Any:
        return self._instance.get_external_store_context(command_info)

    def get_info(self) -> Info:
        return self._instance.get_info()

    def get_thread_id(self) -> int | None:
        return self._instance.get_thread_id()
