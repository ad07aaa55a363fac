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
    task_queue: str | None = None  # set when the registration decides its queue (the host agent's)
    worker_options: dict[str, Any] = field(default_factory=dict)  # `Worker` arguments this registration needs

    async def close(self) -> None:
        for resource in self.resources:
            await resource.close()


# What the sandbox shares between workflow runs instead of importing it afresh for each new run: every module that
# defines no workflow (models, pure arithmetic, helpers that only call `temporalio.workflow`), with the libraries
# under them; a package's name passes all its modules. A module that defines a workflow is never passed through, so
# the sandbox's isolation and checks apply to it: tests/test_sandbox.py keeps the two apart and measures what a new
# run costs.
SANDBOX_PASSTHROUGH = (
    "activities",  # the activities' models and classes: a workflow only names them
    "workflows.common",  # shared models, call options and helpers of every family: no workflow in it
    "workflows.burnin.node_guard",
    "workflows.budget.book",
    "workflows.budget.breaker",
    "workflows.budget.budget",
    "workflows.budget.control_plane",
    "workflows.budget.leases",
    "workflows.clusters.manifests",
    "workflows.clusters.models",
    "workflows.clusters.owners",
    "workflows.fabric.calls",
    "workflows.fabric.models",
    "workflows.firmware.bundle",
    "workflows.firmware.waves",
    "workflows.maintenance.drain",
    "workflows.remediation.models",
    "workflows.remediation.policy",
    "workflows.remediation.sweep_models",
    "workflows.rollout.batching",
    "workflows.rollout.cluster_reads",
    "workflows.rollout.compartments",  # the fleet engine
    "workflows.rollout.dependency_graph",
    "workflows.rollout.fleet_controls",
    "workflows.rollout.membership",
    "workflows.rollout.models",
    "workflows.rollout.spec",  # the input and its sections
    "workflows.rollout.state",
    "workflows.tenancy.capacity",
    "workflows.tenancy.models",
    "workflows.tenancy.objects",
    "workflows.tenancy.plan",
    "workflows.validation",  # the validation gate and its models: no workflow in it
)


def workflow_runner() -> Any:
    """The sandbox every Millwright worker and replayer runs workflows in."""
    from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

    return SandboxedWorkflowRunner(
        restrictions=SandboxRestrictions.default.with_passthrough_modules(*SANDBOX_PASSTHROUGH)
    )


def new_worker(client: Any, registration: Registration, task_queue: str, **options: Any) -> Any:
    """A Worker as Millwright runs one: these workflows and activities, input that does not fit a workflow's
    model failing the run, and a workflow task failed for nondeterminism logged at ERROR with the workflow ID
    (worker/nondeterminism.py). `options` are further `Worker` arguments."""
    from temporalio.worker import Worker

    from worker.nondeterminism import NondeterminismLogged

    return Worker(
        client,
        task_queue=task_queue,
        workflows=registration.workflows,
        activities=registration.activities,
        workflow_failure_exception_types=WORKFLOW_FAILURE_EXCEPTION_TYPES,
        workflow_runner=NondeterminismLogged(workflow_runner()),
        **{**registration.worker_options, **options},
    )


def build(settings: WorkerSettings) -> Registration:
    from activities.capi.activities import ClusterApiActivities
    from activities.entities import EntityActivities
    from activities.firmware.activities import FirmwareActivities
    from activities.ironic.activities import IronicActivities
    from activities.kube.activities import KubeActivities
    from activities.kube.connector import ClusterConnector
    from activities.netbox.activities import NetBoxActivities
    from activities.node_health import NodeHealthActivities
    from activities.notify import NotifyActivities
    from activities.prometheus import PrometheusActivities
    from activities.redfish import RedfishActivities
    from activities.ufm.activities import UfmActivities
    from activities.usage_report import UsageReportActivities
    from workflows.catalog import WORKFLOWS

    connector = ClusterConnector(settings.kubeconfig_paths())
    # Always registered: without NetBox settings each one fails with a non-retryable NetBoxNotConfigured.
    netbox = NetBoxActivities(settings.netbox_config())
    # A gate's server URL comes with its query; GPU faults come from MILLWRIGHT_PROMETHEUS_URL (none: not used).
    # What a certificate is verified against is the worker's.
    prometheus = PrometheusActivities(
        url=settings.prometheus_url,
        ca_bundle=settings.ca_bundle("prometheus"),
        verify_tls=settings.prometheus_verify_tls,
    )
    ufm = UfmActivities(settings.ufm_config())  # without UFM settings: UfmNotConfigured, non-retryable
    ironic = IronicActivities(settings.ironic_config())  # without Ironic settings: IronicNotConfigured
    bmc_settings: dict[str, Any] = dict(ca_bundle=settings.ca_bundle("bmc"), verify_tls=settings.bmc_verify_tls)
    redfish = RedfishActivities(settings.bmc_credentials_ref(), **bmc_settings)
    firmware = FirmwareActivities(settings.bmc_credentials_ref(), **bmc_settings)
    return Registration(
        workflows=list(WORKFLOWS),
        activities=list(KubeActivities(connector).activities())
        + netbox.activities()
        + prometheus.activities()
        + ufm.activities()
        + ClusterApiActivities(connector, settings.reserved_groups).activities()
        + redfish.activities()
        + firmware.activities()
        + ironic.activities()
        + NodeHealthActivities(connector).activities()
        + NotifyActivities().activities()
        + EntityActivities().activities()
        + UsageReportActivities(settings.usage_sink_dir).activities(),
        resources=[connector, netbox, prometheus, ufm, redfish, firmware, ironic],
    )


def build_host_agent(host_name: str, probe: Any = None, settings: WorkerSettings | None = None) -> Registration:
    """The host agent (`python -m worker --host-agent`): only the host activities, on the host's own queue.

    `probe` defaults to NVML on this machine; without NVML the agent still starts and its activities say so."""
    import shlex

    from activities.gpu.activities import HostAgentActivities
    from activities.gpu.models import host_task_queue
    from activities.gpu.nvml import NvmlProbe

    if probe is None:
        command = settings.gpu_stress_command if settings else None
        probe = NvmlProbe(stress_command=shlex.split(command) if command else None)
    agent = HostAgentActivities(probe, host_name)
    # One poller: a host runs a handful of activities at a time, and thousands of agents with the SDK's default
    # of five pollers each would exhaust a namespace's poller limit (1,200 on a default self-hosted server).
    return Registration(
        workflows=[],
        activities=agent.activities(),
        resources=[agent],
        task_queue=host_task_queue(host_name),
        worker_options={"max_concurrent_activity_task_polls": 1},
    )
