"""Prometheus activities: one instant query, its vector as plain numbers (for rollout health gates); the GPU
faults NVIDIA's dcgm-exporter reports for a set of nodes (for the remediation sweep), in one query; one page of
time of GPUs held per tenant and KAI's queue gauges, in three range queries reduced to sums (for TenantUsage).

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
from datetime import datetime
from typing import Any, Literal

import httpx
from pydantic import Field, model_validator
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.models import BaseUrl, StrictModel
from activities.support.integration import (
    Integration,
    Parts,
    SystemSettings,
    ca_bundle_field,
    trust,
    verify_tls_field,
)
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


# GPU-hours per tenant (TenantUsage): dcgm-exporter labels each GPU's series with the pod, namespace and container
# using it (`-k`), so counting a GPU series that carries a pod, by namespace, is the GPUs allocated to each
# namespace; KAI's queue controller exports each queue's deserved (guaranteed) and allocated GPUs.
ALLOCATION_METRIC = "DCGM_FI_DEV_GPU_UTIL"  # a default counter: every GPU exports it at every scrape
# A MIG-enabled GPU's series are one per GPU instance (`GPU_I_PROFILE` such as `3g.40gb`); an instance is its compute
# slices (the profile's `<N>g`) over its GPU's. Compute slices per GPU, by the model in `modelName`: every model of the
# GPU operator's profile table (A100-40GB, A100-80GB, H100-80GB, H200-141GB) has 7 (its whole-GPU profile is 7g).
MIG_COMPUTE_SLICES = {"A100": 7, "H100": 7, "H200": 7}
MAX_POINTS = 11_000  # Prometheus refuses a range query with more points per series
MAX_UNATTRIBUTED = 200  # namespaces outside any tenant a page lists by name; the rest are summed


class UsagePageQuery(StrictModel):
    """One page of time of one cluster, asked of MILLWRIGHT_PROMETHEUS_URL in three range queries."""

    cluster: str
    start: datetime = Field(description="The page's first evaluation time (UTC).")
    end: datetime = Field(description="The page's end, exclusive: points at start, start+step, ... before end.")
    step_seconds: int = Field(ge=1, le=3600)
    tenants: dict[str, list[str]] = Field(description="Tenant -> its namespaces.")
    queues: dict[str, str] = Field(default_factory=dict, description="KAI queue -> the tenant it belongs to.")
    cluster_label: str | None = Field("cluster", pattern=_LABEL)
    timeout_seconds: float = Field(60, gt=0, le=300)

    @model_validator(mode="after")
    def _within_limits(self) -> UsagePageQuery:
        points = (self.end - self.start).total_seconds() / self.step_seconds
        if not 1 <= points <= MAX_POINTS:
            raise ValueError(f"a page holds 1 to {MAX_POINTS} steps; this one {points:g}")
        return self


class GpuUse(StrictModel):
    gpu_seconds: float = Field(0.0, description="Whole-GPU seconds: a MIG instance counts as its share of its GPU.")
    peak_gpus: float = Field(0.0, description="The most GPUs held at once, at the page's steps.")
    mig_gpu_seconds: float = Field(0.0, description="The part of `gpu_seconds` held as MIG instances.")


class QueueUse(StrictModel):
    guaranteed_gpus: float | None = Field(None, description="kai_queue_deserved_gpus at the page's last step.")
    allocated_peak_gpus: float | None = Field(None, description="The highest kai_queue_allocated_gpus.")


class UsagePage(StrictModel):
    configured: bool = Field(description="False: the worker has no MILLWRIGHT_PROMETHEUS_URL; nothing was asked.")
    tenants: dict[str, GpuUse] = Field(default_factory=dict)
    queues: dict[str, QueueUse] = Field(default_factory=dict, description="By tenant.")
    unattributed: dict[str, GpuUse] = Field(default_factory=dict, description="By namespace outside every tenant "
                                            f"(the {MAX_UNATTRIBUTED} largest; the rest under '(others)').")  # fmt: skip
    unweighted_mig_models: list[str] = Field(
        default_factory=list, description="Models not in MIG_COMPUTE_SLICES: their MIG instances counted as whole GPUs."
    )


def _matchers(q: UsagePageQuery, *more: str) -> str:
    found = [f"{q.cluster_label}={promql_string(q.cluster)}"] if q.cluster_label else []
    return "{" + ", ".join([*found, *more]) + "}"


def usage_promql(q: UsagePageQuery) -> tuple[str, str, str]:
    """GPUs held by namespace; KAI's deserved and allocated GPUs by queue."""
    return (
        f"count by (namespace, GPU_I_PROFILE, modelName) "
        f"({ALLOCATION_METRIC}{_matchers(q, 'pod!=' + promql_string(''))})",
        f"max by (queue_name) (kai_queue_deserved_gpus{_matchers(q)})",
        f"max by (queue_name) (kai_queue_allocated_gpus{_matchers(q)})",
    )


