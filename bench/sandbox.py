"""What the sandbox costs a new workflow run: CPU per `prepare_workflow`, for the runs a fleet starts by the thousand.

    python -m bench.sandbox
    python -m bench.sandbox --samples 200

Each `prepare_workflow` builds the sandbox of one new run (its imports afresh, its workflow instance), as the worker
does for every run it starts. Prints, per workflow class, the median and 90th percentile of CPU milliseconds over
`--samples` runs, beside the same measured with only `activities` passed through (every workflows module imported afresh,
as each run did before the worker passed the shared ones through), and the ratio of the two; the machine's load before and after. The last line is
machine-readable. Not a test: nothing here asserts a timing (tests/test_sandbox.py checks what is re-imported).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time

from temporalio import workflow
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

from worker.registry import workflow_runner
from workflows.budget.disruption_budget import DisruptionBudget
from workflows.maintenance.node_maintenance import NodeMaintenance
from workflows.rollout.node_update import NodeUpdate
from workflows.rollout.rollout import Rollout, RolloutBatch

FLEET_RUNS = [NodeUpdate, RolloutBatch, NodeMaintenance, Rollout, DisruptionBudget]


def cpu_ms(runner, cls, samples: int) -> list[float]:
    defn = workflow._Definition.must_from_class(cls)
    # The SDK's own check, a new run's sandbox and instance each time (the worker's checks each class only once).
    prepare = SandboxedWorkflowRunner.prepare_workflow
    for _ in range(3):  # the first runs import the shared modules once, outside
        prepare(runner, defn)
    out = []
    for _ in range(samples):
        started = time.process_time()
        prepare(runner, defn)
        out.append((time.process_time() - started) * 1000)
    return out


async def measure() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=50)
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    bare = SandboxedWorkflowRunner(restrictions=SandboxRestrictions.default.with_passthrough_modules("activities"))
    rows = {}
    for cls in FLEET_RUNS:
        shared = sorted(cpu_ms(workflow_runner(), cls, args.samples))
        alone = sorted(cpu_ms(bare, cls, args.samples))
        rows[cls.__name__] = {
            "median_ms": round(statistics.median(shared), 2),
            "p90_ms": round(shared[int(len(shared) * 0.9)], 2),
            "activities_only_median_ms": round(statistics.median(alone), 2),
            "ratio": round(statistics.median(alone) / statistics.median(shared), 1),
        }
        r = rows[cls.__name__]
        print(
            f"{cls.__name__:16} {r['median_ms']:7.2f} ms median  {r['p90_ms']:7.2f} ms p90   "
            f"only activities passed through: {r['activities_only_median_ms']:7.2f} ms  ({r['ratio']}x)"
        )
    print(f"load average: {load_before:.2f} before, {os.getloadavg()[0]:.2f} after")
    print(json.dumps({"bench": "sandbox", "samples": args.samples, "runs": rows}))


if __name__ == "__main__":
    asyncio.run(measure())
