"""`millwright rack why|remediate|status|approve|reject`, as a person types them (in-process: tests/cli_in_process.py),
against the real dev server, the Kubernetes emulator and, for a real RackRemediation, lab BMCs: a domain is found by
its rack or its ClusterUUID alike (a node whose clique label a fault took off included), a dry run starts and writes
nothing, one run per domain, and the rack's power cycle waits for an operator's decision."""

from __future__ import annotations

import contextlib
import json
import uuid

import pytest
import yaml
from temporalio.api.enums.v1 import EventType
from temporalio.service import RPCError

from lab.fleet import Fleet
from tests.cli_in_process import cli
from tests.kube_helpers import wait_for
from tests.workers import settings_worker

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.timeout(180)]

UUID_A, UUID_B = "7b968a6d-c8aa-45e1-9e07-e1e51be99c31", "0c2f9e4b-5d8e-4a51-9f0d-3c6a2b1e7d44"
RACK_A = [f"ra-{i}" for i in range(1, 5)]
RUN = "rack-remediation/lab/rack-cli-a"
WHO = ("--by", "alice")


def labels(rack: str, domain: str | None) -> dict[str, str]:
    clique = {"nvidia.com/gpu.clique": f"{domain}.1"} if domain else {}
    return {**clique, "accelerator.topograph.run/domain": rack, "fabric.topograph.run/tier-1": "block-1"}


def fleet() -> list[dict]:
    """rack-cli-a: ra-1 and ra-2 run one gang, ra-2 is cordoned by hand, ra-3 is NotReady, and ra-4 is NotReady with its
    clique label gone (a fabric fault); rack-cli-b is another domain."""
    nodes = [{"name": "ra-1", "labels": labels("rack-cli-a", UUID_A), "gpus": 4},
             {"name": "ra-2", "labels": labels("rack-cli-a", UUID_A), "gpus": 4, "unschedulable": True},
             {"name": "ra-3", "labels": labels("rack-cli-a", UUID_A), "gpus": 4, "ready": False},
             {"name": "ra-4", "labels": labels("rack-cli-a", None), "gpus": 4, "ready": False},
             *({"name": f"rb-{i}", "labels": labels("rack-cli-b", UUID_B), "gpus": 4} for i in (1, 2))]  # fmt: skip
    return Fleet.model_validate({
        "cluster": "lab", "nodes": nodes,
        "workloads": [{"name": "train", "namespace": "ml", "replicas": 2, "gpus": 4, "nodes": ["ra-1", "ra-2"],
                       "annotations": {"pod-group-name": "pg-train"}}],
    }).to_objects()  # fmt: skip


@pytest.fixture
def rack(temporal_address, kubeconfig_path):
    """`millwright rack WORDS` on the emulator's cluster `lab`, as its kubeconfig names it."""

    def command(*words: str) -> tuple[str, ...]:
        return ("rack", *words, "--cluster", "lab", "--kubeconfig", str(kubeconfig_path), "--address", temporal_address)

    return command


