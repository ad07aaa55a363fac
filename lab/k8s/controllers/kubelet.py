"""The kubelet: starts bound pods, runs Job pods to the outcome the job rules give, finishes pods that ask to
(`FINISH_ANNOTATION`), removes deleted pods once their grace period is over, stays down while its node reboots."""

from __future__ import annotations

import time

from ..podlogs import log_line
from ..store import JOBS, NODES, PODS, controller_ref, node_ready
from ..util import clone, now_rfc3339, random_suffix
from .base import Controller
from .pods import failing_container, set_ready, terminate
from .reboots import start_reboot

FINISH_ANNOTATION = "lab.millwright.dev/finish-after-seconds"
# A Job's pod so annotated runs until it is deleted (or `FINISH_ANNOTATION` says), as a training job's worker does
# (lab/nvl72.py), instead of to the outcome the job rules give a stage Job's pod.
LONG_RUNNING_ANNOTATION = "lab.millwright.dev/long-running"

# Job labels the rollout activities set; job outcome rules match on them.
JOB_NODE_LABEL = "millwright.dev/node"
JOB_PACKAGE_LABEL = "millwright.dev/package"
JOB_STAGE_LABEL = "millwright.dev/stage"
JOB_INTERRUPT_LABEL = "millwright.dev/interrupt"


def match_job_rule(jobs_cfg: dict, labels: dict, node: str | None) -> dict:
    """The outcome of one run of a Job's pod: the first rule matching the Job's labels with `times` left.

    A rule: {"node", "package", "stage", "interrupt", "outcome": "succeed"|"fail", "seconds", "times", "message",
    "log"}, every field optional; `log` is what the container prints (served at pods/<name>/log). A matching rule
    with `times` consumes one (the count left is kept in the config).
    """
    default = float(jobs_cfg.get("defaultSeconds", 1.0))
    have = {
        "node": labels.get(JOB_NODE_LABEL) or node,
        "package": labels.get(JOB_PACKAGE_LABEL),
        "stage": labels.get(JOB_STAGE_LABEL),
        "interrupt": labels.get(JOB_INTERRUPT_LABEL),
    }
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
        outcome = (
            "fail" if str(rule.get("outcome") or "succeed").lower() in ("fail", "failed", "failure") else "succeed"
        )
        msg = rule.get("message") or (
            f"lab: {have['stage'] or 'job'} failed by a job rule" if outcome == "fail" else ""
        )
        return {"outcome": outcome, "seconds": float(rule.get("seconds", default)), "message": msg,
                "log": str(rule.get("log") or "")}  # fmt: skip
    return {"outcome": "succeed", "seconds": default, "message": "", "log": ""}


def job_seconds(config: dict, labels: dict, node: str | None = None) -> list[tuple[str, float]]:
    """The least time one successful run of a Job with these labels takes on an emulator with this `config`, part by
    part, as `sync_pod` and `_run_job_pod` wait: its pod's start, then its rule's (or the default) seconds; for a
    reboot interrupt the reboot instead, the pod ending as the node is back. Controller wake-ups and API round trips
    only add to it: a lower bound, for the benches' ideals."""
    stage = labels.get(JOB_STAGE_LABEL) or "job"
    start = float(config["podStartSeconds"])
    if labels.get(JOB_INTERRUPT_LABEL) == "reboot":
        return [(f"{stage} pod", start), ("reboot", float(config["rebootSeconds"]))]
    run = match_job_rule(clone(config["jobs"]), labels, node)  # a clone: a rule's `times` is not consumed
    return [(stage, start + run["seconds"])]


