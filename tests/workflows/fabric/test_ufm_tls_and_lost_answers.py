"""The UFM client at the edges: TLS (UFM ships a self-signed certificate), client certificates, and writes whose
answer is lost.

TLS: an untrusted certificate fails at once, non-retryable, with the TLS error and the setting that fixes it
(MILLWRIGHT_UFM_CA_BUNDLE or MILLWRIGHT_UFM_VERIFY_TLS=false), and an isolation that meets it ends at once.
Client certificates (mutual TLS): a certificate UFM associates with a user authenticates without a password, from
a file or from an environment variable; one it does not is refused (UfmAuth); none, where UFM requires one, names
the settings.
Lost answers: UFM's answer never decides that a write is done; it is read back, so a write UFM carried out whose
answer was dropped counts as this attempt's (the result says so) and a success answer for a write that did not
land is retried. Judged from the emulator's state and write audit log."""

from __future__ import annotations

import uuid

import pytest
import pytest_asyncio
from temporalio.client import WorkflowFailureError
from temporalio.exceptions import ActivityError, ApplicationError, RetryState
from temporalio.testing import ActivityEnvironment

from activities.registration import activity_methods
from activities.support.secrets import SecretRef
from activities.ufm.activities import UfmActivities
from activities.ufm.client import UfmConfig
from activities.ufm.models import AddGuids, EmptyRequest, EnsurePKey, HostsRequest, PKeyRef, RemoveGuids
from tests.conftest import as_localhost
from tests.workflows.fabric.conftest import CLIENT_SAN
from workflows.fabric.isolation import IsolateTenant, IsolateTenantInput

# Lost answers under the isolations: replay what they wrote (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("replay_histories")


def https_config(stub, ufm_config, **tls) -> UfmConfig:
    return ufm_config.model_copy(update={"url": stub.url, **tls})


async def resolve(config: UfmConfig, hosts: list[str]):
    return await ActivityEnvironment().run(UfmActivities(config).resolve_hosts, HostsRequest(hosts=hosts))


@pytest_asyncio.fixture(loop_scope="session")
async def https_ufm(https_ufm_stub, lab_ca, fleet):
    from lab.ufm import UfmAdmin, fleet_seed

    async with UfmAdmin(https_ufm_stub.url, ca_file=lab_ca.ca_file) as admin:
        await admin.reset()
        await admin.seed(fleet_seed(fleet))
        yield admin


# ---------------------------------------------------------------- TLS


async def test_an_untrusted_certificate_fails_at_once_naming_the_fix(https_ufm_stub, https_ufm, ufm_config, fleet):
    assert https_ufm_stub.url.startswith("https://")
    with pytest.raises(ApplicationError) as err:
        await resolve(https_config(https_ufm_stub, ufm_config), list(fleet.ib_ports())[:1])
    assert err.value.type == "TlsVerificationFailed" and err.value.non_retryable
    text = str(err.value)
    assert "TLS certificate verification failed: unable to get local issuer certificate" in text
    assert "MILLWRIGHT_UFM_CA_BUNDLE" in text and "MILLWRIGHT_UFM_VERIFY_TLS=false" in text
    assert await https_ufm.audit() == []  # nothing reached UFM


async def test_the_ca_bundle_or_verify_tls_false_makes_it_work(https_ufm_stub, https_ufm, ufm_config, lab_ca, fleet):
    host = next(iter(fleet.ib_ports()))
    for tls in ({"ca_bundle": lab_ca.reference}, {"verify_tls": False}):
        resolved = await resolve(https_config(https_ufm_stub, ufm_config, **tls), [host])
        assert resolved.hosts[0].guids == sorted(fleet.ib_ports()[host]), tls


async def test_a_hostname_mismatch_is_reported_as_such(https_ufm_stub, https_ufm, ufm_config, lab_ca, fleet):
    config = ufm_config.model_copy(update={"url": as_localhost(https_ufm_stub.url), "ca_bundle": lab_ca.reference})
    with pytest.raises(ApplicationError) as err:
        await resolve(config, list(fleet.ib_ports())[:1])
    assert err.value.type == "TlsVerificationFailed" and err.value.non_retryable
    assert "TLS hostname verification failed: Hostname mismatch, certificate is not valid for 'localhost'" in str(
        err.value
    )


