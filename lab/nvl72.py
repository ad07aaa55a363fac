"""A GB200 NVL72 fleet and the training gangs that fill it, as objects for the Kubernetes emulator.

A rack is 18 compute trays of 4 GPUs and one NVLink domain: GPU Feature Discovery labels each tray
`nvidia.com/gpu.clique=<ClusterUUID>.<CliqueID>` and Topograph labels it with its rack (accelerator domain) and the
tier-1 switch of its network block (../shared/reference facts, docs/topology-and-gangs.md). Node names are a
provider's: random, and in no order of racks. The gangs are KAI PodGroups, each owned by an Indexed Job, placed as
KAI's topology-aware scheduler packs them (whole domains, two half-rack jobs sharing one), every tray busy.

Each tray has its BMC (`Nvl72Fleet.bmc_specs`, for lab/redfish.py): one per compute tray, named as its node, and
one per NVLink switch tray, `<rack>-nvswitch-<i>`, each knowing its rack and slot (lab/bmc_trays.py). Slots count
from 1 at the top of the rack, in the order NVIDIA builds an NVL72: compute trays 0-9 in slots 1-10, switch trays
0-8 in slots 11-19, compute trays 10-17 in slots 20-27 (the power shelves and the management switch, above and
below, are not counted; this matches the GPU platform info of NVIDIA's infra controller's GB200 mock: tray 14 in
slot 24).
"""

from __future__ import annotations

import random
import string
import uuid
from typing import Any

from pydantic import Field

from activities.kube.topology import (
    CLIQUE_LABEL,
    KAI_POD_GROUP_ANNOTATION,
    TOPOGRAPH_ACCELERATOR_LABEL,
    TOPOGRAPH_BLOCK_LABEL,
)
from lab.fleet import _M, CREATED, GPU, Fleet, NodeSpec, _uid
from lab.k8s.controllers.jobs import COMPLETION_INDEX
from lab.k8s.controllers.kubelet import LONG_RUNNING_ANNOTATION
from lab.k8s.crds import KAI_CRDS
from lab.k8s.dcgm import QUEUE_LABEL
from lab.k8s.mig import PRODUCT_LABEL

TRAYS_PER_RACK = 18
SWITCH_TRAYS_PER_RACK = 9
TOP_COMPUTE_TRAYS = 10  # compute trays above the switch trays
GPUS_PER_TRAY = 4
GPU_PRODUCT = "NVIDIA-GB200"  # GPU Feature Discovery's label value
GPU_MODEL = "NVIDIA GB200"  # the BMC's Processor Model
NVL72_TOPOLOGY_ID = 1  # the CBC's TopologyId (NVIDIA's code; the lab gives every rack the same)
KAI_SCHEDULER = "kai-scheduler"
TRAINING_NAMESPACE = "training"
TRAINING_QUEUE = "training"
TOPOLOGY = "nvl72"  # the kai.scheduler/v1alpha1 Topology the PodGroups name
HALF_RACK = TRAYS_PER_RACK // 2


