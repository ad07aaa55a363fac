"""The replay check the crash and chaos tests opt into (tests/history_replay.py, the `replay_histories` fixture)
fails on a known nondeterminism, and passes the same runs replayed with the code that made them."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest

from tests.changed_shape import After, Before
from tests.history_replay import check_replay
from worker.registry import Registration, new_worker


async def test_a_changed_command_sequence_fails_the_check_naming_the_run(client):
    since = datetime.now(UTC)
    registration = Registration(workflows=[Before], activities=[])
    queue = f"replay-check-{uuid.uuid4().hex[:8]}"
    async with new_worker(client, registration, queue):
        handle = await client.start_workflow(Before.run, id=f"changed-shape-{uuid.uuid4().hex[:8]}", task_queue=queue)
        await handle.signal(Before.go)
        await handle.signal(Before.finish)
        assert await handle.result() == "finished"

    assert (await check_replay(client, since, [Before])).runs == 1
    with pytest.raises(AssertionError, match="TimerStarted") as failed:
        await check_replay(client, since, [After])
    assert f"ChangedShape {handle.id} run {handle.result_run_id}" in str(failed.value)
