"""vCluster (the Cluster API provider VCluster): a VCluster becomes ready (`status.ready`, phase Deployed) after
`vclusterReadySeconds` and gets its kubeconfig Secret `vc-<name>` (key `config`), owned by it. The emulator runs no
tenant API server: the kubeconfig points at this (host) emulator under a context of its own."""

from __future__ import annotations

import base64
import uuid

import yaml

from ..admin import kubeconfig
from ..crds import VCLUSTERS
from .base import Controller


class VClusters(Controller):
    url = ""  # the (host) emulator's own URL, once serving: the tenant kubeconfigs point there

    def reconcile(self, work: set, now: float) -> None:
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
                secret = {
                    "apiVersion": "v1",
                    "kind": "Secret",
                    "type": "Opaque",
                    "metadata": {
                        "name": sname,
                        "namespace": md["namespace"],
                        "labels": {"app": "vcluster", "vcluster-name": md["name"]},
                        "ownerReferences": [
                            {
                                "apiVersion": vc["apiVersion"],
                                "kind": "VCluster",
                                "name": md["name"],
                                "uid": md["uid"],
                                "controller": True,
                            }
                        ],
                    },
                    "data": {"config": base64.b64encode(cfg.encode()).decode()},
                }
                store.put(s_rt, store.new_meta(s_rt, secret), actor="vcluster", verb="create")
            old = vc.get("status") or {}
            self._status_put(
                rt,
                vc,
                {
                    "ready": True,
                    "initialized": True,
                    "phase": "Deployed",
                    "conditions": [self._cond(old, "Ready", True, "Deployed")],
                },
                "vcluster-provider",
            )
