"""Rollout benchmark: makespan against the policy's ideal, history sizes and CPU per node, at fleet scale.

    python -m bench.rollout --nodes 1000 --batch 100                      # compressed: 0.2 s stages, 0.5 s reboot
    python -m bench.rollout --nodes 200 --batch 100 --profile realistic   # 5 s stages, a 20 s reboot
    python -m bench.rollout --nodes 10000 --batch 250 --workers 2

Seeds the Kubernetes emulator with N GPU nodes, starts the Temporal dev server and `--workers` worker processes
(`python -m worker`, configured by environment as a deployment configures it), runs one Rollout of one package with
a reboot interrupt under a fixed batch size (the cluster's disruption budget entity in the path, as always, its
budget declared as the batch size), and
prints, measured in this run: the actual makespan, the ideal makespan (batches × one node's critical path, computed
from the configuration the emulator reads back: `bench.common.node_update_path`), their ratio (under 1.00 the
ideal was no lower bound: a bench error, `ideal_error=1` and exit status 1), the largest history of any run of
the rollout and its history events per node (every run counted, children and continued runs included) and where
they go (by kind: workflow tasks, activities, local activities markers, signals...), the workers' requests of the Kubernetes API per node (by verb and resource), the CPU time
the workers and the dev server spent during the rollout, each read from its own process and divided by the nodes,
and `throttled`: the lines of the workers' and the server's
logs that report throttling (ResourceExhausted, aborted updates). The last line is machine-readable.
With `--operation mig` the same fleet (H100 nodes) is moved to `all-1g.10gb` by a GpuPartitioning instead (the
emulator's mig-manager taking `--mig-seconds` per node), on the same engine and budget; `--operation both` runs the
rollout, then the partitioning, and the last line gives both `events_per_node` side by side; its ideal: batches ×
one node's least MIG change (`bench.common.node_mig_path`, from the same configuration), `mig_makespan_ratio`.
Not a test: nothing here asserts a timing.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path

import yaml

from bench.common import (
    AuditWrites,
    DevServer,
    Workers,
    batch_spans,
    batch_timeline,
    batches_ideal,
    cpu_per_node,
    cpu_seconds,
    figures_text,
    history_figures,
    ideal_error,
    node_mig_path,
    node_steps,
    node_update_path,
    print_warnings,
    throttled_lines,
    warnings_in,
    where_batches_went,
)
from lab.fleet import Fleet
from lab.k8s.admin import EmulatorAdmin, kubeconfig
from lab.k8s.process import EmulatorProcess
from starter.controls import budget_set
from workflows.partitioning.gpu_partitioning import GpuPartitioning
from workflows.partitioning.models import GpuPartitioningInput
from workflows.rollout.compartments import BATCH_WORKFLOW
from workflows.rollout.rollout import Rollout
from workflows.rollout.spec.spec import RolloutInput

POD_START = 0.05  # the kubelet starts a Job's pod this fast
PACKAGE, INTERRUPT = "kernel-tuning", "reboot"
MIG_LAYOUT = "all-1g.10gb"
NODE_LABELS = {"bench": "true", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
# (stage seconds, reboot seconds) per profile.
PROFILES = {"compressed": (0.2, 0.5), "realistic": (5.0, 20.0)}
ACTIVITY_SLOTS = 400  # per worker: a node's stages hold one slot while its Jobs run


def rollout_template(name: str, batch: int) -> dict:
    """The bench's Rollout input but its cluster: one package with a reboot interrupt over the bench's nodes, one
    batch of `batch` at once (bench/campaign.py hands it to a FleetRollout as its `rollout`)."""
    return {
        "name": name,
        "nodeSelectors": {"matchLabels": {"bench": "true"}},
        "packages": {
            PACKAGE: {
                "version": "1.0.0",
                "image": f"registry.local/millwright/{PACKAGE}",
                "interrupt": {"type": INTERRUPT},
            }
        },
        "deploymentPolicy": {"default": {"budget": {"count": batch}, "strategy": {"fixed": {"initialBatch": batch}}}},
        "maxInFlight": batch,
    }


def rollout_spec(name: str, batch: int) -> RolloutInput:
    return RolloutInput.model_validate({"cluster": "lab", **rollout_template(name, batch)})


def partitioning_spec(name: str, batch: int) -> GpuPartitioningInput:
    return GpuPartitioningInput.model_validate(
        {
            "cluster": "lab",
            "name": name,
            "config": MIG_LAYOUT,
            "nodeSelectors": {"matchLabels": {"bench": "true"}},
            "deploymentPolicy": {
                "default": {"budget": {"count": batch}, "strategy": {"fixed": {"initialBatch": batch}}}
            },
            "maxInFlight": batch,
        }
    )


async def seed_cluster(admin: EmulatorAdmin, cluster: str, nodes: int, stage_seconds: float, reboot_seconds: float,
                       **config: float) -> dict:  # fmt: skip
    """Seeds an emulator with `nodes` GPU nodes of the bench's labels for `cluster`, makes its stage Jobs take
    `stage_seconds` and a reboot `reboot_seconds` (and any other `config` setting), and returns its configuration as
    it reads it back: what it says it was given, not the bench's constants, so that an ideal follows what the lab
    takes."""
    fleet = Fleet.model_validate(
        {"cluster": cluster, "nodes": [{"prefix": "gpu-", "count": nodes, "digits": 5, "labels": NODE_LABELS}]}
    )
    await admin.seed(fleet.to_objects())
    await admin.configure(jobs={"defaultSeconds": stage_seconds, "rules": []}, rebootSeconds=reboot_seconds, **config)
    return await admin.config()


async def api_requests(admin: EmulatorAdmin) -> Counter[str]:
    """What the workers asked of the Kubernetes emulator so far, by verb and resource ("get jobs")."""
    counts: Counter[str] = Counter()
    for kind in await admin.requests():
        if kind["userAgent"].startswith("millwright"):
            counts[" ".join(filter(None, (kind["verb"], kind["resource"], kind["subresource"])))] += kind["count"]
    return counts


async def main(nodes: int, batch: int, stage_seconds: float, reboot_seconds: float, workers: int, operation: str,
               mig_seconds: float) -> int:  # fmt: skip
    """Runs the bench and prints its figures; 1 when an ideal was beaten (`ideal_error`), else 0."""
    with EmulatorProcess(pod_start_seconds=POD_START, grace_scale=0.01) as emulator, \
            tempfile.TemporaryDirectory(prefix="millwright-bench-") as tmp:  # fmt: skip
        admin = EmulatorAdmin(emulator.url)
        config = await seed_cluster(admin, "lab", nodes, stage_seconds, reboot_seconds, migPendingSeconds=mig_seconds)
        path = node_update_path(config, PACKAGE, INTERRUPT)
        mig_path = node_mig_path(config, NODE_LABELS["nvidia.com/gpu.product"], MIG_LAYOUT)
        kube = Path(tmp) / "kubeconfig"
        kube.write_text(yaml.safe_dump(kubeconfig(emulator.url, "lab")))
        figures: dict[str, dict[str, float]] = {}
        async with DevServer() as server:
            pool = Workers(workers, server.address, f"bench-{uuid.uuid4().hex[:6]}", str(kube), Path(tmp),
                           max_concurrent_activities=str(ACTIVITY_SLOTS), log_level="WARNING")  # fmt: skip
            try:
                await pool.polling(server.client)
                # The cluster's budget is the operator's (a run's own only caps the run): one batch at once.
                await budget_set(server.client, "lab", count=batch, by="bench", reason="one batch at once",
                                 task_queue=pool.task_queue)  # fmt: skip
                for op in ("rollout", "mig") if operation == "both" else (operation,):
                    name = f"bench-{uuid.uuid4().hex[:6]}"
                    spec = rollout_spec(name, batch) if op == "rollout" else partitioning_spec(name, batch)
                    run = Rollout.run if op == "rollout" else GpuPartitioning.run
                    cpu_before = pool.cpu_seconds(), cpu_seconds(server.pid), cpu_seconds(emulator.pid)
                    requests_before = await api_requests(admin)
                    started = time.monotonic()
                    writes = AuditWrites(admin)
                    following = asyncio.ensure_future(writes.follow())
                    try:
                        result = await server.client.execute_workflow(
                            run,  # type: ignore[misc]  # one of two workflow types, each with its own input model
                            spec,
                            id=spec.workflow_id(),
                            task_queue=pool.task_queue,
                        )
                        makespan = time.monotonic() - started
                    finally:
                        following.cancel()
                    cpu_after = pool.cpu_seconds(), cpu_seconds(server.pid), cpu_seconds(emulator.pid)
                    worker_cpu, server_cpu, emulator_cpu = (a - b for b, a in zip(cpu_before, cpu_after))
                    print(f"{op}: nodes={nodes} batch={batch} workers={workers} outcome={result.outcome} "
                          f"counts={result.counts} makespan={makespan:.1f}s")  # fmt: skip
                    run_figures = await history_figures(server.client, op, nodes, spec.workflow_id())
                    durations, gaps = await batch_timeline(server.client, BATCH_WORKFLOW, spec.workflow_id())
                    if durations:
                        print(f"{op}: {len(durations)} batches: each {statistics.mean(durations):.1f}s on average "
                              f"(max {max(durations):.1f}s), between two batches {statistics.mean(gaps or [0]):.1f}s "
                              f"(max {max(gaps or [0]):.1f}s)")  # fmt: skip
                        print(f"{op}: each batch in order (s): " + " ".join(f"{d:.0f}" for d in durations))
                    if op == "rollout":
                        steps = node_steps(await writes.read())
                        spans = await batch_spans(server.client, BATCH_WORKFLOW, spec.workflow_id())
                        print(f"{op}: where a batch's time went beyond the ideal (mean over batches): "
                              + "; ".join(where_batches_went(steps, spans, path)))  # fmt: skip
                    asked = await api_requests(admin) - requests_before
                    print(f"{op}: API requests per node by kind: "
                          + ", ".join(f"{kind} {n / nodes:.2f}" for kind, n in asked.most_common(8)))  # fmt: skip
                    print(f"{op}: cpu: workers {worker_cpu:.1f}s, dev server {server_cpu:.1f}s, "
                          f"Kubernetes emulator {emulator_cpu:.1f}s")  # fmt: skip
                    figures[op] = {"makespan": makespan, **run_figures, **cpu_per_node(worker_cpu, server_cpu, nodes)}
            finally:
                pool.stop()
            throttled = throttled_lines(server.log, *pool.logs)
            warnings = warnings_in(*pool.logs)
        await admin.aclose()
    print_warnings(warnings)
    last, error = [], 0
    if "rollout" in figures:
        ideal, how = batches_ideal(nodes, batch, path)
        print(f"ideal: {how}")
        rollout = figures["rollout"]
        error = ideal_error(rollout["makespan"] / ideal, "rollout makespan")
        last.append(figures_text(rollout["makespan"] / ideal, rollout))
    if "mig" in figures:
        mig = figures["mig"]
        mig_ideal, how = batches_ideal(nodes, batch, mig_path)
        print(f"mig ideal: {how}")
        error = max(error, ideal_error(mig["makespan"] / mig_ideal, "mig makespan"))
        last.append(f"mig_makespan_ratio={mig['makespan'] / mig_ideal:.2f} "
                    f"mig_max_run_events={mig['max_run_events']:.0f} mig_events_per_node={mig['events_per_node']:.1f} "
                    f"mig_worker_cpu_ms_per_node={mig['worker_cpu_ms_per_node']:.0f}")  # fmt: skip
    print(" ".join(last) + f" throttled={throttled} ideal_error={error}")
    return error


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument(
        "--profile",
        choices=sorted(PROFILES),
        default="compressed",
        help="compressed: 0.2 s stages, 0.5 s reboot; realistic: 5 s stages, a 20 s reboot",
    )
    parser.add_argument("--stage-seconds", type=float, help="override the profile's stage time")
    parser.add_argument("--reboot-seconds", type=float, help="override the profile's reboot time")
    parser.add_argument("--workers", type=int, default=1, help="worker processes (python -m worker)")
    parser.add_argument("--operation", choices=("rollout", "mig", "both"), default="rollout",
                        help="a Rollout, a GpuPartitioning to all-1g.10gb, or one then the other")  # fmt: skip
    parser.add_argument("--mig-seconds", type=float, default=0.5, help="mig-manager's pending time per node")
    args = parser.parse_args()
    stage, reboot = PROFILES[args.profile]
    sys.exit(
        asyncio.run(
            main(
                args.nodes,
                args.batch,
                args.stage_seconds if args.stage_seconds is not None else stage,
                args.reboot_seconds if args.reboot_seconds is not None else reboot,
                args.workers,
                args.operation,
                args.mig_seconds,
            )
        )
    )
