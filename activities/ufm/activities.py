"""InfiniBand partition-key (PKey) activities against NVIDIA UFM's REST API, plus the Fabric entity's client.

Each activity is one read, or one read followed by the smallest writes, so a retry after a crash at any line
changes nothing twice. Writes, as NVIDIA's own UFM clients make them (NVIDIA/bare-metal-manager-core
``crates/api/src/ib/ufmclient/``, Mellanox/ib-kubernetes ``pkg/sm/plugins/ufm/ufm.go``):

- adding GUIDs: UFM's additive ``POST .../pkeys`` with only the GUIDs that are absent; ``index0: true`` (the PKey
  goes to index 0 of each port's PKey table, which traffic naming no PKey index uses: with the management PKey
  0x7fff limited, tenant traffic there would fail otherwise), ``ip_over_ib: true``;
- changing the membership of GUIDs already members: read, merge, ``PUT .../pkeys`` with the whole membership
  (re-adding a member with another membership is undocumented), read back; per-GUID ``memberships`` are sent only
  when the merged set is mixed;
- removing GUIDs: ``POST /actions/remove_guids_from_pkey`` ``{"pkey", "guids"}``, in requests of at most
  `_REMOVE_CHUNK` GUIDs: GUIDs joined into a ``DELETE`` URL pass UFM's Apache front only up to about 480 (its
  8 KB request line limit answers 414). Removing the last member makes UFM delete the PKey: reported as deleted;
- a PKey is created only when absent (``partition_name`` sent from UFM 6.22, where the API takes it) and deleted
  only when empty.

Reads: host ports are listed with ``?sys_type=Computer``. A fabric audit reads the PKey list without members
(`list_pkeys`), each PKey alone (`get_pkey`), and the systems and virtual ports of only the GUIDs it asks about
(`port_hosts`), so no answer grows with the fabric.

The write each activity makes is read back (activities/ufm/pkeys.py); the security posture is assessed in
activities/ufm/posture.py; authentication, TLS and timeouts are the client's (activities/ufm/client.py), errors
are listed in activities/ufm/errors.py.
"""

from __future__ import annotations

from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.support.tls import TrustingClient
from activities.ufm.client import PARTITION_NAME_SINCE, release_numbers
from activities.ufm.models import (
    MANAGEMENT_PKEY,
    AddGuids,
    DeletedPKey,
    EmptyRequest,
    EnsuredPKey,
    EnsurePKey,
    FabricCall,
    FabricSnapshot,
    GuidsRequest,
    HostPorts,
    HostsRequest,
    MembershipChange,
    PKeyList,
    PKeyMembers,
    PKeyRef,
    PortHosts,
    RemoveGuids,
    ResolvedHosts,
    VirtualPort,
    normalize_guid,
)
from activities.ufm.pkeys import PKeyClient, pkey_members
from activities.ufm.posture import FabricPosture, assess_posture

_REMOVE_CHUNK = 500  # GUIDs per remove_guids_from_pkey request: bounds each request's size and UFM's work


