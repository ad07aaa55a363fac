"""The emulator's own ``/_lab`` admin API (the client is lab/k8s/admin.py): reset, seed, dump, config, what
mig-manager does per node (``/_lab/mig``), the KAI gangs' interruptions (``/_lab/gangs``), and the faults and audit log of lab/faults.py."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from lab import faults

from . import dcgm, evidence, mig
from .crds import POD_GROUPS
from .seed import seed_objects
from .store import NODES, PDBS, Store, default_jobs_config
from .util import ApiError, clone, err_resp, jresp


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


async def _route(store: Store, request: web.Request) -> web.Response:  # noqa: C901 (one branch per lab admin endpoint)
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
                    if k == "migNodes":
                        store.config[k] = validate_mig_nodes(v)
                        continue
                    if k == "migStrategy" and v not in mig.STRATEGIES:
                        raise ApiError(400, f"migStrategy: one of {', '.join(mig.STRATEGIES)}", "BadRequest")
                    store.config[k] = type(store.config[k])(v)
                for ns in {o["metadata"]["namespace"] for o in store.all(PDBS)}:
                    store.recompute_pdbs(ns)
                store.kick.set()
        return jresp(dict(store.config))
    if path == "/_lab/mig":
        if m == "POST":
            body = await _body(request)
            async with store.lock:
                store.config["migNodes"] = set_mig_node(store.config["migNodes"], body)
                store.dirty.add((NODES, ("", body["node"])))  # a failure or reboot set now applies to a run pending
                store.kick.set()
        async with store.lock:
            return jresp(mig_view(store))
    if path == "/_lab/gangs" and m == "GET":
        async with store.lock:
            return jresp({"interruptions": gang_interruptions(store)})
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
    cfg = {**default_jobs_config(), **clone(v)}
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


def validate_mig_nodes(v: Any) -> dict:
    """The `migNodes` config key: {node: {"fail", "reboot", "pendingSeconds", "absent"}}, each field optional."""
    if not isinstance(v, dict):
        raise ApiError(400, "config key 'migNodes' must be an object {node: {fail, reboot}}", "BadRequest")
    out: dict = {}
    for node, how in v.items():
        if not isinstance(how, dict):
            raise ApiError(400, f"migNodes.{node}: an object {{fail, reboot, pendingSeconds, absent}}", "BadRequest")
        out = set_mig_node(out, {**how, "node": node}, f"migNodes.{node}")
    return out


def set_mig_node(nodes: dict, body: Any, where: str = "body") -> dict:
    """`POST /_lab/mig {"node", "fail": reason, "reboot": bool, "pendingSeconds": s, "absent": bool}` (each null:
    as the settings say): the node's next reconfigurations fail with that reason, reboot or not, stay `pending`
    that long; `absent`: no mig-manager runs there, the label is never acted on."""
    if not isinstance(body, dict) or not isinstance(body.get("node"), str):
        raise ApiError(400, f'{where}: expected {{"node": "...", "fail": "reason" | null, "reboot": true | false | null, '
                       '"pendingSeconds": s | null, "absent": true | false | null}', "BadRequest")  # fmt: skip
    extra = set(body) - {"node", "fail", "reboot", "pendingSeconds", "absent"}
    if extra:
        raise ApiError(400, f"{where}: unknown fields {sorted(extra)}", "BadRequest")
    if body.get("fail") is not None and (not isinstance(body["fail"], str) or not body["fail"]):
        raise ApiError(400, f"{where}.fail: a non-empty reason, or null", "BadRequest")
    for k in ("reboot", "absent"):
        if body.get(k) is not None and not isinstance(body[k], bool):
            raise ApiError(400, f"{where}.{k}: true, false or null", "BadRequest")
    pending = body.get("pendingSeconds")
    if pending is not None and (isinstance(pending, bool) or not isinstance(pending, (int, float)) or pending < 0):
        raise ApiError(400, f"{where}.pendingSeconds: seconds (0 or more), or null", "BadRequest")
    how = {k: body[k] for k in ("fail", "reboot", "pendingSeconds", "absent") if body.get(k) is not None}
    rest = {n: h for n, h in nodes.items() if n != body["node"]}
    return {**rest, body["node"]: how} if how else rest


def mig_view(store: Store) -> dict:
    """`GET /_lab/mig`: the settings, and each GPU node's config label, state, failure reason and hardware."""
    nodes = {}
    for node in store.all(NODES):
        md = node["metadata"]
        hw = mig.hardware(node)
        if hw["gpus"] <= 0:
            continue
        labels, ann = md.get("labels") or {}, md.get("annotations") or {}
        nodes[md["name"]] = {"config": labels.get(mig.CONFIG_LABEL), "state": labels.get(mig.STATE_LABEL),
                             "failure": ann.get(mig.FAILURE_ANNOTATION), "hardware": hw}  # fmt: skip
    cfg = store.config
    return {"strategy": cfg["migStrategy"], "pendingSeconds": cfg["migPendingSeconds"], "reboot": cfg["migReboot"],
            "dra": cfg["migDra"], "overrides": cfg["migNodes"], "nodes": nodes}  # fmt: skip


def gang_interruptions(store: Store) -> dict[str, int]:
    """`GET /_lab/gangs`: per KAI PodGroup (`namespace/name`), how often it went from whole to below its minMember
    (lab/k8s/controllers/kai.py `KaiGangs`)."""
    if store.registry.types.get(POD_GROUPS) is None:
        return {}
    return {f"{pg['metadata']['namespace']}/{pg['metadata']['name']}":
            store.side.get(pg["metadata"].get("uid", ""), {}).get("interruptions", 0)
            for pg in store.all(POD_GROUPS)}  # fmt: skip


def dump_objects(store: Store) -> list[dict]:
    """Every object as served, in key order (`/_lab/dump` and the state file)."""
    out = []
    for key in sorted(store.objects):
        rt = store.registry.types.get(key)
        for _, o in sorted(store.objects[key].items()):
            out.append(rt.served(o) if rt else clone(o))
    return out
