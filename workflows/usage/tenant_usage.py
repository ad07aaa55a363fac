"""TenantUsage: GPU-hours per tenant of one cluster over one period, from dcgm-exporter's allocation series in
Prometheus joined to the tenants' namespaces (the ResourceQuotas onboarding labels with the tenant), beside each
tenant's guaranteed and allocated GPUs from KAI; GPU-hours of pods outside every tenant are reported, not dropped.
A MIG instance counts as its compute slices' share of its GPU, so GPU-hours stay in whole-GPU units.

  tenants' namespaces and queues (Kubernetes) → pages of time (Prometheus range queries, one activity each) →
  the table (result, `usage` query, `progress`) → gauge per tenant → report files (the worker's sink: a directory
  or an object store)
  → a NetBox journal entry on each tenant (tenants NetBox does not hold, or no NetBox, are named in the result)

Paging: each page is a few range queries of `page / step` points (Prometheus refuses more than 11,000 per series)
whose answer the activity reduces to sums per tenant and namespace, so what comes back to the workflow is a few KB
per page however many GPUs the fleet has: a month at 60 s steps and 6 h pages is 120 activities.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from pydantic import Field, field_validator, model_validator
from temporalio import workflow
from temporalio.common import SearchAttributePair
from temporalio.exceptions import ActivityError, ApplicationError

from activities.capi.activities import ClusterApiActivities
from activities.capi.models import KindRef, ListRequest
from activities.capi.ownership import TENANT_LABEL
from activities.netbox.activities import NetBoxActivities
from activities.netbox.models import TenantJournal
from activities.prometheus import GpuUse, PrometheusActivities, UsagePage, UsagePageQuery
from activities.usage_report import ReportFiles, TenantUsageRow, UsageReport, UsageReportActivities
from workflows.clusters.manifests import QUEUE_API
from workflows.common import search_attributes as sa
from workflows.common.base import Phases, Progress, WorkflowInput
from workflows.common.call_options import API_CALL
from workflows.common.endpoints import NETBOX, Endpoints, RetryTimeout, gave_up_on, kubernetes_api

PROMETHEUS = "prometheus"
USAGE_SINK = "usage sink"
_NO_NETBOX = "NetBoxNotConfigured"  # the worker's answer when it has no NetBox: no tenant's entry is written
UNATTRIBUTED = "(unattributed) "


class TenantUsageInput(WorkflowInput, RetryTimeout):
    cluster: str = Field(description="The cluster (kubeconfig context; the `cluster` label of its series).")
    start: datetime | None = Field(None, description="The period's start (UTC); none: `end` minus `period`.")
    end: datetime | None = Field(None, description="The period's end, exclusive (UTC); none: the run's start "
                                 "rounded down to the hour (a daily Schedule reports the 24 hours before).")  # fmt: skip
    period: timedelta = Field(timedelta(days=1), description="The period's length when `start` is not given.")
    step: timedelta = Field(timedelta(seconds=60), description="Resolution: the GPUs held at each step count for "
                            "the whole step (at most the scrape interval to count every pod).")  # fmt: skip
    page: timedelta = Field(timedelta(hours=6), description="Time asked of Prometheus per activity.")
    cluster_label: str | None = Field("cluster", description="The series' label holding the cluster's name; None: "
                                      "the server holds this cluster's series only.")  # fmt: skip
    record_in_netbox: bool = Field(True, description="Journal each tenant's GPU-hours on its NetBox tenant.")

    @field_validator("step")
    @classmethod
    def _whole_seconds(cls, v: timedelta) -> timedelta:
        if v.total_seconds() < 1 or v.total_seconds() > 3600 or v.total_seconds() != int(v.total_seconds()):
            raise ValueError("step must be whole seconds, 1 s to 1 h")
        return v

    @model_validator(mode="after")
    def _pages_fit(self) -> TenantUsageInput:
        steps = self.page / self.step
        if steps < 1 or steps > 11_000 or steps != int(steps):
            raise ValueError(f"page must be a whole number of steps, 1 to 11000 (Prometheus's limit); it is {steps:g}")
        if self.start is not None and self.end is not None and self.end <= self.start:
            raise ValueError("end must come after start")
        return self

    def workflow_id(self) -> str:
        when = f"{self.start.isoformat()}" if self.start else "latest"
        return f"tenant-usage/{self.cluster}/{when}"

    def search_attributes(self) -> list[SearchAttributePair]:
        return [SearchAttributePair(sa.CLUSTER, self.cluster)]


class TenantUsageResult(UsageReport):
    pages: int = 0
    report: ReportFiles | None = Field(None, description="Where the report was written (the worker's sink).")
    prometheus: str = Field("", description="`not used: ...` when the worker has no MILLWRIGHT_PROMETHEUS_URL.")
    netbox_journal: dict[str, str] = Field(default_factory=dict, description="Tenant -> `entry <id>`, or why its "
                                           "NetBox journal entry was not written (no such tenant, no NetBox).")  # fmt: skip


def _utc(t: datetime) -> datetime:
    return t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)


def _add(total: GpuUse, page: GpuUse) -> None:
    total.gpu_seconds += page.gpu_seconds
    total.mig_gpu_seconds += page.mig_gpu_seconds
    total.peak_gpus = max(total.peak_gpus, page.peak_gpus)


@workflow.defn
class TenantUsage:
    @workflow.init
    def __init__(self, inp: TenantUsageInput) -> None:
        self._phases = Phases()
        self._calls = Endpoints(inp.retry_timeout, shown=self._phases.waiting)
        self._table: TenantUsageResult | None = None

    @workflow.query(description="Phase, pages done, and the table so far in `details`.")
    def progress(self) -> Progress:
        return self._phases.progress

    @workflow.query(description="The table so far (GPU-hours per tenant and unattributed namespace).")
    def usage(self) -> TenantUsageResult | None:
        return self._table

    @workflow.run
    async def run(self, inp: TenantUsageInput) -> TenantUsageResult:
        end = _utc(inp.end) if inp.end else workflow.now().replace(minute=0, second=0, microsecond=0)
        start = _utc(inp.start) if inp.start else end - inp.period
        end = start + ((end - start) // inp.step) * inp.step  # whole steps
        step = int(inp.step.total_seconds())
        self._phases.enter("reading", f"tenants of {inp.cluster}")
        tenants, queues = await self._tenants(inp)
        pages = [(t, min(t + inp.page, end)) for t in _page_starts(start, end, inp.page)]
        used = {t: GpuUse() for t in tenants}
        outside: dict[str, GpuUse] = {}
        guaranteed: dict[str, float | None] = {}
        allocated: dict[str, float | None] = {}
        table = TenantUsageResult(cluster=inp.cluster, start=start, end=end, step_seconds=step, rows=[])
        for i, (page_start, page_end) in enumerate(pages):
            self._phases.enter("measuring", self._summary(table), done=i, total=len(pages))
            page: UsagePage = await self._calls.execute(
                PrometheusActivities.gpu_usage_page,
                UsagePageQuery(cluster=inp.cluster, start=page_start, end=page_end, step_seconds=step, tenants=tenants,
                               queues=queues, cluster_label=inp.cluster_label),
                **API_CALL, endpoint=PROMETHEUS, summary=f"GPU use {page_start:%Y-%m-%d %H:%M} to {page_end:%H:%M}",
            )  # fmt: skip
            if not page.configured:
                table.prometheus = "not used: the worker has no MILLWRIGHT_PROMETHEUS_URL"
                break
            table.unweighted_mig_models = sorted(set(table.unweighted_mig_models) | set(page.unweighted_mig_models))
            for tenant, use in page.tenants.items():
                _add(used[tenant], use)
            for namespace, use in page.unattributed.items():
                _add(outside.setdefault(namespace, GpuUse()), use)
            for tenant, queue in page.queues.items():
                if queue.guaranteed_gpus is not None:
                    guaranteed[tenant] = queue.guaranteed_gpus
                if queue.allocated_peak_gpus is not None:
                    allocated[tenant] = max(allocated.get(tenant) or 0.0, queue.allocated_peak_gpus)
            table = self._tabulate(table, tenants, used, outside, guaranteed, allocated, i + 1)
            self._table = table
        self._phases.enter("reporting", self._summary(table), done=len(pages), total=len(pages))
        gauge = workflow.metric_meter().create_gauge_float(
            "millwright_tenant_gpu_hours", "GPU-hours of a tenant over the last reported period", "h"
        )
        for row in table.rows:
            if not row.tenant.startswith(UNATTRIBUTED):
                gauge.set(row.gpu_hours, {"tenant": row.tenant, "cluster": inp.cluster})
        table.report = await self._calls.execute(  # a sink down past retry_timeout fails the run: no report
            UsageReportActivities.write_usage_report,
            UsageReport.model_validate(table.model_dump(include=set(UsageReport.model_fields))),
            **API_CALL, endpoint=USAGE_SINK, summary="usage report to the sink",
        )  # fmt: skip
        self._table = table
        if inp.record_in_netbox and workflow.patched("usage-tenant-journal"):
            self._phases.enter("journaling", self._summary(table), done=len(pages), total=len(pages))
            table.netbox_journal = await self._journal(table)
        self._phases.enter("completed", self._summary(table), done=len(pages), total=len(pages))
        return table

    async def _journal(self, table: TenantUsageResult) -> dict[str, str]:
        """One entry per tenant row. A tenant NetBox lacks (onboarded without NetBox), a worker without NetBox or a
        NetBox down past the retry bound is said in the result rather than failing a report already written."""
        tenants = [row for row in table.rows if not row.tenant.startswith(UNATTRIBUTED)]
        written: dict[str, str] = {}
        for row in tenants:
            text = (
                f"GPU-hours on {table.cluster} from {table.start:%Y-%m-%d %H:%M} to {table.end:%Y-%m-%d %H:%M} "
                f"UTC: {row.gpu_hours:.2f} (peak {row.peak_gpus:g} GPUs; namespaces {', '.join(row.namespaces)})"
            )
            try:
                entry = await self._calls.execute(
                    NetBoxActivities.journal_tenant, TenantJournal(tenant=row.tenant, text=text), **API_CALL,
                    endpoint=NETBOX, summary=f"NetBox journal of {row.tenant}",
                )  # fmt: skip
            except (ActivityError, ApplicationError) as err:
                cause = err.cause if isinstance(err, ActivityError) else err
                if gave_up_on(err, NETBOX) or (isinstance(cause, ApplicationError) and cause.type == _NO_NETBOX):
                    why = f"not written: {cause.message if isinstance(cause, ApplicationError) else cause}"
                    return written | {r.tenant: why for r in tenants if r.tenant not in written}  # same for the rest
                if not isinstance(cause, ApplicationError) or cause.type != "TenantNotFound":
                    raise
                written[row.tenant] = f"not written: {cause.message}"
                continue
            written[row.tenant] = f"entry {entry}"
        return written

    async def _tenants(self, inp: TenantUsageInput) -> tuple[dict[str, list[str]], dict[str, str]]:
        """Tenant -> its namespaces (those holding the tenant's ResourceQuota), and KAI queue -> tenant."""
        objects = await self._calls.execute(
            ClusterApiActivities.read_tenant_quota_objects,
            ListRequest(cluster=inp.cluster, kinds=[KindRef(api_version=QUEUE_API, kind="Queue"),
                                                    KindRef(api_version="v1", kind="ResourceQuota")],
                        label_selector=TENANT_LABEL),
            **API_CALL, endpoint=kubernetes_api(inp.cluster), summary="tenants' namespaces and queues",
        )  # fmt: skip
        tenants: dict[str, list[str]] = {}
        queues: dict[str, str] = {}
        for o in objects:
            md = o["metadata"]
            tenant = md["labels"][TENANT_LABEL]
            if o["kind"] == "Queue":
                queues[md["name"]] = tenant
                tenants.setdefault(tenant, [])
            elif md["namespace"] not in tenants.setdefault(tenant, []):
                tenants[tenant].append(md["namespace"])
        return {t: sorted(ns) for t, ns in sorted(tenants.items())}, queues

    @staticmethod
    def _tabulate(table: TenantUsageResult, tenants: dict[str, list[str]], used: dict[str, GpuUse],
                  outside: dict[str, GpuUse], guaranteed: dict[str, float | None],
                  allocated: dict[str, float | None], pages: int) -> TenantUsageResult:  # fmt: skip
        rows = [TenantUsageRow(tenant=t, namespaces=namespaces, gpu_hours=used[t].gpu_seconds / 3600,
                               mig_gpu_hours=used[t].mig_gpu_seconds / 3600, peak_gpus=used[t].peak_gpus,
                               guaranteed_gpus=guaranteed.get(t), allocated_peak_gpus=allocated.get(t))
                for t, namespaces in tenants.items()]  # fmt: skip
        loose = sorted(outside.items(), key=lambda item: (-item[1].gpu_seconds, item[0]))
        rows += [TenantUsageRow(tenant=UNATTRIBUTED + ns, namespaces=[ns], gpu_hours=use.gpu_seconds / 3600,
                                mig_gpu_hours=use.mig_gpu_seconds / 3600, peak_gpus=use.peak_gpus)
                 for ns, use in loose]  # fmt: skip
        unattributed = sum(use.gpu_seconds for use in outside.values()) / 3600
        return table.model_copy(update={"rows": rows, "pages": pages, "unattributed_gpu_hours": unattributed,
                                        "total_gpu_hours": sum(r.gpu_hours for r in rows)})  # fmt: skip

    @staticmethod
    def _summary(table: TenantUsageResult) -> str:
        cells = [f"{r.tenant} {r.gpu_hours:.2f}" for r in table.rows[:20]]
        return f"GPU-hours {table.start:%Y-%m-%d %H:%M} to {table.end:%Y-%m-%d %H:%M}: " + (", ".join(cells) or "none")


def _page_starts(start: datetime, end: datetime, page: timedelta) -> list[datetime]:
    out, t = [], start
    while t < end:
        out.append(t)
        t += page
    return out
