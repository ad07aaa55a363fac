"""Before any write: which nodes move, what each will advertise, and whether the tenants' GPU guarantees still fit.

The target config must exist for every selected node's GPU model (§2.3's table: `all-2g.10gb` is an A100-40GB
layout, not an H100's); a node the table has no row for is refused by name. The capacity check is the tenancy's
(workflows/tenancy/capacity.py): the KAI queue tree's guarantees must fit the cluster's GPUs once the layout is in
place, counted in the layout's units (an instance is its compute slices out of seven: a `3g.40gb` is 3/7 of a GPU,
so `all-3g.40gb` leaves 6/7 of each GPU usable and `all-enabled` none).
"""

from __future__ import annotations

from pydantic import Field

from activities.capi.models import QueueGuarantee
from activities.kube.mig import MigNode
from activities.models import StrictModel
from workflows.partitioning.layouts import current_equivalents, layout_of, model_of
from workflows.tenancy.capacity import tree_guarantee


class NodePlan(StrictModel):
    node: str
    product: str
    gpus: int
    config: str | None = Field(None, description="Its MIG config now.")
    expected: dict[str, int] = Field(description="The GPU resources it advertises once moved.")
    capacity: float = Field(description="Those resources in GPUs (MIG instances by their compute slices).")
    at_target: bool = Field(description="Already there (config, state success, resources): skipped, no write.")


class QuotaCheck(StrictModel):
    """The tenants' GPU guarantees against the cluster's GPUs before and after, in GPUs (MIG instances counted by
    their compute slices)."""

    gpus_before: float
    gpus_after: float
    guaranteed: float = Field(description="What the KAI queue tree guarantees, after.")
    tenants: dict[str, float] = Field(default_factory=dict, description="Tenant → its queue's GPU guarantee.")
    fits: bool
    overridden: bool = Field(False, description="It did not fit, and allow_quota_shortfall let the run go on.")

    def refusal(self, cluster: str, config: str) -> str:
        named = ", ".join(f"{t} ({q:g} GPUs)" for t, q in sorted(self.tenants.items(), key=lambda i: (-i[1], i[0])))
        return (f"{config} would leave cluster {cluster} {self.gpus_after:.2f} GPUs (now {self.gpus_before:.2f}; MIG "
                f"instances counted by their compute slices out of 7) but its queues guarantee {self.guaranteed:g}: "
                f"the guaranteed quota of {named or 'its queues'} would no longer fit. Pick a layout that keeps the "
                "capacity, lower the quotas, or set allow_quota_shortfall")  # fmt: skip


def plan_nodes(nodes: list[MigNode], missing: list[str], config: str) -> list[NodePlan]:
    """The selected nodes' moves; raises ValueError naming every node that is missing or whose GPU has no such
    config."""
    problems = [f"{name}: no such node" for name in missing]
    plans: list[NodePlan] = []
    for n in (n for n in nodes if n.selected):
        model = model_of(n.product)
        layout = layout_of(config, model) if model is not None else None
        if model is None:
            problems.append(f"{n.name}: GPU {n.product or '(no nvidia.com/gpu.product label)'} is not MIG-capable "
                            "as far as the profile table knows")  # fmt: skip
        elif layout is None:
            problems.append(f"{n.name}: {n.product} ({model.name}) has no config {config}")
        elif n.gpus <= 0:
            problems.append(f"{n.name}: no GPU count (nvidia.com/gpu.count label or nvidia.com/gpu capacity)")
        else:
            expected = layout.resources(n.gpus)
            at_target = n.config == config and n.state == "success" and n.resources == expected
            plans.append(NodePlan(node=n.name, product=n.product, gpus=n.gpus, config=n.config, expected=expected,
                                  capacity=layout.gpu_equivalents(n.gpus), at_target=at_target))  # fmt: skip
    if problems:
        raise ValueError("; ".join(problems))
    return plans


def check_quotas(nodes: list[MigNode], plans: list[NodePlan], queues: list[QueueGuarantee]) -> QuotaCheck:
    """The queue tree's guarantees against the cluster's GPUs once every planned node has its layout."""
    moving = {p.node: p.capacity for p in plans}
    before = sum(current_equivalents(n.resources) for n in nodes)
    after = sum(moving.get(n.name, current_equivalents(n.resources)) for n in nodes)
    guaranteed = tree_guarantee(queues, after)
    tenants = {q.tenant: q.gpu_quota for q in queues if q.tenant is not None and q.gpu_quota != 0}
    return QuotaCheck(gpus_before=round(before, 4), gpus_after=round(after, 4), guaranteed=guaranteed,
                      tenants=tenants, fits=guaranteed <= after + 1e-9)  # fmt: skip
