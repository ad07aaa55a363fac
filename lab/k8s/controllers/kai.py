"""KAI Scheduler: its queues (`status.childQueues` of every parent, an `Orphan` condition when a parent is missing)
and its gangs (`KaiGangs`)."""

from __future__ import annotations

from activities.kube.topology import KAI_POD_GROUP_ANNOTATION

from ..crds import POD_GROUPS, QUEUES
from ..store import NODES, PODS
from ..util import clone, now_rfc3339
from .base import Controller
from .jobs import completion_index
from .pods import is_active
from .scheduler import node_takes


class KaiQueues(Controller):
    def reconcile(self, work: set, now: float) -> None:
        store = self.store
        rt = self._rt(QUEUES)
        if rt is None or not any(ok[0] == QUEUES for ok in work):
            return
        queues = store.all(QUEUES)
        names = {q["metadata"]["name"] for q in queues}
        children: dict[str, list[str]] = {}
        for q in queues:
            if not q["metadata"].get("deletionTimestamp"):
                parent = (q.get("spec") or {}).get("parentQueue")
                if parent:
                    children.setdefault(parent, []).append(q["metadata"]["name"])
        for q in queues:
            old = q.get("status") or {}
            st = {k: v for k, v in old.items() if k not in ("childQueues", "conditions")}
            kids = sorted(children.get(q["metadata"]["name"], []))
            if kids:
                st["childQueues"] = kids
            parent = (q.get("spec") or {}).get("parentQueue")
            if parent and parent not in names:
                st["conditions"] = [
                    self._cond(old, "Orphan", True, "ParentQueueNotFound", f"parent queue {parent} does not exist")
                ]
            self._status_put(rt, q, st, "kai-scheduler")


SCHEDULE_PERIOD_SECONDS = 1.0  # KAI's scheduling cycle (--schedule-period): a gang that cannot be bound waits this


