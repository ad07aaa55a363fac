"""Redfish over HTTPS (activities/support/tls.py): a BMC whose certificate the worker does not trust fails at once, with
the TLS error and the setting that fixes it, instead of "the BMC does not answer" retried for an hour; the CA bundle
(per BMC or worker-wide) and verify_tls: false each make it work. A burn-in that meets such a BMC:
tests/workflows/burnin/test_server_burnin.py."""

from __future__ import annotations

import re

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.redfish import BmcRef, RedfishActivities
from activities.support.secrets import SecretRef
from tests.conftest import as_localhost


@pytest.fixture
def creds(bmc_secret_file) -> SecretRef:
    return SecretRef.parse(f"file:{bmc_secret_file}")


def bmc_url(https_bmcs) -> str:
    return https_bmcs.bmc_urls[https_bmcs.names[0]]


async def health(acts: RedfishActivities, bmc: BmcRef):
    return await ActivityEnvironment().run(acts.redfish_health, bmc)


async def test_an_untrusted_certificate_fails_at_once_naming_the_fix(https_bmcs, creds):
    url = bmc_url(https_bmcs)
    assert url.startswith("https://")
    with pytest.raises(ApplicationError) as err:
        await health(RedfishActivities(creds), BmcRef(url=url))
    assert err.value.type == "TlsVerificationFailed" and err.value.non_retryable
    text = str(err.value)
    assert "TLS certificate verification failed: unable to get local issuer certificate" in text
    assert "bmc.ca_bundle" in text and "MILLWRIGHT_BMC_CA_BUNDLE" in text and "bmc.verify_tls: false" in text
    assert "does not answer" not in text


async def test_the_ca_bundle_per_bmc_or_worker_wide_makes_it_work(https_bmcs, creds, lab_ca):
    url = bmc_url(https_bmcs)
    per_bmc = await health(RedfishActivities(creds), BmcRef(url=url, ca_bundle=lab_ca.reference))
    worker_wide = await health(RedfishActivities(creds, ca_bundle=lab_ca.reference), BmcRef(url=url))
    assert per_bmc.power_state == worker_wide.power_state == "Off"


async def test_verify_tls_false_per_bmc_or_worker_wide_makes_it_work(https_bmcs, creds):
    url = bmc_url(https_bmcs)
    assert (await health(RedfishActivities(creds), BmcRef(url=url, verify_tls=False))).power_state == "Off"
    assert (await health(RedfishActivities(creds, verify_tls=False), BmcRef(url=url))).power_state == "Off"


async def test_a_hostname_mismatch_is_reported_as_such(https_bmcs, creds, lab_ca):
    with pytest.raises(ApplicationError) as err:
        await health(
            RedfishActivities(creds), BmcRef(url=as_localhost(bmc_url(https_bmcs)), ca_bundle=lab_ca.reference)
        )
    assert err.value.type == "TlsVerificationFailed" and err.value.non_retryable
    assert "TLS hostname verification failed: Hostname mismatch, certificate is not valid for 'localhost'" in str(
        err.value
    )
    assert "bmc.verify_tls: false" in str(err.value)


async def test_a_ca_bundle_that_cannot_be_used_is_a_configuration_error(https_bmcs, creds, tmp_path):
    not_pem = tmp_path / "ca.pem"
    not_pem.write_text("not a certificate\n")
    for ref, says in ((f"file:{tmp_path / 'missing.pem'}", "cannot read"), (f"file:{not_pem}", "holds no PEM")):
        with pytest.raises(ApplicationError) as err:
            await health(RedfishActivities(creds), BmcRef(url=bmc_url(https_bmcs), ca_bundle=ref))
        assert err.value.type == "TlsNotConfigured" and err.value.non_retryable and says in str(err.value)
    with pytest.raises(ValueError, match=re.escape("file:/path/to/ca.pem")):
        BmcRef(url=bmc_url(https_bmcs), ca_bundle=str(not_pem))  # a bare path is not a reference
