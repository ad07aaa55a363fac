"""Sites (worker/site_routing.py): a central worker with a site map and no kubeconfig sends each call to its site's
worker, local activities included; a site with no worker, or a cluster in no site, is waited out visibly and then
given up on; a site's worker that comes back takes the waiting call; a changed map replays."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowFailureError
from temporalio.exceptions import ActivityError, ApplicationError, RetryState
from temporalio.worker import Replayer

from activities.sites import SITE_WAIT, SiteMap, site_task_queue
from starter.questions import current_details
from tests.site_shape import ClusterRead, SiteShape
from tests.workers import settings_worker
from worker import registry
from worker.config import ConfigError, WorkerSettings
from worker.site_routing import SiteRouting


def _site_map(tmp_path: Path, sites: dict) -> Path:
    path = tmp_path / f"sites-{uuid.uuid4().hex[:6]}.json"
    path.write_text(json.dumps({"sites": sites}))
    return path


@asynccontextmanager
async def _central(client: Client, site_map: Path, pickup: float = 30.0) -> AsyncIterator[str]:
    """The central worker: every workflow and SiteShape, the site map, no kubeconfig."""
    async with settings_worker(client, None, "central", more_workflows=(SiteShape,), site_map=str(site_map),
                               site_pickup_seconds=pickup) as queue:  # fmt: skip
        yield queue


@asynccontextmanager
async def _site_worker(client: Client, site: str, kubeconfig: Path) -> AsyncIterator[None]:
    registration = registry.build(WorkerSettings(site=site, kubeconfig=str(kubeconfig), metrics_port=0))
    assert registration.task_queue == site_task_queue(site)
    try:
        async with registry.new_worker(client, registration, registration.task_queue):
            yield
    finally:
        await registration.close()


async def _scheduled_queues(handle) -> list[str]:
    return [e.activity_task_scheduled_event_attributes.task_queue.name
            async for e in handle.fetch_history_events()
            if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED]  # fmt: skip


async def _details_naming(handle, text: str, timeout: float = 20.0) -> str:
    for _ in range(int(timeout * 4)):
        details = await current_details(handle)
        if SITE_WAIT in details and text in details:
            return details
        await asyncio.sleep(0.25)
    raise AssertionError(f"current details never named {text!r}: {await current_details(handle)!r}")


async def test_every_call_of_a_sites_cluster_runs_on_its_sites_worker_local_ones_too(client, kubeconfig_path,
                                                                                    tmp_path):  # fmt: skip
    site = f"east-{uuid.uuid4().hex[:6]}"
    site_map = _site_map(tmp_path, {site: {"clusters": ["lab"]}})
    async with _central(client, site_map) as queue, _site_worker(client, site, kubeconfig_path):
        handle = await client.start_workflow(SiteShape.run, ClusterRead(cluster="lab"), id=f"site-{site}",
                                             task_queue=queue)  # fmt: skip
        result = await handle.result()
    assert result.by_local == result.by_regular
    # The local activity became a regular one on the site's queue: the central worker cannot reach the cluster.
    assert await _scheduled_queues(handle) == [site_task_queue(site)] * 2
    history = await handle.fetch_history()
    # Another map (another site's name) replays: the queue is not part of the determinism check.
    other = SiteMap.model_validate({"sites": {"west": {"clusters": ["lab"]}}})
    await Replayer(workflows=[SiteShape], interceptors=[SiteRouting(other, central=set())],
                   data_converter=client.data_converter,
                   workflow_runner=registry.workflow_runner()).replay_workflow(history)  # fmt: skip


async def test_a_site_with_no_worker_is_shown_waiting_and_its_call_taken_when_the_worker_returns(
    client, kubeconfig_path, tmp_path
):
    site = f"east-{uuid.uuid4().hex[:6]}"
    site_map = _site_map(tmp_path, {site: {"clusters": ["lab"]}})
    async with _central(client, site_map, pickup=1.0) as queue:
        handle = await client.start_workflow(SiteShape.run, ClusterRead(cluster="lab"), id=f"site-{site}",
                                             task_queue=queue)  # fmt: skip
        details = await _details_naming(handle, site_task_queue(site))
        assert f"site {site}" in details and "not taken by any worker" in details, details
        async with _site_worker(client, site, kubeconfig_path):
            result = await handle.result()
        assert SITE_WAIT not in await current_details(handle)
    assert result.by_local == result.by_regular


@pytest.mark.parametrize("declared", [True, False], ids=["site-without-worker", "cluster-in-no-site"])
async def test_a_call_no_site_takes_fails_as_site_unavailable_after_the_runs_retry_timeout(client, tmp_path,
                                                                                          declared):  # fmt: skip
    site = f"east-{uuid.uuid4().hex[:6]}"
    site_map = _site_map(tmp_path, {site: {"clusters": ["lab" if declared else "other"]}})
    async with _central(client, site_map, pickup=1.0) as queue:
        inp = ClusterRead(cluster="lab", retry_timeout=timedelta(seconds=3))
        handle = await client.start_workflow(SiteShape.run, inp, id=f"site-{site}", task_queue=queue)
        await _details_naming(handle, site_task_queue(site) if declared else "cluster lab: in no site")
        with pytest.raises(WorkflowFailureError) as failed:
            await handle.result()
    failure = failed.value.cause  # as any activity that failed for good: its callers handle it so
    assert isinstance(failure, ActivityError) and failure.retry_state == RetryState.NON_RETRYABLE_FAILURE, failure
    cause = failure.cause
    assert isinstance(cause, ApplicationError) and cause.type == "SiteUnavailable", cause
    assert "gave up (retry_timeout 3s)" in str(cause), cause


def test_a_central_worker_with_a_site_map_builds_no_site_system_and_a_sites_worker_nothing_else(kubeconfig_path,
                                                                                               tmp_path):  # fmt: skip
    from temporalio import activity

    def names(registration) -> set[str]:
        return {activity._Definition.must_from_callable(m).name or "" for m in registration.activities}

    central = registry.build(WorkerSettings(site_map=str(_site_map(tmp_path, {"east": {"clusters": ["lab"]}})),
                                            metrics_port=0, kubeconfig="/nonexistent"))  # fmt: skip
    site = registry.build(WorkerSettings(site="east", kubeconfig=str(kubeconfig_path), metrics_port=0))
    assert central.workflows and not site.workflows
    assert {"list_devices", "notify_webhook", "query_prometheus"} <= names(central)
    assert not {"cordon_node", "redfish_power", "ensure_pkey", "ironic_manage"} & names(central)
    assert {"cordon_node", "redfish_power", "ensure_pkey", "ironic_manage"} <= names(site)
    assert not {"list_devices", "notify_webhook", "query_prometheus"} & names(site)
    assert site.task_queue == "millwright-site-east"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"sites": {"East": {}}}', "sites: Value error, site name 'East'"),
        ('{"sites": {"a": {"clusters": ["x"]}, "b": {"clusters": ["x"]}}}', "cluster 'x' is in two sites: a and b"),
        ('{"sites": {"a": {"clusters": ["x"], "racks": []}}}', "sites.a.racks: Extra inputs are not permitted"),
        ("{}", "sites: Field required"),
    ],
)
def test_a_bad_site_map_stops_the_worker_naming_the_file_and_field(tmp_path, text, expected):
    path = tmp_path / "sites.json"
    path.write_text(text)
    with pytest.raises(ConfigError, match="MILLWRIGHT_SITE_MAP") as raised:
        registry.build(WorkerSettings(site_map=str(path), metrics_port=0))
    assert expected in str(raised.value) and str(path) in str(raised.value), raised.value
    with pytest.raises(ConfigError, match="a site's worker"):
        WorkerSettings(site="east", site_map=str(path)).sites()
    with pytest.raises(ConfigError, match="run it in a site's worker"):
        WorkerSettings(site_map=str(path), fault_events=True, fault_events_clusters=["lab"]).fault_event_config()


def test_a_bmc_belongs_to_the_site_whose_network_or_host_pattern_matches():
    sites = SiteMap.model_validate({"sites": {
        "east": {"bmcs": ["10.20.0.0/16", "bmc-*.east.example.com"]},
        "lab": {"bmcs": ["127.0.0.1:81*"]},
    }})  # fmt: skip
    assert sites.site_of_bmc("https://10.20.3.4") == "east"
    assert sites.site_of_bmc("https://bmc-7.east.example.com:8443") == "east"
    assert sites.site_of_bmc("http://127.0.0.1:8123") == "lab"
    assert sites.site_of_bmc("http://127.0.0.1:9000") is None
    assert sites.site_of_bmc("https://10.21.0.1") is None
