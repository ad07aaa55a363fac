"""Kubernetes activities: cordon, drain through the eviction API, uncordon; and for rollouts:
paged node listing, node rollout state, package Jobs per stage (NodeWright's execution
substrate), reboot verification by boot ID, node-condition gates, and a node's whole update in
three calls (start: state, cordon, drain plan; its stages' Jobs; finish: packages, state, uncordon).

Every activity is idempotent: it reads the live object first and decides from what
it finds, so a retry after a crash at any line neither repeats a write nor undoes
someone else's. Errors a retry cannot fix are raised as non-retryable
`ApplicationError`s with a `type`; everything else (5xx, 409 conflicts, 429 rate
limits, dropped connections) is raised as is and left to the workflow's retry policy.
The client's own retries are off: Temporal owns retrying, so every attempt is visible.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import os
import re
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Literal

import aiohttp
import yaml
from kubernetes.aio import client as k8s
from kubernetes.aio import config as k8s_config
from kubernetes.aio.client.exceptions import ApiException
from pydantic import Field, field_validator
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities import node_marks as marks
from activities.models import StrictModel
from activities.semver import is_downgrade
from activities.selectors import SelectorError, parse_label_selector
from activities.tls import TlsFix, verification_failed

# Where Millwright records on a node that it placed the cordon, so it never
# removes a cordon placed by someone else.
CORDONED_BY = "millwright.dev/cordoned-by"
CORDON_REASON = "millwright.dev/cordon-reason"

# Node metadata Millwright writes during a rollout (NodeWright §6.2 keeps the same facts under its prefix).
ROLLOUT_STATE_LABEL = "millwright.dev/rollout-state"  # waiting|in_progress|complete|erroring|blocked|skipped
ROLLOUT_ANNOTATION = "millwright.dev/rollout"  # JSON {"rollout", "state", "package", "stage", "reason", "updated"}
PACKAGES_ANNOTATION = "millwright.dev/packages"  # JSON {"<package>": "<version>"}, installed and complete
ROLLOUT_STATES = ("waiting", "in_progress", "complete", "erroring", "blocked", "skipped")
NON_INTERRUPTIBLE_RUNNING = "non-interruptible pods running"

# Package Jobs (one per rollout, node, package, stage and activity execution).
JOB_NAMESPACE = "millwright-system"
JOB_TTL_SECONDS = 600  # ttlSecondsAfterFinished: finished Jobs (and their pods' logs) stay this long
JOB_POLL_SECONDS = 5.0  # the longest wait between two looks at a running Job
BEAT_SECONDS = 2.0  # a node's stages heartbeat at least this often, and at once when where they stand changes
JOB_WAIT_SLACK_SECONDS = 60.0  # how long past activeDeadlineSeconds the activity still waits for a verdict
JOB_NODE_LABEL = "millwright.dev/node"
JOB_PACKAGE_LABEL = "millwright.dev/package"
JOB_STAGE_LABEL = "millwright.dev/stage"
JOB_ROLLOUT_LABEL = "millwright.dev/rollout"  # a hash of the rollout id (label values are at most 63 chars)
JOB_INTERRUPT_LABEL = "millwright.dev/interrupt"
JOB_ROLLOUT_ANNOTATION = "millwright.dev/rollout-id"
JOB_VERSION_ANNOTATION = "millwright.dev/version"
JOB_ATTEMPT_ANNOTATION = "millwright.dev/attempt"
JOB_TRY_ANNOTATION = "millwright.dev/try"
STAGES = ("apply", "upgrade", "config", "interrupt", "post-interrupt", "uninstall", "uninstall-interrupt")
INTERRUPTS = ("reboot", "service", "restartAllServices", "noop")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_VIOLATIONS_MAX = 50  # check_node_conditions reports at most this many, then a count

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


class DrainSettings(StrictModel):
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


class NodeRef(StrictModel):
    cluster: str
    node: str


class NodeInfo(StrictModel):
    name: str
    unschedulable: bool
    cordoned_by: str | None = None
    ready: bool
    boot_id: str | None = None
    packages: dict[str, str] = Field(default_factory=dict, description="From the packages annotation.")
    rollout_state: str | None = Field(None, description="The rollout-state label.")


class CordonRequest(StrictModel):
    cluster: str
    node: str
    owner: str = Field(description="Who holds the cordon: the workflow ID.")
    reason: str = ""


class CordonResult(StrictModel):
    owned: bool = Field(description="True when this owner placed (or already held) the cordon.")
    holder: str | None = Field(None, description="Who placed the cordon when it is not ours ('unknown' if unmarked).")


class UncordonResult(StrictModel):
    uncordoned: bool
    note: str


class PodRef(StrictModel):
    namespace: str
    name: str
    uid: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


class PodQuery(StrictModel):
    cluster: str
    node: str
    label_selector: str


class DrainPlanRequest(StrictModel):
    cluster: str
    node: str
    settings: DrainSettings


class SkippedPod(StrictModel):
    pod: PodRef
    reason: str


class DrainPlan(StrictModel):
    evict: list[PodRef] = Field(default_factory=list)
    skipped: list[SkippedPod] = Field(default_factory=list)


class EvictRequest(StrictModel):
    cluster: str
    pod: PodRef
    grace_period_seconds: int | None = None
    node: str = Field("", description="The node drained: its DrainBlocked condition True while the eviction is refused.")
    was_blocked: bool = Field(False, description="An earlier eviction of the pod was refused: once this one is "
                                                 "accepted, DrainBlocked goes False if it still names the pod.")


class EvictOutcome(StrictModel):
    status: Literal["evicted", "gone", "blocked"]
    message: str = ""
    budget: str | None = Field(None, description="The PodDisruptionBudget blocking the eviction, when known.")
    retry_after_seconds: float | None = None


class WaitPodsGoneRequest(StrictModel):
    cluster: str
    pods: list[PodRef]
    poll_interval_seconds: float = 1.0
    node: str = Field("", description="The node drained: DrainBlocked while a pod outlives its grace period, "
                                      "cleared once all are gone.")  # fmt: skip
    not_leaving_after_seconds: float = Field(30.0, ge=0, description="How long past its grace period a terminating "
                                             "pod may stay before the drain shows as blocked.")  # fmt: skip
    was_blocked: bool = Field(False, description="The drain was shown blocked: DrainBlocked goes False once all "
                                                 "the pods are gone.")  # fmt: skip


class NodePageRequest(StrictModel):
    cluster: str
    label_selector: str = ""
    label_keys: list[str] = Field(default_factory=list, description="Labels to return; empty returns all.")
    limit: int = Field(1000, ge=1)
    continue_token: str | None = None

    _selector = field_validator("label_selector")(validate_label_selector)


class NodeSummary(StrictModel):
    name: str
    labels: dict[str, str]
    unschedulable: bool
    ready: bool
    created: str | None = Field(None, description="metadata.creationTimestamp (RFC 3339, UTC): a rollout's stable order.")


class NodePage(StrictModel):
    nodes: list[NodeSummary]
    continue_token: str | None = None


class UnavailableRequest(StrictModel):
    cluster: str
    label_selector: str = ""

    _selector = field_validator("label_selector")(validate_label_selector)


class NodeAvailability(StrictModel):
    total: int = Field(description="Nodes the selector matches.")
    unavailable: dict[str, str] = Field(
        default_factory=dict, description="Node -> why it is out of service: 'cordoned' and/or 'NotReady', name order."
    )


class NodeRolloutState(StrictModel):
    cluster: str
    node: str
    rollout: str
    state: str
    package: str | None = None
    stage: str | None = None
    reason: str = ""


class PackageInstalled(StrictModel):
    cluster: str
    node: str
    package: str
    version: str


class NodeStage(StrictModel):
    """One stage of one package, as its Job runs it."""

    package: str
    version: str
    image: str = Field(description="Image without tag; the Job runs f'{image}:{version}'.")
    stage: str = Field(description="apply|upgrade|config|interrupt|post-interrupt")
    interrupt: str | None = Field(None, description="For stage interrupt: reboot|service|restartAllServices|noop.")
    services: list[str] = Field(default_factory=list)
    config: dict[str, str] = Field(default_factory=dict, description="The package's configMap, given to the Job.")
    timeout_seconds: float = Field(3600, gt=0, description="Job activeDeadlineSeconds, and how long to wait.")


class StageJobRequest(NodeStage):
    cluster: str
    node: str
    rollout: str = Field(description="The rollout workflow id: in the Job's name hash and labels.")
    ordinal: int = Field(0, description="The node's order in the rollout (MILLWRIGHT_NODE_ORDER).")
    try_number: int = Field(1, ge=1, description="The workflow's own try of this stage (a new try: a new Job).")


class StageJobResult(StrictModel):
    job: str
    succeeded: bool
    message: str = ""
    attempt: int


class RebootWait(StrictModel):
    cluster: str
    node: str
    previous_boot_id: str
    timeout_seconds: float = 1800
    poll_seconds: float = 2.0


class StageRecord(StrictModel):
    """One stage of a package run on a node: its verdict after the tries it took."""

    package: str
    stage: str
    succeeded: bool
    attempts: int
    message: str = ""


class NodeUpdateStart(StrictModel):
    cluster: str
    node: str
    rollout: str = Field(description="The rollout's workflow ID: owner of the cordon, named in the node's state.")
    cordon: bool = Field(description="Take the node out of service first (an interrupt is due): cordon, plan the drain.")
    non_interrupt_selector: str | None = Field(
        None, description="Pods that must finish before the node is cordoned; while one runs, the node is blocked."
    )
    drain: DrainSettings | None = Field(None, description="How the drain is planned (with cordon).")
    packages: dict[str, str] = Field(default_factory=dict, description="Package -> version the rollout installs: "
                                     "a node with a later version installed is refused, untouched.")  # fmt: skip
    allow_downgrade: bool = Field(False, description="Install `packages` over later versions.")
    auto_taint: bool = Field(False, description="Give a new node (no Millwright annotation) the runtime-required "
                                                "taint first, so it takes no work until its packages are complete.")

    _selector = field_validator("non_interrupt_selector")(validate_label_selector)


class NodeUpdateStarted(StrictModel):
    node: NodeInfo = Field(description="The node as the update found it: its packages and boot ID.")
    blocked: str = Field("", description="Why the node was left in service (non-interruptible pods run); empty: "
                                         "started.")  # fmt: skip
    cordon: CordonResult | None = Field(None, description="With cordon: whose cordon the node has.")
    drain: DrainPlan | None = Field(None, description="With cordon: the pods to evict, listed after the cordon.")
    refused: str = Field("", description="Why the node was left untouched but `erroring` (a downgrade not allowed).")


class NodeStages(StrictModel):
    """Stages to run on one node, in order, each as its Job (NodeWright's node sequence after the drain)."""

    cluster: str
    node: str
    rollout: str
    ordinal: int = 0
    stages: list[NodeStage] = Field(min_length=1)
    tries: int = Field(1, ge=1, description="Jobs a stage may take: a failed one is tried again, as a new Job.")
    boot_id: str = Field("", description="The node's boot ID before the stages: a reboot must change it.")
    reboot_timeout_seconds: float = Field(1800, gt=0, description="How long a rebooted node may take to be back.")
    reboot_poll_seconds: float = 2.0


class NodeStagesResult(StrictModel):
    stages: list[StageRecord] = Field(description="The stages run, in order; a failed one is the last.")
    held: bool = Field(False, description="It stopped before the next stage because its workflow asked (a pause).")
    reboot_seconds: float | None = Field(None, description="From the reboot Job's start to the node back, new boot ID.")


class NodeUpdateFinish(StrictModel):
    cluster: str
    node: str
    rollout: str
    packages: dict[str, str] = Field(default_factory=dict, description="Package -> version now installed.")
    removed: list[str] = Field(default_factory=list, description="Packages uninstalled: their entries go.")
    uncordon: bool = Field(description="Remove the rollout's own cordon (never one someone else placed).")
    untaint: bool = Field(False, description="Remove the runtime-required taint: the node's packages are complete.")


class ConditionGate(StrictModel):
    cluster: str
    label_selector: str = ""
    conditions: list[str] = Field(description="Node condition types that must not be True; 'Ready' must be True.")

    _selector = field_validator("label_selector")(validate_label_selector)



# ---------------------------------------------------------------- cluster access


# A workload cluster created through Cluster API: `<management context>:<namespace>/<cluster name>`.
WORKLOAD_REF = re.compile(r"(?P<context>[^:/]+):(?P<namespace>[a-z0-9-]+)/(?P<name>[a-z0-9.-]+)")


class ClusterApiClient(k8s.ApiClient):
    """One cluster's API client. A certificate the kubeconfig's CA does not vouch for, or one issued for another
    name, is a non-retryable TlsVerificationFailed naming the kubeconfig setting that fixes it (activities/tls.py),
    not a connection failure retried until the activity gives up."""

    def __init__(self, configuration: k8s.Configuration, cluster: str, fix: TlsFix) -> None:
        super().__init__(configuration=configuration)
        self.user_agent = USER_AGENT  # lets audit logs tell Millwright's calls apart
        self._where = f"the Kubernetes API of cluster {cluster} ({configuration.host})"
        self._trusting = ("verification off" if not configuration.verify_ssl else
                          "trusting the kubeconfig's certificate-authority" if configuration.ssl_ca_cert else
                          "trusting the system's CAs: the kubeconfig names no certificate-authority")  # fmt: skip
        self._fix = fix

    async def call_api(self, method, url, *args, **kwargs):
        try:
            return await super().call_api(method, url, *args, **kwargs)
        except aiohttp.ClientError as err:
            path = url.split("?", 1)[0].removeprefix(self.configuration.host)
            failure = verification_failed(err, f"{method} {path} on {self._where}", self._trusting, self._fix)
            if failure is None:
                raise
            raise failure from None


class ClusterConnector:
    """Resolves a cluster reference (a kubeconfig context name) to an API client.

    Credentials stay in the kubeconfig files on the worker: workflow inputs and
    histories only ever carry the cluster's name. So does what the cluster's certificate
    is verified against: the kubeconfig cluster's certificate-authority(-data), or
    insecure-skip-tls-verify.
    """

    def __init__(self, kubeconfig_paths: list[str]) -> None:
        self._paths = [p for p in kubeconfig_paths if p]
        self._clients: dict[str, k8s.ApiClient] = {}
        self._workload: dict[str, tuple[str, k8s.ApiClient]] = {}  # ref -> (Secret uid/resourceVersion, client)
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
        workload = WORKLOAD_REF.fullmatch(cluster)
        if workload and cluster not in self._clients and cluster not in self._contexts():
            return await self._workload_api(cluster, workload)
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
                # aiohttp would read the proxy environment and ~/.netrc again for every request (trust_env, a thread
                # hop each): the environment's proxy for this API server (as kubectl honours it) is read once here.
                configuration.proxy = configuration.proxy or _env_proxy(configuration.host)
                configuration.client_session_kwargs = {"trust_env": False}
                entry = ((contexts[cluster]["contexts"][0].get("context") or {}).get("cluster")) or cluster
                files = os.pathsep.join(self._paths)
                self._clients[cluster] = ClusterApiClient(configuration, cluster, TlsFix(
                    ca=f"certificate-authority-data (or certificate-authority) on cluster {entry!r} in the kubeconfig "
                       f"({files})",
                    off=f"insecure-skip-tls-verify: true on cluster {entry!r} in the kubeconfig ({files})",
                ))  # fmt: skip
            return self._clients[cluster]

    async def _workload_api(self, cluster: str, ref: re.Match) -> k8s.ApiClient:
        """A workload cluster named `<context>:<namespace>/<name>`: its Cluster API kubeconfig Secret
        (`<name>-kubeconfig`, key `value`) on the management cluster `<context>`, read at each use (a
        recreated cluster gets a new client) and kept in memory only, never in a result or a history."""
        import base64

        context, namespace, name = ref["context"], ref["namespace"], ref["name"]
        secret = await _read(
            f"reading the kubeconfig of cluster {cluster}",
            (await self.core(context)).read_namespaced_secret(f"{name}-kubeconfig", namespace,
                                                              _request_timeout=_REQUEST_TIMEOUT),
        )
        if secret is None or "value" not in (secret.data or {}):
            raise ApplicationError(f"cluster {cluster}: no kubeconfig Secret {namespace}/{name}-kubeconfig yet",
                                   type="KubeconfigNotFound")
        stamp = f"{secret.metadata.uid}/{secret.metadata.resource_version}"
        async with self._lock:
            cached = self._workload.get(cluster)
            if cached and cached[0] == stamp:
                return cached[1]
            if cached:
                await cached[1].close()
            doc = yaml.safe_load(base64.b64decode(secret.data["value"]))
            configuration = type.__call__(k8s.Configuration)
            await k8s_config.load_kube_config_from_dict(doc, client_configuration=configuration)
            configuration.retries = None
            where = f"the kubeconfig Secret {namespace}/{name}-kubeconfig on {context}"
            api = ClusterApiClient(configuration, cluster, TlsFix(
                ca=f"certificate-authority-data in {where}", off=f"insecure-skip-tls-verify: true in {where}"))
            self._workload[cluster] = (stamp, api)
            return api

    async def core(self, cluster: str) -> k8s.CoreV1Api:
        return k8s.CoreV1Api(await self.api(cluster))

    async def close(self) -> None:
        for api in self._clients.values():
            await api.close()
        self._clients.clear()
        for _, api in self._workload.values():
            await api.close()
        self._workload.clear()


# ---------------------------------------------------------------- errors


# Waits look again soon (most Jobs, reboots and terminations end quickly), then less and
# less often, up to each wait's own ceiling.
FIRST_POLL_SECONDS = 0.25


def _next_poll(current: float, ceiling: float) -> float:
    return min(current * 1.5, ceiling)


def _status_of(err: ApiException) -> dict[str, Any]:
    try:
        status = json.loads(err.body or "{}")
    except (TypeError, ValueError):
        return {}
    return status if isinstance(status, dict) else {}


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
    return await _none_if_not_found(_call(doing, coro))


async def _none_if_not_found(call):
    try:
        return await call
    except ApplicationError as err:
        if isinstance(err.__cause__, ApiException) and _object_not_found(err.__cause__):
            return None
        raise


def _object_not_found(err: ApiException) -> bool:
    """A 404 that says the object is missing: a NotFound Status naming it. A 404 for the path (a proxy's,
    or a resource type the server does not serve: no name in its details) says nothing about the object,
    and is never read as "it is gone"."""
    status = _status_of(err)
    return err.status == 404 and status.get("reason") == "NotFound" and bool((status.get("details") or {}).get("name"))


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


# ---------------------------------------------------------------- eviction answers (kubectl drain)


def _eviction_refused(err: ApiException, pod_ref: PodRef) -> EvictOutcome | None:
    """An eviction answer that decides by itself: a refusal to wait out (blocked), or a non-retryable
    error raised here. None: the answer does not say what became of the pod (a fresh read must)."""
    status = _status_of(err)
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
        return EvictOutcome(status="blocked", message=message, budget=budget, retry_after_seconds=_retry_after(err))
    if err.status == 403 and any(c.get("reason") == "NamespaceTerminating" for c in causes):
        return EvictOutcome(status="blocked", message=message)  # until the namespace's deletion reaches the pod
    if err.status == 500 and "more than one PodDisruptionBudget" in message:
        raise ApplicationError(
            f"cannot evict {pod_ref}: {message}", type="MultiplePodDisruptionBudgets", non_retryable=True
        ) from err
    if err.status in (400, 403, 405, 415, 422):
        raise api_error(err, f"evicting pod {pod_ref}") from err
    return None


def _eviction_unsettled(err: ApiException, pod_ref: PodRef) -> ApplicationError | EvictOutcome:
    """What to report for an answer that left the pod as it was (the fresh read after it shows it still
    there): a 409 Conflict (the PodDisruptionBudget changed under the eviction, "the object has been
    modified", or a failed precondition) is blocked, tried again after the retry interval; the rest
    (404, 5xx, anything unexpected) a retryable error."""
    if err.status != 409:
        return api_error(err, f"evicting pod {pod_ref}")
    status = _status_of(err)
    details = status.get("details") or {}
    budget = details.get("name") if details.get("kind") == "poddisruptionbudgets" else None
    return EvictOutcome(status="blocked", budget=f"{pod_ref.namespace}/{budget}" if budget else None,
                        message=f"409 Conflict: {status.get('message') or err.reason}; the pod is still running")


# ---------------------------------------------------------------- rollout helpers


async def _call_json(doing: str, coro) -> dict[str, Any]:
    """Await a `*_without_preload_content` call and parse its JSON; errors mapped as `_call` does.

    Used for large lists: skipping the typed client's model building makes a 10,000-node
    listing several times cheaper.
    """
    try:
        resp = await coro  # the aiohttp response itself
        try:
            data = await resp.read()
        finally:
            resp.release()
    except (aiohttp.ClientError, asyncio.TimeoutError) as err:
        raise ApplicationError(f"{doing}: connection failed: {err!r}", type="KubernetesUnavailable") from err
    if not 200 <= resp.status <= 299:
        failure = ApiException(status=resp.status, reason=resp.reason, body=data.decode(errors="replace"))
        failure.headers = resp.headers
        raise api_error(failure, doing) from failure
    try:
        return json.loads(data)
    except ValueError as err:
        raise ApplicationError(f"{doing}: response is not JSON: {err}", type="KubernetesUnavailable") from err


async def _read_json(doing: str, coro) -> dict[str, Any] | None:
    """Like `_call_json`, for a read where NotFound is an answer: it returns None."""
    return await _none_if_not_found(_call_json(doing, coro))


def _node_ready(node: dict[str, Any]) -> bool:
    for c in (node.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Ready":
            return c.get("status") == "True"
    return False


def _summary(node: dict[str, Any], label_keys: list[str]) -> NodeSummary:
    labels = (node.get("metadata") or {}).get("labels") or {}
    if label_keys:
        labels = {k: labels[k] for k in label_keys if k in labels}
    return NodeSummary(
        name=node["metadata"]["name"],
        labels=labels,
        unschedulable=bool((node.get("spec") or {}).get("unschedulable")),
        ready=_node_ready(node),
        created=(node.get("metadata") or {}).get("creationTimestamp"),
    )


def _annotation(obj: Any, key: str) -> str | None:
    return (obj.metadata.annotations or {}).get(key)


def _packages_of(annotations: dict[str, str], node: str | None, strict: bool = True) -> dict[str, str]:
    raw = annotations.get(PACKAGES_ANNOTATION)
    if not raw:
        return {}
    try:
        value = json.loads(raw)
        if isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
            return value
    except ValueError:
        pass
    if not strict:
        return {}
    raise ApplicationError(
        f"node {node}: annotation {PACKAGES_ANNOTATION} is not a JSON object of package versions: {raw[:200]!r}; "
        "fix or remove it by hand",
        type="MalformedNodeAnnotation",
        non_retryable=True,
    )


def _is_reboot(stage: NodeStage) -> bool:
    return stage.stage in ("interrupt", "uninstall-interrupt") and stage.interrupt == "reboot"


def _downgrades(node: k8s.V1Node, name: str, wanted: dict[str, str]) -> str:
    """Why installing `wanted` on the node would downgrade a package; empty when it would not."""
    installed = _packages_of(node.metadata.annotations or {}, name, strict=False)
    down = [f"{p} {installed[p]} is installed, the rollout has {v}" for p, v in sorted(wanted.items())
            if p in installed and is_downgrade(installed[p], v)]  # fmt: skip
    if not down:
        return ""
    return f"downgrade refused: {'; '.join(down)} (set allowDowngrade: true to install it anyway)"


def _node_info(node: k8s.V1Node) -> NodeInfo:
    annotations = node.metadata.annotations or {}
    return NodeInfo(
        name=node.metadata.name,
        unschedulable=bool(node.spec.unschedulable),
        cordoned_by=annotations.get(CORDONED_BY),
        ready=any(c.type == "Ready" and c.status == "True" for c in (node.status.conditions or [])),
        boot_id=node.status.node_info.boot_id if node.status and node.status.node_info else None,
        packages=_packages_of(annotations, node.metadata.name, strict=False),
        rollout_state=(node.metadata.labels or {}).get(ROLLOUT_STATE_LABEL),
    )


def _rollout_record(node: k8s.V1Node) -> dict[str, Any]:
    try:
        have = json.loads((node.metadata.annotations or {}).get(ROLLOUT_ANNOTATION) or "{}")
    except ValueError:
        return {}
    return have if isinstance(have, dict) else {}


class _StateChange:
    """The label and annotation that record a rollout state on a node, and whether a node read back shows them."""

    def __init__(self, state: str, value: str) -> None:
        self.labels = {ROLLOUT_STATE_LABEL: state}
        self.annotations = {ROLLOUT_ANNOTATION: value}

    def shown_by(self, node: k8s.V1Node) -> bool:
        return self.shown_in(node.metadata.labels or {}, node.metadata.annotations or {})

    def shown_in(self, labels: dict[str, str], annotations: dict[str, str]) -> bool:
        return labels.get(ROLLOUT_STATE_LABEL) == self.labels[ROLLOUT_STATE_LABEL] and \
            annotations.get(ROLLOUT_ANNOTATION) == self.annotations[ROLLOUT_ANNOTATION]


def _state_record(req: NodeRolloutState) -> dict[str, Any]:
    if req.state not in ROLLOUT_STATES:
        raise ApplicationError(f"unknown rollout state {req.state!r}; one of {', '.join(ROLLOUT_STATES)}",
                               type="InvalidRolloutState", non_retryable=True)  # fmt: skip
    return {"rollout": req.rollout, "state": req.state, "package": req.package, "stage": req.stage,
            "reason": req.reason[:1024]}


def _state_change(node: k8s.V1Node | None, req: NodeRolloutState) -> _StateChange | None:
    """What records `req` on `node` (None: unread); None when the node says so already (the `updated` time aside)."""
    want = _state_record(req)
    if node is not None and (node.metadata.labels or {}).get(ROLLOUT_STATE_LABEL) == req.state and \
            {k: _rollout_record(node).get(k) for k in want} == want:  # fmt: skip
        return None
    return _StateChange(req.state, json.dumps({**want, "updated": _iso_now()}, separators=(",", ":")))


def _short_hash(*parts: object, n: int = 10) -> str:
    return hashlib.sha256("\x1f".join(str(p) for p in parts).encode()).hexdigest()[:n]


def label_value(value: str) -> str:
    """`value` when it is a valid label value, else a stable hash of it."""
    if len(value) <= 63 and _LABEL_VALUE.match(value):
        return value
    return "h-" + _short_hash(value, n=40)


def stage_job_name(package: str, stage: str, key: str) -> str:
    """`mw-<package>-<stage>-<10 hex>`, at most 63 characters and DNS-safe."""
    prefix = re.sub(r"[^a-z0-9-]+", "-", f"mw-{package}-{stage}".lower())[:52].rstrip("-")
    return f"{prefix}-{key}"


def _vanished(job: str) -> str:
    return (f"Job {JOB_NAMESPACE}/{job} disappeared (or was replaced) before its verdict was read: deleted by "
            f"someone, or by its TTL ({JOB_TTL_SECONDS}s after finishing); its stage may have run, and it is not "
            "created again under this try")


async def _send_json(api: k8s.ApiClient, method: str, path: str, body: dict[str, Any]):
    """A request with a plain JSON body, its answer unread (for `_call_json`): the typed methods would validate the
    body into the client's models and back (a Job: its spec, template and containers), costing more than the
    call. Authentication, headers, TLS and errors as theirs."""
    params = await api.param_serialize(method=method, resource_path=path, body=body, auth_settings=["BearerToken"],
                                       header_params={"Accept": "application/json",
                                                      "Content-Type": "application/json"})  # fmt: skip
    return (await api.call_api(*params, _preload_content=False, _request_timeout=_REQUEST_TIMEOUT)).response


def _env_proxy(url: str) -> str | None:
    """The proxy HTTPS_PROXY/HTTP_PROXY name for `url`, unless NO_PROXY exempts its host."""
    parts = urllib.parse.urlsplit(url)
    if urllib.request.proxy_bypass(parts.hostname or ""):
        return None
    return urllib.request.getproxies().get(parts.scheme)


def _reboot_unverifiable(node: str) -> ApplicationError:
    return ApplicationError(
        f"node {node}: no boot ID was recorded before the reboot, so a reboot cannot be told from no "
        "reboot (the node reports no status.nodeInfo.bootID)",
        type="RebootUnverifiable",
        non_retryable=True,
    )


def _iso_now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# ---------------------------------------------------------------- activities


class KubeActivities:
    def __init__(self, connector: ClusterConnector) -> None:
        self._clusters = connector
        self._job_namespaces: set[str] = set()  # clusters whose Job namespace this worker has seen

    def activities(self) -> list[Callable]:
        return [
            self.inspect_node,
            self.cordon_node,
            self.uncordon_node,
            self.list_unfinished_pods,
            self.plan_drain,
            self.evict_pod,
            self.wait_pods_gone,
            self.list_nodes_page,
            self.list_unavailable_nodes,
            self.node_availability,
            self.set_node_rollout_state,
            self.record_package_installed,
            self.run_stage_job,
            self.wait_node_rebooted,
            self.check_node_conditions,
            self.start_node_update,
            self.run_node_stages,
            self.finish_node_update,
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
        return _node_info(await self._read_node(ref.cluster, ref.node))

    @activity.defn
    async def cordon_node(self, req: CordonRequest) -> CordonResult:
        """Mark the node unschedulable and record who did it and why.

        A node already cordoned by someone else is left as it is and reported, so the
        caller never removes that cordon later.
        """
        return await self._cordon(req, await self._read_node(req.cluster, req.node))

    async def _cordon(self, req: CordonRequest, node: k8s.V1Node, state: NodeRolloutState | None = None) -> CordonResult:
        """Cordon `node` as read, recording `state` on it in the same write (or alone, when it is cordoned already)."""
        holder = (node.metadata.annotations or {}).get(CORDONED_BY)
        if node.spec.unschedulable:
            if state is not None:
                await self._record_state(node, state)
            if holder == req.owner:
                return CordonResult(owned=True)
            return CordonResult(owned=False, holder=holder or "unknown")
        # resourceVersion makes the patch conditional: if the node changed since we
        # read it (someone cordoned it meanwhile), the 409 sends us round again.
        metadata: dict[str, Any] = {"resourceVersion": node.metadata.resource_version,
                                    "annotations": {CORDONED_BY: req.owner, CORDON_REASON: req.reason[:1024]}}
        change = _state_change(node, state) if state is not None else None
        if change is not None:
            metadata["labels"] = change.labels
            metadata["annotations"].update(change.annotations)
        await self._patch_node(req.cluster, req.node, {"metadata": metadata, "spec": {"unschedulable": True}},
                               f"cordoning node {req.node}",
                               lambda n: bool(n.spec and n.spec.unschedulable) and _annotation(n, CORDONED_BY) == req.owner
                               and (change is None or change.shown_by(n)))  # fmt: skip
        activity.logger.info("cordoned node %s for %s", req.node, req.owner)
        if state is not None and change is not None:
            await self._state_event(node, state, "cordoned")
        return CordonResult(owned=True)

    @activity.defn
    async def uncordon_node(self, req: CordonRequest) -> UncordonResult:
        """Remove our own cordon; never one that someone else placed.

        An earlier attempt that sent the uncordon (its heartbeat says so) and lost the answer is
        reported as the uncordon it was, once a fresh read shows the node schedulable without our mark.
        """
        node = await self._read_node(req.cluster, req.node)
        annotations = node.metadata.annotations or {}
        holder = annotations.get(CORDONED_BY)
        if holder != req.owner:
            if node.spec.unschedulable:
                return UncordonResult(uncordoned=False, note=f"cordon held by {holder or 'someone else'}; left in place")
            details = activity.info().heartbeat_details
            if details and details[0] == {"uncordon_sent": req.owner} and holder is None:
                return UncordonResult(uncordoned=True, note="cordon removed (the answer was lost; read back)")
            return UncordonResult(uncordoned=False, note="node was already schedulable")
        patch = {
            "metadata": {
                "resourceVersion": node.metadata.resource_version,
                "annotations": {CORDONED_BY: None, CORDON_REASON: None},
            },
            "spec": {"unschedulable": False},
        }
        activity.heartbeat({"uncordon_sent": req.owner})
        await self._patch_node(req.cluster, req.node, patch, f"uncordoning node {req.node}",
                               lambda n: not (n.spec and n.spec.unschedulable) and _annotation(n, CORDONED_BY) is None)
        activity.logger.info("uncordoned node %s for %s", req.node, req.owner)
        return UncordonResult(uncordoned=True, note="cordon removed")

    async def _patch_node(self, cluster: str, node: str, patch: dict[str, Any], doing: str,
                          shows: Callable[[k8s.V1Node], bool]) -> None:
        """Patch a node and check the answer (the node as stored after the write) shows the change: a
        write is done only when the API server's own copy says so. An answer that does not (a lost
        write, a webhook that undid it) is a retryable error, and the retry reads the node first."""
        core = await self._clusters.core(cluster)
        stored = await _call(doing, core.patch_node(node, patch, _request_timeout=_REQUEST_TIMEOUT))
        if not isinstance(stored, k8s.V1Node) or stored.metadata is None or not shows(stored):
            raise ApplicationError(f"{doing}: the API server answered, but the node it returned does not show "
                                   "the change; reading it again", type="KubernetesUnavailable")

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
        return await self._plan_drain(req)

    async def _plan_drain(self, req: DrainPlanRequest) -> DrainPlan:
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

    async def _pod_state(self, core: k8s.CoreV1Api, pod_ref: PodRef) -> EvictOutcome | None:
        """What a fresh read says about the planned pod: gone (missing, or replaced by a new UID),
        already terminating, or None when it is still there and running."""
        pod = await self._read_pod(core, pod_ref)
        if pod is None:
            return EvictOutcome(status="gone", message="a fresh read finds no such pod")
        if pod.metadata.uid != pod_ref.uid:
            return EvictOutcome(status="gone", message="a fresh read finds a new pod of that name (new UID)")
        if pod.metadata.deletion_timestamp is not None:
            return EvictOutcome(status="evicted", message="pod is terminating")
        return None

    @activity.defn
    async def evict_pod(self, req: EvictRequest) -> EvictOutcome:
        """Ask the eviction API to evict one pod; a PDB refusal is an outcome, not an error.

        Only a fresh read of the pod ever says it is gone (missing, or a new UID): never the
        eviction's answer. The pod is read first, so a retry after a crash or a lost answer never
        sends a second eviction for a pod already terminating or gone. Every answer, as `kubectl
        drain` treats it (the table: docs/node-maintenance.md, "Draining a node"):
        2xx accepted (the drain then waits for the pod to go); 429 and 403 NamespaceTerminating
        blocked, tried again later; the more-than-one-budget 500 and 400/403/422 refused for good;
        anything else (404, 409, 5xx, a dropped connection: the eviction may or may not have
        happened) is settled by reading the pod again: gone or terminating as the read shows,
        otherwise still to evict (a 409 as blocked, the rest as a retryable error).

        With `node`, the node's DrainBlocked condition says so while this eviction is refused (and a Warning Event
        when it first is); with `was_blocked` too, it goes False once the eviction is accepted, if it still names
        this pod (a drain never blocked reads nothing more).
        """
        outcome = await self._evict(req)
        if req.node and (outcome.status == "blocked" or req.was_blocked):
            await self._show_drain_blocked(req, outcome)
        return outcome

    async def _evict(self, req: EvictRequest) -> EvictOutcome:
        core = await self._clusters.core(req.cluster)
        pod_ref = req.pod
        seen = await self._pod_state(core, pod_ref)
        if seen is not None:
            return seen
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
        doing = f"evicting pod {pod_ref}"
        try:
            await core.create_namespaced_pod_eviction(
                pod_ref.name, pod_ref.namespace, body, _request_timeout=_REQUEST_TIMEOUT
            )
        except ApiException as err:
            refused = _eviction_refused(err, pod_ref)
            if refused is not None:
                return refused
            unsettled: ApplicationError | EvictOutcome = _eviction_unsettled(err, pod_ref)
        except (aiohttp.ClientError, asyncio.TimeoutError) as err:
            unsettled = ApplicationError(f"{doing}: connection failed, the eviction may or may not have happened: "
                                         f"{err!r}", type="KubernetesUnavailable")
        else:
            activity.logger.info("evicted pod %s", pod_ref)
            return EvictOutcome(status="evicted")
        # The answer does not say what happened to the pod: a fresh read does.
        settled = await self._pod_state(core, pod_ref)
        if settled is not None:
            return settled
        if isinstance(unsettled, EvictOutcome):
            return unsettled
        raise unsettled

    @activity.defn
    async def wait_pods_gone(self, req: WaitPodsGoneRequest) -> int:
        """Wait until every pod is deleted or replaced (a new UID), as kubectl drain waits.

        Heartbeats the number still terminating; the workflow bounds it with the drain timeout. With `node`, a pod
        still there `not_leaving_after_seconds` past its deletion deadline (deletionTimestamp: the delete plus its
        grace period; a finalizer or a kubelet keeps it) shows the node's DrainBlocked, until all are gone (and one
        shown by the evictions, `was_blocked`, goes False then too).
        """
        core = await self._clusters.core(req.cluster)
        remaining, poll, stuck_shown = list(req.pods), FIRST_POLL_SECONDS, False
        while True:
            still, stuck = [], None
            for pod_ref in remaining:
                pod = await self._read_pod(core, pod_ref)
                if pod is not None and pod.metadata.uid == pod_ref.uid:
                    still.append(pod_ref)
                    due = pod.metadata.deletion_timestamp
                    if stuck is None and due is not None and \
                            (datetime.now(timezone.utc) - due).total_seconds() > req.not_leaving_after_seconds:
                        stuck = pod_ref
            remaining = still
            activity.heartbeat(len(remaining))
            if not remaining:
                if req.node and (req.was_blocked or stuck_shown):
                    await self._set_drain_blocked(req.cluster, req.node, False, "Drained", "every pod planned is gone")
                return len(req.pods)
            if req.node and stuck is not None and not stuck_shown:
                stuck_shown = True
                await self._set_drain_blocked(req.cluster, req.node, True, "PodNotTerminating",
                                              f"{stuck} outlived its termination grace period", event=True)
            await asyncio.sleep(poll)
            poll = _next_poll(poll, req.poll_interval_seconds)

    async def _show_drain_blocked(self, req: EvictRequest, outcome: EvictOutcome) -> None:
        if outcome.status == "blocked":
            why = f"eviction of {req.pod} refused" + (f" by PodDisruptionBudget {outcome.budget}" if outcome.budget
                                                        else "") + (f": {outcome.message}" if outcome.message else "")
            await self._set_drain_blocked(req.cluster, req.node, True, "PodDisruptionBudget" if outcome.budget
                                          else "EvictionRefused", why, event=True)  # fmt: skip
        else:
            await self._set_drain_blocked(req.cluster, req.node, False, "EvictionAccepted",
                                          f"eviction of {req.pod} accepted", naming=str(req.pod))  # fmt: skip

    async def _set_drain_blocked(self, cluster: str, node: str, blocked: bool, reason: str, message: str, *,
                                 event: bool = False, naming: str | None = None) -> None:  # fmt: skip
        """The node's DrainBlocked condition `blocked` (True) or not, written only when it changes; it is set False
        only where it is True, and with `naming` only when its message names that pod (another pod may still be
        refused). A status write, merged by condition type: the kubelet's conditions stay."""
        found = await self._read_node(cluster, node)
        previous = marks.condition(found.status.conditions or [], marks.DRAIN_BLOCKED)
        if not blocked:
            if previous is None or previous.status != "True" or (naming and naming not in (previous.message or "")):
                return
        elif previous is not None and previous.status == "True" and previous.message == message[:1024]:
            return
        core = await self._clusters.core(cluster)
        patch = marks.drain_blocked_patch(blocked, reason, message, previous)
        await _call(f"recording DrainBlocked on node {node}",
                    core.patch_node_status(node, patch, _request_timeout=_REQUEST_TIMEOUT))
        if event and (previous is None or previous.status != "True"):
            await marks.record_event(core, marks.event_body(node, found.metadata.uid, marks.DRAIN_BLOCKED, message,
                                                            warning=True, key=(message,)))  # fmt: skip

    # ------------------------------------------------------------ rollouts: nodes

    async def _node_page(self, cluster: str, label_selector: str, limit: int, token: str | None) -> dict[str, Any]:
        core = await self._clusters.core(cluster)
        return await _call_json(
            "listing nodes",
            core.list_node_without_preload_content(
                label_selector=label_selector or None,
                limit=limit,
                _continue=token,
                _request_timeout=_REQUEST_TIMEOUT,
            ),
        )

    @activity.defn
    async def list_nodes_page(self, req: NodePageRequest) -> NodePage:
        """One page of the node list (limit/continue), summarised, for fleets of 10,000+ nodes."""
        page = await self._node_page(req.cluster, req.label_selector, req.limit, req.continue_token)
        return NodePage(
            nodes=[_summary(n, req.label_keys) for n in page.get("items") or []],
            continue_token=(page.get("metadata") or {}).get("continue") or None,
        )

    @activity.defn
    async def list_unavailable_nodes(self, req: UnavailableRequest) -> list[str]:
        """Targeted nodes that are cordoned (by anyone) or not Ready, in name order."""
        return list((await self.node_availability(req)).unavailable)

    @activity.defn
    async def node_availability(self, req: UnavailableRequest) -> NodeAvailability:
        """How many nodes the selector matches, and which are out of service (cordoned by anyone, or
        not Ready) and why; read page by page, returning only the unavailable ones by name."""
        out = NodeAvailability(total=0)
        token = None
        while True:
            page = await self._node_page(req.cluster, req.label_selector, _LIST_CHUNK, token)
            for n in page.get("items") or []:
                out.total += 1
                why = [w for w, down in (("cordoned", (n.get("spec") or {}).get("unschedulable")),
                                         ("NotReady", not _node_ready(n))) if down]  # fmt: skip
                if why:
                    out.unavailable[n["metadata"]["name"]] = ", ".join(why)
            if not activity.info().is_local:  # the disruption budget reads it as a local activity
                activity.heartbeat(len(out.unavailable))
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return out

    @activity.defn
    async def set_node_rollout_state(self, req: NodeRolloutState) -> None:
        """Record the node's rollout state: a label (for selectors) and an annotation (the detail).

        Writes nothing when both already say the same (the `updated` time aside).
        """
        await self._record_state(await self._read_node(req.cluster, req.node), req)

    async def _record_state(self, node: k8s.V1Node, req: NodeRolloutState) -> None:
        change = _state_change(node, req)
        if change is not None:
            await self._patch_node(req.cluster, req.node, {"metadata": {"labels": change.labels,
                                                                        "annotations": change.annotations}},
                                   f"recording rollout state of node {req.node}", change.shown_by)  # fmt: skip
            await self._state_event(node, req)

    async def _state_event(self, node: k8s.V1Node, state: NodeRolloutState, *done: str) -> None:
        """The Event of a node's state change (NodeWright's reason `State`), with what the same write did."""
        where = f" at {state.package} {state.stage}" if state.stage else ""
        message = f"{state.state}{where} (rollout {state.rollout})" + "".join(f"; {d}" for d in done) + \
            (f": {state.reason}" if state.reason else "")
        await marks.record_event(await self._clusters.core(state.cluster), marks.event_body(
            state.node, node.metadata.uid, "State", message, warning=state.state in ("erroring", "blocked"),
            key=(state.state, state.stage, state.package)))  # fmt: skip

    @activity.defn
    async def record_package_installed(self, req: PackageInstalled) -> None:
        """Add `package: version` to the node's packages annotation (conditional on the node's
        resourceVersion, so a concurrent writer's entry is never lost: its 409 is retried)."""
        node = await self._read_node(req.cluster, req.node)
        packages = _packages_of(node.metadata.annotations or {}, req.node)
        if packages.get(req.package) == req.version:
            return
        packages[req.package] = req.version
        value = json.dumps(dict(sorted(packages.items())), separators=(",", ":"))
        patch = {"metadata": {"resourceVersion": node.metadata.resource_version,
                              "annotations": {PACKAGES_ANNOTATION: value}}}
        await self._patch_node(req.cluster, req.node, patch,
                               f"recording package {req.package} {req.version} on node {req.node}",
                               lambda n: _annotation(n, PACKAGES_ANNOTATION) == value)

    # ------------------------------------------------------------ rollouts: package Jobs

    async def _ensure_namespace(self, cluster: str) -> None:
        core = await self._clusters.core(cluster)
        if await _read(f"reading namespace {JOB_NAMESPACE}", core.read_namespace(JOB_NAMESPACE,
                                                                                  _request_timeout=_REQUEST_TIMEOUT)):
            return
        body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": JOB_NAMESPACE,
                                                                     "labels": {"app.kubernetes.io/managed-by": "millwright"}}}
        try:
            await core.create_namespace(body, _request_timeout=_REQUEST_TIMEOUT)  # type: ignore[arg-type]  # a dict body is sent as it is
        except ApiException as err:
            if err.status != 409:
                raise api_error(err, f"creating namespace {JOB_NAMESPACE}") from err
        except (aiohttp.ClientError, asyncio.TimeoutError) as err:
            raise ApplicationError(f"creating namespace {JOB_NAMESPACE}: connection failed: {err!r}",
                                   type="KubernetesUnavailable") from err

    @staticmethod
    def _stage_job(req: StageJobRequest, name: str, attempt: int) -> dict[str, Any]:
        interrupt = req.stage in ("interrupt", "uninstall-interrupt")
        labels = {
            JOB_NODE_LABEL: label_value(req.node),
            JOB_PACKAGE_LABEL: label_value(req.package),
            JOB_STAGE_LABEL: label_value(req.stage),
            JOB_ROLLOUT_LABEL: _short_hash(req.rollout, n=16),
            "app.kubernetes.io/managed-by": "millwright",
        }
        if interrupt:
            labels[JOB_INTERRUPT_LABEL] = label_value(req.interrupt or "noop")
        annotations = {JOB_ROLLOUT_ANNOTATION: req.rollout, JOB_VERSION_ANNOTATION: req.version,
                       JOB_ATTEMPT_ANNOTATION: str(attempt), JOB_TRY_ANNOTATION: str(req.try_number)}
        image = f"{req.image}:{req.version}"
        env = [
            {"name": "MILLWRIGHT_STAGE", "value": req.stage},
            {"name": "MILLWRIGHT_PACKAGE", "value": req.package},
            {"name": "MILLWRIGHT_VERSION", "value": req.version},
            {"name": "MILLWRIGHT_NODE", "value": req.node},
            {"name": "MILLWRIGHT_NODE_ORDER", "value": str(req.ordinal)},
            {"name": "MILLWRIGHT_SERVICES", "value": ",".join(req.services)},
        ]
        if interrupt:
            env.append({"name": "MILLWRIGHT_INTERRUPT", "value": req.interrupt or "noop"})

        def container(cname: str, step: str) -> dict[str, Any]:
            c: dict[str, Any] = {
                "name": cname,
                "image": image,
                "args": [step],
                "env": env,
                "securityContext": {"privileged": True},
                "volumeMounts": [{"name": "host-root", "mountPath": "/host"}],
            }
            if req.config:
                c["envFrom"] = [{"configMapRef": {"name": name}}]
            return c

        # NodeWright's order: the stage's work, then its check (not for interrupts); init containers run in order.
        if interrupt:
            init, main = [], [container(req.stage, req.stage)]
        else:
            init, main = [container(req.stage, req.stage)], [container(f"{req.stage}-check", f"{req.stage}-check")]
        pod_spec: dict[str, Any] = {
            "nodeName": req.node,
            "restartPolicy": "OnFailure" if interrupt else "Never",
            "hostPID": True,
            "hostNetwork": True,
            "priorityClassName": "system-node-critical",
            "tolerations": [
                {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"},
                {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
                {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"},
                {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoSchedule"},
                {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoSchedule"},
            ],
            "volumes": [{"name": "host-root", "hostPath": {"path": "/"}}],
            "containers": main,
        }
        if init:
            pod_spec["initContainers"] = init
        spec: dict[str, Any] = {
            "backoffLimit": 0,  # Temporal owns retries, visibly: a new attempt is a new Job
            "completions": 1,
            "parallelism": 1,
            "activeDeadlineSeconds": max(1, math.ceil(req.timeout_seconds)),
            "ttlSecondsAfterFinished": JOB_TTL_SECONDS,
            "template": {"metadata": {"labels": dict(labels), "annotations": dict(annotations)}, "spec": pod_spec},
        }
        if not interrupt:  # an eviction does not burn the (zero) backoff budget; needs restartPolicy Never
            spec["podFailurePolicy"] = {"rules": [{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}]}
        return {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": name, "namespace": JOB_NAMESPACE, "labels": labels, "annotations": annotations},
            "spec": spec,
        }

    @staticmethod
    def _same_job(existing: dict[str, Any], wanted: dict[str, Any]) -> bool:
        labels = existing["metadata"].get("labels") or {}
        annotations = existing["metadata"].get("annotations") or {}
        want_md = wanted["metadata"]
        return all(labels.get(k) == v for k, v in want_md["labels"].items()) and all(
            annotations.get(k) == want_md["annotations"][k] for k in (JOB_ROLLOUT_ANNOTATION, JOB_VERSION_ANNOTATION)
        )

    async def _failure_detail(self, cluster: str, job: str) -> str:
        """The failed container's termination message, as `kubectl describe` would show it."""
        core = await self._clusters.core(cluster)
        pods = await _call(
            f"listing pods of Job {job}",
            core.list_namespaced_pod(JOB_NAMESPACE, label_selector=f"job-name={job}", _request_timeout=_REQUEST_TIMEOUT),
        )
        for pod in sorted(pods.items, key=lambda p: p.metadata.creation_timestamp or datetime.min.replace(tzinfo=timezone.utc), reverse=True):
            statuses = list((pod.status.init_container_statuses if pod.status else None) or []) + list(
                (pod.status.container_statuses if pod.status else None) or []
            )
            for cs in statuses:
                for state in (cs.state, cs.last_state):
                    term = state.terminated if state else None
                    if term is not None and term.exit_code:
                        text = f"container {cs.name} of pod {pod.metadata.name}: {term.reason or 'Error'} (exit code {term.exit_code})"
                        return f"{text}: {term.message.strip()}" if term.message else text
        return ""

    @activity.defn
    async def run_stage_job(self, req: StageJobRequest) -> StageJobResult:
        """Run one package stage on one node as a Job, and wait for its verdict.

        The Job's name is derived from the rollout, node, package, version, stage, the workflow's
        try of the stage and the calling workflow run, never from the activity attempt: a retry
        after a crash at any line (even between creating the Job and the first heartbeat) finds
        and adopts the same Job, so a stage never runs twice; the workflow trying the stage
        again, or a new run for the node, gets a new Job. A failed Job is a result, not an
        error: `succeeded=False` with the reason and the failing container's message. So is a Job
        that vanished after an attempt saw it: it is never created again under the same try.
        The verdict is only ever the Job's own Complete/Failed condition, from a fresh read.
        """
        info = activity.info()
        return await self._run_job(req, info.heartbeat_details[0] if info.heartbeat_details else None,
                                     activity.heartbeat)

    async def _run_job(self, req: StageJobRequest, previous: Any, beat: Callable[[dict[str, Any]], None]) \
            -> StageJobResult:  # fmt: skip
        """`run_stage_job`: `previous` is what an earlier attempt heartbeat about this Job, `beat` heartbeats it."""
        if req.stage not in STAGES:
            raise ApplicationError(f"unknown stage {req.stage!r}", type="InvalidStage", non_retryable=True)
        if req.stage in ("interrupt", "uninstall-interrupt") and (req.interrupt or "noop") not in INTERRUPTS:
            raise ApplicationError(f"unknown interrupt {req.interrupt!r}", type="InvalidStage", non_retryable=True)
        info = activity.info()
        key = _short_hash(req.rollout, req.node, req.package, req.version, req.stage, req.try_number,
                          info.workflow_run_id)
        name = stage_job_name(req.package, req.stage, key)
        started = float(previous["started"]) if isinstance(previous, dict) and previous.get("started") else time.time()
        attempt = int(previous.get("attempt", info.attempt)) if isinstance(previous, dict) else info.attempt
        body = self._stage_job(req, name, attempt)
        batch = k8s.BatchV1Api(await self._clusters.api(req.cluster))
        core = await self._clusters.core(req.cluster)
        # Read and written as plain JSON: many Jobs run at once, and the typed client's models (managedFields and
        # all) cost more than the call itself.
        read = lambda: batch.read_namespaced_job_without_preload_content(  # noqa: E731
            name, JOB_NAMESPACE, _request_timeout=_REQUEST_TIMEOUT)
        # A first attempt creates it at once; a retry (an earlier attempt may have made it, its answer lost) reads
        # first and creates only what is missing.
        existing = None if info.attempt == 1 and not previous else await _read_json(f"reading Job {name}", read())
        if existing is None and isinstance(previous, dict) and previous.get("uid"):
            # An earlier attempt created (or adopted) it: the stage may have run. Creating it again would
            # run it twice under one try; the workflow's next try (a new Job) is the visible way to redo it.
            return StageJobResult(job=name, succeeded=False, attempt=attempt, message=_vanished(name))
        if existing is None:  # a Job that exists after all (409) is read and adopted
            existing = await self._create_job(req.cluster, name, body, read)
            activity.logger.info("created Job %s for %s %s on %s", name, req.package, req.stage, req.node)
        if not self._same_job(existing, body):
            raise ApplicationError(
                f"Job {JOB_NAMESPACE}/{name} exists but belongs to another stage run "
                f"(labels {existing['metadata'].get('labels')}); delete it by hand",
                type="JobConflict",
                non_retryable=True,
            )
        uid = existing["metadata"]["uid"]
        beat({"job": name, "uid": uid, "started": started, "attempt": attempt})
        if req.config:
            cm = {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {
                    "name": name,
                    "namespace": JOB_NAMESPACE,
                    "labels": dict(body["metadata"]["labels"]),
                    "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": uid,
                                         "controller": True, "blockOwnerDeletion": True}],
                },
                "data": dict(req.config),
            }
            try:
                await core.create_namespaced_config_map(JOB_NAMESPACE, cm, _request_timeout=_REQUEST_TIMEOUT)  # type: ignore[arg-type]  # a dict body is sent as it is
            except ApiException as err:
                if err.status != 409:
                    raise api_error(err, f"creating ConfigMap {name}") from err
            except (aiohttp.ClientError, asyncio.TimeoutError) as err:
                raise ApplicationError(f"creating ConfigMap {name}: connection failed: {err!r}",
                                       type="KubernetesUnavailable") from err
        give_up = started + req.timeout_seconds + JOB_WAIT_SLACK_SECONDS
        job: dict[str, Any] | None
        job, waiting = existing, time.time()
        while True:
            if job is None or job["metadata"].get("uid") != uid:
                return StageJobResult(job=name, succeeded=False, attempt=attempt, message=_vanished(name))
            status = job.get("status") or {}
            verdicts = {c.get("type"): c for c in status.get("conditions") or [] if c.get("status") == "True"}
            if "Complete" in verdicts:
                return StageJobResult(job=name, succeeded=True, attempt=attempt)
            failed = verdicts.get("Failed")
            if failed is not None:
                reason = failed.get("reason") or "Failed"
                reason = f"{reason}: {failed['message']}" if failed.get("message") else reason
                detail = await self._failure_detail(req.cluster, name)
                return StageJobResult(job=name, succeeded=False, attempt=attempt,
                                      message=f"{reason}; {detail}" if detail else reason)
            if time.time() > give_up:
                return StageJobResult(job=name, succeeded=False, attempt=attempt,
                                      message=f"Job {name} gave no verdict within {req.timeout_seconds:.0f}s "
                                      f"(+{JOB_WAIT_SLACK_SECONDS:.0f}s)")
            beat({"job": name, "uid": uid, "started": started, "attempt": attempt, "active": status.get("active") or 0})
            # Looked at every tenth of the time waited so far (a verdict is seen at most ~10% late), within bounds.
            await asyncio.sleep(min(JOB_POLL_SECONDS, max(FIRST_POLL_SECONDS, (time.time() - waiting) / 10)))
            job = await _read_json(f"reading Job {name}", read())

    async def _create_job(self, cluster: str, name: str, body: dict[str, Any], read: Callable) -> dict[str, Any]:
        """Create the Job (its namespace first, once per cluster and whenever it went missing); an existing one
        (409) is read and returned."""
        batch = k8s.BatchV1Api(await self._clusters.api(cluster))
        for first in (True, False):
            if cluster not in self._job_namespaces or not first:
                await self._ensure_namespace(cluster)
                self._job_namespaces.add(cluster)
            try:
                return await _call_json(f"creating Job {name}", _send_json(
                    batch.api_client, "POST", f"/apis/batch/v1/namespaces/{JOB_NAMESPACE}/jobs", body))
            except ApplicationError as err:
                status = err.__cause__.status if isinstance(err.__cause__, ApiException) else None
                if status == 409:
                    return await _call_json(f"reading Job {name}", read())
                if status != 404 or not first:  # 404: the namespace is gone; made again, then once more
                    raise
        raise AssertionError("unreachable")

    # ------------------------------------------------------------ rollouts: reboots and gates

    @activity.defn
    async def wait_node_rebooted(self, req: RebootWait) -> str:
        """Wait until the node reports a new boot ID and is Ready; return the new boot ID.

        The deadline counts from the first attempt (kept in the heartbeat details), so retries
        do not extend it; past it, a non-retryable RebootTimeout. Without the boot ID from before the
        reboot nothing can prove one happened: a non-retryable RebootUnverifiable (the node stays as it is).
        """
        if not req.previous_boot_id:
            raise _reboot_unverifiable(req.node)
        info = activity.info()
        details = info.heartbeat_details[0] if info.heartbeat_details else None
        if isinstance(details, dict) and details.get("deadline"):
            deadline = float(details["deadline"])
        else:
            first = info.scheduled_time.timestamp() if info.scheduled_time else 0.0
            base = first if info.attempt > 1 and first > 946684800 else time.time()  # no epoch-0 test defaults
            deadline = base + req.timeout_seconds
        return await self._wait_rebooted(req, deadline, activity.heartbeat)

    async def _wait_rebooted(self, req: RebootWait, deadline: float, beat: Callable[[dict[str, Any]], None]) -> str:
        """`wait_node_rebooted` until `deadline` (epoch seconds); `beat` heartbeats where it stands."""
        poll = FIRST_POLL_SECONDS
        while True:
            node = await self._read_node(req.cluster, req.node)
            boot = node.status.node_info.boot_id if node.status and node.status.node_info else ""
            ready = any(c.type == "Ready" and c.status == "True" for c in (node.status.conditions or []))
            if boot and boot != req.previous_boot_id and ready:
                activity.logger.info("node %s rebooted: boot ID %s", req.node, boot)
                return boot
            beat({"deadline": deadline, "boot_id": boot, "ready": ready})
            if time.time() >= deadline:
                state = "still has the old boot ID" if boot == req.previous_boot_id else "is not Ready"
                raise ApplicationError(
                    f"node {req.node} did not come back from its reboot within {req.timeout_seconds:.0f}s: it {state}",
                    type="RebootTimeout",
                    non_retryable=True,
                )
            await asyncio.sleep(max(0.05, min(poll, deadline - time.time())))
            poll = _next_poll(poll, req.poll_seconds)

    # ------------------------------------------------------------ rollouts: a node's update in three calls

    @activity.defn
    async def start_node_update(self, req: NodeUpdateStart) -> NodeUpdateStarted:
        """Begin a node's update: its rollout state `in_progress`, and with `cordon` the cordon and the drain plan.

        With `cordon`, a node whose non-interruptible pods still run is left in service and its state set `blocked`;
        otherwise it is cordoned, its state written in the same write, its non-interruptible pods looked for again
        now that no new one can land (one found: the cordon is removed again, with the state `blocked`, in one
        write), and its drain planned as `plan_drain` does. Short and idempotent, run as a local activity: every
        write is decided from a fresh read, so a retry after a crash at any line repeats none and undoes nothing
        (a cordon this rollout placed is removed only while the node's state still says this start placed it).

        Before all that, from the same fresh read: a node with a later version of a package installed than
        `packages` is refused unless `allow_downgrade` (its state `erroring`, nothing else written: `refused`);
        with `auto_taint`, a new node (no Millwright annotation yet) gets the runtime-required taint first.
        """
        state = NodeRolloutState(cluster=req.cluster, node=req.node, rollout=req.rollout, state="in_progress")
        if req.packages or req.auto_taint:
            node = await self._read_node(req.cluster, req.node)
            refused = "" if req.allow_downgrade else _downgrades(node, req.node, req.packages)
            if refused:
                await self._record_state(node, state.model_copy(update={"state": "erroring", "reason": refused}))
                return NodeUpdateStarted(node=_node_info(node), refused=refused)
            if req.auto_taint:
                await self._taint_if_new(req, node)
        if req.cordon and await self._non_interruptible_running(req):
            node = await self._read_node(req.cluster, req.node)
            record = _rollout_record(node)  # in progress by this rollout, no stage yet: an earlier try of this start
            placed_here = record.get("rollout") == req.rollout and record.get("state") == "in_progress" \
                and not record.get("stage")
            return await self._blocked(req, node, uncordon=placed_here)
        node = await self._read_node(req.cluster, req.node)
        if not req.cordon:
            await self._record_state(node, state)
            return NodeUpdateStarted(node=_node_info(node))
        cordon = await self._cordon(CordonRequest(cluster=req.cluster, node=req.node, owner=req.rollout,
                                                  reason=f"rollout {req.rollout}"), node, state)  # fmt: skip
        if await self._non_interruptible_running(req):  # one landed between the first look and the cordon
            blocked = await self._blocked(req, await self._read_node(req.cluster, req.node), uncordon=cordon.owned)
            return blocked.model_copy(update={"cordon": cordon})
        plan = await self._plan_drain(DrainPlanRequest(cluster=req.cluster, node=req.node,
                                                       settings=req.drain or DrainSettings()))  # fmt: skip
        await marks.record_event(await self._clusters.core(req.cluster), marks.event_body(
            req.node, node.metadata.uid, "Drain", f"draining {len(plan.evict)} pods, {len(plan.skipped)} left in "
            f"place (rollout {req.rollout})", key=("drain",)))  # fmt: skip
        return NodeUpdateStarted(node=_node_info(node), cordon=cordon, drain=plan)

    async def _taint_if_new(self, req: NodeUpdateStart, node: k8s.V1Node) -> None:
        """NodeWright's auto-taint: a node no rollout has touched yet is given the runtime-required taint (and the
        annotation saying who put it there), conditional on the node's resourceVersion; a node that has one
        already, or that any rollout has written to, is left as it is (one way: a node is new only once)."""
        annotations = node.metadata.annotations or {}
        if marks.has_runtime_taint(node) or PACKAGES_ANNOTATION in annotations or ROLLOUT_ANNOTATION in annotations:
            return
        patch = {"metadata": {"resourceVersion": node.metadata.resource_version,
                              "annotations": {marks.AUTO_TAINT_ANNOTATION: req.rollout}},
                 "spec": {"taints": marks.taints_with_runtime_required(node)}}  # fmt: skip
        await self._patch_node(req.cluster, req.node, patch, f"tainting new node {req.node} runtime-required",
                               marks.has_runtime_taint)
        activity.logger.info("tainted new node %s runtime-required for %s", req.node, req.rollout)

    async def _non_interruptible_running(self, req: NodeUpdateStart) -> bool:
        if not req.non_interrupt_selector:
            return False
        pods = await self._pods_on_node(req.cluster, req.node, req.non_interrupt_selector)
        return any(not _finished(p) for p in pods)

    async def _blocked(self, req: NodeUpdateStart, node: k8s.V1Node, *, uncordon: bool) -> NodeUpdateStarted:
        state = NodeRolloutState(cluster=req.cluster, node=req.node, rollout=req.rollout, state="blocked",
                                 reason=NON_INTERRUPTIBLE_RUNNING)  # fmt: skip
        await self._hand_back(node, state, packages={}, uncordon=uncordon)
        return NodeUpdateStarted(node=_node_info(node), blocked=NON_INTERRUPTIBLE_RUNNING)

    @activity.defn
    async def run_node_stages(self, req: NodeStages) -> NodeStagesResult:
        """Run the node's stages in order, each one's start recorded on the node (the rollout annotation's `stage`),
        each as the Job `run_stage_job` makes (a failed Job tried again as a new one, up to `tries` in all); a reboot
        interrupt is done once the node is back with a new boot ID and Ready within `reboot_timeout_seconds` (else
        it failed). The first stage that fails ends it: a result, not an error.

        Its workflow cancelling it (a pause) stops it before the next stage, never inside one (a reboot and its
        verification are one): it returns what ran, `held`. Any other cancellation (the worker shutting down, an
        operator's pause or reset of the activity) ends it at once, and the retry resumes where the heartbeat
        details say; the Jobs already made are adopted (names derive from stage and try, never from the attempt),
        so a stage never runs twice. Details a crash left behind by a few seconds only repeat looks, never Jobs.
        """
        if not req.boot_id and any(_is_reboot(st) for st in req.stages):
            raise _reboot_unverifiable(req.node)
        stop = asyncio.Event()
        work = asyncio.ensure_future(self._node_stages(req, stop))
        while True:
            try:
                return await asyncio.shield(work)
            except asyncio.CancelledError:
                why = activity.cancellation_details()
                if why is not None and why.cancel_requested and not (why.worker_shutdown or why.paused or why.reset):
                    stop.set()  # the stage that runs finishes first
                    continue
                work.cancel()
                await asyncio.wait([work])
                raise

    async def _node_stages(self, req: NodeStages, stop: asyncio.Event) -> NodeStagesResult:
        info = activity.info()
        details = info.heartbeat_details[0] if info.heartbeat_details else None
        details = details if isinstance(details, dict) else {}
        result = NodeStagesResult(stages=[StageRecord.model_validate(r) for r in details.get("done") or []],
                                  reboot_seconds=details.get("reboot_seconds"))  # fmt: skip
        # A second reboot (an uninstall's, then the install's) must change the boot ID the first one left.
        boot_id = details.get("boot_id") or req.boot_id
        for index in range(len(result.stages), len(req.stages)):
            if stop.is_set():
                result.held = True
                return result
            stage = req.stages[index]
            resumed = details if details.get("index") == index else {}
            # Where this stage stands (its try, its Job, the reboot's deadline), after what is done: sent at once
            # when one of those changes, else every BEAT_SECONDS (the SDK sends one per 0.8 heartbeat timeout).
            at: dict[str, Any] = {"index": index, "started": float(resumed.get("started") or time.time())}
            done = self._stages_done(result, boot_id)
            sent: list[Any] = [None, 0.0]  # the last beat's place, and when it went

            def beat(more: dict[str, Any]) -> None:
                at.update(more)
                where = (at.get("try"), (at.get("job") or {}).get("uid"), at.get("reboot_deadline"))
                if where != sent[0] or time.monotonic() - sent[1] >= BEAT_SECONDS:
                    activity.heartbeat({**at, **done})
                    sent[:] = [where, time.monotonic()]

            uid = await self._mark(NodeRolloutState(cluster=req.cluster, node=req.node, rollout=req.rollout,
                                                    state="in_progress", package=stage.package, stage=stage.stage))
            what = f"{stage.package} {stage.version} {stage.stage}"
            core = await self._clusters.core(req.cluster)
            reason = marks.stage_reason(stage.stage)
            await marks.record_event(core, marks.event_body(req.node, uid, reason, f"{what} started (rollout "
                                                            f"{req.rollout})", key=(stage.package, stage.stage)))
            record = await self._stage_tries(req, stage, resumed, beat)
            if record.succeeded and _is_reboot(stage):
                record, rebooted = await self._rebooted(req, record, resumed, beat, boot_id)
                if record.succeeded:
                    result.reboot_seconds = time.time() - at["started"]
                    await marks.record_event(core, marks.event_body(
                        req.node, uid, "Reboot", f"rebooted for {what}: boot ID {boot_id} -> {rebooted}",
                        key=(stage.package, stage.stage, rebooted)))  # fmt: skip
                    boot_id = rebooted
            result.stages.append(record)
            activity.heartbeat({"index": index + 1, **self._stages_done(result, boot_id)})
            if not record.succeeded:
                await marks.record_event(core, marks.event_body(
                    req.node, uid, reason, f"{what} failed after {record.attempts} tries: {record.message}",
                    warning=True, key=(stage.package, stage.stage, "failed")))  # fmt: skip
                break
        return result

    @staticmethod
    def _stages_done(result: NodeStagesResult, boot_id: str) -> dict[str, Any]:
        return {"done": [r.model_dump() for r in result.stages], "reboot_seconds": result.reboot_seconds,
                "boot_id": boot_id}

    async def _mark(self, state: NodeRolloutState) -> str:
        """Record `state` on the node in one write, unread (a stage's start: the same record written again on a
        retry is harmless), checked in the node as the API server stored it."""
        change = _state_change(None, state)
        core = await self._clusters.core(state.cluster)
        doing = f"recording rollout state of node {state.node}"
        stored = await _call_json(doing, core.patch_node_without_preload_content(
            state.node, {"metadata": {"labels": change.labels, "annotations": change.annotations}},
            _request_timeout=_REQUEST_TIMEOUT))  # fmt: skip
        metadata = stored.get("metadata") or {}
        if not change.shown_in(metadata.get("labels") or {}, metadata.get("annotations") or {}):
            raise ApplicationError(f"{doing}: the API server answered, but the node it returned does not show the "
                                   "change; writing it again", type="KubernetesUnavailable")  # fmt: skip
        return metadata.get("uid") or ""

    async def _stage_tries(self, req: NodeStages, stage: NodeStage, resumed: dict[str, Any],
                           beat: Callable[[dict[str, Any]], None]) -> StageRecord:  # fmt: skip
        first = int(resumed.get("try") or 1)
        for try_number in range(first, req.tries + 1):
            job_req = StageJobRequest(cluster=req.cluster, node=req.node, rollout=req.rollout, ordinal=req.ordinal,
                                      try_number=try_number, **stage.model_dump())  # fmt: skip
            job = await self._run_job(job_req, resumed.get("job") if try_number == first else None,
                                        lambda d, t=try_number: beat({"try": t, "job": d}))  # type: ignore[misc]  # mypy infers no lambda with a default  # fmt: skip
            if job.succeeded:
                break
        return StageRecord(package=stage.package, stage=stage.stage, succeeded=job.succeeded, attempts=try_number,
                           message=job.message)  # fmt: skip

    async def _rebooted(self, req: NodeStages, record: StageRecord, resumed: dict[str, Any],
                        beat: Callable[[dict[str, Any]], None], boot_id: str) -> tuple[StageRecord, str]:  # fmt: skip
        """The reboot Job's verdict confirmed: the node back with a boot ID other than `boot_id` and Ready (the new
        one returned), or the stage failed."""
        deadline = float(resumed.get("reboot_deadline") or time.time() + req.reboot_timeout_seconds)
        wait = RebootWait(cluster=req.cluster, node=req.node, previous_boot_id=boot_id,
                          timeout_seconds=req.reboot_timeout_seconds, poll_seconds=req.reboot_poll_seconds)
        try:
            rebooted = await self._wait_rebooted(wait, deadline, lambda d: beat({"reboot_deadline": deadline,
                                                                                 "reboot": d}))  # fmt: skip
        except ApplicationError as err:
            if err.type != "RebootTimeout":
                raise
            return record.model_copy(update={"succeeded": False, "message": err.message}), boot_id
        return record, rebooted

    @activity.defn
    async def finish_node_update(self, req: NodeUpdateFinish) -> None:
        """End a node's update in one write: the packages installed added to its packages annotation (those
        uninstalled taken out), its state `complete`, with `uncordon` the rollout's own cordon removed (never someone
        else's), and with `untaint` the runtime-required taint. Conditional on the
        node's resourceVersion, so a concurrent writer's package entry is never lost (its 409 is retried); writes
        nothing when the node says all of it already. Short and idempotent: a local activity."""
        state = NodeRolloutState(cluster=req.cluster, node=req.node, rollout=req.rollout, state="complete")
        await self._hand_back(await self._read_node(req.cluster, req.node), state, packages=req.packages,
                              uncordon=req.uncordon, removed=req.removed, untaint=req.untaint)  # fmt: skip

    async def _hand_back(self, node: k8s.V1Node, state: NodeRolloutState, *, packages: dict[str, str],
                         uncordon: bool, removed: list[str] | None = None, untaint: bool = False) -> None:  # fmt: skip
        """One conditional write: `packages` recorded (`removed` ones dropped), `state`, the cordon of
        `state.rollout` removed, and with `untaint` the runtime-required taint."""
        annotations = node.metadata.annotations or {}
        labels: dict[str, Any] = {}
        changes: dict[str, Any] = {}
        shows: list[Callable[[k8s.V1Node], bool]] = []
        spec: dict[str, Any] = {}
        done: list[str] = []
        installed = _packages_of(annotations, state.node)
        gone = [name for name in removed or [] if name in installed]
        if gone or any(installed.get(name) != version for name, version in packages.items()):
            kept = {k: v for k, v in {**installed, **packages}.items() if k not in gone}
            value = json.dumps(dict(sorted(kept.items())), separators=(",", ":"))
            changes[PACKAGES_ANNOTATION] = value
            shows.append(lambda n: _annotation(n, PACKAGES_ANNOTATION) == value)
            done += [f"{name} uninstalled" for name in gone]
        change = _state_change(node, state)
        if change is not None:
            labels.update(change.labels)
            changes.update(change.annotations)
            shows.append(change.shown_by)
        if uncordon and annotations.get(CORDONED_BY) == state.rollout:
            changes.update({CORDONED_BY: None, CORDON_REASON: None})
            spec["unschedulable"] = False
            shows.append(lambda n: not (n.spec and n.spec.unschedulable) and _annotation(n, CORDONED_BY) is None)
            done.append("uncordoned")
        if untaint and marks.has_runtime_taint(node):
            spec["taints"] = marks.taints_without_runtime_required(node)
            changes[marks.AUTO_TAINT_ANNOTATION] = None
            shows.append(lambda n: not marks.has_runtime_taint(n))
            done.append("runtime-required taint removed")
        if not shows:
            return
        patch: dict[str, Any] = {"metadata": {"resourceVersion": node.metadata.resource_version,
                                              "labels": labels, "annotations": changes}}  # fmt: skip
        if spec:
            patch["spec"] = spec
        await self._patch_node(state.cluster, state.node, patch, f"recording {state.state} on node {state.node}",
                               lambda n: all(show(n) for show in shows))  # fmt: skip
        if done:
            activity.logger.info("node %s for %s: %s", state.node, state.rollout, ", ".join(done))
        await self._state_event(node, state, *done)

    @activity.defn
    async def check_node_conditions(self, req: ConditionGate) -> list[str]:
        """Gate on node conditions: each listed type must not be True, except Ready, which must be.

        Returns human-readable violations (empty: the gate passes), at most 50 and a count.
        """
        wanted = list(dict.fromkeys(req.conditions))
        violations: list[str] = []
        extra = 0
        token = None
        while True:
            page = await self._node_page(req.cluster, req.label_selector, _LIST_CHUNK, token)
            for n in page.get("items") or []:
                name = n["metadata"]["name"]
                conds = {c.get("type"): c for c in (n.get("status") or {}).get("conditions") or []}
                for ctype in wanted:
                    c = conds.get(ctype)
                    bad = (c is None or c.get("status") != "True") if ctype == "Ready" else \
                        (c is not None and c.get("status") == "True")
                    if not bad:
                        continue
                    if len(violations) >= _VIOLATIONS_MAX:
                        extra += 1
                        continue
                    if c is None:
                        violations.append(f"node {name}: no {ctype} condition")
                    else:
                        why = ": ".join(x for x in (c.get("reason"), c.get("message")) if x)
                        violations.append(f"node {name}: {ctype} is {c.get('status')}" + (f" ({why})" if why else ""))
            activity.heartbeat(len(violations) + extra)
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                break
        if extra:
            violations.append(f"... and {extra} more violations")
        return violations
