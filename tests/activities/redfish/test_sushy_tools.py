"""The real sushy client against sushy-tools' fake driver (lab/sushy.py): the power and boot subset.

sushy-tools applies power changes 0-11 s after the request (random), so the test polls, and it always reads
BootSourceOverrideEnabled as Continuous, so Once is not asserted here (tests/activities/redfish/test_lab_bmc.py does that).
"""

from __future__ import annotations

import asyncio
import time

import pytest
import sushy
from sushy import auth as sushy_auth
from sushy import exceptions as sushy_exc

from tests.activities.redfish.conftest import ST_PASSWORD, ST_USER

FLIP = {
    sushy.POWER_STATE_ON: (sushy.RESET_FORCE_OFF, sushy.POWER_STATE_OFF),
    sushy.POWER_STATE_OFF: (sushy.RESET_ON, sushy.POWER_STATE_ON),
}


async def flip_all(root, ids: list[str], timeout: float = 25.0) -> dict[str, sushy.PowerState]:
    """Turn every system to the opposite power state at once, poll until all landed; returns the old states."""
    before = {i: root.get_system(i).power_state for i in ids}
    for i, state in before.items():
        root.get_system(i).reset_system(FLIP[state][0])
    deadline = time.monotonic() + timeout
    waiting = set(ids)
    while waiting:
        waiting = {i for i in waiting if root.get_system(i).power_state != FLIP[before[i]][1]}
        assert time.monotonic() < deadline, f"power did not land within {timeout}s: {waiting}"
        await asyncio.sleep(0.25)
    return before


async def test_power_and_boot_through_sushy(sushy_tools):
    root = sushy.Sushy(sushy_tools.url, auth=sushy_auth.BasicAuth(ST_USER, ST_PASSWORD))
    ids = sushy_tools.system_ids
    assert set(root.get_system_collection().members_identities) == set(ids)
    system = root.get_system(ids[1])
    assert system.name == sushy_tools.systems[1]["name"] and system.uuid == sushy_tools.systems[1]["uuid"]
    resets = system.get_allowed_reset_system_values()
    assert {sushy.RESET_ON, sushy.RESET_FORCE_OFF, sushy.RESET_FORCE_RESTART} <= resets

    system.set_system_boot_options(
        sushy.BOOT_SOURCE_TARGET_PXE, enabled=sushy.BOOT_SOURCE_ENABLED_ONCE, mode=sushy.BOOT_SOURCE_MODE_UEFI
    )
    boot = root.get_system(ids[1]).boot
    assert (boot.target, boot.mode) == (sushy.BOOT_SOURCE_TARGET_PXE, sushy.BOOT_SOURCE_MODE_UEFI)

    before = await flip_all(root, ids)
    if sushy.POWER_STATE_ON not in before.values():  # someone left them all off: prove power-off as well
        await flip_all(root, ids)

    system = root.get_system(ids[1])
    system.set_system_boot_options(sushy.BOOT_SOURCE_TARGET_HDD)
    assert root.get_system(ids[1]).boot.target == sushy.BOOT_SOURCE_TARGET_HDD


async def test_default_auth_and_bad_password(sushy_tools):
    # sushy-tools has no SessionService: sushy's default auth falls back to Basic
    root = sushy.Sushy(sushy_tools.url, username=ST_USER, password=ST_PASSWORD)
    assert root.get_system(sushy_tools.system_ids[0]).identity
    bad = sushy.Sushy(sushy_tools.url, auth=sushy_auth.BasicAuth(ST_USER, "wrong"))
    with pytest.raises(sushy_exc.AccessError) as exc:
        bad.get_system(sushy_tools.system_ids[0])
    assert exc.value.status_code == 401
