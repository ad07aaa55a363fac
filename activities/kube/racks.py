"""Rack operations' reads and checks in a cluster: which nodes make up an NVLink domain (`read_rack`), whether its
fabric is back (`wait_fabric`: the clique label on every node again), and the domain-wide check (`run_rack_check`:
one Indexed Job with a pod on each of the domain's nodes, e.g. an NCCL all-reduce across the domain, its verdict the
Job's own Complete/Failed condition). RackRemediation (workflows/remediation/rack_remediation.py) calls them.

A domain is named by its rack (Topograph's accelerator label), which a fabric fault leaves in place, or by its NVLink
ClusterUUID (the clique label's first part), which such a fault takes off: `read_rack` accepts either and returns
every node of the rack and of the domain, so a node whose clique label is gone is still found by its rack.
"""

from __future__ import annotations

import asyncio
import re
import time
from datetime import timedelta
from typing import Any

from kubernetes.aio import client as k8s
from pydantic import Field
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.kube.connector import REQUEST_TIMEOUT
from activities.kube.models import JOB_NAMESPACE, JOB_STAGE_LABEL, JOB_TTL_SECONDS, JOB_WAIT_SLACK_SECONDS
from activities.kube.rollout_activities import RolloutNodeActivities
from activities.kube.stages import label_value, node_info, read_json, short_hash
from activities.kube.topology import NodePlace, TopologyLabels, place_of
from activities.models import StrictModel

RACK_CHECK_STAGE = "rack-check"  # the check Job's stage label: what a lab's job rules match
RACK_LABEL = "millwright.dev/rack"
HOSTNAME_LABEL = "kubernetes.io/hostname"
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")
_POLL_SECONDS = 2.0


class RackCheck(StrictModel):
    """The domain-wide check: a Job with one pod on each node of the domain that must succeed."""

    image: str = Field("ghcr.io/coreweave/nccl-tests", min_length=1, description="Image without tag.")
    version: str = Field("12.4.1-cudnn-devel-ubuntu22.04-nccl2.21.5-1-85f9143", min_length=1, description="Its tag.")
    command: list[str] = Field(default_factory=lambda: ["all_reduce_perf", "-b", "8", "-e", "8G", "-f", "2", "-g", "1"],
                               description="Each pod's command (one rank per node); empty: the image's own.")  # fmt: skip
    timeout: timedelta = Field(timedelta(minutes=15), gt=timedelta(0), description="The Job's deadline.")


class RackRead(StrictModel):
    cluster: str
    domain: str = Field(description="A rack (the topology's rack label) or an NVLink ClusterUUID.")
    topology: TopologyLabels = Field(default_factory=TopologyLabels)


class RackMember(StrictModel):
    place: NodePlace
    ready: bool
    unschedulable: bool
    cordoned_by: str | None = None
    boot_id: str = ""
    gpus: int = Field(0, description="The node's allocatable nvidia.com/gpu.")


class RackView(StrictModel):
    cluster: str
    rack: str = Field(description="What rack operations name the domain by: its rack, else its ClusterUUID.")
    domain: str = Field(description="The NVLink ClusterUUID its nodes show; empty when none shows one now.")
    nodes: list[RackMember] = Field(description="Name order.")

    @property
    def names(self) -> list[str]:
        return [m.place.node for m in self.nodes]


class FabricWait(StrictModel):
    cluster: str
    nodes: list[str]
    rack: str | None = Field(None, description="The nodes' rack label value: only the rack's nodes are read at each "
                             "look; None: every node with a clique label.")  # fmt: skip
    topology: TopologyLabels = Field(default_factory=TopologyLabels)
    timeout_seconds: float = Field(gt=0)


class FabricState(StrictModel):
    complete: bool = Field(description="Every node shows a clique label, all of one ClusterUUID.")
    missing: list[str] = Field(default_factory=list, description="Nodes without the clique label at the end.")
    domains: list[str] = Field(default_factory=list, description="The ClusterUUIDs the nodes show.")


