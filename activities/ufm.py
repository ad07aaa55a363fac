"""InfiniBand partition-key (PKey) activities against NVIDIA UFM's REST API, plus the Fabric entity's client.

Each activity is one read, or one read followed by the smallest writes, so a retry after a crash at any line
changes nothing twice. Writes, as NVIDIA's own UFM clients make them (NVIDIA/bare-metal-manager-core
``crates/api/src/ib/ufmclient/``, Mellanox/ib-kubernetes ``pkg/sm/plugins/ufm/ufm.go``):

- adding GUIDs: UFM's additive ``POST .../pkeys`` with only the GUIDs that are absent; ``index0: true`` (the PKey
  goes to index 0 of each port's PKey table, which traffic naming no PKey index uses: with the management PKey
  0x7fff limited, tenant traffic there would fail otherwise), ``ip_over_ib: true``;
- changing the membership of GUIDs already members: read, merge, ``PUT .../pkeys`` with the whole membership
  (re-adding a member with another membership is undocumented), read back; per-GUID ``memberships`` are sent only
  when the merged set is mixed, and never to UFM 6.19 (which ignores them and makes everyone full);
- removing GUIDs: ``POST /actions/remove_guids_from_pkey`` ``{"pkey", "guids"}``, in requests of at most
  `_REMOVE_CHUNK` GUIDs: GUIDs joined into a ``DELETE`` URL pass UFM's Apache front only up to about 480 (its
  8 KB request line limit answers 414). Removing the last member makes UFM delete the PKey: reported as deleted;
- a PKey is created only when absent (``partition_name`` sent from UFM 6.22, where the API takes it) and deleted
  only when empty.

Reads: a missing PKey is a 404 or, on some releases, 200 ``{}``: both read as absent. Host ports are listed with
``?sys_type=Computer``; fabric-wide listings get a timeout that grows with the fabric (the ports this worker saw
last time; the first listing gets ``max_listing_timeout_seconds``) and heartbeat while they wait. A fabric audit
reads the PKey list without members (`list_pkeys`), each PKey alone (`get_pkey`), and the systems and virtual ports
of only the GUIDs it asks about (`port_hosts`), so no answer grows with the fabric. UFM's version
(``GET /app/ufm_version``) is read once per worker: restart workers after upgrading UFM.

`fabric_posture` reads what makes PKey isolation hold or not: the management PKey 0x7fff's default membership
(UFM reports it from 6.19; ``full``, UFM's default, lets every port reach every other whatever the tenants' PKeys
say) and the SM's keys (``GET /app/smconf``: M_Key, SM_Key, SA_Key, M_Key per port). Only findings leave the
activity, never a key's value.

UFM's answer to a write does not decide that it is done: every write is read back (`UfmActivities._write`), and
its body is not parsed (some releases answer plain text). A write whose answer is lost (the connection dropped
after UFM applied it, a timeout, a 5xx from its front) and that reads back applied counts as done by this attempt,
so the result says what this run changed; one answered with success that does not read back is retried
(``UfmWriteNotApplied``).

Authentication (docs/fabric.md): ``MILLWRIGHT_UFM_CREDENTIALS``, a secret reference
(``env:NAME`` or ``file:/path``) resolved inside each attempt: ``user:password`` uses HTTP Basic on ``/ufmRest``,
anything else is an access token sent as ``Authorization: Basic <token>`` on ``/ufmRestV3``; and/or a client
certificate (``MILLWRIGHT_UFM_CLIENT_CERT`` and ``MILLWRIGHT_UFM_CLIENT_KEY``, secret references to the PEM
certificate and key; alone, on ``/ufmRest``: UFM maps the certificate's name to a user). None of them enters an
activity's input, output or error. The HTTP client never retries; Temporal's retry policy does.

TLS: UFM's certificate (self-signed out of the box) is verified against the default CAs, or the CA bundle of
``MILLWRIGHT_UFM_CA_BUNDLE``; ``MILLWRIGHT_UFM_VERIFY_TLS=false`` turns verification off (activities/support/tls.py).

Errors: 400/404/405/409/413/414/422 → ``UfmRejected`` (non-retryable, UFM's own message); 401/403 → ``UfmAuth``
(non-retryable); a certificate the worker does not trust or one issued for another name →
``TlsVerificationFailed`` (non-retryable, naming the setting that fixes it); 5xx, 429, timeouts, connection errors
and reads that are not JSON → ``UfmUnavailable`` (retryable); no settings → ``UfmNotConfigured``, an unreadable
CA bundle or client certificate → ``TlsNotConfigured``; a membership change this UFM release cannot make safely →
``UfmMembershipsUnsupported`` (all non-retryable).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from typing import Any, Literal

import httpx
from pydantic import Field, field_validator, model_validator
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.models import BaseUrl, StrictModel
from activities.support.secrets import SecretError, SecretRef
from activities.support.tls import ClientCertificate, TlsFix, Trust, TrustingClient, ca_bundle_ref

USER_AGENT = "millwright-worker"
_REQUEST_TIMEOUT = 10.0
_MAX_LISTING_TIMEOUT = 120.0
_LISTING_SECONDS_PER_PORT = 0.005  # 10,000 ports: 50 s on top of the request timeout
_HEARTBEAT_SECONDS = 5.0
_REMOVE_CHUNK = 500  # GUIDs per remove_guids_from_pkey request: bounds each request's size and UFM's work
_GUID = re.compile(r"^(0x)?([0-9a-fA-F]{16})$")
_PKEY = re.compile(r"^0x[0-9a-fA-F]{1,4}$")
MANAGEMENT_PKEY = 0x7FFF
# UFM releases where the REST API differs (UFM Enterprise REST API Guide; NVIDIA's bare-metal-manager client).
PARTITION_NAME_SINCE = (6, 22)  # partition_name on /pkeys/add
DEFAULT_MEMBERSHIP_SINCE = (6, 19)  # 0x7fff read with guids_data reports its default membership
PLURAL_MEMBERSHIPS_IGNORED = (6, 19)  # this line ignores "memberships" (seen on 6.19.1) and makes everyone full

Membership = Literal["full", "limited"]
UFM_TLS_FIX = TlsFix(ca="MILLWRIGHT_UFM_CA_BUNDLE", off="MILLWRIGHT_UFM_VERIFY_TLS=false")
CLIENT_CERT_SETTING = "MILLWRIGHT_UFM_CLIENT_CERT / MILLWRIGHT_UFM_CLIENT_KEY"


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


def release_numbers(release: str) -> tuple[int, ...]:
    """``"6.19.1-3"`` → ``(6, 19, 1)``; what cannot be read is ``()``, older than every release named here."""
    m = re.match(r"^\s*(\d+)(?:\.(\d+))?(?:\.(\d+))?", release or "")
    return tuple(int(x) for x in m.groups() if x is not None) if m else ()


def _guids(values: list[str]) -> list[str]:
    return sorted({normalize_guid(v) for v in values})


def _pkey(value: str) -> str:
    return normalize_pkey(value)


# ---------------------------------------------------------------- models


class UfmConfig(StrictModel):
    """Where UFM is and where its credentials are kept; the credentials themselves are never held here."""

    url: BaseUrl
    credentials: SecretRef | None = Field(None, description="user:password or an access token (a secret reference)")
    client_cert: SecretRef | None = Field(None, description="PEM client certificate (mutual TLS): a secret reference")
    client_key: SecretRef | None = Field(None, description="The client certificate's PEM key: a secret reference")
    timeout_seconds: float = Field(_REQUEST_TIMEOUT, gt=0, description="Per request (listings: see below).")
    max_listing_timeout_seconds: float = Field(
        _MAX_LISTING_TIMEOUT, gt=0, description="Cap on a fabric-wide listing's timeout, which grows with the fabric."
    )
    ca_bundle: str | None = Field(None, description="CA bundle reference (file:/path/to/ca.pem) for UFM's "
                                                    "certificate; default: the default CAs")  # fmt: skip
    verify_tls: bool = True

    _ca_bundle_ok = field_validator("ca_bundle")(ca_bundle_ref)

    @model_validator(mode="after")
    def _authenticates(self) -> UfmConfig:
        if (self.client_cert is None) != (self.client_key is None):
            raise ValueError("client_cert and client_key go together (MILLWRIGHT_UFM_CLIENT_CERT and _CLIENT_KEY)")
        if self.credentials is None and self.client_cert is None:
            raise ValueError("UFM needs credentials (user:password or an access token) or a client certificate")
        return self


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
    partition_name: str = Field("", description="Sent where UFM takes it (6.22 and later).")
    ip_over_ib: bool = True
    index0: bool = Field(True, description="Store the PKey at index 0 of each port's PKey table, as NVIDIA's "
                                           "clients do.")  # fmt: skip


class EnsuredPKey(StrictModel):
    pkey: str
    created: bool


class AddGuids(PKeyRef):
    guids: list[str] = Field(min_length=1)
    membership: Membership = "full"
    ip_over_ib: bool = True
    index0: bool = Field(True, description="Store the PKey at index 0 of each port's PKey table (see EnsurePKey).")
    _g = field_validator("guids")(_guids)


class RemoveGuids(PKeyRef):
    guids: list[str] = Field(min_length=1)
    _g = field_validator("guids")(_guids)


class MembershipChange(StrictModel):
    pkey: str
    changed: list[str] = Field(default_factory=list, description="GUIDs this attempt added or removed.")
    unchanged: list[str] = Field(default_factory=list, description="Already present (add) or absent (remove).")
    membership_changed: list[str] = Field(
        default_factory=list, description="Members whose membership this attempt changed (PUT)."
    )
    pkey_deleted: bool = Field(False, description="UFM deleted the PKey with its last member.")


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


class VirtualPort(StrictModel):
    host: str
    port_guid: str = Field(description="The physical port the virtual (SR-IOV) port is on.")


class FabricSnapshot(StrictModel):
    pkeys: list[PKeyMembers]
    hosts_by_guid: dict[str, str] = Field(default_factory=dict, description="Port GUID -> UFM system name.")
    virtual: dict[str, VirtualPort] = Field(default_factory=dict, description="Virtual port GUID -> where it is.")


PostureCode = Literal["default-membership-full", "default-membership-unreported", "m-key-unset",
                      "m-key-per-port-off", "sm-key-default", "sa-key-default", "sm-config-unreadable"]  # fmt: skip
BlockingCode = Literal["default-membership-full", "default-membership-unreported"]


class PostureFinding(StrictModel):
    code: PostureCode
    blocking: bool = Field(description="Voids PKey isolation or leaves it unverifiable: IsolateTenant refuses.")
    detail: str
    remedy: str

    def line(self) -> str:
        return f"{self.code}: {self.detail}. Remedy: {self.remedy}"


class FabricPosture(StrictModel):
    """What makes PKey isolation on this fabric hold: facts and findings, never a key's value."""

    ufm_version: str
    default_membership: Membership | None = Field(description="0x7fff's default membership; None: not reported.")
    m_key_set: bool | None = None
    m_key_per_port: bool | None = None
    sm_key_default: bool | None = None
    sa_key_default: bool | None = None
    findings: list[PostureFinding] = Field(default_factory=list)

    def blocking(self) -> list[PostureFinding]:
        return [f for f in self.findings if f.blocking]

    def warnings(self) -> list[PostureFinding]:
        return [f for f in self.findings if not f.blocking]


