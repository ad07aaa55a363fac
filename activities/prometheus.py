"""Prometheus activities: one instant query, its vector as plain numbers (for rollout health gates).

The client does no retries of its own: Temporal owns retrying, so every attempt is visible.
A query Prometheus rejects (4xx: bad syntax, bad parameters) fails non-retryably with
Prometheus' own error text; an unavailable server (5xx, 429, connection trouble, timeouts)
is retried by the activity's retry policy.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
from pydantic import Field
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.models import BaseUrl, StrictModel

USER_AGENT = "millwright-worker"


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
    def __init__(self) -> None:
        self._client: httpx.AsyncClient | None = None

    def activities(self) -> list[Callable]:
        return [self.query_prometheus]

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            # no retries in the transport: Temporal retries
            self._client = httpx.AsyncClient(headers={"User-Agent": USER_AGENT},
                                             transport=httpx.AsyncHTTPTransport(retries=0))
        return self._client

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    @activity.defn
    async def query_prometheus(self, q: PrometheusQuery) -> list[float]:
        """Run an instant query; return the values of the resulting vector (a scalar as one value)."""
        url = q.url.rstrip("/") + "/api/v1/query"
        try:
            response = await self._http().post(url, data={"query": q.query, "timeout": f"{q.timeout_seconds:g}s"},
                                               timeout=q.timeout_seconds)
        except httpx.HTTPError as err:
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
