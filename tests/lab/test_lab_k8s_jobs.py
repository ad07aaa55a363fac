"""The emulator's Job controller, job outcome rules, node reboots, and the indexes behind them."""

from __future__ import annotations

import json
import re
import time

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from lab.k8s.server import load_config_file
from tests.lab.labtest_helpers import node, wait_for

NS = "millwright-system"


@pytest.fixture
def batch(api_client) -> client.BatchV1Api:
    return client.BatchV1Api(api_client)


@pytest.fixture
def jobs_lab(lab):
    lab.seed([node("n1"), node("n2"), {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}])
    lab.configure(jobs={"defaultSeconds": 0.2, "rules": []}, rebootSeconds=0.5)
    return lab


def job(
    name: str,
    node_name: str = "n1",
    *,
    labels: dict | None = None,
    backoff: int = 0,
    deadline: int | None = None,
    ttl: int | None = None,
    restart: str = "Never",
    pin: str = "nodeName",
) -> dict:
    labels = {
        "millwright.dev/node": node_name,
        "millwright.dev/package": "pkg",
        "millwright.dev/stage": "apply",
        **(labels or {}),
    }
    pod_spec: dict = {
        "restartPolicy": restart,
        "initContainers": [{"name": "apply", "image": "registry.local/pkg:1.0.0"}],
        "containers": [{"name": "apply-check", "image": "registry.local/pkg:1.0.0"}],
    }
    if pin == "nodeName":
        pod_spec["nodeName"] = node_name
    else:
        pod_spec["nodeSelector"] = {"kubernetes.io/hostname": node_name}
    spec: dict = {"backoffLimit": backoff, "template": {"metadata": {"labels": dict(labels)}, "spec": pod_spec}}
    if deadline is not None:
        spec["activeDeadlineSeconds"] = deadline
    if ttl is not None:
        spec["ttlSecondsAfterFinished"] = ttl
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": NS, "labels": labels},
        "spec": spec,
    }


def finished(batch: client.BatchV1Api, name: str):
    def probe():
        j = batch.read_namespaced_job(name, NS)
        conds = {c.type: c for c in j.status.conditions or [] if c.status == "True"}
        return j if ("Complete" in conds or "Failed" in conds) else None

    return probe


def pods_of(core: client.CoreV1Api, name: str) -> list:
    return core.list_namespaced_pod(NS, label_selector=f"job-name={name}").items


def test_job_runs_one_pod_on_its_node_and_completes(jobs_lab, batch, core):
    created = batch.create_namespaced_job(NS, job("j1"))
    assert created.spec.backoff_limit == 0 and created.spec.completions == 1
    assert created.spec.selector.match_labels == {"batch.kubernetes.io/controller-uid": created.metadata.uid}
    j = wait_for(finished(batch, "j1"), timeout=10, what="job j1 finished")
    conds = {c.type: c for c in j.status.conditions}
    assert set(conds) == {"SuccessCriteriaMet", "Complete"}
    assert conds["Complete"].reason == "CompletionsReached"
    assert j.status.succeeded == 1 and not j.status.failed and not j.status.active
    assert j.status.start_time is not None and j.status.completion_time is not None
    (pod,) = pods_of(core, "j1")
    assert re.fullmatch(r"j1-[a-z0-9]{5}", pod.metadata.name)
    assert pod.spec.node_name == "n1"
    assert pod.status.phase == "Succeeded"
    ref = pod.metadata.owner_references[0]
    assert (ref.kind, ref.name, ref.uid, ref.controller) == ("Job", "j1", created.metadata.uid, True)
    assert pod.metadata.labels["job-name"] == "j1" and pod.metadata.labels["millwright.dev/package"] == "pkg"
    assert pod.status.init_container_statuses[0].state.terminated.reason == "Completed"
    assert pod.status.container_statuses[0].state.terminated.exit_code == 0
    # the index behind spec.nodeName= lists it
    on_n1 = core.list_pod_for_all_namespaces(field_selector="spec.nodeName=n1").items
    assert [p.metadata.name for p in on_n1] == [pod.metadata.name]
    assert core.list_pod_for_all_namespaces(field_selector="spec.nodeName=n2").items == []


