"""Remediation tier: the real dev server, the Kubernetes emulator, the lab BMCs with LabHosts (the real host agent
over simulated GPUs for every powered-on server; both from tests/workflows/burnin), the lab webhook receiver, and a worker
with a recording NetBox fake (the real NetBox is exercised by tests/activities/netbox).

A node is named as the lab server playing it (host agent queue and BMC line up). Each test leaves no remediation
running, so the node-derived workflow IDs (``remediation/lab/<node>``) are free for the next test.
"""

from __future__ import annotations

import contextlib
import uuid
from typing import Any

import pytest
import pytest_asyncio
from temporalio import activity

from activities.netbox.models import (
    DeviceInfo,
    DeviceLookup,
    DeviceQuery,
    DeviceTags,
    DeviceTagsRequest,
    FoundDevice,
    SetStatusRequest,
    StatusChange,
)
from tests.workflows.burnin import conftest as _burnin

# The burn-in tier's lab, reused (not redefined): 8 lab BMCs, their admin API reset per test, and LabHosts running
# the real host agent over simulated GPUs for every powered-on server.
burnin_bmcs = _burnin.burnin_bmcs
bmc_secret_file = _burnin.bmc_secret_file
bmc_admin = _burnin.bmc_admin
lab_hosts = _burnin.lab_hosts
__all__ = ["bmc_admin", "bmc_secret_file", "burnin_bmcs", "lab_hosts"]


@pytest.fixture(scope="session")
def webhook_receiver():
    from lab.webhook import WebhookReceiver

    with WebhookReceiver() as hook:
        yield hook


@pytest_asyncio.fixture(loop_scope="session")
async def webhook(webhook_receiver):
    from lab.webhook import WebhookAdmin

    admin = WebhookAdmin(webhook_receiver.url)
    await admin.reset()
    yield admin
    await admin.aclose()


# ---------------------------------------------------------------- NetBox, recorded


