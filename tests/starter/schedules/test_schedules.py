"""`millwright schedules apply|list` (starter/schedules/) against the session dev server."""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest
import yaml
from temporalio.client import ScheduleOverlapPolicy, ScheduleUpdate
from temporalio.service import RPCError, RPCStatusCode

from starter.schedules.apply import apply
from starter.schedules.cron import cron_calendars
from starter.schedules.file import ScheduleFileError, load
from starter.schedules.listing import list_schedules
from starter.schedules.managed import MANAGED_MEMO
from tests.cli_in_process import cli
from tests.worker_process import REPO

pytestmark = pytest.mark.timeout(120)

YEARLY = "0 3 1 1 *"  # never fires while a test runs


def entry(sid: str, fabric: str = "ib-a", **over) -> dict:
    return {"id": sid, "workflow": "FabricAudit", "input": {"fabric": fabric}, "cron": YEARLY, **over}


@pytest.fixture
def ids():
    """Unique schedule IDs and group for one test; the test's schedules are deleted afterwards."""
    tag = uuid.uuid4().hex[:8]
    return {"group": f"t-{tag}", "a": f"test-sched/{tag}/a", "b": f"test-sched/{tag}/b", "c": f"test-sched/{tag}/c"}


@pytest.fixture
async def cleanup(client, ids):
    yield
    for key in ("a", "b", "c"):
        try:
            await client.get_schedule_handle(ids[key]).delete()
        except RPCError as e:
            if e.status != RPCStatusCode.NOT_FOUND:
                raise


async def exists(client, sid: str) -> bool:
    try:
        await client.get_schedule_handle(sid).describe()
        return True
    except RPCError as e:
        if e.status == RPCStatusCode.NOT_FOUND:
            return False
        raise


async def listed(client, *sids: str) -> None:
    """Wait until the (eventually consistent) schedule list shows every ID."""
    for _ in range(100):
        seen = {s.id async for s in await client.list_schedules()}
        if set(sids) <= seen:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"{sids} not listed")


# ---------------------------------------------------------------- validation (no server)


def test_cron_is_converted_with_standard_semantics():
    [c] = cron_calendars("*/15 * * * *")
    assert [(r.start, r.end, r.step) for r in c.minute] == [(0, 59, 15)] and c.comment == "cron: */15 * * * *"
    both = cron_calendars("0 3 1 * mon")  # day-of-month OR day-of-week, as in cron
    assert len(both) == 2
    [sun] = cron_calendars("0 0 * * 7")
    assert [(r.start, r.end) for r in sun.day_of_week] == [(0, 0)]
    for bad in ("* * *", "61 * * * *", "@every 5m", "5-1 * * * *", "* * * foo *"):
        with pytest.raises(ValueError):
            cron_calendars(bad)


def test_invalid_file_lists_every_problem_by_file_and_field(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"schedules": [
        entry("x", cron="61 * * * *", input={"fabrik": "y"}),
        {"id": "x", "workflow": "NoSuchWorkflow", "interval": "10m"},
        entry("y", timeZone="Mars/Base", overlap="sometimes"),
        {"id": "z", "workflow": "FabricAudit", "input": {"fabric": "f"}},
        entry("w", interval={"every": "1h", "offset": "2h"}, extra=1),
    ]}))  # fmt: skip
    with pytest.raises(ScheduleFileError) as info:
        load(path)
    text = "\n".join(info.value.errors)
    assert all(line.startswith(f"{path}: ") for line in info.value.errors)
    for expected in (
        "schedules[0] (x).cron: minute field: 61 is out of range",
        "schedules[0] (x).input.fabric: Field required",
        "schedules[0] (x).input.fabrik: Extra inputs",
        "schedules[1] (x).id: duplicate schedule ID (first at schedules[0])",
        "schedules[1] (x).workflow: unknown workflow 'NoSuchWorkflow'; startable: ",
        "schedules[2] (y).timeZone: unknown time zone 'Mars/Base'",
        "schedules[2] (y).overlap: ",
        "schedules[3] (z): give cron or interval",
        "schedules[4] (w).interval: offset must be",
        "schedules[4] (w).extra: Extra inputs",
    ):
        assert expected in text, (expected, text)


def test_example_file_is_valid_but_for_the_sweep_until_it_exists():
    path = REPO / "examples" / "schedules.yaml"
    try:
        model = load(path)
    except ScheduleFileError as e:  # FleetHealthSweep not startable yet: that must be the only problem
        assert len(e.errors) == 1 and "unknown workflow 'FleetHealthSweep'" in e.errors[0], e.errors
        return
    assert {s.workflow for s in model.schedules} >= {"FleetHealthSweep", "FabricAudit", "TenantUsage"}