class RackCheckRequest(RackCheck):
    cluster: str
    rack: str
    nodes: list[str] = Field(min_length=1)
    gpus: int = Field(ge=0, description="GPUs each pod requests: the node's all.")
    run: str = Field(description="The calling workflow's ID: in the Job's name and annotations.")
    attempt: int = Field(1, ge=1, description="The workflow's own try: a new try is a new Job.")


class RackCheckResult(StrictModel):
    job: str
    passed: bool
    message: str = ""


def _name(node: k8s.V1Node) -> str:
    return str(node.metadata.name)


def _member(node: k8s.V1Node, keys: TopologyLabels) -> RackMember:
    status = node.status
    alloc = (status.allocatable if status else None) or {}
    try:
        gpus = int(str(alloc.get("nvidia.com/gpu", "0")))
    except ValueError:
        gpus = 0
    info = node_info(node)
    return RackMember(place=place_of(info.name, node.metadata.labels or {}, keys), ready=info.ready,
                      unschedulable=info.unschedulable, cordoned_by=info.cordoned_by, boot_id=info.boot_id or "",
                      gpus=gpus)  # fmt: skip


class RackActivities(RolloutNodeActivities):
    async def _rack_nodes(self, cluster: str, rack_label: str, rack: str) -> list[k8s.V1Node]:
        return await self._list_nodes(cluster, f"{rack_label}={rack}") if _LABEL_VALUE.match(rack) else []

    @activity.defn
    async def read_rack(self, req: RackRead) -> RackView:
        """Every node of the domain `req.domain` names (a rack, or an NVLink ClusterUUID: then its racks whole):
        where each sits, its readiness, cordon and boot ID. None: a non-retryable RackNotFound."""
        keys = req.topology
        found = {_name(n): n for n in await self._rack_nodes(req.cluster, keys.rack, req.domain)}
        if not found:  # a ClusterUUID: the nodes that show it, and the rest of their racks
            for node in await self._list_nodes(req.cluster, keys.clique):
                if place_of(_name(node), node.metadata.labels or {}, keys).domain == req.domain:
                    found[_name(node)] = node
            for rack in sorted({r for n in found.values() if (r := (n.metadata.labels or {}).get(keys.rack))}):
                found |= {_name(n): n for n in await self._rack_nodes(req.cluster, keys.rack, rack)}
        if not found:
            raise ApplicationError(f"no node of cluster {req.cluster} is in rack or NVLink domain {req.domain!r} "
                                   f"(labels {keys.rack}, {keys.clique})", type="RackNotFound", non_retryable=True)  # fmt: skip
        members = [_member(found[name], keys) for name in sorted(found)]
        racks = sorted({m.place.rack for m in members if m.place.rack})
        domains = sorted({m.place.domain for m in members if not m.place.own_domain})
        return RackView(cluster=req.cluster, rack=racks[0] if len(racks) == 1 else req.domain,
                        domain=domains[0] if domains else "", nodes=members)  # fmt: skip

    @activity.defn
    async def wait_fabric(self, req: FabricWait) -> FabricState:
        """Wait, heartbeating, until every node shows the clique label of one ClusterUUID (GPU Feature Discovery
        writes it once the fabric manager's state is complete), or `timeout_seconds`: the state either way."""
        deadline = time.monotonic() + req.timeout_seconds
        wanted = set(req.nodes)
        keys = req.topology
        selector = f"{keys.rack}={req.rack},{keys.clique}" if req.rack else keys.clique
        while True:
            places = {p.node: p for n in await self._list_nodes(req.cluster, selector)
                      if (p := place_of(_name(n), n.metadata.labels or {}, keys)).node in wanted}  # fmt: skip
            missing = sorted(wanted - set(places))
            domains = sorted({p.domain for p in places.values()})
            state = FabricState(complete=not missing and len(domains) == 1, missing=missing, domains=domains)
            if state.complete or time.monotonic() >= deadline:
                return state
            activity.heartbeat({"missing": len(missing)})
            await asyncio.sleep(min(_POLL_SECONDS, max(0.0, deadline - time.monotonic())))

    @activity.defn
    async def run_rack_check(self, req: RackCheckRequest) -> RackCheckResult:
        """Run the domain-wide check and wait for its verdict. The Job is named from the run, rack and try, never
        from the activity attempt, so a retry adopts the Job an earlier attempt created; a failed Job is a result."""
        name = f"rack-check-{short_hash(req.run, req.rack, req.attempt)}"
        batch = k8s.BatchV1Api(await self._clusters.api(req.cluster))
        read = lambda: batch.read_namespaced_job_without_preload_content(name, JOB_NAMESPACE,
                                                                         _request_timeout=REQUEST_TIMEOUT)  # fmt: skip
        job = await read_json(f"reading Job {name}", read())
        if job is None:
            job = await self._create_job(req.cluster, name, rack_check_job(req, name), read)
        give_up = time.monotonic() + req.timeout.total_seconds() + JOB_WAIT_SLACK_SECONDS
        while True:
            verdicts = {c.get("type"): c for c in (job.get("status") or {}).get("conditions") or []
                        if c.get("status") == "True"}  # fmt: skip
            if "Complete" in verdicts:
                return RackCheckResult(job=name, passed=True, message=f"all {len(req.nodes)} ranks succeeded")
            if "Failed" in verdicts:
                failed = verdicts["Failed"]
                detail = await self._failure_detail(req.cluster, name)
                why = "; ".join(t for t in (failed.get("reason") or "Failed", failed.get("message"), detail) if t)
                return RackCheckResult(job=name, passed=False, message=why)
            if time.monotonic() > give_up:
                return RackCheckResult(job=name, passed=False, message=f"Job {name} gave no verdict within "
                                       f"{req.timeout.total_seconds():.0f}s")  # fmt: skip
            activity.heartbeat({"job": name, "active": (job.get("status") or {}).get("active") or 0})
            await asyncio.sleep(_POLL_SECONDS)
            job = await read_json(f"reading Job {name}", read()) or {}


