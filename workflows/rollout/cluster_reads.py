"""What a fleet run reads of its cluster: the targeted nodes, the batch gate's checks, who is out of service."""

from __future__ import annotations

from temporalio import workflow

from activities.kube.activities import KubeActivities
from activities.kube.models import ConditionGate, NodePageRequest, UnavailableRequest
from activities.kube.topology import GangMap, GangRequest
from activities.prometheus import PrometheusActivities, PrometheusQuery
from workflows.common import priorities
from workflows.common.call_options import API_CALL
from workflows.rollout.batching import NODE_PRIORITY_LABEL, NodeSnapshot
from workflows.rollout.spec.admission import BatchGate
from workflows.rollout.spec.fleet import FleetSpec

SURVEY_PAGE = 1000


async def survey(spec: FleetSpec) -> list[NodeSnapshot]:
    """The targeted nodes, page by page, keeping only the labels compartments (and, with batchBy, units) look at."""
    keys = {r.key for r in spec.node_selectors.requirements()} | {NODE_PRIORITY_LABEL}
    if spec.batch_by != "none":  # where each node sits: its batch takes whole units
        keys |= set(spec.topology.keys())
    for compartment in spec.deployment_policy.compartments:
        keys |= {r.key for r in compartment.selector.requirements()}
    nodes, token = [], None
    while True:
        page = await workflow.execute_activity_method(
            KubeActivities.list_nodes_page,
            NodePageRequest(
                cluster=spec.cluster,
                label_selector=spec.node_selectors.to_selector_string(),
                label_keys=sorted(keys),
                limit=SURVEY_PAGE,
                continue_token=token,
            ),
            **API_CALL,
            priority=priorities.rollout(spec.cluster),
            summary="list targeted nodes",
        )
        nodes += [
            NodeSnapshot(name=n.name, labels=n.labels, unschedulable=n.unschedulable, ready=n.ready, created=n.created)
            for n in page.nodes
        ]
        token = page.continue_token
        if not token:
            return nodes


async def check_gate(spec: FleetSpec, gate: BatchGate) -> list[str]:
    """What fails the batch gate now; empty: it passes."""
    problems: list[str] = []
    if gate.node_conditions:
        problems += await workflow.execute_activity_method(
            KubeActivities.check_node_conditions,
            ConditionGate(
                cluster=spec.cluster,
                label_selector=spec.node_selectors.to_selector_string(),
                conditions=gate.node_conditions,
            ),
            **API_CALL,
            priority=priorities.rollout(spec.cluster),
            summary="gate: node conditions",
        )
    if gate.prometheus is not None:
        q = gate.prometheus
        values = await workflow.execute_activity_method(
            PrometheusActivities.query_prometheus,
            PrometheusQuery(url=q.url, query=q.query),
            **API_CALL,
            priority=priorities.rollout(spec.cluster),
            summary="gate: prometheus query",
        )
        if q.min_value is None and q.max_value is None:
            if values:
                problems.append(f"{q.query} returned {len(values)} series")
        else:
            bad = [
                v
                for v in values
                if (q.min_value is not None and v < q.min_value) or (q.max_value is not None and v > q.max_value)
            ]
            if bad or not values:
                problems.append(f"{q.query} = {values or 'no data'} outside [{q.min_value}, {q.max_value}]")
    return problems


async def unavailable_nodes(spec: FleetSpec, compartment: str) -> list[str]:
    """The targeted nodes out of service, asked of the cluster (Rollout runs from before batch planning)."""
    return await workflow.execute_activity_method(
        KubeActivities.list_unavailable_nodes,
        UnavailableRequest(cluster=spec.cluster, label_selector=spec.node_selectors.to_selector_string()),
        **API_CALL,
        priority=priorities.rollout(spec.cluster),
        summary=f"count unavailable nodes for {compartment}",
    )


async def read_gangs(spec: FleetSpec) -> GangMap:
    """With batchBy, the cluster's gangs of GPU work, read before each batch decision: which units a batch must take
    together. Without, none (and no activity: the commands of a run without batchBy are unchanged)."""
    if spec.batch_by == "none":
        return GangMap()
    return await workflow.execute_activity_method(
        KubeActivities.read_gangs,
        GangRequest(cluster=spec.cluster),
        **API_CALL,
        priority=priorities.rollout(spec.cluster),
        summary="read the gangs of GPU work",
    )
