"""A long-running watch on one cluster's Nodes, feeding worker/fault_events.py.

List, then watch from the list's resourceVersion with bookmarks (the API server's heartbeat: every event or
bookmark is recorded in `FaultEvents.heard`, which the receiver's /healthz shows); an expired resourceVersion (410)
or a dropped stream lists again, after a bounded backoff when the API does not answer. The cluster's Nodes are the
durable state: a worker that restarts lists them again and finds every fault still there, so the watch needs no
history of its own (docs/remediation.md says why it is not a workflow).
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime
from typing import Any

from activities.kube.connector import LIST_CHUNK, REQUEST_TIMEOUT, ClusterConnector
from activities.kube.stages import call_json
from activities.kube.watch_stream import BACKOFF, WATCH_SECONDS, Expired, watch_events
from activities.node_health import node_health
from worker.fault_events import FaultEvents

log = logging.getLogger("millwright.node_watch")


async def watch_nodes(connector: ClusterConnector, cluster: str, events: FaultEvents) -> None:
    """Until cancelled."""
    wait = BACKOFF[0]
    while True:
        try:
            version = await _list(connector, cluster, events)
            wait = BACKOFF[0]
            while True:
                version = await _watch(connector, cluster, events, version)
        except asyncio.CancelledError:
            raise
        except Expired:
            log.info("watch of %s: resourceVersion expired, listing again", cluster)
        except Exception as err:
            log.warning("watch of %s failed (%s); listing again in %.0fs", cluster, err, wait)
            await asyncio.sleep(wait)
            wait = min(wait * 2, BACKOFF[1])


async def _list(connector: ClusterConnector, cluster: str, events: FaultEvents) -> str:
    core = await connector.core(cluster)
    items: list[dict[str, Any]] = []
    token: str | None = None
    while True:
        page = await call_json(f"listing the nodes of {cluster}", core.list_node_without_preload_content(
            limit=LIST_CHUNK, _continue=token, _request_timeout=REQUEST_TIMEOUT))  # fmt: skip
        items += page.get("items") or []
        token = (page.get("metadata") or {}).get("continue") or None
        if token is None:
            break
    events.listed(cluster, [node_health(n, events.condition_types, events.label_keys) for n in items])
    _heard(events, cluster)
    return page["metadata"]["resourceVersion"]


async def _watch(connector: ClusterConnector, cluster: str, events: FaultEvents, version: str) -> str:
    """One watch request, to its timeout; the resourceVersion to resume from."""
    core = await connector.core(cluster)
    resp = await core.list_node_without_preload_content(
        watch=True, resource_version=version, allow_watch_bookmarks=True, timeout_seconds=WATCH_SECONDS,
        _request_timeout=WATCH_SECONDS + REQUEST_TIMEOUT)  # fmt: skip
    async for event in watch_events(resp, f"watching the nodes of {cluster}"):
        version = _event(cluster, events, event) or version
    return version


def _event(cluster: str, events: FaultEvents, event: dict[str, Any]) -> str | None:
    kind, obj = event.get("type"), event.get("object") or {}
    _heard(events, cluster)
    if kind == "ADDED" or kind == "MODIFIED":
        events.seen(cluster, node_health(obj, events.condition_types, events.label_keys))
    elif kind == "DELETED":
        events.gone(cluster, obj["metadata"]["name"])
    return (obj.get("metadata") or {}).get("resourceVersion")


def _heard(events: FaultEvents, cluster: str) -> None:
    events.heard[cluster] = datetime.now(UTC)
