"""Assembling and running the emulator (in-process or as ``python -m lab.k8s``)."""

from __future__ import annotations

import json
import logging
import os
import tempfile

from aiohttp import web

from lab.loopback import announce_and_wait

from . import evidence
from .api import Api
from .controllers.composite import Controllers
from .labadmin import dump_objects, validate_jobs_config
from .seed import seed_objects
from .store import Store

log = logging.getLogger("lab.k8s")


class Emulator:
    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        config: dict | None = None,
        state_file: str | None = None,
        users: dict[str, str] | None = None,
    ):
        self.host, self.port = host, port
        self.store = Store(config)
        self.api = Api(self.store, users)
        self.controllers = Controllers(self.api, new_emulator=Emulator)  # a CAPI workload cluster's API server
        self.state_file = state_file
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def start(self, seeds: list[list[dict]] | None = None) -> str:
        if self.state_file and os.path.exists(self.state_file):
            with open(self.state_file) as f:
                data = json.load(f)
            async with self.store.lock:
                seed_objects(self.store, data.get("objects") or [])
                if isinstance(data.get("config"), dict):
                    self.store.config.update({k: v for k, v in data["config"].items() if k in self.store.config})
        for objs in seeds or []:
            async with self.store.lock:
                seed_objects(self.store, objs)
        self.runner = web.AppRunner(self.api.app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, self.host, self.port, shutdown_timeout=2.0)
        await site.start()
        sock = site._server.sockets[0]  # type: ignore[union-attr]
        self.port = sock.getsockname()[1]
        self.url = f"http://{self.host}:{self.port}"
        self.controllers.start(self.url)
        return self.url

    def save_state(self) -> None:
        if not self.state_file:
            return
        data = {"objects": dump_objects(self.store), "config": dict(self.store.config)}
        d = os.path.dirname(os.path.abspath(self.state_file))
        os.makedirs(d, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=d, prefix=".lab-k8s-state-")
        with os.fdopen(fd, "w") as f:
            json.dump(data, f)
        os.replace(tmp, self.state_file)

    async def stop(self) -> None:
        await self.controllers.stop()
        for w in list(self.store.watchers):
            self.store.close_watcher(w)
        if self.state_file:
            async with self.store.lock:
                self.save_state()
        if self.runner:
            await self.runner.cleanup()


async def serve(
    host: str,
    port: int,
    ready_file: str | None,
    seed_files: list[str],
    state_file: str | None,
    config: dict,
    users: dict[str, str] | None = None,
) -> None:
    seeds = []
    config = dict(config)
    for path in seed_files:
        seeds.append(load_objects_file(path))
        config.update(load_config_file(path))
    emu = Emulator(host, port, config, state_file, users)
    url = await emu.start(seeds)
    writer = evidence.Writer(url).start()  # only with LAB_K8S_EVIDENCE_DIR set
    await announce_and_wait("lab.k8s", url, ready_file)
    await emu.stop()
    await writer.stop()


def load_token_file(path: str) -> dict[str, str]:
    """kube-apiserver's --token-auth-file: CSV lines `token,user,uid[,"groups"]`; token -> user."""
    import csv

    with open(path, newline="") as f:
        return {row[0]: row[1] for row in csv.reader(f) if len(row) >= 2 and row[0].strip()}


def load_objects_file(path: str) -> list[dict]:
    """A seed file: {"objects": [...]}, a list of objects, YAML documents, or a Fleet file."""
    import yaml

    with open(path) as f:
        text = f.read()
    docs = [d for d in yaml.safe_load_all(text) if d is not None]
    if len(docs) == 1 and isinstance(docs[0], dict):
        d = docs[0]
        if "objects" in d and not any(k in d for k in ("nodes", "workloads", "namespaces")):
            return list(d["objects"] or [])
        if "apiVersion" in d and "kind" in d:
            if d["kind"].endswith("List") and "items" in d:
                return list(d["items"])
            return [d]
        from lab.fleet import Fleet

        return Fleet.model_validate(d).to_objects()
    if len(docs) == 1 and isinstance(docs[0], list):
        return list(docs[0])
    return [d for d in docs if isinstance(d, dict)]


def load_config_file(path: str) -> dict:
    """Emulator settings a seed or fleet file may carry next to its objects: `jobs` (outcome rules) and
    `rebootSeconds` and `mig` (lab/fleet.py MigSettings)."""
    import yaml

    with open(path) as f:
        docs = [d for d in yaml.safe_load_all(f.read()) if d is not None]
    if len(docs) != 1 or not isinstance(docs[0], dict):
        return {}
    out: dict = {}
    if isinstance(docs[0].get("jobs"), dict):
        out["jobs"] = validate_jobs_config(docs[0]["jobs"])
    if docs[0].get("rebootSeconds") is not None:
        out["rebootSeconds"] = float(docs[0]["rebootSeconds"])
    if isinstance(docs[0].get("mig"), dict):
        from lab.fleet import MigSettings

        out.update(MigSettings.model_validate(docs[0]["mig"]).config())
    return out
