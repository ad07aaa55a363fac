"""The emulator's mig-manager (lab/k8s/controllers/migmanager.py): the state label's walk with and without a reboot,
what the node advertises per layout and GPU model under both device plugin strategies, failures (set for a node,
an unknown config, a profile the GPU lacks), GPU pods on a node being reconfigured, the audit of label changes, and
real kubectl driving it."""

from __future__ import annotations

import time

import pytest
import yaml

from lab.k8s import mig
from lab.k8s.admin import EmulatorAdmin
from lab.k8s.controllers.migmanager import POD_FAILURE_REASON
from lab.k8s.server import load_config_file
from labtest_helpers import node, running_pod, wait_for

H100 = "NVIDIA-H100-80GB-HBM3"
A100_40 = "NVIDIA-A100-SXM4-40GB"
PENDING = 0.05


def gpu_node(name: str = "g1", product: str = H100, gpus: int = 8) -> dict:
    return node(name, gpus=gpus, labels={mig.PRODUCT_LABEL: product, "nvidia.com/gpu.count": str(gpus)})


def gpu_pod(name: str, node_name: str = "g1", resource: str = "nvidia.com/gpu", count: str = "1") -> dict:
    pod = running_pod(name, node_name=node_name)
    pod["spec"]["containers"][0]["resources"] = {"limits": {resource: count}, "requests": {resource: count}}
    return pod


@pytest.fixture
def mlab(lab):
    lab.configure(migPendingSeconds=PENDING, rebootSeconds=0.3)
    return lab


def relabel(core, name: str, config: str | None) -> None:
    core.patch_node(name, {"metadata": {"labels": {mig.CONFIG_LABEL: config}}})


def settled(core, name: str, config: str, state: str = "success", timeout: float = 10.0) -> dict:
    """The node once mig-manager finished acting on `config` (its hardware record says it observed it)."""

    def done():
        n = core.read_node(name).to_dict()
        md = n["metadata"]
        observed = mig.hardware({"metadata": md, "status": {}}).get("observed")
        return n if observed == config and (md["labels"] or {}).get(mig.STATE_LABEL) == state else None

    return wait_for(done, timeout=timeout, what=f"{name} {config} {state}")


def gpu_capacity(n: dict) -> dict[str, str]:
    return {k: v for k, v in n["status"]["capacity"].items() if mig.is_gpu_resource(k)}


def states(lab, name: str, since: int = 0) -> list[str]:
    """The state label values mig-manager wrote on the node, in order."""
    out = []
    for e in lab.audit(since=since, writes=True):
        if e["resource"] == "nodes" and e["name"] == name and e["userAgent"] == "lab-controller/nvidia-mig-manager":
            out += [c["new"] for c in e["changes"] if c["path"] == ".metadata.labels." + mig.STATE_LABEL]
    return out


def test_reconfigure_without_reboot(mlab, core):
    mlab.seed([gpu_node()])
    relabel(core, "g1", "all-1g.10gb")
    n = settled(core, "g1", "all-1g.10gb")
    assert states(mlab, "g1") == ["pending", "success"]
    assert gpu_capacity(n) == {"nvidia.com/gpu": "0", "nvidia.com/mig-1g.10gb": "56"}
    assert n["status"]["allocatable"]["nvidia.com/mig-1g.10gb"] == "56"
    labels = n["metadata"]["labels"]
    assert labels[mig.STRATEGY_LABEL] == "mixed" and labels[mig.CAPABLE_LABEL] == "true"
    assert labels["nvidia.com/mig-1g.10gb.count"] == "56" and labels["nvidia.com/gpu.count"] == "8"
    assert labels["nvidia.com/mig-1g.10gb.product"] == f"{H100}-MIG-1g.10gb"
    writes = [e for e in mlab.audit(writes=True) if e["resource"] == "nodes"]
    pending = next(e for e in writes if "pending" in str(e["changes"]))
    success = next(e for e in writes if "success" in str(e["changes"]))
    assert success["time"] - pending["time"] >= PENDING * 0.9
    assert not any((e.get("nodeAfter") or {}).get("ready") is False for e in writes)  # no reboot

    relabel(core, "g1", "all-disabled")
    n = settled(core, "g1", "all-disabled")
    assert gpu_capacity(n) == {"nvidia.com/gpu": "8"}
    assert not [k for k in n["metadata"]["labels"] if k.startswith(mig.MIG_RESOURCE_PREFIX)]


