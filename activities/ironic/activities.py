"""OpenStack Ironic activities for burn-in: read a node, set its ``agent_burnin_*`` settings, manage it,
run a manual clean and wait for it, over Ironic's REST API (httpx).

Each activity reads before it writes, so a retry after a crash at any line does not do anything twice:
``ironic_set_driver_info`` patches only the keys whose value differs; ``ironic_manage`` does nothing on a
node already manageable (and only waits on one already on its way there); ``ironic_start_clean`` starts a
clean only from ``manageable``, and a retry that finds the same steps already cleaning (or, through the
node's history, already run since this activity was scheduled) does not start them again.
``ironic_wait_clean`` polls with heartbeats that carry the provision state and the current clean step.

What the steps are and how IPA's burn-in steps take their settings: activities/ironic/steps.py. Settings, the token
and TLS: activities/ironic/client.py.

Errors: Ironic's answers as activities/ironic/errors.py maps them; a clean that ends in ``clean failed`` →
``IronicCleanFailed`` (non-retryable; ``last_error`` in the message and the details). Also non-retryable:
``IronicWrongState`` (cleaning asked of a node not manageable, or waited on a node not cleaning), ``IronicNodeBusy``
(already cleaning with other steps), ``IronicManageFailed`` (verification failed), ``IronicTimeout`` /
``IronicCleanTimeout`` (the request's timeout_seconds passed; the clean goes on).
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.ironic.client import IronicClient
from activities.ironic.models import (
    CLEAN_FAILED,
    CLEANING_STATES,
    MANAGEABLE,
    TRANSIENT_STATES,
    CleanResult,
    CleanStarted,
    DriverInfoResult,
    DriverInfoUpdate,
    IronicNode,
    ManageRequest,
    ManageResult,
    NodeRef,
    StartClean,
    WaitClean,
)
from activities.ironic.steps import CleanStep
from activities.support.tls import TrustingClient


def _same_steps(running: list[dict[str, Any]], wanted: list[CleanStep]) -> bool:
    have = [(s.get("interface"), s.get("step"), s.get("args") or {}) for s in running]
    return have == [(s.interface, s.step, s.args) for s in wanted]


def _pointer(key: str) -> str:
    return "/driver_info/" + key.replace("~", "~0").replace("/", "~1")


class IronicActivities(IronicClient):
    """Ironic node activities. With no config every activity fails with IronicNotConfigured."""

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
            return CleanStarted(node=await self._node(client, node.uuid), started=True)

    async def _ran_since_scheduled(self, client: TrustingClient, node: IronicNode, req: StartClean) -> bool:
        """Whether the node's history has a manual clean with these steps started since this activity was scheduled."""
        try:
            history = await self._call(client, "GET", f"/nodes/{node.uuid}/history", f"reading node {req.node} history")
        except ApplicationError:
            return False  # no history (disabled, or an older Ironic): clean again rather than skip a clean
        since = activity.info().scheduled_time
        if since.tzinfo is None:
            since = since.replace(tzinfo=UTC)
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
