"""The Kubernetes API's answers as Temporal errors: what a retry cannot fix is non-retryable with a `type`;
everything else (5xx, 409 conflicts, 429 rate limits with their Retry-After, dropped connections) is raised as is
for the workflow's retry policy. And how often a wait looks again."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import aiohttp
from kubernetes.aio.client.exceptions import ApiException
from temporalio.exceptions import ApplicationError

# ---------------------------------------------------------------- errors


# Waits look again soon (most Jobs, reboots and terminations end quickly), then less and
# less often, up to each wait's own ceiling.
FIRST_POLL_SECONDS = 0.25


def next_poll(current: float, ceiling: float) -> float:
    return min(current * 1.5, ceiling)


def status_of(err: ApiException) -> dict[str, Any]:
    try:
        status = json.loads(err.body or "{}")
    except (TypeError, ValueError):
        return {}
    return status if isinstance(status, dict) else {}


def retry_after(err: ApiException) -> float | None:
    status = status_of(err)
    seconds = (status.get("details") or {}).get("retryAfterSeconds")
    if seconds is None and err.headers is not None:
        seconds = err.headers.get("Retry-After")
    try:
        return float(seconds) if seconds is not None else None
    except ValueError:
        return None


def api_error(err: ApiException, doing: str) -> ApplicationError:
    """Map an API error to what a retry can or cannot fix."""
    status = status_of(err)
    message = status.get("message") or err.reason or "no message"
    text = f"{doing}: {err.status} {status.get('reason') or err.reason}: {message}"
    if err.status in (400, 403, 405, 415, 422):
        return ApplicationError(text, type="KubernetesRejected", non_retryable=True)
    delay = retry_after(err)
    return ApplicationError(
        text,
        type="KubernetesUnavailable",
        next_retry_delay=timedelta(seconds=delay) if delay else None,
    )


async def api_call(doing: str, coro):
    """Await an API call, mapping transport and API errors for the retry policy."""
    try:
        return await coro
    except ApiException as err:
        raise api_error(err, doing) from err
    except (TimeoutError, aiohttp.ClientError) as err:
        raise ApplicationError(f"{doing}: connection failed: {err!r}", type="KubernetesUnavailable") from err


async def api_read(doing: str, coro):
    """Like `api_call`, for a read where NotFound is an answer: it returns None."""
    return await none_if_not_found(api_call(doing, coro))


async def create(doing: str, coro) -> None:
    """Await a create call, mapped as `api_call` maps it; an object that exists already (409) is as good (a retry's,
    or another worker's)."""
    try:
        await api_call(doing, coro)
    except ApplicationError as err:
        if not (isinstance(err.__cause__, ApiException) and err.__cause__.status == 409):
            raise


async def none_if_not_found(call):
    try:
        return await call
    except ApplicationError as err:
        if isinstance(err.__cause__, ApiException) and _object_not_found(err.__cause__):
            return None
        raise


def _object_not_found(err: ApiException) -> bool:
    """A 404 that says the object is missing: a NotFound Status naming it. A 404 for the path (a proxy's,
    or a resource type the server does not serve: no name in its details) says nothing about the object,
    and is never read as "it is gone"."""
    status = status_of(err)
    return err.status == 404 and status.get("reason") == "NotFound" and bool((status.get("details") or {}).get("name"))