class Nvl72Fleet(_M):
    """N racks of GB200 NVL72 compute trays."""

    cluster: str = "nvl72"
    racks: int = Field(ge=1, le=1000)
    seed: int = 0
    racks_per_block: int = Field(8, ge=1, description="Racks under one tier-1 switch (a network block).")
    split_racks: int = Field(0, ge=0, description="Racks whose NVLink fabric is partitioned in two cliques (x36).")

    def rack_names(self) -> list[str]:
        return [f"rack-{i + 1:03d}" for i in range(self.racks)]

    @staticmethod
    def switch_tray_names(rack: str) -> list[str]:
        """The rack's NVLink switch trays, as their BMCs are named."""
        return [f"{rack}-nvswitch-{i}" for i in range(SWITCH_TRAYS_PER_RACK)]

    def block_of(self, rack: int) -> str:
        return f"block-{rack // self.racks_per_block + 1:02d}"

    def layout(self) -> dict[str, list[str]]:
        """rack -> its trays' node names, tray order. Names are drawn at random (seeded) and dealt to racks
        shuffled, so neither their order nor their text says which rack a node is in."""
        rng = random.Random(f"{self.cluster}/{self.seed}/names")
        names: set[str] = set()
        while len(names) < self.racks * TRAYS_PER_RACK:
            names.add(
                rng.choice(string.ascii_lowercase) + "".join(rng.choices(string.ascii_lowercase + string.digits, k=7))
            )
        dealt = sorted(names)
        rng.shuffle(dealt)
        return {rack: dealt[i * TRAYS_PER_RACK : (i + 1) * TRAYS_PER_RACK] for i, rack in enumerate(self.rack_names())}

    def node_labels(self) -> dict[str, dict[str, str]]:
        """node -> its topology and GPU labels."""
        rng = random.Random(f"{self.cluster}/{self.seed}/fabric")
        split = set(rng.sample(range(self.racks), min(self.split_racks, self.racks)))
        out: dict[str, dict[str, str]] = {}
        for i, (rack, nodes) in enumerate(self.layout().items()):
            cluster_uuid = uuid.UUID(int=rng.getrandbits(128), version=4)
            for tray, node in enumerate(nodes):
                clique = 1 + (tray >= HALF_RACK if i in split else 0)
                out[node] = {
                    CLIQUE_LABEL: f"{cluster_uuid}.{clique}",
                    TOPOGRAPH_ACCELERATOR_LABEL: rack,
                    TOPOGRAPH_BLOCK_LABEL: self.block_of(i),
                    PRODUCT_LABEL: GPU_PRODUCT,
                    "kubernetes.io/arch": "arm64",  # Grace CPUs
                }
        return out

    def bmc_specs(self, switch_trays: bool = True) -> list[dict]:
        """A BMC spec (lab/redfish.py) per compute tray, named as its node, powered On, and per NVLink switch tray
        (`switch_tray_names`), each with its `tray`: kind, rack, index and slot."""
        specs: list[dict] = []
        for rack, nodes in self.layout().items():
            specs += [{"name": node, "gpus": GPUS_PER_TRAY, "gpu_model": GPU_MODEL, "power": "On",
                       "manufacturer": "NVIDIA", "model": "GB200 NVL72 Compute Tray",
                       "tray": _tray("compute", rack, i)} for i, node in enumerate(nodes)]  # fmt: skip
            if switch_trays:
                specs += [{"name": name, "gpus": 0, "power": "On", "manufacturer": "NVIDIA",
                           "model": "NVLink Switch Tray", "tray": _tray("switch", rack, i)}
                          for i, name in enumerate(self.switch_tray_names(rack))]  # fmt: skip
        return specs

    def fleet(self) -> Fleet:
        labels = self.node_labels()
        return Fleet(cluster=self.cluster, namespaces=[TRAINING_NAMESPACE],
                     nodes=[NodeSpec(name=n, labels=labels[n], gpus=GPUS_PER_TRAY) for n in sorted(labels)])  # fmt: skip

    def to_objects(self) -> list[dict]:
        """The KAI CRDs, the Topology and the training Queue, and the nodes."""
        objs = self.fleet().to_objects()
        for o in objs:
            if o["kind"] == "Node":
                o["status"]["nodeInfo"]["architecture"] = "arm64"
        topology = {"apiVersion": "kai.scheduler/v1alpha1", "kind": "Topology", "metadata": {"name": TOPOLOGY},
                    "spec": {"levels": [{"nodeLabel": TOPOGRAPH_BLOCK_LABEL}, {"nodeLabel": TOPOGRAPH_ACCELERATOR_LABEL},
                                        {"nodeLabel": "kubernetes.io/hostname"}]}}  # fmt: skip
        queue = {"apiVersion": "scheduling.run.ai/v2", "kind": "Queue", "metadata": {"name": TRAINING_QUEUE},
                 "spec": {"resources": {"gpu": {"quota": -1, "limit": -1, "overQuotaWeight": 1}}}}  # fmt: skip
        return [*KAI_CRDS, topology, queue, *objs]


def tray_slot(kind: str, index: int) -> int:
    """The physical slot of a rack's compute or switch tray `index` (the module's docstring has the layout)."""
    if kind == "switch":
        return TOP_COMPUTE_TRAYS + index + 1
    return index + 1 if index < TOP_COMPUTE_TRAYS else index + SWITCH_TRAYS_PER_RACK + 1


