"""Async client for the emulator's /_lab admin API, plus a kubeconfig helper."""

from __future__ import annotations

from typing import Any

import httpx


class EmulatorAdmin:
    def __init__(self, url: str, timeout: float = 30.0):
        self.url = url.rstrip("/")
        self._client = httpx.AsyncClient(base_url=self.url, timeout=timeout)

    async def _req(self, method: str, path: str, **kw: Any) -> Any:
        r = await self._client.request(method, path, **kw)
        r.raise_for_status()
        return r.json()

    async def reset(self) -> dict:
        return await self._req("POST", "/_lab/reset")

    async def seed(self, objects: list[dict]) -> dict:
        return await self._req("POST", "/_lab/seed", json={"objects": list(objects)})

    async def dump(self) -> list[dict]:
        return (await self._req("GET", "/_lab/dump"))["objects"]

    async def configure(self, **cfg: Any) -> dict:
        return await self._req("POST", "/_lab/config", json=cfg)

    async def config(self) -> dict:
        return await self._req("GET", "/_lab/config")

    async def add_fault(self, match: dict, action: dict, count: int = 1) -> int:
        return (await self._req("POST", "/_lab/faults", json={"match": match, "action": action,
                                                               "count": count}))["id"]

    async def faults(self) -> list[dict]:
        return (await self._req("GET", "/_lab/faults"))["faults"]

    async def clear_faults(self) -> None:
        await self._req("DELETE", "/_lab/faults")

    async def audit(self, since: int = 0, writes: bool = False) -> list[dict]:
        params = {"since": since}
        if writes:
            params["writes"] = 1
        return (await self._req("GET", "/_lab/audit", params=params))["entries"]

    async def audit_cursor(self) -> int:
        """The sequence number of the latest audit entry: pass it as ``since`` to see only what follows."""
        return (await self._req("GET", "/_lab/audit/cursor"))["next"]

    async def audit_page(self, since: int = 0, writes: bool = False) -> dict:
        params = {"since": since, **({"writes": 1} if writes else {})}
        return await self._req("GET", "/_lab/audit", params=params)

    async def aclose(self) -> None:
        await self._client.aclose()

    async def __aenter__(self) -> "EmulatorAdmin":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()


def kubeconfig(url: str, cluster_name: str = "lab", token: str = "lab-token",
               namespace: str | None = None) -> dict:
    """A kubeconfig dict whose cluster and context are both named ``cluster_name``."""
    ctx: dict[str, Any] = {"cluster": cluster_name, "user": f"{cluster_name}-admin"}
    if namespace:
        ctx["namespace"] = namespace
    return {
        "apiVersion": "v1", "kind": "Config", "preferences": {},
        "clusters": [{"name": cluster_name, "cluster": {"server": url}}],
        "users": [{"name": f"{cluster_name}-admin", "user": {"token": token}}],
        "contexts": [{"name": cluster_name, "context": ctx}],
        "current-context": cluster_name,
    }
