"""What this worker runs: one list of workflows, one list of activities."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pydantic
from temporalio import activity

from worker.config import WorkerSettings
from worker.passthrough import workflow_free_modules

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
# defines no workflow (models, pure arithmetic, helpers that only call `temporalio.workflow`), found, not listed
# (worker/passthrough.py), and the activities (a workflow only names their models and methods). A module that
# defines a workflow is never passed through, so the sandbox's isolation and checks apply to it:
# tests/test_sandbox.py keeps the two apart and measures what a new run costs.
# "opentelemetry": the tracing interceptor's spans, when tracing is on (worker/tracing.py).
SANDBOX_PASSTHROUGH = ("activities", "opentelemetry", *workflow_free_modules())


def workflow_runner() -> Any:
    """The sandbox every Millwright worker and replayer runs workflows in."""
    from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

    class Sandbox(SandboxedWorkflowRunner):
        def prepare_workflow(self, defn: Any) -> None:
            """The check a Worker or Replayer makes of each workflow it is given (an instance made in the sandbox),
            once per class and process: with these restrictions it answers the same each time, and a process that
            makes many (the tests: a worker per test, a replayer per history) paid half a second a worker for it."""
            if defn.cls not in _PREPARED:
                super().prepare_workflow(defn)
                _PREPARED.add(defn.cls)

    return Sandbox(restrictions=SandboxRestrictions.default.with_passthrough_modules(*SANDBOX_PASSTHROUGH))


_PREPARED: set[type] = set()  # the workflow classes the sandbox above has taken in


def new_worker(client: Any, registration: Registration, task_queue: str, *, version: Any = None,
               **options: Any) -> Any:  # fmt: skip
    """A Worker as Millwright runs one: these workflows and activities, input that does not fit a workflow's
    model failing the run, and a workflow task failed for nondeterminism logged at ERROR with the workflow ID
    (worker/nondeterminism.py), as is a patch decided where a local activity's result came in
    (worker/patch_placement.py). With `version` (a WorkerDeploymentVersion) it polls as that version of its
    Worker Deployment, else unversioned (worker/versioning.py). `options` are further `Worker` arguments."""
    from temporalio.worker import Worker

    from worker.nondeterminism import nondeterminism_logged
    from worker.patch_placement import patch_placement_checked
    from worker.versioning import deployment_config, unversioned

    runner = patch_placement_checked(nondeterminism_logged(workflow_runner()))
    if version is not None:
        options["deployment_config"] = deployment_config(version)
    else:
        runner = unversioned(runner)
    return Worker(
        client,
        task_queue=task_queue,
        workflows=registration.workflows,
        activities=registration.activities,
        workflow_failure_exception_types=WORKFLOW_FAILURE_EXCEPTION_TYPES,
        workflow_runner=runner,
        **{**registration.worker_options, **options},
    )


def integrations_of(settings: WorkerSettings) -> list[Any]:
    """The systems this worker reaches (activities/integrations.py): a site's worker its site's alone; with a site
    map, the central worker every other (worker/site_routing.py sends the sites' calls to them); else all."""
    from activities.integrations import INTEGRATIONS

    if settings.site:
        return [integration for integration in INTEGRATIONS if integration.in_site]
    if settings.site_map:
        return [integration for integration in INTEGRATIONS if not integration.in_site]
    return list(INTEGRATIONS)


def build(settings: WorkerSettings) -> Registration:
    from temporalio.worker import PollerBehaviorAutoscaling

    from activities.registration import activities_of
    from activities.sites import site_task_queue
    from worker.site_routing import SiteRouting, site_call_misrouted
    from worker.tracing import Tracing
    from workflows.catalog import WORKFLOWS

    sites = settings.sites()  # first, with tracing: a setting that cannot work stops the start before any client opens
    tracing = Tracing(settings)
    parts = [integration.build(settings) for integration in integrations_of(settings)]
    # Every method marked @activity.defn of each integration's objects (activities/registration.py).
    activities = activities_of(*(obj for part in parts for obj in part.activities))
    interceptors = list(tracing.interceptors)
    if sites is not None:
        names = {activity._Definition.must_from_callable(method).name or "" for method in activities}
        interceptors.append(SiteRouting(sites, names, timedelta(seconds=settings.site_pickup_seconds)))
        activities.append(site_call_misrouted)
    return Registration(
        workflows=[] if settings.site else list(WORKFLOWS),
        activities=activities,
        resources=[*(resource for part in parts for resource in part.resources), tracing],
        task_queue=site_task_queue(settings.site) if settings.site else None,
        worker_options={
            # Pollers that scale with the backlog: a rollout batch schedules one activity per node at once (250
            # at 10,000 nodes), and the SDK's five fixed pollers took 3 s to pick them all up (bench/rollout.py's
            # timeline, "cordons' spread"); the server's poller limit per namespace is far above the 100 it may reach.
            "activity_task_poller_behavior": PollerBehaviorAutoscaling(),
            **({"interceptors": interceptors} if interceptors else {}),
        },
    )


def build_host_agent(host_name: str, probe: Any = None, settings: WorkerSettings | None = None) -> Registration:
    """The host agent (`python -m worker --host-agent`): only the host activities, on the host's own queue.

    `probe` defaults to NVML on this machine; without NVML the agent still starts and its activities say so."""
    import shlex

    from activities.gpu.activities import HostAgentActivities
    from activities.gpu.models import host_task_queue
    from activities.gpu.nvml import NvmlProbe
    from activities.registration import activity_methods

    if probe is None:
        command = settings.gpu_stress_command if settings else None
        probe = NvmlProbe(stress_command=shlex.split(command) if command else None)
    agent = HostAgentActivities(probe, host_name)
    # One poller: a host runs a handful of activities at a time, and thousands of agents with the SDK's default
    # of five pollers each would exhaust a namespace's poller limit (1,200 on a default self-hosted server).
    return Registration(
        workflows=[],
        activities=activity_methods(agent),
        resources=[agent],
        task_queue=host_task_queue(host_name),
        worker_options={"max_concurrent_activity_task_polls": 1},
    )
