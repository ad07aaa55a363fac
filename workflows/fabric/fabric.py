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
  (``withdraw``). Its failure lists what it created and removed (workflows/common/saga.py).
- ``ReleaseTenant``: remove exactly the tenant's GUIDs, verify, delete the PKey when empty (UFM itself deletes it
  with its last member; a PKey with other members is kept and retired, never handed out again), record in NetBox,
  release the allocation; what it removed, and whether the PKey is gone, is read from UFM before and after, not
  taken from the answers.
- ``FabricAudit`` (for a Temporal Schedule): report the fabric's posture; compare every tenant's PKey in UFM, one
  PKey at a time and continuing as new between batches, with the Fabric's desired state; report unknown members,
  missing members, missing PKeys, wrong memberships and GUIDs in two tenants' PKeys, exactly what and where;
  recognise virtual (SR-IOV) port GUIDs by their physical port; repair only when asked (a membership is changed by
  read-merge-PUT, a virtual GUID removed only when its port belongs to no tenant).

The Fabric entity lives here; IsolateTenant in workflows/fabric/isolation.py, ReleaseTenant in release.py,
FabricAudit in audit.py; the calls and the entity's models they share in calls.py and models.py.
"""

from __future__ import annotations

from temporalio import workflow
from temporalio.common import VersioningBehavior

from activities.ufm.models import normalize_guid
from workflows.common.base import Progress, history_is_long
from workflows.fabric.models import (
    AllocateRequest,
    Allocation,
    FabricInput,
    FabricState,
    FinishRelease,
    TenantRequest,
    WithdrawRequest,
)

# ================================================================== the Fabric entity


@workflow.defn(versioning_behavior=VersioningBehavior.AUTO_UPGRADE)
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
        self._refuse_outside_range(current)
        for guid, host in req.members.items():
            owner = self._owner_of(normalize_guid(guid))
            if owner is not None and owner != req.tenant:
                raise ValueError(f"port {guid} of host {host} belongs to tenant {owner}'s PKey")
        if current is None:
            used = self._in_use(req.exclude)
            first, last = int(self._inp.pkey_first, 16), int(self._inp.pkey_last, 16)
            if all(n in used for n in range(first, last + 1)):
                raise ValueError(f"no free PKey in {self._inp.pkey_first}-{self._inp.pkey_last}")

    def _refuse_outside_range(self, held: Allocation | None) -> None:
        """A tenant's PKey this fabric would not hand out (its range changed, or a state given by hand) is never
        written to: refused before anything is."""
        why = self._inp.outside_range(held.pkey) if held is not None else None
        if held is not None and why is not None:
            raise ValueError(f"tenant {held.tenant} holds {why}: this fabric does not write it; change it in UFM "
                             "by hand, or widen the range")  # fmt: skip

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

    @workflow.update(
        description="Drop ports from the tenant's desired members (a failed isolation undoing its "
        "additions); returns the allocation."
    )
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

    @begin_release.validator
    def _validate_begin_release(self, req: TenantRequest) -> None:
        self._refuse_outside_range(self._state.allocations.get(req.tenant))

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
