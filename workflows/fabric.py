"""InfiniBand tenant isolation through UFM partition keys (PKeys).

- ``Fabric`` (``fabric/<name>``): an entity workflow per fabric that owns PKey allocation and the desired
  membership of every tenant's PKey. Every change goes through a validated update, handled one at a time, so a
  PKey is never handed out twice and a GUID never belongs to two tenants. It continues-as-new, carrying its
  state, before its history grows large.
- ``IsolateTenant``: check the fabric's security posture (the management PKey 0x7fff's default membership: a full
  one voids every PKey, so the run fails closed with ``FabricInsecure`` unless the input accepts that finding; the
  SM keys are reported), resolve the tenant's hosts to port GUIDs through UFM, cross-check them against NetBox
  (a mismatch fails closed, naming the host, before anything is written to UFM), allocate (or reuse) the
  tenant's PKey through the Fabric entity (update-with-start), add GUIDs with UFM's additive call, read back
  with ``guids_data=true`` and verify, record the PKey and members in NetBox, confirm to the Fabric. What the
  run created is decided by reading UFM (a snapshot before its first write, the PKey after), never from a
  write's answer, which a dropped connection loses after the write was done. A run that fails after the
  allocation undoes what it created: a PKey it allocated goes whole (the ``ReleaseTenant`` child); on a PKey
  the tenant already held, only the ports it added are removed, from UFM and from the Fabric's books
  (``withdraw``). Its failure lists what it created and removed (workflows/saga.py).
- ``ReleaseTenant``: remove exactly the tenant's GUIDs, verify, delete the PKey when empty (UFM itself deletes it
  with its last member; a PKey with other members is kept and retired, never handed out again), record in NetBox,
  release the allocation; what it removed, and whether the PKey is gone, is read from UFM before and after, not
  taken from the answers.
- ``FabricAudit`` (for a Temporal Schedule): report the fabric's posture; compare every tenant's PKey in UFM, one
  PKey at a time and continuing as new between batches, with the Fabric's desired state; report unknown members,
  missing members, missing PKeys, wrong memberships and GUIDs in two tenants' PKeys, exactly what and where;
  recognise virtual (SR-IOV) port GUIDs by their physical port; repair only when asked (a membership is changed by
  read-merge-PUT, a virtual GUID removed only when its port belongs to no tenant).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from datetime import timedelta
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator
from temporalio import workflow
from temporalio.common import RetryPolicy, SearchAttributePair
from temporalio.exceptions import ApplicationError

from workflows import saga
from workflows import search_attributes as sa
from workflows.base import Progress, WorkflowInput, history_is_long
from workflows.endpoints import NETBOX, UFM, Endpoints, RetryTimeout

from activities.models import StrictModel
from activities.netbox import DeviceIbPorts, IbPortQuery, NetBoxActivities, TenantPKeyRecord
from activities.ufm import (
    AddGuids,
    BlockingCode,
    DeletedPKey,
    EmptyRequest,
    EnsurePKey,
    FabricCall,
    FabricPosture,
    FabricSnapshot,
    GuidsRequest,
    HostsRequest,
    MembershipChange,
    PKeyList,
    PKeyMembers,
    PKeyRef,
    PortHosts,
    RemoveGuids,
    ResolvedHosts,
    UfmActivities,
    VirtualPort,
    normalize_guid,
    normalize_pkey,
)

# An attempt makes a few requests of up to 10 s each (a read, a write, its read back; a removal in chunks) and
# heartbeats before each: a worker that dies is noticed in 20 s.
UFM_CALL: dict[str, Any] = dict(
    start_to_close_timeout=timedelta(seconds=60), heartbeat_timeout=timedelta(seconds=20),
    retry_policy=RetryPolicy(initial_interval=timedelta(milliseconds=500), backoff_coefficient=2.0,
                             maximum_interval=timedelta(seconds=10), maximum_attempts=20),
)  # fmt: skip
# The Fabric entity's updates (call_fabric): one update-with-start, no heartbeat.
FABRIC_CALL: dict[str, Any] = dict(UFM_CALL, start_to_close_timeout=timedelta(seconds=10), heartbeat_timeout=None)
# Fabric-wide reads (every port, every PKey): their HTTP timeout grows with the fabric (activities/ufm.py), and they
# heartbeat while they wait.
UFM_LISTING: dict[str, Any] = dict(
    UFM_CALL, start_to_close_timeout=timedelta(minutes=6), heartbeat_timeout=timedelta(seconds=30),
)  # fmt: skip
NETBOX_CALL: dict[str, Any] = dict(
    start_to_close_timeout=timedelta(seconds=60),
    retry_policy=RetryPolicy(initial_interval=timedelta(seconds=1), maximum_interval=timedelta(seconds=30),
                             maximum_attempts=10),
)  # fmt: skip
HISTORY_LIMIT = 2000
# Patches of running code: a failed isolation undoes its writes; a release reads what is there before it removes;
# an undo puts back the tenant's PKey that UFM deleted with the last port the undo removed.
ISOLATION_UNDO = "isolate-tenant-undoes-its-writes"
RELEASE_READS_FIRST = "release-tenant-reads-before-removing"
UNDO_KEEPS_HELD_PKEY = "isolation-undo-keeps-the-held-pkey"

_NAME = r"^[a-z0-9]([-a-z0-9_.]{0,61}[a-z0-9])?$"


def _name(value: str) -> str:
    import re

    if not re.match(_NAME, value):
        raise ValueError(f"{value!r} is not a name (lowercase letters, digits, '-', '_', '.')")
    return value


# ================================================================== the Fabric entity


class Allocation(StrictModel):
    tenant: str
    pkey: str
    members: dict[str, str] = Field(default_factory=dict, description="Desired members: port GUID -> host.")
    membership: Literal["full", "limited"] = "full"
    state: Literal["allocated", "isolated", "releasing"] = "allocated"


class FabricState(StrictModel):
    allocations: dict[str, Allocation] = Field(default_factory=dict, description="By tenant.")
    retired: dict[str, str] = Field(default_factory=dict, description="PKeys never handed out again, and why.")
    changes: int = 0


class FabricInput(WorkflowInput):
    fabric: str
    pkey_first: str = Field("0x100", description="Lowest PKey this fabric hands out.")
    pkey_last: str = Field("0x7ffe", description="Highest PKey this fabric hands out.")
    history_limit: int = Field(HISTORY_LIMIT, ge=50, description="Continue-as-new past this many history events.")
    state: FabricState = Field(default_factory=FabricState, description="Carried across continue-as-new.")

    _n = field_validator("fabric")(_name)
    _p = field_validator("pkey_first", "pkey_last")(normalize_pkey)

    def workflow_id(self) -> str:
        return f"fabric/{self.fabric}"


class AllocateRequest(StrictModel):
    tenant: str
    members: dict[str, str] = Field(description="Port GUID -> host: the tenant's desired members.")
    membership: Literal["full", "limited"] = "full"
    exclude: list[str] = Field(default_factory=list, description="PKeys in use in UFM outside this fabric's books.")


class TenantRequest(StrictModel):
    tenant: str


class WithdrawRequest(StrictModel):
    tenant: str
    guids: list[str] = Field(description="Port GUIDs no longer desired (a failed isolation's additions).")


class FinishRelease(StrictModel):
    tenant: str
    remaining: dict[str, str] = Field(default_factory=dict, description="Members left in the PKey: retire it.")


@workflow.defn
class Fabric:
    @workflow.init
    def __init__(self, inp: FabricInput) -> None:
        self._inp = inp
        self._state = inp.state.model_copy(deep=True)

    @workflow.query(description="Allocations (tenant -> PKey, desired members) and retired PKeys.")
    def state(self) -> FabricState:
        return self._state

    @workflow.query(description="Short progress for pollers.")
    def progress(self) -> Progress:
        return Progress(phase="serving", done=len(self._state.allocations), details=self._summary())

    # ------------------------------------------------------------ updates

    def _owner_of(self, guid: str) -> str | None:
        for a in self._state.allocations.values():
            if guid in a.members:
                return a.tenant
        return None

    def _in_use(self, exclude: list[str]) -> set[int]:
        used = {int(a.pkey, 16) for a in self._state.allocations.values()}
        used |= {int(p, 16) for p in self._state.retired}
        used |= {int(p, 16) for p in exclude}
        return used

    @workflow.update(description="Allocate (or reuse) the tenant's PKey and add desired members.")
    def allocate(self, req: AllocateRequest) -> Allocation:
        members = {normalize_guid(g): h for g, h in req.members.items()}
        current = self._state.allocations.get(req.tenant)
        if current is None:
            used = self._in_use(req.exclude)
            first, last = int(self._inp.pkey_first, 16), int(self._inp.pkey_last, 16)
            pkey = next(n for n in range(first, last + 1) if n not in used)
            current = Allocation(tenant=req.tenant, pkey=f"0x{pkey:x}", membership=req.membership)
            self._state.allocations[req.tenant] = current
        current.members.update(members)
        self._changed()
        return current

    @allocate.validator
    def _validate_allocate(self, req: AllocateRequest) -> None:
        current = self._state.allocations.get(req.tenant)
        if current is not None and current.state == "releasing":
            raise ValueError(f"tenant {req.tenant} is being released; isolate it again after the release")
        if current is not None and current.membership != req.membership:
            raise ValueError(f"tenant {req.tenant} has {current.membership} membership, not {req.membership}")
        for guid, host in req.members.items():
            owner = self._owner_of(normalize_guid(guid))
            if owner is not None and owner != req.tenant:
                raise ValueError(f"port {guid} of host {host} belongs to tenant {owner}'s PKey")
        if current is None:
            used = self._in_use(req.exclude)
            first, last = int(self._inp.pkey_first, 16), int(self._inp.pkey_last, 16)
            if all(n in used for n in range(first, last + 1)):
                raise ValueError(f"no free PKey in {self._inp.pkey_first}-{self._inp.pkey_last}")

    @workflow.update(description="The tenant's members were added and verified in UFM.")
    def confirm(self, req: TenantRequest) -> Allocation:
        a = self._state.allocations[req.tenant]
        a.state = "isolated"
        self._changed()
        return a

    @confirm.validator
    def _validate_confirm(self, req: TenantRequest) -> None:
        if req.tenant not in self._state.allocations:
            raise ValueError(f"tenant {req.tenant} has no PKey on this fabric")

    @workflow.update(description="Drop ports from the tenant's desired members (a failed isolation undoing its "
                                 "additions); returns the allocation.")
    def withdraw(self, req: WithdrawRequest) -> Allocation:
        a = self._state.allocations[req.tenant]
        for guid in req.guids:
            a.members.pop(normalize_guid(guid), None)
        self._changed()
        return a

    @withdraw.validator
    def _validate_withdraw(self, req: WithdrawRequest) -> None:
        a = self._state.allocations.get(req.tenant)
        if a is None:
            raise ValueError(f"tenant {req.tenant} has no PKey on this fabric")
        if a.state == "releasing":
            raise ValueError(f"tenant {req.tenant} is being released")

    @workflow.update(description="Start releasing the tenant's PKey; returns the allocation (empty when none).")
    def begin_release(self, req: TenantRequest) -> dict:
        a = self._state.allocations.get(req.tenant)
        if a is None:
            return {}
        a.state = "releasing"
        self._changed()
        return a.model_dump()

    @workflow.update(description="The tenant's members are gone from UFM: free (or retire) its PKey.")
    def finish_release(self, req: FinishRelease) -> dict:
        a = self._state.allocations.pop(req.tenant, None)
        if a is not None and req.remaining:
            self._state.retired[a.pkey] = (
                f"released by {req.tenant} with {len(req.remaining)} other members left: "
                + ", ".join(sorted(req.remaining)[:10])
            )
        self._changed()
        return a.model_dump() if a else {}

    @finish_release.validator
    def _validate_finish(self, req: FinishRelease) -> None:
        a = self._state.allocations.get(req.tenant)
        if a is not None and a.state != "releasing":
            raise ValueError(f"tenant {req.tenant} is not being released")

    # ------------------------------------------------------------ run

    @workflow.run
    async def run(self, inp: FabricInput) -> None:
        self._changed()
        await workflow.wait_condition(lambda: history_is_long(inp.history_limit))
        await workflow.wait_condition(workflow.all_handlers_finished)
        workflow.continue_as_new(inp.model_copy(update={"state": self._state}))

    def _changed(self) -> None:
        self._state.changes += 1
        workflow.set_current_details(self._summary())

    def _summary(self) -> str:
        s = self._state
        lines = [f"**fabric** `{self._inp.fabric}`: {len(s.allocations)} tenant PKeys"]
        for a in sorted(s.allocations.values(), key=lambda a: a.pkey):
            lines.append(f"{a.pkey} {a.tenant} ({a.state}): {len(a.members)} ports")
        for p, why in sorted(s.retired.items()):
            lines.append(f"retired {p}: {why}")
        return "\n\n".join(lines)


async def _read_pkey(calls: Endpoints, pkey: str, summary: str) -> PKeyMembers:
    return await calls.execute(UfmActivities.get_pkey, PKeyRef(pkey=pkey), **UFM_CALL, endpoint=UFM, summary=summary)


async def _fabric(fabric: str, update: str, payload: BaseModel | None = None) -> dict:
    return await workflow.execute_activity_method(
        UfmActivities.call_fabric,
        FabricCall(fabric=fabric, update=update, payload=payload.model_dump(mode="json") if payload else {}),
        **FABRIC_CALL, summary=f"fabric {fabric}: {update}",
    )  # fmt: skip


# ================================================================== IsolateTenant


class IsolateTenantInput(WorkflowInput, RetryTimeout):
    fabric: str = Field(description="The InfiniBand fabric (its UFM), e.g. lab-ib.")
    tenant: str = Field(description="Tenant slug (NetBox).")
    tenant_name: str | None = Field(None, description="Tenant name, to create the NetBox tenant if missing.")
    hosts: list[str] = Field(min_length=1, description="The tenant's hosts (UFM system names = NetBox devices).")
    membership: Literal["full", "limited"] = "full"
    netbox: bool = Field(True, description="Cross-check GUIDs against NetBox and record the PKey there.")
    accept_posture: list[BlockingCode] = Field(
        default_factory=list,
        description="Isolate although the fabric has these blocking findings (docs/fabric.md, 'Fabric posture'): "
                    "default-membership-full (the isolation is void) or default-membership-unreported (UFM before "
                    "6.19 cannot show it); each accepted finding is named in the result.",
    )  # fmt: skip

    _n = field_validator("fabric", "tenant")(_name)

    def workflow_id(self) -> str:
        return f"isolate-tenant/{self.fabric}/{self.tenant}"

    def search_attributes(self) -> list[SearchAttributePair]:
        return [SearchAttributePair(sa.TENANT, self.tenant)]


class IsolateTenantResult(StrictModel):
    fabric: str
    tenant: str
    pkey: str
    members: dict[str, list[str]] = Field(description="host -> port GUIDs, verified in UFM.")
    added: list[str]
    already: list[str]
    pkey_created: bool
    membership_changed: list[str] = Field(default_factory=list, description="Members whose membership was changed.")
    posture: FabricPosture | None = Field(None, description="The fabric's posture, checked before any change.")
    accepted_findings: list[str] = Field(default_factory=list, description="Blocking findings the input accepted.")


class Step(StrictModel):
    phase: str = "starting"
    note: str = ""


class IsolationWrites(StrictModel):
    """What an isolation run may have written, known before its first write: what it undoes if it fails."""

    pkey: str
    allocated: bool = Field(description="This run allocated the tenant's PKey (the tenant held none before).")
    pkey_before: dict[str, str] | None = Field(description="The PKey's members in UFM before the run; None: absent.")
    partition_before: str = Field("", description="The PKey's partition name in UFM before the run.")
    booked_before: list[str] = Field(description="The tenant's desired members in the Fabric before the run.")
    members: dict[str, str] = Field(description="The run's ports: GUID -> host.")

    def new_ports(self, now: PKeyMembers) -> list[str]:
        """Ports in the PKey now that neither UFM nor the Fabric's books had before: this run's."""
        before = self.pkey_before or {}
        return [g for g in sorted(self.members) if g in now.members and g not in before
                and g not in self.booked_before]

    def lines(self, now: PKeyMembers, ports: list[str], fabric: str) -> list[str]:
        """The report's lines for what is there now of what this run created, in creation order."""
        pkey = [f"PKey {self.pkey} on {fabric}"] if now.exists and self.pkey_before is None else []
        return pkey + [f"port {g} of {self.members[g]} in PKey {self.pkey}" for g in ports if g in now.members]


