"""The operator's questions, as functions: what runs (``list_operations``), where one run stands (``run_status``),
everything that holds or touches one node (``node_why``), what its stage Jobs printed (``node_logs``)."""

from __future__ import annotations

import contextlib
from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field
from temporalio.client import Client, WorkflowExecutionStatus

from activities.kube.gang_reads import POD_GROUPS, gangs_of_pods
from activities.kube.models import (
    CORDON_REASON,
    CORDONED_BY,
    JOB_NAMESPACE,
    JOB_NODE_LABEL,
    JOB_PACKAGE_LABEL,
    JOB_ROLLOUT_ANNOTATION,
    JOB_STAGE_LABEL,
    ROLLOUT_ANNOTATION,
    ROLLOUT_STATE_LABEL,
)
from activities.kube.node_marks import EVENT_COMPONENT, EVENT_NAMESPACE
from activities.kube.topology import Gang, NodePlace, TopologyLabels, place_of
from activities.node_health import LAST_REMEDIATION_ANNOTATION, QUARANTINE_ANNOTATION
from activities.sites import SITE_WAIT
from starter.controls import CAMPAIGNS, FLEETS, RunClosed, RunNotFound, breaker_show, budget_show, described
from workflows.budget.breaker import BreakerView
from workflows.budget.leases import Lease
from workflows.campaign.models import CampaignStatus
from workflows.common import search_attributes as sa
from workflows.common.base import Progress
from workflows.remediation.policy import remediation_workflow_id
from workflows.rollout.models import NodeUpdateStatus, RolloutStatus


class Operation(BaseModel):
    id: str
    family: str
    cluster: str | None = None
    node: str | None = None
    phase: str | None = None
    status: str
    started: datetime | None = None
    progress: str = Field("", description="done/total from the run's progress query (running runs).")
    task_queue: str = ""


def quoted(value: str) -> str:
    """A value as a visibility query's string literal."""
    return "'" + value.replace("'", "\\'") + "'"


async def _progress(client: Client, workflow_id: str) -> Progress | None:
    try:
        return await client.get_workflow_handle(workflow_id).query("progress", result_type=Progress)
    except Exception:  # no worker polling, or a run without the query: the line shows no progress
        return None


async def list_operations(
    client: Client, *, cluster: str | None = None, family: str | None = None, phase: str | None = None,
    all: bool = False, limit: int = 200,
) -> list[Operation]:  # fmt: skip
    """Runs from the search attributes, newest first: running ones unless ``all``; ``family`` is a workflow type."""
    terms = [] if all else ["ExecutionStatus = 'Running'"]
    terms += [f"{sa.CLUSTER.name} = {quoted(cluster)}"] if cluster else []
    terms += [f"WorkflowType = {quoted(family)}"] if family else []
    terms += [f"{sa.PHASE.name} = {quoted(phase)}"] if phase else []
    ops = []
    async for e in client.list_workflows(" AND ".join(terms) or None, limit=limit):
        attrs = e.typed_search_attributes
        op = Operation(
            id=e.id, family=e.workflow_type, cluster=attrs.get(sa.CLUSTER), node=attrs.get(sa.NODE),
            phase=attrs.get(sa.PHASE), status=e.status.name.lower() if e.status else "unknown",
            started=e.start_time, task_queue=e.task_queue,
        )  # fmt: skip
        if e.status == WorkflowExecutionStatus.RUNNING:
            p = await _progress(client, e.id)
            op.progress = f"{p.done}/{p.total}" if p and p.total else ""
            op.phase = op.phase or (p.phase if p else None)
        if e.workflow_type in CAMPAIGNS and (campaign := await _campaign(client, e.id)):  # every cluster in one line
            op.progress = " ".join(f"{c}={o.state}" for c, o in campaign.clusters.items())
        ops.append(op)
    return ops


class RunStatus(BaseModel):
    id: str
    run_id: str
    family: str
    status: str
    started: datetime | None = None
    closed: datetime | None = None
    progress: Progress | None = Field(None, description="The run's own progress query; None once closed.")
    rollout: RolloutStatus | None = Field(None, description="A running fleet run's `status` query (a rollout, a GPU "
                                          "partitioning): compartments, batches, problem nodes.")  # fmt: skip
    campaign: CampaignStatus | None = Field(None, description="A campaign's `status` query: every cluster's state.")
    nodes: dict[str, NodeUpdateStatus] = Field(
        default_factory=dict, description="A running rollout's nodes being updated now, as their batches show them "
        "(the `nodes` query): stage, stages running and done, drain, lease.",
    )  # fmt: skip
    site_waits: list[str] = Field(
        default_factory=list, description="Sites that take none of its calls, from its current details and those of "
        "the running runs under it (docs/sites-and-campaigns.md): each line names the run.",
    )  # fmt: skip


