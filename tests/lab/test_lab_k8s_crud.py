"""CRUD, errors, resourceVersion, patches, selectors, pagination, status, finalizers, CRDs, discovery."""

from __future__ import annotations

import json

import httpx
import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from tests.lab.labtest_helpers import node, running_pod, wait_for


def status_of(e: ApiException) -> dict:
    assert e.body is not None, f"the {e.status} answer has no body"
    body = json.loads(e.body)
    assert body["kind"] == "Status" and body["apiVersion"] == "v1" and body["status"] == "Failure"
    assert body["code"] == e.status
    return body


def cm(name: str, **data) -> dict:
    return {"metadata": {"name": name, "labels": {"app": "x"}}, "data": data}


def test_create_get_conflict_notfound(core):
    created = core.create_namespaced_config_map("default", cm("a", k="v"))
    md = created.metadata
    assert md.uid and md.resource_version and md.creation_timestamp
    assert created.kind == "ConfigMap" and created.api_version == "v1"
    got = core.read_namespaced_config_map("a", "default")
    assert got.data == {"k": "v"} and got.metadata.uid == md.uid

    with pytest.raises(ApiException) as ei:
        core.create_namespaced_config_map("default", cm("a"))
    body = status_of(ei.value)
    assert ei.value.status == 409 and body["reason"] == "AlreadyExists"
    assert body["message"] == 'configmaps "a" already exists'
    assert body["details"] == {"name": "a", "kind": "configmaps"}

    with pytest.raises(ApiException) as ei:
        core.read_namespaced_config_map("nope", "default")
    body = status_of(ei.value)
    assert body["reason"] == "NotFound" and body["message"] == 'configmaps "nope" not found'

    with pytest.raises(ApiException) as ei:
        core.create_namespaced_config_map("missing-ns", cm("a"))
    body = status_of(ei.value)
    assert ei.value.status == 404 and body["message"] == 'namespaces "missing-ns" not found'


def test_create_201_namespace_mismatch_generate_name_dry_run(emulator, lab):
    http = httpx.Client(base_url=emulator.url)
    r = http.post("/api/v1/namespaces/default/configmaps", json={"metadata": {"generateName": "gen-"}})
    assert r.status_code == 201
    name = r.json()["metadata"]["name"]
    assert name.startswith("gen-") and len(name) == len("gen-") + 5
    r = http.post("/api/v1/namespaces/default/configmaps", json={"metadata": {"name": "x", "namespace": "other"}})
    assert r.status_code == 400 and r.json()["reason"] == "BadRequest"
    r = http.post("/api/v1/namespaces/default/configmaps?dryRun=All", json={"metadata": {"name": "dry"}})
    assert r.status_code == 201
    assert http.get("/api/v1/namespaces/default/configmaps/dry").status_code == 404
    r = http.post("/api/v1/namespaces/default/configmaps", json={"metadata": {"name": "Bad_Name"}})
    assert r.status_code == 422 and r.json()["reason"] == "Invalid"
    # global, monotonically increasing resourceVersion
    a = http.post("/api/v1/namespaces/default/configmaps", json={"metadata": {"name": "r1"}}).json()
    b = http.post("/api/v1/namespaces/default/configmaps", json={"metadata": {"name": "r2"}}).json()
    assert int(b["metadata"]["resourceVersion"]) > int(a["metadata"]["resourceVersion"])
    lst = http.get("/api/v1/configmaps").json()
    assert lst["kind"] == "ConfigMapList" and lst["apiVersion"] == "v1"
    assert all(i["kind"] == "ConfigMap" and i["apiVersion"] == "v1" for i in lst["items"])
    assert int(lst["metadata"]["resourceVersion"]) >= int(b["metadata"]["resourceVersion"])
    http.close()


