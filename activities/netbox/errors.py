"""NetBox's answers as Temporal errors: 400 (a bad choice, a failed validation) is ``NetBoxRejected``, 401/403
``NetBoxAuth``, missing bootstrap objects ``NetBoxNotBootstrapped``, all non-retryable; 5xx, 409, 429, timeouts
and connection errors are retryable ``NetBoxUnavailable``; and whether a write's answer was lost."""

from __future__ import annotations

import json
from typing import Any

from temporalio.exceptions import ApplicationError

from activities.support.tls import TlsFix, Trust


def _response_message(err: Any) -> str:
    """NetBox's own words from an error response: the JSON body, compact."""
    req = getattr(err, "req", None)
    text = getattr(err, "error", None) or (req.text if req is not None else "") or str(err)
    try:
        return json.dumps(json.loads(text), separators=(", ", ": "))[:2000]
    except (TypeError, ValueError):
        return str(text).strip()[:500]


NETBOX_TLS_FIX = TlsFix(ca="MILLWRIGHT_NETBOX_CA_BUNDLE", off="MILLWRIGHT_NETBOX_VERIFY_TLS=false")


def netbox_error(err: Exception, doing: str, trust: Trust) -> ApplicationError:
    """Map a pynetbox/requests error to what a retry can or cannot fix."""
    import pynetbox
    import requests

    tls_failure = trust.failure(err, f"{doing}: NetBox")
    if tls_failure is not None:
        return tls_failure

    if isinstance(err, (pynetbox.RequestError, pynetbox.AllocationError)):
        status = err.req.status_code
        text = f"{doing}: NetBox answered {status}: {_response_message(err)}"
        if status == 400:
            return ApplicationError(text, type="NetBoxRejected", non_retryable=True)
        if status in (401, 403):
            return ApplicationError(text, type="NetBoxAuth", non_retryable=True)
        if status in (404, 405):
            return ApplicationError(text, type="NetBoxNotFound", non_retryable=True)
        return ApplicationError(text, type="NetBoxUnavailable")
    if isinstance(err, pynetbox.ContentError):
        return ApplicationError(f"{doing}: not a NetBox API answer: {err}", type="NetBoxUnavailable")
    if isinstance(err, requests.RequestException):
        # Never the request itself: its headers hold the token.
        return ApplicationError(f"{doing}: connection failed: {type(err).__name__}", type="NetBoxUnavailable")
    return ApplicationError(f"{doing}: {type(err).__name__}: {err}", type="NetBoxUnavailable")


def answer_lost(err: Exception) -> bool:
    """Whether a write that failed this way may have been carried out all the same: the request went (or may
    have gone) out and no answer of NetBox's came back, or a gateway answered for it."""
    import pynetbox
    import requests

    if isinstance(err, pynetbox.RequestError):
        return err.req.status_code in (500, 502, 503, 504)
    return isinstance(err, requests.RequestException) and not isinstance(err, requests.exceptions.SSLError)


def not_bootstrapped(what: str) -> ApplicationError:
    return ApplicationError(
        f"{what} is missing in NetBox; run `millwright inventory bootstrap` first",
        type="NetBoxNotBootstrapped",
        non_retryable=True,
    )
