"""The replay check the crash and chaos tests opt into (worker/replay.py, the `replay_histories` fixture) fails on a
known nondeterminism, naming the run, and passes the same runs replayed with the code that made them."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from tests.changed_shape import After, Before
from worker.registry import Registration, new_worker
from worker.replay import replay_since


async def test_a_changed_command_sequence_fails_the_check_naming_the_run(client):
    since = datetime.now(UTC)
    registration = Registration(workflows=[Before], activities=[])
    queue = f"replay-check-{uuid.uuid4().hex[:8]}"
    async with new_worker(client, registration, queue):
        handle = await client.start_workflow(Before.run, id=f"changed-shape-{uuid.uuid4().hex[:8]}", task_queue=queue)
        await handle.signal(Before.go)
        await handle.signal(Before.finish)
        assert await handle.result() == "finished"

    same = await replay_since(client, since, [Before])
    assert same.runs == 1 and not same.failures, same
    changed = await replay_since(client, since, [After])
    assert len(changed.failures) == 1, changed
    assert changed.failures[0].startswith(f"ChangedShape {handle.id} run {handle.result_run_id}")
    assert "replay failed" in changed.failures[0] and "TimerStarted" in changed.failures[0]
