"""`python -m worker` as a subprocess, configured exactly as a deployment configures it."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

from temporalio.api.enums.v1 import TaskQueueType

from lab.temporal import task_queue_poller_identities

REPO = Path(__file__).resolve().parents[1]


def worker_env(tmp: Path, address: str, kubeconfig: Path | None, **extra: str) -> dict[str, str]:
    """The worker's environment: only what is set here, nothing inherited from the caller's Temporal setup.
    `kubeconfig` None: no kubeconfig at all (not even $KUBECONFIG), as a central worker with a site map runs."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TEMPORAL_", "MILLWRIGHT_")) and k != "KUBECONFIG"}
    if kubeconfig is not None:
        env["MILLWRIGHT_KUBECONFIG"] = str(kubeconfig)
    env.update(
        TEMPORAL_ADDRESS=address,
        TEMPORAL_NAMESPACE="default",
        TEMPORAL_CONFIG_FILE=str(tmp / "no-such-temporal.toml"),
        MILLWRIGHT_METRICS_HOST="127.0.0.1",
        MILLWRIGHT_METRICS_PORT="0",
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    return env


def spawn_worker(env: dict[str, str], log: Path, args: tuple[str, ...] = ()) -> subprocess.Popen:
    """Start a worker appending to `log` (restarts of the same worker share one log); `args` e.g. ("--host-agent",)."""
    with open(log, "ab") as fh:
        return subprocess.Popen(
            [sys.executable, "-m", "worker", *args], env=env, cwd=REPO, stdout=fh, stderr=subprocess.STDOUT
        )


def stop_worker(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait(10)


async def wait_polling(
    client,
    task_queue: str,
    proc: subprocess.Popen,
    log: Path,
    timeout: float = 60,
    queue_type: TaskQueueType.ValueType = TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW,
) -> None:
    """Wait until a worker polls the task queue (activity-only workers: TASK_QUEUE_TYPE_ACTIVITY); fail with the
    worker's log if it died. 60 s: a worker imports and validates every workflow before it polls, which takes far
    longer on a loaded 2-core CI machine than on a desk."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"worker exited with {proc.returncode}:\n{log.read_text()}"
        if await task_queue_poller_identities(client, task_queue, queue_type):
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"worker never polled {task_queue}:\n{log.read_text()}")
