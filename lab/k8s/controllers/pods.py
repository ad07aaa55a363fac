"""Pod status as the kubelet writes it: readiness, the container a failure hits, a pod that finished."""

from __future__ import annotations

import contextlib

from ..store import PODS, Store
from ..util import clone, now_rfc3339


def is_active(pod: dict) -> bool:
    """Not being deleted and not finished."""
    return not pod["metadata"].get("deletionTimestamp") and (pod.get("status") or {}).get("phase") not in (
        "Succeeded",
        "Failed",
    )


def gpu_request(pod: dict) -> float:
    total = 0.0
    for c in (pod.get("spec") or {}).get("containers") or []:
        res = c.get("resources") or {}
        v = (res.get("limits") or {}).get("nvidia.com/gpu") or (res.get("requests") or {}).get("nvidia.com/gpu")
        if v is not None:
            with contextlib.suppress(TypeError, ValueError):
                total += float(v)
    return total


def failing_container(pod: dict) -> tuple[str, int]:
    """Which container a simulated failure hits: the work (first init container) if any, else the first."""
    if (pod.get("spec") or {}).get("initContainers"):
        return "initContainerStatuses", 0
    return "containerStatuses", 0


def set_ready(pod: dict, ready: bool, reason: str | None = None) -> None:
    st = pod.setdefault("status", {})
    conds = st.setdefault("conditions", [])
    val = "True" if ready else "False"
    for t in ("Ready", "ContainersReady"):
        c = next((c for c in conds if c.get("type") == t), None)
        if c is None:
            c = {"type": t}
            conds.append(c)
        if c.get("status") != val:
            c["lastTransitionTime"] = now_rfc3339()
        c["status"] = val
        c["lastProbeTime"] = None
        if reason and not ready:
            c["reason"] = reason
        else:
            c.pop("reason", None)


def terminate(store: Store, pod: dict, succeeded: bool, message: str = "") -> None:
    """Pod finished: Succeeded, or Failed with `message` in the failing container's termination state."""
    new = clone(pod)
    st = new.setdefault("status", {})
    st["phase"] = "Succeeded" if succeeded else "Failed"
    set_ready(new, False, "PodCompleted" if succeeded else "PodFailed")
    ts = now_rfc3339()
    started = st.get("startTime") or ts
    fail_list, fail_i = failing_container(new)
    init_failed = not succeeded and fail_list == "initContainerStatuses"
    for lst in ("initContainerStatuses", "containerStatuses"):
        for i, cs in enumerate(st.get(lst) or []):
            cs["ready"] = False
            cs["started"] = False
            if not succeeded and (lst, i) == (fail_list, fail_i):
                cs["state"] = {
                    "terminated": {
                        "exitCode": 1,
                        "reason": "Error",
                        "message": message,
                        "startedAt": started,
                        "finishedAt": ts,
                    }
                }
            elif init_failed and lst == "containerStatuses":
                cs["state"] = {"waiting": {"reason": "PodInitializing"}}
            else:
                cs["state"] = {
                    "terminated": {"exitCode": 0, "reason": "Completed", "startedAt": started, "finishedAt": ts}
                }
    store.put(store.registry.types[PODS], new, actor="kubelet", verb="update", subresource="status")