POSTURE_PATCH = "fabric-posture"  # IsolateTenant and FabricAudit read the posture first (runs before it do not)


async def fabric_posture(calls: Endpoints) -> FabricPosture:
    return await calls.execute(
        UfmActivities.fabric_posture, EmptyRequest(), **UFM_CALL, endpoint=UFM, summary="fabric security posture"
    )


def refuse_insecure(fabric: str, posture: FabricPosture, accept: list[str]) -> list[str]:
    """Fail closed on a blocking posture finding the input does not accept; returns the accepted ones."""
    refused = [f for f in posture.blocking() if f.code not in accept]
    if refused:
        raise ApplicationError(
            f"fabric {fabric} (UFM {posture.ufm_version}) cannot isolate tenants: "
            + "; ".join(f.line() for f in refused) + ". Nothing was changed",
            posture.model_dump(mode="json"), type="FabricInsecure", non_retryable=True,
        )  # fmt: skip
    return [f.line() for f in posture.blocking()]


async def resolve_and_check(calls: Endpoints, hosts: list[str], netbox: bool) -> dict[str, list[str]]:
    """host -> port GUIDs from UFM, cross-checked both ways against NetBox; fails closed naming the host."""
    resolved: ResolvedHosts = await calls.execute(
        UfmActivities.resolve_hosts, HostsRequest(hosts=hosts), **UFM_LISTING, endpoint=UFM,
        summary="resolve hosts in UFM",
    )
    if resolved.unknown:
        raise ApplicationError(f"UFM has no HCA ports for host(s) {', '.join(resolved.unknown)}",
                               type="HostNotInFabric", non_retryable=True)  # fmt: skip
    ufm = {h.host: h.guids for h in resolved.hosts}
    if netbox:
        records: list[DeviceIbPorts] = await calls.execute(
            NetBoxActivities.list_ib_ports, IbPortQuery(devices=hosts), **NETBOX_CALL,
            endpoint=NETBOX, summary="IB ports in NetBox"
        )
        for rec in records:
            nb = sorted({p.guid for p in rec.ports})
            if not rec.found or nb != sorted(ufm[rec.device]):
                raise ApplicationError(
                    f"host {rec.device}: port GUIDs disagree: UFM {', '.join(ufm[rec.device]) or 'none'}, "
                    f"NetBox {', '.join(nb) or ('no device' if not rec.found else 'none')}; nothing was changed",
                    type="GuidMismatch", non_retryable=True,
                )  # fmt: skip
    return ufm


