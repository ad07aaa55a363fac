"""A whole NVLink domain (an NVL72 rack), for the operator, as functions: what its nodes show and which run holds it
(``rack_why``), what a RackRemediation would do (``rack_plan``) and its start (``rack_remediate``), where the rack's
run stands (``rack_status``); starter/controls.py ``rack_decide`` approves or rejects its power cycle.

A domain is named by its rack or its NVLink ClusterUUID; its run (workflows/remediation/rack_remediation.py) by the
rack the nodes' labels say (``rack_workflow_id``), so both names find the same run. The cluster is read as `node
why` reads it (starter/questions.py ``core_api``), through the worker's own read of a domain (activities/kube/racks.py
``read_rack``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import pydantic
from pydantic import BaseModel, Field
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError

from activities.kube.connector import ClusterConnector
from activities.kube.racks import RackActivities, RackRead, RackView
from activities.kube.topology import Gang, TopologyLabels
from activities.node_health import node_health
from starter.client import DEFAULT_TASK_QUEUE, InputError, Started, format_validation_error, start
from starter.controls import ControlError, Refused, RunNotFound, described
from starter.questions import Operation, RunStatus, core_api, gangs_on, quoted, run_status
from workflows.common import search_attributes as sa
from workflows.remediation.policy import HealthChecks, node_problems, remediation_workflow_id
from workflows.remediation.rack_models import (
    DEFAULT_ESCALATION_SHARE,
    RackRemediationInput,
    RackRemediationResult,
    RackRemediationStatus,
    rack_workflow_id,
)

WORKFLOW = "RackRemediation"
COMMAND_FIELDS = ("cluster", "domain", "reason", "requested_by")  # the command's own: never from its settings


@contextlib.asynccontextmanager
async def open_cluster(cluster: str, kubeconfig: str | None = None) -> AsyncIterator[tuple[Any, ClusterConnector]]:
    """(CoreV1Api, its connector) on ``cluster``, closed after: starter/questions.py ``core_api``."""
    core, connector = await core_api(cluster, kubeconfig)
    try:
        yield core, connector
    finally:
        await connector.close()


async def read_domain(connector: ClusterConnector, cluster: str, domain: str,
                      topology: TopologyLabels | None = None) -> RackView:  # fmt: skip
    """Every node of the rack or NVLink domain ``domain``, as RackRemediation reads it."""
    try:
        read = RackRead(cluster=cluster, domain=domain, topology=topology or TopologyLabels())
        return await RackActivities(connector).read_rack(read)
    except ApplicationError as e:
        if e.type == "RackNotFound":
            raise ControlError(e.message) from None
        raise


async def rack_run_id(client: Client, cluster: str, domain: str, kubeconfig: str | None = None,
                      topology: TopologyLabels | None = None) -> str:  # fmt: skip
    """The domain's run: ``rack-remediation/<cluster>/<domain>`` when a run has that ID (``domain`` is its rack),
    else the rack the cluster's nodes say (``domain`` is a ClusterUUID): only then is the cluster read."""
    named = rack_workflow_id(cluster, domain)
    with contextlib.suppress(RunNotFound):
        await described(client, named)
        return named
    async with open_cluster(cluster, kubeconfig) as (_, connector):
        view = await read_domain(connector, cluster, domain, topology)
    return rack_workflow_id(cluster, view.rack)


# ---------------------------------------------------------------- why


class RackNode(BaseModel):
    node: str
    tray: int | None = Field(None, description="Its tray's index in the rack, where the rack's run read it.")
    ready: bool
    unschedulable: bool
    cordoned_by: str | None = Field(None, description="The Millwright run that placed its cordon.")
    cordon_reason: str | None = None
    foreign_cordon: bool = Field(False, description="Cordoned, but not by Millwright.")
    quarantined: str | None = None
    clique: str | None = Field(None, description="Its clique label; None: gone (or never there).")
    problems: list[str] = Field(default_factory=list, description="What the remediation policy counts unhealthy.")
    notes: list[str] = Field(default_factory=list, description="What the policy leaves alone for now.")
    remediation: str | None = Field(None, description="Its running NodeRemediation.")


