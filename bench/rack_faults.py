"""Domain-wide NVLink faults on NVL72 racks, remediated node by node and whole, side by side in one run:

    python -m bench.remediation --racks 8 --domain-faults 2

Each mode gets a fresh lab: the Kubernetes emulator seeded with `--racks` GB200 NVL72 racks of 18 trays and their
KAI gangs (lab/nvl72.py), a BMC per compute tray and per NVLink switch tray (lab/bmc_trays.py, one Redfish port
each), the rack fabric (lab/rack_fabric.py: a fault takes the clique label off every node of the rack and makes each
GpuHealthy=False until every tray of the rack has been power-cycled), a fresh dev server and a worker process with
the event path on (the node watch), the cluster's budget set to `--budget-racks` racks of nodes and as many NVLink
domains. `--domain-faults` racks fault at random moments within `--spread` seconds.

- **node by node**: escalation off, as before issue 40: a NodeRemediation per node, each power-cycling its own tray.
- **whole**: escalation on: one RackRemediation per faulted rack (the power sequence through every tray, switch
  trays included, the domain check Job, the nodes back together).

Prints, for each mode, measured from the emulator's audit and the fabric's history: fault-to-whole-domain-cordon
(the moment the last node of the domain was cordoned, from the fault; p50, p95, max over the faulted domains), power
cycles per node of a faulted domain (goal: 1), nodes back in service and quarantined once the runs ended, the runs
started, fault-to-domain-back-in-service. The lower bound of the cordon latency is the event path's hold (`HOLD`: a
fault is acted on only once it has lasted that long), so its ratio is p95 / hold; that of the power cycles is one
per tray; a cordon ratio under 1.00 is a bench error (`ideal_error=1`, exit status 1). The last line is
machine-readable. Not a test: nothing here asserts a timing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from bench.common import Workers, dev_server, ideal_error
from bench.remediation import HOLD, percentile, watch_listed
from lab.k8s.admin import EmulatorAdmin, kubeconfig
from lab.k8s.process import EmulatorProcess
from lab.loopback import free_port
from lab.nvl72 import Nvl72Fleet, nvl72_objects
from lab.rack_fabric import RackFabric
from lab.redfish import BmcAdmin, LabBmcs
from starter.controls import budget_set

USER, PASSWORD = "admin", f"bench-{uuid.uuid4().hex[:12]}"
SETTLE = 600.0  # seconds the runs may take to end after the last fault


def event_settings(path: Path, bmcs: LabBmcs, fleet: Nvl72Fleet, whole: bool) -> Path:
    """The event path's settings: a short hold, the node object's checks, runs that end fast, every tray's BMC."""
    layout = fleet.layout()
    path.write_text(json.dumps({
        "hold": HOLD, "checks": {"host_agent": False, "bmc": False},
        "min_healthy": {"percent": 1},
        "bmcs": {n: {"url": bmcs.bmc_urls[n]} for ns in layout.values() for n in ns},
        "remediation": {"steps": ["power-cycle"], "agent_timeout": 2, "settle_timeout": 20, "settle_poll_interval": 1,
                        "reboot_timeout": 120, "burn_in_seconds": 1, "breaker": {"max_percent": 100},
                        "drain": {"eviction_retry_interval": 0.5, "timeout": 60}},
        "escalation": {"enabled": whole, "switch_trays": {r: [{"url": bmcs.bmc_urls[t]}
                                                              for t in fleet.switch_tray_names(r)] for r in layout},
                       "rack": {"drain": {"eviction_retry_interval": 0.5, "timeout": 60}, "ready_timeout": 120,
                                "fabric_timeout": 60, "domain_check": {"image": "registry.local/nccl-tests",
                                                                       "version": "2.21", "timeout": 120}}},
    }))  # fmt: skip
    return path


