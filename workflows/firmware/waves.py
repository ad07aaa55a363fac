"""A fleet firmware update's waves: which server starts next, when a wave is done, and when the fleet stops.

Pure (stdlib + pydantic), so the rules are tested without a server. The first wave is the canary; the next ones
take `batch_sizes` (the last size repeats). A wave counts the servers the update changed (updated or failed): a
server already at the bundle's versions frees its place at once, so a canary is always a server that was really
updated. A wave starts only when the one before it has finished, and then at most `max_concurrent_bmcs` of its
servers run at once. The fleet stops (no new server starts, the running ones finish) when `failure_threshold`
servers failed since the last resume, or at the canary's first failure; an operator's resume goes past the failures
seen so far.

With `batch_by` (nvlinkDomain or rack; FleetFirmwareInput) a wave takes whole domains, as a rollout's batch does
(workflows/rollout/unit_batching.py `unit_batch`, no gangs): NVLink-domain systems need all their trays on one
firmware set (docs/firmware.md), so a domain is never split across waves. The canary is the smallest domain (ties
to the servers' order); each later wave takes the next domains in the servers' order up to its size, rounded up to
whole domains. A server already current frees its place as above, so the wave takes the next whole domain in its
stead. A stop (the threshold, a pause, an abort) can still leave a domain mixed: `domains_left_mixed` says which.
With nvlinkDomain a domain's nodes return to service only together, once `domain_verdict` finds it on one firmware
set (workflows/firmware/domain_hold.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from pydantic import Field, field_validator

from activities.kube.topology import BatchBy, NodePlace
from activities.models import StrictModel
from workflows.rollout.spec.admission import MaintenanceWindow
from workflows.rollout.unit_batching import OWN_DOMAINS_SHOWN, UNIT_NAMES, unit_batch, units_of

# A server's states that leave its domain's firmware set as the bundle's (the rest: old, or part of the bundle).
ON_THE_BUNDLE = ("updated", "up-to-date")


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
    """The waves of one fleet run: `startable` before each start, `next_server` to pick it, `finished` after each
    server. With `batch_by` set, waves take whole domains of the servers' `places` (the workflow fills them)."""

    def __init__(
        self, waves: FirmwareWaves, max_concurrent: int, state: WaveState | None = None, batch_by: BatchBy = "none"
    ) -> None:
        self.waves, self.max_concurrent, self.batch_by = waves, max_concurrent, batch_by
        self.state = state or WaveState()
        self.running: set[str] = set()
        self.places: dict[str, NodePlace] = {}
        self.taken: list[str] = []  # servers of the current wave's domains not started yet
        self.wave_domains: list[list[str]] = []

    @property
    def size(self) -> int:
        return self.waves.size(self.state.wave)

    def startable(self) -> bool:
        """Another server of the current wave may start now: concurrency allows it, and the wave's size (with
        `batch_by`: a server of a domain the wave took waits, or the wave has room for another domain)."""
        s = self.state
        if len(self.running) >= self.max_concurrent:
            return False
        return bool(self.taken) or s.changed + len(self.running) < self.size

    def next_server(self, pending: Iterable[str]) -> str:
        """The server to start (when `startable`) of those not started, `pending`, in the servers' order: the first;
        with `batch_by`, the next of the wave's domains, the wave first taking the next whole domains of `pending`
        when none of its own waits."""
        if self.batch_by == "none":
            return next(iter(pending))
        if not self.taken:
            self._take(list(pending))
        return self.taken.pop(0)

    def _take(self, pending: list[str]) -> None:
        """The wave takes whole domains of `pending` for its room (its size less what it changed or runs), rounded
        up to whole domains; the canary takes the smallest first."""
        s, order = self.state, pending
        if s.wave == 0:
            units = units_of(pending, self.places, self.batch_by)
            order = [server for servers in sorted(units.values(), key=len) for server in servers]
        room = self.size - s.changed - len(self.running)
        batch = unit_batch(order, self.places, self.batch_by, [], set(), room, len(order))
        self.taken = batch.nodes
        self.wave_domains += [[] for _ in range(s.wave + 1 - len(self.wave_domains))]
        self.wave_domains[s.wave] += list(batch.units)

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
        if self.running or self.taken or s.changed < self.size:
            return False
        s.wave, s.changed = s.wave + 1, 0
        return True

    def resume(self) -> None:
        """Go past the failures seen so far: the fleet stops again only on new ones."""
        self.state.accepted_failures = self.state.failed


def domains_of(servers: list[str], places: Mapping[str, NodePlace], batch_by: BatchBy) -> dict[str, str]:
    """Server -> the domain its waves take whole (`node:<server>`: a domain of its own)."""
    return {server: unit for unit, members in units_of(servers, places, batch_by).items() for server in members}


def domains_left_mixed(domains: Mapping[str, str], states: Mapping[str, str]) -> list[str]:
    """The domains (in the servers' order) whose servers are not on one firmware set, none of them running: one
    updated or failed (a failed server may hold part of the bundle) and not every one on the bundle."""
    members: dict[str, list[str]] = {}
    for server, domain in domains.items():
        members.setdefault(domain, []).append(states[server])
    return [
        domain for domain, seen in members.items()
        if "running" not in seen and {"updated", "failed"} & set(seen) and not set(seen) <= set(ON_THE_BUNDLE)
    ]  # fmt: skip


def domain_verdict(
    states: Mapping[str, str], versions: Mapping[str, Mapping[str, str]], reasons: Mapping[str, str]
) -> str | None:
    """Why a domain whose servers are all done (`states`: server -> state, none pending or running) must stay out
    of service, or None when it may return: every server on the bundle, and the versions read back (`versions`:
    server -> inventory ID -> version, the bundle's IDs) the same on every server. `reasons`: a server's reason."""
    off = [f"{server} {state}" + (f" ({reasons[server][:400]})" if reasons.get(server) else "")
           for server, state in states.items() if state not in ON_THE_BUNDLE]  # fmt: skip
    if off:
        return "not every server on the bundle: " + "; ".join(off)
    seen: dict[str, dict[str, list[str]]] = {}  # inventory ID -> version -> servers
    for server, read in versions.items():
        for target, version in sorted(read.items()):
            seen.setdefault(target, {}).setdefault(version, []).append(server)
    differ = [f"{target} " + "; ".join(f"{v} on {', '.join(on)}" for v, on in by.items())
              for target, by in seen.items() if len(by) > 1]  # fmt: skip
    return "versions read back differ: " + " | ".join(differ) if differ else None


def own_domains_note(alone: Mapping[str, str], batch_by: BatchBy) -> str:
    """What status says of the waves' domains: their kind, and the servers that are domains of their own (server ->
    why: no Kubernetes node, or no label)."""
    kind = UNIT_NAMES[batch_by]
    note = f"waves take whole {kind}s"
    if not alone:
        return note
    shown = ", ".join(f"{server} ({why})" for server, why in list(alone.items())[:OWN_DOMAINS_SHOWN])
    more = f" and {len(alone) - OWN_DOMAINS_SHOWN} more" if len(alone) > OWN_DOMAINS_SHOWN else ""
    return f"{note}; {len(alone)} server(s) each a {kind} of its own: {shown}{more}"
