"""A rollout with `batchBy: nvlinkDomain` on the Kubernetes emulator: nodes labelled with NVLink domains whose names
do not follow them, KAI gangs of GPU pods spanning domains; the cordons the API server saw show that no batch took
part of a domain and that each gang was interrupted in one batch. The rules themselves: test_unit_batching.py."""

from __future__ import annotations

import json
import uuid
from itertools import pairwise
from typing import Any

import pytest
from temporalio.client import WorkflowFailureError

from activities.kube.topology import CLIQUE_LABEL, KAI_POD_GROUP_ANNOTATION
from lab.fleet import Fleet
from tests.cli_in_process import cli
from tests.workflows.partitioning.helpers import mig_lab
from tests.workflows.partitioning.test_gpu_partitioning import partitioning
from tests.workflows.partitioning.test_gpu_partitioning import start as start_partitioning
from tests.workflows.rollout.helpers import rollout_spec
from tests.workflows.rollout.test_rollout import lab_ready, start
from workflows.partitioning.gpu_partitioning import GpuPartitioning
from workflows.rollout.rollout import Rollout

DOMAINS = "ABCD"


def domain_fleet(nodes: int, gangs: dict[str, list[str]], *, unlabelled: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """Nodes gpu-01.. of 8 GPUs, node i in NVLink domain DOMAINS[(i - 1) % 4] (names do not follow domains), but the
    `unlabelled`; a gang is a ReplicaSet of whole-node GPU pods with KAI's `pod-group-name`, one pod a node."""
    specs = []
    for i in range(1, nodes + 1):
        name, labels = f"gpu-{i:02d}", {"gpu": "true"}
        if name not in unlabelled:
            labels[CLIQUE_LABEL] = f"domain-{DOMAINS[(i - 1) % 4]}.1"
        specs.append({"name": name, "labels": labels, "gpus": 8})
    workloads = [
        {"name": gang, "namespace": "training", "replicas": len(on), "gpus": 8, "nodes": on,
         "annotations": {KAI_POD_GROUP_ANNOTATION: gang}, "terminationGracePeriodSeconds": 1}
        for gang, on in gangs.items()
    ]  # fmt: skip
    return Fleet.model_validate({"cluster": "lab", "nodes": specs, "workloads": workloads}).to_objects()


def first_cordons(audit: list[dict]) -> dict[str, int]:
    """Node -> the audit sequence number of the first write that left it cordoned."""
    out: dict[str, int] = {}
    for entry in audit:
        after = entry.get("nodeAfter")
        if entry.get("resource") == "nodes" and after and after["unschedulable"]:
            out.setdefault(entry["name"], entry["seq"])
    return out


async def test_batches_take_whole_domains_and_each_gang_in_one_batch(client, kube_worker, k8s, core):
    # Domains: A gpu-01,05,09; B 02,06,10; C 03,07,11; D 04,08,12 (no GPU work); gpu-13 has no clique label, and a
    # gang of its own so that no evicted pod restarts there (a gang that restarts on a node not yet updated is
    # interrupted again there: nothing a batch can help).
    gangs = {
        "wide": ["gpu-01", "gpu-05", "gpu-09", "gpu-02", "gpu-06", "gpu-10"],  # A and B
        "left": ["gpu-03"],  # two small gangs sharing C
        "right": ["gpu-07", "gpu-11"],
        "solo": ["gpu-13"],
    }
    await lab_ready(k8s, domain_fleet(13, gangs, unlabelled=("gpu-13",)))
    policy = {"default": {"budget": {"count": 6}, "strategy": {"fixed": {"initialBatch": 6}}}}
    handle = await start(client, kube_worker, rollout_spec("domains", policy=policy, batchBy="nvlinkDomain"))
    result = await handle.result()
    assert result.outcome == "completed" and result.counts == {"complete": 13}

    status = await handle.query(Rollout.status)
    batches = status.recent_batches
    # D interrupts nothing and goes first, filled with C (3 + 3); A and B hold one gang: together; gpu-13 alone.
    assert [sorted(b.units) for b in batches] == [["domain-C", "domain-D"], ["domain-A", "domain-B"], ["node:gpu-13"]]
    assert [b.gangs for b in batches] == [
        ["kai:training/left", "kai:training/right"], ["kai:training/wide"], ["kai:training/solo"]]  # fmt: skip
    assert "gpu-13" in status.compartments["__default__"].topology

    batch_of = {n: i for i, b in enumerate(batches) for n in b.order}
    cordoned = first_cordons(await k8s.audit())
    assert set(cordoned) == set(batch_of)
    for earlier, later in pairwise(batches):  # the cordons came batch by batch
        assert max(cordoned[n] for n in earlier.order) < min(cordoned[n] for n in later.order)
    for i in range(1, 13):  # no batch took part of a domain
        assert batch_of[f"gpu-{i:02d}"] == batch_of[f"gpu-{(i - 1) % 4 + 1:02d}"], f"gpu-{i:02d}"
    for gang, on in gangs.items():  # each gang's nodes all went in one batch
        assert len({batch_of[n] for n in on}) == 1, gang


async def test_the_plan_shows_each_batchs_domains_and_the_gangs_it_would_interrupt(
    client, kube_worker, k8s, temporal_address
):
    gangs = {"wide": ["gpu-01", "gpu-02"], "left": ["gpu-03"], "right": ["gpu-07"]}  # A+B; two in C
    await lab_ready(k8s, domain_fleet(9, gangs))  # A gpu-01,05,09; B 02,06; C 03,07; D 04,08
    spec = rollout_spec(
        f"plan-{uuid.uuid4().hex[:6]}", batchBy="nvlinkDomain",
        policy={"default": {"budget": {"count": 5}, "strategy": {"fixed": {"initialBatch": 5}}}},
    ).model_dump(mode="json", by_alias=True, exclude_none=True)  # fmt: skip
    args = ("rollout", "plan", "-", "-q", kube_worker.task_queue, "--address", temporal_address)
    shown = await cli(*args, stdin=json.dumps(spec))
    assert shown.returncode == 0, shown.stderr
    # The best fill of 5 comes first: A and B, held together by one gang (5), rather than D (no GPU work) and C (4).
    assert "batch 1: 5 nodes in domain-A, domain-B; interrupts gangs: kai:training/wide" in shown.stdout, shown.stdout
    assert "batch 2: 4 nodes in domain-C, domain-D; interrupts gangs: kai:training/left, kai:training/right" in (
        shown.stdout
    )
    planned = json.loads((await cli(*args, "--json", stdin=json.dumps(spec))).stdout)
    second = planned["compartments"][0]["batches"][1]
    assert second["units"] == {"domain-C": ["gpu-03", "gpu-07"], "domain-D": ["gpu-04", "gpu-08"]}
    assert second["gangs"] == ["kai:training/left", "kai:training/right"]


async def test_a_domain_larger_than_the_ceiling_is_refused_before_any_node(client, kube_worker, k8s, core):
    await lab_ready(k8s, domain_fleet(8, {}))
    policy = {"default": {"budget": {"count": 1}, "strategy": {"fixed": {"initialBatch": 1}}}}
    handle = await start(client, kube_worker, rollout_spec("too-big", policy=policy, batchBy="nvlinkDomain"))
    with pytest.raises(WorkflowFailureError) as err:
        await handle.result()
    assert err.value.cause.message == (
        "compartment '__default__': NVLink domain domain-A has 2 nodes, more than the compartment's ceiling of 1; "
        "batchBy nvlinkDomain takes every NVLink domain whole: raise the compartment's budget to at least 2 "
        "nodes, or set batchBy: none"
    )
    assert first_cordons(await k8s.audit()) == {}


async def test_gpu_partitioning_takes_whole_domains_and_its_plan_names_a_domain_over_the_ceiling(
    client, kube_worker, k8s, core
):
    await mig_lab(k8s)  # gpu-01..04, a trainer pod on each (its own gang), a ceiling of 2
    for node, domain in (("gpu-01", "X"), ("gpu-02", "Y"), ("gpu-03", "X"), ("gpu-04", "Y")):
        await core.patch_node(node, {"metadata": {"labels": {CLIQUE_LABEL: f"domain-{domain}.1"}}})
    handle = await start_partitioning(client, kube_worker, partitioning("domains", batchBy="nvlinkDomain"))
    result = await handle.result()
    assert result.outcome == "completed" and result.counts == {"complete": 4}, result.problems
    batches = (await handle.query(GpuPartitioning.status)).recent_batches
    assert [b.units for b in batches] == [{"domain-X": ["gpu-01", "gpu-03"]}, {"domain-Y": ["gpu-02", "gpu-04"]}]

    await core.patch_node("gpu-02", {"metadata": {"labels": {CLIQUE_LABEL: "domain-X.1"}}})  # X: 3 nodes
    planned = await (await start_partitioning(
        client, kube_worker, partitioning("domains-plan", batchBy="nvlinkDomain", dryRun=True))).result()  # fmt: skip
    assert planned.warnings == [
        "compartment '__default__': NVLink domain domain-X has 3 nodes, more than the compartment's ceiling of 2; "
        "batchBy nvlinkDomain takes every NVLink domain whole: raise the compartment's budget to at least 3 nodes, "
        "or set batchBy: none"
    ]
