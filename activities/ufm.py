"""InfiniBand partition-key (PKey) activities against NVIDIA UFM's REST API, plus the Fabric entity's client.

Each activity is one read, or one read followed by the smallest write, so a retry after a crash at any line
changes nothing twice: adding GUIDs uses UFM's additive ``POST .../pkeys`` with only the GUIDs that are
missing (``PUT``, which replaces a PKey's whole membership, is never used); removing uses
``DELETE .../pkeys/<pkey>/guids/<g,...>`` with only the GUIDs present; a PKey is created only when absent
and deleted only when empty.

UFM's answer to a write does not decide that it is done: every write is read back (`UfmActivities._write`).
A write whose answer is lost (the connection dropped after UFM applied it, a timeout, a 5xx from its front)
and that reads back applied counts as done by this attempt, so the result says what this run changed; one
answered with success that does not read back is retried (``UfmWriteNotApplied``).

Credentials come from a secret reference (``MILLWRIGHT_UFM_CREDENTIALS``: ``env:NAME`` or ``file:/path``)
resolved inside each attempt: ``user:password`` uses HTTP Basic on ``/ufmRest``, anything else is an
access token sent as ``Authorization: Basic <token>`` on ``/ufmRestV3``. They never enter an activity's input,
output or error. The HTTP client never retries; Temporal's retry policy does.

TLS: UFM's certificate (self-signed out of the box) is verified against the default CAs, or the CA bundle of
``MILLWRIGHT_UFM_CA_BUNDLE``; ``MILLWRIGHT_UFM_VERIFY_TLS=false`` turns verification off (activities/tls.py).

Errors: 400/404/405/409/422 → ``UfmRejected`` (non-retryable, UFM's own message); 401/403 → ``UfmAuth``
(non-retryable); a certificate the worker does not trust or one issued for another name →
``TlsVerificationFailed`` (non-retryable, naming the setting that fixes it); 5xx, 429, timeouts and connection
errors → ``UfmUnavailable`` (retryable); no settings → ``UfmNotConfigured``, an unreadable CA bundle →
``TlsNotConfigured`` (both non-retryable).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, Literal

import httpx
from pydantic import Field, field_validator
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.models import BaseUrl, StrictModel
from activities.secrets import SecretError, SecretRef
from activities.tls import TlsFix, Trust, TrustingClient, ca_bundle_ref

USER_AGENT = "millwright-worker"
_REQUEST_TIMEOUT = 10.0
_GUID = re.compile(r"^(0x)?([0-9a-fA-F]{16})$")
_PKEY = re.compile(r"^0x[0-9a-fA-F]{1,4}$")
MANAGEMENT_PKEY = 0x7FFF

Membership = Literal["full", "limited"]
UFM_TLS_FIX = TlsFix(ca="MILLWRIGHT_UFM_CA_BUNDLE", off="MILLWRIGHT_UFM_VERIFY_TLS=false")


def normalize_guid(value: str) -> str:
    """A port GUID as UFM writes it: 16 lowercase hex digits, no 0x, no colons."""
    m = _GUID.match(value.replace(":", "").strip())
    if not m:
        raise ValueError(f"{value!r} is not a port GUID (16 hex digits)")
    return m.group(2).lower()


def normalize_pkey(value: str) -> str:
    """A PKey as UFM writes it (``0x1a``); 0x1-0x7ffe (0x7fff is UFM's read-only management key)."""
    if not isinstance(value, str) or not _PKEY.match(value.strip()):
        raise ValueError(f"{value!r} is not a PKey (a hex string 0x1-0x7ffe)")
    n = int(value, 16)
    if not 0 < n < MANAGEMENT_PKEY:
        raise ValueError(f"PKey {value} is outside 0x1-0x7ffe (0x7fff is the read-only management key)")
    return f"0x{n:x}"


def _guids(values: list[str]) -> list[str]:
    return sorted({normalize_guid(v) for v in values})


def _pkey(value: str) -> str:
    return normalize_pkey(value)


# ---------------------------------------------------------------- models


class UfmConfig(StrictModel):
    """Where UFM is and where its credentials are kept; the credentials themselves are never held here."""

    url: BaseUrl
    credentials: SecretRef
    timeout_seconds: float = _REQUEST_TIMEOUT
    ca_bundle: str | None = Field(None, description="CA bundle reference (file:/path/to/ca.pem) for UFM's "
                                                    "certificate; default: the default CAs")  # fmt: skip
    verify_tls: bool = True

    _ca_bundle_ok = field_validator("ca_bundle")(ca_bundle_ref)


class HostsRequest(StrictModel):
    hosts: list[str] = Field(min_length=1)


class HostPorts(StrictModel):
    host: str
    guids: list[str] = Field(default_factory=list, description="Host HCA port GUIDs UFM attributes to this system.")


class ResolvedHosts(StrictModel):
    hosts: list[HostPorts]
    unknown: list[str] = Field(default_factory=list, description="Hosts UFM has no HCA ports for.")


class PKeyRef(StrictModel):
    pkey: str
    _p = field_validator("pkey")(_pkey)


class EnsurePKey(PKeyRef):
    partition_name: str = ""
    ip_over_ib: bool = True
    index0: bool = False


class EnsuredPKey(StrictModel):
    pkey: str
    created: bool


class AddGuids(PKeyRef):
    guids: list[str] = Field(min_length=1)
    membership: Membership = "full"
    ip_over_ib: bool = True
    index0: bool = False
    _g = field_validator("guids")(_guids)


class RemoveGuids(PKeyRef):
    guids: list[str] = Field(min_length=1)
    _g = field_validator("guids")(_guids)


class MembershipChange(StrictModel):
    pkey: str
    changed: list[str] = Field(default_factory=list, description="GUIDs this attempt added or removed.")
    unchanged: list[str] = Field(default_factory=list, description="Already present (add) or absent (remove).")


class PKeyMembers(StrictModel):
    pkey: str
    exists: bool
    partition: str = ""
    members: dict[str, str] = Field(default_factory=dict, description="GUID -> membership (full/limited).")


class DeletedPKey(StrictModel):
    pkey: str
    deleted: bool
    existed: bool
    remaining: dict[str, str] = Field(default_factory=dict, description="Members left: the PKey was kept.")


class FabricSnapshot(StrictModel):
    pkeys: list[PKeyMembers]
    hosts_by_guid: dict[str, str] = Field(default_factory=dict, description="Port GUID -> UFM system name.")


class EmptyRequest(StrictModel):
    pass


class PKeyList(StrictModel):
    pkeys: list[str] = Field(description="Every PKey UFM holds, without members, in ascending order.")


class GuidsRequest(StrictModel):
    guids: list[str] = Field(min_length=1, max_length=20000)
    _g = field_validator("guids")(_guids)


class PortHosts(StrictModel):
    hosts: dict[str, str] = Field(default_factory=dict, description="Port GUID -> UFM system name, for the "
                                                                    "GUIDs asked for that UFM knows.")  # fmt: skip


class FabricCall(StrictModel):
    """One update of a Fabric entity workflow, started with the update if it does not run yet."""

    fabric: str
    update: Literal["allocate", "confirm", "begin_release", "finish_release", "state"]
    payload: dict[str, Any] = Field(default_factory=dict)


# ---------------------------------------------------------------- errors


def ufm_error(response: httpx.Response, doing: str) -> ApplicationError:
    status = response.status_code
    try:
        body = response.json()
        text = body.get("error") or body.get("message") or str(body) if isinstance(body, dict) else str(body)
    except ValueError:
        text = response.text
    message = f"{doing}: UFM answered {status}: {str(text).strip()[:500]}"
    if status in (401, 403):
        return ApplicationError(message, type="UfmAuth", non_retryable=True)
    if status in (400, 404, 405, 409, 422):
        return ApplicationError(message, type="UfmRejected", non_retryable=True)
    return ApplicationError(message, type="UfmUnavailable")


# ---------------------------------------------------------------- activities


class UfmActivities:
    """UFM PKey activities. With no config every activity fails with UfmNotConfigured."""

    def __init__(self, config: UfmConfig | None) -> None:
        self._config = config

    def activities(self) -> list[Callable]:
        return [self.resolve_hosts, self.ensure_pkey, self.add_guids, self.remove_guids, self.get_pkey,
                self.delete_pkey_if_empty, self.snapshot, self.list_pkeys, self.port_hosts,
                self.call_fabric]  # fmt: skip

    async def close(self) -> None:  # a Registration resource; clients are per call
        return None

    # ------------------------------------------------------------ plumbing

    def _client(self) -> TrustingClient:
        if self._config is None:
            raise ApplicationError(
                "UFM is not configured on this worker: set MILLWRIGHT_UFM_URL and MILLWRIGHT_UFM_CREDENTIALS "
                "(a secret reference to user:password or an access token: env:NAME or file:/path)",
                type="UfmNotConfigured",
                non_retryable=True,
            )
        try:
            secret = self._config.credentials.resolve()
        except SecretError as err:
            raise ApplicationError(f"UFM credentials: {err}", type="UfmNotConfigured", non_retryable=True) from None
        base = self._config.url.rstrip("/")
        headers = {"User-Agent": USER_AGENT, "Accept": "application/json"}
        if ":" in secret:
            user, _, password = secret.partition(":")
            auth: Any = httpx.BasicAuth(user, password)
            base += "/ufmRest"
        else:
            auth = None
            headers["Authorization"] = f"Basic {secret}"
            base += "/ufmRestV3"
        trust = Trust.resolve(UFM_TLS_FIX, verify=self._config.verify_tls, ca_bundle=self._config.ca_bundle,
                              setting="MILLWRIGHT_UFM_CA_BUNDLE")  # fmt: skip
        return TrustingClient(trust, base_url=base, auth=auth, headers=headers, timeout=self._config.timeout_seconds)

    async def _call(self, client: TrustingClient, method: str, path: str, doing: str, *,
                    ok404: bool = False, **kw: Any) -> Any:
        doing = f"{doing} at UFM {client.base_url}"  # the endpoint, for a run that shows why it waits
        try:
            response = await client.request(method, path, **kw)
        except httpx.HTTPError as err:
            tls_failure = client.trust.failure(err, f"{doing}: UFM {self._config.url}")
            if tls_failure is not None:
                raise tls_failure from None
            # Never the request itself: its headers hold the credentials.
            raise ApplicationError(f"{doing}: connection failed: {type(err).__name__}", type="UfmUnavailable") from None
        if ok404 and response.status_code == 404:
            return None
        if response.status_code >= 300:
            raise ufm_error(response, doing)
        try:
            return response.json() if response.content else {}
        except ValueError:
            raise ApplicationError(f"{doing}: not a UFM answer (status {response.status_code})",
                                   type="UfmUnavailable") from None

    def _after_write(self, what: str) -> None:
        """Called after each write. A no-op; tests override it to crash an attempt mid-activity."""

    async def _write(self, client: TrustingClient, method: str, path: str, doing: str, pkey: str,
                     landed: Callable[[PKeyMembers], bool], **kw: Any) -> None:  # fmt: skip
        """One write, then PKey `pkey` read back: the write is done when `landed` says the read shows it.

        A retryable failure (the answer lost after UFM applied the write, a timeout, a 5xx) is read back too: a
        write that landed counts as this attempt's, and only one that did not is raised for the retry policy.
        A success answer whose change does not read back is retryable ``UfmWriteNotApplied``: the next attempt
        reads first and writes only what is still missing. A rejection (4xx) is raised as it is."""
        failed: ApplicationError | None = None
        try:
            await self._call(client, method, path, doing, **kw)
        except ApplicationError as err:
            if err.non_retryable:
                raise
            failed = err
        else:
            self._after_write(doing)
        try:
            have = await self._members(client, pkey)
        except ApplicationError:
            if failed is not None:
                raise failed from None  # the write's own error says more than the read's
            raise
        if landed(have):
            return
        if failed is not None:
            raise failed
        raise ApplicationError(f"{doing}: UFM answered success, but PKey {pkey} does not read back changed "
                               f"(exists: {have.exists}, {len(have.members)} members)", type="UfmWriteNotApplied")

    async def _members(self, client: TrustingClient, pkey: str) -> PKeyMembers:
        body = await self._call(client, "GET", f"/resources/pkeys/{pkey}", f"reading PKey {pkey}", ok404=True,
                                params={"guids_data": "true"})
        if body is None:
            return PKeyMembers(pkey=pkey, exists=False)
        return PKeyMembers(
            pkey=pkey, exists=True, partition=str(body.get("partition") or ""),
            members={normalize_guid(g["guid"]): g.get("membership", "full") for g in body.get("guids") or []},
        )  # fmt: skip

    # ------------------------------------------------------------ reads

    @activity.defn
    async def resolve_hosts(self, req: HostsRequest) -> ResolvedHosts:
        """Each host's HCA port GUIDs as UFM sees them (ports whose system is that host; switches excluded)."""
        async with self._client() as client:
            systems = await self._call(client, "GET", "/resources/systems", "listing UFM systems")
            ports = await self._call(client, "GET", "/resources/ports", "listing UFM ports")
        host_systems = {s.get("system_name") for s in systems if s.get("type", "host") == "host"}
        by_host: dict[str, set[str]] = {}
        for p in ports:
            name = p.get("system_name")
            if name in host_systems and p.get("guid"):
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
        """Every PKey with its members, and which system each port GUID belongs to."""
        async with self._client() as client:
            pkeys = await self._call(client, "GET", "/resources/pkeys", "listing PKeys", params={"guids_data": "true"})
            ports = await self._call(client, "GET", "/resources/ports", "listing UFM ports")
        out = FabricSnapshot(pkeys=[])
        for key, body in sorted((pkeys or {}).items()):
            out.pkeys.append(PKeyMembers(
                pkey=f"0x{int(key, 16):x}", exists=True, partition=str(body.get("partition") or ""),
                members={normalize_guid(g["guid"]): g.get("membership", "full") for g in body.get("guids") or []},
            ))  # fmt: skip
        for p in ports:
            if p.get("guid") and p.get("system_name"):
                out.hosts_by_guid.setdefault(normalize_guid(p["guid"]), p["system_name"])
        return out

    @activity.defn
    async def list_pkeys(self, _: EmptyRequest) -> PKeyList:
        """The PKeys UFM holds, without their members (a fabric audit reads members one PKey at a time)."""
        async with self._client() as client:
            keys = await self._call(client, "GET", "/resources/pkeys", "listing PKeys")
        return PKeyList(pkeys=[f"0x{n:x}" for n in sorted(int(k, 16) for k in keys or [])])

    @activity.defn
    async def port_hosts(self, req: GuidsRequest) -> PortHosts:
        """The system each of these port GUIDs belongs to: UFM's port list read here, only the GUIDs asked for
        returned, so that the answer stays small however large the fabric."""
        async with self._client() as client:
            ports = await self._call(client, "GET", "/resources/ports", "listing UFM ports")
        wanted, out = set(req.guids), PortHosts()
        for p in ports:
            if p.get("guid") and p.get("system_name") and (g := normalize_guid(p["guid"])) in wanted:
                out.hosts.setdefault(g, p["system_name"])
        return out

    # ------------------------------------------------------------ writes

    @activity.defn
    async def ensure_pkey(self, req: EnsurePKey) -> EnsuredPKey:
        """Create the PKey (empty) unless it exists."""
        async with self._client() as client:
            if (await self._members(client, req.pkey)).exists:
                return EnsuredPKey(pkey=req.pkey, created=False)
            body: dict[str, Any] = {"pkey": req.pkey, "index0": req.index0, "ip_over_ib": req.ip_over_ib}
            if req.partition_name:
                body["partition_name"] = req.partition_name
            await self._write(client, "POST", "/resources/pkeys/add", f"creating PKey {req.pkey}", req.pkey,
                              lambda have: have.exists, json=body)  # fmt: skip
            return EnsuredPKey(pkey=req.pkey, created=True)

    @activity.defn
    async def add_guids(self, req: AddGuids) -> MembershipChange:
        """Add the GUIDs missing from the PKey, with UFM's additive call; never touches other members."""
        async with self._client() as client:
            have = await self._members(client, req.pkey)
            missing = [g for g in req.guids if have.members.get(g) != req.membership]
            result = MembershipChange(pkey=req.pkey, changed=missing,
                                      unchanged=[g for g in req.guids if g not in missing])
            if missing:
                await self._write(
                    client, "POST", "/resources/pkeys", f"adding {len(missing)} GUIDs to PKey {req.pkey}", req.pkey,
                    lambda after: all(after.members.get(g) == req.membership for g in missing),
                    json={"pkey": req.pkey, "guids": missing, "membership": req.membership, "index0": req.index0,
                          "ip_over_ib": req.ip_over_ib},
                )  # fmt: skip
            return result

    @activity.defn
    async def remove_guids(self, req: RemoveGuids) -> MembershipChange:
        """Remove exactly these GUIDs (those present) from the PKey; other members stay."""
        async with self._client() as client:
            have = await self._members(client, req.pkey)
            present = [g for g in req.guids if g in have.members]
            result = MembershipChange(pkey=req.pkey, changed=present,
                                      unchanged=[g for g in req.guids if g not in present])
            if present:
                await self._write(client, "DELETE", f"/resources/pkeys/{req.pkey}/guids/{','.join(present)}",
                                  f"removing {len(present)} GUIDs from PKey {req.pkey}", req.pkey,
                                  lambda after: not any(g in after.members for g in present))  # fmt: skip
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
