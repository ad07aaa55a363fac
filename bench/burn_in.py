"""Burn-in benchmark: a FleetBurnIn's wall time against its ideal, Redfish requests and history sizes, at scale.

    python -m bench.burn_in --servers 50
    python -m bench.burn_in --servers 1000 --concurrency 50 --bmc-latency 0.5

Starts the lab's BMCs with N servers (plus two for calibration), each answering every request after
`--bmc-latency` seconds (a real BMC's 0.2-2 s) and serving at most its session limit at once (past it: 503
with Retry-After, counted in the statuses), the lab's hosts (an in-process host agent for each server
booted into the burn-in image, in this process) and a Millwright worker (`python -m worker`, a process of its own
as deployed) against a fresh dev server. It first runs
one ServerBurnIn alone as a warm-up and one more alone to measure the per-server time, then one
FleetBurnIn over the N servers at the given concurrency, and prints, measured in this run: the wall
time against the ideal (waves of `concurrency` servers × one server's critical path, `server_burn_in_path`,
derived from the BMCs' configuration as they read it back, the hosts' boot delay and the stress time: a true lower
bound, so a ratio under 1.00 is a bench error, `ideal_error=1` and exit status 1), the time one server alone took
against that path, Redfish
requests per server (from the BMCs' audit, read as it grows so that its retention loses nothing,
and checked against the BMCs' own counters), the largest history of any run and the number of runs,
the CPU each process spent during the fleet's run per server (the worker, the dev server, the lab's BMCs and its
hosts) and all of it against what the machine's cores offer over the ideal wall time, peak resources, and the
load average at the start and the end (the machine may be shared). The last line is machine-readable. Not a test:
nothing here asserts a timing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path

import yaml

from activities.redfish import _POLL_MAX_SECONDS, _POLL_SECONDS
from bench.common import DevServer, Workers, cpu_seconds, history_lengths, ideal_error, path_text
from lab.bmc import DEFAULT_FIRMWARE
from lab.hosts import LabHosts
from lab.k8s.admin import kubeconfig
from lab.loopback import write_secret_file
from lab.redfish import BmcAdmin, LabBmcs
from workflows.burnin.fleet_burnin import FleetBurnIn, FleetBurnInInput, FleetDecision
from workflows.burnin.server_burnin import ServerBurnIn, ServerBurnInInput

BMC_USER = "admin"
CALIBRATION = ("bench-calib-warmup", "bench-calib")


def target(bmcs: LabBmcs, name: str) -> dict:
    return {"name": name, "bmc": {"url": bmcs.bmc_urls[name]},
            "expected": {"gpus": 8, "gpu_model": "H200", "firmware": DEFAULT_FIRMWARE}}  # fmt: skip


def settings(stress_seconds: int) -> dict:
    return {"stress_seconds": stress_seconds, "dcgm_level": None, "record_in_netbox": False, "boot_timeout": "PT5M"}


def _looks(request: float, change: float) -> tuple[int, float]:
    """The looks `redfish_power` takes after its reset to see a power change that lands `change` seconds after it,
    and when the last is answered: each look after a pause (from _POLL_SECONDS, doubling up to _POLL_MAX_SECONDS)
    and a request (activities/redfish.py)."""
    looks, at, pause = 0, 0.0, _POLL_SECONDS
    while True:
        looks, at = looks + 1, at + pause + request
        if at >= change:
            return looks, at
        pause = min(pause * 2, _POLL_MAX_SECONDS)


def server_burn_in_path(bmc: dict, boot_delay: float, stress_seconds: float) -> list[tuple[str, float]]:
    """One passing ServerBurnIn's critical path (workflows/burnin/server_burnin.py `_redfish`, no NetBox, a server
    found Off, booted back to its disk) on a lab BMC with this config (as `BmcAdmin.config` reads it back) and lab
    hosts whose agent starts `boot_delay` after the power-on: its Redfish requests one after another, each answered
    no sooner than `request_delay` (counted from activities/redfish.py, docs/burn-in.md's table: 21), the power
    changes landing `power_delay` after their reset and seen at the looks' pace, the agent up, and the stress
    window. One request at a time: the session limit never binds one server. The GPU checks and the verdict have no
    configured time."""
    request, power = float(bmc["request_delay"]), float(bmc["power_delay"])
    looks, seen = _looks(request, power)
    up = max(seen, power + boot_delay)  # the GPU checks wait for both the power activity and the agent
    return [
        # The root, Systems, the system, UpdateService, 3 collections (each in one `$expand`), the SEL's entries.
        ("inventory and SEL (8 requests)", 8 * request),
        ("boot override Pxe (3)", 3 * request),  # read, PATCH, read back
        ("power On (reset)", request),
        (f"agent up (the later of {looks} look(s) {seen:.2f}, power {power:.2f} + boot {boot_delay:.2f})", up),
        ("stress", float(stress_seconds)),
        ("SEL after (1)", request),
        ("boot override Hdd (3)", 3 * request),
        (f"power Off (reset + {looks} look(s))", request + seen),
        (f"power On (reset + {looks} look(s))", request + seen),
    ]


class Watch:
    """Reads the BMC audit as it grows (so that its retention cap loses nothing) and samples peak resources."""

    def __init__(self, admin: BmcAdmin, hosts: LabHosts) -> None:
        self.admin, self.hosts = admin, hosts
        self.cursor = 0
        self.requests: Counter[str] = Counter()
        self.paths: Counter[str] = Counter()
        self.statuses: Counter[int] = Counter()
        self.lost = 0
        self.peak_agents = 0
        self.peak_fds = 0

    async def start_counting(self) -> None:
        self.cursor = await self.admin.audit_cursor()

    async def read_audit(self) -> None:
        page = await self.admin.audit_page(since=self.cursor)
        entries = page["entries"]
        first = entries[0]["seq"] if entries else page["next"] + 1
        self.lost += first - (self.cursor + 1)  # entries the audit dropped before we read them
        for e in entries:
            self.requests[e["server"]] += 1
            self.paths[f"{e['method']} {e['path'].removeprefix('/redfish/v1')}"] += 1
            self.statuses[e["status"]] += 1
        self.cursor = page["next"]

    def sample(self) -> None:
        self.peak_agents = max(self.peak_agents, len(self.hosts.running()))
        self.peak_fds = max(self.peak_fds, len(os.listdir("/proc/self/fd")))

    async def run(self) -> None:
        tick = 0
        while True:
            self.sample()
            if tick % 4 == 0:
                await self.read_audit()
            tick += 1
            await asyncio.sleep(0.5)


def cpu_of(pids: dict[str, int]) -> dict[str, float]:
    """CPU seconds each process has used so far."""
    return {name: cpu_seconds(pid) for name, pid in pids.items()}


def peak_rss_mib(pid: int) -> int:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return int(next(line for line in lines if line.startswith("VmHWM:")).split()[1]) // 1024


async def burn_in_seconds(client, names: list[str]) -> list[float]:
    """How long each of these servers' burn-ins took, from its run's start to its close, shortest first."""
    fleet = {f"burn-in/{n}" for n in names}
    runs = client.list_workflows("WorkflowId STARTS_WITH 'burn-in/' AND ExecutionStatus = 'Completed'")
    return sorted([(e.close_time - e.start_time).total_seconds() async for e in runs
                   if e.id in fleet and e.close_time and e.start_time])  # fmt: skip


async def progress(handle, every: float = 15.0) -> None:
    """Report progress on stderr; abort a fleet that pauses for failures (no operator here)."""
    while True:
        await asyncio.sleep(every)
        with contextlib.suppress(Exception):
            r = await handle.query(FleetBurnIn.report)
            print(f"  … {r.passed} passed, {r.failed} failed, {r.errors} errors, {len(r.running)} running, "
                  f"{r.pending} pending", file=sys.stderr, flush=True)  # fmt: skip
            if r.paused:
                print(f"  paused: {r.paused}; aborting", file=sys.stderr, flush=True)
                await handle.execute_update(FleetBurnIn.decide, FleetDecision(action="abort", reason="bench: paused"))


async def main(
    servers: int, concurrency: int, stress_seconds: int, power_delay: float, boot_delay: float, bmc_latency: float
) -> int:
    """Runs the bench and prints its figures; 1 when the ideal was beaten (`ideal_error`), else 0."""
    load_before = os.getloadavg()
    password = uuid.uuid4().hex
    names = [f"bench-{i:05d}" for i in range(1, servers + 1)]
    with tempfile.TemporaryDirectory(prefix="millwright-bench-") as tmp:
        secret = write_secret_file(Path(tmp, "bmc-credentials"), f"{BMC_USER}:{password}")
        kube = Path(tmp, "kubeconfig")  # the worker wants one; nothing here talks to Kubernetes
        kube.write_text(yaml.safe_dump(kubeconfig("http://127.0.0.1:9", "none")))
        with LabBmcs(servers=[*CALIBRATION, *names], user=BMC_USER, password=password, power_delay=power_delay,
                     startup_timeout=120) as bmcs:  # fmt: skip
            admin = BmcAdmin(bmcs.url)
            bmc_config = await admin.config(request_delay=bmc_latency)
            async with DevServer() as server:
                client = server.client
                pool = Workers(1, server.address, f"bench-{uuid.uuid4().hex[:6]}", str(kube), Path(tmp),
                               bmc_credentials=f"file:{secret}", log_level="WARNING",
                               max_concurrent_activities=str(max(100, 2 * concurrency)))  # fmt: skip
                queue = pool.task_queue
                assert bmcs.pid is not None
                pids = {
                    "worker": pool.processes[0].pid,
                    "dev server": server.pid,
                    "lab BMCs": bmcs.pid,
                    "lab hosts": os.getpid(),
                }  # the host agents run here, beside the bench's own reading
                try:
                    await pool.polling(client)
                    # Agents only in the burn-in image's boots, not after the boot back to disk: at most
                    # `concurrency` at once (each is a worker with its own poller, in this process).
                    async with LabHosts(client, bmcs.url, boot_delay=boot_delay, booted_from={"Pxe"}) as hosts:
                        watch = Watch(admin, hosts)
                        critical = server_burn_in_path(bmc_config, hosts.boot_delay, stress_seconds)
                        per_server = 0.0
                        for name in CALIBRATION:  # the first warms up the worker and the workflow sandbox
                            one = ServerBurnInInput.model_validate({"server": target(bmcs, name),
                                                                    "settings": settings(stress_seconds)})  # fmt: skip
                            begin = time.monotonic()
                            alone = await client.execute_workflow(ServerBurnIn.run, one, id=one.workflow_id(),
                                                                  task_queue=queue)  # fmt: skip
                            per_server = time.monotonic() - begin
                            assert alone.result == "passed", alone.summary()
                        single_requests = (await admin.servers(["requests"]))[CALIBRATION[1]]["requests"]
                        await watch.start_counting()
                        watching = asyncio.create_task(watch.run())
                        inp = FleetBurnInInput.model_validate({
                            "name": f"bench-{uuid.uuid4().hex[:6]}", "servers": [target(bmcs, n) for n in names],
                            "settings": settings(stress_seconds), "max_concurrent": concurrency,
                        })  # fmt: skip
                        cpu_before = cpu_of(pids)
                        started = time.monotonic()
                        handle = await client.start_workflow(FleetBurnIn.run, inp, id=inp.workflow_id(),
                                                             task_queue=queue)  # fmt: skip
                        reporting = asyncio.create_task(progress(handle))
                        result = await handle.result()
                        wall = time.monotonic() - started
                        cpu = {k: v - cpu_before[k] for k, v in cpu_of(pids).items()}
                        for task in (reporting, watching):
                            task.cancel()
                            with contextlib.suppress(asyncio.CancelledError):
                                await task
                        await watch.read_audit()
                        watch.sample()
                        counters = await admin.servers(["requests"])
                        rss = {k: peak_rss_mib(pid) for k, pid in pids.items()}
                finally:
                    pool.stop()
                fleet_runs = await history_lengths(client, inp.workflow_id())
                lengths = await history_lengths(client, inp.workflow_id(), "burn-in/")
                took = await burn_in_seconds(client, names)
            await admin.aclose()

    fleet_requests = sum(watch.requests[n] for n in names)
    counted = sum(counters[n]["requests"] for n in names)
    per = [watch.requests[n] for n in names]
    waves = math.ceil(servers / concurrency)
    per_path = sum(seconds for _, seconds in critical)
    ideal = waves * per_path
    r = result.report
    unaccounted = servers - (r.passed + r.failed + r.errors + r.skipped)  # the fleet's outcomes should count each
    print(f"servers={servers} concurrency={concurrency} stress={stress_seconds}s power_delay={power_delay}s "
          f"boot_delay={boot_delay}s bmc_latency={bmc_latency}s bmc_session_limit={bmc_config['max_sessions']}: "
          f"{r.passed} passed, {r.failed} failed, {r.errors} errors, {r.skipped} skipped"
          + (" (aborted)" if result.aborted else "") + (f", {unaccounted} NOT ACCOUNTED FOR" if unaccounted else ""))  # fmt: skip
    for f in r.failures[:5]:
        print(f"  {f.server} {f.result}: {f.reason}")
    print(f"ideal: {waves} wave(s) of {concurrency} × {per_path:.2f} s ({path_text(critical)})")
    print(f"one ServerBurnIn alone took {per_server:.2f}s at the start of this run (after a warm-up run), "
          f"{per_server / per_path:.2f} × the path")  # fmt: skip
    print(f"wall={wall:.1f}s ideal={ideal:.1f}s")
    print(f"a server's burn-in inside the fleet took {sum(took) / len(took):.2f}s on average (median "
          f"{took[len(took) // 2]:.2f}s, longest {took[-1]:.2f}s), {sum(took) / len(took) / per_server:.2f} x alone")  # fmt: skip
    print(f"redfish: {fleet_requests} requests to {servers} BMCs in the audit ({watch.lost} lost to its retention; "
          f"the BMCs' own counters say {counted}); per server min {min(per)} max {max(per)}, one run alone "
          f"{single_requests}; statuses {dict(sorted(watch.statuses.items()))}")  # fmt: skip
    print(
        "redfish per server by request: "
        + ", ".join(f"{path or '/'} {n / servers:.1f}" for path, n in watch.paths.most_common(8))
    )
    print(f"histories: runs={len(lengths)} (fleet runs {len(fleet_runs)}, largest {max(fleet_runs)}) "
          f"total_events={sum(lengths)} largest_run={max(lengths)}")  # fmt: skip
    print(f"peaks: host agents running {watch.peak_agents}, open fds {watch.peak_fds}; peak RSS MiB: "
          + ", ".join(f"{k} {mib}" for k, mib in rss.items()))  # fmt: skip
    cores = os.cpu_count() or 1
    print(f"CPU during the fleet's run: {sum(cpu.values()):.0f} s, {sum(cpu.values()) * 1000 / servers:.0f} ms a "
          f"server (" + ", ".join(f"{k} {v:.0f} s, {v * 1000 / servers:.0f} ms" for k, v in cpu.items())
          + f"); {cores} cores over the ideal wall offer {cores * ideal:.0f} CPU-seconds")  # fmt: skip
    print(f"load average (1, 5, 15 min): {' '.join(f'{x:.2f}' for x in load_before)} at the start, "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())} at the end")  # fmt: skip
    # One server alone is a fleet of one wave: the same bound holds for it.
    error = max(ideal_error(wall / ideal, "burn-in wall"), ideal_error(per_server / per_path, "one server alone"))
    print(f"wall_ratio={wall / ideal:.2f} servers_unaccounted={unaccounted} "
          f"redfish_requests_per_server={fleet_requests / servers:.1f} "
          f"bmc_busy_answers={watch.statuses[503]} max_run_events={max(lengths)} "
          f"events_per_server={sum(lengths) / servers:.1f} "
          + " ".join(f"{k.replace(' ', '_')}_cpu_ms_per_server={v * 1000 / servers:.0f}" for k, v in cpu.items())
          + f" cpu_over_ideal={sum(cpu.values()) / (cores * ideal):.2f} ideal_error={error}")  # fmt: skip
    return error


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--servers", type=int, default=50)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--stress-seconds", type=int, default=1)
    parser.add_argument("--power-delay", type=float, default=0.1)
    parser.add_argument("--boot-delay", type=float, default=0.2)
    parser.add_argument("--bmc-latency", type=float, default=0.0, help="seconds each BMC request takes")
    args = parser.parse_args()
    sys.exit(
        asyncio.run(
            main(
                args.servers, args.concurrency, args.stress_seconds, args.power_delay, args.boot_delay, args.bmc_latency
            )
        )
    )
