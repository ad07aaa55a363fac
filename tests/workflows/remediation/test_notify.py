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
    assert event["body"] == {
        "event": "node-quarantined",
        "idempotency_key": "wf/run/node-quarantined",
        "node": "gpu-01",
    }
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


# ---------------------------------------------------------------- TLS (activities/support/tls.py)


@pytest.fixture(scope="module")
def https_receiver(lab_ca):
    with WebhookReceiver(tls=lab_ca.issue("webhook", ["127.0.0.1"])) as hook:
        yield hook


def https_note(url: str, **tls) -> WebhookNotification:
    return WebhookNotification(target=WebhookTarget(url=f"{url}/hooks/tls", **tls), event="e", idempotency_key="tls")


async def test_an_untrusted_certificate_fails_at_once_naming_the_fix(https_receiver):
    assert https_receiver.url.startswith("https://")
    with pytest.raises(ApplicationError) as err:
        await ActivityEnvironment().run(NotifyActivities().notify_webhook, https_note(https_receiver.url))
    assert err.value.type == "TlsVerificationFailed" and err.value.non_retryable
    text = str(err.value)
    assert "TLS certificate verification failed: unable to get local issuer certificate" in text
    assert "the webhook's ca_bundle" in text and "the webhook's verify_tls: false" in text


async def test_the_webhooks_ca_bundle_or_verify_tls_false_makes_it_work(https_receiver, lab_ca):
    env, acts = ActivityEnvironment(), NotifyActivities()
    assert (
        await env.run(acts.notify_webhook, https_note(https_receiver.url, ca_bundle=lab_ca.reference))
    ).status == 204
    assert (await env.run(acts.notify_webhook, https_note(https_receiver.url, verify_tls=False))).status == 204
    async with WebhookAdmin(https_receiver.url, ca_file=lab_ca.ca_file) as admin:
        (event,) = await admin.received()
    assert event["deliveries"] == 2


async def test_a_hostname_mismatch_is_reported_as_such(https_receiver, lab_ca):
    from tests.conftest import as_localhost

    with pytest.raises(ApplicationError) as err:
        await ActivityEnvironment().run(
            NotifyActivities().notify_webhook, https_note(as_localhost(https_receiver.url), ca_bundle=lab_ca.reference)
        )
    assert err.value.type == "TlsVerificationFailed" and err.value.non_retryable
    assert "TLS hostname verification failed: Hostname mismatch, certificate is not valid for 'localhost'" in str(
        err.value
    )
