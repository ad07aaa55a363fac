"""Cluster access: one API client per kubeconfig context, and per Cluster API workload cluster through its
kubeconfig Secret. The client's own retries are off: Temporal owns retrying, so every attempt is visible."""

from __future__ import annotations

import asyncio
import os
import re
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from kubernetes.aio import client as k8s
from kubernetes.aio import config as k8s_config
from temporalio.exceptions import ApplicationError

from activities.kube.errors import api_read
from activities.support.tls import TlsFix, verification_failed

USER_AGENT = "millwright-worker"
REQUEST_TIMEOUT = 10.0
LIST_CHUNK = 500  # objects a list request asks for at once: kubectl drain's default chunk size


# ---------------------------------------------------------------- cluster access


# A workload cluster created through Cluster API: `<management context>:<namespace>/<cluster name>`.
WORKLOAD_REF = re.compile(r"(?P<context>[^:/]+):(?P<namespace>[a-z0-9-]+)/(?P<name>[a-z0-9.-]+)")


class ClusterApiClient(k8s.ApiClient):
    """One cluster's API client. A certificate the kubeconfig's CA does not vouch for, or one issued for another
    name, is a non-retryable TlsVerificationFailed naming the kubeconfig setting that fixes it (activities/support/tls.py),
    not a connection failure retried until the activity gives up."""

    def __init__(self, configuration: k8s.Configuration, cluster: str, fix: TlsFix) -> None:
        super().__init__(configuration=configuration)
        self.user_agent = USER_AGENT  # lets audit logs tell Millwright's calls apart
        self._where = f"the Kubernetes API of cluster {cluster} ({configuration.host})"
        self._trusting = ("verification off" if not configuration.verify_ssl else
                          "trusting the kubeconfig's certificate-authority" if configuration.ssl_ca_cert else
                          "trusting the system's CAs: the kubeconfig names no certificate-authority")  # fmt: skip
        self._fix = fix

    async def call_api(self, method, url, *args, **kwargs):
        try:
            return await super().call_api(method, url, *args, **kwargs)
        except aiohttp.ClientError as err:
            path = url.split("?", 1)[0].removeprefix(self.configuration.host)
            failure = verification_failed(err, f"{method} {path} on {self._where}", self._trusting, self._fix)
            if failure is None:
                raise
            raise failure from None


