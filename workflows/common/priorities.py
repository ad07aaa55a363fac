"""Task priority and fairness: what a worker shared by rollouts, remediation and operators' controls takes first
when its task queues back up. Every choice is here; the workflows only name them.

Temporal dispatches a backlogged task queue by priority key (1 first; none set: the server's default, 3), and within
one key by fairness key, each key's share in proportion to its weight (1.0 here). An activity or child workflow
without a priority inherits its workflow's; the calls below are given theirs where they are scheduled, so a run
started from the UI or a schedule, with no priority of its own, gets the same.

| key | fairness key | what |
|---|---|---|
| 1 `OPERATOR` | none | NodeMaintenance (an operator's cordon, drain, uncordon) and the disruption budget entity's workflow tasks, which run its local activities (a local activity has no task queue of its own) |
| 2 `remediation(cluster)` | `remediation/<cluster>` | NodeRemediation (cordon, drain, the ladder, uncordon), FleetHealthSweep's reads, probes and children |
| 3 (default) | none | everything else: burn-in, inventory, fabric, tenants |
| 4 `rollout(cluster)` | `rollout/<cluster>` | Rollout's own calls, its batches and their node updates (stages, drains: inherited from the child's start) |

So a rollout's thousand node stages never hold a remediation's cordon or an operator's drain behind them, and one
cluster's rollout takes its share of the workers, not all of them, while another cluster's rollout waits.

Replay compares no priority (checked with the SDK's Replayer: a history recorded without priorities replays with
them, and the other way round), so changing these needs no `workflow.patched`. Priority works on the dev server and
a self-hosted server as they come; fairness needs the dynamic config `matching.enableFairness=true` (the lab's and
the tests' dev servers set it: lab/temporal.py, tests/conftest.py; on Temporal Cloud it is a namespace setting).
"""

from __future__ import annotations

from temporalio.common import Priority

# What a self-hosted server (and the dev server: `--dynamic-config-value`) needs for fairness keys to count.
FAIRNESS_DYNAMIC_CONFIG = "matching.enableFairness=true"

OPERATOR = Priority(priority_key=1)
REMEDIATION_KEY = 2
ROLLOUT_KEY = 4


def remediation(cluster: str) -> Priority:
    return Priority(priority_key=REMEDIATION_KEY, fairness_key=_fairness("remediation", cluster))


def rollout(cluster: str) -> Priority:
    return Priority(priority_key=ROLLOUT_KEY, fairness_key=_fairness("rollout", cluster))


def _fairness(kind: str, cluster: str) -> str:
    """`<kind>/<cluster>`, within the server's 64 bytes."""
    return f"{kind}/{cluster}".encode()[:64].decode(errors="ignore")
