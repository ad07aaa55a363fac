"""The worker started exactly as the rendered Deployment starts it, running one NodeMaintenance.

Same command, the ConfigMap as environment, every mounted file at its mount path re-rooted
under a temp dir (and every `file:` / `*_PATH` setting re-rooted with it). Overridden, and only
these: the Temporal address/namespace (the session dev server, which has no TLS, so the
overlay's TEMPORAL_TLS_* are dropped), a unique task queue and a free metrics port on loopback.
The kubeconfig mounted from the ConfigMap is replaced by one of the same file name and context
name (`management`) pointing at the Kubernetes emulator.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import httpx
import pytest
import yaml
from temporalio.common import WorkerDeploymentVersion

from lab.loopback import free_port
from tests.deploy.manifests import (
    container_env,
    host_agent,
    mounts,
    one,
    render,
    resolved_env,
    worker_container,
    worker_deployment,
)
from tests.deploy.test_upgrade import set_current
from tests.kube_helpers import fleet_objects, read_node
from tests.worker_process import REPO, wait_polling
from workflows.maintenance.node_maintenance import NodeMaintenance, NodeMaintenanceInput

pytestmark = pytest.mark.asyncio(loop_scope="session")

OVERLAY = "overlays/self-hosted"


def lay_out_pod(objs, tmp: Path, emulator_url: str) -> tuple[list[str], dict[str, str]]:
    """Write the pod's mounted files under tmp; return (command, env) as the container gets them."""
    from lab.k8s.admin import kubeconfig

    deployment = worker_deployment(objs)
    container = worker_container(objs)
    env = container_env(objs, container)
    root = lambda path: str(tmp / path.lstrip("/"))
    for mount_path, volume in mounts(objs, deployment["spec"]["template"]["spec"], container).items():
        target = Path(root(mount_path))
        target.mkdir(parents=True, exist_ok=True)
        if "configMap" in volume:
            for key, value in one(objs, "ConfigMap", volume["configMap"]["name"])["data"].items():
                (target / key).write_text(value)
        elif "secret" in volume:
            name = volume["secret"]["secretName"]
            (target / "token").write_text(f"nbt_fake.{name}\n")
            (target / "credentials").write_text("millwright:not-a-password\n")
    context = yaml.safe_load(one(objs, "ConfigMap", "millwright-kubeconfig")["data"]["in-cluster.yaml"])
    for path in env["MILLWRIGHT_KUBECONFIG"].split(":"):
        Path(root(path)).write_text(yaml.safe_dump(kubeconfig(emulator_url, context["current-context"])))
    rooted = {}
    for key, value in env.items():
        if value.startswith("file:"):
            rooted[key] = "file:" + root(value.removeprefix("file:"))
        elif key == "MILLWRIGHT_KUBECONFIG":
            rooted[key] = ":".join(root(p) for p in value.split(":"))
        elif key.endswith("_PATH"):
            rooted[key] = root(value)
        else:
            rooted[key] = value
    for key, value in rooted.items():
        if value.startswith("file:"):
            assert Path(value.removeprefix("file:")).is_file(), f"{key}: {value} not mounted"
    return container["command"], rooted


