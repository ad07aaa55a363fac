"""The GPU-hours report (TenantUsage) written to the worker's sink directory, ``MILLWRIGHT_USAGE_SINK_DIR``: one
JSON and one CSV file per cluster and period, ``<dir>/<cluster>/<start>--<end>.{json,csv}`` (UTC, ISO 8601 with
``-`` for ``:``). Writing again replaces both (written to a temporary file, then renamed), so a retried or re-run
report leaves one copy. No directory configured: nothing is written and the answer says so."""

from __future__ import annotations

import csv
import io
import json
import os
import tempfile
from datetime import datetime
from pathlib import Path

from pydantic import Field
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.models import StrictModel
from activities.support.integration import Integration, Parts, SystemSettings


class TenantUsageRow(StrictModel):
    tenant: str = Field(description="A tenant, or `(unattributed) <namespace>` for pods outside every tenant.")
    namespaces: list[str] = Field(default_factory=list)
    gpu_hours: float = 0.0
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


class ReportFiles(StrictModel):
    written: bool = Field(description="False: the worker has no MILLWRIGHT_USAGE_SINK_DIR; nothing was written.")
    json_path: str | None = None
    csv_path: str | None = None


def _stamp(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H-%M-%SZ")


def report_csv(report: UsageReport) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["cluster", "start", "end", "tenant", "namespaces", "gpu_hours", "peak_gpus", "guaranteed_gpus",
                     "allocated_peak_gpus"])  # fmt: skip
    for row in report.rows:
        writer.writerow([report.cluster, report.start.isoformat(), report.end.isoformat(), row.tenant,
                         " ".join(row.namespaces), f"{row.gpu_hours:.6f}", f"{row.peak_gpus:g}",
                         "" if row.guaranteed_gpus is None else f"{row.guaranteed_gpus:g}",
                         "" if row.allocated_peak_gpus is None else f"{row.allocated_peak_gpus:g}"])  # fmt: skip
    return out.getvalue()


def _replace(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}-")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


class UsageReportActivities:
    def __init__(self, sink_dir: str | None = None) -> None:
        """`sink_dir`: the worker's MILLWRIGHT_USAGE_SINK_DIR (None: reports are not written)."""
        self._sink = Path(sink_dir) if sink_dir else None

    @activity.defn
    async def write_usage_report(self, report: UsageReport) -> ReportFiles:
        """The report as JSON and CSV under the sink directory, replacing an earlier copy of the same period."""
        if self._sink is None:
            return ReportFiles(written=False)
        folder = self._sink / report.cluster
        base = folder / f"{_stamp(report.start)}--{_stamp(report.end)}"
        try:
            folder.mkdir(parents=True, exist_ok=True)
            _replace(base.with_suffix(".json"), json.dumps(report.model_dump(mode="json"), indent=2) + "\n")
            _replace(base.with_suffix(".csv"), report_csv(report))
        except PermissionError as err:
            raise ApplicationError(f"cannot write the usage report under {self._sink}: {err}",
                                   type="UsageSinkNotWritable", non_retryable=True) from err  # fmt: skip
        return ReportFiles(
            written=True, json_path=str(base.with_suffix(".json")), csv_path=str(base.with_suffix(".csv"))
        )


class UsageReportSettings(SystemSettings):
    usage_sink_dir: str | None = Field(
        None,
        description="Directory TenantUsage writes its GPU-hours reports to, <dir>/<cluster>/<period>.json and "
        ".csv (none: reports are in the run's result only)",
    )


class UsageReports(Integration[UsageReportSettings]):
    name = "Usage reports"
    settings = UsageReportSettings
    packages = ("activities.usage_report",)

    def build(self, settings: UsageReportSettings) -> Parts:
        return Parts([UsageReportActivities(settings.usage_sink_dir)])

    def describe(self, settings: UsageReportSettings) -> str:
        return f"to {settings.usage_sink_dir or 'nowhere (MILLWRIGHT_USAGE_SINK_DIR not set)'}"
