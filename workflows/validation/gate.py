"""The validation gate: after the work on a node and before its uncordon, is the node fit for GPU work?

`validate_node` runs, from the calling workflow, the host agent's GPU check on the node's own queue (GPU count and
model, NVML state, ECC, retired/remapped rows, PCIe link, NVLink; judged by activities/gpu/verdict.py's
`gpu_verdict`), optionally a short load window on it (Xids and ECC errors under load, a DCGM diagnostic level where
DCGM is installed), and optionally an in-cluster validation Job (an image and command that must succeed on the node,
an NCCL all-reduce test for instance: the rollout's stage Job, stage `validate`). Then it shows the verdict on the
node (activities/kube: the `MillwrightValidated` condition, the `millwright.dev/validation` reason annotation
while it fails, a Warning Event). The caller keeps a node that failed cordoned, and counts it failed.

History events (W = a workflow task, 3 events): the GPU check 3 + W (a missing agent: the same, its
schedule-to-start timeout instead of its completion), the load window and the Job 3 + W each when asked, the mark
1 (a local activity's marker); the caller's `workflow.patched` marker 1.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError, TimeoutError, TimeoutType

from activities.gpu.activities import HostAgentActivities
from activities.gpu.models import StressRequest, StressResult, host_task_queue
from activities.gpu.verdict import gpu_verdict
from activities.kube.activities import KubeActivities
from activities.kube.models import JOB_WAIT_SLACK_SECONDS, NodeValidationMark, Stage, StageJobRequest
from workflows.common.call_options import AGENT_HEARTBEAT, AGENT_RETRY, API_CALL, API_RETRY
from workflows.common.errors import error_text
from workflows.validation.models import ValidationJob, ValidationResult, ValidationSettings


async def validate_node(cluster: str, node: str, settings: ValidationSettings, *, by: str, ordinal: int = 0,
                        attempt: int = 1) -> ValidationResult:  # fmt: skip
    """Run the checks `settings` asks for on `node`, show the verdict on it, and return it (never raises for a
    node that fails: that is the verdict). `attempt` numbers the validations of one run: each gets its own Job."""
    findings: list[str] = []
    if settings.gpu_check:
        findings += await _gpu_findings(node, settings)
    if settings.job is not None and not findings:  # a node that failed its GPU check gets no Job on it
        findings += await _job_findings(cluster, node, settings.job, by=by, ordinal=ordinal, attempt=attempt)
    result = ValidationResult(passed=not findings, reason="; ".join(findings)[:1000], findings=findings)
    await workflow.execute_local_activity_method(
        KubeActivities.mark_node_validation,
        NodeValidationMark(cluster=cluster, node=node, by=by, passed=result.passed, reason=result.reason),
        **API_CALL, summary=f"show {node}'s validation: {'passed' if result.passed else 'failed'}",
    )  # fmt: skip
    return result


async def _gpu_findings(node: str, settings: ValidationSettings) -> list[str]:
    check = settings.gpu_request()
    try:
        seen = await _agent(HostAgentActivities.host_gpu_check, check, node, settings, timedelta(minutes=5))
        stress: StressResult | None = None
        if settings.load_seconds:
            load = StressRequest(seconds=settings.load_seconds, dcgm_level=settings.dcgm_level)
            stress = await _agent(HostAgentActivities.host_gpu_stress, load, node, settings,
                                  timedelta(seconds=settings.load_seconds) + timedelta(minutes=5))  # fmt: skip
    except ActivityError as err:
        if isinstance(err.cause, TimeoutError) and err.cause.type == TimeoutType.SCHEDULE_TO_START:
            return [f"no host agent on {node} answered within {settings.agent_timeout}"]
        return [f"GPU check: {error_text(err)}"]
    verdict = gpu_verdict(check, seen, None, stress)
    return [f"{'' if f.gpu is None else f'gpu {f.gpu} '}{f.check}: {f.evidence}"
            for f in verdict.findings if f.severity == "fail"]  # fmt: skip


async def _agent(method, arg, node: str, settings: ValidationSettings, start_to_close: timedelta):
    return await workflow.execute_activity_method(
        method, arg, task_queue=host_task_queue(node), schedule_to_start_timeout=settings.agent_timeout,
        start_to_close_timeout=start_to_close, retry_policy=AGENT_RETRY,
        heartbeat_timeout=AGENT_HEARTBEAT, summary=f"validate {node}: {method.__name__}",
    )  # fmt: skip


async def _job_findings(cluster: str, node: str, job: ValidationJob, *, by: str, ordinal: int, attempt: int) \
        -> list[str]:  # fmt: skip
    request = StageJobRequest(cluster=cluster, node=node, rollout=by, ordinal=ordinal, package="validation",
                              version=job.version, image=job.image, stage=Stage.VALIDATE, command=job.command,
                              timeout_seconds=job.timeout.total_seconds(), try_number=attempt)  # fmt: skip
    ran = await workflow.execute_activity_method(
        KubeActivities.run_stage_job, request,
        start_to_close_timeout=job.timeout + timedelta(seconds=JOB_WAIT_SLACK_SECONDS) + timedelta(minutes=1),
        heartbeat_timeout=timedelta(seconds=10), retry_policy=API_RETRY,
        summary=f"validation Job {job.image}:{job.version} on {node}",
    )  # fmt: skip
    return [] if ran.succeeded else [f"validation Job {ran.job} failed: {ran.message or 'no message'}"]