class RackWhy(BaseModel):
    cluster: str
    asked: str = Field(description="The domain as the operator named it.")
    rack: str = Field(description="The rack its run is named by.")
    domain: str = Field(description="The NVLink ClusterUUID its nodes show; empty when none shows one.")
    workflow_id: str
    nodes: list[RackNode] = Field(description="Tray order when the rack's run read it, else name order.")
    gangs: list[Gang] = Field(default_factory=list, description="The gangs with GPU pods on its nodes.")
    unhealthy: int
    clique_gone: int
    escalation_share: float
    verdict: str
    rack_run: RunStatus | None = Field(None, description="The domain's RackRemediation, running or the last one.")
    rack_state: RackRemediationStatus | None = Field(None, description="A running one's `status` query.")
    node_runs: list[Operation] = Field(default_factory=list, description="The running NodeRemediations of its nodes.")
    problems: list[str] = Field(default_factory=list, description="What could not be read, and why.")


def verdict(unhealthy: int, total: int, clique_gone: int, share: float = DEFAULT_ESCALATION_SHARE) -> str:
    over = total > 0 and unhealthy >= share * total
    line = f"{unhealthy} of {total} nodes unhealthy: {'at or over' if over else 'under'} the escalation share {share:g}"
    return line + (f"; the clique label is gone from {clique_gone} of {total}" if clique_gone else "")


async def _node_runs(client: Client, cluster: str, nodes: list[str]) -> list[Operation]:
    names = ", ".join(quoted(n) for n in nodes)
    query = (f"WorkflowType = 'NodeRemediation' AND ExecutionStatus = 'Running' AND {sa.CLUSTER.name} = "
             f"{quoted(cluster)} AND {sa.NODE.name} IN ({names})")  # fmt: skip
    return [
        Operation(id=e.id, family=e.workflow_type, cluster=cluster, node=e.typed_search_attributes.get(sa.NODE),
                  phase=e.typed_search_attributes.get(sa.PHASE), status="running", started=e.start_time)
        async for e in client.list_workflows(query)
    ]  # fmt: skip


async def _rack_run(client: Client, workflow_id: str) -> tuple[RunStatus | None, RackRemediationStatus | None, str]:
    """The rack's run (running or the last), a running one's `status` answer, and why it could not be read."""
    try:
        run = await run_status(client, workflow_id)
    except RunNotFound:
        return None, None, ""
    if run.status != "running":
        return run, None, ""
    try:
        state = await client.get_workflow_handle(workflow_id).query("status", result_type=RackRemediationStatus)
    except Exception as e:  # no worker polling its queue: the run is shown without its nodes' states
        return run, None, f"the `status` query of {workflow_id}: {e}"
    return run, state, ""


