"""Redfish activities against servers' BMCs, through `sushy`.

Every attempt opens one connection to the BMC (a `sushy` connector, kept alive for the attempt) and reads a fresh
system object: sushy's ``refresh()`` is unreliable (AttributeError once ``pcie_devices`` was read) and a new object
per attempt means a retry never acts on a stale view. sushy's own retries are turned down to one try so that
Temporal's retry policy owns retrying and every attempt is visible in the UI.

Requests are a BMC's scarce resource (a real one takes 0.2-2 s each and serves a handful of clients), so each activity
asks only for what it has not been told: the service root and the system collection are read only when
``BmcRef.system`` is not known yet (`redfish_inventory` answers it, and the SEL's path, for later calls to carry);
collections are read in one request with ``$expand`` where the service root advertises it; a power change whose caller
just read the state (``PowerRequest.current``) is sent on the first attempt without reading again, and every change is
still verified by reading back. A passing burn-in asks a BMC 21 requests (docs/burn-in.md, "What a burn-in asks a
BMC").

Idempotency: acts are read-first and verified by reading back. `redfish_power` only resets when the read state differs
from the wanted one and then waits until the BMC reports it, so a retry after a crash at any line neither repeats a
completed power change nor returns before it landed. A power cycle is two such activities (Off, then On): a crash
between them leaves a history that says exactly which half happened.

Credentials: a secret reference (``env:NAME`` / ``file:/path``) whose value is ``user:password``, resolved inside each
attempt, sent with HTTP Basic on the attempt's one connection (no BMC session is created: no login and logout
requests, and no session slot held if a worker dies), or in one session per attempt to a BMC with Basic turned off
(activities/redfish_auth.py). They never enter an activity's input, output, heartbeat or error.

TLS: a BMC's certificate is verified against the default CAs, or the CA bundle of ``BmcRef.ca_bundle`` (else the
worker's ``MILLWRIGHT_BMC_CA_BUNDLE``); ``BmcRef.verify_tls: false`` (or the worker's
``MILLWRIGHT_BMC_VERIFY_TLS=false``) turns verification off (activities/support/tls.py).

Errors: 401/403 → ``RedfishAuth``; 400/404/405 and values the BMC does not offer → ``RedfishRejected`` (both
non-retryable); a certificate the worker does not trust or one issued for another name → ``TlsVerificationFailed``
(non-retryable, naming the setting that fixes it); a BMC that does not answer, answers 5xx, or 503/429 for its session
or request limit → ``BmcUnavailable`` (retryable; its ``Retry-After`` becomes the next attempt's delay, and the wait
shows in the run's progress); no credentials configured → ``RedfishNotConfigured``, an unreadable CA bundle →
``TlsNotConfigured`` (both non-retryable).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from typing import Any, Literal, TypeVar

import sushy
from pydantic import Field, field_validator
from sushy import exceptions as sushy_errors
from sushy.connector import Connector
from sushy.resources.base import JsonDataReader, ResourceBase
from sushy.resources.system.system import System
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.models import BaseUrl, StrictModel
from activities.redfish_auth import BmcAuth
from activities.redfish_trays import TrayPlace, tray_place
from activities.support.secrets import SecretError, SecretRef
from activities.support.tls import TlsFix, Trust, ca_bundle_ref

_CONNECT_TIMEOUT = 5.0
_READ_TIMEOUT = 20.0
_POLL_SECONDS = 0.5  # the first look after a reset; each later one waits twice as long, up to _POLL_MAX_SECONDS
_POLL_MAX_SECONDS = 4.0  # a power change takes seconds on a real BMC: looking every half second only loads it
_THREADS = 64  # sushy blocks: BMC calls get threads of their own, not the loop's small default pool
_MAX_SEL_ENTRIES = 200  # per answer: a noisy log must not bloat a workflow's history
_MAX_RETRY_AFTER = 300.0  # seconds: the most a BMC's Retry-After delays one attempt
ROOT = "/redfish/v1/"

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


def _redfish_path(value: str | None) -> str | None:
    if value is not None and not value.startswith("/redfish/"):
        raise ValueError(f"must be a Redfish path starting with /redfish/ (as a BMC answered it), not {value!r}")
    return value


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
    current: PowerState | None = Field(
        None, description="The power state a call just read back (PowerResult.state, BootResult.power_state): when "
        "it differs from `state` and bmc.system is known, the first attempt changes power without reading it again "
        "(a retry reads first). The change is verified by reading back either way.",
    )  # fmt: skip


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
    power_state: PowerState | None = Field(None, description="The power state read with the override, for "
                                           "PowerRequest.current.")  # fmt: skip


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
    entries_path: str | None = Field(None, description="Where the entries were read: give it as SelQuery.entries.")

    @property
    def critical(self) -> list[SelEntry]:
        return [e for e in self.entries if e.severity == "Critical"]


class RedfishGpu(StrictModel):
    id: str
    model: str = ""
    serial: str = ""
    uuid: str = ""
    health: str | None = None


class RedfishInventory(StrictModel):
    system: str = Field("", description="The system's Redfish path: give it as BmcRef.system to skip the lookup.")
    sel_entries: str | None = Field(None, description="The SEL's entries path: give it as SelQuery.entries to read "
                                    "the log in one request.")  # fmt: skip
    manufacturer: str = ""
    model: str = ""
    serial: str = ""
    uuid: str = ""
    power_state: str | None = None
    health: str | None = None
    health_rollup: str | None = None
    firmware: dict[str, str] = Field(default_factory=dict, description="Firmware inventory: component ID -> version.")
    gpus: list[RedfishGpu] = Field(default_factory=list)
    sel: SelReport | None = Field(None, description="The SEL read with the inventory (`redfish_inventory_and_sel`), "
                                  "when the system has one.")  # fmt: skip


class SelQuery(StrictModel):
    bmc: BmcRef
    after_id: str | None = Field(None, description="Only entries after this one (from an earlier SelReport.last_id).")
    entries: str | None = Field(None, description="The SEL's entries path (RedfishInventory.sel_entries, "
                                "SelReport.entries_path); default: looked up from the system.")  # fmt: skip

    _entries_ok = field_validator("entries")(_redfish_path)


class RedfishHealth(StrictModel):
    power_state: str | None = None
    health: str | None = None
    health_rollup: str | None = None


# ---------------------------------------------------------------- errors


class BmcBusy(Exception):
    """A BMC's 503 or 429 (its session or request limit, or an outage), with the delay it asked for."""

    def __init__(self, status: int, retry_after: float | None, detail: str) -> None:
        super().__init__(f"HTTP {status}: {detail}")
        self.status, self.retry_after, self.detail = status, retry_after, detail