def test_reconfigure_with_reboot_only_when_the_mode_changes(mlab, core):
    mlab.configure(migReboot=True)
    mlab.seed([gpu_node()])
    relabel(core, "g1", "all-1g.10gb")
    n = settled(core, "g1", "all-1g.10gb")
    assert states(mlab, "g1") == ["pending", "rebooting", "success"]
    assert n["status"]["node_info"]["boot_id"] != "boot-g1"
    went_down = [e for e in mlab.audit(writes=True) if (e.get("nodeAfter") or {}).get("ready") is False]
    assert [e["name"] for e in went_down] == ["g1"]
    assert gpu_capacity(n)["nvidia.com/mig-1g.10gb"] == "56"

    cursor = mlab.audit(writes=True)[-1]["seq"]  # MIG stays on: no mode change, no reboot
    relabel(core, "g1", "all-3g.40gb")
    settled(core, "g1", "all-3g.40gb")
    assert states(mlab, "g1", cursor) == ["pending", "success"]


def test_reboot_set_per_node(mlab, core):
    mlab.seed([gpu_node("g1"), gpu_node("g2")])
    mlab.post("/_lab/mig", {"node": "g2", "reboot": True})
    relabel(core, "g1", "all-balanced")
    relabel(core, "g2", "all-balanced")
    settled(core, "g1", "all-balanced")
    settled(core, "g2", "all-balanced")
    assert states(mlab, "g1") == ["pending", "success"]
    assert states(mlab, "g2") == ["pending", "rebooting", "success"]


def test_a_node_without_mig_manager_and_one_slow_to_apply(mlab, core):
    mlab.seed([gpu_node("g1"), gpu_node("g2")])
    mlab.post("/_lab/mig", {"node": "g1", "absent": True})
    mlab.post("/_lab/mig", {"node": "g2", "pendingSeconds": 1.0})
    relabel(core, "g1", "all-1g.10gb")
    relabel(core, "g2", "all-1g.10gb")
    wait_for(lambda: core.read_node("g2").metadata.labels.get(mig.STATE_LABEL) == "pending", what="g2 pending")
    time.sleep(0.5)
    assert core.read_node("g2").metadata.labels[mig.STATE_LABEL] == "pending"
    settled(core, "g2", "all-1g.10gb")
    assert mig.STATE_LABEL not in core.read_node("g1").metadata.labels
    mlab.post("/_lab/mig", {"node": "g1", "absent": None})  # mig-manager starts there: it acts on the label
    settled(core, "g1", "all-1g.10gb")


