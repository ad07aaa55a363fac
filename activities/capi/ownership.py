"""Millwright's bookkeeping on the objects it writes: the managed-by and tenant labels, and the owner annotation.

Every object written carries the `millwright.dev/owner` annotation (`Ownership`): the workflow that manages it,
the run that created it and the run that last wrote it. A retry that finds its own run's earlier write reports it
as that run's (`created`, `updated`: activities/capi/apply.py), and compensation finds everything a failed run
created by reading the cluster (`ListRequest.owned_by`) rather than trusting the list it kept.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import Field

from activities.models import StrictModel

MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "millwright"
OWNER_ANNOTATION = "millwright.dev/owner"
TENANT_LABEL = "millwright.dev/tenant"


class Ownership(StrictModel):
    """Who owns an object, as its owner annotation records it (JSON). A bare workflow ID, as objects written
    before runs were recorded carry, reads as that workflow with no run.

    As a filter (`owned_by`): objects of this workflow and, when `created_by` is set, created by that run."""

    workflow: str = Field(
        description="ID of the managing workflow (the same for every run about one tenant or cluster)."
    )
    created_by: str = Field("", description="Run ID of the run that created the object.")
    written_by: str = Field("", description="Run ID of the run that last created or changed it.")

    def annotation(self) -> str:
        return json.dumps(
            {"workflow": self.workflow, "createdBy": self.created_by, "writtenBy": self.written_by},
            separators=(",", ":"),
        )

    @classmethod
    def of(cls, obj: dict[str, Any]) -> Ownership | None:
        value = ((obj.get("metadata") or {}).get("annotations") or {}).get(OWNER_ANNOTATION)
        if not value:
            return None
        try:
            doc = json.loads(value)
        except ValueError:
            doc = None
        if not isinstance(doc, dict):
            return cls(workflow=value)
        return cls(
            workflow=str(doc.get("workflow") or ""),
            created_by=str(doc.get("createdBy") or ""),
            written_by=str(doc.get("writtenBy") or ""),
        )

    def covers(self, obj: dict[str, Any]) -> bool:
        own = Ownership.of(obj)
        return (
            own is not None
            and own.workflow == self.workflow
            and (not self.created_by or own.created_by == self.created_by)
        )

    def describe(self, obj: dict[str, Any]) -> str:
        """Whose the object is, for an error message."""
        return self.whose(Ownership.of(obj))

    def whose(self, own: Ownership | None) -> str:
        """Whose an object with this ownership is (None: no owner annotation), for an error message."""
        if own is None:
            return "not created by Millwright"
        if own.workflow != self.workflow:
            return f"managed by {own.workflow}"
        return f"created by run {own.created_by or 'unknown'} of {own.workflow}"
