"""What every simulated controller shares: the store it reconciles and a few status-writing helpers."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..store import PODS
from ..util import now_rfc3339, with_status

if TYPE_CHECKING:
    from ..api import Api


class Controller:
    """One simulated controller. `reconcile(work, now)` runs once per pass of the composite loop
    (lab/k8s/controllers/composite.py), lock held: `work` is what changed or came due since the last pass."""

    def __init__(self, api: Api) -> None:
        self.api = api  # delete semantics (Api.delete_object) are the API server's, shared with DELETE
        self.store = api.store

    def reconcile(self, work: set, now: float) -> None:
        raise NotImplementedError

    def pod_rt(self):
        return self.store.registry.types[PODS]

    def _rt(self, key: tuple[str, str]):
        return self.store.registry.types.get(key)

    def _status_put(self, rt, obj: dict, status: dict, actor: str) -> dict:
        if (obj.get("status") or {}) == status:
            return obj
        return self.store.put(rt, with_status(obj, status), actor=actor, verb="update", subresource="status")

    @staticmethod
    def _cond(old: dict, ctype: str, ok: bool, reason: str, message: str = "") -> dict:
        status = "True" if ok else "False"
        prev = next((c for c in (old.get("conditions") or []) if c.get("type") == ctype), None)
        ts = prev["lastTransitionTime"] if prev and prev.get("status") == status else now_rfc3339()
        return {"type": ctype, "status": status, "reason": reason, "message": message, "lastTransitionTime": ts}
