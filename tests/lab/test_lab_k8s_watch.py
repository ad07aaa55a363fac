"""Watch: initial ADDED, live events, replay from resourceVersion, 410 Expired, selectors, bookmarks."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest
from kubernetes import watch
from kubernetes.client.rest import ApiException

from lab.k8s.store import NODES, UNCHANGED_CHECK_ENV, Store


def test_watch_initial_and_live_events(core, lab):
    core.create_namespaced_config_map("default", {"metadata": {"name": "pre", "labels": {"w": "1"}}})

    def writer():
        time.sleep(0.3)
        core.create_namespaced_config_map("default", {"metadata": {"name": "live", "labels": {"w": "1"}}})
        core.create_namespaced_config_map("default", {"metadata": {"name": "other"}})
        core.patch_namespaced_config_map("live", "default", {"data": {"a": "b"}})
        core.delete_namespaced_config_map("live", "default")

    t = threading.Thread(target=writer)
    t.start()
    events = []
    w = watch.Watch()
    for ev in w.stream(core.list_namespaced_config_map, "default", label_selector="w=1", timeout_seconds=3):
        events.append((ev["type"], ev["object"].metadata.name))
        if len(events) == 4:
            w.stop()
    t.join()
    assert events == [("ADDED", "pre"), ("ADDED", "live"), ("MODIFIED", "live"), ("DELETED", "live")]


def test_watch_replay_from_resource_version_and_timeout(emulator, core, lab):
    a = core.create_namespaced_config_map("default", {"metadata": {"name": "a"}})
    core.create_namespaced_config_map("default", {"metadata": {"name": "b"}})
    core.patch_namespaced_config_map("a", "default", {"data": {"x": "1"}})
    t0 = time.monotonic()
    with httpx.Client(base_url=emulator.url, timeout=10) as http:
        r = http.get(
            "/api/v1/namespaces/default/configmaps",
            params={"watch": "1", "resourceVersion": a.metadata.resource_version, "timeoutSeconds": "1"},
        )
    lines = [json.loads(x) for x in r.text.splitlines() if x]
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in lines] == [("ADDED", "b"), ("MODIFIED", "a")]
    assert all(e["object"]["kind"] == "ConfigMap" for e in lines)
    assert 0.9 < time.monotonic() - t0 < 5


def test_watch_too_old_resource_version_gives_410(emulator, core, lab):
    first = core.create_namespaced_config_map("default", {"metadata": {"name": "old"}})
    lab.configure(watchHistorySize=3)
    for i in range(6):
        core.create_namespaced_config_map("default", {"metadata": {"name": f"n{i}"}})
    with httpx.Client(base_url=emulator.url, timeout=10) as http:
        r = http.get(
            "/api/v1/namespaces/default/configmaps",
            params={"watch": "true", "resourceVersion": first.metadata.resource_version, "timeoutSeconds": "1"},
        )
    ev = json.loads(r.text.splitlines()[0])
    assert ev["type"] == "ERROR" and ev["object"]["code"] == 410 and ev["object"]["reason"] == "Expired"
    with pytest.raises(ApiException) as ei:
        for _ in watch.Watch().stream(
            core.list_namespaced_config_map,
            "default",
            resource_version=first.metadata.resource_version,
            timeout_seconds=1,
        ):
            pass
    assert ei.value.status == 410


def test_watch_bookmarks_and_field_selector(emulator, lab):
    lab.configure(bookmarkSeconds=0.2)
    with httpx.Client(base_url=emulator.url, timeout=10) as http:
        http.post("/api/v1/namespaces/default/configmaps", json={"metadata": {"name": "a"}})
        http.post("/api/v1/namespaces/default/configmaps", json={"metadata": {"name": "b"}})
        r = http.get(
            "/api/v1/configmaps",
            params={
                "watch": "1",
                "allowWatchBookmarks": "true",
                "fieldSelector": "metadata.name=b",
                "timeoutSeconds": "1",
            },
        )
    evs = [json.loads(x) for x in r.text.splitlines() if x]
    assert evs[0]["type"] == "ADDED" and evs[0]["object"]["metadata"]["name"] == "b"
    assert all(e["object"]["metadata"].get("name") in (None, "b") for e in evs)
    assert any(e["type"] == "BOOKMARK" and e["object"]["metadata"]["resourceVersion"] for e in evs)


def test_the_stored_object_check_reports_a_change_in_place(tmp_path, monkeypatch):
    """The watch history holds the stored versions themselves, so the tests' emulators check none is changed in
    place (tests/kube_helpers.py `checked_emulator`); the check must see both ways of doing it."""
    log = tmp_path / "changed.log"
    monkeypatch.setenv(UNCHANGED_CHECK_ENV, str(log))
    store = Store()
    rt = store.registry.types[NODES]
    node = store.put(rt, store.new_meta(rt, {"metadata": {"name": "gpu-01"}}))
    store.put(rt, {**node, "metadata": dict(node["metadata"])})  # a copy first: as every writer does
    assert not log.exists()
    stored = store.get(rt, None, "gpu-01")
    stored["metadata"]["labels"] = {"pool": "a"}
    store.put(rt, {**stored, "metadata": dict(stored["metadata"])})
    stored = store.get(rt, None, "gpu-01")
    stored["spec"] = {"unschedulable": True}
    store.put(rt, stored)
    report = log.read_text()
    assert "nodes gpu-01 changed in place after it was stored: [{'path': '.metadata.labels'" in report
    assert "nodes gpu-01 written again after being changed in place" in report