async def test_an_isolation_behind_an_untrusted_certificate_ends_at_once(client, https_ufm_stub, https_ufm, ufm_config,
                                                                         fleet):  # fmt: skip
    from worker import registry
    from workflows.fabric.fabric import Fabric

    registration = registry.Registration(
        workflows=[IsolateTenant, Fabric],
        activities=activity_methods(UfmActivities(https_config(https_ufm_stub, ufm_config))),
    )
    inp = IsolateTenantInput(
        fabric=f"ib-{uuid.uuid4().hex[:6]}", tenant="tls", hosts=list(fleet.ib_ports())[:2], netbox=False
    )
    async with registry.new_worker(client, registration, f"ufm-tls-{uuid.uuid4().hex[:8]}") as worker:
        handle = await client.start_workflow(IsolateTenant.run, inp, id=f"{inp.workflow_id()}/{uuid.uuid4().hex[:6]}",
                                             task_queue=worker.task_queue)  # fmt: skip
        with pytest.raises(WorkflowFailureError) as failed:
            await handle.result()
    cause = failed.value.cause
    assert isinstance(cause, ActivityError) and cause.retry_state == RetryState.NON_RETRYABLE_FAILURE
    assert isinstance(cause.cause, ApplicationError) and cause.cause.type == "TlsVerificationFailed"
    attempts = [e.activity_task_started_event_attributes.attempt for e in (await handle.fetch_history()).events
                if e.HasField("activity_task_started_event_attributes")]  # fmt: skip
    assert attempts == [1]
    assert await https_ufm.audit() == []


# ---------------------------------------------------------------- client certificates


def certificate_config(stub, lab_ca, cert, key, **more) -> UfmConfig:
    return UfmConfig(url=stub.url, client_cert=SecretRef.parse(cert), client_key=SecretRef.parse(key),
                     ca_bundle=lab_ca.reference, **more)  # fmt: skip


async def test_a_client_certificate_authenticates_without_a_password(mtls_ufm_stub, lab_ca, monkeypatch):
    good = lab_ca.issue_client("ufm-client", CLIENT_SAN)
    env = ActivityEnvironment()
    from_files = certificate_config(mtls_ufm_stub, lab_ca, f"file:{good.cert}", f"file:{good.key}")
    posture = await env.run(UfmActivities(from_files).fabric_posture, EmptyRequest())
    assert posture.default_membership == "full"  # an emulator as UFM ships: read through the certificate alone
    monkeypatch.setenv("UFM_CLIENT_CERT_PEM", good.cert.read_text())
    monkeypatch.setenv("UFM_CLIENT_KEY_PEM", good.key.read_text())
    from_env = certificate_config(mtls_ufm_stub, lab_ca, "env:UFM_CLIENT_CERT_PEM", "env:UFM_CLIENT_KEY_PEM")
    assert (await env.run(UfmActivities(from_env).get_pkey, PKeyRef(pkey="0x42"))).exists is False

    stranger = lab_ca.issue_client("ufm-stranger", "someone-else")
    with pytest.raises(ApplicationError) as refused:
        await env.run(
            UfmActivities(
                certificate_config(mtls_ufm_stub, lab_ca, f"file:{stranger.cert}", f"file:{stranger.key}")
            ).get_pkey,
            PKeyRef(pkey="0x42"),
        )
    assert refused.value.type == "UfmAuth" and refused.value.non_retryable

    with pytest.raises(ApplicationError) as unreadable:
        await env.run(
            UfmActivities(certificate_config(mtls_ufm_stub, lab_ca, f"file:{good.cert}", f"file:{good.cert}")).get_pkey,
            PKeyRef(pkey="0x42"),
        )
    assert unreadable.value.type == "TlsNotConfigured" and "MILLWRIGHT_UFM_CLIENT_CERT" in str(unreadable.value)


async def test_no_client_certificate_where_ufm_requires_one_names_the_settings(mtls_ufm_stub, lab_ca, ufm_config):
    config = ufm_config.model_copy(update={"url": mtls_ufm_stub.url, "ca_bundle": lab_ca.reference})
    with pytest.raises(ApplicationError) as err:
        await ActivityEnvironment().run(UfmActivities(config).get_pkey, PKeyRef(pkey="0x42"))
    assert err.value.type == "UfmUnavailable" and "MILLWRIGHT_UFM_CLIENT_CERT" in str(err.value), err.value


def test_worker_settings_take_a_client_certificate():
    from worker.config import ConfigError, WorkerSettings

    config = WorkerSettings(
        ufm_url="https://ufm.example.com",
        ufm_client_cert="file:/etc/ufm/tls.crt",
        ufm_client_key="file:/etc/ufm/tls.key",
    ).ufm_config()
    assert config.credentials is None and str(config.client_cert) == "file:/etc/ufm/tls.crt"
    with pytest.raises(ConfigError, match="go together"):
        WorkerSettings(ufm_url="https://ufm.example.com", ufm_client_cert="file:/etc/ufm/tls.crt").ufm_config()


