"""Eviction API, PDB status math, the disruption controller and the ReplicaSet simulator."""

from __future__ import annotations

import json

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from tests.lab.labtest_helpers import node, pdb, running_pod, wait_for

RS_UID = "11111111-2222-3333-4444-555555555555"


def owner(name="web", uid=RS_UID):
    return {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "name": name,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def replicaset(name="web", replicas=3, uid=RS_UID):
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {"name": name, "namespace": "default", "uid": uid},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"terminationGracePeriodSeconds": 1, "containers": [{"name": "c", "image": "x"}]},
            },
        },
    }


def evict(core, name, ns="default", **delete_options):
    body = client.V1Eviction(
        metadata=client.V1ObjectMeta(name=name, namespace=ns),
        delete_options=client.V1DeleteOptions(**delete_options) if delete_options else None,
    )
    return core.create_namespaced_pod_eviction(name, ns, body)


def read_pdb(api_client, name="web"):
    return client.PolicyV1Api(api_client).read_namespaced_pod_disruption_budget(name, "default")


def test_pdb_status_math(api_client, core, lab):
    pods = [running_pod(f"w{i}", labels={"app": "web"}) for i in range(4)]
    pods[3]["status"]["conditions"][0]["status"] = "False"  # not Ready
    lab.seed([node("n1"), *pods, pdb("web", minAvailable="50%"), pdb("mu", labels={"app": "web"}, maxUnavailable=1)])
    p = read_pdb(api_client)
    assert (
        p.status.expected_pods,
        p.status.current_healthy,
        p.status.desired_healthy,
        p.status.disruptions_allowed,
        p.status.observed_generation,
    ) == (4, 3, 2, 1, 1)
    m = read_pdb(api_client, "mu")
    assert (m.status.desired_healthy, m.status.disruptions_allowed) == (3, 0)
    # two PDBs match -> 500: the Status the handler returns as its result, no reason, the message as is
    with pytest.raises(ApiException) as ei:
        evict(core, "w0")
    assert ei.value.status == 500
    assert json.loads(ei.value.body) == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "code": 500,
        "message": "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.",
    }


def test_eviction_201_then_429(api_client, core, lab):
    lab.seed(
        [
            node("n1"),
            *[running_pod(f"w{i}", labels={"app": "web"}, grace=1) for i in range(3)],
            pdb("web", minAvailable=2),
        ]
    )
    assert read_pdb(api_client).status.disruptions_allowed == 1
    before = lab.audit()[-1]["seq"] if lab.audit() else 0
    res = evict(core, "w0")
    assert res is not None
    assert core.read_namespaced_pod("w0", "default").metadata.deletion_timestamp is not None
    st = read_pdb(api_client).status
    assert st.disruptions_allowed == 0 and st.current_healthy == 2
    with pytest.raises(ApiException) as ei:
        evict(core, "w1")
    body = json.loads(ei.value.body)
    assert ei.value.status == 429 and body["reason"] == "TooManyRequests"
    assert body["message"] == "Cannot evict pod as it would violate the pod's disruption budget."
    assert body["details"]["causes"] == [
        {"reason": "DisruptionBudget", "message": "The disruption budget web needs 2 healthy pods and has 2 currently"}
    ]
    evs = [e for e in lab.audit(since=before) if e.get("subresource") == "eviction"]
    assert [e["eviction"]["outcome"] for e in evs] == ["evicted", "blocked"]
    assert evs[0]["code"] == 201 and evs[1]["code"] == 429
    assert evs[0]["eviction"]["pdb"] == "default/web"
    assert evs[0]["eviction"]["disruptionsAllowedBefore"] == 1 and evs[0]["eviction"]["currentHealthyBefore"] == 3
    assert evs[1]["eviction"]["desiredHealthy"] == 2


