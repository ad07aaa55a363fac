"""bench/campaign.py's ideal: the canary alone, then each wave as long as its longest cluster's own rollout ideal,
the soak after the canary and between two waves."""

from __future__ import annotations

import pytest

from bench.campaign import campaign_ideal
from bench.common import batches_ideal, node_update_path
from tests.bench.test_common import configured
from workflows.campaign.models import WavePlan


def test_a_wave_takes_its_longest_cluster_and_a_soak_falls_between_two_waves():
    ideal, per_wave = campaign_ideal([["a"], ["b", "c"], ["d"]], {"a": 10.0, "b": 20.0, "c": 35.0, "d": 5.0}, 3.0)
    assert per_wave == [10.0, 35.0, 5.0]
    assert ideal == pytest.approx(10 + 35 + 5 + 2 * 3)
    assert campaign_ideal([["a"]], {"a": 10.0}, 3.0) == (10.0, [10.0])  # a canary alone: nothing to soak before


def test_ten_clusters_of_1000_nodes_in_waves_of_three_take_1438_seconds():
    """The bench's defaults in the realistic profile: 10 batches of 100 × 35.2 s a cluster, the canary and three
    waves (3, 3, 3), 10 s of soak after each of the first three."""
    path = node_update_path(configured(0.05, 5.0, 20.0), "kernel-tuning", "reboot")
    names = [f"cluster-{i + 1:02d}" for i in range(10)]
    ideals = {name: batches_ideal(1000, 100, path)[0] for name in names}
    waves = WavePlan(wave_size=3).waves(names)
    assert waves == [names[:1], names[1:4], names[4:7], names[7:]]
    ideal, per_wave = campaign_ideal(waves, ideals, 10.0)
    assert per_wave == pytest.approx([352.0] * 4)
    assert ideal == pytest.approx(4 * 352.0 + 3 * 10)
