"""Millwright's workflows: deterministic orchestration only."""

from workflows.inventory import InventoryBootstrap
from workflows.node_maintenance import NodeMaintenance
from workflows.node_update import NodeUpdate
from workflows.rollout import Rollout, RolloutBatch

# What people and services start, by type name (the CLI, the UI, other services).
STARTABLE: list[type] = [NodeMaintenance, Rollout, InventoryBootstrap]
# Every workflow the worker registers: the startable ones and the children they run.
WORKFLOWS: list[type] = STARTABLE + [RolloutBatch, NodeUpdate]
