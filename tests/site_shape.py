"""A run that reads a cluster once by a local activity and once by a regular one, for tests/worker/test_sites.py.
Test-only; in a module of its own so that the sandbox imports nothing else."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow

from activities.models import StrictModel
from activities.node_health import NodeHealthActivities, NodeNamesQuery


class ClusterRead(StrictModel):
    cluster: str
    retry_timeout: timedelta = timedelta(minutes=10)


class ClusterNames(StrictModel):
    by_local: list[str]
    by_regular: list[str]


@workflow.defn(name="SiteShape")
class SiteShape:
    @workflow.run
    async def run(self, inp: ClusterRead) -> ClusterNames:
        query = NodeNamesQuery(cluster=inp.cluster)
        local = await workflow.execute_local_activity_method(
            NodeHealthActivities.list_node_names, query, start_to_close_timeout=timedelta(seconds=15)
        )
        regular = await workflow.execute_activity_method(
            NodeHealthActivities.list_node_names, query, start_to_close_timeout=timedelta(seconds=15)
        )
        return ClusterNames(by_local=local.names, by_regular=regular.names)
