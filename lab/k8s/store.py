"""The object store: one lock, one global resourceVersion, watch history, audit log, PDB status math.

Longer than 600 lines because the indexes, the watch history, the timers and the PDB math all change on the same
`put`/`remove` under the same lock, so they stay next to those two writes."""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import dataclasses
import heapq
import math
import os
import time
import traceback
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lab.faults import AuditLog, FaultTable

from . import evidence, mig
from .resources import Registry, ResourceType
from .selectors import match_selector_obj, selector_obj_empty
from .util import ApiError, clone, diff, now_rfc3339

DEFAULT_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
DISRUPTED_POD_TIMEOUT_S = 120.0
AUDIT_MAX = 200_000
# A file: every write checks that the object it replaces is as it was stored (`Store._check_unchanged`), and
# reports here what was changed in place. The tests' emulators set it (tests/kube_helpers.py `checked_emulator`).
UNCHANGED_CHECK_ENV = "LAB_K8S_UNCHANGED_CHECK"
FAULT_MATCH_KEYS = (
    "verb",
    "group",
    "version",
    "resource",
    "subresource",
    "namespace",
    "name",
)  # resources.Info's facts

PODS = ("", "pods")
PDBS = ("policy", "poddisruptionbudgets")
NAMESPACES = ("", "namespaces")
NODES = ("", "nodes")
CRDS = ("apiextensions.k8s.io", "customresourcedefinitions")
REPLICASETS = ("apps", "replicasets")
JOBS = ("batch", "jobs")

ObjKey = tuple[tuple[str, str], tuple[str, str]]  # (resource key, (namespace, name))


def default_jobs_config() -> dict:
    """Job outcome rules (see lab/k8s/controllers/kubelet.py `match_job_rule`): every rule field is optional."""
    return {"defaultSeconds": 1.0, "rules": []}


def default_config() -> dict:
    return {
        "podStartSeconds": 1.0,
        "graceScale": 0.1,
        "disruptionControllerFrozen": False,
        "watchHistorySize": 10_000,
        "bookmarkSeconds": 5.0,
        "rebootSeconds": 2.0,
        "jobs": default_jobs_config(),
        # lab/k8s/controllers/migmanager.py: the device plugin's strategy, how long a reconfiguration stays
        # `pending`, whether it reboots the node, per-node overrides {node: {"fail": reason, "reboot": bool}}, and
        # whether NVIDIA's DRA driver publishes the node's ResourceSlice
        "migStrategy": "mixed",
        "migPendingSeconds": 0.2,
        "migReboot": False,
        "migNodes": {},
        "migDra": False,
        # lab/k8s/controllers/kai.py: how long a KAI gang may stay below its minMember before the rest of it is
        # evicted (KAI's --default-staleness-grace-period; negative: never)
        "kaiStalenessGraceSeconds": 60.0,
    }


def owner_index_keys(obj: dict) -> list:
    """Keys under which an object is indexed as a dependent: each owner's uid (or kind/ns/name without one)."""
    md = obj.get("metadata") or {}
    out = []
    for ref in md.get("ownerReferences") or []:
        uid = ref.get("uid")
        out.append(uid if uid else ("~", ref.get("kind"), md.get("namespace") or "", ref.get("name")))
    return out


@dataclass(eq=False)
class Watcher:
    key: tuple[str, str]
    namespace: str | None
    label: Callable[[dict], bool]
    field: Callable[[dict], bool]
    queue: asyncio.Queue = dataclasses.field(default_factory=lambda: asyncio.Queue(maxsize=50_000))
    closed: bool = False

    def matches(self, obj: dict | None) -> bool:
        if obj is None:
            return False
        md = obj.get("metadata") or {}
        if self.namespace is not None and md.get("namespace") != self.namespace:
            return False
        return self.label(md.get("labels") or {}) and self.field(obj)


NODE_INFO_FIELDS = (
    "architecture",
    "bootID",
    "containerRuntimeVersion",
    "kernelVersion",
    "kubeProxyVersion",
    "kubeletVersion",
    "machineID",
    "operatingSystem",
    "osImage",
    "systemUUID",
)


