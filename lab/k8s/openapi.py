"""`/openapi/v2` and `/openapi/v3` generated from the registry: what kubectl reads before `apply` (whether the
server takes `fieldValidation`, the strategic-merge metadata of built-in kinds) and `explain`.

Every served kind gets the real server's operations (get, list, create, replace, patch, delete,
deletecollection, and /status), each PATCH with `x-kubernetes-group-version-kind` and the query parameters
`dryRun`, `fieldManager`, `fieldValidation` and `force`; built-in kinds accept strategic merge patch, custom
resources do not. Schemas come from lab/k8s/schemas.py.

kubectl 1.32 asks for v3 as JSON and for v2 only as protobuf (lab/k8s/openapi_proto.py); v2 is also served as
JSON to clients that ask for it.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from . import openapi_proto, schemas
from .util import ApiError

if TYPE_CHECKING:
    from .resources import ResourceType
    from .store import Store

V2_PROTOBUF = "application/com.github.proto-openapi.spec.v2@v1.0+protobuf"  # what clients ask for
V2_PROTOBUF_SENT = "application/com.github.proto-openapi.spec.v2.v1.0+protobuf"  # what the server labels it
V3_SCHEMAS = "#/components/schemas/"
PATCH_TYPES = [
    "application/apply-patch+yaml",
    "application/json-patch+json",
    "application/merge-patch+json",
    "application/strategic-merge-patch+json",
]
META = "io.k8s.apimachinery.pkg.apis.meta.v1."
QUERY_DOCS = {
    "dryRun": "When present, indicates that modifications should not be persisted. An invalid or unrecognized "
    "dryRun directive will result in an error response and no further processing of the request. "
    "Valid values are: - All: all dry run stages will be processed",
    "fieldManager": "fieldManager is a name associated with the actor or entity that is making these changes. "
    "The value must be less than or 128 characters long, and only contain printable characters, "
    "as defined by https://golang.org/pkg/unicode/#IsPrint. This field is required for apply "
    "requests (application/apply-patch) but optional for non-apply patch types (JsonPatch, "
    "MergePatch, StrategicMergePatch).",
    "fieldValidation": "fieldValidation instructs the server on how to handle objects in the request "
    "(POST/PUT/PATCH) containing unknown or duplicate fields. Valid values are: - Ignore: This "
    "will ignore any unknown fields that are silently dropped from the object, and will ignore "
    "all but the last duplicate field that the decoder encounters. - Warn: This will send a "
    "warning via the standard warning response header for each unknown field that is dropped "
    "from the object, and for each duplicate field that is encountered. - Strict: This will "
    "fail the request with a BadRequest error if any unknown fields would be dropped from the "
    "object, or if any duplicate fields are present.",
    "force": 'Force is going to "force" Apply requests. It means user will re-acquire conflicting fields owned '
    "by other people. Force flag must be unset for non-apply patch requests.",
    "pretty": "If 'true', then the output is pretty printed.",
}


# ---------------------------------------------------------------- naming
def group_camel(group: str) -> str:
    if not group:
        return "Core"
    return "".join(p[:1].upper() + p[1:] for p in re.split(r"[.\-]", group.removesuffix(".k8s.io")) if p)


def _tag(group: str, version: str) -> str:
    c = group_camel(group)
    return f"{c[:1].lower()}{c[1:]}_{version}"


def gv_path(group: str, version: str) -> str:
    return f"apis/{group}/{version}" if group else f"api/{version}"


def _schema_names(store: Store, rt: ResourceType, version: str) -> tuple[str | None, str | None]:
    if rt.builtin:
        return (
            schemas.builtin_name(rt.group, version, rt.kind),
            schemas.builtin_name(rt.group, version, f"{rt.kind}List"),
        )
    return (schemas.crd_name(rt.group, version, rt.kind), schemas.crd_name(rt.group, version, f"{rt.kind}List"))


# ---------------------------------------------------------------- operations (v2 form)
def _query(name: str) -> dict:
    return {
        "uniqueItems": True,
        "type": "boolean" if name == "force" else "string",
        "description": QUERY_DOCS[name],
        "name": name,
        "in": "query",
    }


def _ref(name: str | None) -> dict:
    return {"$ref": schemas.REF + name} if name else {"type": "object"}


def _operations(rt: ResourceType, version: str, obj_def: str | None, list_def: str | None) -> dict[str, dict]:
    """Path -> path item for one kind, as the real server lays them out."""
    gvk = {"group": rt.group, "kind": rt.kind, "version": version}
    base = "/" + gv_path(rt.group, version)
    camel = group_camel(rt.group) + version[:1].upper() + version[1:]
    ns = "Namespaced" if rt.namespaced else ""
    coll = f"{base}/namespaces/{{namespace}}/{rt.plural}" if rt.namespaced else f"{base}/{rt.plural}"
    tags = [_tag(rt.group, version)]
    consumes = PATCH_TYPES if rt.builtin else PATCH_TYPES[:3]
    write = [_query("dryRun"), _query("fieldManager"), _query("fieldValidation")]

    def op(
        action: str,
        verb: str,
        what: str,
        body: dict | None = None,
        resp: str | None = obj_def,
        params: list | None = None,
        codes: tuple = ("200",),
        kind_gvk: dict = gvk,
    ) -> dict:
        o: dict[str, Any] = {
            "tags": tags,
            "description": f"{verb} {what}",
            "operationId": f"{action}{camel}{ns if 'AllNamespaces' not in what else ''}{what.replace(' ', '')}",
            "consumes": ["*/*"],
            "produces": ["application/json", "application/yaml"],
            "schemes": ["https"],
            "parameters": list(params or []),
            "responses": {
                c: {
                    "description": "OK" if c == "200" else ("Created" if c == "201" else "Accepted"),
                    "schema": _ref(resp),
                }
                for c in codes
            },
            "x-kubernetes-action": verb,
            "x-kubernetes-group-version-kind": kind_gvk,
        }
        if body is not None:
            o["parameters"].insert(0, {"name": "body", "in": "body", "required": True, "schema": body})
        return o

    path_params = [
        {
            "uniqueItems": True,
            "type": "string",
            "description": f"name of the {rt.kind}",
            "name": "name",
            "in": "path",
            "required": True,
        }
    ]
    if rt.namespaced:
        path_params.append(
            {
                "uniqueItems": True,
                "type": "string",
                "description": "object name and auth scope, such as for teams and projects",
                "name": "namespace",
                "in": "path",
                "required": True,
            }
        )
    coll_params = path_params[1:]
    verbs = set(rt.verbs)
    out: dict[str, dict] = {}
    c: dict[str, Any] = {"parameters": [*coll_params, _query("pretty")]}
    if "list" in verbs:
        c["get"] = op("list", "list", rt.kind, resp=list_def)
    if "create" in verbs:
        c["post"] = op("create", "post", rt.kind, body=_ref(obj_def), params=write, codes=("200", "201", "202"))
    if "deletecollection" in verbs:
        c["delete"] = op(
            "deletecollection",
            "deletecollection",
            f"Collection{rt.kind}",
            body=_ref(META + "DeleteOptions"),
            resp=META + "Status",
            params=[_query("dryRun")],
        )
    out[coll] = c
    one: dict[str, Any] = {"parameters": [*path_params, _query("pretty")]}
    one["get"] = op("read", "get", rt.kind)
    one["put"] = op("replace", "put", rt.kind, body=_ref(obj_def), params=write, codes=("200", "201"))
    one["patch"] = op(
        "patch", "patch", rt.kind, body=_ref(META + "Patch"), params=[*write, _query("force")], codes=("200", "201")
    )
    one["patch"]["consumes"] = list(consumes)
    one["delete"] = op(
        "delete",
        "delete",
        rt.kind,
        body=_ref(META + "DeleteOptions"),
        resp=META + "Status",
        params=[_query("dryRun")],
        codes=("200", "202"),
    )
    out[f"{coll}/{{name}}"] = one
    if rt.status:
        st: dict[str, Any] = {"parameters": [*path_params, _query("pretty")]}
        st["get"] = op("read", "get", f"{rt.kind}Status")
        st["put"] = op("replace", "put", f"{rt.kind}Status", body=_ref(obj_def), params=write, codes=("200", "201"))
        st["patch"] = op(
            "patch",
            "patch",
            f"{rt.kind}Status",
            body=_ref(META + "Patch"),
            params=[*write, _query("force")],
            codes=("200", "201"),
        )
        st["patch"]["consumes"] = list(consumes)
        out[f"{coll}/{{name}}/status"] = st
    if rt.namespaced and "list" in verbs:
        out[f"{base}/{rt.plural}"] = {
            "parameters": [_query("pretty")],
            "get": op("list", "list", f"{rt.kind}ForAllNamespaces", resp=list_def),
        }
    if rt.key == ("", "pods"):
        out[f"{coll}/{{name}}/eviction"] = {
            "parameters": [*path_params, _query("pretty")],
            "post": op(
                "create",
                "post",
                "PodEviction",
                body=_ref("io.k8s.api.policy.v1.Eviction"),
                params=[_query("dryRun"), _query("fieldManager"), _query("fieldValidation")],
                codes=("200", "201", "202"),
                kind_gvk={"group": "policy", "kind": "Eviction", "version": "v1"},
            ),
        }
    return out


# ---------------------------------------------------------------- documents
def _kinds(store: Store, group: str | None = None, version: str | None = None):
    for rt in sorted(store.registry.types.values(), key=lambda r: (r.group, r.plural)):
        for v in rt.versions:
            if (group is None or rt.group == group) and (version is None or v == version):
                yield rt, v


def _paths_and_definitions(store: Store, kinds) -> tuple[dict, dict]:
    paths: dict[str, dict] = {}
    roots = [META + n for n in ("Patch", "DeleteOptions", "Status", "APIResourceList")]
    crd_defs: dict[str, dict] = {}
    for rt, v in kinds:
        obj_def, list_def = _schema_names(store, rt, v)
        if not rt.builtin:
            crd = schemas.crd_object(store, rt)
            if crd is not None:
                crd_defs.update(schemas.crd_definitions(crd, v))
        else:
            roots += [n for n in (obj_def, list_def) if n]
        if rt.key == ("", "pods"):
            roots.append("io.k8s.api.policy.v1.Eviction")
        paths.update(_operations(rt, v, obj_def, list_def))
    for d in crd_defs.values():
        schemas._collect_refs(d, roots)
    defs = schemas.definitions()
    out = {n: defs[n] for n in sorted(schemas.closure(roots))}
    out.update(crd_defs)
    return paths, out


def v2_document(store: Store, version_info: dict) -> dict:
    paths, defs = _paths_and_definitions(store, list(_kinds(store)))
    return {
        "swagger": "2.0",
        "info": {"title": "Kubernetes", "version": version_info["gitVersion"]},
        "paths": paths,
        "definitions": defs,
    }


def _to_v3(node: Any) -> Any:
    """v2 schema -> v3 schema: refs into components, a ref with siblings wrapped in allOf as the server does."""
    if isinstance(node, list):
        return [_to_v3(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: _to_v3(v) for k, v in node.items() if k != "$ref"}
    ref = node.get("$ref")
    if isinstance(ref, str):
        ref = V3_SCHEMAS + ref[len(schemas.REF) :] if ref.startswith(schemas.REF) else ref
        if out:
            out["allOf"] = [{"$ref": ref}]
        else:
            out["$ref"] = ref
    return out


def _v3_operation(op: dict) -> dict:
    o = {k: v for k, v in op.items() if k not in ("consumes", "produces", "parameters", "responses", "schemes")}
    params = []
    for p in op.get("parameters") or []:
        if p.get("in") == "body":
            o["requestBody"] = {
                "content": {
                    m: {"schema": _to_v3(p["schema"])}
                    for m in (op["consumes"] if op.get("consumes") != ["*/*"] else ["*/*"])
                },
                "required": True,
            }
            continue
        params.append(
            {
                "name": p["name"],
                "in": p["in"],
                "description": p.get("description", ""),
                **({"required": True} if p.get("required") else {}),
                "schema": {"type": p.get("type", "string"), "uniqueItems": True},
            }
        )
    if params:
        o["parameters"] = params
    o["responses"] = {
        c: {
            "description": r["description"],
            "content": {m: {"schema": _to_v3(r["schema"])} for m in op.get("produces") or []},
        }
        for c, r in (op.get("responses") or {}).items()
    }
    return o


def v3_document(store: Store, group: str, version: str, version_info: dict) -> dict | None:
    kinds = list(_kinds(store, group, version))
    if not kinds:
        return None
    if all(rt.builtin for rt, _ in kinds):  # shared and cached: callers only serialize it
        return _builtin_v3(store, group, version, version_info["gitVersion"])
    return _v3(store, kinds, version_info["gitVersion"])


_BUILTIN_V3: dict[tuple, dict] = {}


def _builtin_v3(store: Store, group: str, version: str, git_version: str) -> dict:
    """Built-in group versions never change while the process runs: build each once."""
    kinds = list(_kinds(store, group, version))
    key = (group, version, git_version, tuple(rt.key for rt, _ in kinds))
    if key not in _BUILTIN_V3:
        _BUILTIN_V3[key] = _v3(store, kinds, git_version)
    return _BUILTIN_V3[key]


def _v3(store: Store, kinds, git_version: str) -> dict:
    paths, defs = _paths_and_definitions(store, kinds)
    v3_paths = {}
    for p, item in paths.items():
        it: dict[str, Any] = {}
        for verb in ("get", "put", "post", "delete", "patch"):
            if verb in item:
                it[verb] = _v3_operation(item[verb])
        it["parameters"] = [
            {
                "name": q["name"],
                "in": q["in"],
                "description": q.get("description", ""),
                **({"required": True} if q.get("required") else {}),
                "schema": {"type": q.get("type", "string"), "uniqueItems": True},
            }
            for q in item.get("parameters") or []
        ]
        v3_paths[p] = it
    return {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": git_version},
        "paths": v3_paths,
        "components": {"schemas": {n: _to_v3(s) for n, s in defs.items()}},
    }


def _encode(doc: dict) -> tuple[bytes, str]:
    body = json.dumps(doc, separators=(",", ":"), sort_keys=False).encode()
    return body, hashlib.sha512(body).hexdigest().upper()


def _gvs(store: Store) -> list[tuple[str, str]]:
    return sorted({(rt.group, v) for rt, v in _kinds(store)})


def v3_index(store: Store, version_info: dict) -> dict:
    paths = {}
    for g, v in _gvs(store):
        doc = v3_document(store, g, v, version_info)
        assert doc is not None, f"{g}/{v} is listed from its kinds"
        _, h = _encode(doc)
        paths[gv_path(g, v)] = {"serverRelativeURL": f"/openapi/v3/{gv_path(g, v)}?hash={h}"}
    return {"paths": paths}


# ---------------------------------------------------------------- HTTP
def _accepts(accept: str, *types: str) -> bool:
    offered = [a.split(";")[0].strip().lower() for a in (accept or "*/*").split(",")]
    return any(t in offered for t in types)


def serve(store: Store, parts: list[str], query: Mapping[str, str], accept: str, version_info: dict):
    """(status, body bytes, content type, headers) for a GET under /openapi, or raises ApiError."""
    try:
        if parts == ["openapi", "v2"]:
            v2 = v2_document(store, version_info)
            if _accepts(accept, V2_PROTOBUF, V2_PROTOBUF_SENT):
                return 200, openapi_proto.document(v2), V2_PROTOBUF_SENT, {}
            if _accepts(accept, "application/json", "*/*", "application/*"):
                return 200, _encode(v2)[0], "application/json", {}
            raise ApiError(
                406, f"only the following media types are accepted: application/json, {V2_PROTOBUF}", "NotAcceptable"
            )
        if parts[:2] != ["openapi", "v3"]:
            raise ApiError(404, "the server could not find the requested resource", "NotFound")
        if not _accepts(accept, "application/json", "*/*", "application/*"):
            raise ApiError(406, "only the following media types are accepted: application/json", "NotAcceptable")
        if len(parts) == 2:
            return (
                200,
                json.dumps(v3_index(store, version_info)).encode(),
                "application/json",
                {"Cache-Control": "no-cache, private"},
            )
        rest = parts[2:]
        if rest[:1] == ["api"] and len(rest) == 2:
            group, version = "", rest[1]
        elif rest[:1] == ["apis"] and len(rest) == 3:
            group, version = rest[1], rest[2]
        else:
            raise ApiError(404, "the server could not find the requested resource", "NotFound")
        doc = v3_document(store, group, version, version_info)
        if doc is None:
            raise ApiError(404, "the server could not find the requested resource", "NotFound")
        body, h = _encode(doc)
        asked = query.get("hash")
        if asked and asked != h:  # a stale link: send the client to the current document
            return 301, b"", "application/json", {"Location": f"/openapi/v3/{gv_path(group, version)}?hash={h}"}
        headers = {"Etag": f'"{h}"'}
        headers["Cache-Control"] = "public, immutable" if asked else "no-cache, private"
        return 200, body, "application/json", headers
    except schemas.SchemasUnavailable as e:
        raise ApiError(503, str(e), "ServiceUnavailable") from None
