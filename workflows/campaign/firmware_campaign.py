"""FirmwareCampaign: one firmware bundle across clusters (`firmware-campaign/<name>`), a `FleetFirmwareUpdate` per
cluster over that cluster's servers, the canary cluster first and then waves, on the campaign engine FleetRollout runs
on (workflows/campaign/campaign.py).

Each child is the FleetFirmwareUpdate the CLI would start for that cluster's servers
(`fleet-firmware-update/<name>.<cluster>`, the ID FleetFirmwareInput.workflow_id gives), with its own waves inside the
cluster, its BMC concurrency limit and its failure threshold; each server's FirmwareUpdate leases its node from that
cluster's disruption budget.
A child stopped at its failure threshold waits for an operator (`millwright firmware resume|abort NAME.CLUSTER`):
the campaign's resume lifts only the campaign's own pause (workflows/firmware/fleet.py).

Servers come by cluster, listed: NetBox's device query cannot say "this cluster's devices" (activities/netbox/models.py
DeviceQuery filters by role, site, status, tag and tenant; a NetBox cluster need not be named as the kubeconfig
context), and the same query for every cluster would give each the same devices. The input carries every server
once, inside Temporal's 2 MB payload limit: with `record_in_netbox` a server is its name alone.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pydantic
from pydantic import Field, field_validator, model_validator
from temporalio import workflow

from activities.kube.validators import validate_object_name
from workflows.burnin.node_guard import OutOfService
from workflows.campaign.campaign import Campaign, CampaignControls, ClusterWork
from workflows.campaign.models import CampaignInput, CampaignResult, ClusterState
from workflows.firmware.firmware_update import FirmwareTarget
from workflows.firmware.fleet import FleetFirmwareInput, FleetFirmwareResult, FleetFirmwareSettings


class FirmwareCampaignTemplate(FleetFirmwareSettings):
    """A FleetFirmwareUpdate's input without what is each cluster's own: its servers, by cluster, and its name (each
    cluster's fleet is `<name>.<cluster>`)."""

    name: str = Field(min_length=1, max_length=63, description="Each cluster's fleet run is `<name>.<cluster>`.")
    servers: dict[str, list[FirmwareTarget]] = Field(
        description="Each cluster's servers, by its name in `clusters`: each is the node of its own name in that "
        "cluster, unless its own `kubernetes` (naming that cluster) says otherwise.",
    )  # fmt: skip
    kubernetes: OutOfService = Field(
        default_factory=OutOfService, description="How each server's node goes out of service, in every cluster."
    )

    _name = field_validator("name")(validate_object_name)

    @model_validator(mode="after")
    def _servers_of_their_cluster(self) -> FirmwareCampaignTemplate:
        for cluster, targets in self.servers.items():
            for i, t in enumerate(targets):
                if t.kubernetes is not None and t.kubernetes.cluster != cluster:
                    raise ValueError(f"servers.{cluster}[{i}].kubernetes.cluster: {t.kubernetes.cluster!r}, not "
                                     f"{cluster!r}: a server is listed under its own cluster")  # fmt: skip
        twice = sorted(n for n, c in Counter(t.name for ts in self.servers.values() for t in ts).items() if c > 1)
        if twice:  # one FirmwareUpdate a server (`firmware-update/<server>`)
            raise ValueError(f"servers listed in two clusters: {', '.join(twice)}")
        return self

    def for_cluster(self, cluster: str) -> FleetFirmwareInput:
        """The cluster's FleetFirmwareUpdate input: its servers, each a node of it, validated as the fleet's."""
        node = self.kubernetes.model_dump() | {"cluster": cluster}
        servers = [t.model_dump() | ({} if t.kubernetes else {"kubernetes": node}) for t in self.servers[cluster]]
        return FleetFirmwareInput.model_validate(
            self.model_dump(exclude={"name", "servers", "kubernetes"}) | {"name": f"{self.name}.{cluster}",
                                                                           "servers": servers}
        )  # fmt: skip


class FirmwareCampaignInput(CampaignInput):
    """One firmware bundle across clusters: a canary cluster, then waves, each cluster a `FleetFirmwareUpdate` over its
    servers (workflow ID `firmware-campaign/<name>`)."""

    firmware: FirmwareCampaignTemplate = Field(description="Each cluster's FleetFirmwareUpdate input, but its own.")

    @model_validator(mode="after")
    def _a_fleet_for_each_cluster(self) -> FirmwareCampaignInput:
        """Every cluster's fleet input checked now, as the fleet checks its own, not when its wave comes."""
        if stray := sorted(set(self.firmware.servers) - set(self.clusters)):
            raise ValueError(f"firmware.servers: {', '.join(stray)} not in clusters {self.clusters}")
        if missing := [c for c in self.clusters if not self.firmware.servers.get(c)]:
            raise ValueError(f"firmware.servers: no servers for {', '.join(missing)}")
        for cluster in self.clusters:
            try:
                self.firmware.for_cluster(cluster)
            except pydantic.ValidationError as err:
                why = "; ".join(": ".join(filter(None, (".".join(map(str, e["loc"])), e["msg"]))) for e in err.errors())
                raise ValueError(f"firmware for cluster {cluster!r}: {why}") from None
        return self

    def workflow_id(self) -> str:
        return f"firmware-campaign/{self.name}"


def fleet_outcome(value: Any) -> tuple[ClusterState, dict[str, int], str]:
    """A cluster's FleetFirmwareResult: it fails when a server of it failed (the bundle not on every server)."""
    res = FleetFirmwareResult.model_validate(value)
    if res.aborted is not None:
        return "aborted", res.counts, f"the fleet firmware update was aborted: {res.aborted}"
    if failed := [s for s in res.servers if s.state == "failed"]:
        shown = "; ".join(f"{s.server}: {s.reason}" for s in failed[:3])
        return "failed", res.counts, f"{len(failed)} servers failed ({shown})"
    return "completed", res.counts, ""


@workflow.defn
class FirmwareCampaign(CampaignControls):
    @workflow.init
    def __init__(self, inp: FirmwareCampaignInput) -> None:
        work = ClusterWork(workflow="FleetFirmwareUpdate", input=inp.firmware.for_cluster, read=fleet_outcome)
        self._campaign = Campaign(inp.clusters, inp.plan, work)

    @workflow.run
    async def run(self, inp: FirmwareCampaignInput) -> CampaignResult:
        return await self._campaign.result(inp.name)
