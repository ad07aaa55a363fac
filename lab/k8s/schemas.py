"""The emulator's schemas: the built-in kinds' OpenAPI definitions of the Kubernetes release it claims to be, and
each served CRD version's `openAPIV3Schema`, with what server-side apply and strict field validation read from
them (list types, map types, unknown fields).

The built-in definitions are kubernetes-validate's copy of the release's published OpenAPI (with every
`x-kubernetes-*` extension), turned back from JSON Schema into OpenAPI form: nullable type lists become one type,
`$defs` references become `#/definitions/...`, and the `apiVersion`/`kind` enums that copy adds are dropped.
"""

from __future__ import annotations

import functools
import json
import os
from typing import TYPE_CHECKING, Any

from .util import clone

if TYPE_CHECKING:
    from .resources import ResourceType
    from .store import Store

RELEASE = "v1.32.0"  # the minor release lab/k8s/api.py VERSION_INFO reports
REF = "#/definitions/"
OBJECT_META = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
LIST_META = "io.k8s.apimachinery.pkg.apis.meta.v1.ListMeta"
KNOWN_SCALARS = {
    "io.k8s.apimachinery.pkg.util.intstr.IntOrString": {"type": "string", "format": "int-or-string"},
    "io.k8s.apimachinery.pkg.api.resource.Quantity": {"type": "string"},
}


class SchemasUnavailable(RuntimeError):
    pass


def _definitions_file() -> str:
    try:
        import kubernetes_validate
    except ImportError:  # a test/lab extra (pyproject.toml), not a runtime dependency of the worker
        raise SchemasUnavailable(
            "the Kubernetes emulator's OpenAPI needs kubernetes-validate: pip install -e '.[test]'"
        ) from None
    return os.path.join(
        os.path.dirname(kubernetes_validate.__file__), "kubernetes-json-schema", f"{RELEASE}-local", "_definitions.json"
    )


