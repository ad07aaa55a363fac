"""Real kubectl against the emulator: discovery, get, cordon, drain (429 then success), uncordon; a MIG relabel
that mig-manager takes to success or failed; apply
(client-side and server-side) of a manifest with a CRD kind, get -o wide/-o yaml, describe and delete."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from kubernetes import client

import lab.k8s.crds
from lab.k8s.admin import kubeconfig
from lab.k8s.crds import CAPI_CRDS
from tests.lab.labtest_helpers import node, pdb, running_pod, wait_for

KUBECTL = shutil.which("kubectl")
pytestmark = pytest.mark.skipif(KUBECTL is None, reason="kubectl binary not found on PATH")

RS_UID = "aaaaaaaa-bbbb-cccc-dddd-000000000001"
DS_UID = "aaaaaaaa-bbbb-cccc-dddd-000000000002"
POD_UID = "aaaaaaaa-bbbb-cccc-dddd-000000000003"


@dataclass
class Kubectl:
    """kubectl with its own kubeconfig for the emulator and its own cache (`env`, `cache` for a long-running one)."""

    binary: str
    env: dict[str, str]
    cache: str

    def __call__(self, *args: str, timeout: float = 60, check: bool = True) -> subprocess.CompletedProcess:
        p = subprocess.run(
            [self.binary, "--cache-dir", self.cache, *args],
            env=self.env,
            text=True,
            capture_output=True,
            timeout=timeout,
        )
        if check and p.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
        return p


@pytest.fixture
def kubectl(emulator, tmp_path: Path) -> Kubectl:
    assert KUBECTL is not None  # the module is skipped without it
    kc = tmp_path / "kubeconfig"
    kc.write_text(yaml.safe_dump(kubeconfig(emulator.url, "lab")))
    env = {**os.environ, "KUBECONFIG": str(kc), "KUBECACHEDIR": str(tmp_path / "cache"), "HOME": str(tmp_path)}
    return Kubectl(KUBECTL, env, str(tmp_path / "cache"))


def seed_drain_scenario(lab):
    labels = {"app": "web"}
    rs = {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {"name": "web", "namespace": "default", "uid": RS_UID},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "terminationGracePeriodSeconds": 2,
                    "volumes": [{"name": "scratch", "emptyDir": {}}],
                    "containers": [{"name": "c", "image": "x"}],
                },
            },
        },
    }
    ds = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": "exporter", "namespace": "default", "uid": DS_UID},
        "spec": {
            "selector": {"matchLabels": {"app": "exporter"}},
            "template": {
                "metadata": {"labels": {"app": "exporter"}},
                "spec": {"containers": [{"name": "c", "image": "x"}]},
            },
        },
    }
    pods = []
    for i in range(2):
        p = running_pod(
            f"web-{i}",
            labels=labels,
            grace=2,
            owner={"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web", "uid": RS_UID, "controller": True},
        )
        p["spec"]["volumes"] = [{"name": "scratch", "emptyDir": {}}]
        pods.append(p)
    ds_pod = running_pod(
        "exporter-n1",
        labels={"app": "exporter"},
        owner={"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "exporter", "uid": DS_UID, "controller": True},
    )
    lab.seed([node("n1"), node("n2"), node("n3"), rs, ds, *pods, ds_pod, pdb("web", minAvailable=2)])


def test_kubectl_get_nodes(kubectl, lab):
    lab.seed([node("n1"), node("n2")])
    out = json.loads(kubectl("get", "nodes", "-o", "json").stdout)
    assert out["kind"] == "List" or out["kind"] == "NodeList"
    assert [i["metadata"]["name"] for i in out["items"]] == ["n1", "n2"]
    table = kubectl("get", "nodes").stdout
    assert "n1" in table and "n2" in table
    assert "web" not in kubectl("get", "pods", "-A").stdout


def test_kubectl_relabels_a_node_for_mig_manager(kubectl, lab):
    lab.configure(migPendingSeconds=0.1)
    lab.seed([node("n1", labels={"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"})])
    out = kubectl("label", "node", "n1", "nvidia.com/mig.config=all-1g.10gb", "--overwrite").stdout
    assert out.strip() == "node/n1 labeled"

    def state() -> str:
        return kubectl("get", "node", "n1", "-o", r"jsonpath={.metadata.labels.nvidia\.com/mig\.config\.state}").stdout

    assert wait_for(lambda: state() == "success", timeout=15, what="mig.config.state success")
    capacity = kubectl("get", "node", "n1", "-o", r"jsonpath={.status.capacity.nvidia\.com/mig-1g\.10gb}").stdout
    assert capacity == "56"
    kubectl("label", "node", "n1", "nvidia.com/mig.config=all-3g.bogus", "--overwrite")
    assert wait_for(lambda: state() == "failed", timeout=15, what="mig.config.state failed")
    reason = kubectl("get", "node", "n1", "-o",
                     r"jsonpath={.metadata.annotations.lab\.millwright\.dev/mig\.config\.failure}").stdout  # fmt: skip
    assert "'all-3g.bogus' has no entry" in reason
    lab.configure(migDra=True)
    kubectl("label", "node", "n1", "nvidia.com/mig.config=all-disabled", "--overwrite")
    assert wait_for(lambda: state() == "success", timeout=15, what="mig.config.state success")
    rows = parse_table(kubectl("get", "resourceslices").stdout)
    assert [(r["NAME"], r["NODE"], r["DRIVER"], r["POOL"]) for r in rows] == [("n1-gpu.nvidia.com", "n1",
                                                                               "gpu.nvidia.com", "n1")]  # fmt: skip


def test_kubectl_cordon_drain_uncordon(kubectl, lab, api_client, core):
    seed_drain_scenario(lab)
    kubectl("cordon", "n1")
    assert core.read_node("n1").spec.unschedulable is True
    proc = subprocess.Popen(
        [
            KUBECTL,
            "--cache-dir",
            kubectl.cache,
            "drain",
            "n1",
            "--ignore-daemonsets",
            "--delete-emptydir-data",
            "--timeout=60s",
        ],
        env=kubectl.env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        # the PDB (minAvailable == replicas) blocks: kubectl gets 429 and says it will retry
        wait_for(
            lambda: any(e.get("subresource") == "eviction" and e["code"] == 429 for e in lab.audit()),
            timeout=30,
            what="a 429 eviction",
        )
        client.PolicyV1Api(api_client).patch_namespaced_pod_disruption_budget(
            "web", "default", {"spec": {"minAvailable": 1}}
        )
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
    web = wait_for(
        lambda: (lambda ps: ps if len(ps) == 2 and all(p.status.phase == "Running" for p in ps) else None)(
            core.list_namespaced_pod("default", label_selector="app=web").items
        ),
        timeout=10,
        what="replacement pods",
    )
    assert all(p.spec.node_name in ("n2", "n3") for p in web)
    kubectl("uncordon", "n1")
    assert not core.read_node("n1").spec.unschedulable
    evs = [e for e in lab.audit() if e.get("subresource") == "eviction"]
    assert any(e["eviction"]["outcome"] == "blocked" for e in evs)
    assert sum(1 for e in evs if e["eviction"]["outcome"] == "evicted") == 2


# ---------------------------------------------------------------- apply, get, describe, delete
MANIFEST = """\
apiVersion: v1
kind: Namespace
metadata: {name: conformance}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: settings, namespace: conformance}
data: {mode: "a"}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: conformance, labels: {app: web}}
spec:
  replicas: REPLICAS
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers:
      - {name: web, image: "nginx:1.27", ports: [{containerPort: 80}]}
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: web, namespace: conformance}
spec: {minAvailable: 1, selector: {matchLabels: {app: web}}}
---
apiVersion: cluster.x-k8s.io/v1beta2
kind: Cluster
metadata: {name: tenant-a, namespace: conformance}
spec:
  topology: {classRef: {name: gpu-class}, version: v1.32.4}
