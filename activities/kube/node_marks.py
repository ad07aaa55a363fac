"""What a rollout shows on a Node besides its state label and annotations (activities/kube/): Kubernetes Events
for its stage transitions, the `DrainBlocked` condition while its drain cannot progress, and NodeWright's
runtime-required taint that keeps a new node unschedulable until its packages are complete.

Names are NodeWright's where it has them (its reference: /work/shared/reference/nodewright.md §4.3, §6): the taint
`nodewright.nvidia.com=runtime-required:NoSchedule` (its RUNTIME_REQUIRED_TAINT since v0.18), the annotation
`nodewright.nvidia.com/autoTaint_<taint key>` on a node it tainted itself, the condition type `DrainBlocked` with
reason `PodDisruptionBudget`, and the Event reasons `State`, `Drain`, `Apply`, `Interrupt`, `Reboot`.

Events are core/v1 Events on the Node (involvedObject kind Node, its name and UID, in namespace `default`, as the
kubelet and controllers record node events), so `kubectl describe node` and `kubectl get events` show them. As with
client-go's event recorder they are best effort: one try, a failure logged and never failing the stage. Each has a
name derived from its workflow run and what it reports, so an activity's retry re-creates nothing (409: already
there), and a later NodeUpdate of the same node (another run) gets events of its own.
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime
from typing import Any

import aiohttp
from kubernetes.aio import client as k8s
from kubernetes.aio.client.exceptions import ApiException
from temporalio import activity

RUNTIME_REQUIRED_TAINT = {"key": "nodewright.nvidia.com", "value": "runtime-required", "effect": "NoSchedule"}
AUTO_TAINT_ANNOTATION = f"nodewright.nvidia.com/autoTaint_{RUNTIME_REQUIRED_TAINT['key']}"
DRAIN_BLOCKED = "DrainBlocked"
# The validation gate's verdict (workflows/validation/gate.py): False keeps the node cordoned until someone looks.
VALIDATED = "MillwrightValidated"
VALIDATION_ANNOTATION = "millwright.dev/validation"  # why the node failed validation; gone once it passes
EVENT_NAMESPACE = "default"
EVENT_COMPONENT = "millwright"
_EVENT_TIMEOUT = 5.0


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def event_body(node: str, uid: str, reason: str, message: str, *, warning: bool = False,
               key: tuple[object, ...] = ()) -> dict[str, Any]:  # fmt: skip
    """A core/v1 Event on `node`; `key` (with the workflow run) names it, so the same report is made once."""
    run = activity.info().workflow_run_id if activity.in_activity() else ""
    digest = hashlib.sha256("\x1f".join(str(p) for p in (run, reason, *key)).encode()).hexdigest()[:16]
    now = _now()
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{node[:236]}.{digest}", "namespace": EVENT_NAMESPACE},  # a name is 253 at most
        "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": node, "uid": uid},
        "reason": reason,
        "message": message[:1024],
        "type": "Warning" if warning else "Normal",
        "source": {"component": EVENT_COMPONENT},
        "reportingComponent": EVENT_COMPONENT,
        "reportingInstance": EVENT_COMPONENT,
        "action": reason,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }


async def record_event(core: k8s.CoreV1Api, body: dict[str, Any]) -> None:
    """Create the Event, once; best effort (see the module's docstring)."""
    try:
        await core.create_namespaced_event(EVENT_NAMESPACE, body, _request_timeout=_EVENT_TIMEOUT)  # type: ignore[arg-type]  # a dict body is sent as it is
    except ApiException as err:
        if err.status != 409:  # 409: this report was made already (a retry)
            activity.logger.warning("event %s on node %s not recorded: %s %s", body["reason"],
                                    body["involvedObject"]["name"], err.status, err.reason)  # fmt: skip
    except (TimeoutError, aiohttp.ClientError) as err:
        activity.logger.warning("event %s on node %s not recorded: %r", body["reason"],
                                body["involvedObject"]["name"], err)  # fmt: skip


def condition(conditions: list[Any], ctype: str) -> Any | None:
    return next((c for c in conditions if c.type == ctype), None)


def drain_blocked_patch(blocked: bool, reason: str, message: str, previous: Any | None) -> dict[str, Any]:
    """A node status patch setting `DrainBlocked` (the conditions list merges by type: the others stay)."""
    return condition_patch(DRAIN_BLOCKED, blocked, reason, message, previous)


def condition_patch(ctype: str, true: bool, reason: str, message: str, previous: Any | None) -> dict[str, Any]:
    """A node status patch setting condition `ctype`; its transition time moves only when its status does."""
    status = "True" if true else "False"
    now = _now()
    since = now
    if previous is not None and previous.status == status and previous.last_transition_time is not None:
        since = previous.last_transition_time.strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"status": {"conditions": [{"type": ctype, "status": status, "reason": reason,
                                       "message": message[:1024], "lastHeartbeatTime": now,
                                       "lastTransitionTime": since}]}}  # fmt: skip


def has_runtime_taint(node: k8s.V1Node) -> bool:
    return any(t.key == RUNTIME_REQUIRED_TAINT["key"] and t.effect == RUNTIME_REQUIRED_TAINT["effect"]
               for t in (node.spec.taints or []))  # fmt: skip


def _taint_dict(t: k8s.V1Taint) -> dict[str, Any]:
    out = {"key": t.key, "effect": t.effect}
    if t.value is not None:
        out["value"] = t.value
    if t.time_added is not None:
        out["timeAdded"] = t.time_added.strftime("%Y-%m-%dT%H:%M:%SZ")
    return out


def taints_with_runtime_required(node: k8s.V1Node) -> list[dict[str, Any]]:
    """The node's taints and the runtime-required one. `spec.taints` is an atomic list (a patch replaces it whole):
    the caller writes it conditional on the resourceVersion it read, so a taint someone added since is never lost
    (the 409 sends it round again: the race of NodeWright issue #447)."""
    return [_taint_dict(t) for t in node.spec.taints or []] + [dict(RUNTIME_REQUIRED_TAINT)]


def taints_without_runtime_required(node: k8s.V1Node) -> list[dict[str, Any]]:
    return [
        _taint_dict(t)
        for t in node.spec.taints or []
        if not (t.key == RUNTIME_REQUIRED_TAINT["key"] and t.effect == RUNTIME_REQUIRED_TAINT["effect"])
    ]
