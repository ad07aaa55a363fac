"""Campaign benchmark: one FleetRollout across clusters, its makespan against the wave plan's ideal, at fleet scale.

    python -m bench.campaign --clusters 10 --nodes 1000                          # realistic: 5 s stages, a 20 s reboot
    python -m bench.campaign --clusters 3 --nodes 30 --batch 10 --profile compressed

Starts one Kubernetes emulator per cluster, each seeded with `--nodes` GPU nodes as bench.rollout seeds its one
(`bench.rollout.seed_cluster`) and given its own disruption budget of one batch, the Temporal dev server and
`--workers` worker processes (`python -m worker`) on a random task queue that reach every cluster through one
kubeconfig of a context per cluster, then runs one FleetRollout of bench.rollout's Rollout (`rollout_template`) over
the clusters: the first one as the canary, then `--wave-size` clusters at a time, `--soak` seconds after the canary
and between two waves. Prints, measured in this run: each wave's clusters, its makespan (its first rollout's start to
its last one's close, as the server saw them) against its ideal, the time between two waves; the campaign's makespan
against its ideal (`campaign_ideal`), their ratio (under 1.00 the ideal was no lower bound: a bench error,
`ideal_error=1` and exit status 1), the largest history of any run (the campaign's, each cluster's rollout, their
batches and continued runs) and the events per node over all of them, the CPU the workers and the dev server spent
during the campaign per node (the emulators' in a line before), and the throttled lines of their logs. The last line
is machine-readable, as bench.rollout's. Not a test: nothing here asserts a timing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import tempfile
import time
import uuid
from datetime import timedelta
from pathlib import Path

import yaml
from temporalio.client import Client

from bench import common
from bench.rollout import ACTIVITY_SLOTS, INTERRUPT, PACKAGE, POD_START, PROFILES, rollout_template, seed_cluster
from lab.k8s.admin import EmulatorAdmin, kubeconfig, merged_kubeconfig
from lab.k8s.process import EmulatorProcess
from starter.controls import budget_set
from workflows.campaign.models import CampaignResult, FleetRolloutInput

# 300 nodes in flight (3 waves of 100-node batches) spend about a third of the shared 2-core machine at 10 x 1,000
# nodes, measured per node by bench.rollout (docs/testing.md): the orchestration, not the machine, is what is measured.
BATCH, WAVE_SIZE, SOAK = 100, 3, 10.0


def campaign_ideal(waves: list[list[str]], cluster_ideals: dict[str, float], soak: float) -> tuple[float, list[float]]:
    """The least a campaign of these waves (its plan's, `WavePlan.waves`) can take, and each wave's: a wave's
    clusters run side by side, each under its own budget, so a wave takes its longest cluster's own ideal; the waves
    run one after another, the canary first, with the soak after the canary and between two waves (none after the
    last: nothing waits on it)."""
    per_wave = [max(cluster_ideals[cluster] for cluster in wave) for wave in waves]
    return sum(per_wave) + soak * (len(waves) - 1), per_wave


async def run_spans(client: Client, workflow_ids: list[str]) -> dict[str, tuple[float, float]]:
    """Each workflow's first run's start and last run's close (continued runs included), as epoch seconds by the
    server's clock."""
    spans = {}
    for workflow_id in workflow_ids:
        runs = [(run.start_time.timestamp(), run.close_time.timestamp())
                async for run in client.list_workflows(f"WorkflowId = '{workflow_id}'")
                if run.close_time is not None]  # fmt: skip
        spans[workflow_id] = (min(start for start, _ in runs), max(close for _, close in runs))
    return spans


async def main(clusters: int, nodes: int, batch: int, wave_size: int, soak: float, stage_seconds: float,
               reboot_seconds: float, workers: int) -> int:  # fmt: skip
    """Runs the bench and prints its figures; 1 when the ideal was beaten (`ideal_error`), else 0."""
    names = [f"cluster-{i + 1:02d}" for i in range(clusters)]
    print(f"campaign: clusters={clusters} nodes={nodes} each, batch={batch} wave_size={wave_size} soak={soak:g}s "
          f"workers={workers}: {wave_size * batch} nodes in flight in a wave (activity slots: "
          f"{ACTIVITY_SLOTS * workers})")  # fmt: skip
    with contextlib.ExitStack() as stack, tempfile.TemporaryDirectory(prefix="millwright-bench-") as tmp:
        emulators = {name: stack.enter_context(EmulatorProcess(pod_start_seconds=POD_START, grace_scale=0.01))
                     for name in names}  # fmt: skip
        admins = {name: EmulatorAdmin(emulator.url) for name, emulator in emulators.items()}
        cluster_ideals = {}
        for name, admin in admins.items():
            config = await seed_cluster(admin, name, nodes, stage_seconds, reboot_seconds)
            path = common.node_update_path(config, PACKAGE, INTERRUPT)
            cluster_ideals[name], how = common.batches_ideal(nodes, batch, path)
            print(f"{name}: ideal {how}")
        kube = Path(tmp) / "kubeconfig"  # one kubeconfig, a context per cluster, as a worker that reaches them all has
        kube.write_text(yaml.safe_dump(merged_kubeconfig([kubeconfig(emulators[n].url, n) for n in names])))
        spec = FleetRolloutInput.model_validate({
            "name": f"bench-{uuid.uuid4().hex[:6]}", "clusters": names,
            "plan": {"wave_size": wave_size, "soak": timedelta(seconds=soak)},
            "rollout": rollout_template(f"bench-{uuid.uuid4().hex[:6]}", batch),
        })  # fmt: skip
        waves = spec.plan.waves(spec.clusters)
        ideal, wave_ideals = campaign_ideal(waves, cluster_ideals, soak)
        async with common.DevServer() as server:
            pool = common.Workers(workers, server.address, f"bench-{uuid.uuid4().hex[:6]}", str(kube), Path(tmp),
                                  max_concurrent_activities=str(ACTIVITY_SLOTS), log_level="WARNING")  # fmt: skip
            try:
                await pool.polling(server.client)
                for name in names:  # each cluster's own budget, as its operator declares it: one batch at once
                    await budget_set(server.client, name, count=batch, by="bench", reason="one batch at once",
                                     task_queue=pool.task_queue)  # fmt: skip
                cpu_before = _cpu(pool, server, emulators)
                started = time.monotonic()
                result = await server.client.execute_workflow("FleetRollout", spec, id=spec.workflow_id(),
                                                              task_queue=pool.task_queue,
                                                              result_type=CampaignResult)  # fmt: skip
                makespan = time.monotonic() - started
                cpu_after = _cpu(pool, server, emulators)
                worker_cpu, server_cpu, emulator_cpu = (a - b for b, a in zip(cpu_before, cpu_after))
                print(f"campaign: outcome={result.outcome} makespan={makespan:.1f}s waves={result.waves} "
                      f"clusters: " + ", ".join(f"{c} {o.state}" for c, o in result.clusters.items()))  # fmt: skip
                waves_error = int(result.waves != waves)  # the ideal is of the plan's waves, no bound of others
                if waves_error:
                    print(f"bench error: the campaign ran waves {result.waves}, its plan's are {waves}")
                children = {name: result.clusters[name].workflow_id for name in names}
                spans = await run_spans(server.client, [spec.workflow_id(), *children.values()])
                _print_waves(waves, wave_ideals, {name: spans[children[name]] for name in names},
                             spans[spec.workflow_id()], soak)  # fmt: skip
                figures = await common.history_figures(server.client, "campaign", clusters * nodes,
                                                       spec.workflow_id(), *children.values())  # fmt: skip
                campaign_runs = await common.history_lengths(server.client, spec.workflow_id())
                print(f"campaign: the FleetRollout's own run(s): {campaign_runs} events")
                print(f"campaign: cpu: workers {worker_cpu:.1f}s, dev server {server_cpu:.1f}s, "
                      f"Kubernetes emulators {emulator_cpu:.1f}s (all {clusters})")  # fmt: skip
            finally:
                pool.stop()
            throttled = common.throttled_lines(server.log, *pool.logs)
            warnings = common.warnings_in(*pool.logs)
        for admin in admins.values():
            await admin.aclose()
    common.print_warnings(warnings)
    print("ideal: " + " + ".join(f"{w:.2f} ({f'wave {i}' if i else 'canary'})" for i, w in enumerate(wave_ideals))
          + f" + {len(waves) - 1} soak(s) × {soak:g} s = {ideal:.2f} s (a wave: its longest cluster's ideal)")  # fmt: skip
    error = max(common.ideal_error(makespan / ideal, "campaign makespan"), waves_error)
    figures |= {"makespan": makespan, **common.cpu_per_node(worker_cpu, server_cpu, clusters * nodes)}
    print(common.figures_text(makespan / ideal, figures) + f" throttled={throttled} ideal_error={error}")
    return error


def _cpu(pool: common.Workers, server: common.DevServer, emulators: dict[str, EmulatorProcess]) -> tuple[float, ...]:
    """CPU seconds so far of the workers, the dev server and all the emulators together."""
    pids = [emulator.pid for emulator in emulators.values() if emulator.pid is not None]
    return pool.cpu_seconds(), common.cpu_seconds(server.pid), sum(map(common.cpu_seconds, pids))


def _print_waves(waves: list[list[str]], ideals: list[float], spans: dict[str, tuple[float, float]],
                 campaign: tuple[float, float], soak: float) -> None:  # fmt: skip
    """Each wave's clusters, makespan and ideal, and what passed between two waves and at the campaign's ends: where
    the campaign's time went."""
    ended = campaign[0]
    for index, (wave, ideal) in enumerate(zip(waves, ideals)):
        start, close = min(spans[c][0] for c in wave), max(spans[c][1] for c in wave)
        before = "the campaign's start" if index == 0 else f"the last wave's end (soak {soak:g} s)"
        print(f"{f'wave {index}' if index else 'canary'}: {' '.join(wave)}: makespan {close - start:.1f}s "
              f"against {ideal:.2f}s ({(close - start) / ideal:.3f}), started {start - ended:.1f}s after {before}; "
              "each cluster " + " ".join(f"{spans[c][1] - spans[c][0]:.1f}s" for c in wave))  # fmt: skip
        ended = close
    print(f"the last wave's end to the campaign's close: {campaign[1] - ended:.1f}s")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clusters", type=int, default=10)
    parser.add_argument("--nodes", type=int, default=1000, help="nodes per cluster")
    parser.add_argument("--batch", type=int, default=BATCH, help="each cluster's batch and budget")
    parser.add_argument("--wave-size", type=int, default=WAVE_SIZE, help="clusters at once after the canary")
    parser.add_argument("--soak", type=float, default=SOAK, help="seconds after the canary and between two waves")
    parser.add_argument("--profile", choices=sorted(PROFILES), default="realistic",
                        help="compressed: 0.2 s stages, 0.5 s reboot; realistic: 5 s stages, a 20 s reboot")  # fmt: skip
    parser.add_argument("--workers", type=int, default=1, help="worker processes (python -m worker)")
    args = parser.parse_args()
    stage, reboot = PROFILES[args.profile]
    sys.exit(asyncio.run(main(args.clusters, args.nodes, args.batch, args.wave_size, args.soak, stage, reboot,
                              args.workers)))  # fmt: skip
