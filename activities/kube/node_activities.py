"""Node activities: inspect, cordon and uncordon a node (with ownership on the node, so a cordon placed by someone
else is never removed), the pods a drain moves, eviction through the API (so PodDisruptionBudgets hold), waiting for
the pods to go. KubeActivities (activities/kube/activities.py) builds on these; errors as activities/kube/errors.py
maps them."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import aiohttp
from kubernetes.aio import client as k8s
from kubernetes.aio.client.exceptions import ApiException
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.kube import node_marks as marks
from activities.kube.connector import LIST_CHUNK, REQUEST_TIMEOUT, ClusterConnector
from activities.kube.drain import (
    controller_of,
    eviction_refused,
    eviction_unsettled,
    pod_finished,
    pod_ref_of,
    uses_gpu,
)
from activities.kube.errors import FIRST_POLL_SECONDS, api_call, api_read, next_poll
from activities.kube.models import (
    CORDON_REASON,
    CORDONED_BY,
    CordonHandOver,
    CordonRequest,
    CordonResult,
    DrainPlan,
    DrainPlanRequest,
    EvictOutcome,
    EvictRequest,
    NodeInfo,
    NodeRef,
    NodeRolloutState,
    NodeValidationMark,
    PodQuery,
    PodRef,
    SkippedPod,
    UncordonResult,
    WaitPodsGoneRequest,
)
from activities.kube.shared_watch import NODES, SharedWatches
from activities.kube.stages import (
    annotation_of,
    node_info,
    node_not_found,
    state_change,
)


class NodeActivities:
    def __init__(self, connector: ClusterConnector) -> None:
        self._clusters = connector
        self._job_namespaces: set[str] = set()  # clusters whose Job namespace this worker has seen
        self._watches = SharedWatches(connector)

    async def close(self) -> None:
        """Stop the shared watches (before the connector closes their clients)."""
        await self._watches.close()

    async def _read_node(self, cluster: str, node: str) -> k8s.V1Node:
        core = await self._clusters.core(cluster)
        found = await api_read(f"reading node {node}", core.read_node(node, _request_timeout=REQUEST_TIMEOUT))
        if found is None:
            raise node_not_found(node, cluster)
        return found

    @activity.defn
    async def inspect_node(self, ref: NodeRef) -> NodeInfo:
        """Read a node: its cordon, who holds it, readiness and boot ID."""
        return node_info(await self._read_node(ref.cluster, ref.node))

    @activity.defn
    async def cordon_node(self, req: CordonRequest) -> CordonResult:
        """Mark the node unschedulable and record who did it and why.

        A node already cordoned by someone else is left as it is and reported, so the
        caller never removes that cordon later.
        """
        return await self._cordon(req, await self._read_node(req.cluster, req.node))

    async def _cordon(
        self, req: CordonRequest, node: k8s.V1Node, state: NodeRolloutState | None = None
    ) -> CordonResult:
        """Cordon `node` as read, recording `state` on it in the same write (or alone, when it is cordoned already)."""
        holder = (node.metadata.annotations or {}).get(CORDONED_BY)
        if node.spec.unschedulable:
            if state is not None:
                await self._record_state(node, state)
            if holder == req.owner:
                return CordonResult(owned=True)
            return CordonResult(owned=False, holder=holder or "unknown")
        # resourceVersion makes the patch conditional: if the node changed since we
        # read it (someone cordoned it meanwhile), the 409 sends us round again.
        metadata: dict[str, Any] = {
            "resourceVersion": node.metadata.resource_version,
            "annotations": {CORDONED_BY: req.owner, CORDON_REASON: req.reason[:1024]},
        }
        change = state_change(node, state) if state is not None else None
        if change is not None:
            metadata["labels"] = change.labels
            metadata["annotations"].update(change.annotations)
        await self._patch_node(req.cluster, req.node, {"metadata": metadata, "spec": {"unschedulable": True}},
                               f"cordoning node {req.node}",
                               lambda n: bool(n.spec and n.spec.unschedulable) and annotation_of(n, CORDONED_BY) == req.owner
                               and (change is None or change.shown_by(n)))  # fmt: skip
        activity.logger.info("cordoned node %s for %s", req.node, req.owner)
        if state is not None and change is not None:
            await self._state_event(node, state, "cordoned")
        return CordonResult(owned=True)

    async def _record_state(self, node: k8s.V1Node, req: NodeRolloutState) -> None:
        change = state_change(node, req)
        if change is not None:
            await self._patch_node(req.cluster, req.node, {"metadata": {"labels": change.labels,
                                                                        "annotations": change.annotations}},
                                   f"recording rollout state of node {req.node}", change.shown_by)  # fmt: skip
            await self._state_event(node, req)

    async def _state_event(self, node: k8s.V1Node, state: NodeRolloutState, *done: str) -> None:
        """The Event of a node's state change (NodeWright's reason `State`), with what the same write did."""
        where = f" at {state.package} {state.stage}" if state.stage else ""
        message = (
            f"{state.state}{where} (rollout {state.rollout})"
            + "".join(f"; {d}" for d in done)
            + (f": {state.reason}" if state.reason else "")
        )
        await marks.record_event(await self._clusters.core(state.cluster), marks.event_body(
            state.node, node.metadata.uid or "", "State", message, warning=state.state in ("erroring", "blocked"),
            key=(state.state, state.stage, state.package)))  # fmt: skip

    @activity.defn
    async def hand_over_cordon(self, req: CordonHandOver) -> CordonResult:
        """Pass our cordon to another run (`owned`: `req.to` holds it now, also when an earlier attempt passed it);
        a cordon someone else holds, or none, is left as it is and reported."""
        node = await self._read_node(req.cluster, req.node)
        holder = (node.metadata.annotations or {}).get(CORDONED_BY)
        if node.spec.unschedulable and holder == req.to:
            return CordonResult(owned=True)
        if not node.spec.unschedulable or holder != req.owner:
            return CordonResult(owned=False, holder=holder if node.spec.unschedulable else None)
        metadata = {"resourceVersion": node.metadata.resource_version,
                    "annotations": {CORDONED_BY: req.to, CORDON_REASON: req.reason[:1024]}}  # fmt: skip
        await self._patch_node(req.cluster, req.node, {"metadata": metadata}, f"handing node {req.node}'s cordon over",
                               lambda n: bool(n.spec and n.spec.unschedulable) and annotation_of(n, CORDONED_BY) == req.to)  # fmt: skip
        activity.logger.info("node %s: cordon of %s handed over to %s", req.node, req.owner, req.to)
        return CordonResult(owned=True)

    @activity.defn
    async def uncordon_node(self, req: CordonRequest) -> UncordonResult:
        """Remove our own cordon; never one that someone else placed.

        An earlier attempt that sent the uncordon (its heartbeat says so) and lost the answer is
        reported as the uncordon it was, once a fresh read shows the node schedulable without our mark.
        """
        node = await self._read_node(req.cluster, req.node)
        annotations = node.metadata.annotations or {}
        holder = annotations.get(CORDONED_BY)
        if holder != req.owner:
            if node.spec.unschedulable:
                return UncordonResult(
                    uncordoned=False, note=f"cordon held by {holder or 'someone else'}; left in place"
                )
            details = activity.info().heartbeat_details
            if details and details[0] == {"uncordon_sent": req.owner} and holder is None:
                return UncordonResult(uncordoned=True, note="cordon removed (the answer was lost; read back)")
            return UncordonResult(uncordoned=False, note="node was already schedulable")
        patch = {
            "metadata": {
                "resourceVersion": node.metadata.resource_version,
                "annotations": {CORDONED_BY: None, CORDON_REASON: None},
            },
            "spec": {"unschedulable": False},
        }
        activity.heartbeat({"uncordon_sent": req.owner})
        await self._patch_node(
            req.cluster,
            req.node,
            patch,
            f"uncordoning node {req.node}",
            lambda n: not (n.spec and n.spec.unschedulable) and annotation_of(n, CORDONED_BY) is None,
        )
        activity.logger.info("uncordoned node %s for %s", req.node, req.owner)
        return UncordonResult(uncordoned=True, note="cordon removed")

    async def _patch_node(
        self, cluster: str, node: str, patch: dict[str, Any], doing: str, shows: Callable[[k8s.V1Node], bool]
    ) -> None:
        """Patch a node and check the answer (the node as stored after the write) shows the change: a
        write is done only when the API server's own copy says so. An answer that does not (a lost
        write, a webhook that undid it) is a retryable error, and the retry reads the node first."""
        core = await self._clusters.core(cluster)
        stored = await api_call(doing, core.patch_node(node, patch, _request_timeout=REQUEST_TIMEOUT))
        if not isinstance(stored, k8s.V1Node) or stored.metadata is None or not shows(stored):
            raise ApplicationError(
                f"{doing}: the API server answered, but the node it returned does not show "
                "the change; reading it again",
                type="KubernetesUnavailable",
            )
        self._watches.wrote(cluster, NODES, node, stored.metadata.resource_version)

    async def _list_nodes(self, cluster: str, selector: str | None) -> list[k8s.V1Node]:
        """Every node matching the label selector (None: every node), read in pages."""
        core = await self._clusters.core(cluster)
        nodes: list[k8s.V1Node] = []
        token = None
        while True:
            page = await api_call("listing nodes", core.list_node(label_selector=selector or None, limit=LIST_CHUNK,
                                                                  _continue=token, _request_timeout=REQUEST_TIMEOUT))  # fmt: skip
            nodes.extend(page.items)
            token = page.metadata._continue if page.metadata else None
            if not token:
                return nodes

    async def _pods_on_node(self, cluster: str, node: str, label_selector: str | None) -> list[k8s.V1Pod]:
        core = await self._clusters.core(cluster)
        pods: list[k8s.V1Pod] = []
        token = None
        while True:
            page = await api_call(
                f"listing pods on node {node}",
                core.list_pod_for_all_namespaces(
                    field_selector=f"spec.nodeName={node}",
                    label_selector=label_selector or None,
                    limit=LIST_CHUNK,
                    _continue=token,
                    _request_timeout=REQUEST_TIMEOUT,
                ),
            )
            pods.extend(page.items)
            token = page.metadata._continue if page.metadata else None
            if not token:
                return pods

    @activity.defn
    async def list_unfinished_pods(self, query: PodQuery) -> list[PodRef]:
        """Pods on the node matching the selector that have not finished yet."""
        pods = await self._pods_on_node(query.cluster, query.node, query.label_selector)
        return [pod_ref_of(p) for p in pods if not pod_finished(p)]

    async def _daemonset_exists(self, cluster: str, namespace: str, name: str) -> bool:
        apps = k8s.AppsV1Api(await self._clusters.api(cluster))
        found = await api_read(
            f"reading DaemonSet {namespace}/{name}",
            apps.read_namespaced_daemon_set(name, namespace, _request_timeout=REQUEST_TIMEOUT),
        )
        return found is not None

    async def _plan_of(self, req: DrainPlanRequest, pods: list[k8s.V1Pod]) -> DrainPlan:
        """Filter the node's pods exactly as `kubectl drain` does (the plan, without its gangs: `_plan_drain`).

        Any pod that blocks the drain fails the plan before a single eviction, naming
        every such pod and the setting that would allow it.
        """
        settings = req.settings
        plan = DrainPlan()
        errors: dict[str, list[str]] = {}
        for pod in pods:
            ref, finished = pod_ref_of(pod), pod_finished(pod)
            annotations = pod.metadata.annotations or {}
            if "kubernetes.io/config.mirror" in annotations:
                plan.skipped.append(SkippedPod(pod=ref, reason="mirror pod"))
                continue
            if settings.gpu_pods_only and not uses_gpu(pod):
                plan.skipped.append(SkippedPod(pod=ref, reason="uses no GPU"))
                continue
            owner = controller_of(pod)
            if owner is not None and owner.kind == "DaemonSet" and not finished:
                if not await self._daemonset_exists(req.cluster, ref.namespace, owner.name):
                    if not settings.force:
                        errors.setdefault("pods whose DaemonSet is gone (use force to override)", []).append(str(ref))
                        continue
                elif settings.ignore_daemonsets:
                    plan.skipped.append(SkippedPod(pod=ref, reason="DaemonSet-managed"))
                    continue
                else:
                    errors.setdefault("DaemonSet-managed Pods (use ignore_daemonsets to ignore)", []).append(str(ref))
                    continue
            local_storage = any(v.empty_dir is not None for v in (pod.spec.volumes or []))
            if not finished and local_storage and not settings.delete_emptydir_data:
                errors.setdefault("Pods with local storage (use delete_emptydir_data to override)", []).append(str(ref))
                continue
            if owner is None and not finished and not settings.force:
                errors.setdefault("Pods that declare no controller (use force to override)", []).append(str(ref))
                continue
            plan.evict.append(ref)
        if errors:
            detail = "; ".join(f"cannot delete {what}: {', '.join(names)}" for what, names in errors.items())
            raise ApplicationError(
                f"drain of node {req.node} blocked: {detail}", type="DrainBlocked", non_retryable=True
            )
        return plan

    @staticmethod
    async def _read_pod(core: k8s.CoreV1Api, pod_ref: PodRef) -> k8s.V1Pod | None:
        return await api_read(
            f"reading pod {pod_ref}",
            core.read_namespaced_pod(pod_ref.name, pod_ref.namespace, _request_timeout=REQUEST_TIMEOUT),
        )

    async def _pod_state(self, core: k8s.CoreV1Api, pod_ref: PodRef) -> EvictOutcome | None:
        """What a fresh read says about the planned pod: gone (missing, or replaced by a new UID),
        already terminating, or None when it is still there and running."""
        pod = await self._read_pod(core, pod_ref)
        if pod is None:
            return EvictOutcome(status="gone", message="a fresh read finds no such pod")
        if pod.metadata.uid != pod_ref.uid:
            return EvictOutcome(status="gone", message="a fresh read finds a new pod of that name (new UID)")
        if pod.metadata.deletion_timestamp is not None:
            return EvictOutcome(status="evicted", message="pod is terminating")
        return None

    @activity.defn
    async def evict_pod(self, req: EvictRequest) -> EvictOutcome:
        """Ask the eviction API to evict one pod; a PDB refusal is an outcome, not an error.

        Only a fresh read of the pod ever says it is gone (missing, or a new UID): never the
        eviction's answer. The pod is read first, so a retry after a crash or a lost answer never
        sends a second eviction for a pod already terminating or gone. Every answer, as `kubectl
        drain` treats it (the table: docs/node-maintenance.md, "Draining a node"):
        2xx accepted (the drain then waits for the pod to go); 429 and 403 NamespaceTerminating
        blocked, tried again later; the more-than-one-budget 500 and 400/403/422 refused for good;
        anything else (404, 409, 5xx, a dropped connection: the eviction may or may not have
        happened) is settled by reading the pod again: gone or terminating as the read shows,
        otherwise still to evict (a 409 as blocked, the rest as a retryable error).

        With `node`, the node's DrainBlocked condition says so while this eviction is refused (and a Warning Event
        when it first is); with `was_blocked` too, it goes False once the eviction is accepted, if it still names
        this pod (a drain never blocked reads nothing more).
        """
        outcome = await self._evict(req)
        if req.node and (outcome.status == "blocked" or req.was_blocked):
            await self._show_drain_blocked(req, outcome)
        return outcome

    async def _evict(self, req: EvictRequest) -> EvictOutcome:
        core = await self._clusters.core(req.cluster)
        pod_ref = req.pod
        seen = await self._pod_state(core, pod_ref)
        if seen is not None:
            return seen
        delete_options = k8s.V1DeleteOptions(
            grace_period_seconds=req.grace_period_seconds,
            preconditions=k8s.V1Preconditions(uid=pod_ref.uid),
        )
        body = k8s.V1Eviction(
            api_version="policy/v1",
            kind="Eviction",
            metadata=k8s.V1ObjectMeta(name=pod_ref.name, namespace=pod_ref.namespace),
            delete_options=delete_options,
        )
        doing = f"evicting pod {pod_ref}"
        try:
            await core.create_namespaced_pod_eviction(
                pod_ref.name, pod_ref.namespace, body, _request_timeout=REQUEST_TIMEOUT
            )
        except ApiException as err:
            refused = eviction_refused(err, pod_ref)
            if refused is not None:
                return refused
            unsettled: ApplicationError | EvictOutcome = eviction_unsettled(err, pod_ref)
        except (TimeoutError, aiohttp.ClientError) as err:
            unsettled = ApplicationError(
                f"{doing}: connection failed, the eviction may or may not have happened: {err!r}",
                type="KubernetesUnavailable",
            )
        else:
            activity.logger.info("evicted pod %s", pod_ref)
            return EvictOutcome(status="evicted")
        # The answer does not say what happened to the pod: a fresh read does.
        settled = await self._pod_state(core, pod_ref)
        if settled is not None:
            return settled
        if isinstance(unsettled, EvictOutcome):
            return unsettled
        raise unsettled

    @activity.defn
    async def wait_pods_gone(self, req: WaitPodsGoneRequest) -> int:
        """Wait until every pod is deleted or replaced (a new UID), as kubectl drain waits.

        Heartbeats the number still terminating; the workflow bounds it with the drain timeout. With `node`, a pod
        still there `not_leaving_after_seconds` past its deletion deadline (deletionTimestamp: the delete plus its
        grace period; a finalizer or a kubelet keeps it) shows the node's DrainBlocked, until all are gone (and one
        shown by the evictions, `was_blocked`, goes False then too).
        """
        core = await self._clusters.core(req.cluster)
        remaining, poll, stuck_shown = list(req.pods), FIRST_POLL_SECONDS, False
        while True:
            still, stuck = [], None
            for pod_ref in remaining:
                pod = await self._read_pod(core, pod_ref)
                if pod is not None and pod.metadata.uid == pod_ref.uid:
                    still.append(pod_ref)
                    due = pod.metadata.deletion_timestamp
                    if (
                        stuck is None
                        and due is not None
                        and (datetime.now(UTC) - due).total_seconds() > req.not_leaving_after_seconds
                    ):
                        stuck = pod_ref
            remaining = still
            activity.heartbeat(len(remaining))
            if not remaining:
                if req.node and (req.was_blocked or stuck_shown):
                    await self._set_drain_blocked(req.cluster, req.node, False, "Drained", "every pod planned is gone")
                return len(req.pods)
            if req.node and stuck is not None and not stuck_shown:
                stuck_shown = True
                await self._set_drain_blocked(
                    req.cluster,
                    req.node,
                    True,
                    "PodNotTerminating",
                    f"{stuck} outlived its termination grace period",
                    event=True,
                )
            await asyncio.sleep(poll)
            poll = next_poll(poll, req.poll_interval_seconds)

    async def _show_drain_blocked(self, req: EvictRequest, outcome: EvictOutcome) -> None:
        if outcome.status == "blocked":
            why = (
                f"eviction of {req.pod} refused"
                + (f" by PodDisruptionBudget {outcome.budget}" if outcome.budget else "")
                + (f": {outcome.message}" if outcome.message else "")
            )
            await self._set_drain_blocked(req.cluster, req.node, True, "PodDisruptionBudget" if outcome.budget
                                          else "EvictionRefused", why, event=True)  # fmt: skip
        else:
            await self._set_drain_blocked(req.cluster, req.node, False, "EvictionAccepted",
                                          f"eviction of {req.pod} accepted", naming=str(req.pod))  # fmt: skip

    async def _set_drain_blocked(self, cluster: str, node: str, blocked: bool, reason: str, message: str, *,
                                 event: bool = False, naming: str | None = None) -> None:  # fmt: skip
        """The node's DrainBlocked condition `blocked` (True) or not, written only when it changes; it is set False
        only where it is True, and with `naming` only when its message names that pod (another pod may still be
        refused). A status write, merged by condition type: the kubelet's conditions stay."""
        found = await self._read_node(cluster, node)
        previous = marks.condition(found.status.conditions or [], marks.DRAIN_BLOCKED)
        if not blocked:
            if previous is None or previous.status != "True" or (naming and naming not in (previous.message or "")):
                return
        elif previous is not None and previous.status == "True" and previous.message == message[:1024]:
            return
        core = await self._clusters.core(cluster)
        patch = marks.drain_blocked_patch(blocked, reason, message, previous)
        await api_call(
            f"recording DrainBlocked on node {node}",
            core.patch_node_status(node, patch, _request_timeout=REQUEST_TIMEOUT),
        )
        if event and (previous is None or previous.status != "True"):
            await marks.record_event(core, marks.event_body(node, found.metadata.uid or "", marks.DRAIN_BLOCKED, message,
                                                            warning=True, key=(message,)))  # fmt: skip

    @activity.defn
    async def mark_node_validation(self, req: NodeValidationMark) -> None:
        """Show a validation's verdict on the node: the `MillwrightValidated` condition, the reason annotation while
        it fails (removed once it passes), and a Warning Event when it fails. Idempotent: a retry writes the same
        and the Event's name repeats. Never touches the cordon: a failed node stays as its workflow left it."""
        found = await self._read_node(req.cluster, req.node)
        core = await self._clusters.core(req.cluster)
        previous = marks.condition(found.status.conditions or [], marks.VALIDATED)
        reason, message = ("ValidationPassed", f"validated by {req.by}") if req.passed else \
            ("ValidationFailed", f"{req.by}: {req.reason}")  # fmt: skip
        await api_call(f"recording {marks.VALIDATED} on node {req.node}", core.patch_node_status(
            req.node, marks.condition_patch(marks.VALIDATED, req.passed, reason, message, previous),
            _request_timeout=REQUEST_TIMEOUT))  # fmt: skip
        value = None if req.passed else req.reason[:1000]
        if annotation_of(found, marks.VALIDATION_ANNOTATION) != value:
            await self._patch_node(req.cluster, req.node, {"metadata": {"annotations": {
                marks.VALIDATION_ANNOTATION: value}}}, f"recording the validation on node {req.node}",
                lambda n: annotation_of(n, marks.VALIDATION_ANNOTATION) == value)  # fmt: skip
        if not req.passed:
            await marks.record_event(core, marks.event_body(req.node, found.metadata.uid or "", reason, message,
                                                            warning=True, key=(req.by,)))  # fmt: skip