def test_replace_resource_version_conflict(core):
    obj = core.create_namespaced_config_map("default", cm("a", k="1"))
    obj.data = {"k": "2"}
    updated = core.replace_namespaced_config_map("a", "default", obj)
    assert int(updated.metadata.resource_version) > int(obj.metadata.resource_version)
    obj.data = {"k": "3"}  # stale resourceVersion
    with pytest.raises(ApiException) as ei:
        core.replace_namespaced_config_map("a", "default", obj)
    body = status_of(ei.value)
    assert ei.value.status == 409 and body["reason"] == "Conflict"
    assert body["message"] == (
        'Operation cannot be fulfilled on configmaps "a": the object has been modified; '
        "please apply your changes to the latest version and try again"
    )
    # patch with a resourceVersion precondition
    with pytest.raises(ApiException) as ei:
        core.patch_namespaced_config_map("a", "default", {"metadata": {"resourceVersion": "1"}, "data": {"k": "4"}})
    assert ei.value.status == 409
    # no-op update keeps resourceVersion
    same = core.patch_namespaced_config_map("a", "default", {"data": {"k": "2"}})
    assert same.metadata.resource_version == updated.metadata.resource_version


def test_generation_and_status_subresource(api_client, core, lab):
    apps = client.AppsV1Api(api_client)
    rs = apps.create_namespaced_replica_set(
        "default",
        {
            "metadata": {"name": "rs"},
            "spec": {
                "replicas": 0,
                "selector": {"matchLabels": {"app": "rs"}},
                "template": {
                    "metadata": {"labels": {"app": "rs"}},
                    "spec": {"containers": [{"name": "c", "image": "x"}]},
                },
            },
        },
    )
    assert rs.metadata.generation == 1
    rs2 = apps.patch_namespaced_replica_set("rs", "default", {"metadata": {"labels": {"x": "y"}}})
    assert rs2.metadata.generation == 1
    rs3 = apps.patch_namespaced_replica_set(
        "rs", "default", {"spec": {"minReadySeconds": 3}, "status": {"replicas": 99}}
    )
    assert rs3.metadata.generation == 2
    assert (rs3.status.replicas or 0) != 99  # main resource ignores .status
    st = apps.patch_namespaced_replica_set_status("rs", "default", {"status": {"replicas": 7}, "spec": {"replicas": 5}})
    assert st.status.replicas == 7 and st.spec.replicas == 0 and st.metadata.generation == 2


def test_three_patch_types_and_smp_merge_keys(core, lab):
    lab.seed([node("n1")])
    pod = running_pod("p", node_name="n1")
    pod["spec"]["containers"] = [
        {"name": "a", "image": "a:1", "env": [{"name": "X", "value": "1"}]},
        {"name": "b", "image": "b:1"},
    ]
    lab.seed([pod])
    # strategic merge patch (dict body on a built-in): merge containers by name, env by name
    p = core.patch_namespaced_pod(
        "p", "default", {"spec": {"containers": [{"name": "a", "image": "a:2", "env": [{"name": "Y", "value": "2"}]}]}}
    )
    cs = {c.name: c for c in p.spec.containers}
    assert cs["a"].image == "a:2" and cs["b"].image == "b:1"
    assert sorted(e.name for e in cs["a"].env) == ["X", "Y"]
    # $patch: delete
    p = core.patch_namespaced_pod("p", "default", {"spec": {"containers": [{"name": "b", "$patch": "delete"}]}})
    assert [c.name for c in p.spec.containers] == ["a"]
    # conditions merge by type through /status
    p = core.patch_namespaced_pod_status(
        "p", "default", {"status": {"conditions": [{"type": "Custom", "status": "True"}]}}
    )
    assert {c.type for c in p.status.conditions} == {"Ready", "Custom"}
    # json patch, test failure -> 422
    p = core.patch_namespaced_pod("p", "default", [{"op": "add", "path": "/metadata/labels/j", "value": "1"}])
    assert p.metadata.labels["j"] == "1"
    with pytest.raises(ApiException) as ei:
        core.patch_namespaced_pod(
            "p",
            "default",
            [
                {"op": "test", "path": "/metadata/labels/j", "value": "2"},
                {"op": "remove", "path": "/metadata/labels/j"},
            ],
        )
    assert ei.value.status == 422 and status_of(ei.value)["reason"] == "Invalid"
    # merge patch: lists replace, null deletes
    p = core.patch_namespaced_pod(
        "p", "default", {"metadata": {"labels": {"j": None, "k": "v"}}}, _content_type="application/merge-patch+json"
    )
    assert "j" not in p.metadata.labels and p.metadata.labels["k"] == "v"
    # node taints are an atomic list (+listType=atomic): a strategic merge patch replaces it whole, as kubectl
    # taint relies on (it sends the full new list); kubectl cordon uses SMP on spec.unschedulable
    core.patch_node("n1", {"spec": {"taints": [{"key": "a", "effect": "NoSchedule"}]}})
    n = core.patch_node("n1", {"spec": {"taints": [{"key": "b", "effect": "NoSchedule"}], "unschedulable": True}})
    assert [t.key for t in n.spec.taints] == ["b"] and n.spec.unschedulable
    n = core.patch_node("n1", {"spec": {"unschedulable": None}})
    assert not n.spec.unschedulable


