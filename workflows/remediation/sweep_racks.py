"""FleetHealthSweep's side of escalation (workflows/remediation/escalation.py): each slice places its nodes (its
domains' counts, each candidate's place and fabric signs); once a cluster is wholly decided, each domain over the
threshold gets one RackRemediation child instead of a NodeRemediation per node: started by its name, with the ID
every starter derives (`rack-remediation/<cluster>/<rack>`) and parent close policy abandon."""

from __future__ import annotations

from datetime import datetime

from temporalio import workflow
from temporalio.common import TypedSearchAttributes, WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError

from activities.kube.topology import place_of
from activities.node_health import NodeHealth
from activities.prometheus import GpuFault
from workflows.common import priorities
from workflows.remediation.escalation import Escalation, FaultyNode, RackTally, escalations, fabric_signs, tally
from workflows.remediation.rack_models import RackRemediationInput
from workflows.remediation.sweep_models import Candidate, FleetHealthSweepInput, FleetHealthSweepResult

RACK_WORKFLOW = "RackRemediation"  # started by name: workflows/remediation/rack_remediation.py


def place_slice(result: FleetHealthSweepResult, nodes: list[NodeHealth], inp: FleetHealthSweepInput,
                dcgm: dict[str, list[GpuFault]] | None, now: datetime) -> None:  # fmt: skip
    """A slice's nodes counted per domain into `result.racks`, and its candidates placed (`result.found`)."""
    esc = inp.escalation
    (sweep,) = result.clusters
    unhealthy = {d.node for d in sweep.unhealthy}  # a slice's own result lists all of its not healthy nodes
    places = {n.name: place_of(n.name, n.labels, esc.topology) for n in nodes}
    result.racks = tally((places[n.name], n.name in unhealthy) for n in nodes)
    by_name = {n.name: n for n in nodes}
    for candidate in result.found:
        node = by_name[candidate.decision.node]
        candidate.place = places[node.name]
        candidate.fabric = fabric_signs(node, esc, inp.checks, (dcgm or {}).get(node.name))
        candidate.seen_at = node.decided_at(now)


async def start_racks(
    cluster: str, found: list[Candidate], racks: dict[str, RackTally], inp: FleetHealthSweepInput
) -> tuple[list[tuple[list[Candidate], str, str, str]], list[Candidate]]:
    """The domains of `cluster` to remediate whole, each started (or found running): (its candidates, their status,
    the detail, the rack run's ID) for each; and the candidates left to their own NodeRemediation."""
    faulty = [FaultyNode(node=c.decision.node, place=c.place, fabric=c.fabric, seen_at=c.seen_at)
              for c in found if c.place is not None and c.seen_at is not None]  # fmt: skip
    done: list[tuple[list[Candidate], str, str, str]] = []
    escalated: set[str] = set()
    for esc in escalations(faulty, racks, inp.escalation):
        members = [c for c in found if c.decision.node in esc.nodes]
        status, detail, wf_id = await _start_rack(cluster, esc, members, inp)
        done.append((members, status, detail, wf_id))
        escalated.update(esc.nodes)
    return done, [c for c in found if c.decision.node not in escalated]


async def _start_rack(cluster: str, esc: Escalation, members: list[Candidate],
                      inp: FleetHealthSweepInput) -> tuple[str, str, str]:  # fmt: skip
    settings = inp.escalation.rack
    known = {c.decision.node: c.facts.bmc for c in members if c.facts.bmc is not None}
    rack = RackRemediationInput(
        cluster=cluster, domain=esc.rack, reason=esc.reason, topology=inp.escalation.topology,
        breaker=inp.remediation.breaker, node_remediation=inp.remediation,
        **{**inp.escalation.rack_for(esc.rack), "bmcs": {**known, **settings.bmcs},
           "netbox": settings.netbox or inp.netbox})  # fmt: skip
    wf_id = rack.workflow_id()
    if inp.dry_run:
        return "dry-run", f"would remediate its domain whole ({wf_id}): {esc.reason}", wf_id
    try:
        await workflow.start_child_workflow(
            RACK_WORKFLOW, rack, id=wf_id, task_queue=workflow.info().task_queue,
            parent_close_policy=workflow.ParentClosePolicy.ABANDON, priority=priorities.remediation(cluster),
            # A finished rack run may run again; a running one is never started twice.
            id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
            search_attributes=TypedSearchAttributes(rack.search_attributes()),
            static_summary=f"remediate domain {esc.rack} whole: {esc.reason}"[:200],
        )  # fmt: skip
    except WorkflowAlreadyStartedError:
        return "already-running", f"its domain's RackRemediation {wf_id} is already running", wf_id
    return "escalated", f"its domain remediated whole: {esc.reason}", wf_id
