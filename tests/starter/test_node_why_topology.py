"""`millwright node why` says where a node sits (its NVLink domain from the clique label, rack, block; a node without
the label is its own domain, and says so) and which gangs of GPU work run on it."""

from __future__ import annotations

import pytest

from lab.fleet import Fleet
from starter.cli.questions import why_lines
from starter.questions import node_why

pytestmark = pytest.mark.timeout(60)

UUID = "7b968a6d-c8aa-45e1-9e07-e1e51be99c31"
RACK = {"nvidia.com/gpu.clique": f"{UUID}.1", "accelerator.topograph.run/domain": "rack-07",
        "fabric.topograph.run/tier-1": "block-1"}  # fmt: skip


def fleet() -> list[dict]:
    return Fleet.model_validate({
        "cluster": "lab",
        "nodes": [{"name": "s2grxs64", "labels": RACK, "gpus": 4}, {"name": "cpu-01", "gpus": 0}],
        "workloads": [{"name": "train-a", "namespace": "ml", "replicas": 1, "gpus": 4, "nodes": ["s2grxs64"],
                       "annotations": {"pod-group-name": "pg-train-a"}},
                      {"name": "notebook", "namespace": "ml", "replicas": 1, "gpus": 0, "nodes": ["s2grxs64"]}],
    }).to_objects()  # fmt: skip


async def test_node_why_shows_the_nodes_place_and_its_gangs(client, k8s, core) -> None:
    await k8s.seed(fleet())
    why = await node_why(client, core, "lab", "s2grxs64")
    assert why.place is not None and (why.place.domain, why.place.rack, why.place.block) == (UUID, "rack-07", "block-1")
    assert [g.id for g in why.gangs] == ["kai:ml/pg-train-a"]  # the notebook asks for no GPU: no gang
    assert (why.gangs[0].pods, why.gangs[0].gpus) == (1, 4)
    text = "\n".join(why_lines(why, wide=True))
    assert f"where: NVLink domain {UUID} (clique {UUID}.1); rack rack-07; block block-1" in text
    assert "gang kai:ml/pg-train-a: 1 pods here" in text

    alone = "\n".join(why_lines(await node_why(client, core, "lab", "cpu-01"), wide=True))
    assert "where: no nvidia.com/gpu.clique label: its own NVLink domain; rack -; block -" in alone