_GV_CFG = "/opt/ufm/files/conf/gv.cfg"
_OPENSM_CONF = "/opt/ufm/files/conf/opensm/opensm.conf"


def assess_posture(release: str, default_membership: Any, smconf: dict | None, smconf_error: str = "") -> FabricPosture:
    """The findings for what UFM reported: 0x7fff's default membership (None: not reported) and the SM settings."""
    membership = default_membership if default_membership in ("full", "limited") else None
    findings: list[PostureFinding] = []
    if membership == "full":
        findings.append(PostureFinding(
            code="default-membership-full", blocking=True,
            detail="every port is a full member of the management PKey 0x7fff, so any two ports reach each other "
                   "through it whatever the tenants' PKeys say",
            remedy=f"set default_membership = limited in {_GV_CFG} and restart UFM (on a UFM-SDN appliance: "
                   "ib partition management defmember limited)",
        ))  # fmt: skip
    elif membership is None:
        findings.append(PostureFinding(
            code="default-membership-unreported", blocking=True,
            detail=f"UFM {release} does not report the management PKey 0x7fff's default membership (UFM reports it "
                   "from 6.19), so the isolation cannot be verified",
            remedy=f"upgrade UFM to 6.19 or later; or, having set default_membership = limited in {_GV_CFG}, accept "
                   "this finding (IsolateTenant accept_posture: [\"default-membership-unreported\"])",
        ))  # fmt: skip
    keys: dict[str, Any] = {}
    if smconf is None:
        findings.append(
            PostureFinding(
                code="sm-config-unreadable",
                blocking=False,
                detail=f"the SM keys were not checked: {smconf_error}",
                remedy="let the UFM user Millwright uses read /ufmRest/app/smconf",
            )
        )
    else:
        keys = {
            "m_key_set": _key(smconf.get("m_key")) not in (None, 0),
            "m_key_per_port": _flag(smconf.get("m_key_per_port")),
            "sm_key_default": _key(smconf.get("sm_key")) == 1,
            "sa_key_default": _key(smconf.get("sa_key")) == 1,
        }
        if not keys["m_key_set"]:
            findings.append(PostureFinding(
                code="m-key-unset", blocking=False,
                detail="the M_Key is 0x0: a host's root user can reconfigure ports (PortInfo, PKey tables) with SMPs",
                remedy=f"set m_key_per_port = true in {_GV_CFG} and m_key_protection_level 2 in {_OPENSM_CONF}, then "
                       "restart UFM",
            ))  # fmt: skip
        if not keys["m_key_per_port"]:
            findings.append(
                PostureFinding(
                    code="m-key-per-port-off",
                    blocking=False,
                    detail="one M_Key serves every port (m_key_per_port is off)",
                    remedy=f"set m_key_per_port = true in {_GV_CFG} and restart UFM",
                )
            )
        if keys["sm_key_default"]:
            findings.append(
                PostureFinding(
                    code="sm-key-default",
                    blocking=False,
                    detail="the SM_Key is UFM's default 0x1",
                    remedy=f"set sm_key to a random 64-bit value in {_OPENSM_CONF}",
                )
            )
        if keys["sa_key_default"]:
            findings.append(
                PostureFinding(
                    code="sa-key-default",
                    blocking=False,
                    detail="the SA_Key is UFM's default 0x1",
                    remedy=f"set randomize_sa_key = true in {_GV_CFG}",
                )
            )
    return FabricPosture(ufm_version=release, default_membership=membership, findings=findings, **keys)