async def run_mode(args: argparse.Namespace, whole: bool) -> dict[str, Any]:
    fleet = Nvl72Fleet(cluster="lab", racks=args.racks, seed=args.seed)
    rng = random.Random(args.seed)
    faulted = rng.sample(fleet.rack_names(), args.domain_faults)
    layout = fleet.layout()
    port = free_port()
    os.environ["BENCH_BMC_CREDENTIALS"] = f"{USER}:{PASSWORD}"
    with tempfile.TemporaryDirectory(prefix="millwright-bench-") as tmp, \
            EmulatorProcess(pod_start_seconds=0.05, grace_scale=0.01, startup_timeout=60) as emulator, \
            LabBmcs(servers=fleet.bmc_specs(), user=USER, password=PASSWORD, power_delay=args.power_delay) as bmcs:  # fmt: skip
        admin = EmulatorAdmin(emulator.url)
        await admin.seed(nvl72_objects(racks=args.racks, seed=args.seed, cluster="lab").objects)
        await admin.configure(jobs={"defaultSeconds": 2.0, "rules": []})
        kube = Path(tmp, "kubeconfig")
        kube.write_text(yaml.safe_dump(kubeconfig(emulator.url, "lab")))
        from kubernetes.aio import client as k8s_client
        from kubernetes.aio import config as k8s_config

        api = await k8s_config.new_client_from_config(str(kube), context="lab")
        async with await dev_server() as server, BmcAdmin(bmcs.url) as bmc_admin, aiohttp.ClientSession() as http:
            fabric = RackFabric(k8s_client.CoreV1Api(api), bmc_admin, fleet)
            await fabric.start()
            queue = f"bench-{uuid.uuid4().hex[:6]}"
            workers = Workers(1, server.address, queue, str(kube), Path(tmp), fault_events="true",
                              fault_events_clusters='["lab"]', fault_events_token="env:BENCH_ALERTMANAGER_TOKEN",
                              fault_events_port=str(port), fault_events_host="127.0.0.1",
                              bmc_credentials="env:BENCH_BMC_CREDENTIALS",
                              fault_events_settings=str(event_settings(Path(tmp, "events.json"), bmcs, fleet, whole)))  # fmt: skip
            try:
                async with fabric.power_link(poll_interval=0.1):
                    await workers.polling(server.client)
                    await budget_set(server.client, "lab", count=18 * args.budget_racks,
                                     nvlink_domains=args.budget_racks, by="bench", reason="racks at a time",
                                     task_queue=queue)  # fmt: skip
                    receiver = f"http://127.0.0.1:{port}"
                    await watch_listed(http, receiver, args.racks * 18)

                    async def inject(rack: str) -> None:
                        await asyncio.sleep(rng.uniform(0, args.spread))
                        await fabric.fault(rack, origin=rng.choice(layout[rack]))

                    await asyncio.gather(*(inject(r) for r in faulted))
                    ended = await runs_ended(server.client, whole)
                    async with http.get(f"{receiver}/events",
                                        headers={"Authorization": f"Bearer {os.environ['BENCH_ALERTMANAGER_TOKEN']}"}) as resp:  # fmt: skip
                        report = await resp.json()
                    writes = await admin.audit(writes=True)
                    histories = {r: fabric.history(r) for r in faulted}
            finally:
                workers.stop()
                await admin.aclose()
                await api.close()
    return measured(faulted, layout, writes, histories, report, ended)


async def runs_ended(client: Any, whole: bool) -> dict[str, str]:
    """Wait (up to SETTLE) until the runs of the faulted domains have ended: workflow ID -> its status."""
    query = "WorkflowType = 'RackRemediation'" if whole else "WorkflowType = 'NodeRemediation'"
    deadline = time.monotonic() + SETTLE
    await asyncio.sleep(HOLD + 2)
    while True:
        runs = {e.id: e.status.name async for e in client.list_workflows(query)}
        if (runs and all(s != "RUNNING" for s in runs.values())) or time.monotonic() > deadline:
            return runs
        if not runs and time.monotonic() > deadline - SETTLE + 60:  # nothing started within a minute
            return runs
        await asyncio.sleep(1.0)


