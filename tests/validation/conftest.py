"""Validation tier: the burn-in tier's lab (8 lab BMCs, LabHosts running the real host agent over simulated GPUs for
every powered-on server), the Kubernetes emulator and `kube_worker`. A node is named as the lab server playing it,
so the validation's GPU check reaches that server's host agent."""

from __future__ import annotations

from tests.burnin import conftest as _burnin

burnin_bmcs = _burnin.burnin_bmcs
bmc_admin = _burnin.bmc_admin
lab_hosts = _burnin.lab_hosts
__all__ = ["bmc_admin", "burnin_bmcs", "lab_hosts"]
