"""Simulated cluster components: kubelet, scheduler, ReplicaSet controller, garbage collector, namespace
cleanup, CRD cleanup. One task; every timer is a deadline checked by that task, so shutdown cancels all."""

from __future__ import annotations

import asyncio
import copy
import logging
import time
from typing import TYPE_CHECKING

from .store import NAMESPACES, NODES, PODS, REPLICASETS, controller_ref, is_pod_ready
from .util import now_rfc3339, random_suffix

if TYPE_CHECKING:
    from .api import Api

log = logging.getLogger("lab.k8s.controllers")
FINISH_ANNOTATION = "lab.millwright.dev/finish-after-seconds"


def node_ready(node: dict) -> bool:
    for c in (node.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Ready":
            return c.get("status") == "True"
    return False


def _gpu_request(pod: dict) -> float:
    total = 0.0
    for c in (pod.get("spec") or {}).get("containers") or []:
        res = c.get("resources") or {}
        v = (res.get("limits") or {}).get("nvidia.com/gpu") or (res.get("requests") or {}).get("nvidia.com/gpu")
        if v is not None:
            try:
                total += float(v)
            except (TypeError, ValueError):
                pass
    return total


def _tolerated(taint: dict, tolerations: list[dict]) -> bool:
    for t in tolerations or []:
        if t.get("effect") and t.get("effect") != taint.get("effect"):
            continue
        if t.get("operator") == "Exists" and (not t.get("key") or t.get("key") == taint.get("key")):
            return True
        if t.get("key") == taint.get("key") and t.get("value", "") == taint.get("value", ""):
            return True
    return False


def _active(pod: dict) -> bool:
    return not pod["metadata"].get("deletionTimestamp") and \
        (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")


class Controllers:
    def __init__(self, api: "Api"):
        self.api = api
        self.store = api.store
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="lab-controllers")

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass

    async def _run(self) -> None:
        store = self.store
        while True:
            async with store.lock:
                store.kick.clear()
                try:
                    nxt = self.reconcile()
                except Exception:  # a controller bug must not kill the server
                    log.exception("controller reconcile failed")
                    nxt = 1.0
            try:
                await asyncio.wait_for(store.kick.wait(), max(0.01, min(nxt, 1.0)))
            except asyncio.TimeoutError:
                pass

    # ------------------------------------------------------------------ one pass (lock held)
    def reconcile(self) -> float:
        now = time.monotonic()
        nxt = [1.0]
        self.namespaces()
        self.garbage_collect()
        self.replicasets()
        self.schedule()
        self.kubelet(now, nxt)
        return min(nxt)

    def pod_rt(self):
        return self.store.registry.types[PODS]

    def kubelet(self, now: float, nxt: list[float]) -> None:
        store, rt = self.store, self.pod_rt()
        cfg = store.config
        for pod in store.all(PODS):
            md = pod["metadata"]
            uid = md.get("uid", "")
            side = store.side.setdefault(uid, {})
            status = pod.get("status") or {}
            phase = status.get("phase")
            if md.get("deletionTimestamp"):
                due = side.get("delete_at")
                if due is None:
                    grace = md.get("deletionGracePeriodSeconds") or 0
                    due = side["delete_at"] = now + float(grace) * float(cfg.get("graceScale", 1.0))
                if now >= due:
                    if not md.get("finalizers"):
                        store.remove(rt, pod, actor="kubelet")
                    elif phase not in ("Succeeded", "Failed"):
                        new = copy.deepcopy(pod)
                        new["status"]["phase"] = "Failed" if phase == "Running" else "Succeeded"
                        self._set_ready(new, False, "PodCompleted")
                        store.put(rt, new, actor="kubelet", verb="update", subresource="status")
                else:
                    nxt.append(due - now)
                continue
            node_name = (pod.get("spec") or {}).get("nodeName")
            if not node_name:
                continue
            if phase in (None, "", "Pending"):
                due = side.setdefault("start_at", now + float(cfg.get("podStartSeconds", 1.0)))
                if now >= due:
                    self._start(pod, node_name)
                else:
                    nxt.append(due - now)
                continue
            if phase == "Running":
                ann = (md.get("annotations") or {}).get(FINISH_ANNOTATION)
                if ann is None:
                    continue
                try:
                    after = float(ann)
                except ValueError:
                    continue
                since = side.setdefault("running_since", now)
                due = since + after
                if now >= due:
                    new = copy.deepcopy(pod)
                    new["status"]["phase"] = "Succeeded"
                    self._set_ready(new, False, "PodCompleted")
                    for cs in new["status"].get("containerStatuses") or []:
                        cs["ready"] = False
                        cs["started"] = False
                        cs["state"] = {"terminated": {"exitCode": 0, "reason": "Completed",
                                                      "startedAt": new["status"].get("startTime"),
                                                      "finishedAt": now_rfc3339()}}
                    store.put(rt, new, actor="kubelet", verb="update", subresource="status")
                else:
                    nxt.append(due - now)

    @staticmethod
    def _set_ready(pod: dict, ready: bool, reason: str | None = None) -> None:
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

    def _start(self, pod: dict, node_name: str) -> None:
        store, rt = self.store, self.pod_rt()
        node = store.get(store.registry.types[NODES], None, node_name)
        new = copy.deepcopy(pod)
        st = new.setdefault("status", {})
        ts = now_rfc3339()
        st["phase"] = "Running"
        st["startTime"] = st.get("startTime") or ts
        host_ip = "10.0.0.1"
        for a in ((node or {}).get("status") or {}).get("addresses") or []:
            if a.get("type") == "InternalIP":
                host_ip = a.get("address")
        st["hostIP"] = host_ip
        st["hostIPs"] = [{"ip": host_ip}]
        n = int(new["metadata"]["resourceVersion"]) % 250 + 2
        st["podIP"] = st.get("podIP") or f"10.244.{abs(hash(node_name)) % 250}.{n}"
        st["podIPs"] = [{"ip": st["podIP"]}]
        conds = [c for c in st.get("conditions") or [] if c.get("type") not in ("Ready", "ContainersReady",
                                                                                  "Initialized", "PodScheduled")]
        for t in ("PodReadyToStartContainers", "Initialized", "PodScheduled"):
            if not any(c.get("type") == t for c in conds):
                conds.append({"type": t, "status": "True", "lastProbeTime": None, "lastTransitionTime": ts})
        st["conditions"] = conds
        self._set_ready(new, True)
        st["containerStatuses"] = [
            {"name": c.get("name"), "image": c.get("image", ""), "imageID": "", "ready": True, "started": True,
             "restartCount": 0, "containerID": f"containerd://{random_suffix(12)}",
             "state": {"running": {"startedAt": ts}}}
            for c in (new.get("spec") or {}).get("containers") or []]
        store.side.setdefault(new["metadata"].get("uid", ""), {})["running_since"] = time.monotonic()
        store.put(rt, new, actor="kubelet", verb="update", subresource="status")

    # ------------------------------------------------------------------ scheduler
    def pick_node(self, pod: dict) -> str | None:
        store = self.store
        spec = pod.get("spec") or {}
        sel = spec.get("nodeSelector") or {}
        need_gpu = _gpu_request(pod)
        load: dict[str, int] = {}
        gpus_used: dict[str, float] = {}
        for p in store.all(PODS):
            nn = (p.get("spec") or {}).get("nodeName")
            if nn and _active(p):
                load[nn] = load.get(nn, 0) + 1
                gpus_used[nn] = gpus_used.get(nn, 0.0) + _gpu_request(p)
        candidates = []
        for node in store.all(NODES):
            md, nspec = node["metadata"], node.get("spec") or {}
            if not node_ready(node) or nspec.get("unschedulable") or md.get("deletionTimestamp"):
                continue
            labels = md.get("labels") or {}
            if any(labels.get(k) != v for k, v in sel.items()):
                continue
            if any(t.get("effect") in ("NoSchedule", "NoExecute") and not _tolerated(t, spec.get("tolerations"))
                   for t in nspec.get("taints") or []):
                continue
            if need_gpu:
                alloc = ((node.get("status") or {}).get("allocatable") or {}).get("nvidia.com/gpu", 0)
                try:
                    alloc = float(alloc)
                except (TypeError, ValueError):
                    alloc = 0.0
                if gpus_used.get(md["name"], 0.0) + need_gpu > alloc:
                    continue
            candidates.append((load.get(md["name"], 0), md["name"]))
        return min(candidates)[1] if candidates else None

    def schedule(self) -> None:
        store, rt = self.store, self.pod_rt()
        for pod in store.all(PODS):
            spec = pod.get("spec") or {}
            if spec.get("nodeName") or not _active(pod):
                continue
            ref = controller_ref(pod)
            if not ref or ref.get("kind") != "ReplicaSet":
                continue
            if spec.get("schedulerName", "default-scheduler") != "default-scheduler":
                continue
            node = self.pick_node(pod)
            new = copy.deepcopy(pod)
            conds = [c for c in (new.get("status") or {}).get("conditions") or [] if c.get("type") != "PodScheduled"]
            if node is None:
                cond = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "lastProbeTime": None,
                        "message": "0/%d nodes are available." % len(store.all(NODES)),
                        "lastTransitionTime": now_rfc3339()}
                old = next((c for c in (pod.get("status") or {}).get("conditions") or []
                            if c.get("type") == "PodScheduled"), None)
                if old and old.get("status") == "False" and old.get("message") == cond["message"]:
                    continue
                new.setdefault("status", {})["conditions"] = conds + [cond]
                store.put(rt, new, actor="scheduler", verb="update", subresource="status")
                continue
            new["spec"]["nodeName"] = node
            new.setdefault("status", {})["conditions"] = conds + [
                {"type": "PodScheduled", "status": "True", "lastProbeTime": None, "lastTransitionTime": now_rfc3339()}]
            store.put(rt, new, actor="scheduler", verb="create", subresource="binding")

    # ------------------------------------------------------------------ ReplicaSet controller
    def replicasets(self) -> None:
        store = self.store
        rs_rt = store.registry.types[REPLICASETS]
        pod_rt = self.pod_rt()
        pods = store.all(PODS)
        for rs in store.all(REPLICASETS):
            md = rs["metadata"]
            if md.get("deletionTimestamp"):
                continue
            ns, uid = md.get("namespace"), md.get("uid")
            owned = [p for p in pods if p["metadata"].get("namespace") == ns and self._owned_by(p, rs)]
            active = [p for p in owned if _active(p)]
            want = int((rs.get("spec") or {}).get("replicas", 1))
            if len(active) < want:
                for _ in range(want - len(active)):
                    self._create_pod(rs)
            elif len(active) > want:
                def rank(p: dict):
                    return (bool((p.get("spec") or {}).get("nodeName")),
                            (p.get("status") or {}).get("phase") == "Running", is_pod_ready(p),
                            [-ord(ch) for ch in p["metadata"].get("creationTimestamp", "")])
                for p in sorted(active, key=rank)[: len(active) - want]:
                    self.api.delete_object(pod_rt, p, {}, actor="replicaset-controller")
            # status
            owned = [p for p in store.all(PODS, ns) if self._owned_by(p, rs)]
            active = [p for p in owned if _active(p)]
            ready = sum(1 for p in active if is_pod_ready(p))
            status = {"replicas": len(active), "fullyLabeledReplicas": len(active), "readyReplicas": ready,
                      "availableReplicas": ready, "observedGeneration": md.get("generation", 1)}
            if (rs.get("status") or {}) != status:
                new = copy.deepcopy(rs)
                new["status"] = status
                store.put(rs_rt, new, actor="replicaset-controller", verb="update", subresource="status")

    @staticmethod
    def _owned_by(pod: dict, owner: dict) -> bool:
        ref = controller_ref(pod)
        if not ref or ref.get("kind") != owner.get("kind"):
            return False
        if ref.get("uid"):
            return ref["uid"] == owner["metadata"].get("uid")
        return ref.get("name") == owner["metadata"].get("name")

    def _create_pod(self, rs: dict) -> None:
        store, rt = self.store, self.pod_rt()
        md = rs["metadata"]
        tmpl = copy.deepcopy((rs.get("spec") or {}).get("template") or {})
        tmd = tmpl.get("metadata") or {}
        for _ in range(10):
            name = f"{md['name']}-{random_suffix()}"
            if store.get(rt, md["namespace"], name) is None:
                break
        spec = tmpl.get("spec") or {"containers": [{"name": "main", "image": "busybox"}]}
        spec.pop("nodeName", None)
        spec.setdefault("terminationGracePeriodSeconds", 30)
        spec.setdefault("schedulerName", "default-scheduler")
        spec.setdefault("restartPolicy", "Always")
        pod = {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {
                "name": name, "generateName": f"{md['name']}-", "namespace": md["namespace"],
                "labels": dict(tmd.get("labels") or {}), "annotations": dict(tmd.get("annotations") or {}),
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": md["name"],
                                     "uid": md["uid"], "controller": True, "blockOwnerDeletion": True}],
            },
            "spec": spec,
            "status": {"phase": "Pending", "qosClass": "BestEffort"},
        }
        if not pod["metadata"]["annotations"]:
            del pod["metadata"]["annotations"]
        store.put(rt, store.new_meta(rt, pod), actor="replicaset-controller", verb="create")

    # ------------------------------------------------------------------ garbage collector
    def garbage_collect(self) -> None:
        store = self.store
        if not store.gc_owners:
            return
        live = set()
        for objs in store.objects.values():
            for o in objs.values():
                live.add(o["metadata"].get("uid"))
        gone = {u for u in store.gc_owners if u not in live}
        still = set()
        for key in list(store.objects):
            rt = store.registry.types.get(key)
            if rt is None:
                continue
            for o in list(store.objects.get(key, {}).values()):
                refs = o["metadata"].get("ownerReferences") or []
                if refs and any(r.get("uid") in gone for r in refs) and \
                        all(r.get("uid") in gone or r.get("uid") not in live for r in refs):
                    still.add(1)
                    if not o["metadata"].get("deletionTimestamp"):
                        self.api.delete_object(rt, o, {}, actor="garbage-collector")
        if not still:
            store.gc_owners -= gone

    # ------------------------------------------------------------------ namespace lifecycle
    def namespaces(self) -> None:
        store = self.store
        ns_rt = store.registry.types[NAMESPACES]
        for ns in store.all(NAMESPACES):
            if not ns["metadata"].get("deletionTimestamp"):
                continue
            name = ns["metadata"]["name"]
            remaining = 0
            for key in list(store.objects):
                rt = store.registry.types.get(key)
                if rt is None or not rt.namespaced:
                    continue
                for o in store.all(key, name):
                    remaining += 1
                    if not o["metadata"].get("deletionTimestamp"):
                        self.api.delete_object(rt, o, {}, actor="namespace-controller")
            if remaining == 0 and not ns["metadata"].get("finalizers"):
                store.remove(ns_rt, ns, actor="namespace-controller")