def test_an_indexed_job_runs_one_pod_per_index_at_once_and_completes(jobs_lab, batch, core):
    spec = job("ix", pin="selector")
    spec["spec"].update(completionMode="Indexed", completions=3, parallelism=3, backoffLimit=0)
    batch.create_namespaced_job(NS, spec)
    running = wait_for(lambda: len(ps := pods_of(core, "ix")) == 3 and ps, timeout=10, what="three pods at once")
    by_index = {int(p.metadata.annotations["batch.kubernetes.io/job-completion-index"]): p for p in running}
    assert sorted(by_index) == [0, 1, 2]
    for i, pod in by_index.items():
        assert re.fullmatch(rf"ix-{i}-[a-z0-9]{{5}}", pod.metadata.name)
        assert pod.metadata.labels["batch.kubernetes.io/job-completion-index"] == str(i)
        assert pod.spec.hostname == f"ix-{i}"
        (env,) = pod.spec.containers[0].env
        assert env.name == "JOB_COMPLETION_INDEX"
    j = wait_for(finished(batch, "ix"), timeout=10, what="job ix finished")
    assert j.status.succeeded == 3 and {c.type for c in j.status.conditions} == {"SuccessCriteriaMet", "Complete"}
    assert len(pods_of(core, "ix")) == 3  # no index ran twice


def test_node_selector_hostname_pins_the_pod(jobs_lab, batch, core):
    batch.create_namespaced_job(NS, job("js", "n2", pin="selector"))
    wait_for(finished(batch, "js"), timeout=10, what="job finished")
    (pod,) = pods_of(core, "js")
    assert pod.spec.node_name == "n2"


def test_job_rule_fails_with_message_and_backoff_zero(jobs_lab, batch, core):
    jobs_lab.configure(
        jobs={
            "defaultSeconds": 0.1,
            "rules": [
                {"node": "n1", "package": "pkg", "stage": "apply", "outcome": "fail", "message": "dkms build failed"}
            ],
        }
    )
    batch.create_namespaced_job(NS, job("jf"))
    j = wait_for(finished(batch, "jf"), timeout=10, what="job failed")
    conds = {c.type: c for c in j.status.conditions}
    assert set(conds) == {"FailureTarget", "Failed"}
    assert conds["Failed"].reason == "BackoffLimitExceeded"
    assert j.status.failed == 1 and not j.status.succeeded
    (pod,) = pods_of(core, "jf")
    assert pod.status.phase == "Failed"
    term = pod.status.init_container_statuses[0].state.terminated
    assert (term.reason, term.exit_code, term.message) == ("Error", 1, "dkms build failed")
    # a rule for another node does not apply
    batch.create_namespaced_job(NS, job("jok", "n2"))
    j = wait_for(finished(batch, "jok"), timeout=10, what="job on n2 finished")
    assert j.status.succeeded == 1


def test_backoff_limit_retries_with_a_new_pod_and_times_runs_out(jobs_lab, batch, core):
    jobs_lab.configure(jobs={"defaultSeconds": 0.1, "rules": [{"stage": "apply", "outcome": "fail", "times": 1}]})
    batch.create_namespaced_job(NS, job("jr", backoff=1))
    j = wait_for(finished(batch, "jr"), timeout=10, what="job finished")
    assert {c.type for c in j.status.conditions} == {"SuccessCriteriaMet", "Complete"}
    assert (j.status.failed, j.status.succeeded) == (1, 1)
    assert sorted(p.status.phase for p in pods_of(core, "jr")) == ["Failed", "Succeeded"]
    rules = jobs_lab.http.get("/_lab/config").json()["jobs"]["rules"]
    assert rules[0]["times"] == 0


