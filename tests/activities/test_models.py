"""The shared activity models (activities/models.py)."""

from __future__ import annotations

import pytest

from activities.models import SystemIdentity

UUID = "4c4c4544-0042-3510-8052-b4c04f4e3732"


@pytest.mark.parametrize(("bmc", "node", "same"), [
    (UUID, UUID, True), (UUID.upper(), UUID, True), (UUID, f" {UUID}\n", True),
    (UUID, "4c4c4544-0042-3510-8052-b4c04f4e3733", False), (UUID, "", False), ("", "", False),
])  # fmt: skip
def test_a_system_is_the_node_only_when_both_report_the_same_uuid(bmc: str, node: str, same: bool) -> None:
    assert SystemIdentity(uuid=bmc).same_uuid(node) is same
