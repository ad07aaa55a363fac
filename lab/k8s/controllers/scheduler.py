"""The default scheduler: binds a ReplicaSet's or Job's pending pod to the least-loaded Ready node that fits its
node selector, tolerations and GPU requests (whole GPUs or MIG devices); an unschedulable pod is tried again every `SCHEDULE_RETRY_SECONDS`."""

from __future__ import annotations

from ..mig import gpu_resources
from ..store import NODES, PODS, Store, controller_ref, node_ready
from ..util import clone, now_rfc3339
from .base import Controller
from .pods import is_active

SCHEDULE_RETRY_SECONDS = 0.25  # an unschedulable pod is looked at again this often (not every pass)


def _tolerated(taint: dict, tolerations: list[dict] | None) -> bool:
    for t in tolerations or []:
        if t.get("effect") and t.get("effect") != taint.get("effect"):
            continue
        if t.get("operator") == "Exists" and (not t.get("key") or t.get("key") == taint.get("key")):
            return True
        if t.get("key") == taint.get("key") and t.get("value", "") == taint.get("value", ""):
            return True
    return False


def _fits(need: dict[str, float], running: list[dict], allocatable: dict) -> bool:
    """The node's device plugin resources (`nvidia.com/gpu`, `nvidia.com/mig-*`) cover what the running pods hold
    plus `need`."""
    used: dict[str, float] = {}
    for p in running:
        for k, v in gpu_resources(p).items():
            used[k] = used.get(k, 0.0) + v
    for k, v in need.items():
        try:
            alloc = float(allocatable.get(k, 0))
        except (TypeError, ValueError):
            alloc = 0.0
        if used.get(k, 0.0) + v > alloc:
            return False
    return True


def active_on(store: Store, node: str) -> list[dict]:
    """The pods bound to `node` that still hold its resources."""
    pods = store.objects.get(PODS, {})
    return [p for k in store.pods_by_node.get(node, ()) if (p := pods.get(k)) is not None and is_active(p)]


def node_takes(node: dict, pod: dict, running: list[dict]) -> bool:
    """Whether `pod` may be bound to `node`: Ready, schedulable and staying, its node selector matched, its
    NoSchedule and NoExecute taints tolerated, and its GPU requests free beside the `running` pods."""
    md, nspec = node["metadata"], node.get("spec") or {}
    spec = pod.get("spec") or {}
    if not node_ready(node) or nspec.get("unschedulable") or md.get("deletionTimestamp"):
        return False
    labels = md.get("labels") or {}
    if any(labels.get(k) != v for k, v in (spec.get("nodeSelector") or {}).items()):
        return False
    if any(
        t.get("effect") in ("NoSchedule", "NoExecute") and not _tolerated(t, spec.get("tolerations"))
        for t in nspec.get("taints") or []
    ):
        return False
    need = gpu_resources(pod)
    return not need or _fits(need, running, (node.get("status") or {}).get("allocatable") or {})


class Scheduler(Controller):
    def pick_node(self, pod: dict) -> str | None:
        candidates = []
        for node in self.store.all(NODES):
            running = active_on(self.store, node["metadata"]["name"])
            if node_takes(node, pod, running):
                candidates.append((len(running), node["metadata"]["name"]))
        return min(candidates)[1] if candidates else None

    def reconcile(self, work: set, now: float) -> None:
        store, rt = self.store, self.pod_rt()
        pods = store.objects.get(PODS, {})
        for k in sorted(store.unscheduled):
            pod = pods.get(k)
            if pod is None:
                continue
            spec = pod.get("spec") or {}
            if spec.get("nodeName") or not is_active(pod):
                continue
            ref = controller_ref(pod)
            if not ref or ref.get("kind") not in ("ReplicaSet", "Job"):
                continue
            if spec.get("schedulerName", "default-scheduler") != "default-scheduler":
                continue
            side = store.side.setdefault(pod["metadata"].get("uid", ""), {})
            if now < side.get("schedule_retry_at", 0.0):
                continue
            node = self.pick_node(pod)
            if node is None:
                side["schedule_retry_at"] = now + SCHEDULE_RETRY_SECONDS
                store.schedule_at(side["schedule_retry_at"], (PODS, k))
            new = clone(pod)
            conds = [c for c in (new.get("status") or {}).get("conditions") or [] if c.get("type") != "PodScheduled"]
            if node is None:
                cond = {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "lastProbeTime": None,
                    "message": f"0/{len(store.objects.get(NODES, {}))} nodes are available.",
                    "lastTransitionTime": now_rfc3339(),
                }
                old = next(
                    (c for c in (pod.get("status") or {}).get("conditions") or [] if c.get("type") == "PodScheduled"),
                    None,
                )
                if old and old.get("status") == "False" and old.get("message") == cond["message"]:
                    continue
                new.setdefault("status", {})["conditions"] = [*conds, cond]
                store.put(rt, new, actor="scheduler", verb="update", subresource="status")
                continue
            new["spec"]["nodeName"] = node
            new.setdefault("status", {})["conditions"] = [
                *conds,
                {"type": "PodScheduled", "status": "True", "lastProbeTime": None, "lastTransitionTime": now_rfc3339()},
            ]
            store.put(rt, new, actor="scheduler", verb="create", subresource="binding")
