"""The queue tree's GPU guarantees (workflows/tenancy/capacity.py), pure: parents reserve what their children
do (or their own quota when larger), a tenant's unlimited guarantee claims every GPU, KAI's own default queues
reserve none, and queues that are no tenant's count too."""

from __future__ import annotations

import pytest
from temporalio.exceptions import ApplicationError

from activities.capi.models import GpuCapacity, QueueGuarantee
from workflows.tenancy.capacity import check_queue_tree, guaranteed_gpus


def q(name: str, quota: float, parent: str | None = None, tenant: bool = False) -> QueueGuarantee:
    return QueueGuarantee(name=name, parent=parent, gpu_quota=quota, tenant=name if tenant else None)


BASELINE = [q("default-parent-queue", -1), q("default-queue", -1, "default-parent-queue"), q("tenants", -1)]


def cap(*queues: QueueGuarantee, gpus: float = 16) -> GpuCapacity:
    return GpuCapacity(gpus=gpus, queues=[*BASELINE, *queues])


@pytest.mark.parametrize(
    ("queues", "quota", "total"),
    [
        ((), 8, 8),  # the first tenant on a fresh cluster
        ((q("nlp", 8, "tenants", True),), 4, 12),
        ((q("nlp", 8, "tenants", True),), 0, 8),
        # A tenant's unlimited guarantee claims every GPU: anyone beside it oversubscribes.
        ((q("unl", -1, "tenants", True),), 1, 17),
        ((q("nlp", 8, "tenants", True),), -1, 24),
        # Queues that are no tenant's count: a person's top-level queue, a parent with its own quota.
        ((q("batch", 6),), 4, 10),
        ((q("research", 2), q("a", 3, "research"), q("b", 3, "research")), 1, 7),
        ((q("research", 10), q("a", 3, "research")), 1, 11),
        # The tenant's own queue is replaced by its new guarantee, not counted twice.
        ((q("new", 12, "tenants", True),), 4, 4),
    ],
)
def test_guaranteed_gpus(queues, quota, total):
    assert guaranteed_gpus(cap(*queues), "new", "tenants", quota) == total


def test_a_guarantee_under_another_parent_counts_with_its_subtree():
    tree = cap(q("research", 4), q("a", 3, "research"))
    assert guaranteed_gpus(tree, "new", "research", 2) == 5  # research's 4 no longer holds a (3) and new (2)
    assert guaranteed_gpus(tree, "new", "research", 1) == 4


def test_the_check_refuses_past_capacity_naming_the_field_unless_oversubscription():
    tree = cap(q("unl", -1, "tenants", True))
    with pytest.raises(ApplicationError) as err:
        check_queue_tree(tree, "gpu-a", "new", "tenants", 1, allow=False)
    assert err.value.type == "QuotaExceedsCapacity" and err.value.non_retryable
    assert err.value.message.startswith("gpu.quota: the queues' GPU guarantees would total 17 on cluster gpu-a")
    check_queue_tree(tree, "gpu-a", "new", "tenants", 1, allow=True)