def mig_share(profile: str, model: str) -> float | None:
    """The part of its GPU a MIG instance is (`3g.40gb` of an H100: 3/7); None: a model MIG_COMPUTE_SLICES lacks."""
    slices = next((n for name, n in MIG_COMPUTE_SLICES.items() if name in model.upper()), None)
    compute = re.match(r"(\d+)g\.", profile)
    if slices is None or compute is None:
        return None
    return int(compute[1]) / slices


def _per_step(result: Any, label: str, query: str,
              weight: Callable[[dict[str, str]], float] = lambda _: 1.0) -> dict[str, dict[float, float]]:  # fmt: skip
    """label value -> timestamp -> value (times the series' `weight`), from a matrix."""
    if not isinstance(result, list):
        raise ApplicationError(f"Prometheus answered {query!r} with no matrix", type="PrometheusBadResponse",
                               non_retryable=True)  # fmt: skip
    out: dict[str, dict[float, float]] = {}
    for series in result:
        labels = series.get("metric") or {}
        points, w = out.setdefault(labels.get(label, ""), {}), weight(labels)
        for point in series.get("values") or []:
            points[float(point[0])] = points.get(float(point[0]), 0.0) + _number(point, query) * w
    return out


def _use(steps: list[dict[float, float]], on_mig: list[dict[float, float]], step: int) -> GpuUse:
    held: dict[float, float] = {}
    for points in steps:
        for ts, gpus in points.items():
            held[ts] = held.get(ts, 0.0) + gpus
    return GpuUse(gpu_seconds=sum(held.values()) * step, peak_gpus=max(held.values(), default=0.0),
                  mig_gpu_seconds=sum(sum(points.values()) for points in on_mig) * step)  # fmt: skip


