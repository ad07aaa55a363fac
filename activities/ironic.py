"""OpenStack Ironic activities for burn-in: read a node, set its ``agent_burnin_*`` settings, manage it,
run a manual clean and wait for it, over Ironic's REST API (httpx).

Each activity reads before it writes, so a retry after a crash at any line does not do anything twice:
``ironic_set_driver_info`` patches only the keys whose value differs; ``ironic_manage`` does nothing on a
node already manageable (and only waits on one already on its way there); ``ironic_start_clean`` starts a
clean only from ``manageable``, and a retry that finds the same steps already cleaning (or, through the
node's history, already run since this activity was scheduled) does not start them again.
``ironic_wait_clean`` polls with heartbeats that carry the provision state and the current clean step.

IPA's burn-in steps (``deploy.burnin_cpu`` ... ``burnin_network``) take no step arguments: they read
their settings from the node's ``driver_info`` (``agent_burnin_*``). `BurnInStep` knows the steps and
their keys and validates both at the edge; `BurnInStep.driver_info()` and `.clean_step()` give what
``ironic_set_driver_info`` and ``ironic_start_clean`` take.

Settings: ``MILLWRIGHT_IRONIC_URL`` (Ironic's root, e.g. ``http://ironic:6385``) and, unless Ironic runs
with ``noauth``, ``MILLWRIGHT_IRONIC_TOKEN``: a secret reference (``env:NAME`` / ``file:/path``) to a
Keystone token sent as ``X-Auth-Token``, resolved inside each attempt and never in an input, output or
error. The HTTP client never retries; Temporal's retry policy does. TLS: Ironic's certificate is verified
against the default CAs, or the CA bundle of ``MILLWRIGHT_IRONIC_CA_BUNDLE``;
``MILLWRIGHT_IRONIC_VERIFY_TLS=false`` turns verification off (activities/support/tls.py); a certificate the worker
does not trust, or one issued for another name, is a non-retryable ``TlsVerificationFailed``.

Errors: 404 → ``IronicNotFound``; 401/403 → ``IronicAuth``; other 4xx except 409/429 → ``IronicRejected``
(all non-retryable, with Ironic's own faultstring); 409 (node locked), 429, 5xx, timeouts and connection
errors → ``IronicUnavailable`` (retryable); a clean that ends in ``clean failed`` → ``IronicCleanFailed``
(non-retryable; ``last_error`` in the message and the details); no settings → ``IronicNotConfigured``.
Also non-retryable: ``IronicWrongState`` (cleaning asked of a node not manageable, or waited on a node not
cleaning), ``IronicNodeBusy`` (already cleaning with other steps), ``IronicManageFailed`` (verification
failed), ``IronicTimeout`` / ``IronicCleanTimeout`` (the request's timeout_seconds passed; the clean goes on).
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any, ClassVar, Literal
from urllib.parse import quote

import httpx
from pydantic import ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.models import BaseUrl, Host, StrictModel
from activities.support.secrets import SecretError, SecretRef
from activities.support.tls import TlsFix, Trust, TrustingClient, ca_bundle_ref

USER_AGENT = "millwright-worker"
API_VERSION_HEADER = "X-OpenStack-Ironic-API-Version"
# 1.78: node history (used to recognise a clean this activity already ran); clean_steps since 1.15,
# disable_ramdisk since 1.70. Any Ironic since Yoga (2022) speaks it.
API_VERSION = "1.78"
_REQUEST_TIMEOUT = 10.0

# Provision states (Ironic's ironic/common/states.py).
MANAGEABLE = "manageable"
ENROLL = "enroll"
CLEANING = "cleaning"
CLEAN_WAIT = "clean wait"
CLEAN_FAILED = "clean failed"
CLEAN_HOLD = "clean hold"
CLEANING_STATES = frozenset({CLEANING, CLEAN_WAIT, CLEAN_HOLD})
# States Ironic leaves by itself: a node in one of them is on its way somewhere.
TRANSIENT_STATES = frozenset({
    "verifying", CLEANING, CLEAN_WAIT, "inspecting", "inspect wait", "deploying", "wait call-back", "deleting",
    "adopting", "rescuing", "rescue wait", "unrescuing", "servicing", "service wait", "unservicing",
})  # fmt: skip

# Interfaces that may carry clean steps (Ironic's ironic/conductor/steps.py CLEANING_INTERFACE_PRIORITY).
CleanInterface = Literal["deploy", "bios", "management", "power", "raid", "vendor", "firmware"]
_STEP_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_NODE_IDENT = re.compile(r"^[^/\s]{1,255}$")


def _node_ident(value: str) -> str:
    value = value.strip() if isinstance(value, str) else value
    if not isinstance(value, str) or not _NODE_IDENT.match(value):
        raise ValueError(f"{value!r} is not an Ironic node name or UUID (1-255 characters, no '/' or spaces)")
    return value


# ---------------------------------------------------------------- IPA burn-in steps

BurnInStepName = Literal["burnin_cpu", "burnin_memory", "burnin_disk", "burnin_gpu", "burnin_network"]


class _Settings(StrictModel):
    model_config = ConfigDict(populate_by_name=True)
    prefix: ClassVar[str] = ""

    @classmethod
    def setting_keys(cls) -> dict[str, str]:
        """Setting name -> the driver_info key IPA reads."""
        return {name: f"{cls.prefix}{field.alias or name}" for name, field in cls.model_fields.items()}

    def driver_info(self) -> dict[str, Any]:
        """The ``agent_burnin_*`` driver_info keys for the settings given (unset ones keep IPA's defaults)."""
        return {
            key: getattr(self, name) for name, key in self.setting_keys().items() if getattr(self, name) is not None
        }


class CpuBurnIn(_Settings):
    """``stress-ng --cpu N --timeout T`` (IPA ``burnin_cpu``)."""

    prefix: ClassVar[str] = "agent_burnin_cpu_"
    cpu: int | None = Field(None, ge=0, description="Workers; 0 = one per CPU (IPA's default).")
    timeout: int | None = Field(None, gt=0, description="Seconds (IPA's default 86400).")
    outputfile: str | None = Field(None, min_length=1)


class MemoryBurnIn(_Settings):
    """``stress-ng --vm N --vm-bytes B --timeout T`` (IPA ``burnin_memory``)."""

    prefix: ClassVar[str] = "agent_burnin_vm_"
    vm: int | None = Field(None, ge=0, description="Workers; 0 = one per CPU.")
    vm_bytes: str | None = Field(
        None,
        alias="vm-bytes",
        pattern=r"^(\d+%|\d+[bBkKmMgGtT]?)$",
        description="Per worker: '98%' (IPA's default) or a size like '4G'.",
    )
    timeout: int | None = Field(None, gt=0)
    outputfile: str | None = Field(None, min_length=1)


class DiskBurnIn(_Settings):
    """``fio`` read/write with crc32c verify on every block device (IPA ``burnin_disk``)."""

    prefix: ClassVar[str] = "agent_burnin_fio_disk_"
    loops: int | None = Field(None, ge=1, description="IPA's default 4.")
    runtime: int | None = Field(None, ge=0, description="Seconds; 0 = run the loops.")
    outputfile: str | None = Field(None, min_length=1)
    smart_test: bool | None = Field(None, description="Run `smartctl -t long` after fio and fail on errors.")


class NetworkPartner(StrictModel):
    role: Literal["writer", "reader"]
    partner: Host = Field(description="The other node's address (host name or IP).")


class NetworkBurnIn(_Settings):
    """``fio`` net engine between two nodes, static pair (``config``) or paired through tooz (IPA ``burnin_network``)."""

    prefix: ClassVar[str] = "agent_burnin_fio_network_"
    runtime: int | None = Field(None, gt=0, description="Seconds per direction (IPA's default 21600).")
    config: NetworkPartner | None = None
    pairing_backend_url: str | None = Field(None, min_length=1)
    pairing_group_name: str | None = Field(None, min_length=1)
    pairing_timeout: int | None = Field(None, gt=0)
    outputfile: str | None = Field(None, min_length=1)

    @model_validator(mode="after")
    def _pairing(self) -> NetworkBurnIn:
        if self.config is None and not self.pairing_backend_url:
            raise ValueError("give config {role, partner} or pairing_backend_url (IPA fails the step without either)")
        return self

    def driver_info(self) -> dict[str, Any]:
        out = super().driver_info()
        if self.config is not None:
            out[f"{self.prefix}config"] = self.config.model_dump()
        return out


class GpuBurnIn(_Settings):
    """``gpu_burn -l`` (count check when ``count`` > 0), then ``gpu_burn -m MEM T`` (IPA ``burnin_gpu``)."""

    prefix: ClassVar[str] = "agent_burnin_gpu_"
    install_dir: str | None = Field(None, min_length=1, description="IPA's default /opt/gpu-burn.")
    count: int | None = Field(None, ge=0, description="Expected GPUs; 0 = no count check.")
    memory: str | int | None = Field(None, description="'95%' (IPA's default) or MB as a whole number.")
    timeout: int | None = Field(None, gt=0)

    @field_validator("memory")
    @classmethod
    def _memory(cls, value: str | int | None) -> str | int | None:
        if isinstance(value, str) and not re.fullmatch(r"([1-9]\d?|100)%", value):
            raise ValueError("a percentage of GPU memory like '95%' (1-100%), or MB as a whole number")
        if isinstance(value, int) and value <= 0:
            raise ValueError("MB must be positive")
        return value


BURNIN_SETTINGS: dict[str, type[_Settings]] = {
    "burnin_cpu": CpuBurnIn,
    "burnin_memory": MemoryBurnIn,
    "burnin_disk": DiskBurnIn,
    "burnin_gpu": GpuBurnIn,
    "burnin_network": NetworkBurnIn,
}


def burnin_driver_info_keys(step: str) -> list[str]:
    """Every ``driver_info`` key IPA reads for this burn-in step."""
    return list(BURNIN_SETTINGS[step].setting_keys().values())


class CleanStep(StrictModel):
    """One manual clean step as Ironic takes it. IPA's burn-in steps are ``deploy`` steps without args."""

    interface: CleanInterface
    step: str = Field(min_length=1, max_length=255)
    args: dict[str, Any] = Field(default_factory=dict)

    @field_validator("step")
    @classmethod
    def _step(cls, value: str) -> str:
        if not _STEP_NAME.match(value):
            raise ValueError(f"{value!r} is not a step name (a Python identifier such as 'erase_devices_metadata')")
        return value

    @model_validator(mode="after")
    def _burnin(self) -> CleanStep:
        if self.step.startswith("burnin_"):
            if self.step not in BURNIN_SETTINGS:
                raise ValueError(
                    f"step: {self.step!r} is not an IPA burn-in step (one of {', '.join(BURNIN_SETTINGS)})"
                )
            if self.interface != "deploy":
                raise ValueError(f"interface: IPA's {self.step} is a 'deploy' step, not {self.interface!r}")
            if self.args:
                raise ValueError(
                    f"args: IPA's {self.step} takes no arguments (Ironic would fail the clean with 'unexpected "
                    f"arguments'); its settings live in driver_info ({', '.join(burnin_driver_info_keys(self.step))})"
                )
        return self

    def to_ironic(self) -> dict[str, Any]:
        out: dict[str, Any] = {"interface": self.interface, "step": self.step}
        if self.args:
            out["args"] = self.args
        return out


class BurnInStep(StrictModel):
    """One IPA burn-in step with its settings (short names: ``timeout``, not ``agent_burnin_cpu_timeout``).

    ``BurnInStep(step="burnin_gpu", settings={"count": 8, "timeout": 3600})``: ``.driver_info()`` gives
    ``{"agent_burnin_gpu_count": 8, "agent_burnin_gpu_timeout": 3600}``, ``.clean_step()`` the step.
    """

    step: BurnInStepName
    settings: dict[str, Any] = Field(default_factory=dict, validate_default=True)

    @field_validator("settings")
    @classmethod
    def _settings(cls, value: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        step = info.data.get("step")
        if step is None:  # the step itself was refused; that error says so
            return value
        try:
            parsed = BURNIN_SETTINGS[step].model_validate(value)
        except ValidationError as err:
            problems = "; ".join(
                f"settings.{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" if e["loc"] else f"settings: {e['msg']}"
                for e in err.errors()
            )  # fmt: skip
            known = ", ".join(f.alias or n for n, f in BURNIN_SETTINGS[step].model_fields.items())
            raise ValueError(f"{step}: {problems} (its settings: {known})") from None
        return parsed.model_dump(by_alias=True, exclude_none=True)

    def driver_info(self) -> dict[str, Any]:
        return BURNIN_SETTINGS[self.step].model_validate(self.settings).driver_info()

    def clean_step(self) -> CleanStep:
        return CleanStep(interface="deploy", step=self.step)


class BurnInPlan(StrictModel):
    """Burn-in steps in the order they run; each step at most once."""

    steps: list[BurnInStep] = Field(min_length=1)

    @field_validator("steps")
    @classmethod
    def _unique(cls, steps: list[BurnInStep]) -> list[BurnInStep]:
        seen = [s.step for s in steps]
        twice = sorted({s for s in seen if seen.count(s) > 1})
        if twice:
            raise ValueError(f"each burn-in step at most once; repeated: {', '.join(twice)}")
        return steps

    def driver_info(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for step in self.steps:
            out.update(step.driver_info())
        return out

    def clean_steps(self) -> list[CleanStep]:
        return [s.clean_step() for s in self.steps]


# ---------------------------------------------------------------- activity models


class IronicConfig(StrictModel):
    """Where Ironic is and where its token is kept (None: Ironic runs with noauth)."""

    url: BaseUrl
    token: SecretRef | None = None
    timeout_seconds: float = _REQUEST_TIMEOUT
    poll_seconds: float = Field(10.0, gt=0, description="Between two reads of a node while waiting.")
    api_version: str = API_VERSION
    ca_bundle: str | None = Field(None, description="CA bundle reference (file:/path/to/ca.pem) for Ironic's "
                                                    "certificate; default: the default CAs")  # fmt: skip
    verify_tls: bool = True

    _ca_bundle_ok = field_validator("ca_bundle")(ca_bundle_ref)


class NodeRef(StrictModel):
    node: str = Field(description="Ironic node name or UUID.")
    _n = field_validator("node")(_node_ident)


class IronicNode(StrictModel):
    uuid: str
    name: str | None = None
    provision_state: str
    target_provision_state: str | None = None
    power_state: str | None = None
    maintenance: bool = False
    last_error: str | None = None
    clean_step: dict[str, Any] = Field(default_factory=dict, description="The step running now; {} between steps.")

    @classmethod
    def from_api(cls, body: dict[str, Any]) -> IronicNode:
        return cls(
            uuid=body["uuid"], name=body.get("name"), provision_state=body.get("provision_state") or "",
            target_provision_state=body.get("target_provision_state"), power_state=body.get("power_state"),
            maintenance=bool(body.get("maintenance")), last_error=body.get("last_error") or None,
            clean_step=body.get("clean_step") or {},
        )  # fmt: skip


class DriverInfoUpdate(NodeRef):
    """driver_info keys to set; a value of None removes the key."""

    values: dict[str, Any] = Field(min_length=1)

    @field_validator("values")
    @classmethod
    def _keys(cls, values: dict[str, Any]) -> dict[str, Any]:
        bad = [k for k in values if not k or not k.strip()]
        if bad:
            raise ValueError("driver_info keys must be non-empty")
        return values


class DriverInfoResult(StrictModel):
    node: str = Field(description="The node's UUID.")
    changed: list[str] = Field(default_factory=list, description="Keys this attempt set or removed.")
    unchanged: list[str] = Field(default_factory=list, description="Keys that already had the value.")


class ManageRequest(NodeRef):
    timeout_seconds: float = Field(600.0, gt=0)
    poll_seconds: float | None = Field(None, gt=0, description="Default: the worker's IronicConfig.poll_seconds.")


class ManageResult(StrictModel):
    node: IronicNode
    changed: bool = Field(description="False when the node was already manageable (or on its way there).")


class StartClean(NodeRef):
    steps: list[CleanStep] = Field(min_length=1)
    disable_ramdisk: bool | None = Field(None, description="Run the steps without booting IPA (Ironic >= 1.70).")


class CleanStarted(StrictModel):
    node: IronicNode
    started: bool = Field(description="True when this attempt asked Ironic to clean.")
    already: Literal["running", "finished"] | None = Field(
        None, description="A retry found these steps already cleaning, or already run since the activity was scheduled."
    )


class WaitClean(NodeRef):
    timeout_seconds: float = Field(gt=0, description="How long the clean may take in all.")
    poll_seconds: float | None = Field(None, gt=0, description="Default: the worker's IronicConfig.poll_seconds.")


class CleanResult(StrictModel):
    node: IronicNode
    waited_seconds: float


# ---------------------------------------------------------------- errors


def fault_message(response: httpx.Response) -> str:
    """Ironic's own message: {"error_message": "{\\"faultstring\\": ...}"} (a JSON string inside JSON)."""
    try:
        body = response.json()
    except ValueError:
        return response.text.strip()[:500]
    if isinstance(body, dict):
        inner = body.get("error_message", body)
        if isinstance(inner, str):
            try:
                inner = json.loads(inner)
            except ValueError:
                return inner.strip()[:500]
        if isinstance(inner, dict):
            return str(inner.get("faultstring") or inner.get("message") or inner).strip()[:500]
    return str(body)[:500]


IRONIC_TLS_FIX = TlsFix(ca="MILLWRIGHT_IRONIC_CA_BUNDLE", off="MILLWRIGHT_IRONIC_VERIFY_TLS=false")


def ironic_error(response: httpx.Response, doing: str) -> ApplicationError:
    status = response.status_code
    message = f"{doing}: Ironic answered {status}: {fault_message(response)}"
    if status in (409, 429) or status >= 500:
        return ApplicationError(message, type="IronicUnavailable")
    if status in (401, 403):
        return ApplicationError(message, type="IronicAuth", non_retryable=True)
    if status == 404:
        return ApplicationError(message, type="IronicNotFound", non_retryable=True)
    return ApplicationError(message, type="IronicRejected", non_retryable=True)


def _same_steps(running: list[dict[str, Any]], wanted: list[CleanStep]) -> bool:
    have = [(s.get("interface"), s.get("step"), s.get("args") or {}) for s in running]
    return have == [(s.interface, s.step, s.args) for s in wanted]


def _pointer(key: str) -> str:
    return "/driver_info/" + key.replace("~", "~0").replace("/", "~1")


# ---------------------------------------------------------------- activities


class IronicActivities:
    """Ironic node activities. With no config every activity fails with IronicNotConfigured."""

    def __init__(self, config: IronicConfig | None) -> None:
        self._config = config

    def activities(self) -> list[Callable]:
        return [self.ironic_get_node, self.ironic_set_driver_info, self.ironic_manage, self.ironic_start_clean,
                self.ironic_wait_clean]  # fmt: skip

    async def close(self) -> None:  # a Registration resource; clients are per call
        return None

    # ------------------------------------------------------------ plumbing

    def _client(self) -> TrustingClient:
        if self._config is None:
            raise ApplicationError(
                "Ironic is not configured on this worker: set MILLWRIGHT_IRONIC_URL (and MILLWRIGHT_IRONIC_TOKEN, "
                "a secret reference env:NAME or file:/path, unless Ironic runs with noauth)",
                type="IronicNotConfigured",
                non_retryable=True,
            )
        headers = {"User-Agent": USER_AGENT, "Accept": "application/json", API_VERSION_HEADER: self._config.api_version}
        if self._config.token is not None:
            try:
                headers["X-Auth-Token"] = self._config.token.resolve()
            except SecretError as err:
                raise ApplicationError(f"Ironic token: {err}", type="IronicNotConfigured", non_retryable=True) from None
        trust = Trust.resolve(IRONIC_TLS_FIX, verify=self._config.verify_tls, ca_bundle=self._config.ca_bundle,
                              setting="MILLWRIGHT_IRONIC_CA_BUNDLE")  # fmt: skip
        return TrustingClient(trust, base_url=self._config.url.rstrip("/") + "/v1", headers=headers,
                              timeout=self._config.timeout_seconds)  # fmt: skip

    async def _call(self, client: TrustingClient, method: str, path: str, doing: str, **kw: Any) -> Any:
        assert self._config is not None  # the client came from _client(), which refuses a worker without one
        try:
            response = await client.request(method, path, **kw)
        except httpx.HTTPError as err:
            tls_failure = client.trust.failure(err, f"{doing}: Ironic {self._config.url}")
            if tls_failure is not None:
                raise tls_failure from None
            # Never the request itself: its headers hold the token.
            raise ApplicationError(f"{doing}: connection failed: {type(err).__name__}",
                                   type="IronicUnavailable") from None  # fmt: skip
        if response.status_code >= 300:
            raise ironic_error(response, doing)
        try:
            return response.json() if response.content else {}
        except ValueError:
            raise ApplicationError(f"{doing}: not an Ironic answer (status {response.status_code})",
                                   type="IronicUnavailable") from None  # fmt: skip

    async def _node_body(self, client: TrustingClient, node: str) -> dict[str, Any]:
        return await self._call(client, "GET", f"/nodes/{quote(node, safe='')}", f"reading node {node}")

    async def _node(self, client: TrustingClient, node: str) -> IronicNode:
        return IronicNode.from_api(await self._node_body(client, node))

    async def _provision(self, client: TrustingClient, node: str, body: dict[str, Any], doing: str) -> None:
        await self._call(client, "PUT", f"/nodes/{quote(node, safe='')}/states/provision", doing, json=body)

    def _poll(self, requested: float | None) -> float:
        assert self._config is not None
        return requested or self._config.poll_seconds

    def _after_write(self, what: str) -> None:
        """Called after each write. A no-op; tests override it to crash an attempt mid-activity."""

    # ------------------------------------------------------------ reads

    @activity.defn
    async def ironic_get_node(self, ref: NodeRef) -> IronicNode:
        """The node's provision/power state, maintenance flag, last error and current clean step."""
        async with self._client() as client:
            return await self._node(client, ref.node)

    # ------------------------------------------------------------ writes

    @activity.defn
    async def ironic_set_driver_info(self, req: DriverInfoUpdate) -> DriverInfoResult:
        """JSON-patch only the driver_info keys whose value differs (None removes a key)."""
        async with self._client() as client:
            body = await self._node_body(client, req.node)
            have: dict[str, Any] = body.get("driver_info") or {}
            ops: list[dict[str, Any]] = []
            result = DriverInfoResult(node=body["uuid"])
            for key, value in req.values.items():
                if value is None:
                    if key in have:
                        ops.append({"op": "remove", "path": _pointer(key)})
                        result.changed.append(key)
                    else:
                        result.unchanged.append(key)
                elif key in have and have[key] == value:
                    result.unchanged.append(key)
                else:
                    ops.append({"op": "replace" if key in have else "add", "path": _pointer(key), "value": value})
                    result.changed.append(key)
            if ops:
                await self._call(client, "PATCH", f"/nodes/{body['uuid']}", f"setting driver_info on node {req.node}",
                                 json=ops)  # fmt: skip
                self._after_write(f"driver_info {req.node}")
            return result

    @activity.defn
    async def ironic_manage(self, req: ManageRequest) -> ManageResult:
        """Bring the node to ``manageable`` (from enroll, available, clean failed, ...), waiting with heartbeats.

        Already manageable: nothing is sent. On its way to manageable (verifying, cleaning back to
        manageable): only waits. Verification that fails (back in enroll with last_error) is
        non-retryable ``IronicManageFailed``; Ironic refusing the verb is ``IronicRejected``.
        """
        poll = self._poll(req.poll_seconds)
        deadline = time.monotonic() + req.timeout_seconds
        changed = False
        async with self._client() as client:
            node = await self._node(client, req.node)
            while True:
                state = node.provision_state
                if state == MANAGEABLE and not node.target_provision_state:
                    return ManageResult(node=node, changed=changed)
                if state not in TRANSIENT_STATES:  # settled somewhere else: ask (once)
                    if changed:
                        # Ironic takes the verb synchronously (the state moves before its 202): settling
                        # anywhere but manageable after it (enroll after a failed verify) is a failure.
                        raise ApplicationError(
                            f"node {req.node} did not become manageable: it is {state}"
                            + (f" ({node.last_error})" if node.last_error else ""),
                            {"node": node.uuid, "provision_state": state, "last_error": node.last_error},
                            type="IronicManageFailed", non_retryable=True,
                        )  # fmt: skip
                    await self._provision(client, node.uuid, {"target": "manage"}, f"managing node {req.node}")
                    self._after_write(f"manage {req.node}")
                    changed = True
                else:  # on its way somewhere (verifying, or a clean heading back to manageable): wait
                    activity.heartbeat({"provision_state": state,
                                        "target_provision_state": node.target_provision_state})  # fmt: skip
                    if time.monotonic() > deadline:
                        raise ApplicationError(
                            f"node {req.node} not manageable after {req.timeout_seconds:.0f}s (it is {state})",
                            {"node": node.uuid, "provision_state": state},
                            type="IronicTimeout", non_retryable=True,
                        )  # fmt: skip
                    await asyncio.sleep(poll)
                node = await self._node(client, node.uuid)

    @activity.defn
    async def ironic_start_clean(self, req: StartClean) -> CleanStarted:
        """Start a manual clean with these steps; only from ``manageable``.

        A node already cleaning with the same steps is left alone (``already="running"``); one
        cleaning with other steps is ``IronicNodeBusy``. On a retry, a node back in manageable (or in
        clean failed) whose history shows these steps started since the activity was scheduled is
        not cleaned again (``already="finished"``): ``ironic_wait_clean`` then reports the outcome.
        """
        async with self._client() as client:
            body = await self._node_body(client, req.node)
            node = IronicNode.from_api(body)
            state = node.provision_state
            if state in CLEANING_STATES:
                running = (body.get("driver_internal_info") or {}).get("clean_steps")
                if running is None or _same_steps(running, req.steps):
                    return CleanStarted(node=node, started=False, already="running")
                raise ApplicationError(
                    f"node {req.node} is already cleaning with other steps: "
                    + ", ".join(f"{s.get('interface')}.{s.get('step')}" for s in running),
                    {"node": node.uuid, "clean_steps": running},
                    type="IronicNodeBusy", non_retryable=True,
                )  # fmt: skip
            retry = activity.info().attempt > 1
            if retry and state in (MANAGEABLE, CLEAN_FAILED) and await self._ran_since_scheduled(client, node, req):
                return CleanStarted(node=node, started=False, already="finished")
            if state != MANAGEABLE:
                raise ApplicationError(
                    f"node {req.node} is {state}: manual cleaning starts only from manageable (run ironic_manage first)",
                    {"node": node.uuid, "provision_state": state},
                    type="IronicWrongState", non_retryable=True,
                )  # fmt: skip
            payload: dict[str, Any] = {"target": "clean", "clean_steps": [s.to_ironic() for s in req.steps]}
            if req.disable_ramdisk is not None:
                payload["disable_ramdisk"] = req.disable_ramdisk
            steps = ", ".join(f"{s.interface}.{s.step}" for s in req.steps)
            await self._provision(client, node.uuid, payload, f"starting clean ({steps}) on node {req.node}")
            self._after_write(f"clean {req.node}")
            return CleanStarted(node=await self._node(client, node.uuid), started=True)

    async def _ran_since_scheduled(self, client: TrustingClient, node: IronicNode, req: StartClean) -> bool:
        """Whether the node's history has a manual clean with these steps started since this activity was scheduled."""
        try:
            history = await self._call(client, "GET", f"/nodes/{node.uuid}/history", f"reading node {req.node} history")
        except ApplicationError:
            return False  # no history (disabled, or an older Ironic): clean again rather than skip a clean
        since = activity.info().scheduled_time
        if since.tzinfo is None:
            since = since.replace(tzinfo=timezone.utc)
        wanted = [f"'step': '{s.step}'" for s in req.steps]
        for event in history.get("history") or []:
            text = str(event.get("event") or "")
            if not text.startswith("Starting manual cleaning"):
                continue
            try:
                created = datetime.fromisoformat(str(event.get("created_at")))
            except ValueError:
                continue
            if created.tzinfo is not None and created >= since and _in_order(text, wanted):
                return True
        return False

    @activity.defn
    async def ironic_wait_clean(self, req: WaitClean) -> CleanResult:
        """Poll until the clean ends: back in ``manageable`` is success; ``clean failed`` is IronicCleanFailed.

        Heartbeats carry the provision state and the current clean step. A node that is back in
        manageable but keeps a last_error (it failed, and was then managed) is a failure too.
        """
        poll = self._poll(req.poll_seconds)
        started = time.monotonic()
        async with self._client() as client:
            while True:
                node = await self._node(client, req.node)
                state = node.provision_state
                activity.heartbeat({"provision_state": state, "clean_step": node.clean_step,
                                    "maintenance": node.maintenance})  # fmt: skip
                details = {"node": node.uuid, "provision_state": state, "last_error": node.last_error}
                if state == CLEAN_FAILED or (state == MANAGEABLE and node.last_error):
                    raise ApplicationError(
                        f"clean of node {req.node} failed: {node.last_error or 'no last_error recorded'}", details,
                        type="IronicCleanFailed", non_retryable=True,
                    )  # fmt: skip
                if state == MANAGEABLE:
                    return CleanResult(node=node, waited_seconds=round(time.monotonic() - started, 3))
                if state not in CLEANING_STATES:
                    raise ApplicationError(
                        f"node {req.node} is {state}, not cleaning (was the clean started?)", details,
                        type="IronicWrongState", non_retryable=True,
                    )  # fmt: skip
                if time.monotonic() - started > req.timeout_seconds:
                    raise ApplicationError(
                        f"clean of node {req.node} still {state} after {req.timeout_seconds:.0f}s "
                        f"(step {node.clean_step.get('interface')}.{node.clean_step.get('step')})",
                        {**details, "clean_step": node.clean_step},
                        type="IronicCleanTimeout", non_retryable=True,
                    )  # fmt: skip
                await asyncio.sleep(poll)


def _in_order(text: str, needles: list[str]) -> bool:
    at = 0
    for needle in needles:
        at = text.find(needle, at)
        if at < 0:
            return False
        at += len(needle)
    return True