class KaiGangs(Controller):
    """KAI's gangs (scheduling.run.ai/v2alpha2 PodGroups, a pod joining one by its `pod-group-name` annotation):

    * gang scheduling: a PodGroup's pending pods are bound all at once, and only when the group then has
      `minMember` pods on Ready, schedulable nodes that take them, one pod per node; within one domain of the
      `requiredTopologyLevel` label, packed into the fewest and fullest domains of the `preferredTopologyLevel`
      label, preferring the domains and nodes the group last ran on. Otherwise they stay Pending, PodScheduled
      False (Unschedulable), the PodGroup's `UnschedulableOnNodePool` scheduling condition saying why;
    * StaleGangEviction: a group with fewer than `minMember` pods bound (terminating ones included) but some, for
      longer than the staleness grace (`kaiStalenessGraceSeconds`, KAI's `--default-staleness-grace-period`, 60 s;
      negative: never), has every other pod evicted: a DisruptionTarget condition, then deleted;
    * the lab's count of interruptions: a group going from whole (`minMember` pods running) to fewer
      (`/_lab/gangs`, lab/k8s/admin.py `gang_interruptions`)."""

    def __init__(self, api) -> None:
        super().__init__(api)
        self.group_of: dict[tuple[str, str], tuple[str, str]] = {}  # pod -> its PodGroup, for pods now gone

    def reconcile(self, work: set, now: float) -> None:
        rt = self._rt(POD_GROUPS)
        if rt is None:
            return
        store = self.store
        groups: set[tuple[str, str]] = set()
        for ok in work:
            if ok[0] == POD_GROUPS:
                groups.add(ok[1])
            elif ok[0] == PODS:
                pod = store.lookup(ok)
                name = ((pod or {}).get("metadata", {}).get("annotations") or {}).get(KAI_POD_GROUP_ANNOTATION)
                if name:
                    groups.add(self.group_of.setdefault(ok[1], (ok[1][0], name)))
                elif (gone := self.group_of.pop(ok[1], None)) is not None:
                    groups.add(gone)
        members: dict[tuple[str, str], list[dict]] = {g: [] for g in groups}
        for ns in sorted({ns for ns, _ in groups}):
            for pod in store.all(PODS, ns):
                name = (pod["metadata"].get("annotations") or {}).get(KAI_POD_GROUP_ANNOTATION)
                if name and (ns, name) in members:
                    members[(ns, name)].append(pod)
        for key in sorted(groups):
            pg = store.get(rt, key[0], key[1])
            if pg is not None:
                self.sync(rt, pg, members[key], now)

    def sync(self, rt, pg: dict, pods: list[dict], now: float) -> None:
        store = self.store
        md = pg["metadata"]
        key = (POD_GROUPS, (md["namespace"], md["name"]))
        side = store.side.setdefault(md.get("uid", ""), {})
        min_member = int((pg.get("spec") or {}).get("minMember") or 1)
        phases = [(p.get("status") or {}).get("phase") for p in pods]
        bound = [p for p, ph in zip(pods, phases) if p["spec"].get("nodeName") and ph not in ("Succeeded", "Failed")]
        allocated = [p for p in bound if not p["metadata"].get("deletionTimestamp")]
        running = sum(1 for p in allocated if p["status"].get("phase") == "Running")
        for p in allocated:  # where it ran: a restart goes back there when it can
            side.setdefault("nodes", {})[_index_or_name(p)] = p["spec"]["nodeName"]
        if running >= min_member:
            side["whole"] = True
        elif side.pop("whole", False):
            side["interruptions"] = side.get("interruptions", 0) + 1
        grace = float(store.config["kaiStalenessGraceSeconds"])
        if "Succeeded" not in phases and 0 < len(bound) < min_member and grace >= 0:
            since = side.setdefault("stale_since", now)
            if now >= since + grace:
                for p in allocated:
                    self._evict(p, f"{md['namespace']}/{p['metadata']['name']} was evicted: its PodGroup "
                                   f"{md['name']} had fewer than {min_member} pods allocated for {grace:g}s")  # fmt: skip
            else:
                store.schedule_at(since + grace, key)
        else:
            side.pop("stale_since", None)
        pending = [p for p in pods if not p["spec"].get("nodeName") and is_active(p)]
        if not pending:
            self._scheduling_condition(rt, pg, None)
        elif now < side.get("retry_at", 0.0):
            store.schedule_at(side["retry_at"], key)  # the store keeps one timer per object: the earliest
        else:
            why = self._schedule(pg, side, allocated, pending, min_member)
            if why is not None:
                side["retry_at"] = now + SCHEDULE_PERIOD_SECONDS
                store.schedule_at(side["retry_at"], key)
            self._scheduling_condition(rt, pg, why)

    def _schedule(
        self, pg: dict, side: dict, allocated: list[dict], pending: list[dict], min_member: int
    ) -> str | None:
        """Bind every pending pod, or none; None when bound, else why not."""
        if len(allocated) + len(pending) < min_member:
            why = f"the PodGroup has {len(allocated) + len(pending)} pods, fewer than its minMember {min_member}"
            self._unschedulable(pending, why)
            return why
        nodes = self._place(pg, side, allocated, pending)
        if nodes is None:
            why = (f"0/{len(self.store.objects.get(NODES, {}))} nodes are available: the gang needs {len(pending)} "
                   f"more nodes in one topology domain")  # fmt: skip
            self._unschedulable(pending, why)
            return why
        last = side.get("nodes", {})
        free = list(nodes)
        order = sorted(pending, key=lambda p: (last.get(_index_or_name(p)) not in free, _index_or_name(p)))
        for pod in order:
            node = last.get(_index_or_name(pod))
            node = node if node in free else free[0]
            free.remove(node)
            new = clone(pod)
            new["spec"]["nodeName"] = node
            conds = [c for c in new.get("status", {}).get("conditions") or [] if c.get("type") != "PodScheduled"]
            new.setdefault("status", {})["conditions"] = [
                *conds,
                {"type": "PodScheduled", "status": "True", "lastProbeTime": None, "lastTransitionTime": now_rfc3339()},
            ]
            self.store.put(self.pod_rt(), new, actor="kai-scheduler", verb="create", subresource="binding")
        return None

    def _place(self, pg: dict, side: dict, allocated: list[dict], pending: list[dict]) -> list[str] | None:
        """Nodes for the pending pods, one each, or None where the constraint cannot be met now."""
        store = self.store
        constraint = (pg.get("spec") or {}).get("topologyConstraint") or {}
        required, preferred = constraint.get("requiredTopologyLevel"), constraint.get("preferredTopologyLevel")
        nodes = {n["metadata"]["name"]: n for n in store.all(NODES)}

        def label(name: str, key: str | None) -> str | None:
            return (nodes[name]["metadata"].get("labels") or {}).get(key) if key and name in nodes else name

        free = [name for name, node in nodes.items() if node_takes(node, pending[0], _holding(store, name))]
        held = [p["spec"]["nodeName"] for p in allocated]
        if required:
            areas = {label(n, required) for n in held} or {label(n, required) for n in free} - {None}
        else:
            areas = {None}
        last = set(side.get("nodes", {}).values())
        best: tuple[tuple[int, int], list[str]] | None = None
        for area in sorted(areas, key=str):
            inside = [n for n in free if not required or label(n, required) == area]
            chosen = _pack(len(pending), inside, lambda n: label(n, preferred) or n, held, last)
            rank = (-len(last & set(inside)), len(inside))  # where it last ran, else the fullest area that fits
            if chosen is not None and (best is None or rank < best[0]):
                best = (rank, chosen)
        return best[1] if best else None

    def _unschedulable(self, pods: list[dict], message: str) -> None:
        for pod in pods:
            conditions = pod.get("status", {}).get("conditions") or []
            old: dict = next((c for c in conditions if c.get("type") == "PodScheduled"), {})
            if old.get("status") == "False" and old.get("message") == message:
                continue
            new = clone(pod)
            conds = [c for c in new.get("status", {}).get("conditions") or [] if c.get("type") != "PodScheduled"]
            new.setdefault("status", {})["conditions"] = [*conds, {
                "type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message,
                "lastProbeTime": None, "lastTransitionTime": now_rfc3339()}]  # fmt: skip
            self.store.put(self.pod_rt(), new, actor="kai-scheduler", verb="update", subresource="status")

    def _scheduling_condition(self, rt, pg: dict, why: str | None) -> None:
        """The PodGroup's `UnschedulableOnNodePool` scheduling condition while its pods cannot be bound."""
        old = pg.get("status") or {}
        status = {k: v for k, v in old.items() if k != "schedulingConditions"}
        if why is not None:
            prev: dict = next(iter(old.get("schedulingConditions") or []), {})
            status["schedulingConditions"] = [{
                "type": "UnschedulableOnNodePool", "nodePool": "default", "reason": "Unschedulable", "message": why,
                "reasons": [], "status": "True",
                "lastTransitionTime": prev.get("lastTransitionTime") or now_rfc3339(),
                "transitionID": prev.get("transitionID") or "0"}]  # fmt: skip
        self._status_put(rt, pg, status, "kai-scheduler")

    def _evict(self, pod: dict, message: str) -> None:
        """As KAI's evictor: the DisruptionTarget condition, then the delete (no eviction API: no budget check)."""
        new = clone(pod)
        conds = [c for c in new["status"].get("conditions") or [] if c.get("type") != "DisruptionTarget"]
        new["status"]["conditions"] = [*conds, {"type": "DisruptionTarget", "status": "True",
                                                "reason": "PreemptionByScheduler", "message": message,
                                                "lastProbeTime": None, "lastTransitionTime": now_rfc3339()}]  # fmt: skip
        stored = self.store.put(self.pod_rt(), new, actor="kai-scheduler", verb="update", subresource="status")
        self.api.delete_object(self.pod_rt(), stored, {}, actor="kai-scheduler")