async def run_status(client: Client, workflow_id: str) -> RunStatus:
    handle, desc = await described(client, workflow_id)
    running = desc.status == WorkflowExecutionStatus.RUNNING
    status = RunStatus(
        id=workflow_id, run_id=desc.run_id, family=desc.workflow_type,
        status=desc.status.name.lower() if desc.status else "unknown", started=desc.start_time,
        closed=desc.close_time, progress=await _progress(client, workflow_id) if running else None,
    )  # fmt: skip
    if running and desc.workflow_type in FLEETS.values() and status.progress is not None:
        status.rollout = await handle.query("status", result_type=RolloutStatus)
        status.nodes = await _batch_nodes(client, workflow_id)
    if desc.workflow_type in CAMPAIGNS:  # closed too: a worker answers a closed run's query by replaying it
        status.campaign = await _campaign(client, workflow_id)
    if running:
        status.site_waits = await _site_waits(client, workflow_id)
    return status


SHOWN_RUNS = 50  # the running runs under one whose current details `status` reads for site waits


async def _site_waits(client: Client, workflow_id: str) -> list[str]:
    """The site-unreachable lines of the run's current details and of the running runs under it (a campaign's
    clusters, a rollout's batches), where the call that waits was made."""
    under = (f"ExecutionStatus = 'Running' AND (WorkflowId = {quoted(workflow_id)} OR ParentWorkflowId = "
             f"{quoted(workflow_id)} OR RootWorkflowId = {quoted(workflow_id)})")  # fmt: skip
    lines: list[str] = []
    async for run in client.list_workflows(under, limit=SHOWN_RUNS):
        with contextlib.suppress(Exception):  # closed meanwhile, or no worker to answer: nothing to show
            details = await current_details(client.get_workflow_handle(run.id))
            lines += [f"{run.id}: {part}" for part in details.split("\n\n") if part.startswith(SITE_WAIT)]
    return lines


async def current_details(handle: Any) -> str:
    """What the UI shows as the run's current details (`workflow.set_current_details`)."""
    from temporalio.api.sdk.v1 import WorkflowMetadata

    metadata = await handle.query("__temporal_workflow_metadata", result_type=WorkflowMetadata)
    return metadata.current_details


async def _campaign(client: Client, workflow_id: str) -> CampaignStatus | None:
    try:
        return await client.get_workflow_handle(workflow_id).query("status", result_type=CampaignStatus)
    except Exception:  # no worker polling: the line or view shows no clusters
        return None


async def _batch_nodes(client: Client, workflow_id: str) -> dict[str, NodeUpdateStatus]:
    """The nodes the run's running batches update themselves (a rollout's; other fleets' nodes are child runs)."""
    nodes: dict[str, NodeUpdateStatus] = {}
    query = (f"WorkflowType = 'RolloutBatch' AND ExecutionStatus = 'Running' AND "
             f"WorkflowId STARTS_WITH {quoted(workflow_id + '/')}")  # fmt: skip
    async for batch in client.list_workflows(query):
        with contextlib.suppress(Exception):  # closed meanwhile, or a batch from before it had the query
            nodes |= await client.get_workflow_handle(batch.id).query("nodes", result_type=dict[str, NodeUpdateStatus])
    return dict(sorted(nodes.items()))


# Kubernetes' own conditions in their healthy state say nothing about why a node is out of service.
HEALTHY = {t: (t, "False") for t in ("MemoryPressure", "DiskPressure", "PIDPressure", "NetworkUnavailable")}
HEALTHY["Ready"] = ("Ready", "True")


async def gangs_on(core: Any, nodes: list[str]) -> list[Gang]:
    """The gangs with GPU pods on these nodes: their pods here (nodes, running, GPUs count only these nodes'), and
    the minimum their PodGroup sets, where it has one."""
    from kubernetes.aio import client as k8s
    from kubernetes.aio.client.exceptions import ApiException

    pods = []
    for node in nodes:
        listed = await core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}")
        pods += [core.api_client.sanitize_for_serialization(p) for p in listed.items]
    gangs = gangs_of_pods(pods, {})
    custom = k8s.CustomObjectsApi(core.api_client)
    for gang in gangs:
        kind, _, where = gang.id.partition(":")
        namespace, _, name = where.partition("/")
        gang.min_member = 0  # unknown unless its PodGroup says
        if kind in POD_GROUPS:
            group, version, plural = POD_GROUPS[kind]
            with contextlib.suppress(ApiException):
                found = await custom.get_namespaced_custom_object(group, version, namespace, plural, name)
                spec = found.get("spec") if isinstance(found, dict) else None
                gang.min_member = int((spec or {}).get("minMember") or 0)
    return gangs