def test_on_failure_restarts_count_against_the_backoff_limit(jobs_lab, batch, core):
    jobs_lab.configure(jobs={"defaultSeconds": 0.1, "rules": [{"outcome": "fail", "message": "boom"}]})
    batch.create_namespaced_job(NS, job("jo", backoff=1, restart="OnFailure"))
    j = wait_for(finished(batch, "jo"), timeout=10, what="job failed")
    assert {c.type: c.reason for c in j.status.conditions}["Failed"] == "BackoffLimitExceeded"
    (pod,) = pods_of(core, "jo")
    assert pod.status.phase == "Failed"
    assert pod.status.init_container_statuses[0].restart_count == 2


def test_active_deadline_fails_the_job_and_kills_the_pod(jobs_lab, batch, core):
    jobs_lab.configure(jobs={"defaultSeconds": 30})
    batch.create_namespaced_job(NS, job("jd", deadline=1))
    j = wait_for(finished(batch, "jd"), timeout=10, what="job failed")
    cond = {c.type: c for c in j.status.conditions}["Failed"]
    assert cond.reason == "DeadlineExceeded"
    wait_for(lambda: not pods_of(core, "jd"), timeout=10, what="pod deleted")


def test_ttl_after_finished_deletes_job_and_pods(jobs_lab, batch, core):
    batch.create_namespaced_job(NS, job("jt", ttl=0))

    def gone():
        try:
            batch.read_namespaced_job("jt", NS)
            return False
        except ApiException as e:
            return e.status == 404

    wait_for(gone, timeout=10, what="job deleted by its TTL")
    wait_for(lambda: not pods_of(core, "jt"), timeout=10, what="pods deleted")
    actors = {e["userAgent"] for e in jobs_lab.audit(writes=True) if e["resource"] == "jobs" and e["verb"] == "delete"}
    assert actors == {"lab-controller/ttl-after-finished-controller"}


def test_delete_propagation(jobs_lab, batch, core):
    jobs_lab.configure(jobs={"defaultSeconds": 30})
    for name in ("jbg", "jorph"):
        batch.create_namespaced_job(NS, job(name))
    wait_for(lambda: pods_of(core, "jbg") and pods_of(core, "jorph"), timeout=10, what="pods created")
    batch.delete_namespaced_job("jbg", NS, propagation_policy="Background")
    wait_for(lambda: not pods_of(core, "jbg"), timeout=10, what="pods of jbg garbage-collected")
    batch.delete_namespaced_job("jorph", NS)  # batch/v1 default: orphan
    time.sleep(0.3)
    (pod,) = pods_of(core, "jorph")
    assert not pod.metadata.owner_references


def test_job_validation(jobs_lab, batch):
    bad = job("jbad")
    bad["spec"]["template"]["spec"]["restartPolicy"] = "Always"
    with pytest.raises(ApiException) as ei:
        batch.create_namespaced_job(NS, bad)
    assert ei.value.status == 422


def test_reboot_interrupt_job_reboots_the_node(jobs_lab, batch, core):
    before = core.read_node("n1").status.node_info.boot_id
    seen_not_ready = []

    def ready_and_new_boot():
        n = core.read_node("n1")
        ready = next(c for c in n.status.conditions if c.type == "Ready")
        if ready.status == "False":
            seen_not_ready.append(ready.reason)
        return ready.status == "True" and n.status.node_info.boot_id != before

    batch.create_namespaced_job(
        NS,
        job(
            "jint",
            labels={"millwright.dev/stage": "interrupt", "millwright.dev/interrupt": "reboot"},
            restart="OnFailure",
        ),
    )
    wait_for(lambda: seen_not_ready or ready_and_new_boot(), timeout=10, interval=0.02, what="node NotReady")
    assert seen_not_ready == ["KubeletNotReady"]
    j = wait_for(finished(batch, "jint"), timeout=10, what="interrupt job done")
    assert j.status.succeeded == 1
    assert ready_and_new_boot()
    after = core.read_node("n1").status.node_info.boot_id
    assert after != before and len(after) == 36


