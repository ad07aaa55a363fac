"""The Kubernetes API over HTTPS (the emulator behind lab/tls.py's TlsFront): a certificate the kubeconfig's CA
does not vouch for fails at once, non-retryable, naming the kubeconfig setting that fixes it; the kubeconfig's
certificate-authority(-data) or insecure-skip-tls-verify makes it work; a hostname mismatch is reported as such."""

from __future__ import annotations

import base64

import pytest
import pytest_asyncio
import yaml
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.kube.activities import KubeActivities
from activities.kube.connector import ClusterConnector
from activities.kube.models import NodePageRequest, NodeRef
from tests.conftest import as_localhost
from tests.kube_helpers import fleet_objects


@pytest_asyncio.fixture(loop_scope="session")
async def https_k8s(k8s_emulator, lab_ca):
    from lab.tls import TlsFront

    async with TlsFront(k8s_emulator.url, lab_ca.issue("k8s", ["127.0.0.1"])) as front:
        yield front


def kubeconfig_file(tmp_path, url: str, **cluster) -> str:
    from lab.k8s.admin import kubeconfig

    doc = kubeconfig(url, "lab")
    doc["clusters"][0]["cluster"].update(cluster)
    path = tmp_path / f"kubeconfig-{len(list(tmp_path.iterdir()))}"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


async def run(kubeconfig: str, activity: str, arg):
    connector = ClusterConnector([kubeconfig])
    try:
        return await ActivityEnvironment().run(getattr(KubeActivities(connector), activity), arg)
    finally:
        await connector.close()


async def test_an_untrusted_certificate_fails_at_once_naming_the_fix(https_k8s, tmp_path):
    path = kubeconfig_file(tmp_path, https_k8s.url)
    with pytest.raises(ApplicationError) as err:
        await run(path, "inspect_node", NodeRef(cluster="lab", node="node-01"))
    assert err.value.type == "TlsVerificationFailed" and err.value.non_retryable
    text = str(err.value)
    assert "GET /api/v1/nodes/node-01 on the Kubernetes API of cluster lab" in text
    assert "TLS certificate verification failed: unable to get local issuer certificate" in text
    assert "certificate-authority-data (or certificate-authority) on cluster 'lab'" in text and path in text
    assert "insecure-skip-tls-verify: true" in text


async def test_the_kubeconfig_ca_or_insecure_skip_tls_verify_makes_it_work(https_k8s, k8s, lab_ca, tmp_path):
    await k8s.seed(fleet_objects())
    ca_data = base64.b64encode(lab_ca.ca_file.read_bytes()).decode()
    for cluster in (
        {"certificate-authority-data": ca_data},
        {"certificate-authority": str(lab_ca.ca_file)},
        {"insecure-skip-tls-verify": True},
    ):
        page = await run(kubeconfig_file(tmp_path, https_k8s.url, **cluster), "list_nodes_page",
                         NodePageRequest(cluster="lab"))  # fmt: skip
        assert sorted(n.name for n in page.nodes) == [f"node-0{i}" for i in range(1, 6)], cluster


async def test_a_hostname_mismatch_is_reported_as_such(https_k8s, lab_ca, tmp_path):
    path = kubeconfig_file(tmp_path, as_localhost(https_k8s.url), **{"certificate-authority": str(lab_ca.ca_file)})
    with pytest.raises(ApplicationError) as err:
        await run(path, "list_nodes_page", NodePageRequest(cluster="lab"))
    assert err.value.type == "TlsVerificationFailed" and err.value.non_retryable
    assert "TLS hostname verification failed: Hostname mismatch, certificate is not valid for 'localhost'" in str(
        err.value
    )