@pytest.mark.parametrize(
    "product,config,expected",
    [
        (H100, "all-1g.10gb", {"nvidia.com/mig-1g.10gb": "56"}),
        (H100, "all-1g.10gb.me", {"nvidia.com/mig-1g.10gb.me": "8"}),
        (H100, "all-3g.40gb", {"nvidia.com/mig-3g.40gb": "16"}),
        (H100, "all-7g.80gb", {"nvidia.com/mig-7g.80gb": "8"}),
        (H100, "all-balanced",
         {"nvidia.com/mig-1g.10gb": "16", "nvidia.com/mig-2g.20gb": "8", "nvidia.com/mig-3g.40gb": "8"}),
        (H100, "all-enabled", {}),
        (A100_40, "all-1g.5gb", {"nvidia.com/mig-1g.5gb": "56"}),
        (A100_40, "all-1g.10gb", {"nvidia.com/mig-1g.10gb": "32"}),
        (A100_40, "all-2g.10gb", {"nvidia.com/mig-2g.10gb": "24"}),
        (A100_40, "all-balanced",
         {"nvidia.com/mig-1g.5gb": "16", "nvidia.com/mig-2g.10gb": "8", "nvidia.com/mig-3g.20gb": "8"}),
    ],
)  # fmt: skip
def test_mixed_strategy_capacity_per_model(mlab, core, product, config, expected):
    mlab.seed([gpu_node(product=product)])
    relabel(core, "g1", config)
    n = settled(core, "g1", config)
    assert gpu_capacity(n) == {"nvidia.com/gpu": "0", **expected}
    counts = {k.removesuffix(".count"): v for k, v in n["metadata"]["labels"].items()
              if k.startswith(mig.MIG_RESOURCE_PREFIX) and k.endswith(".count")}  # fmt: skip
    assert counts == expected


def test_single_strategy(mlab, core):
    mlab.configure(migStrategy="single")
    mlab.seed([gpu_node(product=A100_40)])
    relabel(core, "g1", "all-1g.5gb")
    n = settled(core, "g1", "all-1g.5gb")
    assert gpu_capacity(n) == {"nvidia.com/gpu": "56"}
    labels = n["metadata"]["labels"]
    assert labels[mig.STRATEGY_LABEL] == "single" and labels[mig.PRODUCT_LABEL] == f"{A100_40}-MIG-1g.5gb"
    assert labels["nvidia.com/gpu.count"] == "56" and labels["nvidia.com/gpu.slices.gi"] == "1"
    relabel(core, "g1", "all-balanced")  # several profiles: the single strategy serves nothing
    n = settled(core, "g1", "all-balanced")
    assert gpu_capacity(n) == {"nvidia.com/gpu": "0"}
    assert n["metadata"]["labels"][mig.PRODUCT_LABEL] == f"{A100_40}-MIG-INVALID"
    relabel(core, "g1", "all-disabled")  # the model is still known under the MIG product name
    n = settled(core, "g1", "all-disabled")
    assert gpu_capacity(n) == {"nvidia.com/gpu": "8"} and n["metadata"]["labels"][mig.PRODUCT_LABEL] == A100_40


def test_failure_set_for_a_node(mlab, core):
    mlab.seed([gpu_node(), gpu_pod("trainer")])
    view = mlab.post("/_lab/mig", {"node": "g1", "fail": "lab: nvidia-mig-parted apply: GPU reset failed"})
    assert view["overrides"] == {"g1": {"fail": "lab: nvidia-mig-parted apply: GPU reset failed"}}
    relabel(core, "g1", "all-1g.10gb")
    n = settled(core, "g1", "all-1g.10gb", "failed")
    assert states(mlab, "g1") == ["pending", "failed"]
    assert n["metadata"]["annotations"][mig.FAILURE_ANNOTATION] == "lab: nvidia-mig-parted apply: GPU reset failed"
    assert gpu_capacity(n) == {"nvidia.com/gpu": "8"}  # the GPUs were not touched
    assert core.read_namespaced_pod("trainer", "default").status.phase == "Running"

    mlab.post("/_lab/mig", {"node": "g1", "fail": None})
    relabel(core, "g1", "all-1g.10gb")  # the same value again is no change: mig-manager does not retry
    relabel(core, "g1", None)  # removed and set again: a new change, tried again
    wait_for(lambda: mig.hardware(core.read_node("g1").to_dict())["observed"] is None, what="label removal seen")
    relabel(core, "g1", "all-1g.10gb")
    settled(core, "g1", "all-1g.10gb")
    assert states(mlab, "g1") == ["pending", "failed", "pending", "success"]
    relabel(core, "g1", "all-7g.80gb")
    n = settled(core, "g1", "all-7g.80gb")
    assert mig.FAILURE_ANNOTATION not in (n["metadata"]["annotations"] or {})
    assert mlab.http.get("/_lab/mig").json()["overrides"] == {}


