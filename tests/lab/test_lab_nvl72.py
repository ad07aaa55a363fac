"""The lab's GB200 NVL72 fleet (lab/nvl72.py) and KAI's gangs in the emulator (lab/k8s/controllers/kai.py): the
fleet's labels and names, all-or-none binding, StaleGangEviction after a drain's eviction, the interruption count,
the restart once the nodes are back, and PodGroups read across namespaces by kubectl and by `read_gangs`."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from activities.kube.connector import ClusterConnector
from activities.kube.gang_reads import GangActivities
from activities.kube.topology import (
    CLIQUE_LABEL,
    TOPOGRAPH_ACCELERATOR_LABEL,
    TOPOGRAPH_BLOCK_LABEL,
    GangRequest,
    place_of,
)
from lab.k8s.admin import kubeconfig
from lab.k8s.controllers.kai import SCHEDULE_PERIOD_SECONDS
from lab.nvl72 import (
    GPU_PRODUCT,
    TRAINING_NAMESPACE,
    Nvl72Fleet,
    nvl72_objects,
    running_pods,
    training_job,
)
from tests.lab.labtest_helpers import wait_for

PG = ("scheduling.run.ai", "v2alpha2", "podgroups")
UUID_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}\.[12]$")


def job_pods(core: client.CoreV1Api, job: str) -> list:
    return core.list_namespaced_pod(TRAINING_NAMESPACE, label_selector=f"batch.kubernetes.io/job-name={job}").items


def running_on(core: client.CoreV1Api, job: str) -> dict[int, str]:
    """completion index -> node, of the job's pods running and not being deleted."""
    return {int(p.metadata.annotations["batch.kubernetes.io/job-completion-index"]): p.spec.node_name
            for p in job_pods(core, job)
            if p.status.phase == "Running" and not p.metadata.deletion_timestamp}  # fmt: skip


def evict(core: client.CoreV1Api, pod: str) -> None:
    body = client.V1Eviction(metadata=client.V1ObjectMeta(name=pod, namespace=TRAINING_NAMESPACE))
    core.create_namespaced_pod_eviction(pod, TRAINING_NAMESPACE, body)


def cordon(core: client.CoreV1Api, node: str, off: bool = True) -> None:
    core.patch_node(node, {"spec": {"unschedulable": off}})


def create(api_client, objs: list[dict]) -> None:
    """Create through the API, as a user's `kubectl create` does (the Job gets the API server's defaults)."""
    dynamic = client.CustomObjectsApi(api_client)
    for o in objs:
        md = {k: v for k, v in o["metadata"].items() if k not in ("uid", "creationTimestamp", "ownerReferences")}
        group, version = o["apiVersion"].split("/")
        plural = "jobs" if o["kind"] == "Job" else PG[2]
        dynamic.create_namespaced_custom_object(group, version, TRAINING_NAMESPACE, plural, {**o, "metadata": md})


def only_pod_group(api_client) -> dict:
    found = client.CustomObjectsApi(api_client).list_namespaced_custom_object(*PG[:2], TRAINING_NAMESPACE, PG[2])
    assert isinstance(found, dict)
    return found["items"][0]


def test_the_fleet_is_racks_of_18_trays_with_clique_and_topograph_labels_and_provider_names(lab, core):
    lab.seed(Nvl72Fleet(racks=4, seed=3, split_racks=1).to_objects())
    nodes = core.list_node().items
    assert len(nodes) == 72
    racks: dict[str, list[str]] = {}
    cliques: dict[str, set[str]] = {}
    for n in nodes:
        labels = n.metadata.labels
        assert n.status.allocatable["nvidia.com/gpu"] == "4" and labels["nvidia.com/gpu.product"] == GPU_PRODUCT
        assert UUID_RE.match(labels[CLIQUE_LABEL]), labels[CLIQUE_LABEL]
        assert labels[TOPOGRAPH_BLOCK_LABEL] == "block-01"
        assert re.fullmatch(r"[a-z][a-z0-9]{7}", n.metadata.name)
        racks.setdefault(labels[TOPOGRAPH_ACCELERATOR_LABEL], []).append(n.metadata.name)
        cliques.setdefault(labels[TOPOGRAPH_ACCELERATOR_LABEL], set()).add(labels[CLIQUE_LABEL])
        assert place_of(n.metadata.name, labels).domain == labels[CLIQUE_LABEL].rsplit(".", 1)[0]
    assert sorted(len(v) for v in racks.values()) == [18] * 4
    domains = [{c.rsplit(".", 1)[0] for c in cs} for cs in cliques.values()]
    assert all(len(d) == 1 for d in domains) and len(set.union(*domains)) == 4  # one NVLink domain per rack
    assert sorted(len(cs) for cs in cliques.values()) == [1, 1, 1, 2]  # one rack split in two cliques
    rack_of = {node: rack for rack, names in racks.items() for node in names}
    in_name_order = [rack_of[n] for n in sorted(rack_of)]
    assert sum(a != b for a, b in itertools.pairwise(in_name_order)) > 20  # names do not follow racks
    again = Nvl72Fleet(racks=4, seed=3, split_racks=1).node_labels()
    assert again == {n.metadata.name: {k: n.metadata.labels[k] for k in again[n.metadata.name]} for n in nodes}


