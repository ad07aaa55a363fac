"""The GPU-hours report (TenantUsage) written to the worker's sink, ``MILLWRIGHT_USAGE_SINK``: one JSON and one CSV
file per cluster and period, ``<cluster>/<start>--<end>.{json,csv}`` (UTC, ISO 8601 with ``-`` for ``:``), under a
directory or, for ``s3://bucket/prefix``, under that prefix of an S3-compatible object store
(activities/object_store.py). Writing again replaces both (a directory's files are written to a temporary file,
then renamed; an object is PUT whole), so a retried or re-run report leaves one copy. No sink configured: nothing
is written and the answer says so."""

from __future__ import annotations

import csv
import io
import json
import os
import tempfile
from datetime import datetime
from pathlib import Path

import httpx
from pydantic import Field, ValidationError
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities import object_store
from activities.models import BaseUrl, StrictModel
from activities.object_store import ObjectStore
from activities.support.integration import ConfigError, Integration, Parts, SystemSettings, secret_ref


class TenantUsageRow(StrictModel):
    tenant: str = Field(description="A tenant, or `(unattributed) <namespace>` for pods outside every tenant.")
    namespaces: list[str] = Field(default_factory=list)
    gpu_hours: float = Field(0.0, description="In whole-GPU units: a MIG instance counts as its share of its GPU.")
    mig_gpu_hours: float = Field(0.0, description="The part of `gpu_hours` held as MIG instances.")
    peak_gpus: float = Field(0.0, description="The most GPUs held at once (at the report's step, within a page).")
    guaranteed_gpus: float | None = Field(None, description="KAI's deserved GPUs of the tenant's queue, at the end.")
    allocated_peak_gpus: float | None = Field(None, description="The highest KAI allocated GPUs of its queue.")


class UsageReport(StrictModel):
    cluster: str
    start: datetime
    end: datetime
    step_seconds: int
    rows: list[TenantUsageRow] = Field(description="Tenants by name, then unattributed namespaces by GPU-hours.")
    unattributed_gpu_hours: float = Field(0.0, description="GPU-hours of pods outside every tenant's namespaces.")
    total_gpu_hours: float = 0.0
    unweighted_mig_models: list[str] = Field(default_factory=list, description="GPU models of unknown compute "
                                             "slices: their MIG instances counted as whole GPUs.")  # fmt: skip


class ReportFiles(StrictModel):
    written: bool = Field(description="False: the worker has no MILLWRIGHT_USAGE_SINK; nothing was written.")
    json_path: str | None = Field(None, description="A file's path, or an object's s3:// URL.")
    csv_path: str | None = Field(None, description="A file's path, or an object's s3:// URL.")


def _stamp(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H-%M-%SZ")


def report_csv(report: UsageReport) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["cluster", "start", "end", "tenant", "namespaces", "gpu_hours", "mig_gpu_hours", "peak_gpus",
                     "guaranteed_gpus", "allocated_peak_gpus"])  # fmt: skip
    for row in report.rows:
        writer.writerow([report.cluster, report.start.isoformat(), report.end.isoformat(), row.tenant,
                         " ".join(row.namespaces), f"{row.gpu_hours:.6f}", f"{row.mig_gpu_hours:.6f}",
                         f"{row.peak_gpus:g}", "" if row.guaranteed_gpus is None else f"{row.guaranteed_gpus:g}",
                         "" if row.allocated_peak_gpus is None else f"{row.allocated_peak_gpus:g}"])  # fmt: skip
    return out.getvalue()


def _replace(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}-")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


