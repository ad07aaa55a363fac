"""Burn-in tier: the lab's BMCs (8 HGX servers), the lab's hosts running the real host agent over simulated
GPUs, and a Millwright worker on a random task queue, all against the session's dev server.

* ``burnin_bmcs`` (session): ``LabBmcs`` with 8 servers (``burnin_bmcs.names``), BMC password random per session.
* ``bmc_admin`` (per test): its admin API after a reset (servers Off, no faults, empty audit).
* ``lab_hosts`` (session): ``LabHosts`` — an in-process host agent for each powered-on server.
* ``burnin_worker`` (session): the worker's task queue; BMC credentials from ``MILLWRIGHT_BMC_CREDENTIALS`` =
  ``file:<0600 file>``, the way a deployment mounts them.
"""

from __future__ import annotations

import uuid

import pytest
import pytest_asyncio

BMC_USER = "admin"
BMC_PASSWORD = f"burnin-bmc-pw-{uuid.uuid4().hex}"


@pytest.fixture(scope="session")
def burnin_bmcs():
    from lab.redfish import LabBmcs

    with LabBmcs(count=8, prefix=f"bi-{uuid.uuid4().hex[:4]}-", user=BMC_USER, password=BMC_PASSWORD,
                 power_delay=0.1) as bmcs:  # fmt: skip
        yield bmcs


@pytest.fixture(scope="session")
def bmc_secret_file(tmp_path_factory):
    from lab.loopback import write_secret_file

    return write_secret_file(tmp_path_factory.mktemp("burnin-bmc") / "credentials", f"{BMC_USER}:{BMC_PASSWORD}")


@pytest_asyncio.fixture(loop_scope="session")
async def bmc_admin(burnin_bmcs, lab_hosts):
    from lab.redfish import BmcAdmin

    admin = BmcAdmin(burnin_bmcs.url)
    await admin.reset()
    await admin.config(power_delay=0.1)
    await lab_hosts.poll_once()  # agents of the previous test's servers stop now, not at the next poll
    yield admin
    await admin.aclose()


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def lab_hosts(client, burnin_bmcs):
    from lab.hosts import LabHosts

    async with LabHosts(client, burnin_bmcs.url, boot_delay=0.2, poll_interval=0.1) as hosts:
        yield hosts


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def burnin_worker(client, kubeconfig_path, bmc_secret_file):
    from tests.workers import settings_worker

    async with settings_worker(client, kubeconfig_path, "burnin", bmc_credentials=f"file:{bmc_secret_file}") as queue:
        yield queue
