"""The Ironic activities against a real standalone Ironic (fake hardware), run through ActivityEnvironment.

Fake-hardware offers real clean steps (bios.factory_reset, vendor.log_passthrough, which sleeps
vendor_delay = 1 s) but not IPA's burnin_* steps: cleaning with those fails in Ironic itself with
"node does not support this clean step", which is how a failed burn-in reaches the activities.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest
from temporalio.exceptions import ApplicationError

from activities.ironic.models import DriverInfoUpdate, ManageRequest, NodeRef, StartClean, WaitClean
from activities.ironic.steps import BurnInPlan, CleanStep

FAKE_STEPS = [CleanStep(interface="bios", step="factory_reset"), CleanStep(interface="vendor", step="log_passthrough")]


def manual_cleans(ironic_http, node: str) -> int:
    events = ironic_http.get(f"/nodes/{node}/history").json()["history"]
    return sum(1 for e in events if e["event"].startswith("Starting manual cleaning"))


async def wait_state(ironic_http, node: str, state: str, timeout: float = 30) -> dict:
    import asyncio

    deadline = time.monotonic() + timeout
    while True:
        body = ironic_http.get(f"/nodes/{node}").json()
        if body["provision_state"] == state and not body["target_provision_state"]:
            return body
        assert time.monotonic() < deadline, f"{node} is {body['provision_state']}, not {state}"
        await asyncio.sleep(0.1)


async def test_burnin_settings_manage_and_clean_with_fake_steps(ironic, enroll, ironic_http):
    node = enroll()
    plan = BurnInPlan(steps=[
        {"step": "burnin_cpu", "settings": {"timeout": 600}},
        {"step": "burnin_gpu", "settings": {"count": 8, "memory": "90%", "timeout": 3600}},
    ])  # fmt: skip
    first = await ironic("ironic_set_driver_info", DriverInfoUpdate(node=node, values=plan.driver_info()))
    assert sorted(first.changed) == ["agent_burnin_cpu_timeout", "agent_burnin_gpu_count", "agent_burnin_gpu_memory",
                                     "agent_burnin_gpu_timeout"] and first.unchanged == []  # fmt: skip
    # Only what differs is patched; None removes a key.
    second = await ironic(
        "ironic_set_driver_info",
        DriverInfoUpdate(
            node=node, values={**plan.driver_info(), "agent_burnin_cpu_timeout": 60, "agent_burnin_gpu_memory": None}
        ),
    )
    assert sorted(second.changed) == ["agent_burnin_cpu_timeout", "agent_burnin_gpu_memory"]
    info = ironic_http.get(f"/nodes/{node}").json()["driver_info"]
    assert info["agent_burnin_cpu_timeout"] == 60 and info["agent_burnin_gpu_count"] == 8  # ints stay ints
    assert "agent_burnin_gpu_memory" not in info

    managed = await ironic("ironic_manage", ManageRequest(node=node))
    assert managed.changed and managed.node.provision_state == "manageable"
    again = await ironic("ironic_manage", ManageRequest(node=node))
    assert not again.changed and again.node.provision_state == "manageable"

    t = time.monotonic()
    started = await ironic("ironic_start_clean", StartClean(node=node, steps=FAKE_STEPS))
    assert started.started and started.already is None
    done = await ironic("ironic_wait_clean", WaitClean(node=node, timeout_seconds=60))
    assert done.node.provision_state == "manageable" and done.node.last_error is None
    assert 1.0 <= time.monotonic() - t < 15  # log_passthrough sleeps vendor_delay = 1 s
    # Heartbeats carried the state and the step running at the time.
    steps = [(h["clean_step"].get("interface"), h["clean_step"].get("step")) for h in ironic.heartbeats
             if h.get("clean_step")]  # fmt: skip
    assert ("vendor", "log_passthrough") in steps and set(steps) <= {
        ("bios", "factory_reset"),
        ("vendor", "log_passthrough"),
    }
    states = [h["provision_state"] for h in ironic.heartbeats if "clean_step" in h]
    assert states[0] == "cleaning" and states[-1] == "manageable" and set(states) <= {"cleaning", "manageable"}
    assert manual_cleans(ironic_http, node) == 1


async def test_ipa_burnin_step_fails_with_ironics_last_error(ironic, enroll, ironic_http):
    node = enroll()
    await ironic("ironic_manage", ManageRequest(node=node))
    plan = BurnInPlan(steps=[{"step": "burnin_cpu", "settings": {"timeout": 60}}])
    started = await ironic("ironic_start_clean", StartClean(node=node, steps=plan.clean_steps()))
    assert started.started
    with pytest.raises(ApplicationError) as failed:
        await ironic("ironic_wait_clean", WaitClean(node=node, timeout_seconds=60))
    err = failed.value
    assert err.type == "IronicCleanFailed" and err.non_retryable
    assert "does not support this clean step" in err.message and "burnin_cpu" in err.message
    assert "does not support this clean step" in err.details[0]["last_error"]
    assert err.details[0]["provision_state"] == "clean failed"

    # From clean failed, a new clean is refused until the node is managed again ...
    with pytest.raises(ApplicationError) as wrong:
        await ironic("ironic_start_clean", StartClean(node=node, steps=FAKE_STEPS))
    assert (
        wrong.value.type == "IronicWrongState" and wrong.value.non_retryable and "clean failed" in wrong.value.message
    )
    # ... manage brings it back (Ironic keeps last_error), and waiting on it still reports the failure.
    back = await ironic("ironic_manage", ManageRequest(node=node))
    assert back.changed and back.node.provision_state == "manageable" and "burnin_cpu" in back.node.last_error
    with pytest.raises(ApplicationError, match="does not support this clean step") as still:
        await ironic("ironic_wait_clean", WaitClean(node=node, timeout_seconds=5))
    assert still.value.type == "IronicCleanFailed"
    # A later clean clears last_error and succeeds.
    await ironic("ironic_start_clean", StartClean(node=node, steps=FAKE_STEPS[:1]))
    done = await ironic("ironic_wait_clean", WaitClean(node=node, timeout_seconds=60))
    assert done.node.last_error is None


async def test_start_clean_retries_never_restart_a_clean(ironic, enroll, ironic_http):
    node = enroll()
    await ironic("ironic_manage", ManageRequest(node=node))
    scheduled = datetime.now(UTC) - timedelta(seconds=1)
    steps = [CleanStep(interface="vendor", step="log_passthrough")]
    first = await ironic("ironic_start_clean", StartClean(node=node, steps=steps), scheduled=scheduled)
    assert first.started

    # A retry while it runs (the first attempt's answer was lost): same steps -> left alone.
    retry = await ironic("ironic_start_clean", StartClean(node=node, steps=steps), attempt=2, scheduled=scheduled)
    assert not retry.started and retry.already == "running"
    # Other steps while it runs: refused, not queued behind it.
    with pytest.raises(ApplicationError) as busy:
        await ironic("ironic_start_clean", StartClean(node=node, steps=FAKE_STEPS[:1]))
    assert (
        busy.value.type == "IronicNodeBusy"
        and busy.value.non_retryable
        and "vendor.log_passthrough" in busy.value.message
    )

    await ironic("ironic_wait_clean", WaitClean(node=node, timeout_seconds=60))
    # A retry after the clean finished: the node's history shows it ran since the activity was scheduled.
    late = await ironic("ironic_start_clean", StartClean(node=node, steps=steps), attempt=3, scheduled=scheduled)
    assert not late.started and late.already == "finished"
    assert manual_cleans(ironic_http, node) == 1
    # A first attempt (or one scheduled after that clean) does start a new one.
    fresh = await ironic("ironic_start_clean", StartClean(node=node, steps=steps), attempt=2)
    assert fresh.started
    await ironic("ironic_wait_clean", WaitClean(node=node, timeout_seconds=60))
    assert manual_cleans(ironic_http, node) == 2


async def test_manage_waits_for_a_clean_heading_back_and_from_available(ironic, enroll, ironic_http):
    node = enroll()
    await ironic("ironic_manage", ManageRequest(node=node))
    await ironic(
        "ironic_start_clean", StartClean(node=node, steps=[CleanStep(interface="vendor", step="log_passthrough")])
    )
    # Cleaning back to manageable: manage sends nothing and waits.
    waited = await ironic("ironic_manage", ManageRequest(node=node))
    assert not waited.changed and waited.node.provision_state == "manageable"
    assert any(h.get("provision_state") == "cleaning" for h in ironic.heartbeats)

    # available -> manageable.
    assert ironic_http.put(f"/nodes/{node}/states/provision", json={"target": "provide"}).status_code == 202
    await wait_state(ironic_http, node, "available")
    from_available = await ironic("ironic_manage", ManageRequest(node=node))
    assert from_available.changed and from_available.node.provision_state == "manageable"


async def test_ironic_errors_map_to_application_errors(ironic, enroll, ironic_http):
    with pytest.raises(ApplicationError) as missing:
        await ironic("ironic_get_node", NodeRef(node="no-such-node"))
    assert missing.value.type == "IronicNotFound" and missing.value.non_retryable
    assert "Node no-such-node could not be found" in missing.value.message  # Ironic's faultstring, unwrapped

    node = enroll()
    got = await ironic("ironic_get_node", NodeRef(node=node))
    assert got.provision_state == "enroll" and got.name == node and not got.maintenance and got.clean_step == {}
    with pytest.raises(ApplicationError) as enrolled:
        await ironic("ironic_start_clean", StartClean(node=node, steps=FAKE_STEPS))
    assert enrolled.value.type == "IronicWrongState" and enrolled.value.non_retryable
    with pytest.raises(ApplicationError) as not_cleaning:
        await ironic("ironic_wait_clean", WaitClean(node=node, timeout_seconds=5))
    assert not_cleaning.value.type == "IronicWrongState"

    # Ironic refusing a verb (manage on an active node): non-retryable, with Ironic's own message.
    await ironic("ironic_manage", ManageRequest(node=node))
    for target in ("provide", "active"):
        assert ironic_http.put(f"/nodes/{node}/states/provision", json={"target": target}).status_code == 202
        await wait_state(ironic_http, node, "available" if target == "provide" else "active")
    with pytest.raises(ApplicationError) as refused:
        await ironic("ironic_manage", ManageRequest(node=node))
    assert refused.value.type == "IronicRejected" and refused.value.non_retryable
    assert "can not be performed on node" in refused.value.message and '"active"' in refused.value.message
