"""The Ironic client: its settings, a client per attempt with the token and TLS, and one request.

Settings: ``MILLWRIGHT_IRONIC_URL`` (Ironic's root, e.g. ``http://ironic:6385``) and, unless Ironic runs
with ``noauth``, ``MILLWRIGHT_IRONIC_TOKEN``: a secret reference (``env:NAME`` / ``file:/path``) to a
Keystone token sent as ``X-Auth-Token``, resolved inside each attempt and never in an input, output or
error. The HTTP client never retries; Temporal's retry policy does. TLS: Ironic's certificate is verified
against the default CAs, or the CA bundle of ``MILLWRIGHT_IRONIC_CA_BUNDLE``;
``MILLWRIGHT_IRONIC_VERIFY_TLS=false`` turns verification off (activities/support/tls.py). Timeouts and connection
errors are ``IronicUnavailable`` (retryable); no settings → ``IronicNotConfigured``.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import httpx
from pydantic import Field, field_validator
from temporalio.exceptions import ApplicationError

from activities.ironic.errors import IRONIC_TLS_FIX, ironic_error
from activities.ironic.models import IronicNode
from activities.models import BaseUrl, StrictModel
from activities.support.secrets import SecretError, SecretRef
from activities.support.tls import Trust, TrustingClient, ca_bundle_ref

USER_AGENT = "millwright-worker"
API_VERSION_HEADER = "X-OpenStack-Ironic-API-Version"
# 1.78: node history (used to recognise a clean this activity already ran); clean_steps since 1.15,
# disable_ramdisk since 1.70. Any Ironic since Yoga (2022) speaks it.
API_VERSION = "1.78"
_REQUEST_TIMEOUT = 10.0


class IronicConfig(StrictModel):
    """Where Ironic is and where its token is kept (None: Ironic runs with noauth)."""

    url: BaseUrl
    token: SecretRef | None = None
    timeout_seconds: float = _REQUEST_TIMEOUT
    poll_seconds: float = Field(10.0, gt=0, description="Between two reads of a node while waiting.")
    api_version: str = API_VERSION
    ca_bundle: str | None = Field(None, description="CA bundle reference (file:/path/to/ca.pem) for Ironic's "
                                                    "certificate; default: the default CAs")  # fmt: skip
    verify_tls: bool = True

    _ca_bundle_ok = field_validator("ca_bundle")(ca_bundle_ref)


class IronicClient:
    """What every Ironic activity calls through: a client per attempt, one request at a time, a node read, a
    provision state asked for. With no config every call fails with IronicNotConfigured."""

    def __init__(self, config: IronicConfig | None) -> None:
        self._config = config

    async def close(self) -> None:  # a Registration resource; clients are per call
        return None

    def _client(self) -> TrustingClient:
        if self._config is None:
            raise ApplicationError(
                "Ironic is not configured on this worker: set MILLWRIGHT_IRONIC_URL (and MILLWRIGHT_IRONIC_TOKEN, "
                "a secret reference env:NAME or file:/path, unless Ironic runs with noauth)",
                type="IronicNotConfigured",
                non_retryable=True,
            )
        headers = {"User-Agent": USER_AGENT, "Accept": "application/json", API_VERSION_HEADER: self._config.api_version}
        if self._config.token is not None:
            try:
                headers["X-Auth-Token"] = self._config.token.resolve()
            except SecretError as err:
                raise ApplicationError(f"Ironic token: {err}", type="IronicNotConfigured", non_retryable=True) from None
        trust = Trust.resolve(IRONIC_TLS_FIX, verify=self._config.verify_tls, ca_bundle=self._config.ca_bundle,
                              setting="MILLWRIGHT_IRONIC_CA_BUNDLE")  # fmt: skip
        return TrustingClient(trust, base_url=self._config.url.rstrip("/") + "/v1", headers=headers,
                              timeout=self._config.timeout_seconds)  # fmt: skip

    async def _call(self, client: TrustingClient, method: str, path: str, doing: str, **kw: Any) -> Any:
        assert self._config is not None  # the client came from _client(), which refuses a worker without one
        try:
            response = await client.request(method, path, **kw)
        except httpx.HTTPError as err:
            tls_failure = client.trust.failure(err, f"{doing}: Ironic {self._config.url}")
            if tls_failure is not None:
                raise tls_failure from None
            # Never the request itself: its headers hold the token.
            raise ApplicationError(f"{doing}: connection failed: {type(err).__name__}",
                                   type="IronicUnavailable") from None  # fmt: skip
        if response.status_code >= 300:
            raise ironic_error(response, doing)
        try:
            return response.json() if response.content else {}
        except ValueError:
            raise ApplicationError(f"{doing}: not an Ironic answer (status {response.status_code})",
                                   type="IronicUnavailable") from None  # fmt: skip

    async def _node_body(self, client: TrustingClient, node: str) -> dict[str, Any]:
        return await self._call(client, "GET", f"/nodes/{quote(node, safe='')}", f"reading node {node}")

    async def _node(self, client: TrustingClient, node: str) -> IronicNode:
        return IronicNode.from_api(await self._node_body(client, node))

    async def _provision(self, client: TrustingClient, node: str, body: dict[str, Any], doing: str) -> None:
        await self._call(client, "PUT", f"/nodes/{quote(node, safe='')}/states/provision", doing, json=body)

    def _poll(self, requested: float | None) -> float:
        assert self._config is not None
        return requested or self._config.poll_seconds