def test_seeded_gangs_fill_every_tray_in_whole_domains(lab, core):
    made = nvl72_objects(racks=16, seed=1)
    lab.seed(made.objects)
    assert sorted(n for nodes in made.jobs.values() for n in nodes) == sorted(made.racks)  # every tray, once
    for nodes in made.jobs.values():
        racks = {made.racks[n] for n in nodes}
        assert len(nodes) in (9, 18 * len(racks)) and 1 <= len(racks) <= 4
    assert any(len(nodes) == 9 for nodes in made.jobs.values())  # two jobs share a rack
    pods = core.list_namespaced_pod(TRAINING_NAMESPACE).items
    assert len(pods) == 16 * 18 and all(p.status.phase == "Running" for p in pods)


def test_a_gang_is_bound_all_or_none(lab, core, api_client):
    lab.seed(Nvl72Fleet(racks=1, seed=2).to_objects())
    nodes = sorted(n.metadata.name for n in core.list_node().items)
    cordon(core, nodes[5])
    create(api_client, training_job("whole-rack", 18))
    wait_for(lambda: len(job_pods(core, "whole-rack")) == 18, what="18 pods created")

    def unschedulable() -> bool:
        pods = job_pods(core, "whole-rack")
        return all(any(c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable"
                       for c in p.status.conditions or []) for p in pods)  # fmt: skip

    wait_for(unschedulable, what="every pod Unschedulable")
    assert all(p.spec.node_name is None for p in job_pods(core, "whole-rack"))  # not 17 of them
    assert only_pod_group(api_client)["status"]["schedulingConditions"][0]["type"] == "UnschedulableOnNodePool"
    cordon(core, nodes[5], off=False)
    placed = wait_for(lambda: (r := running_on(core, "whole-rack")) and len(r) == 18 and r, what="the gang running")
    assert sorted(placed.values()) == nodes
    assert "schedulingConditions" not in only_pod_group(api_client).get("status", {})


def test_two_half_rack_gangs_share_a_domain_and_a_third_waits(lab, core, api_client):
    lab.seed(Nvl72Fleet(racks=2, seed=4).to_objects())
    create(api_client, training_job("big", 18))
    wait_for(lambda: len(running_on(core, "big")) == 18, what="the 18-pod gang running")
    for name in ("half-a", "half-b"):
        create(api_client, training_job(name, 9))
    a = wait_for(lambda: (r := running_on(core, "half-a")) and len(r) == 9 and r, what="half-a running")
    b = wait_for(lambda: (r := running_on(core, "half-b")) and len(r) == 9 and r, what="half-b running")
    racks = {n.metadata.name: n.metadata.labels[TOPOGRAPH_ACCELERATOR_LABEL] for n in core.list_node().items}
    big = {racks[n] for n in running_on(core, "big").values()}
    assert {racks[n] for n in a.values()} == {racks[n] for n in b.values()} != big  # packed into the other rack
    create(api_client, training_job("late", 1))
    wait_for(lambda: job_pods(core, "late"), what="its pod")
    with pytest.raises(AssertionError):
        wait_for(lambda: running_on(core, "late"), timeout=1.0, what="no room")


