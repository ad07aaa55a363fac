"""A worker SIGKILLed in the middle of a burn-in: the replacement neither repeats the completed power cycle nor
loses the run."""

from __future__ import annotations

import uuid

import pytest

from tests.worker_process import spawn_worker, stop_worker, wait_polling, worker_env
from tests.workflows.burnin.test_server_burnin import burn_in_input, resets, wait_phase
from workflows.burnin.server_burnin import ServerBurnIn

# A worker killed or an API failing under the workflows: replay what they wrote (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("replay_histories")


async def test_sigkill_mid_burn_in_does_not_repeat_the_power_cycle(
        client, temporal_address, kubeconfig_path, bmc_secret_file, burnin_bmcs, bmc_admin, lab_hosts, tmp_path):  # fmt: skip
    name = burnin_bmcs.names[7]
    queue = f"burnin-crash-{uuid.uuid4().hex[:6]}"
    env = worker_env(tmp_path, temporal_address, kubeconfig_path, MILLWRIGHT_TASK_QUEUE=queue,
                     MILLWRIGHT_BMC_CREDENTIALS=f"file:{bmc_secret_file}")  # fmt: skip
    log = tmp_path / "worker.log"
    await bmc_admin.power(name, "On")  # delivered running: the burn-in's power cycle is a real Off and On
    worker = spawn_worker(env, log)
    try:
        await wait_polling(client, queue, worker, log)
        inp = burn_in_input(burnin_bmcs, name, stress_seconds=4)
        handle = await client.start_workflow(ServerBurnIn.run, inp, id=f"{inp.workflow_id()}-{uuid.uuid4().hex[:6]}",
                                             task_queue=queue)  # fmt: skip
        await wait_phase(handle, "stressing")
        assert await resets(bmc_admin, name) == ["ForceOff", "On"]  # the power cycle into the burn-in image
        worker.kill()  # SIGKILL: no graceful shutdown, in-flight workflow tasks are lost
        worker.wait(10)
        worker = spawn_worker(env, log)
        result = await handle.result()
    finally:
        stop_worker(worker)
    assert result.result == "passed", result.summary()
    # One power cycle into the image and one into the disk: nothing was repeated.
    assert await resets(bmc_admin, name) == ["ForceOff", "On", "ForceOff", "On"]
    assert (await bmc_admin.server(name))["boot_count"] == 3
    assert "the BMC refused" not in log.read_text()
