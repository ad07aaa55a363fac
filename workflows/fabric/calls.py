"""What every fabric workflow calls: UFM and NetBox call options, the patches they share, the Fabric entity's
updates (`call_fabric`), a PKey read, the fabric's security posture and the tenant's hosts resolved to port GUIDs."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from pydantic import BaseModel
from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ApplicationError

from activities.netbox.activities import NetBoxActivities
from activities.netbox.models import DeviceIbPorts, IbPortQuery
from activities.ufm.activities import UfmActivities
from activities.ufm.models import EmptyRequest, FabricCall, HostsRequest, PKeyMembers, PKeyRef, ResolvedHosts
from activities.ufm.posture import FabricPosture
from workflows.common.base import publish_phase
from workflows.common.endpoints import NETBOX, UFM, Endpoints

# An attempt makes a few requests of up to 10 s each (a read, a write, its read back; a removal in chunks) and
# heartbeats before each: a worker that dies is noticed in 20 s.
UFM_CALL: dict[str, Any] = dict(
    start_to_close_timeout=timedelta(seconds=60), heartbeat_timeout=timedelta(seconds=20),
    retry_policy=RetryPolicy(initial_interval=timedelta(milliseconds=500), backoff_coefficient=2.0,
                             maximum_interval=timedelta(seconds=10), maximum_attempts=20),
)  # fmt: skip
# The Fabric entity's updates (call_fabric): one update-with-start, no heartbeat.
FABRIC_CALL: dict[str, Any] = dict(UFM_CALL, start_to_close_timeout=timedelta(seconds=10), heartbeat_timeout=None)
# Fabric-wide reads (every port, every PKey): their HTTP timeout grows with the fabric (activities/ufm/client.py),
# and they heartbeat while they wait.
UFM_LISTING: dict[str, Any] = dict(
    UFM_CALL, start_to_close_timeout=timedelta(minutes=6), heartbeat_timeout=timedelta(seconds=30),
)  # fmt: skip
NETBOX_CALL: dict[str, Any] = dict(
    start_to_close_timeout=timedelta(seconds=60),
    retry_policy=RetryPolicy(initial_interval=timedelta(seconds=1), maximum_interval=timedelta(seconds=30),
                             maximum_attempts=10),
)  # fmt: skip


# Patches of running code: a failed isolation undoes its writes; a release reads what is there before it removes;
# an undo puts back the tenant's PKey that UFM deleted with the last port the undo removed.
ISOLATION_UNDO = "isolate-tenant-undoes-its-writes"
RELEASE_READS_FIRST = "release-tenant-reads-before-removing"
UNDO_KEEPS_HELD_PKEY = "isolation-undo-keeps-the-held-pkey"

FABRIC_NAME = r"^[a-z0-9]([-a-z0-9_.]{0,61}[a-z0-9])?$"


def show_tenant_step(phase: str, tenant: str, fabric: str, note: str = "") -> None:
    """An isolation's or release's phase: the `MillwrightPhase` search attribute and the current details."""
    publish_phase(phase)
    workflow.set_current_details(f"**{phase}** tenant `{tenant}` on `{fabric}`" + (f"\n\n{note}" if note else ""))


def validate_fabric_name(value: str) -> str:
    import re

    if not re.match(FABRIC_NAME, value):
        raise ValueError(f"{value!r} is not a name (lowercase letters, digits, '-', '_', '.')")
    return value


async def read_pkey(calls: Endpoints, pkey: str, summary: str) -> PKeyMembers:
    return await calls.execute(UfmActivities.get_pkey, PKeyRef(pkey=pkey), **UFM_CALL, endpoint=UFM, summary=summary)


async def call_fabric(fabric: str, update: str, payload: BaseModel | None = None) -> dict:
    return await workflow.execute_activity_method(
        UfmActivities.call_fabric,
        FabricCall(fabric=fabric, update=update, payload=payload.model_dump(mode="json") if payload else {}),
        **FABRIC_CALL, summary=f"fabric {fabric}: {update}",
    )  # fmt: skip


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
        UfmActivities.resolve_hosts,
        HostsRequest(hosts=hosts),
        **UFM_LISTING,
        endpoint=UFM,
        summary="resolve hosts in UFM",
    )
    if resolved.unknown:
        raise ApplicationError(f"UFM has no HCA ports for host(s) {', '.join(resolved.unknown)}",
                               type="HostNotInFabric", non_retryable=True)  # fmt: skip
    ufm = {h.host: h.guids for h in resolved.hosts}
    if netbox:
        records: list[DeviceIbPorts] = await calls.execute(
            NetBoxActivities.list_ib_ports,
            IbPortQuery(devices=hosts),
            **NETBOX_CALL,
            endpoint=NETBOX,
            summary="IB ports in NetBox",
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
