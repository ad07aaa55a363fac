"""HTTP layer: Kubernetes REST paths, discovery and verbs, behind the lab's fault front and audit log
(lab/faults.py); the /_lab admin API is lab/k8s/labadmin.py.

Longer than 600 lines because routing and the REST verbs (list, watch, create, update, patch, delete) share
the request helpers, the namespace and field checks and the write tail (`_finish_update`); what stands on its own
is elsewhere: server-side apply (apply.py), eviction (eviction.py), Table output (tables.py), defaulting
(defaults.py), the admin API (labadmin.py), the simulated controllers (controllers/)."""

from __future__ import annotations

import asyncio
import base64
import bisect
import contextlib
import json
import logging
import time
from typing import Any

from aiohttp import web

from lab.faults import FaultFront

from . import apply, eviction, fieldvalidation, labadmin, managedfields, openapi, schemas, tables
from .crds import admit
from .defaults import default_job, prepare_create
from .patch import PatchError, json_patch, merge_patch, strategic_merge_patch
from .podlogs import job_pod_log
from .resources import Info, ResourceType
from .selectors import SelectorError, node_name_selector, parse_field_selector, parse_label_selector
from .store import CRDS, JOBS, NAMESPACES, PODS, Store
from .util import (
    JSON_CT,
    REASONS,
    ApiError,
    clone,
    diff,
    err_resp,
    jresp,
    now_rfc3339,
    random_suffix,
    status_body,
    truthy,
)

log = logging.getLogger("lab.k8s")

VERSION_INFO = {
    "major": "1",
    "minor": "32",
    "gitVersion": "v1.32.4-lab",
    "gitCommit": "0000000000000000000000000000000000000000",
    "gitTreeState": "clean",
    "buildDate": "2025-04-22T00:00:00Z",
    "goVersion": "go1.23.6",
    "compiler": "gc",
    "platform": "linux/amd64",
}
KNOWN_PATCH_TYPES = (
    "application/json-patch+json",
    "application/merge-patch+json",
    "application/strategic-merge-patch+json",
    "application/apply-patch+yaml",
)

# An object's metadata.managedFields; named here because `list` inside Api is its LIST handler.
ManagedFields = list[dict]