def test_server_side_apply_needs_a_field_manager(emulator, lab):
    http = httpx.Client(base_url=emulator.url)
    http.post("/api/v1/namespaces/default/configmaps", json={"metadata": {"name": "a"}})
    r = http.patch(
        "/api/v1/namespaces/default/configmaps/a",
        content=b"{}",
        headers={"Content-Type": "application/apply-patch+yaml"},
    )
    assert r.status_code == 422 and r.json()["reason"] == "Invalid"
    assert "fieldManager: Required value" in r.json()["message"]
    http.close()


def test_label_field_selectors_and_pagination(core, lab):
    for i in range(7):
        core.create_namespaced_config_map(
            "default",
            {
                "metadata": {
                    "name": f"c{i}",
                    "labels": {"tier": "a" if i < 3 else "b", **({"canary": "1"} if i % 2 else {})},
                }
            },
        )
    names = lambda r: [i.metadata.name for i in r.items]
    assert names(core.list_namespaced_config_map("default", label_selector="tier=a")) == ["c0", "c1", "c2"]
    assert names(core.list_namespaced_config_map("default", label_selector="tier!=a,canary")) == ["c3", "c5"]
    assert names(core.list_namespaced_config_map("default", label_selector="tier in (b),!canary")) == ["c4", "c6"]
    assert names(core.list_namespaced_config_map("default", label_selector="tier notin (b)")) == ["c0", "c1", "c2"]
    assert names(core.list_namespaced_config_map("default", field_selector="metadata.name=c5")) == ["c5"]
    with pytest.raises(ApiException) as ei:
        core.list_namespaced_config_map("default", field_selector="spec.nodeName=x")
    assert ei.value.status == 400 and status_of(ei.value)["reason"] == "BadRequest"
    # pagination
    seen, cont = [], None
    while True:
        page = core.list_namespaced_config_map("default", limit=3, _continue=cont)
        seen += names(page)
        cont = page.metadata._continue
        if not cont:
            break
        assert page.metadata.remaining_item_count > 0
    assert seen == [f"c{i}" for i in range(7)]


def test_pod_field_selectors_cross_namespace(core, lab):
    lab.seed(
        [
            node("n1"),
            node("n2"),
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "other"}},
            running_pod("a", node_name="n1"),
            running_pod("b", "other", node_name="n1"),
            running_pod("c", node_name="n2"),
        ]
    )
    r = core.list_pod_for_all_namespaces(field_selector="spec.nodeName=n1")
    assert sorted((p.metadata.namespace, p.metadata.name) for p in r.items) == [("default", "a"), ("other", "b")]
    r = core.list_pod_for_all_namespaces(field_selector="status.phase=Running,metadata.namespace=default")
    assert sorted(p.metadata.name for p in r.items) == ["a", "c"]


