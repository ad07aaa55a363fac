"""FleetBurnIn on a dev server that suggests continue-as-new after 20 events: the fleet continues as new while its
servers burn in, the next run waits for the children an earlier run started, and every server is burned in once
and counted once."""

from __future__ import annotations

import pytest

from lab.hosts import LabHosts
from lab.redfish import BmcAdmin
from tests.carried_helpers import carried_waits, runs_of
from tests.workers import settings_worker
from tests.workflows.burnin.test_fleet_burnin import fleet_input
from tests.workflows.maintenance.test_node_maintenance import record_history
from workflows.burnin.fleet_burnin import FleetBurnIn

pytestmark = pytest.mark.timeout(240)


async def test_fleet_continues_as_new_while_its_servers_burn_in(small_history_env, burnin_bmcs, bmc_secret_file,
                                                                kubeconfig_path):  # fmt: skip
    client = small_history_env.client
    names = burnin_bmcs.names[:6]
    admin = BmcAdmin(burnin_bmcs.url)
    await admin.reset()
    await admin.config(power_delay=0.1)
    for name in names[1:3]:
        await admin.set_gpu_faults(name, {"xid_under_load": {"gpu": 0, "xid": 79}})
    # Failures never pause this fleet: the test is about the boundary, not the threshold.
    inp = fleet_input(burnin_bmcs, names, max_concurrent=2, pause_when_failed_share=1.0)
    try:
        async with (LabHosts(client, burnin_bmcs.url, boot_delay=0.2, poll_interval=0.1),
                    settings_worker(client, kubeconfig_path, "burnin-can",
                                    bmc_credentials=f"file:{bmc_secret_file}") as queue):  # fmt: skip
            result = await client.execute_workflow(FleetBurnIn.run, inp, id=inp.workflow_id(), task_queue=queue)
    finally:
        await admin.reset()
        await admin.aclose()

    r = result.report
    assert (r.passed, r.failed, r.errors, r.skipped, r.total, r.running, r.pending) == (4, 2, 0, 0, 6, [], 0)
    assert sorted(o.server for o in result.outcomes) == names[1:3]
    assert all(o.result == "failed" and "GPU0" in o.reason for o in result.outcomes), result.outcomes
    # It continued as new with servers still burning in, and a later run waited for them by ID.
    runs = await runs_of(client, inp.workflow_id())
    assert len(runs) > 2
    await record_history(client.get_workflow_handle(inp.workflow_id(), run_id=runs[1].run_id), "fleet_burn_in_carried")
    waited = await carried_waits(client, inp.workflow_id())
    assert waited and set(waited) <= {f"burn-in of {n}" for n in names}
    # Each server burned in exactly once.
    for name in names:
        assert len(await runs_of(client, f"burn-in/{name}")) == 1, name
