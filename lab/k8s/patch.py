"""JSON merge patch (RFC 7386), JSON patch (RFC 6902) and an approximation of strategic merge patch."""

from __future__ import annotations

from typing import Any

from .util import clone


class PatchError(Exception):
    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


# ---------------------------------------------------------------- RFC 7386
def merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return clone(patch)
    result = clone(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            result.pop(k, None)
        else:
            result[k] = merge_patch(result.get(k), v)
    return result


# ---------------------------------------------------------------- RFC 6902
def _unescape(tok: str) -> str:
    return tok.replace("~1", "/").replace("~0", "~")


def _parse_pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise PatchError(422, f"JSON pointer {path!r} must start with '/'")
    return [_unescape(t) for t in path[1:].split("/")]


def _resolve_parent(doc: Any, toks: list[str], path: str) -> tuple[Any, str]:
    cur = doc
    for t in toks[:-1]:
        if isinstance(cur, dict):
            if t not in cur:
                raise PatchError(422, f'doc is missing path: "{path}": missing value')
            cur = cur[t]
        elif isinstance(cur, list):
            try:
                cur = cur[int(t)]
            except (ValueError, IndexError):
                raise PatchError(422, f'doc is missing path: "{path}": missing value') from None
        else:
            raise PatchError(422, f'doc is missing path: "{path}": missing value')
    return cur, toks[-1]


def _get(doc: Any, path: str) -> Any:
    toks = _parse_pointer(path)
    if not toks:
        return doc
    parent, last = _resolve_parent(doc, toks, path)
    try:
        if isinstance(parent, dict):
            return parent[last]
        if isinstance(parent, list):
            return parent[int(last)]
    except (KeyError, ValueError, IndexError):
        pass
    raise PatchError(422, f'doc is missing path: "{path}": missing value')


def _add(doc: Any, path: str, value: Any) -> Any:
    toks = _parse_pointer(path)
    if not toks:
        return value
    parent, last = _resolve_parent(doc, toks, path)
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        if last == "-":
            parent.append(value)
        else:
            try:
                i = int(last)
            except ValueError:
                raise PatchError(422, f"invalid array index {last!r}") from None
            if i < 0 or i > len(parent):
                raise PatchError(422, f'add operation does not apply: doc is missing path: "{path}": missing value')
            parent.insert(i, value)
    else:
        raise PatchError(422, f'doc is missing path: "{path}": missing value')
    return doc


def _remove(doc: Any, path: str) -> Any:
    toks = _parse_pointer(path)
    parent, last = _resolve_parent(doc, toks, path)
    try:
        if isinstance(parent, dict):
            del parent[last]
            return doc
        if isinstance(parent, list):
            del parent[int(last)]
            return doc
    except (KeyError, ValueError, IndexError):
        pass
    raise PatchError(422, f'remove operation does not apply: doc is missing path: "{path}": missing value')


def json_patch(doc: Any, ops: Any) -> Any:
    if not isinstance(ops, list):
        raise PatchError(400, "json: cannot unmarshal object into Go value of type jsonpatch.Patch")
    doc = clone(doc)
    for op in ops:
        if not isinstance(op, dict) or "op" not in op:
            raise PatchError(400, "Unexpected kind: missing op")
        kind, path = op["op"], op.get("path", "")
        if kind == "add":
            doc = _add(doc, path, clone(op.get("value")))
        elif kind == "remove":
            doc = _remove(doc, path)
        elif kind == "replace":
            _get(doc, path)
            if _parse_pointer(path):
                doc = _remove(doc, path)
            doc = _add(doc, path, clone(op.get("value")))
        elif kind == "move":
            val = _get(doc, op["from"])
            doc = _remove(doc, op["from"])
            doc = _add(doc, path, val)
        elif kind == "copy":
            doc = _add(doc, path, clone(_get(doc, op["from"])))
        elif kind == "test":
            try:
                cur = _get(doc, path)
            except PatchError:
                raise PatchError(422, f"testing value {path} failed: test failed") from None
            if cur != op.get("value"):
                raise PatchError(422, f"testing value {path} failed: test failed")
        else:
            raise PatchError(400, f"Unexpected kind: {kind}")
    return doc


# ---------------------------------------------------------------- strategic merge patch
_NAME_KEYED = {
    "containers",
    "initContainers",
    "ephemeralContainers",
    "volumes",
    "env",
    "volumeMounts",
    "imagePullSecrets",
    "volumeDevices",
    "resourceClaims",
    "hostAliases_",
}


def merge_key(field: str, path: tuple[str, ...], kind: str) -> str | None:
    if field in _NAME_KEYED:
        return "name"
    if field == "conditions":
        return "type"
    if field == "ownerReferences":
        return "uid"
    if field == "addresses" and kind == "Node":
        return "type"
    if field == "hostAliases":
        return "ip"
    if field in ("podIPs", "podIPs"):
        return "ip"
    if field == "ports":
        if kind == "Service" and path[-1:] == ("spec",):
            return "port"
        return "containerPort"
    return None


def strategic_merge_patch(target: Any, patch: Any, kind: str, path: tuple[str, ...] = ()) -> Any:
    if not isinstance(patch, dict):
        return clone(patch)
    if patch.get("$patch") == "replace":
        return {k: clone(v) for k, v in patch.items() if k != "$patch"}
    if patch.get("$patch") == "delete":
        return None
    result = clone(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if k.startswith("$setElementOrder/") or k == "$retainKeys" or k == "$patch":
            continue
        if k.startswith("$deleteFromPrimitiveList/"):
            field = k.split("/", 1)[1]
            if isinstance(result.get(field), list) and isinstance(v, list):
                result[field] = [x for x in result[field] if x not in v]
            continue
        if v is None:
            result.pop(k, None)
            continue
        if isinstance(v, list):
            key = merge_key(k, path, kind)
            if key is not None and all(isinstance(x, dict) for x in v) and isinstance(result.get(k), list):
                result[k] = _merge_list(result[k], v, key, kind, (*path, k))
            else:
                result[k] = [x for x in (clone(v)) if not (isinstance(x, dict) and x.get("$patch"))]
            continue
        if isinstance(v, dict):
            merged = strategic_merge_patch(result.get(k), v, kind, (*path, k))
            if merged is None:
                result.pop(k, None)
            else:
                result[k] = merged
            continue
        result[k] = v
    return result


def _merge_list(orig: list, patch: list, key: str, kind: str, path: tuple[str, ...]) -> list:
    out = clone(orig)
    for item in patch:
        if item.get("$patch") == "replace":
            return [dict((kk, vv) for kk, vv in i.items() if kk != "$patch") for i in patch if i is not item]
        kv = item.get(key)
        idx = next((i for i, o in enumerate(out) if isinstance(o, dict) and o.get(key) == kv), None)
        if item.get("$patch") == "delete":
            if idx is not None:
                out.pop(idx)
            continue
        if idx is None:
            out.append(strategic_merge_patch({}, item, kind, path))
        else:
            out[idx] = strategic_merge_patch(out[idx], item, kind, path)
    return out