@workflow.defn
class IsolateTenant:
    @workflow.init
    def __init__(self, inp: IsolateTenantInput) -> None:
        self._inp = inp
        self._step = Step()
        self._calls = Endpoints(inp.retry_timeout)
        self._writes: IsolationWrites | None = None  # set at the allocation, before the first UFM write

    @workflow.query
    def progress(self) -> Progress:
        return Progress(phase=self._step.phase, details=self._step.note,
                        finished=self._step.phase in ("isolated", "failed"), waiting=self._calls.waiting())  # fmt: skip

    def _enter(self, phase: str, note: str = "") -> None:
        self._step = Step(phase=phase, note=note)
        workflow.upsert_search_attributes([sa.PHASE.value_set(phase)])
        workflow.set_current_details(f"**{phase}** tenant `{self._inp.tenant}` on `{self._inp.fabric}`"
                                     + (f"\n\n{note}" if note else ""))  # fmt: skip

    @workflow.run
    async def run(self, inp: IsolateTenantInput) -> IsolateTenantResult:
        workflow.upsert_search_attributes([sa.TENANT.value_set(inp.tenant)])
        try:
            return await self._run(inp)
        except Exception as err:
            if self._writes is None or not workflow.patched(ISOLATION_UNDO):  # nothing written, or an older run
                self._enter("failed", str(saga.root_cause(err)))
                raise
            self._enter("compensating", str(saga.root_cause(err)))
            created, removed = await self._undo(inp, self._writes)
            failure = saga.failure(f"isolating tenant {inp.tenant} on {inp.fabric}", err, created, removed)
            self._enter("failed", failure.message)
            raise failure from err

    async def _undo(self, inp: IsolateTenantInput, w: IsolationWrites) -> tuple[list[str], list[str]]:
        """Undo what this run created, read from UFM: (created, removed), in creation and reverse order."""
        now = await _read_pkey(self._calls, w.pkey, f"what the failed run left in {w.pkey}")
        ports = w.new_ports(now)
        created = w.lines(now, ports, inp.fabric)
        if w.allocated:  # the PKey is this run's: all of it goes, allocation included
            await workflow.execute_child_workflow(
                ReleaseTenant.run, ReleaseTenantInput(fabric=inp.fabric, tenant=inp.tenant, netbox=inp.netbox),
                id=ReleaseTenantInput(fabric=inp.fabric, tenant=inp.tenant).workflow_id(),
                static_summary=f"undo the isolation of {inp.tenant}")
        else:  # the tenant's PKey stays: only the ports this run added go, from UFM and the books
            if ports:
                await workflow.execute_activity_method(
                    UfmActivities.remove_guids, RemoveGuids(pkey=w.pkey, guids=ports), **UFM_CALL,
                    summary=f"remove the {len(ports)} ports this run added to {w.pkey}")
            added = [g for g in w.members if g not in w.booked_before]
            if added:
                await _fabric(inp.fabric, "withdraw", WithdrawRequest(tenant=inp.tenant, guids=added))
        after = await _read_pkey(self._calls, w.pkey, f"read back {w.pkey} after the undo")
        if not w.allocated and w.pkey_before is not None and not after.exists \
                and workflow.patched(UNDO_KEEPS_HELD_PKEY):  # fmt: skip
            # The PKey was there, empty of these ports, before the run: UFM deleted it with the last port the
            # undo removed. It is the tenant's and stays, as it was.
            await self._calls.execute(
                UfmActivities.ensure_pkey, EnsurePKey(pkey=w.pkey, partition_name=w.partition_before or inp.tenant),
                **UFM_CALL, endpoint=UFM, summary=f"recreate {w.pkey}, deleted by UFM with its last member",
            )  # fmt: skip
            after = await _read_pkey(self._calls, w.pkey, f"read back {w.pkey} after recreating it")
        still = set(w.lines(after, ports, inp.fabric))
        return created, [line for line in reversed(created) if line not in still]

    async def _run(self, inp: IsolateTenantInput) -> IsolateTenantResult:
        posture, accepted = None, []
        if workflow.patched(POSTURE_PATCH):
            self._enter("checking-posture", f"fabric {inp.fabric}")
            posture = await fabric_posture(self._calls)
            accepted = refuse_insecure(inp.fabric, posture, list(inp.accept_posture))
        self._enter("resolving", f"hosts {', '.join(inp.hosts)}")
        by_host = await resolve_and_check(self._calls, inp.hosts, inp.netbox)
        members = {g: h for h, gs in by_host.items() for g in gs}

        self._enter("allocating")
        snap: FabricSnapshot = await self._calls.execute(
            UfmActivities.snapshot, EmptyRequest(), **UFM_LISTING, endpoint=UFM, summary="PKeys in UFM"
        )
        state = FabricState.model_validate(await _fabric(inp.fabric, "state"))
        ours = {a.pkey for a in state.allocations.values()} | set(state.retired)
        exclude = [p.pkey for p in snap.pkeys if p.pkey not in ours]
        held = state.allocations.get(inp.tenant)
        alloc = Allocation.model_validate(await _fabric(
            inp.fabric, "allocate",
            AllocateRequest(tenant=inp.tenant, members=members, membership=inp.membership, exclude=exclude),
        ))  # fmt: skip
        found = next((p for p in snap.pkeys if p.pkey == alloc.pkey), None)
        before = found.members if found else None
        self._writes = IsolationWrites(pkey=alloc.pkey, allocated=held is None, pkey_before=before,
                                       partition_before=found.partition if found else "",
                                       booked_before=sorted(held.members) if held else [], members=members)

        self._enter("adding", f"PKey {alloc.pkey}: {len(members)} ports")
        await self._calls.execute(
            UfmActivities.ensure_pkey, EnsurePKey(pkey=alloc.pkey, partition_name=inp.tenant), **UFM_CALL,
            endpoint=UFM, summary=f"ensure PKey {alloc.pkey}",
        )  # fmt: skip
        await self._calls.execute(
            UfmActivities.add_guids,
            AddGuids(pkey=alloc.pkey, guids=sorted(members), membership=inp.membership),
            **UFM_CALL, endpoint=UFM, summary=f"add {len(members)} GUIDs to {alloc.pkey}",
        )  # fmt: skip

        self._enter("verifying", f"PKey {alloc.pkey}")
        read: PKeyMembers = await self._calls.execute(
            UfmActivities.get_pkey, PKeyRef(pkey=alloc.pkey), **UFM_CALL,
            endpoint=UFM, summary=f"read back {alloc.pkey}"
        )
        wrong = [f"{g} ({members[g]})" for g in sorted(members) if read.members.get(g) != inp.membership]
        if wrong:
            raise ApplicationError(f"PKey {alloc.pkey} lacks {', '.join(wrong)} after the add",
                                   type="VerifyFailed", non_retryable=True)  # fmt: skip

        if inp.netbox:
            self._enter("recording")
            await self._calls.execute(
                NetBoxActivities.record_tenant_pkey,
                TenantPKeyRecord(tenant=inp.tenant, name=inp.tenant_name, fabric=inp.fabric, pkey=alloc.pkey,
                                 members=by_host),
                **NETBOX_CALL, endpoint=NETBOX, summary="record the PKey in NetBox",
            )  # fmt: skip
        await _fabric(inp.fabric, "confirm", TenantRequest(tenant=inp.tenant))
        self._enter("isolated", f"PKey {alloc.pkey}: {len(members)} ports verified")
        # Created and added: from UFM before the first write, not the writes' answers (a retry after a lost
        # answer finds its own write done and would call it "already there").
        before_members = before or {}
        added = [g for g in sorted(members) if g not in before_members]
        changed = [g for g in sorted(members) if g in before_members and before_members[g] != inp.membership]
        already = [g for g in sorted(members) if g not in added and g not in changed]
        return IsolateTenantResult(fabric=inp.fabric, tenant=inp.tenant, pkey=alloc.pkey, members=by_host,
                                   added=added, already=already,
                                   pkey_created=before is None, membership_changed=changed, posture=posture,
                                   accepted_findings=accepted)  # fmt: skip