async def rack_why(client: Client, core: Any, connector: ClusterConnector, cluster: str, domain: str, *,
                   topology: TopologyLabels | None = None, checks: HealthChecks | None = None,
                   share: float = DEFAULT_ESCALATION_SHARE) -> RackWhy:  # fmt: skip
    """Every node of the domain (ready, cordon, clique label, problems as ``checks`` judges them), the gangs on it,
    and the runs that hold it; ``share``: the escalation share the verdict measures against."""
    topology, checks = topology or TopologyLabels(), checks or HealthChecks()
    view = await read_domain(connector, cluster, domain, topology)
    wid = rack_workflow_id(cluster, view.rack)
    keys = list(dict.fromkeys([*checks.label_keys(), *topology.keys()]))

    async def health(name: str) -> dict[str, Any]:
        return core.api_client.sanitize_for_serialization(await core.read_node(name))

    read = await asyncio.gather(*(health(n) for n in view.names))
    run, state, unread = await _rack_run(client, wid)
    trays = {n.node: n.tray for n in state.nodes} if state else {}
    node_runs = await _node_runs(client, cluster, view.names)
    held = {r.node: r.id for r in node_runs}
    nodes = []
    for obj in read:
        h = node_health(obj, checks.condition_types(), keys)
        problems, notes = node_problems(h, checks, h.decided_at(datetime.now(UTC)))
        nodes.append(RackNode(
            node=h.name, tray=trays.get(h.name), ready=h.ready, unschedulable=h.unschedulable,
            cordoned_by=h.cordoned_by, cordon_reason=h.cordon_reason,
            foreign_cordon=h.unschedulable and h.cordoned_by is None, quarantined=h.quarantined,
            clique=h.labels.get(topology.clique), problems=problems, notes=notes, remediation=held.get(h.name),
        ))  # fmt: skip
    nodes.sort(key=lambda n: (n.tray is None, n.tray or 0, n.node))
    unhealthy, gone = sum(bool(n.problems) for n in nodes), sum(n.clique is None for n in nodes)
    return RackWhy(
        cluster=cluster, asked=domain, rack=view.rack, domain=view.domain, workflow_id=wid, nodes=nodes,
        gangs=await gangs_on(core, view.names), unhealthy=unhealthy, clique_gone=gone, escalation_share=share,
        verdict=verdict(unhealthy, len(nodes), gone, share), rack_run=run, rack_state=state, node_runs=node_runs,
        problems=[unread] if unread else [],
    )  # fmt: skip


# ---------------------------------------------------------------- remediate


def rack_input(cluster: str, domain: str, *, reason: str, by: str, settings: dict[str, Any] | None = None,
               require_approval: bool = False) -> RackRemediationInput:  # fmt: skip
    """RackRemediation's input: ``settings`` (any of its fields but the command's own) with the command's, checked
    by the model; ``InputError`` names each field it refuses."""
    settings = settings or {}
    own = [f"{k}: given by the command, not in the settings" for k in COMMAND_FIELDS if k in settings]
    if own:
        raise InputError(WORKFLOW, own)
    data = {**settings, "cluster": cluster, "domain": domain, "reason": reason, "requested_by": by}
    if require_approval:
        steps = settings.get("require_approval_for")
        data["require_approval_for"] = [*(steps if isinstance(steps, list) else []), "power-cycle"]
    try:
        return RackRemediationInput.model_validate(data)
    except pydantic.ValidationError as e:
        raise InputError(WORKFLOW, format_validation_error(e, RackRemediationInput)) from None


class RackPlan(BaseModel):
    """What `rack remediate` would start, and what that run would do (nothing is started)."""

    workflow_id: str
    task_queue: str
    input: RackRemediationInput = Field(description="Its input, the domain resolved to its rack.")
    rack: str
    domain: str
    nodes: list[str] = Field(description="The domain's nodes: the power order is their tray order, which the run "
                             "reads from each tray's BMC; name order here.")  # fmt: skip
    lease: str
    cordon: list[str] = Field(description="The nodes it would cordon (it drains them all).")
    not_ours: dict[str, str] = Field(default_factory=dict, description="Nodes someone else cordoned: drained and "
                                     "powered with the rack, never uncordoned by the run.")  # fmt: skip
    power: list[str] = Field(description="The power sequence, step by step.")
    approval: str = ""
    no_bmc: list[str] = Field(default_factory=list, description="Nodes whose tray's BMC the run would not know: "
                              "it would end refused.")  # fmt: skip
    held_by: str | None = Field(None, description="The RackRemediation that runs for the domain already.")
    stand_down: list[str] = Field(default_factory=list, description="The nodes' running NodeRemediations, which "
                                  "the run would tell to stand down.")  # fmt: skip


