"""bench/remediation.py's lower bound: a fault the node watch sees is cordoned no sooner than the event path's hold,
checked against the real watch and hold with the cordon written at once (no workflow, no worker)."""

from __future__ import annotations

import math
import time
from datetime import timedelta

import aiohttp
import pytest
import yaml

from activities.kube.connector import ClusterConnector
from bench.remediation import cordon_bound, set_condition
from lab.k8s.admin import EmulatorAdmin, kubeconfig
from tests.kube_helpers import checked_emulator, wait_for
from tests.lab.labtest_helpers import node
from worker.alert_receiver import event_path
from worker.fault_events import FaultEvents, FaultEventSettings
from workflows.remediation.policy import HealthChecks

HOLD = 0.5


def test_the_watchs_faults_are_bound_by_the_hold(capsys):
    assert cordon_bound([2.1, 2.4, 2.0], 2.0)[1:] == (pytest.approx(1.2), 0)
    assert cordon_bound([1.99], 2.0)[1:] == (pytest.approx(0.995), 1)
    assert "bench error: fault-to-cordon p95 (the watch's faults) ratio 0.995 < 1.00" in capsys.readouterr().out
    # Nothing cordoned, or no hold (an alert's, by default): no bound to compare with, no error.
    assert all(math.isnan(x) for x in cordon_bound([], 2.0)[:2]) and cordon_bound([], 2.0)[2] == 0
    assert math.isnan(cordon_bound([0.3], 0.0)[1]) and cordon_bound([0.3], 0.0)[2] == 0


async def cordoned_at(admin: EmulatorAdmin, name: str) -> float | None:
    """When the audit log first shows `name` cordoned, as the bench reads it."""
    for entry in await admin.audit(writes=True):
        if entry.get("resource") == "nodes" and entry.get("name") == name and \
                entry.get("nodeAfter", {}).get("unschedulable"):  # fmt: skip
            return entry["time"]
    return None


async def test_a_watched_fault_is_cordoned_no_sooner_than_the_hold(tmp_path):
    """NotReady written as the bench writes it, seen by the worker's node watch and held by `FaultEvents`, then
    cordoned the moment the hold ends (its start of a remediation replaced by the cordon itself): the fault to
    cordon, as the bench measures it, can only be longer than the hold the settings give."""
    settings = FaultEventSettings(hold=timedelta(seconds=HOLD), checks=HealthChecks(host_agent=False, bmc=False))
    kube = tmp_path / "kubeconfig"
    with checked_emulator(tmp_path, pod_start_seconds=0.1) as emulator:
        kube.write_text(yaml.safe_dump(kubeconfig(emulator.url, "lab")))
        connector = ClusterConnector([str(kube)])
        admin = EmulatorAdmin(emulator.url)
        events = FaultEvents(None, connector, "unused", settings, ["lab"])  # its remediation starts are replaced below
        async with aiohttp.ClientSession() as http:

            async def cordon(cluster: str, name: str, source: str, reported: list[str]) -> None:
                async with http.patch(f"{emulator.url}/api/v1/nodes/{name}", json={"spec": {"unschedulable": True}},
                                      headers={"Content-Type": "application/merge-patch+json"}) as resp:  # fmt: skip
                    resp.raise_for_status()

            events._act = cordon
            try:
                await admin.seed([node("n1")])
                async with event_path(events, connector, None, "127.0.0.1", 0):
                    await wait_for(lambda: _listed(events), what="the watch's first list", interval=0.05)
                    faulted = time.time()
                    await set_condition(emulator.url, "n1", "Ready", "False", http)
                    cordoned = await wait_for(lambda: cordoned_at(admin, "n1"), what="n1 cordoned", interval=0.05)
            finally:
                await admin.aclose()
                await connector.close()
    took = cordoned - faulted
    assert took >= settings.hold.total_seconds(), f"cordoned {took:.3f} s after the fault, under the {HOLD} s hold"


async def _listed(events: FaultEvents) -> bool:
    return "n1" in events.book["lab"]
