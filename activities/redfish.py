"""Redfish activities against servers' BMCs, through `sushy`.

Every activity builds a fresh `sushy.Sushy` root and reads a fresh system object: sushy's
``refresh()`` is unreliable (AttributeError once ``pcie_devices`` was read) and a new object per attempt
means a retry never acts on a stale view. sushy's own retries are turned down to one try so that
Temporal's retry policy owns retrying and every attempt is visible in the UI.

Idempotency: acts are read-first and verified by reading back. `redfish_power` only resets
when the read state differs from the wanted one and then waits until the BMC reports it,
so a retry after a crash at any line neither repeats a completed power change nor returns
before it landed. A power cycle is two such activities (Off, then On): a crash between
them leaves a history that says exactly which half happened.

Credentials: a secret reference (``env:NAME`` / ``file:/path``) whose value is
``user:password``, resolved inside each attempt, sent with HTTP Basic (no BMC session is
created, so concurrent activities cannot exhaust a BMC's session limit). They never
enter an activity's input, output, heartbeat or error.

TLS: a BMC's certificate is verified against the default CAs, or the CA bundle of
``BmcRef.ca_bundle`` (else the worker's ``MILLWRIGHT_BMC_CA_BUNDLE``); ``BmcRef.verify_tls: false``
(or the worker's ``MILLWRIGHT_BMC_VERIFY_TLS=false``) turns verification off (activities/support/tls.py).

Errors: 401/403 → ``RedfishAuth``; 400/404/405 and values the BMC does not offer →
``RedfishRejected`` (both non-retryable); a certificate the worker does not trust or one issued
for another name → ``TlsVerificationFailed`` (non-retryable, naming the setting that fixes it);
a BMC that does not answer, answers 5xx or 503 for its session limit → ``BmcUnavailable``
(retryable); no credentials configured → ``RedfishNotConfigured``, an unreadable CA bundle →
``TlsNotConfigured`` (both non-retryable).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any, Literal, TypeVar

import sushy
from pydantic import Field, field_validator
from sushy import exceptions as sushy_errors
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.models import BaseUrl, StrictModel
from activities.support.secrets import SecretError, SecretRef
from activities.support.tls import TlsFix, Trust, ca_bundle_ref

_CONNECT_TIMEOUT = 5.0
_READ_TIMEOUT = 20.0
_POLL_SECONDS = 0.5  # a power change takes seconds on a real BMC; polling faster only loads it
_THREADS = 64  # sushy blocks: BMC calls get threads of their own, not the loop's small default pool
_MAX_SEL_ENTRIES = 200  # per answer: a noisy log must not bloat a workflow's history

PowerState = Literal["On", "Off"]
BootTarget = Literal["Pxe", "Hdd", "Cd", "UefiHttp", "BiosSetup", "None"]

T = TypeVar("T")

BMC_TLS_FIX = TlsFix(
    ca="bmc.ca_bundle (this BMC) or MILLWRIGHT_BMC_CA_BUNDLE (every BMC)",
    off="bmc.verify_tls: false (or MILLWRIGHT_BMC_VERIFY_TLS=false for every BMC)",
)


def _text(value: Any) -> str | None:
    """sushy maps Redfish strings to enums; activities answer with the Redfish string."""
    return None if value is None else str(getattr(value, "value", value))


def _credentials_ref(value: str | None) -> str | None:
    if value is not None:
        SecretRef.parse(value)  # refuses a bare password with a message that does not echo it
    return value


class BmcRef(StrictModel):
    """Where a server's BMC is and where its credentials are kept (never the credentials)."""

    url: BaseUrl = Field(description="The BMC's base URL, e.g. https://10.0.0.5")
    system: str | None = Field(None, description="Redfish system ID or path; default: the BMC's only system.")
    credentials: str | None = Field(
        None, description="Secret reference (env:NAME or file:/path) to 'user:password'; default: the worker's "
                          "MILLWRIGHT_BMC_CREDENTIALS.",
    )  # fmt: skip
    verify_tls: bool = Field(True, description="Verify the BMC's TLS certificate (false: accept any certificate).")
    ca_bundle: str | None = Field(
        None, description="CA bundle reference (file:/path/to/ca.pem) the BMC's certificate is verified against; "
                          "default: the worker's MILLWRIGHT_BMC_CA_BUNDLE, else the default CAs.",
    )  # fmt: skip

    _credentials_ok = field_validator("credentials")(_credentials_ref)
    _ca_bundle_ok = field_validator("ca_bundle")(ca_bundle_ref)

    def __str__(self) -> str:
        return self.url + (f" system {self.system}" if self.system else "")


class PowerRequest(StrictModel):
    bmc: BmcRef
    state: PowerState
    timeout_seconds: float = Field(300.0, gt=0, description="How long the BMC may take to report the new state.")