# ================================================================== ReleaseTenant


class ReleaseTenantInput(WorkflowInput, RetryTimeout):
    fabric: str
    tenant: str
    netbox: bool = Field(True, description="Clear the PKey recorded in NetBox.")

    _n = field_validator("fabric", "tenant")(_name)

    def workflow_id(self) -> str:
        return f"release-tenant/{self.fabric}/{self.tenant}"

    def search_attributes(self) -> list[SearchAttributePair]:
        return [SearchAttributePair(sa.TENANT, self.tenant)]


class ReleaseTenantResult(StrictModel):
    fabric: str
    tenant: str
    pkey: str | None
    removed: list[str] = Field(default_factory=list)
    already_absent: list[str] = Field(default_factory=list)
    pkey_deleted: bool = False
    remaining: dict[str, str] = Field(default_factory=dict, description="Other members left: the PKey was kept.")


@workflow.defn
class ReleaseTenant:
    @workflow.init
    def __init__(self, inp: ReleaseTenantInput) -> None:
        self._inp = inp
        self._phase = "starting"
        self._calls = Endpoints(inp.retry_timeout)

    @workflow.query
    def progress(self) -> Progress:
        return Progress(phase=self._phase, finished=self._phase in ("released", "nothing-to-release"),
                        waiting=self._calls.waiting())  # fmt: skip

    def _enter(self, phase: str, note: str = "") -> None:
        self._phase = phase
        workflow.upsert_search_attributes([sa.PHASE.value_set(phase)])
        workflow.set_current_details(f"**{phase}** tenant `{self._inp.tenant}` on `{self._inp.fabric}`"
                                     + (f"\n\n{note}" if note else ""))  # fmt: skip

    @workflow.run
    async def run(self, inp: ReleaseTenantInput) -> ReleaseTenantResult:
        workflow.upsert_search_attributes([sa.TENANT.value_set(inp.tenant)])
        raw = await _fabric(inp.fabric, "begin_release", TenantRequest(tenant=inp.tenant))
        if not raw:
            self._enter("nothing-to-release")
            return ReleaseTenantResult(fabric=inp.fabric, tenant=inp.tenant, pkey=None)
        alloc = Allocation.model_validate(raw)
        guids = sorted(alloc.members)
        self._enter("removing", f"PKey {alloc.pkey}: {len(guids)} ports")
        before = await _read_pkey(self._calls, alloc.pkey, f"read {alloc.pkey} before the removal") \
            if workflow.patched(RELEASE_READS_FIRST) else None
        change: MembershipChange = await self._calls.execute(
            UfmActivities.remove_guids, RemoveGuids(pkey=alloc.pkey, guids=guids), **UFM_CALL,
            endpoint=UFM, summary=f"remove {len(guids)} GUIDs from {alloc.pkey}",
        ) if guids else MembershipChange(pkey=alloc.pkey)  # fmt: skip
        self._enter("verifying")
        read = await _read_pkey(self._calls, alloc.pkey, f"read back {alloc.pkey}")
        left = [g for g in guids if g in read.members]
        if left:
            raise ApplicationError(f"PKey {alloc.pkey} still has {', '.join(left)} after the removal",
                                   type="VerifyFailed", non_retryable=True)  # fmt: skip
        deleted: DeletedPKey = await self._calls.execute(
            UfmActivities.delete_pkey_if_empty, PKeyRef(pkey=alloc.pkey), **UFM_CALL,
            endpoint=UFM, summary=f"delete {alloc.pkey}"
        )
        if inp.netbox:
            await self._calls.execute(
                NetBoxActivities.record_tenant_pkey,
                TenantPKeyRecord(tenant=inp.tenant, fabric=inp.fabric, pkey=None), **NETBOX_CALL,
                endpoint=NETBOX, summary="clear the PKey in NetBox",
            )  # fmt: skip
        await _fabric(inp.fabric, "finish_release", FinishRelease(tenant=inp.tenant, remaining=deleted.remaining))
        # Read from UFM, not the answers: after a lost one, the retry finds its own removal or deletion done
        # ("absent"). UFM deletes a PKey with its last member: there before the removal, gone after it.
        by_ufm = not read.exists and (before.exists if before is not None else change.pkey_deleted)
        by_us = deleted.deleted or (read.exists and not deleted.existed)
        pkey_deleted = by_us or by_ufm
        note = f"PKey {alloc.pkey} " + ("deleted" if by_us else "deleted by UFM with its last member" if by_ufm
                                        else "already absent from UFM" if not read.exists
                                        else f"kept with {len(deleted.remaining)} other members (retired)")
        self._enter("released", note)
        removed = [g for g in guids if g in before.members] if before else change.changed
        return ReleaseTenantResult(
            fabric=inp.fabric, tenant=inp.tenant, pkey=alloc.pkey, removed=removed,
            already_absent=[g for g in guids if g not in removed], pkey_deleted=pkey_deleted,
            remaining=deleted.remaining,
        )  # fmt: skip