class UsageReportActivities:
    def __init__(self, sink_dir: str | None = None, store: ObjectStore | None = None) -> None:
        """The worker's MILLWRIGHT_USAGE_SINK: `sink_dir`, a directory, or `store`, an object store (neither:
        reports are not written)."""
        self._sink = Path(sink_dir) if sink_dir else None
        self._store = store
        self._http: httpx.AsyncClient | None = None

    async def close(self) -> None:
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    @activity.defn
    async def write_usage_report(self, report: UsageReport) -> ReportFiles:
        """The report as JSON and CSV in the sink, replacing an earlier copy of the same period."""
        name = f"{report.cluster}/{_stamp(report.start)}--{_stamp(report.end)}"
        as_json = json.dumps(report.model_dump(mode="json"), indent=2) + "\n"
        if self._store is not None:
            if self._http is None:  # one client for every report, so connections are reused
                self._http = object_store.client()
            return ReportFiles(
                written=True,
                json_path=await object_store.put_object(self._store, self._http, f"{name}.json", as_json.encode(),
                                                        "application/json"),
                csv_path=await object_store.put_object(self._store, self._http, f"{name}.csv",
                                                       report_csv(report).encode(), "text/csv"),
            )  # fmt: skip
        if self._sink is None:
            return ReportFiles(written=False)
        base = self._sink / name
        try:
            base.parent.mkdir(parents=True, exist_ok=True)
            _replace(base.with_suffix(".json"), as_json)
            _replace(base.with_suffix(".csv"), report_csv(report))
        except PermissionError as err:
            raise ApplicationError(f"cannot write the usage report under {self._sink}: {err}",
                                   type="UsageSinkNotWritable", non_retryable=True) from err  # fmt: skip
        return ReportFiles(
            written=True, json_path=str(base.with_suffix(".json")), csv_path=str(base.with_suffix(".csv"))
        )


class UsageReportSettings(SystemSettings):
    usage_sink: str | None = Field(
        None,
        description="Where TenantUsage writes its GPU-hours reports, <cluster>/<period>.json and .csv: a directory, "
        "or s3://bucket/prefix in an S3-compatible object store (none: reports are in the run's result only)",
    )
    usage_sink_dir: str | None = Field(None, description="A directory for usage reports (MILLWRIGHT_USAGE_SINK's "
                                       "earlier name, still read)")  # fmt: skip
    usage_sink_endpoint: BaseUrl | None = Field(
        None, description="The object store's URL for an s3:// sink not on AWS (MinIO, Ceph RGW); none: AWS S3's"
    )
    usage_sink_region: str = Field("us-east-1", description="The s3:// sink's region (signed into each request)")
    usage_sink_credentials: str | None = Field(
        None, description="Secret reference (env:NAME or file:/path) to '<access key id>:<secret access key>' of "
        "the s3:// sink (never the keys themselves)",
    )  # fmt: skip

    def usage_sink_config(self) -> tuple[str | None, ObjectStore | None]:
        """(directory, object store) of MILLWRIGHT_USAGE_SINK (or MILLWRIGHT_USAGE_SINK_DIR), at most one set."""
        if self.usage_sink and self.usage_sink_dir:
            raise ConfigError("MILLWRIGHT_USAGE_SINK and MILLWRIGHT_USAGE_SINK_DIR are both set: keep one")
        sink = self.usage_sink or self.usage_sink_dir
        if not sink or "://" not in sink:
            if self.usage_sink_credentials or self.usage_sink_endpoint:
                raise ConfigError("MILLWRIGHT_USAGE_SINK_CREDENTIALS and _ENDPOINT are for an s3:// sink; the sink is "
                                  f"{'a directory' if sink else 'not set'}")  # fmt: skip
            return sink, None
        if not self.usage_sink_credentials:
            raise ConfigError(f"MILLWRIGHT_USAGE_SINK is {sink}: MILLWRIGHT_USAGE_SINK_CREDENTIALS is not set")
        credentials = secret_ref(self.usage_sink_credentials, "MILLWRIGHT_USAGE_SINK_CREDENTIALS")
        try:
            return None, ObjectStore.from_url(sink, endpoint=self.usage_sink_endpoint, region=self.usage_sink_region,
                                              credentials=credentials)  # fmt: skip
        except ValidationError as err:
            raise ConfigError(
                f"MILLWRIGHT_USAGE_SINK: {err.errors()[0]['msg'].removeprefix('Value error, ')}"
            ) from None
        except ValueError as err:
            raise ConfigError(f"MILLWRIGHT_USAGE_SINK: {err}") from None


class UsageReports(Integration[UsageReportSettings]):
    name = "Usage reports"
    settings = UsageReportSettings
    packages = ("activities.usage_report",)

    def build(self, settings: UsageReportSettings) -> Parts:
        usage = UsageReportActivities(*settings.usage_sink_config())
        return Parts([usage], [usage])

    def describe(self, settings: UsageReportSettings) -> str:
        sink = settings.usage_sink or settings.usage_sink_dir or "nowhere (MILLWRIGHT_USAGE_SINK not set)"
        if (settings.usage_sink or "").startswith("s3://"):
            return f"to {sink} at {settings.usage_sink_endpoint or 'AWS S3'}, credentials {settings.usage_sink_credentials}"
        return f"to {sink}"
