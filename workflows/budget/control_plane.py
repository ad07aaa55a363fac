"""The control-plane boundary of a cluster's disruption budget: whatever the budget allows, control-plane nodes
(label ``node-role.kubernetes.io/control-plane``) go out of service at most ``at_once`` at a time (1 unless the
cluster's settings relax it), so a node is never taken while another control-plane node is unavailable:
rebooting two of three etcd members loses quorum.

Pure: the DisruptionBudget entity (workflows/budget/disruption_budget.py `_grant`) asks it about each request
that would take a node out of service; a request it holds back waits, its note saying why.
"""

from __future__ import annotations

# The entity applies the rule (runs from before it grant by the budget alone).
CONTROL_PLANE_PATCH = "budget-control-plane"
DEFAULT_AT_ONCE = 1


def control_plane_wait(node: str, out: set[str], control_plane: set[str], at_once: int) -> str | None:
    """Why taking `node` out of service must wait, or None when the control-plane rule allows it.

    `out`: the nodes out of service now (unavailable for any reason, or leased); `control_plane`: every
    control-plane node of the cluster. A node already out of service, or not of the control plane, is allowed."""
    if node not in control_plane or node in out:
        return None
    down = sorted(control_plane & out)
    if len(down) < at_once:
        return None
    return (
        f"waiting: control-plane node {node} waits while {len(down)} control-plane "
        f"node{'s' if len(down) > 1 else ''} ({', '.join(down)}) {'are' if len(down) > 1 else 'is'} out of "
        f"service; at most {at_once} at once (the budget's control_plane_at_once)"
    )