def test_eviction_edge_cases(api_client, core, lab, emulator):
    import httpx

    lab.seed(
        [
            node("n1"),
            running_pod("w0", labels={"app": "web"}),
            running_pod("w1", labels={"app": "web"}),
            pdb("web", minAvailable=2),
        ]
    )
    with httpx.Client(base_url=emulator.url) as http:
        r = http.post(
            "/api/v1/namespaces/default/pods/w0/eviction",
            json={"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "other"}},
        )
        assert r.status_code == 400 and r.json()["message"] == "name in URL does not match name in Eviction object"
        r = http.post(
            "/api/v1/namespaces/default/pods/nope/eviction",
            json={"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "nope"}},
        )
        assert r.status_code == 404
    # A uid precondition is checked by the delete, after the budget: with none to spare, the budget answers.
    with pytest.raises(ApiException) as ei:
        evict(core, "w0", preconditions=client.V1Preconditions(uid="wrong"))
    assert ei.value.status == 429
    # Pending pod ignores the PDB
    pending = running_pod("pend", labels={"app": "web"})
    pending["status"] = {"phase": "Pending"}
    del pending["spec"]["nodeName"]
    lab.seed([pending])
    evict(core, "pend")
    with pytest.raises(ApiException):
        core.read_namespaced_pod("pend", "default")
    # stale observedGeneration -> 429 while the controller is frozen
    lab.configure(disruptionControllerFrozen=True)
    client.PolicyV1Api(api_client).patch_namespaced_pod_disruption_budget(
        "web", "default", {"spec": {"minAvailable": 1}}
    )
    with pytest.raises(ApiException) as ei:
        evict(core, "w0")
    assert ei.value.status == 429 and "still being processed" in ei.value.body
    assert json.loads(ei.value.body)["details"]["retryAfterSeconds"] == 10 and ei.value.headers["Retry-After"] == "10"
    lab.configure(disruptionControllerFrozen=False)
    assert read_pdb(api_client).status.disruptions_allowed == 1
    assert evict(core, "w0") is not None


def test_not_ready_pod_evicted_when_budget_healthy(api_client, core, lab):
    pods = [running_pod(f"w{i}", labels={"app": "web"}) for i in range(3)]
    pods[2]["status"]["conditions"][0]["status"] = "False"
    lab.seed([node("n1"), *pods, pdb("web", minAvailable=2)])
    assert read_pdb(api_client).status.disruptions_allowed == 0
    assert evict(core, "w2") is not None  # not Ready, currentHealthy(2) >= desiredHealthy(2) > 0


def test_replicaset_recreates_avoiding_cordoned_nodes(core, lab):
    lab.seed(
        [
            node("n1"),
            node("n2", unschedulable=True),
            node("n3", ready=False),
            node("n4", labels={"pool": "b"}),
            replicaset(replicas=2),
        ]
        + [running_pod(f"web-{i}", labels={"app": "web"}, owner=owner(), grace=1) for i in range(2)]
    )
    core.delete_namespaced_pod("web-0", "default")

    def replacement():
        pods = [
            p
            for p in core.list_namespaced_pod("default", label_selector="app=web").items
            if p.metadata.name not in ("web-0", "web-1")
        ]
        return pods[0] if pods and pods[0].status.phase == "Running" else None

    p = wait_for(replacement, what="replacement pod Running")
    assert p.metadata.name.startswith("web-") and len(p.metadata.name) == len("web-") + 5
    assert p.spec.node_name in ("n1", "n4")
    assert p.metadata.owner_references[0].uid == RS_UID and p.metadata.owner_references[0].controller
    wait_for(lambda: len(core.list_namespaced_pod("default").items) == 2, what="old pod gone")
    ua = {e["userAgent"] for e in lab.audit(writes=True)}
    assert {"lab-controller/replicaset-controller", "lab-controller/scheduler", "lab-controller/kubelet"} <= ua


def test_unschedulable_replacement_stays_pending_until_node_frees(core, lab):
    lab.seed([node("n1", unschedulable=True), replicaset(replicas=1)])
    p = wait_for(lambda: core.list_namespaced_pod("default").items, what="pod created")[0]
    assert p.spec.node_name is None and p.status.phase == "Pending"
    core.patch_node("n1", {"spec": {"unschedulable": None}})
    wait_for(
        lambda: core.read_namespaced_pod(p.metadata.name, "default").status.phase == "Running",
        what="scheduled after uncordon",
    )


PDB_CONFLICT = (
    'Operation cannot be fulfilled on poddisruptionbudgets.policy "web": the object has been modified; '
    "please apply your changes to the latest version and try again"
)
BUDGET_WRITE = {"verb": "update", "group": "policy", "resource": "poddisruptionbudgets", "subresource": "status"}


def test_budget_write_conflicts_are_retried_then_answered_as_the_real_server(api_client, core, lab):
    lab.seed(
        [
            node("n1"),
            *[running_pod(f"w{i}", labels={"app": "web"}, grace=1) for i in range(3)],
            pdb("web", minAvailable=1),
        ]
    )
    # 19 conflicting writes of the budget: the 20th try of the eviction's own write succeeds.
    lab.fault(BUDGET_WRITE, {"status": 409}, count=19)
    assert evict(core, "w0") is not None
    assert core.read_namespaced_pod("w0", "default").metadata.deletion_timestamp is not None
    ev = [e for e in lab.audit() if e.get("subresource") == "eviction"][-1]
    assert ev["code"] == 201 and ev["eviction"]["budgetWriteFaults"] == 19
    allowed = read_pdb(api_client).status.disruptions_allowed
    # 20 conflicts: the eviction fails with that Conflict; nothing is written, the pod runs on.
    lab.fault(BUDGET_WRITE, {"status": 409}, count=20)
    with pytest.raises(ApiException) as ei:
        evict(core, "w1")
    body = json.loads(ei.value.body)
    assert ei.value.status == 409 and body["reason"] == "Conflict" and body["message"] == PDB_CONFLICT
    assert body["details"] == {"name": "web", "group": "policy", "kind": "poddisruptionbudgets"}
    w1 = core.read_namespaced_pod("w1", "default")
    assert w1.metadata.deletion_timestamp is None and w1.status.phase == "Running"
    assert read_pdb(api_client).status.disruptions_allowed == allowed
    # Any other error of that write is the eviction's answer as it is.
    lab.fault(BUDGET_WRITE, {"status": 500, "message": "etcdserver: request timed out"})
    with pytest.raises(ApiException) as ei:
        evict(core, "w1")
    assert ei.value.status == 500 and json.loads(ei.value.body)["message"] == "etcdserver: request timed out"
    assert core.read_namespaced_pod("w1", "default").metadata.deletion_timestamp is None


def test_uid_precondition_fails_at_the_delete_after_the_budget_is_taken(api_client, core, lab):
    lab.seed([node("n1"), *[running_pod(f"w{i}", labels={"app": "web"}) for i in range(3)], pdb("web", minAvailable=1)])
    lab.configure(disruptionControllerFrozen=True)  # keep the budget as the eviction left it
    with pytest.raises(ApiException) as ei:
        evict(core, "w0", preconditions=client.V1Preconditions(uid="not-this-pod"))
    body = json.loads(ei.value.body)
    assert ei.value.status == 409 and body["reason"] == "Conflict"
    assert body["message"].startswith(
        'Operation cannot be fulfilled on pods "w0": Precondition failed: UID in precondition: not-this-pod'
    )
    assert core.read_namespaced_pod("w0", "default").metadata.deletion_timestamp is None
    status = read_pdb(api_client).status
    assert status.disruptions_allowed == 1 and "w0" in status.disrupted_pods  # as the real registry leaves it


def test_a_success_fault_is_served_then_answered_with_its_code(core, lab):
    lab.seed([node("n1"), running_pod("w0", labels={"app": "web"}, grace=1)])
    lab.fault({"verb": "create", "resource": "pods", "subresource": "eviction", "name": "w0"}, {"status": 200})
    assert evict(core, "w0") is not None
    assert core.read_namespaced_pod("w0", "default").metadata.deletion_timestamp is not None
    ev = [e for e in lab.audit() if e.get("subresource") == "eviction"][-1]
    assert ev["code"] == 200 and ev["eviction"]["outcome"] == "evicted-no-pdb"


def test_skip_lets_the_first_matching_requests_through(core, lab):
    lab.seed([node("n1"), running_pod("w0")])
    lab.fault({"verb": "get", "resource": "pods", "name": "w0"}, {"status": 503}, skip=1)
    core.read_namespaced_pod("w0", "default")
    with pytest.raises(ApiException) as ei:
        core.read_namespaced_pod("w0", "default")
    assert ei.value.status == 503
    core.read_namespaced_pod("w0", "default")


def test_the_audit_log_says_which_pods_ran_on_a_node_when_it_changed(api_client, core, lab):
    lab.seed(
        [
            node("n1"),
            replicaset(replicas=1),
            running_pod("web-a", labels={"app": "web"}, owner=owner()),
            running_pod("bare"),
        ]
    )
    core.patch_node("n1", {"spec": {"unschedulable": True}})
    entry = [e for e in lab.audit(writes=True) if e["resource"] == "nodes"][-1]
    assert entry["nodeAfter"]["unschedulable"] and entry["nodeAfter"]["ready"]
    assert [(p["pod"], p["controller"], p["deleting"]) for p in entry["nodeAfter"]["pods"]] == [
        ("default/bare", None, False),
        ("default/web-a", "ReplicaSet", False),
    ]
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "stage", "labels": {"stage": "x"}},
        "spec": {
            "template": {
                "spec": {"nodeName": "n1", "restartPolicy": "Never", "containers": [{"name": "c", "image": "x"}]}
            }
        },
    }
    client.BatchV1Api(api_client).create_namespaced_job("default", job)
    entry = [e for e in lab.audit(writes=True) if e["resource"] == "jobs" and e["verb"] == "create"][-1]
    assert entry["jobAfter"]["node"] == "n1" and entry["jobAfter"]["labels"] == {"stage": "x"}
    assert [p["pod"] for p in entry["jobAfter"]["podsOnNode"]] == ["default/bare", "default/web-a"]