async def rack_plan(client: Client, connector: ClusterConnector, inp: RackRemediationInput, *,
                    task_queue: str = DEFAULT_TASK_QUEUE) -> RackPlan:  # fmt: skip
    """Resolve ``inp.domain`` to its rack (the run's ID) and say what the run would do; start nothing."""
    view = await read_domain(connector, inp.cluster, inp.domain, inp.topology)
    inp = inp.model_copy(update={"domain": view.rack})
    wid = inp.workflow_id()
    held_by = None
    with contextlib.suppress(RunNotFound):
        _, desc = await described(client, wid)
        held_by = wid if desc.status == WorkflowExecutionStatus.RUNNING else None
    names, ours = view.names, {wid, *(remediation_workflow_id(inp.cluster, n) for n in view.names)}
    not_ours = {m.place.node: m.cordoned_by or "someone else (no Millwright cordon annotation)"
                for m in view.nodes if m.unschedulable and m.cordoned_by not in ours}  # fmt: skip
    switches = len(inp.switch_bmcs)
    power = [f"compute trays off, one at a time: {', '.join(names)}"]
    power += [f"{switches} NVLink switch trays off", f"{switches} NVLink switch trays on"] if switches else []
    power += [f"compute trays on, one at a time: {', '.join(names)}"]
    lease = (f"all {len(names)} nodes at once from the disruption budget of {inp.cluster} (within its NVLink-domain "
             "limit)" if inp.disruption_budget else "none (disruption_budget: false)")  # fmt: skip
    approval = (f"the power cycle waits for `millwright rack approve|reject` (else {inp.default_on_timeout} after "
                f"{inp.approval_timeout})" if "power-cycle" in inp.require_approval_for else "")  # fmt: skip
    return RackPlan(
        workflow_id=wid, task_queue=task_queue, input=inp, rack=view.rack, domain=view.domain, nodes=names,
        lease=lease, cordon=[n for n in names if n not in not_ours], not_ours=not_ours, power=power,
        approval=approval, no_bmc=[] if inp.netbox else [n for n in names if n not in inp.bmcs], held_by=held_by,
        stand_down=[r.id for r in await _node_runs(client, inp.cluster, names)],
    )  # fmt: skip


class AlreadyRunning(ControlError):
    def __init__(self, workflow_id: str, rack: str) -> None:
        self.workflow_id = workflow_id
        super().__init__(f"a RackRemediation already runs for rack {rack}: {workflow_id} (nothing new started)")


async def rack_remediate(client: Client, plan: RackPlan) -> Started:
    """Start the planned run; ``AlreadyRunning`` when one runs for the domain (whoever started it)."""
    started = await start(client, plan.input, task_queue=plan.task_queue)
    if started.already_running:
        raise AlreadyRunning(started.workflow_id, plan.rack)
    return started


# ---------------------------------------------------------------- status


class RackRunStatus(BaseModel):
    id: str
    status: str
    started: datetime | None = None
    closed: datetime | None = None
    state: RackRemediationStatus | None = Field(None, description="A running run's `status` query.")
    result: RackRemediationResult | None = Field(None, description="A completed run's result.")


async def rack_status(client: Client, workflow_id: str) -> RackRunStatus:
    """A RackRemediation's `status` query while it runs, its result once it completed."""
    handle, desc = await described(client, workflow_id)
    if desc.workflow_type != WORKFLOW:
        raise Refused(f"{workflow_id} is a {desc.workflow_type}, not a {WORKFLOW}")
    status = RackRunStatus(id=workflow_id, status=desc.status.name.lower() if desc.status else "unknown",
                           started=desc.start_time, closed=desc.close_time)  # fmt: skip
    try:
        if desc.status == WorkflowExecutionStatus.RUNNING:
            status.state = await handle.query("status", result_type=RackRemediationStatus)
        elif desc.status == WorkflowExecutionStatus.COMPLETED:
            done = client.get_workflow_handle(workflow_id, run_id=desc.run_id, result_type=RackRemediationResult)
            status.result = await done.result()
    except RPCError as e:
        raise ControlError(f"{workflow_id}: {e.message}") from None
    return status
