"""The worker process (`python -m worker`) against the session dev server, as deployed."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import pytest
import pytest_asyncio
from temporalio.client import WorkflowFailureError

from lab.loopback import free_port
from tests.worker_process import REPO, spawn_worker, wait_polling, worker_env

pytestmark = pytest.mark.asyncio(loop_scope="session")

KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters: [{name: nowhere, cluster: {server: "http://127.0.0.1:9"}}]
users: [{name: nowhere, user: {}}]
contexts: [{name: nowhere, context: {cluster: nowhere, user: nowhere}}]
current-context: nowhere
"""


def bogus_kubeconfig(tmp: Path) -> Path:
    path = tmp / "kubeconfig"
    path.write_text(KUBECONFIG)
    return path


class WorkerProcess:
    def __init__(self, proc: subprocess.Popen, task_queue: str, metrics_url: str, log: Path) -> None:
        self.proc, self.task_queue, self.metrics_url, self.log = proc, task_queue, metrics_url, log

    def output(self) -> str:
        return self.log.read_text()


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def worker_process(client, temporal_address, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("worker")
    task_queue = f"test-worker-{uuid.uuid4().hex[:8]}"
    port = free_port()
    log = tmp / "worker.log"
    env = worker_env(
        tmp,
        temporal_address,
        bogus_kubeconfig(tmp),
        MILLWRIGHT_TASK_QUEUE=task_queue,
        MILLWRIGHT_METRICS_PORT=str(port),
        MILLWRIGHT_SHUTDOWN_GRACE_SECONDS="5",
    )
    proc = spawn_worker(env, log)
    wp = WorkerProcess(proc, task_queue, f"http://127.0.0.1:{port}/metrics", log)
    try:
        await wait_polling(client, task_queue, proc, log)
        yield wp
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


async def test_start_log_names_address_queue_metrics_and_registrations(worker_process, temporal_address):
    out = worker_process.output()
    assert temporal_address in out and "namespace default" in out
    assert worker_process.task_queue in out
    assert worker_process.metrics_url in out
    assert "NodeMaintenance" in out and "activities" in out


async def test_invalid_input_fails_the_run_fast_naming_the_field(client, worker_process):
    # What a UI user typing bad JSON produces: a raw dict payload, no client-side model.
    handle = await client.start_workflow(
        "NodeMaintenance",
        {"cluster": "nowhere", "node": "Not_A_Node!", "reason": "test", "surprise": 1},
        id=f"bad-input-{uuid.uuid4().hex[:8]}",
        task_queue=worker_process.task_queue,
    )
    started = time.monotonic()
    with pytest.raises(WorkflowFailureError) as info:
        await asyncio.wait_for(handle.result(), timeout=15)
    assert time.monotonic() - started < 10
    message = str(info.value.cause)
    assert "node" in message and "surprise" in message, message
    assert (await handle.describe()).status.name == "FAILED"


async def test_metrics_endpoint_serves_temporal_families(worker_process):
    async with httpx.AsyncClient(trust_env=False, timeout=5) as http:
        resp = await http.get(worker_process.metrics_url)
    assert resp.status_code == 200
    families = {line.split()[2] for line in resp.text.splitlines() if line.startswith("# TYPE")}
    assert any(f.startswith("temporal_") for f in families), sorted(families)[:20]
    assert "temporal_num_pollers" in families or "temporal_worker_task_slots_available" in families
    # the run failed by the previous test is counted
    assert "temporal_workflow_failed" in families, sorted(families)


async def test_sigterm_shuts_down_gracefully_with_exit_0(worker_process):
    worker_process.proc.send_signal(signal.SIGTERM)
    started = time.monotonic()
    rc = await asyncio.to_thread(worker_process.proc.wait, 15)
    assert rc == 0, worker_process.output()
    assert time.monotonic() - started < 10
    out = worker_process.output()
    assert "received SIGTERM" in out and "stopped cleanly" in out
    assert "Traceback" not in out


def run_worker(env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "worker"], env=env, cwd=REPO, capture_output=True, text=True, timeout=30
    )


