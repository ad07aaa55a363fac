"""Which kinds of request an emulator process served, kept for the least-privilege check.

The audit log is emptied by every ``/_lab/reset`` and capped; this summary is not. Each emulator
process (with every workload-cluster emulator the Cluster API simulator starts inside it) counts
one entry per distinct (userAgent, verb, group, resource, subresource, namespace) — for discovery
and other non-resource requests the path instead of the resource — and serves them at
``GET /_lab/audit/requests``.

With ``LAB_K8S_EVIDENCE_DIR`` set (tests/deploy/conftest.py sets it for a whole pytest
session, and children inherit it), ``python -m lab.k8s`` also writes them to
``<dir>/lab-k8s-<pid>.json`` — at start, about every second while they change, and at exit — so
``collect(dir)`` finds every emulator a session started, running or gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import tempfile
from typing import Any

EVIDENCE_DIR_ENV = "LAB_K8S_EVIDENCE_DIR"
KEY_FIELDS = ("userAgent", "verb", "group", "resource", "subresource", "namespace", "path")

# Process-wide: the host emulator and the workload emulators it runs share one summary.
_REQUESTS: dict[tuple[str, ...], int] = {}
_version = 0


def note(entry: dict) -> None:
    """Count one audit entry (called by Store.audit_add for every request and controller write)."""
    global _version
    if entry.get("resource"):
        key = (*tuple(str(entry.get(f) or "") for f in KEY_FIELDS[:-1]), "")
    else:  # discovery (/api, /apis/<group>/<version>, /version, ...) or an unknown path
        path = str(entry.get("path") or "").split("?", 1)[0]
        key = (str(entry.get("userAgent") or ""), str(entry.get("verb") or ""), "", "", "", "", path)
    _REQUESTS[key] = _REQUESTS.get(key, 0) + 1
    _version += 1


def requests() -> list[dict[str, Any]]:
    return [{**dict(zip(KEY_FIELDS, key)), "count": n} for key, n in sorted(_REQUESTS.items())]


def snapshot(url: str) -> dict[str, Any]:
    return {"url": url, "pid": os.getpid(), "requests": requests()}


def _write(path: str, url: str) -> None:
    d = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".lab-k8s-")
    with os.fdopen(fd, "w") as f:
        json.dump(snapshot(url), f)
    os.replace(tmp, path)


class Writer:
    """Keeps ``<dir>/lab-k8s-<pid>.json`` current while the emulator runs (a no-op without the env var)."""

    def __init__(self, url: str, directory: str | None = None, interval: float = 1.0) -> None:
        self.url = url
        directory = directory if directory is not None else os.environ.get(EVIDENCE_DIR_ENV)
        self.path = os.path.join(directory, f"lab-k8s-{os.getpid()}.json") if directory else None
        self.interval = interval
        self._task: asyncio.Task | None = None
        self._written = -1

    def flush(self) -> None:
        if self.path is None or self._written == _version:
            return
        try:
            _write(self.path, self.url)
            self._written = _version
        except OSError:
            pass  # the session's directory is gone: nobody is collecting any more

    async def _run(self) -> None:
        while True:
            self.flush()
            await asyncio.sleep(self.interval)

    def start(self) -> Writer:
        if self.path is not None:
            self.flush()
            self._task = asyncio.get_running_loop().create_task(self._run(), name="lab-k8s-evidence")
        return self

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self.flush()


def collect(directory: str, timeout: float = 5.0) -> list[dict[str, Any]]:
    """Every emulator's summary under ``directory``: a running one is asked for its current counts,
    a stopped one's last file is read; plus this process's own, if it ran emulators in-process.
    [{"url", "pid", "live", "requests": [...]}]"""
    import httpx

    out = [{**snapshot("in-process"), "live": True}] if _REQUESTS else []
    for name in sorted(os.listdir(directory)):
        if not (name.startswith("lab-k8s-") and name.endswith(".json")):
            continue
        try:
            with open(os.path.join(directory, name)) as f:
                data = json.load(f)
        except (OSError, ValueError):
            continue
        data["live"] = False
        try:
            r = httpx.get(f"{data['url']}/_lab/audit/requests", timeout=timeout)
            if r.status_code == 200 and r.json().get("pid") == data["pid"]:
                data.update(r.json(), live=True)
        except (httpx.HTTPError, ValueError):
            pass
        out.append(data)
    return out
