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

import yaml
from kubernetes.aio import client as k8s
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.kube import node_marks as marks
from activities.kube.connector import LIST_CHUNK, REQUEST_TIMEOUT
from activities.kube.drain import pod_finished
from activities.kube.errors import api_read
from activities.kube.models import (
    BEAT_SECONDS,
    CORDON_REASON,
    CORDONED_BY,
    JOB_NAMESPACE,
    NON_INTERRUPTIBLE_RUNNING,
    PACKAGES_ANNOTATION,
    ROLLOUT_ANNOTATION,
    VALIDATION_DEFAULT_CONFIGMAP,
    VALIDATION_DEFAULT_KEY,
    ClusterDefault,
    ClusterDefaultRequest,
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
    Stage,
    StageJobRequest,
    StageRecord,
)
from activities.kube.racks import RackActivities
from activities.kube.shared_watch import NODES
from activities.kube.stages import (
    annotation_of,
    call_json,
    downgrades,
    is_reboot,
    node_info,
    packages_of,
    reboot_unverifiable,
    rollout_record,
    state_change,
)

_VIOLATIONS_MAX = 50  # check_node_conditions reports at most this many, then a count


# A stage a retry reports from the node, not from its Job: an earlier attempt's record of it was lost.
HANDED_BACK = "succeeded: an earlier attempt handed the node back"


def hand_back_patch(node: k8s.V1Node, state: NodeRolloutState, *, packages: dict[str, str], uncordon: bool,
                    removed: list[str] | None = None, untaint: bool = False,
                    ) -> tuple[dict[str, Any], list[Callable[[k8s.V1Node], bool]], list[str]]:  # fmt: skip
    """What hands `node` back (`_hand_back`): the conditional patch, the checks a node read back shows it by (none:
    the node shows it all, nothing to write), and what it does, for the log."""
    annotations = node.metadata.annotations or {}
    labels: dict[str, Any] = {}
    changes: dict[str, Any] = {}
    shows: list[Callable[[k8s.V1Node], bool]] = []
    spec: dict[str, Any] = {}
    done: list[str] = []
    installed = packages_of(annotations, state.node)
    gone = [name for name in removed or [] if name in installed]
    if gone or any(installed.get(name) != version for name, version in packages.items()):
        kept = {k: v for k, v in {**installed, **packages}.items() if k not in gone}
        value = json.dumps(dict(sorted(kept.items())), separators=(",", ":"))
        changes[PACKAGES_ANNOTATION] = value
        shows.append(lambda n: annotation_of(n, PACKAGES_ANNOTATION) == value)
        done += [f"{name} uninstalled" for name in gone]
    change = state_change(node, state)
    if change is not None:
        labels.update(change.labels)
        changes.update(change.annotations)
        shows.append(change.shown_by)
    if uncordon and annotations.get(CORDONED_BY) == state.rollout:
        changes.update({CORDONED_BY: None, CORDON_REASON: None})
        spec["unschedulable"] = False
        shows.append(lambda n: not (n.spec and n.spec.unschedulable) and annotation_of(n, CORDONED_BY) is None)
        done.append("uncordoned")
    if untaint and marks.has_runtime_taint(node):
        spec["taints"] = marks.taints_without_runtime_required(node)
        changes[marks.AUTO_TAINT_ANNOTATION] = None
        shows.append(lambda n: not marks.has_runtime_taint(n))
        done.append("runtime-required taint removed")
    patch: dict[str, Any] = {"metadata": {"resourceVersion": node.metadata.resource_version,
                                          "labels": labels, "annotations": changes}}  # fmt: skip
    if spec:
        patch["spec"] = spec
    return patch, shows, done


