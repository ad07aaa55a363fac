"""The UFM tier: one UFM emulator per session (reset and seeded from a fleet before each test), a worker with
the UFM activities, and the real NetBox from tests/activities/netbox (imported, for the GUID cross-check)."""

from __future__ import annotations

import uuid

import pytest
import pytest_asyncio

# The real NetBox fixtures, reused (not redefined): the NetBox tests skip with one line without Python 3.12.
from tests.activities.netbox import conftest as _netbox

netbox_lab = _netbox.netbox_lab
netbox_token_file = _netbox.netbox_token_file
netbox_config = _netbox.netbox_config
nb = _netbox.nb
__all__ = ["nb", "netbox_config", "netbox_lab", "netbox_token_file"]

PASSWORD = f"ufm-pw-{uuid.uuid4().hex}"
TOKEN = f"ufmtok{uuid.uuid4().hex}"
SUFFIX = uuid.uuid4().hex[:5]


def ufm_http(ufm_stub):
    """An httpx client for out-of-band changes, as an operator would make them in UFM (Basic auth on /ufmRest)."""
    import httpx

    return httpx.AsyncClient(
        base_url=ufm_stub.url + "/ufmRest", auth=("admin", PASSWORD), headers={"User-Agent": "operator"}
    )


def make_fleet():
    from lab.fleet import Fleet, InfiniBandSpec, NodeGenerator

    return Fleet(
        cluster="lab",
        nodes=[NodeGenerator(prefix=f"ib{SUFFIX}-", count=6)],
        infiniband=InfiniBandSpec(fabric="lab-ib", ports_per_host=2, switches=2),
    )


@pytest.fixture(scope="session")
def fleet():
    return make_fleet()


@pytest.fixture(scope="session")
def ufm_stub():
    from lab.ufm import UfmStub

    with UfmStub(password=PASSWORD, token=TOKEN) as stub:
        yield stub


@pytest.fixture(scope="session")
def https_ufm_stub(lab_ca):
    """The emulator answering HTTPS (its admin API too), as a real UFM does, with a certificate of the session's lab
    CA (tests/conftest.py `lab_ca`) naming only 127.0.0.1; same credentials as `ufm_stub`."""
    from lab.ufm import UfmStub

    with UfmStub(password=PASSWORD, token=TOKEN, tls=lab_ca.issue("ufm", ["127.0.0.1"])) as stub:
        yield stub


CLIENT_SAN = "millwright-worker"  # the client certificate name `mtls_ufm_stub` associates with UFM's admin user


@pytest.fixture(scope="session")
def mtls_ufm_stub(lab_ca):
    """The emulator behind HTTPS that requires a client certificate of the session's lab CA (UFM's
    client_cert_authentication, Apache's SSLVerifyClient require); the name CLIENT_SAN authenticates as admin."""
    from lab.ufm import UfmStub

    with UfmStub(password=PASSWORD, token=TOKEN, tls=lab_ca.issue("ufm-mtls", ["127.0.0.1"]), client_ca=lab_ca.ca_file,
                 client_cert_sans=[{"san": CLIENT_SAN, "user": "admin"}]) as stub:  # fmt: skip
        yield stub


@pytest_asyncio.fixture(loop_scope="session")
async def ufm(ufm_stub, fleet):
    """The emulator's admin API; the fabric reset and seeded from the fleet before each test."""
    from lab.ufm import UfmAdmin, fleet_seed

    admin = UfmAdmin(ufm_stub.url)
    await admin.reset()
    await admin.seed(fleet_seed(fleet))
    yield admin
    await admin.aclose()


@pytest.fixture(scope="session")
def ufm_secret_file(tmp_path_factory):
    from lab.loopback import write_secret_file

    return write_secret_file(tmp_path_factory.mktemp("ufm") / "credentials", f"admin:{PASSWORD}")


@pytest.fixture(scope="session")
def ufm_config(ufm_stub, ufm_secret_file):
    from activities.support.secrets import SecretRef
    from activities.ufm.client import UfmConfig

    return UfmConfig(url=ufm_stub.url, credentials=SecretRef.parse(f"file:{ufm_secret_file}"))


async def _worker(client, ufm_config, netbox_cfg, workflows=None):
    """A worker with the UFM (and NetBox) activities and `workflows` (default: every workflow)."""
    from activities.netbox.activities import NetBoxActivities
    from activities.registration import activities_of
    from activities.ufm.activities import UfmActivities
    from worker import registry
    from workflows.catalog import WORKFLOWS

    registration = registry.Registration(
        workflows=list(workflows or WORKFLOWS),
        activities=activities_of(UfmActivities(ufm_config), NetBoxActivities(netbox_cfg)),
    )
    return registry.new_worker(client, registration, f"ufm-test-{uuid.uuid4().hex[:8]}")


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def ufm_worker(client, ufm_config):
    """A worker with every workflow and the UFM activities; NetBox not configured."""
    async with await _worker(client, ufm_config, None) as worker:
        yield worker


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def ufm_nb_worker(client, ufm_config, netbox_config):
    """The same with the real NetBox."""
    async with await _worker(client, ufm_config, netbox_config) as worker:
        yield worker


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def nb_fleet(client, ufm_nb_worker, nb, fleet):
    """NetBox bootstrapped and holding the fleet's hosts with their IB interfaces and port GUIDs."""
    from activities.netbox.models import CF_IB_PORT_GUID
    from workflows.inventory.bootstrap import InventoryBootstrap, InventoryBootstrapInput

    await client.execute_workflow(
        InventoryBootstrap.run, InventoryBootstrapInput(), id=f"inventory-bootstrap/ufm-{SUFFIX}",
        task_queue=ufm_nb_worker.task_queue,
    )  # fmt: skip
    site = nb.dcim.sites.create(name=f"ib-hall-{SUFFIX}", slug=f"ib-hall-{SUFFIX}", status="active")
    maker = nb.dcim.manufacturers.get(slug="nvidia")
    dtype = nb.dcim.device_types.create(manufacturer=maker.id, model=f"HGX IB {SUFFIX}", slug=f"hgx-ib-{SUFFIX}")
    role = nb.dcim.device_roles.get(slug="gpu-server")
    interfaces = {}
    for host, guids in fleet.ib_ports().items():
        dev = nb.dcim.devices.create(name=host, site=site.id, role=role.id, device_type=dtype.id, status="active")
        for i, guid in enumerate(guids):
            interfaces[(host, i)] = nb.dcim.interfaces.create(
                device=dev.id, name=f"ib{i}", type="infiniband-ndr", custom_fields={CF_IB_PORT_GUID: guid}
            )
    return interfaces
