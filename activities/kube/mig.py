"""MIG through NVIDIA's mig-manager: read what the GPU nodes advertise, set a node's `nvidia.com/mig.config`, and
wait for mig-manager's `nvidia.com/mig.config.state` (pending → rebooting → success | failed) and for the layout to be
advertised: by NVIDIA's DRA driver where it publishes the node's ResourceSlice (its devices counted by type and
profile), else by the device plugin (the node's `nvidia.com/gpu` and `nvidia.com/mig-<profile>` capacity).

mig-manager neither cordons nor drains, so `set_mig_config` refuses (MigGpuPodsRunning) while a pod that uses GPUs
still runs on the node: a label is never changed under running GPU work, whatever the caller did before. The write
also removes the state label, so a `success` left from the previous layout is never read as this one's.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Literal

from kubernetes.aio import client as k8s
from kubernetes.aio.client.exceptions import ApiException
from pydantic import Field
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.kube import node_marks as marks
from activities.kube.connector import REQUEST_TIMEOUT, ClusterConnector
from activities.kube.drain import (
    GPU_RESOURCE,
    MIG_RESOURCE_PREFIX,
    is_gpu_resource,
    pod_finished,
    pod_ref_of,
    uses_gpu,
)
from activities.kube.errors import FIRST_POLL_SECONDS, api_call, next_poll
from activities.kube.node_activities import NodeActivities
from activities.models import StrictModel

CONFIG_LABEL = "nvidia.com/mig.config"
STATE_LABEL = "nvidia.com/mig.config.state"
PRODUCT_LABEL = "nvidia.com/gpu.product"
COUNT_LABEL = "nvidia.com/gpu.count"
# mig-manager has no reason label (it logs why it failed); the lab's emulator writes the reason on this annotation,
# and a site's own mig-manager wrapper may too. Without it, `failed` is reported with no reason but the state.
REASON_ANNOTATION = "lab.millwright.dev/mig.config.failure"
BY_ANNOTATION = "millwright.dev/mig-config-by"
DRA_DRIVER = "gpu.nvidia.com"  # NVIDIA's DRA driver (k8s-dra-driver-gpu)
SLICES = ("resource.k8s.io", "v1beta1", "resourceslices")


class MigNodesRequest(StrictModel):
    cluster: str
    selector: str | None = Field(None, description="Label selector of the nodes to move; None: `nodes` only.")
    nodes: list[str] = Field(default_factory=list, description="Nodes to move by name.")


class MigNode(StrictModel):
    """A GPU node as mig-manager and the device plugin show it."""

    name: str
    selected: bool = Field(description="Matched by the request's selector or named in its list.")
    product: str = Field("", description="The `nvidia.com/gpu.product` label.")
    gpus: int = Field(0, description="Physical GPUs: the `nvidia.com/gpu.count` label, else nvidia.com/gpu capacity.")
    config: str | None = None
    state: str | None = None
    reason: str = ""
    resources: dict[str, int] = Field(
        default_factory=dict, description="GPU devices advertised (as resource names), none zero: its DRA driver's "
        "ResourceSlice where it has one, else its capacity.",
    )  # fmt: skip
    advertised_by: Literal["device-plugin", "dra"] = "device-plugin"
    unschedulable: bool = False


class MigNodes(StrictModel):
    nodes: list[MigNode] = Field(description="Every GPU node of the cluster, and every selected node.")
    missing: list[str] = Field(default_factory=list, description="Nodes named in the request that do not exist.")


class MigConfigWrite(StrictModel):
    cluster: str
    node: str
    config: str
    by: str = Field(description="The workflow that asks: recorded on the node.")


class MigConfigWritten(StrictModel):
    written: bool = Field(description="False: the label already named the config (a retry, or nothing to do).")
    previous: str | None = None


class MigConfigWait(StrictModel):
    cluster: str
    node: str
    config: str
    expected: dict[str, int] = Field(description="The GPU resources the node must advertise once it succeeds.")
    timeout_seconds: float = Field(gt=0, description="The whole wait, reboots included.")
    pending_seconds: float = Field(gt=0, description="How long the state label may stay missing or `pending`.")
    poll_seconds: float = Field(5.0, gt=0)


MigOutcome = Literal["success", "failed", "missing", "pending", "timed-out", "capacity-mismatch", "config-changed"]


class MigConfigResult(StrictModel):
    outcome: MigOutcome
    state: str | None = None
    reason: str = ""
    resources: dict[str, int] = Field(default_factory=dict)
    seconds: float = 0


def _advertised(node: k8s.V1Node) -> dict[str, int]:
    counts: dict[str, int] = {}
    for name, value in ((node.status.capacity if node.status else None) or {}).items():
        if is_gpu_resource(name):
            try:
                count = int(str(value))
            except ValueError:
                continue
            if count:
                counts[name] = count
    return counts


def _dra_counts(devices: list[dict]) -> dict[str, int]:
    """A DRA driver's devices as the device plugin's resource names: whole GPUs, MIG devices by profile."""
    counts: dict[str, int] = {}
    for d in devices:
        attrs = (d.get("basic") or {}).get("attributes") or {}
        kind = (attrs.get("type") or {}).get("string")
        profile = (attrs.get("profile") or {}).get("string") or ""
        name = (
            GPU_RESOURCE if kind == "gpu" else MIG_RESOURCE_PREFIX + profile.replace("+", ".") if kind == "mig" else ""
        )
        if name:
            counts[name] = counts.get(name, 0) + 1
    return counts


def mig_node(node: k8s.V1Node, selected: bool, dra: list[dict] | None = None) -> MigNode:
    """`dra`: the devices of the node's ResourceSlice from NVIDIA's DRA driver; None: it has none."""
    labels = node.metadata.labels or {}
    resources = _advertised(node) if dra is None else _dra_counts(dra)
    try:
        gpus = int(labels.get(COUNT_LABEL, ""))
    except ValueError:
        gpus = resources.get(GPU_RESOURCE, 0)
    return MigNode(name=node.metadata.name, selected=selected, product=labels.get(PRODUCT_LABEL, ""), gpus=gpus,
                   config=labels.get(CONFIG_LABEL), state=labels.get(STATE_LABEL),
                   reason=(node.metadata.annotations or {}).get(REASON_ANNOTATION, ""), resources=resources,
                   advertised_by="device-plugin" if dra is None else "dra",
                   unschedulable=bool(node.spec and node.spec.unschedulable))  # fmt: skip


class MigActivities(NodeActivities):
    """The MIG activities; a node's reads, node and pod listing are NodeActivities'."""

    def __init__(self, connector: ClusterConnector) -> None:
        super().__init__(connector)

    async def _dra_devices(self, cluster: str, node: str | None = None) -> dict[str, list[dict]]:
        """Node → the devices of its ResourceSlices from NVIDIA's DRA driver (`node`: that node's only); empty where
        the cluster serves no resource.k8s.io/v1beta1."""
        api = k8s.CustomObjectsApi(await self._clusters.api(cluster))
        selector = f"spec.driver={DRA_DRIVER}" + (f",spec.nodeName={node}" if node else "")
        try:
            found = await api_call("listing ResourceSlices", api.list_cluster_custom_object(
                *SLICES, field_selector=selector, _request_timeout=REQUEST_TIMEOUT))  # fmt: skip
        except ApplicationError as err:
            if isinstance(err.__cause__, ApiException) and err.__cause__.status == 404:
                return {}  # no DRA on this cluster
            raise
        devices: dict[str, list[dict]] = {}
        for item in (found or {}).get("items") or []:
            spec = item.get("spec") or {}
            devices.setdefault(spec.get("nodeName") or "", []).extend(spec.get("devices") or [])
        return devices

    @activity.defn
    async def mig_nodes(self, req: MigNodesRequest) -> MigNodes:
        """Every GPU node (a GPU resource or a GPU product label) with its MIG labels and GPU capacity; a node is
        `selected` when the selector matches it or the list names it. Read only."""
        every = await self._list_nodes(req.cluster, None)
        chosen = {n.metadata.name for n in await self._list_nodes(req.cluster, req.selector)} if req.selector else set()
        chosen |= set(req.nodes)
        found = {n.metadata.name for n in every}
        dra = await self._dra_devices(req.cluster)
        nodes = [mig_node(n, n.metadata.name in chosen, dra.get(n.metadata.name or "")) for n in every
                 if n.metadata.name in chosen or _advertised(n) or PRODUCT_LABEL in (n.metadata.labels or {})]  # fmt: skip
        return MigNodes(nodes=nodes, missing=sorted(set(req.nodes) - found))

    @activity.defn
    async def set_mig_config(self, req: MigConfigWrite) -> MigConfigWritten:
        """Set the node's `nvidia.com/mig.config` (and clear its state label) unless it names the config already.
        Refused, non-retryable MigGpuPodsRunning, while a pod using GPUs runs on the node."""
        node = await self._read_node(req.cluster, req.node)
        previous = (node.metadata.labels or {}).get(CONFIG_LABEL)
        if previous == req.config:
            return MigConfigWritten(written=False, previous=previous)
        running = [str(pod_ref_of(p)) for p in await self._pods_on_node(req.cluster, req.node, None)
                   if not pod_finished(p) and uses_gpu(p)]  # fmt: skip
        if running:
            raise ApplicationError(
                f"node {req.node} still runs pods that use GPUs ({', '.join(sorted(running)[:10])}): its MIG layout "
                "changes only once they are drained", type="MigGpuPodsRunning", non_retryable=True,
            )  # fmt: skip
        patch = {"metadata": {"resourceVersion": node.metadata.resource_version,
                              "labels": {CONFIG_LABEL: req.config, STATE_LABEL: None},
                              "annotations": {BY_ANNOTATION: req.by}}}  # fmt: skip
        await self._patch_node(req.cluster, req.node, patch, f"setting {CONFIG_LABEL}={req.config} on {req.node}",
                               lambda n: (n.metadata.labels or {}).get(CONFIG_LABEL) == req.config)  # fmt: skip
        await marks.record_event(await self._clusters.core(req.cluster), marks.event_body(
            req.node, node.metadata.uid or "", "MigConfig", f"{CONFIG_LABEL} {previous or '(none)'} -> {req.config} "
            f"({req.by})", key=("mig", req.config)))  # fmt: skip
        activity.logger.info("set %s=%s on %s for %s", CONFIG_LABEL, req.config, req.node, req.by)
        return MigConfigWritten(written=True, previous=previous)

    @activity.defn
    async def await_mig_config(self, req: MigConfigWait) -> MigConfigResult:
        """Wait, heartbeating what the node shows, until mig-manager reports `success` and the node advertises
        `expected`, or `failed` (with its reason). The bounds count from the first attempt (kept in the heartbeat
        details): past `pending_seconds` with the state label missing or `pending`, or past `timeout_seconds`, or
        `success` with other resources advertised at the end, the outcome says so: reported, never guessed."""
        info = activity.info()
        details = info.heartbeat_details[0] if info.heartbeat_details else None
        kept = details if isinstance(details, dict) and details.get("start") else {}
        return await self._await(req, float(kept.get("start") or time.time()), activity.heartbeat,
                                 since=float(kept.get("since") or 0), last=str(kept.get("last") or "unset"))  # fmt: skip

    async def _await(self, req: MigConfigWait, start: float, beat: Callable[[dict], None], *, since: float,
                     last: str) -> MigConfigResult:  # fmt: skip
        """`await_mig_config` from `start`; the state label has read `last` since `since` (epoch seconds)."""
        poll = FIRST_POLL_SECONDS
        while True:
            node = await self._read_node(req.cluster, req.node)
            seen = mig_node(node, True, (await self._dra_devices(req.cluster, req.node)).get(req.node))
            now = time.time()
            result = MigConfigResult(outcome="timed-out", state=seen.state, reason=seen.reason,
                                     resources=seen.resources, seconds=round(now - start, 3))  # fmt: skip
            if (seen.state or "missing") != last:
                since, last = now, seen.state or "missing"
            if seen.config != req.config:
                return result.model_copy(update={"outcome": "config-changed",
                                                 "reason": f"{CONFIG_LABEL} is now {seen.config!r}"})  # fmt: skip
            if seen.state == "failed":
                return result.model_copy(update={"outcome": "failed"})
            if seen.state == "success" and seen.resources == req.expected:
                return result.model_copy(update={"outcome": "success"})
            beat({"start": start, "since": since, "last": last, "resources": seen.resources})
            if seen.state in (None, "pending") and now - since >= req.pending_seconds:
                return result.model_copy(update={"outcome": "missing" if seen.state is None else "pending"})
            if now - start >= req.timeout_seconds:
                mismatch = seen.state == "success"
                return result.model_copy(update={"outcome": "capacity-mismatch" if mismatch else "timed-out"})
            await asyncio.sleep(max(0.05, min(poll, start + req.timeout_seconds - now)))
            poll = next_poll(poll, req.poll_seconds)
