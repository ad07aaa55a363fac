"""The `read_gangs` activity: the cluster's gangs of GPU work, read from its pods and its schedulers' PodGroups
(activities/kube/topology.py says how a pod names its gang); and `plan_drain`, a node's drain plan with the gangs of
the pods it evicts, read narrowly (the node's pods, their gangs' namespaces and PodGroups), so that a drain can say
what it interrupted on a cluster of 10,000 nodes without reading them all."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from kubernetes.aio import client as k8s
from kubernetes.aio.client.exceptions import ApiException
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.kube.connector import LIST_CHUNK, REQUEST_TIMEOUT
from activities.kube.drain import is_gpu_resource
from activities.kube.errors import api_call
from activities.kube.models import DrainPlan, DrainPlanRequest
from activities.kube.node_activities import NodeActivities
from activities.kube.stages import call_json
from activities.kube.topology import Gang, GangMap, GangRequest, gang_of

# The PodGroups whose `spec.minMember` says how many running pods a gang needs (group, version, plural).
POD_GROUPS = {"kai": ("scheduling.run.ai", "v2alpha2", "podgroups"),
              "volcano": ("scheduling.volcano.sh", "v1beta1", "podgroups")}  # fmt: skip


def pod_gpus(pod: dict[str, Any]) -> int:
    """GPUs (whole ones and MIG instances) the pod's containers ask for: limits, else requests."""
    total = 0.0
    for c in (pod.get("spec") or {}).get("containers") or []:
        res = c.get("resources") or {}
        for name, value in {**(res.get("requests") or {}), **(res.get("limits") or {})}.items():
            if is_gpu_resource(name):
                try:
                    total += float(value)
                except (TypeError, ValueError):
                    continue
    return int(total)


def _daemon(pod: dict[str, Any]) -> bool:
    return any(r.get("controller") and r.get("kind") == "DaemonSet"
               for r in (pod.get("metadata") or {}).get("ownerReferences") or [])  # fmt: skip


