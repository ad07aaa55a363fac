"""Event-path remediation benchmark: how soon a fault is acted on, and what the node watch costs while nothing happens.

    python -m bench.remediation --nodes 100
    python -m bench.remediation --nodes 1000 --faults 30
    python -m bench.remediation --racks 8 --domain-faults 2    (NVL72 racks: bench/rack_faults.py)

Seeds the Kubernetes emulator with N GPU nodes (one labelled `millwright.dev/remediation=false`), runs a worker
process as deploy/ runs it, with the event path on (MILLWRIGHT_FAULT_EVENTS: the node watch and the Alertmanager
receiver), against a fresh dev server. It measures the worker's CPU over an idle window (`--idle` seconds, no
fault, each node posting one status report as a kubelet does every 5 minutes: one watch event per node, plus
the watch's bookmarks and the worker's polls), then injects `--faults` faults at random moments within
`--spread` seconds, in turn a node going NotReady, a Node Problem Detector condition (KernelDeadlock) and an XID 79
alert posted to the receiver as Alertmanager posts it; and one alert for the opted-out node.

Prints, measured in this run: fault-to-cordon latency (p50, p95, max) from the emulator's audit log (the first
write that left the node unschedulable, against the moment the bench wrote the fault or posted the alert), what
became of each fault, the most nodes cordoned at once against the cluster's disruption budget, the opted-out
alert's answer, the worker's idle CPU per node status report, each process's CPU, and the load average before and after;
and the cordon's lower bound, read back from the settings the worker reads (`FaultEventSettings`): a fault the watch
sees is acted on only once it has lasted the hold, so its fault-to-cordon p95 over the hold is `cordon_ratio` (under
1.00 the bound was beaten: a bench error, `ideal_error=1` and exit status 1); an alert's only bound is `alert_hold`
(none by default), so alerts have no ratio. The last line is machine-readable. Not a test: nothing here asserts a
timing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import aiohttp
import yaml

from bench.common import Workers, cpu_seconds, dev_server, ideal_error
from bench.sweep import load
from lab.fleet import Fleet, NodeGenerator
from lab.k8s.admin import EmulatorAdmin, kubeconfig
from lab.k8s.process import EmulatorProcess
from lab.loopback import free_port
from worker.fault_events import FaultEventSettings
from workflows.remediation.policy import OPT_OUT_LABEL

KINDS = ("NotReady", "KernelDeadlock", "alert XID 79")
WATCHED = KINDS[:2]  # the faults the node watch sees (held `hold`); the last is an alert (held `alert_hold`)
HOLD = 2.0  # seconds: the event path's hold in this run


def settings_file(path: Path, breaker_percent: int) -> Path:
    """The event path's settings: a short hold, the node object's checks, remediations that end fast (no host
    agents or BMCs in this lab: each one ends quarantined after its first step) under this circuit breaker."""
    path.write_text(json.dumps({
        "hold": HOLD, "checks": {"host_agent": False, "bmc": False},
        "remediation": {"steps": ["restart-gpu-services"], "agent_timeout": 2, "settle_timeout": 2,
                        "breaker": {"max_percent": breaker_percent},
                        "settle_poll_interval": 0.5, "drain": {"eviction_retry_interval": 0.5, "timeout": 30},
                        "burn_in_seconds": 1},
    }))  # fmt: skip
    return path


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(p / 100 * len(ordered)) - 1))]


async def kubelet_reports(core_url: str, names: list[str], seconds: float, http: aiohttp.ClientSession) -> None:
    """Each node's status report once, spread over `seconds`, as kubelets post them (Ready, a new heartbeat: a
    watch event for every node and nothing to act on); the watch's cost while the fleet is healthy."""
    started = time.monotonic()
    for i, node in enumerate(names):
        await asyncio.sleep(max(0.0, started + seconds * i / len(names) - time.monotonic()))
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {"status": {"conditions": [{"type": "Ready", "status": "True", "lastHeartbeatTime": now}]}}
        async with http.patch(f"{core_url}/api/v1/nodes/{node}/status", json=body,
                              headers={"Content-Type": "application/strategic-merge-patch+json"}) as resp:  # fmt: skip
            resp.raise_for_status()
    await asyncio.sleep(max(0.0, started + seconds - time.monotonic()))


