"""Host agent tier: a worker running the CallHost test workflow, and a helper to call host activities through it."""

from __future__ import annotations

import uuid

import pytest_asyncio
from temporalio.client import Client

from tests.activities.gpu.helpers import CallHost, CallHostInput


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def call_queue(client):
    """A worker with only the CallHost workflow, on a random queue; yields that queue."""
    from worker import registry

    queue = f"test-host-call-{uuid.uuid4().hex[:8]}"
    registration = registry.Registration(workflows=[CallHost], activities=[])
    async with registry.new_worker(client, registration, queue):
        yield queue


async def call_host(client: Client, call_queue: str, activity: str, task_queue: str, arg: dict | None = None,
                    **options) -> object:  # fmt: skip
    """Run `activity` on `task_queue` from a workflow; the activity's result (a dict)."""
    out = await client.execute_workflow(
        CallHost.run, CallHostInput(activity=activity, task_queue=task_queue, arg=arg or {}, **options),
        id=f"call-host-{uuid.uuid4().hex[:10]}", task_queue=call_queue,
    )  # fmt: skip
    return out.result