"""
KINDS = [
    "namespace/conformance",
    "configmap/settings",
    "deployment.apps/web",
    "poddisruptionbudget.policy/web",
    "cluster.cluster.x-k8s.io/tenant-a",
]


def parse_table(text: str) -> list[dict]:
    """kubectl's table output as rows of {HEADER: cell}, cut at the columns the header line starts."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    header = lines[0]
    starts = [m.start() for m in re.finditer(r"(?:(?<=^)|(?<=\s{2}))\S", header)]
    names = [header[a:b].strip() for a, b in zip(starts, [*starts[1:], None])]
    return [
        {n: ln[a:b].strip() if b else ln[a:].strip() for n, a, b in zip(names, starts, [*starts[1:], None])}
        for ln in lines[1:]
    ]


def columns(text: str) -> list[str]:
    return list(parse_table(text + "\n-")[0]) if text.strip() else []


def lab_node(name: str) -> dict:
    n = node(name, labels={"node-role.kubernetes.io/gpu-worker": ""})
    n["status"]["addresses"] = [{"type": "InternalIP", "address": "10.0.0.11"}, {"type": "Hostname", "address": name}]
    n["status"]["capacity"]["memory"] = n["status"]["allocatable"]["memory"] = "2Ti"
    n["status"]["nodeInfo"].update(
        {
            "kubeletVersion": "v1.32.4",
            "osImage": "Ubuntu 22.04.5 LTS",
            "kernelVersion": "5.15.0-119-generic",
            "containerRuntimeVersion": "containerd://1.7.22",
        }
    )
    return n


