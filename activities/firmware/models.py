"""Requests and results of the firmware activities (activities/firmware/activities.py)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from activities.models import BaseUrl, StrictModel, SystemIdentity
from activities.redfish import BmcRef

TransferProtocol = Literal["HTTP", "HTTPS", "CIFS", "FTP", "SFTP", "NFS", "SCP", "TFTP"]
ApplyTime = Literal["Immediate", "OnReset"]
TaskState = Literal["New", "Starting", "Running", "Suspended", "Interrupted", "Pending", "Stopping", "Completed",
                    "Killed", "Exception", "Service", "Cancelling", "Cancelled"]  # fmt: skip


class FirmwareVersions(StrictModel):
    versions: dict[str, str] = Field(default_factory=dict, description="Firmware inventory ID -> Version.")
    system: SystemIdentity | None = Field(None, description="The ComputerSystem's identity, read with the inventory "
                                          "(None: the BMC has several systems and bmc.system names none).")  # fmt: skip


class UpdateStart(StrictModel):
    """Push one image to the inventory entries it updates (Redfish SimpleUpdate)."""

    bmc: BmcRef
    targets: list[str] = Field(min_length=1, description="Firmware inventory IDs the image updates, e.g. BIOS.")
    image_uri: BaseUrl
    version: str = Field(min_length=1, description="The version the image installs.")
    transfer_protocol: TransferProtocol | None = None
    apply_time: ApplyTime = "Immediate"
    allow_downgrade: bool = False
    push: bool = Field(False, description="Fetch the image here and push it (MultipartHttpPushUri) where the BMC "
                       "offers it.")  # fmt: skip


class UpdateStarted(StrictModel):
    outcome: Literal["started", "at-target"]
    task: str | None = Field(None, description="The BMC's Task URI, followed by follow_firmware_task.")
    pushed: bool = Field(False, description="The image went to the BMC in a multipart push, not by SimpleUpdate.")
    installed: dict[str, str] = Field(default_factory=dict, description="Versions read before starting.")


class TaskFollow(StrictModel):
    bmc: BmcRef
    task: str = Field(min_length=1)
    targets: list[str] = Field(min_length=1)
    version: str = Field(min_length=1)
    timeout_seconds: float = Field(3600.0, gt=0, description="How long the task (and a BMC restart) may take.")


class TaskOutcome(StrictModel):
    state: TaskState
    percent: int | None = None
    messages: list[str] = Field(default_factory=list)
    active: bool = Field(description="The inventory shows the new version already (no reset or power cycle needed).")
    bmc_restarted: bool = Field(False, description="The BMC stopped answering while the task ran, then came back.")


class Activation(StrictModel):
    """Activate installed images: a system reset, or an AC power cycle of the chassis; then wait for the versions."""

    bmc: BmcRef
    how: Literal["reset", "ac_power_cycle"]
    want: dict[str, str] = Field(min_length=1, description="Inventory ID -> the version that must become active.")
    timeout_seconds: float = Field(900.0, gt=0, description="How long the server may take to come back with them.")


class Activated(StrictModel):
    reset: bool = Field(description="False when a retry found the versions already active: no second reset.")
    versions: dict[str, str]
