"""The default scheduler: binds a ReplicaSet's or Job's pending pod to the least-loaded Ready node that fits its
node selector, required node affinity (matchExpressions: In, NotIn, Exists, DoesNotExist), required pod
anti-affinity (a labelSelector's matchLabels per topologyKey), tolerations (a cordoned node takes a pod that
tolerates `node.kubernetes.io/unschedulable:NoSchedule`, as kube-scheduler's NodeUnschedulable plugin allows) and GPU
requests (whole GPUs or MIG devices); an unschedulable pod is tried again every `SCHEDULE_RETRY_SECONDS`."""

from __future__ import annotations

from ..mig import gpu_resources
from ..store import NODES, PODS, Store, controller_ref, node_ready
from ..util import clone, now_rfc3339
from .base import Controller
from .pods import is_active

SCHEDULE_RETRY_SECONDS = 0.25  # an unschedulable pod is looked at again this often (not every pass)
UNSCHEDULABLE_TAINT = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}


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


def _expression_holds(expr: dict, labels: dict) -> bool:
    key, op, values = expr.get("key"), expr.get("operator"), expr.get("values") or []
    if op == "In":
        return labels.get(key) in values
    if op == "NotIn":
        return labels.get(key) not in values
    if op == "Exists":
        return key in labels
    if op == "DoesNotExist":
        return key not in labels
    return False  # Gt, Lt and the rest: not modelled, so never matched (the pod stays pending, visibly)


def _affinity_holds(spec: dict, labels: dict) -> bool:
    """Required node affinity: any term whose every expression holds (no terms: no constraint)."""
    required = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution") or {})  # fmt: skip
    terms = required.get("nodeSelectorTerms") or []
    return not terms or any(all(_expression_holds(e, labels) for e in t.get("matchExpressions") or []) for t in terms)


def _anti_affinity_holds(spec: dict, namespace: str, labels: dict, placed: list[tuple[dict, dict]]) -> bool:
    """Required pod anti-affinity: no pod it names (matchLabels, the pod's namespace) in the node's topology domain.
    `placed`: (pod, its node's labels) of the active pods."""
    terms = ((spec.get("affinity") or {}).get("podAntiAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution") or []  # fmt: skip
    for term in terms:
        key, want = term.get("topologyKey"), (term.get("labelSelector") or {}).get("matchLabels") or {}
        for other, where in placed:
            md = other.get("metadata") or {}
            if (md.get("namespace") == namespace and where.get(key) is not None and where.get(key) == labels.get(key)
                    and all((md.get("labels") or {}).get(k) == v for k, v in want.items())):  # fmt: skip
                return False
    return True


def node_takes(node: dict, pod: dict, running: list[dict], placed: list[tuple[dict, dict]] | None = None) -> bool:
    """Whether `pod` may be bound to `node`: Ready and staying, schedulable (or the cordon tolerated), its node
    selector and required node affinity matched, no pod its anti-affinity names in the node's topology domain
    (`placed`, when it has such terms), its NoSchedule and NoExecute taints tolerated, and its GPU requests free
    beside the `running` pods."""
    md, nspec = node["metadata"], node.get("spec") or {}
    spec = pod.get("spec") or {}
    if not node_ready(node) or md.get("deletionTimestamp"):
        return False
    if nspec.get("unschedulable") and not _tolerated(UNSCHEDULABLE_TAINT, spec.get("tolerations")):
        return False
    labels = md.get("labels") or {}
    if any(labels.get(k) != v for k, v in (spec.get("nodeSelector") or {}).items()):
        return False
    if not _affinity_holds(spec, labels):
        return False
    if placed and not _anti_affinity_holds(spec, (pod.get("metadata") or {}).get("namespace", ""), labels, placed):
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
        nodes = self.store.all(NODES)
        placed = None
        if ((pod.get("spec") or {}).get("affinity") or {}).get("podAntiAffinity"):  # only then: every active pod
            by_name = {n["metadata"]["name"]: n["metadata"].get("labels") or {} for n in nodes}
            placed = [(p, by_name.get(n["metadata"]["name"], {})) for n in nodes
                      for p in active_on(self.store, n["metadata"]["name"])]  # fmt: skip
        for node in nodes:
            running = active_on(self.store, node["metadata"]["name"])
            if node_takes(node, pod, running, placed):
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
