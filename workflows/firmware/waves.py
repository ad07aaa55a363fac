"""A fleet firmware update's waves: which server starts next, when a wave is done, and when the fleet stops.

Pure (stdlib + pydantic), so the rules are tested without a server. The first wave is the canary; the next ones
take `batch_sizes` (the last size repeats). A wave counts the servers the update changed (updated or failed): a
server already at the bundle's versions frees its place at once, so a canary is always a server that was really
updated. A wave starts only when the one before it has finished, and then at most `max_concurrent_bmcs` of its
servers run at once. The fleet stops (no new server starts, the running ones finish) when `failure_threshold`
servers failed since the last resume, or at the canary's first failure; an operator's resume goes past the failures
seen so far.
"""

from __future__ import annotations

from pydantic import Field, field_validator

from activities.models import StrictModel
from workflows.rollout.spec.admission import MaintenanceWindow


class FirmwareWaves(StrictModel):
    canary: int = Field(1, ge=1, le=100, description="Servers in the first wave; any failure in it stops the fleet.")
    batch_sizes: list[int] = Field(
        default_factory=lambda: [10], min_length=1, description="Servers in each wave after the canary; the last "
        "size repeats, e.g. [2, 5, 20].",
    )  # fmt: skip
    failure_threshold: int = Field(1, ge=1, description="Failed servers (since the last resume) that stop the fleet.")
    maintenance_windows: list[MaintenanceWindow] = Field(
        default_factory=list, description="A server starts only inside one of these (a running one finishes); "
        "none: any time.",
    )  # fmt: skip

    @field_validator("batch_sizes")
    @classmethod
    def _sizes(cls, value: list[int]) -> list[int]:
        if any(size < 1 for size in value):
            raise ValueError("every batch size must be at least 1")
        return value

    def size(self, wave: int) -> int:
        """Servers wave `wave` changes (0: the canary)."""
        return self.canary if wave == 0 else self.batch_sizes[min(wave - 1, len(self.batch_sizes) - 1)]


class WaveState(StrictModel):
    """Where the waves stand: the current wave, what it has changed, the failures an operator went past."""

    wave: int = 0
    changed: int = Field(0, description="Servers of this wave updated or failed.")
    failed: int = Field(0, description="Servers failed in every wave.")
    accepted_failures: int = Field(0, description="Failures an operator resumed past.")


class WaveBook:
    """The waves of one fleet run: `startable` before each start, `finished` after each server."""

    def __init__(self, waves: FirmwareWaves, max_concurrent: int, state: WaveState | None = None) -> None:
        self.waves, self.max_concurrent = waves, max_concurrent
        self.state = state or WaveState()
        self.running: set[str] = set()

    @property
    def size(self) -> int:
        return self.waves.size(self.state.wave)

    def startable(self) -> bool:
        """Another server of the current wave may start now (concurrency and the wave's size allow it)."""
        s = self.state
        return len(self.running) < self.max_concurrent and s.changed + len(self.running) < self.size

    def start(self, server: str) -> int:
        """`server` starts in the current wave; returns the wave's number."""
        self.running.add(server)
        return self.state.wave

    def finished(self, server: str, changed: bool, failed: bool) -> str | None:
        """`server` is done; returns why the fleet stops now, or None."""
        s = self.state
        self.running.discard(server)
        s.changed += changed or failed
        s.failed += failed
        if not failed:
            return None
        since = s.failed - s.accepted_failures
        if s.wave == 0:
            return f"the canary failed ({server})"
        if since >= self.waves.failure_threshold:
            return f"{since} server(s) failed (threshold {self.waves.failure_threshold}), the last {server}"
        return None

    def next_wave(self) -> bool:
        """Move to the next wave when the current one is done (its size reached, none of it running); True when it
        moved."""
        s = self.state
        if self.running or s.changed < self.size:
            return False
        s.wave, s.changed = s.wave + 1, 0
        return True

    def resume(self) -> None:
        """Go past the failures seen so far: the fleet stops again only on new ones."""
        self.state.accepted_failures = self.state.failed
