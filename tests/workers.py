"""A Millwright worker built from settings, on a random task queue, inside a test's session loop."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any


@asynccontextmanager
async def settings_worker(client: Any, kubeconfig: Path | None, prefix: str, *, more_workflows: tuple[type, ...] = (),
                          **settings: Any) -> AsyncIterator[str]:  # fmt: skip
    """`async with settings_worker(client, kubeconfig_path, "burnin", bmc_credentials=...) as queue:` — the worker
    process's registration (worker.registry.build) for these MILLWRIGHT_* settings (no kubeconfig: None), with
    `more_workflows` (a test's own) besides; yields its task queue."""
    from worker import registry
    from worker.config import WorkerSettings

    kube: dict[str, Any] = {"kubeconfig": str(kubeconfig)} if kubeconfig is not None else {}
    registration = registry.build(WorkerSettings(metrics_port=0, **kube, **settings))
    registration.workflows.extend(more_workflows)
    queue = f"{prefix}-{uuid.uuid4().hex[:8]}"
    try:
        async with registry.new_worker(client, registration, queue):
            yield queue
    finally:
        await registration.close()
