"""The ReplicaSet controller: as many active pods as `spec.replicas` (the least advanced go first when scaling
down), and the status counts."""

from __future__ import annotations

from ..store import PODS, REPLICASETS, is_pod_ready
from ..util import clone, random_suffix
from .base import Controller
from .pods import is_active


class ReplicaSets(Controller):
    def reconcile(self, work: set, now: float) -> None:
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
            active = [p for p in owned if is_active(p)]
            want = int((rs.get("spec") or {}).get("replicas", 1))
            if len(active) < want:
                for _ in range(want - len(active)):
                    self._create_pod(rs)
            elif len(active) > want:

                def rank(p: dict):
                    return (
                        bool((p.get("spec") or {}).get("nodeName")),
                        (p.get("status") or {}).get("phase") == "Running",
                        is_pod_ready(p),
                        [-ord(ch) for ch in p["metadata"].get("creationTimestamp", "")],
                    )

                for p in sorted(active, key=rank)[: len(active) - want]:
                    self.api.delete_object(pod_rt, p, {}, actor="replicaset-controller")
            # status
            owned = store.owned(rs, PODS)
            active = [p for p in owned if is_active(p)]
            ready = sum(1 for p in active if is_pod_ready(p))
            status = {
                "replicas": len(active),
                "fullyLabeledReplicas": len(active),
                "readyReplicas": ready,
                "availableReplicas": ready,
                "observedGeneration": md.get("generation", 1),
            }
            if (rs.get("status") or {}) != status:
                new = clone(rs)
                new["status"] = status
                store.put(rs_rt, new, actor="replicaset-controller", verb="update", subresource="status")

    def _create_pod(self, rs: dict) -> None:
        store, rt = self.store, self.pod_rt()
        md = rs["metadata"]
        tmpl = clone((rs.get("spec") or {}).get("template") or {})
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
        pod: dict = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "generateName": f"{md['name']}-",
                "namespace": md["namespace"],
                "labels": dict(tmd.get("labels") or {}),
                "annotations": dict(tmd.get("annotations") or {}),
                "ownerReferences": [
                    {
                        "apiVersion": "apps/v1",
                        "kind": "ReplicaSet",
                        "name": md["name"],
                        "uid": md["uid"],
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": spec,
            "status": {"phase": "Pending", "qosClass": "BestEffort"},
        }
        if not pod["metadata"]["annotations"]:
            del pod["metadata"]["annotations"]
        store.put(rt, store.new_meta(rt, pod), actor="replicaset-controller", verb="create")