class UfmActivities(PKeyClient):
    """UFM PKey activities. With no config every activity fails with UfmNotConfigured."""

    # ------------------------------------------------------------ reads

    @activity.defn
    async def resolve_hosts(self, req: HostsRequest) -> ResolvedHosts:
        """Each host's HCA port GUIDs as UFM sees them (the ports of the Computer system of that name)."""
        async with self._client() as client:
            ports = await self._host_ports(client)
        wanted = set(req.hosts)
        by_host: dict[str, set[str]] = {}
        for p in ports:
            name = p.get("system_name")
            if name in wanted and p.get("guid"):
                by_host.setdefault(name, set()).add(normalize_guid(p["guid"]))
        out = ResolvedHosts(hosts=[])
        for host in req.hosts:
            if host in by_host:
                out.hosts.append(HostPorts(host=host, guids=sorted(by_host[host])))
            else:
                out.unknown.append(host)
        return out

    @activity.defn
    async def get_pkey(self, ref: PKeyRef) -> PKeyMembers:
        """One PKey's members, read back with guids_data=true; a missing PKey is an answer (exists=False)."""
        async with self._client() as client:
            return await self._members(client, ref.pkey)

    @activity.defn
    async def snapshot(self, _: EmptyRequest) -> FabricSnapshot:
        """Every PKey with its members, which system each host port GUID belongs to, and the virtual ports."""
        async with self._client() as client:
            pkeys = await self._listing(client, "/resources/pkeys", "listing PKeys", guids_data="true")
            hosts, virtual = await self._port_owners(client, None)
        return FabricSnapshot(pkeys=[pkey_members(f"0x{int(key, 16):x}", body)
                                     for key, body in sorted((pkeys or {}).items())],
                              hosts_by_guid=hosts, virtual=virtual)  # fmt: skip

    async def _port_owners(self, client: TrustingClient,
                           wanted: set[str] | None) -> tuple[dict[str, str], dict[str, VirtualPort]]:  # fmt: skip
        """The system each host port GUID belongs to, and where each virtual port is: of the GUIDs `wanted` (None:
        all of them). UFM filters its ports by system and type, not by GUID, and its virtual ports not at all: both
        are read whole here (host ports only), and only what was asked for leaves."""
        ports = await self._host_ports(client)
        vports = await self._listing(client, "/resources/vports", "listing virtual ports", ok404=True) or []
        hosts: dict[str, str] = {}
        virtual: dict[str, VirtualPort] = {}
        for p in ports:
            if p.get("guid") and p.get("system_name") and (wanted is None or normalize_guid(p["guid"]) in wanted):
                hosts.setdefault(normalize_guid(p["guid"]), p["system_name"])
        for v in vports:
            if v.get("virtual_port_guid") and v.get("port_guid") \
                    and (wanted is None or normalize_guid(v["virtual_port_guid"]) in wanted):  # fmt: skip
                virtual[normalize_guid(v["virtual_port_guid"])] = VirtualPort(
                    host=str(v.get("system_name") or ""), port_guid=normalize_guid(v["port_guid"])
                )
        return hosts, virtual

    @activity.defn
    async def list_pkeys(self, _: EmptyRequest) -> PKeyList:
        """The PKeys UFM holds, without their members (a fabric audit reads members one PKey at a time)."""
        async with self._client() as client:
            keys = await self._listing(client, "/resources/pkeys", "listing PKeys")
        return PKeyList(pkeys=[f"0x{n:x}" for n in sorted(int(k, 16) for k in keys or [])])

    @activity.defn
    async def port_hosts(self, req: GuidsRequest) -> PortHosts:
        """The system each of these port GUIDs belongs to, and which of them are virtual ports and on which
        physical port: UFM's host ports and virtual ports are read here (neither can be asked for by GUID), and
        only the GUIDs asked for are returned, so that the answer stays small however large the fabric."""
        async with self._client() as client:
            hosts, virtual = await self._port_owners(client, set(req.guids))
        return PortHosts(hosts=hosts, virtual=virtual)

    @activity.defn
    async def fabric_posture(self, _: EmptyRequest) -> FabricPosture:
        """The fabric's security posture: 0x7fff's default membership and the SM keys, as findings."""
        async with self._client() as client:
            release = await self._ufm_release(client)
            management = await self._call(
                client,
                "GET",
                f"/resources/pkeys/0x{MANAGEMENT_PKEY:x}",
                "reading the management PKey 0x7fff",
                params={"guids_data": "true"},
            )
            try:
                smconf, error = await self._call(client, "GET", "/app/smconf", "reading the SM configuration"), ""
            except ApplicationError as err:
                if err.type not in ("UfmAuth", "UfmRejected"):  # not allowed, or not there: report, go on
                    raise
                smconf, error = None, str(err)
        membership = management.get("membership") if isinstance(management, dict) else None
        return assess_posture(release, membership, smconf if isinstance(smconf, dict) else None, error)

    # ------------------------------------------------------------ writes

    @activity.defn
    async def ensure_pkey(self, req: EnsurePKey) -> EnsuredPKey:
        """Create the PKey (empty) unless it exists."""
        async with self._client() as client:
            if (await self._members(client, req.pkey)).exists:
                return EnsuredPKey(pkey=req.pkey, created=False)
            body: dict[str, Any] = {"pkey": req.pkey, "index0": req.index0, "ip_over_ib": req.ip_over_ib}
            if req.partition_name and release_numbers(await self._ufm_release(client)) >= PARTITION_NAME_SINCE:
                body["partition_name"] = req.partition_name
            await self._write(client, "POST", "/resources/pkeys/add", f"creating PKey {req.pkey}", req.pkey,
                              lambda have: have.exists, json=body)  # fmt: skip
            return EnsuredPKey(pkey=req.pkey, created=True)

    @activity.defn
    async def add_guids(self, req: AddGuids) -> MembershipChange:
        """Make these GUIDs members with this membership: UFM's additive call for the absent ones, a
        read-merge-PUT for members with another membership; other members stay as they are."""
        async with self._client() as client:
            have = await self._members(client, req.pkey)
            absent = [g for g in req.guids if g not in have.members]
            other = [g for g in req.guids if g in have.members and have.members[g] != req.membership]
            result = MembershipChange(
                pkey=req.pkey,
                changed=absent,
                membership_changed=other,
                unchanged=[g for g in req.guids if g not in absent and g not in other],
            )
            if absent:
                await self._write(
                    client, "POST", "/resources/pkeys", f"adding {len(absent)} GUIDs to PKey {req.pkey}", req.pkey,
                    lambda after: all(after.members.get(g) == req.membership for g in absent),
                    json={"pkey": req.pkey, "guids": absent, "membership": req.membership, "index0": req.index0,
                          "ip_over_ib": req.ip_over_ib},
                )  # fmt: skip
            if other:
                await self._set_memberships(client, req, other)
            return result

    async def _set_memberships(self, client: TrustingClient, req: AddGuids, guids: list[str]) -> None:
        """Read, merge, PUT the whole membership, read back: every other member must read back as it was.

        UFM has no conditional write: a member another party adds between this read and the PUT is lost (the
        next FabricAudit reports it missing, if it is a tenant's)."""
        have = await self._members(client, req.pkey)
        if not have.exists:
            raise ApplicationError(f"PKey {req.pkey} vanished while its memberships were changed",
                                   type="UfmWriteNotApplied")  # fmt: skip
        merged = {**have.members, **{g: req.membership for g in guids}}
        order = sorted(merged)
        body: dict[str, Any] = {"pkey": req.pkey, "guids": order, "index0": req.index0, "ip_over_ib": req.ip_over_ib}
        kinds = set(merged.values())
        if len(kinds) == 1:
            body["membership"] = kinds.pop()
        else:
            body["memberships"] = [merged[g] for g in order]
        doing = f"changing the membership of {len(guids)} GUIDs of PKey {req.pkey} to {req.membership}"
        await self._write(
            client, "PUT", "/resources/pkeys", doing, req.pkey, lambda after: after.members == merged, json=body
        )

    @activity.defn
    async def remove_guids(self, req: RemoveGuids) -> MembershipChange:
        """Remove exactly these GUIDs (those present) from the PKey; other members stay. UFM deletes a PKey with
        its last member: the result says so (`pkey_deleted`)."""
        async with self._client() as client:
            have = await self._members(client, req.pkey)
            present = [g for g in req.guids if g in have.members]
            result = MembershipChange(
                pkey=req.pkey, changed=present, unchanged=[g for g in req.guids if g not in present]
            )
            for i in range(0, len(present), _REMOVE_CHUNK):
                chunk = present[i : i + _REMOVE_CHUNK]
                after = await self._write(
                    client, "POST", "/actions/remove_guids_from_pkey",
                    f"removing {len(chunk)} GUIDs from PKey {req.pkey}", req.pkey,
                    lambda after, chunk=chunk: not any(g in after.members for g in chunk),  # type: ignore[misc]  # mypy infers no lambda with a default
                    json={"pkey": req.pkey, "guids": chunk},
                )  # fmt: skip
                result.pkey_deleted = not after.exists
            return result

    @activity.defn
    async def delete_pkey_if_empty(self, ref: PKeyRef) -> DeletedPKey:
        """Delete the PKey when it has no members; a PKey with members is kept and its members reported."""
        async with self._client() as client:
            have = await self._members(client, ref.pkey)
            if not have.exists:
                return DeletedPKey(pkey=ref.pkey, deleted=False, existed=False)
            if have.members:
                return DeletedPKey(pkey=ref.pkey, deleted=False, existed=True, remaining=have.members)
            await self._write(client, "DELETE", f"/resources/pkeys/{ref.pkey}", f"deleting PKey {ref.pkey}", ref.pkey,
                              lambda after: not after.exists, ok404=True)  # fmt: skip
            return DeletedPKey(pkey=ref.pkey, deleted=True, existed=True)

    # ------------------------------------------------------------ the Fabric entity

    @activity.defn
    async def call_fabric(self, call: FabricCall) -> dict[str, Any]:
        """Send one update to the fabric's entity workflow (``fabric/<name>``), starting it if it is not running.

        Workflows cannot update other workflows, so this activity does it with update-with-start; a rejected
        update (its validator refused) is non-retryable ``FabricRefused`` with the validator's message.
        """
        from activities.entities import EntityUpdate, update_with_start

        workflow_id = f"fabric/{call.fabric}"
        if call.update == "state":
            from temporalio.service import RPCError

            try:
                return await activity.client().get_workflow_handle(workflow_id).query("state", result_type=dict)
            except RPCError:
                return {}
        return await update_with_start(EntityUpdate(
            workflow_type="Fabric", workflow_id=workflow_id, start_input={"fabric": call.fabric}, update=call.update,
            payload=call.payload, refused_type="FabricRefused", entity=f"fabric {call.fabric}",
        ))  # fmt: skip