def test_finalizers_and_delete_preconditions(core, lab):
    core.create_namespaced_config_map("default", {"metadata": {"name": "f", "finalizers": ["lab/x"]}})
    deleted = core.delete_namespaced_config_map("f", "default")
    got = core.read_namespaced_config_map("f", "default")
    assert got.metadata.deletion_timestamp is not None
    core.patch_namespaced_config_map(
        "f", "default", {"metadata": {"finalizers": None}}, _content_type="application/merge-patch+json"
    )
    with pytest.raises(ApiException) as ei:
        core.read_namespaced_config_map("f", "default")
    assert ei.value.status == 404
    obj = core.create_namespaced_config_map("default", {"metadata": {"name": "g"}})
    with pytest.raises(ApiException) as ei:
        core.delete_namespaced_config_map(
            "g", "default", body=client.V1DeleteOptions(preconditions=client.V1Preconditions(uid="not-the-uid"))
        )
    assert ei.value.status == 409 and "Precondition failed: UID in precondition" in status_of(ei.value)["message"]
    core.delete_namespaced_config_map(
        "g", "default", body=client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=obj.metadata.uid))
    )
    assert deleted is not None


def test_graceful_pod_deletion(core, lab):
    lab.configure(graceScale=0.05)
    lab.seed([node("n1"), running_pod("p", grace=10), running_pod("q")])
    p = core.delete_namespaced_pod("p", "default")
    assert p.metadata.deletion_timestamp is not None and p.metadata.deletion_grace_period_seconds == 10
    assert core.read_namespaced_pod("p", "default").metadata.deletion_timestamp is not None
    wait_for(
        lambda: "p" not in [x.metadata.name for x in core.list_namespaced_pod("default").items],
        timeout=5,
        what="graceful deletion",
    )
    core.delete_namespaced_pod("q", "default", grace_period_seconds=0)
    with pytest.raises(ApiException):
        core.read_namespaced_pod("q", "default")


def test_kubelet_starts_and_finishes_pods(core, lab):
    lab.seed([node("n1")])
    core.create_namespaced_pod(
        "default",
        {
            "metadata": {"name": "job", "annotations": {"lab.millwright.dev/finish-after-seconds": "0.3"}},
            "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "x"}]},
        },
    )
    assert core.read_namespaced_pod("job", "default").status.phase == "Pending"
    wait_for(lambda: core.read_namespaced_pod("job", "default").status.phase == "Running", what="Running")
    p = wait_for(
        lambda: (lambda p: p if p.status.phase == "Succeeded" else None)(core.read_namespaced_pod("job", "default")),
        what="Succeeded",
    )
    ready = next(c for c in p.status.conditions if c.type == "Ready")
    assert ready.status == "False"


