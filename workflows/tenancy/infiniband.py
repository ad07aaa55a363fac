"""The InfiniBand step undone: the ReleaseTenant child, for onboarding's compensation and for offboarding.

The child has the ID `release-tenant/<fabric>/<tenant>`, the same as when it is started on its own, so a
standalone run and a tenant workflow never release the same PKey at once.
"""

from __future__ import annotations

from temporalio import workflow

from workflows.fabric.release import ReleaseTenant, ReleaseTenantInput, ReleaseTenantResult


async def release_ib(fabric: str, tenant: str, netbox: bool) -> ReleaseTenantResult:
    """The ReleaseTenant child (no-op when the tenant holds no PKey on the fabric)."""
    child = ReleaseTenantInput(fabric=fabric, tenant=tenant, netbox=netbox)
    return await workflow.execute_child_workflow(
        ReleaseTenant.run, child, id=child.workflow_id(), static_summary=f"IB release of {tenant}"
    )
