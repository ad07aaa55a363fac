"""The emulator's own ``/_lab`` admin API (the client is lab/k8s/admin.py): reset, seed, dump, config, and the
faults and audit log of lab/faults.py."""

from __future__ import annotations

import copy
import json
from typing import Any

from aiohttp import web

from lab import faults

from . import dcgm, evidence
from .seed import seed_objects
from .store import PDBS, Store, default_jobs_config
from .util import ApiError, err_resp, jresp


async def handle(store: Store, request: web.Request) -> web.Response:
    try:
        return await faults.admin(request, store.faults, store.audit) or await _route(store, request)
    except faults.FaultError as e:
        return err_resp(ApiError(400, str(e), "BadRequest"))
    except ApiError as e:
        return err_resp(e)


async def _body(request: web.Request) -> Any:
    raw = await request.read()
    try:
        return json.loads(raw) if raw else None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ApiError(400, f"error decoding request body: {e}", "BadRequest") from None


async def _route(store: Store, request: web.Request) -> web.Response:
    path = request.path.rstrip("/")
    m = request.method
    if path.startswith(("/_lab/dcgm", "/_lab/kai/")):
        served = await dcgm.handle(store, request, path)
        if served is not None:
            return served
    if path == "/_lab/reset" and m == "POST":
        async with store.lock:
            store.reset()
        return jresp({"ok": True, "resourceVersion": str(store.rv)})
    if path == "/_lab/seed" and m == "POST":
        body = await _body(request) or {}
        objs = body.get("objects") if isinstance(body, dict) else body
        async with store.lock:
            result = seed_objects(store, objs or [])
        return jresp(result)
    if path == "/_lab/dump" and m == "GET":
        async with store.lock:
            return jresp({"objects": dump_objects(store), "resourceVersion": str(store.rv)})
    if path == "/_lab/config":
        if m == "POST":
            body = await _body(request) or {}
            async with store.lock:
                for k, v in body.items():
                    if k not in store.config:
                        raise ApiError(400, f"unknown config key {k!r}", "BadRequest")
                    if k == "jobs":
                        store.config[k] = validate_jobs_config(v)
                        continue
                    store.config[k] = type(store.config[k])(v)
                for ns in {o["metadata"]["namespace"] for o in store.all(PDBS)}:
                    store.recompute_pdbs(ns)
                store.kick.set()
        return jresp(dict(store.config))
    if path == "/_lab/audit/requests" and m == "GET":  # lab/k8s/evidence.py: every request kind, ever
        return jresp(evidence.snapshot(f"{request.scheme}://{request.host}"))
    if path == "/_lab/healthz":
        return jresp({"ok": True})
    raise ApiError(404, f"unknown admin path {path}", "NotFound")


def validate_jobs_config(v: Any) -> dict:
    """The `jobs` config key: {"defaultSeconds": float, "rules": [{node, package, stage, interrupt, outcome,
    seconds, times, message, log}]}; every rule field optional."""
    if not isinstance(v, dict):
        raise ApiError(400, "config key 'jobs' must be an object", "BadRequest")
    cfg = {**default_jobs_config(), **copy.deepcopy(v)}
    try:
        cfg["defaultSeconds"] = float(cfg["defaultSeconds"])
    except (TypeError, ValueError):
        raise ApiError(400, "jobs.defaultSeconds must be a number", "BadRequest") from None
    rules = cfg.get("rules")
    if not isinstance(rules, list) or not all(isinstance(r, dict) for r in rules):
        raise ApiError(400, "jobs.rules must be a list of objects", "BadRequest")
    known = {"node", "package", "stage", "interrupt", "outcome", "seconds", "times", "message", "log"}
    for i, r in enumerate(rules):
        extra = set(r) - known
        if extra:
            raise ApiError(400, f"jobs.rules[{i}]: unknown fields {sorted(extra)}", "BadRequest")
        if str(r.get("outcome") or "succeed").lower() not in ("succeed", "success", "fail", "failed", "failure"):
            raise ApiError(400, f"jobs.rules[{i}].outcome must be 'succeed' or 'fail'", "BadRequest")
    return cfg


def dump_objects(store: Store) -> list[dict]:
    """Every object as served, in key order (`/_lab/dump` and the state file)."""
    out = []
    for key in sorted(store.objects):
        rt = store.registry.types.get(key)
        for _, o in sorted(store.objects[key].items()):
            out.append(rt.served(o) if rt else copy.deepcopy(o))
    return out
