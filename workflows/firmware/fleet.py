"""FleetFirmwareUpdate: one firmware bundle over many servers, in waves, as one run an operator can pause, resume,
abort and watch.

Servers come as a list or from a NetBox query (as a fleet burn-in's do). Each runs the per-server `FirmwareUpdate`
as a child (`firmware-update/<server>`), which takes a Kubernetes node out of service through the cluster's
disruption budget itself, so the budget holds across the fleet and every other operation. The waves
(workflows/firmware/waves.py) decide when a server starts: the canary first, then the batch sizes, at most
`max_concurrent_bmcs` at once, only inside a maintenance window; `failure_threshold` failures stop the fleet until
an operator resumes or aborts. A server already at the bundle's versions is recorded `up-to-date` and takes no
place in its wave. Children outlive the fleet's run (`ParentClosePolicy.ABANDON`): a flash is never cut short.

`status` lists every server (its wave, state, child workflow, reason, and its components once finished); a running
server's components and task states are its child's `components` query (`millwright` shows both).

With `batch_by` (nvlinkDomain or rack), waves take whole domains (workflows/firmware/waves.py): the run first reads
where each server's Kubernetes node sits (its labels, a page of each cluster's node list at a time); a server that is
no node, or whose node has no such label, is a domain of its own. `status` shows each server's domain, each wave's
domains, and the domains a stop left on mixed firmware. With nvlinkDomain no node of a domain returns to service
before every server of it is done and on one firmware set; a domain that is not stays out, named in
`domains_held_out` (workflows/firmware/domain_hold.py). History: ~9 events a server (a child's start, close and two
workflow tasks), at most 6 more a node an NVLink domain holds (its uncordon or quarantine and a workflow task), and
one per control, so one run holds `MAX_SERVERS` servers (~30,000 events at most) under Temporal's history limits;
larger fleets run as several fleets.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from datetime import timedelta
from typing import Literal

from pydantic import Field, field_validator, model_validator
from temporalio import workflow
from temporalio.common import WorkflowIDReusePolicy
from temporalio.exceptions import ApplicationError, ChildWorkflowError, WorkflowAlreadyStartedError

from activities.kube.activities import KubeActivities
from activities.kube.models import NodePageRequest, NodeRef
from activities.kube.topology import OWN_DOMAIN_PREFIX, BatchBy, TopologyLabels, place_of
from activities.kube.validators import validate_object_name
from activities.models import StrictModel
from activities.netbox.activities import NetBoxActivities
from activities.netbox.models import DeviceQuery
from workflows.burnin.node_guard import KubernetesNode
from workflows.common.base import Phases, Progress, WorkflowInput
from workflows.common.call_options import API_CALL, NETBOX_CALL
from workflows.common.endpoints import Endpoints, RetryTimeout, kubernetes_api
from workflows.common.errors import error_text
from workflows.firmware.bundle import ComponentStatus
from workflows.firmware.domain_hold import DomainHeldOut, DomainHold
from workflows.firmware.firmware_update import (
    FirmwareSettings,
    FirmwareTarget,
    FirmwareUpdate,
    FirmwareUpdateInput,
    firmware_update_id,
)
from workflows.firmware.waves import (
    FirmwareWaves,
    WaveBook,
    domains_left_mixed,
    domains_of,
    own_domains_note,
)
from workflows.maintenance.drain import DrainCost
from workflows.rollout.batching import next_window_open, window_open
from workflows.rollout.models import ReasonRequest
from workflows.rollout.unit_batching import UNIT_NAMES

MAX_SERVERS = 2000
NODE_PAGE = 1000  # nodes a page when reading where servers sit
# workflow.patched() id: with batch_by nvlinkDomain, each domain's nodes held out until it reads back one firmware set.
DOMAIN_HOLD_PATCH = "fleet-firmware-holds-nvlink-domains"

ServerState = Literal["pending", "running", "updated", "up-to-date", "failed", "skipped"]
FINISHED = ("completed", "aborted")
CAMPAIGN_PAUSE = "paused by the campaign: "  # how `paused` reads while a campaign holds the run


class ServerFirmware(StrictModel):
    """One server in the fleet."""

    server: str
    state: ServerState = "pending"
    wave: int | None = Field(None, description="The wave it ran in (0: the canary).")
    domain: str | None = Field(
        None, description="With batch_by: the domain its wave takes whole (an NVLink domain's ClusterUUID, a rack); "
        "`node:<server>`: a domain of its own (status's `topology` says why).",
    )  # fmt: skip
    workflow_id: str | None = Field(None, description="Its FirmwareUpdate run (`components` query while running).")
    reason: str = Field("", description="Why it failed or was skipped, or why its NVLink domain is held out.")
    held: bool = Field(
        False, description="With batch_by nvlinkDomain: its node is cordoned in the fleet's name, out of service "
        "until its NVLink domain is done and on one firmware set (or for good: its domain held out).",
    )  # fmt: skip
    components: list[ComponentStatus] = Field(default_factory=list, description="Its result's components.")
    now: str = Field("", description="A running server's phase and details, from its run's progress (filled by "
                     "`millwright firmware status`, not by the fleet).")  # fmt: skip


def node_of(target: FirmwareTarget) -> NodeRef | None:
    k = target.kubernetes
    return None if k is None else NodeRef(cluster=k.cluster, node=k.node or target.name)


class FleetFirmwareSettings(RetryTimeout, FirmwareSettings):
    """How a fleet installs its bundle, whichever servers it takes: a firmware campaign
    (workflows/campaign/firmware_campaign.py) gives every cluster's fleet the same."""

    waves: FirmwareWaves = Field(default_factory=FirmwareWaves)
    max_concurrent_bmcs: int = Field(
        2, ge=1, le=1000, description="Servers whose BMCs update at once (the image server and the management "
        "network carry this many transfers); a larger wave runs in turns.",
    )  # fmt: skip
    batch_by: BatchBy = Field(
        "none", description="What a wave takes whole: nvlinkDomain (an NVLink domain's servers need one firmware set) "
        "or rack, from each server's Kubernetes node's labels; the canary is the smallest domain. none: servers one "
        "by one.",
    )  # fmt: skip
    topology: TopologyLabels = Field(
        default_factory=TopologyLabels, description="The node label keys that say where a server's node sits (its "
        "NVLink domain: `clique`; `rack`), read with batch_by.",
    )  # fmt: skip

    @model_validator(mode="after")
    def _whole_domain_canary(self) -> FleetFirmwareSettings:
        if self.batch_by != "none" and self.waves.canary != 1:
            raise ValueError(f"waves.canary: with batch_by {self.batch_by} the canary is one whole domain (the "
                             "smallest): leave canary out")  # fmt: skip
        return self


