"""The lab's hosts: a host agent for every emulated server that is powered on.

``async with LabHosts(client, bmc_admin_url) as hosts: ...`` polls the BMC emulator's admin API
(``GET /_lab/servers``, lab/redfish.py) every `poll_interval` seconds. A server that is On gets, `boot_delay`
seconds after it powered on, an in-process host-agent worker: the same ``HostAgentActivities`` the real agent
runs (worker.registry.build_host_agent), on ``host_task_queue(name)``, over a ``lab.gpus.SimulatedGpuProbe`` built
from the server's spec and its ``gpu_faults``. The agent stops when the server powers off, and restarts (after the
boot delay) when it reboots (its boot_count changes). Each server keeps one probe for the lab's lifetime, so what a
reboot clears (pending remaps, a lost GPU, volatile ECC counters) is cleared and the rest stays; a fault spec that
changes is applied to the running probe at once. A lab reset (boot_count going back) starts the server afresh.
``booted_from={"Pxe"}`` runs agents only in the boots from those sources (the burn-in image), not in every
powered-on server: a fleet's servers stay On after a pass, and an agent each would be a worker each.

As a process (what `millwright lab up` runs): ``python -m lab.hosts --temporal ADDRESS --bmc-admin URL
[--ready-file F]``; it writes the ready file once every server that is On has its agent, and stops on SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import sys
import time
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

import httpx

from activities.gpu.models import host_task_queue
from lab.gpus import SimulatedGpuProbe

log = logging.getLogger("lab.hosts")

# What every poll reads of every server; a server's spec (the bulk of its view) only when its probe is made.
VIEW_FIELDS = "power,boot_count,booted_from,gpu_faults"


@dataclass
class _Agent:
    boot_count: int
    worker: Any
    task: asyncio.Task
    registration: Any


@dataclass
class _Server:
    boot_count: int = 0
    up_at: float | None = None  # when the agent of the current boot may start
    faults: str = "{}"  # the fault spec applied to the probe, as canonical JSON
    probe: SimulatedGpuProbe | None = None
    agent: _Agent | None = None
    starts: list[int] = field(default_factory=list)  # boot counts agents were started for


class LabHosts:
    def __init__(self, client: Any, bmc_admin_url: str, *, boot_delay: float = 0.3, poll_interval: float = 0.2,
                 heartbeat_seconds: float = 1.0, booted_from: Collection[str] | None = None) -> None:  # fmt: skip
        self.client = client
        self.booted_from = None if booted_from is None else frozenset(booted_from)
        self.admin_url = bmc_admin_url.rstrip("/")
        self.boot_delay = boot_delay
        self.poll_interval = poll_interval
        self.heartbeat_seconds = heartbeat_seconds
        self.servers: dict[str, _Server] = {}
        self._http: httpx.AsyncClient | None = None
        self._task: asyncio.Task | None = None
        self._changed = asyncio.Event()

    # ------------------------------------------------------------ public

    async def __aenter__(self) -> LabHosts:
        self._http = httpx.AsyncClient(base_url=self.admin_url, timeout=10)
        self._task = asyncio.create_task(self._loop(), name="lab-hosts")
        return self

    async def __aexit__(self, *exc: Any) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None
        await asyncio.gather(*(self._stop(name) for name in list(self.servers)), return_exceptions=True)
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    def task_queue(self, name: str) -> str:
        return host_task_queue(name)

    def running(self) -> list[str]:
        """Servers whose agent polls its task queue now."""
        return sorted(n for n, s in self.servers.items() if s.agent is not None)

    def probe(self, name: str) -> SimulatedGpuProbe | None:
        """The server's simulated GPUs (resets, service restarts, loads can be read off it)."""
        server = self.servers.get(name)
        return server.probe if server else None

    def boots_served(self, name: str) -> list[int]:
        """The boot counts an agent was started for."""
        server = self.servers.get(name)
        return list(server.starts) if server else []

    async def wait_running(self, name: str, timeout: float = 10.0, *, boot_count: int | None = None) -> None:
        """Until the server's agent runs (for at least boot `boot_count`, when given)."""
        deadline = time.monotonic() + timeout
        while True:
            server = self.servers.get(name)
            if server and server.agent and (boot_count is None or server.agent.boot_count >= boot_count):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"no host agent for {name} after {timeout}s (running: {self.running()})")
            await self._wait_change(deadline)

    async def wait_stopped(self, name: str, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while (server := self.servers.get(name)) and server.agent is not None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"host agent for {name} still running after {timeout}s")
            await self._wait_change(deadline)

    async def _wait_change(self, deadline: float) -> None:
        self._changed.clear()
        with contextlib.suppress(asyncio.TimeoutError):
            wait = max(0.01, min(self.poll_interval, deadline - time.monotonic()))
            await asyncio.wait_for(self._changed.wait(), wait)

    # ------------------------------------------------------------ the loop

    async def _loop(self) -> None:
        while True:
            try:
                await self.poll_once()
            except asyncio.CancelledError:
                raise
            except Exception as err:
                log.warning("polling the BMC emulator at %s: %s", self.admin_url, err)
            await asyncio.sleep(self.poll_interval)

    async def poll_once(self) -> None:
        """Read every server's power and boot count once, and start/stop agents to match."""
        assert self._http is not None, "use LabHosts as an async context manager"
        response = await self._http.get("/_lab/servers", params={"fields": VIEW_FIELDS})
        response.raise_for_status()
        views: dict[str, dict] = response.json()["servers"]
        now = time.monotonic()
        for name, view in views.items():
            await self._reconcile(name, view, now)
        for name in set(self.servers) - set(views):
            await self._stop(name)
        self._changed.set()

    async def _reconcile(self, name: str, view: dict, now: float) -> None:
        server = self.servers.setdefault(name, _Server())
        boots = int(view.get("boot_count") or 0)
        faults = view.get("gpu_faults") or {}
        if boots < server.boot_count:  # the lab was reset: new hardware state
            await self._stop(name)
            server.probe, server.faults, server.starts = None, "{}", []
        if view.get("power") != "On" or (self.booted_from is not None and view.get("booted_from") not in
                                         self.booted_from):  # fmt: skip
            server.boot_count, server.up_at = boots, None
            await self._stop(name)
            return
        if server.agent is not None and server.agent.boot_count != boots:  # rebooted between two polls
            await self._stop(name)
        if server.boot_count != boots or server.up_at is None:
            server.boot_count, server.up_at = boots, now + self.boot_delay
        canonical = json.dumps(faults, sort_keys=True) if faults else "{}"  # most servers, each poll
        if server.agent is not None:
            if canonical != server.faults and server.probe is not None:
                server.probe.set_faults(faults)
                server.faults = canonical
            return
        if now < server.up_at:
            return
        if server.probe is None:
            spec = {**await self._spec(name), "name": name, "boot_count": boots, "booted_from": view.get("booted_from")}
            server.probe = SimulatedGpuProbe(spec, faults)
        else:
            server.probe.boot(boot_count=boots, booted_from=view.get("booted_from"))
            if canonical != server.faults:
                server.probe.set_faults(faults)
        server.faults = canonical
        await self._start(name, server, boots)

    async def _spec(self, name: str) -> dict:
        assert self._http is not None
        response = await self._http.get(f"/_lab/servers/{name}")
        response.raise_for_status()
        return response.json().get("spec") or {}

    async def _start(self, name: str, server: _Server, boots: int) -> None:
        from worker import registry

        assert server.probe is not None
        registration = registry.build_host_agent(name, server.probe)
        for resource in registration.resources:
            if hasattr(resource, "heartbeat_seconds"):
                resource.heartbeat_seconds = self.heartbeat_seconds
        assert registration.task_queue is not None, "the host agent's registration names its queue"
        worker = registry.new_worker(self.client, registration, registration.task_queue)
        task = asyncio.create_task(worker.run(), name=f"host-agent-{name}")
        server.agent = _Agent(boot_count=boots, worker=worker, task=task, registration=registration)
        server.starts.append(boots)
        log.info("%s: host agent up on %s (boot %d)", name, registration.task_queue, boots)

    async def _stop(self, name: str) -> None:
        server = self.servers.get(name)
        agent = server.agent if server else None
        if server is None or agent is None:
            return
        server.agent = None
        with contextlib.suppress(Exception):
            await agent.worker.shutdown()
        with contextlib.suppress(BaseException):
            await agent.task
        log.info("%s: host agent down (boot %d)", name, agent.boot_count)