async def test_worker_as_deployed_runs_node_maintenance(client, temporal_address, k8s, k8s_emulator, tmp_path):
    objs = render(OVERLAY)
    command, pod_env = lay_out_pod(objs, tmp_path / "pod", k8s_emulator.url)
    port = free_port()
    task_queue = f"deploy-{uuid.uuid4().hex[:8]}"
    build_id = f"as-deployed-{uuid.uuid4().hex[:6]}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TEMPORAL_", "MILLWRIGHT_", "KUBECONFIG"))}
    env.update({k: v for k, v in pod_env.items() if not k.startswith("TEMPORAL_TLS_")})
    env.update(
        TEMPORAL_ADDRESS=temporal_address,
        TEMPORAL_NAMESPACE="default",
        TEMPORAL_CONFIG_FILE=str(tmp_path / "no-such.toml"),
        MILLWRIGHT_TASK_QUEUE=task_queue,
        MILLWRIGHT_METRICS_HOST="127.0.0.1",
        MILLWRIGHT_METRICS_PORT=str(port),
        MILLWRIGHT_BUILD_ID=build_id,  # as deploy/Dockerfile sets it in the image
        PYTHONUNBUFFERED="1",
    )
    executable = Path(sys.executable).parent / command[0]
    assert executable.is_file(), f"{command[0]} is not installed in the venv"
    log = tmp_path / "worker.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen(
            [str(executable), *command[1:]], env=env, cwd=tmp_path, stdout=fh, stderr=subprocess.STDOUT
        )
    try:
        await wait_polling(client, task_queue, proc, log)
        # The deploy step that gives a new build its work (docs/production.md, "Upgrades").
        await set_current(temporal_address, WorkerDeploymentVersion(pod_env["MILLWRIGHT_DEPLOYMENT_NAME"], build_id))
        # The probes' target answers.
        async with httpx.AsyncClient(trust_env=False, timeout=5) as http:
            assert (await http.get(f"http://127.0.0.1:{port}/metrics")).status_code == 200

        await k8s.seed(fleet_objects())
        inp = NodeMaintenanceInput(
            cluster="management",
            node="node-02",
            reason="as deployed",
            uncordon_after=True,
            drain={"eviction_retry_interval": 0.5, "timeout": 60},
        )
        handle = await client.start_workflow(
            NodeMaintenance.run, inp, id=f"{inp.workflow_id()}/{uuid.uuid4().hex[:6]}", task_queue=task_queue
        )
        result = await asyncio.wait_for(handle.result(), timeout=60)
        assert result.uncordoned, result
        from kubernetes.aio import client as k8s_client
        from kubernetes.aio import config as k8s_config

        api = await k8s_config.new_client_from_config(pod_env["MILLWRIGHT_KUBECONFIG"].split(":")[0])
        try:
            assert not (await read_node(k8s_client.CoreV1Api(api), "node-02")).spec.unschedulable
        finally:
            await api.close()

        proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(proc.wait, 20) == 0, log.read_text()
        out = log.read_text()
        assert "stopped cleanly" in out and "Traceback" not in out
        assert "nbt_fake" not in out and "not-a-password" not in out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


async def test_search_attribute_job_script_is_idempotent(temporal_address, tmp_path):
    """The Job's script, with the Job's env, against the dev server (attributes already registered)."""
    objs = render(OVERLAY)
    job = one(objs, "Job", "millwright-search-attributes")
    container = job["spec"]["template"]["spec"]["containers"][0]
    env = {k: v for k, v in os.environ.items() if not k.startswith("TEMPORAL_")}
    env.update({k: v for k, v in container_env(objs, container).items() if not k.startswith("TEMPORAL_TLS_")})
    env.update(
        TEMPORAL_ADDRESS=temporal_address,
        TEMPORAL_NAMESPACE="default",
        TEMPORAL_CONFIG_FILE=str(tmp_path / "no-such.toml"),
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
    )
    result = await asyncio.to_thread(
        subprocess.run,
        [*container["command"], *container["args"]],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("already registered") == 4, result.stdout


async def test_host_agent_as_deployed_polls_its_node_queue(client, temporal_address, tmp_path):
    """The DaemonSet's command and environment (node name from spec.nodeName), against the dev server:
    it polls millwright-host-<node>, serves its liveness probe's target and stops cleanly on SIGTERM."""
    from temporalio.api.enums.v1 import TaskQueueType

    from activities.gpu.models import host_task_queue

    objs = render(OVERLAY)
    _, container = host_agent(objs)
    node = f"gpu-node-{uuid.uuid4().hex[:6]}"
    pod_env = {k: (node if v == ("field", "spec.nodeName") else v) for k, v in resolved_env(objs, container).items()}
    assert all(isinstance(v, str) for v in pod_env.values()), pod_env
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TEMPORAL_", "MILLWRIGHT_", "KUBECONFIG"))}
    env.update({k: v for k, v in pod_env.items() if not k.startswith("TEMPORAL_TLS_")})
    env.update(
        TEMPORAL_ADDRESS=temporal_address,
        TEMPORAL_NAMESPACE="default",
        TEMPORAL_CONFIG_FILE=str(tmp_path / "no-such.toml"),
        MILLWRIGHT_METRICS_HOST="127.0.0.1",
        MILLWRIGHT_METRICS_PORT=str(port),
        PYTHONUNBUFFERED="1",
    )
    command = container["command"]
    executable = Path(sys.executable).parent / command[0]
    assert executable.is_file(), f"{command[0]} is not in the venv"
    log = tmp_path / "host-agent.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen(
            [str(executable), *command[1:]], env=env, cwd=tmp_path, stdout=fh, stderr=subprocess.STDOUT
        )
    try:
        await wait_polling(client, host_task_queue(node), proc, log, queue_type=TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY)
        async with httpx.AsyncClient(trust_env=False, timeout=5) as http:
            assert (await http.get(f"http://127.0.0.1:{port}/metrics")).status_code == 200
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(proc.wait, 20) == 0, log.read_text()
        assert "Traceback" not in log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