async def test_why_and_a_dry_run_read_the_domain_and_start_nothing(client, k8s, rack, tmp_path):
    await k8s.seed(fleet())

    shown = await cli(*rack("why", "rack-cli-a", "-o", "json"))
    assert shown.returncode == 0, shown
    why = json.loads(shown.stdout)
    assert (why["rack"], why["domain"], why["workflow_id"]) == ("rack-cli-a", UUID_A, RUN)
    nodes = {n["node"]: n for n in why["nodes"]}
    assert list(nodes) == RACK_A and (why["unhealthy"], why["clique_gone"]) == (2, 1)
    assert why["verdict"] == "2 of 4 nodes unhealthy: at or over the escalation share 0.5; the clique label is gone " \
                             "from 1 of 4"  # fmt: skip
    assert nodes["ra-4"]["clique"] is None and nodes["ra-4"]["problems"][0].startswith("NotReady")
    assert nodes["ra-1"]["problems"] == [] and nodes["ra-2"]["foreign_cordon"] is True
    assert [(g["id"], g["nodes"], g["gpus"]) for g in why["gangs"]] == [("kai:ml/pg-train", ["ra-1", "ra-2"], 8)]
    assert why["rack_run"] is None and why["node_runs"] == []

    # The ClusterUUID names the same domain and run: ra-4, whose label is gone, is found by its rack.
    by_uuid = await cli(*rack("why", UUID_A))
    assert by_uuid.returncode == 0, by_uuid
    text = by_uuid.stdout
    assert f"rack rack-cli-a on lab: NVLink domain {UUID_A}, 4 nodes" in text and f"({RUN})" in text, text
    assert "ra-4" in text and "gone" in text and "by someone else" in text
    assert "gang kai:ml/pg-train: 2 pods here on 2 nodes (2 running, 8 GPUs)" in text
    missing = await cli(*rack("why", "rack-zz"))
    assert missing.returncode == 1 and "no node of cluster lab is in rack or NVLink domain 'rack-zz'" in missing.stderr

    # A dry run says what would be done and starts nothing, writing nothing to the cluster.
    cursor = await k8s.audit_cursor()
    remediate = ("remediate", UUID_A, *WHO, "--reason", "fabric fault", "--dry-run")
    dry = await cli(*rack(*remediate))
    assert dry.returncode == 0 and "dry run: rack-remediation/lab/rack-cli-a was not started" in dry.stderr, dry
    assert f"would start RackRemediation {RUN} on task queue millwright" in dry.stdout
    assert "cordon: ra-1, ra-3, ra-4" in dry.stdout and "drain: all 4 nodes at once" in dry.stdout
    assert "ra-2: cordoned by someone else" in dry.stdout and "power: compute trays off" in dry.stdout
    assert "refused: no BMC known for ra-1, ra-2, ra-3, ra-4" in dry.stdout
    plan = json.loads((await cli(*rack(*remediate, "--require-approval", "-o", "json"))).stdout)
    assert plan["input"]["domain"] == "rack-cli-a" and plan["input"]["require_approval_for"] == ["power-cycle"]
    assert plan["input"]["requested_by"] == "alice" and plan["held_by"] is None
    assert [e async for e in client.list_workflows(f"WorkflowId = '{RUN}'")] == []
    assert await k8s.audit(since=cursor, writes=True) == []

    # Settings that do not fit the input are refused naming the field, before anything is read.
    settings = tmp_path / "settings.yaml"
    settings.write_text("power_timout: PT1M\n")
    bad = await cli(*rack("remediate", "rack-cli-a", *WHO, "--reason", "x", "--settings", str(settings)))
    assert bad.returncode == 2 and "nothing was started" in bad.stderr, bad
    assert "power_timout: Extra inputs are not permitted; did you mean 'power_timeout'?" in bad.stderr
    settings.write_text(json.dumps({"domain": "rack-cli-b"}))
    own = await cli(*rack("remediate", "rack-cli-a", *WHO, "--reason", "x", "--settings", str(settings)))
    assert own.returncode == 2 and "domain: given by the command, not in the settings" in own.stderr, own


@pytest.fixture(scope="module")
def rack_bmcs(tmp_path_factory):
    """A lab BMC for each tray of rack-cli-a, and the credentials file a worker reads them with."""
    from lab.loopback import write_secret_file
    from lab.redfish import LabBmcs

    password = f"rack-{uuid.uuid4().hex}"
    secret = write_secret_file(tmp_path_factory.mktemp("rack-cli-bmc") / "credentials", f"admin:{password}")
    with LabBmcs(servers=RACK_A, user="admin", password=password, power_delay=0.05) as bmcs:
        yield bmcs, secret


async def update_events(client, workflow_id: str) -> list:
    events = []
    async for e in client.get_workflow_handle(workflow_id).fetch_history_events():
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED:
            events.append(e.workflow_execution_update_accepted_event_attributes.accepted_request)
    return events


