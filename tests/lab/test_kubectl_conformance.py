"""Real kubectl against the emulator: discovery, get, cordon, drain (429 then success), uncordon."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest
import yaml
from kubernetes import client

from lab.k8s.admin import kubeconfig
from labtest_helpers import node, pdb, running_pod, wait_for

KUBECTL = shutil.which("kubectl")
pytestmark = pytest.mark.skipif(KUBECTL is None, reason="kubectl binary not found on PATH")

RS_UID = "aaaaaaaa-bbbb-cccc-dddd-000000000001"
DS_UID = "aaaaaaaa-bbbb-cccc-dddd-000000000002"


@pytest.fixture
def kubectl(emulator, tmp_path):
    kc = tmp_path / "kubeconfig"
    kc.write_text(yaml.safe_dump(kubeconfig(emulator.url, "lab")))
    env = {**os.environ, "KUBECONFIG": str(kc), "KUBECACHEDIR": str(tmp_path / "cache"), "HOME": str(tmp_path)}

    def run(*args: str, timeout: float = 60, check: bool = True) -> subprocess.CompletedProcess:
        p = subprocess.run([KUBECTL, "--cache-dir", str(tmp_path / "cache"), *args], env=env, text=True,
                           capture_output=True, timeout=timeout)
        if check and p.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
        return p

    run.env = env  # type: ignore[attr-defined]
    run.cache = str(tmp_path / "cache")  # type: ignore[attr-defined]
    return run


def seed_drain_scenario(lab):
    labels = {"app": "web"}
    rs = {"apiVersion": "apps/v1", "kind": "ReplicaSet",
          "metadata": {"name": "web", "namespace": "default", "uid": RS_UID},
          "spec": {"replicas": 2, "selector": {"matchLabels": labels},
                   "template": {"metadata": {"labels": labels},
                                "spec": {"terminationGracePeriodSeconds": 2,
                                         "volumes": [{"name": "scratch", "emptyDir": {}}],
                                         "containers": [{"name": "c", "image": "x"}]}}}}
    ds = {"apiVersion": "apps/v1", "kind": "DaemonSet",
          "metadata": {"name": "exporter", "namespace": "default", "uid": DS_UID},
          "spec": {"selector": {"matchLabels": {"app": "exporter"}},
                   "template": {"metadata": {"labels": {"app": "exporter"}},
                                "spec": {"containers": [{"name": "c", "image": "x"}]}}}}
    pods = []
    for i in range(2):
        p = running_pod(f"web-{i}", labels=labels, grace=2,
                        owner={"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web", "uid": RS_UID,
                               "controller": True})
        p["spec"]["volumes"] = [{"name": "scratch", "emptyDir": {}}]
        pods.append(p)
    ds_pod = running_pod("exporter-n1", labels={"app": "exporter"},
                         owner={"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "exporter", "uid": DS_UID,
                                "controller": True})
    lab.seed([node("n1"), node("n2"), node("n3"), rs, ds, *pods, ds_pod, pdb("web", minAvailable=2)])


def test_kubectl_get_nodes(kubectl, lab):
    lab.seed([node("n1"), node("n2")])
    out = json.loads(kubectl("get", "nodes", "-o", "json").stdout)
    assert out["kind"] == "List" or out["kind"] == "NodeList"
    assert [i["metadata"]["name"] for i in out["items"]] == ["n1", "n2"]
    table = kubectl("get", "nodes").stdout
    assert "n1" in table and "n2" in table  # no server-side Table: kubectl prints NAME/AGE only
    assert "web" not in kubectl("get", "pods", "-A").stdout


def test_kubectl_cordon_drain_uncordon(kubectl, lab, api_client, core):
    seed_drain_scenario(lab)
    kubectl("cordon", "n1")
    assert core.read_node("n1").spec.unschedulable is True
    proc = subprocess.Popen(
        [KUBECTL, "--cache-dir", kubectl.cache, "drain", "n1", "--ignore-daemonsets", "--delete-emptydir-data",
         "--timeout=60s"], env=kubectl.env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        # the PDB (minAvailable == replicas) blocks: kubectl gets 429 and says it will retry
        wait_for(lambda: any(e.get("subresource") == "eviction" and e["code"] == 429 for e in lab.audit()),
                 timeout=30, what="a 429 eviction")
        client.PolicyV1Api(api_client).patch_namespaced_pod_disruption_budget(
            "web", "default", {"spec": {"minAvailable": 1}})
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, out
    assert "will retry after 5s" in out
    assert "node/n1 drained" in out and "ignoring daemonset-managed pods" in out.lower()
    on_n1 = core.list_pod_for_all_namespaces(field_selector="spec.nodeName=n1").items
    assert [p.metadata.name for p in on_n1] == ["exporter-n1"]
    web = wait_for(lambda: (lambda ps: ps if len(ps) == 2 and all(p.status.phase == "Running" for p in ps)
                            else None)(core.list_namespaced_pod("default", label_selector="app=web").items),
                   timeout=10, what="replacement pods")
    assert all(p.spec.node_name in ("n2", "n3") for p in web)
    kubectl("uncordon", "n1")
    assert not core.read_node("n1").spec.unschedulable
    evs = [e for e in lab.audit() if e.get("subresource") == "eviction"]
    assert any(e["eviction"]["outcome"] == "blocked" for e in evs)
    assert sum(1 for e in evs if e["eviction"]["outcome"] == "evicted") == 2