def _retry_after(value: str | None) -> float | None:
    """Retry-After in seconds (delta-seconds or an HTTP date), bounded so that a wrong clock cannot stall a call."""
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            seconds = (parsedate_to_datetime(value) - datetime.now(UTC)).total_seconds()
        except (TypeError, ValueError):
            return None
    return min(max(seconds, 0.0), _MAX_RETRY_AFTER)


def refuse_busy(response: Any) -> None:
    """sushy's response callback: a 503/429 ends the attempt with the BMC's Retry-After, before sushy's own
    retry (which would come back after a fixed second, ignoring what the BMC asked)."""
    if response.status_code not in (429, 503):
        return
    try:
        error = response.json().get("error", {})
        detail = next((i.get("MessageId") for i in error.get("@Message.ExtendedInfo", [])), None) or error["message"]
    except (ValueError, AttributeError, KeyError, TypeError):
        detail = response.reason or "busy"
    raise BmcBusy(response.status_code, _retry_after(response.headers.get("Retry-After")), str(detail))


def redfish_error(err: Exception, doing: str, bmc: BmcRef, trust: Trust) -> ApplicationError:
    """Classify an error from sushy or the HTTP client; the message never carries credentials."""
    where = f"{doing} on BMC {bmc}"
    tls_failure = trust.failure(err, where)
    if tls_failure is not None:
        return tls_failure
    if isinstance(err, BmcBusy):
        asked = f"; it asked to retry after {err.retry_after:g}s" if err.retry_after is not None else ""
        return ApplicationError(
            f"{where}: {err}{asked}", type="BmcUnavailable",
            next_retry_delay=timedelta(seconds=err.retry_after) if err.retry_after else None,
        )  # fmt: skip
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


# ---------------------------------------------------------------- one attempt's conversation


class _OneRead(JsonDataReader):
    """sushy's reader, keeping its one answer: sushy reads a system again before a PATCH only for the ETag that
    answer already carried (a fresh read is a new `ReadSystem`)."""

    answer: Any = None

    def get_data(self) -> Any:
        if self.answer is None:
            self.answer = super().get_data()
        return self.answer


class ReadSystem(System):
    """A sushy system read once."""

    def __init__(self, connector: Connector, path: str) -> None:
        ResourceBase.__init__(self, connector, path, reader=_OneRead())  # System's own __init__ only forwards