def test_a_drained_pod_takes_the_gang_down_once_and_it_comes_back_on_its_nodes(lab, core):
    job, pod_group = training_job("llm", 18)
    fleet = Nvl72Fleet(racks=1, seed=5)
    nodes = next(iter(fleet.layout().values()))
    lab.seed([*fleet.to_objects(), job, pod_group, *running_pods(job, nodes)])
    lab.configure(kaiStalenessGraceSeconds=0.3)  # shorter than KAI's scheduling cycle: both timers on one PodGroup
    group = f"{TRAINING_NAMESPACE}/{pod_group['metadata']['name']}"

    def interruptions() -> dict[str, int]:
        return lab.http.get("/_lab/gangs").json()["interruptions"]

    wait_for(lambda: interruptions() == {group: 0}, what="the seeded gang whole")
    start = len(lab.audit())

    by_index = {int(p.metadata.annotations["batch.kubernetes.io/job-completion-index"]): p.metadata.name
                for p in job_pods(core, "llm")}  # fmt: skip
    cordon(core, nodes[3])  # a drain: cordon, then evict
    evict(core, by_index[3])
    wait_for(lambda: interruptions() == {group: 1}, what="one interruption")
    evict(core, by_index[7])  # the gang is down already: no second interruption
    wait_for(lambda: not running_on(core, "llm"), timeout=15, what="StaleGangEviction of the rest")
    assert interruptions() == {group: 1}
    kai_deletes = [e for e in lab.audit(start, writes=True)
                   if e["userAgent"] == "lab-controller/kai-scheduler" and e["verb"] == "delete"]  # fmt: skip
    assert len(kai_deletes) == 16  # every pod still allocated, none twice
    replacements = wait_for(lambda: (ps := job_pods(core, "llm")) and len(ps) == 18
                            and all(not p.metadata.deletion_timestamp for p in ps) and ps, what="18 new pods")  # fmt: skip
    assert all(p.spec.node_name is None for p in replacements)  # its node is cordoned: none of them bound
    time.sleep(2 * SCHEDULE_PERIOD_SECONDS)  # the node stays out a while: nothing but KAI's own cycle retries
    cordon(core, nodes[3], off=False)
    back = wait_for(lambda: (r := running_on(core, "llm")) and len(r) == 18 and r, timeout=15, what="the gang back")
    assert back == dict(enumerate(nodes))  # each index back on its tray
    assert interruptions() == {group: 1}
    evict(core, next(p.metadata.name for p in job_pods(core, "llm")))
    wait_for(lambda: interruptions() == {group: 2}, what="a second interruption, once whole again")


def test_podgroups_are_read_across_namespaces_by_kubectl_and_read_gangs(lab, emulator, tmp_path: Path):
    made = nvl72_objects(racks=4, seed=0)
    other_job, other_pg = training_job("elsewhere", 2, namespace="research")
    lab.seed([*made.objects, other_job, other_pg])
    kc = tmp_path / "kubeconfig"
    kc.write_text(yaml.safe_dump(kubeconfig(emulator.url, "nvl72")))
    kubectl = shutil.which("kubectl")
    if kubectl is not None:
        env = {**os.environ, "KUBECONFIG": str(kc), "HOME": str(tmp_path)}
        out = subprocess.run([kubectl, "get", "pg", "-A", "-o", "json"], env=env, text=True, capture_output=True,
                             timeout=60, check=True).stdout  # fmt: skip
        listed = {f"{i['metadata']['namespace']}/{i['metadata']['name']}": i["spec"]["minMember"]
                  for i in json.loads(out)["items"]}  # fmt: skip
        assert listed == {**{g: len(made.jobs[j]) for j, g in made.pod_groups.items()},
                          f"research/{other_pg['metadata']['name']}": 2}  # fmt: skip

    async def read() -> dict[str, int]:
        connector = ClusterConnector([str(kc)])
        acts = GangActivities(connector)
        try:
            found = await acts.read_gangs(GangRequest(cluster="nvl72"))
        finally:
            await acts.close()
            await connector.close()
        return {g.id: g.min_member for g in found.gangs if g.running == g.min_member}

    gangs = asyncio.run(read())
    assert gangs == {f"kai:{g}": len(made.jobs[j]) for j, g in made.pod_groups.items()}