class PrometheusActivities:
    def __init__(self, *, url: str | None = None, ca_bundle: str | None = None, verify_tls: bool = True) -> None:
        """`url`: the server GPU faults are read from (the worker's MILLWRIGHT_PROMETHEUS_URL; None: not
        configured). `ca_bundle`, `verify_tls`: what every server's certificate is verified against (the worker's
        MILLWRIGHT_PROMETHEUS_CA_BUNDLE and MILLWRIGHT_PROMETHEUS_VERIFY_TLS)."""
        self._url = url
        self._ca_bundle, self._verify_tls = ca_bundle, verify_tls
        self._client: TrustingClient | None = None

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

    @activity.defn
    async def gpu_usage_page(self, q: UsagePageQuery) -> UsagePage:
        """GPU-seconds and peak GPUs per tenant (its namespaces' pods) and per namespace outside every tenant, and
        KAI's guaranteed and allocated GPUs per tenant, over one page of time, from MILLWRIGHT_PROMETHEUS_URL.
        Each step counts the GPUs held at that instant for the whole step. Not configured: `configured: false`."""
        if not self._url:
            return UsagePage(configured=False)
        held_q, deserved_q, allocated_q = usage_promql(q)
        window = {"start": f"{q.start.timestamp():.3f}", "end": f"{q.end.timestamp() - q.step_seconds / 2:.3f}",
                  "step": f"{q.step_seconds}s", "timeout": f"{q.timeout_seconds:g}s"}  # fmt: skip
        answers = []
        for query in (held_q, deserved_q, allocated_q):
            _, result = await self._ask(self._url, "query_range", {**window, "query": query}, query, q.timeout_seconds)
            answers.append(result)
        unweighted: set[str] = set()

        def share(labels: dict[str, str]) -> float:
            if not labels.get("GPU_I_PROFILE"):
                return 1.0
            part = mig_share(labels["GPU_I_PROFILE"], labels.get("modelName", ""))
            if part is None:
                unweighted.add(labels.get("modelName") or "(no modelName)")
            return 1.0 if part is None else part

        held = _per_step(answers[0], "namespace", held_q, share)
        on_mig = _per_step(answers[0], "namespace", held_q, lambda m: share(m) if m.get("GPU_I_PROFILE") else 0.0)

        def use(namespaces: list[str]) -> GpuUse:
            return _use([held[ns] for ns in namespaces if ns in held], [on_mig[ns] for ns in namespaces
                                                                        if ns in on_mig], q.step_seconds)  # fmt: skip

        owner = {ns: tenant for tenant, namespaces in q.tenants.items() for ns in namespaces}
        page = UsagePage(configured=True, unweighted_mig_models=sorted(unweighted))
        for tenant, namespaces in q.tenants.items():
            page.tenants[tenant] = use(namespaces)
        outside = sorted(((ns, use([ns])) for ns in held if ns not in owner), key=lambda item: -item[1].gpu_seconds)
        page.unattributed = dict(outside[:MAX_UNATTRIBUTED])
        if len(outside) > MAX_UNATTRIBUTED:
            page.unattributed["(others)"] = use([ns for ns, _ in outside[MAX_UNATTRIBUTED:]])
        deserved = _per_step(answers[1], "queue_name", deserved_q)
        allocated = _per_step(answers[2], "queue_name", allocated_q)
        for queue, tenant in q.queues.items():
            if queue in deserved or queue in allocated:
                last = deserved.get(queue) or {}
                page.queues[tenant] = QueueUse(
                    guaranteed_gpus=last[max(last)] if last else None,
                    allocated_peak_gpus=max((allocated.get(queue) or {}).values(), default=None),
                )
        return page

    async def _instant(self, q: PrometheusQuery) -> tuple[Any, Any]:
        """POST an instant query; (resultType, result) of a successful answer."""
        return await self._ask(q.url, "query", {"query": q.query, "timeout": f"{q.timeout_seconds:g}s"}, q.query,
                               q.timeout_seconds)  # fmt: skip

    async def _ask(self, url: str, endpoint: str, form: dict[str, str], query: str, timeout: float) -> tuple[Any, Any]:
        """POST to /api/v1/<endpoint>; (resultType, result) of a successful answer."""
        http = self._http()
        try:
            response = await http.post(url.rstrip("/") + f"/api/v1/{endpoint}", data=form, timeout=timeout)
        except httpx.HTTPError as err:
            tls_failure = http.trust.failure(err, f"querying Prometheus at {url}")
            if tls_failure is not None:
                raise tls_failure from None
            raise ApplicationError(
                f"querying Prometheus at {url}: {type(err).__name__}: {err}", type="PrometheusUnavailable"
            ) from err
        if response.status_code == 429 or response.status_code >= 500:
            raise ApplicationError(
                f"querying Prometheus at {url}: {response.status_code}: {_error_text(response)}",
                type="PrometheusUnavailable",
            )
        if response.status_code >= 400:
            raise ApplicationError(
                f"Prometheus rejected {query!r}: {response.status_code}: {_error_text(response)}",
                type="PrometheusRejected",
                non_retryable=True,
            )
        try:
            body = response.json()
        except ValueError as err:
            raise ApplicationError(
                f"Prometheus at {url} answered with something that is not JSON",
                type="PrometheusBadResponse",
                non_retryable=True,
            ) from err
        if not isinstance(body, dict) or body.get("status") != "success":
            raise ApplicationError(
                f"Prometheus rejected {query!r}: {_error_text(response)}",
                type="PrometheusRejected",
                non_retryable=True,
            )
        data = body.get("data") or {}
        return data.get("resultType"), data.get("result")


__all__ = ["DcgmFaults", "DcgmFaultsQuery", "GpuFault", "GpuUse", "PrometheusActivities", "PrometheusQuery",
           "QueueUse", "UsagePage", "UsagePageQuery", "mig_share"]  # fmt: skip


class PrometheusSettings(SystemSettings):
    prometheus_url: BaseUrl | None = Field(
        None,
        description="Prometheus base URL the remediation sweep reads dcgm-exporter's GPU fault series from, "
        "e.g. http://prometheus:9090 (none: the sweep does not use that signal, and says so)",
    )
    prometheus_ca_bundle: str | None = ca_bundle_field("Prometheus servers'")
    prometheus_verify_tls: bool = verify_tls_field("Prometheus servers")


class Prometheus(Integration[PrometheusSettings]):
    name = "Prometheus"
    settings = PrometheusSettings
    packages = ("activities.prometheus",)

    def build(self, settings: PrometheusSettings) -> Parts:
        # A gate's server URL comes with its query; GPU faults come from MILLWRIGHT_PROMETHEUS_URL (none: not used).
        # What a certificate is verified against is the worker's.
        prometheus = PrometheusActivities(
            url=settings.prometheus_url,
            ca_bundle=settings.ca_bundle("prometheus"),
            verify_tls=settings.prometheus_verify_tls,
        )
        return Parts([prometheus], [prometheus])

    def describe(self, settings: PrometheusSettings) -> str:
        return (
            f"GPU faults from {settings.prometheus_url or 'nowhere (MILLWRIGHT_PROMETHEUS_URL not set)'}, "
            f"a gate's URL with its query, {trust(settings.prometheus_verify_tls, settings.prometheus_ca_bundle)}"
        )
