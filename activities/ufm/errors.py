"""UFM's answers as the retry policy sees them.

400/404/405/409/413/414/422 → ``UfmRejected`` (non-retryable, UFM's own message); 401/403 → ``UfmAuth``
(non-retryable); 5xx and 429 → ``UfmUnavailable`` (retryable). The other errors of the UFM activities are raised
where they arise: timeouts, connection errors and reads that are not JSON → ``UfmUnavailable``, a certificate the
worker does not trust or one issued for another name → ``TlsVerificationFailed`` (non-retryable, naming the setting
that fixes it, from `UFM_TLS_FIX`), no settings → ``UfmNotConfigured``, an unreadable CA bundle or client
certificate → ``TlsNotConfigured`` (activities/ufm/client.py); a write that does not read back →
``UfmWriteNotApplied`` (retryable, activities/ufm/pkeys.py).
"""

from __future__ import annotations

import re

import httpx
from temporalio.exceptions import ApplicationError

from activities.support.tls import TlsFix

UFM_TLS_FIX = TlsFix(ca="MILLWRIGHT_UFM_CA_BUNDLE", off="MILLWRIGHT_UFM_VERIFY_TLS=false")


def ufm_error(response: httpx.Response, doing: str) -> ApplicationError:
    status = response.status_code
    try:
        body = response.json()
        text = body.get("error") or body.get("message") or str(body) if isinstance(body, dict) else str(body)
    except ValueError:  # e.g. the HTML page of UFM's Apache front
        text = re.sub(r"\s+", " ", re.sub(r"<[^>]*>", " ", response.text))
    message = f"{doing}: UFM answered {status}: {str(text).strip()[:500]}"
    if status in (401, 403):
        return ApplicationError(message, type="UfmAuth", non_retryable=True)
    if status in (413, 414):
        return ApplicationError(f"{message} (the request is too large for UFM's front)", type="UfmRejected",
                                non_retryable=True)  # fmt: skip
    if status in (400, 404, 405, 409, 422):
        return ApplicationError(message, type="UfmRejected", non_retryable=True)
    return ApplicationError(message, type="UfmUnavailable")
