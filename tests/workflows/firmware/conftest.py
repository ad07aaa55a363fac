"""Firmware tier: the burn-in tier's lab (tests/workflows/burnin/conftest.py: 8 lab BMCs, their host agents, a worker with
the BMC credentials as a secret file reference), the Kubernetes emulator of tests/conftest.py, and the burn-in's
`power_link` (a lab server's power as its Kubernetes node sees it)."""

from tests.workflows.burnin import conftest as _burnin
from tests.workflows.burnin import test_burnin_node as _node

burnin_bmcs = _burnin.burnin_bmcs
bmc_secret_file = _burnin.bmc_secret_file
bmc_admin = _burnin.bmc_admin
lab_hosts = _burnin.lab_hosts
burnin_worker = _burnin.burnin_worker
power_link = _node.power_link
