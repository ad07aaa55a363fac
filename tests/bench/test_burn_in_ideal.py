"""bench/burn_in.py's ideal: one ServerBurnIn's critical path computed from the lab BMCs' configuration and the lab
hosts' boot delay, checked against the lab itself as a lower bound (never as a timed assertion of the product)."""

from __future__ import annotations

import time
import uuid

import pytest
from temporalio.testing import ActivityEnvironment

from activities.gpu.activities import LoadWindow
from activities.gpu.models import StressRequest
from activities.redfish import BmcRef, BootRequest, PowerRequest, RedfishActivities, SelQuery
from activities.support.secrets import SecretRef
from bench.burn_in import _looks, server_burn_in_path
from bench.common import ideal_error
from lab.bmc import DEFAULT_CONFIG
from lab.hosts import LabHosts
from lab.redfish import BmcAdmin, LabBmcs

PASSWORD = f"bench-{uuid.uuid4().hex}"


def total(path: list[tuple[str, float]]) -> float:
    return sum(seconds for _, seconds in path)


def test_the_benchs_defaults_take_2_5_seconds_a_server():
    """No request latency: the three power changes' first looks (0.5 s each, the agent up within the first) and
    the stress second."""
    path = server_burn_in_path({**DEFAULT_CONFIG, "power_delay": 0.1}, 0.2, 1)
    assert total(path) == pytest.approx(2.5)
    assert dict(path)["power Off (reset + 1 look(s))"] == pytest.approx(0.5)


def test_each_request_takes_the_bmcs_latency():
    """21 requests at 0.5 s (8 + 3 + 3 resets and 3 looks + 1 + 3) and the looks' pauses (0.5 s each)."""
    path = server_burn_in_path({**DEFAULT_CONFIG, "request_delay": 0.5, "power_delay": 0.1}, 0.2, 1)
    assert total(path) == pytest.approx(21 * 0.5 + 3 * 0.5 + 1)


def test_a_slow_power_change_is_seen_at_the_looks_pace():
    """Looks after 0.5, 1, 2 and 4 s: a change that lands 5 s after its reset is seen at the fourth, 7.5 s in."""
    assert _looks(0.0, 5.0) == (4, 7.5)
    path = dict(server_burn_in_path({**DEFAULT_CONFIG, "power_delay": 0.1}, 3.0, 1))
    assert path["agent up (the later of 1 look(s) 0.50, power 0.10 + boot 3.00)"] == pytest.approx(3.1)


def test_a_fleet_faster_than_its_waves_is_a_bench_error(capsys):
    ideal = 2 * total(server_burn_in_path({**DEFAULT_CONFIG, "power_delay": 0.1}, 0.2, 1))  # two waves
    assert ideal_error(ideal / ideal, "burn-in wall") == 0
    assert ideal_error(4.99 / ideal, "burn-in wall") == 1
    assert "bench error: burn-in wall ratio 0.998 < 1.00" in capsys.readouterr().out


async def test_one_server_burn_in_takes_at_least_its_path(client, monkeypatch):
    """A ServerBurnIn's Redfish calls (the same activities, no workflow, no worker) made one after another against
    a lab BMC, the lab host's agent waited for and the stress window run on its GPUs directly: the lab can only be
    slower than the path it is configured to take, and it asks exactly the requests the path counts."""
    monkeypatch.setenv("BENCH_BMC_CREDENTIALS", f"admin:{PASSWORD}")
    redfish = RedfishActivities(SecretRef.parse("env:BENCH_BMC_CREDENTIALS"))
    env = ActivityEnvironment()
    with LabBmcs(count=1, prefix=f"bi-{uuid.uuid4().hex[:4]}-", user="admin", password=PASSWORD,
                 power_delay=0.1) as bmcs:  # fmt: skip
        (name,) = bmcs.names
        async with BmcAdmin(bmcs.url) as admin, LabHosts(client, bmcs.url, boot_delay=0.2, poll_interval=0.05,
                                                         booted_from={"Pxe"}) as hosts:  # fmt: skip
            config = await admin.config(request_delay=0.05)
            started = time.monotonic()
            inventory = await env.run(redfish.redfish_inventory_and_sel, BmcRef(url=bmcs.bmc_urls[name]))
            bmc = BmcRef(url=bmcs.bmc_urls[name], system=inventory.system)
            boot = await env.run(redfish.redfish_set_boot, BootRequest(bmc=bmc, target="Pxe"))
            assert boot.power_state == "Off"  # found Off: no power Off first
            await env.run(redfish.redfish_power, PowerRequest(bmc=bmc, state="On", current="Off"))
            await hosts.wait_running(name, timeout=10)
            probe = hosts.probe(name)
            assert probe is not None
            await LoadWindow(probe, StressRequest(seconds=1, dcgm_level=None)).run()
            assert inventory.sel is not None
            await env.run(redfish.redfish_sel, SelQuery(bmc=bmc, after_id=inventory.sel.last_id,
                                                        entries=inventory.sel_entries))  # fmt: skip
            boot = await env.run(redfish.redfish_set_boot, BootRequest(bmc=bmc, target="Hdd"))
            await env.run(redfish.redfish_power, PowerRequest(bmc=bmc, state="Off", current=boot.power_state))
            await env.run(redfish.redfish_power, PowerRequest(bmc=bmc, state="On", current="Off"))
            took = time.monotonic() - started
            requests = (await admin.servers(["requests"]))[name]["requests"]
    await redfish.close()
    path = server_burn_in_path(config, hosts.boot_delay, 1)
    assert total(path) == pytest.approx(21 * 0.05 + 3 * 0.5 + 1)
    assert requests == 21, f"the path counts 21 requests; the activities asked {requests}"
    assert took >= total(path), f"one server's burn-in took {took:.3f} s, under its ideal {total(path):.3f} s"