def _tray(kind: str, rack: str, index: int) -> dict:
    return {"kind": kind, "rack": rack, "index": index, "slot": tray_slot(kind, index),
            "topology_id": NVL72_TOPOLOGY_ID}  # fmt: skip


class TrainingJob(_M):
    name: str
    nodes: list[str] = Field(description="Its pods' nodes, in completion-index order.")


def plan_gangs(fleet: Nvl72Fleet) -> list[TrainingJob]:
    """Training jobs filling every tray, as KAI's topology-aware scheduler packs them: a job of 1 to 4 whole NVLink
    domains within one network block, or two 9-tray jobs sharing a rack (seeded; about 40 jobs on 64 racks)."""
    rng = random.Random(f"{fleet.cluster}/{fleet.seed}/gangs")
    layout = list(fleet.layout().values())
    jobs: list[TrainingJob] = []
    rack = 0
    while rack < fleet.racks:
        left_in_block = fleet.racks_per_block - rack % fleet.racks_per_block
        span = rng.choices([0, 1, 2, 3, 4], weights=[25, 25, 20, 15, 15])[0]  # 0: two half-rack jobs
        span = min(span, left_in_block, fleet.racks - rack)
        if span == 0:
            for half in (layout[rack][:HALF_RACK], layout[rack][HALF_RACK:]):
                jobs.append(TrainingJob(name=f"train-{len(jobs) + 1:03d}", nodes=half))
            rack += 1
            continue
        nodes = [n for r in layout[rack : rack + span] for n in r]
        jobs.append(TrainingJob(name=f"train-{len(jobs) + 1:03d}", nodes=nodes))
        rack += span
    return jobs


def pod_group_name(job: str, job_uid: str) -> str:
    """The name KAI's pod-grouper gives a Job's PodGroup."""
    return f"pg-{job}-{job_uid}"


def training_job(name: str, size: int, *, namespace: str = TRAINING_NAMESPACE, queue: str = TRAINING_QUEUE,
                 grace: int = 30) -> list[dict]:  # fmt: skip
    """An Indexed Job of `size` pods (one per tray, all its GPUs) scheduled by KAI, and its PodGroup (minMember
    `size`, within one network block, packed into NVLink domains). An eviction is not a failure of the job
    (podFailurePolicy Ignore on DisruptionTarget): the Job recreates the pod and KAI restarts the gang."""
    job_uid = _uid("job", namespace, name)
    group = pod_group_name(name, job_uid)
    labels = {QUEUE_LABEL: queue, "app": name}
    container = {"name": "trainer", "image": "nvcr.io/nvidia/pytorch:25.01-py3",
                 "resources": {"limits": {GPU: str(GPUS_PER_TRAY)}, "requests": {GPU: str(GPUS_PER_TRAY)}}}  # fmt: skip
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": job_uid,
            "labels": labels,
            "creationTimestamp": CREATED,
        },
        "spec": {
            "completionMode": "Indexed",
            "completions": size,
            "parallelism": size,
            "backoffLimit": 6,
            "podFailurePolicy": {"rules": [{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}]},
            "podReplacementPolicy": "Failed",
            "template": {
                "metadata": {
                    "labels": labels,
                    "annotations": {KAI_POD_GROUP_ANNOTATION: group, LONG_RUNNING_ANNOTATION: "true"},
                },
                "spec": {
                    "schedulerName": KAI_SCHEDULER,
                    "restartPolicy": "Never",
                    "terminationGracePeriodSeconds": grace,
                    "containers": [container],
                },
            },
        },
    }
    pod_group = {
        "apiVersion": "scheduling.run.ai/v2alpha2",
        "kind": "PodGroup",
        "metadata": {
            "name": group,
            "namespace": namespace,
            "uid": _uid("podgroup", namespace, group),
            "labels": {QUEUE_LABEL: queue},
            "creationTimestamp": CREATED,
            "ownerReferences": [
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "name": name,
                    "uid": job_uid,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            "minMember": size,
            "queue": queue,
            "topologyConstraint": {
                "topology": TOPOLOGY,
                "requiredTopologyLevel": TOPOGRAPH_BLOCK_LABEL,
                "preferredTopologyLevel": TOPOGRAPH_ACCELERATOR_LABEL,
            },
        },
    }
    return [job, pod_group]


def running_pods(job: dict, nodes: list[str]) -> list[dict]:
    """The Job's pods, index i running on nodes[i], as the Job controller and KAI left them."""
    md, spec = job["metadata"], job["spec"]
    tmpl = spec["template"]
    out = []
    for i, node in enumerate(nodes):
        name = f"{md['name']}-{i}-{_uid('pod', md['uid'], str(i))[:5]}"
        labels = {**tmpl["metadata"]["labels"], "batch.kubernetes.io/controller-uid": md["uid"],
                  "batch.kubernetes.io/job-name": md["name"], COMPLETION_INDEX: str(i)}  # fmt: skip
        ready = [{"type": t, "status": "True", "lastProbeTime": None, "lastTransitionTime": CREATED}
                 for t in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled")]  # fmt: skip
        c = tmpl["spec"]["containers"][0]
        out.append({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "generateName": f"{md['name']}-{i}-", "namespace": md["namespace"],
                         "uid": _uid("pod", md["uid"], str(i)), "creationTimestamp": CREATED, "labels": labels,
                         "annotations": {**tmpl["metadata"]["annotations"], COMPLETION_INDEX: str(i)},
                         "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": md["name"],
                                              "uid": md["uid"], "controller": True, "blockOwnerDeletion": True}]},
            "spec": {**tmpl["spec"], "nodeName": node, "hostname": f"{md['name']}-{i}"},
            "status": {"phase": "Running", "conditions": ready, "startTime": CREATED, "qosClass": "Guaranteed",
                       "containerStatuses": [{"name": c["name"], "image": c["image"], "imageID": "", "ready": True,
                                              "started": True, "restartCount": 0,
                                              "state": {"running": {"startedAt": CREATED}}}]},
        })  # fmt: skip
    return out


