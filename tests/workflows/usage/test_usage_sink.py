"""The usage report's object store sink against a real S3 server (moto, which checks each request's SigV4
signature): written, read back, replaced by a rewrite; refused for a wrong secret or a missing bucket without
retrying; retried when the store is down; and the worker's MILLWRIGHT_USAGE_SINK settings."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime

import httpx
import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.object_store import ObjectStore, sign
from activities.support.secrets import SecretRef
from activities.usage_report import TenantUsageRow, UsageReport, UsageReportActivities
from lab.loopback import free_port
from worker.config import ConfigError, WorkerSettings

pytestmark = pytest.mark.timeout(120)

START = datetime(2026, 12, 1, tzinfo=UTC)
END = datetime(2026, 12, 2, tzinfo=UTC)


def report(acme_hours: float) -> UsageReport:
    return UsageReport(cluster="lab", start=START, end=END, step_seconds=60, total_gpu_hours=acme_hours,
                       rows=[TenantUsageRow(tenant="acme", namespaces=["acme-train"], gpu_hours=acme_hours,
                                            mig_gpu_hours=acme_hours / 2, peak_gpus=3)])  # fmt: skip


def store(s3, monkeypatch, *, bucket: str | None = None, secret: str | None = None) -> ObjectStore:
    monkeypatch.setenv("USAGE_S3_KEYS", f"{s3.access_key_id}:{secret or s3.secret_access_key}")
    return ObjectStore.from_url(f"s3://{bucket or s3.bucket}/reports/daily", endpoint=s3.url, region="us-east-1",
                                credentials=SecretRef.parse("env:USAGE_S3_KEYS"))  # fmt: skip


def get(s3, key: str) -> httpx.Response:
    """An object, read with a request signed as Millwright signs its writes (moto checks it)."""
    path = f"/{s3.bucket}/{key}"
    host = s3.url.removeprefix("http://")
    headers = sign("GET", host, path, {}, hashlib.sha256(b"").hexdigest(), region="us-east-1",
                   access_key_id=s3.access_key_id, secret=s3.secret_access_key,
                   now=datetime.now(UTC))  # fmt: skip
    return httpx.get(s3.url + path, headers=headers, timeout=10)


async def test_report_written_to_the_object_store_and_replaced_by_a_rewrite(s3, monkeypatch):
    acts = UsageReportActivities(store=store(s3, monkeypatch))
    try:
        files = await ActivityEnvironment().run(acts.write_usage_report, report(5.0))
        key = "reports/daily/lab/2026-12-01T00-00-00Z--2026-12-02T00-00-00Z"
        assert (files.written, files.json_path, files.csv_path) == (True, f"s3://{s3.bucket}/{key}.json",
                                                                    f"s3://{s3.bucket}/{key}.csv")  # fmt: skip
        assert json.loads(get(s3, f"{key}.json").text)["rows"][0]["gpu_hours"] == 5.0
        await ActivityEnvironment().run(acts.write_usage_report, report(7.5))  # a re-run of the same period
        assert json.loads(get(s3, f"{key}.json").text)["rows"][0]["gpu_hours"] == 7.5
        csv = get(s3, f"{key}.csv")
        assert csv.headers["content-type"] == "text/csv"
        assert csv.text.splitlines()[1].split(",")[3:7] == ["acme", "acme-train", "7.500000", "3.750000"]
    finally:
        await acts.close()


@pytest.mark.parametrize(
    ("bucket", "secret", "kind", "says"),
    [
        (None, "not-the-secret", "UsageSinkDenied", "403: SignatureDoesNotMatch"),
        ("no-such-bucket", None, "UsageSinkNotFound", "404: NoSuchBucket"),
    ],
)
async def test_refusals_a_retry_cannot_fix_are_not_retried(s3, monkeypatch, bucket, secret, kind, says):
    acts = UsageReportActivities(store=store(s3, monkeypatch, bucket=bucket, secret=secret))
    try:
        with pytest.raises(ApplicationError) as err:
            await ActivityEnvironment().run(acts.write_usage_report, report(1.0))
    finally:
        await acts.close()
    assert (err.value.type, err.value.non_retryable) == (kind, True)
    assert says in err.value.message and "not-the-secret" not in err.value.message


async def test_a_store_that_does_not_answer_is_retried(monkeypatch):
    monkeypatch.setenv("USAGE_S3_KEYS", "AKIDEXAMPLE:secret")
    down = ObjectStore.from_url("s3://usage-reports", endpoint=f"http://127.0.0.1:{free_port()}", region="us-east-1",
                                credentials=SecretRef.parse("env:USAGE_S3_KEYS"))  # fmt: skip
    acts = UsageReportActivities(store=down)
    try:
        with pytest.raises(ApplicationError) as err:
            await ActivityEnvironment().run(acts.write_usage_report, report(1.0))
    finally:
        await acts.close()
    assert (err.value.type, err.value.non_retryable) == ("UsageSinkUnavailable", False)


async def test_credentials_not_set_are_refused_without_a_retry(monkeypatch):
    monkeypatch.delenv("USAGE_S3_KEYS", raising=False)
    acts = UsageReportActivities(store=ObjectStore.from_url("s3://usage-reports", endpoint="http://127.0.0.1:9",
                                 region="us-east-1", credentials=SecretRef.parse("env:USAGE_S3_KEYS")))  # fmt: skip
    with pytest.raises(ApplicationError) as err:
        await ActivityEnvironment().run(acts.write_usage_report, report(1.0))
    assert (err.value.type, err.value.non_retryable) == ("UsageSinkNotConfigured", True)
    assert "USAGE_S3_KEYS is not set" in err.value.message


def test_worker_settings_name_a_directory_or_an_object_store():
    directory, none = WorkerSettings(usage_sink_dir="/var/lib/usage").usage_sink_config()
    assert (directory, none) == ("/var/lib/usage", None)
    _, s3 = WorkerSettings(usage_sink="s3://usage-reports/gpu/", usage_sink_credentials="file:/etc/s3/keys",
                           usage_sink_endpoint="http://minio:9000",
                           usage_sink_region="eu-west-1").usage_sink_config()  # fmt: skip
    assert s3 is not None
    assert (s3.bucket, s3.prefix, s3.endpoint, s3.region, str(s3.credentials)) == (
        "usage-reports", "gpu", "http://minio:9000", "eu-west-1", "file:/etc/s3/keys")  # fmt: skip
    aws = WorkerSettings(usage_sink="s3://usage-reports", usage_sink_credentials="env:KEYS").usage_sink_config()[1]
    assert aws is not None and aws.endpoint == "https://s3.us-east-1.amazonaws.com"
    refused = {
        "MILLWRIGHT_USAGE_SINK_CREDENTIALS is not set": {"usage_sink": "s3://usage-reports"},
        "MILLWRIGHT_USAGE_SINK_CREDENTIALS: a secret reference is": {"usage_sink": "s3://usage-reports",
                                                                     "usage_sink_credentials": "AKID:secret"},
        "MILLWRIGHT_USAGE_SINK: 'Bad_Bucket' is not an S3 bucket name": {"usage_sink": "s3://Bad_Bucket",
                                                                         "usage_sink_credentials": "env:KEYS"},
        "both set": {"usage_sink": "/a", "usage_sink_dir": "/b"},
        "are for an s3:// sink": {"usage_sink": "/a", "usage_sink_credentials": "env:KEYS"},
    }  # fmt: skip
    for says, settings in refused.items():
        with pytest.raises(ConfigError, match=says) as err:
            WorkerSettings(**settings).usage_sink_config()
        assert "AKID" not in str(err.value)  # a pasted key is never echoed