# ================================================================== FabricAudit

DriftKind = Literal["unknown-member", "missing-member", "missing-pkey", "guid-in-two-tenants", "wrong-membership",
                    "unknown-virtual-member", "virtual-member-of-other-tenant"]
# What a repair removes: a member no tenant owns, or another tenant's physical port. Never a virtual GUID whose
# physical port belongs to a tenant (that tenant's VM): it is reported only.
_REMOVED_BY_REPAIR = ("unknown-member", "guid-in-two-tenants", "unknown-virtual-member")
# Audits started before PKeys were read one at a time read the whole fabric in one activity; replays take that path.
AUDIT_BY_PKEY_PATCH = "fabric-audit-by-pkey"
AUDIT_HISTORY_LIMIT = 6000  # continue as new past this, or at the server's suggestion (4,096 events)
DRIFT_LISTED = 1000  # drift items, repairs and recognised virtual GUIDs a result lists; the counts stay exact
REPAIR_CHUNK = 500  # GUIDs per repair call
HOSTS_CHUNK = 10000  # GUIDs per port-owner lookup


class Drift(StrictModel):
    kind: DriftKind
    pkey: str
    tenant: str | None = None
    guid: str | None = None
    host: str | None = None
    detail: str

    def line(self) -> str:
        return f"{self.kind}: PKey {self.pkey}" + (f" ({self.tenant})" if self.tenant else "") + f": {self.detail}"