class Conversation:
    """One attempt's talk with one BMC: one connection (kept alive), authenticated by `BmcAuth`, and what it has
    read so far, so that nothing is asked twice."""

    def __init__(self, bmc: BmcRef, user: str, password: str, trust: Trust) -> None:
        self.bmc = bmc
        self.conn = Connector(
            bmc.url, verify=trust.for_requests(), response_callback=refuse_busy,
            server_side_retries=1, server_side_retries_delay=1,
            default_request_timeout=_READ_TIMEOUT, connect_timeout=_CONNECT_TIMEOUT,
        )  # fmt: skip
        self.auth = BmcAuth(bmc.url, self.conn, user, password)
        self._root: dict | None = None

    def close(self) -> None:
        self.auth.close()
        self.conn.close()

    def json(self, path: str) -> dict:
        return self.conn.get(path).json()

    @property
    def root(self) -> dict:
        if self._root is None:
            self._root = self.json(ROOT)
        return self._root

    def link(self, doc: dict, key: str) -> str | None:
        return (doc.get(key) or {}).get("@odata.id")

    def system_path(self) -> str:
        """The system's path: as given in BmcRef.system, else the BMC's only system (root and collection)."""
        if self.bmc.system:
            return self.bmc.system if self.bmc.system.startswith("/") else f"{ROOT}/Systems/{self.bmc.system}"
        systems = self.link(self.root, "Systems")
        if systems is None:
            raise ApplicationError(f"BMC {self.bmc} lists no Systems", type="RedfishRejected", non_retryable=True)
        members = sorted(m["@odata.id"] for m in self.json(systems).get("Members", []))
        if len(members) != 1:
            raise ApplicationError(
                f"BMC {self.bmc} has {len(members)} systems; name one in bmc.system ({', '.join(members[:5])})",
                type="RedfishRejected", non_retryable=True,
            )  # fmt: skip
        return members[0]

    def system(self, path: str | None = None) -> System:
        """A fresh read of the system (one GET)."""
        return ReadSystem(self.conn, path or self.system_path())

    def members(self, collection: str) -> list[dict]:
        """A collection's members, read in one request where the service root advertises ``$expand``."""
        expand = bool(((self.root.get("ProtocolFeaturesSupported") or {}).get("ExpandQuery") or {}).get("NoLinks"))
        listed = self.json(f"{collection}?$expand=.($levels=1)" if expand else collection).get("Members", [])
        # A member the answer left as a bare link (no expansion, or a BMC that expands partly) is read by itself.
        return [self.json(m["@odata.id"]) if set(m) == {"@odata.id"} else m for m in listed]

    def sel_entries(self, system: dict) -> str | None:
        """The path of the system's SEL entries (else of its first log), from its LogServices."""
        services = self.link(system, "LogServices")
        if services is None:
            raise ApplicationError(f"BMC {self.bmc} has no LogServices", type="RedfishRejected", non_retryable=True)
        logs = self.members(services)
        sel = next((log for log in logs if log.get("@odata.id", "").rstrip("/").endswith("SEL")),
                   logs[0] if logs else None)  # fmt: skip
        if sel is None:
            return None
        return self.link(sel, "Entries") or sel["@odata.id"].rstrip("/") + "/Entries"


# ---------------------------------------------------------------- activities


