"""Disruption budget chaos: the `DisruptionBudget` entity under many requesters, its worker SIGKILLed and restarted at
random moments while its cluster reads outlast a workflow task; then every run's history replayed.

    python -m bench.budget_chaos                          # 20 runs, 8 requesters, a budget of 4, 12 s reads, 3 kills
    python -m bench.budget_chaos --runs 5 --seed 7 --save /tmp/chaos   # histories of failing runs kept there

Each run, on one dev server and one Kubernetes emulator (reset between runs): the entity (`disruption-budget/lab`,
a budget of `--budget` nodes) and `--requesters` NodeMaintenance runs (cordon, drain, uncordon, each holding a
lease) on `--nodes` nodes, one worker process (`python -m worker`). The entity reads the cluster (its
`node_availability` local activity) in pages of 500 nodes, and the emulator holds each page `--page-seconds`: with
the default 600 nodes and 6 s, a read takes 12 s, longer than the workflow task timeout (10 s) but within the
call's 15 s and each request within the client's 10 s, so each read spans workflow-task heartbeats, and a kill
during one times the task out. The worker is killed `--kills` times a run, each time `--kill-min`..`--kill-max`
seconds after the worker started since the last kill polls (so each kill meets work in flight, and each worker
gets going first: kills faster than a read lasts leave the entity no read to finish), and the run goes on until
the requesters finish (or `--run-timeout`, or the entity stops on a failed workflow task). Then every run the run
started (the entity's continue-as-new chain included) is fetched and replayed with the current code
(worker/replay.py), and its workflow tasks that failed (WorkflowTaskFailed events) are counted by cause.

Prints one line per run and the totals: runs, runs with a failed workflow task, failed workflow tasks (by cause),
nondeterminism (histories that fail replay, and tasks failed for it while they ran), stuck runs (the entity
stopped on a failed workflow task), unfinished runs (requesters not done within `--run-timeout`), seconds. The last
line is machine-readable. Not a test: never run in the suite.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import tempfile
import time
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import yaml
from temporalio.api.enums.v1 import EventType, WorkflowTaskFailedCause
from temporalio.client import Client, WorkflowHandle
from temporalio.service import RPCError

from bench.common import DevServer, Workers
from lab.fleet import Fleet
from lab.k8s.admin import EmulatorAdmin, kubeconfig
from lab.k8s.process import EmulatorProcess
from worker.replay import failed_for_nondeterminism, histories_since, replay
from workflows.budget.budget import Budget
from workflows.budget.disruption_budget import DisruptionBudget
from workflows.budget.models import DisruptionBudgetInput
from workflows.maintenance.node_maintenance import NodeMaintenance, NodeMaintenanceInput

NODE_LISTS = {"verb": "list", "resource": "nodes"}  # the entity's cluster read; nothing else lists nodes here
# The server fails the workflow task in flight when the bench terminates the entity at a run's end: not counted.
TERMINATED_MID_TASK = "FORCE_CLOSE_COMMAND"


async def one_run(n: int, args: argparse.Namespace, rng: random.Random, client: Client, admin: EmulatorAdmin,
                  pool: Workers) -> dict:  # fmt: skip
    await admin.reset()
    nodes = {"prefix": "node-", "count": args.nodes, "digits": 3}
    await admin.seed(Fleet.model_validate({"cluster": "lab", "nodes": [nodes]}).to_objects())
    await admin.add_fault(NODE_LISTS, {"delay": args.page_seconds}, count=-1)
    since = datetime.now(UTC)
    started = time.monotonic()
    pool_starts = polls(pool) - 1  # worker starts before this run's first kill
    entity = await start_entity(client, pool.task_queue, args.budget)
    requesters = [
        await start_requester(client, pool.task_queue, f"node-{i:03d}") for i in range(1, args.requesters + 1)
    ]
    waiting = asyncio.gather(*(h.result() for h in requesters), return_exceptions=True)
    kills, stuck = 0, False
    deadline = started + args.run_timeout
    while not waiting.done() and not stuck and time.monotonic() < deadline:
        if kills < args.kills and polls(pool) > pool_starts:
            # The worker started after the last kill polls: kill it at a random moment of what it runs now.
            await asyncio.wait({waiting}, timeout=rng.uniform(args.kill_min, args.kill_max))
            if waiting.done():
                break
            pool.kill_and_restart()
            kills += 1
            pool_starts += 1
        else:
            await asyncio.wait({waiting}, timeout=1)
        # A failed task fails every attempt from then on: nobody gets a lease, the run would only time out.
        stuck = bool(failed_for_nondeterminism(await entity.fetch_history()))
    finished = waiting.done() and not any(isinstance(r, BaseException) for r in waiting.result())
    waiting.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await waiting
    for handle in [entity, *requesters]:
        with contextlib.suppress(RPCError):  # closed already
            await handle.terminate("chaos run over")
    await admin.clear_faults()
    histories = await histories_since(client, since)
    replayed = await replay(histories)
    causes: Counter[str] = Counter()  # failed workflow tasks by cause, the bench's own terminations left out
    timed_out = 0  # workflow tasks timed out: the chaos reached the workflows (kills, reads past the task timeout)
    for history in histories:
        for event in history.events:
            timed_out += event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT
            if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED:
                cause = event.workflow_task_failed_event_attributes.cause
                name = WorkflowTaskFailedCause.Name(cause).removeprefix("WORKFLOW_TASK_FAILED_CAUSE_")
                if name != TERMINATED_MID_TASK:
                    causes[name] += 1
    if args.save and replayed.failing:
        replayed.save(args.save / f"run{n:02d}")
    result = {"run": n, "seconds": time.monotonic() - started, "kills": kills, "finished": finished, "stuck": stuck,
              "histories": len(histories), "failed_tasks": sum(causes.values()),
              "causes": causes, "timed_out": timed_out, "nondeterminism": len(replayed.failing)}  # fmt: skip
    print(f"run {n}: {result['seconds']:.0f}s, {kills} kills, requesters "
          f"{'finished' if finished else 'did NOT finish'}{' (the entity stuck)' if stuck else ''}, "
          f"{len(histories)} runs replayed, {timed_out} workflow "
          f"tasks timed out, "
          f"{result['failed_tasks']} failed workflow tasks {dict(causes) or ''}, "
          f"{len(replayed.failing)} runs failing replay or failed for nondeterminism", flush=True)  # fmt: skip
    for line in replayed.failures:
        print(f"  {line[:400]}", flush=True)
    return result


def polls(pool: Workers) -> int:
    """How many times the worker has started polling (restarts append to its log)."""
    return pool.logs[0].read_text(errors="replace").count("polling task queue")


async def start_entity(client: Client, task_queue: str, budget: int) -> WorkflowHandle:
    inp = DisruptionBudgetInput(cluster="lab", budget=Budget(count=budget), check_interval=timedelta(seconds=1),
                                liveness_interval=timedelta(seconds=5), task_queue=task_queue)  # fmt: skip
    return await client.start_workflow(DisruptionBudget.run, inp, id=inp.workflow_id(), task_queue=task_queue)


async def start_requester(client: Client, task_queue: str, node: str) -> WorkflowHandle:
    inp = NodeMaintenanceInput(cluster="lab", node=node, reason="budget chaos", uncordon_after=True,
                               drain={"eviction_retry_interval": 0.5, "timeout": 60})  # fmt: skip
    return await client.start_workflow(NodeMaintenance.run, inp, id=f"{inp.workflow_id()}/{uuid.uuid4().hex[:6]}",
                                       task_queue=task_queue)  # fmt: skip


async def main(args: argparse.Namespace) -> None:
    rng = random.Random(args.seed)
    started = time.monotonic()
    with EmulatorProcess(pod_start_seconds=0.1, grace_scale=0.01) as emulator, \
            tempfile.TemporaryDirectory(prefix="millwright-bench-") as tmp:  # fmt: skip
        admin = EmulatorAdmin(emulator.url)
        path = Path(tmp) / "kubeconfig"
        path.write_text(yaml.safe_dump(kubeconfig(emulator.url, "lab")))
        async with DevServer() as server:
            pool = Workers(1, server.address, f"chaos-{uuid.uuid4().hex[:6]}", str(path), Path(tmp))
            try:
                await pool.polling(server.client)
                results = [await one_run(n, args, rng, server.client, admin, pool) for n in range(1, args.runs + 1)]
            finally:
                pool.stop()
        await admin.aclose()
    seconds = time.monotonic() - started
    causes: Counter[str] = sum((r["causes"] for r in results), Counter())
    with_failures = sum(1 for r in results if r["failed_tasks"] or r["nondeterminism"])
    nondeterminism = sum(r["nondeterminism"] for r in results)
    stuck = sum(1 for r in results if r["stuck"])
    unfinished = sum(1 for r in results if not r["finished"])
    print(f"\n{len(results)} runs in {seconds:.0f}s ({seconds / len(results):.0f}s a run), "
          f"{sum(r['kills'] for r in results)} worker kills, {sum(r['timed_out'] for r in results)} workflow tasks "
          f"timed out, each page of a cluster read held {args.page_seconds}s")  # fmt: skip
    print(f"runs with a failed workflow task or a history that fails replay: {with_failures} of {len(results)} "
          f"({with_failures / len(results):.0%}); failed workflow tasks by cause: {dict(causes) or 'none'}")  # fmt: skip
    print(f"runs={len(results)} failed_runs={with_failures} failed_tasks={sum(causes.values())} "
          f"nondeterminism={nondeterminism} stuck={stuck} unfinished={unfinished} seconds={seconds:.0f}")  # fmt: skip


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=20, help="consecutive runs")
    parser.add_argument("--requesters", type=int, default=8, help="NodeMaintenance runs, one node each")
    parser.add_argument("--nodes", type=int, default=600, help="nodes in the cluster (at least --requesters)")
    parser.add_argument("--budget", type=int, default=4, help="nodes allowed out of service at once")
    parser.add_argument("--page-seconds", type=float, default=6.0, help="how long each page of a read is held")
    parser.add_argument("--kills", type=int, default=3, help="worker kills a run")
    parser.add_argument("--kill-min", type=float, default=1.0, help="a kill comes this long after the worker polls")
    parser.add_argument("--kill-max", type=float, default=14.0, help="or as late as this (a read lasts 12 s)")
    parser.add_argument("--run-timeout", type=float, default=300.0, help="a run's requesters get this long")
    parser.add_argument("--seed", type=int, default=22, help="the random kill moments")
    parser.add_argument("--save", type=Path, help="write the histories that fail replay here")
    args = parser.parse_args()
    if args.nodes < args.requesters:
        parser.error("--nodes must be at least --requesters")
    asyncio.run(main(args))
