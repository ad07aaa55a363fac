"""A node's rollout record and its package Jobs: the JSON calls, the node's state annotation and label, the installed
packages, Job names within Kubernetes' limits, the proxy the API client honours, reboot checks."""

from __future__ import annotations

import hashlib
import json
import re
from datetime import UTC, datetime
from typing import Any

import aiohttp
from kubernetes.aio import client as k8s
from kubernetes.aio.client.exceptions import ApiException
from temporalio.exceptions import ApplicationError

from activities.kube.connector import REQUEST_TIMEOUT
from activities.kube.errors import api_error, none_if_not_found
from activities.kube.models import (
    CONTROL_PLANE_LABEL,
    CORDONED_BY,
    JOB_NAMESPACE,
    JOB_TTL_SECONDS,
    PACKAGES_ANNOTATION,
    ROLLOUT_ANNOTATION,
    ROLLOUT_STATE_LABEL,
    ROLLOUT_STATES,
    NodeInfo,
    NodeRolloutState,
    NodeStage,
    NodeSummary,
    Stage,
)
from activities.support.semver import is_downgrade

_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


# ---------------------------------------------------------------- rollout helpers


async def call_json(doing: str, coro) -> dict[str, Any]:
    """Await a `*_without_preload_content` call and parse its JSON; errors mapped as `api_call` does.

    Used for large lists: skipping the typed client's model building makes a 10,000-node
    listing several times cheaper.
    """
    try:
        resp = await coro  # the aiohttp response itself
        try:
            data = await resp.read()
        finally:
            resp.release()
    except (TimeoutError, aiohttp.ClientError) as err:
        raise ApplicationError(f"{doing}: connection failed: {err!r}", type="KubernetesUnavailable") from err
    if not 200 <= resp.status <= 299:
        failure = ApiException(status=resp.status, reason=resp.reason, body=data.decode(errors="replace"))
        failure.headers = resp.headers
        raise api_error(failure, doing) from failure
    try:
        return json.loads(data)
    except ValueError as err:
        raise ApplicationError(f"{doing}: response is not JSON: {err}", type="KubernetesUnavailable") from err


async def read_json(doing: str, coro) -> dict[str, Any] | None:
    """Like `call_json`, for a read where NotFound is an answer: it returns None."""
    return await none_if_not_found(call_json(doing, coro))