# ---------------------------------------------------------------- lost answers


def guids(fleet, n: int = 2) -> list[str]:
    return sorted(g for h in list(fleet.ib_ports())[:n] for g in fleet.ib_ports()[h])


async def writes(ufm, since: int, method: str, path: str) -> list[dict]:
    return [w for w in await ufm.audit(since=since, writes=True) if w["method"] == method and w["path"].endswith(path)]


async def test_writes_whose_answer_is_dropped_are_read_back_and_reported_done(ufm, ufm_config, fleet):
    env, acts, members = ActivityEnvironment(), UfmActivities(ufm_config), guids(fleet)
    cursor = await ufm.audit_cursor()
    for method, path in (
        ("POST", r"/pkeys/add$"),
        ("POST", r"/resources/pkeys$"),
        ("POST", r"/remove_guids_from_pkey$"),
        ("DELETE", r"/pkeys/0x[0-9a-f]+$"),
    ):
        await ufm.add_fault({"method": method, "path": path}, {"drop": "after"})  # carried out, then cut off

    created = await env.run(acts.ensure_pkey, EnsurePKey(pkey="0x51", partition_name="lost"))
    added = await env.run(acts.add_guids, AddGuids(pkey="0x51", guids=members))
    assert created.created and added.changed == members and not added.unchanged
    assert await ufm.members("0x51") == {g: "full" for g in members}
    removed = await env.run(acts.remove_guids, RemoveGuids(pkey="0x51", guids=members))
    assert removed.changed == members and removed.pkey_deleted  # UFM deletes a PKey with its last member
    assert "0x51" not in (await ufm.state())["pkeys"]
    assert (await env.run(acts.ensure_pkey, EnsurePKey(pkey="0x52"))).created  # empty: deleted by Millwright
    deleted = await env.run(acts.delete_pkey_if_empty, PKeyRef(pkey="0x52"))
    assert deleted.deleted and "0x52" not in (await ufm.state())["pkeys"]
    # Each write went once: the answer's loss was settled by reading, not by writing again.
    for method, path in (
        ("POST", "/pkeys/add"),
        ("POST", "/pkeys"),
        ("POST", "/remove_guids_from_pkey"),
        ("DELETE", "/pkeys/0x52"),
    ):
        assert len(await writes(ufm, cursor, method, path)) == (2 if path == "/pkeys/add" else 1), (method, path)


async def test_a_write_that_did_not_land_is_retried_whatever_ufm_answered(ufm, ufm_config, fleet):
    env, acts, members = ActivityEnvironment(), UfmActivities(ufm_config), guids(fleet, 1)
    await env.run(acts.ensure_pkey, EnsurePKey(pkey="0x52"))
    await ufm.add_fault({"method": "POST", "path": r"/resources/pkeys$"}, {"status": 200})  # "OK", nothing done
    with pytest.raises(ApplicationError) as not_applied:
        await env.run(acts.add_guids, AddGuids(pkey="0x52", guids=members))
    assert not_applied.value.type == "UfmWriteNotApplied" and not not_applied.value.non_retryable
    await ufm.add_fault({"method": "POST", "path": r"/resources/pkeys$"}, {"drop": "before"})  # never arrived
    with pytest.raises(ApplicationError) as dropped:
        await env.run(acts.add_guids, AddGuids(pkey="0x52", guids=members))
    assert dropped.value.type == "UfmUnavailable" and not dropped.value.non_retryable
    assert await ufm.members("0x52") == {}
    retried = await env.run(acts.add_guids, AddGuids(pkey="0x52", guids=members))  # the next attempt
    assert retried.changed == members and await ufm.members("0x52") == {g: "full" for g in members}


async def test_an_isolation_whose_answers_are_dropped_reports_what_it_created(client, ufm_worker, ufm, fleet):
    await ufm.add_fault({"method": "POST", "path": r"/pkeys/add$"}, {"drop": "after"})
    await ufm.add_fault({"method": "POST", "path": r"/resources/pkeys$"}, {"drop": "after"})
    hosts = list(fleet.ib_ports())[:2]
    inp = IsolateTenantInput(fabric=f"ib-{uuid.uuid4().hex[:6]}", tenant="lost", hosts=hosts, netbox=False)
    result = await client.execute_workflow(IsolateTenant.run, inp, id=f"{inp.workflow_id()}/{uuid.uuid4().hex[:6]}",
                                           task_queue=ufm_worker.task_queue)  # fmt: skip
    assert result.pkey_created and sorted(result.added) == guids(fleet) and not result.already
    assert await ufm.members(result.pkey) == {g: "full" for g in guids(fleet)}
