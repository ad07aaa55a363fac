"""Node health as remediation reads it, and quarantine as it writes it (Kubernetes).

- `list_node_health` / `read_node_health`: readiness (with when it last changed), the cordon and who
  holds it, the node conditions asked for (Node Problem Detector's `KernelDeadlock`, a GPU health
  condition such as `GpuHealthy`), the labels asked for (e.g. `nvidia.com/gpu.health`) and whether
  Millwright quarantined the node. Paged as plain JSON, for clusters of thousands of nodes.
- `list_node_names` / `read_nodes_health`: the same for a fleet split into slices: the names alone, page
  by page (about 20 bytes a node in the caller's history, where a node's health is about 700), then one
  slice's nodes read by name, each result bounded by the slice, whatever the size of the cluster.
- `quarantine_node`: keep the node cordoned and mark it quarantined: an annotation with the reason
  (JSON) and a `NoSchedule` taint, so nothing lands on it even if someone uncordons it by mistake.
  Reads first, writes only what is missing, conditional on the node's resourceVersion.
- `mark_remediated`: when a remediation ends, an annotation saying when, by whom and how it ended; the sweep's
  per-node cooldown reads it (`NodeHealth.last_remediation`).

Errors as in `activities.kube.errors`: what a retry cannot fix is non-retryable with a type; the rest is
left to the workflow's retry policy.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from datetime import UTC, datetime
from typing import Any

from pydantic import Field, field_validator
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.kube.connector import LIST_CHUNK, REQUEST_TIMEOUT, ClusterConnector
from activities.kube.errors import api_call
from activities.kube.models import CORDON_REASON, CORDONED_BY
from activities.kube.stages import call_json, read_json
from activities.kube.validators import validate_label_selector
from activities.models import StrictModel

# Set by a remediation that gave up: why, by which workflow, when (JSON). Removed by an operator.
QUARANTINE_ANNOTATION = "millwright.dev/quarantine"
QUARANTINE_TAINT = "millwright.dev/quarantine"
# Set by a remediation when it ends: {"at", "by", "outcome"} (JSON); the sweep's cooldown counts from `at`.
LAST_REMEDIATION_ANNOTATION = "millwright.dev/last-remediation"
# Taints are replaced as a whole list (a JSON merge patch), never merged, so removing one is exact.
MERGE_PATCH = "application/merge-patch+json"


class ConditionState(StrictModel):
    status: str = Field(description="True, False or Unknown.")
    reason: str = ""
    message: str = ""
    since: datetime | None = Field(None, description="lastTransitionTime.")


class LastRemediation(StrictModel):
    at: datetime
    by: str = Field("", description="The remediation's workflow ID.")
    outcome: str = ""


class NodeHealth(StrictModel):
    name: str
    ready: bool
    ready_since: datetime | None = Field(None, description="When Ready last changed.")
    unschedulable: bool = False
    cordoned_by: str | None = None
    cordon_reason: str | None = None
    conditions: dict[str, ConditionState] = Field(default_factory=dict, description="Only the types asked for.")
    labels: dict[str, str] = Field(default_factory=dict, description="Only the keys asked for.")
    quarantined: str | None = Field(None, description="The quarantine reason, when Millwright quarantined the node.")
    boot_id: str | None = None
    last_remediation: LastRemediation | None = Field(None, description="How the node's last remediation ended.")
    read_at: datetime | None = Field(
        None,
        description="When it was read (the worker's clock): the time a decision on it is made at, recorded with "
        "the result so that a replay decides at the same time (workflow.now() can differ between the two).",
    )

    def decided_at(self, fallback: datetime) -> datetime:
        """The time to judge it at: when it was read; `fallback` (workflow.now()) for results recorded before."""
        return self.read_at or fallback


class NodeHealthQuery(StrictModel):
    cluster: str
    label_selector: str = ""
    condition_types: list[str] = Field(default_factory=list)
    label_keys: list[str] = Field(default_factory=list)
    limit: int = Field(500, ge=1)
    continue_token: str | None = None

    _selector = field_validator("label_selector")(validate_label_selector)


class NodeHealthPage(StrictModel):
    nodes: list[NodeHealth]
    continue_token: str | None = None


class NodeNamesQuery(StrictModel):
    cluster: str
    label_selector: str = ""
    max_names: int = Field(5000, ge=1, le=20000, description="Names per answer (API pages of 500 each).")
    continue_token: str | None = None

    _selector = field_validator("label_selector")(validate_label_selector)


class NodeNamesPage(StrictModel):
    names: list[str]
    continue_token: str | None = Field(None, description="Where the next answer starts; None: the last one.")


class NodesHealthRequest(StrictModel):
    cluster: str
    nodes: list[str] = Field(min_length=1, max_length=1000, description="Node names (one slice of a fleet).")
    condition_types: list[str] = Field(default_factory=list)
    label_keys: list[str] = Field(default_factory=list)


class NodesHealth(StrictModel):
    nodes: list[NodeHealth] = Field(description="In the order asked for.")
    missing: list[str] = Field(default_factory=list, description="Nodes that no longer exist.")


class NodeHealthRequest(StrictModel):
    cluster: str
    node: str
    condition_types: list[str] = Field(default_factory=list)
    label_keys: list[str] = Field(default_factory=list)


class QuarantineRequest(StrictModel):
    cluster: str
    node: str
    owner: str = Field(description="The workflow ID quarantining the node.")
    reason: str = Field(min_length=1)


class RemediatedMark(StrictModel):
    cluster: str
    node: str
    owner: str = Field(description="The remediation's workflow ID.")
    outcome: str = Field(min_length=1)
    at: datetime = Field(description="When it ended (the workflow's clock, so a retry writes the same mark).")


class QuarantineResult(StrictModel):
    changed: bool = Field(description="False when the node already was quarantined, cordoned and tainted.")
    cordoned_by: str | None = None


def _ts(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def _last_remediation(value: str | None) -> LastRemediation | None:
    """The annotation, or None when absent or unreadable (someone edited it: no cooldown rather than none ever)."""
    if not value:
        return None
    try:
        return LastRemediation.model_validate_json(value)
    except ValueError:
        return None


def node_health(node: dict[str, Any], condition_types: list[str], label_keys: list[str]) -> NodeHealth:
    """A node object (JSON) summarised for the health decision."""
    meta, spec, status = node.get("metadata") or {}, node.get("spec") or {}, node.get("status") or {}
    annotations, labels = meta.get("annotations") or {}, meta.get("labels") or {}
    conds = {c.get("type"): c for c in status.get("conditions") or []}
    ready = conds.get("Ready") or {}
    quarantined = annotations.get(QUARANTINE_ANNOTATION)
    if quarantined:
        with contextlib.suppress(ValueError, AttributeError):
            quarantined = str(json.loads(quarantined).get("reason") or quarantined)
    return NodeHealth(
        name=meta["name"],
        ready=ready.get("status") == "True",
        ready_since=_ts(ready.get("lastTransitionTime")),
        unschedulable=bool(spec.get("unschedulable")),
        cordoned_by=annotations.get(CORDONED_BY),
        cordon_reason=annotations.get(CORDON_REASON),
        conditions={
            t: ConditionState(
                status=str(c.get("status") or "Unknown"),
                reason=c.get("reason") or "",
                message=(c.get("message") or "")[:500],
                since=_ts(c.get("lastTransitionTime")),
            )
            for t in condition_types
            if (c := conds.get(t)) is not None
        },
        labels={k: labels[k] for k in label_keys if k in labels},
        quarantined=quarantined or None,
        read_at=datetime.now(UTC),
        boot_id=(status.get("nodeInfo") or {}).get("bootID") or None,
        last_remediation=_last_remediation(annotations.get(LAST_REMEDIATION_ANNOTATION)),
    )


class NodeHealthActivities:
    def __init__(self, connector: ClusterConnector) -> None:
        self._clusters = connector

    @activity.defn
    async def list_node_health(self, req: NodeHealthQuery) -> NodeHealthPage:
        """One page of the cluster's nodes with their readiness, cordon, conditions and labels."""
        core = await self._clusters.core(req.cluster)
        page = await call_json("listing nodes", core.list_node_without_preload_content(
            label_selector=req.label_selector or None, limit=req.limit, _continue=req.continue_token,
            _request_timeout=REQUEST_TIMEOUT))  # fmt: skip
        return NodeHealthPage(
            nodes=[node_health(n, req.condition_types, req.label_keys) for n in page.get("items") or []],
            continue_token=(page.get("metadata") or {}).get("continue") or None,
        )

    @activity.defn
    async def list_node_names(self, req: NodeNamesQuery) -> NodeNamesPage:
        """Up to `max_names` node names, in the API server's order, and where the next answer starts.

        Read in API pages of 500 (what kubectl asks for); a caller lists the whole cluster in quick succession,
        so the continue token never ages past the API server's compaction window (5 minutes by default)."""
        core = await self._clusters.core(req.cluster)
        names: list[str] = []
        token = req.continue_token
        while True:
            page = await call_json("listing node names", core.list_node_without_preload_content(
                label_selector=req.label_selector or None, limit=min(LIST_CHUNK, req.max_names - len(names)),
                _continue=token, _request_timeout=REQUEST_TIMEOUT))  # fmt: skip
            names += [n["metadata"]["name"] for n in page.get("items") or []]
            token = (page.get("metadata") or {}).get("continue") or None
            activity.heartbeat(len(names))
            if token is None or len(names) >= req.max_names:
                return NodeNamesPage(names=names, continue_token=token)

    @activity.defn
    async def read_nodes_health(self, req: NodesHealthRequest) -> NodesHealth:
        """These nodes' readiness, cordon, conditions and labels, read one by one (16 at a time); a node deleted
        since it was listed is reported missing, not an error. Heartbeats as it goes."""
        core = await self._clusters.core(req.cluster)
        slots = asyncio.Semaphore(16)
        done = 0

        async def read(name: str) -> dict[str, Any] | None:
            nonlocal done
            async with slots:
                node = await read_json(f"reading node {name}", core.read_node_without_preload_content(
                    name, _request_timeout=REQUEST_TIMEOUT))  # fmt: skip
            done += 1
            activity.heartbeat(done)
            return node

        read_back = await asyncio.gather(*(read(n) for n in req.nodes))
        return NodesHealth(
            nodes=[node_health(n, req.condition_types, req.label_keys) for n in read_back if n is not None],
            missing=[name for name, n in zip(req.nodes, read_back) if n is None],
        )

    async def _node(self, cluster: str, name: str) -> dict[str, Any]:
        core = await self._clusters.core(cluster)
        node = await read_json(f"reading node {name}", core.read_node_without_preload_content(
            name, _request_timeout=REQUEST_TIMEOUT))  # fmt: skip
        if node is None:
            raise ApplicationError(f"node {name!r} not found in cluster {cluster!r}", type="NodeNotFound",
                                   non_retryable=True)  # fmt: skip
        return node

    @activity.defn
    async def read_node_health(self, req: NodeHealthRequest) -> NodeHealth:
        """One node's readiness, cordon, conditions and labels."""
        return node_health(await self._node(req.cluster, req.node), req.condition_types, req.label_keys)

    @activity.defn
    async def quarantine_node(self, req: QuarantineRequest) -> QuarantineResult:
        """Keep the node cordoned, annotate why and taint it `millwright.dev/quarantine=true:NoSchedule`.

        A cordon someone else placed stays theirs (the ownership annotation is not rewritten); an
        uncordoned node is cordoned in our name.
        """
        node = await self._node(req.cluster, req.node)
        meta, spec = node.get("metadata") or {}, node.get("spec") or {}
        annotations = meta.get("annotations") or {}
        taints = list(spec.get("taints") or [])
        have = annotations.get(QUARANTINE_ANNOTATION)
        try:
            have_reason = json.loads(have).get("reason") if have else None
        except (ValueError, AttributeError):
            have_reason = None
        tainted = any(t.get("key") == QUARANTINE_TAINT and t.get("effect") == "NoSchedule" for t in taints)
        holder = annotations.get(CORDONED_BY)
        if have_reason == req.reason[:1024] and tainted and spec.get("unschedulable"):
            return QuarantineResult(changed=False, cordoned_by=holder)
        new_annotations: dict[str, Any] = {QUARANTINE_ANNOTATION: json.dumps({
            "reason": req.reason[:1024], "by": req.owner,
            "at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")}, separators=(",", ":"))}  # fmt: skip
        if not spec.get("unschedulable"):
            new_annotations |= {CORDONED_BY: req.owner, CORDON_REASON: f"quarantined: {req.reason}"[:1024]}
            holder = req.owner
        if not tainted:
            taints.append({"key": QUARANTINE_TAINT, "value": "true", "effect": "NoSchedule"})
        patch = {
            "metadata": {"resourceVersion": meta.get("resourceVersion"), "annotations": new_annotations},
            "spec": {"unschedulable": True, "taints": taints},
        }
        core = await self._clusters.core(req.cluster)
        await api_call(f"quarantining node {req.node}", core.patch_node(req.node, patch, _content_type=MERGE_PATCH,
                                                                    _request_timeout=REQUEST_TIMEOUT))  # fmt: skip
        activity.logger.info("quarantined node %s for %s: %s", req.node, req.owner, req.reason)
        return QuarantineResult(changed=True, cordoned_by=holder)

    @activity.defn
    async def release_quarantine(self, req: QuarantineRequest) -> QuarantineResult:
        """Remove the quarantine annotation and taint (the cordon is the caller's to lift); nothing when absent."""
        node = await self._node(req.cluster, req.node)
        meta, spec = node.get("metadata") or {}, node.get("spec") or {}
        taints = list(spec.get("taints") or [])
        kept = [t for t in taints if t.get("key") != QUARANTINE_TAINT]
        if QUARANTINE_ANNOTATION not in (meta.get("annotations") or {}) and len(kept) == len(taints):
            return QuarantineResult(changed=False, cordoned_by=(meta.get("annotations") or {}).get(CORDONED_BY))
        patch = {"metadata": {"resourceVersion": meta.get("resourceVersion"),
                              "annotations": {QUARANTINE_ANNOTATION: None}},
                 "spec": {"taints": kept}}  # fmt: skip
        core = await self._clusters.core(req.cluster)
        await api_call(f"lifting the quarantine of node {req.node}",
                    core.patch_node(req.node, patch, _content_type=MERGE_PATCH,
                                    _request_timeout=REQUEST_TIMEOUT))  # fmt: skip
        activity.logger.info("lifted the quarantine of node %s for %s: %s", req.node, req.owner, req.reason)
        return QuarantineResult(changed=True, cordoned_by=(meta.get("annotations") or {}).get(CORDONED_BY))

    @activity.defn
    async def mark_remediated(self, req: RemediatedMark) -> None:
        """Annotate how the node's remediation ended (`millwright.dev/last-remediation`); one merge patch of the
        annotation alone, the same on every retry."""
        value = json.dumps({"at": req.at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"), "by": req.owner,
                            "outcome": req.outcome}, separators=(",", ":"))  # fmt: skip
        core = await self._clusters.core(req.cluster)
        await api_call(f"marking node {req.node} remediated",
                    core.patch_node(req.node, {"metadata": {"annotations": {LAST_REMEDIATION_ANNOTATION: value}}},
                                    _content_type=MERGE_PATCH, _request_timeout=REQUEST_TIMEOUT))  # fmt: skip
