"""What went wrong, in words: the one place a workflow unwraps an activity's or a child's failure.

`root_cause` is the error under Temporal's wrappers (the one that names what went wrong); `error_text` is its
message, or that the call did not answer in time. Every family reports failures through these two (the saga
report, the endpoint waits, remediation's notes, the carried outcomes)."""

from __future__ import annotations

from temporalio.exceptions import ActivityError, ChildWorkflowError, TimeoutError


def root_cause(err: BaseException) -> BaseException:
    """The error under an activity's or a child workflow's wrapper (the one that names what went wrong)."""
    while isinstance(err, (ActivityError, ChildWorkflowError)) and err.cause is not None:
        err = err.cause
    return err


def error_text(err: BaseException) -> str:
    """The innermost cause's message: what the endpoint answered, or that it did not answer in time."""
    err = root_cause(err)
    if isinstance(err, TimeoutError):
        last = err.cause
        kind = err.type.name.lower().replace("_", "-") if err.type else "activity"
        return error_text(last) if last is not None else f"no answer within the {kind} timeout"
    return (getattr(err, "message", None) or str(err))[:500]
