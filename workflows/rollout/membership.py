"""Who is in a rollout now: the membership a Rollout re-reads before each batch, and its erroring-node retries.

NodeWright rebuilds its node list on every reconcile: a node that starts matching the selector joins the rollout,
one that stops matching leaves it, and a compartment's counters follow. A Rollout does the same once per batch, from
one paged re-read of the targeted nodes (`Rollout._survey`), with `reconcile`. Pure and deterministic: it changes
the checkpoint in place and returns what changed, for the batch's view and the status. The rules
(docs/rollout-batch-planning.md):

* a node that starts matching joins the compartment NodeWright's assignment picks for it, as `waiting`;
* a node that stops matching leaves, whatever its state, except while it is `in_progress`: a running node is never
  interrupted, it leaves at the first re-read after its batch; the compartment's counters drop what it had counted
  (a complete node from `completedNodes`, an erroring one from `failedNodes`), so progress stays a share of the
  nodes still in it;
* a node still matching whose labels now pick another compartment moves there only while it has no outcome
  (`waiting` or `blocked`): outcomes stay where they were counted.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from pydantic import Field

from activities.models import StrictModel
from workflows.rollout.batching import NodeSnapshot, choose_compartment
from workflows.rollout.spec.deployment_policy import DeploymentPolicy
from workflows.rollout.state import CompartmentState, NodeStatus, RolloutCheckpoint


class MembershipChange(StrictModel):
    joined: dict[str, str] = Field(default_factory=dict)
    left: dict[str, NodeStatus] = Field(default_factory=dict)
    moved: dict[str, str] = Field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.joined or self.left or self.moved)


def reconcile(cp: RolloutCheckpoint, live: Sequence[NodeSnapshot], policy: DeploymentPolicy) -> MembershipChange:
    """Bring the checkpoint's members in line with the nodes the selectors match now."""
    change = MembershipChange()
    names = {n.name for n in live}
    matched = {c.name: sum(1 for n in live if c.selector.matches(n.labels)) for c in policy.compartments}
    where = {m: name for name, cs in cp.compartments.items() for m in cs.members}
    for node in sorted(live, key=lambda n: n.name):
        target = choose_compartment(node.labels, policy, matched)
        current = where.get(node.name)
        if current is None:
            _add(cp, target, node.name)
            cp.nodes[node.name] = "waiting"
            cp.joined[node.name] = target
            cp.left.pop(node.name, None)
            change.joined[node.name] = target
        elif current != target and cp.nodes[node.name] in ("waiting", "blocked"):
            cp.compartments[current].members.remove(node.name)
            _add(cp, target, node.name)
            change.moved[node.name] = target
    for name in sorted(set(where) - names):
        status = cp.nodes[name]
        if status == "in_progress":
            continue  # never interrupted: it leaves at the first re-read after its batch
        cs = cp.compartments[where[name]]
        cs.members.remove(name)
        if status == "complete":
            cs.batch = cs.batch.model_copy(update={"completed_nodes": max(0, cs.batch.completed_nodes - 1)})
        elif status == "erroring":
            cs.batch = cs.batch.model_copy(update={"failed_nodes": max(0, cs.batch.failed_nodes - 1)})
        del cp.nodes[name]
        cp.reasons.pop(name, None)
        cp.retries.pop(name, None)
        cp.joined.pop(name, None)
        cp.left[name] = status
        change.left[name] = status
    return change


def _add(cp: RolloutCheckpoint, compartment: str, node: str) -> None:
    cs = cp.compartments.setdefault(compartment, CompartmentState())
    bisect.insort(cs.members, node)


def retryable(cp: RolloutCheckpoint, node: str, limit: int) -> bool:
    """An erroring node with automatic retries left (`retryErroringNodes`)."""
    return cp.nodes.get(node) == "erroring" and cp.retries.get(node, 0) < limit
