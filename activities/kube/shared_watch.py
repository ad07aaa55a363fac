"""One watch per cluster and kind of object (the stage Jobs, the nodes) that this worker's waits share.

Why: a wait that reads its object again and again (a stage's Job every tenth of the time waited, a rebooting node
every 2 s) makes, with 250 nodes in a batch, hundreds of reads a second of the API server, and sees the change it
waits for late; a list instead scans every object the cluster keeps (docs/testing.md has the figures). With the
watch, a wait reads its object when it starts and whenever the watch cannot vouch for it, learns of every other
change from the stream as it happens, and reads again every RECHECK_SECONDS as the backstop.

Why it is exact: a wait follows its object (`follow`) before it first reads it, so every change the stream brings
after that read reaches it. The watch starts from a list's resourceVersion (one item: only the version is wanted)
and notes when it sent that list; a read sent after that moment is covered while the stream stays unbroken. An
expired resourceVersion or a dropped stream tells every follower to read again, and until the stream is back each
wait reads on its own schedule.

What the watch of nodes keeps (every node's summary, as an informer's cache) answers whole-cluster reads: the
disruption budget's and a rollout's re-read of its targeted nodes. Such a read must see this worker's own writes
(a batch's uncordons just before the next batch's re-read): a node write tells the watch the resourceVersion the
API server answered with (`wrote`), and a read waits until the stream has brought each such version (compared for
equality only, as the API's rules allow), CATCH_UP_SECONDS at most; past that, the watch lists again.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

from kubernetes.aio import client as k8s

from activities.kube.connector import LIST_CHUNK, REQUEST_TIMEOUT, ClusterConnector
from activities.kube.models import JOB_NAMESPACE, JOB_STAGE_LABEL
from activities.kube.stages import call_json, node_summary
from activities.kube.watch_stream import BACKOFF, WATCH_SECONDS, Expired, watch_events

log = logging.getLogger("millwright.shared_watch")

LINGER_SECONDS = 30.0  # a watch nobody follows stops after this long (the next batch's waits often come sooner)
RECHECK_SECONDS = 30.0  # the longest a wait trusts the stream alone: then it reads its object again
# What is kept counts only while the stream was heard from this recently (an event, or a bookmark: the emulator sends
# one every 5 s, a real API server about every minute); older, the reader lists as it would without the watch.
KEPT_FRESH_SECONDS = 15.0
# How long a read of what is kept waits for the stream to bring this worker's own writes; past that the stream is
# lagging, and the watch lists again (the read lists itself meanwhile).
CATCH_UP_SECONDS = 2.0

READ = "read"  # what `Follow.next` answers when the wait must read its object itself (`Follow.reading` first)
QUIET = "quiet"  # ... when the watch vouches that the object has not changed


@dataclass(frozen=True)
class Watched:
    """A kind of object the waits follow: `lister` gives the client's list call for it (`watch=True` makes it a
    watch), `selector` narrows it to the objects the waits can follow. With `keep`, the watch also keeps `keep(obj)`
    of every object, as an informer's cache does: it starts from a whole list, and `SharedWatches.kept` reads it."""

    what: str
    lister: Callable[[k8s.ApiClient], Callable[..., Awaitable[Any]]]
    selector: str | None = None
    keep: Callable[[dict[str, Any]], Any] | None = None
    linger: float = LINGER_SECONDS


STAGE_JOBS = Watched(  # every Job `run_stage_job` makes carries the stage label
    "stage Jobs",
    lambda api: functools.partial(k8s.BatchV1Api(api).list_namespaced_job_without_preload_content, JOB_NAMESPACE),
    JOB_STAGE_LABEL,
)
# The disruption budget reads every node's service state per decision (a batch's leases), and a rollout re-reads its
# targeted nodes before each batch: every node's summary (all its labels) kept, and kept running between them,
# spares a 10,000-node cluster 20 pages a decision and 10 a batch.
NODES = Watched(
    "nodes",
    lambda api: k8s.CoreV1Api(api).list_node_without_preload_content,
    keep=functools.partial(node_summary, label_keys=[]),
    linger=300.0,
)


