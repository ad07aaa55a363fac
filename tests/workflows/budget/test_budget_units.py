"""A disruption budget's limits in NVLink domains and gangs, on a real dev server against the Kubernetes emulator:
nodes labelled with GPU Feature Discovery's clique label, GPU pods carrying KAI's `pod-group-name` (the emulator
serves no PodGroup, so a gang's minimum is its pod count). The operator sets and clears the limits with
`millwright budget set`, and `budget show` says what is out and where."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from temporalio.testing import ActivityEnvironment

from activities.kube.models import UnavailableRequest
from activities.kube.topology import TopologyLabels
from lab.fleet import Fleet
from starter.questions import current_details
from tests.cli_in_process import cli
from tests.workflows.budget.test_disruption_budget import budget_state, start_budget, state_where
from tests.workflows.maintenance.test_node_maintenance import record_history
from tests.workflows.rollout.helpers import availability_timeline
from workflows.budget.disruption_budget import DisruptionBudget, Lease, LeaseRelease, LeaseRequest
from workflows.budget.units import UnitLimits

DOMAIN_A = "7b968a6d-c8aa-45e1-9e07-e1e51be99c31"
DOMAIN_B = "0c4e2f1a-1111-4d2b-8d6e-3a9f5c2b7e10"
DOMAIN_C = "e1d2c3b4-2222-4a5b-9c8d-7e6f5a4b3c2d"


def topology_fleet(domains: Mapping[str, str | None], gangs: Mapping[str, list[str]]) -> list[dict[str, Any]]:
    """8-GPU nodes in NVLink domains (`domains`: node -> ClusterUUID; None: no clique label), and each gang's
    4-GPU pods (`gangs`: KAI PodGroup name -> its nodes, a pod on each) in namespace ml."""
    nodes = [{"name": n, "labels": {"nvidia.com/gpu.clique": f"{d}.1"} if d else {}} for n, d in domains.items()]
    workloads = [{"name": name, "kind": "Pod", "namespace": "ml", "replicas": len(on), "nodes": on, "gpus": 4,
                  "annotations": {"pod-group-name": name}, "terminationGracePeriodSeconds": 1}
                 for name, on in gangs.items()]  # fmt: skip
    return Fleet.model_validate({"cluster": "lab", "nodes": nodes, "workloads": workloads}).to_objects()


def most_units_out(
    audit: list[dict], domains: Mapping[str, str | None], gangs: Mapping[str, list[str]]
) -> tuple[int, int]:
    """The most NVLink domains with a node out of service, and the most gangs with a pod on such a node, at once
    after any node write (a node without a clique label is its own domain)."""
    runs = {node: {g for g, on in gangs.items() if node in on} for node in domains}
    worst = (0, 0)
    for _, state in availability_timeline(audit):
        down = [n for n, d in state.items() if d]
        out = {domains.get(n) or f"node:{n}" for n in down}, set().union(*(runs.get(n, set()) for n in down))
        worst = (max(worst[0], len(out[0])), max(worst[1], len(out[1])))
    return worst


DOMAINS = {"node-01": DOMAIN_A, "node-02": DOMAIN_A, "node-03": DOMAIN_A, "node-04": DOMAIN_B, "node-05": DOMAIN_B,
           "node-06": None}  # fmt: skip
GANGS = {"train-a": ["node-01", "node-04"], "train-b": ["node-02"]}


async def test_leases_within_the_domain_and_gang_limits_and_what_the_operator_sees(
    client, kube_worker, k8s, core, temporal_address
):
    await k8s.seed(topology_fleet(DOMAINS, GANGS))
    entity = await start_budget(client, kube_worker, {"count": 5})
    # Running workflows to stand for holders: other clusters' entities (their liveness is what counts).
    h1, h2, h3, h4 = [(await start_budget(client, kube_worker, {"count": 1}, cluster=f"holder-{i}")).id
                      for i in range(1, 5)]  # fmt: skip

    def budget_cli(*args: str):
        return cli("budget", *args, "--address", temporal_address)

    bad = await budget_cli("set", "lab", "--count", "5", "--gangs", "0", "--by", "sre", "-r", "x")
    assert bad.returncode == 2 and "gangs" in bad.stderr, bad
    limits = ("--count", "5", "--nvlink-domains", "1", "--gangs", "1", "--by", "sre", "-r", "one rack, one job")
    dry = await budget_cli("set", "lab", *limits, "--dry-run")
    assert dry.returncode == 0 and "(limits none -> 1 NVLink domains, 1 gangs)" in dry.stderr, dry
    done = await budget_cli("set", "lab", *limits)
    assert done.returncode == 0, done
    assert (await budget_state(entity)).limits == UnitLimits(nvlink_domains=1, gangs=1)

    async def acquire(node: str, holder: str) -> Lease:
        return await entity.execute_update(DisruptionBudget.acquire, LeaseRequest(node=node, holder=holder))

    assert (await acquire("node-01", h1)).state == "granted"  # domain A, train-a
    held_by_domain = await acquire("node-04", h2)  # would add domain B
    assert held_by_domain.state == "queued"
    assert held_by_domain.note == (f"waiting: 1 of 1 allowed NVLink domains have nodes out of service (node-04 is in "
                                   f"domain {DOMAIN_B})")  # fmt: skip
    held_by_gang = await acquire("node-02", h3)  # domain A, but would add train-b
    assert held_by_gang.note == "waiting: 1 of 1 allowed gangs disrupted (node-02 runs kai:ml/train-b)"
    # Neither holds up a request within both limits: node-03 is in domain A and runs no gang.
    assert (await acquire("node-03", h4)).state == "granted"

    await core.patch_node("node-06", {"spec": {"unschedulable": True}})  # someone else's cordon: its own domain
    state = await state_where(entity, lambda s: "node-06" in s.places, "node-06 placed")
    assert state.domains_out == {DOMAIN_A: ["node-01", "node-03"], "node:node-06": ["node-06"]}
    assert state.gangs_disrupted == {"kai:ml/train-a": f"runs on node-01, leased to {h1}"}
    assert "its own NVLink domain" in state.places["node-06"] and f"NVLink domain {DOMAIN_A}" in state.places["node-01"]
    shown = await budget_cli("show", "lab")
    assert shown.returncode == 0, shown
    assert "NVLink domains with nodes out of service: 2 of 1 allowed" in shown.stdout, shown.stdout
    assert "gangs disrupted: 1 of 1 allowed" in shown.stdout and "kai:ml/train-a: runs on node-01" in shown.stdout
    assert "no nvidia.com/gpu.clique label: its own NVLink domain" in shown.stdout, shown.stdout
    details = await current_details(entity)
    assert "NVLink domains out: 2 of 1" in details and "gangs disrupted: 1 of 1 (kai:ml/train-a)" in details, details

    # Without the domain limit node-04 is within the gang limit (train-a is disrupted already); node-02 still waits.
    cleared = await budget_cli("set", "lab", "--count", "5", "--nvlink-domains", "none", "--by", "sre", "-r", "racks")
    assert cleared.returncode == 0, cleared
    state = await state_where(entity, lambda s: any(lease.node == "node-04" for lease in s.leases), "node-04 leased")
    assert state.limits == UnitLimits(gangs=1)
    assert [q.node for q in state.queue] == ["node-02"] and "allowed gangs disrupted" in state.queue[0].note
    for node, holder in (("node-01", h1), ("node-03", h4)):
        await entity.execute_update(DisruptionBudget.release, LeaseRelease(node=node, holder=holder))
    # node-04 still holds train-a: node-02 waits on; released too, train-b may go.
    await entity.execute_update(DisruptionBudget.release, LeaseRelease(node="node-04", holder=h2))
    await state_where(entity, lambda s: [lease.node for lease in s.leases] == ["node-02"], "node-02 leased")
    await record_history(entity, "disruption_budget_unit_limits")


async def test_the_read_places_only_the_nodes_the_decision_needs_and_finds_the_gangs_disrupted(k8s, kube, core):
    """The entity's cluster read with topology keys: places for the nodes out of service and those asked about (not
    the cluster's), their gangs, and the gangs disrupted; without the keys, none of it."""
    await k8s.seed(topology_fleet(DOMAINS, {**GANGS, "train-c": ["node-05", "node-06"]}))
    await core.patch_node("node-04", {"spec": {"unschedulable": True}})
    plain = await ActivityEnvironment().run(kube.node_availability, UnavailableRequest(cluster="lab"))
    assert plain.unavailable == {"node-04": "cordoned"}
    assert plain.places == {} and plain.gangs_on == {} and plain.disrupted_gangs == {}
    req = UnavailableRequest(cluster="lab", topology=TopologyLabels(), nodes=["node-02", "node-06"], gangs=True)
    got = await ActivityEnvironment().run(kube.node_availability, req)
    assert set(got.places) == {"node-02", "node-04", "node-06"}
    assert got.places["node-04"].domain == DOMAIN_B and got.places["node-06"].own_domain
    assert got.gangs_on == {"node-02": ["kai:ml/train-b"], "node-04": ["kai:ml/train-a"],
                            "node-06": ["kai:ml/train-c"]}  # fmt: skip
    assert got.disrupted_gangs == {"kai:ml/train-a": "pods on node-04, out of service"}