def _to_openapi(node: Any, gvk_object: bool = False) -> Any:
    if isinstance(node, list):
        return [_to_openapi(v) for v in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for k, v in node.items():
        if k == "type" and isinstance(v, list):
            types = [t for t in v if t != "null"]
            out[k] = types[0] if len(types) == 1 else types
        elif k == "$ref" and isinstance(v, str):
            out[k] = REF + v.rsplit("/", 1)[-1]
        elif k == "oneOf" and all(isinstance(o, dict) and set(o) == {"type"} for o in v):
            continue  # JSON Schema's spelling of a union scalar; the OpenAPI form has none
        elif k == "properties" and isinstance(v, dict):
            props = {pk: _to_openapi(pv) for pk, pv in v.items()}
            if gvk_object:
                for tk in ("apiVersion", "kind"):
                    if isinstance(props.get(tk), dict):
                        props[tk].pop("enum", None)
            out[k] = props
        else:
            out[k] = _to_openapi(v)
    return out


@functools.cache
def definitions() -> dict[str, dict]:
    """Every built-in definition by name, in OpenAPI v2 form (refs `#/definitions/NAME`)."""
    with open(_definitions_file()) as f:
        raw = json.load(f)["$defs"]
    out = {}
    for name, d in raw.items():
        conv = _to_openapi(d, gvk_object="x-kubernetes-group-version-kind" in d)
        if name in KNOWN_SCALARS:
            conv = {**{k: v for k, v in conv.items() if k == "description"}, **KNOWN_SCALARS[name]}
        out[name] = conv
    return out


@functools.cache
def _gvk_index() -> dict[tuple[str, str, str], str]:
    idx = {}
    for name, d in definitions().items():
        gvks = d.get("x-kubernetes-group-version-kind") or []
        if len(gvks) == 1:  # DeleteOptions, WatchEvent... carry many and are not resources
            g = gvks[0]
            idx[(g.get("group", ""), g["version"], g["kind"])] = name
    return idx


def builtin_name(group: str, version: str, kind: str) -> str | None:
    return _gvk_index().get((group, version, kind))


def crd_name(group: str, version: str, kind: str) -> str:
    """How the real server names a CRD version's schema: the group reversed, then version and kind."""
    return ".".join(reversed(group.split("."))) + f".{version}.{kind}"


def crd_object(store: Store, rt: ResourceType) -> dict | None:
    from .store import CRDS

    return store.get(store.registry.types[CRDS], None, f"{rt.plural}.{rt.group}")


def crd_version_schema(crd: dict, version: str) -> dict:
    for v in (crd.get("spec") or {}).get("versions") or []:
        if v.get("name") == version:
            return clone(
                ((v.get("schema") or {}).get("openAPIV3Schema"))
                or {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
            )
    return {"type": "object", "x-kubernetes-preserve-unknown-fields": True}


def crd_definitions(crd: dict, version: str) -> dict[str, dict]:
    """A CRD version's object and list definitions, as the real server publishes them."""
    spec = crd["spec"]
    group, kind = spec["group"], spec["names"]["kind"]
    gvk = [{"group": group, "kind": kind, "version": version}]
    obj = crd_version_schema(crd, version)
    obj.setdefault("type", "object")
    props = obj.setdefault("properties", {})
    tm = definitions()["io.k8s.api.core.v1.Pod"]["properties"]
    props["apiVersion"] = clone(tm["apiVersion"])
    props["kind"] = clone(tm["kind"])
    props["metadata"] = {"$ref": REF + OBJECT_META, "description": tm["metadata"]["description"]}
    obj["x-kubernetes-group-version-kind"] = gvk
    name = crd_name(group, version, kind)
    lst = {
        "description": f"{kind}List is a list of {kind}",
        "type": "object",
        "required": ["items"],
        "properties": {
            "apiVersion": clone(tm["apiVersion"]),
            "items": {
                "type": "array",
                "items": {"$ref": REF + name},
                "description": f"List of {spec['names']['plural']}. More info: "
                "https://git.k8s.io/community/contributors/devel/"
                "sig-architecture/api-conventions.md",
            },
            "kind": clone(tm["kind"]),
            "metadata": {"$ref": REF + LIST_META},
        },
        "x-kubernetes-group-version-kind": [
            {"group": group, "kind": spec["names"].get("listKind") or f"{kind}List", "version": version}
        ],
    }
    return {name: obj, crd_name(group, version, spec["names"].get("listKind") or f"{kind}List"): lst}


def resource_schema(store: Store, rt: ResourceType, version: str | None = None) -> dict | None:
    """The root schema of a kind's objects (refs resolve in definitions()), or None when unknown."""
    version = version or rt.version
    if rt.builtin:
        name = builtin_name(rt.group, version, rt.kind)
        return definitions().get(name) if name else None
    crd = crd_object(store, rt)
    if crd is None:
        return None
    return crd_definitions(crd, version)[crd_name(rt.group, version, rt.kind)]


def closure(roots: list[str]) -> list[str]:
    """The definition names reachable from `roots` through $ref, roots first."""
    defs = definitions()
    seen: list[str] = []
    stack = list(roots)
    while stack:
        n = stack.pop()
        if n in seen or n not in defs:
            continue
        seen.append(n)
        _collect_refs(defs[n], stack)
    return seen


def _collect_refs(node: Any, out: list[str]) -> None:
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith(REF):
            out.append(ref[len(REF) :])
        for v in node.values():
            _collect_refs(v, out)
    elif isinstance(node, list):
        for v in node:
            _collect_refs(v, out)


# ---------------------------------------------------------------- reading a schema node
def resolve(node: dict | None) -> dict | None:
    """Follow `$ref` (and a one-element allOf) to the schema that describes the value."""
    seen = 0
    while isinstance(node, dict) and seen < 32:
        seen += 1
        if isinstance(node.get("$ref"), str) and node["$ref"].startswith(REF):
            node = definitions().get(node["$ref"][len(REF) :])
        elif len(node.get("allOf") or []) == 1 and "properties" not in node:
            node = node["allOf"][0]
        else:
            break
    return node


def preserves_unknown(node: dict | None) -> bool:
    return node is None or bool(node.get("x-kubernetes-preserve-unknown-fields"))


def child(node: dict | None, key: str) -> tuple[dict | None, bool]:
    """(the schema of field `key` of an object described by `node`, whether the field is declared)."""
    node = resolve(node)
    if node is None:
        return None, True
    props = node.get("properties")
    if isinstance(props, dict) and key in props:
        return props[key], True
    extra = node.get("additionalProperties")
    if isinstance(extra, dict):
        return extra, True
    if extra is True or preserves_unknown(node) or (not props and node.get("type") in (None, "object")):
        return None, True
    return None, False


def items(node: dict | None) -> dict | None:
    node = resolve(node)
    it = node.get("items") if node else None
    return it if isinstance(it, dict) else None


def list_semantics(field_node: dict | None) -> tuple[str, list[str]]:
    """How structured merge treats a list: ("map", keys), ("set", []) or ("atomic", []).

    `x-kubernetes-list-type` decides; without it, a strategic-merge `merge` strategy with a merge key makes the
    list a map on that key (and without a key, a set), as the server's schema conversion does; otherwise atomic.
    """
    if not field_node:
        return "atomic", []
    nodes = [field_node, resolve(field_node) or {}]
    for n in nodes:
        lt = n.get("x-kubernetes-list-type")
        if lt == "map":
            return "map", list(n.get("x-kubernetes-list-map-keys") or [])
        if lt in ("set", "atomic"):
            return lt, []
    for n in nodes:
        strategy = n.get("x-kubernetes-patch-strategy") or ""
        if "merge" in strategy.split(","):
            key = n.get("x-kubernetes-patch-merge-key")
            return ("map", [key]) if key else ("set", [])
    return "atomic", []


def is_atomic_map(field_node: dict | None) -> bool:
    return any(n and n.get("x-kubernetes-map-type") == "atomic" for n in (field_node, resolve(field_node)))


def is_granular_map(field_node: dict | None) -> bool:
    """A map (additionalProperties) whose keys are owned one by one, like labels."""
    n = resolve(field_node)
    return n is not None and isinstance(n.get("additionalProperties"), dict) and not is_atomic_map(field_node)
