"""Field ownership (`metadata.managedFields`, FieldsV1) as the API server's field manager keeps it.

A field set is a dict from path to value; a path is a tuple of FieldsV1 path elements: `f:name` for an object
field, `k:{"name":"c"}` for an item of a list keyed by fields, `v:"x"` for an item of a set. How a list or map
is keyed comes from the kind's schema (lab/k8s/schemas.py), as structured-merge-diff reads it.

Every write through the API records who changed what: a create or update makes the writer (`fieldManager`, or
the User-Agent's product name, as the real server defaults it) own the fields it added or changed and takes them
from every other manager; a server-side apply (lab/k8s/apply.py) makes the applier own exactly what it applied.
The emulator's own controllers write around this, as if they had no field manager.
"""

from __future__ import annotations

import json
from typing import Any

from . import schemas
from .util import now_rfc3339

# what the real field manager strips before tracking (k8s.io/apimachinery/pkg/util/managedfields stripmeta)
STRIPPED_META = {
    "name",
    "namespace",
    "creationTimestamp",
    "selfLink",
    "uid",
    "generation",
    "managedFields",
    "resourceVersion",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
}
MEMBER = object()  # the value recorded for a path that has members under it (compared through its leaves)

Path = tuple[str, ...]


def _pe_key(item: dict, keys: list[str]) -> str:
    return "k:" + json.dumps({k: item[k] for k in sorted(keys) if k in item}, separators=(",", ":"))


def _pe_value(v: Any) -> str:
    return "v:" + json.dumps(v, separators=(",", ":"))


def _walk(value: Any, node: dict | None, path: Path, out: dict, granular_members: bool) -> None:
    if isinstance(value, dict) and not schemas.is_atomic_map(node):
        if not value:
            out[path] = value
            return
        if granular_members and path and schemas.is_granular_map(node):
            out[path] = MEMBER
        for k, v in value.items():
            _walk(v, schemas.child(node, k)[0], (*path, f"f:{k}"), out, granular_members)
    elif isinstance(value, list) and value:
        kind, keys = schemas.list_semantics(node)
        if kind == "map" and all(isinstance(i, dict) for i in value):
            item_node = schemas.items(node)
            for item in value:
                ipath = (*path, _pe_key(item, keys))
                out[ipath] = MEMBER if item else item
                for k, v in item.items():
                    _walk(v, schemas.child(item_node, k)[0], (*ipath, f"f:{k}"), out, granular_members)
        elif kind == "set" and not any(isinstance(i, (dict, list)) for i in value):
            for item in value:
                out[(*path, _pe_value(item))] = item
        else:
            out[path] = value
    else:
        out[path] = value


def field_set(obj: dict, root: dict | None, subresource: str = "", apply: bool = False) -> dict[Path, Any]:
    """The fields of `obj` a write to the main resource (or its /status) is about, path -> value."""
    out: dict[Path, Any] = {}
    for k, v in obj.items():
        if k in ("apiVersion", "kind"):
            continue
        if (k == "status") != (subresource == "status"):
            continue  # the main resource resets status, /status resets everything else
        node = schemas.child(root, k)[0]
        if k == "metadata" and isinstance(v, dict):
            meta = {mk: mv for mk, mv in v.items() if mk not in STRIPPED_META}
            for mk, mv in meta.items():
                _walk(mv, schemas.child(node, mk)[0], ("f:metadata", f"f:{mk}"), out, not apply)
            continue
        _walk(v, node, (f"f:{k}",), out, not apply)
    return out


# ---------------------------------------------------------------- FieldsV1 <-> sets of paths
def to_fields_v1(paths) -> dict:
    tree: dict = {}
    members = set(paths)
    for p in sorted(members):
        node = tree
        for pe in p:
            node = node.setdefault(pe, {})
    # a path that is a member and has children gets "."
    for p in members:
        node = tree
        for pe in p:
            node = node[pe]
        if node and "." not in node:
            node["."] = {}
    return _sorted(tree)


def _sorted(tree: dict) -> dict:
    return {k: _sorted(v) for k, v in sorted(tree.items(), key=lambda kv: (kv[0] != ".", kv[0]))}


def from_fields_v1(tree: Any, prefix: Path = ()) -> set[Path]:
    out: set[Path] = set()
    if not isinstance(tree, dict):
        return out
    if not tree and prefix:
        out.add(prefix)
    for k, v in tree.items():
        if k == ".":
            out.add(prefix)
        else:
            out |= from_fields_v1(v, (*prefix, k))
    return out


