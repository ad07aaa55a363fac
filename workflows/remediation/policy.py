"""Which nodes need remediation, and why: pure functions over what a sweep observed.

No I/O and no clock of its own (the caller passes `now`), so workflows call them directly and the
tests check them without Temporal. Four sources, each optional:

- the node object: Ready (NotReady longer than a grace period), conditions that are a problem when
  True (Node Problem Detector's `KernelDeadlock`, `ReadonlyFilesystem`, ...), conditions that are a
  problem when False (a GPU health condition such as `GpuHealthy`), a GPU health label
  (`nvidia.com/gpu.health`);
- the host agent's GPU check: findings are problems; no agent answering is *unknown*, never unhealthy;
- the BMC's health rollup: `Critical` (by default) is a problem; no answer is unknown;
- dcgm-exporter's GPU fault series in Prometheus (one query per slice, activities/prometheus.py): an XID of
  `dcgm.xid_codes`, a double-bit ECC error, a failed or pending row remap is a problem; other XIDs (an
  application's fault: 13, 31, 43, ...) are noted, never acted on; no Prometheus configured is unknown.

A node Millwright quarantined, or that someone else cordoned (a rollout, an operator), is left alone; so is a node
labelled `millwright.dev/remediation=false` (its owner opted out of automated remediation, NVSentinel's
`ManagedByNVSentinel=false`) and one remediated less than `cooldown` ago (the `millwright.dev/last-remediation`
annotation NodeRemediation leaves): a node that fails again at once waits, rather than being power cycled in a loop.
NodeRemediation asks the same rule (`left_alone`) of the node it reads at its start (`start_refusal`), and also
refuses a sweep's decision that Millwright's own writes on the node have overtaken (`written_since`), unless an
operator asked for the run.

A cluster is remediated at all only while at least `min_healthy` of the nodes a sweep looked at are healthy (Node
Healthcheck's `minHealthy`, default 51 %, a percent rounded up; Cluster API's `unhealthyLessThanOrEqualTo: N%` is
`min_healthy: 100 - N` percent): when half the cluster looks sick, the fault is more likely the checks, the network
or the control plane than the nodes, and remediating would make it worse.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Literal

from pydantic import Field, model_validator

from activities.models import StrictModel
from activities.node_health import LastRemediation, NodeHealth
from activities.prometheus import (
    ECC_DBE_VOLATILE,
    ROW_REMAP_FAILURE,
    ROW_REMAP_PENDING,
    XID_ERRORS,
    DcgmMetric,
    GpuFault,
)
from workflows.common.durations import human_duration

# Node Problem Detector's default problem conditions (True = problem).
NPD_CONDITIONS = ["KernelDeadlock", "ReadonlyFilesystem", "FrequentKubeletRestart", "FrequentContainerdRestart"]

Action = Literal["remediate", "healthy", "skip"]
OPT_OUT_LABEL = "millwright.dev/remediation"  # on a node: "false" opts it out of automated remediation
OPT_OUT_VALUE = "false"
DEFAULT_COOLDOWN = timedelta(hours=1)

# XIDs that say the GPU or its memory, NVLink or GSP firmware failed (NVIDIA's XID catalog: 48 double-bit ECC,
# 62 internal micro-controller halt, 63/64 row remapping event/failure, 74 NVLink, 79 fallen off the bus,
# 92 high single-bit ECC rate, 94/95 contained/uncontained ECC, 119/120 GSP, 140 unrecovered ECC): a reset or
# more is due. The others (13, 31, 43, 45, ...) are most often an application's fault.
HARDWARE_XIDS = [48, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120, 140]


def validate_cooldown(value: timedelta) -> timedelta:
    """Pydantic validator helper for a `cooldown` (0: none)."""
    if value < timedelta(0):
        raise ValueError("must not be negative")
    return value


def remediation_workflow_id(cluster: str, node: str) -> str:
    """One NodeRemediation per node: the ID every starter derives, so a second start finds the first."""
    return f"remediation/{cluster}/{node}"


class DcgmChecks(StrictModel):
    """GPU faults from dcgm-exporter's series in the worker's Prometheus (MILLWRIGHT_PROMETHEUS_URL)."""

    enabled: bool = Field(True, description="Read them (a worker without MILLWRIGHT_PROMETHEUS_URL: not used, said).")
    node_label: str = Field("Hostname", pattern=r"^[a-zA-Z_][a-zA-Z0-9_]*$",
                            description="The series' label holding the Kubernetes node name.")  # fmt: skip
    cluster_label: str | None = Field(
        "cluster",
        pattern=r"^[a-zA-Z_][a-zA-Z0-9_]*$",
        description="The series' label holding the cluster's name (an external label, or one the scrape adds); "
        "None: the server holds this cluster's series only.",
    )
    xid_codes: list[int] = Field(default_factory=lambda: list(HARDWARE_XIDS),
                                 description="XIDs that need remediation; any other XID is noted only.")  # fmt: skip
    ecc: bool = Field(True, description="Double-bit volatile ECC errors (DCGM_FI_DEV_ECC_DBE_VOL_TOTAL > 0).")
    row_remap: bool = Field(True, description="A failed or pending row remap (DCGM_FI_DEV_ROW_REMAP_FAILURE / "
                            "_PENDING).")  # fmt: skip

    def metrics(self) -> list[DcgmMetric]:
        return [XID_ERRORS] + ([ECC_DBE_VOLATILE] if self.ecc else []) + \
            ([ROW_REMAP_FAILURE, ROW_REMAP_PENDING] if self.row_remap else [])  # fmt: skip


class HealthChecks(StrictModel):
    """What counts as unhealthy. Every source can be switched off."""

    ready: bool = Field(True, description="A node NotReady for longer than not_ready_grace needs remediation.")
    not_ready_grace: timedelta = Field(
        timedelta(minutes=5), description="NotReady for less than this is left alone (a reboot, a blip)."
    )
    problem_conditions: list[str] = Field(
        default_factory=lambda: list(NPD_CONDITIONS), description="Node conditions that are a problem when True."
    )
    gpu_conditions: list[str] = Field(
        default_factory=lambda: ["GpuHealthy"], description="Node conditions that are a problem when False."
    )
    gpu_health_label: str | None = Field(
        "nvidia.com/gpu.health", description="A node label holding the GPU health; absent means unknown."
    )
    gpu_health_label_healthy: list[str] = Field(
        default_factory=lambda: ["healthy", "Healthy", "true", "True", "ok", "OK"],
        description="Values of gpu_health_label that mean healthy; any other value is a problem.",
    )
    host_agent: bool = Field(True, description="Ask the node's host agent for a GPU check (no agent: unknown).")
    bmc: bool = Field(True, description="Read the BMC's health rollup through Redfish (no BMC known: unknown).")
    bmc_unhealthy: list[str] = Field(
        default_factory=lambda: ["Critical"], description="BMC Health/HealthRollup values that are a problem."
    )
    dcgm: DcgmChecks = Field(default_factory=DcgmChecks, description="GPU faults from dcgm-exporter in Prometheus.")

    def condition_types(self) -> list[str]:
        return list(dict.fromkeys(["Ready", *self.problem_conditions, *self.gpu_conditions]))

    def label_keys(self) -> list[str]:
        return list(dict.fromkeys([*([self.gpu_health_label] if self.gpu_health_label else []), OPT_OUT_LABEL]))


class MinHealthy(StrictModel):
    """Exactly one of `percent` (0-100 of the nodes a sweep looked at, rounded up: Node Healthcheck's `minHealthy`)
    or `count`; 0 switches the rule off."""

    percent: int | None = Field(None, ge=0, le=100)
    count: int | None = Field(None, ge=0)

    @model_validator(mode="after")
    def _exactly_one(self) -> MinHealthy:
        if (self.percent is None) == (self.count is None):
            raise ValueError("set exactly one of percent or count")
        return self

    def nodes(self, total: int) -> int:
        """The fewest healthy nodes, of `total`, that let remediation go ahead."""
        if self.count is not None:
            return self.count
        assert self.percent is not None
        return -(-max(total, 0) * self.percent // 100)

    def __str__(self) -> str:
        return f"{self.percent}%" if self.percent is not None else f"{self.count} nodes"


def too_few_healthy(healthy: int, total: int, min_healthy: MinHealthy) -> str | None:
    """None while remediation may go ahead (at least `min_healthy` of `total` healthy); else why it may not."""
    need = min_healthy.nodes(total)
    if healthy >= need:
        return None
    return (f"only {healthy} of {total} nodes healthy, fewer than min_healthy {min_healthy} ({need}): "
            f"no remediation in this cluster")  # fmt: skip


class AgentObservation(StrictModel):
    """The host agent's GPU check as the decision sees it."""

    status: Literal["ok", "findings", "unavailable", "error"]
    findings: list[str] = Field(default_factory=list)
    detail: str = ""


class BmcObservation(StrictModel):
    status: Literal["ok", "unavailable", "unknown"] = "ok"
    power_state: str | None = None
    health: str | None = None
    health_rollup: str | None = None
    detail: str = ""


class DecidedFrom(StrictModel):
    """Millwright's own marks on a node as a sweep read them when it decided to remediate the node: the remediation it
    starts compares them with the node it reads (`written_since`). Compared as values, not times: the cordon carries
    no time, and the node's resourceVersion has no order Kubernetes promises."""

    at: datetime = Field(description="When the sweep decided, just after reading the node (its workflow clock).")
    cordoned_by: str | None = Field(None, description="Who held the node's cordon then (millwright.dev/cordoned-by).")
    last_remediation: LastRemediation | None = Field(None, description="The node's last-remediation mark then.")


class NodeDecision(StrictModel):
    node: str
    action: Action
    reasons: list[str] = Field(default_factory=list, description="The problems found (also for skipped nodes).")
    note: str = Field("", description="Why the node is skipped, or what is unknown about it.")
    decided_from: DecidedFrom | None = Field(None, description="To remediate: Millwright's marks on the node as the "
                                             "decision saw them, for the remediation to re-check.")  # fmt: skip

    def __str__(self) -> str:
        text = f"{self.node}: {self.action}"
        if self.reasons:
            text += f" ({'; '.join(self.reasons)})"
        return text + (f" — {self.note}" if self.note else "")


def node_problems(node: NodeHealth, checks: HealthChecks, now: datetime) -> tuple[list[str], list[str]]:
    """(problems, notes) from the node object alone; notes say what is pending or unknown."""
    problems: list[str] = []
    notes: list[str] = []
    if checks.ready and not node.ready:
        since = node.ready_since
        down = (now - since) if since is not None else None
        if down is None or down >= checks.not_ready_grace:
            problems.append("NotReady" + (f" for {human_duration(down)}" if down is not None else ""))
        else:
            notes.append(
                f"NotReady for {human_duration(down)}, within the {human_duration(checks.not_ready_grace)} grace"
            )
    for ctype in checks.problem_conditions:
        c = node.conditions.get(ctype)
        if c is not None and c.status == "True":
            problems.append(f"{ctype}" + (f" ({c.reason})" if c.reason else ""))
    for ctype in checks.gpu_conditions:
        c = node.conditions.get(ctype)
        if c is not None and c.status == "False":
            problems.append(f"{ctype}=False" + (f" ({c.reason})" if c.reason else ""))
    if checks.gpu_health_label:
        value = node.labels.get(checks.gpu_health_label)
        if value is not None and value not in checks.gpu_health_label_healthy:
            problems.append(f"{checks.gpu_health_label}={value}")
    return problems, notes


def agent_problems(agent: AgentObservation | None) -> tuple[list[str], list[str]]:
    if agent is None:
        return [], []
    if agent.status == "findings":
        return [f"GPU check: {f}" for f in agent.findings] or ["GPU check failed"], []
    if agent.status in ("unavailable", "error"):
        return [], [f"host agent {agent.status}" + (f": {agent.detail}" if agent.detail else "")]
    return [], []


def bmc_problems(bmc: BmcObservation | None, checks: HealthChecks) -> tuple[list[str], list[str]]:
    if bmc is None:
        return [], []
    if bmc.status != "ok":
        return [], [f"BMC {bmc.status}" + (f": {bmc.detail}" if bmc.detail else "")]
    if bmc.health_rollup in checks.bmc_unhealthy:
        return [f"BMC health rollup {bmc.health_rollup}"], []
    if bmc.health in checks.bmc_unhealthy:
        return [f"BMC health {bmc.health}"], []
    return [], []


def dcgm_problems(faults: list[GpuFault] | None, checks: HealthChecks) -> tuple[list[str], list[str]]:
    """(problems, notes) from a node's GPU fault series (None: not read)."""
    if faults is None:
        return [], []
    problems: list[str] = []
    notes: list[str] = []
    for f in faults:
        where = f"GPU{f.gpu}" if f.gpu is not None else "a GPU"
        where += f" ({f.uuid})" if f.uuid else ""
        if f.metric == XID_ERRORS:
            xid = int(f.value)
            (problems if xid in checks.dcgm.xid_codes else notes).append(f"DCGM: XID {xid} on {where}")
        elif f.metric == ECC_DBE_VOLATILE and checks.dcgm.ecc:
            problems.append(f"DCGM: {f.value:g} double-bit ECC errors on {where}")
        elif f.metric == ROW_REMAP_FAILURE and checks.dcgm.row_remap:
            problems.append(f"DCGM: row remap failed on {where}")
        elif f.metric == ROW_REMAP_PENDING and checks.dcgm.row_remap:
            problems.append(f"DCGM: row remap pending on {where}")
    if notes:
        notes = [f"not acted on: {'; '.join(notes)}"]
    return problems, notes


def decide(
    cluster: str,
    node: NodeHealth,
    checks: HealthChecks,
    now: datetime,
    agent: AgentObservation | None = None,
    bmc: BmcObservation | None = None,
    cooldown: timedelta = timedelta(0),
    dcgm: list[GpuFault] | None = None,
    reported: list[str] | None = None,
) -> NodeDecision:
    """Whether `node` needs remediation, with the reasons; or why it is left alone (quarantined, opted out,
    remediated less than `cooldown` ago, cordoned by someone else). A node without problems is healthy, whatever
    its label or its last remediation. `reported`: problems an event reported (an alert), taken as found."""
    problems, notes = node_problems(node, checks, now)
    problems = [*(reported or []), *problems]
    for more, more_notes in (dcgm_problems(dcgm, checks), agent_problems(agent), bmc_problems(bmc, checks)):
        problems += more
        notes += more_notes
    note = "; ".join(notes)
    if not problems and not node.quarantined:
        return NodeDecision(node=node.name, action="healthy", note=note)
    left = left_alone(node, now, cooldown)
    if left is not None:
        return NodeDecision(node=node.name, action="skip", reasons=problems, note=left)
    ours = remediation_workflow_id(cluster, node.name)
    if node.unschedulable and node.cordoned_by != ours:
        holder = node.cordoned_by or "someone (unmarked cordon)"
        return NodeDecision(node=node.name, action="skip", reasons=problems, note=f"cordoned by {holder}; left to them")
    seen = DecidedFrom(at=now, cordoned_by=node.cordoned_by, last_remediation=node.last_remediation)
    return NodeDecision(node=node.name, action="remediate", reasons=problems, note=note, decided_from=seen)


def left_alone(node: NodeHealth, now: datetime, cooldown: timedelta) -> str | None:
    """Why automated remediation leaves `node` alone: quarantined, opted out, or remediated less than `cooldown` ago;
    None when it may go ahead. The sweep's decision and NodeRemediation's start both ask it."""
    if node.quarantined:
        return f"quarantined ({node.quarantined}): waiting for an operator"
    if node.labels.get(OPT_OUT_LABEL) == OPT_OUT_VALUE:
        return f"opted out of automated remediation ({OPT_OUT_LABEL}={OPT_OUT_VALUE})"
    last = node.last_remediation
    if last is not None and now - last.at < cooldown:
        ago, until = human_duration(now - last.at), (last.at + cooldown).isoformat()
        return (f"cooling down: remediated {ago} ago ({last.outcome}), not again before {until} "
                f"(cooldown {human_duration(cooldown)})")  # fmt: skip
    return None


def written_since(node: NodeHealth, seen: DecidedFrom) -> str | None:
    """What Millwright wrote on `node` after a sweep decided from `seen` (a last-remediation mark, a remediation's
    cordon); None when nothing. A quarantine comes with both, and `left_alone` refuses it anyway."""
    last = node.last_remediation
    if last is not None and last != seen.last_remediation:
        return f"marked remediated ({last.outcome}) at {last.at.isoformat()} by {last.by or 'unknown'}"
    if node.cordoned_by != seen.cordoned_by and (node.cordoned_by or "").startswith("remediation/"):
        return f"cordoned by {node.cordoned_by}"
    return None


def start_refusal(node: NodeHealth, now: datetime, cooldown: timedelta, decided_from: DecidedFrom | None,
                  requested_by: str | None) -> str | None:  # fmt: skip
    """Why a NodeRemediation must not touch `node`, as read at its start; None when it goes ahead. An operator's
    explicit request (`requested_by`) overrides everything: remediating a quarantined node is how one is released."""
    if requested_by is not None:
        return None
    left = left_alone(node, now, cooldown)
    if left is not None:
        return left
    if decided_from is not None and (written := written_since(node, decided_from)) is not None:
        return f"decided by a sweep at {decided_from.at.isoformat()} from older facts: since, the node was {written}"
    return None
