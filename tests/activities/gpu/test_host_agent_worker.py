"""`python -m worker --host-agent` as a subprocess, against the session dev server: on a machine without NVML it
starts, polls millwright-host-<name>, and its check says NVML is unavailable (retryable error or failed result)."""

from __future__ import annotations

import signal
import uuid

import pytest
from temporalio.api.enums.v1 import TaskQueueType
from temporalio.client import WorkflowFailureError
from temporalio.exceptions import ActivityError, ApplicationError

from activities.gpu.models import GpuCheckResult, HostInfo, host_task_queue
from tests.activities.gpu.conftest import call_host
from tests.activities.gpu.test_activities import nvml_present
from tests.worker_process import spawn_worker, stop_worker, wait_polling, worker_env

pytestmark = pytest.mark.skipif(nvml_present(), reason="this machine has NVML; the test is for GPU-less hosts")


async def test_host_agent_process_reports_nvml_unavailable_and_stops_cleanly(client, temporal_address, call_queue,
                                                                             tmp_path):  # fmt: skip
    host = f"ha-{uuid.uuid4().hex[:8]}"
    queue = host_task_queue(host)
    log = tmp_path / "agent.log"
    # No kubeconfig: the host agent needs none.
    env = worker_env(tmp_path, temporal_address, tmp_path / "no-kubeconfig", MILLWRIGHT_HOST_NAME=host,
                     MILLWRIGHT_SHUTDOWN_GRACE_SECONDS="5")  # fmt: skip
    proc = spawn_worker(env, log, ("--host-agent",))
    try:
        await wait_polling(client, queue, proc, log, queue_type=TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY)
        out = log.read_text()
        assert f"polling task queue '{queue}' (host agent)" in out
        assert "registered 0 workflows () and 5 activities" in out

        with pytest.raises(WorkflowFailureError) as info:
            await call_host(client, call_queue, "host_gpu_check", queue, {"expected_count": 8})
        cause = info.value.cause
        assert isinstance(cause, ActivityError) and isinstance(cause.cause, ApplicationError)
        err = cause.cause
        assert err.type == "NvmlUnavailable" and not err.non_retryable
        assert f"NVML unavailable on host {host}" in err.message and "Library Not Found" in err.message

        raw = await call_host(client, call_queue, "host_gpu_check", queue,
                              {"expected_count": 8, "report_unavailable": True})  # fmt: skip
        result = GpuCheckResult.model_validate(raw)
        assert result.host == host and not result.passed
        assert [f.check for f in result.findings] == ["nvml_unavailable"]

        info_ = HostInfo.model_validate(await call_host(client, call_queue, "host_info", queue))
        assert info_.host == host and not info_.nvml_available and info_.facts.get("boot_id")

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0, log.read_text()
        assert "worker stopped cleanly" in log.read_text()
    finally:
        stop_worker(proc)


def test_unknown_argument_is_a_one_line_error(tmp_path):
    import subprocess
    import sys

    from tests.worker_process import REPO

    env = worker_env(tmp_path, "127.0.0.1:9", tmp_path / "kubeconfig")
    out = subprocess.run([sys.executable, "-m", "worker", "--hots-agent"], env=env, cwd=REPO, capture_output=True,
                         text=True, timeout=60)  # fmt: skip
    assert out.returncode == 1
    assert (
        out.stderr.strip() == "millwright-worker: error: unknown arguments: --hots-agent "
        "(usage: millwright-worker [--host-agent] [--help] [--version])"
    )