class FleetFirmwareInput(FleetFirmwareSettings, WorkflowInput):
    """Install a firmware bundle on a list of servers and/or the NetBox devices a query finds."""

    name: str = Field(min_length=1, max_length=63, description="Names this fleet run (its workflow ID).")
    servers: list[FirmwareTarget] = Field(default_factory=list, max_length=MAX_SERVERS)
    netbox_query: DeviceQuery | None = Field(
        None, description="Add NetBox's devices matching this query (their BMCs from NetBox); needs record_in_netbox."
    )
    kubernetes: KubernetesNode | None = Field(
        None, description="The cluster the NetBox query's servers are nodes of (each its own name as node name).",
    )  # fmt: skip

    _name = field_validator("name")(validate_object_name)

    @model_validator(mode="after")
    def _servers(self) -> FleetFirmwareInput:
        if not self.servers and self.netbox_query is None:
            raise ValueError("give servers, a netbox_query, or both")
        if self.netbox_query is not None and not self.record_in_netbox:
            raise ValueError("netbox_query needs record_in_netbox (the servers' BMCs come from NetBox)")
        if self.netbox_query is not None and self.netbox_query.limit > MAX_SERVERS:
            raise ValueError(f"netbox_query.limit: at most {MAX_SERVERS} servers a fleet run")
        if self.kubernetes is not None and self.kubernetes.node is not None:
            raise ValueError("kubernetes.node: leave it out (each server is the node of its own name)")
        for i, s in enumerate(self.servers):
            if s.bmc is None and not self.record_in_netbox:
                raise ValueError(f"servers[{i}].bmc is required when record_in_netbox is false")
            if refused := self.validation_refused(s.kubernetes, f"servers[{i}].kubernetes"):
                raise ValueError(refused)
        if self.netbox_query is not None and (refused := self.validation_refused(self.kubernetes, "kubernetes")):
            raise ValueError(refused)
        dupes = sorted(n for n, c in Counter(s.name for s in self.servers).items() if c > 1)
        if dupes:
            raise ValueError(f"servers listed twice: {', '.join(dupes)}")
        no_node = all(s.kubernetes is None for s in self.servers) and self.kubernetes is None
        if self.batch_by != "none" and no_node:
            raise ValueError("batch_by: a server's domain comes from its Kubernetes node's labels, and no "
                             "server is a node: give servers[].kubernetes or kubernetes, or batch_by none")  # fmt: skip
        return self

    def workflow_id(self) -> str:
        return f"fleet-firmware-update/{self.name}"


