"""What every lab service shares: free loopback ports, the 'ready' handshake, secret files."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import ssl
import tempfile
from pathlib import Path
from typing import Any

from lab import tls as lab_tls

LOOPBACK = "127.0.0.1"


def free_port(host: str = LOOPBACK, avoid: set[int] | None = None) -> int:
    """A port nothing listens on now (and not one of `avoid`, ports promised to others)."""
    avoid = avoid or set()
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
        if port not in avoid:
            return port


def write_secret_file(path: Path | str, value: str) -> Path:
    """A secret for a worker to read through a `file:` reference: mode 0600 from the start."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(value + "\n")
    return Path(path)


def write_ready_file(path: str, url: str) -> None:
    """Atomically tell the parent where the service listens: {"url", "pid"}."""
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".ready-")
    with os.fdopen(fd, "w") as f:
        json.dump({"url": url, "pid": os.getpid()}, f)
    os.replace(tmp, path)


async def announce_and_wait(name: str, url: str, ready_file: str | None) -> None:
    """Say where the service listens, then wait for SIGTERM or SIGINT."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):  # before announcing: a caller may signal as soon as it reads
        loop.add_signal_handler(sig, stop.set)
    print(f"{name} listening on {url}", flush=True)
    if ready_file:
        write_ready_file(ready_file, url)
    await stop.wait()


def server_arguments(prog: str, description: str) -> argparse.ArgumentParser:
    """The arguments every lab server takes from ChildProcess: --host, --port, --ready-file; and --log-level,
    --tls-cert/--tls-key (lab/tls.py)."""
    p = argparse.ArgumentParser(prog=prog, description=description)
    p.add_argument("--host", default=LOOPBACK)
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--ready-file")
    p.add_argument("--log-level", default="WARNING")
    lab_tls.add_arguments(p)
    return p


async def serve_app(name: str, app: Any, host: str, port: int, ready_file: str | None,
                    ssl_context: ssl.SSLContext | None = None) -> None:  # fmt: skip
    """Serve an aiohttp application on host:port (0: a free port), over HTTPS with `ssl_context`, say where, and
    run until SIGTERM or SIGINT."""
    from aiohttp import web

    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port, shutdown_timeout=1.0, ssl_context=ssl_context)
    await site.start()
    sock = site._server.sockets[0]  # type: ignore[union-attr]
    scheme = "https" if ssl_context else "http"
    await announce_and_wait(name, f"{scheme}://{host}:{sock.getsockname()[1]}", ready_file)
    await runner.cleanup()


class AdminClient:
    """Async client for a lab service's `/_lab/` admin API: reset, faults, the audit log."""

    def __init__(self, url: str, timeout: float = 30.0, ca_file: Path | str | None = None) -> None:
        """`ca_file`: the CA to trust when the service answers HTTPS (lab/tls.py's LabCa.ca_file)."""
        import httpx

        self.url = url.rstrip("/")
        verify = ssl.create_default_context(cafile=str(ca_file)) if ca_file else True
        self._client = httpx.AsyncClient(base_url=self.url, timeout=timeout, verify=verify)

    async def _req(self, method: str, path: str, **kw: Any) -> Any:
        r = await self._client.request(method, path, **kw)
        r.raise_for_status()
        return r.json()

    async def reset(self) -> dict:
        return await self._req("POST", "/_lab/reset")

    async def add_fault(self, match: dict, action: dict, count: int = 1, skip: int = 0, *,
                        after: int | None = None) -> int:  # fmt: skip
        """The next `count` requests matching `match` get `action` (a status, a delay, a dropped connection), once
        `skip` matching ones went through and, with `after` (a fault's id), only once that fault was served
        (lab/faults.py)."""
        body = {"match": match, "action": action, "count": count, "skip": skip, "after": after}
        return (await self._req("POST", "/_lab/faults", json=body))["id"]

    async def faults(self) -> list[dict]:
        """The armed faults, with what is left of each (`remaining`, `skip`) and how often it was `served`."""
        return (await self._req("GET", "/_lab/faults"))["faults"]

    async def clear_faults(self) -> None:
        await self._req("DELETE", "/_lab/faults")

    async def audit(self, since: int = 0, writes: bool = False) -> list[dict]:
        return (await self.audit_page(since, writes))["entries"]

    async def audit_page(self, since: int = 0, writes: bool = False) -> dict:
        params = {"since": since, **({"writes": 1} if writes else {})}
        return await self._req("GET", "/_lab/audit", params=params)

    async def audit_cursor(self) -> int:
        """The sequence number of the latest audit entry: pass it as `since` to see only what follows."""
        return (await self._req("GET", "/_lab/audit/cursor"))["next"]

    async def aclose(self) -> None:
        await self._client.aclose()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()