class KubeActivities(RackActivities):
    """Every Kubernetes activity of the worker: the node's (activities/kube/node_activities.py), the rollout's
    (activities/kube/rollout_activities.py), the gangs' (activities/kube/gang_reads.py) and, here, a node's update
    in three calls and the condition gates."""

    @activity.defn
    async def read_validation_default(self, req: ClusterDefaultRequest) -> ClusterDefault:
        """The cluster's validation default: the ConfigMap millwright-system/millwright-validation's `validation`
        key, YAML or JSON (docs/validation.md). No ConfigMap: not found (no default). A ConfigMap without the key,
        or one whose key is not a YAML mapping, is refused (non-retryable `InvalidValidationDefault`): an operator
        meant a default, and a run must not go on as if there were none. A read only: retried as any API call."""
        source = f"ConfigMap {JOB_NAMESPACE}/{VALIDATION_DEFAULT_CONFIGMAP} in {req.cluster}"
        core = await self._clusters.core(req.cluster)
        found = await api_read(f"reading {source}", core.read_namespaced_config_map(
            VALIDATION_DEFAULT_CONFIGMAP, JOB_NAMESPACE, _request_timeout=REQUEST_TIMEOUT))  # fmt: skip
        if found is None:
            return ClusterDefault(source=source, found=False)
        text = (found.data or {}).get(VALIDATION_DEFAULT_KEY)
        if text is None:
            raise ApplicationError(f"{source} has no key {VALIDATION_DEFAULT_KEY!r} (the validation settings)",
                                   type="InvalidValidationDefault", non_retryable=True)  # fmt: skip
        try:
            settings = yaml.safe_load(text)
        except yaml.YAMLError as err:
            raise ApplicationError(f"{source}: {VALIDATION_DEFAULT_KEY} is not YAML: {err}",
                                   type="InvalidValidationDefault", non_retryable=True) from err  # fmt: skip
        if not isinstance(settings, dict):
            raise ApplicationError(f"{source}: {VALIDATION_DEFAULT_KEY} must be a mapping of the validation "
                                   f"settings, not {type(settings).__name__}",
                                   type="InvalidValidationDefault", non_retryable=True)  # fmt: skip
        return ClusterDefault(source=source, found=True, settings=settings)

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

        Before all that, from the same fresh read: a node with a later version of a package installed than
        `packages` is refused unless `allow_downgrade` (its state `erroring`, nothing else written: `refused`);
        with `auto_taint`, a new node (no Millwright annotation yet) gets the runtime-required taint first.
        """
        state = NodeRolloutState(cluster=req.cluster, node=req.node, rollout=req.rollout, state="in_progress")
        if req.packages or req.auto_taint:
            node = await self._read_node(req.cluster, req.node)
            refused = "" if req.allow_downgrade else downgrades(node, req.node, req.packages)
            if refused:
                await self._record_state(node, state.model_copy(update={"state": "erroring", "reason": refused}))
                return NodeUpdateStarted(node=node_info(node), refused=refused)
            if req.auto_taint:
                await self._taint_if_new(req, node)
        if req.cordon and await self._non_interruptible_running(req):
            node = await self._read_node(req.cluster, req.node)
            record = rollout_record(node)  # in progress by this rollout, no stage yet: an earlier try of this start
            placed_here = (
                record.get("rollout") == req.rollout
                and record.get("state") == "in_progress"
                and not record.get("stage")
            )
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
        await marks.record_event(await self._clusters.core(req.cluster), marks.event_body(
            req.node, node.metadata.uid or "", "Drain", f"draining {len(plan.evict)} pods, {len(plan.skipped)} left in "
            f"place (rollout {req.rollout})", key=("drain",)))  # fmt: skip
        return NodeUpdateStarted(node=node_info(node), cordon=cordon, drain=plan)

    async def _taint_if_new(self, req: NodeUpdateStart, node: k8s.V1Node) -> None:
        """NodeWright's auto-taint: a node no rollout has touched yet is given the runtime-required taint (and the
        annotation saying who put it there), conditional on the node's resourceVersion; a node that has one
        already, or that any rollout has written to, is left as it is (one way: a node is new only once)."""
        annotations = node.metadata.annotations or {}
        if marks.has_runtime_taint(node) or PACKAGES_ANNOTATION in annotations or ROLLOUT_ANNOTATION in annotations:
            return
        patch = {"metadata": {"resourceVersion": node.metadata.resource_version,
                              "annotations": {marks.AUTO_TAINT_ANNOTATION: req.rollout}},
                 "spec": {"taints": marks.taints_with_runtime_required(node)}}  # fmt: skip
        await self._patch_node(
            req.cluster, req.node, patch, f"tainting new node {req.node} runtime-required", marks.has_runtime_taint
        )
        activity.logger.info("tainted new node %s runtime-required for %s", req.node, req.rollout)

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

        With `finish`, once every stage has succeeded it hands the node back as `finish_node_update` does, `finished`
        (also when asked to stop meanwhile: the write ends the node's update, it starts nothing). A retry that finds
        the node handed back already (an earlier attempt's result lost) writes nothing and reports the rest done.
        """
        self._check_stages(req)
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

    @staticmethod
    def _check_stages(req: NodeStages) -> None:
        """Refused before any of its stages runs: an unknown stage, a reboot with no boot ID to tell it by."""
        unknown = sorted({st.stage for st in req.stages if Stage.named(st.stage) is None})
        if unknown:
            raise ApplicationError(f"unknown stages {unknown}", type="InvalidStage", non_retryable=True)
        if not req.boot_id and any(is_reboot(st) for st in req.stages):
            raise reboot_unverifiable(req.node)

    async def _start_first(self, req: NodeStages, details: dict[str, Any]) -> tuple[NodeStages | None,
                                                                                    NodeUpdateStarted | None]:  # fmt: skip
        """`req.start` done (or what an earlier attempt heartbeat of it), then the stages its plan makes from the
        packages the node had, the boot ID and the finish's packages filled in; None for the stages when they must
        not run here: the node blocked, refused or with pods to drain (the workflow drains, then runs them), or
        handed back already by an earlier attempt whose beats were lost (nothing started: None too)."""
        assert req.start is not None and req.plan is not None
        started = NodeUpdateStarted.model_validate(details["started"]) if details.get("started") else None
        if started is None:
            if activity.info().attempt > 1:
                # Started and maybe finished by an earlier attempt before its first beat reached the server: a
                # node this rollout already completed is not started again (that would cordon it anew).
                record = rollout_record(await self._read_node(req.cluster, req.node))
                if record.get("rollout") == req.rollout and record.get("state") == "complete":
                    return None, None
            started = await self.start_node_update(req.start)
            activity.heartbeat({"started": started.model_dump(mode="json")})  # a retry never starts it again
        if started.blocked or started.refused or (started.drain is not None and started.drain.evict):
            return None, started
        stages, installs, removed = req.plan.stages_for(started.node.packages)
        finish = req.finish and req.finish.model_copy(update={"packages": installs, "removed": removed})
        planned = req.model_copy(update={"stages": stages, "boot_id": started.node.boot_id or "", "finish": finish})
        self._check_stages(planned)
        return planned, started

    async def _begin(self, req: NodeStages, details: dict[str, Any]) -> tuple[NodeStages | None, NodeStagesResult]:
        """The stages to run (None: none here, the result says why) and the result so far, from the details an
        earlier attempt heartbeat (`finished` already when that attempt handed the node back); with `req.start`, the
        node started first (`_start_first`)."""
        started = None
        if req.start is not None:
            planned, started = await self._start_first(req, details)
            if planned is None:
                return None, NodeStagesResult(stages=[], started=started, finished=started is None)
            req = planned
        result = NodeStagesResult(stages=[StageRecord.model_validate(r) for r in details.get("done") or []],
                                  reboot_seconds=details.get("reboot_seconds"), started=started)  # fmt: skip
        if req.finish is not None and activity.info().attempt > 1 and await self._handed_back(req.finish):
            # An earlier attempt ran every stage and handed the node back, its result lost (the server down): walking
            # the stages again would mark a finished, schedulable node `in_progress`. Nothing is written.
            rest = [StageRecord(package=st.package, stage=st.stage, succeeded=True, attempts=1, message=HANDED_BACK)
                    for st in req.stages[len(result.stages):]]  # fmt: skip
            result = result.model_copy(update={"stages": result.stages + rest, "finished": True})
        return req, result

    async def _node_stages(self, req: NodeStages, stop: asyncio.Event) -> NodeStagesResult:
        info = activity.info()
        details = info.heartbeat_details[0] if info.heartbeat_details else None
        details = details if isinstance(details, dict) else {}
        planned, result = await self._begin(req, details)
        if planned is None or result.finished:
            return result
        req = planned
        # A second reboot (an uninstall's, then the install's) must change the boot ID the first one left.
        boot_id = details.get("boot_id") or req.boot_id
        for index in range(len(result.stages), len(req.stages)):
            if stop.is_set():
                result.held = True
                return result
            stage = req.stages[index]
            resumed = details if details.get("index") == index else {}
            # Where this stage stands (its try, its Job, the reboot's deadline), after what is done: sent at once
            # when one of those changes, else every BEAT_SECONDS (the SDK sends one per 0.8 heartbeat timeout).
            at: dict[str, Any] = {"index": index, "started": float(resumed.get("started") or time.time())}
            done = self._stages_done(result, boot_id)
            sent: list[Any] = [None, 0.0]  # the last beat's place, and when it went
            what = f"{stage.package} {stage.version} {stage.stage}"
            core = await self._clusters.core(req.cluster)
            reason = Stage(stage.stage).event_reason
            marking: list[asyncio.Future[str]] = []

            def mark() -> None:
                """The stage's start on the node (its mark and Event), once: as soon as its Job exists, not before
                nor beside its creation. At a stage change a whole batch writes at once, and the Jobs are the
                critical path: a mark and an Event queued ahead of each Job made the batch's last node wait for
                two writes of every other node first (bench/rollout.py's timeline)."""
                if not marking:
                    marking.append(asyncio.ensure_future(self._stage_started(core, req, stage, what, reason)))

            def beat(more: dict[str, Any]) -> None:
                at.update(more)
                if (at.get("job") or {}).get("uid"):
                    mark()
                where = (at.get("try"), (at.get("job") or {}).get("uid"), at.get("reboot_deadline"))
                if where != sent[0] or time.monotonic() - sent[1] >= BEAT_SECONDS:
                    activity.heartbeat({**at, **done})
                    sent[:] = [where, time.monotonic()]

            try:
                record = await self._stage_tries(req, stage, resumed, beat)
            except BaseException:  # an error or a cancellation: the retry marks the stage again
                for marked in marking:
                    marked.cancel()
                await asyncio.gather(*marking, return_exceptions=True)
                raise
            mark()  # a stage that ended with no Job of its own (one vanished) is marked all the same
            uid = await marking[0]
            if record.succeeded and is_reboot(stage):
                record, rebooted = await self._rebooted(req, record, resumed, beat, boot_id)
                if record.succeeded:
                    result.reboot_seconds = time.time() - at["started"]
                    await marks.record_event(core, marks.event_body(
                        req.node, uid, "Reboot", f"rebooted for {what}: boot ID {boot_id} -> {rebooted}",
                        key=(stage.package, stage.stage, rebooted)))  # fmt: skip
                    boot_id = rebooted
            result.stages.append(record)
            activity.heartbeat({"index": index + 1, **self._stages_done(result, boot_id)})
            if not record.succeeded:
                await marks.record_event(core, marks.event_body(
                    req.node, uid, reason, f"{what} failed after {record.attempts} tries: {record.message}",
                    warning=True, key=(stage.package, stage.stage, "failed")))  # fmt: skip
                break
        if req.finish is not None and len(result.stages) == len(req.stages) and all(r.succeeded for r in result.stages):
            # Handed back here rather than by a call of its own: a batch's nodes then leave as their Jobs end, not in
            # waves of its workflow tasks. A retry from the last beat writes it again: nothing, as it is all there.
            await self.finish_node_update(req.finish)
            result.finished = True
        return result

    async def _stage_started(self, core: k8s.CoreV1Api, req: NodeStages, stage: NodeStage, what: str,
                             reason: str) -> str:  # fmt: skip
        """The stage's start on the node: its state mark, then an Event; the node's UID returned."""
        uid = await self._mark(NodeRolloutState(cluster=req.cluster, node=req.node, rollout=req.rollout,
                                                state="in_progress", package=stage.package, stage=stage.stage))  # fmt: skip
        await marks.record_event(core, marks.event_body(req.node, uid, reason, f"{what} started (rollout {req.rollout})",
                                                        key=(stage.package, stage.stage)))  # fmt: skip
        return uid

    @staticmethod
    def _stages_done(result: NodeStagesResult, boot_id: str) -> dict[str, Any]:
        done: dict[str, Any] = {"done": [r.model_dump() for r in result.stages],
                                "reboot_seconds": result.reboot_seconds, "boot_id": boot_id}  # fmt: skip
        if result.started is not None:  # every beat carries the start: a retry never starts the node again
            done["started"] = result.started.model_dump(mode="json")
        return done

    async def _mark(self, state: NodeRolloutState) -> str:
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
        self._watches.wrote(state.cluster, NODES, state.node, metadata.get("resourceVersion"))
        return metadata.get("uid") or ""

    async def _stage_tries(self, req: NodeStages, stage: NodeStage, resumed: dict[str, Any],
                           beat: Callable[[dict[str, Any]], None]) -> StageRecord:  # fmt: skip
        first = int(resumed.get("try") or 1)
        for try_number in range(first, req.tries + 1):
            job_req = StageJobRequest(cluster=req.cluster, node=req.node, rollout=req.rollout, ordinal=req.ordinal,
                                      try_number=try_number, **stage.model_dump())  # fmt: skip
            job = await self._run_job(job_req, resumed.get("job") if try_number == first else None,
                                        lambda d, t=try_number: beat({"try": t, "job": d}))  # type: ignore[misc]  # mypy infers no lambda with a default  # fmt: skip
            if job.succeeded:
                break
        return StageRecord(package=stage.package, stage=stage.stage, succeeded=job.succeeded, attempts=try_number,
                           message=job.message)  # fmt: skip

    async def _rebooted(self, req: NodeStages, record: StageRecord, resumed: dict[str, Any],
                        beat: Callable[[dict[str, Any]], None], boot_id: str) -> tuple[StageRecord, str]:  # fmt: skip
        """The reboot Job's verdict confirmed: the node back with a boot ID other than `boot_id` and Ready (the new
        one returned), or the stage failed."""
        deadline = float(resumed.get("reboot_deadline") or time.time() + req.reboot_timeout_seconds)
        wait = RebootWait(
            cluster=req.cluster,
            node=req.node,
            previous_boot_id=boot_id,
            timeout_seconds=req.reboot_timeout_seconds,
            poll_seconds=req.reboot_poll_seconds,
        )
        try:
            rebooted = await self._wait_rebooted(wait, deadline, lambda d: beat({"reboot_deadline": deadline,
                                                                                 "reboot": d}))  # fmt: skip
        except ApplicationError as err:
            if err.type != "RebootTimeout":
                raise
            return record.model_copy(update={"succeeded": False, "message": err.message}), boot_id
        return record, rebooted

    @activity.defn
    async def finish_node_update(self, req: NodeUpdateFinish) -> None:
        """End a node's update in one write: the packages installed added to its packages annotation (those
        uninstalled taken out), its state `complete`, with `uncordon` the rollout's own cordon removed (never someone
        else's), and with `untaint` the runtime-required taint. Conditional on the
        node's resourceVersion, so a concurrent writer's package entry is never lost (its 409 is retried); writes
        nothing when the node says all of it already. Short and idempotent: a local activity."""
        state = NodeRolloutState(cluster=req.cluster, node=req.node, rollout=req.rollout, state="complete")
        await self._hand_back(await self._read_node(req.cluster, req.node), state, packages=req.packages,
                              uncordon=req.uncordon, removed=req.removed, untaint=req.untaint)  # fmt: skip

    async def _hand_back(self, node: k8s.V1Node, state: NodeRolloutState, *, packages: dict[str, str],
                         uncordon: bool, removed: list[str] | None = None, untaint: bool = False) -> None:  # fmt: skip
        """One conditional write: `packages` recorded (`removed` ones dropped), `state`, the cordon of
        `state.rollout` removed, and with `untaint` the runtime-required taint."""
        patch, shows, done = hand_back_patch(node, state, packages=packages, uncordon=uncordon, removed=removed,
                                             untaint=untaint)  # fmt: skip
        if not shows:
            return
        await self._patch_node(state.cluster, state.node, patch, f"recording {state.state} on node {state.node}",
                               lambda n: all(show(n) for show in shows))  # fmt: skip
        if done:
            activity.logger.info("node %s for %s: %s", state.node, state.rollout, ", ".join(done))
        await self._state_event(node, state, *done)

    async def _handed_back(self, finish: NodeUpdateFinish) -> bool:
        """The node shows `finish` written already (complete for this rollout, its packages, no cordon of its)."""
        node = await self._read_node(finish.cluster, finish.node)
        state = NodeRolloutState(cluster=finish.cluster, node=finish.node, rollout=finish.rollout, state="complete")
        _, shows, _ = hand_back_patch(node, state, packages=finish.packages, uncordon=finish.uncordon,
                                      removed=finish.removed, untaint=finish.untaint)  # fmt: skip
        return not shows

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
                    bad = (
                        (c is None or c.get("status") != "True")
                        if ctype == "Ready"
                        else (c is not None and c.get("status") == "True")
                    )
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
