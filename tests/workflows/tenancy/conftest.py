"""Clusters-and-tenants tier: the session dev server, the Kubernetes emulator (management cluster; the CAPI
simulator starts workload clusters in it) and, when it can run here, the real NetBox of tests/activities/netbox."""

from __future__ import annotations

import uuid

import pytest
import pytest_asyncio

from tests.activities.netbox.conftest import netbox_lab, netbox_token_file

_REUSED = (
    netbox_lab,
    netbox_token_file,
)  # the NetBox fixtures of tests/activities/netbox, reused (one NetBox per session)


@pytest.fixture(scope="session")
def tenant_netbox(request):
    """(url, token file) of the real NetBox, or None where it cannot run (tenant records then skipped)."""
    from lab.netbox import NetBoxUnavailable, check_available

    try:
        check_available()
    except NetBoxUnavailable:
        return None
    lab = request.getfixturevalue("netbox_lab")
    return lab.url, request.getfixturevalue("netbox_token_file"), lab.token


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def tenant_worker(client, kubeconfig_path, tenant_netbox):
    """A real worker built like production (worker.registry.build) on a random task queue; one for the session
    (a worker's start, its workflows checked in the sandbox, costs seconds; the emulators are reset per test)."""
    from worker import registry
    from worker.config import WorkerSettings

    extra = {}
    if tenant_netbox:
        extra = {"netbox_url": tenant_netbox[0], "netbox_token": f"file:{tenant_netbox[1]}"}
    registration = registry.build(WorkerSettings(kubeconfig=str(kubeconfig_path), metrics_port=0, **extra))
    async with registry.new_worker(client, registration, f"tenants-{uuid.uuid4().hex[:8]}") as worker:
        yield worker
    await registration.close()
