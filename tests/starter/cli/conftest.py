"""One lab for the CLI's operator tests: a Kubernetes emulator with a cluster of its own (`cli`, so its disruption
budget is no other test's), a worker in this process, and one rollout the tests drive in order."""

from __future__ import annotations

import contextlib
import uuid

import pytest_asyncio
import yaml

from tests.kube_helpers import declare_lab_budget, wait_for
from tests.workflows.rollout.helpers import JOBS_FAST, REBOOT_SECONDS, rollout_fleet, rollout_spec

CLUSTER = "cli"
FAILING = "a-01"  # its apply stage fails every time: erroring, then retried
RULES = [{"node": FAILING, "stage": "apply", "outcome": "fail", "seconds": 0.1, "message": "dkms build failed",
          "log": "building nvidia-dkms 550.54\nerror: dkms build failed"}]  # fmt: skip


class Lab:
    def __init__(self, admin, kubeconfig, worker, client, address, rollout_id):
        self.admin, self.kubeconfig, self.worker, self.client = admin, kubeconfig, worker, client
        self.address, self.rollout_id = address, rollout_id

    def args(self, *args: str) -> tuple[str, ...]:
        return (*args, "--address", self.address)


@pytest_asyncio.fixture(scope="package", loop_scope="session")
async def lab(client, temporal_address, tmp_path_factory):
    from lab.k8s.admin import EmulatorAdmin, kubeconfig
    from lab.k8s.process import EmulatorProcess
    from worker import registry
    from worker.config import WorkerSettings
    from workflows.rollout.rollout import Rollout

    tmp = tmp_path_factory.mktemp("cli-lab")
    with EmulatorProcess(pod_start_seconds=0.3, grace_scale=0.02) as emu:
        path = tmp / "kubeconfig"
        path.write_text(yaml.safe_dump(kubeconfig(emu.url, CLUSTER)))
        admin = EmulatorAdmin(emu.url)
        await admin.seed(rollout_fleet({"a": 6}))
        await admin.configure(jobs={**JOBS_FAST, "rules": RULES}, rebootSeconds=REBOOT_SECONDS)
        registration = registry.build(WorkerSettings(kubeconfig=str(path), metrics_port=0))
        async with registry.new_worker(client, registration, f"cli-{uuid.uuid4().hex[:8]}") as worker:
            policy = {"default": {"budget": {"count": 2}, "strategy": {"fixed": {"initialBatch": 2}}}}
            # The cluster's budget, as its operator declares it (the rollout's own only caps the rollout).
            await declare_lab_budget(client, worker.task_queue, {"count": 2}, cluster=CLUSTER)
            spec = rollout_spec(f"ops-{uuid.uuid4().hex[:6]}", policy=policy, approval="batch", cluster=CLUSTER)
            handle = await client.start_workflow(
                Rollout.run, spec, id=spec.workflow_id(), task_queue=worker.task_queue,
                search_attributes=spec_attributes(spec),
            )  # fmt: skip
            yield Lab(admin, path, worker, client, temporal_address, handle.id)
            await terminate_all(client, handle.id)
        await registration.close()
        await admin.aclose()


def spec_attributes(spec):
    from starter.client import search_attributes_of

    return search_attributes_of(spec)


async def terminate_all(client, *ids: str) -> None:
    from temporalio.service import RPCError

    for wf in (*ids, f"disruption-budget/{CLUSTER}"):
        with contextlib.suppress(RPCError):  # closed already
            await client.get_workflow_handle(wf).terminate("test over")


async def rollout_status(lab, predicate, what, timeout=60):
    from workflows.rollout.rollout import Rollout

    async def probe():
        status = await lab.client.get_workflow_handle(lab.rollout_id).query(Rollout.status)
        return status if predicate(status) else None

    return await wait_for(probe, what=what, timeout=timeout)


@pytest_asyncio.fixture(loop_scope="session")
async def core_cli(lab):
    """The official asyncio client on the lab's cluster, as a person with kubectl would touch it."""
    from kubernetes.aio import client as k8s_client
    from kubernetes.aio import config as k8s_config

    api = await k8s_config.new_client_from_config(str(lab.kubeconfig), context=CLUSTER)
    yield k8s_client.CoreV1Api(api)
    await api.close()
