"""The operator's questions on the same lab and rollout as tests/starter/cli/test_controls.py: `ls` filtered by cluster and
phase, `status`, and `node why` on a node cordoned by hand, one a remediation quarantined, and one a rollout's lease
holds, each naming the right holder and reason."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from tests.cli_in_process import cli
from tests.kube_helpers import wait_for
from tests.starter.cli.conftest import CLUSTER, FAILING, rollout_status
from tests.workflows.rollout.helpers import JOBS_FAST

FIXED = {
    "node": FAILING,
    "stage": "apply",
    "seconds": 60,
    "log": "building nvidia-dkms 550.54\nDKMS: install completed",
}

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.timeout(240)]


async def test_ls_filters_by_cluster_and_phase_and_status_renders_progress(lab):
    listed = await cli(*lab.args("ls", "--cluster", CLUSTER, "-o", "json"))
    assert listed.returncode == 0, listed
    ops = {o["id"]: o for o in json.loads(listed.stdout)}
    assert ops[lab.rollout_id]["family"] == "Rollout" and ops[lab.rollout_id]["progress"].endswith("/6")
    assert ops[f"disruption-budget/{CLUSTER}"]["phase"] == "serving"
    phase = ops[lab.rollout_id]["phase"]

    by_phase = await cli(*lab.args("ls", "--cluster", CLUSTER, "--phase", phase))
    assert by_phase.returncode == 0 and by_phase.stdout.split()[:6] == [
        "ID",
        "FAMILY",
        "CLUSTER",
        "PHASE",
        "PROGRESS",
        "AGE",
    ]
    assert lab.rollout_id in by_phase.stdout and "disruption-budget" not in by_phase.stdout, by_phase
    serving = await cli(*lab.args("ls", "--cluster", CLUSTER, "--phase", "serving", "-o", "wide"))
    assert f"disruption-budget/{CLUSTER}" in serving.stdout and lab.rollout_id not in serving.stdout, serving
    rollouts = json.loads((await cli(*lab.args("ls", "--family", "Rollout", "-o", "json"))).stdout)
    assert lab.rollout_id in [o["id"] for o in rollouts] and {o["family"] for o in rollouts} == {"Rollout"}
    elsewhere = await cli(*lab.args("ls", "--cluster", "no-such-cluster"))
    assert elsewhere.returncode == 0 and elsewhere.stdout.startswith("no operations running"), elsewhere

    shown = await cli(*lab.args("status", lab.rollout_id))
    assert shown.returncode == 0 and f"Rollout {lab.rollout_id} (running" in shown.stdout and "/6" in shown.stdout
    as_json = json.loads((await cli(*lab.args("status", lab.rollout_id, "-o", "json"))).stdout)
    assert as_json["family"] == "Rollout" and as_json["progress"]["total"] == 6
    assert as_json["rollout"]["problems"]["a-06"]["status"] == "skipped" and "COMPARTMENT" in shown.stdout
    missing = await cli(*lab.args("status", "rollout/cli/nothing"))
    assert missing.returncode == 1 and "no run with ID 'rollout/cli/nothing'" in missing.stderr, missing


async def why(lab, node: str) -> tuple[dict, str]:
    args = lab.args("node", "why", node, "--cluster", CLUSTER, "--kubeconfig", str(lab.kubeconfig))
    person, script = await cli(*args), await cli(*args, "-o", "json")
    assert person.returncode == 0 and script.returncode == 0, (person, script)
    return json.loads(script.stdout), person.stdout


async def test_node_why_a_node_a_rollout_lease_holds(lab):
    # The retried node's next apply succeeds, slowly: it holds its lease meanwhile, and prints what it builds.
    await lab.admin.configure(jobs={**JOBS_FAST, "defaultSeconds": 60, "rules": [FIXED]})
    approved = await cli(*lab.args("rollout", "approve", lab.rollout_id, "--by", "alice", "-r", "second batch"))
    assert approved.returncode == 0, approved
    status = await rollout_status(lab, lambda s: (b := s.compartments["__default__"].current_batch)
                                  and b.finished is None and b.order, "the next batch")  # fmt: skip
    node = status.compartments["__default__"].current_batch.order[0]
    batch = f"{lab.rollout_id}/__default__/batch-"  # the batch that updates the node holds its lease

    async def leased():
        found, text = await why(lab, node)
        return (found, text) if any(lease["holder"].startswith(batch) for lease in found["leases"]) else None

    found, text = await wait_for(leased, what=f"{node}'s lease", timeout=60)
    # (A node retried from an earlier batch may show that closed batch's lease too, until the budget recovers it.)
    holders = [lease["holder"] for lease in found["leases"] if lease["state"] == "granted"]
    assert holders and all(h.startswith(batch) for h in holders)
    holder = holders[-1]
    assert found["rollout"]["rollout"] == lab.rollout_id
    assert holder in text and "granted" in text
    # Millwright's Events on the node: its state changes (NodeWright's reason `State`) and stages.
    assert "State" in {e["reason"] for e in found["events"]} and "EVENT AT" in text, found["events"]

    # `status` shows where the node stands in its batch: its 60 s apply stage under way.
    async def applying():
        shown = json.loads((await cli(*lab.args("status", lab.rollout_id, "-o", "json"))).stdout)
        return shown if shown["nodes"].get(node, {}).get("running") else None

    shown = await wait_for(applying, what=f"{node}'s stages in status", timeout=30)
    assert shown["nodes"][node]["running"][0] == "kernel-tuning apply"
    text = (await cli(*lab.args("status", lab.rollout_id))).stdout
    assert "RUNNING" in text and f"{node} " in text and "kernel-tuning apply" in text, text


async def test_node_why_a_hand_cordon(lab, core_cli):
    await core_cli.patch_node("a-06", {"spec": {"unschedulable": True}})
    found, text = await why(lab, "a-06")
    assert found["foreign_cordon"] is True and found["cordoned_by"] is None
    assert found["leases"] == [] and found["quarantine"] is None  # nothing of Millwright's holds it
    assert "cordoned by someone else" in text and "Millwright never removes it" in text
    missing = await cli(*lab.args("node", "why", "a-99", "--cluster", CLUSTER, "--kubeconfig", str(lab.kubeconfig)))
    assert missing.returncode == 1 and "no node 'a-99' in cluster cli" in missing.stderr, missing


async def test_node_why_a_node_remediation_quarantined(lab):
    from workflows.remediation.models import NodeRemediationInput
    from workflows.remediation.node_remediation import NodeRemediation

    # A node no batch has taken yet; no host agent answers its queue: its one step fails, the ladder ends in quarantine.
    status = await rollout_status(lab, lambda s: s, "the status")
    taken = {
        n for b in [*status.recent_batches, status.compartments["__default__"].current_batch] if b for n in b.order
    }
    node = sorted({"a-03", "a-04", "a-05"} - taken)[0]
    inp = NodeRemediationInput(cluster=CLUSTER, node=node, reason="XID 79 on GPU 3", steps=["restart-gpu-services"],
                               agent_timeout=timedelta(seconds=1), disruption_budget=False)  # fmt: skip
    handle = await lab.client.start_workflow(NodeRemediation.run, inp, id=inp.workflow_id(),
                                             task_queue=lab.worker.task_queue)  # fmt: skip
    assert (await handle.result()).outcome == "quarantined"
    found, text = await why(lab, node)
    assert found["cordoned_by"] == inp.workflow_id() and "XID 79 on GPU 3" in found["quarantine"]["reason"]
    assert found["last_remediation"]["outcome"] == "quarantined"
    assert found["remediation"]["id"] == inp.workflow_id() and found["remediation"]["status"] == "completed"
    assert f"cordoned by Millwright run {inp.workflow_id()}" in text and "quarantined by" in text
    closed = await cli(*lab.args("remediation", "approve", node, "--cluster", CLUSTER, "--by", "bob", "-r", "late"))
    assert closed.returncode == 1 and "is completed: a closed run takes no controls" in closed.stderr, closed


async def test_node_logs_print_what_the_stage_jobs_printed(lab):
    args = ("node", "logs", FAILING, "--cluster", CLUSTER, "--kubeconfig", str(lab.kubeconfig))
    shown = await cli(*args, "--stage", "apply")
    assert shown.returncode == 0, shown
    assert "==> " in shown.stdout and "kernel-tuning apply" in shown.stdout
    assert (
        "lab: apply of kernel-tuning (registry.local/millwright/kernel-tuning:1.2.0) on a-01: started" in shown.stdout
    )
    assert "building nvidia-dkms 550.54" in shown.stdout and "DKMS: install completed" in shown.stdout
    logs = json.loads((await cli(*args, "-o", "json")).stdout)
    assert {entry["stage"] for entry in logs} >= {"apply"} and all(entry["rollout"] == lab.rollout_id for entry in logs)
    # The operator's reads say so: the worker's RBAC is held to what `millwright-worker` alone was seen to do.
    logs_read = [r for r in await lab.admin.requests() if r["subresource"] == "log"]
    assert logs_read and {r["userAgent"] for r in logs_read} == {"millwright-cli"}, logs_read
    none = await cli("node", "logs", "a-06", "--cluster", CLUSTER, "--kubeconfig", str(lab.kubeconfig))
    assert none.returncode == 0 and none.stdout == "" and "no stage Jobs of Millwright's on a-06" in none.stderr
