"""Validation tier: the burn-in tier's lab (8 lab BMCs, LabHosts running the real host agent over simulated GPUs for
every powered-on server), the Kubernetes emulator and `kube_worker`. A node is named as the lab server playing it,
so the validation's GPU check reaches that server's host agent. The burn-in's worker (BMC credentials as a file
reference) and `power_link` (a lab server's power as its node sees it) for the runs that power-cycle a node."""

from __future__ import annotations

from tests.workflows.burnin import conftest as _burnin
from tests.workflows.burnin import test_burnin_node as _node

burnin_bmcs = _burnin.burnin_bmcs
bmc_admin = _burnin.bmc_admin
lab_hosts = _burnin.lab_hosts
bmc_secret_file = _burnin.bmc_secret_file
burnin_worker = _burnin.burnin_worker
power_link = _node.power_link
__all__ = ["bmc_admin", "bmc_secret_file", "burnin_bmcs", "burnin_worker", "lab_hosts", "power_link"]
