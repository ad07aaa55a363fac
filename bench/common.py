"""What the benchmarks share: the dev server they run against and the history sizes they report."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

import workflows.search_attributes


def temporal_binary() -> str | None:
    """The `temporal` CLI next to this interpreter (the venv's), else the one on PATH."""
    local = Path(sys.executable).parent / "temporal"
    return str(local) if local.exists() else shutil.which("temporal")


async def dev_server() -> WorkflowEnvironment:
    """A fresh local dev server with Millwright's converter and search attributes (use with `async with`)."""
    return await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_binary(),
        data_converter=pydantic_data_converter,
        search_attributes=workflows.search_attributes.ALL,
        dev_server_extra_args=["--log-level", "error"],
    )


async def history_lengths(client: Client, *prefixes: str) -> list[int]:
    """The history length of every run (continued-as-new runs each count) whose workflow ID starts with a prefix."""
    query = " OR ".join(f"WorkflowId STARTS_WITH '{p}'" for p in prefixes)
    return [execution.history_length async for execution in client.list_workflows(query)]
