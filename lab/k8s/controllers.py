"""Simulated cluster components: kubelet, scheduler, ReplicaSet and Job controllers, node reboots, garbage
collector, TTL-after-finished, namespace cleanup, CRD cleanup.

One task. Each pass looks only at what changed (the store's dirty set: written objects and their controllers)
and at objects whose timer is due (the store's timer heap), so a pass costs O(changes), not O(objects);
shutdown cancels the one task and with it every timer."""

from __future__ import annotations

import asyncio
import copy
import logging
import time
import uuid
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from .store import JOBS, NAMESPACES, NODES, PODS, REPLICASETS, controller_ref, is_pod_ready, node_ready
from .util import now_rfc3339, random_suffix

if TYPE_CHECKING:
    from .api import Api

log = logging.getLogger("lab.k8s.controllers")
FINISH_ANNOTATION = "lab.millwright.dev/finish-after-seconds"

# Job labels the rollout activities set; job outcome rules match on them.
JOB_NODE_LABEL = "millwright.dev/node"
JOB_PACKAGE_LABEL = "millwright.dev/package"
JOB_STAGE_LABEL = "millwright.dev/stage"
JOB_INTERRUPT_LABEL = "millwright.dev/interrupt"
REBOOT_MESSAGE = "lab: node is rebooting"
SCHEDULE_RETRY_SECONDS = 0.25  # an unschedulable pod is looked at again this often (not every pass)
CAPI_FINALIZER = "cluster.cluster.x-k8s.io"
TOPOLOGY_OWNED = "topology.cluster.x-k8s.io/owned"


def parse_ts(ts: str | None) -> float | None:
    """RFC 3339 (as the emulator writes it) to epoch seconds."""
    if not ts:
        return None
    try:
        return datetime.strptime(ts, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc).timestamp()
    except ValueError:
        return None