class Api:
    def __init__(self, store: Store, users: dict[str, str] | None = None):
        self.store = store
        # bearer token -> user name, as kube-apiserver's --token-auth-file: each request's audit entry names its
        # caller, and a token not in it is refused (401). None: every caller is served and none is named.
        self.users = users
        self.app = web.Application(client_max_size=64 * 1024 * 1024)
        self.app.router.add_route("*", "/{tail:.*}", self.dispatch)
        self.app.on_shutdown.append(self._on_shutdown)
        self.app.on_response_prepare.append(self._add_warnings)
        self.front = FaultFront(self._record, serve_2xx=True)  # lab/faults.py: a 2xx fault is served first

    async def _add_warnings(self, request: web.Request, response: web.StreamResponse) -> None:
        for w in request.get("warnings") or []:  # fieldValidation=Warn (lab/k8s/fieldvalidation.py)
            response.headers.add("Warning", "299 - " + json.dumps(w))

    async def _on_shutdown(self, app: web.Application) -> None:
        for w in list(self.store.watchers):
            self.store.close_watcher(w)

    # ================================================================== routing
    def classify(self, request: web.Request) -> Info:
        info = Info()
        parts = [p for p in request.path.split("/") if p]
        method = request.method
        if (
            not parts
            or parts[0] in ("version", "openapi", "healthz", "livez", "readyz")
            or (parts[0] in ("api", "apis") and len(parts) <= (2 if parts[0] == "api" else 3))
        ):
            info.kind = "discovery"
            info.verb = "get"
            return info
        if parts[0] == "api":
            group, version, rest = "", parts[1], parts[2:]
        elif parts[0] == "apis":
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            return info
        info.kind = "resource"
        info.group, info.version = group, version
        reg = self.store.registry
        # The API server's RequestInfoFactory: `namespaces/<ns>/<resource>` addresses a namespaced resource, served
        # or not (an unserved one is still a request for that resource, as an audit log or RBAC sees it), except the
        # Namespace's own subresources.
        if len(rest) >= 3 and rest[0] == "namespaces" and rest[2] not in ("status", "finalize"):
            info.namespace = rest[1]
            rest = rest[2:]
        info.resource = rest[0] if rest else ""
        info.name = rest[1] if len(rest) > 1 else ""
        info.subresource = "/".join(rest[2:]) if len(rest) > 2 else ""
        info.rt = reg.get(group, version, info.resource)
        q = request.query
        if method == "GET":
            info.verb = "get" if info.name else ("watch" if truthy(q.get("watch")) else "list")
        elif method == "POST":
            info.verb = "create"
        elif method == "PUT":
            info.verb = "update"
        elif method == "PATCH":
            info.verb = "patch"
        elif method == "DELETE":
            info.verb = "delete" if info.name else "deletecollection"
        else:
            info.verb = method.lower()
        return info

    # ================================================================== entry point
    async def dispatch(self, request: web.Request) -> web.StreamResponse:
        if request.path.startswith("/_lab/") or request.path == "/_lab":
            return await labadmin.handle(self.store, request)
        info = self.classify(request)
        entry: dict[str, Any] = {
            "time": time.time(),
            **info.as_dict(),
            "userAgent": request.headers.get("User-Agent", ""),
            "write": info.verb in ("create", "update", "patch", "delete", "deletecollection"),
            "path": request.path_qs[:300],
        }
        if info.kind == "discovery":
            entry["resource"] = ""
        serve = lambda: self.serve(request, info)
        if self.users is not None:
            token = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
            entry["user"] = self.users.get(token, "system:anonymous")
            if token not in self.users:
                serve = self.unauthorized
        request["audit"] = entry
        fault = self.store.faults.match(info.as_dict()) if info.kind == "resource" else None
        return await self.front.handle(
            request, entry, fault, serve, lambda f: err_resp(self.injected(info, f["action"]))
        )

    @staticmethod
    async def unauthorized() -> web.Response:
        return err_resp(ApiError(401, "Unauthorized"))

    def _record(self, entry: dict) -> None:
        if entry["write"]:
            entry.setdefault("changes", [])
        self.store.audit_add(entry)

    @staticmethod
    def injected(info: Info, action: dict) -> ApiError:
        """A status fault's answer: a Status naming the addressed object, or the fault's own `details`."""
        code = int(action["status"])
        details: dict[str, Any] = {"name": info.name, "kind": info.resource}
        if info.group:
            details["group"] = info.group
        if "details" in action:  # a Status the defaults cannot say: causes, or a path-level 404's none
            details = dict(action["details"] or {})
        headers = {}
        ra = action.get("retryAfterSeconds")
        if ra is not None:
            details["retryAfterSeconds"] = int(ra)
            headers["Retry-After"] = str(int(ra))
        msg = action.get("message") or f"injected fault: {REASONS.get(code, code)}"
        return ApiError(code, msg, action.get("reason"), details, headers)

    async def serve(self, request: web.Request, info: Info) -> web.StreamResponse:
        try:
            if info.kind == "discovery":
                return self.discovery(request)
            if info.kind == "resource":
                return await self.resource(request, info)
            raise ApiError(404, "the server could not find the requested resource", "NotFound")
        except ApiError as e:
            return err_resp(e)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            return err_resp(ApiError(400, f"error decoding request body: {e}", "BadRequest"))
        except (ConnectionResetError, asyncio.CancelledError):
            raise
        except Exception as e:  # an emulator bug: still answer with a Status
            log.exception("internal error handling %s %s", request.method, request.path_qs)
            return err_resp(ApiError(500, f"Internal error occurred: {type(e).__name__}: {e}", "InternalError"))

    # ================================================================== discovery
    def discovery(self, request: web.Request) -> web.Response:
        parts = [p for p in request.path.split("/") if p]
        reg = self.store.registry
        if parts == ["version"]:
            return jresp(VERSION_INFO)
        if parts and parts[0] in ("healthz", "livez", "readyz"):
            return web.Response(text="ok")
        if parts[:1] == ["openapi"]:  # lab/k8s/openapi.py
            code, body, ct, headers = openapi.serve(
                self.store, parts, request.query, request.headers.get("Accept", ""), VERSION_INFO
            )
            return web.Response(body=body, status=code, content_type=ct, headers=headers)
        if parts == ["api"]:
            host = request.host or "127.0.0.1"
            return jresp(
                {
                    "kind": "APIVersions",
                    "versions": ["v1"],
                    "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": host}],
                }
            )
        if parts == ["api", "v1"]:
            return jresp(reg.resource_list("", "v1"))
        if parts == ["apis"]:
            return jresp(reg.api_group_list())
        if len(parts) == 2 and parts[0] == "apis":
            g = reg.api_group(parts[1])
            if g:
                return jresp(g)
        if len(parts) == 3 and parts[0] == "apis":
            rl = reg.resource_list(parts[1], parts[2])
            if rl:
                return jresp(rl)
        raise ApiError(404, "the server could not find the requested resource", "NotFound")

    # ================================================================== resources
    async def body_json(self, request: web.Request) -> Any:
        raw = await request.read()
        if not raw:
            return None
        return json.loads(raw)

    def out(self, rt: ResourceType, obj: dict, version: str | None = None, shallow: bool = False) -> dict:
        """The object as served (lab/k8s/resources.py `ResourceType.served`)."""
        return rt.served(obj, version, shallow)

    async def resource(self, request: web.Request, info: Info) -> web.StreamResponse:  # noqa: C901 (one branch per verb and subresource on a path, as kube-apiserver routes them)
        rt = info.rt
        if rt is None:
            raise ApiError(404, "the server could not find the requested resource", "NotFound")
        sub = info.subresource
        if sub and not (sub == "status" and rt.status) and not (sub in ("eviction", "log") and rt.key == PODS):
            raise ApiError(404, "the server could not find the requested resource", "NotFound")
        if rt.namespaced and info.name and not info.namespace and info.verb not in ("list", "watch"):
            raise ApiError(404, "the server could not find the requested resource", "NotFound")
        if info.namespace and not rt.namespaced:  # a cluster-scoped resource under a namespace's path
            raise ApiError(404, "the server could not find the requested resource", "NotFound")
        verb = info.verb
        if sub == "eviction":
            if verb != "create":
                raise ApiError(
                    405, "the server does not allow this method on the requested resource", "MethodNotAllowed"
                )
            return await eviction.evict(self, request, info, rt)  # lab/k8s/eviction.py
        if sub == "log":  # what a Job's container printed (lab/k8s/podlogs.py); never followed
            async with self.store.lock:
                pod = self.store.get(rt, info.namespace, info.name)
                if pod is None:
                    raise self.store.not_found(rt, info.name)
                text = job_pod_log(self.store.side.get(pod["metadata"].get("uid", ""), {}))
            return web.Response(text=text, content_type="text/plain")
        if verb == "list":
            return await self.list(request, info, rt)
        if verb == "watch":
            return await self.watch(request, info, rt)
        if verb == "get":
            async with self.store.lock:
                obj = self.store.get(rt, info.namespace, info.name)
                if obj is None:
                    raise self.store.not_found(rt, info.name)
                as_table = tables.wanted_version(request.headers.get("Accept"))  # lab/k8s/tables.py
                if as_table:
                    return jresp(
                        tables.table(
                            self.store,
                            rt,
                            info.version,
                            [self.out(rt, obj, info.version)],
                            {"resourceVersion": obj["metadata"]["resourceVersion"]},
                            request.query,
                            as_table,
                        )
                    )
                return jresp(self.out(rt, obj, info.version, shallow=True))
        if verb == "create":
            if info.name:
                raise ApiError(
                    405, "the server does not allow this method on the requested resource", "MethodNotAllowed"
                )
            return await self.create(request, info, rt)
        if verb == "update":
            return await self.replace(request, info, rt)
        if verb == "patch":
            return await self.patch(request, info, rt)
        if verb == "delete":
            return await self.delete(request, info, rt)
        if verb == "deletecollection":
            return await self.delete_collection(request, info, rt)
        raise ApiError(405, "the server does not allow this method on the requested resource", "MethodNotAllowed")

    # ------------------------------------------------------------------ list / watch
    def _selectors(self, request: web.Request, rt: ResourceType):
        q = request.query
        try:
            return (parse_label_selector(q.get("labelSelector")), parse_field_selector(q.get("fieldSelector"), rt.key))
        except SelectorError as e:
            raise ApiError(400, str(e), "BadRequest") from None

    async def list(self, request: web.Request, info: Info, rt: ResourceType) -> web.Response:
        label, field = self._selectors(request, rt)
        q = request.query
        limit = int(q.get("limit") or 0)
        start_after: tuple | None = None
        if q.get("continue"):
            try:
                tok = json.loads(base64.urlsafe_b64decode(q["continue"].encode()).decode())
                start_after = tuple(tok["start"])
                tok_rv = int(tok["rv"])
            except Exception:
                raise ApiError(400, "continue key is not valid: invalid continue token", "BadRequest") from None
            if tok_rv < self.store.history_floor:
                raise ApiError(
                    410,
                    "The provided continue parameter is too old to display a consistent list "
                    "result. You can start a new list without the continue parameter, or use the "
                    "continue token in this response to retrieve the remainder of the results.",
                    "Expired",
                )
        node_name = node_name_selector(q.get("fieldSelector")) if rt.key == PODS else None
        has_selectors = bool((q.get("labelSelector") or "").strip() or (q.get("fieldSelector") or "").strip())
        async with self.store.lock:
            ns = info.namespace if rt.namespaced and info.namespace else None
            objs = self.store.objects.get(rt.key, {})
            if node_name is not None:  # the pods-by-node index: O(pods on the node)
                keys = sorted(k for k in self.store.pods_by_node.get(node_name, ()) if ns is None or k[0] == ns)
                lo, hi = 0, len(keys)
            else:
                keys, lo, hi = self.store.key_range(rt.key, ns)
            if start_after is not None:
                lo = max(lo, bisect.bisect_right(keys, start_after, lo, hi))
            matched = []
            last = lo
            for i in range(lo, hi):
                o = objs[keys[i]]
                if label(o["metadata"].get("labels") or {}) and field(o):
                    matched.append((keys[i], o))
                    last = i
                    if limit > 0 and len(matched) > limit:
                        break
            cont = None
            meta: dict[str, Any] = {"resourceVersion": str(self.store.rv)}
            if limit > 0 and len(matched) > limit:
                matched = matched[:limit]
                cont = base64.urlsafe_b64encode(
                    json.dumps({"rv": self.store.rv, "start": list(matched[-1][0])}).encode()
                ).decode()
                meta["continue"] = cont
                if not has_selectors:  # as the real server: only without selectors
                    meta["remainingItemCount"] = hi - last
            items = [self.out(rt, o, info.version, shallow=True) for _, o in matched]
            as_table = tables.wanted_version(request.headers.get("Accept"))  # lab/k8s/tables.py
            if as_table:
                return jresp(tables.table(self.store, rt, info.version, items, meta, q, as_table))
        api_version = f"{rt.group}/{info.version}" if rt.group else info.version
        return jresp({"kind": f"{rt.kind}List", "apiVersion": api_version, "metadata": meta, "items": items})

    async def watch(self, request: web.Request, info: Info, rt: ResourceType) -> web.StreamResponse:  # noqa: C901 (each watch parameter (resourceVersion, bookmarks, timeout, selectors) shapes the stream)
        from .store import Watcher

        label, field = self._selectors(request, rt)
        q = request.query
        timeout = float(q.get("timeoutSeconds") or 1800)
        timeout = max(0.0, min(timeout, 3600.0))
        bookmarks = truthy(q.get("allowWatchBookmarks"))
        rv_param = q.get("resourceVersion")
        w = Watcher(rt.key, info.namespace if rt.namespaced and info.namespace else None, label, field)
        initial: list[tuple[str, dict]] = []
        expired: dict | None = None
        async with self.store.lock:
            if rv_param in (None, "", "0"):
                for o in self.store.all(rt.key, w.namespace):
                    if w.matches(o):
                        initial.append(("ADDED", o))
            else:
                try:
                    n = int(rv_param)
                except ValueError:
                    raise ApiError(400, f"invalid resource version: {rv_param}", "BadRequest") from None
                if n < self.store.history_floor:
                    expired = status_body(
                        410, f"too old resource version: {n} ({self.store.history_floor + 1})", "Expired"
                    )
                else:
                    for ev in self.store.history:
                        if ev[0] > n and ev[1] == rt.key:
                            t = self.store.translate(w, ev)
                            if t:
                                initial.append(t)
            initial = [(t, self.out(rt, o, info.version)) for t, o in initial]
            if expired is None:
                self.store.watchers.add(w)
            current_rv = self.store.rv
        entry = request["audit"]
        entry["code"] = 200
        self.store.audit_add(entry)
        resp = web.StreamResponse(status=200, headers={"Content-Type": JSON_CT, "Cache-Control": "no-cache"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)

        as_table = tables.wanted_version(request.headers.get("Accept"))  # kubectl get -w (lab/k8s/tables.py)
        headers_sent: list[bool] = []

        async def send(etype: str, obj: dict) -> None:
            if as_table and etype in ("ADDED", "MODIFIED", "DELETED"):
                obj = tables.table(
                    self.store,
                    rt,
                    info.version,
                    [obj],
                    {"resourceVersion": obj["metadata"].get("resourceVersion", "")},
                    {**q, **({"noHeaders": "true"} if headers_sent else {})},
                    as_table,
                )
                headers_sent.append(True)
            await resp.write(json.dumps({"type": etype, "object": obj}, separators=(",", ":")).encode() + b"\n")

        api_version = f"{rt.group}/{info.version}" if rt.group else info.version
        try:
            if expired is not None:
                await send("ERROR", expired)
                return resp
            for etype, obj in initial:
                await send(etype, obj)
            deadline = time.monotonic() + timeout
            bm_every = float(self.store.config.get("bookmarkSeconds") or 5.0)
            if bookmarks and initial:
                await send(
                    "BOOKMARK",
                    {"kind": rt.kind, "apiVersion": api_version, "metadata": {"resourceVersion": str(current_rv)}},
                )
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                try:
                    item = await asyncio.wait_for(w.queue.get(), min(left, bm_every if bookmarks else left))
                except TimeoutError:
                    if bookmarks and time.monotonic() < deadline:
                        await send(
                            "BOOKMARK",
                            {
                                "kind": rt.kind,
                                "apiVersion": api_version,
                                "metadata": {"resourceVersion": str(self.store.rv)},
                            },
                        )
                    continue
                if item is None:
                    break
                etype, obj = item
                await send(etype, self.out(rt, obj, info.version, shallow=True))
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            self.store.watchers.discard(w)
            w.closed = True
        with contextlib.suppress(Exception):
            await resp.write_eof()
        return resp

    # ------------------------------------------------------------------ create
    def _check_namespace(self, rt: ResourceType, ns: str, name: str) -> None:
        if not rt.namespaced:
            return
        nsobj = self.store.get(self.store.registry.types[NAMESPACES], None, ns)
        if nsobj is None:
            raise ApiError(404, f'namespaces "{ns}" not found', "NotFound", {"name": ns, "kind": "namespaces"})
        if nsobj["metadata"].get("deletionTimestamp"):
            raise ApiError(
                403,
                f'{rt.group_resource} "{name}" is forbidden: unable to create new content in '
                f"namespace {ns} because it is being terminated",
                "Forbidden",
                {
                    "name": name,
                    "kind": rt.plural,
                    **({"group": rt.group} if rt.group else {}),
                    "causes": [
                        {
                            "reason": "NamespaceTerminating",
                            "message": f"namespace {ns} is being terminated",
                            "field": "metadata.namespace",
                        }
                    ],
                },
            )

    def _invalid(self, rt: ResourceType, name: str, field: str, msg: str, value: Any = None) -> ApiError:
        full = f"{field}: {msg}" if value is None else f"{field}: Invalid value: {json.dumps(value)}: {msg}"
        details = {
            "name": name,
            "kind": rt.kind,
            "causes": [{"reason": "FieldValueInvalid", "message": msg, "field": field}],
        }
        if rt.group:
            details["group"] = rt.group
        return ApiError(422, f'{rt.kind} "{name}" is invalid: {full}', "Invalid", details)

    def _validate(self, rt: ResourceType, obj: dict) -> None:
        import re

        md = obj.get("metadata") or {}
        name = md.get("name", "")
        if not re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", name or "") or len(name) > 253:
            raise self._invalid(
                rt,
                name,
                "metadata.name",
                "a lowercase RFC 1123 subdomain must consist of "
                "lower case alphanumeric characters, '-' or '.', and must start and end with an "
                "alphanumeric character",
                name,
            )
        for v in (md.get("labels") or {}).values():
            if not isinstance(v, str) or len(v) > 63:
                raise self._invalid(rt, name, "metadata.labels", "must be no more than 63 characters", v)
        if rt.key == PODS and not ((obj.get("spec") or {}).get("containers")):
            raise self._invalid(rt, name, "spec.containers", "Required value")
        if rt.key == JOBS:
            tspec = ((obj.get("spec") or {}).get("template") or {}).get("spec") or {}
            if not tspec.get("containers"):
                raise self._invalid(rt, name, "spec.template.spec.containers", "Required value")
            if tspec.get("restartPolicy") not in ("Never", "OnFailure"):
                raise self._invalid(
                    rt,
                    name,
                    "spec.template.spec.restartPolicy",
                    'Unsupported value: supported values: "OnFailure", "Never"',
                    tspec.get("restartPolicy", ""),
                )
        if rt.key == CRDS:
            spec = obj.get("spec") or {}
            names = spec.get("names") or {}
            if not (spec.get("group") and names.get("plural") and names.get("kind") and spec.get("versions")):
                raise self._invalid(rt, name, "spec", "Required value: group, names.plural, names.kind, versions")
            if name != f"{names['plural']}.{spec['group']}":
                raise self._invalid(rt, name, "metadata.name", 'must be spec.names.plural+"."+spec.group', name)

    def _query_dry_run(self, request: web.Request) -> bool:
        return "All" in request.query.getall("dryRun", [])

    async def create(self, request: web.Request, info: Info, rt: ResourceType) -> web.Response:
        body = await self.body_json(request)
        if not isinstance(body, dict):
            raise ApiError(400, "the object provided is unrecognized (must be of type map)", "BadRequest")
        md = body.setdefault("metadata", {})
        if rt.namespaced:
            if md.get("namespace") and md["namespace"] != info.namespace:
                raise ApiError(
                    400,
                    "the namespace of the provided object does not match the namespace sent on the request",
                    "BadRequest",
                )
            md["namespace"] = info.namespace
        else:
            md.pop("namespace", None)
        self._check_fields(request, rt, info, body)
        async with self.store.lock:
            return self.create_locked(request, info, rt, body)

    def _check_fields(self, request: web.Request, rt: ResourceType, info: Info, body: Any) -> None:
        fieldvalidation.check(
            body,
            schemas.resource_schema(self.store, rt, info.version),
            request.query,
            rt.kind,
            info.version,
            request.setdefault("warnings", []),
        )

    def _record_update(self, request: web.Request, rt: ResourceType, info: Info, old: dict | None, new: dict) -> None:
        """Who changed which fields (lab/k8s/managedfields.py)."""
        manager = managedfields.default_manager(request.query.get("fieldManager"), request.headers.get("User-Agent"))
        managedfields.record_update(
            old,
            new,
            schemas.resource_schema(self.store, rt, info.version),
            manager,
            f"{rt.group}/{info.version}" if rt.group else info.version,
            info.subresource,
        )

    def create_locked(
        self, request: web.Request, info: Info, rt: ResourceType, body: dict, managed: ManagedFields | None = None
    ) -> web.Response:
        """Create `body` (lock held); `managed`: its managedFields when a server-side apply creates it."""
        md = body["metadata"]
        dry = self._query_dry_run(request)
        if not md.get("name") and md.get("generateName"):
            for _ in range(8):
                cand = md["generateName"] + random_suffix()
                if self.store.get(rt, info.namespace, cand) is None:
                    md["name"] = cand
                    break
        if not md.get("name"):
            raise self._invalid(rt, "", "metadata.name", "Required value: name or generateName is required")
        name = md["name"]
        self._check_namespace(rt, info.namespace, name)
        self._validate(rt, body)
        admit(self.store, rt, "create", body)  # simulated validating webhooks (lab/k8s/crds.py)
        if self.store.get(rt, info.namespace, name) is not None:
            details = {"name": name, "kind": rt.plural}
            if rt.group:
                details["group"] = rt.group
            raise ApiError(409, f'{rt.group_resource} "{name}" already exists', "AlreadyExists", details)
        prepare_create(rt, body)
        obj = self.store.new_meta(rt, body)
        if rt.key == JOBS:
            default_job(obj)
        if managed is None:
            self._record_update(request, rt, info, None, obj)
        else:
            obj["metadata"]["managedFields"] = managed
        if rt.key == CRDS:
            existing = self.store.registry.types.get((obj["spec"]["group"], obj["spec"]["names"]["plural"]))
            if existing is not None and existing.builtin:
                raise self._invalid(rt, name, "spec.group", "conflicts with a built-in resource")
        if dry:
            obj["metadata"].pop("resourceVersion", None)
            return jresp(self.out(rt, obj, info.version, shallow=True), 201)
        if rt.key == CRDS:
            self.store.registry.register_crd(obj)
        self.store.put(rt, obj)
        request["audit"]["changes"] = diff(None, obj)
        request["audit"]["resourceVersion"] = obj["metadata"]["resourceVersion"]
        if not info.name:
            request["audit"]["name"] = name
        return jresp(self.out(rt, obj, info.version, shallow=True), 201)

    # ------------------------------------------------------------------ update / patch
    def _spec_changed(self, rt: ResourceType, old: dict, new: dict) -> bool:
        skip = {"metadata", "status", "apiVersion", "kind"} if rt.status else {"metadata", "apiVersion", "kind"}
        a = {k: v for k, v in old.items() if k not in skip}
        b = {k: v for k, v in new.items() if k not in skip}
        return a != b

    def _finish_update(  # noqa: C901 (one branch per update precondition the API server checks, in its order)
        self,
        request: web.Request,
        info: Info,
        rt: ResourceType,
        old: dict,
        new: dict,
        sub: str,
        managed: ManagedFields | None = None,
    ) -> web.Response:
        """Common tail of PUT and PATCH: immutables, status split, generation, write, finalizer removal.
        `managed`: the managedFields a server-side apply computed (lab/k8s/apply.py)."""
        omd, nmd = old["metadata"], new.setdefault("metadata", {})
        if sub == "status":
            merged = clone(old)
            if "status" in new:
                merged["status"] = new["status"]
            else:
                merged.pop("status", None)
            new = merged
            nmd = new["metadata"]
        else:
            for k in (
                "uid",
                "creationTimestamp",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "name",
                "namespace",
                "generation",
            ):
                if k in omd:
                    nmd[k] = omd[k]
                else:
                    nmd.pop(k, None)
            if rt.status:
                if "status" in old:
                    new["status"] = clone(old["status"])
                else:
                    new.pop("status", None)
            if rt.key == NAMESPACES:
                nmd.setdefault("labels", {})["kubernetes.io/metadata.name"] = omd["name"]
        new["apiVersion"], new["kind"] = rt.api_version, rt.kind
        nmd["resourceVersion"] = omd["resourceVersion"]
        if rt.generation and self._spec_changed(rt, old, new):
            nmd["generation"] = int(omd.get("generation", 1)) + 1
        if new == old:
            return jresp(self.out(rt, old, info.version, shallow=True))
        if rt.key == PODS and sub != "status":
            self._check_pod_update(rt, old, new)
        if sub != "status":
            admit(self.store, rt, "update", new)  # simulated validating webhooks (lab/k8s/crds.py)
        if managed is None:
            self._record_update(request, rt, info, old, new)
        else:
            nmd["managedFields"] = managed
        if self._query_dry_run(request):
            return jresp(self.out(rt, new, info.version, shallow=True))
        if nmd.get("deletionTimestamp") and not nmd.get("finalizers") and self._removable(rt, new):
            final = self.store.remove(rt, new)
            request["audit"]["changes"] = diff(old, None)
            return jresp(self.out(rt, final, info.version, shallow=True))
        self.store.put(rt, new)
        if rt.key == CRDS:
            self.store.registry.register_crd(new)
        request["audit"]["changes"] = diff(old, new)
        request["audit"]["resourceVersion"] = nmd["resourceVersion"]
        return jresp(self.out(rt, new, info.version, shallow=True))

    def _check_pod_update(self, rt: ResourceType, old: dict, new: dict) -> None:
        os_, ns_ = old.get("spec") or {}, new.get("spec") or {}
        if os_.get("nodeName") and os_.get("nodeName") != ns_.get("nodeName"):
            raise self._invalid(
                rt,
                old["metadata"]["name"],
                "spec",
                "Forbidden: pod updates may not change "
                "fields other than `spec.containers[*].image`, `spec.initContainers[*].image`, "
                "`spec.activeDeadlineSeconds`, `spec.tolerations` (only additions to existing "
                "tolerations), `spec.terminationGracePeriodSeconds` (allow it to be set to 1 if "
                "it was previously negative)",
            )

    def _removable(self, rt: ResourceType, obj: dict) -> bool:
        if rt.key != PODS:
            return True
        side = self.store.side.get(obj["metadata"].get("uid", ""), {})
        due = side.get("delete_at")
        return due is None or time.monotonic() >= due

    async def replace(self, request: web.Request, info: Info, rt: ResourceType) -> web.Response:
        body = await self.body_json(request)
        if not isinstance(body, dict):
            raise ApiError(400, "the object provided is unrecognized (must be of type map)", "BadRequest")
        md = body.setdefault("metadata", {})
        if md.get("name") and md["name"] != info.name:
            raise ApiError(
                400,
                f"the name of the object ({md['name']}) does not match the name on the URL ({info.name})",
                "BadRequest",
            )
        if rt.namespaced and md.get("namespace") and md["namespace"] != info.namespace:
            raise ApiError(
                400,
                "the namespace of the provided object does not match the namespace sent on the request",
                "BadRequest",
            )
        self._check_fields(request, rt, info, body)
        async with self.store.lock:
            old = self.store.get(rt, info.namespace, info.name)
            if old is None:
                raise self.store.not_found(rt, info.name)
            rv = md.get("resourceVersion")
            if rv:
                if rv != old["metadata"]["resourceVersion"]:
                    raise self.store.conflict(rt, info.name)
            elif not rt.builtin:
                raise self._invalid(rt, info.name, "metadata.resourceVersion", "must be specified for an update", 0)
            return self._finish_update(request, info, rt, old, body, info.subresource)

    async def patch(self, request: web.Request, info: Info, rt: ResourceType) -> web.Response:
        ct = (request.headers.get("Content-Type") or "").split(";")[0].strip().lower()
        accepted = (
            "application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml"
            if not rt.builtin
            else "application/json-patch+json, application/merge-patch+json, "
            "application/apply-patch+yaml, application/strategic-merge-patch+json"
        )
        if ct == "application/apply-patch+yaml":
            return await apply.handle(self, request, info, rt)  # server-side apply (lab/k8s/apply.py)
        if ct not in KNOWN_PATCH_TYPES or (ct == "application/strategic-merge-patch+json" and not rt.builtin):
            raise ApiError(
                415,
                f"the body of the request was in an unknown format - accepted media types include: {accepted}",
                "UnsupportedMediaType",
            )
        body = await self.body_json(request)
        if ct != "application/json-patch+json":
            self._check_fields(request, rt, info, body)
        async with self.store.lock:
            old = self.store.get(rt, info.namespace, info.name)
            if old is None:
                raise self.store.not_found(rt, info.name)
            cur = self.out(rt, old, rt.version)
            try:
                if ct == "application/json-patch+json":
                    new = json_patch(cur, body)
                elif ct == "application/merge-patch+json":
                    if not isinstance(body, dict):
                        raise PatchError(400, "patch body must be a JSON object")
                    new = merge_patch(cur, body)
                else:
                    if not isinstance(body, dict):
                        raise PatchError(400, "patch body must be a JSON object")
                    new = strategic_merge_patch(cur, body, rt.kind)
            except PatchError as e:
                raise ApiError(e.code, e.message, "Invalid" if e.code == 422 else "BadRequest") from None
            if not isinstance(new, dict):
                raise ApiError(400, "patched object is not a JSON object", "BadRequest")
            nmd = new.setdefault("metadata", {})
            if not isinstance(nmd, dict):
                raise ApiError(400, "metadata must be an object", "BadRequest")
            prv = nmd.get("resourceVersion")
            if prv is not None and prv != old["metadata"]["resourceVersion"]:
                raise self.store.conflict(rt, info.name)
            if nmd.get("uid") is not None and nmd.get("uid") != old["metadata"].get("uid"):
                raise self.store.conflict(
                    rt,
                    info.name,
                    f"Precondition failed: UID in precondition: "
                    f"{nmd.get('uid')}, UID in object meta: {old['metadata'].get('uid')}",
                )
            return self._finish_update(request, info, rt, old, new, info.subresource)

    # ------------------------------------------------------------------ delete
    async def _delete_options(self, request: web.Request) -> dict:
        opts: dict[str, Any] = {}
        raw = await request.read()
        if raw:
            try:
                b = json.loads(raw)
                if isinstance(b, dict):
                    opts = b
            except json.JSONDecodeError:
                raise ApiError(400, "invalid DeleteOptions body", "BadRequest") from None
        q = request.query
        if "gracePeriodSeconds" in q:
            opts["gracePeriodSeconds"] = int(q["gracePeriodSeconds"])
        if "propagationPolicy" in q:
            opts["propagationPolicy"] = q["propagationPolicy"]
        if q.getall("dryRun", []):
            opts["dryRun"] = q.getall("dryRun")
        return opts

    def check_preconditions(self, rt: ResourceType, obj: dict, opts: dict) -> None:
        pre = opts.get("preconditions") or {}
        md = obj["metadata"]
        if pre.get("uid") and pre["uid"] != md.get("uid"):
            raise self.store.conflict(
                rt,
                md["name"],
                f"Precondition failed: UID in precondition: {pre['uid']}, UID in object meta: {md.get('uid')}",
            )
        if pre.get("resourceVersion") and pre["resourceVersion"] != md.get("resourceVersion"):
            raise self.store.conflict(
                rt,
                md["name"],
                f"Precondition failed: ResourceVersion in precondition: "
                f"{pre['resourceVersion']}, ResourceVersion in object meta: "
                f"{md.get('resourceVersion')}",
            )

    def delete_object(self, rt: ResourceType, obj: dict, opts: dict, actor: str | None = None) -> dict:
        """Delete semantics shared by DELETE, eviction and the controllers. Lock held. Returns the result."""
        store = self.store
        md = obj["metadata"]
        policy = opts.get("propagationPolicy")
        if policy is None and rt.key == JOBS:
            policy = "Orphan"  # batch/v1 Jobs default to orphaning their pods (kubectl asks for Background)
        if policy != "Orphan":
            store.gc_owners.add(md.get("uid", ""))
        elif rt.key == JOBS:
            self._orphan_dependents(obj)
        if rt.key == NAMESPACES:
            if md.get("deletionTimestamp"):
                return obj
            new = clone(obj)
            new["metadata"]["deletionTimestamp"] = now_rfc3339()
            new.setdefault("status", {})["phase"] = "Terminating"
            return store.put(rt, new, actor=actor, verb="delete")
        if rt.key == PODS:
            grace = opts.get("gracePeriodSeconds")
            spec = obj.get("spec") or {}
            if grace is None:
                grace = spec.get("terminationGracePeriodSeconds", 30)
            phase = (obj.get("status") or {}).get("phase")
            if not spec.get("nodeName") or phase in ("Succeeded", "Failed"):
                grace = 0
            grace = max(0, int(grace))
            side = store.side.setdefault(md.get("uid", ""), {})
            due = time.monotonic() + grace * float(store.config.get("graceScale", 1.0))
            if md.get("deletionTimestamp"):
                cur_due = side.get("delete_at")
                if cur_due is not None and due >= cur_due and grace != 0:
                    return obj
            if grace == 0 and not md.get("finalizers"):
                side["delete_at"] = time.monotonic()
                return store.remove(rt, obj, actor=actor)
            side["delete_at"] = due
            new = clone(obj)
            new["metadata"]["deletionTimestamp"] = md.get("deletionTimestamp") or now_rfc3339(grace)
            new["metadata"]["deletionGracePeriodSeconds"] = grace
            if md.get("deletionTimestamp") and grace < (md.get("deletionGracePeriodSeconds") or 0):
                new["metadata"]["deletionTimestamp"] = now_rfc3339(grace)
            return store.put(rt, new, actor=actor, verb="delete")
        if md.get("finalizers"):
            if md.get("deletionTimestamp"):
                return obj
            new = clone(obj)
            new["metadata"]["deletionTimestamp"] = now_rfc3339()
            new["metadata"]["deletionGracePeriodSeconds"] = 0
            return store.put(rt, new, actor=actor, verb="delete")
        return store.remove(rt, obj, actor=actor)

    def _orphan_dependents(self, owner: dict) -> None:
        """What the orphan finalizer does: drop the owner's ownerReferences from its dependents."""
        store = self.store
        uid = owner["metadata"].get("uid")
        for ok in sorted(store.dependents.get(uid, ())):
            o, rt = store.lookup(ok), store.registry.types.get(ok[0])
            if o is None or rt is None:
                continue
            new = clone(o)
            refs = [r for r in new["metadata"].get("ownerReferences") or [] if r.get("uid") != uid]
            if refs:
                new["metadata"]["ownerReferences"] = refs
            else:
                new["metadata"].pop("ownerReferences", None)
            store.put(rt, new, actor="garbage-collector", verb="patch")

    async def delete(self, request: web.Request, info: Info, rt: ResourceType) -> web.Response:
        opts = await self._delete_options(request)
        async with self.store.lock:
            obj = self.store.get(rt, info.namespace, info.name)
            if obj is None:
                raise self.store.not_found(rt, info.name)
            self.check_preconditions(rt, obj, opts)
            admit(self.store, rt, "delete", obj)  # simulated validating webhooks (lab/k8s/crds.py)
            if "All" in (opts.get("dryRun") or []):
                return jresp(self.out(rt, obj, info.version, shallow=True))
            result = self.delete_object(rt, obj, opts)
            request["audit"]["changes"] = diff(
                obj, result if result is not obj and self.store.get(rt, info.namespace, info.name) else None
            )
            return jresp(self.out(rt, result, info.version, shallow=True))

    async def delete_collection(self, request: web.Request, info: Info, rt: ResourceType) -> web.Response:
        label, field = self._selectors(request, rt)
        opts = await self._delete_options(request)
        async with self.store.lock:
            ns = info.namespace if rt.namespaced and info.namespace else None
            victims = [o for o in self.store.all(rt.key, ns) if label(o["metadata"].get("labels") or {}) and field(o)]
            if "All" not in (opts.get("dryRun") or []):
                for o in victims:
                    self.delete_object(rt, o, opts)
            request["audit"]["changes"] = [{"path": ".", "old": f"{len(victims)} objects", "new": None}]
        return jresp(
            {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Success",
                "details": {"kind": rt.plural, **({"group": rt.group} if rt.group else {})},
            }
        )
