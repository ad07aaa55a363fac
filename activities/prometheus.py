"""Prometheus activities: one instant query, its vector as plain numbers (for rollout health gates); the GPU
faults NVIDIA's dcgm-exporter reports for a set of nodes (for the remediation sweep), in one query.

The client does no retries of its own: Temporal owns retrying, so every attempt is visible.
A query Prometheus rejects (4xx: bad syntax, bad parameters) fails non-retryably with
Prometheus' own error text; an unavailable server (5xx, 429, connection trouble, timeouts)
is retried by the activity's retry policy.

TLS: an https server's certificate is verified against the default CAs, or the CA bundle of the
worker's ``MILLWRIGHT_PROMETHEUS_CA_BUNDLE`` (read when the worker's client is made, at its first
query); ``MILLWRIGHT_PROMETHEUS_VERIFY_TLS=false`` turns verification off. A certificate the worker
does not trust, or one issued for another name, is a non-retryable ``TlsVerificationFailed``
naming those settings (activities/support/tls.py).

GPU faults (`dcgm_faults`): the server is the worker's ``MILLWRIGHT_PROMETHEUS_URL`` (none set: the activity
answers ``configured: false`` and the sweep says the signal is not used). The series are dcgm-exporter's, named
and labelled as it exports them (etc/default-counters.csv of NVIDIA/dcgm-exporter: ``gpu``, ``UUID``, ``device``,
``modelName``, ``Hostname``), plus the cluster label the scrape or federation adds.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, Literal

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
        raise ApplicationError(
            f"Prometheus answered {query!r} with a malformed sample {sample!r}",
            type="PrometheusBadResponse",
            non_retryable=True,
        ) from err


# dcgm-exporter's metrics for GPU faults. XID_ERRORS is a gauge holding the *last* XID's number (0: none since the
# exporter started); ROW_REMAP_FAILURE and ROW_REMAP_PENDING are 0/1 gauges; ECC_DBE_VOL_TOTAL counts double-bit
# errors since the driver loaded. XID_ERRORS and ROW_REMAP_FAILURE are in the exporter's default counters; the ECC
# and pending-remap fields must be enabled in its counters file.
DcgmMetric = Literal["DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "DCGM_FI_DEV_ROW_REMAP_FAILURE",
                     "DCGM_FI_DEV_ROW_REMAP_PENDING"]  # fmt: skip
XID_ERRORS: DcgmMetric = "DCGM_FI_DEV_XID_ERRORS"
ECC_DBE_VOLATILE: DcgmMetric = "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"
ROW_REMAP_FAILURE: DcgmMetric = "DCGM_FI_DEV_ROW_REMAP_FAILURE"
ROW_REMAP_PENDING: DcgmMetric = "DCGM_FI_DEV_ROW_REMAP_PENDING"
DCGM_FAULT_METRICS: tuple[DcgmMetric, ...] = (XID_ERRORS, ECC_DBE_VOLATILE, ROW_REMAP_FAILURE, ROW_REMAP_PENDING)
_LABEL = r"^[a-zA-Z_][a-zA-Z0-9_]*$"
MAX_FAULTS = 5000  # faults one answer carries (8 GPUs x 4 metrics x 150 nodes): a result stays far below 2 MB


class DcgmFaultsQuery(StrictModel):
    """The fault series of some nodes of one cluster, in one instant query."""

    cluster: str = Field(description="The cluster's name, matched against cluster_label.")
    nodes: list[str] = Field(min_length=1, max_length=1000, description="Kubernetes node names.")
    node_label: str = Field("Hostname", pattern=_LABEL, description="The series' label holding the node name.")
    cluster_label: str | None = Field("cluster", pattern=_LABEL, description="The series' label holding the "
                                      "cluster's name; None: the server holds one cluster's series.")  # fmt: skip
    metrics: list[DcgmMetric] = Field(default_factory=lambda: list(DCGM_FAULT_METRICS), min_length=1)
    timeout_seconds: float = Field(30, gt=0, le=300)


class GpuFault(StrictModel):
    """One series above zero: a GPU's last XID, its double-bit ECC count, a failed or pending row remap."""

    node: str
    metric: DcgmMetric
    value: float
    gpu: str | None = Field(None, description="The GPU's index on the node (the series' `gpu` label).")
    uuid: str | None = Field(None, description="The series' `UUID` label.")


class DcgmFaults(StrictModel):
    configured: bool = Field(description="False: the worker has no MILLWRIGHT_PROMETHEUS_URL; nothing was asked.")
    url: str | None = None
    query: str | None = None
    faults: list[GpuFault] = Field(default_factory=list, description=f"Above zero, by node (at most {MAX_FAULTS}).")
    series: int = Field(0, description="Series the query answered, those of other nodes included.")
    truncated: int = Field(0, description="Faults left out past MAX_FAULTS.")