class Kubelet(Controller):
    def reconcile(self, work: set, now: float) -> None:
        store = self.store
        for ok in sorted(ok for ok in work if ok[0] == PODS):
            pod = store.lookup(ok)
            if pod is not None:
                self.sync_pod(ok, pod, now)

    def sync_pod(self, ok: tuple, pod: dict, now: float) -> None:
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
                    new = clone(pod)
                    new["status"]["phase"] = "Failed" if phase == "Running" else "Succeeded"
                    set_ready(new, False, "PodCompleted")
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
            if ref and ref.get("kind") == "Job" and LONG_RUNNING_ANNOTATION not in (md.get("annotations") or {}):
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
                terminate(store, pod, True)
            else:
                store.schedule_at(due, ok)

    def _owner_job(self, pod: dict) -> dict | None:
        ref = controller_ref(pod) or {}
        ok = self.store.by_uid.get(ref.get("uid") or "")
        return self.store.lookup(ok) if ok and ok[0] == JOBS else None

    def _run_job_pod(self, ok: tuple, pod: dict, side: dict, now: float) -> None:
        store = self.store
        job = self._owner_job(pod)
        labels = (job or pod)["metadata"].get("labels") or {}
        node_name = pod["spec"]["nodeName"]
        run = side.get("run")
        if run is None:
            run = side["run"] = {**match_job_rule(store.config.get("jobs") or {}, labels, node_name), "since": now}
            image = ((pod["spec"].get("containers") or [{}])[0]).get("image", "?")
            log_line(side, f"lab: {labels.get(JOB_STAGE_LABEL) or 'job'} of {labels.get(JOB_PACKAGE_LABEL) or '?'} "
                       f"({image}) on {node_name}: started")  # fmt: skip
            for line in run["log"].splitlines():
                log_line(side, line)
        if labels.get(JOB_INTERRUPT_LABEL) == "reboot" and run["outcome"] == "succeed":
            node = store.get(store.registry.types[NODES], None, node_name)
            if node is None:
                terminate(store, pod, True)
                return
            boot = ((node.get("status") or {}).get("nodeInfo") or {}).get("bootID", "")
            if "boot_before" not in side:
                side["boot_before"] = boot
                start_reboot(store, node_name, now)
                return
            if node_name not in store.rebooting and node_ready(node) and boot != side["boot_before"]:
                log_line(side, "lab: the node is back with a new boot ID: succeeded")
                terminate(store, pod, True)  # the interrupt completes once the node is back with a new boot ID
            return
        due = run["since"] + run["seconds"]
        if now < due:
            store.schedule_at(due, ok)
            return
        if run["outcome"] == "succeed":
            log_line(side, "lab: succeeded")
            terminate(store, pod, True)
            return
        log_line(side, f"lab: failed: {run['message']}")
        if (pod.get("spec") or {}).get("restartPolicy") == "OnFailure":  # the container restarts in place
            new = clone(pod)
            lst, i = failing_container(new)
            statuses = new["status"].get(lst) or []
            if i < len(statuses):
                cs = statuses[i]
                cs["restartCount"] = int(cs.get("restartCount") or 0) + 1
                cs["lastState"] = {
                    "terminated": {
                        "exitCode": 1,
                        "reason": "Error",
                        "message": run["message"],
                        "startedAt": new["status"].get("startTime"),
                        "finishedAt": now_rfc3339(),
                    }
                }
            side.pop("run", None)
            store.put(self.pod_rt(), new, actor="kubelet", verb="update", subresource="status")
            return
        terminate(store, pod, False, run["message"])

    def _start(self, pod: dict, node_name: str) -> None:
        store, rt = self.store, self.pod_rt()
        node = store.get(store.registry.types[NODES], None, node_name)
        new = clone(pod)
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
        conds = [
            c
            for c in st.get("conditions") or []
            if c.get("type") not in ("Ready", "ContainersReady", "Initialized", "PodScheduled")
        ]
        for t in ("PodReadyToStartContainers", "Initialized", "PodScheduled"):
            if not any(c.get("type") == t for c in conds):
                conds.append({"type": t, "status": "True", "lastProbeTime": None, "lastTransitionTime": ts})
        st["conditions"] = conds
        set_ready(new, True)
        st["containerStatuses"] = [
            {
                "name": c.get("name"),
                "image": c.get("image", ""),
                "imageID": "",
                "ready": True,
                "started": True,
                "restartCount": 0,
                "containerID": f"containerd://{random_suffix(12)}",
                "state": {"running": {"startedAt": ts}},
            }
            for c in (new.get("spec") or {}).get("containers") or []
        ]
        if (new.get("spec") or {}).get("initContainers"):
            st["initContainerStatuses"] = [
                {
                    "name": c.get("name"),
                    "image": c.get("image", ""),
                    "imageID": "",
                    "ready": True,
                    "started": False,
                    "restartCount": 0,
                    "containerID": f"containerd://{random_suffix(12)}",
                    "state": {"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": ts, "finishedAt": ts}},
                }
                for c in new["spec"]["initContainers"]
            ]
        store.side.setdefault(new["metadata"].get("uid", ""), {})["running_since"] = time.monotonic()
        store.put(rt, new, actor="kubelet", verb="update", subresource="status")
