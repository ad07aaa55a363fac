"""What every lab service shares: free loopback ports and the 'ready' handshake."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import tempfile

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


def write_ready_file(path: str, url: str) -> None:
    """Atomically tell the parent where the service listens: {"url", "pid"}."""
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".ready-")
    with os.fdopen(fd, "w") as f:
        json.dump({"url": url, "pid": os.getpid()}, f)
    os.replace(tmp, path)


async def announce_and_wait(name: str, url: str, ready_file: str | None) -> None:
    """Say where the service listens, then wait for SIGTERM or SIGINT."""
    print(f"{name} listening on {url}", flush=True)
    if ready_file:
        write_ready_file(ready_file, url)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
