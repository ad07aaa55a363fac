"""The operator's controls, as a person types them (`millwright`, run in-process: tests/cli_in_process.py), on one
rollout in the lab: refusals exit 1 naming why, dry runs send nothing, and every control that is taken records who
and why."""

from __future__ import annotations

import json

import pytest
import yaml
from temporalio.api.enums.v1 import EventType

from tests.cli_in_process import cli
from tests.starter.cli.conftest import CLUSTER, FAILING, rollout_status

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.timeout(240)]

WHO = ("--by", "alice")


async def update_events(lab, workflow_id: str) -> list:
    """The run's accepted updates, each with the identity of who sent it."""
    events = []
    async for e in lab.client.get_workflow_handle(workflow_id).fetch_history_events():
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED:
            events.append(e.workflow_execution_update_accepted_event_attributes.accepted_request)
    return events


async def test_rollout_controls_in_order(lab):
    rid = lab.rollout_id
    await rollout_status(lab, lambda s: s.compartments.get("__default__") and
                         s.compartments["__default__"].phase == "waiting-for-approval", "the first approval")  # fmt: skip

    # Refused by the validator: not paused. Exit 1, the validator's reason, nothing sent.
    refused = await cli(*lab.args("rollout", "resume", rid, *WHO, "-r", "go"))
    assert refused.returncode == 1, refused
    assert "the rollout is not paused" in refused.stderr and "Traceback" not in refused.stderr

    # A dry run of an approval: the run would take it, and nothing is sent or written.
    cursor = await lab.admin.audit_cursor()
    dry = await cli(*lab.args("rollout", "approve", rid, *WHO, "-r", "first batch", "--dry-run"))
    assert dry.returncode == 0, dry
    assert "would take `rollout approve`" in dry.stderr and "nothing was sent" in dry.stderr
    assert await update_events(lab, rid) == []
    status = await rollout_status(lab, lambda s: s, "the status")
    assert status.compartments["__default__"].phase == "waiting-for-approval" and status.counts == {"waiting": 6}
    assert await lab.admin.audit(since=cursor, writes=True) == []  # the cluster saw no write

    # Skip a waiting node, by name and cluster; the reason records who.
    skipped = await cli(*lab.args("rollout", "skip-node", rid.rsplit("/", 1)[1], "a-06", "--cluster", CLUSTER,
                                  *WHO, "-r", "bad DIMM", "-o", "json"))  # fmt: skip
    assert skipped.returncode == 0, skipped
    assert json.loads(skipped.stdout)["problems"]["a-06"]["reason"] == "skipped: bad DIMM (by alice)"
    again = await cli(*lab.args("rollout", "skip-node", rid, "a-06", *WHO, "-r", "twice", "--dry-run"))
    assert again.returncode == 1 and "node a-06 is skipped" in again.stderr, again

    approved = await cli(*lab.args("rollout", "approve", rid, *WHO, "-r", "first batch"))
    assert approved.returncode == 0, approved
    await rollout_status(lab, lambda s: s.problems.get(FAILING) and s.problems[FAILING].status == "erroring",
                         f"{FAILING} erroring")  # fmt: skip

    # Pause, refused twice; retry the erroring node while paused; a completed node cannot be retried.
    paused = await cli(*lab.args("rollout", "pause", rid, *WHO, "-r", "incident 4711"))
    assert paused.returncode == 0 and "paused: incident 4711 (by alice)" in paused.stdout, paused
    twice = await cli(*lab.args("rollout", "pause", rid, *WHO, "-r", "twice"))
    assert twice.returncode == 1 and "already paused: incident 4711 (by alice)" in twice.stderr, twice
    dry_twice = await cli(*lab.args("rollout", "pause", rid, *WHO, "-r", "twice", "--dry-run"))
    assert dry_twice.returncode == 1 and "already paused" in dry_twice.stderr, dry_twice
    retried = await cli(*lab.args("rollout", "retry-node", rid, FAILING, *WHO, "-r", "driver fixed", "-o", "yaml"))
    assert retried.returncode == 0, retried
    assert FAILING not in yaml.safe_load(retried.stdout)["problems"]  # back in line: waiting
    not_retryable = await cli(*lab.args("rollout", "retry-node", rid, "a-02", *WHO, "-r", "again"))
    assert not_retryable.returncode == 1 and "a-02" in not_retryable.stderr, not_retryable
    resumed = await cli(*lab.args("rollout", "resume", rid, *WHO, "-r", "incident over"))
    assert resumed.returncode == 0, resumed

    # Every update taken names its sender; the refused and dry ones left no trace.
    accepted = await update_events(lab, rid)
    assert [a.input.name for a in accepted] == ["skip_node", "approve_batch", "pause", "retry_node", "resume"]
    assert {a.meta.identity for a in accepted} == {"alice"}