def match_job_rule(jobs_cfg: dict, labels: dict, node: str | None) -> dict:
    """The outcome of one run of a Job's pod: the first rule matching the Job's labels with `times` left.

    A rule: {"node", "package", "stage", "interrupt", "outcome": "succeed"|"fail", "seconds", "times", "message"},
    every field optional. A matching rule with `times` consumes one (the count left is kept in the config).
    """
    default = float(jobs_cfg.get("defaultSeconds", 1.0))
    have = {"node": labels.get(JOB_NODE_LABEL) or node, "package": labels.get(JOB_PACKAGE_LABEL),
            "stage": labels.get(JOB_STAGE_LABEL), "interrupt": labels.get(JOB_INTERRUPT_LABEL)}
    for rule in jobs_cfg.get("rules") or []:
        if not isinstance(rule, dict):
            continue
        if any(rule.get(k) not in (None, "", "*") and rule.get(k) != have[k] for k in have):
            continue
        times = rule.get("times")
        if times is not None:
            if int(times) <= 0:
                continue
            rule["times"] = int(times) - 1
        outcome = "fail" if str(rule.get("outcome") or "succeed").lower() in ("fail", "failed", "failure") \
            else "succeed"
        msg = rule.get("message") or (f"lab: {have['stage'] or 'job'} failed by a job rule" if outcome == "fail"
                                      else "")
        return {"outcome": outcome, "seconds": float(rule.get("seconds", default)), "message": msg}
    return {"outcome": "succeed", "seconds": default, "message": ""}


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
        self.url = ""  # this emulator's own URL, once serving
        self.workload: dict[str, Any] = {}  # CAPI Cluster uid -> the Emulator serving that workload cluster
        self._bg: set[asyncio.Task] = set()  # starting and stopping workload emulators

    def start(self) -> None:
        self.resume_reboots()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="lab-controllers")

    async def stop(self) -> None:
        for emu in list(self.workload.values()):
            await emu.stop()
        self.workload.clear()
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
        store = self.store
        now = time.monotonic()
        work = store.dirty | store.pop_due(now)
        store.dirty = set()
        self.namespaces()
        self.garbage_collect()
        self.replicasets(work)
        self.schedule(now)
        self.jobs(work, now)
        self.reboots(now)
        self.kubelet(work, now)
        self.cluster_api(work, now)
        self.kai_queues(work)
        self.vclusters(work, now)
        nxt = store.next_timer()
        return 1.0 if nxt is None else min(1.0, nxt - time.monotonic())

    def pod_rt(self):
        return self.store.registry.types[PODS]

    def kubelet(self, work: set, now: float) -> None:
        store = self.store
        for ok in sorted(ok for ok in work if ok[0] == PODS):
            pod = store.lookup(ok)
            if pod is not None:
                self.kubelet_pod(ok, pod, now)

    def kubelet_pod(self, ok: tuple, pod: dict, now: float) -> None:
        store, rt = self.store, self.pod_rt()
        cfg = store.config
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
                store.schedule_at(due, ok)
            return
        node_name = (pod.get("spec") or {}).get("nodeName")
        if not node_name:
            return
        if phase in (None, "", "Pending"):
            if node_name in store.rebooting:  # the kubelet is down: nothing starts until the node is back
                store.schedule_at(store.rebooting[node_name], ok)
                return
            due = side.setdefault("start_at", now + float(cfg.get("podStartSeconds", 1.0)))
            if now >= due:
                self._start(pod, node_name)
            else:
                store.schedule_at(due, ok)
            return
        if phase == "Running":
            ref = controller_ref(pod)
            if ref and ref.get("kind") == "Job":
                self._run_job_pod(ok, pod, side, now)
                return
            ann = (md.get("annotations") or {}).get(FINISH_ANNOTATION)
            if ann is None:
                return
            try:
                after = float(ann)
            except ValueError:
                return
            since = side.setdefault("running_since", now)
            due = since + after
            if now >= due:
                self._terminate(pod, True)
            else:
                store.schedule_at(due, ok)

    # ------------------------------------------------------------------ Job pods on the kubelet
    @staticmethod
    def _failing_container(pod: dict) -> tuple[str, int]:
        """Which container a simulated failure hits: the work (first init container) if any, else the first."""
        if (pod.get("spec") or {}).get("initContainers"):
            return "initContainerStatuses", 0
        return "containerStatuses", 0

    def _terminate(self, pod: dict, succeeded: bool, message: str = "") -> None:
        """Pod finished: Succeeded, or Failed with `message` in the failing container's termination state."""
        new = copy.deepcopy(pod)
        st = new.setdefault("status", {})
        st["phase"] = "Succeeded" if succeeded else "Failed"
        self._set_ready(new, False, "PodCompleted" if succeeded else "PodFailed")
        ts = now_rfc3339()
        started = st.get("startTime") or ts
        fail_list, fail_i = self._failing_container(new)
        init_failed = not succeeded and fail_list == "initContainerStatuses"
        for lst in ("initContainerStatuses", "containerStatuses"):
            for i, cs in enumerate(st.get(lst) or []):
                cs["ready"] = False
                cs["started"] = False
                if not succeeded and (lst, i) == (fail_list, fail_i):
                    cs["state"] = {"terminated": {"exitCode": 1, "reason": "Error", "message": message,
                                                  "startedAt": started, "finishedAt": ts}}
                elif init_failed and lst == "containerStatuses":
                    cs["state"] = {"waiting": {"reason": "PodInitializing"}}
                else:
                    cs["state"] = {"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": started,
                                                  "finishedAt": ts}}
        self.store.put(self.pod_rt(), new, actor="kubelet", verb="update", subresource="status")

    def _owner_job(self, pod: dict) -> dict | None:
        ref = controller_ref(pod) or {}
        ok = self.store.by_uid.get(ref.get("uid") or "")
        return self.store.lookup(ok) if ok and ok[0] == JOBS else None

    def _run_job_pod(self, ok: tuple, pod: dict, side: dict, now: float) -> None:
        store = self.store
        job = self._owner_job(pod)
        labels = ((job or pod)["metadata"].get("labels") or {})
        node_name = pod["spec"]["nodeName"]
        run = side.get("run")
        if run is None:
            run = side["run"] = {**match_job_rule(store.config.get("jobs") or {}, labels, node_name), "since": now}
        if labels.get(JOB_INTERRUPT_LABEL) == "reboot" and run["outcome"] == "succeed":
            node = store.get(store.registry.types[NODES], None, node_name)
            if node is None:
                self._terminate(pod, True)
                return
            boot = ((node.get("status") or {}).get("nodeInfo") or {}).get("bootID", "")
            if "boot_before" not in side:
                side["boot_before"] = boot
                self.start_reboot(node_name, now)
                return
            if node_name not in store.rebooting and node_ready(node) and boot != side["boot_before"]:
                self._terminate(pod, True)  # the interrupt completes once the node is back with a new boot ID
            return
        due = run["since"] + run["seconds"]
        if now < due:
            store.schedule_at(due, ok)
            return
        if run["outcome"] == "succeed":
            self._terminate(pod, True)
            return
        if (pod.get("spec") or {}).get("restartPolicy") == "OnFailure":  # the container restarts in place
            new = copy.deepcopy(pod)
            lst, i = self._failing_container(new)
            statuses = new["status"].get(lst) or []
            if i < len(statuses):
                cs = statuses[i]
                cs["restartCount"] = int(cs.get("restartCount") or 0) + 1
                cs["lastState"] = {"terminated": {"exitCode": 1, "reason": "Error", "message": run["message"],
                                                  "startedAt": new["status"].get("startTime"),
                                                  "finishedAt": now_rfc3339()}}
            side.pop("run", None)
            store.put(self.pod_rt(), new, actor="kubelet", verb="update", subresource="status")
            return
        self._terminate(pod, False, run["message"])

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
        if (new.get("spec") or {}).get("initContainers"):
            st["initContainerStatuses"] = [
                {"name": c.get("name"), "image": c.get("image", ""), "imageID": "", "ready": True, "started": False,
                 "restartCount": 0, "containerID": f"containerd://{random_suffix(12)}",
                 "state": {"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": ts, "finishedAt": ts}}}
                for c in new["spec"]["initContainers"]]
        store.side.setdefault(new["metadata"].get("uid", ""), {})["running_since"] = time.monotonic()
        store.put(rt, new, actor="kubelet", verb="update", subresource="status")

    # ------------------------------------------------------------------ scheduler
    def pick_node(self, pod: dict) -> str | None:
        store = self.store
        spec = pod.get("spec") or {}
        sel = spec.get("nodeSelector") or {}
        need_gpu = _gpu_request(pod)
        pods = store.objects.get(PODS, {})

        def on_node(name: str) -> list[dict]:
            return [p for k in store.pods_by_node.get(name, ()) if (p := pods.get(k)) is not None and _active(p)]

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
            running = on_node(md["name"])
            load = {md["name"]: len(running)}
            gpus_used = {md["name"]: sum(_gpu_request(p) for p in running)}
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

    def schedule(self, now: float) -> None:
        store, rt = self.store, self.pod_rt()
        pods = store.objects.get(PODS, {})
        for k in sorted(store.unscheduled):
            pod = pods.get(k)
            if pod is None:
                continue
            spec = pod.get("spec") or {}
            if spec.get("nodeName") or not _active(pod):
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
            new = copy.deepcopy(pod)
            conds = [c for c in (new.get("status") or {}).get("conditions") or [] if c.get("type") != "PodScheduled"]
            if node is None:
                cond = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "lastProbeTime": None,
                        "message": "0/%d nodes are available." % len(store.objects.get(NODES, {})),
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
    def replicasets(self, work: set) -> None:
        store = self.store
        rs_rt = store.registry.types[REPLICASETS]
        pod_rt = self.pod_rt()
        for ok in sorted(ok for ok in work if ok[0] == REPLICASETS):
            rs = store.lookup(ok)
            if rs is None:
                continue
            md = rs["metadata"]
            if md.get("deletionTimestamp"):
                continue
            owned = store.owned(rs, PODS)
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
            owned = store.owned(rs, PODS)
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
        """Delete dependents whose owners (deleted with cascading propagation) are all gone."""
        store = self.store
        if not store.gc_owners:
            return
        live = store.by_uid
        gone = {u for u in store.gc_owners if u not in live}
        for u in sorted(gone):
            still = False
            for ok in sorted(store.dependents.get(u, ())):
                o = store.lookup(ok)
                rt = store.registry.types.get(ok[0])
                if o is None or rt is None:
                    continue
                refs = o["metadata"].get("ownerReferences") or []
                if all(r.get("uid") in gone or r.get("uid") not in live for r in refs):
                    still = True
                    if not o["metadata"].get("deletionTimestamp"):
                        self.api.delete_object(rt, o, {}, actor="garbage-collector")
            if not still:
                store.gc_owners.discard(u)

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

    # ------------------------------------------------------------------ Job controller (batch/v1)
    def jobs(self, work: set, now: float) -> None:
        store = self.store
        for ok in sorted(ok for ok in work if ok[0] == JOBS):
            job = store.lookup(ok)
            if job is not None:
                self.sync_job(ok, job, now)

    @staticmethod
    def _job_condition(ctype: str, reason: str, message: str, ts: str) -> dict:
        return {"type": ctype, "status": "True", "lastProbeTime": ts, "lastTransitionTime": ts, "reason": reason,
                "message": message}

    def sync_job(self, ok: tuple, job: dict, now: float) -> None:
        """One Job, one pod at a time (parallelism/completions 1, as NodeWright's Jobs): create the pod,
        count outcomes against backoffLimit and activeDeadlineSeconds, write the status, expire after the TTL."""
        store, api = self.store, self.api
        jrt, prt = store.registry.types[JOBS], self.pod_rt()
        md, spec = job["metadata"], job.get("spec") or {}
        if md.get("deletionTimestamp") or spec.get("suspend"):
            return
        side = store.side.setdefault(md.get("uid", ""), {})
        old_status = job.get("status") or {}
        status = copy.deepcopy(old_status)
        conds = status.get("conditions") or []
        pods = store.owned(job, PODS)
        ts = now_rfc3339()
        finished = next((c for c in conds if c.get("type") in ("Complete", "Failed") and c.get("status") == "True"),
                        None)
        if finished is not None:
            for p in pods:
                if _active(p):
                    api.delete_object(prt, p, {}, actor="job-controller")
            ttl = spec.get("ttlSecondsAfterFinished")
            if ttl is not None:
                fin = side.get("finished_at")
                if fin is None:
                    wall = parse_ts(status.get("completionTime") or finished.get("lastTransitionTime")) or time.time()
                    fin = side["finished_at"] = now - max(0.0, time.time() - wall)
                due = fin + float(ttl)
                if now >= due:
                    api.delete_object(jrt, job, {"propagationPolicy": "Background"},
                                      actor="ttl-after-finished-controller")
                else:
                    store.schedule_at(due, ok)
            return
        if not status.get("startTime"):
            status["startTime"] = ts
            side["started_at"] = now
        started = side.get("started_at")
        if started is None:
            started = side["started_at"] = now - max(0.0, time.time() - (parse_ts(status["startTime"]) or time.time()))
        tmpl_spec = ((spec.get("template") or {}).get("spec") or {})
        on_failure = tmpl_spec.get("restartPolicy") == "OnFailure"
        active = [p for p in pods if _active(p)]
        succeeded = sum(1 for p in pods if (p.get("status") or {}).get("phase") == "Succeeded")
        failed = max(int(old_status.get("failed") or 0),
                     sum(1 for p in pods if (p.get("status") or {}).get("phase") == "Failed"))
        restarts = 0
        if on_failure:
            for p in active:
                for lst in ("initContainerStatuses", "containerStatuses"):
                    restarts += sum(int(cs.get("restartCount") or 0) for cs in (p.get("status") or {}).get(lst) or [])
        backoff = int(spec.get("backoffLimit", 6))
        completions = int(spec.get("completions") or 1)
        deadline = spec.get("activeDeadlineSeconds")
        verdict = None
        if succeeded >= completions:
            verdict = ("Complete", "SuccessCriteriaMet", "CompletionsReached",
                       "Reached expected number of succeeded pods")
        elif failed + restarts > backoff:
            verdict = ("Failed", "FailureTarget", "BackoffLimitExceeded", "Job has reached the specified backoff limit")
        elif deadline is not None and now >= started + float(deadline):
            verdict = ("Failed", "FailureTarget", "DeadlineExceeded", "Job was active longer than specified deadline")
        created = 0
        if verdict is None:
            if deadline is not None:
                store.schedule_at(started + float(deadline), ok)
            if not active:
                self._create_job_pod(job)
                created = 1
        else:
            kind, target, reason, message = verdict
            for p in active:
                if reason == "BackoffLimitExceeded":  # OnFailure: the restarting pod ends Failed (kept for its logs)
                    last = {}
                    for lst in ("initContainerStatuses", "containerStatuses"):
                        for cs in (p.get("status") or {}).get(lst) or []:
                            last = (cs.get("lastState") or {}).get("terminated") or last
                    self._terminate(p, False, last.get("message", ""))
                    failed += 1
                else:
                    api.delete_object(prt, p, {}, actor="job-controller")
            conds = [c for c in conds if c.get("type") not in (target, kind)]
            conds += [self._job_condition(target, reason, message, ts), self._job_condition(kind, reason, message, ts)]
            status["conditions"] = conds
            if kind == "Complete":
                status["completionTime"] = ts
            side["finished_at"] = now
            active, created = [], 0
        n_active = len(active) + created
        for k, v in (("active", n_active), ("succeeded", succeeded), ("failed", failed)):
            if v:
                status[k] = v
            else:
                status.pop(k, None)
        status["ready"] = sum(1 for p in active if is_pod_ready(p))
        status["terminating"] = sum(1 for p in pods if p["metadata"].get("deletionTimestamp"))
        status["uncountedTerminatedPods"] = {}
        if status != old_status:
            new = copy.deepcopy(job)
            new["status"] = status
            store.put(jrt, new, actor="job-controller", verb="update", subresource="status")

    def _create_job_pod(self, job: dict) -> None:
        store, rt = self.store, self.pod_rt()
        md = job["metadata"]
        tmpl = copy.deepcopy((job.get("spec") or {}).get("template") or {})
        tmd = tmpl.get("metadata") or {}
        spec = tmpl.get("spec") or {"containers": [{"name": "main", "image": "busybox"}], "restartPolicy": "Never"}
        node = spec.get("nodeName") or (spec.get("nodeSelector") or {}).get("kubernetes.io/hostname")
        if node:
            spec["nodeName"] = node
        for _ in range(10):
            name = f"{md['name']}-{random_suffix()}"
            if store.get(rt, md["namespace"], name) is None:
                break
        labels = {**(tmd.get("labels") or {}), "batch.kubernetes.io/controller-uid": md["uid"],
                  "batch.kubernetes.io/job-name": md["name"], "controller-uid": md["uid"], "job-name": md["name"]}
        pod: dict[str, Any] = {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {
                "name": name, "generateName": f"{md['name']}-", "namespace": md["namespace"], "labels": labels,
                "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": md["name"], "uid": md["uid"],
                                     "controller": True, "blockOwnerDeletion": True}],
            },
            "spec": spec,
        }
        if tmd.get("annotations"):
            pod["metadata"]["annotations"] = dict(tmd["annotations"])
        self.api._prepare_create(rt, pod)
        if node:
            pod["status"]["conditions"] = [{"type": "PodScheduled", "status": "True", "lastProbeTime": None,
                                            "lastTransitionTime": now_rfc3339()}]
        store.put(rt, store.new_meta(rt, pod), actor="job-controller", verb="create")

    # ------------------------------------------------------------------ node reboots
    @staticmethod
    def _set_node_ready(node: dict, ready: bool, reason: str, message: str) -> None:
        conds = node.setdefault("status", {}).setdefault("conditions", [])
        c = next((c for c in conds if c.get("type") == "Ready"), None)
        if c is None:
            c = {"type": "Ready"}
            conds.append(c)
        ts = now_rfc3339()
        val = "True" if ready else "False"
        if c.get("status") != val:
            c["lastTransitionTime"] = ts
        c.update({"status": val, "reason": reason, "message": message, "lastHeartbeatTime": ts})

    def start_reboot(self, node_name: str, now: float) -> None:
        """The node goes NotReady for rebootSeconds, then comes back Ready with a new bootID."""
        store = self.store
        nrt = store.registry.types[NODES]
        node = store.get(nrt, None, node_name)
        if node is None or node_name in store.rebooting:
            return
        new = copy.deepcopy(node)
        self._set_node_ready(new, False, "KubeletNotReady", REBOOT_MESSAGE)
        store.put(nrt, new, actor="kubelet", verb="update", subresource="status")
        due = now + float(store.config.get("rebootSeconds", 2.0))
        store.rebooting[node_name] = due
        store.schedule_at(due, (NODES, ("", node_name)))

    def resume_reboots(self) -> None:
        """After a restart from a state file: reboots in flight finish at once (their timers were in memory)."""
        store, now = self.store, time.monotonic()
        for node in store.all(NODES):
            for c in (node.get("status") or {}).get("conditions") or []:
                if c.get("type") == "Ready" and c.get("status") != "True" and c.get("message") == REBOOT_MESSAGE:
                    store.rebooting[node["metadata"]["name"]] = now
                    store.schedule_at(now, (NODES, ("", node["metadata"]["name"])))

    def reboots(self, now: float) -> None:
        store = self.store
        nrt = store.registry.types[NODES]
        for name, due in sorted(store.rebooting.items()):
            if now < due:
                continue
            del store.rebooting[name]
            node = store.get(nrt, None, name)
            if node is None:
                continue
            new = copy.deepcopy(node)
            self._set_node_ready(new, True, "KubeletReady", "kubelet is posting ready status")
            new.setdefault("status", {}).setdefault("nodeInfo", {})["bootID"] = str(uuid.uuid4())
            store.put(nrt, new, actor="kubelet", verb="update", subresource="status")
            for k in store.pods_by_node.get(name, ()):
                store.dirty.add((PODS, k))

    # ------------------------------------------------------------------ Cluster API (v1beta2) + Metal3
    # A created Cluster steps Pending → Provisioning (infrastructure provisioned, Machines created) →
    # Provisioned (control plane initialized, a new emulated API server for the workload cluster, its
    # `<name>-kubeconfig` Secret, control-plane Machines with nodeRef) → Available (worker Machines Ready).
    # One step every `capiStepSeconds` (config, default 0.5 s). Deleting it (finalizer) removes its children
    # tier by tier: MachineDeployments and their Machines, the control plane, the infrastructure cluster, the
    # kubeconfig Secret; then the finalizer goes and the workload API server stops.
    # A ClusterClass Cluster (`spec.topology`) is the same once the topology controller has derived its
    # KubeadmControlPlane `<name>-cp` and MachineDeployments `<name>-<md name>` (labelled topology-owned).

    def _status_put(self, rt, obj: dict, status: dict, actor: str) -> dict:
        if (obj.get("status") or {}) == status:
            return obj
        new = copy.deepcopy(obj)
        new["status"] = status
        return self.store.put(rt, new, actor=actor, verb="update", subresource="status")

    @staticmethod
    def _cond(old: dict, ctype: str, ok: bool, reason: str, message: str = "") -> dict:
        status = "True" if ok else "False"
        prev = next((c for c in (old.get("conditions") or []) if c.get("type") == ctype), None)
        ts = prev["lastTransitionTime"] if prev and prev.get("status") == status else now_rfc3339()
        return {"type": ctype, "status": status, "reason": reason, "message": message, "lastTransitionTime": ts}

    def cluster_api(self, work: set, now: float) -> None:
        from .crds import CLUSTERS

        store = self.store
        for uid in [u for u in self.workload if u not in store.by_uid]:
            self._stop_workload(uid)
        if CLUSTERS not in store.registry.types:
            return
        for ok in sorted(ok for ok in work if ok[0] == CLUSTERS):
            cluster = store.lookup(ok)
            if cluster is not None:
                self.sync_cluster(ok, cluster, now)

    def _stop_workload(self, uid: str) -> None:
        emu = self.workload.pop(uid, None)
        if emu is not None:
            task = asyncio.get_running_loop().create_task(emu.stop())
            self._bg.add(task)
            task.add_done_callback(self._bg.discard)

    async def _start_workload(self, uid: str) -> None:
        from .crds import TENANCY_CRDS
        from .server import Emulator

        emu = Emulator()
        await emu.start([TENANCY_CRDS])
        async with self.store.lock:
            keep = uid in self.store.by_uid
            if keep:
                self.workload[uid] = emu
                self.store.side.setdefault(uid, {})["url"] = emu.url
                self.store.kick.set()
        if not keep:
            await emu.stop()

    def _seed_workload(self, uid: str, objects: list[dict]) -> None:
        from .seed import seed_objects

        emu = self.workload.get(uid)
        if emu is None:
            return

        async def run() -> None:
            async with emu.store.lock:
                seed_objects(emu.api, objects)

        task = asyncio.get_running_loop().create_task(run())
        self._bg.add(task)
        task.add_done_callback(self._bg.discard)

    def _rt(self, key: tuple[str, str]):
        return self.store.registry.types.get(key)

    def _cluster_children(self, cluster: dict) -> tuple[list[dict], list[dict], list[dict], list[dict]]:
        """(MachineDeployments, worker Machines, control-plane Machines, KubeadmControlPlanes) of a Cluster."""
        from .crds import KCPS, MACHINE_DEPLOYMENTS, MACHINES

        store = self.store
        ns, name = cluster["metadata"]["namespace"], cluster["metadata"]["name"]
        mds = [o for o in store.all(MACHINE_DEPLOYMENTS, ns) if (o.get("spec") or {}).get("clusterName") == name]
        machines = [o for o in store.all(MACHINES, ns)
                    if (o["metadata"].get("labels") or {}).get("cluster.x-k8s.io/cluster-name") == name]
        workers = [m for m in machines if "cluster.x-k8s.io/control-plane" not in (m["metadata"].get("labels") or {})]
        cps = [m for m in machines if m not in workers]
        kref = (cluster.get("spec") or {}).get("controlPlaneRef") or {}
        kcps = [o for o in store.all(KCPS, ns) if o["metadata"]["name"] == kref.get("name")
                or (not kref and TOPOLOGY_OWNED in (o["metadata"].get("labels") or {})
                    and o["metadata"]["labels"].get("cluster.x-k8s.io/cluster-name") == name)]
        return mds, workers, cps, kcps

    def _sync_topology(self, cluster: dict) -> None:
        """The topology controller, just enough: `spec.topology` → a KubeadmControlPlane and MachineDeployments
        (owned by the Cluster), their replicas kept in step with the topology."""
        from .crds import KCPS, MACHINE_DEPLOYMENTS

        store = self.store
        md = cluster["metadata"]
        ns, name = md["namespace"], md["name"]
        topo = cluster["spec"]["topology"]
        version = topo.get("version", "")
        labels = {"cluster.x-k8s.io/cluster-name": name, TOPOLOGY_OWNED: ""}
        owner = [{"apiVersion": cluster["apiVersion"], "kind": "Cluster", "name": name, "uid": md["uid"],
                  "controller": True, "blockOwnerDeletion": True}]
        want = [(KCPS, "KubeadmControlPlane", f"{name}-cp", {},
                 {"replicas": int((topo.get("controlPlane") or {}).get("replicas", 1)), "version": version})]
        for w in (topo.get("workers") or {}).get("machineDeployments") or []:
            mdname = f"{name}-{w['name']}"
            sel = {"cluster.x-k8s.io/cluster-name": name, "cluster.x-k8s.io/deployment-name": mdname}
            want.append((MACHINE_DEPLOYMENTS, "MachineDeployment", mdname, (w.get("metadata") or {}).get(
                "annotations") or {}, {"clusterName": name, "replicas": int(w.get("replicas", 1)),
                                       "selector": {"matchLabels": sel}, "template": {
                                           "metadata": {"labels": sel},
                                           "spec": {"clusterName": name, "version": version}}}))
        for key, kind, oname, ann, spec in want:
            rt = self._rt(key)
            live = store.get(rt, ns, oname)
            if live is None:
                obj = {"apiVersion": rt.api_version, "kind": kind, "metadata": {
                    "name": oname, "namespace": ns, "labels": dict(labels), "annotations": dict(ann),
                    "ownerReferences": owner}, "spec": spec}
                store.put(rt, store.new_meta(rt, obj), actor="capi-topology-controller", verb="create")
            elif (live.get("spec") or {}).get("replicas") != spec["replicas"]:
                new = copy.deepcopy(live)
                new["spec"]["replicas"] = spec["replicas"]
                store.put(rt, new, actor="capi-topology-controller", verb="update")

    def sync_cluster(self, ok: tuple, cluster: dict, now: float) -> None:
        from .crds import MACHINES, MACHINE_DEPLOYMENTS, METAL3_CLUSTERS, KCPS

        store = self.store
        rt = self._rt(ok[0])
        md = cluster["metadata"]
        uid, ns, name = md["uid"], md["namespace"], md["name"]
        step = float(store.config.get("capiStepSeconds", 0.5))
        if md.get("deletionTimestamp"):
            self._delete_cluster(ok, cluster, now, step)
            return
        if CAPI_FINALIZER not in (md.get("finalizers") or []):
            new = copy.deepcopy(cluster)
            new["metadata"]["finalizers"] = [*(md.get("finalizers") or []), CAPI_FINALIZER]
            cluster = store.put(rt, new, actor="capi-controller", verb="update")
        side = store.side.setdefault(uid, {})
        t0 = side.setdefault("capi_t0", now)
        stage = min(3, int((now - t0) / step))
        if stage >= 1 and uid not in self.workload and not side.get("starting"):
            side["starting"] = True
            task = asyncio.get_running_loop().create_task(self._start_workload(uid))
            self._bg.add(task)
            task.add_done_callback(self._bg.discard)
        url = side.get("url")
        if stage >= 2 and not url:
            stage = 1  # the workload API server is still starting; its start kicks us again
        spec = cluster.get("spec") or {}
        if spec.get("topology"):
            self._sync_topology(cluster)
        mds, workers, cps, kcps = self._cluster_children(cluster)
        version = ""
        if stage >= 1:
            m_rt = self._rt(MACHINES)
            wanted: list[tuple[dict, str, bool]] = []  # (owner, machine name, control plane)
            for kcp in kcps:
                version = (kcp.get("spec") or {}).get("version", "")
                for i in range(int((kcp.get("spec") or {}).get("replicas", 1))):
                    wanted.append((kcp, f"{kcp['metadata']['name']}-{i}", True))
            for d in mds:
                for i in range(int((d.get("spec") or {}).get("replicas", 1))):
                    wanted.append((d, f"{d['metadata']['name']}-{i}", False))
            have = {m["metadata"]["name"] for m in workers + cps}
            for owner, mname, is_cp in wanted:
                if mname in have:
                    continue
                labels = {"cluster.x-k8s.io/cluster-name": name}
                if is_cp:
                    labels["cluster.x-k8s.io/control-plane"] = ""
                else:
                    labels["cluster.x-k8s.io/deployment-name"] = owner["metadata"]["name"]
                tmpl = ((owner.get("spec") or {}).get("template") or {}).get("spec") or {}
                machine = {"apiVersion": m_rt.api_version, "kind": "Machine", "metadata": {
                    "name": mname, "namespace": ns, "labels": labels,
                    "annotations": dict(owner["metadata"].get("annotations") or {}),
                    "ownerReferences": [{"apiVersion": owner["apiVersion"], "kind": owner["kind"],
                                         "name": owner["metadata"]["name"], "uid": owner["metadata"]["uid"],
                                         "controller": True, "blockOwnerDeletion": True}]},
                    "spec": {"clusterName": name, "version": (owner.get("spec") or {}).get("version")
                             or tmpl.get("version", ""),
                             "infrastructureRef": tmpl.get("infrastructureRef") or {}},
                    "status": {"phase": "Provisioning"}}
                store.put(m_rt, store.new_meta(m_rt, machine), actor="capi-controller", verb="create")
            mds, workers, cps, kcps = self._cluster_children(cluster)
            # Machines become Ready with a nodeRef: control plane at stage 2, workers at stage 3.
            nodes: list[dict] = []
            for m in cps + workers:
                is_cp = m in cps
                if stage < (2 if is_cp else 3) or (m.get("status") or {}).get("nodeRef"):
                    continue
                st = {"phase": "Running", "nodeRef": {"name": m["metadata"]["name"]},
                      "initialization": {"infrastructureProvisioned": True, "bootstrapDataSecretCreated": True},
                      "conditions": [self._cond({}, "Ready", True, "Ready"),
                                     self._cond({}, "NodeHealthy", True, "NodeHealthy")]}
                self._status_put(m_rt, m, st, "capi-controller")
                gpus = (m["metadata"].get("annotations") or {}).get("millwright.dev/gpus-per-node", "0")
                labels = {"kubernetes.io/hostname": m["metadata"]["name"]}
                if is_cp:
                    labels["node-role.kubernetes.io/control-plane"] = ""
                else:
                    labels["cluster.x-k8s.io/deployment-name"] = m["metadata"]["labels"][
                        "cluster.x-k8s.io/deployment-name"]
                alloc = {"cpu": "64", "memory": "512Gi", "pods": "110"}
                if gpus not in ("", "0"):
                    alloc["nvidia.com/gpu"] = str(gpus)
                nodes.append({"apiVersion": "v1", "kind": "Node", "metadata": {"name": m["metadata"]["name"],
                                                                                "labels": labels},
                              "spec": {}, "status": {"capacity": dict(alloc), "allocatable": dict(alloc),
                                                     "conditions": [{"type": "Ready", "status": "True",
                                                                     "reason": "KubeletReady"}],
                                                     "nodeInfo": {"kubeletVersion": m["spec"].get("version", ""),
                                                                  "bootID": str(uuid.uuid4())}}})
            if nodes:
                self._seed_workload(uid, nodes)
        mds, workers, cps, kcps = self._cluster_children(cluster)
        cp_ready = [m for m in cps if (m.get("status") or {}).get("nodeRef")]
        w_ready = [m for m in workers if (m.get("status") or {}).get("nodeRef")]
        available = stage >= 3 and len(cp_ready) == len(cps) and len(w_ready) == len(workers)
        for kcp in kcps:
            k = kcp.get("status") or {}
            self._status_put(self._rt(KCPS), kcp, {
                "replicas": len(cps), "readyReplicas": len(cp_ready), "availableReplicas": len(cp_ready),
                "upToDateReplicas": len(cps), "version": version or None,
                "initialization": {"controlPlaneInitialized": stage >= 2},
                "conditions": [self._cond(k, "Initialized", stage >= 2, "Initialized" if stage >= 2 else "Waiting"),
                               self._cond(k, "Available", len(cp_ready) == len(cps) and stage >= 2, "Available")]},
                "capi-controller")
        for d in mds:
            mine = [m for m in workers if m["metadata"]["labels"].get("cluster.x-k8s.io/deployment-name")
                    == d["metadata"]["name"]]
            ready = [m for m in mine if (m.get("status") or {}).get("nodeRef")]
            self._status_put(self._rt(MACHINE_DEPLOYMENTS), d, {
                "replicas": len(mine), "readyReplicas": len(ready), "availableReplicas": len(ready),
                "upToDateReplicas": len(mine), "phase": "Running" if len(ready) == len(mine) else "ScalingUp"},
                "capi-controller")
        iref = spec.get("infrastructureRef") or {}
        if stage >= 1 and iref.get("kind") == "Metal3Cluster" and self._rt(METAL3_CLUSTERS):
            infra = store.get(self._rt(METAL3_CLUSTERS), ns, iref.get("name", ""))
            if infra is not None:
                self._status_put(self._rt(METAL3_CLUSTERS), infra,
                                 {"ready": True, "initialization": {"provisioned": True}}, "metal3-controller")
        if stage >= 2:
            self._ensure_kubeconfig_secret(cluster, url)
        old = cluster.get("status") or {}
        phase = ["Pending", "Provisioning", "Provisioned", "Provisioned"][stage]
        status = {
            "phase": phase,
            "initialization": {"infrastructureProvisioned": stage >= 1, "controlPlaneInitialized": stage >= 2},
            "conditions": [
                self._cond(old, "InfrastructureReady", stage >= 1, "Ready" if stage >= 1 else "Provisioning"),
                self._cond(old, "ControlPlaneInitialized", stage >= 2,
                           "Initialized" if stage >= 2 else "WaitingForControlPlane"),
                self._cond(old, "ControlPlaneAvailable", stage >= 2 and len(cp_ready) == len(cps), "Available"),
                self._cond(old, "WorkersAvailable", available, "Available"),
                self._cond(old, "RemoteConnectionProbe", stage >= 2, "Probed"),
                *([self._cond(old, "TopologyReconciled", True, "ReconcileSucceeded")] if spec.get("topology") else []),
                self._cond(old, "Available", available, "Available" if available else "NotAvailable",
                           f"{len(cp_ready) + len(w_ready)} of {len(cps) + len(workers)} machines ready"),
            ],
            "controlPlane": {"desiredReplicas": len(cps), "readyReplicas": len(cp_ready)},
            "workers": {"desiredReplicas": len(workers), "readyReplicas": len(w_ready)},
        }
        self._status_put(rt, cluster, status, "capi-controller")
        if not available:
            store.schedule_at(t0 + (stage + 1) * step if stage < 3 else now + step / 2, ok)

    def _ensure_kubeconfig_secret(self, cluster: dict, url: str) -> None:
        import base64

        import yaml

        from .admin import kubeconfig

        store = self.store
        s_rt = store.registry.types[("", "secrets")]
        md = cluster["metadata"]
        sname = f"{md['name']}-kubeconfig"
        if store.get(s_rt, md["namespace"], sname) is not None:
            return
        cfg = kubeconfig(url, md["name"], token=f"capi-{uuid.uuid4().hex}")
        secret = {"apiVersion": "v1", "kind": "Secret", "type": "cluster.x-k8s.io/secret", "metadata": {
            "name": sname, "namespace": md["namespace"], "labels": {"cluster.x-k8s.io/cluster-name": md["name"]},
            "ownerReferences": [{"apiVersion": cluster["apiVersion"], "kind": "Cluster", "name": md["name"],
                                 "uid": md["uid"], "controller": True}]},
            "data": {"value": base64.b64encode(yaml.safe_dump(cfg).encode()).decode()}}
        store.put(s_rt, store.new_meta(s_rt, secret), actor="capi-controller", verb="create")

    def _delete_cluster(self, ok: tuple, cluster: dict, now: float, step: float) -> None:
        from .crds import MACHINES, MACHINE_DEPLOYMENTS, METAL3_CLUSTERS, KCPS

        store = self.store
        md = cluster["metadata"]
        ns = md["namespace"]
        mds, workers, cps, kcps = self._cluster_children(cluster)
        iref = (cluster.get("spec") or {}).get("infrastructureRef") or {}
        infra = []
        if iref.get("kind") == "Metal3Cluster" and self._rt(METAL3_CLUSTERS):
            found = store.get(self._rt(METAL3_CLUSTERS), ns, iref.get("name", ""))
            infra = [found] if found else []
        secret = store.get(store.registry.types[("", "secrets")], ns, f"{md['name']}-kubeconfig")
        tiers = [[(MACHINES, m) for m in workers] + [(MACHINE_DEPLOYMENTS, d) for d in mds],
                 [(MACHINES, m) for m in cps] + [(KCPS, k) for k in kcps],
                 [(METAL3_CLUSTERS, i) for i in infra],
                 [(("", "secrets"), secret)] if secret else []]
        for tier in tiers:
            if tier:
                for key, o in tier:
                    if not o["metadata"].get("deletionTimestamp"):
                        self.api.delete_object(self._rt(key), o, {}, actor="capi-controller")
                store.schedule_at(now + step / 2, ok)
                return
        rt = self._rt(ok[0])
        self._stop_workload(md["uid"])
        new = copy.deepcopy(cluster)
        new["metadata"]["finalizers"] = [f for f in md.get("finalizers") or [] if f != CAPI_FINALIZER]
        if new["metadata"]["finalizers"]:
            store.put(rt, new, actor="capi-controller", verb="update")
        else:
            store.remove(rt, new, actor="capi-controller")

    # ------------------------------------------------------------------ KAI Scheduler queues
    def kai_queues(self, work: set) -> None:
        """`status.childQueues` of every parent, and an `Orphan` condition when a parent is missing."""
        from .crds import QUEUES

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
                st["conditions"] = [self._cond(old, "Orphan", True, "ParentQueueNotFound",
                                               f"parent queue {parent} does not exist")]
            self._status_put(rt, q, st, "kai-scheduler")

    # ------------------------------------------------------------------ vCluster (CAPI provider VCluster)
    def vclusters(self, work: set, now: float) -> None:
        """A VCluster becomes ready (`status.ready`, phase Deployed) after `vclusterReadySeconds` and gets its
        kubeconfig Secret `vc-<name>` (key `config`), owned by it. The emulator runs no tenant API server: the
        kubeconfig points at this (host) emulator under a context of its own."""
        import base64

        import yaml

        from .admin import kubeconfig
        from .crds import VCLUSTERS

        store = self.store
        rt = self._rt(VCLUSTERS)
        if rt is None:
            return
        s_rt = store.registry.types[("", "secrets")]
        for ok in sorted(ok for ok in work if ok[0] == VCLUSTERS):
            vc = store.lookup(ok)
            if vc is None or vc["metadata"].get("deletionTimestamp"):
                continue
            md = vc["metadata"]
            side = store.side.setdefault(md["uid"], {})
            due = side.setdefault("vc_ready_at", now + float(store.config.get("vclusterReadySeconds", 0.5)))
            if now < due:
                if not vc.get("status"):
                    self._status_put(rt, vc, {"phase": "Pending", "ready": False}, "vcluster-provider")
                store.schedule_at(due, ok)
                continue
            sname = f"vc-{md['name']}"
            if store.get(s_rt, md["namespace"], sname) is None:
                ctx = f"vcluster_{md['name']}_{md['namespace']}"
                cfg = yaml.safe_dump(kubeconfig(self.url, ctx, token=f"vc-{uuid.uuid4().hex}"))
                secret = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque", "metadata": {
                    "name": sname, "namespace": md["namespace"],
                    "labels": {"app": "vcluster", "vcluster-name": md["name"]},
                    "ownerReferences": [{"apiVersion": vc["apiVersion"], "kind": "VCluster", "name": md["name"],
                                         "uid": md["uid"], "controller": True}]},
                    "data": {"config": base64.b64encode(cfg.encode()).decode()}}
                store.put(s_rt, store.new_meta(s_rt, secret), actor="vcluster", verb="create")
            old = vc.get("status") or {}
            self._status_put(rt, vc, {"ready": True, "initialized": True, "phase": "Deployed",
                                      "conditions": [self._cond(old, "Ready", True, "Deployed")]},
                             "vcluster-provider")