class Follow:
    """One wait's view of its object through the watch."""

    def __init__(self, watch: SharedWatch) -> None:
        self._watch = watch
        self.changed = asyncio.Event()
        self.latest: dict[str, Any] | None = None  # the newest version the stream brought since the last `next`
        self.stale = False  # the stream broke or (re)started, or the object was deleted: read it
        self._read_sent = -1.0  # when the wait's latest read was sent (time.monotonic())

    def reading(self) -> None:
        """Say that the wait reads its object now (call it just before the read is sent)."""
        self._read_sent = time.monotonic()

    def covered(self) -> bool:
        """Whether the stream brings every change since the wait's latest read."""
        since = self._watch.since
        return since is not None and since <= self._read_sent

    async def next(self, fallback: float, within: float) -> dict[str, Any] | str:
        """The object as the stream brought it, READ or QUIET. Covered, it waits up to `within` seconds (and
        answers READ once RECHECK_SECONDS passed since the last read); not covered, `fallback` seconds, then READ."""
        seconds = min(within, self._read_sent + RECHECK_SECONDS - time.monotonic()) if self.covered() else fallback
        if not self.changed.is_set() and seconds > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), seconds)
        self.changed.clear()
        latest, stale = self.latest, self.stale
        self.latest, self.stale = None, False
        if stale or not self.covered() or time.monotonic() >= self._read_sent + RECHECK_SECONDS:
            return READ
        return latest if latest is not None else QUIET


class SharedWatch:
    """One kind of object's watch on one cluster: runs while someone follows an object, and LINGER_SECONDS after."""

    def __init__(self, connector: ClusterConnector, cluster: str, watched: Watched) -> None:
        self._connector, self._cluster, self._watched = connector, cluster, watched
        self._what = f"{watched.what} of {cluster}"
        self._followers: dict[str, set[Follow]] = {}
        self._task: asyncio.Task | None = None
        self._linger: asyncio.TimerHandle | None = None
        self.since: float | None = None  # when the unbroken stream's starting list was sent; None: no stream
        self._kept: dict[str, Any] = {}  # name -> watched.keep(object), with `keep`
        self._heard = 0.0  # when the stream last brought an event or a bookmark (time.monotonic())
        self._versions: dict[str, str] = {}  # name -> the resourceVersion last listed or brought, with `keep`
        # name -> (resourceVersion, when answered) of this worker's writes the stream has not brought yet
        self._unseen: dict[str, tuple[str, float]] = {}
        self._caught_up = asyncio.Event()  # set while `_unseen` is empty
        self._caught_up.set()

    @contextlib.contextmanager
    def follow(self, name: str) -> Iterator[Follow]:
        follow = Follow(self)
        self._followers.setdefault(name, set()).add(follow)
        self._running()
        try:
            yield follow
        finally:
            followers = self._followers[name]
            followers.discard(follow)
            if not followers:
                del self._followers[name]
            self._running()

    async def kept(self) -> dict[str, Any] | None:
        """What the watch keeps of every object once the stream brought this worker's writes, while it vouches for
        it; else None (and it starts, or lists again when the stream lags behind those writes)."""
        self._running()
        if self._unseen and self.since is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._caught_up.wait(), CATCH_UP_SECONDS)
            if self._unseen and self.since is not None:
                log.warning("watch of the %s: %d of this worker's writes not brought in %.0fs; listing again",
                            self._what, len(self._unseen), CATCH_UP_SECONDS)  # fmt: skip
                self._end()
                self._running()
        if self._unseen or self.since is None or time.monotonic() - self._heard > KEPT_FRESH_SECONDS:
            return None
        return self._kept

    def wrote(self, name: str, version: str) -> None:
        """This worker wrote the object, and the API server answered with `version`: what is kept is read only
        once the stream has brought it (a no-op write's version was brought already)."""
        if self._versions.get(name) != version:
            self._unseen[name] = (version, time.monotonic())
            self._caught_up.clear()

    def _brought(self, name: str, version: str) -> None:
        self._versions[name] = version
        mine = self._unseen.get(name)
        if mine is not None and mine[0] == version:
            del self._unseen[name]
            if not self._unseen:
                self._caught_up.set()

    def _running(self) -> None:
        """Run the watch, and stop it `linger` seconds after it was last used, unless someone follows then."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name=f"watch of the {self._what}")
        if self._linger is not None:
            self._linger.cancel()
            self._linger = None
        if not self._followers:
            self._linger = asyncio.get_running_loop().call_later(self._watched.linger, self._stop)

    def _stop(self) -> None:
        self._linger = None
        if not self._followers:
            self._end()

    def _end(self) -> asyncio.Task | None:
        """Cancel the watch (its task, returned to await) and forget what it vouched for."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
        self.since, self._kept, self._versions = None, {}, {}
        return task

    async def close(self) -> None:
        if self._linger is not None:
            self._linger.cancel()
            self._linger = None
        task = self._end()
        if task is not None:
            await asyncio.wait([task])

    def _tell_all(self) -> None:
        """The stream can no longer vouch for anything read so far: every follower reads its object again."""
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
                log.info("watch of the %s: resourceVersion expired, listing again", self._what)
                self.since = None
                self._tell_all()
            except Exception as err:  # the waits read on their own schedule meanwhile
                self.since = None
                self._tell_all()
                if self._connector.closed:  # the worker stopped: nothing is left to watch with
                    return
                log.warning("watch of the %s failed (%s); again in %.0fs", self._what, err, wait)
                await asyncio.sleep(wait)
                wait = min(wait * 2, BACKOFF[1])

    async def _list(self) -> Callable[..., Awaitable[Any]]:
        return self._watched.lister(await self._connector.api(self._cluster))

    async def _start(self) -> str:
        """The list the stream starts from (one item, or with `keep` all, page by page); every follower reads its
        object once it is sent."""
        lister, keep = await self._list(), self._watched.keep
        sent, token, version = time.monotonic(), None, None
        kept: dict[str, Any] = {}
        versions: dict[str, str] = {}
        while True:
            page = await call_json(f"listing the {self._what}", lister(
                label_selector=self._watched.selector, limit=LIST_CHUNK if keep else 1, _continue=token,
                _request_timeout=REQUEST_TIMEOUT))  # fmt: skip
            version = version or page["metadata"]["resourceVersion"]  # the first page's: the list's snapshot
            token = page["metadata"].get("continue") if keep else None
            if keep is not None:
                for obj in page.get("items") or []:
                    kept[obj["metadata"]["name"]] = keep(obj)
                    versions[obj["metadata"]["name"]] = obj["metadata"]["resourceVersion"]
            if not token:
                break
        self._kept, self._versions, self.since, self._heard = kept, versions, sent, time.monotonic()
        # Writes answered before the list was sent are in it; later ones, if the list has them, too.
        for name, (written, answered) in list(self._unseen.items()):
            if answered <= sent or versions.get(name) == written:
                del self._unseen[name]
        if not self._unseen:
            self._caught_up.set()
        self._tell_all()
        return version

    async def _watch(self, version: str) -> str:
        """One watch request, to its timeout; the resourceVersion to resume from."""
        lister = await self._list()
        resp = await lister(label_selector=self._watched.selector, watch=True, resource_version=version,
                            allow_watch_bookmarks=True, timeout_seconds=WATCH_SECONDS,
                            _request_timeout=WATCH_SECONDS + REQUEST_TIMEOUT)  # fmt: skip
        keep = self._watched.keep
        async for event in watch_events(resp, f"watching the {self._what}"):
            self._heard = time.monotonic()
            obj, kind = event.get("object") or {}, event.get("type")
            metadata = obj.get("metadata") or {}
            version, name = metadata.get("resourceVersion") or version, metadata.get("name") or ""
            if kind == "BOOKMARK":
                continue
            if keep is not None:
                if kind == "DELETED":
                    self._kept.pop(name, None)
                else:
                    self._kept[name] = keep(obj)
                self._brought(name, version)
            for follow in self._followers.get(name, ()):
                if kind == "DELETED":
                    follow.stale = True
                else:
                    follow.latest = obj
                follow.changed.set()
        return version