async def test_one_run_per_domain_and_its_power_cycle_waits_for_an_operator(client, k8s, kubeconfig_path, rack,
                                                                            rack_bmcs, tmp_path):  # fmt: skip
    from workflows.remediation.rack_models import RackRemediationResult, RackRemediationStatus

    bmcs, secret = rack_bmcs
    await k8s.seed(fleet())
    settings = tmp_path / "settings.yaml"
    settings.write_text(yaml.safe_dump({"bmcs": {n: {"url": bmcs.bmc_urls[n]} for n in RACK_A},
                                        "disruption_budget": False, "domain_check": None,
                                        "approval_timeout": "PT10M", "ready_timeout": "PT30S"}))  # fmt: skip
    handle = client.get_workflow_handle(RUN)

    async def phase(wanted: str) -> RackRemediationStatus:
        async def probe():
            s = await handle.query("status", result_type=RackRemediationStatus)
            return s if s.phase == wanted else None

        return await wait_for(probe, what=f"{RUN} in phase {wanted}", timeout=60)

    async with settings_worker(client, kubeconfig_path, "rack", bmc_credentials=f"file:{secret}") as queue:
        start = ("remediate", "--reason", "fabric fault", *WHO, "--settings", str(settings), "-q", queue)
        try:
            started = await cli(*rack(*start[:1], "rack-cli-a", *start[1:], "--require-approval"))
            assert started.returncode == 0 and f"workflow id: {RUN}" in started.stdout, started
            again = await cli(*rack(*start[:1], UUID_A, *start[1:]))  # the same domain by its ClusterUUID
            assert again.returncode == 1 and f"already runs for rack rack-cli-a: {RUN}" in again.stderr, again
            assert f"workflow id: {RUN}" in again.stdout

            await phase("awaiting-approval")
            why = await cli(*rack("why", "rack-cli-a", "-o", "wide"))
            assert f"held by the running {RUN}: phase awaiting-approval" in why.stdout, why
            assert "ra-3: cordon: rack remediation: fabric fault" in why.stdout
            assert f"ra-1   -      Ready      by {RUN}" in why.stdout and "by someone else" in why.stdout
            status = await cli(*rack("status", UUID_A))
            assert status.returncode == 0 and "awaiting approval of power-cycle until" in status.stdout, status
            assert "ra-2   -      not-ours   no" in status.stdout and "1/1 evicted" in status.stdout, status
            held = await cli(*rack(*start[:1], "rack-cli-a", *start[1:], "--dry-run"))
            assert held.returncode == 1 and f"already held: {RUN} runs for this domain" in held.stdout, held

            dry = await cli(*rack("approve", UUID_A, *WHO, "--reason", "ok", "--dry-run"))
            assert dry.returncode == 0 and "would take `rack approve`: step power-cycle until" in dry.stderr, dry
            assert await update_events(client, RUN) == []
            rejected = await cli(*rack("reject", "rack-cli-a", *WHO, "--reason", "fans out on tray 3"))
            assert rejected.returncode == 0 and f"rack reject: done on {RUN}" in rejected.stderr, rejected
            result = await client.get_workflow_handle(RUN, result_type=RackRemediationResult).result()
            assert result.outcome == "held-out" and "power cycle rejected by alice: fans out on tray 3" in result.note
            assert result.held_out == ["ra-1", "ra-3", "ra-4"] and result.power_cycles == 0
            assert [(a.input.name, a.meta.identity) for a in await update_events(client, RUN)] == [("reject", "alice")]
            ended = await cli(*rack("status", "rack-cli-a"))
            assert "outcome held-out" in ended.stdout and "held out: ra-1, ra-3, ra-4" in ended.stdout, ended
            closed = await cli(*rack("approve", "rack-cli-a", *WHO, "--reason", "late"))
            assert closed.returncode == 1 and "is completed: a closed run takes no controls" in closed.stderr, closed

            # A run with no approval step powers the rack at once; the validator refuses an approval then.
            started = await cli(*rack(*start[:1], "rack-cli-a", *start[1:]))
            assert started.returncode == 0, started
            waiting = await phase("waiting-for-nodes")
            assert [n.powered for n in waiting.nodes] == [["Off", "On"]] * 4 and waiting.power_order == RACK_A
            refused = await cli(*rack("approve", "rack-cli-a", *WHO, "--reason", "too late"))
            assert refused.returncode == 1, refused
            assert "no step is waiting for approval (phase waiting-for-nodes)" in refused.stderr
            shown = await cli(*rack("status", "rack-cli-a", "-o", "json"))
            assert json.loads(shown.stdout)["state"]["phase"] == "waiting-for-nodes", shown
        finally:
            with contextlib.suppress(RPCError):  # closed already
                await handle.terminate("test over")
