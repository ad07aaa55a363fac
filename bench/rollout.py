"""Rollout benchmark: makespan against the policy's ideal, and history sizes, at fleet scale.

    python -m bench.rollout --nodes 1000
    python -m bench.rollout --nodes 10000 --batch 500

Seeds the Kubernetes emulator with N GPU nodes, runs one Rollout of one package with a
reboot interrupt under a fixed batch size, with fixed simulated stage and reboot times,
and prints, measured in this run: the actual makespan, the ideal makespan from the
policy (batches × per-node time), their ratio, the largest history of any run, and
history events per node. The last line is machine-readable.
Not a test: nothing here asserts a timing.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import time
import uuid

from bench.common import dev_server, history_lengths
from lab.fleet import Fleet
from lab.k8s.admin import EmulatorAdmin, kubeconfig
from lab.k8s.process import EmulatorProcess
from worker import registry
from worker.config import WorkerSettings
from workflows.rollout import Rollout
from workflows.rollout_spec import RolloutInput

POD_START = 0.05  # the kubelet starts a Job's pod this fast


def rollout_spec(name: str, batch: int) -> RolloutInput:
    return RolloutInput.model_validate(
        {
            "cluster": "lab",
            "name": name,
            "nodeSelectors": {"matchLabels": {"bench": "true"}},
            "packages": {
                "kernel-tuning": {
                    "version": "1.0.0",
                    "image": "registry.local/millwright/kernel-tuning",
                    "interrupt": {"type": "reboot"},
                }
            },
            "deploymentPolicy": {
                "default": {"budget": {"count": batch}, "strategy": {"fixed": {"initialBatch": batch}}}
            },
        }
    )


async def main(nodes: int, batch: int, stage_seconds: float, reboot_seconds: float) -> None:
    with EmulatorProcess(pod_start_seconds=POD_START, grace_scale=0.01) as emulator:
        admin = EmulatorAdmin(emulator.url)
        fleet = Fleet.model_validate(
            {"cluster": "lab", "nodes": [{"prefix": "gpu-", "count": nodes, "digits": 5, "labels": {"bench": "true"}}]}
        )
        await admin.seed(fleet.to_objects())
        await admin.configure(jobs={"defaultSeconds": stage_seconds, "rules": []}, rebootSeconds=reboot_seconds)
        path = f"/tmp/millwright-bench-{uuid.uuid4().hex[:6]}.kubeconfig"
        with open(path, "w") as fh:
            import yaml

            yaml.safe_dump(kubeconfig(emulator.url, "lab"), fh)
        async with await dev_server() as env:
            registration = registry.build(WorkerSettings(kubeconfig=path, metrics_port=0))
            task_queue = f"bench-{uuid.uuid4().hex[:6]}"
            async with registry.new_worker(env.client, registration, task_queue, max_concurrent_activities=400):
                spec = rollout_spec(f"bench-{uuid.uuid4().hex[:6]}", batch)
                started = time.monotonic()
                result = await env.client.execute_workflow(
                    Rollout.run, spec, id=spec.workflow_id(), task_queue=task_queue
                )
                makespan = time.monotonic() - started
            await registration.close()
            lengths = await history_lengths(env.client, spec.workflow_id())
        await admin.aclose()
    batches = math.ceil(nodes / batch)
    # Per node: apply, config, the reboot's Job, post-interrupt — each a Job of stage_seconds
    # after its pod starts — and the reboot itself.
    per_node = 4 * (stage_seconds + POD_START) + reboot_seconds
    ideal = batches * per_node
    print(f"nodes={nodes} batch={batch} batches={batches} outcome={result.outcome} counts={result.counts}")
    print(f"makespan={makespan:.1f}s ideal={ideal:.1f}s (batches x per-node {per_node:.2f}s)")
    print(f"runs={len(lengths)} total_events={sum(lengths)} largest_run={max(lengths)}")
    print(
        f"makespan_ratio={makespan / ideal:.2f} max_run_events={max(lengths)} "
        f"events_per_node={sum(lengths) / nodes:.1f}"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--stage-seconds", type=float, default=0.2)
    parser.add_argument("--reboot-seconds", type=float, default=0.5)
    args = parser.parse_args()
    asyncio.run(main(args.nodes, args.batch, args.stage_seconds, args.reboot_seconds))
