"""The NetBox client against a small in-memory stub (tests/activities/netbox/stub.py), no real NetBox: TLS, and writes whose
answer is lost (read back, so the result says what this attempt did and nothing is written twice)."""

from __future__ import annotations

import ssl

import pytest
import pytest_asyncio
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.netbox.activities import NetBoxActivities
from activities.netbox.client import NetBoxConfig
from activities.netbox.models import TenantSpec
from activities.support.secrets import SecretRef
from tests.activities.netbox.stub import NetBoxStub
from tests.conftest import as_localhost

TOKEN = "nbt_abcdefghijkl.0123456789012345678901234567890123456789"
TENANTS = "/api/tenancy/tenants/"


@pytest.fixture
def token(monkeypatch) -> SecretRef:
    monkeypatch.setenv("MW_STUB_NETBOX_TOKEN", TOKEN)
    return SecretRef.parse("env:MW_STUB_NETBOX_TOKEN")


@pytest_asyncio.fixture(loop_scope="session")
async def stub():
    async with NetBoxStub() as s:
        yield s


@pytest_asyncio.fixture(loop_scope="session")
async def https_stub(lab_ca):
    cert = lab_ca.issue("netbox", ["127.0.0.1"])
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert.cert, cert.key)
    async with NetBoxStub(context) as s:
        yield s


async def upsert(config: NetBoxConfig, spec: TenantSpec):
    return await ActivityEnvironment().run(NetBoxActivities(config).upsert_tenant, spec)


def posts(stub: NetBoxStub) -> int:
    return stub.requests.count(("POST", TENANTS))


# ---------------------------------------------------------------- lost answers


async def test_a_create_or_update_whose_answer_is_lost_is_read_back(stub, token):
    config = NetBoxConfig(url=stub.url, token=token)
    stub.drop("POST", f"^{TENANTS}$", "after")  # NetBox creates the tenant; the answer never arrives
    created = await upsert(config, TenantSpec(name="Team A", slug="team-a"))
    assert created.created and posts(stub) == 1 and len(stub.objects["tenancy/tenants"]) == 1
    stub.drop("PATCH", rf"^{TENANTS}\d+/$", "after")
    updated = await upsert(config, TenantSpec(name="Team A", slug="team-a", description="ml"))
    assert not updated.created and updated.updated == ["description"]
    assert stub.requests.count(("PATCH", f"{TENANTS}{created.id}/")) == 1
    assert stub.objects["tenancy/tenants"][created.id]["description"] == "ml"


async def test_a_write_that_never_arrived_is_left_to_the_retry(stub, token):
    config = NetBoxConfig(url=stub.url, token=token)
    stub.drop("POST", f"^{TENANTS}$", "before")
    with pytest.raises(ApplicationError) as lost:
        await upsert(config, TenantSpec(name="Team B", slug="team-b"))
    assert lost.value.type == "NetBoxUnavailable" and not lost.value.non_retryable
    assert not [t for t in stub.objects["tenancy/tenants"].values() if t["slug"] == "team-b"]
    assert (await upsert(config, TenantSpec(name="Team B", slug="team-b"))).created  # the next attempt


async def test_a_tenant_pkey_record_whose_answers_are_lost_is_written_once(stub, token):
    from activities.netbox.models import CF_TENANT_PKEY, TenantPKeyRecord

    tenant = stub.add("tenancy/tenants", {"name": "Team C", "slug": "team-c", "custom_fields": {CF_TENANT_PKEY: None}})
    stub.drop("PATCH", rf"^{TENANTS}{tenant['id']}/$", "after")
    stub.drop("POST", "^/api/extras/journal-entries/$", "after")
    env, acts = ActivityEnvironment(), NetBoxActivities(NetBoxConfig(url=stub.url, token=token))
    req = TenantPKeyRecord(tenant="team-c", fabric="ib-a", pkey="0x12", members={"gpu-01": ["0002c90300a1b2c3"]})
    first = await env.run(acts.record_tenant_pkey, req)
    again = await env.run(acts.record_tenant_pkey, req)  # the same activity once more: its marker finds the entry
    assert first.updated == [CF_TENANT_PKEY] and again.updated == []
    assert tenant["custom_fields"][CF_TENANT_PKEY] == "0x12"
    (entry,) = stub.objects["extras/journal-entries"].values()
    assert "InfiniBand PKey **0x12** on fabric `ib-a`" in entry["comments"]
    assert entry["assigned_object_id"] == tenant["id"]
    assert stub.requests.count(("POST", "/api/extras/journal-entries/")) == 1


# ---------------------------------------------------------------- TLS


async def test_an_untrusted_certificate_fails_at_once_naming_the_fix(https_stub, token):
    with pytest.raises(ApplicationError) as err:
        await upsert(NetBoxConfig(url=https_stub.url, token=token), TenantSpec(name="T", slug="t"))
    assert err.value.type == "TlsVerificationFailed" and err.value.non_retryable
    text = str(err.value)
    assert "TLS certificate verification failed: unable to get local issuer certificate" in text
    assert "MILLWRIGHT_NETBOX_CA_BUNDLE" in text and "MILLWRIGHT_NETBOX_VERIFY_TLS=false" in text
    assert TOKEN not in text and https_stub.requests == []


async def test_the_ca_bundle_or_verify_tls_false_makes_it_work(https_stub, token, lab_ca):
    trusted = await upsert(NetBoxConfig(url=https_stub.url, token=token, ca_bundle=lab_ca.reference),
                           TenantSpec(name="T", slug="t-ca"))  # fmt: skip
    unverified = await upsert(NetBoxConfig(url=https_stub.url, token=token, verify_tls=False),
                              TenantSpec(name="T", slug="t-off"))  # fmt: skip
    assert trusted.created and unverified.created


async def test_a_hostname_mismatch_is_reported_as_such(https_stub, token, lab_ca):
    config = NetBoxConfig(url=as_localhost(https_stub.url), token=token, ca_bundle=lab_ca.reference)
    with pytest.raises(ApplicationError) as err:
        await upsert(config, TenantSpec(name="T", slug="t-name"))
    assert err.value.type == "TlsVerificationFailed" and err.value.non_retryable
    assert "TLS hostname verification failed: Hostname mismatch, certificate is not valid for 'localhost'" in str(
        err.value
    )
