"""Notifications to a webhook: one JSON POST per event, safe to retry.

Every delivery carries an `Idempotency-Key` header the workflow derives from its run and the event,
so a retry after a timeout (the receiver may have got the first POST) lets the receiver drop the
duplicate. An optional bearer token comes from a secret reference read inside the attempt; it never
enters an input, output or error.

Errors: 2xx is delivered; 408, 425, 429, 5xx, timeouts and connection errors are retryable
(`WebhookUnavailable`, honouring Retry-After); any other 4xx is non-retryable (`WebhookRejected`);
a bad token reference is `WebhookNotConfigured` (non-retryable). The client never retries itself:
the workflow's retry policy does, visibly.

TLS: an https webhook's certificate is verified against the default CAs, or the target's own CA bundle
(`WebhookTarget.ca_bundle`); `verify_tls: false` turns verification off. A certificate the worker does not
trust, or one issued for another name, is a non-retryable `TlsVerificationFailed` naming those settings;
an unreadable CA bundle is `TlsNotConfigured` (activities/support/tls.py).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import httpx
from pydantic import Field, field_validator
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.models import BaseUrl, StrictModel
from activities.support.integration import Plain
from activities.support.secrets import SecretError, SecretRef
from activities.support.tls import TlsFix, Trust, ca_bundle_ref

USER_AGENT = "millwright-worker"
IDEMPOTENCY_HEADER = "Idempotency-Key"
EVENT_HEADER = "X-Millwright-Event"
_TIMEOUT = 10.0
_RETRYABLE = (408, 425, 429)
WEBHOOK_TLS_FIX = TlsFix(ca="the webhook's ca_bundle", off="the webhook's verify_tls: false")


def _token_ref(value: str | None) -> str | None:
    if value is not None:
        SecretRef.parse(value)  # a bare token is refused without echoing it
    return value


class WebhookTarget(StrictModel):
    """Where notifications go; the token is a secret reference, never the token."""

    url: BaseUrl = Field(description="The webhook URL (POST, JSON body).")
    token: str | None = Field(None, description="Secret reference (env:NAME or file:/path) to a bearer token.")
    ca_bundle: str | None = Field(
        None,
        description="CA bundle reference (file:/path/to/ca.pem) an https webhook's "
        "certificate is verified against; default: the default CAs",
    )
    verify_tls: bool = Field(True, description="Verify an https webhook's certificate (false: accept any).")

    _token = field_validator("token")(_token_ref)
    _ca_bundle = field_validator("ca_bundle")(ca_bundle_ref)


class WebhookNotification(StrictModel):
    target: WebhookTarget
    event: str = Field(min_length=1, description="e.g. node-quarantined")
    idempotency_key: str = Field(min_length=1, max_length=255)
    payload: dict[str, Any] = Field(default_factory=dict)


class WebhookDelivery(StrictModel):
    status: int
    attempt: int


class NotifyActivities:
    async def close(self) -> None:  # a Registration resource; clients are per attempt
        return None

    @activity.defn
    async def notify_webhook(self, req: WebhookNotification) -> WebhookDelivery:
        """POST `{"event", "idempotency_key", **payload}` as JSON to the webhook."""
        headers = {"User-Agent": USER_AGENT, IDEMPOTENCY_HEADER: req.idempotency_key, EVENT_HEADER: req.event}
        if req.target.token:
            try:
                headers["Authorization"] = f"Bearer {SecretRef.parse(req.target.token).resolve()}"
            except SecretError as err:
                raise ApplicationError(f"webhook token: {err}", type="WebhookNotConfigured",
                                       non_retryable=True) from None  # fmt: skip
        body = {"event": req.event, "idempotency_key": req.idempotency_key, **req.payload}
        trust = Trust.resolve(WEBHOOK_TLS_FIX, verify=req.target.verify_tls, ca_bundle=req.target.ca_bundle,
                              setting="the webhook's ca_bundle")  # fmt: skip
        try:
            async with httpx.AsyncClient(timeout=_TIMEOUT, verify=trust.for_httpx()) as http:
                resp = await http.post(req.target.url, json=body, headers=headers)
        except httpx.HTTPError as err:
            tls_failure = trust.failure(err, f"webhook {req.target.url}")
            if tls_failure is not None:
                raise tls_failure from None
            raise ApplicationError(f"webhook {req.target.url}: {type(err).__name__}: {err}",
                                   type="WebhookUnavailable") from None  # fmt: skip
        attempt = activity.info().attempt
        if 200 <= resp.status_code < 300:
            return WebhookDelivery(status=resp.status_code, attempt=attempt)
        text = f"webhook {req.target.url} answered HTTP {resp.status_code}: {resp.text[:300]}"
        if resp.status_code in _RETRYABLE or resp.status_code >= 500:
            delay = resp.headers.get("Retry-After")
            try:
                next_delay = timedelta(seconds=float(delay)) if delay else None
            except ValueError:
                next_delay = None
            raise ApplicationError(text, type="WebhookUnavailable", next_retry_delay=next_delay)
        raise ApplicationError(text, type="WebhookRejected", non_retryable=True)


class Notify(Plain):
    """Webhooks: each target carries its own URL, secret and TLS settings."""

    name = "Notify"
    packages = ("activities.notify",)
    activities_class = NotifyActivities