def promql_string(value: str) -> str:
    """`value` as a PromQL double-quoted string literal (Go escapes: backslash and quote)."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def dcgm_faults_promql(q: DcgmFaultsQuery) -> str:
    """One selector for every fault metric (so each series keeps its name: `or` would match series of different
    metrics with the same labels and drop one), this cluster's, these nodes', above zero."""
    names = "|".join(re.escape(m) for m in q.metrics)
    matchers = [f"__name__=~{promql_string(names)}"]
    if q.cluster_label:
        matchers.append(f"{q.cluster_label}={promql_string(q.cluster)}")
    nodes = "|".join(re.escape(n) for n in sorted(set(q.nodes)))
    matchers.append(f"{q.node_label}=~{promql_string(nodes)}")
    return "{" + ", ".join(matchers) + "} > 0"


class PrometheusActivities:
    def __init__(self, *, url: str | None = None, ca_bundle: str | None = None, verify_tls: bool = True) -> None:
        """`url`: the server GPU faults are read from (the worker's MILLWRIGHT_PROMETHEUS_URL; None: not
        configured). `ca_bundle`, `verify_tls`: what every server's certificate is verified against (the worker's
        MILLWRIGHT_PROMETHEUS_CA_BUNDLE and MILLWRIGHT_PROMETHEUS_VERIFY_TLS)."""
        self._url = url
        self._ca_bundle, self._verify_tls = ca_bundle, verify_tls
        self._client: TrustingClient | None = None

    def activities(self) -> list[Callable]:
        return [self.query_prometheus, self.dcgm_faults]

    def _http(self) -> TrustingClient:
        if self._client is None:  # one client for every query, so connections are reused
            trust = Trust.resolve(PROMETHEUS_TLS_FIX, verify=self._verify_tls, ca_bundle=self._ca_bundle,
                                  setting="MILLWRIGHT_PROMETHEUS_CA_BUNDLE")  # fmt: skip
            # no retries in the transport: Temporal retries
            self._client = TrustingClient(
                trust,
                headers={"User-Agent": USER_AGENT},
                transport=httpx.AsyncHTTPTransport(retries=0, verify=trust.for_httpx()),
            )
        return self._client

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    @activity.defn
    async def query_prometheus(self, q: PrometheusQuery) -> list[float]:
        """Run an instant query; return the values of the resulting vector (a scalar as one value)."""
        kind, result = await self._instant(q)
        if kind == "vector" and isinstance(result, list):
            return [_number(s.get("value"), q.query) for s in result]
        if kind == "scalar":
            return [_number(result, q.query)]
        raise ApplicationError(
            f"Prometheus answered {q.query!r} with a {kind}; a gate needs an instant vector or a scalar",
            type="PrometheusBadResponse",
            non_retryable=True,
        )

    @activity.defn
    async def dcgm_faults(self, q: DcgmFaultsQuery) -> DcgmFaults:
        """The GPU fault series of `q.nodes` (one instant query at MILLWRIGHT_PROMETHEUS_URL), mapped to nodes by
        `q.node_label`; series of other nodes are counted, not returned. Not configured: `configured: false`."""
        if not self._url:
            return DcgmFaults(configured=False)
        promql = dcgm_faults_promql(q)
        kind, result = await self._instant(PrometheusQuery(url=self._url, query=promql,
                                                           timeout_seconds=q.timeout_seconds))  # fmt: skip
        if kind != "vector" or not isinstance(result, list):
            raise ApplicationError(f"Prometheus answered the GPU fault query with a {kind}, not an instant vector",
                                   type="PrometheusBadResponse", non_retryable=True)  # fmt: skip
        wanted = set(q.nodes)
        faults: list[GpuFault] = []
        for sample in result:
            labels = sample.get("metric") or {}
            node, metric = labels.get(q.node_label), labels.get("__name__")
            if node not in wanted or metric not in q.metrics:
                continue
            faults.append(GpuFault(node=node, metric=metric, value=_number(sample.get("value"), promql),
                                   gpu=labels.get("gpu"), uuid=labels.get("UUID")))  # fmt: skip
        faults.sort(key=lambda f: (f.node, f.gpu or "", f.metric))
        return DcgmFaults(configured=True, url=self._url, query=promql[:2000], faults=faults[:MAX_FAULTS],
                          series=len(result), truncated=max(0, len(faults) - MAX_FAULTS))  # fmt: skip

    async def _instant(self, q: PrometheusQuery) -> tuple[Any, Any]:
        """POST an instant query; (resultType, result) of a successful answer."""
        url = q.url.rstrip("/") + "/api/v1/query"
        http = self._http()
        try:
            response = await http.post(
                url, data={"query": q.query, "timeout": f"{q.timeout_seconds:g}s"}, timeout=q.timeout_seconds
            )
        except httpx.HTTPError as err:
            tls_failure = http.trust.failure(err, f"querying Prometheus at {q.url}")
            if tls_failure is not None:
                raise tls_failure from None
            raise ApplicationError(
                f"querying Prometheus at {q.url}: {type(err).__name__}: {err}", type="PrometheusUnavailable"
            ) from err
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
            raise ApplicationError(
                f"Prometheus at {q.url} answered with something that is not JSON",
                type="PrometheusBadResponse",
                non_retryable=True,
            ) from err
        if not isinstance(body, dict) or body.get("status") != "success":
            raise ApplicationError(
                f"Prometheus rejected {q.query!r}: {_error_text(response)}",
                type="PrometheusRejected",
                non_retryable=True,
            )
        data = body.get("data") or {}
        return data.get("resultType"), data.get("result")


__all__ = ["DcgmFaults", "DcgmFaultsQuery", "GpuFault", "PrometheusActivities", "PrometheusQuery"]
