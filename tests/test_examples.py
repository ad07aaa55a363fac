"""Every file in examples/ runs to completion in the default lab, with the command its docs give.

One lab for the module: the real `millwright lab up` as a subprocess (tests/test_lab_runner.py's `LabProcess`) with
a temporary state dir and every service, NetBox included (the NetBox tier's cached venv and database dump under
~/.cache/millwright: about 30 s to start once cached; skipped like that tier where NetBox cannot run, a failure in
CI). The examples run through the CLI (`millwright start ... --watch`, `rollout plan`, `schedules apply`) in two
lanes at once: the ones that take nodes out of service one after the other (they share the cluster's disruption
budget), and the cluster and tenant ones. Files that need the lab's values (a BMC URL, the webhook receiver) run
from the copies `lab up` writes into its state dir, as the docs say. `EXAMPLES` says how each one runs and what
its outcome must be; an example file it does not list fails `test_every_example_is_covered`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.test_lab_runner import REPO, LabProcess, cli_env

EXAMPLES_DIR = REPO / "examples"
COMMAND_TIMEOUT = 600
pytestmark = pytest.mark.needs_netbox  # the lab it brings up includes NetBox (tests/conftest.py orders it last)


@dataclass
class Example:
    """How one example file runs (`workflow`: `millwright start <workflow> --input <file> --watch`; else `cli`
    with `{file}` replaced) and what its outcome must be (`check(result)`: a list of what is wrong)."""

    lane: str
    check: Callable[[Any], list[str]]
    workflow: str | None = None
    cli: tuple[str, ...] = ()
    lab_copy: bool = False  # run the copy `lab up` wrote into <state-dir>/examples/


def expect(**wanted: Any) -> Callable[[Any], list[str]]:
    return lambda result: [f"{k} is {result.get(k)!r}, want {v!r}" for k, v in wanted.items() if result.get(k) != v]


def rollout_done(result: dict) -> list[str]:
    done = (result.get("compartments") or {}).get("__default__") or {}
    return expect(outcome="completed")(result) + (
        []
        if done.get("completedNodes") == 6 and not done.get("failedNodes")
        else [f"compartment __default__: {done}, want 6 nodes completed, none failed"]
    )


def campaign_done(**lab: Any) -> Callable[[Any], list[str]]:
    """A campaign completed, its one cluster `lab` ended as `lab` says."""
    return lambda result: (
        expect(outcome="completed")(result)
        + [f"cluster lab: {wrong}" for wrong in expect(**lab)((result.get("clusters") or {}).get("lab") or {})]
    )


def sweep_done(result: dict) -> list[str]:
    lab = (result.get("clusters") or [{}])[0]
    return [] if lab.get("nodes") == 6 and lab.get("error") is None else [f"cluster lab: {lab}, want 6 nodes read"]


def burned_in(result: dict) -> list[str]:
    wrong = expect(result="passed", gpus=8)(result)
    if not any("back in service" in n for n in result.get("notes") or []):
        wrong.append(f"notes {result.get('notes')}: the node was not put back in service")
    return wrong


def firmware_updated(result: dict) -> list[str]:
    wrong = expect(result="updated")(result)
    states = {c["name"]: c["state"] for c in result.get("components") or []}
    if states != {"BMC": "active", "BIOS": "active", "CPLD": "active"}:
        wrong.append(f"components {states}: want BMC, BIOS and CPLD active")
    if not any("back in service" in n for n in result.get("notes") or []):
        wrong.append(f"notes {result.get('notes')}: the node was not put back in service")
    return wrong


def fleet_updated(result: dict) -> list[str]:
    states = {s["server"]: s["state"] for s in result.get("servers") or []}
    wrong = expect(aborted=None)(result)
    if len(states) != 6 or set(states.values()) - {"updated", "up-to-date"}:
        wrong.append(f"servers {states}: want the 6 GPU nodes updated or already up to date")
    return wrong


def onboarded(result: dict) -> list[str]:
    netbox = [s for s in result.get("steps") or [] if s.get("step") == "netbox"]
    return [] if netbox else [f"steps {[s.get('step') for s in result.get('steps') or []]}: no NetBox record"]


def applied(output: str) -> list[str]:
    return (
        []
        if "fleet-health-sweep/lab" in output and "fabric-audit/lab-ib" in output
        else [f"schedules apply printed no fleet-health-sweep/lab and fabric-audit/lab-ib:\n{output}"]
    )


def planned(output: str) -> list[str]:
    return [] if "6 nodes targeted" in output else [f"rollout plan did not target the 6 GPU nodes:\n{output}"]


NODES, TENANTS = "nodes", "tenants"
EXAMPLES: dict[str, Example] = {
    "server-burn-in.json": Example(NODES, burned_in, workflow="ServerBurnIn", lab_copy=True),
    "firmware-update.json": Example(NODES, firmware_updated, workflow="FirmwareUpdate", lab_copy=True),
    "node-maintenance.json": Example(NODES, expect(outcome="completed", uncordoned=True), workflow="NodeMaintenance"),
    "node-remediation.json": Example(
        NODES, expect(outcome="healthy", uncordoned=True), workflow="NodeRemediation", lab_copy=True
    ),
    "rollout.yaml": Example(NODES, planned, cli=("rollout", "plan", "{file}")),
    "rollout.json": Example(NODES, rollout_done, workflow="Rollout"),
    "fleet-rollout.json": Example(NODES, campaign_done(state="completed"), workflow="FleetRollout"),
    # After the rollout, which waits for gpu-node-02's protected pod to finish: a drain refuses that bare pod.
    "fleet-firmware-update.json": Example(NODES, fleet_updated, workflow="FleetFirmwareUpdate", lab_copy=True),
    # After it, as a campaign: its one cluster's fleet finds the servers at the bundle (their BMCs from NetBox).
    "firmware-campaign.json": Example(
        NODES, campaign_done(state="completed", counts={"up-to-date": 3}), workflow="FirmwareCampaign"
    ),
    "fleet-health-sweep.json": Example(NODES, sweep_done, workflow="FleetHealthSweep", lab_copy=True),
    "schedules.yaml": Example(NODES, applied, cli=("schedules", "apply", "{file}")),
    # Last of its lane: gpu-node-06 keeps its MIG layout, and the trainer it evicted waits for whole GPUs.
    "gpu-partitioning.json": Example(
        NODES, expect(outcome="completed", counts={"complete": 1}), workflow="GpuPartitioning"
    ),
    # The same layout on the same node, as a campaign: its cluster's GpuPartitioning finds the node at it.
    "fleet-gpu-partitioning.json": Example(
        NODES, campaign_done(state="completed", counts={"complete": 1}), workflow="FleetGpuPartitioning"
    ),
    "tenant-cluster.json": Example(TENANTS, expect(cluster="lab:fleet/gpu-a", machines=3), workflow="CreateCluster"),
    "tenant-nlp.json": Example(TENANTS, onboarded, workflow="OnboardTenant"),
    "tenant-vision.json": Example(TENANTS, onboarded, workflow="OnboardTenant"),
    "tenant-recommender.json": Example(TENANTS, onboarded, workflow="OnboardTenant"),
    "tenant-nlp-quota.json": Example(
        TENANTS, lambda r: [] if r.get("updated") else [f"nothing updated: {r}"], workflow="UpdateTenantQuota"
    ),
}


@dataclass
class Outcome:
    command: list[str]
    rc: int | None = None
    stdout: str = ""
    stderr: str = ""
    seconds: float = 0.0
    wrong: list[str] | None = None

    def report(self) -> str:
        tail = "\n".join((self.stderr.strip().splitlines() or [""])[-12:])
        return (
            f"`{' '.join(self.command)}` exited {self.rc} after {self.seconds:.0f}s; "
            f"{'; '.join(self.wrong or []) or 'outcome as expected'}\n--- its last lines:\n{tail}"
        )


def _text(output: str | bytes | None) -> str:
    """A timed-out command's captured output as text: TimeoutExpired holds bytes even with text=True."""
    return output.decode(errors="replace") if isinstance(output, bytes) else output or ""


