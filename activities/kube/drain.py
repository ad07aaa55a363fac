"""kubectl drain's rules: which pods a drain leaves (mirror pods, DaemonSet pods, finished ones) and what each answer
of the eviction API means."""

from __future__ import annotations

import re

from kubernetes.aio import client as k8s
from kubernetes.aio.client.exceptions import ApiException
from temporalio.exceptions import ApplicationError

from activities.kube.errors import api_error, retry_after, status_of
from activities.kube.models import EvictOutcome, PodRef

# ---------------------------------------------------------------- pod filters (kubectl drain)


def controller_of(pod: k8s.V1Pod) -> k8s.V1OwnerReference | None:
    for ref in pod.metadata.owner_references or []:
        if ref.controller:
            return ref
    return None


def pod_finished(pod: k8s.V1Pod) -> bool:
    return bool(pod.status and pod.status.phase in ("Succeeded", "Failed"))


# Extended resources that are GPUs: whole ones, and MIG instances under the device plugin's `mixed` strategy.
GPU_RESOURCE = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"


def is_gpu_resource(name: str) -> bool:
    return name == GPU_RESOURCE or name.startswith(MIG_RESOURCE_PREFIX)


def uses_gpu(pod: k8s.V1Pod) -> bool:
    """Any container (init containers too) requests or limits a GPU resource."""
    spec = pod.spec
    for c in [*(spec.containers or []), *(spec.init_containers or [])] if spec else []:
        res = c.resources
        for amounts in (res.requests, res.limits) if res else ():
            if any(is_gpu_resource(k) and str(v) not in ("0", "") for k, v in (amounts or {}).items()):
                return True
    return False


def pod_ref_of(pod: k8s.V1Pod) -> PodRef:
    return PodRef(namespace=pod.metadata.namespace, name=pod.metadata.name, uid=pod.metadata.uid)


# ---------------------------------------------------------------- eviction answers (kubectl drain)


def eviction_refused(err: ApiException, pod_ref: PodRef) -> EvictOutcome | None:
    """An eviction answer that decides by itself: a refusal to wait out (blocked), or a non-retryable
    error raised here. None: the answer does not say what became of the pod (a fresh read must)."""
    status = status_of(err)
    message = status.get("message") or err.reason or ""
    causes = (status.get("details") or {}).get("causes") or []
    if err.status == 429:
        # The PodDisruptionBudget (a StatusCause's type is serialized as "reason"), or the API's own rate limit.
        budget_cause = next((c for c in causes if c.get("reason") == "DisruptionBudget"), None)
        budget = None
        if budget_cause:
            m = re.search(r"disruption budget (\S+)", budget_cause.get("message", ""))
            budget = f"{pod_ref.namespace}/{m.group(1)}" if m else None
            message = f"{message} {budget_cause.get('message', '')}".strip()
        return EvictOutcome(status="blocked", message=message, budget=budget, retry_after_seconds=retry_after(err))
    if err.status == 403 and any(c.get("reason") == "NamespaceTerminating" for c in causes):
        return EvictOutcome(status="blocked", message=message)  # until the namespace's deletion reaches the pod
    if err.status == 500 and "more than one PodDisruptionBudget" in message:
        raise ApplicationError(
            f"cannot evict {pod_ref}: {message}", type="MultiplePodDisruptionBudgets", non_retryable=True
        ) from err
    if err.status in (400, 403, 405, 415, 422):
        raise api_error(err, f"evicting pod {pod_ref}") from err
    return None


def eviction_unsettled(err: ApiException, pod_ref: PodRef) -> ApplicationError | EvictOutcome:
    """What to report for an answer that left the pod as it was (the fresh read after it shows it still
    there): a 409 Conflict (the PodDisruptionBudget changed under the eviction, "the object has been
    modified", or a failed precondition) is blocked, tried again after the retry interval; the rest
    (404, 5xx, anything unexpected) a retryable error."""
    if err.status != 409:
        return api_error(err, f"evicting pod {pod_ref}")
    status = status_of(err)
    details = status.get("details") or {}
    budget = details.get("name") if details.get("kind") == "poddisruptionbudgets" else None
    return EvictOutcome(
        status="blocked",
        budget=f"{pod_ref.namespace}/{budget}" if budget else None,
        message=f"409 Conflict: {status.get('message') or err.reason}; the pod is still running",
    )
