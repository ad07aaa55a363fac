"""bench/rollout.py's MIG ideal (`--operation mig`): one node's MIG change computed from the emulator's configuration
(bench/common.py `node_mig_path`), checked against the emulator's mig-manager itself as a lower bound."""

from __future__ import annotations

import time

import httpx
import pytest

from bench.common import ideal_error, node_mig_path
from lab.k8s import mig
from lab.k8s.store import default_config
from tests.kube_helpers import checked_emulator
from tests.lab.labtest_helpers import node, wait_for

H100 = "NVIDIA-H100-80GB-HBM3"


def total(path: list[tuple[str, float]]) -> float:
    return sum(seconds for _, seconds in path)


def test_a_change_waits_out_its_pending_and_a_mode_change_its_reboot():
    config = {**default_config(), "migPendingSeconds": 0.5, "migReboot": True, "rebootSeconds": 20.0}
    assert node_mig_path(config, H100, "all-1g.10gb") == [("mig-manager pending", 0.5), ("reboot", 20.0)]
    # Between two MIG layouts the mode stays on: no reboot; a node already there has no path.
    assert node_mig_path(config, H100, "all-2g.20gb", applied="all-1g.10gb") == [("mig-manager pending", 0.5)]
    assert node_mig_path(config, H100, "all-1g.10gb", applied="all-1g.10gb") == []
    assert node_mig_path({**config, "migReboot": False}, H100, "all-1g.10gb") == [("mig-manager pending", 0.5)]


def test_a_nodes_own_settings_come_first():
    config = {**default_config(), "migNodes": {"g1": {"pendingSeconds": 2.0, "reboot": True}}}
    assert total(node_mig_path(config, H100, "all-1g.10gb", node="g1")) == pytest.approx(2.0 + 2.0)
    assert total(node_mig_path(config, H100, "all-1g.10gb", node="g2")) == pytest.approx(0.2)


def test_a_partitioning_faster_than_its_batches_is_a_bench_error(capsys):
    ideal = 3 * total(node_mig_path(default_config(), H100, "all-1g.10gb"))  # three batches
    assert ideal_error(0.61 / ideal, "mig makespan") == 0
    assert ideal_error(0.59 / ideal, "mig makespan") == 1
    assert "bench error: mig makespan ratio 0.983 < 1.00" in capsys.readouterr().out


@pytest.mark.parametrize("reboot", [False, True])
def test_one_nodes_mig_change_takes_at_least_its_path(tmp_path, reboot):
    """The node's config label set as the product sets it, and its state read until `success` (no orchestration
    at all): the emulator can only be slower than the path it is configured to take."""
    gpu_node = node("g1", labels={mig.PRODUCT_LABEL: H100, "nvidia.com/gpu.count": "8"})
    with checked_emulator(tmp_path) as emulator, httpx.Client(base_url=emulator.url) as http:
        http.post("/_lab/seed", json={"objects": [gpu_node]}).raise_for_status()
        http.post("/_lab/config", json={"migPendingSeconds": 0.3, "migReboot": reboot,
                                        "rebootSeconds": 0.4}).raise_for_status()  # fmt: skip
        config = http.get("/_lab/config").json()
        started = time.monotonic()
        http.patch("/api/v1/nodes/g1", json={"metadata": {"labels": {mig.CONFIG_LABEL: "all-1g.10gb"}}},
                   headers={"Content-Type": "application/merge-patch+json"}).raise_for_status()  # fmt: skip
        wait_for(lambda: http.get("/api/v1/nodes/g1").json()["metadata"]["labels"].get(mig.STATE_LABEL) == "success",
                 interval=0.005, what="g1 at all-1g.10gb")  # fmt: skip
        took = time.monotonic() - started
    ideal = total(node_mig_path(config, H100, "all-1g.10gb"))
    assert ideal == pytest.approx(0.3 + (0.4 if reboot else 0))
    assert took >= ideal, f"one node's MIG change took {took:.3f} s, under its ideal {ideal:.3f} s"
