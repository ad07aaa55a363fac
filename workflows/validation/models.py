"""What the validation gate (workflows/validation/gate.py) takes and returns: pure data, passed through the sandbox
with the models of the workflows that carry it."""

from __future__ import annotations

from datetime import timedelta

from pydantic import ConfigDict, Field
from pydantic.alias_generators import to_camel

from activities.gpu.models import GpuCheckRequest
from activities.models import StrictModel


class _Settings(StrictModel):
    # camelCase in a rollout's spec, snake_case elsewhere: both are accepted.
    model_config = ConfigDict(populate_by_name=True, alias_generator=to_camel, serialize_by_alias=True)


class ValidationJob(_Settings):
    """An in-cluster validation: a Job on the node that must succeed (its exit code is the verdict)."""

    image: str = Field(min_length=1, description="Image without tag, e.g. 'registry.local/nccl-tests'.")
    version: str = Field(min_length=1, description="Its tag; the Job runs f'{image}:{version}'.")
    command: list[str] = Field(default_factory=list, description="The container's command; empty: the image's own.")
    timeout: timedelta = Field(timedelta(minutes=10), gt=timedelta(0), description="The Job's deadline.")


class ValidationSettings(_Settings):
    """What a node must pass before it returns to service. Given with no fields: the host agent's GPU check."""

    enabled: bool = Field(True, description="false: no validation (the node returns to service after its work).")
    gpu_check: bool = Field(True, description="The host agent's GPU check on the node.")
    expected_gpus: int | None = Field(None, ge=0, description="GPUs the node must show; None: not checked.")
    gpu_model: str | None = Field(None, description="Case-insensitive part of the GPU name, e.g. 'H200'.")
    min_pcie_gen: int | None = Field(None, ge=1)
    expected_mig: bool | None = Field(False, description="MIG mode the GPUs must be in; None: not checked.")
    min_pcie_width: int | None = Field(None, ge=1, description="e.g. 16: a link trained at x8 fails.")
    load_seconds: float = Field(
        0, ge=0, le=3600, description="A load window judged for Xids, ECC growth and throttling; 0: none."
    )
    dcgm_level: int | None = Field(None, ge=1, le=4, description="`dcgmi diag -r N` in the load window.")
    agent_timeout: timedelta = Field(
        timedelta(minutes=2), gt=timedelta(0), description="No host agent picking the check up in this: failed."
    )
    job: ValidationJob | None = Field(None, description="An in-cluster validation Job; None: none.")

    def gpu_request(self) -> GpuCheckRequest:
        return GpuCheckRequest(expected_count=self.expected_gpus, expected_model=self.gpu_model,
                               min_pcie_gen=self.min_pcie_gen, min_pcie_width=self.min_pcie_width,
                               expected_mig=self.expected_mig, report_unavailable=True)  # fmt: skip


class ValidationResult(StrictModel):
    passed: bool
    reason: str = Field("", description="What failed, one line; empty when it passed.")
    findings: list[str] = Field(default_factory=list, description="Every failing check, as `gpu N check: evidence`.")