async def _serve(args: argparse.Namespace) -> None:
    from temporalio.client import Client

    from lab.loopback import announce_and_wait
    from lab.redfish import BmcAdmin

    client = await Client.connect(args.temporal, namespace=args.namespace)
    async with LabHosts(client, args.bmc_admin, boot_delay=args.boot_delay, poll_interval=args.poll_interval) as hosts:
        async with BmcAdmin(args.bmc_admin) as admin:
            on = [name for name, view in (await admin.servers(["power"])).items() if view.get("power") == "On"]
        for name in on:
            await hosts.wait_running(name, args.startup_timeout)
        log.info("host agents up for %d powered-on server(s), following %s", len(on), args.bmc_admin)
        await announce_and_wait("lab.hosts", args.bmc_admin, args.ready_file)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lab.hosts", description="Host agents for the lab's powered-on servers")
    p.add_argument("--temporal", required=True, help="Temporal frontend host:port")
    p.add_argument("--namespace", default="default")
    p.add_argument("--bmc-admin", required=True, help="the lab BMCs' admin URL (python -m lab.redfish)")
    p.add_argument("--boot-delay", type=float, default=0.3, help="seconds from power-on to the agent's start")
    p.add_argument("--poll-interval", type=float, default=0.2)
    p.add_argument("--startup-timeout", type=float, default=60.0)
    p.add_argument("--ready-file", help="{url: the BMC admin URL, pid}, once the powered-on servers' agents run")
    p.add_argument("--log-level", default="INFO")
    args = p.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")  # fmt: skip
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per poll
    asyncio.run(_serve(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
