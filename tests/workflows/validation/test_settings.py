"""The validation settings at the edge: defaults, both spellings, and refusals naming the field's full path."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from tests.workflows.rollout.helpers import rollout_spec
from workflows.rollout.spec.spec import RolloutInput, describe_errors
from workflows.validation.models import ValidationSettings


def test_given_empty_it_runs_the_gpu_check_only():
    settings = ValidationSettings()
    assert settings.enabled and settings.gpu_check and settings.job is None and settings.load_seconds == 0
    assert settings.gpu_request().report_unavailable  # no NVML on the node is a finding, not a retry


def test_a_rollout_spec_takes_camel_case_and_refuses_unknown_fields_by_path():
    spec = rollout_spec("v", validation={"expectedGpus": 8, "job": {"image": "nccl", "version": "1", "timeout": 60}})
    assert spec.validation.expected_gpus == 8 and spec.validation.job.timeout.total_seconds() == 60
    data = spec.model_dump(mode="json", by_alias=True, exclude={"checkpoint"})
    data["validation"] = {"expectedGPUs": 8}
    with pytest.raises(ValidationError) as err:
        RolloutInput.model_validate(data)
    assert any(line.startswith("validation.expectedGPUs:") for line in describe_errors(err.value))
    data["validation"] = {"job": {"image": "nccl"}}
    with pytest.raises(ValidationError) as err:
        RolloutInput.model_validate(data)
    assert any(line.startswith("validation.job.version:") for line in describe_errors(err.value))