def _index_or_name(pod: dict) -> str:
    """A pod's place in its gang: its completion index, else its name."""
    index = completion_index(pod)
    return pod["metadata"]["name"] if index is None else f"{index:06d}"


def _holding(store, node: str) -> list[dict]:
    """The pods whose resources `node` still holds: bound and not finished, terminating ones included."""
    pods = store.objects.get(PODS, {})
    return [p for k in store.pods_by_node.get(node, ()) if (p := pods.get(k)) is not None
            and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")]  # fmt: skip


def _pack(need: int, free: list[str], domain_of, held: list[str], last: set[str]) -> list[str] | None:
    """`need` of the `free` nodes packed into domains: the one domain that fits them with the fewest free nodes
    left, else whole domains, largest first; the domains the gang holds or last ran in come first."""
    domains: dict[str, list[str]] = {}
    for n in sorted(free, key=lambda n: (n not in last, n)):
        domains.setdefault(domain_of(n), []).append(n)
    ours = {d: sum(1 for n in held if domain_of(n) == d) + sum(1 for n in last if domain_of(n) == d) for d in domains}
    fits = [d for d, ns in domains.items() if len(ns) >= need]
    if fits:
        return domains[min(fits, key=lambda d: (-ours[d], len(domains[d]), d))][:need]
    chosen: list[str] = []
    for d in sorted(domains, key=lambda d: (-ours[d], -len(domains[d]), d)):
        chosen += domains[d][: need - len(chosen)]
        if len(chosen) == need:
            return chosen
    return None
