"""Fleet-wide sweep benchmark: the history a FleetHealthSweep (or a FabricAudit) costs, per run and per node, at scale.

    python -m bench.sweep --nodes 2000
    python -m bench.sweep --nodes 10000                      # the 10,000-node check: no run over 10,240 events
    python -m bench.sweep --nodes 2000 --bmcs                # also each node's BMC health (the lab's BMCs)
    python -m bench.sweep --nodes 10000 --no-agents          # no GPU checks: nodes' conditions (and BMCs) only
    python -m bench.sweep --fabric-ports 4000 --tenants 100  # a FabricAudit over a fabric of 4,000 ports instead

Sweep: seeds the Kubernetes emulator with N GPU nodes, every `--unhealthy-every`-th with a Node Problem Detector
condition and every `--not-ready-every`-th NotReady for long, and runs one FleetHealthSweep (dry run: it decides,
starts nothing) against a fresh dev server: node names listed page by page, slices of `--slice-size` nodes, each
node's GPU check sent to its host agent's queue, where no agent runs (each one unknown after `--agent-timeout`,
the cost of a fleet without agents; each check goes to its node's own task queue, which the dev server creates:
thousands of queues, its largest cost at scale; `--no-agents` leaves the checks out), and with `--bmcs` each node's
BMC read through the lab's Redfish BMCs.

Audit: seeds the UFM emulator with a fabric of P host ports (8 a host), gives them to T tenants (one PKey each) in
the Fabric entity's desired state, drops one member from every tenth PKey in UFM, and runs one FabricAudit.

Prints, measured in this run: the wall time, the runs and their largest history, events per node (all runs, the
children included), what the run found (checked against what was seeded) and the CPU seconds of each process; the
machine's load (`uptime`) before and after, since the machine may be shared. The last line is machine-readable.
Not a test: nothing here asserts a timing.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
import uuid
from pathlib import Path

import yaml

from bench.common import dev_server, history_lengths, resources
from lab.fleet import Fleet, InfiniBandSpec, NodeGenerator
from lab.k8s.admin import EmulatorAdmin, kubeconfig
from lab.k8s.process import EmulatorProcess
from lab.loopback import write_secret_file
from worker import registry
from worker.config import WorkerSettings

OLD = "2026-01-01T00:00:00Z"  # long before now: NotReady past any grace
SICK = {"type": "KernelDeadlock", "status": "True", "reason": "DockerHung", "message": "task docker blocked",
        "lastHeartbeatTime": OLD, "lastTransitionTime": OLD}  # fmt: skip


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} {five:.2f} {fifteen:.2f}"


def seeded_nodes(nodes: int, unhealthy_every: int, not_ready_every: int) -> tuple[list[dict], set[str]]:
    """The node objects, and the names of those that are not healthy."""
    fleet = Fleet(cluster="lab", nodes=[NodeGenerator(prefix="gpu-", count=nodes, digits=5)])
    objects, unhealthy = fleet.to_objects(), set()
    for i, obj in enumerate(o for o in objects if o["kind"] == "Node"):
        name, conditions = obj["metadata"]["name"], obj["status"]["conditions"]
        if unhealthy_every and i % unhealthy_every == unhealthy_every - 1:
            conditions.append(dict(SICK))
            unhealthy.add(name)
        if not_ready_every and i % not_ready_every == not_ready_every // 2:
            ready = next(c for c in conditions if c["type"] == "Ready")
            ready.update(status="False", reason="KubeletNotReady", lastTransitionTime=OLD)
            unhealthy.add(name)
    return objects, unhealthy


async def sweep(args: argparse.Namespace, settings: dict, bmcs: dict[str, str]) -> dict:
    from workflows.remediation.health_sweep import FleetHealthSweep
    from workflows.remediation.sweep_models import FleetHealthSweepInput

    with tempfile.TemporaryDirectory(prefix="millwright-bench-") as tmp, \
            EmulatorProcess(pod_start_seconds=0.05, grace_scale=0.01, startup_timeout=60) as emulator:  # fmt: skip
        admin = EmulatorAdmin(emulator.url)
        objects, unhealthy = seeded_nodes(args.nodes, args.unhealthy_every, args.not_ready_every)
        await admin.seed(objects)
        await admin.aclose()
        kube = Path(tmp, "kubeconfig")
        kube.write_text(yaml.safe_dump(kubeconfig(emulator.url, "lab")))
        inp = FleetHealthSweepInput(
            clusters=["lab"], agent_timeout=args.agent_timeout, concurrency=args.concurrency,
            slice_size=args.slice_size, slices_at_once=args.slices_at_once, dry_run=True,
            checks={"bmc": bool(bmcs), "host_agent": not args.no_agents}, bmcs={n: {"url": u} for n, u in bmcs.items()},
        )  # fmt: skip
        wid = f"{inp.workflow_id()}/bench-{uuid.uuid4().hex[:6]}"
        result, wall, lengths, used = await run_one(settings | {"kubeconfig": str(kube)}, FleetHealthSweep.run, inp,
                                                    wid, started_by=wid)  # fmt: skip
    (c,) = result.clusters
    found = {d.node for d in c.unhealthy}
    return {
        "nodes": args.nodes, "wall": wall, "lengths": lengths, "used": used,
        "found": f"swept {c.healthy + c.not_healthy} of {c.nodes} nodes in {c.slices} slices: {c.healthy} healthy, "
                 f"{c.not_healthy} not ({len(unhealthy)} seeded; listed match: {found == unhealthy or 'partly'}), "
                 f"{c.agents_unavailable} without a host agent, {c.bmc_unknown} BMCs unknown, error: {c.error}",
        "extra": f"slices={c.slices} swept={c.healthy + c.not_healthy} unhealthy={c.not_healthy} "
                 f"seeded_unhealthy={len(unhealthy)}",
    }  # fmt: skip


async def audit(args: argparse.Namespace, settings: dict) -> dict:
    from lab.ufm import UfmAdmin, UfmStub, fleet_seed
    from workflows.fabric.audit import FabricAudit, FabricAuditInput
    from workflows.fabric.models import Allocation, FabricInput, FabricState

    per_host = 8
    hosts = max(1, args.fabric_ports // per_host)
    fleet = Fleet(cluster="lab", nodes=[NodeGenerator(prefix="gpu-", count=hosts, digits=5)],
                  infiniband=InfiniBandSpec(fabric="bench-ib", ports_per_host=per_host, switches=8))  # fmt: skip
    ports = fleet.ib_ports()
    names = sorted(ports)
    tenants = min(args.tenants, hosts)
    allocations, pkeys, dropped = {}, {}, 0
    for t in range(tenants):
        members = {g: h for h in names[t::tenants] for g in ports[h]}
        pkey = f"0x{0x100 + t:x}"
        allocations[f"t{t:04d}"] = Allocation(tenant=f"t{t:04d}", pkey=pkey, members=members, state="isolated")
        in_ufm = sorted(members)[1:] if t % 10 == 0 else sorted(members)  # every tenth PKey lost a member
        dropped += len(members) - len(in_ufm)
        pkeys[pkey] = {"guids": {g: "full" for g in in_ufm}}
    password = uuid.uuid4().hex
    with tempfile.TemporaryDirectory(prefix="millwright-bench-") as tmp, UfmStub(password=password) as ufm:
        admin = UfmAdmin(ufm.url)
        await admin.seed({**fleet_seed(fleet), "pkeys": pkeys})
        await admin.aclose()
        secret = write_secret_file(Path(tmp, "ufm"), f"admin:{password}")
        kube = Path(tmp, "kubeconfig")  # registry.build wants one; nothing here talks to Kubernetes
        kube.write_text(yaml.safe_dump(kubeconfig("http://127.0.0.1:9", "none")))
        fabric = f"bench-{uuid.uuid4().hex[:6]}"
        inp = FabricAuditInput(fabric=fabric, concurrency=args.concurrency)
        entity = FabricInput(fabric=fabric, state=FabricState(allocations=allocations))
        wid = f"{inp.workflow_id()}/bench"
        result, wall, lengths, used = await run_one(
            settings | {"kubeconfig": str(kube), "ufm_url": ufm.url, "ufm_credentials": f"file:{secret}"},
            FabricAudit.run, inp, wid, started_by=wid, entity=entity)  # fmt: skip
    return {
        "nodes": hosts, "wall": wall, "lengths": lengths, "used": used,
        "found": f"{len(result.checked_pkeys)} PKeys of {tenants} tenants over {hosts * per_host} ports: "
                 f"{result.drift_total} drift items ({dropped} seeded), by kind {result.drift_counts}",
        "extra": f"ports={hosts * per_host} tenants={tenants} drift={result.drift_total} seeded_drift={dropped} "
                 f"events_per_pkey={sum(lengths) / max(1, tenants):.1f}",
    }  # fmt: skip


async def run_one(settings: dict, run, inp, wid: str, *, started_by: str, entity=None):
    """One workflow on a fresh dev server and worker; its result, wall time, the history lengths of every run
    whose ID starts with `started_by` (its continued runs and its children), and CPU per process."""
    from workflows.fabric.fabric import Fabric

    async with await dev_server() as env:
        registration = registry.build(WorkerSettings(metrics_port=0, **settings))
        queue = f"bench-{uuid.uuid4().hex[:6]}"
        async with registry.new_worker(env.client, registration, queue, max_concurrent_activities=400):
            if entity is not None:
                await env.client.start_workflow(Fabric.run, entity, id=entity.workflow_id(), task_queue=queue)
            started = time.monotonic()
            result = await env.client.execute_workflow(run, inp, id=wid, task_queue=queue)
            wall = time.monotonic() - started
            used = resources()
        await registration.close()
        lengths = await history_lengths(env.client, started_by)
    return result, wall, lengths, used


async def main(args: argparse.Namespace) -> None:
    before = load()
    settings: dict = {}
    if args.fabric_ports:
        measured = await audit(args, settings)
        what = f"FabricAudit, concurrency {args.concurrency}"
    elif args.bmcs:
        from lab.redfish import LabBmcs

        password = uuid.uuid4().hex
        names = [f"gpu-{i:05d}" for i in range(1, args.nodes + 1)]
        with tempfile.TemporaryDirectory(prefix="millwright-bench-") as tmp, \
                LabBmcs(servers=names, user="admin", password=password, startup_timeout=600) as bmcs:  # fmt: skip
            secret = write_secret_file(Path(tmp, "bmc"), f"admin:{password}")
            settings["bmc_credentials"] = f"file:{secret}"
            measured = await sweep(args, settings, dict(bmcs.bmc_urls))
        what = "FleetHealthSweep with BMCs"
    else:
        measured = await sweep(args, settings, {})
        what = "FleetHealthSweep without BMCs"
    what += ", no GPU checks" if args.no_agents and not args.fabric_ports else ""
    lengths, nodes = measured["lengths"], measured["nodes"]
    if not args.fabric_ports:
        what += (f", slices of {args.slice_size}, {args.slices_at_once} at once, concurrency {args.concurrency}, "
                 f"agent timeout {args.agent_timeout}s")  # fmt: skip
    print(f"{what}: {nodes} nodes, wall {measured['wall']:.1f}s")
    print(measured["found"])
    print(f"runs={len(lengths)} total_events={sum(lengths)} largest_run={max(lengths)} "
          f"runs_over_10240={sum(n > 10240 for n in lengths)}")  # fmt: skip
    print("CPU s / peak RSS MiB: " + ", ".join(f"{k} {cpu:.0f}/{rss}" for k, (cpu, rss) in measured["used"].items()))
    print(f"load (1/5/15 min) before {before}, after {load()}; {os.cpu_count()} CPUs")
    print(f"nodes={nodes} runs={len(lengths)} max_run_events={max(lengths)} events_per_node={sum(lengths) / nodes:.2f} "
          f"wall_s={measured['wall']:.1f} {measured['extra']} load1={os.getloadavg()[0]:.2f}")  # fmt: skip


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=2000)
    parser.add_argument("--unhealthy-every", type=int, default=20, help="every Nth node has KernelDeadlock")
    parser.add_argument("--not-ready-every", type=int, default=50, help="every Nth node is NotReady for long")
    parser.add_argument("--slice-size", type=int, default=250)
    parser.add_argument("--slices-at-once", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=20, help="nodes probed (PKeys read, with --fabric-ports) "
                                                                    "at once")  # fmt: skip
    parser.add_argument("--agent-timeout", type=float, default=1.0)
    parser.add_argument("--bmcs", action="store_true", help="run the lab's BMCs and read each node's health")
    parser.add_argument("--no-agents", action="store_true", help="no GPU checks (checks.host_agent false)")
    parser.add_argument("--fabric-ports", type=int, default=0, help="audit a fabric of this many ports instead")
    parser.add_argument("--tenants", type=int, default=100)
    asyncio.run(main(parser.parse_args()))
