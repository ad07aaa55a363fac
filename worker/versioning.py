"""Worker Versioning for a Millwright worker (docs/production.md, "Upgrades").

A versioned worker polls as one version of its Worker Deployment; a workflow that declares no behavior is pinned,
so a bounded run finishes on the build that started it; the entities declare AUTO_UPGRADE (workflows/catalog.py
ENTITIES). An unversioned worker (the lab, the tests, MILLWRIGHT_BUILD_ID unset) sends no behavior: the server
refuses a workflow task completion that carries one from a worker without deployment options ("versioning
behavior cannot be specified without deployment options being set with versioned mode"), so the entities could
not run there.
"""

from __future__ import annotations

from temporalio.bridge.proto.workflow_activation import WorkflowActivation
from temporalio.bridge.proto.workflow_completion import WorkflowActivationCompletion
from temporalio.common import VersioningBehavior, WorkerDeploymentVersion
from temporalio.worker import WorkerDeploymentConfig, WorkflowRunner

from worker.runners import Delegating, Wrapping


def deployment_config(version: WorkerDeploymentVersion) -> WorkerDeploymentConfig:
    return WorkerDeploymentConfig(
        version=version, use_worker_versioning=True, default_versioning_behavior=VersioningBehavior.PINNED
    )


def unversioned(runner: WorkflowRunner) -> WorkflowRunner:
    """`runner`, its instances' completions carrying no versioning behavior."""
    return Wrapping(runner, _Unversioned)


class _Unversioned(Delegating):
    def activate(self, act: WorkflowActivation) -> WorkflowActivationCompletion:
        completion = self._instance.activate(act)
        if completion.HasField("successful"):
            completion.successful.ClearField("versioning_behavior")
        return completion
