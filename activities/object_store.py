"""Objects written to an S3-compatible object store (AWS S3, MinIO, Ceph RGW, ...): one PUT per object, signed with
AWS Signature Version 4 (the payload's SHA-256 signed too), path-style (`<endpoint>/<bucket>/<key>`, which every
S3-compatible store answers).

The store's credentials are a secret reference (`env:NAME` or `file:/path`) whose value is
`<access key id>:<secret access key>`, read at each attempt: never in a workflow's input or history.

A PUT replaces the object of the same key, so writing again is idempotent. The client does no retries of its own
(Temporal retries): 5xx, 429 and connection trouble are retryable; 403 (unknown key, wrong secret, no permission),
404 (no such bucket) and other 4xx fail non-retryably, since the same request would be refused again.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from datetime import UTC, datetime
from urllib.parse import quote

import httpx
from pydantic import Field, field_validator
from temporalio.exceptions import ApplicationError

from activities.models import StrictModel
from activities.support.secrets import SecretError, SecretRef

USER_AGENT = "millwright-worker"
# S3's bucket naming rules (lowercase letters, digits, dots and hyphens, 3 to 63 characters).
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


class ObjectStore(StrictModel):
    """Where objects go: a bucket and key prefix (from an `s3://bucket/prefix` URL), the endpoint and region, and
    the reference to the credentials."""

    bucket: str
    prefix: str = Field("", description="Key prefix, without leading or trailing '/'.")
    endpoint: str = Field(description="The store's base URL, e.g. https://s3.us-east-1.amazonaws.com.")
    region: str = "us-east-1"
    credentials: SecretRef = Field(description="access key id:secret access key, as a secret reference.")

    @field_validator("bucket")
    @classmethod
    def _bucket_name(cls, v: str) -> str:
        if not _BUCKET.match(v) or ".." in v:
            raise ValueError(f"{v!r} is not an S3 bucket name (3-63 lowercase letters, digits, '.', '-')")
        return v

    @classmethod
    def from_url(cls, url: str, *, endpoint: str | None, region: str, credentials: SecretRef) -> ObjectStore:
        """`s3://bucket[/prefix]`; no endpoint: AWS S3's in `region`."""
        if not url.startswith("s3://"):
            raise ValueError(f"an object store URL is s3://bucket/prefix, not {url!r}")
        bucket, _, prefix = url.removeprefix("s3://").partition("/")
        return cls(bucket=bucket, prefix=prefix.strip("/"), region=region, credentials=credentials,
                   endpoint=(endpoint or f"https://s3.{region}.amazonaws.com").rstrip("/"))  # fmt: skip

    def url_of(self, key: str) -> str:
        """`s3://bucket/prefix/key`: what a report names as written."""
        return f"s3://{self.bucket}/{self.key(key)}"

    def key(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name


def _hmac(key: bytes, text: str) -> bytes:
    return hmac.new(key, text.encode(), hashlib.sha256).digest()


def sign(method: str, host: str, path: str, headers: dict[str, str], payload_sha256: str, *, region: str,
         access_key_id: str, secret: str, now: datetime) -> dict[str, str]:  # fmt: skip
    """The headers of a SigV4-signed S3 request (AWS General Reference, "Signature Version 4"): `headers` plus
    `x-amz-date`, `x-amz-content-sha256` and `Authorization`, every one of them signed. `path` is already
    URI-encoded (S3 signs it as sent, without encoding it twice); no query string."""
    amz_date = now.astimezone(UTC).strftime("%Y%m%dT%H%M%SZ")
    scope = f"{amz_date[:8]}/{region}/s3/aws4_request"
    out = {**headers, "host": host, "x-amz-date": amz_date, "x-amz-content-sha256": payload_sha256}
    names = sorted(k.lower() for k in out)
    lowered = {k.lower(): " ".join(str(v).split()) for k, v in out.items()}
    canonical = "\n".join([method, path, "", *(f"{k}:{lowered[k]}" for k in names), "", ";".join(names),
                           payload_sha256])  # fmt: skip
    to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()])
    key = _hmac(_hmac(_hmac(_hmac(f"AWS4{secret}".encode(), amz_date[:8]), region), "s3"), "aws4_request")
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    out["Authorization"] = (f"AWS4-HMAC-SHA256 Credential={access_key_id}/{scope}, SignedHeaders={';'.join(names)}, "
                            f"Signature={signature}")  # fmt: skip
    del out["host"]  # httpx sends the same Host itself
    return out


def _s3_error(response: httpx.Response) -> str:
    """`<Code>: <Message>` of S3's XML error body, else the status line."""
    found = {tag: re.search(rf"<{tag}>([^<]*)</{tag}>", response.text) for tag in ("Code", "Message")}
    parts = [m[1] for m in found.values() if m]
    return ": ".join(parts) if parts else f"{response.status_code} {response.reason_phrase}"


async def put_object(store: ObjectStore, http: httpx.AsyncClient, name: str, body: bytes, content_type: str,
                     timeout: float = 60) -> str:  # fmt: skip
    """PUT `body` at the store's `prefix/name`, replacing what was there; returns its s3:// URL."""
    try:
        access_key_id, sep, secret = store.credentials.resolve().partition(":")
    except SecretError as err:
        raise ApplicationError(f"object store credentials: {err}", type="UsageSinkNotConfigured",
                               non_retryable=True) from None  # fmt: skip
    if not sep or not access_key_id or not secret:
        raise ApplicationError(f"object store credentials {store.credentials}: not '<access key id>:<secret key>'",
                               type="UsageSinkNotConfigured", non_retryable=True)  # fmt: skip
    path = "/" + quote(f"{store.bucket}/{store.key(name)}", safe="/-_.~")
    request = http.build_request("PUT", store.endpoint + path, content=body, timeout=timeout)
    request.headers.update(sign("PUT", request.headers["host"], path, {"content-type": content_type},
                                hashlib.sha256(body).hexdigest(), region=store.region, access_key_id=access_key_id,
                                secret=secret, now=datetime.now(UTC)))  # fmt: skip
    where = store.url_of(name)
    try:
        response = await http.send(request)
    except httpx.HTTPError as err:
        raise ApplicationError(f"writing {where} at {store.endpoint}: {type(err).__name__}: {err}",
                               type="UsageSinkUnavailable") from err  # fmt: skip
    if response.status_code == 429 or response.status_code >= 500:
        raise ApplicationError(f"writing {where}: {response.status_code}: {_s3_error(response)}",
                               type="UsageSinkUnavailable")  # fmt: skip
    if response.status_code >= 300:
        kind = {403: "UsageSinkDenied", 404: "UsageSinkNotFound"}.get(response.status_code, "UsageSinkRejected")
        raise ApplicationError(f"writing {where} at {store.endpoint}: {response.status_code}: {_s3_error(response)}",
                               type=kind, non_retryable=True)  # fmt: skip
    return where


def client() -> httpx.AsyncClient:
    """No retries in the transport: Temporal retries, so every attempt is visible."""
    return httpx.AsyncClient(headers={"User-Agent": USER_AGENT}, transport=httpx.AsyncHTTPTransport(retries=0))
