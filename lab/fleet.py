"""Fleet files: a compact description of a lab cluster, rendered to Kubernetes objects for seeding.

``millwright lab seed FILE`` and ``python -m lab.k8s --seed FILE`` accept this format (JSON or YAML).
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

GPU = "nvidia.com/gpu"
CREATED = "2026-01-01T00:00:00Z"


def _uid(*parts: str) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_URL, "millwright-lab/" + "/".join(parts)))


def _suffix(*parts: str) -> str:
    alphabet = "bcdfghjklmnpqrstvwxz2456789"
    h = hashlib.sha256("/".join(parts).encode()).digest()
    return "".join(alphabet[b % len(alphabet)] for b in h[:5])


class _M(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class Taint(_M):
    key: str
    value: str = ""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] = "NoSchedule"


class NodeSpec(_M):
    name: str
    labels: dict[str, str] = Field(default_factory=dict)
    gpus: int = 8
    taints: list[Taint] = Field(default_factory=list)
    unschedulable: bool = False
    ready: bool = True


class NodeGenerator(_M):
    prefix: str
    count: int
    gpus: int = 8
    labels: dict[str, str] = Field(default_factory=dict)
    start: int = 1
    digits: int = 2


class PDBSpec(_M):
    minAvailable: int | str | None = None
    maxUnavailable: int | str | None = None

    @model_validator(mode="after")
    def _one(self) -> PDBSpec:
        if (self.minAvailable is None) == (self.maxUnavailable is None):
            raise ValueError("pdb needs exactly one of minAvailable, maxUnavailable")
        return self


class Workload(_M):
    name: str
    kind: Literal["ReplicaSet", "DaemonSet", "Pod"] = "ReplicaSet"
    namespace: str = "default"
    replicas: int = 1
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    gpus: int = 0
    nodes: list[str] | None = None  # pinning: pods are placed on these nodes (round robin)
    node: str | None = None  # bare pods
    nodeSelector: dict[str, str] = Field(default_factory=dict)
    pdb: PDBSpec | None = None
    emptyDir: bool = False
    terminationGracePeriodSeconds: int = 30
    image: str = "registry.local/millwright/workload:latest"
    tolerations: list[dict[str, Any]] = Field(default_factory=list)


class InfiniBandSpec(_M):
    """The fleet's InfiniBand fabric: which nodes have HCA ports, and the switches (seeds the UFM emulator
    and the NetBox interfaces from the same GUIDs)."""

    fabric: str = "lab-ib"
    ports_per_host: int = Field(1, ge=1, le=8, description="HCA ports per host, named ib0, ib1, ...")
    switches: int = Field(2, ge=0, le=64)
    hosts: list[str] | None = Field(None, description="Nodes with IB ports; default every node.")
    guids: dict[str, list[str]] = Field(default_factory=dict, description="Explicit port GUIDs per host.")


def ib_guid(*parts: str) -> str:
    """A stable port GUID (16 lowercase hex digits, NVIDIA OUI) derived from names."""
    return "b8cef603" + hashlib.sha256("/".join(parts).encode()).hexdigest()[:8]


class BmcSettings(_M):
    """The lab's emulated BMCs (lab/redfish.py), one per GPU node, named like the node; read by `millwright lab up`."""

    enabled: bool = Field(True, description="Run a BMC and a host agent for every node with GPUs.")
    power_delay: float = Field(0.2, ge=0, le=60, description="Seconds a power change takes to land.")
    power: Literal["On", "Off"] = Field("On", description="Power at start (On: the nodes are running).")
    https: bool = Field(
        True,
        description="Answer HTTPS with a lab CA certificate, as real BMCs do (false: plain "
        "HTTP, as `millwright lab up --bmc-http` asks).",
    )


