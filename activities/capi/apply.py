"""Create-or-compare of one desired object: what `apply_objects` (activities/capi/activities.py) does per object.

Every write reads first, and the outcome comes from reading the cluster, never from a write's answer (which a
dropped connection loses after the write was done). A missing object is created and read back; an existing
object that already matches is left alone; one that differs is an error (`ObjectConflict`) when it is not ours or
when the caller asked for create-only (unless this run created it), and is replaced in place and read back
otherwise. AlreadyExists → read and compare. Whose an object is comes from its owner annotation
(activities/capi/ownership.py).
"""

from __future__ import annotations

import json
from typing import Any

from kubernetes.aio.client.exceptions import ApiException
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.capi.client import Resources, request
from activities.capi.models import ApplyOutcome, ApplyRequest, ObjectRef
from activities.capi.ownership import MANAGED_BY, MANAGED_BY_LABEL, OWNER_ANNOTATION, Ownership


async def apply_object(res: Resources, raw: dict[str, Any], req: ApplyRequest) -> ApplyOutcome:
    """Create the object unless it exists, then reconcile what is there with it."""
    desired = json.loads(json.dumps(raw))
    md = desired.setdefault("metadata", {})
    md.setdefault("labels", {})[MANAGED_BY_LABEL] = MANAGED_BY
    notes = md.setdefault("annotations", {})
    ref = ObjectRef.of(desired)
    activity.heartbeat(str(ref))
    item = await res.path(ref.api_version, ref.kind, ref.name, ref.namespace)
    live = await request(res.api, "GET", item, f"reading {ref}", missing_ok=True)
    if live is None:
        notes[OWNER_ANNOTATION] = Ownership(workflow=req.owner, created_by=req.run, written_by=req.run).annotation()
        try:
            await request(
                res.api,
                "POST",
                await res.path(ref.api_version, ref.kind, namespace=ref.namespace),
                f"creating {ref}",
                body=desired,
            )
        except ApplicationError as err:
            if not _already_exists(err):
                raise  # a lost answer included: the retry reads what the write left
        live = await request(res.api, "GET", item, f"reading {ref}", missing_ok=True)
        if live is None:
            raise _not_applied(ref, req.cluster, "creating", None)
    return await _reconcile(res, item, ref, live, desired, req)


async def _reconcile(
    res: Resources,
    item: str,
    ref: ObjectRef,
    live: dict[str, Any],
    desired: dict[str, Any],
    req: ApplyRequest,
) -> ApplyOutcome:
    """The outcome for an object that exists: whose it is says whether this run wrote it (an earlier attempt
    whose answer was lost included); a differing one of ours is replaced in place and read back."""
    lmd = live.get("metadata") or {}
    own = Ownership.of(live) or Ownership(workflow="")
    ours = own.workflow == req.owner
    mine = ours and bool(req.run) and own.created_by == req.run
    if matches(live, desired, req.exact):
        wrote = ours and bool(req.run) and own.written_by == req.run
        return ApplyOutcome(
            ref=ref, outcome="created" if mine else "updated" if wrote else "unchanged", uid=lmd.get("uid", "")
        )
    if not ours or (req.on_difference == "error" and not mine):
        whose = Ownership(workflow=req.owner).describe(live)
        raise ApplicationError(
            f"{ref} already exists in cluster {req.cluster} and differs from the "
            f"desired object ({whose}); refusing to adopt or overwrite it",
            type="ObjectConflict",
            non_retryable=True,
        )
    md = desired["metadata"]
    md["annotations"][OWNER_ANNOTATION] = Ownership(
        workflow=req.owner, created_by=own.created_by, written_by=req.run
    ).annotation()
    md["resourceVersion"] = lmd.get("resourceVersion")
    if "status" in live:
        desired["status"] = live["status"]
    await request(res.api, "PUT", item, f"updating {ref}", body=desired)  # 409 Conflict: retried
    back = await request(res.api, "GET", item, f"reading {ref}", missing_ok=True)
    if back is None or not matches(back, desired, req.exact):
        raise _not_applied(ref, req.cluster, "updating", back)
    return ApplyOutcome(ref=ref, outcome="created" if mine else "updated", uid=lmd.get("uid", ""))


def _contains(have: Any, want: Any) -> bool:
    """Does the live value carry every field of the desired one (server defaults may add others)?"""
    if isinstance(want, dict):
        return isinstance(have, dict) and all(_contains(have.get(k), v) for k, v in want.items())
    if isinstance(want, list):
        return isinstance(have, list) and len(have) == len(want) and all(map(_contains, have, want))
    if isinstance(want, (int, float)) and isinstance(have, (int, float)) and not isinstance(want, bool):
        return float(have) == float(want)
    return have == want


def matches(live: dict[str, Any], desired: dict[str, Any], exact: list[str] | None = None) -> bool:
    """Does the live object carry the desired one? Millwright's bookkeeping (the managed-by label, the owner
    annotation) is not content: an identical object someone else made matches, and is left alone, not adopted.
    At the `exact` paths (dotted), a key the live object has and the desired one does not is a difference: a
    ResourceQuota's removed GPU cap, which no server default adds back."""
    for path in exact or []:
        want, have = _at(desired, path), _at(live, path)
        if isinstance(want, dict) and isinstance(have, dict) and set(have) - set(want):
            return False
    body = {k: v for k, v in desired.items() if k not in ("apiVersion", "kind", "metadata", "status")}
    md = desired.get("metadata") or {}
    lmd = live.get("metadata") or {}
    labels = {k: v for k, v in (md.get("labels") or {}).items() if k != MANAGED_BY_LABEL}
    notes = {k: v for k, v in (md.get("annotations") or {}).items() if k != OWNER_ANNOTATION}
    return (
        _contains(live, body)
        and _contains(lmd.get("labels") or {}, labels)
        and _contains(lmd.get("annotations") or {}, notes)
    )


def _at(obj: Any, path: str) -> Any:
    for part in path.split("."):
        obj = obj.get(part) if isinstance(obj, dict) else None
    return obj


def _already_exists(err: ApplicationError) -> bool:
    cause = err.__cause__
    return isinstance(cause, ApiException) and cause.status == 409 and "AlreadyExists" in str(cause.body or "")


def _not_applied(ref: ObjectRef, cluster: str, doing: str, back: dict[str, Any] | None) -> ApplicationError:
    """A write answered (or lost) whose effect the read-back does not show."""
    if back is None:  # the write's answer said done, yet nothing is there: read again on the next attempt
        return ApplicationError(
            f"{doing} {ref} in cluster {cluster}: reading it back finds nothing", type="KubernetesUnavailable"
        )
    return ApplicationError(
        f"{doing} {ref} in cluster {cluster}: reading it back shows an object that differs "
        "from the one written (changed meanwhile, or by an admission webhook)",
        type="ObjectNotApplied",
        non_retryable=True,
    )
