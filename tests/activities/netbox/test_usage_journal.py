"""TenantUsage journals each tenant's GPU-hours on its NetBox tenant; a tenant NetBox does not hold is named in the
result instead of failing the report."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime, timedelta

from activities.capi.ownership import TENANT_LABEL
from lab.k8s.crds import TENANCY_CRDS
from tests.lab.test_lab_prometheus import namespace, queue
from tests.workflows.maintenance.test_node_maintenance import record_history
from workflows.usage.tenant_usage import TenantUsage, TenantUsageInput


async def test_each_tenant_journaled_on_its_netbox_tenant(client, nb, netbox_lab, netbox_token_file, k8s,
                                                          kubeconfig_path, prometheus, tmp_path):  # fmt: skip
    from worker import registry
    from worker.config import WorkerSettings

    suffix = uuid.uuid4().hex[:6]
    held, unknown = f"usage-held-{suffix}", f"usage-unknown-{suffix}"
    tenant = nb.tenancy.tenants.create(name=held, slug=held)
    objects = []
    for name in (held, unknown):
        q = queue(name, 2)
        q["metadata"]["labels"] = {TENANT_LABEL: name}
        objects += [q, namespace(name, {TENANT_LABEL: name}),
                    {"apiVersion": "v1", "kind": "ResourceQuota",
                     "metadata": {"name": f"{name}-quota", "namespace": name, "labels": {TENANT_LABEL: name}},
                     "spec": {"hard": {"requests.nvidia.com/gpu": "2"}}}]  # fmt: skip
    await k8s.seed(TENANCY_CRDS)
    await k8s.seed(objects)

    settings = WorkerSettings(kubeconfig=str(kubeconfig_path), metrics_port=0, prometheus_url=prometheus.url,
                              netbox_url=netbox_lab.url, netbox_token=f"file:{netbox_token_file}",
                              usage_sink_dir=str(tmp_path / "usage"))  # fmt: skip
    registration = registry.build(settings)
    end = datetime.fromtimestamp(int(time.time()), UTC)
    inp = TenantUsageInput(cluster="lab", start=end - timedelta(seconds=4), end=end, step=timedelta(seconds=1),
                           page=timedelta(seconds=4))  # fmt: skip
    try:
        async with registry.new_worker(client, registration, f"usage-nb-{suffix}") as worker:
            handle = await client.start_workflow(TenantUsage.run, inp, id=f"{inp.workflow_id()}-{suffix}",
                                                 task_queue=worker.task_queue)  # fmt: skip
            result = await handle.result()
            await record_history(handle, "tenant_usage_journal")
    finally:
        await registration.close()

    journal = result.netbox_journal
    assert journal[held].startswith("entry ") and journal[unknown].startswith("not written: no tenant"), journal
    entries = [e.comments for e in nb.extras.journal_entries.filter(assigned_object_type="tenancy.tenant",
                                                                    assigned_object_id=tenant.id)]  # fmt: skip
    assert len(entries) == 1 and "GPU-hours on lab" in entries[0] and f"namespaces {held}" in entries[0], entries
