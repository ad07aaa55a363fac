"""Node reboots: a node goes NotReady for `rebootSeconds`, then comes back Ready with a new boot ID (a Job's
`reboot` interrupt starts one, lab/k8s/controllers/kubelet.py)."""

from __future__ import annotations

import time
import uuid

from ..store import NODES, PODS, Store
from ..util import clone, now_rfc3339
from .base import Controller

REBOOT_MESSAGE = "lab: node is rebooting"


def set_node_ready(node: dict, ready: bool, reason: str, message: str) -> None:
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


def start_reboot(store: Store, node_name: str, now: float) -> None:
    """The node goes NotReady for rebootSeconds, then comes back Ready with a new bootID."""
    nrt = store.registry.types[NODES]
    node = store.get(nrt, None, node_name)
    if node is None or node_name in store.rebooting:
        return
    new = clone(node)
    set_node_ready(new, False, "KubeletNotReady", REBOOT_MESSAGE)
    store.put(nrt, new, actor="kubelet", verb="update", subresource="status")
    due = now + float(store.config.get("rebootSeconds", 2.0))
    store.rebooting[node_name] = due
    store.schedule_at(due, (NODES, ("", node_name)))


class Reboots(Controller):
    def resume(self) -> None:
        """After a restart from a state file: reboots in flight finish at once (their timers were in memory)."""
        store, now = self.store, time.monotonic()
        for node in store.all(NODES):
            for c in (node.get("status") or {}).get("conditions") or []:
                if c.get("type") == "Ready" and c.get("status") != "True" and c.get("message") == REBOOT_MESSAGE:
                    store.rebooting[node["metadata"]["name"]] = now
                    store.schedule_at(now, (NODES, ("", node["metadata"]["name"])))

    def reconcile(self, work: set, now: float) -> None:
        store = self.store
        nrt = store.registry.types[NODES]
        for name, due in sorted(store.rebooting.items()):
            if now < due:
                continue
            del store.rebooting[name]
            node = store.get(nrt, None, name)
            if node is None:
                continue
            new = clone(node)
            set_node_ready(new, True, "KubeletReady", "kubelet is posting ready status")
            new.setdefault("status", {}).setdefault("nodeInfo", {})["bootID"] = str(uuid.uuid4())
            store.put(nrt, new, actor="kubelet", verb="update", subresource="status")
            for k in store.pods_by_node.get(name, ()):
                store.dirty.add((PODS, k))
