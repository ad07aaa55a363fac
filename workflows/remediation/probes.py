"""How the sweep's slice looks at its nodes: dcgm-exporter's GPU fault series (one Prometheus query a slice), each
node's host agent and BMC probed where the node object and its faults alone do not settle it, and the decision
(workflows/remediation/policy.decide) for each node."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, TimeoutError, TimeoutType

from activities.gpu.activities import HostAgentActivities
from activities.gpu.models import GpuCheckRequest, GpuCheckResult, host_task_queue
from activities.node_health import NodeHealth
from activities.prometheus import DcgmFaults, DcgmFaultsQuery, GpuFault, PrometheusActivities
from activities.redfish import BmcRef, RedfishActivities, RedfishHealth
from workflows.common import priorities
from workflows.common.call_options import BMC_RETRY
from workflows.common.errors import error_text
from workflows.remediation.models import DeviceFacts, finding_text, server_facts
from workflows.remediation.policy import AgentObservation, BmcObservation, NodeDecision, decide
from workflows.remediation.sweep_models import ClusterSweep, FleetHealthSweepInput, SweepSlice

# Prometheus not answering within DCGM_CALL's bound leaves the signal unknown for that slice (said), never the sweep
# stuck.
DCGM_CALL: dict[str, Any] = dict(start_to_close_timeout=timedelta(minutes=1), schedule_to_close_timeout=timedelta(minutes=3),
                 retry_policy=RetryPolicy(initial_interval=timedelta(seconds=2), maximum_interval=timedelta(seconds=30),
                                          non_retryable_error_types=["PrometheusRejected", "PrometheusBadResponse"]))  # fmt: skip


class NodeProbes:
    """The probes of one sweep run (`inp`: its input, for the checks, concurrency and bounds)."""

    def __init__(self, inp: FleetHealthSweepInput) -> None:
        self._inp = inp

    async def dcgm_faults(self, part: SweepSlice, sweep: ClusterSweep) -> dict[str, list[GpuFault]] | None:
        """The slice's GPU fault series by node, in one query; None (and `sweep.dcgm` says why) when not known."""
        checks = self._inp.checks.dcgm
        query = DcgmFaultsQuery(cluster=part.cluster, nodes=part.nodes, node_label=checks.node_label,
                                cluster_label=checks.cluster_label, metrics=checks.metrics())  # fmt: skip
        try:
            seen: DcgmFaults = await workflow.execute_activity_method(
                PrometheusActivities.dcgm_faults, query, **DCGM_CALL, priority=priorities.remediation(part.cluster),
                summary=f"GPU faults of {len(part.nodes)} nodes from Prometheus")  # fmt: skip
        except ActivityError as err:
            sweep.dcgm = f"not read: {error_text(err)}"[:500]
            return None
        if not seen.configured:
            sweep.dcgm = "not used: the worker has no MILLWRIGHT_PROMETHEUS_URL"
            return None
        sweep.gpu_faults = len(seen.faults) + seen.truncated
        sweep.dcgm = f"read from {seen.url}" + (f"; {seen.truncated} fault series past the first {len(seen.faults)} "
                                                f"not used" if seen.truncated else "")  # fmt: skip
        by_node: dict[str, list[GpuFault]] = {n: [] for n in part.nodes}
        for fault in seen.faults:
            by_node[fault.node].append(fault)
        return by_node

    async def look_all(
        self,
        cluster: str,
        nodes: list[NodeHealth],
        facts: dict[str, DeviceFacts],
        sweep: ClusterSweep,
        *,
        together: bool,
        dcgm: dict[str, list[GpuFault]] | None = None,
    ) -> list[tuple[str, NodeDecision, DeviceFacts]]:
        """Decide every node, probing its host agent and BMC (`together`: both at once) where the node object
        and its GPU fault series (`dcgm`, None: not read) alone do not settle it; counts into `sweep`; the nodes
        to remediate."""
        inp = self._inp
        slots = asyncio.Semaphore(max(1, inp.concurrency // inp.slices_at_once) if together else inp.concurrency)
        now = workflow.now()  # for results recorded before NodeHealth.read_at; the read's time decides since

        async def look(node: NodeHealth) -> tuple[str, NodeDecision, DeviceFacts]:
            node_facts = server_facts(node.name, inp.bmcs, facts.get(node.name))
            faults = dcgm.get(node.name, []) if dcgm is not None else None
            first = decide(cluster, node, inp.checks, node.decided_at(now), cooldown=inp.cooldown, dcgm=faults)
            if first.action == "skip":  # quarantined or someone else's: no probe changes that
                return cluster, first, node_facts
            async with slots:
                agent_probe = self._probe_agent(node.name, node_facts) if inp.checks.host_agent else _nothing()
                bmc_probe = self._probe_bmc(node_facts.bmc) if inp.checks.bmc else _nothing()
                if together:
                    agent, bmc = await asyncio.gather(agent_probe, bmc_probe)
                else:
                    agent, bmc = await agent_probe, await bmc_probe
            if agent is not None and agent.status in ("unavailable", "error"):
                sweep.agents_unavailable += 1
            if inp.checks.bmc and (bmc is None or bmc.status != "ok"):
                sweep.bmc_unknown += 1
            return (
                cluster,
                decide(
                    cluster,
                    node,
                    inp.checks,
                    node.decided_at(now),
                    agent=agent,
                    bmc=bmc,
                    cooldown=inp.cooldown,
                    dcgm=faults,
                ),
                node_facts,
            )

        looked = await asyncio.gather(*(look(n) for n in nodes))
        for _, decision, _ in looked:
            if decision.action == "healthy":
                sweep.healthy += 1
            else:
                sweep.not_healthy += 1
                sweep.unhealthy.append(decision)
        return [x for x in looked if x[1].action == "remediate"]

    async def _probe_agent(self, node: str, facts: DeviceFacts) -> AgentObservation:
        inp = self._inp
        check = GpuCheckRequest(expected_count=facts.gpus if facts.gpus is not None else inp.remediation.expected_gpus,
                                expected_model=facts.gpu_model or inp.remediation.gpu_model,
                                report_unavailable=True)  # fmt: skip
        try:
            result: GpuCheckResult = await workflow.execute_activity_method(
                HostAgentActivities.host_gpu_check, check, task_queue=host_task_queue(node),
                schedule_to_start_timeout=inp.agent_timeout, start_to_close_timeout=timedelta(minutes=2),
                retry_policy=RetryPolicy(maximum_attempts=2), priority=priorities.remediation(inp.clusters[0]),
                summary=f"GPU check on {node}")  # fmt: skip
        except ActivityError as err:
            if isinstance(err.cause, TimeoutError) and err.cause.type == TimeoutType.SCHEDULE_TO_START:
                return AgentObservation(status="unavailable", detail=f"no host agent within {inp.agent_timeout}")
            return AgentObservation(status="error", detail=error_text(err)[:300])
        failed = [finding_text(f) for f in result.findings if f.severity == "fail"]
        return AgentObservation(status="findings" if failed else "ok", findings=failed)

    async def _probe_bmc(self, bmc: BmcRef | None) -> BmcObservation | None:
        if bmc is None:
            return None
        try:
            seen: RedfishHealth = await workflow.execute_activity_method(
                RedfishActivities.redfish_health, bmc, start_to_close_timeout=timedelta(seconds=30),
                schedule_to_close_timeout=timedelta(minutes=2), retry_policy=BMC_RETRY,
                priority=priorities.remediation(self._inp.clusters[0]), summary=f"BMC health {bmc.url}")  # fmt: skip
        except ActivityError as err:
            return BmcObservation(status="unavailable", detail=error_text(err)[:300])
        return BmcObservation(**seen.model_dump())


async def _nothing() -> None:
    return None