def _running(pod: dict[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") == "Running" and not pod["metadata"].get("deletionTimestamp")


def _started(pod: dict[str, Any]) -> datetime | None:
    value = (pod.get("status") or {}).get("startTime")
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")) if value else None
    except ValueError:
        return None


def gangs_of_pods(pods: list[dict[str, Any]], min_members: dict[str, int]) -> list[Gang]:
    """Group GPU pods into gangs. A gang's minimum: its PodGroup's minMember (`min_members` by gang id), else all
    its pods (a JobSet or LeaderWorkerSet restarts whole on one pod's loss; a lone pod is its own unit)."""
    gangs: dict[str, Gang] = {}
    for pod in pods:
        md = pod.get("metadata") or {}
        phase = (pod.get("status") or {}).get("phase")
        if phase in ("Succeeded", "Failed") or _daemon(pod) or not (gpus := pod_gpus(pod)):
            continue
        ref = gang_of(md.get("namespace", ""), md.get("name", ""), md.get("labels") or {}, md.get("annotations") or {})
        gang = gangs.setdefault(ref.id, Gang(id=ref.id))
        gang.pods += 1
        gang.gpus += gpus
        if node := (pod.get("spec") or {}).get("nodeName"):
            gang.nodes.append(node)
        if _running(pod):
            gang.running += 1
            started = _started(pod)
            if started is not None and (gang.started is None or started > gang.started):
                gang.started = started  # the gang is whole since its last pod started
    for gang in gangs.values():
        gang.nodes = sorted(set(gang.nodes))
        gang.min_member = min_members.get(gang.id, gang.pods)
    return sorted(gangs.values(), key=lambda g: g.id)


def gang_disruptions(gangs: list[Gang], out: set[str]) -> dict[str, str]:
    """Gang id -> why it is disrupted: its pods on a node out of service (`out`), or its running pods below its
    minimum. A gang none of whose pods is bound to a node waits for the scheduler: it is not disrupted."""
    why: dict[str, str] = {}
    for gang in gangs:
        down = [n for n in gang.nodes if n in out]
        if down:
            why[gang.id] = f"pods on {', '.join(down)}, out of service"
        elif gang.nodes and gang.disrupted:
            why[gang.id] = f"below its minimum: {gang.running} of {gang.min_member} pods running"
    return why


def _ref_of(pod: dict[str, Any]) -> tuple[str, str]:
    md = pod.get("metadata") or {}
    return md.get("namespace", ""), md.get("name", "")


def _parts(gang_id: str) -> tuple[str, str, str]:
    """A gang id's kind, namespace and name (GangRef.id's form)."""
    kind, _, key = gang_id.partition(":")
    namespace, _, name = key.partition("/")
    return kind, namespace, name


class GangActivities(NodeActivities):
    @activity.defn
    async def plan_drain(self, req: DrainPlanRequest) -> DrainPlan:
        """List the node's pods and filter them exactly as `kubectl drain` does, with the gangs of those it evicts.

        Any pod that blocks the drain fails the plan before a single eviction, naming
        every such pod and the setting that would allow it.
        """
        return await self._plan_drain(req)

    async def _plan_drain(self, req: DrainPlanRequest) -> DrainPlan:
        pods = await self._pods_on_node(req.cluster, req.node, req.settings.pod_selector)
        plan = await self._plan_of(req, pods)
        evicted = {(p.namespace, p.name) for p in plan.evict}
        api = await self._clusters.api(req.cluster)
        planned = [api.sanitize_for_serialization(p) for p in pods]
        gangs, pod_gangs = await self._gangs_of(req.cluster, [p for p in planned if _ref_of(p) in evicted])
        return plan.model_copy(update={"gangs": gangs, "pod_gangs": pod_gangs})

    async def _gangs_of(self, cluster: str, pods: list[dict[str, Any]]) -> tuple[list[Gang], dict[str, str]]:
        """The gangs of GPU work `pods` belong to, whole (their pods on every node), and pod -> gang id. Reads only
        the namespaces of gangs of more than a pod (an annotation may name the gang, and no selector asks for one)
        and those gangs' PodGroups by name."""
        own = gangs_of_pods(pods, {})  # as the node's pods alone show them
        ids = {g.id for g in own}
        pod_gangs = {}
        for pod in pods:
            md = pod.get("metadata") or {}
            gang = gang_of(md.get("namespace", ""), md.get("name", ""), md.get("labels") or {},
                           md.get("annotations") or {}).id  # fmt: skip
            if gang in ids:  # a GPU pod (gangs_of_pods leaves out the rest)
                pod_gangs["/".join(_ref_of(pod))] = gang
        spread = sorted({_parts(g)[1] for g in ids if _parts(g)[0] != "pod"})
        whole = [p for p in pods if _ref_of(p)[0] not in spread]
        for namespace in spread:
            whole += await self._namespace_pods(cluster, namespace)
        min_members: dict[str, int] = {}
        for gang in sorted(ids):
            kind, namespace, name = _parts(gang)
            if kind in POD_GROUPS and (found := await self._pod_group(cluster, kind, namespace, name)) is not None:
                min_members[gang] = found
        read = {g.id: g for g in gangs_of_pods(whole, min_members)}
        return [read.get(g.id, g) for g in own], pod_gangs

    async def _namespace_pods(self, cluster: str, namespace: str) -> list[dict[str, Any]]:
        core = await self._clusters.core(cluster)
        pods: list[dict[str, Any]] = []
        token = None
        while True:
            page = await call_json(f"listing pods in {namespace}", core.list_namespaced_pod_without_preload_content(
                namespace, limit=LIST_CHUNK, _continue=token, _request_timeout=REQUEST_TIMEOUT))  # fmt: skip
            pods += page.get("items") or []
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return pods

    async def _pod_group(self, cluster: str, kind: str, namespace: str, name: str) -> int | None:
        """The PodGroup's minMember; None where there is none or the cluster does not serve its API."""
        group, version, plural = POD_GROUPS[kind]
        api = k8s.CustomObjectsApi(await self._clusters.api(cluster))
        try:
            found = await api_call(f"reading {plural}.{group} {namespace}/{name}", api.get_namespaced_custom_object(
                group, version, namespace, plural, name, _request_timeout=REQUEST_TIMEOUT))  # fmt: skip
        except ApplicationError as err:
            if isinstance(err.__cause__, ApiException) and err.__cause__.status == 404:
                return None  # no such PodGroup, or no such API (a 404 either way)
            raise
        value = ((found or {}).get("spec") or {}).get("minMember")
        return value if isinstance(value, int) else None

    @activity.defn
    async def read_gangs(self, req: GangRequest) -> GangMap:
        """Every gang of GPU work in the cluster: its pods' nodes, GPUs, running count against its minimum, when it
        last became whole. Read only (pods page by page, and the KAI and Volcano PodGroups where served)."""
        core = await self._clusters.core(req.cluster)
        pods: list[dict[str, Any]] = []
        token = None
        while True:
            page = await call_json("listing pods", core.list_pod_for_all_namespaces_without_preload_content(
                limit=LIST_CHUNK, _continue=token, _request_timeout=REQUEST_TIMEOUT))  # fmt: skip
            pods += page.get("items") or []
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                break
        min_members: dict[str, int] = {}
        for kind, (group, version, plural) in POD_GROUPS.items():
            for pg in await self._pod_groups(req.cluster, group, version, plural):
                md, spec = pg.get("metadata") or {}, pg.get("spec") or {}
                if isinstance(spec.get("minMember"), int):
                    min_members[f"{kind}:{md.get('namespace', '')}/{md.get('name', '')}"] = spec["minMember"]
        return GangMap(gangs=gangs_of_pods(pods, min_members), read_at=datetime.now(UTC))

    async def _pod_groups(self, cluster: str, group: str, version: str, plural: str) -> list[dict[str, Any]]:
        """Every PodGroup of a scheduler; none where the cluster does not serve its API."""
        api = k8s.CustomObjectsApi(await self._clusters.api(cluster))
        try:
            found = await api_call(f"listing {plural}.{group}", api.list_cluster_custom_object(
                group, version, plural, _request_timeout=REQUEST_TIMEOUT))  # fmt: skip
        except ApplicationError as err:
            if isinstance(err.__cause__, ApiException) and err.__cause__.status == 404:
                return []
            raise
        return (found or {}).get("items") or []