def test_crd_registration_discovery_and_cluster_scoped_cr(api_client, emulator, lab):
    ext = client.ApiextensionsV1Api(api_client)
    ext.create_custom_resource_definition(
        {
            "metadata": {"name": "queues.scheduling.run.ai"},
            "spec": {
                "group": "scheduling.run.ai",
                "scope": "Cluster",
                "names": {"plural": "queues", "singular": "queue", "kind": "Queue", "listKind": "QueueList"},
                "versions": [
                    {
                        "name": "v2",
                        "served": True,
                        "storage": True,
                        "subresources": {"status": {}},
                        "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
                    }
                ],
            },
        }
    )
    http = httpx.Client(base_url=emulator.url)
    groups = http.get("/apis").json()
    assert any(g["name"] == "scheduling.run.ai" for g in groups["groups"])
    rl = http.get("/apis/scheduling.run.ai/v2").json()
    q = next(r for r in rl["resources"] if r["name"] == "queues")
    assert q["namespaced"] is False and q["kind"] == "Queue" and q["singularName"] == "queue"
    assert any(r["name"] == "queues/status" for r in rl["resources"])
    http.close()

    co = client.CustomObjectsApi(api_client)
    body = {
        "apiVersion": "scheduling.run.ai/v2",
        "kind": "Queue",
        "metadata": {"name": "team-a"},
        "spec": {"parentQueue": "root", "resources": {"gpu": {"quota": 8, "limit": -1, "overQuotaWeight": 1}}},
        "status": {"ignored": True},
    }
    created = co.create_cluster_custom_object("scheduling.run.ai", "v2", "queues", body)
    assert created is not None and created["metadata"]["uid"] and "status" not in created  # 201 declared
    with pytest.raises(ApiException) as ei:
        co.create_cluster_custom_object("scheduling.run.ai", "v2", "queues", body)
    assert ei.value.status == 409
    got = co.get_cluster_custom_object("scheduling.run.ai", "v2", "queues", "team-a")
    assert got["spec"]["resources"]["gpu"]["quota"] == 8
    patched = co.patch_cluster_custom_object("scheduling.run.ai", "v2", "queues", "team-a", {"spec": {"priority": 120}})
    assert patched["spec"]["priority"] == 120 and patched["metadata"]["generation"] == 2
    st = co.patch_cluster_custom_object_status(
        "scheduling.run.ai", "v2", "queues", "team-a", {"status": {"childQueues": ["x"]}}
    )
    assert st["status"]["childQueues"] == ["x"] and st["metadata"]["generation"] == 2
    # SMP on a custom resource -> 415
    with pytest.raises(ApiException) as ei:
        co.patch_cluster_custom_object(
            "scheduling.run.ai",
            "v2",
            "queues",
            "team-a",
            {"spec": {}},
            _content_type="application/strategic-merge-patch+json",
        )
    assert ei.value.status == 415 and status_of(ei.value)["reason"] == "UnsupportedMediaType"
    lst = co.list_cluster_custom_object("scheduling.run.ai", "v2", "queues")
    assert lst["kind"] == "QueueList" and lst["items"][0]["kind"] == "Queue"
    co.delete_cluster_custom_object("scheduling.run.ai", "v2", "queues", "team-a")
    with pytest.raises(ApiException) as ei:
        co.get_cluster_custom_object("scheduling.run.ai", "v2", "queues", "team-a")
    assert ei.value.status == 404


def test_core_discovery(emulator, lab):
    http = httpx.Client(base_url=emulator.url)
    assert http.get("/api").json()["versions"] == ["v1"]
    v1 = http.get("/api/v1").json()
    assert v1["groupVersion"] == "v1"
    ev = next(r for r in v1["resources"] if r["name"] == "pods/eviction")
    assert ev == {
        "name": "pods/eviction",
        "singularName": "",
        "namespaced": True,
        "group": "policy",
        "version": "v1",
        "kind": "Eviction",
        "verbs": ["create"],
    }
    for r in v1["resources"]:
        assert {"name", "singularName", "namespaced", "kind", "verbs"} <= set(r)
    assert http.get("/version").json()["major"] == "1"
    assert http.get("/apis/policy/v1").json()["groupVersion"] == "policy/v1"
    http.close()


async def test_asyncio_client(emulator, lab):
    from kubernetes.aio import client as aclient
    from kubernetes.aio import config as aconfig

    from lab.k8s.admin import kubeconfig

    api = await aconfig.new_client_from_config_dict(kubeconfig(emulator.url, "lab"))
    try:
        core = aclient.CoreV1Api(api)
        await core.create_node({"metadata": {"name": "aio-node"}})
        n = await core.patch_node("aio-node", {"spec": {"unschedulable": True}})
        assert n.spec.unschedulable is True
        nodes = await core.list_node()
        assert [x.metadata.name for x in nodes.items] == ["aio-node"]
    finally:
        await api.close()
