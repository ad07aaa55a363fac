"""Lab glue: a lab server's power, as its Kubernetes node sees it.

``async with NodePowerLink(bmc_admin, core, nodes) as link: ...`` polls the BMC emulator (lab/redfish.py) and, for
each server that plays a Kubernetes node of the same name in the Kubernetes emulator: while the server is Off the
node is NotReady (``lab: powered off``); each power-on (its boot count going up) is a reboot: the node gets a new
boot ID and is Ready again, as a kubelet reports after a reboot. ``on_boot(name)`` (optional, awaited first) lets a
test decide what the reboot repaired (e.g. clear the server's GPU faults); ``on_off(name)`` (optional, awaited
first) hears each power-off seen (one shorter than the poll interval is not seen; its boot is). ``nodeless``
servers play no node (an NVLink switch tray): only the hooks hear their power. Together with ``lab.hosts.LabHosts``
(the host agent follows the same power) a power cycle through Redfish looks, to Millwright, like a real one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Awaitable, Callable, Iterable
from datetime import UTC, datetime
from typing import Any

log = logging.getLogger("lab.node_power")


class NodePowerLink:
    def __init__(self, bmc_admin: Any, core: Any, nodes: list[str] | None = None, *, poll_interval: float = 0.05,
                 on_boot: Callable[[str], Awaitable[None]] | None = None,
                 on_off: Callable[[str], Awaitable[None]] | None = None,
                 nodeless: Iterable[str] = ()) -> None:  # fmt: skip
        """`bmc_admin`: a lab.redfish.BmcAdmin; `core`: a kubernetes.aio CoreV1Api; `nodes`: the servers to follow
        (default: every server, from the first poll); `nodeless`: servers followed for the hooks only."""
        self.bmc_admin, self.core = bmc_admin, core
        self.nodeless = set(nodeless)
        self.nodes = set(nodes) | self.nodeless if nodes is not None else None
        self.poll_interval, self.on_boot, self.on_off = poll_interval, on_boot, on_off
        self.boots: dict[str, int] = {}
        self.powered: dict[str, bool] = {}
        self.reboots: dict[str, int] = {}
        self._task: asyncio.Task | None = None

    def follow(self, node: str) -> None:
        if self.nodes is not None:
            self.nodes.add(node)

    async def __aenter__(self) -> NodePowerLink:
        await self.poll_once(first=True)
        self._task = asyncio.create_task(self._loop(), name="lab-node-power")
        return self

    async def __aexit__(self, *exc: Any) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _loop(self) -> None:
        while True:
            with contextlib.suppress(Exception):  # the lab may be resetting: look again at the next poll
                await self.poll_once()
            await asyncio.sleep(self.poll_interval)

    async def poll_once(self, first: bool = False) -> None:
        servers = await self.bmc_admin.servers(["power", "boot_count"])
        for name, view in servers.items():
            if self.nodes is not None and name not in self.nodes:
                continue
            boots, on = int(view.get("boot_count") or 0), view.get("power") == "On"
            seen_boots, was_on = self.boots.get(name), self.powered.get(name)
            self.boots[name], self.powered[name] = boots, on
            if first or seen_boots is None:
                continue
            if boots < seen_boots:  # the BMC lab was reset: nothing happened to the node
                continue
            if boots > seen_boots:
                if self.on_boot is not None:
                    await self.on_boot(name)
                self.reboots[name] = self.reboots.get(name, 0) + 1
                if name not in self.nodeless:
                    await self._node(name, ready=True, boot_id=f"{name}-boot-{uuid.uuid4().hex[:8]}")
                was_on = True  # and if it is off again already, that is a power-off too
            if was_on and not on:
                if self.on_off is not None:
                    await self.on_off(name)
                if name not in self.nodeless:
                    await self._node(name, ready=False)

    async def _node(self, name: str, *, ready: bool, boot_id: str | None = None) -> None:
        from kubernetes.aio.client.exceptions import ApiException

        for _ in range(10):  # a 409 (the node changed since we read it): read again
            try:
                return await self._patch(name, ready=ready, boot_id=boot_id)
            except ApiException as err:
                if err.status != 409:
                    raise
        raise RuntimeError(f"node {name}: could not record its power state (conflicts)")

    async def _patch(self, name: str, *, ready: bool, boot_id: str | None) -> None:
        node = await self.core.read_node_status(name)
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        conditions = [self.core.api_client.sanitize_for_serialization(c) for c in node.status.conditions or []]
        for c in conditions:
            if c.get("type") == "Ready" and (c.get("status") == "True") != ready:
                c.update(status="True" if ready else "False", lastTransitionTime=now, lastHeartbeatTime=now,
                         reason="KubeletReady" if ready else "NodeStatusUnknown",
                         message="kubelet is posting ready status" if ready else "lab: powered off")  # fmt: skip
        status: dict[str, Any] = {"conditions": conditions}
        if boot_id:
            status["nodeInfo"] = {"bootID": boot_id}
        body = {"metadata": {"resourceVersion": node.metadata.resource_version}, "status": status}
        await self.core.patch_node_status(name, body)
        log.info("node %s: %s", name, f"rebooted ({boot_id})" if boot_id else "powered off: NotReady")
