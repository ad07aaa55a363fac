"""What a failed saga run reports: the error that stopped it, what the run created and what its compensation
removed, in the message and in the failure's details (`{"created": [...], "removed": [...]}`), so an operator
and a calling workflow read the same account. Shared by OnboardTenant, CreateCluster and IsolateTenant."""

from __future__ import annotations

from temporalio.exceptions import ApplicationError

from workflows.common.errors import root_cause

_REPORT_KEYS = ("created", "removed")


def failure(
    doing: str, err: BaseException, created: list[str], removed: list[str], type: str | None = None
) -> ApplicationError:
    """The run's non-retryable failure: `<doing> failed: <cause>; created [...]; removed [...]`. Its type is
    `type`, or else the cause's own (a caller matching on ObjectConflict or ClusterNotReady still can)."""
    cause = root_cause(err)
    kind = type or (cause.type if isinstance(cause, ApplicationError) else None) or "Failed"
    return ApplicationError(
        f"{doing} failed: {cause}; created {created or 'nothing'}; removed {removed or 'nothing'} (in reverse order)",
        {"created": created, "removed": removed},
        type=kind,
        non_retryable=True,
    )


def report_of(err: BaseException) -> tuple[list[str], list[str]] | None:
    """(created, removed) from a failure `failure` made, found under its wrappers; None for any other error."""
    cause: BaseException | None = err
    while cause is not None:
        if isinstance(cause, ApplicationError) and cause.details:
            doc = cause.details[0]
            if isinstance(doc, dict) and all(isinstance(doc.get(k), list) for k in _REPORT_KEYS):
                return [str(x) for x in doc["created"]], [str(x) for x in doc["removed"]]
        cause = getattr(cause, "cause", None)
    return None