MIXED_DOC = (
    "With batch_by: domains on mixed firmware, none of their servers running: one updated or failed, not "
    "all on the bundle (a stop, a failure, or a closed maintenance window left them so)."
)
HELD_OUT_DOC = (
    "With batch_by nvlinkDomain: domains kept out of service once all their servers were done, not on one firmware "
    "set (a server failed or was skipped, or the versions read back differ); their nodes stay cordoned and "
    "quarantined in the fleet's name until it runs again and finds the domain whole."
)


class FleetFirmwareStatus(DrainCost):
    phase: str
    bundle: str
    wave: int = Field(description="The current wave (0: the canary).")
    wave_size: int
    paused: str | None = Field(None, description="Why no new server starts (an operator, or the failure threshold).")
    aborted: str | None = None
    counts: dict[str, int] = Field(description="Servers by state.")
    decisions: list[str] = Field(default_factory=list, description="Operators' pauses, resumes and aborts.")
    topology: str | None = Field(None, description="With batch_by: what the waves take whole, and which servers "
                                 "are domains of their own and why.")  # fmt: skip
    wave_domains: list[list[str]] = Field(default_factory=list, description="With batch_by: each wave's domains "
                                          "(index 0: the canary).")  # fmt: skip
    domains_left_mixed: list[str] = Field(default_factory=list, description=MIXED_DOC)
    domains_held_out: list[DomainHeldOut] = Field(default_factory=list, description=HELD_OUT_DOC)
    servers: list[ServerFirmware]


class FleetFirmwareResult(DrainCost):
    bundle: str
    aborted: str | None = None
    counts: dict[str, int]
    domains_left_mixed: list[str] = Field(default_factory=list, description=MIXED_DOC)
    domains_held_out: list[DomainHeldOut] = Field(default_factory=list, description=HELD_OUT_DOC)
    servers: list[ServerFirmware]