def path_string(p: Path) -> str:
    """How conflicts name a field: .spec.containers[name="c"].image"""
    s = ""
    for pe in p:
        if pe.startswith("f:"):
            s += "." + pe[2:]
        elif pe.startswith("k:"):
            s += "[" + ",".join(f"{k}={json.dumps(v)}" for k, v in json.loads(pe[2:]).items()) + "]"
        elif pe.startswith("v:"):
            s += f"[={pe[2:]}]"
    return s


# ---------------------------------------------------------------- entries
class Entry:
    def __init__(
        self,
        manager: str,
        operation: str,
        api_version: str,
        fields: set[Path],
        time: str | None = None,
        subresource: str = "",
    ):
        self.manager, self.operation, self.api_version = manager, operation, api_version
        self.fields, self.time, self.subresource = fields, time, subresource
        # The entry as it was stored (`decode`), for `encode` while its fields are unchanged: encoding FieldsV1
        # again (sorted) for every write to an object was a tenth of the emulator's CPU in a 1,000-node rollout,
        # mostly for entries the write did not touch. Whoever changes `fields` sets it None.
        self.stored: dict | None = None

    @property
    def key(self) -> tuple:
        if self.operation == "Apply":
            return (self.manager, "Apply", self.subresource)
        return (self.manager, "Update", self.api_version, self.subresource)

    def describe(self) -> str:
        """printManager in k8s.io/apimachinery/pkg/util/managedfields/internal/conflict.go."""
        s = json.dumps(self.manager)
        if self.subresource:
            s += f" with subresource {json.dumps(self.subresource)}"
        if self.operation == "Update":
            s += f" using {self.api_version}"
        return s

    def encode(self) -> dict:
        if self.stored is not None:
            return self.stored
        d = {
            "manager": self.manager,
            "operation": self.operation,
            "apiVersion": self.api_version,
            "time": self.time or now_rfc3339(),
            "fieldsType": "FieldsV1",
            "fieldsV1": to_fields_v1(self.fields),
        }
        if self.subresource:
            d["subresource"] = self.subresource
        return d


def decode(managed: Any) -> list[Entry]:
    out = []
    for m in managed or []:
        if not isinstance(m, dict) or (not m.get("manager") and not m.get("fieldsV1")):
            continue
        out.append(
            Entry(
                str(m.get("manager", "")),
                m.get("operation") or "Update",
                m.get("apiVersion") or "",
                from_fields_v1(m.get("fieldsV1") or {}),
                m.get("time"),
                m.get("subresource") or "",
            )
        )
        out[-1].stored = m
    return out


def encode(entries: list[Entry]) -> list[dict]:
    live = [e for e in entries if e.fields]
    live.sort(key=lambda e: (e.operation != "Apply", e.time or "", e.manager))
    return [e.encode() for e in live]


def default_manager(field_manager: str | None, user_agent: str | None) -> str:
    """The `fieldManager` query parameter, else the User-Agent's product name, as the real server derives it."""
    if field_manager:
        return field_manager
    return ((user_agent or "").split("/")[0] or "unknown")[:128]


# ---------------------------------------------------------------- recording a write that is not an apply
def record_update(
    old: dict | None, new: dict, root: dict | None, manager: str, api_version: str, subresource: str = ""
) -> None:
    """Set new.metadata.managedFields after a create (old None) or an update by `manager`."""
    md = new.setdefault("metadata", {})
    sent = decode(md.get("managedFields"))
    before = (old or {}).get("metadata", {}).get("managedFields")
    # a client that changes managedFields itself (kubectl's client-side-apply upgrade does) is taken at its word
    if sent and md.get("managedFields") != before:
        entries = sent
        for e in entries:  # encoded again, as the server stores them
            e.stored = None
    else:
        entries = decode(before)
    old_set = field_set(old, root, subresource) if old else {}
    new_set = field_set(new, root, subresource)
    added = {p for p in new_set if p not in old_set}
    removed = {p for p in old_set if p not in new_set}
    modified = {p for p in new_set if p in old_set and new_set[p] is not MEMBER and new_set[p] != old_set[p]}
    changed = added | modified
    mine = Entry(manager, "Update", api_version, set(), now_rfc3339(), subresource)
    kept = []
    for e in entries:
        if e.key == mine.key:
            mine.fields = set(e.fields)
            continue
        if e.fields & (changed | removed):
            e.fields -= changed | removed
            e.stored = None  # else kept as it was stored (a stored object is never changed in place)
        kept.append(e)
    mine.fields = (mine.fields | changed) - removed
    md["managedFields"] = encode([*kept, mine])
