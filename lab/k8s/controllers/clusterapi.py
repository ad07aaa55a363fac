"""Cluster API (v1beta2) and Metal3.

A created Cluster steps Pending → Provisioning (infrastructure provisioned, Machines created) →
Provisioned (control plane initialized, a new emulated API server for the workload cluster, its
`<name>-kubeconfig` Secret, control-plane Machines with nodeRef) → Available (worker Machines Ready).
One step every `capiStepSeconds` (config, default 0.5 s). Deleting it (finalizer) removes its children
tier by tier: MachineDeployments and their Machines, the control plane, the infrastructure cluster, the
kubeconfig Secret; then the finalizer goes and the workload API server stops.
A ClusterClass Cluster (`spec.topology`) is the same once the topology controller has derived its
KubeadmControlPlane `<name>-cp` and MachineDeployments `<name>-<md name>` (labelled topology-owned).

A workload cluster's API server is a new emulator of its own, made by the factory the composite is given
(lab/k8s/server.py passes its `Emulator`)."""

from __future__ import annotations

import asyncio
import base64
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

import yaml

from ..admin import kubeconfig
from ..crds import CLUSTERS, KCPS, MACHINE_DEPLOYMENTS, MACHINES, METAL3_CLUSTERS, TENANCY_CRDS
from ..seed import seed_objects
from ..util import clone
from .base import Controller

if TYPE_CHECKING:
    from ..api import Api
    from ..store import Store

CAPI_FINALIZER = "cluster.cluster.x-k8s.io"
TOPOLOGY_OWNED = "topology.cluster.x-k8s.io/owned"


class WorkloadEmulator(Protocol):
    """What the controller needs of a workload cluster's API server (lab/k8s/server.py `Emulator`)."""

    url: str
    store: Store

    async def start(self, seeds: list[list[dict]] | None = None) -> str: ...

    async def stop(self) -> None: ...


