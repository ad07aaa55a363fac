"""The event path (worker/fault_events.py): Alertmanager's webhook and the node watch start a NodeRemediation within
seconds, through the sweep's rules; a flapping condition starts nothing. The real receiver and watch against the
Kubernetes emulator, the remediation on the remediation tier's worker."""

from __future__ import annotations

import asyncio
import contextlib
import time
from datetime import UTC, datetime, timedelta

import aiohttp
import pytest
from temporalio.service import RPCError, RPCStatusCode

from activities.kube.connector import ClusterConnector
from activities.kube.topology import CLIQUE_LABEL
from activities.redfish import BmcRef
from activities.support.secrets import SecretRef
from tests.kube_helpers import read_node, wait_for
from tests.workflows.remediation.helpers import fast_settings, fleet, started_since, stop_remediation
from tests.workflows.remediation.rack_stand_in import RackStandIn
from tests.workflows.remediation.test_node_remediation import power_resets
from tests.workflows.remediation.test_rack_remediation import seed_racks
from worker.alert_receiver import event_path
from worker.fault_events import FaultEvents, FaultEventSettings
from workflows.remediation.models import RemediationSettings
from workflows.remediation.node_remediation import NodeRemediation
from workflows.remediation.policy import OPT_OUT_LABEL, HealthChecks, remediation_workflow_id
from workflows.remediation.rack_models import rack_workflow_id

pytestmark = pytest.mark.timeout(120)
TOKEN = "s3cret-alertmanager-token"


@contextlib.asynccontextmanager
async def running_event_path(client, worker, kubeconfig_path, monkeypatch, hold: float = 2.0,
                             bmcs: dict[str, BmcRef] | None = None, min_healthy: dict | None = None,
                             escalation: dict | None = None, **remediation):  # fmt: skip
    """The event path as the worker runs it, on an ephemeral port; yields (events, receiver URL). `bmcs`: its
    settings' BMC map; `min_healthy`, `escalation`: its own, where not the default; `remediation`: the remediation
    settings that differ from `fast_settings`."""
    monkeypatch.setenv("TEST_AM_TOKEN", TOKEN)
    connector = ClusterConnector([str(kubeconfig_path)])
    settings = FaultEventSettings(
        hold=timedelta(seconds=hold), checks=HealthChecks(bmc=False), bmcs=bmcs or {},
        remediation=RemediationSettings(**fast_settings(**remediation)),
        **({"min_healthy": min_healthy} if min_healthy is not None else {}),
        **({"escalation": escalation} if escalation is not None else {}),
    )  # fmt: skip
    events = FaultEvents(client, connector, worker.task_queue, settings, ["lab"])
    try:
        async with event_path(events, connector, SecretRef.parse("env:TEST_AM_TOKEN"), "127.0.0.1", 0) as port:
            await wait_for(lambda: settled(events.heard["lab"]), what="the watch's first list")
            yield events, f"http://127.0.0.1:{port}"
    finally:
        await connector.close()


async def settled(value):
    """`value`, awaitable: for `wait_for` over what the test already holds."""
    return value


def payload(node: str, *, alertname: str = "GpuXid79", status: str = "firing") -> dict:
    alert = {"status": status, "labels": {"alertname": alertname, "Hostname": node, "cluster": "lab"},
             "annotations": {"summary": "XID 79: GPU fell off the bus"}, "startsAt": "2026-12-01T00:00:00Z",
             "endsAt": "0001-01-01T00:00:00Z", "generatorURL": "http://prometheus/graph", "fingerprint": "a1b2"}  # fmt: skip
    return {"version": "4", "groupKey": '{}:{alertname="GpuXid79"}', "truncatedAlerts": 0, "status": status,
            "receiver": "millwright", "groupLabels": {"alertname": alertname}, "commonLabels": alert["labels"],
            "commonAnnotations": alert["annotations"], "externalURL": "http://alertmanager:9093",
            "alerts": [alert]}  # fmt: skip


async def post(url: str, body: dict, token: str | None = TOKEN) -> tuple[int, dict]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with aiohttp.ClientSession() as http, http.post(f"{url}/alerts", json=body, headers=headers) as resp:
        return resp.status, await resp.json()