async def set_condition(core_url: str, node: str, ctype: str, status: str, http: aiohttp.ClientSession) -> None:
    """A node condition written as a kubelet or Node Problem Detector writes it (strategic merge by type)."""
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    body = {"status": {"conditions": [{"type": ctype, "status": status, "reason": "Bench", "message": "bench fault",
                                       "lastTransitionTime": now, "lastHeartbeatTime": now}]}}  # fmt: skip
    async with http.patch(f"{core_url}/api/v1/nodes/{node}/status", json=body,
                          headers={"Content-Type": "application/strategic-merge-patch+json"}) as resp:  # fmt: skip
        resp.raise_for_status()


def alert_payload(node: str) -> dict:
    alert = {"status": "firing", "labels": {"alertname": "GpuXid", "Hostname": node, "xid": "79", "cluster": "lab"},
             "annotations": {"summary": "XID 79: GPU fell off the bus"}, "startsAt": "2026-12-01T00:00:00Z",
             "endsAt": "0001-01-01T00:00:00Z", "generatorURL": "", "fingerprint": uuid.uuid4().hex[:16]}  # fmt: skip
    return {"version": "4", "groupKey": "{}:{alertname=\"GpuXid\"}", "truncatedAlerts": 0, "status": "firing",
            "receiver": "millwright", "groupLabels": {}, "commonLabels": {}, "commonAnnotations": {},
            "externalURL": "http://alertmanager", "alerts": [alert]}  # fmt: skip