def millwright(state: Path, *args: str) -> Outcome:
    command = [sys.executable, "-m", "starter", *args, "--state-dir", str(state)]
    started = time.monotonic()
    try:
        done = subprocess.run(command, env=cli_env(), cwd=REPO, capture_output=True, text=True, timeout=COMMAND_TIMEOUT)
    except subprocess.TimeoutExpired as err:
        return Outcome(command, None, _text(err.stdout), f"timed out after {COMMAND_TIMEOUT}s\n{_text(err.stderr)}",
                       time.monotonic() - started, ["did not finish"])  # fmt: skip
    return Outcome(command, done.returncode, done.stdout, done.stderr, time.monotonic() - started)


def run_example(name: str, spec: Example, state: Path) -> Outcome:
    path = (state / "examples" / name) if spec.lab_copy else EXAMPLES_DIR / name
    display = str(path) if spec.lab_copy else f"examples/{name}"
    if spec.workflow:
        outcome = millwright(state, "start", spec.workflow, "--input", display, "--watch")
        if outcome.rc != 0:
            outcome.wrong = [f"{spec.workflow} did not complete"]
            return outcome
        try:
            result = json.loads(outcome.stdout[outcome.stdout.index("\n{") + 1 :])
        except ValueError:
            outcome.wrong = [f"no JSON result in the output:\n{outcome.stdout[-2000:]}"]
            return outcome
        outcome.wrong = spec.check(result)
        return outcome
    outcome = millwright(state, *(a.replace("{file}", display) for a in spec.cli))
    outcome.wrong = (["did not succeed"] if outcome.rc != 0 else []) + spec.check(outcome.stdout)
    return outcome


