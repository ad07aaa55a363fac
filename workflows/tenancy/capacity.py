"""The GPU capacity check of onboarding and of a quota change: the guaranteed GPUs of the cluster's KAI queue
tree, with the tenant's new guarantee in place, within the cluster's GPUs.

KAI guarantees a child's quota out of its parent's: a subtree reserves its own quota or, when its children's
quotas add up to more, theirs. A queue with an unlimited guarantee (-1) reserves what its children do; a tenant
queue's unlimited guarantee claims every GPU of the cluster (so any other guarantee beside it oversubscribes).
A queue that is not a tenant's and has neither a guarantee nor children (KAI's `default-queue`) reserves none:
its jobs run on what the guarantees leave.
"""

from __future__ import annotations

from temporalio.exceptions import ApplicationError

from activities.capi.activities import ClusterApiActivities
from activities.capi.models import CapacityRequest, GpuCapacity, QueueGuarantee
from workflows.common.call_options import API_CALL
from workflows.common.endpoints import Endpoints, kubernetes_api
from workflows.tenancy.models import UNLIMITED


async def read_capacity(calls: Endpoints, cluster: str) -> GpuCapacity:
    return await calls.execute(
        ClusterApiActivities.gpu_capacity,
        CapacityRequest(cluster=cluster),
        **API_CALL,
        endpoint=kubernetes_api(cluster),
    )


def guaranteed_gpus(cap: GpuCapacity, tenant: str, parent: str, gpu_quota: float) -> float:
    """The GPUs the queue tree guarantees once `tenant`'s queue (under `parent`) guarantees `gpu_quota`."""
    queues = [q for q in cap.queues if q.name != tenant]
    queues.append(QueueGuarantee(name=tenant, parent=parent, gpu_quota=gpu_quota, tenant=tenant))
    return tree_guarantee(queues, cap.gpus)


def tree_guarantee(queues: list[QueueGuarantee], gpus: float) -> float:
    """The GPUs a KAI queue tree guarantees on a cluster of `gpus` GPUs."""
    names = {q.name for q in queues}
    children: dict[str, list[QueueGuarantee]] = {}
    for q in queues:
        if q.parent in names:
            children.setdefault(q.parent, []).append(q)

    def reserved(q: QueueGuarantee, seen: frozenset[str]) -> float:
        if q.name in seen:  # a cycle KAI would not schedule: counted once
            return 0.0
        kids = sum(reserved(c, seen | {q.name}) for c in children.get(q.name, []))
        if q.gpu_quota == UNLIMITED:
            return gpus if q.tenant is not None else kids
        return max(max(q.gpu_quota, 0.0), kids)

    # A queue whose parent does not exist is a root as far as the guarantee goes (KAI marks it Orphan).
    return sum(reserved(q, frozenset()) for q in queues if q.parent not in names)


def check_queue_tree(cap: GpuCapacity, cluster: str, tenant: str, parent: str, gpu_quota: float, allow: bool) -> None:
    """Fails for good (QuotaExceedsCapacity) when the guarantees would pass the GPUs and oversubscription is not
    allowed."""
    total = guaranteed_gpus(cap, tenant, parent, gpu_quota)
    if total > cap.gpus and not allow:
        others = guaranteed_gpus(cap, tenant, parent, 0)
        asked = "unlimited (every GPU)" if gpu_quota == UNLIMITED else f"{gpu_quota:g}"
        raise ApplicationError(
            f"gpu.quota: the queues' GPU guarantees would total {total:g} on cluster {cluster} (the queue tree "
            f"without {tenant}: {others:g}; {tenant}: {asked}) but it has {cap.gpus:g} GPUs; lower the quota or "
            "set allow_oversubscription",
            type="QuotaExceedsCapacity",
            non_retryable=True,
        )