def normalize_node(node: dict) -> None:
    """NodeSystemInfo fields are non-omitempty strings in the real API (the typed client requires them)."""
    info = node.setdefault("status", {}).setdefault("nodeInfo", {})
    for f in NODE_INFO_FIELDS:
        if info.get(f) is None:
            info[f] = ""


def node_ready(node: dict) -> bool:
    for c in (node.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Ready":
            return c.get("status") == "True"
    return False


def is_pod_ready(pod: dict) -> bool:
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Ready":
            return c.get("status") == "True"
    return False


def pod_healthy(pod: dict) -> bool:
    return (
        (pod.get("status") or {}).get("phase") == "Running"
        and is_pod_ready(pod)
        and not pod["metadata"].get("deletionTimestamp")
    )


def controller_ref(obj: dict) -> dict | None:
    for ref in obj.get("metadata", {}).get("ownerReferences") or []:
        if ref.get("controller"):
            return ref
    return None


def scaled(value: Any, total: int, round_up: bool = True) -> int:
    if isinstance(value, str) and value.endswith("%"):
        pct = float(value[:-1] or 0)
        v = pct * total / 100.0
        return math.ceil(v) if round_up else math.floor(v)
    return int(value)


class Store:
    def __init__(self, config: dict | None = None) -> None:
        self.base_config = {**default_config(), **(config or {})}
        self.config = clone(self.base_config)
        self.lock = asyncio.Lock()
        self.registry = Registry()
        self.objects: dict[tuple[str, str], dict[tuple[str, str], dict]] = {}
        self.rv = 0
        self.history: deque = deque()
        self.history_floor = 0
        self.watchers: set[Watcher] = set()
        self.audit = AuditLog(AUDIT_MAX)  # lab/faults.py, with what `audit_add` adds
        self.faults = FaultTable(FAULT_MATCH_KEYS)
        self.kick = asyncio.Event()
        self.side: dict[str, dict] = {}  # per-uid simulator bookkeeping (monotonic deadlines)
        self.gc_owners: set[str] = set()  # uids deleted with cascading propagation
        self.gpu_readings: dict[str, dict[int | None, dict[str, float]]] = {}  # lab/k8s/dcgm.py: node -> GPU -> set
        self._in_pdb = False
        self._unchanged_log = os.environ.get(UNCHANGED_CHECK_ENV)
        self._as_stored: dict[int, tuple[dict, dict]] = {}  # id -> (stored object, its copy), with the check on
        self._init_indexes()
        self._bootstrap()

    def _init_indexes(self) -> None:
        """Indexes kept in step with every put/remove, so hot paths are O(matching), not O(all)."""
        self._sorted: dict[tuple[str, str], list[tuple[str, str]]] = {}  # sorted keys per resource
        self.by_uid: dict[str, ObjKey] = {}
        self.dependents: dict[Any, set[ObjKey]] = {}  # owner uid -> dependents
        self.pods_by_node: dict[str, set[tuple[str, str]]] = {}
        self.unscheduled: set[tuple[str, str]] = set()  # pods without spec.nodeName
        self.dirty: set[ObjKey] = set()  # written since the controllers' last pass (and their owners)
        self.timers: list[tuple[float, int, ObjKey]] = []  # heap of (monotonic due, seq, object)
        self.timer_at: dict[ObjKey, float] = {}
        self._timer_seq = 0
        self.rebooting: dict[str, float] = {}  # node name -> monotonic time the reboot ends

    # ------------------------------------------------------------------ lifecycle
    def _bootstrap(self) -> None:
        for ns in DEFAULT_NAMESPACES:
            rt = self.registry.types[NAMESPACES]
            self.put(rt, self.new_meta(rt, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}))

    def reset(self) -> None:
        self.registry.reset()
        self.objects.clear()
        for w in list(self.watchers):
            self.close_watcher(w)
        self.history.clear()
        # Older resourceVersions are gone: a watch resumed from one is told 410 Expired and lists again, as it would
        # be by a real API server, instead of carrying on with objects the reset removed without a DELETED event.
        self.rv += 1
        self.history_floor = self.rv
        self.audit.clear()
        self.faults.clear()
        self.side.clear()
        self.gc_owners.clear()
        self.gpu_readings.clear()
        self.config = clone(self.base_config)
        self._init_indexes()
        self._bootstrap()

    # ------------------------------------------------------------------ reads
    def bucket(self, rt: ResourceType) -> dict[tuple[str, str], dict]:
        return self.objects.setdefault(rt.key, {})

    def get(self, rt: ResourceType, ns: str | None, name: str) -> dict | None:
        return self.objects.get(rt.key, {}).get((ns or "", name))

    def sorted_keys(self, key: tuple[str, str]) -> list[tuple[str, str]]:
        """(namespace, name) keys of a resource, sorted; cached and kept up to date by put/remove."""
        keys = self._sorted.get(key)
        if keys is None:
            keys = self._sorted[key] = sorted(self.objects.get(key, {}))
        return keys

    def key_range(self, key: tuple[str, str], ns: str | None = None) -> tuple[list[tuple[str, str]], int, int]:
        keys = self.sorted_keys(key)
        if ns is None:
            return keys, 0, len(keys)
        return keys, bisect.bisect_left(keys, (ns, "")), bisect.bisect_left(keys, (ns + "\x00", ""))

    def all(self, key: tuple[str, str], ns: str | None = None) -> list[dict]:
        objs = self.objects.get(key, {})
        keys, lo, hi = self.key_range(key, ns)
        return [objs[k] for k in keys[lo:hi]]

    def lookup(self, ok: ObjKey) -> dict | None:
        return self.objects.get(ok[0], {}).get(ok[1])

    def owned(self, owner: dict, key: tuple[str, str] | None = None, controller_only: bool = True) -> list[dict]:
        """Objects (of resource `key`) whose (controller) ownerReference points at `owner`."""
        md = owner["metadata"]
        found: set[ObjKey] = set(self.dependents.get(md.get("uid"), ()))
        found |= self.dependents.get(("~", owner.get("kind"), md.get("namespace") or "", md.get("name")), set())
        out = []
        for ok in sorted(found):
            if key is not None and ok[0] != key:
                continue
            o = self.lookup(ok)
            if o is None:
                continue
            if controller_only:
                ref = controller_ref(o)
                if not ref or ref.get("kind") != owner.get("kind"):
                    continue
                if (ref["uid"] != md.get("uid")) if ref.get("uid") else (ref.get("name") != md.get("name")):
                    continue
            out.append(o)
        return out

    # ------------------------------------------------------------------ indexes and timers
    def _index_add(self, key: tuple[str, str], k: tuple[str, str], obj: dict, old: dict | None) -> None:
        ok = (key, k)
        if old is None:
            keys = self._sorted.get(key)
            if keys is not None:
                bisect.insort(keys, k)
        else:
            self._index_drop_refs(ok, old, obj)
        md = obj["metadata"]
        if md.get("uid"):
            self.by_uid[md["uid"]] = ok
        for ik in owner_index_keys(obj):
            self.dependents.setdefault(ik, set()).add(ok)
        if key == PODS:
            node = (obj.get("spec") or {}).get("nodeName")
            if node:
                self.pods_by_node.setdefault(node, set()).add(k)
                self.unscheduled.discard(k)
            else:
                self.unscheduled.add(k)
        self._mark_dirty(ok, obj)

    def _index_drop_refs(self, ok: ObjKey, old: dict, new: dict | None) -> None:
        omd = old["metadata"]
        if (
            omd.get("uid")
            and (new is None or new["metadata"].get("uid") != omd["uid"])
            and self.by_uid.get(omd["uid"]) == ok
        ):
            del self.by_uid[omd["uid"]]
        keep = set(owner_index_keys(new)) if new is not None else set()
        for ik in owner_index_keys(old):
            if ik in keep:
                continue
            deps = self.dependents.get(ik)
            if deps is not None:
                deps.discard(ok)
                if not deps:
                    del self.dependents[ik]
        if ok[0] == PODS:
            node = (old.get("spec") or {}).get("nodeName")
            if node and (new is None or (new.get("spec") or {}).get("nodeName") != node):
                on = self.pods_by_node.get(node)
                if on is not None:
                    on.discard(ok[1])
                    if not on:
                        del self.pods_by_node[node]
            if new is None:
                self.unscheduled.discard(ok[1])

    def _index_remove(self, key: tuple[str, str], k: tuple[str, str], old: dict) -> None:
        ok = (key, k)
        keys = self._sorted.get(key)
        if keys is not None:
            i = bisect.bisect_left(keys, k)
            if i < len(keys) and keys[i] == k:
                del keys[i]
        self._index_drop_refs(ok, old, None)
        self._mark_dirty(ok, old)

    def _mark_dirty(self, ok: ObjKey, obj: dict) -> None:
        self.dirty.add(ok)
        ref = controller_ref(obj)
        if ref and ref.get("uid") in self.by_uid:
            self.dirty.add(self.by_uid[ref["uid"]])

    def schedule_at(self, due: float, ok: ObjKey) -> None:
        """Have the controllers look at `ok` again at monotonic time `due`."""
        cur = self.timer_at.get(ok)
        if cur is not None and cur <= due:
            return
        self.timer_at[ok] = due
        self._timer_seq += 1
        heapq.heappush(self.timers, (due, self._timer_seq, ok))

    def pop_due(self, now: float) -> set[ObjKey]:
        out: set[ObjKey] = set()
        while self.timers and self.timers[0][0] <= now:
            due, _, ok = heapq.heappop(self.timers)
            if self.timer_at.get(ok) == due:
                del self.timer_at[ok]
                out.add(ok)
        return out

    def next_timer(self) -> float | None:
        while self.timers and self.timer_at.get(self.timers[0][2]) != self.timers[0][0]:
            heapq.heappop(self.timers)
        return self.timers[0][0] if self.timers else None

    def not_found(self, rt: ResourceType, name: str) -> ApiError:
        details = {"name": name, "kind": rt.plural}
        if rt.group:
            details["group"] = rt.group
        return ApiError(404, f'{rt.group_resource} "{name}" not found', "NotFound", details)

    def conflict(
        self,
        rt: ResourceType,
        name: str,
        why: str = "the object has been modified; please apply your changes to the latest version and try again",
    ) -> ApiError:
        details = {"name": name, "kind": rt.plural}
        if rt.group:
            details["group"] = rt.group
        return ApiError(
            409, f'Operation cannot be fulfilled on {rt.group_resource} "{name}": {why}', "Conflict", details
        )

    # ------------------------------------------------------------------ writes (lock held)
    def new_meta(self, rt: ResourceType, obj: dict, keep_uid: bool = False) -> dict:
        md = obj.setdefault("metadata", {})
        if not (keep_uid and md.get("uid")):
            md["uid"] = str(uuid.uuid4())
        if not (keep_uid and md.get("creationTimestamp")):
            md["creationTimestamp"] = now_rfc3339()
        if rt.generation:
            if not (keep_uid and md.get("generation")):
                md["generation"] = 1
        else:
            md.pop("generation", None)
        obj["apiVersion"] = rt.api_version
        obj["kind"] = rt.kind
        if rt.key == NAMESPACES:
            md.setdefault("labels", {})["kubernetes.io/metadata.name"] = md["name"]
            obj.setdefault("spec", {}).setdefault("finalizers", ["kubernetes"])
            obj.setdefault("status", {}).setdefault("phase", "Active")
        return obj

    def put(
        self, rt: ResourceType, obj: dict, actor: str | None = None, verb: str | None = None, subresource: str = ""
    ) -> dict:
        md = obj["metadata"]
        k = (md.get("namespace") or "", md["name"])
        bucket = self.bucket(rt)
        old = bucket.get(k)
        self._check_unchanged(rt, k, old, obj)
        if rt.key == NODES:
            normalize_node(obj)
        self.rv += 1
        md["resourceVersion"] = str(self.rv)
        obj["apiVersion"] = rt.api_version
        obj["kind"] = rt.kind
        bucket[k] = obj
        self._index_add(rt.key, k, obj, old)
        self._emit(rt, "MODIFIED" if old else "ADDED", obj, old)
        if actor:
            self.audit_write(
                actor, verb or ("update" if old else "create"), rt, obj, old, subresource, 200 if old else 201
            )
        self._after_write(rt, obj)
        return obj

    def remove(self, rt: ResourceType, obj: dict, actor: str | None = None) -> dict:
        md = obj["metadata"]
        k = (md.get("namespace") or "", md["name"])
        bucket = self.bucket(rt)
        old = bucket.pop(k, None)
        if old is None:
            return obj
        self._check_unchanged(rt, k, old, None)
        self._index_remove(rt.key, k, old)
        self.rv += 1
        final = {**old, "metadata": {**old["metadata"], "resourceVersion": str(self.rv)}}
        self._emit(rt, "DELETED", final, old)
        self.side.pop(md.get("uid", ""), None)
        if actor:
            self.audit_write(actor, "delete", rt, None, old, "", 200)
        if rt.key == CRDS:
            for key in self.registry.unregister_crd(md["name"]):
                owned = self.objects.pop(key, {})
                self._sorted.pop(key, None)
                for ok, o in owned.items():
                    self._index_remove(key, ok, o)
                    self.rv += 1
                    self._emit_raw(key, "DELETED", o, o)
        self._after_write(rt, final)
        return final

    def _after_write(self, rt: ResourceType, obj: dict) -> None:
        if rt.key in (PODS, PDBS):
            self.recompute_pdbs(obj["metadata"].get("namespace") or "")
        self.kick.set()

    # ------------------------------------------------------------------ watch plumbing
    def _emit(self, rt: ResourceType, etype: str, obj: dict, old: dict | None) -> None:
        self._emit_raw(rt.key, etype, obj, old)

    def _emit_raw(self, key: tuple[str, str], etype: str, obj: dict, old: dict | None) -> None:
        # The stored version itself, not a copy: a stored object is never changed in place (every writer copies it
        # first), which the tests check. Copying each one here was 20 % of the emulator's CPU at 10,000 nodes.
        ev = (self.rv, key, etype, obj, old)
        if self._unchanged_log and etype != "DELETED":
            self._as_stored[id(obj)] = (obj, clone(obj))
        self.history.append(ev)
        limit = max(1, int(self.config.get("watchHistorySize") or 10_000))
        while len(self.history) > limit:
            dropped = self.history.popleft()
            self.history_floor = dropped[0]
        for w in list(self.watchers):
            if w.key == key:
                self.deliver(w, ev)

    def _check_unchanged(self, rt: ResourceType, k: tuple[str, str], old: dict | None, obj: dict | None) -> None:
        """With the check on, report to its file a write of the stored object itself, or a stored object that was
        changed in place since it was stored (the watch history holds stored versions: `_emit_raw`)."""
        if old is None or not self._unchanged_log:
            return
        kept = self._as_stored.pop(id(old), None)
        if old is obj:
            why = "written again after being changed in place"
        elif kept is not None and kept[0] is old and kept[1] != old:
            why = f"changed in place after it was stored: {diff(kept[1], old)}"
        else:
            return
        with open(self._unchanged_log, "a") as out:
            out.write(f"{rt.plural} {'/'.join(filter(None, k))} {why}\n{''.join(traceback.format_stack(limit=8))}\n")

    def translate(self, w: Watcher, ev: tuple) -> tuple[str, dict] | None:
        _, _, etype, obj, old = ev
        if etype == "MODIFIED":
            now_m, was_m = w.matches(obj), w.matches(old)
            if now_m and was_m:
                return "MODIFIED", obj
            if now_m:
                return "ADDED", obj
            if was_m:
                return "DELETED", obj
            return None
        return (etype, obj) if w.matches(obj) else None

    def deliver(self, w: Watcher, ev: tuple) -> None:
        if w.closed:
            return
        t = self.translate(w, ev)
        if t is None:
            return
        try:
            w.queue.put_nowait(t)
        except asyncio.QueueFull:
            self.close_watcher(w)

    def close_watcher(self, w: Watcher) -> None:
        w.closed = True
        self.watchers.discard(w)
        with contextlib.suppress(asyncio.QueueFull):
            w.queue.put_nowait(None)

    # ------------------------------------------------------------------ audit
    def pods_on_node(self, node: str) -> list[dict]:
        """The pods bound to `node` that have not finished (terminating ones too: they still run), name order."""
        out = []
        for ns, name in sorted(self.pods_by_node.get(node, ())):
            pod = self.get(self.registry.types[PODS], ns, name)
            if pod is None or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                continue
            md = pod["metadata"]
            out.append(
                {
                    "pod": f"{ns}/{name}",
                    "uid": md.get("uid"),
                    "controller": (controller_ref(pod) or {}).get("kind"),
                    "deleting": bool(md.get("deletionTimestamp")),
                    "gpus": mig.uses_gpus(pod),
                }
            )
        return out

    def audit_add(self, entry: dict) -> dict:
        ok = entry.get("write") and 200 <= (entry.get("code") or 0) < 300
        if ok and entry.get("resource") == "nodes":
            # What the write left the node as, so tests can tell from the log alone how many
            # nodes were out of service (cordoned by anyone, or NotReady) at every moment, and
            # which pods were still on a node when it went down.
            node = self.get(self.registry.types[NODES], None, entry.get("name") or "")
            if node is not None:
                entry["nodeAfter"] = {
                    "unschedulable": bool((node.get("spec") or {}).get("unschedulable")),
                    "ready": node_ready(node),
                    "pods": self.pods_on_node(node["metadata"]["name"]),
                }
                change = next((c for c in entry.get("changes") or () if c.get("path") == mig.CONFIG_CHANGE_PATH), None)
                if change is not None:  # whether GPU pods still ran when mig-manager was told to change the layout
                    gpu_pods = [p["pod"] for p in entry["nodeAfter"]["pods"] if p["gpus"]]
                    entry["migConfigChange"] = {"from": change["old"], "to": change["new"], "gpuPods": gpu_pods}
        elif ok and entry.get("resource") == "jobs" and entry.get("verb") == "create":
            # A Job pinned to a node (a package stage) and what ran on that node when it was created.
            job = self.get(self.registry.types[JOBS], entry.get("namespace"), entry.get("name") or "")
            spec = (((job or {}).get("spec") or {}).get("template") or {}).get("spec") or {}
            if job is not None and spec.get("nodeName"):
                entry["jobAfter"] = {
                    "node": spec["nodeName"],
                    "labels": dict(job["metadata"].get("labels") or {}),
                    "podsOnNode": self.pods_on_node(spec["nodeName"]),
                }
        self.audit.add(entry)
        evidence.note(entry)  # survives /_lab/reset: what the least-privilege check reads
        return entry

    def audit_write(
        self,
        actor: str,
        verb: str,
        rt: ResourceType,
        obj: dict | None,
        old: dict | None,
        subresource: str,
        code: int,
        extra: dict | None = None,
    ) -> None:
        ref = obj or old or {}
        md = ref.get("metadata") or {}
        entry = {
            "time": time.time(),
            "verb": verb,
            "group": rt.group,
            "version": rt.version,
            "resource": rt.plural,
            "subresource": subresource,
            "namespace": md.get("namespace") or "",
            "name": md.get("name") or "",
            "code": code,
            "userAgent": f"lab-controller/{actor}" if "/" not in actor else actor,
            "write": True,
            "resourceVersion": (obj or {}).get("metadata", {}).get("resourceVersion"),
            "changes": diff(old, obj),
        }
        if extra:
            entry.update(extra)
        self.audit_add(entry)

    # ------------------------------------------------------------------ disruption controller
    def pdbs_for_pod(self, pod: dict) -> list[dict]:
        ns = pod["metadata"].get("namespace") or ""
        out = []
        for pdb in self.all(PDBS, ns):
            sel = (pdb.get("spec") or {}).get("selector")
            if selector_obj_empty(sel):
                continue  # a nil or empty selector matches nothing (eviction.go)
            try:
                if match_selector_obj(sel, pod["metadata"].get("labels")):
                    out.append(pdb)
            except ValueError:
                continue
        return out

    def pdb_pods(self, pdb: dict) -> list[dict]:
        sel = (pdb.get("spec") or {}).get("selector")
        if selector_obj_empty(sel):
            return []
        ns = pdb["metadata"].get("namespace") or ""
        out = []
        for p in self.all(PODS, ns):
            try:
                if match_selector_obj(sel, p["metadata"].get("labels")):
                    out.append(p)
            except ValueError:
                return []
        return out

    def pdb_math(self, pdb: dict) -> dict:
        """Live PDB numbers: expectedPods, currentHealthy, desiredHealthy, disruptionsAllowed, disruptedPods."""
        spec = pdb.get("spec") or {}
        pods = self.pdb_pods(pdb)
        now = time.time()
        disrupted_in = (pdb.get("status") or {}).get("disruptedPods") or {}
        live = {p["metadata"]["name"]: p for p in pods}
        disrupted = {}
        for name, ts in disrupted_in.items():
            p = live.get(name)
            if p is None or p["metadata"].get("deletionTimestamp"):
                continue
            t = self.side.get(p["metadata"].get("uid", ""), {}).get("disrupted_at")
            if t is not None and now - t > DISRUPTED_POD_TIMEOUT_S:
                continue
            disrupted[name] = ts
        healthy = sum(1 for p in pods if pod_healthy(p) and p["metadata"]["name"] not in disrupted)
        min_av, max_un = spec.get("minAvailable"), spec.get("maxUnavailable")
        if max_un is not None or (isinstance(min_av, str) and min_av.endswith("%")):
            expected = self._expected_scale(pods)
        else:
            expected = len(pods)
        if max_un is not None:
            desired = max(0, expected - scaled(max_un, expected))
        elif min_av is not None:
            desired = scaled(min_av, expected)
        else:
            desired = 0
        return {
            "expectedPods": expected,
            "currentHealthy": healthy,
            "desiredHealthy": desired,
            "disruptionsAllowed": max(0, healthy - desired),
            "disruptedPods": disrupted,
        }

    def _expected_scale(self, pods: list[dict]) -> int:
        total, seen = 0, set()
        for p in pods:
            ref = controller_ref(p)
            if ref and ref.get("kind") in ("ReplicaSet", "StatefulSet", "Deployment"):
                if ref.get("uid") in seen:
                    continue
                seen.add(ref.get("uid"))
                plural = {"ReplicaSet": "replicasets", "StatefulSet": "statefulsets", "Deployment": "deployments"}[
                    ref["kind"]
                ]
                owner = self.objects.get(("apps", plural), {}).get(
                    (p["metadata"].get("namespace") or "", ref.get("name") or "")
                )
                if owner is not None:
                    total += int((owner.get("spec") or {}).get("replicas", 1))
                    continue
            total += 1
        return total

    def recompute_pdbs(self, ns: str) -> None:
        if self._in_pdb or self.config.get("disruptionControllerFrozen"):
            return
        rt = self.registry.types[PDBS]
        self._in_pdb = True
        try:
            for pdb in self.all(PDBS, ns):
                if pdb["metadata"].get("deletionTimestamp"):
                    continue
                m = self.pdb_math(pdb)
                old_status = pdb.get("status") or {}
                allowed = m["disruptionsAllowed"] > 0
                cond_status = "True" if allowed else "False"
                conds = [c for c in old_status.get("conditions") or [] if c.get("type") == "DisruptionAllowed"]
                prev = conds[0] if conds else None
                gen = pdb["metadata"].get("generation", 1)
                cond = {
                    "type": "DisruptionAllowed",
                    "status": cond_status,
                    "reason": "SufficientPods" if allowed else "InsufficientPods",
                    "message": "",
                    "observedGeneration": gen,
                    "lastTransitionTime": prev["lastTransitionTime"]
                    if prev and prev.get("status") == cond_status and prev.get("lastTransitionTime")
                    else now_rfc3339(),
                }
                status = {
                    "observedGeneration": gen,
                    "disruptionsAllowed": m["disruptionsAllowed"],
                    "currentHealthy": m["currentHealthy"],
                    "desiredHealthy": m["desiredHealthy"],
                    "expectedPods": m["expectedPods"],
                    "conditions": [cond],
                }
                if m["disruptedPods"]:
                    status["disruptedPods"] = m["disruptedPods"]
                if status != old_status:
                    new = clone(pdb)
                    new["status"] = status
                    self.put(rt, new, actor="disruption-controller", verb="update", subresource="status")
        finally:
            self._in_pdb = False
