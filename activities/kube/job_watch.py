"""One watch per cluster on the stage Jobs this worker waits for, shared by all its waits (`run_stage_job`).

Why: a wait that reads its Job every tenth of the time waited makes, with 250 nodes in a batch, about a thousand
reads a second of the API server, and a list of the Jobs scans every Job the namespace keeps (docs/testing.md has
the figures). With the watch, a wait reads its Job when it starts and whenever the watch cannot vouch for it, and
learns of every other change from the stream, with a read every JOB_RECHECK_SECONDS as the backstop.

Why it is exact: a wait follows its Job (`follow`) before it first reads it, so every change the stream brings after
that read reaches it. The watch starts from a list's resourceVersion (one item: only the version is wanted) and notes
when it sent that list; a read sent after that moment is covered while the stream stays unbroken. An expired
resourceVersion or a dropped stream tells every follower to read its Job again, and until the stream is back each
wait reads on its own schedule.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterator
from typing import Any

from kubernetes.aio import client as k8s

from activities.kube.connector import REQUEST_TIMEOUT, ClusterConnector
from activities.kube.models import JOB_NAMESPACE, JOB_STAGE_LABEL
from activities.kube.stages import call_json
from activities.kube.watch_stream import Expired, watch_events

log = logging.getLogger("millwright.job_watch")

WATCH_SECONDS = 300  # one watch request's server-side timeout; the watch then resumes from its resourceVersion
LINGER_SECONDS = 30.0  # a watch nobody follows stops after this long (the next batch's waits often come sooner)
BACKOFF = (1.0, 30.0)  # seconds: first and longest wait after a failed watch
STAGE_JOBS = JOB_STAGE_LABEL  # the selector: every Job `run_stage_job` makes carries the stage label

READ = "read"  # what `Follow.next` answers when the wait must read its Job itself
QUIET = "quiet"  # ... when the watch vouches that the Job has not changed


class Follow:
    """One wait's view of its Job through the watch."""

    def __init__(self, watch: JobWatch) -> None:
        self._watch = watch
        self.changed = asyncio.Event()
        self.job: dict[str, Any] | None = None  # the newest version the stream brought since the last `next`
        self.stale = False  # the stream broke or (re)started, or the Job was deleted: read it

    def covers(self, read_sent: float) -> bool:
        """Whether the stream brings every change since a read sent at `read_sent` (time.monotonic())."""
        since = self._watch.since
        return since is not None and since <= read_sent

    async def next(self, seconds: float, read_sent: float) -> dict[str, Any] | str:
        """Within `seconds`: the Job as the stream brought it, READ, or QUIET (the stream covers the read sent at
        `read_sent` and brought nothing)."""
        if not self.changed.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), seconds)
        self.changed.clear()
        job, stale = self.job, self.stale
        self.job, self.stale = None, False
        if stale or not self.covers(read_sent):
            return READ
        return job if job is not None else QUIET


class JobWatch:
    """The stage Jobs' watch on one cluster: runs while someone follows a Job there, and LINGER_SECONDS after."""

    def __init__(self, connector: ClusterConnector, cluster: str) -> None:
        self._connector, self._cluster = connector, cluster
        self._followers: dict[str, set[Follow]] = {}
        self._task: asyncio.Task | None = None
        self._linger: asyncio.TimerHandle | None = None
        self.since: float | None = None  # when the unbroken stream's starting list was sent; None: no stream

    @contextlib.contextmanager
    def follow(self, name: str) -> Iterator[Follow]:
        follow = Follow(self)
        self._followers.setdefault(name, set()).add(follow)
        if self._linger is not None:
            self._linger.cancel()
            self._linger = None
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name=f"stage Jobs of {self._cluster}")
        try:
            yield follow
        finally:
            followers = self._followers[name]
            followers.discard(follow)
            if not followers:
                del self._followers[name]
            if not self._followers and self._task is not None:
                self._linger = asyncio.get_running_loop().call_later(LINGER_SECONDS, self._stop)

    def _stop(self) -> None:
        self._linger = None
        if not self._followers and self._task is not None:
            self._task.cancel()
            self._task = None
            self.since = None

    async def close(self) -> None:
        if self._linger is not None:
            self._linger.cancel()
            self._linger = None
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.wait([task])
        self.since = None

    def _tell_all(self) -> None:
        """The stream can no longer vouch for anything read so far: every follower reads its Job again."""
        for followers in self._followers.values():
            for follow in followers:
                follow.stale = True
                follow.changed.set()

    async def _run(self) -> None:
        wait = BACKOFF[0]
        while True:
            try:
                version = await self._start()
                wait = BACKOFF[0]
                while True:
                    version = await self._watch(version)
            except Expired:
                log.info("stage Jobs' watch on %s: resourceVersion expired, listing again", self._cluster)
                self.since = None
                self._tell_all()
            except Exception as err:  # the waits read on their own schedule meanwhile
                self.since = None
                self._tell_all()
                log.warning("stage Jobs' watch on %s failed (%s); again in %.0fs", self._cluster, err, wait)
                await asyncio.sleep(wait)
                wait = min(wait * 2, BACKOFF[1])

    async def _start(self) -> str:
        """The list the stream starts from; every follower reads its Job once it is sent."""
        batch = k8s.BatchV1Api(await self._connector.api(self._cluster))
        sent = time.monotonic()
        page = await call_json(
            f"listing the stage Jobs of {self._cluster}",
            batch.list_namespaced_job_without_preload_content(
                JOB_NAMESPACE, label_selector=STAGE_JOBS, limit=1, _request_timeout=REQUEST_TIMEOUT
            ),
        )
        self.since = sent
        self._tell_all()
        return page["metadata"]["resourceVersion"]

    async def _watch(self, version: str) -> str:
        """One watch request, to its timeout; the resourceVersion to resume from."""
        batch = k8s.BatchV1Api(await self._connector.api(self._cluster))
        resp = await batch.list_namespaced_job_without_preload_content(
            JOB_NAMESPACE, label_selector=STAGE_JOBS, watch=True, resource_version=version,
            allow_watch_bookmarks=True, timeout_seconds=WATCH_SECONDS,
            _request_timeout=WATCH_SECONDS + REQUEST_TIMEOUT)  # fmt: skip
        async for event in watch_events(resp, f"watching the stage Jobs of {self._cluster}"):
            obj = event.get("object") or {}
            metadata = obj.get("metadata") or {}
            version = metadata.get("resourceVersion") or version
            for follow in self._followers.get(metadata.get("name") or "", ()):
                if event.get("type") == "DELETED":
                    follow.stale = True
                elif event.get("type") in ("ADDED", "MODIFIED"):
                    follow.job = obj
                follow.changed.set()
        return version


class JobWatches:
    """This worker's stage Jobs' watches, one per cluster, made when a wait first follows a Job there."""

    def __init__(self, connector: ClusterConnector) -> None:
        self._connector = connector
        self._watches: dict[str, JobWatch] = {}

    def follow(self, cluster: str, name: str) -> contextlib.AbstractContextManager[Follow]:
        watch = self._watches.get(cluster)
        if watch is None:
            watch = self._watches[cluster] = JobWatch(self._connector, cluster)
        return watch.follow(name)

    async def close(self) -> None:
        for watch in self._watches.values():
            await watch.close()
        self._watches.clear()
