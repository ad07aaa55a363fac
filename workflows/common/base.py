"""What every Millwright workflow shares: its input's identity and its progress shape."""

from __future__ import annotations

from typing import Any

from pydantic import Field
from temporalio import workflow
from temporalio.common import SearchAttributePair, SearchAttributeUpdate

from activities.models import StrictModel
from workflows.common import search_attributes as sa
from workflows.common.endpoints import EndpointWait, with_waits


class WorkflowInput(StrictModel):
    """Base of every workflow input.

    Unknown fields are rejected so a typo in the UI's JSON box fails the run at once
    instead of being silently ignored.
    """

    def workflow_id(self) -> str:
        """A meaningful, deterministic workflow ID: double submissions collapse into one run."""
        raise NotImplementedError

    def search_attributes(self) -> list[SearchAttributePair]:
        """Search attributes set at start, so runs can be filtered before their first task."""
        return []


def history_is_long(limit: int) -> bool:
    """Time to continue as new: the server suggests it, or this run's history passed `limit` events."""
    info = workflow.info()
    return info.is_continue_as_new_suggested() or info.get_current_history_length() > limit


class Progress(StrictModel):
    """What `millwright watch` and other pollers read through a workflow's `progress` query."""

    phase: str
    done: int = 0
    total: int = 0
    details: str = ""
    finished: bool = False
    waiting: list[EndpointWait] = Field(
        default_factory=list, description="Calls to external endpoints failing now, retried until their bound "
                                          "(workflows.common.endpoints).")  # fmt: skip


def publish_phase(phase: str, *also: SearchAttributeUpdate[Any]) -> None:
    """Write the `MillwrightPhase` search attribute: the one place a running workflow does (its start sets the
    first value, `WorkflowInput.search_attributes`). `also`: other attributes written in the same upsert.

    Each call is one upsert command and one history event, so the caller decides when: `Phases.enter` and the
    Rollout publish only a changed phase; NodeMaintenance, IsolateTenant, ReleaseTenant and DisruptionBudget
    publish on every call, as their running executions' histories expect.
    """
    workflow.upsert_search_attributes([*also, sa.PHASE.value_set(phase)])


class Phases:
    """A workflow's visible phase: the model its `progress` query returns, the UI's current
    details and the `MillwrightPhase` search attribute (`publish_phase`), kept in step; with the
    calls that keep failing meanwhile (`waiting`, the `shown` of workflows.common.endpoints.Endpoints)."""

    def __init__(self, finished: tuple[str, ...] = ("completed", "failed")) -> None:
        self.progress = Progress(phase="starting")
        self._finished = finished

    def enter(self, phase: str, details: str = "", done: int | None = None, total: int | None = None) -> None:
        p = self.progress
        if phase != p.phase:  # each upsert is a history event
            publish_phase(phase)
        p.phase, p.details = phase, details
        if done is not None:
            p.done = done
        if total is not None:
            p.total = total
        p.finished = phase in self._finished
        self.show()

    def waiting(self, waits: list[EndpointWait]) -> None:
        self.progress.waiting = waits
        self.show()

    def show(self) -> None:
        p = self.progress
        workflow.set_current_details(with_waits(f"**{p.phase}** {p.details}".strip(), p.waiting))
