"""Answers of the systems Millwright reads (Kubernetes, Redfish, UFM, NetBox, Ironic, Prometheus) with a field a
newer release adds, at the top and nested: read as before, the new field ignored (activities/models.py; the
Alertmanager payload's case is in tests/workflows/remediation/test_fault_events.py). Each goes through the function
its activity reads that system's JSON with."""

from __future__ import annotations

from typing import Any

NEW = {"addedInANewerRelease": {"nested": True}}


def test_a_kubernetes_node_with_new_fields():
    from activities.node_health import node_health

    node = {"apiVersion": "v1", "kind": "Node", **NEW,
            "metadata": {"name": "gpu-1", "labels": {"nvidia.com/gpu.health": "ok"}, **NEW},
            "spec": {"unschedulable": True, **NEW},
            "status": {"conditions": [{"type": "Ready", "status": "False", "reason": "KubeletDown", **NEW},
                                      {"type": "KernelDeadlock", "status": "True", **NEW}],
                       "nodeInfo": {"bootID": "b-1", **NEW}}}  # fmt: skip
    health = node_health(node, ["KernelDeadlock"], ["nvidia.com/gpu.health"])
    assert (health.name, health.ready, health.unschedulable, health.boot_id) == ("gpu-1", False, True, "b-1")
    assert health.conditions["KernelDeadlock"].status == "True" and health.labels == {"nvidia.com/gpu.health": "ok"}


def test_a_redfish_log_with_new_fields():
    from activities.redfish import _sel

    class Talk:
        def json(self, path: str) -> dict[str, Any]:
            return {"Members": [{"Id": "7", "Severity": "Critical", "Message": "GPU3 fell off the bus",
                                 "MessageId": "Base.1.0.x", "Oem": {"Vendor": {"new": 1}}, **NEW}], **NEW}  # fmt: skip

    report = _sel(Talk(), "/redfish/v1/Systems/1/LogServices/SEL/Entries")
    assert [(e.id, e.severity, e.message) for e in report.entries] == [("7", "Critical", "GPU3 fell off the bus")]


def test_a_ufm_pkey_with_new_fields():
    from activities.ufm.pkeys import pkey_members

    body = {"partition": "tenant-a", "ip_over_ib": True, **NEW,
            "guids": [{"guid": "0x0002C90300A1B2C3", "membership": "limited", "index0": False, **NEW}]}  # fmt: skip
    members = pkey_members("0x8001", body)
    assert members.exists and members.partition == "tenant-a"
    assert list(members.members.values()) == ["limited"]


def test_a_netbox_device_with_new_fields():
    from activities.netbox.client import device_info

    record = {"id": 4, "name": "gpu-1", "serial": "S1", "status": {"value": "active", "label": "Active", **NEW},
              "role": {"slug": "gpu-server", **NEW}, "tags": [{"slug": "t", **NEW}], "custom_fields": {}, **NEW}  # fmt: skip
    info = device_info(record)
    assert (info.id, info.name, info.status, info.role, info.tags) == (4, "gpu-1", "active", "gpu-server", ["t"])


def test_an_ironic_node_with_new_fields():
    from activities.ironic.models import IronicNode

    node = IronicNode.from_api({"uuid": "u-1", "name": "gpu-1", "provision_state": "manageable",
                                "power_state": "power on", "parent_node": None, **NEW})  # fmt: skip
    assert (node.uuid, node.provision_state, node.power_state) == ("u-1", "manageable", "power on")


async def test_a_prometheus_vector_with_new_fields(monkeypatch):
    from activities.prometheus import DcgmFaultsQuery, PrometheusActivities

    prometheus = PrometheusActivities(url="http://prometheus.invalid:9090")
    sample = {"metric": {"__name__": "DCGM_FI_DEV_XID_ERRORS", "Hostname": "gpu-1", "gpu": "3", **NEW},
              "value": [1764892800.0, "79"], "histogram": None, **NEW}  # fmt: skip

    async def instant(_query: Any) -> tuple[str, Any]:
        return "vector", [sample]

    monkeypatch.setattr(prometheus, "_instant", instant)
    faults = await prometheus.dcgm_faults(DcgmFaultsQuery(cluster="lab", nodes=["gpu-1"]))
    assert [(f.node, f.metric, f.value, f.gpu) for f in faults.faults] == [
        ("gpu-1", "DCGM_FI_DEV_XID_ERRORS", 79.0, "3")
    ]
