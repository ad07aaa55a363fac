"""Redfish tier fixtures: the lab's HGX BMC emulator (lab/redfish.py) and sushy-tools (lab/sushy.py).

Reusable by other tiers (e.g. burn-in workflow tests): import them from here, as tests/workflows/fabric does with NetBox's
(``from tests.activities.redfish import conftest as _redfish; lab_bmcs = _redfish.lab_bmcs`` ...).

* ``lab_bmcs`` (session): a ``LabBmcs`` child process with 4 default servers (8 x NVIDIA H200, DEFAULT_FIRMWARE,
  powered Off) named ``hgx-<suffix>-001`` .. ``-004`` (``lab_bmcs.names``); ``lab_bmcs.url`` is the admin URL,
  ``lab_bmcs.bmc_urls[name]`` each BMC's base URL for ``sushy.Sushy(url, ...)``; credentials ``BMC_USER`` /
  ``BMC_PASSWORD`` (random per session; also the ``bmc_credentials`` fixture and ``bmc_secret_file``, a 0600 file
  holding ``user:password``).
* ``bmc_admin`` (per test): a ``BmcAdmin`` on ``lab_bmcs`` after ``POST /_lab/reset`` (servers back to their spec,
  sessions, faults, audit and config cleared).
* ``redfish`` (per test): a factory ``redfish(name, auth="basic"|"session"|"either", password=None, **sushy_kw)``
  -> ``sushy.Sushy`` on that lab BMC; every root it made is closed (its session logged out) at teardown.
* ``https_bmcs`` (session): a ``LabBmcs`` with 1 server (``tls-<suffix>-001``) whose BMC answers HTTPS with a
  certificate of the session's lab CA (``lab_ca``, tests/conftest.py) naming only 127.0.0.1; same credentials.
* ``sushy_tools`` (session): a ``SushyTools`` (fake driver, Basic auth via a bcrypt htpasswd) with 3 systems named
  ``st-<suffix>-001`` .. ``-003``; system 001 starts On, the others Off (power changes land 0-11 s later; state is
  shared by every test of the session, so read it rather than assume it). Credentials ``ST_USER`` / ``ST_PASSWORD``.
"""

from __future__ import annotations

import contextlib
import uuid

import pytest
import pytest_asyncio

SUFFIX = uuid.uuid4().hex[:5]
BMC_USER = "admin"
BMC_PASSWORD = f"bmc-pw-{uuid.uuid4().hex}"
ST_USER = "admin"
ST_PASSWORD = f"st-pw-{uuid.uuid4().hex}"


@pytest.fixture(scope="session")
def lab_bmcs():
    from lab.redfish import LabBmcs

    with LabBmcs(count=4, prefix=f"hgx-{SUFFIX}-", user=BMC_USER, password=BMC_PASSWORD) as bmcs:
        yield bmcs


@pytest.fixture(scope="session")
def https_bmcs(lab_ca):
    from lab.redfish import LabBmcs

    with LabBmcs(count=1, prefix=f"tls-{SUFFIX}-", user=BMC_USER, password=BMC_PASSWORD,
                 tls=lab_ca.issue("bmc", ["127.0.0.1"])) as bmcs:  # fmt: skip
        yield bmcs


@pytest.fixture(scope="session")
def bmc_credentials() -> tuple[str, str]:
    return BMC_USER, BMC_PASSWORD


@pytest.fixture(scope="session")
def bmc_secret_file(tmp_path_factory):
    from lab.loopback import write_secret_file

    return write_secret_file(tmp_path_factory.mktemp("bmc") / "credentials", f"{BMC_USER}:{BMC_PASSWORD}")


@pytest_asyncio.fixture(loop_scope="session")
async def bmc_admin(lab_bmcs):
    """The lab BMCs' admin API, every server reset to its spec before the test."""
    from lab.redfish import BmcAdmin

    admin = BmcAdmin(lab_bmcs.url)
    await admin.reset()
    yield admin
    await admin.aclose()


@pytest.fixture
def redfish(lab_bmcs):
    import sushy
    from sushy import auth as sushy_auth

    kinds = {"basic": sushy_auth.BasicAuth, "session": sushy_auth.SessionAuth, "either": sushy_auth.SessionOrBasicAuth}
    made = []

    def connect(name: str, auth: str = "basic", password: str | None = None, **kw) -> sushy.Sushy:
        kw.setdefault("server_side_retries", 0)  # tests that want sushy's 5xx retries pass their own
        kw.setdefault("server_side_retries_delay", 0.2)
        root = sushy.Sushy(lab_bmcs.bmc_urls[name], auth=kinds[auth](BMC_USER, password or BMC_PASSWORD), **kw)
        made.append(root)
        return root

    yield connect
    for root in made:
        with contextlib.suppress(Exception):  # the lab may have been reset meanwhile (the session is gone)
            root._auth.close()


@pytest.fixture(scope="session")
def sushy_tools():
    from lab.sushy import SushyTools

    with SushyTools(
        systems=[{"power_state": "On"}, {}, {}], prefix=f"st-{SUFFIX}-", user=ST_USER, password=ST_PASSWORD
    ) as st:
        yield st