class NodeEvent(BaseModel):
    at: str
    type: str
    reason: str
    message: str


class NodeWhy(BaseModel):
    cluster: str
    node: str
    unschedulable: bool
    ready: bool
    cordoned_by: str | None = Field(None, description="The run that placed the cordon (Millwright's annotation).")
    cordon_reason: str | None = None
    foreign_cordon: bool = Field(False, description="Cordoned, but not by Millwright: someone else's.")
    cordon_holder: RunStatus | None = Field(
        None, description="The run named by the cordon, running (its progress says what it waits for) or closed."
    )
    rollout_state: str | None = None
    rollout: dict[str, Any] | None = Field(None, description="The rollout annotation: rollout, stage, reason...")
    quarantine: dict[str, Any] | None = Field(None, description="Remediation's quarantine: reason, by, at.")
    last_remediation: dict[str, Any] | None = Field(
        None, description="When, by whom and how the last remediation ended (the sweep's cooldown counts from it)."
    )
    conditions: list[dict[str, str]] = Field(default_factory=list, description="Conditions other than a healthy Ready.")
    place: NodePlace | None = Field(None, description="Its NVLink domain, rack and network block, by its labels.")
    gangs: list[Gang] = Field(
        default_factory=list, description="The gangs of GPU work with pods on it: their pods here, and their minimum."
    )
    out_of_service: str | None = Field(None, description="Why the disruption budget counts it out of service.")
    leases: list[Lease] = Field(default_factory=list, description="Its leases and waiting requests.")
    breaker: BreakerView | None = None
    runs: list[Operation] = Field(default_factory=list, description="Runs whose MillwrightNode is this node.")
    remediation: RunStatus | None = Field(None, description="The node's last remediation, running or closed.")
    events: list[NodeEvent] = Field(default_factory=list, description="Millwright's recent Events on the node.")
    problems: list[str] = Field(default_factory=list, description="What could not be read, and why.")


async def node_why(
    client: Client, core: Any, cluster: str, node: str, *, events: int = 10, topology: TopologyLabels | None = None
) -> NodeWhy:
    """``core``: a kubernetes CoreV1Api on the cluster (as the worker reads it: starter/nodes.py ``core_api``);
    ``topology``: the label keys that say where a node sits (docs/topology-and-gangs.md)."""
    import json

    from kubernetes.aio.client.exceptions import ApiException

    try:
        obj = await core.read_node(node)
    except ApiException as e:
        if e.status == 404:
            raise RunNotFound(f"no node {node!r} in cluster {cluster}") from None
        raise
    ann, labels = obj.metadata.annotations or {}, obj.metadata.labels or {}
    conditions = [
        {"type": c.type, "status": c.status, "reason": c.reason or "", "message": c.message or ""}
        for c in obj.status.conditions or []
        if (c.type, c.status) != HEALTHY.get(c.type, ("", ""))
    ]
    ready = any(c.type == "Ready" and c.status == "True" for c in obj.status.conditions or [])
    unschedulable = bool(obj.spec.unschedulable)
    why = NodeWhy(
        cluster=cluster, node=node, unschedulable=unschedulable, ready=ready, cordoned_by=ann.get(CORDONED_BY),
        cordon_reason=ann.get(CORDON_REASON), foreign_cordon=unschedulable and CORDONED_BY not in ann,
        rollout_state=labels.get(ROLLOUT_STATE_LABEL), conditions=conditions,
        place=place_of(node, labels, topology),
    )  # fmt: skip
    why.gangs = await gangs_on(core, [node])
    for name, key in (("rollout", ROLLOUT_ANNOTATION), ("quarantine", QUARANTINE_ANNOTATION),
                      ("last_remediation", LAST_REMEDIATION_ANNOTATION)):  # fmt: skip
        if key in ann:
            try:
                setattr(why, name, json.loads(ann[key]))
            except ValueError:
                why.problems.append(f"the {key} annotation is not JSON: {ann[key][:200]}")
    try:
        budget = await budget_show(client, cluster)
        why.out_of_service = budget.out_of_service.get(node)
        why.leases = [lease for lease in [*budget.leases, *budget.queue] if lease.node == node]
        why.breaker = await breaker_show(client, cluster)
    except (RunNotFound, RunClosed):
        why.problems.append(f"no disruption budget runs for {cluster}: nothing leased there")
    query = f"{sa.CLUSTER.name} = {quoted(cluster)} AND {sa.NODE.name} = {quoted(node)}"
    why.runs = [
        Operation(
            id=e.id,
            family=e.workflow_type,
            cluster=cluster,
            node=node,
            phase=e.typed_search_attributes.get(sa.PHASE),
            status=e.status.name.lower() if e.status else "",
            started=e.start_time,
        )
        async for e in client.list_workflows(query, limit=20)
    ]
    with contextlib.suppress(RunNotFound):
        why.remediation = await run_status(client, remediation_workflow_id(cluster, node))
    if why.cordoned_by and unschedulable:
        with contextlib.suppress(RunNotFound):
            held = why.remediation if why.remediation and why.remediation.id == why.cordoned_by else None
            why.cordon_holder = held or await run_status(client, why.cordoned_by)
    listed = await core.list_namespaced_event(EVENT_NAMESPACE, field_selector=f"involvedObject.name={node}")
    mine = [
        e for e in listed.items if e.involved_object.name == node and e.source and e.source.component == EVENT_COMPONENT
    ]
    mine.sort(key=lambda e: str(e.last_timestamp or e.first_timestamp or ""))
    why.events = [
        NodeEvent(
            at=str(e.last_timestamp or e.first_timestamp or ""),
            type=e.type or "",
            reason=e.reason or "",
            message=e.message or "",
        )
        for e in mine[-events:]
    ]
    return why