class PowerResult(StrictModel):
    state: PowerState
    changed: bool = Field(description="False when the server already was in this state.")


class BootRequest(StrictModel):
    bmc: BmcRef
    target: BootTarget
    enabled: Literal["Once", "Continuous"] = "Once"
    mode: Literal["UEFI", "Legacy"] | None = None


class BootResult(StrictModel):
    target: str
    enabled: str
    changed: bool


class RedfishGpu(StrictModel):
    id: str
    model: str = ""
    serial: str = ""
    uuid: str = ""
    health: str | None = None


class RedfishInventory(StrictModel):
    system: str = Field("", description="The system's Redfish path: give it as BmcRef.system to skip the lookup.")
    manufacturer: str = ""
    model: str = ""
    serial: str = ""
    uuid: str = ""
    power_state: str | None = None
    health: str | None = None
    health_rollup: str | None = None
    firmware: dict[str, str] = Field(default_factory=dict, description="Firmware inventory: component ID -> version.")
    gpus: list[RedfishGpu] = Field(default_factory=list)


class SelQuery(StrictModel):
    bmc: BmcRef
    after_id: str | None = Field(None, description="Only entries after this one (from an earlier SelReport.last_id).")


class SelEntry(StrictModel):
    id: str
    created: datetime | None = None
    severity: str = "OK"
    message: str = ""
    message_id: str = ""


class SelReport(StrictModel):
    entries: list[SelEntry] = Field(default_factory=list)
    last_id: str | None = Field(None, description="The newest entry's ID (also when entries were capped).")
    truncated: int = Field(0, description="Entries left out of `entries` to keep the answer small.")

    @property
    def critical(self) -> list[SelEntry]:
        return [e for e in self.entries if e.severity == "Critical"]


class RedfishHealth(StrictModel):
    power_state: str | None = None
    health: str | None = None
    health_rollup: str | None = None


# ---------------------------------------------------------------- errors


def redfish_error(err: Exception, doing: str, bmc: BmcRef, trust: Trust) -> ApplicationError:
    """Classify an error from sushy or the HTTP client; the message never carries credentials."""
    where = f"{doing} on BMC {bmc}"
    tls_failure = trust.failure(err, where)
    if tls_failure is not None:
        return tls_failure
    if isinstance(err, sushy_errors.AccessError):
        return ApplicationError(f"{where}: the BMC refused the credentials (HTTP {err.status_code})",
                                type="RedfishAuth", non_retryable=True)  # fmt: skip
    if isinstance(err, sushy_errors.HTTPError):
        status = err.status_code or 0
        detail = err.detail or err.code
        if status in (400, 404, 405):
            return ApplicationError(f"{where}: HTTP {status}: {detail}", type="RedfishRejected", non_retryable=True)
        return ApplicationError(f"{where}: HTTP {status}: {detail}", type="BmcUnavailable")
    if isinstance(
        err,
        sushy_errors.InvalidParameterValueError | sushy_errors.MissingAttributeError | sushy_errors.MissingActionError,
    ):
        return ApplicationError(f"{where}: {err}", type="RedfishRejected", non_retryable=True)
    if isinstance(err, sushy_errors.ConnectionError):
        return ApplicationError(f"{where}: the BMC does not answer", type="BmcUnavailable")
    return ApplicationError(f"{where}: {type(err).__name__}: {err}", type="BmcUnavailable")


# ---------------------------------------------------------------- activities