@workflow.defn
class FleetFirmwareUpdate:
    @workflow.init
    def __init__(self, inp: FleetFirmwareInput) -> None:
        self._inp = inp
        self._book = WaveBook(inp.waves, inp.max_concurrent_bmcs, batch_by=inp.batch_by)
        self._servers: dict[str, ServerFirmware] = {}
        self._pending: dict[str, FirmwareTarget] = {}
        self._topology: str | None = None
        self._paused: str | None = None
        self._aborted: str | None = None
        self._decisions: list[str] = []
        self._cost = DrainCost()  # what the servers' drains cost their GPU work (a failed server's: not known here)
        self._phases = Phases(finished=FINISHED)
        self._calls = Endpoints(inp.retry_timeout, shown=self._phases.waiting)
        self._hold = False  # nvlinkDomain: whether domains are held (runs from before the patch: no)
        self._domains = DomainHold(inp.bundle, self._calls)
        self._members: dict[str, list[str]] = {}  # domain -> its servers

    # ------------------------------------------------------------ operator controls and views

    @workflow.update(description="Start no new server; running ones finish.")
    def pause(self, req: ReasonRequest) -> FleetFirmwareStatus:
        self._paused = f"paused: {req.reason}"
        return self._decided(f"pause: {req.reason}")

    @pause.validator
    def _pause_ok(self, req: ReasonRequest) -> None:
        self._require_active()
        if self._paused is not None:
            raise ValueError(f"already paused ({self._paused})")

    @workflow.update(description="Carry on after a pause or a stop at the failure threshold (past its failures).")
    def resume(self, req: ReasonRequest) -> FleetFirmwareStatus:
        self._paused = None
        self._book.resume()
        return self._decided(f"resume: {req.reason}")

    @resume.validator
    def _resume_ok(self, req: ReasonRequest) -> None:
        self._require_active()
        if self._paused is None:
            raise ValueError("the fleet firmware update is not paused")

    @workflow.update(description="Start no new server (the rest are skipped); running ones finish.")
    def abort(self, req: ReasonRequest) -> FleetFirmwareStatus:
        self._aborted = req.reason
        return self._decided(f"abort: {req.reason}")

    @abort.validator
    def _abort_ok(self, req: ReasonRequest) -> None:
        self._require_active()

    # A campaign's controls of this run (workflows/campaign/firmware_campaign.py), as a Rollout takes them
    # (workflows/rollout/fleet_controls.py): signals, since a workflow cannot send another an update; one the
    # update's validator would refuse changes nothing. The campaign's resume lifts only its own pause: a stop at the
    # failure threshold waits for an operator who has looked at this fleet (`millwright firmware resume`).
    @workflow.signal(description="The campaign's pause: as `pause`, sent by the campaign that started it.")
    def pause_from_campaign(self, req: ReasonRequest) -> None:
        if self._paused is None and self._inactive() is None:
            self._paused = f"{CAMPAIGN_PAUSE}{req.reason}"
            self._decided(f"pause (campaign): {req.reason}")

    @workflow.signal(description="The campaign's resume of its own pause, sent by the campaign that started it.")
    def resume_from_campaign(self, req: ReasonRequest) -> None:
        if (self._paused or "").startswith(CAMPAIGN_PAUSE) and self._inactive() is None:
            self._paused = None
            self._decided(f"resume (campaign): {req.reason}")

    @workflow.signal(description="The campaign's abort: as `abort`, sent by the campaign that started it.")
    def abort_from_campaign(self, req: ReasonRequest) -> None:
        if self._inactive() is None:
            self._aborted = req.reason
            self._decided(f"abort (campaign): {req.reason}")

    def _inactive(self) -> str | None:
        """Why this run takes no control, or None."""
        if self._aborted is not None:
            return f"the fleet firmware update is aborting: {self._aborted}"
        if self._phases.progress.phase in FINISHED:
            return f"the fleet firmware update is {self._phases.progress.phase}"
        return None

    def _require_active(self) -> None:
        if (why := self._inactive()) is not None:
            raise ValueError(why)

    def _decided(self, decision: str) -> FleetFirmwareStatus:
        self._decisions.append(decision)
        self._show()
        return self.status()

    @workflow.query(description="Every server: its wave, state, FirmwareUpdate run, reason and components.")
    def status(self) -> FleetFirmwareStatus:
        return FleetFirmwareStatus(
            phase=self._phases.progress.phase, bundle=self._inp.bundle.name, wave=self._book.state.wave,
            wave_size=self._book.size, paused=self._paused, aborted=self._aborted, counts=self._counts(),
            decisions=self._decisions, topology=self._topology, wave_domains=self._book.wave_domains,
            domains_left_mixed=self._mixed(), domains_held_out=self._domains.held_out,
            servers=list(self._servers.values()), **self._cost.cost().model_dump(),
        )  # fmt: skip

    @workflow.query(description="Short progress for pollers such as `millwright watch`.")
    def progress(self) -> Progress:
        return self._phases.progress

    def _counts(self) -> dict[str, int]:
        return dict(Counter(s.state for s in self._servers.values()))

    def _mixed(self) -> list[str]:
        if self._inp.batch_by == "none":
            return []
        servers = self._servers.values()  # a domain is None until read
        domains = {s.server: s.domain for s in servers if s.domain is not None}
        return domains_left_mixed(domains, {s.server: s.state for s in servers})

    def _show(self, phase: str | None = None) -> None:
        if phase is None:
            phase = "aborting" if self._aborted else "paused" if self._paused else "running"
        counts, book = self._counts(), self._book
        running = sorted(book.running)
        details = (
            f"wave {book.state.wave} ({'canary, ' if book.state.wave == 0 else ''}{book.state.changed}/{book.size} "
            f"changed), running: {', '.join(running) or 'none'}; "
            + ", ".join(f"{n} {state}" for state, n in sorted(counts.items()) if state != "running")
        )
        if mixed := self._mixed():
            details += f"; {UNIT_NAMES[self._inp.batch_by]}s left on mixed firmware: {', '.join(mixed)}"
        if self._domains.nodes:
            details += f"; {len(self._domains.nodes)} node(s) held out until their NVLink domain is on one firmware set"
        if self._domains.held_out:
            details += f"; NVLink domains held out of service: {', '.join(d.domain for d in self._domains.held_out)}"
        if self._paused or self._aborted:
            details = f"{self._paused or 'aborting: ' + (self._aborted or '')} — {details}"
        done = sum(n for state, n in counts.items() if state not in ("pending", "running"))
        self._phases.enter(phase, details, done=done, total=len(self._servers))

    # ------------------------------------------------------------ the run

    @workflow.run
    async def run(self, inp: FleetFirmwareInput) -> FleetFirmwareResult:
        self._hold = inp.batch_by == "nvlinkDomain" and workflow.patched(DOMAIN_HOLD_PATCH)
        targets = list(inp.servers)
        if inp.netbox_query is not None:
            self._phases.enter("listing", "NetBox query")
            devices = await self._calls.execute(NetBoxActivities.list_devices, inp.netbox_query, **NETBOX_CALL,
                                                summary="servers from NetBox")  # fmt: skip
            listed = {t.name for t in targets}
            targets += [FirmwareTarget(name=d.name, kubernetes=inp.kubernetes) for d in devices
                        if d.name and d.name not in listed]  # fmt: skip
        if len(targets) > MAX_SERVERS:
            raise ApplicationError(f"{len(targets)} servers: at most {MAX_SERVERS} a fleet run",
                                   type="TooManyServers", non_retryable=True)  # fmt: skip
        self._servers = {t.name: ServerFirmware(server=t.name) for t in targets}
        self._pending = {t.name: t for t in targets}
        if inp.batch_by != "none":
            await self._read_domains(targets)
        tasks: list[asyncio.Task[None]] = []
        self._show()
        while self._pending and self._aborted is None:
            if self._paused is not None:
                await workflow.wait_condition(lambda: self._paused is None or self._aborted is not None)
                continue
            if not await self._window_open():
                continue
            if self._book.next_wave():
                self._show()
            if self._book.startable():
                target = self._pending.pop(self._book.next_server(self._pending))
                tasks.append(asyncio.create_task(self._update(target, self._book.start(target.name))))
                continue
            await workflow.wait_condition(
                lambda: self._book.startable() or not self._book.running or self._paused is not None
                or self._aborted is not None
            )  # fmt: skip
        for target in self._pending.values():  # an abort: the rest are left as they are
            self._servers[target.name].state = "skipped"
            self._servers[target.name].reason = f"fleet aborted: {self._aborted}"
        self._pending = {}
        self._show()
        await asyncio.gather(*tasks)
        for domain in self._members:  # those an abort ended
            await self._settle(domain)
        self._show("aborted" if self._aborted else "completed")
        await workflow.wait_condition(workflow.all_handlers_finished)
        return FleetFirmwareResult(bundle=inp.bundle.name, aborted=self._aborted, counts=self._counts(),
                                   domains_left_mixed=self._mixed(), domains_held_out=self._domains.held_out,
                                   servers=list(self._servers.values()), **self._cost.cost().model_dump())  # fmt: skip

    async def _read_domains(self, targets: list[FirmwareTarget]) -> None:
        """Each server's domain, from its Kubernetes node's labels: each cluster's node list, a page at a time (one
        activity a page), keeping the targets' nodes."""
        keys, label = self._inp.topology, (self._inp.topology.clique if self._inp.batch_by == "nvlinkDomain"
                                           else self._inp.topology.rack)  # fmt: skip
        wanted: dict[str, dict[str, str]] = {}  # cluster -> node -> server
        cordons: dict[str, str] = {}  # server -> who holds its node's cordon
        for t in targets:
            if t.kubernetes is not None:
                wanted.setdefault(t.kubernetes.cluster, {})[t.kubernetes.node or t.name] = t.name
        self._phases.enter("reading-topology", f"where the servers' nodes sit ({label} labels)")
        for cluster, servers in sorted(wanted.items()):
            token = None
            while True:
                page = await self._calls.execute(
                    KubeActivities.list_nodes_page,
                    NodePageRequest(cluster=cluster, label_keys=[label], limit=NODE_PAGE, continue_token=token),
                    **API_CALL, endpoint=kubernetes_api(cluster), summary=f"read {label} of cluster {cluster}'s nodes",
                )  # fmt: skip
                for node in page.nodes:
                    if node.name in servers:
                        self._book.places[servers[node.name]] = place_of(servers[node.name], node.labels, keys)
                        if node.cordoned_by:
                            cordons[servers[node.name]] = node.cordoned_by
                token = page.continue_token
                if not token:
                    break
        domains = domains_of([t.name for t in targets], self._book.places, self._inp.batch_by)
        alone: dict[str, str] = {}
        for t in targets:
            self._servers[t.name].domain = domains[t.name]
            if domains[t.name].startswith(OWN_DOMAIN_PREFIX):
                alone[t.name] = ("no Kubernetes node" if t.kubernetes is None
                                 else f"its node is not in cluster {t.kubernetes.cluster}"
                                 if t.name not in self._book.places else f"no {label} label")  # fmt: skip
        self._topology = own_domains_note(alone, self._inp.batch_by)
        if self._hold:
            self._hold_domains(targets, cordons)

    def _holds(self, record: ServerFirmware) -> bool:
        """Its node is held for its NVLink domain (a server that is a domain of its own returns by itself)."""
        return self._hold and record.domain is not None and not record.domain.startswith(OWN_DOMAIN_PREFIX)

    def _hold_domains(self, targets: list[FirmwareTarget], cordons: dict[str, str]) -> None:
        """Each NVLink domain's servers; the nodes an earlier run of this fleet (this workflow ID) kept out with their
        domain (`cordons`: server -> its cordon's holder) held again; a quarantine that run or the server's own
        update left goes when the domain returns."""
        me = workflow.info().workflow_id
        for t in targets:
            record = self._servers[t.name]
            if not self._holds(record) or record.domain is None:
                continue
            self._members.setdefault(record.domain, []).append(t.name)
            holder = cordons.get(t.name)
            if holder == me and (node := node_of(t)) is not None:
                self._domains.hold(t.name, node)
                record.held = True
            if holder in (me, firmware_update_id(t.name)):
                self._domains.lift.add(t.name)

    async def _settle(self, domain: str) -> None:
        """Once none of `domain`'s servers waits or runs: back in service together, or held out (domain_hold.py)."""
        members = [self._servers[server] for server in self._members[domain]]
        if domain in self._domains.settled or any(m.state in ("pending", "running") for m in members):
            return
        out = await self._domains.settle(domain, {m.server: m.state for m in members},
                                         {m.server: m.reason for m in members})  # fmt: skip
        for m in members:
            if out is None:
                m.held = False
            elif m.held:
                m.reason = out.reason
        self._show()

    async def _window_open(self) -> bool:
        """True inside a maintenance window; else waits until one opens (or an operator acts) and returns False."""
        windows, now = self._inp.waves.maintenance_windows, workflow.now()
        if window_open(windows, now):
            return True
        opens = next_window_open(windows, now)
        self._phases.enter("waiting-for-window", f"next maintenance window opens {opens:%Y-%m-%d %H:%M %Z}")
        with contextlib.suppress(TimeoutError):  # the window opened
            await workflow.wait_condition(lambda: self._paused is not None or self._aborted is not None,
                                          timeout=(opens - now) if opens else timedelta(days=1))  # fmt: skip
        return False

    async def _update(self, target: FirmwareTarget, wave: int) -> None:
        inp, record = self._inp, self._servers[target.name]
        holds, me = self._holds(record), workflow.info().workflow_id
        child = FirmwareUpdateInput(server=target, retry_timeout=inp.retry_timeout, hand_node_to=me if holds else None,
                                    **inp.settings())  # fmt: skip
        record.state, record.wave, record.workflow_id = "running", wave, child.workflow_id()
        self._show()
        changed = failed = False
        try:
            result = await workflow.execute_child_workflow(
                FirmwareUpdate.run, child, id=child.workflow_id(), id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
                static_summary=f"firmware {inp.bundle.name} on {target.name} (wave {wave})",
                parent_close_policy=workflow.ParentClosePolicy.ABANDON,
            )  # fmt: skip
            record.components = result.components
            self._cost.add(result)
            if holds:
                self._domains.read_back(target.name, result.versions)
            if holds and result.node_handed_to == me and (node := node_of(target)) is not None:
                self._domains.hold(target.name, node)
                record.held = True
            if result.result == "validation-failed":  # installed, but the node is not fit: left out of service
                record.state, failed = "failed", True
                record.reason = f"validation failed: {result.validation.reason if result.validation else ''}" + (
                    f"; handed to {result.remediation}" if result.remediation else ""
                )
            else:
                record.state, changed = result.result, result.result == "updated"
        except WorkflowAlreadyStartedError:
            record.state, record.reason = "skipped", "a firmware update of this server is already running"
        except ChildWorkflowError as err:
            record.state, record.reason, failed = "failed", error_text(err), True
        if holds and record.domain is not None:
            await self._settle(record.domain)  # part of its wave: the next starts once the domain is back
        stop = self._book.finished(target.name, changed, failed)
        stoppable = self._paused is None or self._paused.startswith(CAMPAIGN_PAUSE)  # outlasts a campaign's pause
        if stop is not None and stoppable and self._aborted is None:
            self._paused = f"stopped: {stop}: {record.reason}"
        self._show()