# ---------------------------------------------------------------- apply


async def test_create_then_apply_again_changes_nothing(client, ids, cleanup):
    doc = {"group": ids["group"], "schedules": [entry(ids["a"], timeZone="Europe/Berlin", jitter="30s")]}
    report = await apply(client, doc, task_queue="sched-test")
    assert [(r.id, r.action) for r in report.results] == [(ids["a"], "created")]

    desc = await client.get_schedule_handle(ids["a"]).describe()
    action = desc.schedule.action
    assert (action.workflow, action.id, action.task_queue) == ("FabricAudit", "fabric-audit/ib-a", "sched-test")
    assert desc.schedule.policy.overlap == ScheduleOverlapPolicy.SKIP  # the default: a sweep never overlaps itself
    assert (
        desc.schedule.spec.time_zone_name == "Europe/Berlin"
        and desc.schedule.spec.calendars[0].comment == f"cron: {YEARLY}"
    )
    assert (await desc.memo())[MANAGED_MEMO] == {"group": ids["group"]}

    again = await apply(client, doc, task_queue="sched-test")
    assert [(r.id, r.action, r.changes) for r in again.results] == [(ids["a"], "unchanged", [])] and not again.changed
    after = await client.get_schedule_handle(ids["a"]).describe()
    assert after.info.last_updated_at == desc.info.last_updated_at  # not blindly updated


async def test_update_reports_a_field_diff_and_reverts_ui_drift(client, ids, cleanup):
    doc = {"group": ids["group"], "schedules": [entry(ids["a"])]}
    await apply(client, doc)
    changed = {
        "group": ids["group"],
        "schedules": [entry(ids["a"], fabric="ib-b", cron=None, interval="15m", jitter="1m")],
    }
    del changed["schedules"][0]["cron"]
    report = await apply(client, changed)
    [r] = report.results
    assert r.action == "updated"
    diff = {c.field: (c.old, c.new) for c in r.changes}
    assert diff["spec"] == (f"cron {YEARLY}", "every 15m")
    assert diff["workflowId"] == ("fabric-audit/ib-a", "fabric-audit/ib-b")
    assert diff["jitter"] == ("0s", "1m")
    assert '"fabric":"ib-b"' in diff["input"][1]
    assert set(diff) == {"spec", "workflowId", "jitter", "input"}
    assert (await apply(client, changed)).results[0].action == "unchanged"

    # someone changes the overlap policy in the UI: the file wins again
    def ui_edit(u):
        u.description.schedule.policy.overlap = ScheduleOverlapPolicy.ALLOW_ALL
        return ScheduleUpdate(schedule=u.description.schedule)

    await client.get_schedule_handle(ids["a"]).update(ui_edit)
    [r] = (await apply(client, changed)).results
    assert [(c.field, c.old, c.new) for c in r.changes] == [("overlap", "allow_all", "skip")]
    desc = await client.get_schedule_handle(ids["a"]).describe()
    assert desc.schedule.policy.overlap == ScheduleOverlapPolicy.SKIP


async def test_pause_via_file(client, ids, cleanup):
    base = entry(ids["a"])
    await apply(client, {"group": ids["group"], "schedules": [base]})
    [r] = (
        await apply(
            client, {"group": ids["group"], "schedules": [{**base, "paused": True, "note": "fabric maintenance"}]}
        )
    ).results
    assert {c.field: (c.old, c.new) for c in r.changes} == {
        "paused": ("false", "true"),
        "note": ("''", "'fabric maintenance'"),
    }
    desc = await client.get_schedule_handle(ids["a"]).describe()
    assert desc.schedule.state.paused and desc.schedule.state.note == "fabric maintenance"
    # a file that does not say `paused` leaves an operator's pause alone
    assert (await apply(client, {"group": ids["group"], "schedules": [base]})).results[0].action == "unchanged"
    assert (await client.get_schedule_handle(ids["a"]).describe()).schedule.state.paused
    [r] = (await apply(client, {"group": ids["group"], "schedules": [{**base, "paused": False}]})).results
    assert [(c.field, c.new) for c in r.changes] == [("paused", "false")]
    assert not (await client.get_schedule_handle(ids["a"]).describe()).schedule.state.paused