class RedfishActivities:
    def __init__(self, default_credentials: SecretRef | None = None, *, ca_bundle: str | None = None,
                 verify_tls: bool = True) -> None:  # fmt: skip
        """`ca_bundle` and `verify_tls`: the worker's defaults for every BMC (MILLWRIGHT_BMC_CA_BUNDLE,
        MILLWRIGHT_BMC_VERIFY_TLS)."""
        self.default_credentials = default_credentials
        self.ca_bundle, self.verify_tls = ca_bundle, verify_tls
        self._threads = ThreadPoolExecutor(max_workers=_THREADS, thread_name_prefix="redfish")

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

    @contextlib.asynccontextmanager
    async def _talk(self, bmc: BmcRef) -> AsyncIterator[Callable[[str, Callable[[Conversation], T]], Awaitable[T]]]:
        """One attempt's conversation: `ask(doing, fn)` runs a blocking part of it in a thread, mapping errors."""
        trust = self._trust(bmc)
        talk = Conversation(bmc, *self._user_password(bmc), trust)

        async def ask(doing: str, fn: Callable[[Conversation], T]) -> T:
            try:
                return await asyncio.get_running_loop().run_in_executor(self._threads, talk.auth.run, lambda: fn(talk))
            except ApplicationError:
                raise
            except Exception as err:
                raise redfish_error(err, doing, bmc, trust) from None

        try:
            yield ask
        finally:
            await asyncio.get_running_loop().run_in_executor(self._threads, talk.close)  # a logout is a request

    @activity.defn
    async def redfish_power(self, req: PowerRequest) -> PowerResult:
        """Bring the server to a power state and wait until the BMC reports it; no reset when it already is."""
        want = sushy.POWER_STATE_ON if req.state == "On" else sushy.POWER_STATE_OFF
        reset = sushy.RESET_ON if req.state == "On" else sushy.RESET_FORCE_OFF
        told = req.current is not None and req.current != req.state and req.bmc.system is not None
        told = told and activity.info().attempt == 1  # a retry reads first: an earlier reset may be landing

        def act(talk: Conversation) -> tuple[str, bool]:
            if told:  # the caller just read the other state: reset at the action's standard URI, no read
                path = talk.system_path()
                try:
                    talk.conn.post(f"{path}/Actions/ComputerSystem.Reset", data={"ResetType": reset.value})
                    return path, True
                except sushy_errors.HTTPError as err:
                    if err.status_code not in (400, 409):
                        raise  # else the state changed since it was read (or another target): read, as a retry does
            system = talk.system()
            if system.power_state == want:
                return system.path, False
            settling = {
                sushy.POWER_STATE_POWERING_ON: sushy.POWER_STATE_ON,
                sushy.POWER_STATE_POWERING_OFF: sushy.POWER_STATE_OFF,
            }.get(system.power_state)
            if settling != want:  # else an earlier attempt's reset is landing: do not send another
                system.reset_system(reset)
            return system.path, True

        async with self._talk(req.bmc) as ask:
            path, changed = await ask(f"powering {req.state.lower()}", act)
            deadline, pause = time.monotonic() + req.timeout_seconds, _POLL_SECONDS
            while changed:  # a reset never lands at once: look after a pause, one GET of the system per look
                await asyncio.sleep(pause)
                pause = min(pause * 2, _POLL_MAX_SECONDS)
                state = await ask("reading the power state", lambda talk: talk.json(path).get("PowerState"))
                if state == want.value:
                    break
                activity.heartbeat({"power_state": state, "want": req.state})
                if time.monotonic() > deadline:
                    # Retryable: the next attempt reads again and resets only if still needed.
                    raise ApplicationError(
                        f"BMC {req.bmc} still reports power {state!r} {req.timeout_seconds:.0f}s after asking "
                        f"for {req.state}", type="PowerStateTimeout",
                    )  # fmt: skip
        return PowerResult(state=req.state, changed=changed)

    @activity.defn
    async def redfish_set_boot(self, req: BootRequest) -> BootResult:
        """Set the boot source override, then read it back; no write when it is already set."""

        def run(talk: Conversation) -> BootResult:
            system = talk.system()
            boot = system.boot
            current = (_text(boot.target), _text(boot.enabled)) + ((_text(boot.mode),) if req.mode else ())
            wanted = (req.target, req.enabled) + ((req.mode,) if req.mode else ())
            if current == wanted:
                return BootResult(target=req.target, enabled=req.enabled, changed=False,
                                  power_state=_power_state(system))  # fmt: skip
            options: dict[str, Any] = {
                "target": sushy.BootSource(req.target),
                "enabled": sushy.BootSourceOverrideEnabled(req.enabled),
            }
            if req.mode:
                options["mode"] = sushy.BootSourceOverrideMode(req.mode)
            system.set_system_boot_options(**options)
            after = talk.system(system.path)
            if _text(after.boot.target) != req.target:
                raise ApplicationError(
                    f"BMC {req.bmc} accepted boot target {req.target} but reads back {_text(after.boot.target)}",
                    type="BootOverrideNotApplied",
                )  # fmt: skip
            return BootResult(target=req.target, enabled=_text(after.boot.enabled) or req.enabled, changed=True,
                              power_state=_power_state(after))  # fmt: skip

        async with self._talk(req.bmc) as ask:
            return await ask(f"setting boot override {req.target}/{req.enabled}", run)

    @activity.defn
    async def redfish_inventory(self, bmc: BmcRef) -> RedfishInventory:
        """Identity, health, firmware inventory, GPUs (processors of type GPU), and the paths later calls carry."""
        async with self._talk(bmc) as ask:
            return await ask("reading the inventory", _inventory)

    @activity.defn
    async def redfish_inventory_and_sel(self, bmc: BmcRef) -> RedfishInventory:
        """The inventory and the SEL's entries in one attempt on one connection (`sel`): what a burn-in reads
        before it touches the server, one activity instead of two."""

        def run(talk: Conversation) -> RedfishInventory:
            inv = _inventory(talk)
            if inv.sel_entries is not None:
                inv.sel = _sel(talk, inv.sel_entries)
            return inv

        async with self._talk(bmc) as ask:
            return await ask("reading the inventory and the SEL", run)

    @activity.defn
    async def redfish_sel(self, query: SelQuery) -> SelReport:
        """The system's SEL entries (after `after_id`), oldest first, read from `query.entries` when given. sushy
        has no LogService class, so the log is read as raw JSON through the same authenticated connection."""

        def run(talk: Conversation) -> SelReport:
            path = query.entries or talk.sel_entries(talk.system().json)
            return SelReport() if path is None else _sel(talk, path, query.after_id)

        async with self._talk(query.bmc) as ask:
            return await ask("reading the SEL", run)

    @activity.defn
    async def redfish_tray(self, bmc: BmcRef) -> TrayPlace:
        """Where the NVL72 tray sits in its rack (activities/redfish_trays.py)."""
        async with self._talk(bmc) as ask:
            return await ask("reading its tray's place", tray_place)

    @activity.defn
    async def redfish_health(self, bmc: BmcRef) -> RedfishHealth:
        def run(talk: Conversation) -> RedfishHealth:
            system = talk.system()
            status = system.status
            return RedfishHealth(power_state=_text(system.power_state), health=_text(status.health) if status else None,
                                 health_rollup=_text(status.health_rollup) if status else None)  # fmt: skip

        async with self._talk(bmc) as ask:
            return await ask("reading the health", run)


