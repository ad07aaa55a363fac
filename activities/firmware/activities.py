"""Firmware activities against a server's BMC: read the firmware inventory, start an update (Redfish
``UpdateService.SimpleUpdate``, or with `push` the image fetched here and sent in a ``MultipartHttpPushUri`` push
where the BMC offers one), follow its Task, and activate what waits for a reset or an AC power cycle.

They build on `RedfishActivities` (activities/redfish.py): credentials as a secret reference resolved inside the
attempt (never in an input, output, heartbeat or error), the same TLS trust, threads and error classification; one
sushy root per BMC conversation (`_converse`), with sushy's own retries turned down so Temporal's policy owns them. sushy reads the inventory; the update action, its Task and the chassis reset are plain
Redfish through sushy's authenticated connector, because sushy sends no apply time and waits on a Task wrongly
(it treats the Task URI as a monitor, and a Task answers 200 while it runs).

Idempotency: `start_firmware_update` reads the inventory first (every target already at the version: nothing to
do; an older version wanted: refused unless allowed) and finds a task an earlier attempt started for the same image
and targets (still running, or completed with the image staged awaiting activation) before starting another.
`follow_firmware_task` only reads. `activate_firmware` resets only while the versions are not active and no power
change is landing, so a retry does not reset twice.

A BMC that restarts itself to activate its own firmware stops answering, then answers again with its tasks gone
(../shared/reference/lifecycle-apis.md §1.6, §1.8): following the task waits that out, then decides from the
inventory's ``Version``. Errors a retry cannot fix are non-retryable: ``FirmwareUpdateFailed`` (the task ended in
Exception, Killed or Cancelled; the message is the BMC's), ``FirmwareDowngradeRefused``, ``FirmwareComponentUnknown``,
``FirmwareImageTooLarge`` and ``FirmwareImageUnavailable`` (a push's image; a 5xx is retried), ``FirmwareTaskLost``,
``FirmwareTaskTimeout`` (the task ran past `timeout_seconds`, default an hour) and
``FirmwareNotActivated`` (the versions did not become active within `timeout_seconds` of the reset).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import urljoin, urlparse

import httpx
import sushy
from sushy import exceptions as sushy_errors
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.firmware.models import (
    Activated,
    Activation,
    FirmwareVersions,
    TaskFollow,
    TaskOutcome,
    UpdateStart,
    UpdateStarted,
)
from activities.firmware.versions import refused
from activities.models import SystemIdentity
from activities.redfish import BmcRef, RedfishActivities, redfish_error
from activities.redfish_auth import BmcAuth

T = TypeVar("T")
_CONNECT_TIMEOUT, _READ_TIMEOUT = 5.0, 20.0
_IMAGE_READ_TIMEOUT = 300.0  # an image of some hundred MB, fetched and pushed
_POLL_SECONDS = 0.5  # tasks take minutes on real BMCs; the lab's take a second
_ENDED = ("Completed", "Exception", "Killed", "Cancelled")
_UNREACHABLE = (sushy_errors.ConnectionError, sushy_errors.ServerSideError)


def _versions(root: sushy.Sushy) -> dict[str, str]:
    return {fw.identity: fw.version or "" for fw in root.get_update_service().firmware_inventory.get_members()}


def _inventory_paths(root: sushy.Sushy) -> dict[str, str]:
    return {fw.identity: fw.path for fw in root.get_update_service().firmware_inventory.get_members()}


def _messages(task: dict) -> list[str]:
    return [str(m.get("Message") or m.get("MessageId")) for m in task.get("Messages") or []]


def _filename(uri: str) -> str:
    return urlparse(uri).path.rsplit("/", 1)[-1] or "image.bin"


def _differs(have: dict[str, str], want: dict[str, str]) -> dict[str, str]:
    return {k: have.get(k, "(missing)") for k, v in want.items() if have.get(k) != v}


class FirmwareActivities(RedfishActivities):
    async def _converse(self, doing: str, bmc: BmcRef, fn: Callable[[sushy.Sushy], T]) -> T:
        """`fn` on a fresh sushy root of the BMC, in a thread of the Redfish activities, its errors classified."""
        trust = self._trust(bmc)

        def run() -> T:
            user, password = self._user_password(bmc)
            root = sushy.Sushy(bmc.url, auth=sushy.auth.BasicAuth(user, password), verify=trust.for_requests(),
                               server_side_retries=1, server_side_retries_delay=1,
                               connect_timeout=_CONNECT_TIMEOUT, read_timeout=_READ_TIMEOUT)  # fmt: skip
            auth = BmcAuth(bmc.url, root._conn, user, password)
            try:
                return auth.run(lambda: fn(root))
            finally:
                auth.close()

        try:
            return await asyncio.get_running_loop().run_in_executor(self._threads, run)
        except ApplicationError:
            raise
        except Exception as err:
            raise redfish_error(err, doing, bmc, trust) from None

    @staticmethod
    def _the_system(root: sushy.Sushy, bmc: BmcRef) -> Any:
        if bmc.system:
            return root.get_system(bmc.system if bmc.system.startswith("/") else f"/redfish/v1/Systems/{bmc.system}")
        members = sorted(root.get_system_collection().members_identities)
        if len(members) != 1:
            raise ApplicationError(f"BMC {bmc} has {len(members)} systems; name one in bmc.system",
                                   type="RedfishRejected", non_retryable=True)  # fmt: skip
        return root.get_system(members[0])

    @activity.defn
    async def firmware_inventory(self, bmc: BmcRef) -> FirmwareVersions:
        """Every firmware inventory entry's Version, and the system's identity (checked against the node it is said
        to be before anything is written)."""

        def run(root: sushy.Sushy) -> FirmwareVersions:
            several = not bmc.system and len(root.get_system_collection().members_identities) != 1
            system = None if several else self._the_system(root, bmc)
            return FirmwareVersions(versions=_versions(root), system=None if system is None else SystemIdentity(
                uuid=system.uuid or "", serial=system.serial_number or ""))  # fmt: skip

        return await self._converse("reading the firmware inventory", bmc, run)

    @activity.defn
    async def start_firmware_update(self, req: UpdateStart) -> UpdateStarted:
        """SimpleUpdate of one image to its targets, unless they are already at its version (or it is a downgrade
        that is not allowed); answers the Task to follow."""
        where = f"{', '.join(req.targets)} on BMC {req.bmc}"

        def run(root: sushy.Sushy) -> UpdateStarted:
            have = _versions(root)
            kind, why = refused(req.targets, req.version, have, req.allow_downgrade)
            if kind == "FirmwareComponentUnknown":
                raise ApplicationError(f"BMC {req.bmc}: {why}", type=kind, non_retryable=True)
            installed = {t: have[t] for t in req.targets}
            if all(v == req.version for v in installed.values()):
                return UpdateStarted(outcome="at-target", installed=installed)
            if kind:
                raise ApplicationError(f"{where}: {why}", type=kind, non_retryable=True)
            paths = _inventory_paths(root)
            targets = [paths[t] for t in req.targets]
            service = root.get_update_service()
            push = service.json.get("MultipartHttpPushUri") if req.push else None
            # A pushed image's task names its file, a pulled one's its URI.
            earlier = self._earlier_task(root, _filename(req.image_uri) if push else req.image_uri, targets)
            if earlier is not None:  # an earlier attempt started it: follow that one, never flash twice
                return UpdateStarted(outcome="started", task=earlier, installed=installed, pushed=bool(push))
            if push:
                return self._push(root, service.json, push, req, targets, installed)
            action = (service.json.get("Actions") or {}).get("#UpdateService.SimpleUpdate", {}).get("target")
            if not action:
                raise ApplicationError(f"BMC {req.bmc} offers no UpdateService.SimpleUpdate",
                                       type="RedfishRejected", non_retryable=True)  # fmt: skip
            body: dict[str, Any] = {"ImageURI": req.image_uri, "Targets": targets,
                                    "@Redfish.OperationApplyTime": req.apply_time}  # fmt: skip
            if req.transfer_protocol:
                body["TransferProtocol"] = req.transfer_protocol
            rsp = root._conn.post(action, data=body)
            doc = rsp.json() if rsp.content else {}
            task = doc.get("@odata.id") or rsp.headers.get("Location", "").removesuffix("/Monitor")
            if not task:
                raise ApplicationError(f"{where}: the BMC answered HTTP {rsp.status_code} without a task to follow",
                                       type="RedfishRejected", non_retryable=True)  # fmt: skip
            return UpdateStarted(outcome="started", task=task, installed=installed)

        return await self._converse(f"starting the update of {', '.join(req.targets)} to {req.version}", req.bmc, run)

    def _push(self, root: sushy.Sushy, service: dict, push: str, req: UpdateStart, targets: list[str],
              installed: dict[str, str]) -> UpdateStarted:  # fmt: skip
        """The multipart push (DSP0266 §12.6.2.2): the image, fetched from its URI here, and its parameters."""
        where = f"{', '.join(req.targets)} on BMC {req.bmc}"
        fetched = httpx.get(req.image_uri, timeout=httpx.Timeout(_IMAGE_READ_TIMEOUT, connect=_CONNECT_TIMEOUT))
        if fetched.status_code != 200:
            raise ApplicationError(f"{where}: the image server answered HTTP {fetched.status_code} for "
                                   f"{req.image_uri}", type="FirmwareImageUnavailable",
                                   non_retryable=fetched.status_code in (401, 403, 404, 410))  # fmt: skip
        limit = service.get("MaxImageSizeBytes")
        if isinstance(limit, int) and len(fetched.content) > limit:
            raise ApplicationError(f"{where}: {req.image_uri} is {len(fetched.content)} bytes, more than the BMC's "
                                   f"MaxImageSizeBytes {limit}", type="FirmwareImageTooLarge", non_retryable=True)  # fmt: skip
        params = {"Targets": targets, "@Redfish.OperationApplyTime": req.apply_time}
        conn = root._conn
        url = urljoin(req.bmc.url, push)
        rsp = conn._session.post(url, timeout=(_CONNECT_TIMEOUT, _IMAGE_READ_TIMEOUT), files={
            "UpdateParameters": (None, json.dumps(params), "application/json"),
            "UpdateFile": (_filename(req.image_uri), fetched.content, "application/octet-stream"),
        })  # fmt: skip
        if rsp.status_code >= 400:
            sushy_errors.raise_for_response("POST", url, rsp)
        task = (rsp.json() if rsp.content else {}).get("@odata.id") or rsp.headers.get("Location", "")
        if not task:
            raise ApplicationError(f"{where}: the BMC answered the push HTTP {rsp.status_code} without a task to "
                                   "follow", type="RedfishRejected", non_retryable=True)  # fmt: skip
        return UpdateStarted(outcome="started", task=task.removesuffix("/Monitor"), installed=installed, pushed=True)

    @staticmethod
    def _earlier_task(root: sushy.Sushy, image_uri: str, targets: list[str]) -> str | None:
        """The task an earlier attempt started for this image and these targets: still running, or Completed with
        the image staged until a reset or power cycle (``Update.1.0.AwaitToActivate``; the inventory shows the old
        version until then). Only the newest task touching any of the targets counts: a later image replaced what
        an older task staged."""
        service = root.json.get("Tasks", {}).get("@odata.id")
        if not service:
            return None
        conn = root._conn
        tasks = conn.get(service).json().get("Tasks", {}).get("@odata.id")
        quoted = [json.dumps(t) for t in targets]  # as the task's JsonBody has them: GPU1 is not GPU10
        touching = []
        for i, member in enumerate(conn.get(tasks).json().get("Members", []) if tasks else []):
            task = conn.get(member["@odata.id"]).json()
            body = (task.get("Payload") or {}).get("JsonBody") or ""
            if any(t in body for t in quoted):
                touching.append((task.get("StartTime") or "", i, member["@odata.id"], task, body))
        if not touching:
            return None
        _, _, uri, task, body = max(touching, key=lambda found: found[:2])
        if image_uri not in body or not all(t in body for t in quoted):
            return None
        state = task.get("TaskState")
        staged = state == "Completed" and any(
            str(m.get("MessageId", "")).endswith("AwaitToActivate") for m in task.get("Messages") or []
        )
        return uri if state not in _ENDED or staged else None

    @activity.defn
    async def follow_firmware_task(self, req: TaskFollow) -> TaskOutcome:
        """Poll the update's Task until it ends, heartbeating its state; wait out a BMC that restarts meanwhile."""
        where = f"the update of {', '.join(req.targets)} to {req.version} on BMC {req.bmc}"
        want = dict.fromkeys(req.targets, req.version)
        deadline = time.monotonic() + req.timeout_seconds
        restarted, last = False, "not read yet"

        def look(root: sushy.Sushy) -> tuple[str, Any]:
            try:
                return "task", root._conn.get(req.task).json()
            except sushy_errors.ResourceNotFoundError:
                return "gone", _versions(root)

        while True:
            try:
                kind, seen = await self._converse(f"following {req.task}", req.bmc, look)
            except ApplicationError as err:
                if err.type != "BmcUnavailable":
                    raise
                # A BMC restarting into new firmware does not answer: not a failure until the timeout.
                kind, seen, restarted = "unreachable", str(err), True
            if kind == "task":
                state, percent = seen.get("TaskState", "Running"), seen.get("PercentComplete")
                last = f"{state} {percent}%"
                if state in ("Exception", "Killed", "Cancelled"):
                    raise ApplicationError(f"{where}: the BMC's task ended {state}: " + "; ".join(_messages(seen)),
                                           type="FirmwareUpdateFailed", non_retryable=True)  # fmt: skip
                if state == "Completed":
                    have = await self._converse("reading the firmware inventory", req.bmc, _versions)
                    return TaskOutcome(state=state, percent=percent, messages=_messages(seen),
                                       active=not _differs(have, want), bmc_restarted=restarted)  # fmt: skip
                activity.heartbeat({"task": req.task, "state": state, "percent": percent, "bmc_restarted": restarted})
            elif kind == "gone":
                differs = _differs(seen, want)
                if differs:
                    raise ApplicationError(
                        f"{where}: the BMC no longer knows task {req.task}" + (" after restarting" if restarted else "")
                        + " and its inventory shows " + ", ".join(f"{k} {v}" for k, v in differs.items()),
                        type="FirmwareTaskLost", non_retryable=True,
                    )  # fmt: skip
                # The BMC restarted into the new version and forgot its task (tasks live in its memory).
                return TaskOutcome(state="Completed", percent=100, active=True, bmc_restarted=restarted,
                                   messages=[f"task gone after the BMC restarted; inventory shows {req.version}"])  # fmt: skip
            else:
                last = "the BMC does not answer (restarting?)"
                activity.heartbeat({"task": req.task, "state": "BmcRestarting", "bmc_restarted": True})
            if time.monotonic() > deadline:
                raise ApplicationError(f"{where}: not finished after {req.timeout_seconds:.0f}s (last: {last})",
                                       type="FirmwareTaskTimeout", non_retryable=True)  # fmt: skip
            await asyncio.sleep(_POLL_SECONDS)

    @activity.defn
    async def activate_firmware(self, req: Activation) -> Activated:
        """Reset the system (or AC power cycle the chassis) unless the versions are already active or a power change
        is landing, then wait until the inventory shows them and the system is On (after an AC power cycle: as it
        was; a system that was off stays off)."""

        def act(root: sushy.Sushy) -> tuple[bool, bool]:
            system = self._the_system(root, req.bmc)
            on = system.power_state != sushy.POWER_STATE_OFF
            if not _differs(_versions(root), req.want):
                return False, on
            if system.power_state in (sushy.POWER_STATE_POWERING_ON, sushy.POWER_STATE_POWERING_OFF):
                return True, True  # an earlier attempt's reset is landing
            if req.how == "reset":
                system.reset_system(sushy.RESET_FORCE_RESTART if on else sushy.RESET_ON)
                return True, True
            chassis = [c["@odata.id"] for c in (system.json.get("Links") or {}).get("Chassis") or []]
            if not chassis:
                raise ApplicationError(f"BMC {req.bmc}: the system names no chassis to AC power cycle",
                                       type="RedfishRejected", non_retryable=True)  # fmt: skip
            root._conn.post(f"{chassis[0]}/Actions/Chassis.Reset", data={"ResetType": "PowerCycle"})
            return True, on

        def settled(root: sushy.Sushy) -> tuple[dict[str, str], str | None]:
            power = self._the_system(root, req.bmc).power_state
            return _versions(root), None if power is None else str(getattr(power, "value", power))

        how = "system reset" if req.how == "reset" else "AC power cycle"
        reset, on = await self._converse(f"{how} to activate firmware", req.bmc, act)
        deadline = time.monotonic() + req.timeout_seconds
        while True:
            try:
                have, power = await self._converse("reading the firmware inventory", req.bmc, settled)
            except ApplicationError as err:
                if err.type != "BmcUnavailable":
                    raise
                have, power = {}, "unknown (BMC not answering)"
            differs = _differs(have, req.want) if have else req.want
            if not differs and power == ("On" if on else "Off"):
                return Activated(reset=reset, versions={k: have[k] for k in req.want})
            activity.heartbeat({"how": req.how, "power": power, "waiting_for": sorted(differs)})
            if time.monotonic() > deadline:
                raise ApplicationError(
                    f"BMC {req.bmc}: {req.timeout_seconds:.0f}s after the {how} the inventory shows "
                    + ", ".join(f"{k} {v}" for k, v in differs.items()) + f" (power {power})",
                    type="FirmwareNotActivated", non_retryable=True,
                )  # fmt: skip
            await asyncio.sleep(_POLL_SECONDS)
