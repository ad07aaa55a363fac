"""One lab BMC's firmware updates: Redfish ``UpdateService`` (``SimpleUpdate``), ``TaskService`` with the tasks it
runs, and ``FirmwareInventory`` (SoftwareInventory members with ``Version``), in the DMTF schema shapes
(UpdateService v1_11, Task v1_4, TaskService v1_2; ../shared/reference/lifecycle-apis.md §1).

``POST UpdateService/Actions/UpdateService.SimpleUpdate`` ``{"ImageURI", "TransferProtocol"?, "Targets": [inventory
URIs], "@Redfish.OperationApplyTime"?}`` answers 202 with ``Location: TaskService/Tasks/<n>/Monitor`` and the Task.
``Targets`` is required (as in sushy-tools: the lab does not guess which component an image is for); the apply
time is checked and kept in the Task's ``Payload``, while when a version activates follows the image's ``apply``. The image is
looked up in the lab's image catalogue (``PUT /_lab/images``: ``{uri: {"version", "seconds"?, "apply"?, "bad"?}}``);
the task runs ``seconds`` (default the lab's ``update_seconds``), ``PercentComplete`` rising, then ends by how the
image applies (``apply``, default by component):

* ``none``: the new version is active at once; ``Completed``.
* ``reset`` (BIOS, GPUs, NVSwitches): ``Completed`` with ``Update.1.0.AwaitToActivate``; the version activates at
  the system's next power-on (any reset that boots it).
* ``ac_power_cycle`` (CPLD): ``Completed`` with ``AwaitToActivate``; it activates only at a ``Chassis.Reset``
  ``PowerCycle`` (AC power cycle), which also power-cycles a running system.
* ``bmc_restart`` (BMC): the new version is active and the BMC restarts: it drops every connection for the lab's
  ``bmc_restart_seconds``, then answers again with its tasks and sessions gone (in memory, as in OpenBMC).

A task ends ``Exception`` (``TaskStatus`` Critical, the version unchanged) when the image is not in the catalogue
(``Update.1.0.TransferFailed``), the image is bad (``"bad": "<why>"``: ``Update.1.0.VerificationFailed``), or a
fault is armed for the component on this server (``PUT /_lab/servers/{name}/update-faults`` ``{component: why}``,
used once: ``Update.1.0.ApplyFailed``). A bad flash armed on one server (``PUT /_lab/servers/{name}/bad-flash``
``{component: why}``, used once) ends its task as usual, but the image never activates: the component runs its
previous version and the SEL gets a Critical ``Update.1.0.ActivateFailed`` entry. ``GET`` on the monitor answers 202 (with ``Retry-After``) while the task
runs, then 200 with the Task; with the lab's ``monitor_expires`` 1, as OpenBMC's bmcweb does, 204 once the task
ended and 404 after that (the Task itself still answers 200).

``POST UpdateService/update-multipart`` (``MultipartHttpPushUri``, offered unless the lab's ``multipart_push`` is 0;
DSP0266 §12.6.2.2): parts ``UpdateParameters`` (JSON: ``Targets``, ``@Redfish.OperationApplyTime``) and
``UpdateFile`` (the image, with its ``filename``); 411 without a ``Content-Length``, 412 past
``MaxImageSizeBytes``. The pushed image is the catalogue's entry whose URI ends in its filename, and its task runs
as a SimpleUpdate's.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any, Protocol
from urllib.parse import urlparse

from aiohttp import BodyPartReader, web

from lab.redfish_shapes import RedfishError, collection


class UpdatedBmc(Protocol):
    """What the update service asks of its BMC (lab/bmc.py `Bmc`)."""

    firmware: dict[str, str]
    spec: dict
    lab: Any
    power: str

    def set_firmware(self, component: str, version: str) -> None: ...

    def restart_bmc(self, seconds: float) -> None: ...

    def reset(self, reset_type: str) -> None: ...

    def add_sel(self, body: dict) -> dict: ...


ROOT = "/redfish/v1"
US = f"{ROOT}/UpdateService"
TASKS = f"{ROOT}/TaskService/Tasks"
SIMPLE_UPDATE = f"{US}/Actions/UpdateService.SimpleUpdate"
MULTIPART = f"{US}/update-multipart"  # where NVIDIA's bmcweb has it
MULTIPART_PARTS = MULTIPART.removeprefix(f"{ROOT}/").split("/")
MAX_IMAGE_BYTES = 64 * 1024 * 1024
PROTOCOLS = ("HTTP", "HTTPS")
APPLY_TIMES = ("Immediate", "OnReset")
APPLIES = ("none", "reset", "ac_power_cycle", "bmc_restart")
TERMINAL = ("Completed", "Exception", "Killed", "Cancelled")


def default_apply(component: str) -> str:
    """How a component's new image becomes active when the catalogue does not say."""
    if component == "BMC":
        return "bmc_restart"
    return "ac_power_cycle" if component == "CPLD" else "reset"