def test_failure_after_a_reboot(mlab, core):
    mlab.seed([gpu_node()])
    mlab.post("/_lab/mig", {"node": "g1", "fail": "MIG mode change did not take effect after rebooting",
                            "reboot": True})  # fmt: skip
    relabel(core, "g1", "all-1g.10gb")
    n = settled(core, "g1", "all-1g.10gb", "failed")
    assert states(mlab, "g1") == ["pending", "rebooting", "failed"]
    assert n["metadata"]["annotations"][mig.FAILURE_ANNOTATION].endswith("after rebooting")


@pytest.mark.parametrize(
    "product,config,reason",
    [
        (H100, "all-2g.bogus", "'all-2g.bogus' has no entry for A100-80GB/H100-80GB"),
        (H100, "half-and-half", "unknown MIG config 'half-and-half'"),
        (A100_40, "all-7g.80gb", "no entry for A100-40GB"),
        ("NVIDIA-L40S", "all-1g.10gb", "NVIDIA-L40S does not support MIG"),
    ],
)
def test_config_the_node_cannot_take_fails(mlab, core, product, config, reason):
    mlab.seed([gpu_node(product=product)])
    relabel(core, "g1", config)
    n = settled(core, "g1", config, "failed")
    assert reason in n["metadata"]["annotations"][mig.FAILURE_ANNOTATION]
    assert gpu_capacity(n) == {"nvidia.com/gpu": "8"}
    relabel(core, "g1", "all-disabled")  # back to the layout it has: success at once
    n = settled(core, "g1", "all-disabled")
    assert mig.FAILURE_ANNOTATION not in (n["metadata"]["annotations"] or {})


def test_gpu_pods_on_a_reconfigured_node_fail_and_the_audit_says_so(mlab, core):
    mlab.seed([gpu_node(), gpu_node("g2"), gpu_pod("trainer"), running_pod("cpu-only", node_name="g1")])
    relabel(core, "g2", "all-1g.10gb")  # drained first: no GPU pod there
    relabel(core, "g1", "all-1g.10gb")
    settled(core, "g1", "all-1g.10gb")
    trainer = core.read_namespaced_pod("trainer", "default").status
    assert trainer.phase == "Failed" and trainer.reason == POD_FAILURE_REASON
    assert "nvidia.com/gpu. Requested: 1, Available: 0" in trainer.message
    assert core.read_namespaced_pod("cpu-only", "default").status.phase == "Running"
    changes = mig.config_changes(mlab.audit(writes=True))
    assert [(c["node"], c["from"], c["to"], c["gpuPods"]) for c in changes] == [
        ("g2", None, "all-1g.10gb", []),
        ("g1", None, "all-1g.10gb", ["default/trainer"]),
    ]

    mlab.seed([gpu_pod("inference", resource="nvidia.com/mig-1g.10gb", count="2")])
    relabel(core, "g1", "all-disabled")
    settled(core, "g1", "all-disabled")
    status = core.read_namespaced_pod("inference", "default").status
    assert status.phase == "Failed" and "nvidia.com/mig-1g.10gb. Requested: 2" in status.message


def test_scheduler_places_mig_device_requests(mlab, core, api_client):
    from kubernetes import client

    mlab.seed([gpu_node("g1"), gpu_node("g2")])
    relabel(core, "g2", "all-3g.40gb")
    settled(core, "g2", "all-3g.40gb")
    labels = {"app": "infer"}
    tmpl = {"metadata": {"labels": labels}, "spec": {"containers": [{"name": "c", "image": "x", "resources": {
        "limits": {"nvidia.com/mig-3g.40gb": "8"}}}]}}  # fmt: skip
    client.AppsV1Api(api_client).create_namespaced_replica_set(
        "default", {"metadata": {"name": "infer"}, "spec": {"replicas": 3, "selector": {"matchLabels": labels},
                                                            "template": tmpl}})  # fmt: skip

    def placed():
        pods = core.list_namespaced_pod("default", label_selector="app=infer").items
        return pods if len(pods) == 3 and all(p.spec.node_name or p.status.conditions for p in pods) else None

    pods = wait_for(placed, what="the scheduler's decisions")
    assert sorted(p.spec.node_name or "" for p in pods) == ["", "g2", "g2"]  # 16 devices: two pods of 8


