"""Two sites for a test, without the whole lab (issue 42): per site its own Kubernetes emulator and BMC lab, a
worker process given only that site's kubeconfig (its own identity in the emulator's token file, so the emulator's
audit names each caller) and BMC credentials; and a central worker with the site map and neither.

The `two_sites` fixture (tests/conftest.py) starts the emulators and BMC labs once per module; a test starts and
stops the workers (`await sites.start_workers(client)`, `sites.stop_worker(site)`), and reads who called each
site's API server with `await sites.callers(site)`."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from temporalio.api.enums.v1 import TaskQueueType

from activities.firmware.integration import Bmcs
from activities.sites import site_task_queue
from lab.k8s.admin import EmulatorAdmin, kubeconfig
from lab.k8s.process import EmulatorProcess
from lab.loopback import write_secret_file
from lab.redfish import LabBmcs
from lab.runner import write_site_map
from tests.kube_helpers import checked_emulator
from tests.worker_process import spawn_worker, stop_worker, wait_polling, worker_env

SITE_PICKUP_SECONDS = 2  # a site whose worker is gone shows in its runs' details this soon
NODES_PER_SITE = 2  # a rollout's one batch: the test is about where calls go, not about batches
BMCS_PER_SITE = 2
POD_START_SECONDS = 0.3
GRACE_SCALE = 0.02


@dataclass
class Site:
    name: str  # site-1, site-2
    cluster: str  # lab-1, lab-2: the kubeconfig context, and the Rollout's `cluster`
    folder: Path
    emulator: EmulatorProcess
    bmcs: LabBmcs
    identity: str  # the site worker's user name in its emulator's token file: what the audit names it
    kubeconfig: Path  # the site worker's: its cluster only, its identity's token
    bmc_credentials: Path  # this site's BMCs' user:password (another user and password at every site)
    worker: subprocess.Popen | None = None

    @property
    def task_queue(self) -> str:
        return site_task_queue(self.name)

    @property
    def log(self) -> Path:
        return self.folder / "worker.log"


@dataclass
class TwoSites:
    folder: Path
    sites: dict[str, Site]
    site_map: Path  # the central worker's MILLWRIGHT_SITE_MAP
    central_queue: str = field(default_factory=lambda: f"test-central-{uuid.uuid4().hex[:8]}")
    central: subprocess.Popen | None = None

    def __getitem__(self, site: str) -> Site:
        return self.sites[site]

    def site_worker_env(self, site: Site, address: str) -> dict[str, str]:
        """Only its own kubeconfig and BMC credentials; it polls its site's queue (MILLWRIGHT_SITE), and the central
        queue is where its fault events would start runs."""
        return worker_env(self.folder, address, site.kubeconfig, MILLWRIGHT_SITE=site.name,
                          MILLWRIGHT_TASK_QUEUE=self.central_queue,
                          **Bmcs.environment(bmc_credentials=f"file:{site.bmc_credentials}"))  # fmt: skip

    def central_env(self, address: str) -> dict[str, str]:
        """The site map, and neither a kubeconfig nor BMC credentials."""
        return worker_env(self.folder, address, None, MILLWRIGHT_SITE_MAP=str(self.site_map),
                          MILLWRIGHT_SITE_PICKUP_SECONDS=str(SITE_PICKUP_SECONDS),
                          MILLWRIGHT_TASK_QUEUE=self.central_queue)  # fmt: skip

    async def start_worker(self, client, site: str) -> None:
        """`site`'s worker as its own process (unless it runs already: tests share it); back once it polls its
        site's queue."""
        one = self.sites[site]
        if one.worker is not None and one.worker.poll() is None:
            return
        one.worker = spawn_worker(self.site_worker_env(one, client.service_client.config.target_host), one.log)
        await wait_polling(client, one.task_queue, one.worker, one.log,
                           queue_type=TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY)  # fmt: skip

    def stop_worker(self, site: str) -> None:
        """Kill `site`'s worker (SIGKILL: a site cut off, not a graceful shutdown)."""
        worker = self.sites[site].worker
        if worker is not None:
            stop_worker(worker)

    async def start_workers(self, client) -> None:
        """Every site's worker and the central worker, started together (each imports its modules: seconds on a
        loaded machine)."""
        await asyncio.gather(self.start_central(client), *(self.start_worker(client, site) for site in self.sites))

    async def start_central(self, client) -> None:
        if self.central is not None and self.central.poll() is None:
            return
        log = self.folder / "central-worker.log"
        self.central = spawn_worker(self.central_env(client.service_client.config.target_host), log)
        await wait_polling(client, self.central_queue, self.central, log)

    def stop_workers(self) -> None:
        for site in self.sites:
            self.stop_worker(site)
        if self.central is not None:
            stop_worker(self.central)

    async def callers(self, site: str, since: int = 0) -> set[str]:
        """The identities that called the site's API server after audit entry `since` (a token it does not know is
        `system:anonymous`, refused 401). Entries with no user are the emulator's own controllers' writes."""
        async with EmulatorAdmin(self.sites[site].emulator.url) as admin:
            return {entry["user"] for entry in await admin.audit(since) if "user" in entry}

    async def audit_cursor(self, site: str) -> int:
        async with EmulatorAdmin(self.sites[site].emulator.url) as admin:
            return await admin.audit_cursor()


@contextlib.contextmanager
def two_sites(folder: Path, names: tuple[str, ...] = ("site-1", "site-2")) -> Iterator[TwoSites]:
    """The sites' emulators and BMC labs, each site's worker kubeconfig and BMC credentials, and the site map;
    the workers are the test's to start (`start_workers`), and are stopped at the end."""
    with contextlib.ExitStack() as stack:
        sites = [stack.enter_context(_site(folder / name, name)) for name in names]
        both = TwoSites(
            folder,
            {s.name: s for s in sites},
            write_site_map(folder / "site-map.json", {s.name: (s.cluster, s.bmcs.bmc_urls.values()) for s in sites}),
        )
        stack.callback(both.stop_workers)
        yield both


@contextlib.contextmanager
def _site(folder: Path, name: str) -> Iterator[Site]:
    folder.mkdir(parents=True)
    cluster = "lab-" + name.removeprefix("site-")
    identity, token = f"millwright-{name}", secrets.token_urlsafe(18)
    (folder / "tokens.csv").write_text(f"{token},{identity},{identity}\n")
    password = secrets.token_urlsafe(12)
    credentials = write_secret_file(folder / "bmc-credentials", f"admin-{name}:{password}")
    with checked_emulator(folder, pod_start_seconds=POD_START_SECONDS, grace_scale=GRACE_SCALE,
                          extra_args=["--token-auth-file", str(folder / "tokens.csv")]) as emulator, \
            LabBmcs(count=BMCS_PER_SITE, prefix=f"{name}-bmc-", user=f"admin-{name}", password=password) as bmcs:  # fmt: skip
        config = folder / "kubeconfig"
        config.write_text(yaml.safe_dump(kubeconfig(emulator.url, cluster, token=token, user=identity)))
        yield Site(name, cluster, folder, emulator, bmcs, identity, config, credentials)
