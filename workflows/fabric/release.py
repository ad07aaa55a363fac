"""ReleaseTenant: exactly the tenant's GUIDs out of its PKey, the PKey deleted when empty, the allocation released.

See workflows/fabric/fabric.py for the family."""

from __future__ import annotations

from pydantic import Field, field_validator
from temporalio import workflow
from temporalio.common import SearchAttributePair
from temporalio.exceptions import ApplicationError

from activities.models import StrictModel
from activities.netbox.activities import NetBoxActivities
from activities.netbox.models import TenantPKeyRecord
from activities.ufm.activities import UfmActivities
from activities.ufm.models import DeletedPKey, PKeyRef, RemoveGuids
from workflows.common import search_attributes as sa
from workflows.common.base import Progress, WorkflowInput
from workflows.common.endpoints import NETBOX, UFM, Endpoints, RetryTimeout
from workflows.fabric.calls import (
    NETBOX_CALL,
    RELEASE_READS_FIRST,
    UFM_CALL,
    call_fabric,
    read_pkey,
    show_tenant_step,
    validate_fabric_name,
)
from workflows.fabric.models import Allocation, FinishRelease, TenantRequest


class ReleaseTenantInput(WorkflowInput, RetryTimeout):
    fabric: str
    tenant: str
    netbox: bool = Field(True, description="Clear the PKey recorded in NetBox.")

    _n = field_validator("fabric", "tenant")(validate_fabric_name)

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
        show_tenant_step(phase, self._inp.tenant, self._inp.fabric, note)

    @workflow.run
    async def run(self, inp: ReleaseTenantInput) -> ReleaseTenantResult:
        workflow.upsert_search_attributes([sa.TENANT.value_set(inp.tenant)])
        raw = await call_fabric(inp.fabric, "begin_release", TenantRequest(tenant=inp.tenant))
        if not raw:
            self._enter("nothing-to-release")
            return ReleaseTenantResult(fabric=inp.fabric, tenant=inp.tenant, pkey=None)
        alloc = Allocation.model_validate(raw)
        guids = sorted(alloc.members)
        self._enter("removing", f"PKey {alloc.pkey}: {len(guids)} ports")
        workflow.deprecate_patch(RELEASE_READS_FIRST)
        before = await read_pkey(self._calls, alloc.pkey, f"read {alloc.pkey} before the removal")
        if guids:  # what it removed is read from UFM before and after, not taken from the answer
            await self._calls.execute(
                UfmActivities.remove_guids, RemoveGuids(pkey=alloc.pkey, guids=guids), **UFM_CALL,
                endpoint=UFM, summary=f"remove {len(guids)} GUIDs from {alloc.pkey}",
            )  # fmt: skip
        self._enter("verifying")
        read = await read_pkey(self._calls, alloc.pkey, f"read back {alloc.pkey}")
        left = [g for g in guids if g in read.members]
        if left:
            raise ApplicationError(f"PKey {alloc.pkey} still has {', '.join(left)} after the removal",
                                   type="VerifyFailed", non_retryable=True)  # fmt: skip
        deleted: DeletedPKey = await self._calls.execute(
            UfmActivities.delete_pkey_if_empty,
            PKeyRef(pkey=alloc.pkey),
            **UFM_CALL,
            endpoint=UFM,
            summary=f"delete {alloc.pkey}",
        )
        if inp.netbox:
            await self._calls.execute(
                NetBoxActivities.record_tenant_pkey,
                TenantPKeyRecord(tenant=inp.tenant, fabric=inp.fabric, pkey=None), **NETBOX_CALL,
                endpoint=NETBOX, summary="clear the PKey in NetBox",
            )  # fmt: skip
        await call_fabric(inp.fabric, "finish_release", FinishRelease(tenant=inp.tenant, remaining=deleted.remaining))
        # Read from UFM, not the answers: after a lost one, the retry finds its own removal or deletion done
        # ("absent"). UFM deletes a PKey with its last member: there before the removal, gone after it.
        by_ufm = not read.exists and before.exists
        by_us = deleted.deleted or (read.exists and not deleted.existed)
        pkey_deleted = by_us or by_ufm
        note = f"PKey {alloc.pkey} " + (
            "deleted"
            if by_us
            else "deleted by UFM with its last member"
            if by_ufm
            else "already absent from UFM"
            if not read.exists
            else f"kept with {len(deleted.remaining)} other members (retired)"
        )
        self._enter("released", note)
        removed = [g for g in guids if g in before.members]
        return ReleaseTenantResult(
            fabric=inp.fabric, tenant=inp.tenant, pkey=alloc.pkey, removed=removed,
            already_absent=[g for g in guids if g not in removed], pkey_deleted=pkey_deleted,
            remaining=deleted.remaining,
        )  # fmt: skip


async def release_as_child(fabric: str, tenant: str, netbox: bool) -> ReleaseTenantResult:
    """ReleaseTenant as a tenant workflow's child (OnboardTenant's compensation, OffboardTenant), with the ID it has
    when started on its own, so a standalone run and a tenant workflow never release the same PKey at once; a no-op
    when the tenant holds no PKey on the fabric."""
    child = ReleaseTenantInput(fabric=fabric, tenant=tenant, netbox=netbox)
    return await workflow.execute_child_workflow(
        ReleaseTenant.run, child, id=child.workflow_id(), static_summary=f"IB release of {tenant}"
    )
