"""Kubernetes activities: cordon, drain through the eviction API, uncordon; and for rollouts:
paged node listing, node rollout state, package Jobs per stage (NodeWright's execution
substrate), reboot verification by boot ID, node-condition gates, and a node's whole update in
three calls (start: state, cordon, drain plan; its stages' Jobs; finish: packages, state, uncordon).

Every activity is idempotent: it reads the live object first and decides from what
it finds, so a retry after a crash at any line neither repeats a write nor undoes
someone else's. Errors a retry cannot fix are raised as non-retryable
`ApplicationError`s with a `type`; everything else (5xx, 409 conflicts, 429 rate
limits, dropped connections) is raised as is and left to the workflow's retry policy.
The client's own retries are off: Temporal owns retrying, so every attempt is visible.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

from kubernetes.aio import client as k8s
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.kube.connector import REQUEST_TIMEOUT
from activities.kube.drain import pod_finished
from activities.kube.models import (
    BEAT_SECONDS,
    CORDON_REASON,
    CORDONED_BY,
    NON_INTERRUPTIBLE_RUNNING,
    PACKAGES_ANNOTATION,
    ConditionGate,
    CordonRequest,
    DrainPlanRequest,
    DrainSettings,
    NodeRolloutState,
    NodeStage,
    NodeStages,
    NodeStagesResult,
    NodeUpdateFinish,
    NodeUpdateStart,
    NodeUpdateStarted,
    RebootWait,
    StageJobRequest,
    StageRecord,
)
from activities.kube.node_activities import LIST_CHUNK
from activities.kube.rollout_activities import RolloutNodeActivities
from activities.kube.stages import (
    annotation_of,
    call_json,
    node_info,
    packages_of,
    reboot_unverifiable,
    rollout_record,
    state_change,
)

_VIOLATIONS_MAX = 50  # check_node_conditions reports at most this many, then a count


class KubeActivities(RolloutNodeActivities):
    """Every Kubernetes activity of the worker: the node's (activities/kube/node_activities.py), the rollout's
    (activities/kube/rollout_activities.py) and, here, a node's update in three calls and the condition gates."""

    def activities(self) -> list[Callable]:
        return [
            self.inspect_node,
            self.cordon_node,
            self.uncordon_node,
            self.list_unfinished_pods,
            self.plan_drain,
            self.evict_pod,
            self.wait_pods_gone,
            self.list_nodes_page,
            self.list_unavailable_nodes,
            self.node_availability,
            self.set_node_rollout_state,
            self.record_package_installed,
            self.run_stage_job,
            self.wait_node_rebooted,
            self.check_node_conditions,
            self.start_node_update,
            self.run_node_stages,
            self.finish_node_update,
        ]

    # ------------------------------------------------------------ rollouts: a node's update in three calls

    @activity.defn
    async def start_node_update(self, req: NodeUpdateStart) -> NodeUpdateStarted:
        """Begin a node's update: its rollout state `in_progress`, and with `cordon` the cordon and the drain plan.

        With `cordon`, a node whose non-interruptible pods still run is left in service and its state set `blocked`;
        otherwise it is cordoned, its state written in the same write, its non-interruptible pods looked for again
        now that no new one can land (one found: the cordon is removed again, with the state `blocked`, in one
        write), and its drain planned as `plan_drain` does. Short and idempotent, run as a local activity: every
        write is decided from a fresh read, so a retry after a crash at any line repeats none and undoes nothing
        (a cordon this rollout placed is removed only while the node's state still says this start placed it).
        """
        state = NodeRolloutState(cluster=req.cluster, node=req.node, rollout=req.rollout, state="in_progress")
        if req.cordon and await self._non_interruptible_running(req):
            node = await self._read_node(req.cluster, req.node)
            record = rollout_record(node)  # in progress by this rollout, no stage yet: an earlier try of this start
            placed_here = record.get("rollout") == req.rollout and record.get("state") == "in_progress" \
                and not record.get("stage")
            return await self._blocked(req, node, uncordon=placed_here)
        node = await self._read_node(req.cluster, req.node)
        if not req.cordon:
            await self._record_state(node, state)
            return NodeUpdateStarted(node=node_info(node))
        cordon = await self._cordon(CordonRequest(cluster=req.cluster, node=req.node, owner=req.rollout,
                                                  reason=f"rollout {req.rollout}"), node, state)  # fmt: skip
        if await self._non_interruptible_running(req):  # one landed between the first look and the cordon
            blocked = await self._blocked(req, await self._read_node(req.cluster, req.node), uncordon=cordon.owned)
            return blocked.model_copy(update={"cordon": cordon})
        plan = await self._plan_drain(DrainPlanRequest(cluster=req.cluster, node=req.node,
                                                       settings=req.drain or DrainSettings()))  # fmt: skip
        return NodeUpdateStarted(node=node_info(node), cordon=cordon, drain=plan)

    async def _non_interruptible_running(self, req: NodeUpdateStart) -> bool:
        if not req.non_interrupt_selector:
            return False
        pods = await self._pods_on_node(req.cluster, req.node, req.non_interrupt_selector)
        return any(not pod_finished(p) for p in pods)

    async def _blocked(self, req: NodeUpdateStart, node: k8s.V1Node, *, uncordon: bool) -> NodeUpdateStarted:
        state = NodeRolloutState(cluster=req.cluster, node=req.node, rollout=req.rollout, state="blocked",
                                 reason=NON_INTERRUPTIBLE_RUNNING)  # fmt: skip
        await self._hand_back(node, state, packages={}, uncordon=uncordon)
        return NodeUpdateStarted(node=node_info(node), blocked=NON_INTERRUPTIBLE_RUNNING)

    @activity.defn
    async def run_node_stages(self, req: NodeStages) -> NodeStagesResult:
        """Run the node's stages in order, each one's start recorded on the node (the rollout annotation's `stage`),
        each as the Job `run_stage_job` makes (a failed Job tried again as a new one, up to `tries` in all); a reboot
        interrupt is done once the node is back with a new boot ID and Ready within `reboot_timeout_seconds` (else
        it failed). The first stage that fails ends it: a result, not an error.

        Its workflow cancelling it (a pause) stops it before the next stage, never inside one (a reboot and its
        verification are one): it returns what ran, `held`. Any other cancellation (the worker shutting down, an
        operator's pause or reset of the activity) ends it at once, and the retry resumes where the heartbeat
        details say; the Jobs already made are adopted (names derive from stage and try, never from the attempt),
        so a stage never runs twice. Details a crash left behind by a few seconds only repeat looks, never Jobs.
        """
        if not req.boot_id and any(st.stage == "interrupt" and st.interrupt == "reboot" for st in req.stages):
            raise reboot_unverifiable(req.node)
        stop = asyncio.Event()
        work = asyncio.ensure_future(self._node_stages(req, stop))
        while True:
            try:
                return await asyncio.shield(work)
            except asyncio.CancelledError:
                why = activity.cancellation_details()
                if why is not None and why.cancel_requested and not (why.worker_shutdown or why.paused or why.reset):
                    stop.set()  # the stage that runs finishes first
                    continue
                work.cancel()
                await asyncio.wait([work])
                raise

    async def _node_stages(self, req: NodeStages, stop: asyncio.Event) -> NodeStagesResult:
        info = activity.info()
        details = info.heartbeat_details[0] if info.heartbeat_details else None
        details = details if isinstance(details, dict) else {}
        result = NodeStagesResult(stages=[StageRecord.model_validate(r) for r in details.get("done") or []],
                                  reboot_seconds=details.get("reboot_seconds"))  # fmt: skip
        for index in range(len(result.stages), len(req.stages)):
            if stop.is_set():
                result.held = True
                return result
            stage = req.stages[index]
            resumed = details if details.get("index") == index else {}
            # Where this stage stands (its try, its Job, the reboot's deadline), after what is done: sent at once
            # when one of those changes, else every BEAT_SECONDS (the SDK sends one per 0.8 heartbeat timeout).
            at: dict[str, Any] = {"index": index, "started": float(resumed.get("started") or time.time())}
            done, sent = self._stages_done(result), [None, 0.0]

            def beat(more: dict[str, Any]) -> None:
                at.update(more)
                where = (at.get("try"), (at.get("job") or {}).get("uid"), at.get("reboot_deadline"))
                if where != sent[0] or time.monotonic() - sent[1] >= BEAT_SECONDS:
                    activity.heartbeat({**at, **done})
                    sent[:] = [where, time.monotonic()]

            await self._mark(NodeRolloutState(cluster=req.cluster, node=req.node, rollout=req.rollout,
                                              state="in_progress", package=stage.package, stage=stage.stage))
            record = await self._stage_tries(req, stage, resumed, beat)
            if record.succeeded and stage.stage == "interrupt" and stage.interrupt == "reboot":
                record = await self._rebooted(req, record, resumed, beat)
                if record.succeeded:
                    result.reboot_seconds = time.time() - at["started"]
            result.stages.append(record)
            activity.heartbeat({"index": index + 1, **self._stages_done(result)})
            if not record.succeeded:
                break
        return result

    @staticmethod
    def _stages_done(result: NodeStagesResult) -> dict[str, Any]:
        return {"done": [r.model_dump() for r in result.stages], "reboot_seconds": result.reboot_seconds}

    async def _mark(self, state: NodeRolloutState) -> None:
        """Record `state` on the node in one write, unread (a stage's start: the same record written again on a
        retry is harmless), checked in the node as the API server stored it."""
        change = state_change(None, state)
        core = await self._clusters.core(state.cluster)
        doing = f"recording rollout state of node {state.node}"
        stored = await call_json(doing, core.patch_node_without_preload_content(
            state.node, {"metadata": {"labels": change.labels, "annotations": change.annotations}},
            _request_timeout=REQUEST_TIMEOUT))  # fmt: skip
        metadata = stored.get("metadata") or {}
        if not change.shown_in(metadata.get("labels") or {}, metadata.get("annotations") or {}):
            raise ApplicationError(f"{doing}: the API server answered, but the node it returned does not show the "
                                   "change; writing it again", type="KubernetesUnavailable")  # fmt: skip

    async def _stage_tries(self, req: NodeStages, stage: NodeStage, resumed: dict[str, Any],
                           beat: Callable[[dict[str, Any]], None]) -> StageRecord:  # fmt: skip
        first = int(resumed.get("try") or 1)
        for try_number in range(first, req.tries + 1):
            job_req = StageJobRequest(cluster=req.cluster, node=req.node, rollout=req.rollout, ordinal=req.ordinal,
                                      try_number=try_number, **stage.model_dump())  # fmt: skip
            job = await self._run_job(job_req, resumed.get("job") if try_number == first else None,
                                        lambda d, t=try_number: beat({"try": t, "job": d}))  # fmt: skip
            if job.succeeded:
                break
        return StageRecord(package=stage.package, stage=stage.stage, succeeded=job.succeeded, attempts=try_number,
                           message=job.message)  # fmt: skip

    async def _rebooted(self, req: NodeStages, record: StageRecord, resumed: dict[str, Any],
                        beat: Callable[[dict[str, Any]], None]) -> StageRecord:  # fmt: skip
        """The reboot Job's verdict confirmed: the node back with a new boot ID and Ready, or the stage failed."""
        deadline = float(resumed.get("reboot_deadline") or time.time() + req.reboot_timeout_seconds)
        wait = RebootWait(cluster=req.cluster, node=req.node, previous_boot_id=req.boot_id,
                          timeout_seconds=req.reboot_timeout_seconds, poll_seconds=req.reboot_poll_seconds)
        try:
            await self._wait_rebooted(wait, deadline, lambda d: beat({"reboot_deadline": deadline, "reboot": d}))
        except ApplicationError as err:
            if err.type != "RebootTimeout":
                raise
            return record.model_copy(update={"succeeded": False, "message": err.message})
        return record

    @activity.defn
    async def finish_node_update(self, req: NodeUpdateFinish) -> None:
        """End a node's update in one write: the packages installed added to its packages annotation, its state
        `complete`, and with `uncordon` the rollout's own cordon removed (never someone else's). Conditional on the
        node's resourceVersion, so a concurrent writer's package entry is never lost (its 409 is retried); writes
        nothing when the node says all of it already. Short and idempotent: a local activity."""
        state = NodeRolloutState(cluster=req.cluster, node=req.node, rollout=req.rollout, state="complete")
        await self._hand_back(await self._read_node(req.cluster, req.node), state, packages=req.packages,
                              uncordon=req.uncordon)  # fmt: skip

    async def _hand_back(self, node: k8s.V1Node, state: NodeRolloutState, *, packages: dict[str, str],
                         uncordon: bool) -> None:  # fmt: skip
        """One conditional write: `packages` recorded, `state`, and the cordon of `state.rollout` removed."""
        annotations = node.metadata.annotations or {}
        labels: dict[str, Any] = {}
        changes: dict[str, Any] = {}
        shows: list[Callable[[k8s.V1Node], bool]] = []
        spec: dict[str, Any] = {}
        installed = packages_of(annotations, state.node)
        if any(installed.get(name) != version for name, version in packages.items()):
            value = json.dumps(dict(sorted({**installed, **packages}.items())), separators=(",", ":"))
            changes[PACKAGES_ANNOTATION] = value
            shows.append(lambda n: annotation_of(n, PACKAGES_ANNOTATION) == value)
        change = state_change(node, state)
        if change is not None:
            labels.update(change.labels)
            changes.update(change.annotations)
            shows.append(change.shown_by)
        if uncordon and annotations.get(CORDONED_BY) == state.rollout:
            changes.update({CORDONED_BY: None, CORDON_REASON: None})
            spec["unschedulable"] = False
            shows.append(lambda n: not (n.spec and n.spec.unschedulable) and annotation_of(n, CORDONED_BY) is None)
        if not shows:
            return
        patch: dict[str, Any] = {"metadata": {"resourceVersion": node.metadata.resource_version,
                                              "labels": labels, "annotations": changes}}  # fmt: skip
        if spec:
            patch["spec"] = spec
        await self._patch_node(state.cluster, state.node, patch, f"recording {state.state} on node {state.node}",
                               lambda n: all(show(n) for show in shows))  # fmt: skip
        if spec:
            activity.logger.info("uncordoned node %s for %s", state.node, state.rollout)

    @activity.defn
    async def check_node_conditions(self, req: ConditionGate) -> list[str]:
        """Gate on node conditions: each listed type must not be True, except Ready, which must be.

        Returns human-readable violations (empty: the gate passes), at most 50 and a count.
        """
        wanted = list(dict.fromkeys(req.conditions))
        violations: list[str] = []
        extra = 0
        token = None
        while True:
            page = await self._node_page(req.cluster, req.label_selector, LIST_CHUNK, token)
            for n in page.get("items") or []:
                name = n["metadata"]["name"]
                conds = {c.get("type"): c for c in (n.get("status") or {}).get("conditions") or []}
                for ctype in wanted:
                    c = conds.get(ctype)
                    bad = (c is None or c.get("status") != "True") if ctype == "Ready" else \
                        (c is not None and c.get("status") == "True")
                    if not bad:
                        continue
                    if len(violations) >= _VIOLATIONS_MAX:
                        extra += 1
                        continue
                    if c is None:
                        violations.append(f"node {name}: no {ctype} condition")
                    else:
                        why = ": ".join(x for x in (c.get("reason"), c.get("message")) if x)
                        violations.append(f"node {name}: {ctype} is {c.get('status')}" + (f" ({why})" if why else ""))
            activity.heartbeat(len(violations) + extra)
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                break
        if extra:
            violations.append(f"... and {extra} more violations")
        return violations