async def cordoned_at(k8s, node: str) -> float | None:
    """When the audit log first shows `node` cordoned (the write that left it unschedulable), or None."""
    for entry in await k8s.audit(writes=True):
        if (
            entry.get("resource") == "nodes"
            and entry.get("name") == node
            and entry.get("nodeAfter", {}).get("unschedulable")
        ):
            return entry["time"]
    return None


async def not_started(client, node: str) -> bool:
    try:
        await client.get_workflow_handle(remediation_workflow_id("lab", node)).describe()
    except RPCError as err:
        return err.status == RPCStatusCode.NOT_FOUND
    return False


async def set_condition(core, node: str, ctype: str, status: str) -> None:
    """A node condition set as a kubelet or Node Problem Detector writes it (added when absent)."""
    current = await core.read_node_status(node)
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    conditions = [core.api_client.sanitize_for_serialization(c) for c in current.status.conditions or []]
    found = next((c for c in conditions if c["type"] == ctype), None)
    if found is None:
        found = {"type": ctype, "reason": "Lab", "message": "lab"}
        conditions.append(found)
    found.update(status=status, lastTransitionTime=now, lastHeartbeatTime=now)
    body = {"metadata": {"resourceVersion": current.metadata.resource_version}, "status": {"conditions": conditions}}
    await core.patch_node_status(node, body)


async def test_an_alert_starts_the_nodes_remediation_within_seconds(client, rem_worker, k8s, core, hosts, names,
                                                                     kubeconfig_path, monkeypatch):  # fmt: skip
    node = names[0]
    await k8s.seed(fleet(names[:4]))
    await hosts.add(node)
    async with running_event_path(client, rem_worker, kubeconfig_path, monkeypatch) as (_events, url):
        sent = time.time()
        status, answer = await post(url, payload(node))
        assert status == 200, answer
        (outcome,) = answer["outcomes"]
        assert outcome["status"] == "started" and outcome["workflow_id"] == f"remediation/lab/{node}", outcome
        assert outcome["detail"] == "alert GpuXid79: XID 79: GPU fell off the bus", outcome
        assert outcome["bmc"].startswith("none known (not in the settings' bmcs"), outcome
        cordoned = await wait_for(lambda: cordoned_at(k8s, node), what=f"{node} cordoned", timeout=15)
        assert cordoned - sent < 10, f"cordoned {cordoned - sent:.1f}s after the alert"
        # The same alert again (Alertmanager's repeat) while it runs: never a second remediation.
        status, answer = await post(url, payload(node))
        assert answer["outcomes"][0]["status"] in ("already-running", "ignored"), answer
        result = await client.get_workflow_handle_for(NodeRemediation.run, outcome["workflow_id"]).result()
    assert result.outcome == "healthy", result
    assert not (await read_node(core, node)).spec.unschedulable


async def test_an_alert_for_an_opted_out_node_is_ignored_and_reported(client, rem_worker, k8s, names, kubeconfig_path,
                                                                       monkeypatch):  # fmt: skip
    node = names[1]
    await k8s.seed(fleet(names[:4], labels={node: {OPT_OUT_LABEL: "false"}}))
    async with running_event_path(client, rem_worker, kubeconfig_path, monkeypatch) as (events, url):
        status, answer = await post(url, payload(node))
        assert status == 200
        (outcome,) = answer["outcomes"]
        assert outcome["status"] == "ignored" and "opted out" in outcome["detail"], outcome
        assert events.counts["ignored"] == 1 and events.recent[-1].node == node
        # Resolved alerts are ignored, not acted on.
        status, answer = await post(url, payload(names[2], status="resolved"))
        assert status == 200 and answer == {"outcomes": [], "resolved_ignored": 1}
    assert await not_started(client, node) and await not_started(client, names[2])


async def test_a_request_without_the_token_is_refused(client, rem_worker, k8s, names, kubeconfig_path, monkeypatch):
    node = names[2]
    await k8s.seed(fleet(names[:4]))
    async with running_event_path(client, rem_worker, kubeconfig_path, monkeypatch) as (events, url):
        assert (await post(url, payload(node), token=None))[0] == 401
        assert (await post(url, payload(node), token="guessed"))[0] == 401
        status, answer = await post(url, {"version": "3", "alerts": []})
        assert status == 400 and any(p.startswith("version:") for p in answer["problems"]), answer
    assert await not_started(client, node)
    assert not events.counts


