"""Where a node sits (NVLink domain, rack, network block) and which gang each pod belongs to, as a cluster's labels
and annotations say (../shared/reference facts, summarised in docs/topology-and-gangs.md).

Pure (stdlib and pydantic): the budget's book and the fleet engine's batching call these inside the workflow
sandbox; `read_gangs` (activities/kube/gang_reads.py) fills a `GangMap` from the cluster.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Literal

from pydantic import Field

from activities.models import StrictModel

# GPU Feature Discovery's label: `<ClusterUUID>.<CliqueID>`; the ClusterUUID is the physical NVLink domain. Written
# only once the fabric manager's state is complete, so a node without it is an NVLink domain of its own.
CLIQUE_LABEL = "nvidia.com/gpu.clique"
# Topograph's current labels: the accelerator (NVLink) domain, which is one NVL72 rack, and the switch one tier above
# the leaf, which bounds a network block.
TOPOGRAPH_ACCELERATOR_LABEL = "accelerator.topograph.run/domain"
TOPOGRAPH_BLOCK_LABEL = "fabric.topograph.run/tier-1"
OWN_DOMAIN_PREFIX = "node:"  # the domain of a node without a clique label: itself

BatchBy = Literal["nvlinkDomain", "rack", "none"]
GangKind = Literal["kai", "kueue", "volcano", "jobset", "lws", "pod"]

# How a pod names its gang (docs/topology-and-gangs.md, "Gangs").
KAI_POD_GROUP_ANNOTATION = "pod-group-name"
KUEUE_WORKLOAD_ANNOTATION = "kueue.x-k8s.io/workload"
VOLCANO_GROUP_ANNOTATIONS = ("scheduling.k8s.io/group-name", "scheduling.volcano.sh/group-name")
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
LWS_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
LWS_GROUP_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/group-index"

DEFAULT_CHECKPOINT_INTERVAL = timedelta(hours=1)  # what an interrupted gang loses at most: hourly checkpoints


class TopologyLabels(StrictModel):
    """Which node labels say where a node sits. The defaults are GPU Feature Discovery's and Topograph's; the
    clouds' keys are documented alternatives (docs/topology-and-gangs.md)."""

    clique: str = Field(CLIQUE_LABEL, min_length=1, description="`<ClusterUUID>.<CliqueID>`: the NVLink domain.")
    rack: str = Field(TOPOGRAPH_ACCELERATOR_LABEL, min_length=1, description="The rack (OCI: host.rack_id).")
    block: str = Field(TOPOGRAPH_BLOCK_LABEL, min_length=1, description="The network block (GKE: gce-topology-block).")

    def keys(self) -> list[str]:
        return [self.clique, self.rack, self.block]


class NodePlace(StrictModel):
    node: str
    domain: str = Field(description="The NVLink domain's ClusterUUID; `node:<name>` for a node without a clique label.")
    clique: str | None = Field(None, description="The clique label's value, when the node has one.")
    rack: str | None = None
    block: str | None = None

    @property
    def own_domain(self) -> bool:
        return self.domain.startswith(OWN_DOMAIN_PREFIX)

    def describe(self) -> str:
        domain = (f"no {CLIQUE_LABEL} label: its own NVLink domain" if self.own_domain
                  else f"NVLink domain {self.domain} (clique {self.clique})")  # fmt: skip
        return f"{domain}; rack {self.rack or '-'}; block {self.block or '-'}"


def place_of(node: str, labels: Mapping[str, str], keys: TopologyLabels | None = None) -> NodePlace:
    keys = keys or TopologyLabels()
    clique = labels.get(keys.clique) or None
    uuid = clique.rsplit(".", 1)[0] if clique else ""
    return NodePlace(node=node, domain=uuid or f"{OWN_DOMAIN_PREFIX}{node}", clique=clique,
                     rack=labels.get(keys.rack) or None, block=labels.get(keys.block) or None)  # fmt: skip


def unit_of(place: NodePlace, batch_by: BatchBy) -> str:
    """The unit a batch takes whole: the NVLink domain, the rack (a node without one: itself), or the node."""
    if batch_by == "nvlinkDomain":
        return place.domain
    if batch_by == "rack":
        return place.rack or f"{OWN_DOMAIN_PREFIX}{place.node}"
    return place.node


RACK_PREFIX = "rack:"  # the NVLink domain of a rack none of whose nodes shows a clique label any more


