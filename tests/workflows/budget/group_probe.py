"""A workflow of the tests' own that leases a group of nodes with `acquire_leases` and returns them with
`release_leases` (what RackRemediation does for a rack), or withdraws it when cancelled while it waits. Its own module, so the sandbox imports this workflow
without the test module's imports."""

from __future__ import annotations

from pydantic import Field
from temporalio import workflow

from activities.models import StrictModel
from workflows.budget.leases import Lease, acquire_leases, release_leases


class GroupProbeInput(StrictModel):
    cluster: str
    nodes: list[str]
    group: str


class GroupProbeResult(StrictModel):
    leases: list[Lease]
    notes: list[str] = Field(description="The notes `waiting` was called with, in order.")


@workflow.defn
class GroupProbe:
    def __init__(self) -> None:
        self._notes: list[str] = []
        self._done = self._cancelled = False

    @workflow.run
    async def run(self, inp: GroupProbeInput) -> GroupProbeResult:
        leases = await acquire_leases(inp.cluster, inp.nodes, group=inp.group, reason="group probe",
                                      cancelled=lambda: self._cancelled,
                                      waiting=lambda lease: self._notes.append(lease.note))  # fmt: skip
        if not leases:  # cancelled while waiting: withdrawn
            return GroupProbeResult(leases=leases, notes=self._notes)
        await workflow.wait_condition(lambda: self._done)
        await release_leases(inp.cluster, inp.nodes, reason="probe done")
        return GroupProbeResult(leases=leases, notes=self._notes)

    @workflow.signal
    def done(self) -> None:
        self._done = True

    @workflow.signal
    def cancel(self) -> None:
        self._cancelled = True

    @workflow.query
    def notes(self) -> list[str]:
        return self._notes
