"""What every Millwright workflow shares: its input's identity and its progress shape."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict
from temporalio.common import SearchAttributePair


class WorkflowInput(BaseModel):
    """Base of every workflow input.

    Unknown fields are rejected so a typo in the UI's JSON box fails the run at once
    instead of being silently ignored.
    """

    model_config = ConfigDict(extra="forbid")

    def workflow_id(self) -> str:
        """A meaningful, deterministic workflow ID: double submissions collapse into one run."""
        raise NotImplementedError

    def search_attributes(self) -> list[SearchAttributePair]:
        """Search attributes set at start, so runs can be filtered before their first task."""
        return []


class Progress(BaseModel):
    """What `millwright watch` and other pollers read through a workflow's `progress` query."""

    phase: str
    done: int = 0
    total: int = 0
    details: str = ""
    finished: bool = False
