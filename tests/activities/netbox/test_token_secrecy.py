"""The NetBox API token never enters a workflow history: every run of the tier is scanned."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json

import pytest
from temporalio.client import WorkflowFailureError


def _strings(node):
    """Every string in a history's JSON, plus each payload's decoded data."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "data" and isinstance(value, str):
                with contextlib.suppress(ValueError):
                    yield base64.b64decode(value).decode("utf-8", errors="replace")
            yield from _strings(value)
    elif isinstance(node, list):
        for value in node:
            yield from _strings(value)
    elif isinstance(node, str):
        yield node


async def test_the_token_never_enters_any_workflow_history(client, call, netbox_worker, netbox_lab, bootstrapped):
    token = netbox_lab.token
    secret = token.removeprefix("nbt_").split(".", 1)[1]
    assert token.startswith("nbt_") and len(secret) >= 40  # a v2 token: nbt_<key>.<secret>

    # Runs of every shape: a success, a failure carrying NetBox's message, a bootstrap.
    await call("list_devices", {"role": "gpu-server", "limit": 5})
    with pytest.raises(WorkflowFailureError):
        await call("upsert_cluster", {"name": "x", "type": "no-such-type"})
    with pytest.raises(WorkflowFailureError):
        await call("find_device", {"name": "x", "site": "no-such-site"})  # NetBox 400 on an unknown slug

    query = f'TaskQueue="{netbox_worker.task_queue}"'
    runs: list = []
    for _ in range(50):  # visibility is eventually consistent
        runs = [r async for r in client.list_workflows(query)]
        if len(runs) >= len(call.handles) + 1:
            break
        await asyncio.sleep(0.2)
    assert len(runs) >= 4, runs

    scanned, payloads_seen = 0, False
    for run in runs:
        history = await client.get_workflow_handle(run.id, run_id=run.run_id).fetch_history()
        raw = b"".join(event.SerializeToString() for event in history.events)
        assert token.encode() not in raw and secret.encode() not in raw, f"token found in {run.id}"
        doc = history.to_json_dict()
        text = json.dumps(doc)
        assert secret not in text
        strings = list(_strings(doc))
        assert not any(secret in s for s in strings), f"token found in {run.id}"
        # The scan reads inside payloads (base64 in JSON): it sees the inputs it is looking through.
        payloads_seen = payloads_seen or any('"role":"gpu-server"' in s.replace(" ", "") for s in strings)
        scanned += 1
    assert payloads_seen, "the scan never saw a decoded payload; it would miss a token in one"
    print(f"\nscanned {scanned} workflow histories of the NetBox tier: no token")
