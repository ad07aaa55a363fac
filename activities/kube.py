"""Kubernetes activities: cordon, drain through the eviction API, uncordon.

Every activity is idempotent: it reads the live object first and decides from what
it finds, so a retry after a crash at any line neither repeats a write nor undoes
someone else's. Errors a retry cannot fix are raised as non-retryable
`ApplicationError`s with a `type`; everything else (5xx, 409 conflicts, 429 rate
limits, dropped connections) is raised as is and left to the workflow's retry policy.
The client's own retries are off: Temporal owns retrying, so every attempt is visible.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal

import aiohttp
import yaml
from kubernetes.aio import client as k8s
from kubernetes.aio import config as k8s_config
from kubernetes.aio.client.exceptions import ApiException
from pydantic import BaseModel, Field, field_validator
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.selectors import SelectorError, parse_label_selector, selector_matches

# Where Millwright records on a node that it placed the cordon, so it never
# removes a cordon placed by someone else.
CORDONED_BY = "millwright.dev/cordoned-by"
CORDON_REASON = "millwright.dev/cordon-reason"

USER_AGENT = "millwright-worker"
_REQUEST_TIMEOUT = 10.0
_LIST_CHUNK = 500  # kubectl drain's default chunk size
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def validate_label_selector(value: str | None) -> str | None:
    """Pydantic validator helper: reject a selector the API server would reject."""
    if value is None:
        return None
    try:
        parse_label_selector(value)
    except SelectorError as err:
        raise ValueError(str(err)) from err
    return value


def validate_object_name(value: str) -> str:
    if len(value) > 253 or not _DNS_SUBDOMAIN.match(value):
        raise ValueError(f"{value!r} is not a valid Kubernetes object name (RFC 1123 subdomain)")
    return value


def validate_positive_duration(value: timedelta) -> timedelta:
    if value <= timedelta(0):
        raise ValueError("must be a positive duration")
    return value


# ---------------------------------------------------------------- models


class DrainSettings(BaseModel):
    """How to drain, mirroring `kubectl drain` flags, with a finite default timeout."""

    ignore_daemonsets: bool = Field(True, description="Skip DaemonSet pods (kubectl --ignore-daemonsets).")
    delete_emptydir_data: bool = Field(
        False, description="Evict pods using emptyDir volumes; their data is lost (--delete-emptydir-data)."
    )
    force: bool = Field(False, description="Evict pods that no controller will recreate (--force).")
    grace_period_seconds: int | None = Field(
        None, ge=0, description="Override each pod's terminationGracePeriodSeconds; unset keeps the pod's own."
    )
    pod_selector: str | None = Field(None, description="Only drain pods matching this label selector.")
    timeout: timedelta = Field(
        timedelta(minutes=30), description="Give up the drain after this long (ISO 8601 duration or seconds)."
    )
    eviction_retry_interval: timedelta = Field(
        timedelta(seconds=5), description="Wait between eviction attempts blocked by a PodDisruptionBudget."
    )

    _selector = field_validator("pod_selector")(validate_label_selector)
    _durations = field_validator("timeout", "eviction_retry_interval")(validate_positive_duration)


class NodeRef(BaseModel):
    cluster: str
    node: str


class NodeInfo(BaseModel):
    name: str
    unschedulable: bool
    cordoned_by: str | None = None
    ready: bool
    boot_id: str | None = None


class CordonRequest(BaseModel):
    cluster: str
    node: str
    owner: str = Field(description="Who holds the cordon: the workflow ID.")
    reason: str = ""


class CordonResult(BaseModel):
    owned: bool = Field(description="True when this owner placed (or already held) the cordon.")
    holder: str | None = Field(None, description="Who placed the cordon when it is not ours ('unknown' if unmarked).")


class UncordonResult(BaseModel):
    uncordoned: bool
    note: str


class PodRef(BaseModel):
    namespace: str
    name: str
    uid: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


class PodQuery(BaseModel):
    cluster: str
    node: str
    label_selector: str


class DrainPlanRequest(BaseModel):
    cluster: str
    node: str
    settings: DrainSettings


class SkippedPod(BaseModel):
    pod: PodRef
    reason: str


class DrainPlan(BaseModel):
    evict: list[PodRef] = Field(default_factory=list)
    skipped: list[SkippedPod] = Field(default_factory=list)


class EvictRequest(BaseModel):
    cluster: str
    pod: PodRef
    grace_period_seconds: int | None = None


class EvictOutcome(BaseModel):
    status: Literal["evicted", "gone", "blocked"]
    message: str = ""
    budget: str | None = Field(None, description="The PodDisruptionBudget blocking the eviction, when known.")
    retry_after_seconds: float | None = None


class WaitPodsGoneRequest(BaseModel):
    cluster: str
    pods: list[PodRef]
    poll_interval_seconds: float = 1.0


# ---------------------------------------------------------------- cluster access


class ClusterConnector:
    """Resolves a cluster reference (a kubeconfig context name) to an API client.

    Credentials stay in the kubeconfig files on the worker: workflow inputs and
    histories only ever carry the cluster's name.
    """

    def __init__(self, kubeconfig_paths: list[str]) -> None:
        self._paths = [p for p in kubeconfig_paths if p]
        self._clients: dict[str, k8s.ApiClient] = {}
        self._lock = asyncio.Lock()

    def _contexts(self) -> dict[str, dict[str, Any]]:
        """Merge the kubeconfig files, first file wins, as kubectl does with KUBECONFIG."""
        merged: dict[str, dict[str, Any]] = {}
        for path in self._paths:
            p = Path(path).expanduser()
            if not p.exists():
                continue
            doc = yaml.safe_load(p.read_text()) or {}
            clusters = {c["name"]: c for c in doc.get("clusters") or []}
            users = {u["name"]: u for u in doc.get("users") or []}
            for ctx in doc.get("contexts") or []:
                name = ctx["name"]
                if name in merged:
                    continue
                spec = ctx.get("context") or {}
                merged[name] = {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "current-context": name,
                    "contexts": [ctx],
                    "clusters": [clusters[spec["cluster"]]] if spec.get("cluster") in clusters else [],
                    "users": [users[spec["user"]]] if spec.get("user") in users else [],
                }
        return merged

    async def api(self, cluster: str) -> k8s.ApiClient:
        async with self._lock:
            if cluster not in self._clients:
                contexts = self._contexts()
                if cluster not in contexts:
                    raise ApplicationError(
                        f"unknown cluster {cluster!r}: no kubeconfig context of that name in "
                        f"{os.pathsep.join(self._paths) or '(no kubeconfig configured)'}; "
                        f"known: {', '.join(sorted(contexts)) or 'none'}",
                        type="UnknownCluster",
                        non_retryable=True,
                    )
                configuration = type.__call__(k8s.Configuration)
                await k8s_config.load_kube_config_from_dict(contexts[cluster], client_configuration=configuration)
                configuration.retries = None  # Temporal retries, visibly
                api = k8s.ApiClient(configuration=configuration)
                api.user_agent = USER_AGENT  # lets audit logs tell Millwright's calls apart
                self._clients[cluster] = api
            return self._clients[cluster]

    async def core(self, cluster: str) -> k8s.CoreV1Api:
        return k8s.CoreV1Api(await self.api(cluster))

    async def close(self) -> None:
        for api in self._clients.values():
            await api.close()
        self._clients.clear()


# ---------------------------------------------------------------- errors


def _status_of(err: ApiException) -> dict[str, Any]:
    try:
        return json.loads(err.body or "{}")
    except (TypeError, ValueError):
        return {}


def _retry_after(err: ApiException) -> float | None:
    status = _status_of(err)
    seconds = (status.get("details") or {}).get("retryAfterSeconds")
    if seconds is None and err.headers is not None:
        seconds = err.headers.get("Retry-After")
    try:
        return float(seconds) if seconds is not None else None
    except ValueError:
        return None


def api_error(err: ApiException, doing: str) -> ApplicationError:
    """Map an API error to what a retry can or cannot fix."""
    status = _status_of(err)
    message = status.get("message") or err.reason or "no message"
    text = f"{doing}: {err.status} {status.get('reason') or err.reason}: {message}"
    if err.status in (400, 403, 405, 415, 422):
        return ApplicationError(text, type="KubernetesRejected", non_retryable=True)
    delay = _retry_after(err)
    return ApplicationError(
        text,
        type="KubernetesUnavailable",
        next_retry_delay=timedelta(seconds=delay) if delay else None,
    )


async def _call(doing: str, coro):
    """Await an API call, mapping transport and API errors for the retry policy."""
    try:
        return await coro
    except ApiException as err:
        raise api_error(err, doing) from err
    except (aiohttp.ClientError, asyncio.TimeoutError) as err:
        raise ApplicationError(f"{doing}: connection failed: {err!r}", type="KubernetesUnavailable") from err


async def _read(doing: str, coro):
    """Like `_call`, for a read where NotFound is an answer: it returns None."""
    try:
        return await _call(doing, coro)
    except ApplicationError as err:
        if isinstance(err.__cause__, ApiException) and err.__cause__.status == 404:
            return None
        raise


# ---------------------------------------------------------------- pod filters (kubectl drain)


def _controller(pod: k8s.V1Pod) -> k8s.V1OwnerReference | None:
    for ref in pod.metadata.owner_references or []:
        if ref.controller:
            return ref
    return None


def _finished(pod: k8s.V1Pod) -> bool:
    return bool(pod.status and pod.status.phase in ("Succeeded", "Failed"))


def _ref(pod: k8s.V1Pod) -> PodRef:
    return PodRef(namespace=pod.metadata.namespace, name=pod.metadata.name, uid=pod.metadata.uid)


# ---------------------------------------------------------------- activities


class KubeActivities:
    def __init__(self, connector: ClusterConnector) -> None:
        self._clusters = connector

    def activities(self) -> list[Callable]:
        return [
            self.inspect_node,
            self.cordon_node,
            self.uncordon_node,
            self.list_unfinished_pods,
            self.plan_drain,
            self.evict_pod,
            self.wait_pods_gone,
        ]

    async def _read_node(self, cluster: str, node: str) -> k8s.V1Node:
        core = await self._clusters.core(cluster)
        found = await _read(f"reading node {node}", core.read_node(node, _request_timeout=_REQUEST_TIMEOUT))
        if found is None:
            raise ApplicationError(
                f"node {node!r} not found in cluster {cluster!r}", type="NodeNotFound", non_retryable=True
            )
        return found

    @activity.defn
    async def inspect_node(self, ref: NodeRef) -> NodeInfo:
        """Read a node: its cordon, who holds it, readiness and boot ID."""
        node = await self._read_node(ref.cluster, ref.node)
        ready = any(c.type == "Ready" and c.status == "True" for c in (node.status.conditions or []))
        return NodeInfo(
            name=node.metadata.name,
            unschedulable=bool(node.spec.unschedulable),
            cordoned_by=(node.metadata.annotations or {}).get(CORDONED_BY),
            ready=ready,
            boot_id=node.status.node_info.boot_id if node.status and node.status.node_info else None,
        )

    @activity.defn
    async def cordon_node(self, req: CordonRequest) -> CordonResult:
        """Mark the node unschedulable and record who did it and why.

        A node already cordoned by someone else is left as it is and reported, so the
        caller never removes that cordon later.
        """
        node = await self._read_node(req.cluster, req.node)
        holder = (node.metadata.annotations or {}).get(CORDONED_BY)
        if node.spec.unschedulable:
            if holder == req.owner:
                return CordonResult(owned=True)
            return CordonResult(owned=False, holder=holder or "unknown")
        core = await self._clusters.core(req.cluster)
        patch = {
            # resourceVersion makes the patch conditional: if the node changed since we
            # read it (someone cordoned it meanwhile), the 409 sends us round again.
            "metadata": {
                "resourceVersion": node.metadata.resource_version,
                "annotations": {CORDONED_BY: req.owner, CORDON_REASON: req.reason[:1024]},
            },
            "spec": {"unschedulable": True},
        }
        await _call(f"cordoning node {req.node}", core.patch_node(req.node, patch, _request_timeout=_REQUEST_TIMEOUT))
        activity.logger.info("cordoned node %s for %s", req.node, req.owner)
        return CordonResult(owned=True)

    @activity.defn
    async def uncordon_node(self, req: CordonRequest) -> UncordonResult:
        """Remove our own cordon; never one that someone else placed."""
        node = await self._read_node(req.cluster, req.node)
        annotations = node.metadata.annotations or {}
        holder = annotations.get(CORDONED_BY)
        if holder != req.owner:
            if node.spec.unschedulable:
                return UncordonResult(uncordoned=False, note=f"cordon held by {holder or 'someone else'}; left in place")
            return UncordonResult(uncordoned=False, note="node was already schedulable")
        core = await self._clusters.core(req.cluster)
        patch = {
            "metadata": {
                "resourceVersion": node.metadata.resource_version,
                "annotations": {CORDONED_BY: None, CORDON_REASON: None},
            },
            "spec": {"unschedulable": False},
        }
        await _call(f"uncordoning node {req.node}", core.patch_node(req.node, patch, _request_timeout=_REQUEST_TIMEOUT))
        activity.logger.info("uncordoned node %s for %s", req.node, req.owner)
        return UncordonResult(uncordoned=True, note="cordon removed")

    async def _pods_on_node(self, cluster: str, node: str, label_selector: str | None) -> list[k8s.V1Pod]:
        core = await self._clusters.core(cluster)
        pods: list[k8s.V1Pod] = []
        token = None
        while True:
            page = await _call(
                f"listing pods on node {node}",
                core.list_pod_for_all_namespaces(
                    field_selector=f"spec.nodeName={node}",
                    label_selector=label_selector or None,
                    limit=_LIST_CHUNK,
                    _continue=token,
                    _request_timeout=_REQUEST_TIMEOUT,
                ),
            )
            pods.extend(page.items)
            token = page.metadata._continue if page.metadata else None
            if not token:
                return pods

    @activity.defn
    async def list_unfinished_pods(self, query: PodQuery) -> list[PodRef]:
        """Pods on the node matching the selector that have not finished yet."""
        pods = await self._pods_on_node(query.cluster, query.node, query.label_selector)
        return [_ref(p) for p in pods if not _finished(p)]

    async def _daemonset_exists(self, cluster: str, namespace: str, name: str) -> bool:
        apps = k8s.AppsV1Api(await self._clusters.api(cluster))
        found = await _read(
            f"reading DaemonSet {namespace}/{name}",
            apps.read_namespaced_daemon_set(name, namespace, _request_timeout=_REQUEST_TIMEOUT),
        )
        return found is not None

    @activity.defn
    async def plan_drain(self, req: DrainPlanRequest) -> DrainPlan:
        """List the node's pods and filter them exactly as `kubectl drain` does.

        Any pod that blocks the drain fails the plan before a single eviction, naming
        every such pod and the setting that would allow it.
        """
        settings = req.settings
        pods = await self._pods_on_node(req.cluster, req.node, settings.pod_selector)
        plan = DrainPlan()
        errors: dict[str, list[str]] = {}
        for pod in pods:
            ref, finished = _ref(pod), _finished(pod)
            annotations = pod.metadata.annotations or {}
            if "kubernetes.io/config.mirror" in annotations:
                plan.skipped.append(SkippedPod(pod=ref, reason="mirror pod"))
                continue
            owner = _controller(pod)
            if owner is not None and owner.kind == "DaemonSet" and not finished:
                if not await self._daemonset_exists(req.cluster, ref.namespace, owner.name):
                    if not settings.force:
                        errors.setdefault("pods whose DaemonSet is gone (use force to override)", []).append(str(ref))
                        continue
                elif settings.ignore_daemonsets:
                    plan.skipped.append(SkippedPod(pod=ref, reason="DaemonSet-managed"))
                    continue
                else:
                    errors.setdefault("DaemonSet-managed Pods (use ignore_daemonsets to ignore)", []).append(str(ref))
                    continue
            if not finished and any(v.empty_dir is not None for v in (pod.spec.volumes or [])):
                if not settings.delete_emptydir_data:
                    errors.setdefault("Pods with local storage (use delete_emptydir_data to override)", []).append(
                        str(ref)
                    )
                    continue
            if owner is None and not finished and not settings.force:
                errors.setdefault("Pods that declare no controller (use force to override)", []).append(str(ref))
                continue
            plan.evict.append(ref)
        if errors:
            detail = "; ".join(f"cannot delete {what}: {', '.join(names)}" for what, names in errors.items())
            raise ApplicationError(f"drain of node {req.node} blocked: {detail}", type="DrainBlocked", non_retryable=True)
        return plan

    @staticmethod
    async def _read_pod(core: k8s.CoreV1Api, pod_ref: PodRef) -> k8s.V1Pod | None:
        return await _read(
            f"reading pod {pod_ref}",
            core.read_namespaced_pod(pod_ref.name, pod_ref.namespace, _request_timeout=_REQUEST_TIMEOUT),
        )

    @activity.defn
    async def evict_pod(self, req: EvictRequest) -> EvictOutcome:
        """Ask the eviction API to evict one pod; a PDB refusal is an outcome, not an error.

        The pod is read first: one already gone, replaced (new UID) or terminating is not
        evicted again, so a retry after a crash never sends a second eviction.
        """
        core = await self._clusters.core(req.cluster)
        pod_ref = req.pod
        pod = await self._read_pod(core, pod_ref)
        if pod is None:
            return EvictOutcome(status="gone", message="pod no longer exists")
        if pod.metadata.uid != pod_ref.uid:
            return EvictOutcome(status="gone", message="pod was replaced by a new one of the same name")
        if pod.metadata.deletion_timestamp is not None:
            return EvictOutcome(status="evicted", message="pod is already terminating")
        delete_options = k8s.V1DeleteOptions(
            grace_period_seconds=req.grace_period_seconds,
            preconditions=k8s.V1Preconditions(uid=pod_ref.uid),
        )
        body = k8s.V1Eviction(
            api_version="policy/v1",
            kind="Eviction",
            metadata=k8s.V1ObjectMeta(name=pod_ref.name, namespace=pod_ref.namespace),
            delete_options=delete_options,
        )
        try:
            await core.create_namespaced_pod_eviction(
                pod_ref.name, pod_ref.namespace, body, _request_timeout=_REQUEST_TIMEOUT
            )
        except ApiException as err:
            status = _status_of(err)
            message = status.get("message") or err.reason or ""
            if err.status == 404:
                return EvictOutcome(status="gone", message="pod no longer exists")
            if err.status == 409 and status.get("reason") == "Conflict":
                # The UID precondition failed: the pod we planned to evict is gone.
                return EvictOutcome(status="gone", message="pod was replaced by a new one of the same name")
            if err.status == 429:
                # A StatusCause's type is serialized as "reason".
                causes = (status.get("details") or {}).get("causes") or []
                budget_cause = next((c for c in causes if c.get("reason") == "DisruptionBudget"), None)
                budget = None
                if budget_cause:
                    m = re.search(r"disruption budget (\S+)", budget_cause.get("message", ""))
                    budget = f"{pod_ref.namespace}/{m.group(1)}" if m else None
                    message = f"{message} {budget_cause.get('message', '')}".strip()
                return EvictOutcome(
                    status="blocked", message=message, budget=budget, retry_after_seconds=_retry_after(err)
                )
            if err.status == 403 and any(
                c.get("reason") == "NamespaceTerminating" for c in (status.get("details") or {}).get("causes") or []
            ):
                return EvictOutcome(status="blocked", message=message)
            if err.status == 500 and "more than one PodDisruptionBudget" in message:
                raise ApplicationError(
                    f"cannot evict {pod_ref}: {message}", type="MultiplePodDisruptionBudgets", non_retryable=True
                ) from err
            raise api_error(err, f"evicting pod {pod_ref}") from err
        except (aiohttp.ClientError, asyncio.TimeoutError) as err:
            raise ApplicationError(f"evicting pod {pod_ref}: connection failed: {err!r}", type="KubernetesUnavailable") from err
        activity.logger.info("evicted pod %s", pod_ref)
        return EvictOutcome(status="evicted")

    @activity.defn
    async def wait_pods_gone(self, req: WaitPodsGoneRequest) -> int:
        """Wait until every pod is deleted or replaced (a new UID), as kubectl drain waits.

        Heartbeats the number still terminating; the workflow bounds it with the drain timeout.
        """
        core = await self._clusters.core(req.cluster)
        remaining = list(req.pods)
        while True:
            still = []
            for pod_ref in remaining:
                pod = await self._read_pod(core, pod_ref)
                if pod is not None and pod.metadata.uid == pod_ref.uid:
                    still.append(pod_ref)
            remaining = still
            activity.heartbeat(len(remaining))
            if not remaining:
                return len(req.pods)
            await asyncio.sleep(req.poll_interval_seconds)
