"""Async client for the emulator's /_lab admin API, plus a kubeconfig helper."""

from __future__ import annotations

from typing import Any

from lab.loopback import AdminClient

from . import mig


class EmulatorAdmin(AdminClient):
    """The Kubernetes emulator's admin API: seed, dump and tune it, on top of faults and the audit log.

    A fault's `match` takes verb, group, version, resource, subresource, namespace and name; its `action`
    (lab/faults.py) {"status": code, "reason", "message", "retryAfterSeconds", "details"} (a 2xx: served, then
    answered with that code; `details` replaces the Status's default ones), {"delay": seconds}, {"delayAfter":
    seconds} or {"drop": "before" | "after"} (the connection is cut before the request is served, or after, its
    answer lost). A status fault on `update poddisruptionbudgets/status` answers the eviction's own budget write
    (lab/k8s/eviction.py `_budget_status_write`)."""

    async def seed(self, objects: list[dict]) -> dict:
        return await self._req("POST", "/_lab/seed", json={"objects": list(objects)})

    async def dump(self) -> list[dict]:
        return (await self._req("GET", "/_lab/dump"))["objects"]

    async def configure(self, **cfg: Any) -> dict:
        return await self._req("POST", "/_lab/config", json=cfg)

    async def config(self) -> dict:
        return await self._req("GET", "/_lab/config")

    async def set_gpu(self, node: str, values: dict[str, float | None], gpu: int | None = None) -> None:
        """dcgm-exporter readings of a node's GPU (every GPU without its own: `gpu` None); lab/k8s/dcgm.py."""
        await self._req("POST", "/_lab/dcgm", json={"node": node, "gpu": gpu, "values": values})

    async def set_mig_node(self, node: str, fail: str | None = None, reboot: bool | None = None,
                           pending_seconds: float | None = None, absent: bool | None = None) -> dict:  # fmt: skip
        """mig-manager on `node` from now on: its reconfigurations fail with reason `fail`, reboot when the MIG mode
        changes or not, stay `pending` that long; `absent`: none runs there (the label is never acted on). None:
        as the settings say (lab/k8s/controllers/migmanager.py)."""
        body = {"node": node, "fail": fail, "reboot": reboot, "pendingSeconds": pending_seconds, "absent": absent}
        return await self._req("POST", "/_lab/mig", json=body)

    async def mig(self) -> dict:
        """The MIG settings and every GPU node's config, state, failure reason and emulated hardware."""
        return await self._req("GET", "/_lab/mig")

    async def mig_config_changes(self, since: int = 0) -> list[dict]:
        """Every change of a node's `nvidia.com/mig.config` label in the audit log, with the GPU pods still on the
        node at that moment (lab/k8s/mig.py `config_changes`)."""
        return mig.config_changes(await self.audit(since, writes=True))

    async def gang_interruptions(self) -> dict[str, int]:
        """KAI PodGroup (`namespace/name`) -> how often it went from whole (minMember pods running) to below it."""
        return (await self._req("GET", "/_lab/gangs"))["interruptions"]

    async def requests(self) -> list[dict]:
        """Every kind of request this emulator process served, resets included (lab/k8s/evidence.py)."""
        return (await self._req("GET", "/_lab/audit/requests"))["requests"]


def kubeconfig(
    url: str, cluster_name: str = "lab", token: str = "lab-token", namespace: str | None = None, user: str | None = None
) -> dict:
    """A kubeconfig dict whose cluster and context are both named ``cluster_name``; its user ``user`` (default
    ``<cluster_name>-admin``) holds ``token``."""
    user = user or f"{cluster_name}-admin"
    ctx: dict[str, Any] = {"cluster": cluster_name, "user": user}
    if namespace:
        ctx["namespace"] = namespace
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "preferences": {},
        "clusters": [{"name": cluster_name, "cluster": {"server": url}}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": cluster_name, "context": ctx}],
        "current-context": cluster_name,
    }


def merged_kubeconfig(docs: list[dict]) -> dict:
    """One kubeconfig holding every one of `docs`' clusters, users and contexts; the first's current context."""
    return docs[0] | {key: [item for doc in docs for item in doc[key]] for key in ("clusters", "users", "contexts")}
