"""The namespace controller: a terminating namespace's objects are deleted, then the namespace itself once it
is empty and has no finalizers."""

from __future__ import annotations

from ..store import NAMESPACES
from .base import Controller


class NamespaceLifecycle(Controller):
    def reconcile(self, work: set, now: float) -> None:
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
