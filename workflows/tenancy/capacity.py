"""The GPU capacity check of onboarding and of a quota change: the tenants' GPU quotas within the cluster's GPUs."""

from __future__ import annotations

from temporalio.exceptions import ApplicationError

from activities.capi.activities import ClusterApiActivities
from activities.capi.models import CapacityRequest
from workflows.common.call_options import API_CALL
from workflows.common.endpoints import Endpoints, kubernetes_api


async def check_gpu_capacity(calls: Endpoints, cluster: str, tenant: str, gpu_quota: float, allow: bool) -> None:
    """Fails for good (QuotaExceedsCapacity) when the quotas would pass the GPUs and oversubscription is not allowed."""
    cap = await calls.execute(
        ClusterApiActivities.gpu_capacity,
        CapacityRequest(cluster=cluster),
        **API_CALL,
        endpoint=kubernetes_api(cluster),
    )
    others = sum(q for t, q in cap.quotas.items() if t != tenant)
    total = others + max(0.0, gpu_quota)
    if total > cap.gpus and not allow:
        raise ApplicationError(
            f"GPU quotas would total {total:g} on cluster {cluster} (other tenants {others:g} + {tenant} "
            f"{gpu_quota:g}) but it has {cap.gpus:g} GPUs; lower the quota or set allow_oversubscription",
            type="QuotaExceedsCapacity",
            non_retryable=True,
        )