class AuditCursor(StrictModel):
    """Where an audit stands, carried across continue-as-new."""

    after: int = Field(0, description="The last PKey audited, as a number (PKeys are audited in ascending order).")
    checked: list[str] = Field(default_factory=list)
    drift: list[Drift] = Field(default_factory=list, description=f"The first {DRIFT_LISTED} drift items.")
    drift_counts: dict[str, int] = Field(default_factory=dict, description="Drift items by kind, all of them.")
    repaired: list[str] = Field(default_factory=list, description=f"The first {DRIFT_LISTED} repairs.")
    repaired_total: int = 0
    unmanaged: list[str] | None = Field(None, description="PKeys in UFM no tenant owns (None: not read yet).")
    virtual_members: list[str] = Field(default_factory=list,
                                       description=f"The first {DRIFT_LISTED} virtual GUIDs recognised.")
    virtual_members_total: int = 0
    posture: FabricPosture | None = Field(None, description="Read by the audit's first run (None: an audit "
                                                            "started before the posture check).")  # fmt: skip


class FabricAuditInput(WorkflowInput, RetryTimeout):
    fabric: str
    repair: bool = Field(False, description="Repair drift: add missing members, remove unknown ones.")
    concurrency: int = Field(8, ge=1, le=50, description="PKeys read from UFM at once.")
    carried: AuditCursor | None = Field(None, description="Internal: carried across continue-as-new.")

    _n = field_validator("fabric")(_name)

    def workflow_id(self) -> str:
        return f"fabric-audit/{self.fabric}"


class FabricAuditResult(StrictModel):
    fabric: str
    checked_pkeys: list[str]
    drift: list[Drift] = Field(default_factory=list, description=f"Drift, one item per GUID and place (the first "
                               f"{DRIFT_LISTED}; `drift_total` counts them all).")  # fmt: skip
    drift_total: int = 0
    drift_counts: dict[str, int] = Field(default_factory=dict, description="Drift items by kind.")
    repaired: list[str] = Field(default_factory=list, description=f"What the repair did, one line per change (the "
                                f"first {DRIFT_LISTED}).")  # fmt: skip
    repaired_total: int = 0
    unmanaged_pkeys: list[str] = Field(default_factory=list, description="PKeys in UFM no tenant of this fabric owns.")
    clean: bool = Field(description="No drift (the posture is reported apart: `insecure`).")
    virtual_members: list[str] = Field(default_factory=list, description="Virtual (SR-IOV) GUIDs recognised in "
                                       f"their tenant's PKey (the first {DRIFT_LISTED}).")  # fmt: skip
    virtual_members_total: int = 0
    posture: FabricPosture | None = Field(None, description="The fabric's security posture, read by every audit.")
    insecure: bool = Field(False, description="The posture voids PKey isolation or leaves it unverifiable.")


