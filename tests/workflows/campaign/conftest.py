"""A campaign test module's clusters: one Kubernetes emulator per name in the module's `CLUSTERS`, and a worker on a
random task queue whose kubeconfig has a context for each, with the burn-in tier's BMC credentials
(tests/workflows/burnin/conftest.py: its lab BMCs and host agents, for a firmware campaign's servers)."""

from __future__ import annotations

import contextlib
import uuid

import pytest
import pytest_asyncio
import yaml

from lab.k8s.admin import kubeconfig, merged_kubeconfig
from tests.conftest import GRACE_SCALE, POD_START_SECONDS, end_disruption_budgets
from tests.kube_helpers import checked_emulator
from tests.workflows.burnin import conftest as _burnin

burnin_bmcs = _burnin.burnin_bmcs
bmc_secret_file = _burnin.bmc_secret_file
bmc_admin = _burnin.bmc_admin
lab_hosts = _burnin.lab_hosts


@pytest.fixture(scope="module")
def emulators(request, tmp_path_factory):
    with contextlib.ExitStack() as stack:
        yield {
            c: stack.enter_context(checked_emulator(tmp_path_factory.mktemp(f"k8s-{c}"),
                                                    pod_start_seconds=POD_START_SECONDS, grace_scale=GRACE_SCALE))
            for c in request.module.CLUSTERS
        }  # fmt: skip


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def campaign_worker(client, emulators, bmc_secret_file, tmp_path_factory):
    from worker import registry
    from worker.config import WorkerSettings

    path = tmp_path_factory.mktemp("kube") / "kubeconfig"
    path.write_text(yaml.safe_dump(merged_kubeconfig([kubeconfig(e.url, c) for c, e in emulators.items()])))
    settings = WorkerSettings(kubeconfig=str(path), metrics_port=0, bmc_credentials=f"file:{bmc_secret_file}")
    registration = registry.build(settings)
    async with registry.new_worker(client, registration, f"test-{uuid.uuid4().hex[:8]}") as worker:
        yield worker
    await registration.close()
    await end_disruption_budgets(client)
