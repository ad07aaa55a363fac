"""NodeRemediation notifying a webhook where nothing listens: the outcome (quarantine) is decided and recorded first,
the notification's failure shows in `progress` and `millwright watch` while it is retried, and after notify_timeout
the run ends with that outcome and the notification reported failed in its result, not as the run's failure."""

from __future__ import annotations

import asyncio
import socket

import pytest

from activities.node_health import QUARANTINE_ANNOTATION
from tests.cli_in_process import cli
from tests.kube_helpers import read_node, wait_for
from tests.workflows.maintenance.test_node_maintenance import record_history
from tests.workflows.remediation.helpers import fast_settings, fleet
from tests.workflows.remediation.test_node_remediation import start
from workflows.remediation.node_remediation import NodeRemediation

# A call that never answers: replay what the run wrote (tests/conftest.py).
pytestmark = [pytest.mark.timeout(180), pytest.mark.usefixtures("replay_histories")]

NOTIFY_TIMEOUT = 15


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_a_webhook_that_never_answers_does_not_hold_the_outcome(client, temporal_address, rem_worker, k8s, core,
                                                                      hosts, names, burnin_bmcs):  # fmt: skip
    node = names[3]
    hook = f"http://127.0.0.1:{closed_port()}/hooks/ops"
    await k8s.seed(fleet(names[:4]))
    await hosts.add(node, {"remap_failure": [5]})  # quarantined at once: only an RMA fixes it
    handle = await start(client, rem_worker, burnin_bmcs, node, "remap failure",
                         **fast_settings(hook, notify_timeout=NOTIFY_TIMEOUT))  # fmt: skip
    watched = asyncio.create_task(cli("watch", handle.id, "--address", temporal_address, "--interval", "0.5",
                                      timeout=150))  # fmt: skip

    async def notifying():
        p = await handle.query(NodeRemediation.progress)
        return p if p.waiting else None

    p = await wait_for(notifying, what="the webhook's failure in progress", timeout=90)
    assert p.phase == "quarantined" and p.finished  # the outcome came first
    wait = p.waiting[0]
    assert (wait.endpoint, wait.call, wait.setting) == (f"webhook {hook}", "notify node-quarantined", "notify_timeout")
    assert hook in wait.error and "ConnectError" in wait.error and wait.attempts >= 3
    n = await read_node(core, node)  # recorded on the node while the webhook is still being retried
    assert n.spec.unschedulable and "remap_failure" in n.metadata.annotations[QUARANTINE_ANNOTATION]

    result = await handle.result()
    await record_history(handle, "node_remediation_webhook_gives_up")
    assert result.outcome == "quarantined" and result.quarantined and not result.notified
    assert result.notification is not None
    assert result.notification.startswith("node-quarantined: failed after "), result.notification
    assert f"webhook {hook}" in result.notification and "ConnectError" in result.notification
    desc = await handle.describe()
    assert (desc.close_time - desc.start_time).total_seconds() < 300  # bounded: minutes, not the hour it was

    out = await watched
    assert out.returncode == 0, out
    assert f"retrying webhook {hook} (notify node-quarantined)" in out.stderr
    assert "retrying notify_webhook (attempt " in out.stderr  # the pending activity's last failure
    assert '"outcome": "quarantined"' in out.stdout
