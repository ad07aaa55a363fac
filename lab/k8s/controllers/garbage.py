"""The garbage collector: deletes dependents whose owners (deleted with cascading propagation) are all gone."""

from __future__ import annotations

from .base import Controller


class GarbageCollector(Controller):
    def reconcile(self, work: set, now: float) -> None:
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