def rack_check_job(req: RackCheckRequest, name: str) -> dict[str, Any]:
    """An Indexed Job of one pod per node: each pod asks for the node's every GPU and may land only on the domain's
    nodes (required node affinity) and never beside another of its ranks (pod anti-affinity), tolerating the cordon
    the remediation holds, as an MPI or torchrun launcher's workers would."""
    labels = {JOB_STAGE_LABEL: RACK_CHECK_STAGE, RACK_LABEL: label_value(req.rack),
              "app.kubernetes.io/managed-by": "millwright"}  # fmt: skip
    n = len(req.nodes)
    container: dict[str, Any] = {"name": "rack-check", "image": f"{req.image}:{req.version}",
                                 "env": [{"name": "MILLWRIGHT_RACK", "value": req.rack},
                                         {"name": "WORLD_SIZE", "value": str(n)}]}  # fmt: skip
    if req.command:
        container["command"] = req.command
    if req.gpus:
        container["resources"] = {"limits": {"nvidia.com/gpu": str(req.gpus)}}
    affinity = {
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": HOSTNAME_LABEL, "operator": "In", "values": list(req.nodes)}]}]}},
        "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": {"job-name": name}}, "topologyKey": HOSTNAME_LABEL}]},
    }  # fmt: skip
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "namespace": JOB_NAMESPACE, "labels": labels,
                     "annotations": {"millwright.dev/run": req.run, "millwright.dev/nodes": ",".join(req.nodes)}},
        "spec": {
            "completionMode": "Indexed", "completions": n, "parallelism": n, "backoffLimit": 0,
            "activeDeadlineSeconds": max(1, int(req.timeout.total_seconds())), "ttlSecondsAfterFinished": JOB_TTL_SECONDS,
            "template": {"metadata": {"labels": dict(labels)}, "spec": {
                "restartPolicy": "Never", "affinity": affinity, "containers": [container],
                "tolerations": [{"key": "node.kubernetes.io/unschedulable", "operator": "Exists",
                                 "effect": "NoSchedule"}],
            }},
        },
    }  # fmt: skip
