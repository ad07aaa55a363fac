"""bench/common.py's rollout ideal: one node's critical path computed from the emulator's configuration, checked
against the emulator itself as a lower bound (never as a timed assertion of the product's speed)."""

from __future__ import annotations

import time

import httpx
import pytest

from activities.kube.models import JOB_NAMESPACE, Stage, StageJobRequest
from activities.kube.rollout_activities import RolloutNodeActivities
from bench.common import ideal_error, node_update_path
from lab.k8s.store import default_config
from tests.kube_helpers import checked_emulator
from tests.lab.labtest_helpers import node, wait_for


def configured(pod_start: float, stage: float, reboot: float, rules: list[dict] | None = None) -> dict:
    """The emulator's configuration as `GET /_lab/config` reads it back after the bench's `configure`."""
    return {**default_config(), "podStartSeconds": pod_start, "rebootSeconds": reboot,
            "jobs": {"defaultSeconds": stage, "rules": rules or []}}  # fmt: skip


def test_the_realistic_profile_takes_35_2_seconds_a_node():
    path = node_update_path(configured(0.05, 5.0, 20.0), "kernel-tuning", "reboot")
    assert path == [("apply", 5.05), ("config", 5.05), ("interrupt pod", 0.05), ("reboot", 20.0),
                    ("post-interrupt", 5.05)]  # fmt: skip
    assert sum(seconds for _, seconds in path) == pytest.approx(35.2)


def test_a_job_rule_sets_its_stage_and_keeps_its_times():
    rules = [{"stage": "config", "seconds": 1.0, "times": 1}, {"package": "other", "seconds": 9.0}]
    config = configured(0.1, 0.2, 0.5, rules)
    path = dict(node_update_path(config, "kernel-tuning", "reboot"))
    assert path["config"] == pytest.approx(1.1) and path["apply"] == pytest.approx(0.3)
    assert config["jobs"]["rules"][0]["times"] == 1  # reading the path runs nothing


def test_a_service_interrupt_is_a_job_of_its_own_seconds():
    path = dict(node_update_path(configured(0.1, 0.2, 0.5), "kernel-tuning", "service"))
    assert "reboot" not in path and path["interrupt"] == pytest.approx(0.3)


def test_a_ratio_under_one_is_a_bench_error(capsys):
    assert ideal_error(1.0, "rollout makespan") == 0 and capsys.readouterr().out == ""
    assert ideal_error(0.99, "rollout makespan") == 1
    assert "bench error: rollout makespan ratio 0.990 < 1.00: the ideal is not a lower bound" in capsys.readouterr().out


def test_one_node_update_takes_at_least_its_path(tmp_path):
    """A node's stage Jobs, as the product writes them, created one after another the moment the last is
    complete (no orchestration at all): the emulator can only be slower than the path it is configured to take."""
    with checked_emulator(tmp_path, pod_start_seconds=0.1) as emulator, httpx.Client(base_url=emulator.url) as http:
        namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": JOB_NAMESPACE}}
        http.post("/_lab/seed", json={"objects": [node("n1"), namespace]}).raise_for_status()
        http.post("/_lab/config", json={"jobs": {"defaultSeconds": 0.2, "rules": []},
                                        "rebootSeconds": 0.5}).raise_for_status()  # fmt: skip
        config = http.get("/_lab/config").json()
        jobs = f"/apis/batch/v1/namespaces/{JOB_NAMESPACE}/jobs"
        started = time.monotonic()
        for stage in (Stage.APPLY, Stage.CONFIG, Stage.INTERRUPT, Stage.POST_INTERRUPT):
            req = StageJobRequest(cluster="lab", node="n1", rollout="bench", package="kernel-tuning", version="1.0.0",
                                  image="registry.local/kernel-tuning", stage=stage.value,
                                  interrupt="reboot" if stage.is_interrupt else None)  # fmt: skip
            name = f"kernel-tuning-{stage.value}"
            http.post(jobs, json=RolloutNodeActivities._stage_job(req, name, 1)).raise_for_status()
            wait_for(lambda: http.get(f"{jobs}/{name}").json().get("status", {}).get("succeeded"),
                     interval=0.005, what=f"{name} complete")  # fmt: skip
        took = time.monotonic() - started
    ideal = sum(seconds for _, seconds in node_update_path(config, "kernel-tuning", "reboot"))
    assert ideal == pytest.approx(4 * 0.1 + 3 * 0.2 + 0.5)
    assert took >= ideal, f"one node's update took {took:.3f} s, under its ideal {ideal:.3f} s"