async def test_dry_run_changes_nothing(client, ids, cleanup):
    doc = {"group": ids["group"], "schedules": [entry(ids["a"])]}
    report = await apply(client, doc, dry_run=True)
    assert report.results[0].action == "created" and report.dry_run
    assert "would create" in report.lines()[0] and "dry run: nothing applied" in report.lines()[-1]
    assert not await exists(client, ids["a"])
    await apply(client, doc)
    before = await client.get_schedule_handle(ids["a"]).describe()
    changed = {"group": ids["group"], "schedules": [entry(ids["a"], overlap="buffer_one")]}
    assert (await apply(client, changed, dry_run=True)).results[0].action == "updated"
    after = await client.get_schedule_handle(ids["a"]).describe()
    assert (
        after.schedule.policy.overlap == ScheduleOverlapPolicy.SKIP
        and after.info.last_updated_at == before.info.last_updated_at
    )


async def test_prune_deletes_only_this_groups_unlisted_schedules(client, ids, cleanup):
    g = ids["group"]
    await apply(client, {"group": g, "schedules": [entry(ids["a"]), entry(ids["b"], fabric="ib-b")]})
    await apply(client, {"group": f"{g}-other", "schedules": [entry(ids["c"], fabric="ib-c")]})
    await listed(client, ids["a"], ids["b"], ids["c"])

    only_a = {"group": g, "schedules": [entry(ids["a"])]}
    dry = await apply(client, only_a, prune=True, dry_run=True)
    assert [(r.id, r.action) for r in dry.results] == [(ids["a"], "unchanged"), (ids["b"], "deleted")]
    assert await exists(client, ids["b"])

    assert (await apply(client, only_a)).results[0].action == "unchanged"  # no prune: b stays
    assert await exists(client, ids["b"])
    report = await apply(client, only_a, prune=True)
    assert [(r.id, r.action) for r in report.results] == [(ids["a"], "unchanged"), (ids["b"], "deleted")]
    assert not await exists(client, ids["b"])
    assert await exists(client, ids["c"])  # another group's


# ---------------------------------------------------------------- CLI


async def test_cli_invalid_file_exits_2_and_creates_nothing(client, ids, tmp_path, temporal_address):
    path = tmp_path / "schedules.yaml"
    path.write_text(yaml.safe_dump({"schedules": [entry(ids["a"]), entry(ids["b"], cron="every day")]}))
    result = await cli("schedules", "apply", str(path), "--address", temporal_address)
    assert result.returncode == 2, result
    assert "nothing was applied" in result.stderr and f"{path}: schedules[1] ({ids['b']}).cron:" in result.stderr
    assert "Traceback" not in result.stderr
    assert not await exists(client, ids["a"])


async def test_cli_apply_and_list(client, ids, cleanup, tmp_path, temporal_address):
    path = tmp_path / "schedules.yaml"
    path.write_text(yaml.safe_dump({"group": ids["group"], "schedules": [entry(ids["a"], paused=True, note="held")]}))
    result = await cli("schedules", "apply", str(path), "--address", temporal_address)
    assert result.returncode == 0, result
    assert f"created      {ids['a']}" in result.stdout
    result = await cli("schedules", "apply", str(path), "--address", temporal_address, "--json")
    assert result.returncode == 0, result
    assert json.loads(result.stdout)["results"] == [
        {"id": ids["a"], "action": "unchanged", "changes": [], "warnings": []}
    ]

    await listed(client, ids["a"])
    result = await cli("schedules", "list", "--address", temporal_address, "--json")
    assert result.returncode == 0, result
    [row] = [r for r in json.loads(result.stdout) if r["id"] == ids["a"]]
    assert (
        row["workflow"] == "FabricAudit" and row["spec"] == f"cron {YEARLY}" and row["paused"] and row["note"] == "held"
    )
    assert row["group"] == ids["group"] and len(row["next_runs"]) == 3 and row["last_run"] is None
    result = await cli("schedules", "list", "--address", temporal_address)
    assert result.returncode == 0, result
    assert ids["a"] in result.stdout and "FabricAudit" in result.stdout and "yes (held)" in result.stdout


async def test_list_shows_the_last_run(client, ids, cleanup):
    await apply(client, {"group": ids["group"], "schedules": [entry(ids["a"])]}, task_queue=f"no-worker-{ids['group']}")
    await client.get_schedule_handle(ids["a"]).trigger()
    for _ in range(100):
        rows = {r.id: r for r in await list_schedules(client)}
        if ids["a"] in rows and rows[ids["a"]].last_run:
            break
        await asyncio.sleep(0.1)
    last = rows[ids["a"]].last_run
    assert last and last.workflow_id.startswith("fabric-audit/ib-a") and last.status == "RUNNING"
    await client.get_workflow_handle(last.workflow_id).terminate("test done")
