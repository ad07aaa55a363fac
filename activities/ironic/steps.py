"""Manual clean steps, and IPA's burn-in steps with their settings.

IPA's burn-in steps (``deploy.burnin_cpu`` ... ``burnin_network``) take no step arguments: they read
their settings from the node's ``driver_info`` (``agent_burnin_*``). `BurnInStep` knows the steps and
their keys and validates both at the edge; `BurnInStep.driver_info()` and `.clean_step()` give what
``ironic_set_driver_info`` and ``ironic_start_clean`` take (activities/ironic/activities.py). Pydantic models only:
workflows/burnin/server_burnin.py imports them.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar, Literal

from pydantic import ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from activities.models import Host, StrictModel

# Interfaces that may carry clean steps (Ironic's ironic/conductor/steps.py CLEANING_INTERFACE_PRIORITY).
CleanInterface = Literal["deploy", "bios", "management", "power", "raid", "vendor", "firmware"]
_STEP_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

BurnInStepName = Literal["burnin_cpu", "burnin_memory", "burnin_disk", "burnin_gpu", "burnin_network"]


class _Settings(StrictModel):
    model_config = ConfigDict(populate_by_name=True)
    prefix: ClassVar[str] = ""

    @classmethod
    def setting_keys(cls) -> dict[str, str]:
        """Setting name -> the driver_info key IPA reads."""
        return {name: f"{cls.prefix}{field.alias or name}" for name, field in cls.model_fields.items()}

    def driver_info(self) -> dict[str, Any]:
        """The ``agent_burnin_*`` driver_info keys for the settings given (unset ones keep IPA's defaults)."""
        return {
            key: getattr(self, name) for name, key in self.setting_keys().items() if getattr(self, name) is not None
        }


class CpuBurnIn(_Settings):
    """``stress-ng --cpu N --timeout T`` (IPA ``burnin_cpu``)."""

    prefix: ClassVar[str] = "agent_burnin_cpu_"
    cpu: int | None = Field(None, ge=0, description="Workers; 0 = one per CPU (IPA's default).")
    timeout: int | None = Field(None, gt=0, description="Seconds (IPA's default 86400).")
    outputfile: str | None = Field(None, min_length=1)


class MemoryBurnIn(_Settings):
    """``stress-ng --vm N --vm-bytes B --timeout T`` (IPA ``burnin_memory``)."""

    prefix: ClassVar[str] = "agent_burnin_vm_"
    vm: int | None = Field(None, ge=0, description="Workers; 0 = one per CPU.")
    vm_bytes: str | None = Field(
        None,
        alias="vm-bytes",
        pattern=r"^(\d+%|\d+[bBkKmMgGtT]?)$",
        description="Per worker: '98%' (IPA's default) or a size like '4G'.",
    )
    timeout: int | None = Field(None, gt=0)
    outputfile: str | None = Field(None, min_length=1)


class DiskBurnIn(_Settings):
    """``fio`` read/write with crc32c verify on every block device (IPA ``burnin_disk``)."""

    prefix: ClassVar[str] = "agent_burnin_fio_disk_"
    loops: int | None = Field(None, ge=1, description="IPA's default 4.")
    runtime: int | None = Field(None, ge=0, description="Seconds; 0 = run the loops.")
    outputfile: str | None = Field(None, min_length=1)
    smart_test: bool | None = Field(None, description="Run `smartctl -t long` after fio and fail on errors.")


class NetworkPartner(StrictModel):
    role: Literal["writer", "reader"]
    partner: Host = Field(description="The other node's address (host name or IP).")


class NetworkBurnIn(_Settings):
    """``fio`` net engine between two nodes, static pair (``config``) or paired through tooz (IPA ``burnin_network``)."""

    prefix: ClassVar[str] = "agent_burnin_fio_network_"
    runtime: int | None = Field(None, gt=0, description="Seconds per direction (IPA's default 21600).")
    config: NetworkPartner | None = None
    pairing_backend_url: str | None = Field(None, min_length=1)
    pairing_group_name: str | None = Field(None, min_length=1)
    pairing_timeout: int | None = Field(None, gt=0)
    outputfile: str | None = Field(None, min_length=1)

    @model_validator(mode="after")
    def _pairing(self) -> NetworkBurnIn:
        if self.config is None and not self.pairing_backend_url:
            raise ValueError("give config {role, partner} or pairing_backend_url (IPA fails the step without either)")
        return self

    def driver_info(self) -> dict[str, Any]:
        out = super().driver_info()
        if self.config is not None:
            out[f"{self.prefix}config"] = self.config.model_dump()
        return out


class GpuBurnIn(_Settings):
    """``gpu_burn -l`` (count check when ``count`` > 0), then ``gpu_burn -m MEM T`` (IPA ``burnin_gpu``)."""

    prefix: ClassVar[str] = "agent_burnin_gpu_"
    install_dir: str | None = Field(None, min_length=1, description="IPA's default /opt/gpu-burn.")
    count: int | None = Field(None, ge=0, description="Expected GPUs; 0 = no count check.")
    memory: str | int | None = Field(None, description="'95%' (IPA's default) or MB as a whole number.")
    timeout: int | None = Field(None, gt=0)

    @field_validator("memory")
    @classmethod
    def _memory(cls, value: str | int | None) -> str | int | None:
        if isinstance(value, str) and not re.fullmatch(r"([1-9]\d?|100)%", value):
            raise ValueError("a percentage of GPU memory like '95%' (1-100%), or MB as a whole number")
        if isinstance(value, int) and value <= 0:
            raise ValueError("MB must be positive")
        return value


BURNIN_SETTINGS: dict[str, type[_Settings]] = {
    "burnin_cpu": CpuBurnIn,
    "burnin_memory": MemoryBurnIn,
    "burnin_disk": DiskBurnIn,
    "burnin_gpu": GpuBurnIn,
    "burnin_network": NetworkBurnIn,
}


def burnin_driver_info_keys(step: str) -> list[str]:
    """Every ``driver_info`` key IPA reads for this burn-in step."""
    return list(BURNIN_SETTINGS[step].setting_keys().values())


class CleanStep(StrictModel):
    """One manual clean step as Ironic takes it. IPA's burn-in steps are ``deploy`` steps without args."""

    interface: CleanInterface
    step: str = Field(min_length=1, max_length=255)
    args: dict[str, Any] = Field(default_factory=dict)

    @field_validator("step")
    @classmethod
    def _step(cls, value: str) -> str:
        if not _STEP_NAME.match(value):
            raise ValueError(f"{value!r} is not a step name (a Python identifier such as 'erase_devices_metadata')")
        return value

    @model_validator(mode="after")
    def _burnin(self) -> CleanStep:
        if self.step.startswith("burnin_"):
            if self.step not in BURNIN_SETTINGS:
                raise ValueError(
                    f"step: {self.step!r} is not an IPA burn-in step (one of {', '.join(BURNIN_SETTINGS)})"
                )
            if self.interface != "deploy":
                raise ValueError(f"interface: IPA's {self.step} is a 'deploy' step, not {self.interface!r}")
            if self.args:
                raise ValueError(
                    f"args: IPA's {self.step} takes no arguments (Ironic would fail the clean with 'unexpected "
                    f"arguments'); its settings live in driver_info ({', '.join(burnin_driver_info_keys(self.step))})"
                )
        return self

    def to_ironic(self) -> dict[str, Any]:
        out: dict[str, Any] = {"interface": self.interface, "step": self.step}
        if self.args:
            out["args"] = self.args
        return out


class BurnInStep(StrictModel):
    """One IPA burn-in step with its settings (short names: ``timeout``, not ``agent_burnin_cpu_timeout``).

    ``BurnInStep(step="burnin_gpu", settings={"count": 8, "timeout": 3600})``: ``.driver_info()`` gives
    ``{"agent_burnin_gpu_count": 8, "agent_burnin_gpu_timeout": 3600}``, ``.clean_step()`` the step.
    """

    step: BurnInStepName
    settings: dict[str, Any] = Field(default_factory=dict, validate_default=True)

    @field_validator("settings")
    @classmethod
    def _settings(cls, value: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        step = info.data.get("step")
        if step is None:  # the step itself was refused; that error says so
            return value
        try:
            parsed = BURNIN_SETTINGS[step].model_validate(value)
        except ValidationError as err:
            problems = "; ".join(
                f"settings.{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" if e["loc"] else f"settings: {e['msg']}"
                for e in err.errors()
            )  # fmt: skip
            known = ", ".join(f.alias or n for n, f in BURNIN_SETTINGS[step].model_fields.items())
            raise ValueError(f"{step}: {problems} (its settings: {known})") from None
        return parsed.model_dump(by_alias=True, exclude_none=True)

    def driver_info(self) -> dict[str, Any]:
        return BURNIN_SETTINGS[self.step].model_validate(self.settings).driver_info()

    def clean_step(self) -> CleanStep:
        return CleanStep(interface="deploy", step=self.step)


class BurnInPlan(StrictModel):
    """Burn-in steps in the order they run; each step at most once."""

    steps: list[BurnInStep] = Field(min_length=1)

    @field_validator("steps")
    @classmethod
    def _unique(cls, steps: list[BurnInStep]) -> list[BurnInStep]:
        seen = [s.step for s in steps]
        twice = sorted({s for s in seen if seen.count(s) > 1})
        if twice:
            raise ValueError(f"each burn-in step at most once; repeated: {', '.join(twice)}")
        return steps

    def driver_info(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for step in self.steps:
            out.update(step.driver_info())
        return out

    def clean_steps(self) -> list[CleanStep]:
        return [s.clean_step() for s in self.steps]