async def test_a_payload_with_fields_a_newer_alertmanager_adds_is_taken(client, rem_worker, k8s, names,
                                                                          kubeconfig_path, monkeypatch):  # fmt: skip
    """Alertmanager does not retry a 4xx: a 400 for a field this receiver does not know would drop the alerts."""
    node = names[2]
    await k8s.seed(fleet(names[:4]))
    body = payload(node, status="resolved") | {"newTopLevelField": {"since": "v0.29"}}
    body["alerts"][0] |= {"silencedBy": [], "inhibitedBy": []}
    async with running_event_path(client, rem_worker, kubeconfig_path, monkeypatch) as (_events, url):
        status, answer = await post(url, body)
    assert status == 200 and answer == {"outcomes": [], "resolved_ignored": 1}, answer


def test_alertmanagers_models_ignore_unknown_fields_at_every_depth():
    from worker.alert_receiver import AlertmanagerPayload

    body = payload("gpu-1") | {"newTopLevelField": 1}
    body["alerts"][0] |= {"silencedBy": ["a-silence"]}
    parsed = AlertmanagerPayload.model_validate(body)
    assert parsed.alerts[0].labels["Hostname"] == "gpu-1"
    assert "newTopLevelField" not in parsed.model_dump() and "silencedBy" not in parsed.alerts[0].model_dump()


async def test_a_node_the_watch_sees_go_not_ready_is_remediated(client, rem_worker, k8s, core, hosts, names,
                                                                 kubeconfig_path, monkeypatch):  # fmt: skip
    node = names[3]
    await k8s.seed(fleet(names[:4]))
    await hosts.add(node)
    async with running_event_path(client, rem_worker, kubeconfig_path, monkeypatch, hold=1.0) as (events, _url):
        went = time.time()
        await set_condition(core, node, "Ready", "False")
        cordoned = await wait_for(lambda: cordoned_at(k8s, node), what=f"{node} cordoned", timeout=15)
        assert 1.0 <= cordoned - went < 10, f"cordoned {cordoned - went:.1f}s after NotReady (hold 1 s)"
        assert events.recent[-1].status == "started" and "NotReady" in events.recent[-1].detail
        await set_condition(core, node, "Ready", "True")  # the kubelet is back: the first step's check passes
        result = await client.get_workflow_handle_for(
            NodeRemediation.run, remediation_workflow_id("lab", node)
        ).result()
    assert result.outcome == "healthy", result


async def test_the_event_paths_remediation_power_cycles_with_the_bmc_its_settings_name(
        client, rem_worker, k8s, core, hosts, bmc_admin, names, burnin_bmcs, kubeconfig_path, monkeypatch):  # fmt: skip
    node = names[5]
    await k8s.seed(fleet(names[:6]))
    await hosts.add(node)
    bmc = BmcRef(url=burnin_bmcs.bmc_urls[node])  # credentials: the worker's default reference
    async with running_event_path(client, rem_worker, kubeconfig_path, monkeypatch, hold=1.0, bmcs={node: bmc},
                                  steps=["power-cycle"]) as (events, _url):  # fmt: skip
        await set_condition(core, node, "Ready", "False")  # only the power cycle brings it back (lab.node_power)

        async def started():
            return next((o for o in events.recent if o.node == node and o.status == "started"), None)

        outcome = await wait_for(started, what=f"{node}'s remediation started", timeout=15)
        assert outcome.bmc == f"{bmc} (the settings' bmcs)", outcome
        result = await client.get_workflow_handle_for(NodeRemediation.run, outcome.workflow_id).result()
    assert result.outcome == "healthy" and result.fixed_by == "power-cycle", result
    assert await power_resets(bmc_admin, node) == ["ForceOff", "On"]