@workflow.defn
class FabricAudit:
    """Report the fabric's posture, and compare every tenant's PKey in UFM with the Fabric entity's desired state,
    one PKey at a time.

    The audit's first run reads the fabric's posture (`fabric_posture`: 0x7fff's default membership and the SM keys)
    and UFM's PKey list (keys only). Each run reads the desired state (the Fabric's `state`); then the live PKeys in
    ascending order, `concurrency` at a time (`get_pkey`: one PKey's members), then, for the members no allocation of
    their PKey desires, which system each belongs to and which are virtual (SR-IOV) ports on which physical port
    (`port_hosts`); then the drift of each PKey, and its repair when asked (GUIDs 500 to a call). A virtual GUID on a
    port of the PKey's own tenant is that tenant's VM: recognised, not drift; one on another tenant's port is reported
    and never removed; one on no tenant's port is removed by a repair. Past `AUDIT_HISTORY_LIMIT` events (or the
    server's suggestion) it continues as new after the current wave (reads of a few seconds) with a cursor: the last
    PKey audited, the posture, the drift so far (counts by kind and the first 1,000 items), the recognised virtual
    GUIDs and the repairs.

    UFM cannot be asked for ports or virtual ports by GUID (its port list filters by system and type, its virtual
    port list not at all), so `port_hosts` reads the host ports and the virtual ports whole, inside the activity,
    with a timeout that grows with the fabric, heartbeating: one bounded read per wave that has such members (a
    clean fabric makes none), and only the GUIDs asked about come back into the history.

    History events: per PKey ≤ 6 (the read: scheduled, started, completed; a workflow task), per wave with unknown
    members ~6 (the owners' lookup), per drifted PKey repaired ≤ 18 (three calls), per run ~12 (the desired state;
    the PKey list) and ~6 in the first (the posture). None per port: members stay inside each PKey's read. At 10,000
    nodes in 500 tenants: ~3,400 events in one run; the worst case, a PKey per node: ~68,000 events in runs of
    ≤ 6,000 + one wave (≤ 8 × 24 + 6). Payloads: a PKey's members (~36 bytes a port) must fit in 2 MB, ~55,000
    ports a PKey; the desired state is read whole, as the Fabric entity carries it whole across its own
    continue-as-new.
    """

    @workflow.init
    def __init__(self, inp: FabricAuditInput) -> None:
        self._inp = inp
        self._phase = "starting"
        self._cursor = inp.carried or AuditCursor()
        self._calls = Endpoints(inp.retry_timeout)

    @workflow.query
    def progress(self) -> Progress:
        c = self._cursor
        return Progress(phase=self._phase, done=len(c.checked), details="\n".join(d.line() for d in c.drift[:50]),
                        finished=self._phase in ("clean", "drift", "repaired"),
                        waiting=self._calls.waiting())  # fmt: skip

    @workflow.run
    async def run(self, inp: FabricAuditInput) -> FabricAuditResult:
        if inp.carried is None and not workflow.patched(AUDIT_BY_PKEY_PATCH):
            return await self._audit_whole(inp)
        cursor = self._cursor
        self._phase = "reading"
        if inp.carried is None and workflow.patched(POSTURE_PATCH):
            cursor.posture = await fabric_posture(self._calls)
        state = FabricState.model_validate(await _fabric(inp.fabric, "state"))
        allocations = list(state.allocations.values())
        if cursor.unmanaged is None:
            listed: PKeyList = await self._calls.execute(UfmActivities.list_pkeys, EmptyRequest(), **UFM_LISTING,
                                                         endpoint=UFM, summary="PKeys in UFM")  # fmt: skip
            managed = {a.pkey for a in allocations if a.state != "releasing"}
            cursor.unmanaged = [p for p in listed.pkeys if p not in managed and p not in state.retired]
        owner = {g: a for a in allocations for g in a.members}
        todo = sorted((a for a in allocations if a.state != "releasing" and int(a.pkey, 16) > cursor.after),
                      key=lambda a: int(a.pkey, 16))  # fmt: skip
        for start in range(0, len(todo), inp.concurrency):
            if start and history_is_long(AUDIT_HISTORY_LIMIT):
                await workflow.wait_condition(workflow.all_handlers_finished)
                workflow.continue_as_new(inp.model_copy(update={"carried": cursor}))
            await self._audit_wave(todo[start:start + inp.concurrency], owner)
        result = FabricAuditResult(
            fabric=inp.fabric, checked_pkeys=cursor.checked, drift=cursor.drift,
            drift_total=sum(cursor.drift_counts.values()), drift_counts=cursor.drift_counts, repaired=cursor.repaired,
            repaired_total=cursor.repaired_total, unmanaged_pkeys=cursor.unmanaged or [],
            clean=not cursor.drift_counts, virtual_members=cursor.virtual_members,
            virtual_members_total=cursor.virtual_members_total, posture=cursor.posture,
            insecure=bool(cursor.posture and cursor.posture.blocking()),
        )  # fmt: skip
        self._phase = "repaired" if cursor.repaired_total else "drift" if result.drift_total else "clean"
        self._finish(result)
        return result

    async def _audit_wave(self, wave: list[Allocation], owner: dict[str, Allocation]) -> None:
        """Read these PKeys from UFM at once, find who owns their unknown members, record and repair the drift."""
        cursor = self._cursor
        self._phase = "auditing"
        read: list[PKeyMembers] = await asyncio.gather(*(self._calls.execute(
            UfmActivities.get_pkey, PKeyRef(pkey=a.pkey), **UFM_CALL, endpoint=UFM, summary=f"read PKey {a.pkey}")
            for a in wave))  # fmt: skip
        strangers = sorted({g for a, p in zip(wave, read) for g in p.members if g not in a.members})
        found = PortHosts()
        for i in range(0, len(strangers), HOSTS_CHUNK):
            part: PortHosts = await self._calls.execute(
                UfmActivities.port_hosts, GuidsRequest(guids=strangers[i:i + HOSTS_CHUNK]), **UFM_LISTING,
                endpoint=UFM, summary=f"owners of {len(strangers[i:i + HOSTS_CHUNK])} unknown ports")  # fmt: skip
            found.hosts |= part.hosts
            found.virtual |= part.virtual
        for a, p in zip(wave, read):
            drift, recognised = pkey_drift(a, p if p.exists else None, owner, found.hosts, found.virtual)
            for d in drift:
                cursor.drift_counts[d.kind] = cursor.drift_counts.get(d.kind, 0) + 1
            cursor.drift += drift[:max(DRIFT_LISTED - len(cursor.drift), 0)]
            cursor.virtual_members_total += len(recognised)
            cursor.virtual_members += recognised[:max(DRIFT_LISTED - len(cursor.virtual_members), 0)]
            if drift and self._inp.repair:
                done = await self._repair_pkey(a, drift)
                cursor.repaired_total += len(done)
                cursor.repaired += done[:max(DRIFT_LISTED - len(cursor.repaired), 0)]
            cursor.checked.append(a.pkey)
            cursor.after = int(a.pkey, 16)
        self._show(f"{len(cursor.checked)} PKeys audited, {sum(cursor.drift_counts.values())} drift items")

    async def _repair_pkey(self, a: Allocation, drift: list[Drift]) -> list[str]:
        done: list[str] = []
        if any(d.kind == "missing-pkey" for d in drift):
            await self._calls.execute(UfmActivities.ensure_pkey, EnsurePKey(pkey=a.pkey), **UFM_CALL, endpoint=UFM,
                                      summary=f"recreate {a.pkey}")  # fmt: skip
            done.append(f"created PKey {a.pkey}")
        return done + await self._fix_members(a, a.pkey, drift, chunk=REPAIR_CHUNK)

    async def _fix_members(self, a: Allocation | None, pkey: str, drift: list[Drift], chunk: int | None) -> list[str]:
        """Add the missing members, change wrong memberships and remove the members a repair removes, of one PKey,
        `chunk` GUIDs a call (None: all)."""
        add = sorted({d.guid for d in drift if d.pkey == pkey and d.guid
                      and d.kind in ("missing-member", "missing-pkey", "wrong-membership")})  # fmt: skip
        remove = sorted({d.guid for d in drift if d.pkey == pkey and d.guid and d.kind in _REMOVED_BY_REPAIR})
        done: list[str] = []
        if add and a is not None:
            # Which were changed: from the audit's read, not the answer (a retry after a lost one finds the change
            # done and reports nothing changed).
            changed = {d.guid for d in drift if d.pkey == pkey and d.kind == "wrong-membership"}
            for part in _chunks(add, chunk):
                # Absent GUIDs are added; members with another membership are changed by read-merge-PUT, read back.
                await self._calls.execute(
                    UfmActivities.add_guids, AddGuids(pkey=pkey, guids=part, membership=a.membership), **UFM_CALL,
                    endpoint=UFM, summary=f"re-add {len(part)} GUIDs to {pkey}",
                )  # fmt: skip
                done += [f"changed {g} ({a.members.get(g)}) to {a.membership} in {pkey}" if g in changed
                         else f"added {g} ({a.members.get(g)}) to {pkey}" for g in part]  # fmt: skip
        if remove:
            for part in _chunks(remove, chunk):
                await self._calls.execute(
                    UfmActivities.remove_guids, RemoveGuids(pkey=pkey, guids=part), **UFM_CALL,
                    endpoint=UFM, summary=f"remove {len(part)} unknown GUIDs from {pkey}",
                )  # fmt: skip
                done += [f"removed {g} from {pkey}" for g in part]
        return done

    def _finish(self, r: FabricAuditResult) -> None:
        meter = workflow.metric_meter()
        meter.create_gauge("millwright_fabric_drift", "Drift found by the last fabric audit", "items").set(
            r.drift_total, {"fabric": r.fabric})
        if r.posture is not None:
            meter.create_gauge("millwright_fabric_insecure", "1: the last fabric audit found the fabric's posture "
                               "voids PKey isolation or leaves it unverifiable").set(int(r.insecure),
                                                                                     {"fabric": r.fabric})
            meter.create_gauge("millwright_fabric_posture_warnings", "Posture warnings (SM keys) of the last fabric "
                               "audit", "items").set(len(r.posture.warnings()), {"fabric": r.fabric})  # fmt: skip
        self._show(f"{r.drift_total} drift items in {len(r.checked_pkeys)} PKeys", r)

    def _show(self, head: str, r: FabricAuditResult | None = None) -> None:
        c = self._cursor if r is None else r
        lines = [f"**{self._phase}** fabric `{self._inp.fabric}`: {head}"]
        lines += [f"posture ({'blocking' if f.blocking else 'warning'}): {f.line()}"
                  for f in (c.posture.findings if c.posture else [])]  # fmt: skip
        lines += [d.line() for d in c.drift[:50]] + [f"repaired: {x}" for x in c.repaired[:50]]
        workflow.set_current_details("\n\n".join(lines))

    # ------------------------------------------------------------ audits started before the PKey reads

    async def _audit_whole(self, inp: FabricAuditInput) -> FabricAuditResult:
        """The whole fabric in one snapshot (an audit from before `AUDIT_BY_PKEY_PATCH`, replayed)."""
        self._phase = "reading"
        posture = await fabric_posture(self._calls) if workflow.patched(POSTURE_PATCH) else None
        state = FabricState.model_validate(await _fabric(inp.fabric, "state"))
        allocations = list(state.allocations.values())
        snap: FabricSnapshot = await self._calls.execute(
            UfmActivities.snapshot, EmptyRequest(), **UFM_LISTING, endpoint=UFM, summary="PKeys in UFM"
        )
        drift, recognised = audit(allocations, snap)
        self._cursor.drift = drift
        managed = {a.pkey for a in allocations if a.state != "releasing"}
        result = FabricAuditResult(
            fabric=inp.fabric, checked_pkeys=sorted(managed), drift=drift, drift_total=len(drift),
            drift_counts=dict(Counter(d.kind for d in drift)), clean=not drift, virtual_members=recognised,
            virtual_members_total=len(recognised),
            unmanaged_pkeys=[p.pkey for p in snap.pkeys if p.pkey not in managed and p.pkey not in state.retired],
            posture=posture, insecure=bool(posture and posture.blocking()),
        )  # fmt: skip
        self._phase = "drift" if drift else "clean"
        self._finish(result)
        if drift and inp.repair:
            by_pkey = {a.pkey: a for a in allocations}
            for pkey in sorted({d.pkey for d in drift if d.kind == "missing-pkey"}):
                await self._calls.execute(UfmActivities.ensure_pkey, EnsurePKey(pkey=pkey), **UFM_CALL,
                                          endpoint=UFM, summary=f"recreate {pkey}")  # fmt: skip
                result.repaired.append(f"created PKey {pkey}")
            for pkey in sorted({d.pkey for d in drift}):
                result.repaired += await self._fix_members(by_pkey.get(pkey), pkey, drift, chunk=None)
            result.repaired_total = len(result.repaired)
            self._phase = "repaired"
            self._show(f"{len(drift)} drift items in {len(result.checked_pkeys)} PKeys", result)
        return result


