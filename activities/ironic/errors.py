"""Ironic's answers as the retry policy sees them.

404 → ``IronicNotFound``; 401/403 → ``IronicAuth``; other 4xx except 409/429 → ``IronicRejected`` (all
non-retryable, with Ironic's own faultstring); 409 (node locked), 429 and 5xx → ``IronicUnavailable`` (retryable).
A certificate the worker does not trust, or one issued for another name, is a non-retryable
``TlsVerificationFailed`` naming the setting that fixes it (`IRONIC_TLS_FIX`).
"""

from __future__ import annotations

import json

import httpx
from temporalio.exceptions import ApplicationError

from activities.support.tls import TlsFix


def fault_message(response: httpx.Response) -> str:
    """Ironic's own message: {"error_message": "{\\"faultstring\\": ...}"} (a JSON string inside JSON)."""
    try:
        body = response.json()
    except ValueError:
        return response.text.strip()[:500]
    if isinstance(body, dict):
        inner = body.get("error_message", body)
        if isinstance(inner, str):
            try:
                inner = json.loads(inner)
            except ValueError:
                return inner.strip()[:500]
        if isinstance(inner, dict):
            return str(inner.get("faultstring") or inner.get("message") or inner).strip()[:500]
    return str(body)[:500]


IRONIC_TLS_FIX = TlsFix(ca="MILLWRIGHT_IRONIC_CA_BUNDLE", off="MILLWRIGHT_IRONIC_VERIFY_TLS=false")


def ironic_error(response: httpx.Response, doing: str) -> ApplicationError:
    status = response.status_code
    message = f"{doing}: Ironic answered {status}: {fault_message(response)}"
    if status in (409, 429) or status >= 500:
        return ApplicationError(message, type="IronicUnavailable")
    if status in (401, 403):
        return ApplicationError(message, type="IronicAuth", non_retryable=True)
    if status == 404:
        return ApplicationError(message, type="IronicNotFound", non_retryable=True)
    return ApplicationError(message, type="IronicRejected", non_retryable=True)
