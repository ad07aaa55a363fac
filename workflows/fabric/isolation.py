"""IsolateTenant: a tenant's hosts into its own PKey, checked against the fabric's posture and NetBox, undone on
failure.

See workflows/fabric/fabric.py for the family."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator
from temporalio import workflow
from temporalio.common import SearchAttributePair
from temporalio.exceptions import ApplicationError

from activities.models import StrictModel
from activities.netbox.activities import NetBoxActivities
from activities.netbox.models import TenantPKeyRecord
from activities.ufm.activities import UfmActivities
from activities.ufm.models import AddGuids, EmptyRequest, EnsurePKey, FabricSnapshot, PKeyMembers, PKeyRef, RemoveGuids
from activities.ufm.posture import BlockingCode, FabricPosture
from workflows.common import saga
from workflows.common import search_attributes as sa
from workflows.common.base import Progress, WorkflowInput
from workflows.common.endpoints import NETBOX, UFM, Endpoints, RetryTimeout
from workflows.common.errors import root_cause
from workflows.fabric.calls import (
    ISOLATION_UNDO,
    NETBOX_CALL,
    POSTURE_PATCH,
    UFM_CALL,
    UFM_LISTING,
    UNDO_KEEPS_HELD_PKEY,
    call_fabric,
    fabric_posture,
    read_pkey,
    refuse_insecure,
    resolve_and_check,
    show_tenant_step,
    validate_fabric_name,
)
from workflows.fabric.models import AllocateRequest, Allocation, FabricState, TenantRequest, WithdrawRequest
from workflows.fabric.release import ReleaseTenant, ReleaseTenantInput

# A host whose ports UFM has in another tenant's (or an unknown) PKey is refused before the allocation.
PORTS_OF_OTHERS = "isolate-tenant-refuses-ports-of-others"


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

    _n = field_validator("fabric", "tenant")(validate_fabric_name)

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
        return [g for g in sorted(self.members) if g in now.members and g not in before and g not in self.booked_before]

    def lines(self, now: PKeyMembers, ports: list[str], fabric: str) -> list[str]:
        """The report's lines for what is there now of what this run created, in creation order."""
        pkey = [f"PKey {self.pkey} on {fabric}"] if now.exists and self.pkey_before is None else []
        return pkey + [f"port {g} of {self.members[g]} in PKey {self.pkey}" for g in ports if g in now.members]


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
        show_tenant_step(phase, self._inp.tenant, self._inp.fabric, note)

    @workflow.run
    async def run(self, inp: IsolateTenantInput) -> IsolateTenantResult:
        workflow.upsert_search_attributes([sa.TENANT.value_set(inp.tenant)])
        try:
            return await self._run(inp)
        except Exception as err:
            if self._writes is None:  # nothing written
                self._enter("failed", str(root_cause(err)))
                raise
            workflow.deprecate_patch(ISOLATION_UNDO)
            self._enter("compensating", str(root_cause(err)))
            created, removed = await self._undo(inp, self._writes)
            failure = saga.failure(f"isolating tenant {inp.tenant} on {inp.fabric}", err, created, removed)
            self._enter("failed", failure.message)
            raise failure from err

    async def _undo(self, inp: IsolateTenantInput, w: IsolationWrites) -> tuple[list[str], list[str]]:
        """Undo what this run created, read from UFM: (created, removed), in creation and reverse order."""
        now = await read_pkey(self._calls, w.pkey, f"what the failed run left in {w.pkey}")
        ports = w.new_ports(now)
        created = w.lines(now, ports, inp.fabric)
        if w.allocated:  # the PKey is this run's: all of it goes, allocation included
            await workflow.execute_child_workflow(
                ReleaseTenant.run,
                ReleaseTenantInput(fabric=inp.fabric, tenant=inp.tenant, netbox=inp.netbox),
                id=ReleaseTenantInput(fabric=inp.fabric, tenant=inp.tenant).workflow_id(),
                static_summary=f"undo the isolation of {inp.tenant}",
            )
        else:  # the tenant's PKey stays: only the ports this run added go, from UFM and the books
            if ports:
                await self._calls.execute(
                    UfmActivities.remove_guids,
                    RemoveGuids(pkey=w.pkey, guids=ports),
                    **UFM_CALL,
                    endpoint=UFM,
                    summary=f"remove the {len(ports)} ports this run added to {w.pkey}",
                )
            added = [g for g in w.members if g not in w.booked_before]
            if added:
                await call_fabric(inp.fabric, "withdraw", WithdrawRequest(tenant=inp.tenant, guids=added))
        after = await read_pkey(self._calls, w.pkey, f"read back {w.pkey} after the undo")
        if not w.allocated and w.pkey_before is not None and not after.exists:
            workflow.deprecate_patch(UNDO_KEEPS_HELD_PKEY)
            # The PKey was there, empty of these ports, before the run: UFM deleted it with the last port the
            # undo removed. It is the tenant's and stays, as it was.
            await self._calls.execute(
                UfmActivities.ensure_pkey, EnsurePKey(pkey=w.pkey, partition_name=w.partition_before or inp.tenant),
                **UFM_CALL, endpoint=UFM, summary=f"recreate {w.pkey}, deleted by UFM with its last member",
            )  # fmt: skip
            after = await read_pkey(self._calls, w.pkey, f"read back {w.pkey} after recreating it")
        still = set(w.lines(after, ports, inp.fabric))
        return created, [line for line in reversed(created) if line not in still]

    async def _run(self, inp: IsolateTenantInput) -> IsolateTenantResult:
        workflow.deprecate_patch(POSTURE_PATCH)
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
        state = FabricState.model_validate(await call_fabric(inp.fabric, "state"))
        workflow.deprecate_patch(PORTS_OF_OTHERS)
        taken = state.ports_of_others(inp.tenant, members, snap)
        if taken:
            raise ApplicationError(
                f"hosts: {'; '.join(taken)}. A port belongs to one partition: release it there first. "
                "Nothing was changed", type="HostOfAnotherTenant", non_retryable=True,
            )  # fmt: skip
        ours = {a.pkey for a in state.allocations.values()} | set(state.retired)
        exclude = [p.pkey for p in snap.pkeys if p.pkey not in ours]
        held = state.allocations.get(inp.tenant)
        alloc = Allocation.model_validate(await call_fabric(
            inp.fabric, "allocate",
            AllocateRequest(tenant=inp.tenant, members=members, membership=inp.membership, exclude=exclude),
        ))  # fmt: skip
        found = next((p for p in snap.pkeys if p.pkey == alloc.pkey), None)
        before = found.members if found else None
        self._writes = IsolationWrites(
            pkey=alloc.pkey,
            allocated=held is None,
            pkey_before=before,
            partition_before=found.partition if found else "",
            booked_before=sorted(held.members) if held else [],
            members=members,
        )

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
            UfmActivities.get_pkey,
            PKeyRef(pkey=alloc.pkey),
            **UFM_CALL,
            endpoint=UFM,
            summary=f"read back {alloc.pkey}",
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
        await call_fabric(inp.fabric, "confirm", TenantRequest(tenant=inp.tenant))
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