CLI_USER_AGENT = "millwright-cli"


async def core_api(cluster: str, kubeconfig: str | None = None) -> tuple[Any, Any]:
    """(CoreV1Api on ``cluster``, its connector to close), read as the worker reads clusters: MILLWRIGHT_KUBECONFIG
    or ``kubeconfig`` (os.pathsep-separated), else $KUBECONFIG, else ~/.kube/config; the context named ``cluster``."""
    from kubernetes.aio import client as k8s

    from activities.kube.connector import ClusterConnector
    from worker.config import WorkerSettings

    settings = WorkerSettings(kubeconfig=kubeconfig) if kubeconfig else WorkerSettings()
    connector = ClusterConnector(settings.kubeconfig_paths())
    api = await connector.api(cluster)
    # An operator's reads are not the worker's: audit logs (and tests/deploy/test_least_privilege.py, which holds
    # the worker's RBAC to what `millwright-worker` was seen to do) tell them apart by this.
    api.user_agent = CLI_USER_AGENT
    return k8s.CoreV1Api(api), connector


class StageLog(BaseModel):
    pod: str
    package: str
    stage: str
    rollout: str = Field("", description="The rollout that ran it (the Job's annotation).")
    phase: str
    started: datetime | None = None
    log: str


async def node_logs(core: Any, node: str, *, stage: str | None = None) -> list[StageLog]:
    """The logs of the stage Jobs Millwright ran on ``node`` (as long as Kubernetes keeps their pods, JOB_TTL_SECONDS
    after they finish), oldest first: each pod's stage container, the one that does the stage's work."""
    selector = f"{JOB_NODE_LABEL}={node}" + (f",{JOB_STAGE_LABEL}={stage}" if stage else "")
    pods = (await core.list_namespaced_pod(JOB_NAMESPACE, label_selector=selector)).items
    pods.sort(key=lambda p: (p.status.start_time or p.metadata.creation_timestamp or datetime.min, p.metadata.name))
    logs = []
    for p in pods:
        labels, ann = p.metadata.labels or {}, p.metadata.annotations or {}
        text = await core.read_namespaced_pod_log(p.metadata.name, JOB_NAMESPACE, container=labels.get(JOB_STAGE_LABEL))
        logs.append(StageLog(
            pod=p.metadata.name, package=labels.get(JOB_PACKAGE_LABEL, ""), stage=labels.get(JOB_STAGE_LABEL, ""),
            rollout=ann.get(JOB_ROLLOUT_ANNOTATION, ""), phase=p.status.phase or "", started=p.status.start_time,
            log=text or "",
        ))  # fmt: skip
    return logs
