"""Raw Kubernetes API calls for any kind: discovery (`apiVersion`/`kind` → resource path) and one JSON request.

Generic over kinds: the resource path of an `apiVersion`/`kind` comes from discovery, so the same activities
create a `Namespace`, a KAI `Queue` or a Cluster API `Cluster`. Each call uses the client's own credentials
(activities/kube/connector.py); errors map to the same typed errors as the typed clients (activities/kube/errors.py).
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp
from kubernetes.aio import client as k8s
from kubernetes.aio.client.exceptions import ApiException
from temporalio.exceptions import ApplicationError

from activities.kube.connector import REQUEST_TIMEOUT
from activities.kube.errors import api_error


class Resources:
    """Discovery for one cluster during one activity: `apiVersion`+`kind` → (plural, namespaced)."""

    def __init__(self, api: k8s.ApiClient, cluster: str) -> None:
        self.api, self.cluster = api, cluster
        self._lists: dict[str, dict[str, Any] | None] = {}

    async def lookup(self, api_version: str, kind: str) -> tuple[str, bool] | None:
        if api_version not in self._lists:
            path = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
            self._lists[api_version] = await request(
                self.api, "GET", path, f"discovery of {api_version}", missing_ok=True
            )
        doc = self._lists[api_version]
        for r in (doc or {}).get("resources") or []:
            if r.get("kind") == kind and "/" not in r.get("name", ""):
                return r["name"], bool(r.get("namespaced"))
        return None

    async def path(self, api_version: str, kind: str, name: str | None = None, namespace: str | None = None) -> str:
        found = await self.lookup(api_version, kind)
        if found is None:
            raise ApplicationError(
                f"cluster {self.cluster} does not serve {kind} ({api_version}): install its CRD or provider first",
                type="KindNotInstalled",
                non_retryable=True,
            )
        plural, namespaced = found
        base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
        if namespaced and namespace:
            base += f"/namespaces/{namespace}"
        base += f"/{plural}"
        return f"{base}/{name}" if name else base

    async def read(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        """The object, or None when there is none."""
        path = await self.path(api_version, kind, name, namespace)
        return await request(self.api, "GET", path, f"reading {kind} {name}", missing_ok=True)


async def request(
    api: k8s.ApiClient,
    method: str,
    path: str,
    doing: str,
    *,
    body: Any = None,
    query: dict[str, str] | None = None,
    missing_ok: bool = False,
    content_type: str = "application/json",
) -> dict[str, Any] | None:
    """One raw API call with the client's own credentials; JSON in and out; errors mapped by api_error."""
    headers = {"Accept": "application/json", "User-Agent": api.user_agent}
    if body is not None:
        headers["Content-Type"] = content_type
    try:
        m, url, h, b, _ = await api.param_serialize(
            method=method,
            resource_path=path,
            header_params=headers,
            query_params=list((query or {}).items()) or None,
            body=body,
            auth_settings=["BearerToken"],
        )
        resp = await api.call_api(m, url, header_params=h, body=b, _request_timeout=REQUEST_TIMEOUT)
        data = await resp.read()
    except (TimeoutError, aiohttp.ClientError) as err:
        raise ApplicationError(f"{doing}: connection failed: {err!r}", type="KubernetesUnavailable") from err
    if 200 <= resp.status < 300:
        return json.loads(data) if data else {}
    if resp.status == 404 and missing_ok:
        return None
    failure = ApiException(http_resp=resp)
    raise api_error(failure, doing) from failure
