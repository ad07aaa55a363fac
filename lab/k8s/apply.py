"""Server-side apply: `PATCH` with `Content-Type: application/apply-patch+yaml`, `fieldManager` and `force`.

The applied configuration is merged into the live object by its schema (lists keyed by their map keys, sets
unioned, atomic lists and maps replaced); fields the manager applied before and no longer applies are removed
unless another manager owns them; a field another manager owns and the configuration sets to a different value
is a conflict, answered 409 as the real server words it, unless `force=true` takes it over. The object is created
when it does not exist. Ownership bookkeeping is lab/k8s/managedfields.py's.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Protocol

import yaml

from . import fieldvalidation, managedfields, schemas
from .managedfields import MEMBER, Entry, Path
from .util import ApiError, clone, now_rfc3339

if TYPE_CHECKING:
    from aiohttp import web

    from .resources import Info, ResourceType
    from .store import Store


class Writes(Protocol):
    """What an apply asks of the API server (lab/k8s/api.py `Api`): its store and its create and update tails."""

    store: Store

    def create_locked(
        self, request: web.Request, info: Info, rt: ResourceType, body: dict, managed: list[dict] | None = None
    ) -> web.Response: ...

    def _finish_update(
        self,
        request: web.Request,
        info: Info,
        rt: ResourceType,
        old: dict,
        new: dict,
        sub: str,
        managed: list[dict] | None = None,
    ) -> web.Response: ...


def parse(raw: bytes) -> dict:
    try:
        body = json.loads(raw) if raw.strip()[:1] in (b"{", b"[") else yaml.safe_load(raw)
    except (ValueError, yaml.YAMLError) as e:
        raise ApiError(400, f"error decoding YAML: {e}", "BadRequest") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the object provided is unrecognized (must be of type map)", "BadRequest")
    return body


# ---------------------------------------------------------------- merging by schema
def _key(item: Any, keys: list[str]) -> str | None:
    return managedfields._pe_key(item, keys) if isinstance(item, dict) else None


def merge(live: Any, config: Any, node: dict | None) -> Any:
    if isinstance(config, dict) and isinstance(live, dict) and not schemas.is_atomic_map(node):
        out = clone(live)
        for k, v in config.items():
            out[k] = merge(live[k], v, schemas.child(node, k)[0]) if k in live else clone(v)
        return out
    if isinstance(config, list) and isinstance(live, list):
        kind, keys = schemas.list_semantics(node)
        if kind == "map" and all(isinstance(i, dict) for i in config + live):
            item_node = schemas.items(node)
            applied = {_key(i, keys): i for i in config}
            merged = [
                merge(i, applied[_key(i, keys)], item_node) if _key(i, keys) in applied else clone(i) for i in live
            ]
            seen = {_key(i, keys) for i in live}
            return merged + [clone(i) for i in config if _key(i, keys) not in seen]
        if kind == "set":
            return clone(live) + [clone(i) for i in config if i not in live]
    return clone(config)


def _remove(obj: Any, path: Path) -> None:
    """Remove the member at `path` from `obj` (a missing one is already gone)."""
    cur = obj
    for i, pe in enumerate(path):
        last = i == len(path) - 1
        if pe.startswith("f:") and isinstance(cur, dict):
            if last:
                cur.pop(pe[2:], None)
                return
            cur = cur.get(pe[2:])
        elif pe.startswith("k:") and isinstance(cur, list):
            want = json.loads(pe[2:])
            idx = next(
                (
                    j
                    for j, it in enumerate(cur)
                    if isinstance(it, dict) and all(it.get(k) == v for k, v in want.items())
                ),
                None,
            )
            if idx is None:
                return
            if last:
                del cur[idx]
                return
            cur = cur[idx]
        elif pe.startswith("v:") and isinstance(cur, list):
            v = json.loads(pe[2:])
            if last and v in cur:
                cur.remove(v)
            return
        else:
            return


def _drop_emptied(obj: dict, path: Path) -> None:
    """After a removal, drop the maps and lists it left empty on its way, as structured merge does."""
    for n in range(len(path) - 1, 0, -1):
        parent = _get(obj, path[: n - 1])
        pe = path[n - 1]
        if isinstance(parent, dict) and pe.startswith("f:") and parent.get(pe[2:]) in ({}, []):
            del parent[pe[2:]]
        else:
            return


def _get(obj: Any, path: Path) -> Any:
    cur = obj
    for pe in path:
        if pe.startswith("f:") and isinstance(cur, dict):
            cur = cur.get(pe[2:])
        elif pe.startswith("k:") and isinstance(cur, list):
            want = json.loads(pe[2:])
            cur = next(
                (it for it in cur if isinstance(it, dict) and all(it.get(k) == v for k, v in want.items())), None
            )
        else:
            return None
    return cur


# ---------------------------------------------------------------- the request
def _conflict_error(conflicts: list[tuple[Entry, Path]]) -> ApiError:
    causes = [
        {
            "reason": "FieldManagerConflict",
            "message": f"conflict with {e.describe()}",
            "field": managedfields.path_string(p),
        }
        for e, p in conflicts
    ]
    if len(conflicts) == 1:
        e, p = conflicts[0]
        msg = f"Apply failed with 1 conflict: conflict with {e.describe()}: {managedfields.path_string(p)}"
    else:
        by: dict[str, list[str]] = {}
        for e, p in conflicts:
            by.setdefault(e.describe(), []).append(managedfields.path_string(p))
        lines = []
        for who in sorted(by):
            lines.append(f"conflicts with {who}:")
            lines += [f"- {p}" for p in by[who]]
        msg = f"Apply failed with {len(conflicts)} conflicts: " + "\n".join(lines)
    return ApiError(409, msg, "Conflict", {"causes": causes})


def _options(request: web.Request) -> tuple[str, bool]:
    q = request.query
    manager = q.get("fieldManager") or ""
    if not manager:
        raise ApiError(
            422,
            'PatchOptions.meta.k8s.io "" is invalid: fieldManager: Required value: is required for apply patch',
            "Invalid",
        )
    force = (q.get("force") or "").lower() in ("1", "true")
    return manager, force


def applied(
    api: Writes,
    rt: ResourceType,
    version: str,
    live: dict | None,
    config: dict,
    manager: str,
    force: bool,
    subresource: str,
) -> tuple[dict, list[dict]]:
    """(the object after applying `config`, its managedFields). Lock held."""
    root = schemas.resource_schema(api.store, rt, version)
    config_set = managedfields.field_set(config, root, subresource, apply=True)
    me = Entry(
        manager, "Apply", f"{rt.group}/{version}" if rt.group else version, set(config_set), now_rfc3339(), subresource
    )
    if live is None:
        return clone(config), managedfields.encode([me])
    entries = managedfields.decode(live["metadata"].get("managedFields"))
    live_set = managedfields.field_set(live, root, subresource)
    previous = next((e for e in entries if e.key == me.key), None)
    others = [e for e in entries if e.key != me.key]
    conflicts = []
    for p, v in config_set.items():
        if v is MEMBER or p not in live_set or live_set[p] == v:
            continue
        conflicts += [(e, p) for e in others if p in e.fields]
    if conflicts and not force:
        raise _conflict_error(conflicts)
    for e, p in conflicts:
        e.fields.discard(p)
        e.stored = None  # encoded again (managedfields.Entry.stored)
    merged = merge(live, config, root)
    if previous is not None:
        still_owned = set(config_set).union(*(e.fields for e in others))
        for p in sorted(previous.fields - still_owned, key=len, reverse=True):
            _remove(merged, p)
            _drop_emptied(merged, p)
    return merged, managedfields.encode([*others, me])


async def handle(api: Writes, request: web.Request, info: Info, rt: ResourceType) -> web.Response:
    manager, force = _options(request)
    config = parse(await request.read())
    md = config.setdefault("metadata", {})
    if not isinstance(md, dict):
        raise ApiError(400, "metadata must be an object", "BadRequest")
    if md.get("name") and md["name"] != info.name:
        raise ApiError(
            400, f"the name of the object ({md['name']}) does not match the name on the URL ({info.name})", "BadRequest"
        )
    if rt.namespaced and md.get("namespace") and md["namespace"] != info.namespace:
        raise ApiError(
            400, "the namespace of the provided object does not match the namespace sent on the request", "BadRequest"
        )
    gv = f"{rt.group}/{info.version}" if rt.group else info.version
    if config.get("apiVersion") != gv or config.get("kind") != rt.kind:
        raise ApiError(
            400,
            f"the apiVersion and kind of the applied object ({config.get('apiVersion')}, "
            f"{config.get('kind')}) do not match the request ({gv}, {rt.kind})",
            "BadRequest",
        )
    fieldvalidation.check(
        config,
        schemas.resource_schema(api.store, rt, info.version),
        request.query,
        rt.kind,
        info.version,
        request.setdefault("warnings", []),
    )
    md["name"] = info.name
    if rt.namespaced:
        md["namespace"] = info.namespace
    async with api.store.lock:
        live = api.store.get(rt, info.namespace, info.name)
        if live is None:
            if info.subresource:
                raise api.store.not_found(rt, info.name)
            obj, managed = applied(api, rt, info.version, None, config, manager, force, "")
            return api.create_locked(request, info, rt, obj, managed)
        current = rt.served(live, info.version)
        new, managed = applied(api, rt, info.version, current, config, manager, force, info.subresource)
        new["metadata"]["managedFields"] = managed
        return api._finish_update(request, info, rt, live, new, info.subresource, managed=managed)