class MigSettings(_M):
    """The emulator's mig-manager (lab/k8s/controllers/migmanager.py), as `POST /_lab/config` sets it."""

    strategy: Literal["single", "mixed"] = Field("mixed", description="The device plugin's MIG strategy.")
    pendingSeconds: float = Field(0.2, ge=0, le=3600, description="How long a reconfiguration stays `pending`.")
    reboot: bool = Field(False, description="Reboot the node when the MIG mode changes (mig-manager's WITH_REBOOT).")
    dra: bool = Field(False, description="NVIDIA's DRA driver publishes each GPU node's ResourceSlice.")

    def config(self) -> dict[str, Any]:
        return {"migStrategy": self.strategy, "migPendingSeconds": self.pendingSeconds, "migReboot": self.reboot,
                "migDra": self.dra}  # fmt: skip


class Fleet(_M):
    cluster: str = "lab"
    nodes: list[NodeSpec | NodeGenerator] = Field(default_factory=list)
    namespaces: list[str] = Field(default_factory=list)
    workloads: list[Workload] = Field(default_factory=list)
    objects: list[dict[str, Any]] = Field(default_factory=list)
    # emulator settings, not objects (read by lab.k8s.server.load_config_file)
    jobs: dict[str, Any] | None = Field(None, description="Job outcome rules, as POST /_lab/config {'jobs': ...}.")
    rebootSeconds: float | None = None
    mig: MigSettings | None = None
    infiniband: InfiniBandSpec | None = None
    bmc: BmcSettings = Field(default_factory=BmcSettings)

    def bmc_servers(self) -> list[dict]:
        """lab.redfish server specs for the GPU nodes (name = node name; the GPU model from the node's
        `nvidia.com/gpu.product` label, as NVML names it); empty when the BMCs are turned off."""
        if not self.bmc.enabled:
            return []
        out = []
        for n in self.node_specs():
            if n.gpus:
                spec: dict[str, Any] = {"name": n.name, "gpus": n.gpus, "power": self.bmc.power}
                if n.labels.get("nvidia.com/gpu.product"):
                    spec["gpu_model"] = n.labels["nvidia.com/gpu.product"].replace("-", " ")
                out.append(spec)
        return out

    def ib_ports(self) -> dict[str, list[str]]:
        """host -> its HCA port GUIDs (ib0, ib1, ... in order); empty without an infiniband part."""
        ib = self.infiniband
        if ib is None:
            return {}
        hosts = ib.hosts if ib.hosts is not None else [n.name for n in self.node_specs()]
        return {
            h: list(ib.guids.get(h) or [ib_guid(self.cluster, ib.fabric, h, str(i)) for i in range(ib.ports_per_host)])
            for h in hosts
        }

    def netbox_devices(self, bmcs: dict[str, str] | None = None, credentials: str | None = None) -> list[dict]:
        """The fleet's nodes as the lab records them in NetBox (lab/netbox.py's `seed_inventory`): a device per
        node with its HCA ports as interfaces ``ib0``, ``ib1``, ... carrying the same port GUIDs the UFM emulator
        serves (`ib_ports`), and, for a GPU node, what burn-in reads from NetBox: the expected GPUs, GPU model
        and firmware baseline of its BMC's spec, its BMC URL (`bmcs`: node -> URL) and the credentials reference."""
        from activities.netbox.models import (
            CF_BMC_CREDENTIALS,
            CF_BMC_URL,
            CF_EXPECTED_GPUS,
            CF_FIRMWARE_BASELINE,
            CF_GPU_MODEL,
        )
        from lab.bmc import normalize_spec

        ports = self.ib_ports()
        specs = {s["name"]: normalize_spec(s) for s in self.bmc_servers()}
        out = []
        for n in self.node_specs():
            fields: dict[str, Any] = {}
            spec = specs.get(n.name)
            if spec:
                fields |= {
                    CF_EXPECTED_GPUS: spec["gpus"],
                    CF_GPU_MODEL: spec["gpu_model"],
                    CF_FIRMWARE_BASELINE: spec["firmware"],
                }
            if bmcs and n.name in bmcs:
                fields[CF_BMC_URL] = bmcs[n.name]
                if credentials:
                    fields[CF_BMC_CREDENTIALS] = credentials
            out.append(
                {
                    "name": n.name,
                    "custom_fields": fields,
                    "interfaces": {f"ib{i}": guid for i, guid in enumerate(ports.get(n.name, []))},
                }
            )
        return out

    def ib_switches(self) -> dict[str, str]:
        """switch system name -> system GUID."""
        ib = self.infiniband
        if ib is None:
            return {}
        return {
            f"{ib.fabric}-leaf-{i + 1:02d}": ib_guid(self.cluster, ib.fabric, "switch", str(i))
            for i in range(ib.switches)
        }

    # ------------------------------------------------------------------ rendering
    def node_specs(self) -> list[NodeSpec]:
        out: list[NodeSpec] = []
        for n in self.nodes:
            if isinstance(n, NodeGenerator):
                for i in range(n.start, n.start + n.count):
                    out.append(NodeSpec(name=f"{n.prefix}{i:0{n.digits}d}", labels=dict(n.labels), gpus=n.gpus))
            else:
                out.append(n)
        return out

    def to_objects(self) -> list[dict]:
        objs: list[dict] = []
        nodes = self.node_specs()
        namespaces = list(dict.fromkeys(self.namespaces + [w.namespace for w in self.workloads]))
        for ns in namespaces:
            objs.append(
                {
                    "apiVersion": "v1",
                    "kind": "Namespace",
                    "metadata": {"name": ns, "uid": _uid(self.cluster, "ns", ns), "creationTimestamp": CREATED},
                }
            )
        for i, n in enumerate(nodes):
            objs.append(self._node(n, i))
        counter = [0]
        for w in self.workloads:
            if w.kind == "ReplicaSet":
                objs += self._replicaset(w, nodes, counter)
            elif w.kind == "DaemonSet":
                objs += self._daemonset(w, nodes, counter)
            else:
                objs += self._bare(w, nodes, counter)
            if w.pdb is not None:
                spec: dict[str, Any] = {"selector": {"matchLabels": self._labels(w)}}
                if w.pdb.minAvailable is not None:
                    spec["minAvailable"] = w.pdb.minAvailable
                else:
                    spec["maxUnavailable"] = w.pdb.maxUnavailable
                objs.append(
                    {
                        "apiVersion": "policy/v1",
                        "kind": "PodDisruptionBudget",
                        "metadata": {
                            "name": w.name,
                            "namespace": w.namespace,
                            "uid": _uid(self.cluster, "pdb", w.namespace, w.name),
                            "creationTimestamp": CREATED,
                            "generation": 1,
                        },
                        "spec": spec,
                    }
                )
        objs += [dict(o) for o in self.objects]
        return objs

    def _node(self, n: NodeSpec, i: int) -> dict:
        labels = {
            "kubernetes.io/hostname": n.name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            **({"nvidia.com/gpu.present": "true", "nvidia.com/gpu.count": str(n.gpus)} if n.gpus else {}),
            **n.labels,
        }
        res = {"cpu": "96", "memory": "1056Gi", "pods": "110", "ephemeral-storage": "3500Gi"}
        if n.gpus:
            res[GPU] = str(n.gpus)
        spec: dict[str, Any] = {"podCIDR": f"10.244.{i}.0/24"}
        if n.unschedulable:
            spec["unschedulable"] = True
        taints = [t.model_dump() for t in n.taints]
        if n.unschedulable:
            taints.append({"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"})
        if taints:
            spec["taints"] = taints
        cond = [
            {
                "type": t,
                "status": "False",
                "reason": r,
                "message": m,
                "lastHeartbeatTime": CREATED,
                "lastTransitionTime": CREATED,
            }
            for t, r, m in [
                ("MemoryPressure", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
                ("DiskPressure", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
                ("PIDPressure", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
            ]
        ]
        cond.append(
            {
                "type": "Ready",
                "status": "True" if n.ready else "False",
                "reason": "KubeletReady" if n.ready else "KubeletNotReady",
                "message": "kubelet is posting ready status" if n.ready else "container runtime is down",
                "lastHeartbeatTime": CREATED,
                "lastTransitionTime": CREATED,
            }
        )
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": n.name,
                "uid": _uid(self.cluster, "node", n.name),
                "labels": labels,
                "creationTimestamp": CREATED,
                "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
            },
            "spec": spec,
            "status": {
                "capacity": dict(res),
                "allocatable": dict(res),
                "conditions": cond,
                "addresses": [
                    {"type": "InternalIP", "address": f"10.0.{i // 250}.{i % 250 + 10}"},
                    {"type": "Hostname", "address": n.name},
                ],
                "nodeInfo": {
                    "bootID": _uid(self.cluster, "boot", n.name, "0"),
                    "machineID": hashlib.md5(n.name.encode()).hexdigest(),
                    # The SMBIOS UUID, as the lab BMC of a server of that name reports it (lab/bmc.py).
                    "systemUUID": _uid(n.name, "system"),
                    "kernelVersion": "6.8.0-49-generic",
                    "osImage": "Ubuntu 24.04.1 LTS",
                    "containerRuntimeVersion": "containerd://1.7.22",
                    "kubeletVersion": "v1.32.4",
                    "kubeProxyVersion": "v1.32.4",
                    "operatingSystem": "linux",
                    "architecture": "amd64",
                },
                "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            },
        }

    @staticmethod
    def _labels(w: Workload) -> dict[str, str]:
        return {"app": w.name, **w.labels}

    def _pod_spec(self, w: Workload) -> dict:
        c: dict[str, Any] = {
            "name": "main",
            "image": w.image,
            "imagePullPolicy": "IfNotPresent",
            "terminationMessagePath": "/dev/termination-log",
            "terminationMessagePolicy": "File",
        }
        if w.gpus:
            c["resources"] = {"limits": {GPU: str(w.gpus)}, "requests": {GPU: str(w.gpus)}}
        else:
            c["resources"] = {}
        spec: dict[str, Any] = {
            "containers": [c],
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": w.terminationGracePeriodSeconds,
            "schedulerName": "default-scheduler",
            "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "default",
        }
        if w.emptyDir:
            spec["volumes"] = [{"name": "scratch", "emptyDir": {}}]
            c["volumeMounts"] = [{"name": "scratch", "mountPath": "/scratch"}]
        if w.nodeSelector:
            spec["nodeSelector"] = dict(w.nodeSelector)
        if w.tolerations:
            spec["tolerations"] = [dict(t) for t in w.tolerations]
        return spec

    def _pod(
        self,
        w: Workload,
        name: str,
        node: str | None,
        owner: dict | None,
        counter: list[int],
        gen_name: str | None = None,
    ) -> dict:
        counter[0] += 1
        md: dict[str, Any] = {
            "name": name,
            "namespace": w.namespace,
            "labels": self._labels(w),
            "uid": _uid(self.cluster, "pod", w.namespace, name),
            "creationTimestamp": CREATED,
        }
        if gen_name:
            md["generateName"] = gen_name
        if w.annotations:
            md["annotations"] = dict(w.annotations)
        if owner:
            md["ownerReferences"] = [{**owner, "controller": True, "blockOwnerDeletion": True}]
        spec = self._pod_spec(w)
        status: dict[str, Any] = {"phase": "Pending", "qosClass": "BestEffort"}
        if node:
            spec["nodeName"] = node
            ip = f"10.244.{counter[0] // 250}.{counter[0] % 250 + 2}"
            cond = [
                {"type": t, "status": "True", "lastProbeTime": None, "lastTransitionTime": CREATED}
                for t in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled")
            ]
            status = {
                "phase": "Running",
                "conditions": cond,
                "podIP": ip,
                "podIPs": [{"ip": ip}],
                "startTime": CREATED,
                "qosClass": "BestEffort" if not w.gpus else "Guaranteed",
                "containerStatuses": [
                    {
                        "name": "main",
                        "image": w.image,
                        "imageID": "",
                        "ready": True,
                        "started": True,
                        "restartCount": 0,
                        "containerID": f"containerd://{_uid(name)[:12]}",
                        "state": {"running": {"startedAt": CREATED}},
                    }
                ],
            }
        return {"apiVersion": "v1", "kind": "Pod", "metadata": md, "spec": spec, "status": status}

    def _eligible(self, w: Workload, nodes: list[NodeSpec]) -> list[str]:
        if w.nodes:
            return list(w.nodes)
        out = []
        for n in nodes:
            labels = {"kubernetes.io/hostname": n.name, **n.labels}
            if n.unschedulable or any(t.effect in ("NoSchedule", "NoExecute") for t in n.taints):
                continue
            if any(labels.get(k) != v for k, v in w.nodeSelector.items()):
                continue
            if w.gpus and n.gpus < w.gpus:
                continue
            out.append(n.name)
        return out

    def _replicaset(self, w: Workload, nodes: list[NodeSpec], counter: list[int]) -> list[dict]:
        uid = _uid(self.cluster, "rs", w.namespace, w.name)
        labels = self._labels(w)
        tmpl_md: dict[str, Any] = {"labels": labels}
        if w.annotations:
            tmpl_md["annotations"] = dict(w.annotations)
        rs = {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "metadata": {
                "name": w.name,
                "namespace": w.namespace,
                "uid": uid,
                "labels": labels,
                "creationTimestamp": CREATED,
                "generation": 1,
            },
            "spec": {
                "replicas": w.replicas,
                "selector": {"matchLabels": labels},
                "template": {"metadata": tmpl_md, "spec": self._pod_spec(w)},
            },
            "status": {
                "replicas": w.replicas,
                "readyReplicas": w.replicas,
                "availableReplicas": w.replicas,
                "fullyLabeledReplicas": w.replicas,
                "observedGeneration": 1,
            },
        }
        eligible = self._eligible(w, nodes)
        owner = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": w.name, "uid": uid}
        pods = []
        for i in range(w.replicas):
            node = eligible[i % len(eligible)] if eligible else None
            name = f"{w.name}-{_suffix(self.cluster, w.namespace, w.name, str(i))}"
            pods.append(self._pod(w, name, node, owner, counter, gen_name=f"{w.name}-"))
        return [rs, *pods]

    def _daemonset(self, w: Workload, nodes: list[NodeSpec], counter: list[int]) -> list[dict]:
        uid = _uid(self.cluster, "ds", w.namespace, w.name)
        labels = self._labels(w)
        targets = w.nodes or [
            n.name
            for n in nodes
            if all(({"kubernetes.io/hostname": n.name, **n.labels}).get(k) == v for k, v in w.nodeSelector.items())
        ]
        ds = {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": {
                "name": w.name,
                "namespace": w.namespace,
                "uid": uid,
                "labels": labels,
                "creationTimestamp": CREATED,
                "generation": 1,
            },
            "spec": {
                "selector": {"matchLabels": labels},
                "template": {"metadata": {"labels": labels}, "spec": self._pod_spec(w)},
            },
            "status": {
                "currentNumberScheduled": len(targets),
                "desiredNumberScheduled": len(targets),
                "numberReady": len(targets),
                "numberAvailable": len(targets),
                "numberMisscheduled": 0,
                "updatedNumberScheduled": len(targets),
                "observedGeneration": 1,
            },
        }
        owner = {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": w.name, "uid": uid}
        pods = [
            self._pod(
                w, f"{w.name}-{_suffix(self.cluster, w.namespace, w.name, n)}", n, owner, counter, gen_name=f"{w.name}-"
            )
            for n in targets
        ]
        return [ds, *pods]

    def _bare(self, w: Workload, nodes: list[NodeSpec], counter: list[int]) -> list[dict]:
        if w.replicas <= 1:
            return [self._pod(w, w.name, w.node or (w.nodes[0] if w.nodes else None), None, counter)]
        targets: Sequence[str | None] = w.nodes or ([w.node] if w.node else [None])
        return [self._pod(w, f"{w.name}-{i}", targets[i % len(targets)], None, counter) for i in range(w.replicas)]


def load_fleet(path: str | Path) -> Fleet:
    text = Path(path).read_text()
    data = yaml.safe_load(text)  # YAML is a superset of JSON
    return Fleet.model_validate(data or {})


DEMO_FLEET = Path(__file__).parent / "fleets" / "demo.json"