class SharedWatches:
    """This worker's shared watches, one per cluster and kind of object, made when a wait first follows one."""

    def __init__(self, connector: ClusterConnector) -> None:
        self._connector = connector
        self._watches: dict[tuple[str, str], SharedWatch] = {}

    def _watch(self, cluster: str, watched: Watched) -> SharedWatch:
        watch = self._watches.get((cluster, watched.what))
        if watch is None:
            watch = self._watches[cluster, watched.what] = SharedWatch(self._connector, cluster, watched)
        return watch

    def follow(self, cluster: str, watched: Watched, name: str) -> contextlib.AbstractContextManager[Follow]:
        return self._watch(cluster, watched).follow(name)

    async def kept(self, cluster: str, watched: Watched) -> dict[str, Any] | None:
        """What the cluster's watch keeps of every object (`watched.keep`), while its stream vouches for it and has
        brought this worker's writes; None while it cannot (it starts now, and the caller reads the cluster itself)."""
        return await self._watch(cluster, watched).kept()

    def wrote(self, cluster: str, watched: Watched, name: str, version: str | None) -> None:
        """This worker wrote the object (a kind the watch keeps) and the API server answered with `version`."""
        watch = self._watches.get((cluster, watched.what))
        if watch is not None and version:
            watch.wrote(name, version)

    async def close(self) -> None:
        for watch in self._watches.values():
            await watch.close()
        self._watches.clear()
