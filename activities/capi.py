"""Declarative-object activities for cluster creation (Cluster API) and tenant onboarding (vCluster, KAI).

Generic over kinds: the resource path of an `apiVersion`/`kind` comes from discovery, so the same
activities create a `Namespace`, a KAI `Queue` or a Cluster API `Cluster`. Every write reads first, and what
an activity reports comes from reading the cluster, never from a write's answer (which a dropped connection
loses after the write was done):

* Ownership: every object written carries the `millwright.dev/owner` annotation (`Ownership`): the workflow
  that manages it, the run that created it and the run that last wrote it. A retry that finds its own run's
  earlier write reports it as that run's (`created`, `updated`), and compensation finds everything a failed run
  created by reading the cluster (`ListRequest.owned_by`) rather than trusting the list it kept.
* `apply_objects` creates what is missing and reads it back; an existing object that already matches is left
  alone; one that differs is an error (`ObjectConflict`) when it is not ours or when the caller asked for
  create-only (unless this run created it), and is replaced in place and read back otherwise.
  AlreadyExists → read and compare.
* `delete_objects` deletes and waits until every object is gone (finalizers included), heartbeating; with
  `owned_by` it deletes only what that owner holds (precondition: the UID it read) and reports the rest as kept.

Cluster references are those `ClusterConnector` resolves: a kubeconfig context, or a workload cluster
`<context>:<namespace>/<name>` whose kubeconfig Secret the connector reads itself. No kubeconfig, token
or Secret data is ever returned.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any, Literal

import aiohttp
from kubernetes.aio import client as k8s
from kubernetes.aio.client.exceptions import ApiException
from pydantic import Field
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.kube.connector import REQUEST_TIMEOUT, ClusterConnector
from activities.kube.errors import api_error
from activities.models import StrictModel

MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "millwright"
OWNER_ANNOTATION = "millwright.dev/owner"
TENANT_LABEL = "millwright.dev/tenant"
GPU = "nvidia.com/gpu"


# ---------------------------------------------------------------- models


class KindRef(StrictModel):
    api_version: str
    kind: str

    def __str__(self) -> str:
        return f"{self.api_version}/{self.kind}"

    @classmethod
    def of_objects(cls, objs: list[dict[str, Any]]) -> list["KindRef"]:
        """The distinct kinds of these objects, in first-seen order."""
        seen: dict[str, KindRef] = {}
        for o in objs:
            seen.setdefault(f"{o['apiVersion']}/{o['kind']}", cls(api_version=o["apiVersion"], kind=o["kind"]))
        return list(seen.values())


class Ownership(StrictModel):
    """Who owns an object, as its owner annotation records it (JSON). A bare workflow ID, as objects written
    before runs were recorded carry, reads as that workflow with no run.

    As a filter (`owned_by`): objects of this workflow and, when `created_by` is set, created by that run."""

    workflow: str = Field(
        description="ID of the managing workflow (the same for every run about one tenant or cluster)."
    )
    created_by: str = Field("", description="Run ID of the run that created the object.")
    written_by: str = Field("", description="Run ID of the run that last created or changed it.")

    def annotation(self) -> str:
        return json.dumps(
            {"workflow": self.workflow, "createdBy": self.created_by, "writtenBy": self.written_by},
            separators=(",", ":"),
        )

    @classmethod
    def of(cls, obj: dict[str, Any]) -> "Ownership | None":
        value = ((obj.get("metadata") or {}).get("annotations") or {}).get(OWNER_ANNOTATION)
        if not value:
            return None
        try:
            doc = json.loads(value)
        except ValueError:
            doc = None
        if not isinstance(doc, dict):
            return cls(workflow=value)
        return cls(
            workflow=str(doc.get("workflow") or ""),
            created_by=str(doc.get("createdBy") or ""),
            written_by=str(doc.get("writtenBy") or ""),
        )

    def covers(self, obj: dict[str, Any]) -> bool:
        own = Ownership.of(obj)
        return (
            own is not None
            and own.workflow == self.workflow
            and (not self.created_by or own.created_by == self.created_by)
        )

    def describe(self, obj: dict[str, Any]) -> str:
        """Whose the object is, for an error message."""
        own = Ownership.of(obj)
        if own is None:
            return "not created by Millwright"
        if own.workflow != self.workflow:
            return f"managed by {own.workflow}"
        return f"created by run {own.created_by or 'unknown'} of {own.workflow}"


class ObjectRef(StrictModel):
    api_version: str
    kind: str
    name: str
    namespace: str | None = None

    def __str__(self) -> str:
        where = f"{self.namespace}/" if self.namespace else ""
        return f"{self.kind} {where}{self.name}"

    @classmethod
    def of(cls, obj: dict[str, Any]) -> "ObjectRef":
        md = obj.get("metadata") or {}
        return cls(api_version=obj["apiVersion"], kind=obj["kind"], name=md["name"], namespace=md.get("namespace"))

    def key(self) -> tuple[str, str, str, str]:
        return self.api_version, self.kind, self.namespace or "", self.name


class DiscoveryRequest(StrictModel):
    cluster: str
    kinds: list[KindRef]


class DiscoveryResult(StrictModel):
    installed: list[str]


class ApplyRequest(StrictModel):
    cluster: str
    owner: str = Field(description="Who manages these objects (a workflow ID); written as an annotation.")
    run: str = Field(
        "",
        description="The writing run's ID: recorded as the creator of what it creates and the "
        "writer of what it changes (`Ownership`).",
    )
    objects: list[dict[str, Any]] = Field(description="Full desired objects, in creation order.")
    on_difference: Literal["error", "update"] = Field(
        "error", description="What to do with an existing object of ours that differs: fail, or replace it."
    )


class ApplyOutcome(StrictModel):
    ref: ObjectRef
    outcome: Literal["created", "unchanged", "updated"]
    uid: str = ""


class ApplyResult(StrictModel):
    outcomes: list[ApplyOutcome] = Field(default_factory=list)

    def created(self) -> list[ObjectRef]:
        return [o.ref for o in self.outcomes if o.outcome == "created"]

    def changed(self) -> bool:
        return any(o.outcome != "unchanged" for o in self.outcomes)


class DeleteRequest(StrictModel):
    cluster: str
    objects: list[ObjectRef] = Field(description="Deleted in this order; each waited for before the next.")
    timeout_seconds: float = 600
    poll_seconds: float = 0.5
    owned_by: Ownership | None = Field(
        None,
        description="Delete only objects this owner holds (read first; the "
        "delete is conditional on the UID read); others are kept.",
    )


class DeleteResult(StrictModel):
    deleted: list[ObjectRef] = Field(default_factory=list, description="Deleted by this attempt.")
    absent: list[ObjectRef] = Field(
        default_factory=list, description="Already gone (perhaps by an earlier attempt whose answer was lost)."
    )
    kept: list[ObjectRef] = Field(default_factory=list, description="Not held by `owned_by`: left alone.")

    def account(self, order: list[ObjectRef], existed: list[ObjectRef]) -> tuple[list[ObjectRef], list[ObjectRef]]:
        """(removed, kept) of a delete of `order`, from what a listing showed there before (`existed`) and this
        result, not from the delete answers alone (after a lost one, the retry finds the object absent). An
        object kept inside a namespace that was removed went with it."""
        there = {r.key() for r in existed + self.deleted}
        kept = {r.key() for r in self.kept}
        gone_ns = {r.name for r in order if r.kind == "Namespace" and r.key() in there and r.key() not in kept}
        removed = [r for r in order if r.key() in there and (r.key() not in kept or r.namespace in gone_ns)]
        return removed, [r for r in order if r.key() in kept and r.namespace not in gone_ns]


class ListRequest(StrictModel):
    cluster: str
    kinds: list[KindRef]
    label_selector: str = ""
    owned_by: Ownership | None = Field(None, description="Only objects this owner holds (see Ownership).")


class CapiClusterRef(StrictModel):
    cluster: str = Field(description="The management cluster (kubeconfig context).")
    namespace: str
    name: str


class CapiClusterStatus(StrictModel):
    exists: bool
    phase: str = ""
    infrastructure_provisioned: bool = False
    control_plane_initialized: bool = False
    available: bool = False
    machines_total: int = 0
    machines_ready: int = Field(0, description="Machines with a nodeRef.")
    message: str = ""

    def ready(self) -> bool:
        # The clusterctl move pre-check plus v1beta2 Available and the e2e framework's phase.
        return (
            self.infrastructure_provisioned
            and self.control_plane_initialized
            and self.available
            and self.phase == "Provisioned"
            and self.machines_ready == self.machines_total
        )


class MachineNode(StrictModel):
    machine: str
    node: str = Field("", description="status.nodeRef.name; empty until the machine has a node.")
    control_plane: bool = False


class SecretCheck(StrictModel):
    cluster: str
    namespace: str
    name: str
    key: str


class SecretReference(StrictModel):
    """Where a credential lives; never the credential."""

    ref: str = Field(description="secret:<cluster>/<namespace>/<name>#<key>")


class VClusterStatus(StrictModel):
    exists: bool
    ready: bool = False
    phase: str = ""
    kubeconfig: SecretReference | None = None


class VClusterRef(StrictModel):
    cluster: str
    namespace: str
    name: str


class CapacityRequest(StrictModel):
    cluster: str


class GpuCapacity(StrictModel):
    gpus: float = Field(description="Sum of allocatable nvidia.com/gpu over the cluster's nodes.")
    quotas: dict[str, float] = Field(default_factory=dict, description="Tenant → its queue's GPU quota.")


class NodeLabels(StrictModel):
    cluster: str
    labels: dict[str, str]
    label_selector: str = ""


class WorkloadQuery(StrictModel):
    cluster: str
    namespaces: list[str]
    evict: bool = Field(False, description="Delete the tenant's running pods (forced offboarding).")


class WorkloadCount(StrictModel):
    active: int
    evicted: int = 0


# ---------------------------------------------------------------- helpers


def _contains(have: Any, want: Any) -> bool:
    """Does the live value carry every field of the desired one (server defaults may add others)?"""
    if isinstance(want, dict):
        return isinstance(have, dict) and all(_contains(have.get(k), v) for k, v in want.items())
    if isinstance(want, list):
        return isinstance(have, list) and len(have) == len(want) and all(map(_contains, have, want))
    if isinstance(want, (int, float)) and isinstance(have, (int, float)) and not isinstance(want, bool):
        return float(have) == float(want)
    return have == want


def _matches(live: dict[str, Any], desired: dict[str, Any]) -> bool:
    """Does the live object carry the desired one? Millwright's bookkeeping (the managed-by label, the owner
    annotation) is not content: an identical object someone else made matches, and is left alone, not adopted."""
    body = {k: v for k, v in desired.items() if k not in ("apiVersion", "kind", "metadata", "status")}
    md = desired.get("metadata") or {}
    lmd = live.get("metadata") or {}
    labels = {k: v for k, v in (md.get("labels") or {}).items() if k != MANAGED_BY_LABEL}
    notes = {k: v for k, v in (md.get("annotations") or {}).items() if k != OWNER_ANNOTATION}
    return (
        _contains(live, body)
        and _contains(lmd.get("labels") or {}, labels)
        and _contains(lmd.get("annotations") or {}, notes)
    )


def _already_exists(err: ApplicationError) -> bool:
    cause = err.__cause__
    return isinstance(cause, ApiException) and cause.status == 409 and "AlreadyExists" in str(cause.body or "")


def _not_applied(ref: ObjectRef, cluster: str, doing: str, back: dict[str, Any] | None) -> ApplicationError:
    """A write answered (or lost) whose effect the read-back does not show."""
    if back is None:  # the write's answer said done, yet nothing is there: read again on the next attempt
        return ApplicationError(
            f"{doing} {ref} in cluster {cluster}: reading it back finds nothing", type="KubernetesUnavailable"
        )
    return ApplicationError(
        f"{doing} {ref} in cluster {cluster}: reading it back shows an object that differs "
        "from the one written (changed meanwhile, or by an admission webhook)",
        type="ObjectNotApplied",
        non_retryable=True,
    )


class _Resources:
    """Discovery for one cluster during one activity: `apiVersion`+`kind` → (plural, namespaced)."""

    def __init__(self, api: k8s.ApiClient, cluster: str) -> None:
        self.api, self.cluster = api, cluster
        self._lists: dict[str, dict[str, Any] | None] = {}

    async def lookup(self, api_version: str, kind: str) -> tuple[str, bool] | None:
        if api_version not in self._lists:
            path = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
            self._lists[api_version] = await _request(
                self.api, "GET", path, f"discovery of {api_version}", missing_ok=True
            )
        doc = self._lists[api_version]
        for r in (doc or {}).get("resources") or []:
            if r.get("kind") == kind and "/" not in r.get("name", ""):
                return r["name"], bool(r.get("namespaced"))
        return None

    async def path(self, api_version: str, kind: str, name: str | None = None, namespace: str | None = None) -> str:
        found = await self.lookup(api_version, kind)
        if found is None:
            raise ApplicationError(
                f"cluster {self.cluster} does not serve {kind} ({api_version}): install its CRD or provider first",
                type="KindNotInstalled",
                non_retryable=True,
            )
        plural, namespaced = found
        base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
        if namespaced and namespace:
            base += f"/namespaces/{namespace}"
        base += f"/{plural}"
        return f"{base}/{name}" if name else base


async def _request(
    api: k8s.ApiClient,
    method: str,
    path: str,
    doing: str,
    *,
    body: Any = None,
    query: dict[str, str] | None = None,
    missing_ok: bool = False,
    content_type: str = "application/json",
) -> dict[str, Any] | None:
    """One raw API call with the client's own credentials; JSON in and out; errors mapped like kube.py."""
    headers = {"Accept": "application/json", "User-Agent": api.user_agent}
    if body is not None:
        headers["Content-Type"] = content_type
    try:
        m, url, h, b, _ = await api.param_serialize(
            method=method,
            resource_path=path,
            header_params=headers,
            query_params=list((query or {}).items()) or None,
            body=body,
            auth_settings=["BearerToken"],
        )
        resp = await api.call_api(m, url, header_params=h, body=b, _request_timeout=REQUEST_TIMEOUT)
        data = await resp.read()
    except (aiohttp.ClientError, asyncio.TimeoutError) as err:
        raise ApplicationError(f"{doing}: connection failed: {err!r}", type="KubernetesUnavailable") from err
    if 200 <= resp.status < 300:
        return json.loads(data) if data else {}
    if resp.status == 404 and missing_ok:
        return None
    failure = ApiException(http_resp=resp)
    raise api_error(failure, doing) from failure


