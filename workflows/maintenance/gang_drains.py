"""Drains that take a gang together: the nodes a batch runs at once, gang by gang (issue 39).

A gang of GPU work dies whole when one pod goes (docs/topology-and-gangs.md). Drained one node at a time, a gang
spread over several nodes of one batch restarts once per node: the first eviction kills it, its scheduler may
place it again on a batch node not cordoned yet, and that node's drain kills it again. So each node's drain holds
the evictions of a gang that has pods on other nodes of the batch until every one of those nodes is cordoned (or
will not be soon: it ended without a cordon, e.g. held by non-interruptible pods, was never started, or waits for
the disruption budget, which may grant it only once the others are back), and inside a
maintenance window; then every node's drain evicts its pods of the gang at once, each through the eviction API, so
a PodDisruptionBudget holds and a refusal shows as today. The other pods are evicted as before.

Workflow code without I/O of its own: its state lives in the batch's run, rebuilt by a replay, so a worker lost at
any line resumes where it was, and it adds no history event (a wait for the mates is a condition, not a timer).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable

from temporalio import workflow

from activities.kube.topology import Gang


class GangDrains:
    """The drains of `nodes`, which run together (a batch's chunk: every node of it can be in flight at once)."""

    def __init__(self, nodes: Iterable[str], slots: asyncio.Semaphore, windows: Callable[[], Awaitable[None]]) -> None:
        """`slots`: the in-flight places the nodes hold while they run; a node waiting for its gang's other nodes
        gives its place to the next node (else nodes waiting for mates not yet started could hold every place), and
        takes one again once its drain is over (`rejoin`): its evictions wait for no place, so a gang's come
        together. `windows`: returns once inside a maintenance window."""
        self._nodes = set(nodes)
        self._slots, self._windows = slots, windows
        self._ready: set[str] = set()  # cordoned, or ended without a cordon: no gang waits for it
        self._lent: set[str] = set()  # nodes that gave their place up and have not taken one again

    def cordoned(self, node: str) -> None:
        self._ready.add(node)

    def settled(self, node: str) -> None:
        """Nothing is awaited of the node: its run ended, never started, or waits for the disruption budget (which
        may grant it only once its gang's other nodes are back: waiting for it could wait for ever)."""
        self._ready.add(node)

    def spread(self, node: str, gangs: Iterable[Gang]) -> set[str]:
        """The gangs of `node` that have pods on other nodes of these drains: their evictions wait (`together`)."""
        return {g.id for g in gangs if (set(g.nodes) & self._nodes) - {node}}

    async def together(self, node: str, gangs: Iterable[Gang]) -> None:
        """Return once every other node of these drains that `gangs` run on is cordoned or settled, inside a
        maintenance window."""
        mates = {m for g in gangs for m in g.nodes if m in self._nodes and m != node}
        if not mates <= self._ready and node not in self._lent:
            self._lent.add(node)
            self._slots.release()
        await workflow.wait_condition(lambda: mates <= self._ready)
        await self._windows()

    async def rejoin(self, node: str) -> None:
        """After the node's drain (whatever its end): its place again, if it gave it up."""
        if node in self._lent:
            await self._slots.acquire()
            self._lent.discard(node)
