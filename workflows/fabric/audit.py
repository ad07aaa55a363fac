"""FabricAudit (for a Temporal Schedule): the fabric's posture and every tenant's PKey against the Fabric's books.

See workflows/fabric/fabric.py for the family."""

from __future__ import annotations

import asyncio
from typing import Literal

from pydantic import Field, field_validator
from temporalio import workflow

from activities.models import StrictModel
from activities.ufm.activities import UfmActivities
from activities.ufm.models import (
    AddGuids,
    EmptyRequest,
    EnsurePKey,
    GuidsRequest,
    PKeyList,
    PKeyMembers,
    PKeyRef,
    PortHosts,
    RemoveGuids,
    VirtualPort,
)
from activities.ufm.posture import FabricPosture
from workflows.common.base import Progress, WorkflowInput, history_is_long
from workflows.common.endpoints import UFM, Endpoints, RetryTimeout
from workflows.fabric.calls import (
    POSTURE_PATCH,
    UFM_CALL,
    UFM_LISTING,
    call_fabric,
    fabric_posture,
    validate_fabric_name,
)
from workflows.fabric.models import Allocation, FabricState

DriftKind = Literal[
    "unknown-member",
    "missing-member",
    "missing-pkey",
    "guid-in-two-tenants",
    "wrong-membership",
    "unknown-virtual-member",
    "virtual-member-of-other-tenant",
]
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
    virtual_members: list[str] = Field(
        default_factory=list, description=f"The first {DRIFT_LISTED} virtual GUIDs recognised."
    )
    virtual_members_total: int = 0
    posture: FabricPosture | None = Field(None, description="Read by the audit's first run (None: an audit "
                                                            "started before the posture check).")  # fmt: skip


class FabricAuditInput(WorkflowInput, RetryTimeout):
    fabric: str
    repair: bool = Field(False, description="Repair drift: add missing members, remove unknown ones.")
    concurrency: int = Field(8, ge=1, le=50, description="PKeys read from UFM at once.")
    carried: AuditCursor | None = Field(None, description="Internal: carried across continue-as-new.")

    _n = field_validator("fabric")(validate_fabric_name)

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
        if inp.carried is None:
            workflow.deprecate_patch(AUDIT_BY_PKEY_PATCH)
        cursor = self._cursor
        self._phase = "reading"
        if inp.carried is None:
            workflow.deprecate_patch(POSTURE_PATCH)
            cursor.posture = await fabric_posture(self._calls)
        state = FabricState.model_validate(await call_fabric(inp.fabric, "state"))
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
            await self._audit_wave(todo[start : start + inp.concurrency], owner)
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
            cursor.drift += drift[: max(DRIFT_LISTED - len(cursor.drift), 0)]
            cursor.virtual_members_total += len(recognised)
            cursor.virtual_members += recognised[: max(DRIFT_LISTED - len(cursor.virtual_members), 0)]
            if drift and self._inp.repair:
                done = await self._repair_pkey(a, drift)
                cursor.repaired_total += len(done)
                cursor.repaired += done[: max(DRIFT_LISTED - len(cursor.repaired), 0)]
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
            r.drift_total, {"fabric": r.fabric}
        )
        if r.posture is not None:
            meter.create_gauge(
                "millwright_fabric_insecure",
                "1: the last fabric audit found the fabric's posture voids PKey isolation or leaves it unverifiable",
            ).set(int(r.insecure), {"fabric": r.fabric})
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


def _chunks(items: list[str], size: int | None) -> list[list[str]]:
    return [items] if size is None else [items[i : i + size] for i in range(0, len(items), size)]


def pkey_drift(a: Allocation, p: PKeyMembers | None, owner: dict[str, Allocation], host: dict[str, str],
               virtual: dict[str, VirtualPort]) -> tuple[list[Drift], list[str]]:  # fmt: skip
    """Drift of one tenant's PKey: `p` its members in UFM (None: absent), `owner` who desires each GUID, `host`
    the UFM system of the GUIDs no one here desires, `virtual` which of those are virtual ports, and where. Also
    returns the virtual GUIDs recognised on the tenant's own ports (its VMs), which are not drift."""
    if p is None:
        return [
            Drift(
                kind="missing-pkey",
                pkey=a.pkey,
                tenant=a.tenant,
                detail=f"PKey absent from UFM; {len(a.members)} ports expected",
            )
        ] + [
            Drift(
                kind="missing-pkey",
                pkey=a.pkey,
                tenant=a.tenant,
                guid=g,
                host=h,
                detail=f"port {g} of {h} not a member (PKey absent)",
            )
            for g, h in sorted(a.members.items())
        ], []
    out: list[Drift] = []
    recognised: list[str] = []
    for g, h in sorted(a.members.items()):
        if g not in p.members:
            out.append(
                Drift(
                    kind="missing-member",
                    pkey=a.pkey,
                    tenant=a.tenant,
                    guid=g,
                    host=h,
                    detail=f"port {g} of {h} is missing",
                )
            )
        elif p.members[g] != a.membership:
            out.append(
                Drift(
                    kind="wrong-membership",
                    pkey=a.pkey,
                    tenant=a.tenant,
                    guid=g,
                    host=h,
                    detail=f"port {g} of {h} is {p.members[g]}, expected {a.membership}",
                )
            )
    for g in sorted(set(p.members) - set(a.members)):
        other = owner.get(g)
        h = host.get(g, "unknown host")
        v = virtual.get(g)
        if v is not None and other is None:
            port_owner = owner.get(v.port_guid)
            where = f"virtual port {g} of {v.host or 'unknown host'} (on port {v.port_guid})"
            if port_owner is None:
                out.append(
                    Drift(
                        kind="unknown-virtual-member",
                        pkey=a.pkey,
                        tenant=a.tenant,
                        guid=g,
                        host=v.host,
                        detail=f"{where} is a member, but its port belongs to no tenant",
                    )
                )
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
        out.append(
            Drift(
                kind="unknown-member",
                pkey=a.pkey,
                tenant=a.tenant,
                guid=g,
                host=h,
                detail=f"port {g} of {h} is a member but not desired",
            )
        )
    return out, recognised