def domains_by_rack(places: Iterable[NodePlace]) -> dict[str, str]:
    """rack -> the NVLink domain its nodes with a clique label show. A fabric fault takes the clique label off a
    node (GPU Feature Discovery writes it only while the fabric manager's state is complete), yet the node is still
    in that domain: its rack, which Topograph labels from the topology, not from the fabric, says which."""
    out: dict[str, str] = {}
    for place in places:
        if place.rack and not place.own_domain:
            out.setdefault(place.rack, place.domain)
    return out


def fault_domain(place: NodePlace, by_rack: Mapping[str, str]) -> str:
    """The NVLink domain a node belongs to even while a fault hides its clique label: its own label's, else its
    rack's (`domains_by_rack`), else `rack:<rack>` when no node of the rack shows one, else the node alone."""
    if not place.own_domain or not place.rack:
        return place.domain
    return by_rack.get(place.rack) or f"{RACK_PREFIX}{place.rack}"


def rack_key(place: NodePlace) -> str | None:
    """The name rack operations know a domain by, stable while a fault hides clique labels: the node's rack (on
    NVL72 Topograph's accelerator domain, one rack), else its NVLink domain; None for a node with neither."""
    return place.rack or (None if place.own_domain else place.domain)


# ---------------------------------------------------------------- gangs


class GangRef(StrictModel):
    kind: GangKind
    namespace: str
    name: str

    @property
    def id(self) -> str:
        return f"{self.kind}:{self.namespace}/{self.name}"


def gang_of(namespace: str, pod: str, labels: Mapping[str, str], annotations: Mapping[str, str]) -> GangRef:
    """The gang a pod belongs to, by the first link it carries: KAI's `pod-group-name`, Kueue's workload, Volcano's
    group, a JobSet, a LeaderWorkerSet group; none: the pod is a unit of its own."""
    if name := annotations.get(KAI_POD_GROUP_ANNOTATION):
        return GangRef(kind="kai", namespace=namespace, name=name)
    if name := annotations.get(KUEUE_WORKLOAD_ANNOTATION):
        return GangRef(kind="kueue", namespace=namespace, name=name)
    for key in VOLCANO_GROUP_ANNOTATIONS:
        if name := annotations.get(key):
            return GangRef(kind="volcano", namespace=namespace, name=name)
    if name := labels.get(JOBSET_NAME_LABEL):
        return GangRef(kind="jobset", namespace=namespace, name=name)
    if name := labels.get(LWS_NAME_LABEL):
        return GangRef(kind="lws", namespace=namespace, name=f"{name}-group-{labels.get(LWS_GROUP_INDEX_LABEL, '0')}")
    return GangRef(kind="pod", namespace=namespace, name=pod)


class Gang(StrictModel):
    """A unit of GPU work that dies whole: its pods, where they run, and whether it is already down."""

    id: str
    nodes: list[str] = Field(default_factory=list, description="Nodes its pods are bound to, name order.")
    pods: int = 0
    running: int = Field(0, description="Pods running and not being deleted.")
    min_member: int = Field(1, description="Running pods below this and the gang restarts (KAI's minMember).")
    gpus: int = Field(0, description="GPUs its pods request.")
    started: datetime | None = Field(None, description="When its latest (re)start began: its pods' earliest start.")

    @property
    def disrupted(self) -> bool:
        """Below its minimum: it restarts (or is restarting) whatever else is taken of it."""
        return self.running < self.min_member


class GangRequest(StrictModel):
    cluster: str


class GangMap(StrictModel):
    """The cluster's gangs of GPU work (pods requesting no GPU, DaemonSet and finished pods are left out)."""

    gangs: list[Gang] = Field(default_factory=list)
    read_at: datetime | None = None

    def by_node(self) -> dict[str, list[Gang]]:
        out: dict[str, list[Gang]] = {}
        for gang in self.gangs:
            for node in gang.nodes:
                out.setdefault(node, []).append(gang)
        return out


def gpu_hours_at_risk(
    gangs: Iterable[Gang], at: datetime, checkpoint: timedelta = DEFAULT_CHECKPOINT_INTERVAL
) -> float:
    """What interrupting `gangs` at `at` costs: each one's GPUs × the time since it (re)started, capped by the
    checkpoint interval (work since the last checkpoint is what a restart loses)."""
    total = 0.0
    for gang in gangs:
        ran = at - gang.started if gang.started is not None else checkpoint
        total += gang.gpus * min(max(ran, timedelta(0)), checkpoint).total_seconds() / 3600
    return round(total, 3)