def measured(faulted: list[str], layout: dict[str, list[str]], writes: list[dict], histories: dict[str, Any],
             report: dict, ended: dict[str, str]) -> dict[str, Any]:  # fmt: skip
    cordon_s, back_s, cycles, returned, quarantined = [], [], [], 0, 0
    for rack in faulted:
        nodes, h = set(layout[rack]), histories[rack]
        first: dict[str, float] = {}
        last_back: dict[str, float] = {}
        state: dict[str, dict] = {}
        for e in writes:
            if e.get("resource") != "nodes" or e.get("name") not in nodes or "nodeAfter" not in e:
                continue
            after = e["nodeAfter"]
            if after["unschedulable"]:
                first.setdefault(e["name"], e["time"])
            elif e["name"] in first:
                last_back[e["name"]] = e["time"]
            state[e["name"]] = after
        cordon_s.append(max(first.values()) - h.faulted_at if len(first) == len(nodes) else float("inf"))
        back = [n for n in nodes if not state.get(n, {}).get("unschedulable", False) and n in last_back]
        returned += len(back)
        quarantined += len(nodes) - len(back)
        back_s.append(max(last_back[n] for n in back) - h.faulted_at if len(back) == len(nodes) else float("inf"))
        ons = [p.tray for p in h.power if p.power == "On" and p.tray in nodes]
        cycles += [ons.count(n) for n in nodes]
    return {"cordon": cordon_s, "back": back_s, "cycles": cycles, "returned": returned, "quarantined": quarantined,
            "counts": report["counts"], "runs": len(ended), "ended": sorted(set(ended.values()))}  # fmt: skip


def line(name: str, m: dict[str, Any], nodes: int) -> str:
    c = m["cordon"]
    return (f"{name}: whole domain cordoned after p50 {percentile(c, 50):.2f}s p95 {percentile(c, 95):.2f}s max "
            f"{max(c):.2f}s; power cycles per node mean {sum(m['cycles']) / len(m['cycles']):.2f} max "
            f"{max(m['cycles'])}; back in service {m['returned']} of {nodes}, left out {m['quarantined']}; domain "
            f"back after max {max(m['back']):.1f}s; runs {m['runs']} ({', '.join(m['ended'])}); event outcomes "
            f"{m['counts']}")  # fmt: skip


async def main(args: argparse.Namespace) -> int:
    """Runs both modes and prints their figures; 1 when the cordon's lower bound was beaten (`ideal_error`)."""
    os.environ["BENCH_ALERTMANAGER_TOKEN"] = uuid.uuid4().hex
    nodes = args.domain_faults * 18
    print(f"Domain-wide NVLink faults: {args.racks} NVL72 racks ({args.racks * 18} nodes, {args.racks * 27} BMCs), "
          f"{args.domain_faults} racks faulted within {args.spread:.0f}s, hold {HOLD:.0f}s, budget "
          f"{args.budget_racks} racks ({18 * args.budget_racks} nodes, {args.budget_racks} NVLink domains)")  # fmt: skip
    node_by_node = await run_mode(args, whole=False)
    print(line("node by node", node_by_node, nodes))
    whole = await run_mode(args, whole=True)
    print(line("whole", whole, nodes))
    p95 = percentile(whole["cordon"], 95)
    cycles = sum(whole["cycles"]) / len(whole["cycles"])
    print(f"ratios to the lower bound: whole-domain cordon p95 / hold {p95 / HOLD:.2f}; power cycles per node / 1 "
          f"{cycles:.2f} (node by node: {percentile(node_by_node['cordon'], 95) / HOLD:.2f}, "
          f"{sum(node_by_node['cycles']) / len(node_by_node['cycles']):.2f})")  # fmt: skip
    error = ideal_error(p95 / HOLD, "whole-domain cordon p95")
    print(f"racks={args.racks} domain_faults={args.domain_faults} cordon_p95_s={p95:.2f} hold_s={HOLD:.1f} "
          f"cordon_ratio={p95 / HOLD:.2f} power_cycles_per_node={cycles:.2f} max_power_cycles={max(whole['cycles'])} "
          f"returned={whole['returned']}/{nodes} baseline_returned={node_by_node['returned']}/{nodes} "
          f"baseline_cordon_p95_s={percentile(node_by_node['cordon'], 95):.2f} "
          f"baseline_power_cycles_per_node={sum(node_by_node['cycles']) / len(node_by_node['cycles']):.2f} "
          f"ideal_error={error}")  # fmt: skip
    return error