async def test_unreachable_server_is_one_clear_line(tmp_path):
    env = worker_env(tmp_path, f"127.0.0.1:{free_port()}", bogus_kubeconfig(tmp_path))
    result = await asyncio.to_thread(run_worker, env)
    assert result.returncode == 1
    assert "cannot connect to Temporal at 127.0.0.1:" in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1


async def test_missing_kubeconfig_is_one_clear_line(tmp_path, temporal_address):
    env = worker_env(tmp_path, temporal_address, bogus_kubeconfig(tmp_path))
    env["MILLWRIGHT_KUBECONFIG"] = str(tmp_path / "absent.yaml")
    result = await asyncio.to_thread(run_worker, env)
    assert result.returncode == 1
    assert "kubeconfig not found" in result.stderr and "absent.yaml" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("flag", ["--help", "--version"])
async def test_help_and_version_answer_without_connecting(flag):
    # No Temporal, no kubeconfig: both answer from the code alone, exit 0.
    done = subprocess.run([sys.executable, "-m", "worker", flag], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done
    assert (
        ("MILLWRIGHT_KUBECONFIG" in done.stdout) if flag == "--help" else done.stdout.startswith("millwright-worker ")
    )
    cli = subprocess.run([sys.executable, "-m", "starter", flag], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert cli.returncode == 0 and (
        "node" in cli.stdout if flag == "--help" else cli.stdout.startswith("millwright ")
    ), cli


def test_each_integration_says_at_start_what_it_is_configured_as(tmp_path):
    """One start-up line per integration, in the list's order, naming references, never secrets; a system without
    settings (webhooks, entities) has none."""
    from worker.config import WorkerSettings
    from worker.main import integrations

    kubeconfig = bogus_kubeconfig(tmp_path)
    settings = WorkerSettings(kubeconfig=str(kubeconfig), netbox_url="https://netbox.example", netbox_token="file:/t",
                              ironic_url="http://ironic:6385", bmc_credentials="env:BMC", bmc_verify_tls=False,
                              prometheus_ca_bundle="file:/ca.pem")  # fmt: skip
    lines = integrations(settings)
    assert lines[:-1] == [
        ("kubeconfig", str(kubeconfig)),
        ("NetBox", "https://netbox.example (token file:/t, default CAs)"),
        (
            "UFM",
            "not configured: its activities fail with UfmNotConfigured (set MILLWRIGHT_UFM_URL and "
            "MILLWRIGHT_UFM_CREDENTIALS)",
        ),
        ("Ironic", "http://ironic:6385 (token none: noauth, default CAs)"),
        ("BMCs (Redfish)", "default credentials env:BMC, TLS verification OFF"),
        (
            "Prometheus",
            "GPU faults from nowhere (MILLWRIGHT_PROMETHEUS_URL not set), a gate's URL with its query, "
            "CA bundle file:/ca.pem",
        ),
    ]
    assert lines[-1][0] == "Usage reports" and lines[-1][1].startswith("to nowhere")


def test_an_integrations_environment_is_set_by_its_own_field_names():
    """The lab writes a worker's settings through the integration each serves (lab/runner.py): a name the
    integration does not have is refused there, not silently ignored by the worker."""
    from activities.netbox.integration import NetBox

    assert NetBox.environment(netbox_url="https://n") == {"MILLWRIGHT_NETBOX_URL": "https://n"}
    with pytest.raises(ValueError, match="NetBox has no setting netbox_uri"):
        NetBox.environment(netbox_uri="https://n")


async def test_half_configured_versioning_is_one_clear_line(tmp_path, temporal_address):
    env = worker_env(tmp_path, temporal_address, bogus_kubeconfig(tmp_path))
    env["MILLWRIGHT_DEPLOYMENT_NAME"] = "millwright"
    result = await asyncio.to_thread(run_worker, env)
    assert result.returncode == 1
    assert "Worker Versioning is half configured: MILLWRIGHT_BUILD_ID is not set" in result.stderr
    assert "Traceback" not in result.stderr