def node_ready(node: dict[str, Any]) -> bool:
    for c in (node.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Ready":
            return c.get("status") == "True"
    return False


def service_state(node: NodeSummary) -> tuple[str, bool]:
    """Why the node is out of service ("cordoned", "NotReady", or both; "" when in service), and whether it is a
    control-plane node."""
    why = [w for w, down in (("cordoned", node.unschedulable), ("NotReady", not node.ready)) if down]
    return ", ".join(why), CONTROL_PLANE_LABEL in node.labels


def only_labels(labels: dict[str, str], label_keys: list[str]) -> dict[str, str]:
    """The labels named in `label_keys`; all of them when it is empty."""
    return {k: labels[k] for k in label_keys if k in labels} if label_keys else labels


def node_summary(node: dict[str, Any], label_keys: list[str]) -> NodeSummary:
    return NodeSummary(
        name=node["metadata"]["name"],
        labels=only_labels((node.get("metadata") or {}).get("labels") or {}, label_keys),
        unschedulable=bool((node.get("spec") or {}).get("unschedulable")),
        cordoned_by=((node.get("metadata") or {}).get("annotations") or {}).get(CORDONED_BY),
        ready=node_ready(node),
        created=(node.get("metadata") or {}).get("creationTimestamp"),
    )


def annotation_of(obj: Any, key: str) -> str | None:
    return (obj.metadata.annotations or {}).get(key)


def packages_of(annotations: dict[str, str], node: str | None, strict: bool = True) -> dict[str, str]:
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


def is_reboot(stage: NodeStage) -> bool:
    named = Stage.named(stage.stage)
    return named is not None and named.needs_reboot(stage.interrupt)


def downgrades(node: k8s.V1Node, name: str, wanted: dict[str, str]) -> str:
    """Why installing `wanted` on the node would downgrade a package; empty when it would not."""
    installed = packages_of(node.metadata.annotations or {}, name, strict=False)
    down = [f"{p} {installed[p]} is installed, the rollout has {v}" for p, v in sorted(wanted.items())
            if p in installed and is_downgrade(installed[p], v)]  # fmt: skip
    if not down:
        return ""
    return f"downgrade refused: {'; '.join(down)} (set allowDowngrade: true to install it anyway)"


def node_info(node: k8s.V1Node) -> NodeInfo:
    annotations = node.metadata.annotations or {}
    return NodeInfo(
        name=node.metadata.name,
        unschedulable=bool(node.spec.unschedulable),
        cordoned_by=annotations.get(CORDONED_BY),
        ready=any(c.type == "Ready" and c.status == "True" for c in (node.status.conditions or [])),
        boot_id=node.status.node_info.boot_id if node.status and node.status.node_info else None,
        system_uuid=(node.status.node_info.system_uuid or "") if node.status and node.status.node_info else "",
        packages=packages_of(annotations, node.metadata.name, strict=False),
        rollout_state=(node.metadata.labels or {}).get(ROLLOUT_STATE_LABEL),
    )


def rollout_record(node: k8s.V1Node) -> dict[str, Any]:
    try:
        have = json.loads((node.metadata.annotations or {}).get(ROLLOUT_ANNOTATION) or "{}")
    except ValueError:
        return {}
    return have if isinstance(have, dict) else {}


class StateChange:
    """The label and annotation that record a rollout state on a node, and whether a node read back shows them."""

    def __init__(self, state: str, value: str) -> None:
        self.labels = {ROLLOUT_STATE_LABEL: state}
        self.annotations = {ROLLOUT_ANNOTATION: value}

    def shown_by(self, node: k8s.V1Node) -> bool:
        return self.shown_in(node.metadata.labels or {}, node.metadata.annotations or {})

    def shown_in(self, labels: dict[str, str], annotations: dict[str, str]) -> bool:
        return (
            labels.get(ROLLOUT_STATE_LABEL) == self.labels[ROLLOUT_STATE_LABEL]
            and annotations.get(ROLLOUT_ANNOTATION) == self.annotations[ROLLOUT_ANNOTATION]
        )


def _state_record(req: NodeRolloutState) -> dict[str, Any]:
    if req.state not in ROLLOUT_STATES:
        raise ApplicationError(f"unknown rollout state {req.state!r}; one of {', '.join(ROLLOUT_STATES)}",
                               type="InvalidRolloutState", non_retryable=True)  # fmt: skip
    return {
        "rollout": req.rollout,
        "state": req.state,
        "package": req.package,
        "stage": req.stage,
        "reason": req.reason[:1024],
    }


def state_change(node: k8s.V1Node | None, req: NodeRolloutState) -> StateChange | None:
    """What records `req` on `node` (None: unread); None when the node says so already (the `updated` time aside)."""
    want = _state_record(req)
    if node is not None and (node.metadata.labels or {}).get(ROLLOUT_STATE_LABEL) == req.state and \
            {k: rollout_record(node).get(k) for k in want} == want:  # fmt: skip
        return None
    return StateChange(req.state, json.dumps({**want, "updated": _iso_now()}, separators=(",", ":")))


def short_hash(*parts: object, n: int = 10) -> str:
    return hashlib.sha256("\x1f".join(str(p) for p in parts).encode()).hexdigest()[:n]


def label_value(value: str) -> str:
    """`value` when it is a valid label value, else a stable hash of it."""
    if len(value) <= 63 and _LABEL_VALUE.match(value):
        return value
    return "h-" + short_hash(value, n=40)


def stage_job_name(package: str, stage: str, key: str) -> str:
    """`mw-<package>-<stage>-<10 hex>`, at most 63 characters and DNS-safe."""
    prefix = re.sub(r"[^a-z0-9-]+", "-", f"mw-{package}-{stage}".lower())[:52].rstrip("-")
    return f"{prefix}-{key}"


def vanished(job: str) -> str:
    return (
        f"Job {JOB_NAMESPACE}/{job} disappeared (or was replaced) before its verdict was read: deleted by "
        f"someone, or by its TTL ({JOB_TTL_SECONDS}s after finishing); its stage may have run, and it is not "
        "created again under this try"
    )


async def send_json(api: k8s.ApiClient, method: str, path: str, body: dict[str, Any]):
    """A request with a plain JSON body, its answer unread (for `call_json`): the typed methods would validate the
    body into the client's models and back (a Job: its spec, template and containers), costing more than the
    call. Authentication, headers, TLS and errors as theirs."""
    params = await api.param_serialize(method=method, resource_path=path, body=body, auth_settings=["BearerToken"],
                                       header_params={"Accept": "application/json",
                                                      "Content-Type": "application/json"})  # fmt: skip
    return (await api.call_api(*params, _preload_content=False, _request_timeout=REQUEST_TIMEOUT)).response


def node_not_found(node: str, cluster: str) -> ApplicationError:
    return ApplicationError(f"node {node!r} not found in cluster {cluster!r}", type="NodeNotFound", non_retryable=True)


def reboot_unverifiable(node: str) -> ApplicationError:
    return ApplicationError(
        f"node {node}: no boot ID was recorded before the reboot, so a reboot cannot be told from no "
        "reboot (the node reports no status.nodeInfo.bootID)",
        type="RebootUnverifiable",
        non_retryable=True,
    )


def _iso_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