# ---------------------------------------------------------------- activities


class ClusterApiActivities:
    def __init__(self, clusters: ClusterConnector) -> None:
        self._clusters = clusters

    def activities(self) -> list[Callable]:
        return [
            self.check_kinds_installed,
            self.apply_objects,
            self.delete_objects,
            self.list_objects,
            self.read_tenant_quota_objects,
            self.read_capi_cluster,
            self.list_machines,
            self.check_secret,
            self.read_vcluster,
            self.gpu_capacity,
            self.label_nodes,
            self.tenant_workloads,
        ]

    async def _resources(self, cluster: str) -> _Resources:
        return _Resources(await self._clusters.api(cluster), cluster)

    @activity.defn
    async def check_kinds_installed(self, req: DiscoveryRequest) -> DiscoveryResult:
        """Fail (non-retryable, naming every missing kind) unless the cluster serves all these kinds."""
        res = await self._resources(req.cluster)
        missing = [str(k) for k in req.kinds if await res.lookup(k.api_version, k.kind) is None]
        if missing:
            raise ApplicationError(
                f"cluster {req.cluster} does not serve: {', '.join(missing)}; install the "
                "providers and CRDs of these API versions first",
                type="KindNotInstalled",
                non_retryable=True,
            )
        return DiscoveryResult(installed=[str(k) for k in req.kinds])

    @activity.defn
    async def apply_objects(self, req: ApplyRequest) -> ApplyResult:
        """Create or update each object in order; every outcome comes from reading the object (see above)."""
        res = await self._resources(req.cluster)
        result = ApplyResult()
        for raw in req.objects:
            desired = json.loads(json.dumps(raw))
            md = desired.setdefault("metadata", {})
            md.setdefault("labels", {})[MANAGED_BY_LABEL] = MANAGED_BY
            notes = md.setdefault("annotations", {})
            ref = ObjectRef.of(desired)
            activity.heartbeat(str(ref))
            item = await res.path(ref.api_version, ref.kind, ref.name, ref.namespace)
            live = await _request(res.api, "GET", item, f"reading {ref}", missing_ok=True)
            if live is None:
                notes[OWNER_ANNOTATION] = Ownership(
                    workflow=req.owner, created_by=req.run, written_by=req.run
                ).annotation()
                try:
                    await _request(
                        res.api,
                        "POST",
                        await res.path(ref.api_version, ref.kind, namespace=ref.namespace),
                        f"creating {ref}",
                        body=desired,
                    )
                except ApplicationError as err:
                    if not _already_exists(err):
                        raise  # a lost answer included: the retry reads what the write left
                live = await _request(res.api, "GET", item, f"reading {ref}", missing_ok=True)
                if live is None:
                    raise _not_applied(ref, req.cluster, "creating", None)
            result.outcomes.append(await self._reconcile(res, item, ref, live, desired, req))
        return result

    async def _reconcile(
        self,
        res: _Resources,
        item: str,
        ref: ObjectRef,
        live: dict[str, Any],
        desired: dict[str, Any],
        req: ApplyRequest,
    ) -> ApplyOutcome:
        """The outcome for an object that exists: whose it is says whether this run wrote it (an earlier attempt
        whose answer was lost included); a differing one of ours is replaced in place and read back."""
        lmd = live.get("metadata") or {}
        own = Ownership.of(live) or Ownership(workflow="")
        ours = own.workflow == req.owner
        mine = ours and bool(req.run) and own.created_by == req.run
        if _matches(live, desired):
            wrote = ours and bool(req.run) and own.written_by == req.run
            return ApplyOutcome(
                ref=ref, outcome="created" if mine else "updated" if wrote else "unchanged", uid=lmd.get("uid", "")
            )
        if not ours or (req.on_difference == "error" and not mine):
            whose = Ownership(workflow=req.owner).describe(live)
            raise ApplicationError(
                f"{ref} already exists in cluster {req.cluster} and differs from the "
                f"desired object ({whose}); refusing to adopt or overwrite it",
                type="ObjectConflict",
                non_retryable=True,
            )
        md = desired["metadata"]
        md["annotations"][OWNER_ANNOTATION] = Ownership(
            workflow=req.owner, created_by=own.created_by, written_by=req.run
        ).annotation()
        md["resourceVersion"] = lmd.get("resourceVersion")
        if "status" in live:
            desired["status"] = live["status"]
        await _request(res.api, "PUT", item, f"updating {ref}", body=desired)  # 409 Conflict: retried
        back = await _request(res.api, "GET", item, f"reading {ref}", missing_ok=True)
        if back is None or not _matches(back, desired):
            raise _not_applied(ref, req.cluster, "updating", back)
        return ApplyOutcome(ref=ref, outcome="created" if mine else "updated", uid=lmd.get("uid", ""))

    @activity.defn
    async def delete_objects(self, req: DeleteRequest) -> DeleteResult:
        """Delete each object in order and wait until it is gone (finalizers done); NotFound is done. With
        `owned_by`, only what that owner holds, and only the very object read (UID precondition)."""
        res = await self._resources(req.cluster)
        result = DeleteResult()
        deadline = time.monotonic() + req.timeout_seconds
        for ref in req.objects:
            if await res.lookup(ref.api_version, ref.kind) is None:
                result.absent.append(ref)  # the kind is gone (its CRD removed): so is the object
                continue
            item = await res.path(ref.api_version, ref.kind, ref.name, ref.namespace)
            options: dict[str, Any] = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"}
            uid = ""
            if req.owned_by is not None:
                live = await _request(res.api, "GET", item, f"reading {ref}", missing_ok=True)
                if live is None:
                    result.absent.append(ref)
                    continue
                if not req.owned_by.covers(live):
                    result.kept.append(ref)
                    continue
                uid = live["metadata"].get("uid", "")
                options["preconditions"] = {"uid": uid}  # replaced meanwhile: 409, and the retry reads again
            answer = await _request(res.api, "DELETE", item, f"deleting {ref}", missing_ok=True, body=options)
            gone = answer is None
            (result.absent if gone else result.deleted).append(ref)
            while not gone:
                live = await _request(res.api, "GET", item, f"reading {ref}", missing_ok=True)
                if live is None or (uid and live["metadata"].get("uid") != uid):
                    break  # gone (a new object of that name is not the one deleted)
                fins = (live.get("metadata") or {}).get("finalizers") or []
                activity.heartbeat(f"waiting for {ref} to go (finalizers: {', '.join(fins) or 'none'})")
                if time.monotonic() > deadline:
                    raise ApplicationError(
                        f"{ref} still exists after {req.timeout_seconds:.0f}s (finalizers: {fins})",
                        type="DeleteTimeout",
                    )
                await asyncio.sleep(req.poll_seconds)
        return result

    @activity.defn
    async def list_objects(self, req: ListRequest) -> list[ObjectRef]:
        """Objects of these kinds (all namespaces) matching the selector (and held by `owned_by`); kinds not
        served list nothing."""
        return [
            ObjectRef(
                api_version=k.api_version,
                kind=k.kind,
                name=o["metadata"]["name"],
                namespace=o["metadata"].get("namespace"),
            )
            async for k, o in self._items(req.cluster, req.kinds, req.label_selector)
            if req.owned_by is None or req.owned_by.covers(o)
        ]

    async def _items(self, cluster: str, kinds: list[KindRef], label_selector: str | None):
        """(kind, object) for every object of these kinds (all namespaces) matching the selector;
        kinds the cluster does not serve yield nothing."""
        res = await self._resources(cluster)
        query = {"labelSelector": label_selector} if label_selector else None
        for k in kinds:
            if await res.lookup(k.api_version, k.kind) is None:
                continue
            doc = await _request(res.api, "GET", await res.path(k.api_version, k.kind), f"listing {k}", query=query)
            for o in (doc or {}).get("items") or []:
                yield k, o

    @activity.defn
    async def read_tenant_quota_objects(self, req: ListRequest) -> list[dict[str, Any]]:
        """Queues and ResourceQuotas matching the selector, as desired objects (metadata trimmed, no status).
        Only these kinds: nothing that can hold a credential comes back."""
        allowed = {("scheduling.run.ai/v2", "Queue"), ("v1", "ResourceQuota")}
        for k in req.kinds:
            if (k.api_version, k.kind) not in allowed:
                raise ApplicationError(
                    f"read_tenant_quota_objects does not read {k}", type="BadRequest", non_retryable=True
                )
        out: list[dict[str, Any]] = []
        async for k, o in self._items(req.cluster, req.kinds, req.label_selector):
            md = o.get("metadata") or {}
            keep = {f: md[f] for f in ("name", "namespace", "labels", "annotations") if md.get(f)}
            out.append({"apiVersion": k.api_version, "kind": k.kind, "metadata": keep, "spec": o.get("spec") or {}})
        return out

    @activity.defn
    async def read_capi_cluster(self, ref: CapiClusterRef) -> CapiClusterStatus:
        """What `clusterctl` checks: phase, status.initialization, v1beta2 conditions, Machines with a nodeRef."""
        res = await self._resources(ref.cluster)
        c = await _request(
            res.api,
            "GET",
            await res.path("cluster.x-k8s.io/v1beta2", "Cluster", ref.name, ref.namespace),
            f"reading Cluster {ref.name}",
            missing_ok=True,
        )
        if c is None:
            return CapiClusterStatus(exists=False)
        st = c.get("status") or {}
        init = st.get("initialization") or {}
        conds = {x.get("type"): x for x in st.get("conditions") or []}
        machines = await _request(
            res.api,
            "GET",
            await res.path("cluster.x-k8s.io/v1beta2", "Machine", namespace=ref.namespace),
            "listing Machines",
            query={"labelSelector": f"cluster.x-k8s.io/cluster-name={ref.name}"},
        )
        items = (machines or {}).get("items") or []
        return CapiClusterStatus(
            exists=True,
            phase=st.get("phase") or "",
            infrastructure_provisioned=bool(init.get("infrastructureProvisioned")),
            control_plane_initialized=bool(init.get("controlPlaneInitialized"))
            and (conds.get("ControlPlaneInitialized") or {}).get("status") == "True",
            available=(conds.get("Available") or {}).get("status") == "True",
            machines_total=len(items),
            machines_ready=sum(1 for m in items if (m.get("status") or {}).get("nodeRef")),
            message=(conds.get("Available") or {}).get("message") or "",
        )

    @activity.defn
    async def list_machines(self, ref: CapiClusterRef) -> list[MachineNode]:
        """The Cluster's Machines and their nodes (`status.nodeRef.name`), sorted by machine name."""
        res = await self._resources(ref.cluster)
        doc = await _request(
            res.api,
            "GET",
            await res.path("cluster.x-k8s.io/v1beta2", "Machine", namespace=ref.namespace),
            "listing Machines",
            query={"labelSelector": f"cluster.x-k8s.io/cluster-name={ref.name}"},
        )
        out = []
        for m in (doc or {}).get("items") or []:
            md = m.get("metadata") or {}
            node = ((m.get("status") or {}).get("nodeRef") or {}).get("name") or ""
            out.append(
                MachineNode(
                    machine=md["name"],
                    node=node,
                    control_plane="cluster.x-k8s.io/control-plane" in (md.get("labels") or {}),
                )
            )
        return sorted(out, key=lambda m: m.machine)

    @activity.defn
    async def check_secret(self, req: SecretCheck) -> SecretReference:
        """That a Secret holds a key; returns where it is, never what it holds (a retry waits for it)."""
        core = k8s.CoreV1Api(await self._clusters.api(req.cluster))
        try:
            secret = await core.read_namespaced_secret(req.name, req.namespace, _request_timeout=REQUEST_TIMEOUT)
        except ApiException as err:
            if err.status == 404:
                raise ApplicationError(
                    f"Secret {req.namespace}/{req.name} not found yet", type="SecretNotFound"
                ) from None
            raise api_error(err, f"reading Secret {req.namespace}/{req.name}") from None
        if req.key not in (secret.data or {}):
            raise ApplicationError(
                f"Secret {req.namespace}/{req.name} has no key {req.key!r} yet", type="SecretNotFound"
            )
        return SecretReference(ref=f"secret:{req.cluster}/{req.namespace}/{req.name}#{req.key}")

    @activity.defn
    async def read_vcluster(self, ref: VClusterRef) -> VClusterStatus:
        """vCluster readiness: the VCluster object ready (provider status) and its Secret `vc-<name>` present."""
        res = await self._resources(ref.cluster)
        vc = await _request(
            res.api,
            "GET",
            await res.path("infrastructure.cluster.x-k8s.io/v1alpha1", "VCluster", ref.name, ref.namespace),
            f"reading VCluster {ref.name}",
            missing_ok=True,
        )
        if vc is None:
            return VClusterStatus(exists=False)
        st = vc.get("status") or {}
        secret = await _request(
            res.api,
            "GET",
            f"/api/v1/namespaces/{ref.namespace}/secrets/vc-{ref.name}",
            "reading the vCluster kubeconfig Secret",
            missing_ok=True,
        )
        has_config = bool(secret and "config" in (secret.get("data") or {}))
        kubeconfig = (
            SecretReference(ref=f"secret:{ref.cluster}/{ref.namespace}/vc-{ref.name}#config") if has_config else None
        )
        return VClusterStatus(
            exists=True, ready=bool(st.get("ready")) and has_config, phase=st.get("phase") or "", kubeconfig=kubeconfig
        )

    @activity.defn
    async def gpu_capacity(self, req: CapacityRequest) -> GpuCapacity:
        """Allocatable GPUs over all nodes, and each tenant queue's GPU quota (queues Millwright labels)."""
        res = await self._resources(req.cluster)
        nodes = await _request(res.api, "GET", "/api/v1/nodes", "listing nodes")
        gpus = 0.0
        for n in (nodes or {}).get("items") or []:
            try:
                gpus += float(((n.get("status") or {}).get("allocatable") or {}).get(GPU) or 0)
            except ValueError:
                pass
        quotas: dict[str, float] = {}
        if await res.lookup("scheduling.run.ai/v2", "Queue") is not None:
            qs = await _request(
                res.api,
                "GET",
                await res.path("scheduling.run.ai/v2", "Queue"),
                "listing queues",
                query={"labelSelector": TENANT_LABEL},
            )
            for q in (qs or {}).get("items") or []:
                tenant = q["metadata"]["labels"][TENANT_LABEL]
                gpu = ((q.get("spec") or {}).get("resources") or {}).get("gpu") or {}
                quotas[tenant] = quotas.get(tenant, 0.0) + max(0.0, float(gpu.get("quota") or 0))
        return GpuCapacity(gpus=gpus, quotas=quotas)

    @activity.defn
    async def label_nodes(self, req: NodeLabels) -> int:
        """Merge these labels onto every matching node, each read back; returns how many nodes this attempt
        changed (a retry skips the nodes an earlier attempt labelled)."""
        api = await self._clusters.api(req.cluster)
        query = {"labelSelector": req.label_selector} if req.label_selector else None
        nodes = await _request(api, "GET", "/api/v1/nodes", "listing nodes", query=query)
        changed = 0
        for n in (nodes or {}).get("items") or []:
            have = n["metadata"].get("labels") or {}
            if all(have.get(k) == v for k, v in req.labels.items()):
                continue
            path = f"/api/v1/nodes/{n['metadata']['name']}"
            await _request(
                api,
                "PATCH",
                path,
                "labelling node",
                body={"metadata": {"labels": req.labels}},
                content_type="application/merge-patch+json",
            )
            back = await _request(api, "GET", path, "reading node", missing_ok=True)
            labels = ((back or {}).get("metadata") or {}).get("labels") or {}
            if back is not None and any(labels.get(k) != v for k, v in req.labels.items()):
                raise ApplicationError(
                    f"node {n['metadata']['name']}: labels {req.labels} not there after the patch (changed meanwhile?)",
                    type="KubernetesUnavailable",
                )
            if back is not None:  # a node deleted meanwhile needs no label
                changed += 1
        return changed

    @activity.defn
    async def tenant_workloads(self, req: WorkloadQuery) -> WorkloadCount:
        """Pods still running in the tenant's namespaces; with `evict`, delete them."""
        api = await self._clusters.api(req.cluster)
        active = evicted = 0
        for ns in req.namespaces:
            pods = await _request(api, "GET", f"/api/v1/namespaces/{ns}/pods", "listing pods", missing_ok=True)
            for p in (pods or {}).get("items") or []:
                if (p.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                    continue
                if req.evict and not p["metadata"].get("deletionTimestamp"):
                    if (
                        await _request(
                            api,
                            "DELETE",
                            f"/api/v1/namespaces/{ns}/pods/{p['metadata']['name']}",
                            "deleting a tenant pod",
                            missing_ok=True,
                        )
                        is None
                    ):
                        continue  # gone already: neither evicted by this call nor active
                    evicted += 1
                active += 1
        return WorkloadCount(active=active, evicted=evicted)
