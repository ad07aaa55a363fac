"""Fixtures: one emulator subprocess per session, reset before each test."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from kubernetes import client, config

from lab.k8s.admin import kubeconfig
from tests.kube_helpers import checked_emulator

POD_START = 0.1
GRACE_SCALE = 0.02


@pytest.fixture(scope="session")
def emulator(tmp_path_factory):
    with checked_emulator(tmp_path_factory.mktemp("k8s"), pod_start_seconds=POD_START, grace_scale=GRACE_SCALE) as emu:
        yield emu


class Lab:
    """Synchronous admin helper for tests."""

    def __init__(self, url: str):
        self.url = url
        self.http = httpx.Client(base_url=url, timeout=30)

    def post(self, path: str, body: Any = None) -> Any:
        r = self.http.post(path, json=body)
        r.raise_for_status()
        return r.json()

    def reset(self) -> None:
        self.post("/_lab/reset")

    def seed(self, objects: list[dict]) -> dict:
        return self.post("/_lab/seed", {"objects": objects})

    def configure(self, **cfg: Any) -> dict:
        return self.post("/_lab/config", cfg)

    def fault(self, match: dict, action: dict, count: int = 1, skip: int = 0) -> int:
        return self.post("/_lab/faults", {"match": match, "action": action, "count": count, "skip": skip})["id"]

    def audit(self, since: int = 0, writes: bool = False) -> list[dict]:
        r = self.http.get("/_lab/audit", params={"since": since, **({"writes": 1} if writes else {})})
        r.raise_for_status()
        return r.json()["entries"]

    def dump(self) -> list[dict]:
        return self.http.get("/_lab/dump").json()["objects"]


@pytest.fixture
def lab(emulator) -> Iterator[Lab]:
    lab = Lab(emulator.url)
    lab.reset()
    yield lab
    lab.http.close()


@pytest.fixture
def api_client(emulator, lab):
    c = config.new_client_from_config_dict(kubeconfig(emulator.url, "lab"))
    yield c
    c.close()


@pytest.fixture
def core(api_client) -> client.CoreV1Api:
    return client.CoreV1Api(api_client)