def _inventory(talk: Conversation) -> RedfishInventory:
    """Identity, health, firmware, GPUs and the SEL's path, read on one connection."""
    system = talk.system()
    status = system.status
    inv = RedfishInventory(system=system.path, manufacturer=system.manufacturer or "", model=system.model or "",
                           serial=system.serial_number or "", uuid=system.uuid or "",
                           power_state=_text(system.power_state), health=_text(status.health) if status else None,
                           health_rollup=_text(status.health_rollup) if status else None)  # fmt: skip
    updates = talk.link(talk.root, "UpdateService")
    firmware = talk.link(talk.json(updates), "FirmwareInventory") if updates else None
    if firmware:  # else a BMC without a firmware inventory: the baseline check says so
        inv.firmware = {fw["Id"]: fw.get("Version") or "" for fw in talk.members(firmware)}
    processors = talk.link(system.json, "Processors")
    for p in talk.members(processors) if processors else []:
        if p.get("ProcessorType") == "GPU":
            inv.gpus.append(RedfishGpu(id=p["Id"], model=p.get("Model") or "", serial=p.get("SerialNumber") or "",
                                       uuid=p.get("UUID") or "", health=(p.get("Status") or {}).get("Health")))  # fmt: skip
    if talk.link(system.json, "LogServices"):
        inv.sel_entries = talk.sel_entries(system.json)
    return inv


def _sel(talk: Conversation, path: str, after_id: str | None = None) -> SelReport:
    """The SEL's entries at `path` (after `after_id`), oldest first, at most _MAX_SEL_ENTRIES kept."""
    raw = talk.json(path).get("Members", [])
    entries = [SelEntry(id=str(e.get("Id")), created=e.get("Created"), severity=e.get("Severity") or "OK",
                        message=e.get("Message") or "", message_id=e.get("MessageId") or "")
               for e in raw]  # fmt: skip
    last_id = entries[-1].id if entries else after_id
    if after_id is not None:
        ids = [e.id for e in entries]
        # An ID no longer in the log means it was cleared: everything there now is new.
        entries = entries[ids.index(after_id) + 1 :] if after_id in ids else entries
    truncated = max(0, len(entries) - _MAX_SEL_ENTRIES)
    if truncated:  # keep the criticals (the evidence), then the newest, in log order
        keep = sorted(range(len(entries)), key=lambda i: (entries[i].severity != "Critical", -i))
        entries = [entries[i] for i in sorted(keep[:_MAX_SEL_ENTRIES])]
    return SelReport(entries=entries, last_id=last_id, truncated=truncated, entries_path=path)


def _power_state(system: System) -> PowerState | None:
    state = _text(system.power_state)
    return "On" if state == "On" else "Off" if state == "Off" else None  # a transition tells no caller anything
