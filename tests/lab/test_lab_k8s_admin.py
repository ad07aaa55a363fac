"""Fault injection, audit log, admin client, process entry point, state file, fleets."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import httpx
import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from lab.fleet import DEMO_FLEET, load_fleet
from lab.k8s.admin import EmulatorAdmin, kubeconfig
from lab.k8s.process import EmulatorProcess


def test_fault_status_with_retry_after(core, lab, emulator):
    lab.fault(
        {"verb": "get", "resource": "configmaps", "name": "x"},
        {"status": 429, "retryAfterSeconds": 2, "message": "slow down"},
        count=2,
    )
    core.create_namespaced_config_map("default", {"metadata": {"name": "x"}})
    with httpx.Client(base_url=emulator.url) as http:
        r = http.get("/api/v1/namespaces/default/configmaps/x")
        assert r.status_code == 429 and r.headers["Retry-After"] == "2"
        body = r.json()
        assert body["reason"] == "TooManyRequests" and body["details"]["retryAfterSeconds"] == 2
        assert body["message"] == "slow down"
    # NB: urllib3's default Retry re-sends idempotent requests (GET/PUT/DELETE) answered 429/503 with a
    # Retry-After header, so the typed client swallows this second fault on its own.
    assert core.read_namespaced_config_map("x", "default").metadata.name == "x"
    faults = lab.http.get("/_lab/faults").json()["faults"]
    assert faults[0]["remaining"] == 0
    lab.fault({"verb": "create", "resource": "configmaps"}, {"status": 429, "retryAfterSeconds": 1})
    with pytest.raises(ApiException) as ei:  # POST is not retried
        core.create_namespaced_config_map("default", {"metadata": {"name": "z"}})
    assert ei.value.status == 429 and ei.value.headers["Retry-After"] == "1"
    lab.fault({"verb": "create", "resource": "configmaps"}, {"status": 503}, count=1)
    with pytest.raises(ApiException) as ei:
        core.create_namespaced_config_map("default", {"metadata": {"name": "y"}})
    assert ei.value.status == 503 and json.loads(ei.value.body)["reason"] == "ServiceUnavailable"


def test_fault_delay_and_drops(lab, emulator):
    lab.fault({"verb": "list", "resource": "configmaps"}, {"delay": 0.5})
    with httpx.Client(base_url=emulator.url, timeout=10) as http:
        t0 = time.monotonic()
        assert http.get("/api/v1/namespaces/default/configmaps").status_code == 200
        assert time.monotonic() - t0 >= 0.45
    lab.fault({"verb": "create", "resource": "configmaps"}, {"drop": "before"})
    with httpx.Client(base_url=emulator.url, timeout=10) as http, pytest.raises(httpx.TransportError):
        http.post("/api/v1/namespaces/default/configmaps", json={"metadata": {"name": "before"}})
    with httpx.Client(base_url=emulator.url, timeout=10) as http:
        assert http.get("/api/v1/namespaces/default/configmaps/before").status_code == 404
    lab.fault({"verb": "create", "resource": "configmaps"}, {"drop": "after"})
    with httpx.Client(base_url=emulator.url, timeout=10) as http, pytest.raises(httpx.TransportError):
        http.post("/api/v1/namespaces/default/configmaps", json={"metadata": {"name": "after"}})
    with httpx.Client(base_url=emulator.url, timeout=10) as http:
        assert http.get("/api/v1/namespaces/default/configmaps/after").status_code == 200
    entries = [e for e in lab.audit() if e.get("fault")]
    assert [e["fault"].get("drop") or ("delay" if "delay" in e["fault"] else None) for e in entries] == [
        "delay",
        "before",
        "after",
    ]


def test_audit_entries(core, lab):
    core.create_namespaced_config_map("default", {"metadata": {"name": "a"}, "data": {"k": "1"}})
    core.read_namespaced_config_map("a", "default")
    core.patch_namespaced_config_map("a", "default", {"data": {"k": "2"}})
    entries = lab.audit()
    assert [e["seq"] for e in entries] == sorted(e["seq"] for e in entries)
    create, get, patch = entries[-3:]
    assert (create["verb"], create["code"], create["write"], create["name"]) == ("create", 201, True, "a")
    assert (get["verb"], get["code"], get["write"]) == ("get", 200, False)
    assert patch["verb"] == "patch" and {"path": ".data.k", "old": "1", "new": "2"} in patch["changes"]
    for e in entries:
        assert {
            "seq",
            "time",
            "verb",
            "group",
            "version",
            "resource",
            "subresource",
            "namespace",
            "name",
            "code",
            "userAgent",
            "write",
        } <= set(e)
    assert "OpenAPI-Generator" in patch["userAgent"] or patch["userAgent"]
    writes = lab.audit(since=create["seq"] - 1, writes=True)
    assert all(e["write"] for e in writes) and writes[0]["seq"] == create["seq"]


async def test_admin_client(emulator, lab):
    admin = EmulatorAdmin(emulator.url)
    try:
        await admin.reset()
        res = await admin.seed(
            [
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "t"}},
                {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "t"}},
            ]
        )
        assert res["created"] == 2
        names = {(o["kind"], o["metadata"]["name"]) for o in await admin.dump()}
        assert {("Namespace", "t"), ("ConfigMap", "c"), ("Namespace", "default"), ("Namespace", "kube-system")} <= names
        cfg = await admin.configure(podStartSeconds=0.2)
        assert cfg["podStartSeconds"] == 0.2
        fid = await admin.add_fault({"verb": "get"}, {"status": 500}, count=1)
        assert isinstance(fid, int)
        await admin.clear_faults()
        assert await admin.audit(writes=True) == []
        await admin.reset()
        kc = kubeconfig(emulator.url, "edge-1")
        assert kc["current-context"] == "edge-1" and kc["clusters"][0]["name"] == "edge-1"
        assert kc["clusters"][0]["cluster"]["server"] == emulator.url
    finally:
        await admin.aclose()


def test_demo_fleet_seeds(api_client, core, lab):
    fleet = load_fleet(DEMO_FLEET)
    res = lab.seed(fleet.to_objects())
    assert not res["errors"]
    nodes = core.list_node().items
    assert [n.metadata.name for n in nodes] == [f"gpu-node-0{i}" for i in range(1, 7)]
    assert all(n.status.allocatable["nvidia.com/gpu"] == "8" and n.status.node_info.boot_id for n in nodes)
    train = core.list_namespaced_pod("training").items
    assert sorted(p.spec.node_name for p in train) == [f"gpu-node-0{i}" for i in range(1, 7)]
    assert all(p.status.phase == "Running" for p in train)
    pdb = client.PolicyV1Api(api_client).read_namespaced_pod_disruption_budget("llm-pretrain", "training")
    assert pdb.status.disruptions_allowed == 1 and pdb.status.desired_healthy == 5
    inf = client.PolicyV1Api(api_client).read_namespaced_pod_disruption_budget("chat-inference", "inference")
    assert inf.status.disruptions_allowed == 1 and inf.status.expected_pods == 3
    prot = core.list_pod_for_all_namespaces(label_selector="millwright.dev/protected=true").items
    assert len(prot) == 1 and prot[0].spec.node_name == "gpu-node-02"
    assert len(core.list_namespaced_pod("gpu-operator").items) == 6


def test_state_file_round_trip_and_cli(tmp_path):
    state = tmp_path / "state.json"
    seed = tmp_path / "seed.json"
    seed.write_text(
        json.dumps(
            {
                "objects": [
                    {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "seeded", "namespace": "default"}}
                ]
            }
        )
    )
    with EmulatorProcess(state_file=str(state), seeds=[str(seed)]) as emu:
        http = httpx.Client(base_url=emu.url)
        r = http.post("/api/v1/namespaces/default/configmaps", json={"metadata": {"name": "kept"}, "data": {"a": "1"}})
        uid = r.json()["metadata"]["uid"]
        assert http.get("/api/v1/namespaces/default/configmaps/seeded").status_code == 200
        http.close()
        rc = emu.stop()
    assert rc == 0 and state.exists()
    with EmulatorProcess(state_file=str(state)) as emu, httpx.Client(base_url=emu.url) as http:
        got = http.get("/api/v1/namespaces/default/configmaps/kept").json()
        assert got["data"] == {"a": "1"} and got["metadata"]["uid"] == uid


def test_process_prints_listening_line_and_exits_zero(tmp_path):
    ready = tmp_path / "ready.json"
    p = subprocess.Popen(
        [sys.executable, "-m", "lab.k8s", "--host", "127.0.0.1", "--port", "0", "--ready-file", str(ready)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
    )
    try:
        line = p.stdout.readline()
        assert line.startswith("lab.k8s listening on http://127.0.0.1:")
        for _ in range(100):
            if ready.exists():
                break
            time.sleep(0.05)
        data = json.loads(ready.read_text())
        assert data["url"] == line.split()[-1] and data["pid"] == p.pid
    finally:
        p.send_signal(signal.SIGINT)
        assert p.wait(10) == 0


def test_process_failure_reports_stderr():
    emu = EmulatorProcess(extra_args=["--bogus-flag"], startup_timeout=10)
    with pytest.raises(RuntimeError, match="bogus"):
        emu.start()


def test_token_auth_file_names_each_caller_in_the_audit_and_refuses_other_tokens(tmp_path):
    tokens = tmp_path / "tokens.csv"
    tokens.write_text('site-one-secret,millwright-site-1,1\nadmin-secret,lab-admin,2,"system:masters"\n')
    with EmulatorProcess(extra_args=["--token-auth-file", str(tokens)]) as emu:
        for token, code in (("site-one-secret", 200), ("admin-secret", 200), ("lab-token", 401), (None, 401)):
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            answer = httpx.get(f"{emu.url}/api/v1/nodes", headers=headers)
            assert answer.status_code == code, (token, answer.text)
        with httpx.Client(base_url=emu.url) as http:
            entries = http.get("/_lab/audit").json()["entries"]
    assert [(e["user"], e["code"]) for e in entries] == [
        ("millwright-site-1", 200), ("lab-admin", 200), ("system:anonymous", 401), ("system:anonymous", 401)
    ]  # fmt: skip
