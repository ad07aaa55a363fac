"""The catalog of Millwright's workflows: what people and services start, and what the worker registers.

The worker (worker/registry.py), the starter (starter/client.py), the benchmarks and the tests read it; no
workflow imports it. Each workflow module is imported only here and by the workflows that start it, so the
sandbox imports a run's own module (and what that module imports) for each new run, never all of them.
"""

from workflows.budget.disruption_budget import DisruptionBudget
from workflows.burnin.fleet_burnin import FleetBurnIn
from workflows.burnin.server_burnin import ServerBurnIn
from workflows.campaign.firmware_campaign import FirmwareCampaign
from workflows.campaign.fleet_gpu_partitioning import FleetGpuPartitioning
from workflows.campaign.fleet_rollout import FleetRollout
from workflows.clusters.create_cluster import CreateCluster
from workflows.clusters.delete_cluster import DeleteCluster
from workflows.fabric.audit import FabricAudit
from workflows.fabric.fabric import Fabric
from workflows.fabric.isolation import IsolateTenant
from workflows.fabric.release import ReleaseTenant
from workflows.firmware.firmware_update import FirmwareUpdate
from workflows.firmware.fleet import FleetFirmwareUpdate
from workflows.inventory.bootstrap import InventoryBootstrap
from workflows.maintenance.node_maintenance import NodeMaintenance
from workflows.partitioning.gpu_partitioning import GpuPartitioning
from workflows.partitioning.node_mig import NodeMigReconfigure
from workflows.remediation.health_sweep import FleetHealthSweep
from workflows.remediation.node_remediation import NodeRemediation
from workflows.remediation.rack_remediation import RackRemediation
from workflows.remediation.rma import NodeRma
from workflows.rollout.node_update import NodeUpdate
from workflows.rollout.rollout import Rollout, RolloutBatch
from workflows.tenancy.offboarding import OffboardTenant
from workflows.tenancy.onboarding import OnboardTenant
from workflows.tenancy.quota import UpdateTenantQuota
from workflows.usage.tenant_usage import TenantUsage

# What people and services start, by type name (the CLI, the UI, other services).
STARTABLE: list[type] = [NodeMaintenance, Rollout, InventoryBootstrap, IsolateTenant, ReleaseTenant, FabricAudit]
# Clusters and tenants (Cluster API, vCluster, KAI).
STARTABLE += [CreateCluster, DeleteCluster, OnboardTenant, OffboardTenant, UpdateTenantQuota]
# Bare-metal burn-in (issue #5): one server, or a fleet with a fail-fast threshold.
STARTABLE += [ServerBurnIn, FleetBurnIn]
# Remediation of unhealthy nodes (issue #8): the scheduled sweep, and one remediation per node.
STARTABLE += [FleetHealthSweep, NodeRemediation]
# A sick NVLink domain (an NVL72 rack) remediated whole (issue #40).
STARTABLE += [RackRemediation]
# A quarantined node's return to its vendor and back to service (issue #25).
STARTABLE += [NodeRma]
# GPU-hours per tenant from Prometheus (issue #29), daily by a Schedule.
STARTABLE += [TenantUsage]
# Firmware through Redfish UpdateService (issue #25): one server, its node taken out of service first; a fleet in
# waves.
STARTABLE += [FirmwareUpdate, FleetFirmwareUpdate]
# MIG layouts across a fleet (issue #26), on the rollout's engine: one NodeMigReconfigure child per node.
STARTABLE += [GpuPartitioning]
# One change across clusters (issue #42): a Rollout, a GpuPartitioning or a FleetFirmwareUpdate per cluster, the
# canary first, then waves.
STARTABLE += [FleetRollout, FleetGpuPartitioning, FirmwareCampaign]
# Every workflow the worker registers: the startable ones and the children they run.
WORKFLOWS: list[type] = [*STARTABLE, RolloutBatch, NodeUpdate, Fabric, NodeMigReconfigure]
# One per cluster, started on demand by whoever takes a node out of service.
WORKFLOWS += [DisruptionBudget]
# The entities: one per cluster or fabric, continuing as new for ever. Under Worker Versioning they move to the
# current build (AUTO_UPGRADE) where every other workflow, a bounded run, finishes on the build that started it.
ENTITIES: list[type] = [DisruptionBudget, Fabric]