async def main(args: argparse.Namespace) -> int:
    """Runs the bench and prints its figures; 1 when the cordon's lower bound was beaten (`ideal_error`), else 0."""
    before = load()
    rng = random.Random(args.seed)
    token = uuid.uuid4().hex
    os.environ["BENCH_ALERTMANAGER_TOKEN"] = token
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="millwright-bench-") as tmp, \
            EmulatorProcess(pod_start_seconds=0.05, grace_scale=0.01, startup_timeout=60) as emulator:  # fmt: skip
        fleet = Fleet(cluster="lab", nodes=[NodeGenerator(prefix="gpu-", count=args.nodes, digits=5)])
        objects = fleet.to_objects()
        names = [o["metadata"]["name"] for o in objects if o["kind"] == "Node"]
        opted_out = names[-1]
        next(o for o in objects if o["metadata"]["name"] == opted_out)["metadata"]["labels"][OPT_OUT_LABEL] = "false"
        admin = EmulatorAdmin(emulator.url)
        await admin.seed(objects)
        kube = Path(tmp, "kubeconfig")
        kube.write_text(yaml.safe_dump(kubeconfig(emulator.url, "lab")))
        settings = settings_file(Path(tmp, "events.json"), args.breaker_percent)
        held = FaultEventSettings.model_validate_json(settings.read_text())  # as the worker reads it
        async with await dev_server() as server, aiohttp.ClientSession() as http:
            workers = Workers(1, server.address, f"bench-{uuid.uuid4().hex[:6]}", str(kube), Path(tmp),
                              fault_events="true", fault_events_clusters='["lab"]',
                              fault_events_token="env:BENCH_ALERTMANAGER_TOKEN", fault_events_port=str(port),
                              fault_events_host="127.0.0.1",
                              fault_events_settings=str(settings))  # fmt: skip
            try:
                await workers.polling(server.client)
                receiver = f"http://127.0.0.1:{port}"
                listed = await watch_listed(http, receiver, args.nodes)
                cpu_idle_start, idle_start = workers.cpu_seconds(), time.monotonic()
                await kubelet_reports(emulator.url, names, args.idle, http)
                idle_cpu = workers.cpu_seconds() - cpu_idle_start
                idle_s = time.monotonic() - idle_start
                auth = {"Authorization": f"Bearer {token}"}
                victims = rng.sample(names[:-1], args.faults)
                injected: dict[str, tuple[str, float]] = {}

                async def inject(i: int, node: str) -> None:
                    await asyncio.sleep(rng.uniform(0, args.spread))
                    kind = KINDS[i % len(KINDS)]
                    injected[node] = (kind, time.time())
                    if kind == "NotReady":
                        await set_condition(emulator.url, node, "Ready", "False", http)
                    elif kind == "KernelDeadlock":
                        await set_condition(emulator.url, node, "KernelDeadlock", "True", http)
                    else:
                        async with http.post(f"{receiver}/alerts", json=alert_payload(node), headers=auth) as resp:
                            await resp.read()

                await asyncio.gather(*(inject(i, n) for i, n in enumerate(victims)))
                async with http.post(f"{receiver}/alerts", json=alert_payload(opted_out), headers=auth) as resp:
                    opted = (await resp.json())["outcomes"][0]
                cordoned = await wait_cordoned(
                    admin, set(victims), args.settle, args.nodes * args.breaker_percent // 100
                )
                async with http.get(f"{receiver}/events", headers=auth) as resp:
                    report = await resp.json()
                writes = await admin.audit(writes=True)
                used = {"worker": workers.cpu_seconds(), "dev server": cpu_seconds(server.pid),
                        "emulator": cpu_seconds(emulator.pid or 0)}  # fmt: skip
            finally:
                workers.stop()
                await admin.aclose()
    latencies = {n: cordoned[n] - injected[n][1] for n in cordoned}
    by_kind = {k: [latencies[n] for n in latencies if injected[n][0] == k] for k in KINDS}
    most_out = most_cordoned_at_once(writes)
    budget = max(1, args.nodes // 10)  # the cluster's default budget: 10 % of its nodes
    breaker_limit = args.nodes * args.breaker_percent // 100  # nodes remediation may take before the breaker trips
    values = list(latencies.values()) or [float("nan")]
    p50, p95, worst = percentile(values, 50), percentile(values, 95), max(values)
    watched = [latencies[n] for n in latencies if injected[n][0] in WATCHED]
    hold = held.hold.total_seconds()
    watched_p95, ratio, error = cordon_bound(watched, hold)
    report_ms = 1000 * idle_cpu / args.nodes  # the worker's CPU per node status report (one watch event)
    print(f"Event-path remediation: {args.nodes} nodes ({listed} listed by the watch), {args.faults} faults within "
          f"{args.spread:.0f}s, hold {HOLD:.0f}s")  # fmt: skip
    print(
        f"fault-to-cordon (s): p50 {p50:.2f} p95 {p95:.2f} max {worst:.2f}; cordoned {len(cordoned)} of "
        f"{args.faults}; by kind " + ", ".join(f"{k} {max(v):.2f} max of {len(v)}" for k, v in by_kind.items() if v)
    )
    print(
        f"outcomes {report['counts']}; most nodes cordoned at once {most_out} (budget {budget}); nodes "
        f"remediation cordoned {len(cordoned)} (the breaker at {args.breaker_percent}% lets it take {breaker_limit})"
    )
    print(f"lower bound: the hold {hold:.2f}s for the watch's faults ({', '.join(WATCHED)}): p95 {watched_p95:.2f}s "
          f"/ {hold:.2f}s = {ratio:.2f}; an alert's is its alert_hold ({held.alert_hold.total_seconds():.2f}s): no "
          f"ratio")  # fmt: skip
    print(f"opted-out {opted_out}: {opted['status']} ({opted['detail']})")
    print(f"worker CPU while idle: {1000 * idle_cpu:.0f} ms over {idle_s:.0f}s in which each of the {args.nodes} nodes "
          f"posted one status report = {report_ms:.3f} ms per node per report; a kubelet reports every 5 minutes "
          f"when nothing changes: {report_ms / 5:.4f} ms per idle node per minute")  # fmt: skip
    print("CPU s: " + ", ".join(f"{k} {v:.1f}" for k, v in used.items()))
    print(f"load (1/5/15 min) before {before}, after {load()}; {os.cpu_count()} CPUs")
    print(f"nodes={args.nodes} faults={args.faults} cordoned={len(cordoned)} p50_s={p50:.2f} p95_s={p95:.2f} "
          f"max_s={worst:.2f} most_cordoned={most_out} budget={budget} breaker_limit={breaker_limit} "
          f"refused={report['counts'].get('refused', 0)} opted_out={opted['status']} "
          f"idle_cpu_ms_per_node_report={report_ms:.3f} load1={os.getloadavg()[0]:.2f} hold_s={hold:.1f} "
          f"cordon_ratio={ratio:.2f} ideal_error={error}")  # fmt: skip
    return error


def cordon_bound(watched: list[float], hold: float) -> tuple[float, float, int]:
    """The fault-to-cordon p95 of the faults the watch saw, its ratio to the hold (their lower bound: a fault is
    acted on only once it has lasted the hold) and `ideal_error` for that ratio; with none cordoned, or no hold,
    nothing to compare: nan, and no error."""
    p95 = percentile(watched, 95) if watched else float("nan")
    if math.isnan(p95) or hold <= 0:
        return p95, float("nan"), 0
    return p95, p95 / hold, ideal_error(p95 / hold, "fault-to-cordon p95 (the watch's faults)")


async def watch_listed(http: aiohttp.ClientSession, receiver: str, nodes: int, timeout: float = 120) -> int:
    """Until the watch holds every node (the receiver's /healthz)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            async with http.get(f"{receiver}/healthz") as resp:
                seen = (await resp.json())["nodes"].get("lab", 0)
            if seen >= nodes:
                return seen
        except aiohttp.ClientError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"the watch did not list {nodes} nodes within {timeout}s")
        await asyncio.sleep(0.2)


async def wait_cordoned(admin: EmulatorAdmin, nodes: set[str], settle: float, most: int) -> dict[str, float]:
    """When each node was first cordoned, from the audit log; waits up to `settle` seconds for them all (or for
    the `most` the circuit breaker lets remediation take, and then `settle` / 4 for any beyond)."""
    deadline = time.monotonic() + settle
    while True:
        found: dict[str, float] = {}
        for entry in await admin.audit(writes=True):
            name = entry.get("name")
            if entry.get("resource") == "nodes" and name in nodes and name not in found and \
                    entry.get("nodeAfter", {}).get("unschedulable"):  # fmt: skip
                found[name] = entry["time"]
        if len(found) == len(nodes) or time.monotonic() > deadline:
            return found
        if len(found) >= most:
            deadline = min(deadline, time.monotonic() + settle / 4)
        await asyncio.sleep(0.5)


def most_cordoned_at_once(writes: list[dict]) -> int:
    """The most nodes unschedulable at one moment, replaying every node write of the audit log."""
    out: set[str] = set()
    most = 0
    for entry in writes:
        if entry.get("resource") == "nodes" and "nodeAfter" in entry:
            (out.add if entry["nodeAfter"]["unschedulable"] else out.discard)(entry["name"])
            most = max(most, len(out))
    return most


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--faults", type=int, default=0, help="faults to inject (default: 6, or 2 %% of the nodes)")
    parser.add_argument("--spread", type=float, default=20.0, help="seconds over which the faults arrive")
    parser.add_argument("--idle", type=float, default=20.0, help="seconds of the idle CPU measurement")
    parser.add_argument("--settle", type=float, default=60.0, help="seconds to wait for the last cordon")
    parser.add_argument("--seed", type=int, default=27)
    parser.add_argument("--breaker-percent", type=int, default=50, help="the remediations' breaker.max_percent")
    racks = parser.add_argument_group("NVL72 racks (bench/rack_faults.py): domain-wide faults, node by node and whole")
    racks.add_argument("--racks", type=int, default=0, help="NVL72 racks (18 trays each); 0: the node bench above")
    racks.add_argument("--domain-faults", type=int, default=2, help="racks given a domain-wide NVLink fault")
    racks.add_argument("--budget-racks", type=int, default=2, help="the budget: this many racks of nodes and domains")
    racks.add_argument("--power-delay", type=float, default=0.2, help="seconds a tray's BMC takes to change power")
    parsed = parser.parse_args()
    parsed.faults = parsed.faults or max(6, parsed.nodes // 50)
    if parsed.racks:
        from bench import rack_faults

        parsed.spread = min(parsed.spread, 10.0)
        sys.exit(asyncio.run(rack_faults.main(parsed)))
    else:
        sys.exit(asyncio.run(main(parsed)))
