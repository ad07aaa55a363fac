"""The MIG profile table, what a layout makes a node advertise, and the checks before any write (pure)."""

from __future__ import annotations

import pytest

from activities.capi.models import QueueGuarantee
from activities.kube.mig import MigNode
from workflows.partitioning.layouts import known_configs, layout_of, model_of
from workflows.partitioning.plan import check_quotas, plan_nodes

H100 = "NVIDIA-H100-80GB-HBM3"


@pytest.mark.parametrize(
    ("product", "config", "resources", "gpus"),
    [
        (H100, "all-1g.10gb", {"nvidia.com/mig-1g.10gb": 56}, 8.0),
        (H100, "all-1g.10gb.me", {"nvidia.com/mig-1g.10gb.me": 8}, 8 / 7),
        (H100, "all-3g.40gb", {"nvidia.com/mig-3g.40gb": 16}, 48 / 7),
        (H100, "all-balanced", {"nvidia.com/mig-1g.10gb": 16, "nvidia.com/mig-2g.20gb": 8,
                                "nvidia.com/mig-3g.40gb": 8}, 8.0),
        (H100, "all-disabled", {"nvidia.com/gpu": 8}, 8.0),
        (H100, "all-enabled", {}, 0.0),
        ("NVIDIA-A100-SXM4-40GB", "all-1g.10gb", {"nvidia.com/mig-1g.10gb": 32}, 32 / 7),
        ("NVIDIA-H200-MIG-1g.18gb", "all-7g.141gb", {"nvidia.com/mig-7g.141gb": 8}, 8.0),
    ],
)  # fmt: skip
def test_a_layout_is_what_the_device_plugin_advertises_in_mixed_strategy(product, config, resources, gpus):
    model = model_of(product)
    assert model is not None
    layout = layout_of(config, model)
    assert layout is not None
    assert layout.resources(8) == resources
    assert layout.gpu_equivalents(8) == pytest.approx(gpus)


def test_config_names_are_the_built_in_ones():
    names = known_configs()
    assert {"all-disabled", "all-enabled", "all-balanced", "all-1g.10gb", "all-1g.18gb.me", "all-2g.10gb"} <= set(names)
    assert "all-1g.10gb+me" not in names and "1g.10gb" not in names


def _node(name: str, product: str = H100, **kw) -> MigNode:
    return MigNode(name=name, product=product, gpus=8, **({"selected": True, "resources": {"nvidia.com/gpu": 8}} | kw))


def test_the_plan_refuses_naming_each_node_that_cannot_take_the_config():
    nodes = [_node("a"), _node("b", "NVIDIA-A100-SXM4-40GB"), _node("c", "NVIDIA-L40S")]
    with pytest.raises(ValueError) as err:
        plan_nodes(nodes, ["gone"], "all-2g.10gb")
    text = str(err.value)
    assert "gone: no such node" in text and "a: NVIDIA-H100-80GB-HBM3 (A100-80GB/H100-80GB) has no config" in text
    assert "c: GPU NVIDIA-L40S is not MIG-capable" in text and "b:" not in text


def test_a_node_at_its_layout_is_planned_as_at_target():
    moved = {"nvidia.com/mig-1g.10gb": 56}
    plans = plan_nodes([_node("a", config="all-1g.10gb", state="success", resources=moved), _node("b")], [],
                       "all-1g.10gb")  # fmt: skip
    assert [(p.node, p.at_target) for p in plans] == [("a", True), ("b", False)]


def test_the_quota_check_counts_instances_by_their_compute_slices():
    nodes = [_node(f"n{i}") for i in range(3)] + [_node("other", selected=False)]
    queues = [QueueGuarantee(name="tenants", gpu_quota=-1), QueueGuarantee(name="nlp", parent="tenants", gpu_quota=22,
              tenant="nlp"), QueueGuarantee(name="vision", parent="tenants", gpu_quota=8, tenant="vision")]  # fmt: skip
    kept = check_quotas(nodes, plan_nodes(nodes, [], "all-1g.10gb"), queues)
    assert (kept.gpus_before, kept.gpus_after, kept.guaranteed, kept.fits) == (32, 32, 30, True)
    shrunk = check_quotas(nodes, plan_nodes(nodes, [], "all-3g.40gb"), queues)  # 6 of each GPU's 7 slices
    assert shrunk.gpus_after == pytest.approx(8 + 24 * 6 / 7, abs=1e-3) and not shrunk.fits
    assert "guaranteed quota of nlp (22 GPUs), vision (8 GPUs) would no longer fit" in shrunk.refusal("lab", "x")