class ClusterApi(Controller):
    def __init__(self, api: Api, new_emulator: Callable[[], WorkloadEmulator]) -> None:
        super().__init__(api)
        self.new_emulator = new_emulator
        self.workload: dict[str, WorkloadEmulator] = {}  # CAPI Cluster uid -> the emulator serving it
        self._bg: set[asyncio.Task] = set()  # starting and stopping workload emulators

    async def stop(self) -> None:
        for emu in list(self.workload.values()):
            await emu.stop()
        self.workload.clear()

    def reconcile(self, work: set, now: float) -> None:
        store = self.store
        for uid in [u for u in self.workload if u not in store.by_uid]:
            self._stop_workload(uid)
        if CLUSTERS not in store.registry.types:
            return
        for ok in sorted(ok for ok in work if ok[0] == CLUSTERS):
            cluster = store.lookup(ok)
            if cluster is not None:
                self.sync_cluster(ok, cluster, now)

    def _stop_workload(self, uid: str) -> None:
        emu = self.workload.pop(uid, None)
        if emu is not None:
            task = asyncio.get_running_loop().create_task(emu.stop())
            self._bg.add(task)
            task.add_done_callback(self._bg.discard)

    async def _start_workload(self, uid: str) -> None:
        emu = self.new_emulator()
        await emu.start([TENANCY_CRDS])
        async with self.store.lock:
            keep = uid in self.store.by_uid
            if keep:
                self.workload[uid] = emu
                self.store.side.setdefault(uid, {})["url"] = emu.url
                self.store.kick.set()
        if not keep:
            await emu.stop()

    def _seed_workload(self, uid: str, objects: list[dict]) -> None:
        emu = self.workload.get(uid)
        if emu is None:
            return

        async def run() -> None:
            async with emu.store.lock:
                seed_objects(emu.store, objects)

        task = asyncio.get_running_loop().create_task(run())
        self._bg.add(task)
        task.add_done_callback(self._bg.discard)

    def _cluster_children(self, cluster: dict) -> tuple[list[dict], list[dict], list[dict], list[dict]]:
        """(MachineDeployments, worker Machines, control-plane Machines, KubeadmControlPlanes) of a Cluster."""
        store = self.store
        ns, name = cluster["metadata"]["namespace"], cluster["metadata"]["name"]
        mds = [o for o in store.all(MACHINE_DEPLOYMENTS, ns) if (o.get("spec") or {}).get("clusterName") == name]
        machines = [
            o
            for o in store.all(MACHINES, ns)
            if (o["metadata"].get("labels") or {}).get("cluster.x-k8s.io/cluster-name") == name
        ]
        workers = [m for m in machines if "cluster.x-k8s.io/control-plane" not in (m["metadata"].get("labels") or {})]
        cps = [m for m in machines if m not in workers]
        kref = (cluster.get("spec") or {}).get("controlPlaneRef") or {}
        kcps = [
            o
            for o in store.all(KCPS, ns)
            if o["metadata"]["name"] == kref.get("name")
            or (
                not kref
                and TOPOLOGY_OWNED in (o["metadata"].get("labels") or {})
                and o["metadata"]["labels"].get("cluster.x-k8s.io/cluster-name") == name
            )
        ]
        return mds, workers, cps, kcps

    def _sync_topology(self, cluster: dict) -> None:
        """The topology controller, just enough: `spec.topology` → a KubeadmControlPlane and MachineDeployments
        (owned by the Cluster), their replicas kept in step with the topology."""
        store = self.store
        md = cluster["metadata"]
        ns, name = md["namespace"], md["name"]
        topo = cluster["spec"]["topology"]
        version = topo.get("version", "")
        labels = {"cluster.x-k8s.io/cluster-name": name, TOPOLOGY_OWNED: ""}
        owner = [
            {
                "apiVersion": cluster["apiVersion"],
                "kind": "Cluster",
                "name": name,
                "uid": md["uid"],
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
        want: list[tuple[tuple[str, str], str, str, dict, dict]] = [
            (
                KCPS,
                "KubeadmControlPlane",
                f"{name}-cp",
                {},
                {"replicas": int((topo.get("controlPlane") or {}).get("replicas", 1)), "version": version},
            )
        ]
        for w in (topo.get("workers") or {}).get("machineDeployments") or []:
            mdname = f"{name}-{w['name']}"
            sel = {"cluster.x-k8s.io/cluster-name": name, "cluster.x-k8s.io/deployment-name": mdname}
            want.append(
                (
                    MACHINE_DEPLOYMENTS,
                    "MachineDeployment",
                    mdname,
                    (w.get("metadata") or {}).get("annotations") or {},
                    {
                        "clusterName": name,
                        "replicas": int(w.get("replicas", 1)),
                        "selector": {"matchLabels": sel},
                        "template": {"metadata": {"labels": sel}, "spec": {"clusterName": name, "version": version}},
                    },
                )
            )
        for key, kind, oname, ann, spec in want:
            rt = self._rt(key)
            live = store.get(rt, ns, oname)
            if live is None:
                obj = {
                    "apiVersion": rt.api_version,
                    "kind": kind,
                    "metadata": {
                        "name": oname,
                        "namespace": ns,
                        "labels": dict(labels),
                        "annotations": dict(ann),
                        "ownerReferences": owner,
                    },
                    "spec": spec,
                }
                store.put(rt, store.new_meta(rt, obj), actor="capi-topology-controller", verb="create")
            elif (live.get("spec") or {}).get("replicas") != spec["replicas"]:
                new = clone(live)
                new["spec"]["replicas"] = spec["replicas"]
                store.put(rt, new, actor="capi-topology-controller", verb="update")

    def sync_cluster(self, ok: tuple, cluster: dict, now: float) -> None:  # noqa: C901 (one reconcile pass over a Cluster's phases, as Cluster API's controller walks them)
        store = self.store
        rt = self._rt(ok[0])
        md = cluster["metadata"]
        uid, ns, name = md["uid"], md["namespace"], md["name"]
        step = float(store.config.get("capiStepSeconds", 0.5))
        if md.get("deletionTimestamp"):
            self._delete_cluster(ok, cluster, now, step)
            return
        if CAPI_FINALIZER not in (md.get("finalizers") or []):
            new = clone(cluster)
            new["metadata"]["finalizers"] = [*(md.get("finalizers") or []), CAPI_FINALIZER]
            cluster = store.put(rt, new, actor="capi-controller", verb="update")
        side = store.side.setdefault(uid, {})
        t0 = side.setdefault("capi_t0", now)
        stage = min(3, int((now - t0) / step))
        if stage >= 1 and uid not in self.workload and not side.get("starting"):
            side["starting"] = True
            task = asyncio.get_running_loop().create_task(self._start_workload(uid))
            self._bg.add(task)
            task.add_done_callback(self._bg.discard)
        url: str = side.get("url") or ""
        if stage >= 2 and not url:
            stage = 1  # the workload API server is still starting; its start kicks us again
        spec = cluster.get("spec") or {}
        if spec.get("topology"):
            self._sync_topology(cluster)
        mds, workers, cps, kcps = self._cluster_children(cluster)
        version = ""
        if stage >= 1:
            m_rt = self._rt(MACHINES)
            wanted: list[tuple[dict, str, bool]] = []  # (owner, machine name, control plane)
            for kcp in kcps:
                version = (kcp.get("spec") or {}).get("version", "")
                for i in range(int((kcp.get("spec") or {}).get("replicas", 1))):
                    wanted.append((kcp, f"{kcp['metadata']['name']}-{i}", True))
            for d in mds:
                for i in range(int((d.get("spec") or {}).get("replicas", 1))):
                    wanted.append((d, f"{d['metadata']['name']}-{i}", False))
            have = {m["metadata"]["name"] for m in workers + cps}
            for owner, mname, is_cp in wanted:
                if mname in have:
                    continue
                labels = {"cluster.x-k8s.io/cluster-name": name}
                if is_cp:
                    labels["cluster.x-k8s.io/control-plane"] = ""
                else:
                    labels["cluster.x-k8s.io/deployment-name"] = owner["metadata"]["name"]
                tmpl = ((owner.get("spec") or {}).get("template") or {}).get("spec") or {}
                machine = {
                    "apiVersion": m_rt.api_version,
                    "kind": "Machine",
                    "metadata": {
                        "name": mname,
                        "namespace": ns,
                        "labels": labels,
                        "annotations": dict(owner["metadata"].get("annotations") or {}),
                        "ownerReferences": [
                            {
                                "apiVersion": owner["apiVersion"],
                                "kind": owner["kind"],
                                "name": owner["metadata"]["name"],
                                "uid": owner["metadata"]["uid"],
                                "controller": True,
                                "blockOwnerDeletion": True,
                            }
                        ],
                    },
                    "spec": {
                        "clusterName": name,
                        "version": (owner.get("spec") or {}).get("version") or tmpl.get("version", ""),
                        "infrastructureRef": tmpl.get("infrastructureRef") or {},
                    },
                    "status": {"phase": "Provisioning"},
                }
                store.put(m_rt, store.new_meta(m_rt, machine), actor="capi-controller", verb="create")
            mds, workers, cps, kcps = self._cluster_children(cluster)
            # Machines become Ready with a nodeRef: control plane at stage 2, workers at stage 3.
            nodes: list[dict] = []
            for m in cps + workers:
                is_cp = m in cps
                if stage < (2 if is_cp else 3) or (m.get("status") or {}).get("nodeRef"):
                    continue
                st = {
                    "phase": "Running",
                    "nodeRef": {"name": m["metadata"]["name"]},
                    "initialization": {"infrastructureProvisioned": True, "bootstrapDataSecretCreated": True},
                    "conditions": [
                        self._cond({}, "Ready", True, "Ready"),
                        self._cond({}, "NodeHealthy", True, "NodeHealthy"),
                    ],
                }
                self._status_put(m_rt, m, st, "capi-controller")
                gpus = (m["metadata"].get("annotations") or {}).get("millwright.dev/gpus-per-node", "0")
                labels = {"kubernetes.io/hostname": m["metadata"]["name"]}
                if is_cp:
                    labels["node-role.kubernetes.io/control-plane"] = ""
                else:
                    labels["cluster.x-k8s.io/deployment-name"] = m["metadata"]["labels"][
                        "cluster.x-k8s.io/deployment-name"
                    ]
                alloc = {"cpu": "64", "memory": "512Gi", "pods": "110"}
                if gpus not in ("", "0"):
                    alloc["nvidia.com/gpu"] = str(gpus)
                nodes.append(
                    {
                        "apiVersion": "v1",
                        "kind": "Node",
                        "metadata": {"name": m["metadata"]["name"], "labels": labels},
                        "spec": {},
                        "status": {
                            "capacity": dict(alloc),
                            "allocatable": dict(alloc),
                            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
                            "nodeInfo": {"kubeletVersion": m["spec"].get("version", ""), "bootID": str(uuid.uuid4())},
                        },
                    }
                )
            if nodes:
                self._seed_workload(uid, nodes)
        mds, workers, cps, kcps = self._cluster_children(cluster)
        cp_ready = [m for m in cps if (m.get("status") or {}).get("nodeRef")]
        w_ready = [m for m in workers if (m.get("status") or {}).get("nodeRef")]
        available = stage >= 3 and len(cp_ready) == len(cps) and len(w_ready) == len(workers)
        for kcp in kcps:
            k = kcp.get("status") or {}
            self._status_put(
                self._rt(KCPS),
                kcp,
                {
                    "replicas": len(cps),
                    "readyReplicas": len(cp_ready),
                    "availableReplicas": len(cp_ready),
                    "upToDateReplicas": len(cps),
                    "version": version or None,
                    "initialization": {"controlPlaneInitialized": stage >= 2},
                    "conditions": [
                        self._cond(k, "Initialized", stage >= 2, "Initialized" if stage >= 2 else "Waiting"),
                        self._cond(k, "Available", len(cp_ready) == len(cps) and stage >= 2, "Available"),
                    ],
                },
                "capi-controller",
            )
        for d in mds:
            mine = [
                m
                for m in workers
                if m["metadata"]["labels"].get("cluster.x-k8s.io/deployment-name") == d["metadata"]["name"]
            ]
            ready = [m for m in mine if (m.get("status") or {}).get("nodeRef")]
            self._status_put(
                self._rt(MACHINE_DEPLOYMENTS),
                d,
                {
                    "replicas": len(mine),
                    "readyReplicas": len(ready),
                    "availableReplicas": len(ready),
                    "upToDateReplicas": len(mine),
                    "phase": "Running" if len(ready) == len(mine) else "ScalingUp",
                },
                "capi-controller",
            )
        iref = spec.get("infrastructureRef") or {}
        if stage >= 1 and iref.get("kind") == "Metal3Cluster" and self._rt(METAL3_CLUSTERS):
            infra = store.get(self._rt(METAL3_CLUSTERS), ns, iref.get("name", ""))
            if infra is not None:
                self._status_put(
                    self._rt(METAL3_CLUSTERS),
                    infra,
                    {"ready": True, "initialization": {"provisioned": True}},
                    "metal3-controller",
                )
        if stage >= 2:
            self._ensure_kubeconfig_secret(cluster, url)
        old = cluster.get("status") or {}
        phase = ["Pending", "Provisioning", "Provisioned", "Provisioned"][stage]
        status = {
            "phase": phase,
            "initialization": {"infrastructureProvisioned": stage >= 1, "controlPlaneInitialized": stage >= 2},
            "conditions": [
                self._cond(old, "InfrastructureReady", stage >= 1, "Ready" if stage >= 1 else "Provisioning"),
                self._cond(
                    old,
                    "ControlPlaneInitialized",
                    stage >= 2,
                    "Initialized" if stage >= 2 else "WaitingForControlPlane",
                ),
                self._cond(old, "ControlPlaneAvailable", stage >= 2 and len(cp_ready) == len(cps), "Available"),
                self._cond(old, "WorkersAvailable", available, "Available"),
                self._cond(old, "RemoteConnectionProbe", stage >= 2, "Probed"),
                *([self._cond(old, "TopologyReconciled", True, "ReconcileSucceeded")] if spec.get("topology") else []),
                self._cond(
                    old,
                    "Available",
                    available,
                    "Available" if available else "NotAvailable",
                    f"{len(cp_ready) + len(w_ready)} of {len(cps) + len(workers)} machines ready",
                ),
            ],
            "controlPlane": {"desiredReplicas": len(cps), "readyReplicas": len(cp_ready)},
            "workers": {"desiredReplicas": len(workers), "readyReplicas": len(w_ready)},
        }
        self._status_put(rt, cluster, status, "capi-controller")
        if not available:
            store.schedule_at(t0 + (stage + 1) * step if stage < 3 else now + step / 2, ok)

    def _ensure_kubeconfig_secret(self, cluster: dict, url: str) -> None:
        store = self.store
        s_rt = store.registry.types[("", "secrets")]
        md = cluster["metadata"]
        sname = f"{md['name']}-kubeconfig"
        if store.get(s_rt, md["namespace"], sname) is not None:
            return
        cfg = kubeconfig(url, md["name"], token=f"capi-{uuid.uuid4().hex}")
        secret = {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "cluster.x-k8s.io/secret",
            "metadata": {
                "name": sname,
                "namespace": md["namespace"],
                "labels": {"cluster.x-k8s.io/cluster-name": md["name"]},
                "ownerReferences": [
                    {
                        "apiVersion": cluster["apiVersion"],
                        "kind": "Cluster",
                        "name": md["name"],
                        "uid": md["uid"],
                        "controller": True,
                    }
                ],
            },
            "data": {"value": base64.b64encode(yaml.safe_dump(cfg).encode()).decode()},
        }
        store.put(s_rt, store.new_meta(s_rt, secret), actor="capi-controller", verb="create")

    def _delete_cluster(self, ok: tuple, cluster: dict, now: float, step: float) -> None:
        store = self.store
        md = cluster["metadata"]
        ns = md["namespace"]
        mds, workers, cps, kcps = self._cluster_children(cluster)
        iref = (cluster.get("spec") or {}).get("infrastructureRef") or {}
        infra = []
        if iref.get("kind") == "Metal3Cluster" and self._rt(METAL3_CLUSTERS):
            found = store.get(self._rt(METAL3_CLUSTERS), ns, iref.get("name", ""))
            infra = [found] if found else []
        secret = store.get(store.registry.types[("", "secrets")], ns, f"{md['name']}-kubeconfig")
        tiers = [
            [(MACHINES, m) for m in workers] + [(MACHINE_DEPLOYMENTS, d) for d in mds],
            [(MACHINES, m) for m in cps] + [(KCPS, k) for k in kcps],
            [(METAL3_CLUSTERS, i) for i in infra],
            [(("", "secrets"), secret)] if secret else [],
        ]
        for tier in tiers:
            if tier:
                for key, o in tier:
                    if not o["metadata"].get("deletionTimestamp"):
                        self.api.delete_object(self._rt(key), o, {}, actor="capi-controller")
                store.schedule_at(now + step / 2, ok)
                return
        rt = self._rt(ok[0])
        self._stop_workload(md["uid"])
        new = clone(cluster)
        new["metadata"]["finalizers"] = [f for f in md.get("finalizers") or [] if f != CAPI_FINALIZER]
        if new["metadata"]["finalizers"]:
            store.put(rt, new, actor="capi-controller", verb="update")
        else:
            store.remove(rt, new, actor="capi-controller")