class FakeNetBox:
    """The NetBox activities remediation uses, recording what they were asked."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.devices: dict[str, DeviceInfo] = {}

    @activity.defn(name="set_device_status")
    async def set_device_status(self, req: SetStatusRequest) -> StatusChange:
        self.calls.append(("set_device_status", req))
        return StatusChange(device=req.device.name or "", previous="active", status=req.status, changed=True,
                            journal_entry_id=len(self.calls), journal_created=True)  # fmt: skip

    @activity.defn(name="set_device_tags")
    async def set_device_tags(self, req: DeviceTagsRequest) -> DeviceTags:
        self.calls.append(("set_device_tags", req))
        return DeviceTags(device=req.device.name or "", tags=sorted(req.add), changed=True)

    @activity.defn(name="find_device")
    async def find_device(self, lookup: DeviceLookup) -> FoundDevice:
        return FoundDevice(device=self.devices.get(lookup.name or ""))

    @activity.defn(name="list_devices")
    async def list_devices(self, query: DeviceQuery) -> list[DeviceInfo]:
        return list(self.devices.values())


@pytest.fixture
def netbox() -> FakeNetBox:
    return FakeNetBox()


@pytest_asyncio.fixture(loop_scope="session")
async def rem_worker(client, kubeconfig_path, netbox, bmc_secret_file, prometheus):
    """A worker on a fresh queue: every workflow, Kubernetes, node health, Redfish, webhook, entity and Prometheus
    activities (the lab's Prometheus as its MILLWRIGHT_PROMETHEUS_URL), and the NetBox fake."""
    async with remediation_worker(client, kubeconfig_path, netbox, bmc_secret_file, prometheus) as worker:
        yield worker


@pytest_asyncio.fixture(loop_scope="session")
async def rack_worker(client, kubeconfig_path, netbox, bmc_secret_file, prometheus):
    """`rem_worker` with a stand-in RackRemediation (tests/workflows/remediation/rack_stand_in.py) in the real one's
    place: the escalation tests see exactly what the sweep or the event path started."""
    from tests.workflows.remediation.rack_stand_in import RackStandIn

    async with remediation_worker(client, kubeconfig_path, netbox, bmc_secret_file, prometheus,
                                  stand_ins=[RackStandIn]) as worker:  # fmt: skip
        yield worker


@contextlib.asynccontextmanager
async def remediation_worker(client, kubeconfig_path, netbox, bmc_secret_file, prometheus, node_health=None,
                             stand_ins=()):  # fmt: skip
    """`rem_worker`'s worker; `node_health`: builds the node-health activities from the connector instead of
    NodeHealthActivities (a test's held reads); `stand_ins`: workflows registered in place of the catalog's of the
    same name."""
    from temporalio.workflow import _Definition

    from activities.entities import EntityActivities
    from activities.kube.activities import KubeActivities
    from activities.kube.connector import ClusterConnector
    from activities.node_health import NodeHealthActivities
    from activities.notify import NotifyActivities
    from activities.prometheus import PrometheusActivities
    from activities.redfish import RedfishActivities
    from activities.registration import activities_of
    from activities.support.secrets import SecretRef
    from worker import registry
    from workflows.budget.disruption_budget import DisruptionBudget
    from workflows.catalog import WORKFLOWS

    connector = ClusterConnector([str(kubeconfig_path)])
    prometheus_activities = PrometheusActivities(url=prometheus.url)
    replaced = {_Definition.must_from_class(w).name for w in stand_ins}
    workflows = [w for w in WORKFLOWS if _Definition.must_from_class(w).name not in replaced] + list(stand_ins)
    workflows += [DisruptionBudget] if DisruptionBudget not in workflows else []
    registration = registry.Registration(
        workflows=workflows,
        activities=activities_of(KubeActivities(connector), (node_health or NodeHealthActivities)(connector),
                                 RedfishActivities(SecretRef.parse(f"file:{bmc_secret_file}")), NotifyActivities(),
                                 EntityActivities(), netbox, prometheus_activities),
        resources=[connector, prometheus_activities],
    )  # fmt: skip
    async with registry.new_worker(client, registration, f"rem-{uuid.uuid4().hex[:8]}") as worker:
        yield worker
    await registration.close()


# ---------------------------------------------------------------- hosts: BMC power -> Kubernetes node


class Hosts:
    """The lab servers playing this test's nodes (a node is named as its server).

    `add` sets a server's GPU faults and powers it on, so LabHosts runs its host agent; lab.node_power reflects
    later power changes (the remediation's power cycle) on the Kubernetes node: NotReady while off, a new boot ID
    at power-on. With `reboot_fixes` the reboot clears the server's GPU faults (what it repaired in this test)."""

    def __init__(self, bmc_admin, lab_hosts, core) -> None:
        from lab.node_power import NodePowerLink

        self.bmc_admin, self.lab_hosts = bmc_admin, lab_hosts
        self.reboot_fixes: dict[str, bool] = {}
        self.link = NodePowerLink(bmc_admin, core, [], on_boot=self._booted)

    async def _booted(self, node: str) -> None:
        if self.reboot_fixes.get(node):
            await self.bmc_admin.set_gpu_faults(node, {})

    @property
    def reboots(self) -> dict[str, int]:
        return self.link.reboots

    async def add(self, node: str, faults: dict | None = None, *, reboot_fixes: bool = False, agent: bool = True):
        if faults:
            await self.bmc_admin.set_gpu_faults(node, faults)
        if agent:
            await self.bmc_admin.power(node, "On")
            await self.lab_hosts.wait_running(node)
        self.reboot_fixes[node] = reboot_fixes
        self.link.follow(node)
        await self.link.poll_once(first=True)  # what is now is the starting point, not a change
        return self.lab_hosts.probe(node)


@pytest_asyncio.fixture(loop_scope="session")
async def hosts(bmc_admin, lab_hosts, core):
    h = Hosts(bmc_admin, lab_hosts, core)
    async with h.link:
        yield h


@pytest.fixture
def names(burnin_bmcs) -> list[str]:
    """The node names a test may use: the lab servers' names."""
    return list(burnin_bmcs.names)
