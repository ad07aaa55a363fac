"""The simulated control plane: every controller of this package, run in one reconcile loop.

One task. Each pass looks only at what changed (the store's dirty set: written objects and their controllers)
and at objects whose timer is due (the store's timer heap), so a pass costs O(changes), not O(objects); the
controllers run in a fixed order within a pass (`Controllers.chain`); shutdown cancels the one task and with it
every timer."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from .clusterapi import ClusterApi, WorkloadEmulator
from .garbage import GarbageCollector
from .jobs import Jobs
from .kai import KaiGangs, KaiQueues
from .kubelet import Kubelet
from .migmanager import MigManager
from .namespaces import NamespaceLifecycle
from .reboots import Reboots
from .replicasets import ReplicaSets
from .scheduler import Scheduler
from .vcluster import VClusters

if TYPE_CHECKING:
    from ..api import Api

log = logging.getLogger("lab.k8s.controllers")


class Controllers:
    """`new_emulator` makes the API server of a Cluster API workload cluster (lab/k8s/server.py `Emulator`)."""

    def __init__(self, api: Api, new_emulator: Callable[[], WorkloadEmulator]) -> None:
        self.store = api.store
        self.reboots = Reboots(api)
        self.cluster_api = ClusterApi(api, new_emulator)
        self.vclusters = VClusters(api)
        self.chain = (
            NamespaceLifecycle(api),
            GarbageCollector(api),
            ReplicaSets(api),
            Scheduler(api),
            Jobs(api),
            KaiGangs(api),
            self.reboots,
            MigManager(api),
            Kubelet(api),
            self.cluster_api,
            KaiQueues(api),
            self.vclusters,
        )
        self._task: asyncio.Task | None = None

    def start(self, url: str) -> None:
        """`url`: this emulator's own, once serving (the vCluster kubeconfigs point there)."""
        self.vclusters.url = url
        self.reboots.resume()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="lab-controllers")

    async def stop(self) -> None:
        await self.cluster_api.stop()
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task

    async def _run(self) -> None:
        store = self.store
        while True:
            async with store.lock:
                store.kick.clear()
                try:
                    nxt = self.reconcile()
                except Exception:  # a controller bug must not kill the server
                    log.exception("controller reconcile failed")
                    nxt = 1.0
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(store.kick.wait(), max(0.01, min(nxt, 1.0)))

    def reconcile(self) -> float:
        """One pass (lock held); the seconds until the next timer is due (at most 1)."""
        store = self.store
        now = time.monotonic()
        work = store.dirty | store.pop_due(now)
        store.dirty = set()
        for controller in self.chain:
            controller.reconcile(work, now)
        nxt = store.next_timer()
        return 1.0 if nxt is None else min(1.0, nxt - time.monotonic())