def test_dcgm_exporter_still_sees_a_partitioned_node(mlab, core):
    mlab.seed([gpu_node()])
    relabel(core, "g1", "all-1g.10gb")
    settled(core, "g1", "all-1g.10gb")
    assert [t["labels"]["node"] for t in mlab.http.get("/_lab/dcgm/targets").json()] == ["g1"]
    metrics = mlab.http.get("/_lab/dcgm/nodes/g1/metrics").text
    assert 'gpu="7"' in metrics and 'modelName="NVIDIA H100 80GB HBM3"' in metrics


@pytest.mark.parametrize(
    "body,message",
    [
        ({"fail": "x"}, 'expected {"node"'),
        ({"node": "g1", "fail": ""}, "body.fail: a non-empty reason"),
        ({"node": "g1", "reboot": "yes"}, "body.reboot: true, false or null"),
        ({"node": "g1", "times": 2}, "unknown fields ['times']"),
        ({"node": "g1", "pendingSeconds": -1}, "body.pendingSeconds: seconds (0 or more)"),
        ({"node": "g1", "absent": 1}, "body.absent: true, false or null"),
    ],
)
def test_admin_refuses_a_bad_node_setting(mlab, body, message):
    r = mlab.http.post("/_lab/mig", json=body)
    assert r.status_code == 400 and message in r.json()["message"]


def test_config_keys_are_checked(mlab):
    r = mlab.http.post("/_lab/config", json={"migStrategy": "none"})
    assert r.status_code == 400 and "migStrategy: one of single, mixed" in r.json()["message"]
    r = mlab.http.post("/_lab/config", json={"migNodes": {"g1": {"fail": 3}}})
    assert r.status_code == 400 and "migNodes.g1.fail" in r.json()["message"]
    assert mlab.configure(migNodes={"g1": {"reboot": False}})["migNodes"] == {"g1": {"reboot": False}}


def test_fleet_file_carries_mig_settings(tmp_path):
    f = tmp_path / "fleet.yaml"
    f.write_text(yaml.safe_dump({"nodes": [{"prefix": "n", "count": 1}], "mig": {"strategy": "single",
                                                                                   "reboot": True}}))  # fmt: skip
    assert load_config_file(str(f)) == {"migStrategy": "single", "migPendingSeconds": 0.2, "migReboot": True,
                                        "migDra": False}  # fmt: skip
    f.write_text(yaml.safe_dump({"nodes": [], "mig": {"strategy": "none"}}))
    with pytest.raises(ValueError, match="strategy"):
        load_config_file(str(f))


async def test_admin_client_mig_calls(emulator, lab):
    admin = EmulatorAdmin(emulator.url)
    try:
        await admin.configure(migPendingSeconds=PENDING)
        await admin.seed([gpu_node()])
        cursor = await admin.audit_cursor()
        await admin.set_mig_node("g1", fail="lab: broken")
        await admin.seed([{**gpu_node(), "metadata": {**gpu_node()["metadata"], "labels": {
            **gpu_node()["metadata"]["labels"], mig.CONFIG_LABEL: "all-1g.10gb"}}}])  # fmt: skip
        view = await _wait_async(admin, lambda v: v["nodes"]["g1"]["state"] == "failed")
        assert view["nodes"]["g1"]["failure"] == "lab: broken" and view["strategy"] == "mixed"
        assert view["nodes"]["g1"]["hardware"] == {"product": H100, "gpus": 8, "applied": "all-disabled",
                                                   "observed": "all-1g.10gb"}  # fmt: skip
        assert await admin.mig_config_changes(cursor) == []  # a seed is no client write
    finally:
        await admin.aclose()