async def test_a_condition_flapping_within_the_hold_starts_nothing(client, rem_worker, k8s, core, names,
                                                                   kubeconfig_path, monkeypatch):  # fmt: skip
    node = names[4]  # no other test of this server remediates it
    await k8s.seed(fleet(names[:5]))
    async with running_event_path(client, rem_worker, kubeconfig_path, monkeypatch, hold=3.0) as (events, _url):
        for _ in range(2):
            await set_condition(core, node, "KernelDeadlock", "True")
            await wait_for(lambda: settled((events.book["lab"][node].conditions.get("KernelDeadlock") or
                                           _Absent).status == "True"), what="the watch seeing the condition")  # fmt: skip
            await set_condition(core, node, "KernelDeadlock", "False")
        await wait_for(lambda: settled(events.counts["flapped"] == 2), what="two flaps counted")
        await asyncio.sleep(4.0)  # past the hold: nothing was left held
    assert await not_started(client, node)
    assert await cordoned_at(k8s, node) is None
    assert set(events.counts) == {"flapped"}


class _Absent:
    status = "absent"


def test_the_event_path_settings_are_checked_at_start_up(tmp_path):
    from worker.config import ConfigError, WorkerSettings

    with pytest.raises(ConfigError, match="MILLWRIGHT_FAULT_EVENTS_CLUSTERS names no cluster"):
        WorkerSettings(fault_events=True).fault_event_config()
    with pytest.raises(ConfigError, match="MILLWRIGHT_FAULT_EVENTS_TOKEN"):
        WorkerSettings(
            fault_events=True, fault_events_clusters=["lab"], fault_events_token="hunter2"
        ).fault_event_config()
    bad = tmp_path / "events.json"
    bad.write_text('{"hold": 5, "checks": {"ready": true, "not_ready_grase": 1}}')
    with pytest.raises(ConfigError, match=r"checks\.not_ready_grase: Extra inputs are not permitted"):
        WorkerSettings(fault_events_clusters=["lab"], fault_events_settings=str(bad)).fault_event_config()
    bad.write_text('{"hold": 3, "min_healthy": {"count": 2}}')
    settings, token = WorkerSettings(fault_events_clusters=["lab"], fault_events_settings=str(bad),
                                     fault_events_token="env:AM_TOKEN").fault_event_config()  # fmt: skip
    assert settings.hold == timedelta(seconds=3) and settings.min_healthy.count == 2 and str(token) == "env:AM_TOKEN"


async def test_the_worker_process_runs_the_event_path_as_deployed(client, temporal_address, k8s, names,
                                                                  kubeconfig_path, tmp_path):  # fmt: skip
    import signal
    import uuid

    from lab.loopback import free_port
    from tests.worker_process import spawn_worker, stop_worker, wait_polling, worker_env

    await k8s.seed(fleet(names[:4]))
    port, queue = free_port(), f"events-{uuid.uuid4().hex[:8]}"
    (tmp_path / "token").write_text(TOKEN + "\n")
    env = worker_env(tmp_path, temporal_address, kubeconfig_path, MILLWRIGHT_TASK_QUEUE=queue,
                     MILLWRIGHT_FAULT_EVENTS="true", MILLWRIGHT_FAULT_EVENTS_CLUSTERS='["lab"]',
                     MILLWRIGHT_FAULT_EVENTS_TOKEN=f"file:{tmp_path / 'token'}",
                     MILLWRIGHT_FAULT_EVENTS_HOST="127.0.0.1", MILLWRIGHT_FAULT_EVENTS_PORT=str(port))  # fmt: skip
    log = tmp_path / "worker.log"
    proc = spawn_worker(env, log)
    try:
        await wait_polling(client, queue, proc, log)
        url = f"http://127.0.0.1:{port}"

        async def listed():
            async with aiohttp.ClientSession() as http, http.get(f"{url}/healthz") as resp:
                body = await resp.json()
            return body if body["nodes"].get("lab") == 4 and body["watches"]["lab"] else None

        await wait_for(listed, what="the worker's watch listing the 4 nodes")
        assert (await post(url, payload(names[0]), token=None))[0] == 401
        status, answer = await post(url, payload(names[0], status="resolved"))
        assert status == 200 and answer["resolved_ignored"] == 1
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(proc.wait, 30) == 0, log.read_text()
    finally:
        stop_worker(proc)
    assert f"Alertmanager receiver on port {port}" in log.read_text()


