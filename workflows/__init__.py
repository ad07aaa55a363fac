"""Millwright's workflows: deterministic orchestration only."""

from workflows.node_maintenance import NodeMaintenance

# Every workflow the worker registers and the CLI can start, by type name.
WORKFLOWS: list[type] = [NodeMaintenance]