def _chunks(items: list[str], size: int | None) -> list[list[str]]:
    return [items] if size is None else [items[i:i + size] for i in range(0, len(items), size)]


def audit(allocations: list[Allocation], snap: FabricSnapshot) -> tuple[list[Drift], list[str]]:
    """Drift between the desired state (allocations) and a whole-fabric snapshot, one item per GUID and place; and
    the virtual GUIDs recognised in their own tenant's PKey."""
    in_ufm = {p.pkey: p for p in snap.pkeys}
    owner = {g: a for a in allocations for g in a.members}
    live = [a for a in allocations if a.state != "releasing"]
    drift: list[Drift] = []
    recognised: list[str] = []
    for a in sorted(live, key=lambda a: a.pkey):
        found, known = pkey_drift(a, in_ufm.get(a.pkey), owner, snap.hosts_by_guid, snap.virtual)
        drift += found
        recognised += known
    return drift, recognised


def pkey_drift(a: Allocation, p: PKeyMembers | None, owner: dict[str, Allocation], host: dict[str, str],
               virtual: dict[str, VirtualPort]) -> tuple[list[Drift], list[str]]:  # fmt: skip
    """Drift of one tenant's PKey: `p` its members in UFM (None: absent), `owner` who desires each GUID, `host`
    the UFM system of the GUIDs no one here desires, `virtual` which of those are virtual ports, and where. Also
    returns the virtual GUIDs recognised on the tenant's own ports (its VMs), which are not drift."""
    if p is None:
        return [Drift(kind="missing-pkey", pkey=a.pkey, tenant=a.tenant,
                      detail=f"PKey absent from UFM; {len(a.members)} ports expected")] + [
            Drift(kind="missing-pkey", pkey=a.pkey, tenant=a.tenant, guid=g, host=h,
                  detail=f"port {g} of {h} not a member (PKey absent)") for g, h in sorted(a.members.items())], []
    out: list[Drift] = []
    recognised: list[str] = []
    for g, h in sorted(a.members.items()):
        if g not in p.members:
            out.append(Drift(kind="missing-member", pkey=a.pkey, tenant=a.tenant, guid=g, host=h,
                             detail=f"port {g} of {h} is missing"))
        elif p.members[g] != a.membership:
            out.append(Drift(kind="wrong-membership", pkey=a.pkey, tenant=a.tenant, guid=g, host=h,
                             detail=f"port {g} of {h} is {p.members[g]}, expected {a.membership}"))
    for g in sorted(set(p.members) - set(a.members)):
        other = owner.get(g)
        h = host.get(g, "unknown host")
        v = virtual.get(g)
        if v is not None and other is None:
            port_owner = owner.get(v.port_guid)
            where = f"virtual port {g} of {v.host or 'unknown host'} (on port {v.port_guid})"
            if port_owner is None:
                out.append(Drift(kind="unknown-virtual-member", pkey=a.pkey, tenant=a.tenant, guid=g, host=v.host,
                                 detail=f"{where} is a member, but its port belongs to no tenant"))
            elif port_owner.tenant != a.tenant:
                out.append(Drift(kind="virtual-member-of-other-tenant", pkey=a.pkey, tenant=a.tenant, guid=g,
                                 host=v.host, detail=f"{where} of tenant {port_owner.tenant} ({port_owner.pkey}) "
                                                     f"is a member of {a.tenant}'s PKey; left for the tenants "
                                                     "to settle (a repair never removes it)"))  # fmt: skip
            else:
                recognised.append(f"{a.pkey} ({a.tenant}): {where}")
            continue
        if other is not None:
            out.append(Drift(kind="guid-in-two-tenants", pkey=a.pkey, tenant=a.tenant, guid=g, host=h,
                             detail=f"port {g} of {h} belongs to tenant {other.tenant} ({other.pkey}) "
                                    f"but is also in {a.tenant}'s PKey"))  # fmt: skip
            continue
        out.append(Drift(kind="unknown-member", pkey=a.pkey, tenant=a.tenant, guid=g, host=h,
                         detail=f"port {g} of {h} is a member but not desired"))
    return out, recognised
