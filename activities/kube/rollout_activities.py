"""Rollout activities on a node: paged node listing and availability, the node's rollout state, package Jobs per
stage (NodeWright's execution substrate) and reboot verification by boot ID. KubeActivities
(activities/kube/activities.py) builds a node's whole update in three calls on these."""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from kubernetes.aio import client as k8s
from kubernetes.aio.client.exceptions import ApiException
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.kube.connector import LIST_CHUNK, REQUEST_TIMEOUT
from activities.kube.errors import FIRST_POLL_SECONDS, api_call, api_read, create, next_poll
from activities.kube.gang_reads import GangActivities, gang_disruptions
from activities.kube.models import (
    BEAT_SECONDS,
    INTERRUPTS,
    JOB_ATTEMPT_ANNOTATION,
    JOB_INTERRUPT_LABEL,
    JOB_NAMESPACE,
    JOB_NODE_LABEL,
    JOB_PACKAGE_LABEL,
    JOB_POLL_SECONDS,
    JOB_ROLLOUT_ANNOTATION,
    JOB_ROLLOUT_LABEL,
    JOB_STAGE_LABEL,
    JOB_TRY_ANNOTATION,
    JOB_TTL_SECONDS,
    JOB_VERSION_ANNOTATION,
    JOB_WAIT_SLACK_SECONDS,
    NodeAvailability,
    NodePage,
    NodePageRequest,
    NodeRolloutState,
    NodeSummary,
    RebootWait,
    Stage,
    StageJobRequest,
    StageJobResult,
    UnavailableRequest,
)
from activities.kube.shared_watch import NODES, READ, STAGE_JOBS, Follow
from activities.kube.stages import (
    call_json,
    label_value,
    node_not_found,
    node_ready,
    node_summary,
    only_labels,
    read_json,
    reboot_unverifiable,
    send_json,
    service_state,
    short_hash,
    stage_job_name,
    vanished,
)
from activities.kube.topology import GangMap, GangRequest, TopologyLabels, place_of
from activities.support.selectors import parse_label_selector, selector_matches

# A continue token of a page answered from what the shared watch of nodes keeps: the last node name it gave.
KEPT_PAGE = "kept-after:"


