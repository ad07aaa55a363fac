"""KAI Scheduler queues: `status.childQueues` of every parent, and an `Orphan` condition when a parent is
missing."""

from __future__ import annotations

from ..crds import QUEUES
from .base import Controller


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
