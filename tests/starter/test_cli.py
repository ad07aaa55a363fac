"""The `millwright` CLI against the session dev server: as users run it (a subprocess) for a bad input's exit and
one run watched to its end, in-process (tests/cli_in_process.py) for the rest."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.cli_in_process import cli, command_environment
from tests.conftest import end_disruption_budgets
from tests.worker_process import REPO, spawn_worker, worker_env

pytestmark = pytest.mark.asyncio(loop_scope="session")

EXAMPLE = REPO / "examples" / "node-maintenance.json"


def millwright(
    *args: str, stdin: str | None = None, cwd: Path = REPO, timeout: float = 60
) -> subprocess.CompletedProcess:
    """The installed entry point in a subprocess (`python -m starter`: the real exit, os._exit); the other tests
    run the same commands in-process (`cli`)."""
    env = command_environment(dict(os.environ))
    env["TEMPORAL_CONFIG_FILE"] = str(cwd / "no-such-temporal.toml")
    env["MILLWRIGHT_STATE_DIR"] = str(cwd / ".no-lab")
    return subprocess.run(
        [sys.executable, "-m", "starter", *args],
        input=stdin,
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


async def cli_process(*args: str, **kw) -> subprocess.CompletedProcess:
    return await asyncio.to_thread(millwright, *args, **kw)


async def count_runs(client, query: str) -> int:
    await asyncio.sleep(1.0)  # visibility is eventually consistent
    return (await client.count_workflows(query)).count


async def test_example_input_is_valid():
    from starter.client import parse_input

    inp = parse_input("NodeMaintenance", EXAMPLE.read_text())
    assert inp.cluster == "lab" and inp.node == "gpu-node-03"


async def test_start_with_a_bad_field_exits_2_and_starts_nothing(client, temporal_address):
    task_queue = f"cli-bad-{uuid.uuid4().hex[:8]}"
    bad = {"cluster": "lab", "node": "Not_A_Node!", "reason": "kernel update", "uncordon_after": "maybe"}
    result = await cli_process(
        "start", "NodeMaintenance", "--input", "-", "--address", temporal_address, "--task-queue", task_queue,
        stdin=json.dumps(bad),
    )  # fmt: skip
    assert result.returncode == 2, result
    assert "nothing was started" in result.stderr
    assert "node:" in result.stderr and "uncordon_after:" in result.stderr
    assert "Traceback" not in result.stderr
    assert await count_runs(client, f"TaskQueue = '{task_queue}'") == 0


async def test_start_rejects_non_json_and_unknown_workflow():
    result = await cli("start", "NodeMaintenance", "--input", "-", stdin="{not json")
    assert result.returncode == 2 and "not valid JSON" in result.stderr
    result = await cli("start", "NoSuchWorkflow", "--input", str(EXAMPLE))
    assert result.returncode == 2
    assert "unknown workflow 'NoSuchWorkflow'" in result.stderr and "NodeMaintenance" in result.stderr


async def test_a_mig_config_the_profile_table_lacks_is_refused_as_ours_not_mig_parteds():
    # all-1g.12gb is mig-parted's (H100 NVL); what lacks it is Millwright's table, which has no H100 NVL row.
    inp = {"cluster": "lab", "name": "nvl", "config": "all-1g.12gb", "nodeSelectors": {"matchLabels": {"mig": "true"}}}
    result = await cli("start", "GpuPartitioning", "--input", "-", stdin=json.dumps(inp))
    assert result.returncode == 2 and "nothing was started" in result.stderr
    said = " ".join(result.stderr.split())
    assert "'all-1g.12gb' is no config of a GPU model in Millwright's MIG profile table" in said, result.stderr
    assert "built-in" not in said


async def test_start_twice_attaches_to_the_running_run(client, temporal_address):
    # No worker polls this queue: the run stays RUNNING, so the second submission must collapse into it.
    task_queue = f"cli-dup-{uuid.uuid4().hex[:8]}"
    wf_id = f"cli-dup-{uuid.uuid4().hex[:8]}"
    args = ("start", "NodeMaintenance", "--input", str(EXAMPLE), "--address", temporal_address,
            "--task-queue", task_queue, "--id", wf_id, "--ui", "http://ui.example:8233")  # fmt: skip
    first = await cli(*args)
    assert first.returncode == 0, first
    assert f"workflow id: {wf_id}" in first.stdout
    assert f"http://ui.example:8233/namespaces/default/workflows/{wf_id}/" in first.stdout
    run_id = first.stdout.split("run id:")[1].split()[0]
    second = await cli(*args)
    assert second.returncode == 0, second
    assert "already running" in second.stdout and run_id in second.stdout
    desc = await client.get_workflow_handle(wf_id).describe()
    assert desc.run_id == run_id and desc.task_queue == task_queue
    # search attributes from the input are set at start
    assert "MillwrightCluster" in desc.raw_description.workflow_execution_info.search_attributes.indexed_fields
    await client.get_workflow_handle(wf_id).terminate("test over")

    watched = await cli("watch", wf_id, "--address", temporal_address)
    assert watched.returncode == 1, watched
    assert "TERMINATED" in watched.stderr


async def test_watch_unknown_id_exits_1(temporal_address):
    result = await cli("watch", f"nope-{uuid.uuid4().hex[:6]}", "--address", temporal_address)
    assert result.returncode == 1 and "no workflow with ID" in result.stderr


async def test_schema_writes_input_and_output_schemas(tmp_path):
    result = await cli("schema", "--out", str(tmp_path / "schemas"))
    assert result.returncode == 0, result
    out = tmp_path / "schemas"
    index = json.loads((out / "index.json").read_text())
    names = [w["name"] for w in index["workflows"]]
    assert "NodeMaintenance" in names and index["task_queue"] == "millwright"
    for entry in index["workflows"]:
        for kind in ("input", "output"):
            doc = json.loads((out / entry[kind]).read_text())
            assert doc["type"] == "object" and doc["properties"], entry[kind]
    nm = json.loads((out / "NodeMaintenance.input.schema.json").read_text())
    assert {"cluster", "node", "reason"} <= set(nm["required"])
    assert nm["additionalProperties"] is False
    # the shipped example only uses fields the schema knows
    assert set(json.loads(EXAMPLE.read_text())) <= set(nm["properties"])

    stdout = await cli("schema")
    assert stdout.returncode == 0
    assert "NodeMaintenance.input.schema.json" in json.loads(stdout.stdout)["schemas"]


# ---------------------------------------------------------------- end to end: start --watch against a real worker


@pytest.fixture(scope="module")
def lab_worker(temporal_address, tmp_path_factory):
    """Kubernetes emulator seeded with the demo fleet + a `python -m worker` on a fresh task queue."""
    import yaml

    from lab.k8s.admin import kubeconfig
    from lab.k8s.process import EmulatorProcess

    tmp = tmp_path_factory.mktemp("cli-e2e")
    task_queue = f"cli-e2e-{uuid.uuid4().hex[:8]}"
    with EmulatorProcess(seeds=[str(REPO / "lab" / "fleets" / "demo.json")], grace_scale=0.05) as emu:
        (tmp / "kubeconfig").write_text(yaml.safe_dump(kubeconfig(emu.url, "lab")))
        env = worker_env(tmp, temporal_address, tmp / "kubeconfig", MILLWRIGHT_TASK_QUEUE=task_queue)
        worker = spawn_worker(env, tmp / "worker.log")
        try:
            yield task_queue
        finally:
            worker.terminate()
            worker.wait(15)


async def test_start_watch_end_to_end(lab_worker, temporal_address, client):
    await end_disruption_budgets(client)  # this emulator's cluster "lab": none bound to an earlier test's queue
    wf_id = f"cli-e2e-{uuid.uuid4().hex[:8]}"
    result = await cli_process(
        "start", "NodeMaintenance", "--input", str(EXAMPLE), "--id", wf_id, "--task-queue", lab_worker,
        "--address", temporal_address, "--watch",
        timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result
    payload = json.loads(result.stdout[result.stdout.index("{") :])
    assert payload["outcome"] == "completed" and payload["node"] == "gpu-node-03" and payload["uncordoned"] is True
    assert "COMPLETED" in result.stderr

    again = await cli("watch", wf_id, "--address", temporal_address)
    assert again.returncode == 0, again
    assert json.loads(again.stdout)["outcome"] == "completed"
