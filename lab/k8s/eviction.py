"""Eviction (`POST pods/<name>/eviction`): the PodDisruptionBudget check as the real API server makes it, the
budget's own status write (which a status fault can answer) and the delete. Every eviction's audit entry carries
`eviction` {pdb, disruptionsAllowedBefore, currentHealthyBefore, desiredHealthy, outcome}: the disruption-budget
checks read it."""

from __future__ import annotations

import time
from typing import Any, Protocol

from aiohttp import web

from .resources import Info, ResourceType
from .store import PDBS, Store, is_pod_ready
from .util import REASONS, ApiError, clone, diff, jresp, now_rfc3339

EVICTION_RETRY_STEPS = 20  # EvictionsRetry in eviction.go: a budget write that conflicts is tried 20 times


class Verbs(Protocol):
    """What an eviction asks of the API server (lab/k8s/api.py `Api`): the delete and the checks before it."""

    store: Store

    async def body_json(self, request: web.Request) -> Any: ...

    def _query_dry_run(self, request: web.Request) -> bool: ...

    def _check_namespace(self, rt: ResourceType, ns: str, name: str) -> None: ...

    def check_preconditions(self, rt: ResourceType, obj: dict, opts: dict) -> None: ...

    def delete_object(self, rt: ResourceType, obj: dict, opts: dict, actor: str | None = None) -> dict: ...


async def evict(api: Verbs, request: web.Request, info: Info, rt: ResourceType) -> web.Response:  # noqa: C901 (the Eviction API's rules in the order the API server applies them)
    """pods/eviction as pkg/registry/core/pod/storage/eviction.go answers it (reference §4.2, §8.4)."""
    body = await api.body_json(request) or {}
    entry = request["audit"]
    ev: dict[str, Any] = {
        "pdb": None,
        "disruptionsAllowedBefore": None,
        "currentHealthyBefore": None,
        "desiredHealthy": None,
        "outcome": None,
    }
    entry["eviction"] = ev
    name = ((body.get("metadata") or {}).get("name")) or ""
    if name and name != info.name:
        ev["outcome"] = "bad-request"
        raise ApiError(400, "name in URL does not match name in Eviction object", "BadRequest")
    opts = dict(body.get("deleteOptions") or {})
    dry = "All" in (opts.get("dryRun") or []) or api._query_dry_run(request)
    store = api.store
    pdb_rt = store.registry.types[PDBS]
    success = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}
    async with store.lock:
        try:  # the NamespaceLifecycle admission, before the handler: no new content in a terminating namespace
            api._check_namespace(rt, info.namespace, info.name)
        except ApiError:
            ev["outcome"] = "namespace-refused"
            raise
        pod = store.get(rt, info.namespace, info.name)
        if pod is None:
            ev["outcome"] = "not-found"
            raise store.not_found(rt, info.name)
        phase = (pod.get("status") or {}).get("phase")
        deleting = bool(pod["metadata"].get("deletionTimestamp"))

        def do_delete(outcome: str) -> web.Response:
            # The delete options' preconditions are checked by the delete itself, after any budget
            # was taken: a failed precondition is a 409 that has still used up a disruption.
            try:
                api.check_preconditions(rt, pod, opts)
            except ApiError:
                ev["outcome"] = "precondition-failed"
                raise
            ev["outcome"] = outcome
            if not dry:
                before = clone(pod)
                after = api.delete_object(rt, pod, opts)
                entry["changes"] = diff(before, after if store.get(rt, info.namespace, info.name) else None)
            return jresp(success, 201)

        if phase in ("Pending", "Succeeded", "Failed") or not phase or deleting:
            return do_delete("deleted-without-pdb-check")
        pdbs = store.pdbs_for_pod(pod)
        if not pdbs:
            return do_delete("evicted-no-pdb")
        if len(pdbs) > 1:
            ev["pdb"] = ",".join(f"{p['metadata']['namespace']}/{p['metadata']['name']}" for p in pdbs)
            ev["outcome"] = "multiple-pdbs"
            # Returned as the handler's result, not raised: a bare Status, no reason, the message as is.
            raise ApiError(
                500,
                "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.",
                "",
            )
        pdb = pdbs[0]
        pmd, pst = pdb["metadata"], pdb.get("status") or {}
        live = store.pdb_math(pdb)
        ev.update(
            {
                "pdb": f"{pmd['namespace']}/{pmd['name']}",
                "disruptionsAllowedBefore": pst.get("disruptionsAllowed", 0),
                "currentHealthyBefore": live["currentHealthy"],
                "desiredHealthy": live["desiredHealthy"],
            }
        )
        policy = (pdb.get("spec") or {}).get("unhealthyPodEvictionPolicy", "IfHealthyBudget")
        if not is_pod_ready(pod):
            if policy == "AlwaysAllow":
                return do_delete("evicted-unhealthy")
            if pst.get("currentHealthy", 0) >= pst.get("desiredHealthy", 0) > 0:
                return do_delete("evicted-unhealthy")
        too_many = "Cannot evict pod as it would violate the pod's disruption budget."
        if pst.get("observedGeneration", 0) < pmd.get("generation", 1):
            ev["outcome"] = "blocked-stale-pdb"
            raise ApiError(
                429,
                too_many,
                "TooManyRequests",
                {
                    "retryAfterSeconds": 10,
                    "causes": [
                        {
                            "reason": "DisruptionBudget",
                            "message": f"The disruption budget {pmd['name']} is still being processed by the server.",
                        }
                    ],
                },
                {"Retry-After": "10"},
            )
        allowed = int(pst.get("disruptionsAllowed", 0))
        if allowed < 0:
            ev["outcome"] = "forbidden-negative-budget"
            raise ApiError(
                403,
                f'poddisruptionbudgets.policy "{pmd["name"]}" is forbidden: pdb disruptions allowed is negative',
                "Forbidden",
                {"name": pmd["name"], "group": "policy", "kind": "poddisruptionbudgets"},
            )
        if len(pst.get("disruptedPods") or {}) > 2000:
            ev["outcome"] = "forbidden-too-many-disrupted"
            raise ApiError(
                403,
                f'poddisruptionbudgets.policy "{pmd["name"]}" is forbidden: DisruptedPods map '
                "too big - too many evictions not confirmed by PDB controller",
                "Forbidden",
                {"name": pmd["name"], "group": "policy", "kind": "poddisruptionbudgets"},
            )
        if allowed == 0:
            ev["outcome"] = "blocked"
            raise ApiError(
                429,
                too_many,
                "TooManyRequests",
                {
                    "causes": [
                        {
                            "reason": "DisruptionBudget",
                            "message": f"The disruption budget {pmd['name']} needs {pst.get('desiredHealthy', 0)} healthy "
                            f"pods and has {pst.get('currentHealthy', 0)} currently",
                        }
                    ]
                },
            )
        if dry:
            ev["outcome"] = "evicted"
            return jresp(success, 201)
        _budget_status_write(store, request, pdb, ev)
        new_pdb = clone(pdb)
        ns_ = new_pdb.setdefault("status", {})
        ns_["disruptionsAllowed"] = allowed - 1
        ns_.setdefault("disruptedPods", {})[info.name] = now_rfc3339()
        store.side.setdefault(pod["metadata"].get("uid", ""), {})["disrupted_at"] = time.time()
        store.put(pdb_rt, new_pdb, actor="lab-apiserver/eviction", verb="update", subresource="status")
        return do_delete("evicted")


