"""The declarative-object activities for cluster creation (Cluster API) and tenant onboarding (vCluster, KAI).

Generic over kinds (activities/capi/client.py discovers each kind's resource path). What an activity reports
comes from reading the cluster, never from a write's answer:

* `apply_objects` creates what is missing and compares what exists (activities/capi/apply.py), stamping the
  owner annotation (activities/capi/ownership.py).
* `delete_objects` deletes and waits until every object is gone (finalizers included), heartbeating; with
  `owned_by` it deletes only what that owner holds (precondition: the UID it read) and reports the rest as kept.

Cluster references are those `ClusterConnector` resolves: a kubeconfig context, or a workload cluster
`<context>:<namespace>/<name>` whose kubeconfig Secret the connector reads itself. No kubeconfig, token
or Secret data is ever returned.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from kubernetes.aio import client as k8s
from kubernetes.aio.client.exceptions import ApiException
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.capi.apply import apply_object
from activities.capi.client import Resources, request
from activities.capi.models import (
    DEFAULT_RESERVED_GROUPS,
    ApplyRequest,
    ApplyResult,
    CapacityRequest,
    CapiClusterRef,
    CapiClusterStatus,
    DeleteRequest,
    DeleteResult,
    DiscoveryRequest,
    DiscoveryResult,
    ExistingObject,
    GpuCapacity,
    KindRef,
    ListRequest,
    MachineNode,
    NodeLabels,
    ObjectRef,
    OwnersRequest,
    QueueGuarantee,
    SecretCheck,
    SecretReference,
    SurveyRequest,
    SurveyResult,
    VClusterRef,
    VClusterStatus,
    WorkloadCount,
    WorkloadQuery,
)
from activities.capi.ownership import TENANT_LABEL, Ownership
from activities.capi.survey import survey
from activities.kube.connector import REQUEST_TIMEOUT, ClusterConnector
from activities.kube.errors import api_error

GPU = "nvidia.com/gpu"


class ClusterApiActivities:
    def __init__(self, clusters: ClusterConnector, reserved_groups: list[str] | None = None) -> None:
        self._clusters = clusters
        self._reserved_groups = list(DEFAULT_RESERVED_GROUPS if reserved_groups is None else reserved_groups)

    async def _resources(self, cluster: str) -> Resources:
        return Resources(await self._clusters.api(cluster), cluster)

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
        """Create or update each object in order; every outcome comes from reading the object (apply_object)."""
        res = await self._resources(req.cluster)
        result = ApplyResult()
        for raw in req.objects:
            result.outcomes.append(await apply_object(res, raw, req))
        return result

    @activity.defn
    async def survey_objects(self, req: SurveyRequest) -> SurveyResult:
        """What exists under each name and whose it is, read only (activities/capi/survey.py), with the groups the
        operator reserves (the worker's `reserved_groups`)."""
        objects = await survey(await self._resources(req.cluster), req)
        return SurveyResult(objects=objects, reserved_groups=self._reserved_groups)

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
                live = await request(res.api, "GET", item, f"reading {ref}", missing_ok=True)
                if live is None:
                    result.absent.append(ref)
                    continue
                if not req.owned_by.covers(live):
                    result.kept.append(ref)
                    continue
                uid = live["metadata"].get("uid", "")
                options["preconditions"] = {"uid": uid}  # replaced meanwhile: 409, and the retry reads again
            answer = await request(res.api, "DELETE", item, f"deleting {ref}", missing_ok=True, body=options)
            gone = answer is None
            (result.absent if gone else result.deleted).append(ref)
            while not gone:
                live = await request(res.api, "GET", item, f"reading {ref}", missing_ok=True)
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

    @activity.defn
    async def read_owners(self, req: OwnersRequest) -> list[ExistingObject]:
        """Which of these objects exist, and whose each is: what a run checks before its first write. Kinds the
        cluster does not serve have none; only the owner annotation of each comes back."""
        res = await self._resources(req.cluster)
        out = []
        for ref in req.objects:
            if await res.lookup(ref.api_version, ref.kind) is None:
                continue
            item = await res.path(ref.api_version, ref.kind, ref.name, ref.namespace)
            live = await request(res.api, "GET", item, f"reading {ref}", missing_ok=True)
            if live is not None:
                out.append(ExistingObject(ref=ref, owner=Ownership.of(live)))
        return out

    async def _items(self, cluster: str, kinds: list[KindRef], label_selector: str | None):
        """(kind, object) for every object of these kinds (all namespaces) matching the selector;
        kinds the cluster does not serve yield nothing."""
        res = await self._resources(cluster)
        query = {"labelSelector": label_selector} if label_selector else None
        for k in kinds:
            if await res.lookup(k.api_version, k.kind) is None:
                continue
            doc = await request(res.api, "GET", await res.path(k.api_version, k.kind), f"listing {k}", query=query)
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
        c = await res.read("cluster.x-k8s.io/v1beta2", "Cluster", ref.name, ref.namespace)
        if c is None:
            return CapiClusterStatus(exists=False)
        st = c.get("status") or {}
        init = st.get("initialization") or {}
        conds = {x.get("type"): x for x in st.get("conditions") or []}
        items = await self._machines(res, ref)
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

    async def _machines(self, res: Resources, ref: CapiClusterRef) -> list[dict[str, Any]]:
        """The Cluster's Machines (by the cluster-name label)."""
        doc = await request(
            res.api,
            "GET",
            await res.path("cluster.x-k8s.io/v1beta2", "Machine", namespace=ref.namespace),
            "listing Machines",
            query={"labelSelector": f"cluster.x-k8s.io/cluster-name={ref.name}"},
        )
        return (doc or {}).get("items") or []

    @activity.defn
    async def list_machines(self, ref: CapiClusterRef) -> list[MachineNode]:
        """The Cluster's Machines and their nodes (`status.nodeRef.name`), sorted by machine name."""
        res = await self._resources(ref.cluster)
        out = []
        for m in await self._machines(res, ref):
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
        vc = await res.read("infrastructure.cluster.x-k8s.io/v1alpha1", "VCluster", ref.name, ref.namespace)
        if vc is None:
            return VClusterStatus(exists=False)
        st = vc.get("status") or {}
        secret = await request(
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
        """Allocatable GPUs over all nodes, and every KAI queue (the tree: parent, GPU quota, tenant label)."""
        res = await self._resources(req.cluster)
        nodes = await request(res.api, "GET", "/api/v1/nodes", "listing nodes")
        gpus = 0.0
        for n in (nodes or {}).get("items") or []:
            with contextlib.suppress(ValueError):
                gpus += float(((n.get("status") or {}).get("allocatable") or {}).get(GPU) or 0)
        quotas: dict[str, float] = {}
        queues: list[QueueGuarantee] = []
        if await res.lookup("scheduling.run.ai/v2", "Queue") is not None:
            qs = await request(res.api, "GET", await res.path("scheduling.run.ai/v2", "Queue"), "listing queues")
            for q in (qs or {}).get("items") or []:
                spec = q.get("spec") or {}
                gpu = (spec.get("resources") or {}).get("gpu") or {}
                tenant = (q["metadata"].get("labels") or {}).get(TENANT_LABEL)
                guarantee = _number(gpu.get("quota"))
                queues.append(
                    QueueGuarantee(
                        name=q["metadata"]["name"], parent=spec.get("parentQueue"), gpu_quota=guarantee, tenant=tenant
                    )
                )
                if tenant is not None:  # what runs that began before the queue tree read
                    quotas[tenant] = quotas.get(tenant, 0.0) + max(0.0, guarantee)
        return GpuCapacity(gpus=gpus, quotas=quotas, queues=queues)

    @activity.defn
    async def label_nodes(self, req: NodeLabels) -> int:
        """Merge these labels onto every matching node, each read back; returns how many nodes this attempt
        changed (a retry skips the nodes an earlier attempt labelled)."""
        api = await self._clusters.api(req.cluster)
        query = {"labelSelector": req.label_selector} if req.label_selector else None
        nodes = await request(api, "GET", "/api/v1/nodes", "listing nodes", query=query)
        changed = 0
        for n in (nodes or {}).get("items") or []:
            have = n["metadata"].get("labels") or {}
            if all(have.get(k) == v for k, v in req.labels.items()):
                continue
            path = f"/api/v1/nodes/{n['metadata']['name']}"
            await request(
                api,
                "PATCH",
                path,
                "labelling node",
                body={"metadata": {"labels": req.labels}},
                content_type="application/merge-patch+json",
            )
            back = await request(api, "GET", path, "reading node", missing_ok=True)
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
            pods = await request(api, "GET", f"/api/v1/namespaces/{ns}/pods", "listing pods", missing_ok=True)
            for p in (pods or {}).get("items") or []:
                if (p.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                    continue
                if req.evict and not p["metadata"].get("deletionTimestamp"):
                    if (
                        await request(
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


def _number(value: Any) -> float:
    """A queue's quota as KAI reads it: a number; absent (or not a number) counts as none guaranteed."""
    try:
        return float(value if value is not None else 0)
    except (TypeError, ValueError):
        return 0.0