def test_capi_seed_file_is_the_emulators_bundle():
    with open(os.path.join(os.path.dirname(lab.k8s.crds.__file__), "..", "fleets", "capi-crds.json")) as f:
        assert json.load(f)["objects"] == CAPI_CRDS  # `lab seed lab/fleets/capi-crds.json` installs these


def test_kubectl_apply_get_describe_delete(kubectl, lab, tmp_path):
    pod = running_pod("trainer-0", node_name="n1", labels={"app": "trainer"})
    pod["metadata"]["uid"] = POD_UID
    pod["status"].update(
        {
            "podIP": "10.244.1.7",
            "podIPs": [{"ip": "10.244.1.7"}],
            "containerStatuses": [
                {
                    "name": "c",
                    "ready": True,
                    "restartCount": 2,
                    "image": "busybox",
                    "imageID": "",
                    "started": True,
                    "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}},
                    "lastState": {"terminated": {"exitCode": 1, "finishedAt": "2026-01-01T00:00:00Z"}},
                }
            ],
        }
    )
    event = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": "trainer-0.1", "namespace": "default"},
        "involvedObject": {
            "kind": "Pod",
            "namespace": "default",
            "name": "trainer-0",
            "uid": POD_UID,
            "apiVersion": "v1",
        },
        "reason": "Pulled",
        "message": 'Container image "busybox" already present on machine',
        "type": "Normal",
        "source": {"component": "kubelet", "host": "n1"},
        "count": 1,
    }
    lab.seed([*CAPI_CRDS, lab_node("n1"), pod, event])
    manifest = tmp_path / "manifest.yaml"

    def write(replicas: int, mode: str = "a") -> str:
        manifest.write_text(MANIFEST.replace("REPLICAS", str(replicas)).replace('mode: "a"', f'mode: "{mode}"'))
        return str(manifest)

    # client-side apply: create, no-op, change (last-applied annotation, strategic merge for built-ins)
    out = kubectl("apply", "-f", write(2)).stdout
    assert [ln.split()[0] for ln in out.splitlines()] == KINDS and all(
        ln.endswith(" created") for ln in out.splitlines()
    ), out
    out = kubectl("apply", "-f", write(2)).stdout.splitlines()
    # the PDB's selector has patch strategy "replace": kubectl always sends it, so it says "configured"
    assert out == [
        "namespace/conformance unchanged",
        "configmap/settings unchanged",
        "deployment.apps/web unchanged",
        "poddisruptionbudget.policy/web configured",
        "cluster.cluster.x-k8s.io/tenant-a unchanged",
    ], out
    out = kubectl("apply", "-f", write(3, mode="b")).stdout.splitlines()
    assert out == [
        "namespace/conformance unchanged",
        "configmap/settings configured",
        "deployment.apps/web configured",
        "poddisruptionbudget.policy/web configured",
        "cluster.cluster.x-k8s.io/tenant-a unchanged",
    ], out
    dep = json.loads(
        kubectl("get", "deployment", "web", "-n", "conformance", "-o", "json", "--show-managed-fields").stdout
    )
    assert dep["spec"]["replicas"] == 3
    assert (
        json.loads(dep["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"])["spec"][
            "replicas"
        ]
        == 3
    )
    assert [m["manager"] for m in dep["metadata"]["managedFields"]] == ["kubectl-client-side-apply"]

    # an unknown field is refused by the server (kubectl sends fieldValidation=Strict)
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: typo, namespace: conformance}\n"
        "spec: {replicaz: 1, selector: {matchLabels: {app: t}}, template: {metadata: {labels: {app: t}},"
        " spec: {containers: [{name: c, image: x}]}}}\n"
    )
    p = kubectl("apply", "-f", str(bad), check=False)
    assert (
        p.returncode != 0
        and 'Deployment in version "v1" cannot be handled as a Deployment: strict decoding '
        'error: unknown field "spec.replicaz"'
        in p.stderr
    ), p.stderr

    # -o yaml reads back what was applied (kubectl hides managedFields)
    cm = yaml.safe_load(kubectl("get", "configmap", "settings", "-n", "conformance", "-o", "yaml").stdout)
    assert cm["kind"] == "ConfigMap" and cm["data"] == {"mode": "b"} and "managedFields" not in cm["metadata"]

    # server-side apply takes the fields over; another manager's change conflicts until forced
    out = kubectl("apply", "--server-side", "-f", write(3, mode="b")).stdout.splitlines()
    assert [ln.split()[1] for ln in out] == ["serverside-applied"] * 5, out
    kubectl("patch", "deployment", "web", "-n", "conformance", "--type", "merge", "-p", '{"spec":{"replicas":5}}')
    p = kubectl("apply", "--server-side", "-f", write(3, mode="b"), check=False)
    assert p.returncode != 0
    assert 'Apply failed with 1 conflict: conflict with "kubectl-patch" using apps/v1: .spec.replicas' in p.stderr
    kubectl("apply", "--server-side", "--force-conflicts", "-f", write(3, mode="b"))
    dep = json.loads(
        kubectl("get", "deployment", "web", "-n", "conformance", "-o", "json", "--show-managed-fields").stdout
    )
    assert dep["spec"]["replicas"] == 3
    owners = {(m["manager"], m["operation"]) for m in dep["metadata"]["managedFields"]}
    assert ("kubectl", "Apply") in owners and not any(
        "f:replicas" in (m["fieldsV1"].get("f:spec") or {})
        for m in dep["metadata"]["managedFields"]
        if m["manager"] == "kubectl-patch"
    )

    # get: the server-side Table columns of the real printers (and the CRD's printer columns)
    wide = kubectl("get", "nodes", "-o", "wide").stdout
    assert columns(wide) == [
        "NAME",
        "STATUS",
        "ROLES",
        "AGE",
        "VERSION",
        "INTERNAL-IP",
        "EXTERNAL-IP",
        "OS-IMAGE",
        "KERNEL-VERSION",
        "CONTAINER-RUNTIME",
    ]
    row = parse_table(wide)[0]
    assert (
        row["NAME"],
        row["STATUS"],
        row["ROLES"],
        row["VERSION"],
        row["INTERNAL-IP"],
        row["EXTERNAL-IP"],
        row["OS-IMAGE"],
        row["CONTAINER-RUNTIME"],
    ) == ("n1", "Ready", "gpu-worker", "v1.32.4", "10.0.0.11", "<none>", "Ubuntu 22.04.5 LTS", "containerd://1.7.22")
    assert columns(kubectl("get", "nodes").stdout) == ["NAME", "STATUS", "ROLES", "AGE", "VERSION"]
    pods = kubectl("get", "pods", "-o", "wide").stdout
    assert columns(pods) == [
        "NAME",
        "READY",
        "STATUS",
        "RESTARTS",
        "AGE",
        "IP",
        "NODE",
        "NOMINATED NODE",
        "READINESS GATES",
    ]
    row = parse_table(pods)[0]
    assert (row["NAME"], row["READY"], row["STATUS"], row["IP"], row["NODE"], row["NOMINATED NODE"]) == (
        "trainer-0",
        "1/1",
        "Running",
        "10.244.1.7",
        "n1",
        "<none>",
    )
    assert re.fullmatch(r"2 \(\S+ ago\)", row["RESTARTS"]), row
    deps = kubectl("get", "deployments", "-n", "conformance", "-o", "wide").stdout
    assert columns(deps) == ["NAME", "READY", "UP-TO-DATE", "AVAILABLE", "AGE", "CONTAINERS", "IMAGES", "SELECTOR"]
    row = parse_table(deps)[0]
    assert (row["NAME"], row["READY"], row["CONTAINERS"], row["IMAGES"], row["SELECTOR"]) == (
        "web",
        "0/3",
        "web",
        "nginx:1.27",
        "app=web",
    )
    pdbs = kubectl("get", "pdb", "-n", "conformance").stdout
    assert columns(pdbs) == ["NAME", "MIN AVAILABLE", "MAX UNAVAILABLE", "ALLOWED DISRUPTIONS", "AGE"]
    assert [parse_table(pdbs)[0][c] for c in ("NAME", "MIN AVAILABLE", "MAX UNAVAILABLE")] == ["web", "1", "N/A"]
    clusters = kubectl("get", "clusters", "-n", "conformance").stdout
    assert columns(clusters) == [
        "NAME",
        "CLUSTERCLASS",
        "AVAILABLE",
        "CP DESIRED",
        "CP AVAILABLE",
        "CP UP-TO-DATE",
        "W DESIRED",
        "W AVAILABLE",
        "W UP-TO-DATE",
        "PHASE",
        "AGE",
        "VERSION",
    ]
    row = parse_table(clusters)[0]
    assert (row["NAME"], row["CLUSTERCLASS"], row["VERSION"]) == ("tenant-a", "gpu-class", "v1.32.4")
    assert columns(kubectl("get", "clusterroles").stdout or "NAME   CREATED AT") == ["NAME", "CREATED AT"]
    assert columns(kubectl("get", "namespaces").stdout) == ["NAME", "STATUS", "AGE"]
    events = kubectl("get", "events", "-n", "default").stdout
    assert columns(events) == ["LAST SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"]
    assert parse_table(events)[0]["OBJECT"] == "pod/trainer-0"

    # get -w: watch events come as table rows too
    watch = subprocess.Popen(
        [KUBECTL, "--cache-dir", kubectl.cache, "get", "pods", "-o", "wide", "--watch-only", "--request-timeout=4s"],
        env=kubectl.env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_for(
            lambda: any(e.get("verb") == "watch" and e.get("resource") == "pods" for e in lab.audit()),
            timeout=10,
            what="kubectl's watch",
        )
        kubectl("label", "pod", "trainer-0", "checked=yes")
        out, _ = watch.communicate(timeout=20)
    finally:
        if watch.poll() is None:
            watch.kill()
            watch.communicate()
    row = parse_table(out)[0]
    assert (row["NAME"], row["STATUS"], row["NODE"]) == ("trainer-0", "Running", "n1"), out

    # describe reads the object, its pods and events
    d = kubectl("describe", "node", "n1").stdout
    assert re.search(r"^Name:\s+n1$", d, re.M) and re.search(r"^Roles:\s+gpu-worker$", d, re.M)
    assert re.search(r"^\s+default\s+trainer-0\s", d, re.M), d  # Non-terminated Pods
    d = kubectl("describe", "pod", "trainer-0").stdout
    assert re.search(r"^Node:\s+n1/", d, re.M) and re.search(r"^Status:\s+Running$", d, re.M)
    assert re.search(r"Normal\s+Pulled\s+.*kubelet.*already present on machine", d), d
    d = kubectl("describe", "cluster", "tenant-a", "-n", "conformance").stdout
    assert re.search(r"^Name:\s+tenant-a$", d, re.M) and re.search(r"^Kind:\s+Cluster$", d, re.M)
    assert re.search(r"^API Version:\s+cluster.x-k8s.io/v1beta2$", d, re.M)

    # delete waits for every object to be gone; the namespace goes last, or its controller deletes the rest first
    docs = manifest.read_text().split("---\n")
    manifest.write_text("---\n".join(docs[1:] + docs[:1]))
    out = kubectl("delete", "-f", str(manifest), "--timeout=40s", timeout=60).stdout.splitlines()
    assert sorted(out) == sorted(f'{k.split("/")[0]} "{k.split("/")[1]}" deleted' for k in KINDS), out
    assert "conformance" not in kubectl("get", "namespaces").stdout
