"""Millwright's workflows: deterministic orchestration only."""

from workflows.fabric import Fabric, FabricAudit, IsolateTenant, ReleaseTenant
from workflows.clusters import CreateCluster, DeleteCluster
from workflows.inventory import InventoryBootstrap
from workflows.node_maintenance import NodeMaintenance
from workflows.node_update import NodeUpdate
from workflows.rollout import Rollout, RolloutBatch
from workflows.tenants import OffboardTenant, OnboardTenant, UpdateTenantQuota

# What people and services start, by type name (the CLI, the UI, other services).
STARTABLE: list[type] = [NodeMaintenance, Rollout, InventoryBootstrap, IsolateTenant, ReleaseTenant, FabricAudit]
# Clusters and tenants (Cluster API, vCluster, KAI).
STARTABLE += [CreateCluster, DeleteCluster, OnboardTenant, OffboardTenant, UpdateTenantQuota]
# Every workflow the worker registers: the startable ones and the children they run.
WORKFLOWS: list[type] = STARTABLE + [RolloutBatch, NodeUpdate, Fabric]
