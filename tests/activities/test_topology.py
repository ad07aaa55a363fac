"""Where a node sits and which gang a pod belongs to (activities/kube/topology.py, activities/kube/gang_reads.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from activities.kube.gang_reads import gangs_of_pods
from activities.kube.topology import (
    Gang,
    TopologyLabels,
    gang_of,
    gpu_hours_at_risk,
    place_of,
    unit_of,
)

UUID = "7b968a6d-c8aa-45e1-9e07-e1e51be99c31"


def test_the_domain_is_the_clique_labels_cluster_uuid() -> None:
    place = place_of("s2grxs64", {"nvidia.com/gpu.clique": f"{UUID}.1", "accelerator.topograph.run/domain": "r7"})
    assert (place.domain, place.clique, place.rack, place.block) == (UUID, f"{UUID}.1", "r7", None)
    assert unit_of(place, "nvlinkDomain") == UUID and unit_of(place, "rack") == "r7"
    assert unit_of(place, "none") == "s2grxs64"


def test_a_node_without_a_clique_label_is_its_own_domain_and_says_so() -> None:
    place = place_of("cpu-1", {})
    assert place.own_domain and place.domain == "node:cpu-1"
    assert "no nvidia.com/gpu.clique label: its own NVLink domain" in place.describe()
    assert unit_of(place, "rack") == "node:cpu-1"


def test_label_keys_are_configurable() -> None:
    keys = TopologyLabels(rack="oci.oraclecloud.com/host.rack_id", block="cloud.google.com/gce-topology-block")
    place = place_of("n", {"oci.oraclecloud.com/host.rack_id": "rk", "cloud.google.com/gce-topology-block": "b"}, keys)
    assert (place.rack, place.block) == ("rk", "b")


def test_how_each_scheduler_links_a_pod_to_its_gang() -> None:
    assert gang_of("ml", "p", {}, {"pod-group-name": "pg-train"}).id == "kai:ml/pg-train"
    assert gang_of("ml", "p", {}, {"kueue.x-k8s.io/workload": "wl"}).id == "kueue:ml/wl"
    assert gang_of("ml", "p", {}, {"scheduling.k8s.io/group-name": "vg"}).id == "volcano:ml/vg"
    assert gang_of("ml", "p", {}, {"scheduling.volcano.sh/group-name": "vg"}).id == "volcano:ml/vg"
    assert gang_of("ml", "p", {"jobset.sigs.k8s.io/jobset-name": "js"}, {}).id == "jobset:ml/js"
    lws = {"leaderworkerset.sigs.k8s.io/name": "serve", "leaderworkerset.sigs.k8s.io/group-index": "2"}
    assert gang_of("ml", "p", lws, {}).id == "lws:ml/serve-group-2"
    assert gang_of("ml", "p", {}, {}).id == "pod:ml/p"


def _pod(
    name: str,
    node: str | None,
    *,
    gpus: int = 4,
    group: str | None = "pg",
    phase: str = "Running",
    started: str = "2026-12-05T10:00:00Z",
    owner: str | None = None,
) -> dict:
    md: dict = {"namespace": "ml", "name": name, "annotations": {"pod-group-name": group} if group else {}}
    if owner:
        md["ownerReferences"] = [{"kind": owner, "name": "x", "controller": True}]
    limits = {"nvidia.com/gpu": str(gpus)} if gpus else {}
    return {
        "metadata": md,
        "spec": {"nodeName": node, "containers": [{"resources": {"limits": limits}}]},
        "status": {"phase": phase, "startTime": started},
    }


def test_gangs_count_gpu_pods_their_nodes_and_minimum() -> None:
    pods = [
        _pod("a", "n1"),
        _pod("b", "n2", started="2026-12-05T10:05:00Z"),
        _pod("c", None, phase="Pending"),
        _pod("cpu", "n1", gpus=0, group=None),
        _pod("dcgm", "n1", group=None, owner="DaemonSet"),
        _pod("done", "n3", group=None, phase="Succeeded"),
        _pod("solo", "n3", group=None),
    ]
    gangs = {g.id: g for g in gangs_of_pods(pods, {"kai:ml/pg": 3})}
    assert set(gangs) == {"kai:ml/pg", "pod:ml/solo"}
    pg = gangs["kai:ml/pg"]
    assert (pg.nodes, pg.pods, pg.running, pg.min_member, pg.gpus) == (["n1", "n2"], 3, 2, 3, 12)
    assert pg.disrupted and pg.started == datetime(2026, 12, 5, 10, 5, tzinfo=UTC)
    assert gangs["pod:ml/solo"].min_member == 1 and not gangs["pod:ml/solo"].disrupted


def test_gpu_hours_at_risk_are_capped_by_the_checkpoint_interval() -> None:
    at = datetime(2026, 12, 5, 12, tzinfo=UTC)
    young = Gang(id="a", gpus=8, started=at - timedelta(minutes=30))
    old = Gang(id="b", gpus=4, started=at - timedelta(hours=5))
    assert gpu_hours_at_risk([young, old], at) == 8 * 0.5 + 4 * 1.0
    assert gpu_hours_at_risk([old], at, timedelta(hours=2)) == 8.0