class ClusterConnector:
    """Resolves a cluster reference (a kubeconfig context name) to an API client.

    Credentials stay in the kubeconfig files on the worker: workflow inputs and
    histories only ever carry the cluster's name. So does what the cluster's certificate
    is verified against: the kubeconfig cluster's certificate-authority(-data), or
    insecure-skip-tls-verify.
    """

    def __init__(self, kubeconfig_paths: list[str]) -> None:
        self._paths = [p for p in kubeconfig_paths if p]
        self._clients: dict[str, k8s.ApiClient] = {}
        self._workload: dict[str, tuple[str, k8s.ApiClient]] = {}  # ref -> (Secret uid/resourceVersion, client)
        self._lock = asyncio.Lock()
        self.closed = False  # its clients closed with the worker (activities/kube/shared_watch.py stops then)

    def _contexts(self) -> dict[str, dict[str, Any]]:
        """Merge the kubeconfig files, first file wins, as kubectl does with KUBECONFIG."""
        merged: dict[str, dict[str, Any]] = {}
        for path in self._paths:
            p = Path(path).expanduser()
            if not p.exists():
                continue
            doc = yaml.safe_load(p.read_text()) or {}
            clusters = {c["name"]: c for c in doc.get("clusters") or []}
            users = {u["name"]: u for u in doc.get("users") or []}
            for ctx in doc.get("contexts") or []:
                name = ctx["name"]
                if name in merged:
                    continue
                spec = ctx.get("context") or {}
                merged[name] = {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "current-context": name,
                    "contexts": [ctx],
                    "clusters": [clusters[spec["cluster"]]] if spec.get("cluster") in clusters else [],
                    "users": [users[spec["user"]]] if spec.get("user") in users else [],
                }
        return merged

    async def api(self, cluster: str) -> k8s.ApiClient:
        workload = WORKLOAD_REF.fullmatch(cluster)
        if workload and cluster not in self._clients and cluster not in self._contexts():
            return await self._workload_api(cluster, workload)
        async with self._lock:
            if cluster not in self._clients:
                contexts = self._contexts()
                if cluster not in contexts:
                    raise ApplicationError(
                        f"unknown cluster {cluster!r}: no kubeconfig context of that name in "
                        f"{os.pathsep.join(self._paths) or '(no kubeconfig configured)'}; "
                        f"known: {', '.join(sorted(contexts)) or 'none'}",
                        type="UnknownCluster",
                        non_retryable=True,
                    )
                configuration = type.__call__(k8s.Configuration)
                await k8s_config.load_kube_config_from_dict(contexts[cluster], client_configuration=configuration)
                configuration.retries = None  # Temporal retries, visibly
                # aiohttp would read the proxy environment and ~/.netrc again for every request (trust_env, a thread
                # hop each): the environment's proxy for this API server (as kubectl honours it) is read once here.
                configuration.proxy = configuration.proxy or env_proxy(configuration.host)
                configuration.client_session_kwargs = {"trust_env": False}
                entry = ((contexts[cluster]["contexts"][0].get("context") or {}).get("cluster")) or cluster
                files = os.pathsep.join(self._paths)
                self._clients[cluster] = ClusterApiClient(configuration, cluster, TlsFix(
                    ca=f"certificate-authority-data (or certificate-authority) on cluster {entry!r} in the kubeconfig "
                       f"({files})",
                    off=f"insecure-skip-tls-verify: true on cluster {entry!r} in the kubeconfig ({files})",
                ))  # fmt: skip
            return self._clients[cluster]

    async def _workload_api(self, cluster: str, ref: re.Match) -> k8s.ApiClient:
        """A workload cluster named `<context>:<namespace>/<name>`: its Cluster API kubeconfig Secret
        (`<name>-kubeconfig`, key `value`) on the management cluster `<context>`, read at each use (a
        recreated cluster gets a new client) and kept in memory only, never in a result or a history."""
        import base64

        context, namespace, name = ref["context"], ref["namespace"], ref["name"]
        secret = await api_read(
            f"reading the kubeconfig of cluster {cluster}",
            (await self.core(context)).read_namespaced_secret(
                f"{name}-kubeconfig", namespace, _request_timeout=REQUEST_TIMEOUT
            ),
        )
        if secret is None or "value" not in (secret.data or {}):
            raise ApplicationError(
                f"cluster {cluster}: no kubeconfig Secret {namespace}/{name}-kubeconfig yet", type="KubeconfigNotFound"
            )
        stamp = f"{secret.metadata.uid}/{secret.metadata.resource_version}"
        async with self._lock:
            cached = self._workload.get(cluster)
            if cached and cached[0] == stamp:
                return cached[1]
            if cached:
                await cached[1].close()
            doc = yaml.safe_load(base64.b64decode(secret.data["value"]))
            configuration = type.__call__(k8s.Configuration)
            await k8s_config.load_kube_config_from_dict(doc, client_configuration=configuration)
            configuration.retries = None
            where = f"the kubeconfig Secret {namespace}/{name}-kubeconfig on {context}"
            api = ClusterApiClient(
                configuration,
                cluster,
                TlsFix(ca=f"certificate-authority-data in {where}", off=f"insecure-skip-tls-verify: true in {where}"),
            )
            self._workload[cluster] = (stamp, api)
            return api

    async def core(self, cluster: str) -> k8s.CoreV1Api:
        return k8s.CoreV1Api(await self.api(cluster))

    async def close(self) -> None:
        self.closed = True
        for api in self._clients.values():
            await api.close()
        self._clients.clear()
        for _, api in self._workload.values():
            await api.close()
        self._workload.clear()


def env_proxy(url: str) -> str | None:
    """The proxy HTTPS_PROXY/HTTP_PROXY name for `url`, unless NO_PROXY exempts its host."""
    parts = urllib.parse.urlsplit(url)
    if urllib.request.proxy_bypass(parts.hostname or ""):
        return None
    return urllib.request.getproxies().get(parts.scheme)
