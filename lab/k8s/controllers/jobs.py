"""The Job controller (batch/v1) and TTL-after-finished: up to `parallelism` pods (one at a time for the stage Jobs;
an Indexed Job one per completion index still to do), outcomes counted against `backoffLimit` and
`activeDeadlineSeconds`, the Job's status and conditions, expiry after the TTL."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from ..defaults import prepare_create
from ..store import JOBS, PODS, is_pod_ready
from ..util import clone, now_rfc3339, random_suffix, with_status
from .base import Controller
from .pods import is_active, terminate

COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"  # label and annotation of an Indexed Job's pod


def completion_index(pod: dict) -> int | None:
    try:
        return int((pod["metadata"].get("annotations") or {})[COMPLETION_INDEX])
    except (KeyError, TypeError, ValueError):
        return None


def parse_ts(ts: str | None) -> float | None:
    """RFC 3339 (as the emulator writes it) to epoch seconds."""
    if not ts:
        return None
    try:
        return datetime.strptime(ts, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
    except ValueError:
        return None


class Jobs(Controller):
    def reconcile(self, work: set, now: float) -> None:
        store = self.store
        for ok in sorted(ok for ok in work if ok[0] == JOBS):
            job = store.lookup(ok)
            if job is not None:
                self.sync(ok, job, now)

    @staticmethod
    def _job_condition(ctype: str, reason: str, message: str, ts: str) -> dict:
        return {
            "type": ctype,
            "status": "True",
            "lastProbeTime": ts,
            "lastTransitionTime": ts,
            "reason": reason,
            "message": message,
        }

    def sync(self, ok: tuple, job: dict, now: float) -> None:  # noqa: C901 (one reconcile pass over a Job's pods, as the Job controller makes it)
        """One Job: create its missing pods (`_to_create`), count outcomes against backoffLimit and
        activeDeadlineSeconds, write the status, expire after the TTL."""
        store, api = self.store, self.api
        jrt, prt = store.registry.types[JOBS], self.pod_rt()
        md, spec = job["metadata"], job.get("spec") or {}
        if md.get("deletionTimestamp") or spec.get("suspend"):
            return
        side = store.side.setdefault(md.get("uid", ""), {})
        old_status = job.get("status") or {}
        status = clone(old_status)
        conds = status.get("conditions") or []
        pods = store.owned(job, PODS)
        ts = now_rfc3339()
        finished = next(
            (c for c in conds if c.get("type") in ("Complete", "Failed") and c.get("status") == "True"), None
        )
        if finished is not None:
            for p in pods:
                if is_active(p):
                    api.delete_object(prt, p, {}, actor="job-controller")
            ttl = spec.get("ttlSecondsAfterFinished")
            if ttl is not None:
                fin = side.get("finished_at")
                if fin is None:
                    wall = parse_ts(status.get("completionTime") or finished.get("lastTransitionTime")) or time.time()
                    fin = side["finished_at"] = now - max(0.0, time.time() - wall)
                due = fin + float(ttl)
                if now >= due:
                    api.delete_object(
                        jrt, job, {"propagationPolicy": "Background"}, actor="ttl-after-finished-controller"
                    )
                else:
                    store.schedule_at(due, ok)
            return
        if not status.get("startTime"):
            status["startTime"] = ts
            side["started_at"] = now
        started = side.get("started_at")
        if started is None:
            started = side["started_at"] = now - max(0.0, time.time() - (parse_ts(status["startTime"]) or time.time()))
        tmpl_spec = (spec.get("template") or {}).get("spec") or {}
        on_failure = tmpl_spec.get("restartPolicy") == "OnFailure"
        active = [p for p in pods if is_active(p)]
        indexed = spec.get("completionMode") == "Indexed"
        done = [p for p in pods if (p.get("status") or {}).get("phase") == "Succeeded"]
        succeeded = len({completion_index(p) for p in done}) if indexed else len(done)
        failed = max(
            int(old_status.get("failed") or 0), sum(1 for p in pods if (p.get("status") or {}).get("phase") == "Failed")
        )
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
            verdict = (
                "Complete",
                "SuccessCriteriaMet",
                "CompletionsReached",
                "Reached expected number of succeeded pods",
            )
        elif failed + restarts > backoff:
            verdict = ("Failed", "FailureTarget", "BackoffLimitExceeded", "Job has reached the specified backoff limit")
        elif deadline is not None and now >= started + float(deadline):
            verdict = ("Failed", "FailureTarget", "DeadlineExceeded", "Job was active longer than specified deadline")
        created = 0
        if verdict is None:
            if deadline is not None:
                store.schedule_at(started + float(deadline), ok)
            # podReplacementPolicy Failed: a terminating pod is replaced only once it is gone
            replacing = [p for p in pods if p["metadata"].get("deletionTimestamp") and (p.get("status") or {}).get("phase")
                         not in ("Succeeded", "Failed")] if spec.get("podReplacementPolicy") == "Failed" else []  # fmt: skip
            for index in self._to_create(spec, active + replacing, done, succeeded):
                self._create_job_pod(job, index)
                created += 1
        else:
            kind, target, reason, message = verdict
            for p in active:
                if reason == "BackoffLimitExceeded":  # OnFailure: the restarting pod ends Failed (kept for its logs)
                    last: dict[str, Any] = {}
                    for lst in ("initContainerStatuses", "containerStatuses"):
                        for cs in (p.get("status") or {}).get(lst) or []:
                            last = (cs.get("lastState") or {}).get("terminated") or last
                    terminate(store, p, False, last.get("message", ""))
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
            store.put(jrt, with_status(job, status), actor="job-controller", verb="update", subresource="status")

    @staticmethod
    def _to_create(spec: dict, active: list[dict], done: list[dict], succeeded: int) -> list[int | None]:
        """The pods to create now: up to `parallelism` active; an Indexed Job's are the lowest completion indexes
        neither done nor running (as the Job controller's `firstPendingIndexes`), a NonIndexed Job's unnumbered."""
        room = min(int(spec.get("parallelism", 1)), int(spec.get("completions") or 1) - succeeded) - len(active)
        if room <= 0:
            return []
        if spec.get("completionMode") != "Indexed":
            return [None] * room
        taken = {completion_index(p) for p in active + done}
        pending: list[int | None] = [i for i in range(int(spec.get("completions") or 1)) if i not in taken]
        return pending[:room]

    def _create_job_pod(self, job: dict, index: int | None) -> None:
        store, rt = self.store, self.pod_rt()
        md = job["metadata"]
        tmpl = clone((job.get("spec") or {}).get("template") or {})
        tmd = tmpl.get("metadata") or {}
        spec = tmpl.get("spec") or {"containers": [{"name": "main", "image": "busybox"}], "restartPolicy": "Never"}
        node = spec.get("nodeName") or (spec.get("nodeSelector") or {}).get("kubernetes.io/hostname")
        if node:
            spec["nodeName"] = node
        prefix = f"{md['name']}-" if index is None else f"{md['name']}-{index}-"
        for _ in range(10):
            name = f"{prefix}{random_suffix()}"
            if store.get(rt, md["namespace"], name) is None:
                break
        annotations = dict(tmd.get("annotations") or {})
        labels = {
            **(tmd.get("labels") or {}),
            "batch.kubernetes.io/controller-uid": md["uid"],
            "batch.kubernetes.io/job-name": md["name"],
            "controller-uid": md["uid"],
            "job-name": md["name"],
        }
        if index is not None:  # what the Job controller gives each pod of an Indexed Job
            labels[COMPLETION_INDEX] = annotations[COMPLETION_INDEX] = str(index)
            spec.setdefault("hostname", f"{md['name']}-{index}")
            ref = {"fieldRef": {"fieldPath": f"metadata.annotations['{COMPLETION_INDEX}']"}}
            for c in spec.get("containers") or []:
                c["env"] = [*(c.get("env") or []), {"name": "JOB_COMPLETION_INDEX", "valueFrom": ref}]
        pod: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "generateName": prefix,
                "namespace": md["namespace"],
                "labels": labels,
                "ownerReferences": [
                    {
                        "apiVersion": "batch/v1",
                        "kind": "Job",
                        "name": md["name"],
                        "uid": md["uid"],
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": spec,
        }
        if annotations:
            pod["metadata"]["annotations"] = annotations
        prepare_create(rt, pod)
        if node:
            pod["status"]["conditions"] = [
                {"type": "PodScheduled", "status": "True", "lastProbeTime": None, "lastTransitionTime": now_rfc3339()}
            ]
        store.put(rt, store.new_meta(rt, pod), actor="job-controller", verb="create")
