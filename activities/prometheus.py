"""Prometheus activities: one instant query, its vector as plain numbers (for rollout health gates).

The client does no retries of its own: Temporal owns retrying, so every attempt is visible.
A query Prometheus rejects (4xx: bad syntax, bad parameters) fails non-retryably with
Prometheus' own error text; an unavailable server (5xx, 429, connection trouble, timeouts)
is retried by the activity's retry policy.

TLS: an https server's certificate is verified against the default CAs, or the CA bundle of the
worker's ``MILLWRIGHT_PROMETHEUS_CA_BUNDLE`` (read when the worker's client is made, at its first
query); ``MILLWRIGHT_PROMETHEUS_VERIFY_TLS=false`` turns verification off. A certificate the worker
does not trust, or one issued for another name, is a non-retryable ``TlsVerificationFailed``
naming those settings (activities/support/tls.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
from pydantic import Field
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.models import BaseUrl, StrictModel
from activities.support.tls import TlsFix, Trust, TrustingClient

USER_AGENT = "millwright-worker"
PROMETHEUS_TLS_FIX = TlsFix(ca="MILLWRIGHT_PROMETHEUS_CA_BUNDLE", off="MILLWRIGHT_PROMETHEUS_VERIFY_TLS=false")


class PrometheusQuery(StrictModel):
    url: BaseUrl = Field(description="Base URL of the Prometheus server, e.g. http://prometheus:9090")
    query: str = Field(description="PromQL, evaluated as an instant query.")
    timeout_seconds: float = Field(10, gt=0)


def _error_text(response: httpx.Response) -> str:
    try:
        body = response.json()
        if isinstance(body, dict) and body.get("error"):
            return f"{body.get('errorType') or 'error'}: {body['error']}"
    except ValueError:
        pass
    return response.text[:500] or response.reason_phrase


def _number(sample: Any, query: str) -> float:
    try:
        return float(sample[1])  # Prometheus sends values as strings: "1", "NaN", "+Inf"
    except (TypeError, ValueError, IndexError) as err:
        raise ApplicationError(f"Prometheus answered {query!r} with a malformed sample {sample!r}",
                               type="PrometheusBadResponse", non_retryable=True) from err


class PrometheusActivities:
    def __init__(self, *, ca_bundle: str | None = None, verify_tls: bool = True) -> None:
        """`ca_bundle`, `verify_tls`: what every server's certificate is verified against (the worker's
        MILLWRIGHT_PROMETHEUS_CA_BUNDLE and MILLWRIGHT_PROMETHEUS_VERIFY_TLS)."""
        self._ca_bundle, self._verify_tls = ca_bundle, verify_tls
        self._client: TrustingClient | None = None

    def activities(self) -> list[Callable]:
        return [self.query_prometheus]

    def _http(self) -> TrustingClient:
        if self._client is None:  # one client for every query, so connections are reused
            trust = Trust.resolve(PROMETHEUS_TLS_FIX, verify=self._verify_tls, ca_bundle=self._ca_bundle,
                                  setting="MILLWRIGHT_PROMETHEUS_CA_BUNDLE")  # fmt: skip
            # no retries in the transport: Temporal retries
            self._client = TrustingClient(trust, headers={"User-Agent": USER_AGENT},
                                          transport=httpx.AsyncHTTPTransport(retries=0, verify=trust.for_httpx()))
        return self._client

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    @activity.defn
    async def query_prometheus(self, q: PrometheusQuery) -> list[float]:
        """Run an instant query; return the values of the resulting vector (a scalar as one value)."""
        url = q.url.rstrip("/") + "/api/v1/query"
        http = self._http()
        try:
            response = await http.post(url, data={"query": q.query, "timeout": f"{q.timeout_seconds:g}s"},
                                       timeout=q.timeout_seconds)
        except httpx.HTTPError as err:
            tls_failure = http.trust.failure(err, f"querying Prometheus at {q.url}")
            if tls_failure is not None:
                raise tls_failure from None
            raise ApplicationError(f"querying Prometheus at {q.url}: {type(err).__name__}: {err}",
                                   type="PrometheusUnavailable") from err
        if response.status_code == 429 or response.status_code >= 500:
            raise ApplicationError(
                f"querying Prometheus at {q.url}: {response.status_code}: {_error_text(response)}",
                type="PrometheusUnavailable",
            )
        if response.status_code >= 400:
            raise ApplicationError(
                f"Prometheus rejected {q.query!r}: {response.status_code}: {_error_text(response)}",
                type="PrometheusRejected",
                non_retryable=True,
            )
        try:
            body = response.json()
        except ValueError as err:
            raise ApplicationError(f"Prometheus at {q.url} answered with something that is not JSON",
                                   type="PrometheusBadResponse", non_retryable=True) from err
        if not isinstance(body, dict) or body.get("status") != "success":
            raise ApplicationError(f"Prometheus rejected {q.query!r}: {_error_text(response)}",
                                   type="PrometheusRejected", non_retryable=True)
        data = body.get("data") or {}
        kind, result = data.get("resultType"), data.get("result")
        if kind == "vector" and isinstance(result, list):
            return [_number(s.get("value"), q.query) for s in result]
        if kind == "scalar":
            return [_number(result, q.query)]
        raise ApplicationError(
            f"Prometheus answered {q.query!r} with a {kind}; a gate needs an instant vector or a scalar",
            type="PrometheusBadResponse", non_retryable=True,
        )


__all__ = ["PrometheusActivities", "PrometheusQuery"]
