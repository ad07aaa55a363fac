"""The UFM client: its settings, a client per attempt with UFM's credentials and TLS, one request, fabric-wide
listings, and UFM's version.

Authentication (docs/fabric.md): ``MILLWRIGHT_UFM_CREDENTIALS``, a secret reference
(``env:NAME`` or ``file:/path``) resolved inside each attempt: ``user:password`` uses HTTP Basic on ``/ufmRest``,
anything else is an access token sent as ``Authorization: Basic <token>`` on ``/ufmRestV3``; and/or a client
certificate (``MILLWRIGHT_UFM_CLIENT_CERT`` and ``MILLWRIGHT_UFM_CLIENT_KEY``, secret references to the PEM
certificate and key; alone, on ``/ufmRest``: UFM maps the certificate's name to a user). None of them enters an
activity's input, output or error. The HTTP client never retries; Temporal's retry policy does.

TLS: UFM's certificate (self-signed out of the box) is verified against the default CAs, or the CA bundle of
``MILLWRIGHT_UFM_CA_BUNDLE``; ``MILLWRIGHT_UFM_VERIFY_TLS=false`` turns verification off (activities/support/tls.py).

Fabric-wide listings get a timeout that grows with the fabric (the ports this worker saw last time; the first
listing gets ``max_listing_timeout_seconds``) and heartbeat while they wait. UFM's version
(``GET /app/ufm_version``) is read once per worker: restart workers after upgrading UFM.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

import httpx
from pydantic import Field, field_validator, model_validator
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.models import BaseUrl, StrictModel
from activities.support.secrets import SecretError, SecretRef
from activities.support.tls import ClientCertificate, Trust, TrustingClient, ca_bundle_ref
from activities.ufm.errors import UFM_TLS_FIX, ufm_error

USER_AGENT = "millwright-worker"
_REQUEST_TIMEOUT = 10.0
_MAX_LISTING_TIMEOUT = 120.0
_LISTING_SECONDS_PER_PORT = 0.005  # 10,000 ports: 50 s on top of the request timeout
_HEARTBEAT_SECONDS = 5.0
# UFM releases where the REST API differs (UFM Enterprise REST API Guide; NVIDIA's bare-metal-manager client).
PARTITION_NAME_SINCE = (6, 22)  # partition_name on /pkeys/add

CLIENT_CERT_SETTING = "MILLWRIGHT_UFM_CLIENT_CERT / MILLWRIGHT_UFM_CLIENT_KEY"


def release_numbers(release: str) -> tuple[int, ...]:
    """``"6.19.1-3"`` → ``(6, 19, 1)``; what cannot be read is ``()``, older than every release named here."""
    m = re.match(r"^\s*(\d+)(?:\.(\d+))?(?:\.(\d+))?", release or "")
    return tuple(int(x) for x in m.groups() if x is not None) if m else ()


class UfmConfig(StrictModel):
    """Where UFM is and where its credentials are kept; the credentials themselves are never held here."""

    url: BaseUrl
    credentials: SecretRef | None = Field(None, description="user:password or an access token (a secret reference)")
    client_cert: SecretRef | None = Field(None, description="PEM client certificate (mutual TLS): a secret reference")
    client_key: SecretRef | None = Field(None, description="The client certificate's PEM key: a secret reference")
    timeout_seconds: float = Field(_REQUEST_TIMEOUT, gt=0, description="Per request (listings: see below).")
    max_listing_timeout_seconds: float = Field(
        _MAX_LISTING_TIMEOUT, gt=0, description="Cap on a fabric-wide listing's timeout, which grows with the fabric."
    )
    ca_bundle: str | None = Field(None, description="CA bundle reference (file:/path/to/ca.pem) for UFM's "
                                                    "certificate; default: the default CAs")  # fmt: skip
    verify_tls: bool = True

    _ca_bundle_ok = field_validator("ca_bundle")(ca_bundle_ref)

    @model_validator(mode="after")
    def _authenticates(self) -> UfmConfig:
        if (self.client_cert is None) != (self.client_key is None):
            raise ValueError("client_cert and client_key go together (MILLWRIGHT_UFM_CLIENT_CERT and _CLIENT_KEY)")
        if self.credentials is None and self.client_cert is None:
            raise ValueError("UFM needs credentials (user:password or an access token) or a client certificate")
        return self


class UfmClient:
    """What every UFM activity calls through: a client per attempt, one request at a time, fabric-wide listings
    with a timeout that scales with the fabric, and UFM's version. With no config every call fails with
    UfmNotConfigured."""

    def __init__(self, config: UfmConfig | None) -> None:
        self._config = config
        self._release: str | None = None  # UFM's version, read once per worker
        self._ports_seen: int | None = None  # host ports in the last listing: scales the next one's timeout

    async def close(self) -> None:  # a Registration resource; clients are per call
        return None

    def _client(self) -> TrustingClient:
        config = self._config
        if config is None:
            raise ApplicationError(
                "UFM is not configured on this worker: set MILLWRIGHT_UFM_URL and MILLWRIGHT_UFM_CREDENTIALS "
                "(a secret reference to user:password or an access token: env:NAME or file:/path), or "
                "MILLWRIGHT_UFM_CLIENT_CERT and MILLWRIGHT_UFM_CLIENT_KEY",
                type="UfmNotConfigured",
                non_retryable=True,
            )
        base = config.url.rstrip("/") + "/ufmRest"
        headers = {"User-Agent": USER_AGENT, "Accept": "application/json"}
        auth: Any = None
        if config.credentials is not None:
            try:
                secret = config.credentials.resolve()
            except SecretError as err:
                raise ApplicationError(f"UFM credentials: {err}", type="UfmNotConfigured",
                                       non_retryable=True) from None  # fmt: skip
            if ":" in secret:
                user, _, password = secret.partition(":")
                auth = httpx.BasicAuth(user, password)
            else:
                headers["Authorization"] = f"Basic {secret}"
                base += "V3"
        client_cert = (ClientCertificate(cert=config.client_cert, key=config.client_key, setting=CLIENT_CERT_SETTING)
                       if config.client_cert and config.client_key else None)  # fmt: skip
        trust = Trust.resolve(UFM_TLS_FIX, verify=config.verify_tls, ca_bundle=config.ca_bundle,
                              setting="MILLWRIGHT_UFM_CA_BUNDLE", client_cert=client_cert)  # fmt: skip
        return TrustingClient(trust, base_url=base, auth=auth, headers=headers, timeout=config.timeout_seconds)

    async def _call(self, client: TrustingClient, method: str, path: str, doing: str, *, ok404: bool = False,
                    parse: bool = True, timeout: float | None = None, **kw: Any) -> Any:  # fmt: skip
        """One request. A read's body must be JSON (`parse`); a write's is not looked at: the read back decides.
        The activity heartbeats first: each request is bounded by its timeout, so a live attempt is seen."""
        assert self._config is not None  # the client came from _client(), which refuses a worker without one
        doing = f"{doing} at UFM {client.base_url}"  # the endpoint, for a run that shows why it waits
        activity.heartbeat(doing)
        try:
            response = await client.request(method, path, timeout=timeout or httpx.USE_CLIENT_DEFAULT, **kw)
        except httpx.HTTPError as err:
            tls_failure = client.trust.failure(err, f"{doing}: UFM {self._config.url}")
            if tls_failure is not None:
                raise tls_failure from None
            hint = ""
            closed = isinstance(err, (httpx.ReadError, httpx.RemoteProtocolError))  # as TLS 1.3 refuses no certificate
            if closed and self._config.url.startswith("https") and not self._config.client_cert:
                hint = f" (a UFM that requires client certificates closes the connection so: see {CLIENT_CERT_SETTING})"
            # Never the request itself: its headers hold the credentials.
            raise ApplicationError(f"{doing}: connection failed: {type(err).__name__}{hint}",
                                   type="UfmUnavailable") from None  # fmt: skip
        if ok404 and response.status_code == 404:
            return None
        if response.status_code >= 300:
            raise ufm_error(response, doing)
        if not parse:
            return None
        if not response.content:
            return {}
        try:
            return response.json()
        except ValueError:
            kind = response.headers.get("content-type", "no content type")
            raise ApplicationError(f"{doing}: UFM answered {response.status_code} with a body that is not JSON "
                                   f"({kind})", type="UfmUnavailable") from None  # fmt: skip

    def _listing_timeout(self) -> float:
        assert self._config is not None  # asked only by an activity that holds a client from _client()
        cap = self._config.max_listing_timeout_seconds
        if self._ports_seen is None:  # the fabric's size is not known yet
            return cap
        return min(cap, self._config.timeout_seconds + self._ports_seen * _LISTING_SECONDS_PER_PORT)

    async def _listing(self, client: TrustingClient, path: str, doing: str, *, ok404: bool = False,
                       **params: str) -> Any:  # fmt: skip
        """A fabric-wide read: its timeout scales with the fabric; the activity heartbeats while it waits."""
        call = asyncio.ensure_future(self._call(client, "GET", path, doing, ok404=ok404, params=params,
                                                timeout=self._listing_timeout()))  # fmt: skip
        try:
            while not (await asyncio.wait({call}, timeout=_HEARTBEAT_SECONDS))[0]:
                activity.heartbeat(f"waiting for UFM: {doing}")
            return call.result()
        finally:
            call.cancel()

    async def _host_ports(self, client: TrustingClient) -> list[dict]:
        ports = await self._listing(client, "/resources/ports", "listing UFM host ports", sys_type="Computer")
        self._ports_seen = len(ports)
        return ports

    async def _ufm_release(self, client: TrustingClient) -> str:
        if self._release is None:
            body = await self._call(client, "GET", "/app/ufm_version", "reading UFM's version")
            release = body.get("ufm_release_version") if isinstance(body, dict) else None
            if not isinstance(release, str):
                raise ApplicationError("reading UFM's version: no ufm_release_version in the answer",
                                       type="UfmUnavailable")  # fmt: skip
            self._release = release
        return self._release