def _key(value: Any) -> int | None:
    """A key as UFM reports it (``"0x0"``, ``"0x0000000000000001"``, a number); None when absent or unreadable."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return value
    try:
        return int(str(value).strip(), 0)
    except ValueError:
        return None


def _flag(value: Any) -> bool:
    return value is True or str(value).strip().lower() in ("true", "1", "yes")


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
    virtual: dict[str, VirtualPort] = Field(default_factory=dict, description="Virtual port GUID -> where it is, "
                                                                              "for the GUIDs asked for.")  # fmt: skip


class FabricCall(StrictModel):
    """One update of a Fabric entity workflow, started with the update if it does not run yet."""

    fabric: str
    update: Literal["allocate", "confirm", "withdraw", "begin_release", "finish_release", "state"]
    payload: dict[str, Any] = Field(default_factory=dict)


# ---------------------------------------------------------------- errors


def ufm_error(response: httpx.Response, doing: str) -> ApplicationError:
    status = response.status_code
    try:
        body = response.json()
        text = body.get("error") or body.get("message") or str(body) if isinstance(body, dict) else str(body)
    except ValueError:  # e.g. the HTML page of UFM's Apache front
        text = re.sub(r"\s+", " ", re.sub(r"<[^>]*>", " ", response.text))
    message = f"{doing}: UFM answered {status}: {str(text).strip()[:500]}"
    if status in (401, 403):
        return ApplicationError(message, type="UfmAuth", non_retryable=True)
    if status in (413, 414):
        return ApplicationError(f"{message} (the request is too large for UFM's front)", type="UfmRejected",
                                non_retryable=True)  # fmt: skip
    if status in (400, 404, 405, 409, 422):
        return ApplicationError(message, type="UfmRejected", non_retryable=True)
    return ApplicationError(message, type="UfmUnavailable")


# ---------------------------------------------------------------- activities


class UfmActivities:
    """UFM PKey activities. With no config every activity fails with UfmNotConfigured."""

    def __init__(self, config: UfmConfig | None) -> None:
        self._config = config
        self._release: str | None = None  # UFM's version, read once per worker
        self._ports_seen: int | None = None  # host ports in the last listing: scales the next one's timeout

    def activities(self) -> list[Callable]:
        return [self.resolve_hosts, self.ensure_pkey, self.add_guids, self.remove_guids, self.get_pkey,
                self.delete_pkey_if_empty, self.snapshot, self.list_pkeys, self.port_hosts, self.fabric_posture,
                self.call_fabric]  # fmt: skip

    async def close(self) -> None:  # a Registration resource; clients are per call
        return None

    # ------------------------------------------------------------ plumbing

    def _client(self) -> TrustingClient:
        config = self._config
        if config is None:
            raise ApplicationError(
                "UFM is not configured on this worker: set MILLWRIGHT_UFM_URL and MILLWRIGHT_UFM_CREDENTIALS "
                "(a secret reference to user:password or an access token: env:NAME or file:/path), or "
                "MILLWRIGHT_UFM_CLIENT_CERT and MILLWRIGHT_UFM_CLIENT_KEY",
                type="UfmNotConfigured",
                non_retryable=True,
            )
        base = config.url.rstrip("/") + "/ufmRest"
        headers = {"User-Agent": USER_AGENT, "Accept": "application/json"}
        auth: Any = None
        if config.credentials is not None:
            try:
                secret = config.credentials.resolve()
            except SecretError as err:
                raise ApplicationError(f"UFM credentials: {err}", type="UfmNotConfigured",
                                       non_retryable=True) from None  # fmt: skip
            if ":" in secret:
                user, _, password = secret.partition(":")
                auth = httpx.BasicAuth(user, password)
            else:
                headers["Authorization"] = f"Basic {secret}"
                base += "V3"
        client_cert = (ClientCertificate(cert=config.client_cert, key=config.client_key, setting=CLIENT_CERT_SETTING)
                       if config.client_cert and config.client_key else None)  # fmt: skip
        trust = Trust.resolve(UFM_TLS_FIX, verify=config.verify_tls, ca_bundle=config.ca_bundle,
                              setting="MILLWRIGHT_UFM_CA_BUNDLE", client_cert=client_cert)  # fmt: skip
        return TrustingClient(trust, base_url=base, auth=auth, headers=headers, timeout=config.timeout_seconds)

    async def _call(self, client: TrustingClient, method: str, path: str, doing: str, *, ok404: bool = False,
                    parse: bool = True, timeout: float | None = None, **kw: Any) -> Any:  # fmt: skip
        """One request. A read's body must be JSON (`parse`); a write's is not looked at: the read back decides.
        The activity heartbeats first: each request is bounded by its timeout, so a live attempt is seen."""
        assert self._config is not None  # the client came from _client(), which refuses a worker without one
        doing = f"{doing} at UFM {client.base_url}"  # the endpoint, for a run that shows why it waits
        activity.heartbeat(doing)
        try:
            response = await client.request(method, path, timeout=timeout or httpx.USE_CLIENT_DEFAULT, **kw)
        except httpx.HTTPError as err:
            tls_failure = client.trust.failure(err, f"{doing}: UFM {self._config.url}")
            if tls_failure is not None:
                raise tls_failure from None
            hint = ""
            closed = isinstance(err, (httpx.ReadError, httpx.RemoteProtocolError))  # as TLS 1.3 refuses no certificate
            if closed and self._config.url.startswith("https") and not self._config.client_cert:
                hint = f" (a UFM that requires client certificates closes the connection so: see {CLIENT_CERT_SETTING})"
            # Never the request itself: its headers hold the credentials.
            raise ApplicationError(f"{doing}: connection failed: {type(err).__name__}{hint}",
                                   type="UfmUnavailable") from None  # fmt: skip
        if ok404 and response.status_code == 404:
            return None
        if response.status_code >= 300:
            raise ufm_error(response, doing)
        if not parse:
            return None
        if not response.content:
            return {}
        try:
            return response.json()
        except ValueError:
            kind = response.headers.get("content-type", "no content type")
            raise ApplicationError(f"{doing}: UFM answered {response.status_code} with a body that is not JSON "
                                   f"({kind})", type="UfmUnavailable") from None  # fmt: skip

    def _listing_timeout(self) -> float:
        assert self._config is not None  # asked only by an activity that holds a client from _client()
        cap = self._config.max_listing_timeout_seconds
        if self._ports_seen is None:  # the fabric's size is not known yet
            return cap
        return min(cap, self._config.timeout_seconds + self._ports_seen * _LISTING_SECONDS_PER_PORT)

    async def _listing(self, client: TrustingClient, path: str, doing: str, *, ok404: bool = False,
                       **params: str) -> Any:  # fmt: skip
        """A fabric-wide read: its timeout scales with the fabric; the activity heartbeats while it waits."""
        call = asyncio.ensure_future(self._call(client, "GET", path, doing, ok404=ok404, params=params,
                                                timeout=self._listing_timeout()))  # fmt: skip
        try:
            while not (await asyncio.wait({call}, timeout=_HEARTBEAT_SECONDS))[0]:
                activity.heartbeat(f"waiting for UFM: {doing}")
            return call.result()
        finally:
            call.cancel()

    async def _host_ports(self, client: TrustingClient) -> list[dict]:
        ports = await self._listing(client, "/resources/ports", "listing UFM host ports", sys_type="Computer")
        self._ports_seen = len(ports)
        return ports

    async def _ufm_release(self, client: TrustingClient) -> str:
        if self._release is None:
            body = await self._call(client, "GET", "/app/ufm_version", "reading UFM's version")
            release = body.get("ufm_release_version") if isinstance(body, dict) else None
            if not isinstance(release, str):
                raise ApplicationError("reading UFM's version: no ufm_release_version in the answer",
                                       type="UfmUnavailable")  # fmt: skip
            self._release = release
        return self._release

    def _after_write(self, what: str) -> None:
        """Called after each write. A no-op; tests override it to crash an attempt mid-activity."""

    async def _write(self, client: TrustingClient, method: str, path: str, doing: str, pkey: str,
                     landed: Callable[[PKeyMembers], bool], **kw: Any) -> PKeyMembers:  # fmt: skip
        """One write, then PKey `pkey` read back: the write is done when `landed` says the read shows it.

        A retryable failure (the answer lost after UFM applied the write, a timeout, a 5xx) is read back too: a
        write that landed counts as this attempt's, and only one that did not is raised for the retry policy.
        A success answer whose change does not read back is retryable ``UfmWriteNotApplied``: the next attempt
        reads first and writes only what is still missing. A rejection (4xx) is raised as it is. Returns the
        read."""
        failed: ApplicationError | None = None
        try:
            await self._call(client, method, path, doing, parse=False, **kw)
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
            return have
        if failed is not None:
            raise failed
        raise ApplicationError(
            f"{doing}: UFM answered success, but PKey {pkey} does not read back changed "
            f"(exists: {have.exists}, {len(have.members)} members)",
            type="UfmWriteNotApplied",
        )

    async def _members(self, client: TrustingClient, pkey: str) -> PKeyMembers:
        body = await self._call(
            client, "GET", f"/resources/pkeys/{pkey}", f"reading PKey {pkey}", ok404=True, params={"guids_data": "true"}
        )
        if not body:  # 404, or the 200 {} some releases answer for a PKey that does not exist
            return PKeyMembers(pkey=pkey, exists=False)
        return _pkey_members(pkey, body)

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
        return FabricSnapshot(pkeys=[_pkey_members(f"0x{int(key, 16):x}", body)
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
        release = await self._ufm_release(client)
        if len(kinds) == 1:
            body["membership"] = kinds.pop()
        elif release_numbers(release)[:2] == PLURAL_MEMBERSHIPS_IGNORED:
            raise ApplicationError(
                f"changing {len(guids)} members of PKey {req.pkey} to {req.membership} needs a PUT with per-GUID "
                f"memberships, which UFM {release} ignores (it makes every member full): nothing was changed. "
                f"Upgrade UFM, or give the PKey's {len(merged) - len(guids)} other members one membership",
                type="UfmMembershipsUnsupported", non_retryable=True,
            )  # fmt: skip
        else:
            body["memberships"] = [merged[g] for g in order]
        seen: list[PKeyMembers] = []

        def landed(after: PKeyMembers) -> bool:
            seen.append(after)
            return after.members == merged

        doing = f"changing the membership of {len(guids)} GUIDs of PKey {req.pkey} to {req.membership}"
        try:
            await self._write(client, "PUT", "/resources/pkeys", doing, req.pkey, landed, json=body)
        except ApplicationError:
            after = seen[-1].members if seen else {}
            collateral = sorted((g, merged[g], after.get(g, "absent")) for g in order
                                if g not in guids and seen and after.get(g) != merged[g])  # fmt: skip
            if collateral:
                raise ApplicationError(
                    f"{doing}: UFM changed other members too (" + ", ".join(f"{g} {was} -> {now}" for g, was, now in
                                                                            collateral[:20])
                    + "): restore them in UFM", type="UfmMembershipsUnsupported", non_retryable=True,
                ) from None  # fmt: skip
            raise

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


def _pkey_members(pkey: str, body: dict) -> PKeyMembers:
    return PKeyMembers(
        pkey=pkey, exists=True, partition=str(body.get("partition") or ""),
        members={normalize_guid(g["guid"]): g.get("membership", "full") for g in body.get("guids") or []},
    )  # fmt: skip