async def trigger_schedules(address: str) -> dict[str, str]:
    """Run each schedule of examples/schedules.yaml once now; schedule ID -> what its run ended as. Then delete
    them, so nothing fires later."""
    from temporalio.client import Client, ScheduleActionExecutionStartWorkflow
    from temporalio.service import RPCError

    client = await Client.connect(address)
    ended: dict[str, str] = {}
    for sid in ("fleet-health-sweep/lab", "fabric-audit/lab-ib", "tenant-usage/lab"):
        schedule = client.get_schedule_handle(sid)
        await schedule.trigger()
        deadline = time.monotonic() + 60
        while not (recent := (await schedule.describe()).info.recent_actions):
            assert time.monotonic() < deadline, f"schedule {sid} started nothing"
            await asyncio.sleep(0.5)
        run = recent[-1].action
        assert isinstance(run, ScheduleActionExecutionStartWorkflow), f"schedule {sid} started {run!r}"
        handle = client.get_workflow_handle(run.workflow_id, run_id=run.first_execution_run_id)
        try:
            await asyncio.wait_for(handle.result(), 180)
            ended[sid] = "completed"
        except Exception as err:
            ended[sid] = f"{type(err).__name__}: {getattr(err, 'cause', None) or err}"
        with contextlib.suppress(RPCError):
            await schedule.delete()
    return ended


@pytest.fixture(scope="module")
def lab_outcomes(tmp_path_factory):
    """The lab up once, every example run in its lane; name -> Outcome, plus the lab's own timings."""
    from lab.netbox import NetBoxUnavailable, check_available
    from tests.tiers import require

    require(check_available, NetBoxUnavailable, "NetBox")
    state = tmp_path_factory.mktemp("examples") / "state"
    started = time.monotonic()
    lab = LabProcess(state, "--port", "0")
    outcomes: dict[str, Outcome] = {}
    try:
        lab.wait_for("lab: ready", timeout=120)
        ready_at = time.monotonic() - started
        info = json.loads((state / "lab.json").read_text())

        def lane(name: str) -> None:
            for example, spec in EXAMPLES.items():
                if spec.lane == name:
                    outcomes[example] = run_example(example, spec, state)
                    if example == "schedules.yaml" and outcomes[example].rc == 0:
                        runs = asyncio.run(trigger_schedules(info["temporal"]["address"]))
                        outcomes[example].wrong = (outcomes[example].wrong or []) + [
                            f"schedule {sid}'s run: {how}" for sid, how in runs.items() if how != "completed"
                        ]

        threads = [threading.Thread(target=lane, args=(n,)) for n in (NODES, TENANTS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        netbox = json.loads((state / "lab.json").read_text())["services"]["netbox"]
        print(
            f"\nexamples: lab ready in {ready_at:.0f}s (NetBox {netbox['state']}: {netbox['note']}); "
            f"all examples done {time.monotonic() - started:.0f}s after `lab up`"
        )
        for example, outcome in outcomes.items():
            print(
                f"  {example}: {'ok' if outcome.rc == 0 and not outcome.wrong else 'FAILED'} in {outcome.seconds:.0f}s"
            )
        yield outcomes
    finally:
        lab.kill()
        from lab.netbox import NetBoxLab

        # As root the lab keeps NetBox's database outside the state dir (lab/netbox.py `_pgdata`): not left behind.
        shutil.rmtree(NetBoxLab(state / "netbox", keep_data=True)._pgdata().parent, ignore_errors=True)


def test_every_example_is_covered():
    files = sorted(p.name for p in EXAMPLES_DIR.iterdir() if p.is_file())
    missing = [f for f in files if f not in EXAMPLES]
    assert not missing, f"examples not run by tests/test_examples.py: {missing}; add each to EXAMPLES with its check"
    assert sorted(EXAMPLES) == files, (
        f"EXAMPLES lists files examples/ does not have: {sorted(set(EXAMPLES) - set(files))}"
    )


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("example", sorted(EXAMPLES))
def test_example_runs_to_completion_in_the_lab(lab_outcomes, example):
    outcome = lab_outcomes[example]
    assert outcome.rc == 0 and not outcome.wrong, f"examples/{example}: {outcome.report()}"
