"""The webhook activity against the lab's receiver: JSON body, idempotency key, bearer token from a secret
reference, what is retried and what is not."""

from __future__ import annotations

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.notify import NotifyActivities, WebhookNotification, WebhookTarget
from lab.webhook import WebhookAdmin, WebhookReceiver

TOKEN = "hook-token-123"


@pytest.fixture(scope="module")
def receiver():
    with WebhookReceiver(token=TOKEN) as hook:
        yield hook


async def test_delivery_with_token_and_idempotency_key(receiver, monkeypatch):
    monkeypatch.setenv("MILLWRIGHT_TEST_HOOK_TOKEN", TOKEN)
    admin = WebhookAdmin(receiver.url)
    await admin.reset()
    note = WebhookNotification(target=WebhookTarget(url=f"{receiver.url}/hooks/a", token="env:MILLWRIGHT_TEST_HOOK_TOKEN"),
                               event="node-quarantined", idempotency_key="wf/run/node-quarantined",
                               payload={"node": "gpu-01"})  # fmt: skip
    env = ActivityEnvironment()
    first = await env.run(NotifyActivities().notify_webhook, note)
    again = await env.run(NotifyActivities().notify_webhook, note)  # a retry after a lost answer
    assert first.status == again.status == 204
    (event,) = await admin.received()
    assert event["deliveries"] == 2 and event["key"] == "wf/run/node-quarantined"
    assert event["body"] == {"event": "node-quarantined", "idempotency_key": "wf/run/node-quarantined", "node": "gpu-01"}
    assert event["headers"]["X-Millwright-Event"] == "node-quarantined"
    await admin.aclose()


async def test_what_is_retried_and_what_is_not(receiver, monkeypatch):
    monkeypatch.setenv("MILLWRIGHT_TEST_HOOK_TOKEN", TOKEN)
    admin = WebhookAdmin(receiver.url)
    await admin.reset()
    env, acts = ActivityEnvironment(), NotifyActivities()

    def note(token: str | None) -> WebhookNotification:
        return WebhookNotification(target=WebhookTarget(url=f"{receiver.url}/hooks/a", token=token), event="e",
                                   idempotency_key="k")  # fmt: skip

    with pytest.raises(ApplicationError) as unauthorized:  # no token: 401, a retry will not help
        await env.run(acts.notify_webhook, note(None))
    assert unauthorized.value.type == "WebhookRejected" and unauthorized.value.non_retryable
    await admin.add_fault({"method": "POST"}, {"status": 503})
    with pytest.raises(ApplicationError) as down:
        await env.run(acts.notify_webhook, note("env:MILLWRIGHT_TEST_HOOK_TOKEN"))
    assert down.value.type == "WebhookUnavailable" and not down.value.non_retryable
    with pytest.raises(ApplicationError) as unset:
        await env.run(acts.notify_webhook, note("env:MILLWRIGHT_TEST_HOOK_TOKEN_UNSET"))
    assert unset.value.type == "WebhookNotConfigured" and unset.value.non_retryable
    assert await admin.answers() == [401, 503]
    with pytest.raises(ValueError):
        WebhookTarget(url="http://x", token="a-bare-token")
    await admin.aclose()
