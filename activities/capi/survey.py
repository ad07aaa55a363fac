"""The read behind a tenant onboarding's plan (workflows/tenancy/plan.py): what the cluster holds under every name
the onboarding would write, and whose it is, before anything is written. Read only; what it returns is the
objects' bookkeeping (owner, tenant label) and the few fields the plan judges (a Queue's parent, a RoleBinding's
groups), never their content otherwise.
"""

from __future__ import annotations

from typing import Any

from temporalio import activity

from activities.capi.apply import matches
from activities.capi.client import Resources
from activities.capi.models import LiveObject, ObjectRef, SurveyRequest
from activities.capi.ownership import TENANT_LABEL, Ownership


async def survey(res: Resources, req: SurveyRequest) -> list[LiveObject]:
    """Each desired object (compared with what is there) and each object only to be read, in order."""
    wanted: list[tuple[ObjectRef, dict[str, Any] | None]] = [(ObjectRef.of(o), o) for o in req.objects]
    wanted += [(ref, None) for ref in req.read]
    out = []
    for ref, desired in wanted:
        activity.heartbeat(str(ref))
        live = None
        if await res.lookup(ref.api_version, ref.kind) is not None:  # a kind not served holds nothing
            live = await res.read(ref.api_version, ref.kind, ref.name, ref.namespace)
        out.append(_seen(ref, live, desired, req.exact))
    return out


def _seen(ref: ObjectRef, live: dict[str, Any] | None, desired: dict[str, Any] | None, exact: list[str]) -> LiveObject:
    if live is None:
        return LiveObject(ref=ref, exists=False)
    labels = (live.get("metadata") or {}).get("labels") or {}
    own = Ownership.of(live)
    spec = live.get("spec") or {}
    return LiveObject(
        ref=ref,
        exists=True,
        owner=own.workflow if own else None,
        tenant=labels.get(TENANT_LABEL),
        differs=desired is not None and not matches(live, desired, exact),
        labels={str(k): str(v) for k, v in labels.items()},
        parent_queue=spec.get("parentQueue") if ref.kind == "Queue" else None,
        groups=[s.get("name", "") for s in live.get("subjects") or [] if s.get("kind") == "Group"]
        if ref.kind == "RoleBinding"
        else [],
    )
