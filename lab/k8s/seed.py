"""Seeding: create or replace full objects through the admin API (status is kept)."""

from __future__ import annotations

import time

from .defaults import prepare_create
from .store import CRDS, NAMESPACES, PODS, Store
from .util import clone


def _order(o: dict) -> int:
    kind = o.get("kind")
    if kind == "CustomResourceDefinition":
        return 0
    if kind == "Namespace":
        return 1
    if kind == "Node":
        return 2
    if kind == "Pod":
        return 4
    return 3


def seed_objects(store: Store, objects: list[dict]) -> dict:
    """Lock held. Creates (or replaces) each object, keeping status, uid and timestamps when given."""
    created = replaced = 0
    errors: list[str] = []
    kinds: dict[str, int] = {}
    for raw in sorted((o for o in objects if isinstance(o, dict)), key=_order):
        obj = clone(raw)
        rt = store.registry.by_kind(obj.get("apiVersion", ""), obj.get("kind", ""))
        md = obj.get("metadata") or {}
        if rt is None:
            errors.append(f"unknown kind {obj.get('apiVersion')}/{obj.get('kind')} ({md.get('name')})")
            continue
        if not md.get("name"):
            errors.append(f"{rt.kind} without metadata.name")
            continue
        obj["metadata"] = md
        if rt.namespaced:
            md.setdefault("namespace", "default")
            ns_rt = store.registry.types[NAMESPACES]
            if store.get(ns_rt, None, md["namespace"]) is None:
                store.put(
                    ns_rt,
                    store.new_meta(
                        ns_rt, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": md["namespace"]}}
                    ),
                )
                created += 1
        else:
            md.pop("namespace", None)
        existing = store.get(rt, md.get("namespace"), md["name"])
        if existing is not None:
            md.setdefault("uid", existing["metadata"]["uid"])
            md.setdefault("creationTimestamp", existing["metadata"]["creationTimestamp"])
        for k in ("resourceVersion", "managedFields", "selfLink"):
            md.pop(k, None)
        store.new_meta(rt, obj, keep_uid=True)
        if rt.key == PODS:
            spec = obj.setdefault("spec", {})
            spec.setdefault("terminationGracePeriodSeconds", 30)
            spec.setdefault("schedulerName", "default-scheduler")
            spec.setdefault("restartPolicy", "Always")
            obj.setdefault("status", {}).setdefault("phase", "Pending")
            if md.get("deletionTimestamp"):
                grace = md.get("deletionGracePeriodSeconds", spec["terminationGracePeriodSeconds"])
                store.side.setdefault(md["uid"], {})["delete_at"] = time.monotonic() + float(grace) * float(
                    store.config.get("graceScale", 1.0)
                )
        if rt.key == CRDS:
            if "status" not in obj:
                prepare_create(rt, obj)
            store.registry.register_crd(obj)
        store.put(rt, obj)
        kinds[rt.kind] = kinds.get(rt.kind, 0) + 1
        if existing is None:
            created += 1
        else:
            replaced += 1
    return {
        "created": created,
        "replaced": replaced,
        "kinds": kinds,
        "errors": errors,
        "resourceVersion": str(store.rv),
    }