async def _wait_async(admin: EmulatorAdmin, pred, timeout: float = 10.0) -> dict:
    import asyncio
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        view = await admin.mig()
        if pred(view):
            return view
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out: {view}")


def test_dcgm_exporter_shows_gpu_instances_and_who_holds_them(mlab, core):
    mlab.seed([gpu_node(gpus=2), gpu_pod("infer", resource="nvidia.com/mig-3g.40gb", count="3")])
    relabel(core, "g1", "all-balanced")
    settled(core, "g1", "all-balanced")
    mlab.seed([gpu_pod("infer", resource="nvidia.com/mig-3g.40gb", count="1"),  # failed by the change: again
               gpu_pod("small", resource="nvidia.com/mig-1g.10gb", count="3")])  # fmt: skip
    temps = [line for line in mlab.http.get("/_lab/dcgm/nodes/g1/metrics").text.splitlines()
             if line.startswith("DCGM_FI_DEV_GPU_TEMP{")]  # fmt: skip
    assert len(temps) == 8  # 2 GPUs x (2 x 1g.10gb + 2g.20gb + 3g.40gb)
    held = sorted((t.split('gpu="')[1][0], t.split('GPU_I_PROFILE="')[1].split('"')[0], t.split('pod="')[1][:5])
                  for t in temps if 'pod="' in t)  # fmt: skip
    assert held == [("0", "1g.10gb", "small"), ("0", "1g.10gb", "small"), ("0", "3g.40gb", "infer"),
                    ("1", "1g.10gb", "small")]  # fmt: skip
    assert all('GPU_I_ID="' in t for t in temps)


def test_dra_driver_publishes_the_layout_as_a_resource_slice(mlab, core, api_client):
    from kubernetes import client

    mlab.configure(migDra=True)
    mlab.seed([gpu_node(gpus=2), gpu_node("g2", gpus=1)])
    relabel(core, "g1", "all-balanced")
    relabel(core, "g2", "all-disabled")
    settled(core, "g1", "all-balanced")
    settled(core, "g2", "all-disabled")
    dra = client.ResourceV1beta1Api(api_client)

    def slice_of(node_name: str):
        (s,) = dra.list_resource_slice(field_selector=f"spec.nodeName={node_name}").items
        return s

    s = slice_of("g1")
    assert (s.spec.driver, s.spec.pool.name, s.spec.pool.generation, s.spec.pool.resource_slice_count) == (
        "gpu.nvidia.com", "g1", 1, 1)  # fmt: skip
    assert s.metadata.owner_references[0].kind == "Node" and s.metadata.owner_references[0].name == "g1"
    assert sorted(d.name for d in s.spec.devices) == sorted(
        f"gpu-{i}-mig-{m}" for i in (0, 1) for m in ("9-4-4", "14-2-2", "19-1-1", "19-0-1"))  # fmt: skip
    profiles = sorted(d.basic.attributes["profile"].string for d in s.spec.devices)
    assert profiles == ["1g.10gb"] * 4 + ["2g.20gb"] * 2 + ["3g.40gb"] * 2
    assert all(d.basic.attributes["type"].string == "mig" for d in s.spec.devices)
    assert [d.name for d in slice_of("g2").spec.devices] == ["gpu-0"]

    relabel(core, "g1", "all-disabled")
    settled(core, "g1", "all-disabled")
    s = slice_of("g1")
    assert s.spec.pool.generation == 2 and [d.name for d in s.spec.devices] == ["gpu-0", "gpu-1"]
    assert s.spec.devices[0].basic.attributes["type"].string == "gpu"