class RolloutNodeActivities(GangActivities):
    # ------------------------------------------------------------ rollouts: nodes

    async def _node_page(self, cluster: str, label_selector: str, limit: int, token: str | None) -> dict[str, Any]:
        core = await self._clusters.core(cluster)
        return await call_json(
            "listing nodes",
            core.list_node_without_preload_content(
                label_selector=label_selector or None,
                limit=limit,
                _continue=token,
                _request_timeout=REQUEST_TIMEOUT,
            ),
        )

    @activity.defn
    async def list_nodes_page(self, req: NodePageRequest) -> NodePage:
        """One page of the node list (limit/continue), summarised, for fleets of 10,000+ nodes: from what the shared
        watch of nodes keeps while it vouches for it (a page's token then says so), else from the API server."""
        token = req.continue_token
        after = token.removeprefix(KEPT_PAGE) if token and token.startswith(KEPT_PAGE) else None
        if token is None or after is not None:
            kept = await self._watches.kept(req.cluster, NODES)
            if kept is not None:
                return self._kept_page(sorted(kept.items()), req, after or "")
        if after is not None:  # the watch stopped vouching between two pages: the rest of the list, from the API
            listed = await self._listed_nodes(req.cluster, req.label_selector)
            return self._kept_page([(n.name, n) for n in listed if n.name > after], req, after)
        page = await self._node_page(req.cluster, req.label_selector, req.limit, token)
        return NodePage(
            nodes=[node_summary(n, req.label_keys) for n in page.get("items") or []],
            continue_token=(page.get("metadata") or {}).get("continue") or None,
        )

    @staticmethod
    def _kept_page(nodes: list[tuple[str, NodeSummary]], req: NodePageRequest, after: str) -> NodePage:
        """The page after the node named `after` (in name order, as the API server lists) of the nodes matching the
        request's selector, with the token for the next one."""
        selector = parse_label_selector(req.label_selector)
        matching = (n for name, n in nodes if name > after and selector_matches(selector, n.labels))
        page = list(itertools.islice(matching, req.limit + 1))
        more = len(page) > req.limit
        page = page[: req.limit]
        if req.label_keys:
            page = [n.model_copy(update={"labels": only_labels(n.labels, req.label_keys)}) for n in page]
        return NodePage(
            nodes=page,
            continue_token=f"{KEPT_PAGE}{page[-1].name}" if more else None,
        )

    async def _listed_nodes(self, cluster: str, label_selector: str) -> list[NodeSummary]:
        """Every node the selector matches, from the API server page by page, summarised."""
        nodes: list[NodeSummary] = []
        token = None
        while True:
            page = await self._node_page(cluster, label_selector, LIST_CHUNK, token)
            nodes += [node_summary(n, []) for n in page.get("items") or []]
            if not activity.info().is_local:  # the disruption budget reads it as a local activity
                activity.heartbeat(len(nodes))
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return nodes

    @activity.defn
    async def list_unavailable_nodes(self, req: UnavailableRequest) -> list[str]:
        """Targeted nodes that are cordoned (by anyone) or not Ready, in name order."""
        return list((await self.node_availability(req)).unavailable)

    @activity.defn
    async def node_availability(self, req: UnavailableRequest) -> NodeAvailability:
        """How many nodes the selector matches, which are out of service (cordoned by anyone, or not Ready)
        and why, and which are control-plane nodes, returning only those by name; read page by page, or for the whole
        cluster from what the shared watch of nodes keeps."""
        # The whole cluster's (the disruption budget's read): from the shared watch of nodes while it vouches for
        # what it keeps (activities/kube/shared_watch.py), as current as a list and without its pages.
        kept = None if req.label_selector else await self._watches.kept(req.cluster, NODES)
        nodes = (sorted(kept.values(), key=lambda n: n.name) if kept is not None
                 else await self._listed_nodes(req.cluster, req.label_selector))  # fmt: skip
        avail = self._availability(nodes)
        if req.topology is not None:
            await self._place(req, req.topology, avail, nodes)
        return avail

    @staticmethod
    def _availability(nodes: list[NodeSummary]) -> NodeAvailability:
        """`node_availability` from each node's `service_state`, in name order."""
        out = NodeAvailability(total=len(nodes), read_at=datetime.now(UTC))
        for name, (why, control_plane) in ((n.name, service_state(n)) for n in nodes):
            if why:
                out.unavailable[name] = why
            if control_plane:
                out.control_plane.append(name)
        return out

    async def _place(
        self, req: UnavailableRequest, keys: TopologyLabels, avail: NodeAvailability, nodes: list[NodeSummary]
    ) -> None:
        """Where the nodes out of service and those asked about sit and, asked, their gangs and the cluster's gangs
        disrupted: an answer as large as the budget's decision, not as the cluster (10,000 nodes)."""
        asked = set(avail.unavailable) | set(req.nodes)
        avail.places = {n.name: place_of(n.name, n.labels, keys) for n in nodes if n.name in asked}
        if req.gangs:
            gangs = (await self.read_gangs(GangRequest(cluster=req.cluster))).gangs
            on = GangMap(gangs=gangs).by_node()
            avail.gangs_on = {n: [g.id for g in on[n]] for n in sorted(asked) if n in on}
            avail.disrupted_gangs = gang_disruptions(gangs, set(avail.unavailable))

    @activity.defn
    async def set_node_rollout_state(self, req: NodeRolloutState) -> None:
        """Record the node's rollout state: a label (for selectors) and an annotation (the detail).

        Writes nothing when both already say the same (the `updated` time aside).
        """
        await self._record_state(await self._read_node(req.cluster, req.node), req)

    # ------------------------------------------------------------ rollouts: package Jobs

    async def _ensure_namespace(self, cluster: str) -> None:
        core = await self._clusters.core(cluster)
        if await api_read(
            f"reading namespace {JOB_NAMESPACE}", core.read_namespace(JOB_NAMESPACE, _request_timeout=REQUEST_TIMEOUT)
        ):
            return
        body = {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": JOB_NAMESPACE, "labels": {"app.kubernetes.io/managed-by": "millwright"}},
        }
        creating = core.create_namespace(body, _request_timeout=REQUEST_TIMEOUT)  # type: ignore[arg-type]  # a dict body is sent as it is
        await create(f"creating namespace {JOB_NAMESPACE}", creating)

    @staticmethod
    def _stage_job(req: StageJobRequest, name: str, attempt: int) -> dict[str, Any]:
        stage = Stage(req.stage)
        interrupt = stage.is_interrupt
        labels = {
            JOB_NODE_LABEL: label_value(req.node),
            JOB_PACKAGE_LABEL: label_value(req.package),
            JOB_STAGE_LABEL: label_value(req.stage),
            JOB_ROLLOUT_LABEL: short_hash(req.rollout, n=16),
            "app.kubernetes.io/managed-by": "millwright",
        }
        if interrupt:
            labels[JOB_INTERRUPT_LABEL] = label_value(req.interrupt or "noop")
        annotations = {
            JOB_ROLLOUT_ANNOTATION: req.rollout,
            JOB_VERSION_ANNOTATION: req.version,
            JOB_ATTEMPT_ANNOTATION: str(attempt),
            JOB_TRY_ANNOTATION: str(req.try_number),
        }
        image = f"{req.image}:{req.version}"
        env = [
            {"name": "MILLWRIGHT_STAGE", "value": req.stage},
            {"name": "MILLWRIGHT_PACKAGE", "value": req.package},
            {"name": "MILLWRIGHT_VERSION", "value": req.version},
            {"name": "MILLWRIGHT_NODE", "value": req.node},
            {"name": "MILLWRIGHT_NODE_ORDER", "value": str(req.ordinal)},
            {"name": "MILLWRIGHT_SERVICES", "value": ",".join(req.services)},
        ]
        if interrupt:
            env.append({"name": "MILLWRIGHT_INTERRUPT", "value": req.interrupt or "noop"})

        def container(cname: str, step: str) -> dict[str, Any]:
            c: dict[str, Any] = {
                "name": cname,
                "image": image,
                **({"command": req.command} if req.command else {"args": [step]}),
                "env": env,
                "securityContext": {"privileged": True},
                "volumeMounts": [{"name": "host-root", "mountPath": "/host"}],
            }
            if req.config:
                c["envFrom"] = [{"configMapRef": {"name": name}}]
            return c

        # NodeWright's order: the stage's work, then its check; init containers run in order.
        if stage.checked:
            init, main = [container(req.stage, req.stage)], [container(f"{req.stage}-check", f"{req.stage}-check")]
        else:
            init, main = [], [container(req.stage, req.stage)]
        pod_spec: dict[str, Any] = {
            "nodeName": req.node,
            "restartPolicy": "OnFailure" if interrupt else "Never",
            "hostPID": True,
            "hostNetwork": True,
            "priorityClassName": "system-node-critical",
            "tolerations": [
                {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"},
                {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
                {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"},
                {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoSchedule"},
                {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoSchedule"},
            ],
            "volumes": [{"name": "host-root", "hostPath": {"path": "/"}}],
            "containers": main,
        }
        if init:
            pod_spec["initContainers"] = init
        spec: dict[str, Any] = {
            "backoffLimit": 0,  # Temporal owns retries, visibly: a new attempt is a new Job
            "completions": 1,
            "parallelism": 1,
            "activeDeadlineSeconds": max(1, math.ceil(req.timeout_seconds)),
            "ttlSecondsAfterFinished": JOB_TTL_SECONDS,
            "template": {"metadata": {"labels": dict(labels), "annotations": dict(annotations)}, "spec": pod_spec},
        }
        if not interrupt:  # an eviction does not burn the (zero) backoff budget; needs restartPolicy Never
            spec["podFailurePolicy"] = {
                "rules": [{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}]
            }
        return {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": name, "namespace": JOB_NAMESPACE, "labels": labels, "annotations": annotations},
            "spec": spec,
        }

    @staticmethod
    def _same_job(existing: dict[str, Any], wanted: dict[str, Any]) -> bool:
        labels = existing["metadata"].get("labels") or {}
        annotations = existing["metadata"].get("annotations") or {}
        want_md = wanted["metadata"]
        return all(labels.get(k) == v for k, v in want_md["labels"].items()) and all(
            annotations.get(k) == want_md["annotations"][k] for k in (JOB_ROLLOUT_ANNOTATION, JOB_VERSION_ANNOTATION)
        )

    async def _failure_detail(self, cluster: str, job: str) -> str:
        """The failed container's termination message, as `kubectl describe` would show it."""
        core = await self._clusters.core(cluster)
        pods = await api_call(
            f"listing pods of Job {job}",
            core.list_namespaced_pod(JOB_NAMESPACE, label_selector=f"job-name={job}", _request_timeout=REQUEST_TIMEOUT),
        )
        for pod in sorted(
            pods.items,
            key=lambda p: p.metadata.creation_timestamp or datetime.min.replace(tzinfo=UTC),
            reverse=True,
        ):
            statuses = list((pod.status.init_container_statuses if pod.status else None) or []) + list(
                (pod.status.container_statuses if pod.status else None) or []
            )
            for cs in statuses:
                for state in (cs.state, cs.last_state):
                    term = state.terminated if state else None
                    if term is not None and term.exit_code:
                        text = f"container {cs.name} of pod {pod.metadata.name}: {term.reason or 'Error'} (exit code {term.exit_code})"
                        return f"{text}: {term.message.strip()}" if term.message else text
        return ""

    @activity.defn
    async def run_stage_job(self, req: StageJobRequest) -> StageJobResult:
        """Run one package stage on one node as a Job, and wait for its verdict.

        The Job's name is derived from the rollout, node, package, version, stage, the workflow's
        try of the stage and the calling workflow run, never from the activity attempt: a retry
        after a crash at any line (even between creating the Job and the first heartbeat) finds
        and adopts the same Job, so a stage never runs twice; the workflow trying the stage
        again, or a new run for the node, gets a new Job. A failed Job is a result, not an
        error: `succeeded=False` with the reason and the failing container's message. So is a Job
        that vanished after an attempt saw it: it is never created again under the same try.
        The verdict is only ever the Job's own Complete/Failed condition, as the API server gives it: a read, or
        the cluster's shared watch of stage Jobs (activities/kube/shared_watch.py).
        """
        info = activity.info()
        return await self._run_job(
            req, info.heartbeat_details[0] if info.heartbeat_details else None, activity.heartbeat
        )

    async def _run_job(self, req: StageJobRequest, previous: Any, beat: Callable[[dict[str, Any]], None]) \
            -> StageJobResult:  # fmt: skip
        """`run_stage_job`: `previous` is what an earlier attempt heartbeat about this Job, `beat` heartbeats it."""
        stage = Stage.named(req.stage)
        if stage is None:
            raise ApplicationError(f"unknown stage {req.stage!r}", type="InvalidStage", non_retryable=True)
        if stage.is_interrupt and (req.interrupt or "noop") not in INTERRUPTS:
            raise ApplicationError(f"unknown interrupt {req.interrupt!r}", type="InvalidStage", non_retryable=True)
        info = activity.info()
        key = short_hash(
            req.rollout, req.node, req.package, req.version, req.stage, req.try_number, info.workflow_run_id
        )
        name = stage_job_name(req.package, req.stage, key)
        started = float(previous["started"]) if isinstance(previous, dict) and previous.get("started") else time.time()
        attempt = int(previous.get("attempt", info.attempt)) if isinstance(previous, dict) else info.attempt
        batch = k8s.BatchV1Api(await self._clusters.api(req.cluster))
        # Read and written as plain JSON: many Jobs run at once, and the typed client's models (managedFields and
        # all) cost more than the call itself.
        read = lambda: batch.read_namespaced_job_without_preload_content(
            name, JOB_NAMESPACE, _request_timeout=REQUEST_TIMEOUT
        )
        # Followed through the cluster's watch from before the first read, so every later change reaches the wait.
        with self._watches.follow(req.cluster, STAGE_JOBS, name) as follow:
            return await self._wait_job(req, name, started, attempt, previous, follow, read, beat)

    async def _wait_job(self, req: StageJobRequest, name: str, started: float, attempt: int, previous: Any,
                        follow: Follow, read: Callable, beat: Callable[[dict[str, Any]], None]) -> StageJobResult:  # fmt: skip
        """`_run_job` from its first read of the Job to the verdict, the Job's changes learnt from `follow`."""
        info = activity.info()
        body = self._stage_job(req, name, attempt)
        # A first attempt creates it at once; a retry (an earlier attempt may have made it, its answer lost) reads
        # first and creates only what is missing.
        follow.reading()
        existing = None if info.attempt == 1 and not previous else await read_json(f"reading Job {name}", read())
        if existing is None and isinstance(previous, dict) and previous.get("uid"):
            # An earlier attempt created (or adopted) it: the stage may have run. Creating it again would
            # run it twice under one try; the workflow's next try (a new Job) is the visible way to redo it.
            return StageJobResult(job=name, succeeded=False, attempt=attempt, message=vanished(name))
        if existing is None:  # a Job that exists after all (409) is read and adopted
            existing = await self._create_job(req.cluster, name, body, read)
            activity.logger.info("created Job %s for %s %s on %s", name, req.package, req.stage, req.node)
        if not self._same_job(existing, body):
            raise ApplicationError(
                f"Job {JOB_NAMESPACE}/{name} exists but belongs to another stage run "
                f"(labels {existing['metadata'].get('labels')}); delete it by hand",
                type="JobConflict",
                non_retryable=True,
            )
        uid = existing["metadata"]["uid"]
        beat({"job": name, "uid": uid, "started": started, "attempt": attempt})
        if req.config:
            await self._create_job_config(req, name, uid, body["metadata"]["labels"])
        give_up = started + req.timeout_seconds + JOB_WAIT_SLACK_SECONDS
        job: dict[str, Any] | None
        job, waiting = existing, time.time()
        while True:
            if job is None or job["metadata"].get("uid") != uid:
                return StageJobResult(job=name, succeeded=False, attempt=attempt, message=vanished(name))
            status = job.get("status") or {}
            verdicts = {c.get("type"): c for c in status.get("conditions") or [] if c.get("status") == "True"}
            if "Complete" in verdicts:
                return StageJobResult(job=name, succeeded=True, attempt=attempt)
            failed = verdicts.get("Failed")
            if failed is not None:
                reason = failed.get("reason") or "Failed"
                reason = f"{reason}: {failed['message']}" if failed.get("message") else reason
                detail = await self._failure_detail(req.cluster, name)
                return StageJobResult(
                    job=name, succeeded=False, attempt=attempt, message=f"{reason}; {detail}" if detail else reason
                )
            if time.time() > give_up:
                return StageJobResult(
                    job=name,
                    succeeded=False,
                    attempt=attempt,
                    message=f"Job {name} gave no verdict within {req.timeout_seconds:.0f}s "
                    f"(+{JOB_WAIT_SLACK_SECONDS:.0f}s)",
                )
            beat({"job": name, "uid": uid, "started": started, "attempt": attempt, "active": status.get("active") or 0})
            # Without a stream to vouch for it, looked at every tenth of the time waited (a verdict ~10% late at most).
            poll = min(JOB_POLL_SECONDS, max(FIRST_POLL_SECONDS, (time.time() - waiting) / 10))
            news = await follow.next(poll, within=min(BEAT_SECONDS, give_up - time.time()))
            if news == READ:
                follow.reading()
                job = await read_json(f"reading Job {name}", read())
            elif isinstance(news, dict):
                job = news

    async def _create_job_config(self, req: StageJobRequest, name: str, uid: str, labels: dict[str, str]) -> None:
        """The Job's ConfigMap (`req.config`, read by its containers), owned by the Job; one that exists is kept."""
        core = await self._clusters.core(req.cluster)
        cm = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": name,
                "namespace": JOB_NAMESPACE,
                "labels": dict(labels),
                "ownerReferences": [
                    {
                        "apiVersion": "batch/v1",
                        "kind": "Job",
                        "name": name,
                        "uid": uid,
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "data": dict(req.config),
        }
        creating = core.create_namespaced_config_map(JOB_NAMESPACE, cm, _request_timeout=REQUEST_TIMEOUT)  # type: ignore[arg-type]  # a dict body is sent as it is
        await create(f"creating ConfigMap {name}", creating)

    async def _create_job(self, cluster: str, name: str, body: dict[str, Any], read: Callable) -> dict[str, Any]:
        """Create the Job (its namespace first, once per cluster and whenever it went missing); an existing one
        (409) is read and returned."""
        batch = k8s.BatchV1Api(await self._clusters.api(cluster))
        for first in (True, False):
            if cluster not in self._job_namespaces or not first:
                await self._ensure_namespace(cluster)
                self._job_namespaces.add(cluster)
            try:
                return await call_json(
                    f"creating Job {name}",
                    send_json(batch.api_client, "POST", f"/apis/batch/v1/namespaces/{JOB_NAMESPACE}/jobs", body),
                )
            except ApplicationError as err:
                status = err.__cause__.status if isinstance(err.__cause__, ApiException) else None
                if status == 409:
                    return await call_json(f"reading Job {name}", read())
                if status != 404 or not first:  # 404: the namespace is gone; made again, then once more
                    raise
        raise AssertionError("unreachable")

    # ------------------------------------------------------------ rollouts: reboots and gates

    @activity.defn
    async def wait_node_rebooted(self, req: RebootWait) -> str:
        """Wait until the node reports a new boot ID and is Ready; return the new boot ID.

        The deadline counts from the first attempt (kept in the heartbeat details), so retries
        do not extend it; past it, a non-retryable RebootTimeout. Without the boot ID from before the
        reboot nothing can prove one happened: a non-retryable RebootUnverifiable (the node stays as it is).
        """
        if not req.previous_boot_id:
            raise reboot_unverifiable(req.node)
        info = activity.info()
        details = info.heartbeat_details[0] if info.heartbeat_details else None
        if isinstance(details, dict) and details.get("deadline"):
            deadline = float(details["deadline"])
        else:
            first = info.scheduled_time.timestamp() if info.scheduled_time else 0.0
            base = first if info.attempt > 1 and first > 946684800 else time.time()  # no epoch-0 test defaults
            deadline = base + req.timeout_seconds
        return await self._wait_rebooted(req, deadline, activity.heartbeat)

    async def _wait_rebooted(self, req: RebootWait, deadline: float, beat: Callable[[dict[str, Any]], None]) -> str:
        """`wait_node_rebooted` until `deadline` (epoch seconds); `beat` heartbeats where it stands. The node's
        changes come from the cluster's shared watch of nodes; without it, it is read every `poll_seconds` at most."""
        core = await self._clusters.core(req.cluster)
        read = lambda: core.read_node_without_preload_content(req.node, _request_timeout=REQUEST_TIMEOUT)
        poll = FIRST_POLL_SECONDS
        with self._watches.follow(req.cluster, NODES, req.node) as follow:
            follow.reading()
            node = await read_json(f"reading node {req.node}", read())
            while True:
                if node is None:
                    raise node_not_found(req.node, req.cluster)
                boot = ((node.get("status") or {}).get("nodeInfo") or {}).get("bootID") or ""
                ready = node_ready(node)
                if boot and boot != req.previous_boot_id and ready:
                    activity.logger.info("node %s rebooted: boot ID %s", req.node, boot)
                    return boot
                beat({"deadline": deadline, "boot_id": boot, "ready": ready})
                if time.time() >= deadline:
                    state = "still has the old boot ID" if boot == req.previous_boot_id else "is not Ready"
                    raise ApplicationError(
                        f"node {req.node} did not come back from its reboot within {req.timeout_seconds:.0f}s: "
                        f"it {state}",
                        type="RebootTimeout",
                        non_retryable=True,
                    )
                left = max(0.05, deadline - time.time())
                news = await follow.next(min(poll, left), within=min(BEAT_SECONDS, left))
                poll = next_poll(poll, req.poll_seconds)
                if news == READ:
                    follow.reading()
                    node = await read_json(f"reading node {req.node}", read())
                elif isinstance(news, dict):
                    node = news