@pytest.mark.parametrize(
    "labels, node",
    [
        ({"node": "gpu-1", "Hostname": "other", "instance": "10.0.0.1:9400"}, "gpu-1"),
        ({"Hostname": "gpu-2", "hostname": "other"}, "gpu-2"),
        ({"hostname": "gpu-3", "instance": "other:9400"}, "gpu-3"),
        ({"instance": "gpu-4:9400"}, "gpu-4"),
        ({"instance": "gpu-5"}, "gpu-5"),
        ({"alertname": "GpuXid"}, None),
    ],
)
def test_an_alert_names_its_node_by_the_documented_labels_in_order(labels, node):
    from worker.alert_receiver import Alert, alert_node

    assert alert_node(Alert(status="firing", labels=labels)) == node


async def test_a_sick_domain_gets_one_rack_remediation_and_a_lone_fault_its_node_remediation(
        client, rack_worker, k8s, core, names, kubeconfig_path, monkeypatch):  # fmt: skip
    """Two racks of four: three nodes of rack-east go GpuHealthy=False with their clique label gone at once, one node of
    rack-west alone; then the fourth node of rack-east, while the rack's run runs."""
    where = await seed_racks(k8s, names)
    rack_a, rack_b = ([n for n, r in where.items() if r == rack] for rack in ("rack-east", "rack-west"))
    since = datetime.now(UTC)
    rack_id = rack_workflow_id("lab", "rack-east")
    # Four of eight nodes sick: min_healthy (51 %) would refuse them all; this test is about escalation.
    async with running_event_path(client, rack_worker, kubeconfig_path, monkeypatch, hold=2.0,
                                  min_healthy={"percent": 0}, require_approval_for=["restart-gpu-services"],
                                  approval_timeout=3600) as (events, _url):  # fmt: skip
        try:
            for node in rack_a[:3]:
                await core.patch_node(node, {"metadata": {"labels": {CLIQUE_LABEL: None}}})
            for node in [*rack_a[:3], rack_b[0]]:
                await set_condition(core, node, "GpuHealthy", "False")

            def outcome_of(node: str):
                return next((o for o in events.recent if o.node == node), None)

            async def decided():
                return all(outcome_of(n) for n in [*rack_a[:3], rack_b[0]])

            await wait_for(decided, what="the four faults decided", timeout=30)
            seen = {n: outcome_of(n) for n in rack_a[:3]}
            assert {o.workflow_id for o in seen.values()} == {rack_id}, seen
            assert {o.status for o in seen.values()} <= {"escalated", "already-running"}, seen
            (starter,) = [o for o in seen.values() if o.detail.startswith(f"started {rack_id}")]
            assert starter.status == "escalated"
            assert starter.detail == (f"started {rack_id}: 3 of 4 nodes unhealthy (share 0.5); fabric fault: clique "
                                      f"label gone from 3 nodes")  # fmt: skip
            lone = outcome_of(rack_b[0])
            assert lone.status == "started" and lone.workflow_id == remediation_workflow_id("lab", rack_b[0]), lone

            # Exactly what was started: one RackRemediation of rack-east, no NodeRemediation of its nodes.
            rack_run = client.get_workflow_handle(rack_id)
            started = await rack_run.query(RackStandIn.started_with)
            assert started.domain == "rack-east" and started.cluster == "lab" and started.reason in starter.detail
            assert started.node_remediation.require_approval_for == ["restart-gpu-services"]
            assert await started_since(client, rack_id, since)
            for node in rack_a:
                assert not await started_since(client, remediation_workflow_id("lab", node), since), node

            # A fault of the fourth node while the rack's run runs starts nothing new.
            await set_condition(core, rack_a[3], "GpuHealthy", "False")
            fourth = await wait_for(lambda: settled(outcome_of(rack_a[3])), what="the fourth fault decided")
            assert fourth.status == "escalated" and fourth.workflow_id == rack_id, fourth
            assert fourth.detail == f"its domain is remediated whole by {rack_id}"
            assert not await started_since(client, remediation_workflow_id("lab", rack_a[3]), since)
            assert events.counts["escalated"] >= 2
        finally:
            with contextlib.suppress(Exception):  # ended now: the tests' worker goes with the test
                await client.get_workflow_handle(rack_id).terminate("test over")
            await stop_remediation(client, "lab", rack_b[0])
