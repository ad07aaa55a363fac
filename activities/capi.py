"""Declarative-object activities for cluster creation (Cluster API) and tenant onboarding (vCluster, KAI).

Generic over kinds: the resource path of an `apiVersion`/`kind` comes from discovery, so the same
activities create a `Namespace`, a KAI `Queue` or a Cluster API `Cluster`. Every write reads first:

* `apply_objects` creates what is missing; an existing object that already matches is left alone; one that
  differs is an error (`ObjectConflict`) when it is not ours (the `millwright.dev/owner` annotation) or when
  the caller asked for create-only, and is replaced in place otherwise. AlreadyExists → read and compare.
* `delete_objects` deletes and waits until every object is gone (finalizers included), heartbeating.

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

from activities.kube import _REQUEST_TIMEOUT, ClusterConnector, api_error
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


class DiscoveryRequest(StrictModel):
    cluster: str
    kinds: list[KindRef]


class DiscoveryResult(StrictModel):
    installed: list[str]


class ApplyRequest(StrictModel):
    cluster: str
    owner: str = Field(description="Who manages these objects (a workflow ID); written as an annotation.")
    objects: list[dict[str, Any]] = Field(description="Full desired objects, in creation order.")
    on_difference: Literal["error", "update"] = Field(
        "error", description="What to do with an existing object of ours that differs: fail, or replace it.")


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


class DeleteResult(StrictModel):
    deleted: list[ObjectRef] = Field(default_factory=list)
    absent: list[ObjectRef] = Field(default_factory=list)


class ListRequest(StrictModel):
    cluster: str
    kinds: list[KindRef]
    label_selector: str = ""


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
        return (self.infrastructure_provisioned and self.control_plane_initialized and self.available
                and self.phase == "Provisioned" and self.machines_ready == self.machines_total)


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
    body = {k: v for k, v in desired.items() if k not in ("apiVersion", "kind", "metadata", "status")}
    md = desired.get("metadata") or {}
    lmd = live.get("metadata") or {}
    return (_contains(live, body) and _contains(lmd.get("labels") or {}, md.get("labels") or {})
            and _contains(lmd.get("annotations") or {}, md.get("annotations") or {}))


class _Resources:
    """Discovery for one cluster during one activity: `apiVersion`+`kind` → (plural, namespaced)."""

    def __init__(self, api: k8s.ApiClient, cluster: str) -> None:
        self.api, self.cluster = api, cluster
        self._lists: dict[str, dict[str, Any] | None] = {}

    async def lookup(self, api_version: str, kind: str) -> tuple[str, bool] | None:
        if api_version not in self._lists:
            path = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
            self._lists[api_version] = await _request(self.api, "GET", path, f"discovery of {api_version}",
                                                      missing_ok=True)
        doc = self._lists[api_version]
        for r in (doc or {}).get("resources") or []:
            if r.get("kind") == kind and "/" not in r.get("name", ""):
                return r["name"], bool(r.get("namespaced"))
        return None

    async def path(self, api_version: str, kind: str, name: str | None = None,
                   namespace: str | None = None) -> str:
        found = await self.lookup(api_version, kind)
        if found is None:
            raise ApplicationError(
                f"cluster {self.cluster} does not serve {kind} ({api_version}): install its CRD or provider first",
                type="KindNotInstalled", non_retryable=True)
        plural, namespaced = found
        base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
        if namespaced and namespace:
            base += f"/namespaces/{namespace}"
        base += f"/{plural}"
        return f"{base}/{name}" if name else base


async def _request(api: k8s.ApiClient, method: str, path: str, doing: str, *, body: Any = None,
                   query: dict[str, str] | None = None, missing_ok: bool = False,
                   content_type: str = "application/json") -> dict[str, Any] | None:
    """One raw API call with the client's own credentials; JSON in and out; errors mapped like kube.py."""
    headers = {"Accept": "application/json", "User-Agent": api.user_agent}
    if body is not None:
        headers["Content-Type"] = content_type
    try:
        m, url, h, b, _ = await api.param_serialize(method=method, resource_path=path, header_params=headers,
                                                    query_params=list((query or {}).items()) or None, body=body,
                                                    auth_settings=["BearerToken"])
        resp = await api.call_api(m, url, header_params=h, body=b, _request_timeout=_REQUEST_TIMEOUT)
        data = await resp.read()
    except (aiohttp.ClientError, asyncio.TimeoutError) as err:
        raise ApplicationError(f"{doing}: connection failed: {err!r}", type="KubernetesUnavailable") from err
    if 200 <= resp.status < 300:
        return json.loads(data) if data else {}
    if resp.status == 404 and missing_ok:
        return None
    err = ApiException(http_resp=resp)
    raise api_error(err, doing) from err


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
            raise ApplicationError(f"cluster {req.cluster} does not serve: {', '.join(missing)}; install the "
                                   "providers and CRDs of these API versions first",
                                   type="KindNotInstalled", non_retryable=True)
        return DiscoveryResult(installed=[str(k) for k in req.kinds])

    @activity.defn
    async def apply_objects(self, req: ApplyRequest) -> ApplyResult:
        res = await self._resources(req.cluster)
        result = ApplyResult()
        for raw in req.objects:
            desired = json.loads(json.dumps(raw))
            md = desired.setdefault("metadata", {})
            md.setdefault("labels", {})[MANAGED_BY_LABEL] = MANAGED_BY
            md.setdefault("annotations", {})[OWNER_ANNOTATION] = req.owner
            ref = ObjectRef.of(desired)
            activity.heartbeat(str(ref))
            item = await res.path(ref.api_version, ref.kind, ref.name, ref.namespace)
            live = await _request(res.api, "GET", item, f"reading {ref}", missing_ok=True)
            if live is None:
                try:
                    made = await _request(res.api, "POST", await res.path(ref.api_version, ref.kind,
                                                                          namespace=ref.namespace),
                                          f"creating {ref}", body=desired)
                    result.outcomes.append(ApplyOutcome(ref=ref, outcome="created",
                                                        uid=(made or {}).get("metadata", {}).get("uid", "")))
                    continue
                except ApplicationError as err:
                    if "AlreadyExists" not in str(err):
                        raise
                    live = await _request(res.api, "GET", item, f"reading {ref}")  # created meanwhile: compare
            assert live is not None
            lmd = live.get("metadata") or {}
            if _matches(live, desired):
                result.outcomes.append(ApplyOutcome(ref=ref, outcome="unchanged", uid=lmd.get("uid", "")))
                continue
            holder = (lmd.get("annotations") or {}).get(OWNER_ANNOTATION)
            if holder != req.owner or req.on_difference == "error":
                whose = f"managed by {holder}" if holder else "not created by Millwright"
                raise ApplicationError(f"{ref} already exists in cluster {req.cluster} and differs from the "
                                       f"desired object ({whose}); refusing to adopt or overwrite it",
                                       type="ObjectConflict", non_retryable=True)
            md["resourceVersion"] = lmd.get("resourceVersion")
            if "status" in live:
                desired["status"] = live["status"]
            await _request(res.api, "PUT", item, f"updating {ref}", body=desired)  # 409 Conflict: retried
            result.outcomes.append(ApplyOutcome(ref=ref, outcome="updated", uid=lmd.get("uid", "")))
        return result

    @activity.defn
    async def delete_objects(self, req: DeleteRequest) -> DeleteResult:
        """Delete each object in order and wait until it is gone (finalizers done); NotFound is done."""
        res = await self._resources(req.cluster)
        result = DeleteResult()
        deadline = time.monotonic() + req.timeout_seconds
        for ref in req.objects:
            if await res.lookup(ref.api_version, ref.kind) is None:
                result.absent.append(ref)  # the kind is gone (its CRD removed): so is the object
                continue
            item = await res.path(ref.api_version, ref.kind, ref.name, ref.namespace)
            gone = await _request(res.api, "DELETE", item, f"deleting {ref}", missing_ok=True,
                                  body={"kind": "DeleteOptions", "apiVersion": "v1",
                                        "propagationPolicy": "Background"}) is None
            (result.absent if gone else result.deleted).append(ref)
            while not gone:
                live = await _request(res.api, "GET", item, f"reading {ref}", missing_ok=True)
                if live is None:
                    break
                fins = (live.get("metadata") or {}).get("finalizers") or []
                activity.heartbeat(f"waiting for {ref} to go (finalizers: {', '.join(fins) or 'none'})")
                if time.monotonic() > deadline:
                    raise ApplicationError(f"{ref} still exists after {req.timeout_seconds:.0f}s "
                                           f"(finalizers: {fins})", type="DeleteTimeout")
                await asyncio.sleep(req.poll_seconds)
        return result

    @activity.defn
    async def list_objects(self, req: ListRequest) -> list[ObjectRef]:
        """Objects of these kinds (all namespaces) matching the selector; kinds not served list nothing."""
        return [
            ObjectRef(api_version=k.api_version, kind=k.kind, name=o["metadata"]["name"],
                      namespace=o["metadata"].get("namespace"))
            async for k, o in self._items(req.cluster, req.kinds, req.label_selector)
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
                raise ApplicationError(f"read_tenant_quota_objects does not read {k}", type="BadRequest",
                                       non_retryable=True)
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
        c = await _request(res.api, "GET", await res.path("cluster.x-k8s.io/v1beta2", "Cluster", ref.name,
                                                          ref.namespace), f"reading Cluster {ref.name}",
                           missing_ok=True)
        if c is None:
            return CapiClusterStatus(exists=False)
        st = c.get("status") or {}
        init = st.get("initialization") or {}
        conds = {x.get("type"): x for x in st.get("conditions") or []}
        machines = await _request(res.api, "GET", await res.path("cluster.x-k8s.io/v1beta2", "Machine",
                                                                 namespace=ref.namespace),
                                  "listing Machines", query={"labelSelector": f"cluster.x-k8s.io/cluster-name={ref.name}"})
        items = (machines or {}).get("items") or []
        return CapiClusterStatus(
            exists=True, phase=st.get("phase") or "",
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
        doc = await _request(res.api, "GET", await res.path("cluster.x-k8s.io/v1beta2", "Machine",
                                                            namespace=ref.namespace), "listing Machines",
                             query={"labelSelector": f"cluster.x-k8s.io/cluster-name={ref.name}"})
        out = []
        for m in (doc or {}).get("items") or []:
            md = m.get("metadata") or {}
            node = ((m.get("status") or {}).get("nodeRef") or {}).get("name") or ""
            out.append(MachineNode(machine=md["name"], node=node,
                                   control_plane="cluster.x-k8s.io/control-plane" in (md.get("labels") or {})))
        return sorted(out, key=lambda m: m.machine)

    @activity.defn
    async def check_secret(self, req: SecretCheck) -> SecretReference:
        """That a Secret holds a key; returns where it is, never what it holds (a retry waits for it)."""
        core = k8s.CoreV1Api(await self._clusters.api(req.cluster))
        try:
            secret = await core.read_namespaced_secret(req.name, req.namespace, _request_timeout=_REQUEST_TIMEOUT)
        except ApiException as err:
            if err.status == 404:
                raise ApplicationError(f"Secret {req.namespace}/{req.name} not found yet", type="SecretNotFound") \
                    from None
            raise api_error(err, f"reading Secret {req.namespace}/{req.name}") from None
        if req.key not in (secret.data or {}):
            raise ApplicationError(f"Secret {req.namespace}/{req.name} has no key {req.key!r} yet",
                                   type="SecretNotFound")
        return SecretReference(ref=f"secret:{req.cluster}/{req.namespace}/{req.name}#{req.key}")

    @activity.defn
    async def read_vcluster(self, ref: VClusterRef) -> VClusterStatus:
        """vCluster readiness: the VCluster object ready (provider status) and its Secret `vc-<name>` present."""
        res = await self._resources(ref.cluster)
        vc = await _request(res.api, "GET", await res.path("infrastructure.cluster.x-k8s.io/v1alpha1", "VCluster",
                                                           ref.name, ref.namespace),
                            f"reading VCluster {ref.name}", missing_ok=True)
        if vc is None:
            return VClusterStatus(exists=False)
        st = vc.get("status") or {}
        secret = await _request(res.api, "GET", f"/api/v1/namespaces/{ref.namespace}/secrets/vc-{ref.name}",
                                "reading the vCluster kubeconfig Secret", missing_ok=True)
        has_config = bool(secret and "config" in (secret.get("data") or {}))
        kubeconfig = SecretReference(ref=f"secret:{ref.cluster}/{ref.namespace}/vc-{ref.name}#config") \
            if has_config else None
        return VClusterStatus(exists=True, ready=bool(st.get("ready")) and has_config, phase=st.get("phase") or "",
                              kubeconfig=kubeconfig)

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
            qs = await _request(res.api, "GET", await res.path("scheduling.run.ai/v2", "Queue"), "listing queues",
                                query={"labelSelector": TENANT_LABEL})
            for q in (qs or {}).get("items") or []:
                tenant = q["metadata"]["labels"][TENANT_LABEL]
                gpu = (((q.get("spec") or {}).get("resources") or {}).get("gpu") or {})
                quotas[tenant] = quotas.get(tenant, 0.0) + max(0.0, float(gpu.get("quota") or 0))
        return GpuCapacity(gpus=gpus, quotas=quotas)

    @activity.defn
    async def label_nodes(self, req: NodeLabels) -> int:
        """Merge these labels onto every matching node; returns how many nodes changed."""
        api = await self._clusters.api(req.cluster)
        query = {"labelSelector": req.label_selector} if req.label_selector else None
        nodes = await _request(api, "GET", "/api/v1/nodes", "listing nodes", query=query)
        changed = 0
        for n in (nodes or {}).get("items") or []:
            have = n["metadata"].get("labels") or {}
            if all(have.get(k) == v for k, v in req.labels.items()):
                continue
            await _request(api, "PATCH", f"/api/v1/nodes/{n['metadata']['name']}", "labelling node",
                           body={"metadata": {"labels": req.labels}}, content_type="application/merge-patch+json")
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
                    await _request(api, "DELETE", f"/api/v1/namespaces/{ns}/pods/{p['metadata']['name']}",
                                   "deleting a tenant pod", missing_ok=True)
                    evicted += 1
                active += 1
        return WorkloadCount(active=active, evicted=evicted)