class RedfishActivities:
    def __init__(self, default_credentials: SecretRef | None = None, *, ca_bundle: str | None = None,
                 verify_tls: bool = True) -> None:  # fmt: skip
        """`ca_bundle` and `verify_tls`: the worker's defaults for every BMC (MILLWRIGHT_BMC_CA_BUNDLE,
        MILLWRIGHT_BMC_VERIFY_TLS)."""
        self.default_credentials = default_credentials
        self.ca_bundle, self.verify_tls = ca_bundle, verify_tls
        self._threads = ThreadPoolExecutor(max_workers=_THREADS, thread_name_prefix="redfish")

    def activities(self) -> list[Callable]:
        return [self.redfish_power, self.redfish_set_boot, self.redfish_inventory, self.redfish_sel,
                self.redfish_health]  # fmt: skip

    async def close(self) -> None:  # a Registration resource; connections are per attempt
        self._threads.shutdown(wait=False, cancel_futures=True)

    def _user_password(self, bmc: BmcRef) -> tuple[str, str]:
        ref = SecretRef.parse(bmc.credentials) if bmc.credentials else self.default_credentials
        if ref is None:
            raise ApplicationError(
                f"no credentials for BMC {bmc}: give bmc.credentials or set MILLWRIGHT_BMC_CREDENTIALS",
                type="RedfishNotConfigured", non_retryable=True,
            )  # fmt: skip
        try:
            value = ref.resolve()
        except SecretError as err:
            raise ApplicationError(str(err), type="RedfishNotConfigured", non_retryable=True) from None
        user, sep, password = value.partition(":")
        if not sep or not user:
            raise ApplicationError(f"secret {ref} is not 'user:password'", type="RedfishNotConfigured",
                                   non_retryable=True)  # fmt: skip
        return user, password

    def _trust(self, bmc: BmcRef) -> Trust:
        """The BMC's own CA bundle over the worker's; verification is off when either turns it off."""
        ca, setting = (
            (bmc.ca_bundle, "bmc.ca_bundle") if bmc.ca_bundle else (self.ca_bundle, "MILLWRIGHT_BMC_CA_BUNDLE")
        )
        return Trust.resolve(BMC_TLS_FIX, verify=bmc.verify_tls and self.verify_tls, ca_bundle=ca, setting=setting)

    def _root(self, bmc: BmcRef, trust: Trust) -> sushy.Sushy:
        user, password = self._user_password(bmc)
        return sushy.Sushy(
            bmc.url, auth=sushy.auth.BasicAuth(user, password), verify=trust.for_requests(),
            server_side_retries=1, server_side_retries_delay=1,
            connect_timeout=_CONNECT_TIMEOUT, read_timeout=_READ_TIMEOUT,
        )  # fmt: skip

    @staticmethod
    def _system(root: sushy.Sushy, bmc: BmcRef) -> Any:
        if bmc.system:
            path = bmc.system if bmc.system.startswith("/") else f"/redfish/v1/Systems/{bmc.system}"
            return root.get_system(path)
        members = sorted(root.get_system_collection().members_identities)
        if len(members) != 1:
            raise ApplicationError(
                f"BMC {bmc} has {len(members)} systems; name one in bmc.system ({', '.join(members[:5])})",
                type="RedfishRejected", non_retryable=True,
            )  # fmt: skip
        return root.get_system(members[0])

    async def _call(self, doing: str, bmc: BmcRef, fn: Callable[[sushy.Sushy], T], root: sushy.Sushy | None = None
                    ) -> T:  # fmt: skip
        """Run a blocking sushy conversation in a thread (on `root`, or a fresh one), mapping its errors."""
        trust = self._trust(bmc)

        def run() -> T:
            return fn(root or self._root(bmc, trust))

        try:
            return await asyncio.get_running_loop().run_in_executor(self._threads, run)
        except ApplicationError:
            raise
        except Exception as err:
            raise redfish_error(err, doing, bmc, trust) from None

    @activity.defn
    async def redfish_power(self, req: PowerRequest) -> PowerResult:
        """Bring the server to a power state and wait until the BMC reports it; no reset when it already is."""
        want = sushy.POWER_STATE_ON if req.state == "On" else sushy.POWER_STATE_OFF

        def act(root: sushy.Sushy) -> tuple[sushy.Sushy, str, bool]:
            system = self._system(root, req.bmc)
            if system.power_state == want:
                return root, system.path, False
            settling = {
                sushy.POWER_STATE_POWERING_ON: sushy.POWER_STATE_ON,
                sushy.POWER_STATE_POWERING_OFF: sushy.POWER_STATE_OFF,
            }.get(system.power_state)
            if settling != want:  # else an earlier attempt's reset is landing: do not send another
                system.reset_system(sushy.RESET_ON if req.state == "On" else sushy.RESET_FORCE_OFF)
            return root, system.path, True

        root, path, changed = await self._call(f"powering {req.state.lower()}", req.bmc, act)
        deadline = time.monotonic() + req.timeout_seconds
        while True:  # one connection, one GET of the system per look
            state = await self._call("reading the power state", req.bmc, lambda r: r.get_system(path).power_state,
                                     root)  # fmt: skip
            if state == want:
                return PowerResult(state=req.state, changed=changed)
            activity.heartbeat({"power_state": _text(state), "want": req.state})
            if time.monotonic() > deadline:
                # Retryable: the next attempt reads again and resets only if still needed.
                raise ApplicationError(
                    f"BMC {req.bmc} still reports power {_text(state)!r} {req.timeout_seconds:.0f}s after asking for "
                    f"{req.state}", type="PowerStateTimeout",
                )  # fmt: skip
            await asyncio.sleep(_POLL_SECONDS)

    @activity.defn
    async def redfish_set_boot(self, req: BootRequest) -> BootResult:
        """Set the boot source override, then read it back; no write when it is already set."""

        def run(root: sushy.Sushy) -> BootResult:
            system = self._system(root, req.bmc)
            boot = system.boot
            current = (_text(boot.target), _text(boot.enabled)) + ((_text(boot.mode),) if req.mode else ())
            wanted = (req.target, req.enabled) + ((req.mode,) if req.mode else ())
            if current == wanted:
                return BootResult(target=req.target, enabled=req.enabled, changed=False)
            options: dict[str, Any] = {
                "target": sushy.BootSource(req.target),
                "enabled": sushy.BootSourceOverrideEnabled(req.enabled),
            }
            if req.mode:
                options["mode"] = sushy.BootSourceOverrideMode(req.mode)
            system.set_system_boot_options(**options)
            after = self._system(root, req.bmc).boot
            if _text(after.target) != req.target:
                raise ApplicationError(
                    f"BMC {req.bmc} accepted boot target {req.target} but reads back {_text(after.target)}",
                    type="BootOverrideNotApplied",
                )  # fmt: skip
            return BootResult(target=req.target, enabled=_text(after.enabled) or req.enabled, changed=True)

        return await self._call(f"setting boot override {req.target}/{req.enabled}", req.bmc, run)

    @activity.defn
    async def redfish_inventory(self, bmc: BmcRef) -> RedfishInventory:
        """Identity, health, firmware inventory and GPUs (processors of type GPU)."""

        def run(root: sushy.Sushy) -> RedfishInventory:
            system = self._system(root, bmc)
            status = system.status
            inv = RedfishInventory(
                system=system.path, manufacturer=system.manufacturer or "", model=system.model or "",
                serial=system.serial_number or "", uuid=system.uuid or "", power_state=_text(system.power_state),
                health=_text(status.health) if status else None,
                health_rollup=_text(status.health_rollup) if status else None,
            )  # fmt: skip
            try:
                inv.firmware = {
                    fw.identity: fw.version or "" for fw in root.get_update_service().firmware_inventory.get_members()
                }
            except sushy_errors.MissingAttributeError:
                pass  # a BMC without a firmware inventory: the baseline check says so
            try:
                processors = system.processors.get_members()
            except sushy_errors.MissingAttributeError:
                processors = []
            for p in processors:
                if p.processor_type == sushy.PROCESSOR_TYPE_GPU:
                    raw = p.json
                    inv.gpus.append(RedfishGpu(
                        id=p.identity, model=p.model or "", serial=raw.get("SerialNumber") or "",
                        uuid=raw.get("UUID") or "", health=_text(p.status.health) if p.status else None,
                    ))  # fmt: skip
            return inv

        return await self._call("reading the inventory", bmc, run)

    @activity.defn
    async def redfish_sel(self, query: SelQuery) -> SelReport:
        """The system's SEL entries (after `after_id`), oldest first. sushy has no LogService class,
        so the log is read as raw JSON through the same authenticated connector."""

        def run(root: sushy.Sushy) -> SelReport:
            system = self._system(root, query.bmc)
            services = system.json.get("LogServices", {}).get("@odata.id")
            if not services:
                raise ApplicationError(f"BMC {query.bmc} has no LogServices", type="RedfishRejected",
                                       non_retryable=True)  # fmt: skip
            conn = root._conn
            members = conn.get(services).json().get("Members", [])
            sel = next((m["@odata.id"] for m in members if m["@odata.id"].rstrip("/").endswith("SEL")),
                       members[0]["@odata.id"] if members else None)  # fmt: skip
            if sel is None:
                return SelReport()
            entries_path = conn.get(sel).json().get("Entries", {}).get("@odata.id", sel.rstrip("/") + "/Entries")
            raw = conn.get(entries_path).json().get("Members", [])
            entries = [SelEntry(id=str(e.get("Id")), created=e.get("Created"), severity=e.get("Severity") or "OK",
                                message=e.get("Message") or "", message_id=e.get("MessageId") or "")
                       for e in raw]  # fmt: skip
            last_id = entries[-1].id if entries else query.after_id
            if query.after_id is not None:
                ids = [e.id for e in entries]
                # An ID no longer in the log means it was cleared: everything there now is new.
                entries = entries[ids.index(query.after_id) + 1 :] if query.after_id in ids else entries
            truncated = max(0, len(entries) - _MAX_SEL_ENTRIES)
            if truncated:  # keep the criticals (the evidence), then the newest, in log order
                keep = sorted(range(len(entries)), key=lambda i: (entries[i].severity != "Critical", -i))
                entries = [entries[i] for i in sorted(keep[:_MAX_SEL_ENTRIES])]
            return SelReport(entries=entries, last_id=last_id, truncated=truncated)

        return await self._call("reading the SEL", query.bmc, run)

    @activity.defn
    async def redfish_health(self, bmc: BmcRef) -> RedfishHealth:
        def run(root: sushy.Sushy) -> RedfishHealth:
            system = self._system(root, bmc)
            status = system.status
            return RedfishHealth(power_state=_text(system.power_state), health=_text(status.health) if status else None,
                                 health_rollup=_text(status.health_rollup) if status else None)  # fmt: skip

        return await self._call("reading the health", bmc, run)
