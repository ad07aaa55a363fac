"""TLS settings shared by every integration (activities/support/tls.py): Ironic and Prometheus against a small HTTPS server
with a lab certificate, CA bundle references, and the worker's MILLWRIGHT_*_CA_BUNDLE / *_VERIFY_TLS settings.
The other integrations are tested against their lab servers: tests/activities/redfish/test_redfish_tls.py,
tests/workflows/fabric/test_ufm_tls_and_lost_answers.py, tests/activities/netbox/test_netbox_client_stub.py, tests/workflows/remediation/test_notify.py
(webhooks), tests/activities/kube/test_kube_tls.py."""

from __future__ import annotations

import ssl

import pytest
import pytest_asyncio
from aiohttp import web
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.ironic.activities import IronicActivities
from activities.ironic.client import IronicConfig
from activities.ironic.models import NodeRef
from activities.prometheus import PrometheusActivities, PrometheusQuery
from activities.support.tls import TlsFix, Trust
from tests.conftest import as_localhost
from worker.config import ConfigError, WorkerSettings

QUERY_ANSWER = {"status": "success", "data": {"resultType": "vector", "result": [{"metric": {}, "value": [0, "1"]}]}}


@pytest_asyncio.fixture(loop_scope="session")
async def https_server(lab_ca):
    """Prometheus' query endpoint; anything else 404 (Ironic's answer for a node it does not know)."""

    async def answer(request: web.Request) -> web.Response:
        if request.path == "/api/v1/query":
            return web.json_response(QUERY_ANSWER)
        return web.json_response({"error_message": {"faultstring": "Node x could not be found."}}, status=404)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", answer)
    cert = lab_ca.issue("generic", ["127.0.0.1"])
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert.cert, cert.key)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    yield f"https://127.0.0.1:{runner.addresses[0][1]}"
    await runner.cleanup()


async def query(url: str, **tls) -> list[float]:
    acts = PrometheusActivities(**tls)
    try:
        return await ActivityEnvironment().run(acts.query_prometheus, PrometheusQuery(url=url, query="up"))
    finally:
        await acts.close()


async def ironic_node(url: str, **tls):
    acts = IronicActivities(IronicConfig(url=url, **tls))
    return await ActivityEnvironment().run(acts.ironic_get_node, NodeRef(node="x"))


async def test_prometheus_and_ironic_fail_at_once_on_an_untrusted_certificate(https_server):
    for call, setting in (
        (query(https_server), "MILLWRIGHT_PROMETHEUS"),
        (ironic_node(https_server), "MILLWRIGHT_IRONIC"),
    ):
        with pytest.raises(ApplicationError) as err:
            await call
        assert err.value.type == "TlsVerificationFailed" and err.value.non_retryable
        assert "unable to get local issuer certificate" in str(err.value)
        assert f"{setting}_CA_BUNDLE" in str(err.value) and f"{setting}_VERIFY_TLS=false" in str(err.value)


async def test_prometheus_and_ironic_with_the_ca_bundle_or_verification_off(https_server, lab_ca):
    for tls in ({"ca_bundle": lab_ca.reference}, {"verify_tls": False}):
        assert await query(https_server, **tls) == [1.0]
        with pytest.raises(ApplicationError) as err:  # TLS passed: Ironic's own answer
            await ironic_node(https_server, **tls)
        assert err.value.type == "IronicNotFound", tls
    with pytest.raises(ApplicationError) as mismatch:
        await query(as_localhost(https_server), ca_bundle=lab_ca.reference)
    assert "TLS hostname verification failed" in str(mismatch.value)


def test_ca_bundle_references(tmp_path, lab_ca):
    fix = TlsFix(ca="X_CA_BUNDLE", off="X_VERIFY_TLS=false")
    assert Trust.resolve(fix, ca_bundle=lab_ca.reference).for_requests() == str(lab_ca.ca_file)
    assert Trust.resolve(fix, verify=False, ca_bundle="file:/missing").for_requests() is False  # off: not read
    assert Trust.resolve(fix).for_httpx() is True
    for bad, says in (
        ("/etc/ssl/ca.pem", "file:/path/to/ca.pem"),
        ("env:CA", "file:/path/to/ca.pem"),
        (f"file:{tmp_path}/none.pem", "cannot read"),
    ):
        with pytest.raises(ApplicationError, match=says) as err:
            Trust.resolve(fix, ca_bundle=bad, setting="X_CA_BUNDLE")
        assert err.value.type == "TlsNotConfigured" and err.value.non_retryable and "X_CA_BUNDLE" in str(err.value)


def test_worker_settings(monkeypatch, lab_ca):
    monkeypatch.setenv("MILLWRIGHT_NETBOX_URL", "https://netbox.example")
    monkeypatch.setenv("MILLWRIGHT_NETBOX_TOKEN", "env:NETBOX_TOKEN")
    monkeypatch.setenv("MILLWRIGHT_NETBOX_CA_BUNDLE", lab_ca.reference)
    monkeypatch.setenv("MILLWRIGHT_UFM_URL", "https://ufm.example")
    monkeypatch.setenv("MILLWRIGHT_UFM_CREDENTIALS", "env:UFM")
    monkeypatch.setenv("MILLWRIGHT_UFM_VERIFY_TLS", "false")
    settings = WorkerSettings()
    assert settings.netbox_config().ca_bundle == lab_ca.reference and settings.netbox_config().verify_tls
    assert settings.ufm_config().verify_tls is False and settings.ufm_config().ca_bundle is None
    assert settings.bmc_verify_tls and settings.ca_bundle("bmc") is None
    monkeypatch.setenv("MILLWRIGHT_BMC_CA_BUNDLE", str(lab_ca.ca_file))  # a path, not a reference
    with pytest.raises(ConfigError, match=r"MILLWRIGHT_BMC_CA_BUNDLE: .* 'file:/path/to/ca\.pem'"):
        WorkerSettings().ca_bundle("bmc")