def _budget_status_write(store: Store, request: web.Request, pdb: dict, ev: dict) -> None:
    """Before the budget is decremented: the API server writes it through its own loopback client
    (`UpdateStatus`), so a status fault on `update poddisruptionbudgets/status` answers that internal
    call. A Conflict is retried (the real server waits 500 ms between tries; here nothing else can
    change the budget meanwhile); after 20 the eviction fails with that Conflict, nothing written,
    the pod untouched. Any other error is the eviction's answer as it is. Lock held."""
    pmd = pdb["metadata"]
    internal = {
        "verb": "update",
        "group": "policy",
        "version": "v1",
        "resource": "poddisruptionbudgets",
        "subresource": "status",
        "namespace": pmd["namespace"],
        "name": pmd["name"],
    }
    for _ in range(EVICTION_RETRY_STEPS):
        fault = store.faults.match(internal, status_only=True)
        if fault is None:
            return
        code = int(fault["action"]["status"])
        ev["budgetWriteFaults"] = ev.get("budgetWriteFaults", 0) + 1
        store.audit_add(
            {
                "time": time.time(),
                **internal,
                "write": True,
                "code": code,
                "userAgent": "lab-apiserver/eviction",
                "fault": {"id": fault["id"], **fault["action"]},
                "path": f"(internal, for {request.path})",
            }
        )
        if code == 409:
            continue
        ev["outcome"] = "budget-write-failed"
        raise ApiError(
            code,
            fault["action"].get("message") or f"injected fault: {REASONS.get(code, code)}",
            fault["action"].get("reason"),
        )
    ev["outcome"] = "budget-write-conflict"
    raise store.conflict(store.registry.types[PDBS], pmd["name"])