async def test_budget_and_breaker(lab):
    from workflows.budget.breaker import BreakerSettings
    from workflows.budget.disruption_budget import DisruptionBudget
    from workflows.budget.leases import LeaseRequest

    entity = f"disruption-budget/{CLUSTER}"
    shown = await cli(*lab.args("budget", "show", CLUSTER, "-o", "json"))
    assert shown.returncode == 0, shown
    view = json.loads(shown.stdout)  # as the lab's operator started it
    assert view["budget"] == {"percent": None, "count": 2} and view["budget_source"] == "input"
    assert view["total_nodes"] == 6

    too_many = await cli(*lab.args("budget", "set", CLUSTER, "--count", "99", *WHO, "-r", "more"))
    assert too_many.returncode == 1 and "count 99 is more than the 6 nodes of cli" in too_many.stderr, too_many
    neither = await cli(*lab.args("budget", "set", CLUSTER, *WHO, "-r", "nothing"))
    assert neither.returncode == 2 and "nothing was sent" in neither.stderr, neither
    dry = await cli(*lab.args("budget", "set", CLUSTER, "--count", "3", *WHO, "-r", "change window", "--dry-run"))
    assert dry.returncode == 0 and "budget 2 nodes -> 3 nodes" in dry.stderr, dry
    assert await update_events(lab, entity) == []
    done = await cli(*lab.args("budget", "set", CLUSTER, "--count", "3", *WHO, "-r", "change window"))
    assert done.returncode == 0, done
    shown = await cli(*lab.args("budget", "show", CLUSTER))
    assert "budget 3 nodes (operator alice: change window)" in shown.stdout, shown

    # A remediation's request past the breaker's share trips it (1%: any node).
    handle = lab.client.get_workflow_handle(entity)
    trip = LeaseRequest(node="a-05", holder=lab.rollout_id, remediation=BreakerSettings(max_percent=1))
    assert (await handle.execute_update(DisruptionBudget.acquire, trip)).state == "refused"
    tripped = await cli(*lab.args("breaker", "show", CLUSTER))
    assert tripped.returncode == 0 and "remediation circuit breaker tripped at" in tripped.stdout, tripped
    dry = await cli(*lab.args("breaker", "reset", CLUSTER, *WHO, "-r", "found it", "--dry-run", "-o", "json"))
    assert dry.returncode == 0 and json.loads(dry.stdout)["tripped"] is True, dry
    reset = await cli(*lab.args("breaker", "reset", CLUSTER, *WHO, "-r", "bad PSU batch replaced", "-o", "json"))
    assert reset.returncode == 0, reset
    assert (
        json.loads(reset.stdout)["tripped"] is False
        and "by alice: bad PSU batch replaced" in json.loads(reset.stdout)["reset"]
    )
    accepted = await update_events(lab, entity)
    assert [(a.input.name, a.meta.identity) for a in accepted if a.input.name != "acquire"] == [
        ("set_budget", "alice"), ("reset_breaker", "alice")
    ]  # fmt: skip


async def test_controls_of_a_run_that_does_not_exist_exit_1(lab):
    missing = await cli(*lab.args("maintenance", "abort", "a-03", "--cluster", CLUSTER, *WHO, "-r", "x"))
    assert missing.returncode == 1 and "no run with ID 'node-maintenance/cli/a-03'" in missing.stderr, missing
    missing = await cli(*lab.args("breaker", "show", "nowhere"))
    assert missing.returncode == 1 and "disruption-budget/nowhere" in missing.stderr, missing
    no_cluster = await cli(*lab.args("rollout", "pause", "some-rollout", *WHO, "-r", "x"))
    assert no_cluster.returncode == 2 and "give --cluster" in no_cluster.stderr, no_cluster


async def test_reset_batch_names_the_compartments_it_knows(lab):
    unknown = await cli(*lab.args("rollout", "reset-batch", lab.rollout_id, "--compartment", "gpu-b", *WHO, "-r", "x",
                                  "--dry-run"))  # fmt: skip
    assert unknown.returncode == 1 and "unknown compartment 'gpu-b'; known: ['__default__']" in unknown.stderr, unknown
    reset = await cli(*lab.args("rollout", "reset-batch", lab.rollout_id, "--compartment", "__default__", *WHO,
                                "-r", "failures understood"))  # fmt: skip
    assert reset.returncode == 0, reset
    assert [a.input.name for a in await update_events(lab, lab.rollout_id)][-1] == "reset_batch_state"