def test_service_interrupt_just_completes(jobs_lab, batch, core):
    before = core.read_node("n1").status.node_info.boot_id
    batch.create_namespaced_job(
        NS, job("jsvc", labels={"millwright.dev/stage": "interrupt", "millwright.dev/interrupt": "service"})
    )
    j = wait_for(finished(batch, "jsvc"), timeout=10, what="done")
    assert j.status.succeeded == 1
    assert core.read_node("n1").status.node_info.boot_id == before


def test_jobs_config_is_validated(jobs_lab):
    r = jobs_lab.http.post("/_lab/config", json={"jobs": {"rules": [{"outcome": "explode"}]}})
    assert r.status_code == 400
    r = jobs_lab.http.post("/_lab/config", json={"jobs": {"rules": [{"nod": "n1"}]}})
    assert r.status_code == 400
    cfg = jobs_lab.configure(jobs={"rules": [{"node": "n1"}]})
    assert cfg["jobs"]["defaultSeconds"] == 1.0  # defaults filled in


def test_seed_file_may_carry_job_rules(tmp_path):
    f = tmp_path / "fleet.yaml"
    f.write_text(
        yaml.safe_dump(
            {
                "nodes": [{"prefix": "n", "count": 2}],
                "rebootSeconds": 0.1,
                "jobs": {"defaultSeconds": 0.5, "rules": [{"node": "n01", "outcome": "fail"}]},
            }
        )
    )
    cfg = load_config_file(str(f))
    assert cfg["rebootSeconds"] == 0.1 and cfg["jobs"]["rules"] == [{"node": "n01", "outcome": "fail"}]
    g = tmp_path / "objects.json"
    g.write_text(json.dumps({"objects": []}))
    assert load_config_file(str(g)) == {}


def test_node_pages_without_selectors_report_remaining_items(lab, core):
    lab.seed([node(f"p{i:02d}", labels={"pool": "a" if i % 2 else "b"}) for i in range(25)])
    names, cont, pages = [], None, 0
    while True:
        page = core.list_node(limit=10, _continue=cont)
        names += [n.metadata.name for n in page.items]
        pages += 1
        cont = page.metadata._continue
        if not cont:
            break
        assert page.metadata.remaining_item_count == 25 - len(names)
    assert names == [f"p{i:02d}" for i in range(25)] and pages == 3
    names, cont = [], None
    while True:
        page = core.list_node(limit=5, label_selector="pool=a", _continue=cont)
        names += [n.metadata.name for n in page.items]
        cont = page.metadata._continue
        if not cont:
            break
        assert page.metadata.remaining_item_count is None
    assert names == [f"p{i:02d}" for i in range(25) if i % 2]


def test_state_file_keeps_job_rules_and_finishes_a_reboot(tmp_path):
    import httpx

    from lab.k8s.process import EmulatorProcess

    state = tmp_path / "state.json"
    rules = {"defaultSeconds": 0.3, "rules": [{"node": "n1", "outcome": "fail", "times": 2}]}
    with EmulatorProcess(state_file=str(state)) as emu, httpx.Client(base_url=emu.url) as http:
        http.post("/_lab/seed", json={"objects": [node("n1")]}).raise_for_status()
        http.post("/_lab/config", json={"jobs": rules, "rebootSeconds": 3600}).raise_for_status()
        # a node caught mid-reboot when the emulator stops
        http.patch(
            "/api/v1/nodes/n1/status",
            headers={"Content-Type": "application/merge-patch+json"},
            json={
                "status": {
                    "conditions": [
                        {
                            "type": "Ready",
                            "status": "False",
                            "reason": "KubeletNotReady",
                            "message": "lab: node is rebooting",
                        }
                    ]
                }
            },
        ).raise_for_status()
    with EmulatorProcess(state_file=str(state)) as emu, httpx.Client(base_url=emu.url) as http:
        assert http.get("/_lab/config").json()["jobs"] == rules

        def back():
            n = http.get("/api/v1/nodes/n1").json()
            ready = next(c for c in n["status"]["conditions"] if c["type"] == "Ready")
            return ready["status"] == "True" and n["status"]["nodeInfo"]["bootID"] != "boot-n1"

        wait_for(back, timeout=10, what="the interrupted reboot finished after the restart")