def _now_iso(at: float | None = None) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))


def _message(key: str, message: str, args: list[str], severity: str = "OK", resolution: str = "None.") -> dict:
    return {"MessageId": f"Update.1.0.{key}", "Message": message, "MessageArgs": args, "MessageSeverity": severity,
            "Resolution": resolution}  # fmt: skip


def _apply_time_support() -> dict:
    return {"@odata.type": "#Settings.v1_3_5.OperationApplyTimeSupport", "SupportedValues": list(APPLY_TIMES)}


def _action_error(status: int, message_id: str, message: str) -> Exception:
    return RedfishError(status, message_id, message)


class Updates:
    """The update tasks of one BMC, the versions waiting to activate, and the faults armed for its updates."""

    def __init__(self, bmc: UpdatedBmc) -> None:
        self.bmc = bmc
        self.tasks: dict[str, dict] = {}
        self.seq = 0
        self.pending: dict[str, dict] = {}  # component -> {"version", "apply"}
        self.faults: dict[str, str] = {}
        self.bad_flash: dict[str, str] = {}  # component -> why its next flash on this server is written bad
        self.timers: list[asyncio.TimerHandle] = []
        self.ac_cycles = 0

    def cancel(self) -> None:
        for t in self.timers:
            t.cancel()
        self.timers = []

    # ------------------------------------------------------------------ documents
    def get(self, parts: list[str]) -> dict | None:
        n = len(parts)
        if parts[0] == "UpdateService":
            if n == 1:
                return self._update_service()
            if parts[1] == "FirmwareInventory":
                if n == 2:
                    return collection(f"{US}/FirmwareInventory", "SoftwareInventoryCollection",
                                       "Firmware Inventory Collection",
                                       [f"{US}/FirmwareInventory/{k}" for k in self.bmc.firmware])  # fmt: skip
                if n == 3 and parts[2] in self.bmc.firmware:
                    return self._software(parts[2])
            return None
        if n == 1:
            return {
                "@odata.id": f"{ROOT}/TaskService",
                "@odata.type": "#TaskService.v1_2_0.TaskService",
                "Id": "TaskService",
                "Name": "Task Service",
                "ServiceEnabled": True,
                "CompletedTaskOverWritePolicy": "Oldest",
                "LifeCycleEventOnTaskStateChange": True,
                "DateTime": _now_iso(),
                "Status": {"State": "Enabled", "Health": "OK"},
                "Tasks": {"@odata.id": TASKS},
            }
        if parts[1] == "Tasks":
            if n == 2:
                return collection(TASKS, "TaskCollection", "Task Collection", [f"{TASKS}/{i}" for i in self.tasks])
            if n == 3 and parts[2] in self.tasks:
                return self._task(self.tasks[parts[2]])
        return None

    def monitor(self, task_id: str) -> web.Response | None:
        task = self.tasks.get(task_id)
        if task is None:
            return None
        if task["state"] in TERMINAL:
            if not self.bmc.lab.config["monitor_expires"]:
                return web.json_response(self._task(task))
            if task.get("monitor_spent"):  # OpenBMC bmcweb: the monitor expires once it has answered 204
                return None
            task["monitor_spent"] = True
            return web.Response(status=204)
        headers = {"Location": f"{TASKS}/{task_id}/Monitor", "Retry-After": "1"}
        return web.json_response(self._task(task), status=202, headers=headers)

    def _update_service(self) -> dict:
        return {
            "@odata.id": US,
            "@odata.type": "#UpdateService.v1_11_0.UpdateService",
            "Id": "UpdateService",
            "Name": "Update Service",
            "ServiceEnabled": True,
            "Status": {"State": "Enabled", "Health": "OK"},
            "FirmwareInventory": {"@odata.id": f"{US}/FirmwareInventory"},
            **(
                {
                    "MultipartHttpPushUri": MULTIPART,
                    "MaxImageSizeBytes": MAX_IMAGE_BYTES,
                    "MultipartHttpPushUri@Redfish.OperationApplyTimeSupport": _apply_time_support(),
                }
                if self.bmc.lab.config["multipart_push"]
                else {}
            ),
            "Actions": {
                "#UpdateService.SimpleUpdate": {
                    "target": SIMPLE_UPDATE,
                    "TransferProtocol@Redfish.AllowableValues": list(PROTOCOLS),
                    "@Redfish.OperationApplyTimeSupport": _apply_time_support(),
                }
            },
        }

    def _software(self, k: str) -> dict:
        maker = "NVIDIA" if k.startswith(("GPU", "NVSwitch")) else self.bmc.spec["manufacturer"]
        return {
            "@odata.id": f"{US}/FirmwareInventory/{k}",
            "@odata.type": "#SoftwareInventory.v1_9_0.SoftwareInventory",
            "Id": k,
            "Name": f"{k} Firmware",
            "Version": self.bmc.firmware[k],
            "Updateable": True,
            "Manufacturer": maker,
            "SoftwareId": k,
            "Status": {"State": "Enabled", "Health": "OK"},
        }

    def _task(self, t: dict) -> dict:
        doc = {
            "@odata.id": f"{TASKS}/{t['id']}",
            "@odata.type": "#Task.v1_4_3.Task",
            "Id": t["id"],
            "Name": "Firmware update",
            "TaskState": t["state"],
            "StartTime": _now_iso(t["start"]),
            "PercentComplete": self._percent(t),
            "TaskMonitor": f"{TASKS}/{t['id']}/Monitor",
            "Messages": list(t["messages"]),
            "Payload": {
                "HttpOperation": "POST",
                "TargetUri": t["target_uri"],
                "JsonBody": json.dumps(t["body"]),
                "HttpHeaders": [],
            },
        }
        if t["state"] in TERMINAL:
            doc["EndTime"] = _now_iso(t["end"])
            worst = max((m["MessageSeverity"] for m in t["messages"]), key=("OK", "Warning", "Critical").index)
            doc["TaskStatus"] = worst
        return doc

    @staticmethod
    def _percent(t: dict) -> int:
        if t["state"] == "Completed":
            return 100
        if t["state"] in TERMINAL:
            return t["percent"]
        return min(99, int((time.time() - t["start"]) / max(t["seconds"], 1e-6) * 100))

    # ------------------------------------------------------------------ SimpleUpdate
    def simple_update(self, body: Any) -> web.Response:
        if not isinstance(body, dict) or not isinstance(body.get("ImageURI"), str) or not body["ImageURI"]:
            raise _action_error(400, "ActionParameterMissing", "The action UpdateService.SimpleUpdate requires the "
                                "parameter ImageURI to be present in the request body.")  # fmt: skip
        uri = body["ImageURI"]
        protocol = urlparse(uri).scheme.upper() or body.get("TransferProtocol") or "HTTP"
        if body.get("TransferProtocol") not in (None, *PROTOCOLS) or protocol not in PROTOCOLS:
            raise _action_error(400, "ActionParameterValueNotInList", f"The value '{protocol}' for the parameter "
                                "TransferProtocol in the action UpdateService.SimpleUpdate is not in the list of "
                                "acceptable values.")  # fmt: skip
        components = self._parameters(body, "the action UpdateService.SimpleUpdate")
        return self._start(uri, components, self.bmc.lab.images.get(uri), body, SIMPLE_UPDATE)

    def _parameters(self, body: dict, where: str) -> list[str]:
        """The components `body`'s Targets name, its apply time checked."""
        apply_time = body.get("@Redfish.OperationApplyTime", "Immediate")
        if apply_time not in APPLY_TIMES:
            raise _action_error(400, "ActionParameterValueNotInList", f"The value '{apply_time}' for the parameter "
                                f"@Redfish.OperationApplyTime in {where} is not in the list of acceptable "
                                "values.")  # fmt: skip
        targets = body.get("Targets")
        if not isinstance(targets, list) or not targets:
            raise _action_error(400, "ActionParameterMissing", f"{where[0].upper()}{where[1:]} requires the "
                                "parameter Targets to be present in the request body.")  # fmt: skip
        components = []
        for target in targets:
            k = str(target).rstrip("/").rsplit("/", 1)[-1]
            if str(target).rstrip("/") != f"{US}/FirmwareInventory/{k}" or k not in self.bmc.firmware:
                raise _action_error(400, "ActionParameterValueNotInList", f"The value '{target}' for the parameter "
                                    f"Targets in {where} is not in the list of acceptable values.")  # fmt: skip
            components.append(k)
        return components

    async def multipart_push(self, request: web.Request, entry: dict) -> web.Response:
        """``MultipartHttpPushUri``: the image in the request, its parameters beside it."""
        if not self.bmc.lab.config["multipart_push"]:
            raise RedfishError(404, "ResourceNotFound", f"The requested resource of type URI named '{MULTIPART}' "
                               "was not found.")  # fmt: skip
        if request.content_length is None:
            raise RedfishError(411, "LengthRequired", "The request requires a Content-Length header.")
        if request.content_length > MAX_IMAGE_BYTES:
            raise RedfishError(412, "PreconditionFailed", f"The image is larger than MaxImageSizeBytes "
                               f"({MAX_IMAGE_BYTES}).")  # fmt: skip
        where = "the multipart HTTP push"
        params: Any = None
        filename, size = None, 0
        try:
            reader = await request.multipart()
            async for part in reader:
                if not isinstance(part, BodyPartReader):  # a nested multipart is no part this action takes
                    continue
                if part.name == "UpdateParameters":
                    params = json.loads(await part.text())
                elif part.name == "UpdateFile":
                    filename, size = part.filename, len(await part.read())
        except (ValueError, AssertionError):
            raise _action_error(400, "MalformedJSON", f"The body of {where} is not multipart/form-data with JSON "
                                "UpdateParameters.") from None  # fmt: skip
        if not isinstance(params, dict) or not filename or not size:
            raise _action_error(400, "ActionParameterMissing", f"The {where} requires the parts UpdateParameters "
                                "and UpdateFile (with a filename).")  # fmt: skip
        entry["body"] = {"UpdateParameters": params, "UpdateFile": {"filename": filename, "bytes": size}}
        components = self._parameters(params, where)
        image = next((v for u, v in self.bmc.lab.images.items() if u.rsplit("/", 1)[-1] == filename), None)
        return self._start(filename, components, image, entry["body"], MULTIPART)

    def _start(self, uri: str, components: list[str], image: dict | None, body: dict, target_uri: str) -> web.Response:
        self.seq += 1
        task_id, seconds = str(self.seq), float((image or {}).get("seconds") or self.bmc.lab.config["update_seconds"])
        task = {"id": task_id, "state": "Running", "start": time.time(), "end": None, "percent": 0, "seconds": seconds,
                "body": body, "uri": uri, "components": components, "image": image, "target_uri": target_uri,
                "messages": [_message("TransferringToComponent", f"Image '{uri}' is being transferred to "
                                      f"'{', '.join(components)}'.", [uri, ", ".join(components)])]}  # fmt: skip
        self.tasks[task_id] = task
        loop = asyncio.get_running_loop()
        self.timers = [t for t in self.timers if not t.cancelled() and t.when() > loop.time()]
        self.timers.append(loop.call_later(seconds, self._finish, task))
        headers = {"Location": f"{TASKS}/{task_id}/Monitor", "Retry-After": "1"}
        return web.json_response(self._task(task), status=202, headers=headers)

    def _end(self, task: dict, state: str, message: dict) -> None:
        task["percent"] = self._percent(task)
        task["state"], task["end"] = state, time.time()
        task["messages"].append(message)

    def _finish(self, task: dict) -> None:
        uri, components, image = task["uri"], task["components"], task["image"]
        where = ", ".join(components)
        fault = next((self.faults.pop(k) for k in components if k in self.faults), None)
        if image is None:
            self._end(task, "Exception", _message("TransferFailed", f"Transfer of image '{uri}' to '{where}' failed: "
                      "the image server answered 404.", [uri, where], "Critical",
                      "Check the image URI and resubmit the request."))  # fmt: skip
            return
        if image.get("bad"):
            self._end(task, "Exception", _message("VerificationFailed", f"Verification of image '{uri}' at '{where}' "
                      f"failed: {image['bad']}", [uri, where], "Critical",
                      "Obtain a valid image and resubmit the request."))  # fmt: skip
            return
        if fault is not None:
            self._end(task, "Exception", _message("ApplyFailed", f"Installation of image '{uri}' to '{where}' failed: "
                      f"{fault}", [uri, where], "Critical", "Retry the update; if it fails again, contact the "
                      "vendor."))  # fmt: skip
            return
        version, apply = str(image["version"]), image.get("apply") or default_apply(components[0])
        bad = {k: self.bad_flash.pop(k) for k in components if k in self.bad_flash}
        if apply in ("reset", "ac_power_cycle"):
            for k in components:
                self.pending[k] = {"version": version, "apply": apply, **({"bad": bad[k]} if k in bad else {})}
            how = "a system reset" if apply == "reset" else "an AC power cycle (Chassis.Reset PowerCycle)"
            self._end(task, "Completed", _message("AwaitToActivate", f"Awaiting {how} to activate image '{uri}' on "
                      f"'{where}'.", [uri, where], "OK", f"Perform {how}."))  # fmt: skip
            return
        for k in components:
            self._activate(k, version, bad.get(k))
        self._end(task, "Completed", _message("UpdateSuccessful", f"Update of '{where}' to version {version} was "
                  "successful.", [where, version]))  # fmt: skip
        if apply == "bmc_restart":
            self.bmc.restart_bmc(float(self.bmc.lab.config["bmc_restart_seconds"]))

    # ------------------------------------------------------------------ activation
    def activate(self, at: str) -> None:
        """A system power-on (`at` "reset") activates what waits for a reset; an AC cycle activates everything."""
        for k, p in list(self.pending.items()):
            if at == "ac_power_cycle" or p["apply"] == "reset":
                self._activate(k, p["version"], p.get("bad"))
                del self.pending[k]

    def _activate(self, component: str, version: str, bad: str | None) -> None:
        """The new version runs, unless its flash was written bad: then the component boots its other (previous)
        image, as dual-image firmware does, and the SEL says why."""
        if bad is None:
            self.bmc.set_firmware(component, version)
            return
        self.bmc.add_sel({"severity": "Critical", "message_id": "Update.1.0.ActivateFailed",
                          "message": f"Activation of {component} {version} failed: {bad}; "
                                     f"running the previous image {self.bmc.firmware.get(component)}."})  # fmt: skip

    def ac_power_cycle(self) -> None:
        """Chassis.Reset PowerCycle: AC power goes and comes back; a running system restarts."""
        self.ac_cycles += 1
        self.activate("ac_power_cycle")
        if self.bmc.power == "On":
            self.bmc.reset("PowerCycle")

    def view(self) -> dict:
        return {
            "firmware_pending": {k: dict(p) for k, p in self.pending.items()},
            "update_faults": dict(self.faults),
            "bad_flash": dict(self.bad_flash),
            "ac_cycles": self.ac_cycles,
            "tasks": [
                {"id": t["id"], "state": t["state"], "components": t["components"], "uri": t["uri"]}
                for t in self.tasks.values()
            ],
        }