class Nvl72Seed(_M):
    """What `seed_nvl72` made: the objects, where every node sits and which nodes each job's pods run on."""

    objects: list[dict[str, Any]]
    jobs: dict[str, list[str]] = Field(description="`namespace/job` -> its nodes, completion-index order.")
    pod_groups: dict[str, str] = Field(description="`namespace/job` -> its PodGroup's `namespace/name`.")
    racks: dict[str, str] = Field(description="node -> its rack (NVLink domain).")
    domains: dict[str, str] = Field(description="node -> its NVLink domain's ClusterUUID.")


def nvl72_objects(racks: int = 64, seed: int = 0, *, cluster: str = "nvl72", split_racks: int = 0,
                  grace: int = 30) -> Nvl72Seed:  # fmt: skip
    """The fleet of `racks` NVL72 racks and its training gangs, every tray running one pod of one."""
    fleet = Nvl72Fleet(cluster=cluster, racks=racks, seed=seed, split_racks=split_racks)
    objs = fleet.to_objects()
    labels = fleet.node_labels()
    jobs: dict[str, list[str]] = {}
    groups: dict[str, str] = {}
    for plan in plan_gangs(fleet):
        job, pod_group = training_job(plan.name, len(plan.nodes), grace=grace)
        job["status"] = {"startTime": CREATED, "active": len(plan.nodes), "ready": len(plan.nodes),
                         "terminating": 0, "uncountedTerminatedPods": {}}  # fmt: skip
        objs += [job, pod_group, *running_pods(job, plan.nodes)]
        key = f"{TRAINING_NAMESPACE}/{plan.name}"
        jobs[key] = plan.nodes
        groups[key] = f"{TRAINING_NAMESPACE}/{pod_group['metadata']['name']}"
    return Nvl72Seed(objects=objs, jobs=jobs, pod_groups=groups,
                     racks={n: lab[TOPOGRAPH_ACCELERATOR_LABEL] for n, lab in labels.items()},
                     domains={n: lab[CLIQUE_LABEL].rsplit(".", 1)[0] for n, lab in labels.items()})  # fmt: skip


async def seed_nvl72(admin: Any, racks: int = 64, seed: int = 0, **options: Any) -> Nvl72Seed:
    """Seed an emulator (lab/k8s/admin.py `EmulatorAdmin`) with `nvl72_objects(racks, seed, **options)`."""
    made = nvl72_objects(racks, seed, **options)
    await admin.seed(made.objects)
    return made
