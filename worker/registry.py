"""What this worker runs: one list of workflows, one list of activities."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pydantic

from worker.config import WorkerSettings

# A workflow started with input that does not fit its model (e.g. JSON typed into the
# UI) fails at once with pydantic's message naming the field, instead of retrying its
# first workflow task forever.
WORKFLOW_FAILURE_EXCEPTION_TYPES: list[type[BaseException]] = [pydantic.ValidationError]


@dataclass
class Registration:
    workflows: list[type]
    activities: list[Callable[..., Any]]
    resources: list[Any] = field(default_factory=list)  # objects with ``async close()``

    async def close(self) -> None:
        for resource in self.resources:
            await resource.close()


def new_worker(client: Any, registration: Registration, task_queue: str, **options: Any) -> Any:
    """A Worker as Millwright runs one: these workflows and activities, and input that does not
    fit a workflow's model failing the run. `options` are further `Worker` arguments."""
    from temporalio.worker import Worker

    return Worker(
        client,
        task_queue=task_queue,
        workflows=registration.workflows,
        activities=registration.activities,
        workflow_failure_exception_types=WORKFLOW_FAILURE_EXCEPTION_TYPES,
        **options,
    )


def build(settings: WorkerSettings) -> Registration:
    from activities.capi import ClusterApiActivities
    from activities.kube import ClusterConnector, KubeActivities
    from activities.netbox import NetBoxActivities
    from activities.prometheus import PrometheusActivities
    from activities.ufm import UfmActivities
    from workflows import WORKFLOWS

    connector = ClusterConnector(settings.kubeconfig_paths())
    # Always registered: without NetBox settings each one fails with a non-retryable NetBoxNotConfigured.
    netbox = NetBoxActivities(settings.netbox_config())
    prometheus = PrometheusActivities()  # the server URL comes with each query
    ufm = UfmActivities(settings.ufm_config())  # without UFM settings: UfmNotConfigured, non-retryable
    return Registration(
        workflows=list(WORKFLOWS),
        activities=list(KubeActivities(connector).activities()) + netbox.activities() + prometheus.activities()
        + ufm.activities() + ClusterApiActivities(connector).activities(),
        resources=[connector, netbox, prometheus, ufm],
    )
