"""What the benchmarks share: the dev server they run against, workers as processes, the CPU time each process
spent (from /proc), the throttling errors in their logs, the history sizes they report, a node update's and a node's
MIG change's least time on the emulator (the rollout's ideals) and the check that an ideal was a lower bound."""

from __future__ import annotations

import asyncio
import compileall
import contextlib
import itertools
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from activities.kube.models import JOB_INTERRUPT_LABEL, JOB_PACKAGE_LABEL, JOB_STAGE_LABEL, Stage
from lab.k8s import mig
from lab.k8s.controllers.kubelet import job_seconds
from lab.loopback import LOOPBACK, AdminClient, free_port
from lab.temporal import search_attribute_args, task_queue_poller_identities

REPO = Path(__file__).resolve().parents[1]
# What Temporal answers a caller it throttles: a ResourceExhausted status (too many in-flight updates, rate
# limits, ...), and updates aborted when their workflow continues as new; as the worker and the server log them.
THROTTLED = re.compile(r"resource.?exhausted|limit on number of concurrent in-flight updates|"
                       r"workflow update was aborted", re.IGNORECASE)  # fmt: skip


def node_update_path(config: dict, package: str, interrupt: str) -> list[tuple[str, float]]:
    """One node's critical path through a rollout of `package` on an emulator with this `config` (as `GET
    /_lab/config` reads it back), part by part: its stage Jobs one after another, in the order a node runs them
    (workflows/rollout/node_update.py `_stages_of`: apply, config, the interrupt, post-interrupt), each as long as
    the kubelet makes it at the least (`job_seconds`)."""
    path = []
    for stage in (Stage.APPLY, Stage.CONFIG, Stage.INTERRUPT, Stage.POST_INTERRUPT):
        labels = {JOB_PACKAGE_LABEL: package, JOB_STAGE_LABEL: stage.value}
        if stage.is_interrupt:
            labels[JOB_INTERRUPT_LABEL] = interrupt
        path += job_seconds(config, labels)
    return path


def node_mig_path(config: dict, product: str, layout: str, applied: str = mig.DISABLED,
                  node: str = "") -> list[tuple[str, float]]:  # fmt: skip
    """One node's critical path through a GpuPartitioning to `layout` on an emulator with this `config` (as `GET
    /_lab/config` reads it back), for a node of GPU `product` whose GPUs have `applied`: what mig-manager makes it
    wait at the least (lab/k8s/controllers/migmanager.py): the change `pending` (`migPendingSeconds`, or the node's
    own `pendingSeconds` in `migNodes`), then, when rebooting is on (`migReboot`, or the node's `reboot`) and the
    MIG mode changes, the reboot (`rebootSeconds`). The cordon, the label writes and a drain with no GPU pod to
    evict have no configured time; a node already at its layout has no path."""
    if layout == applied:
        return []
    own = (config.get("migNodes") or {}).get(node) or {}
    pending = own.get("pendingSeconds")
    path = [("mig-manager pending", float(config["migPendingSeconds"] if pending is None else pending))]
    reboot = own.get("reboot")
    mode_change = (mig.layout(layout, mig.model_of(product), product) is None) != (applied == mig.DISABLED)
    if (config["migReboot"] if reboot is None else reboot) and mode_change:
        path.append(("reboot", float(config["rebootSeconds"])))
    return path


def path_text(path: list[tuple[str, float]]) -> str:
    """A critical path as the benches print it: its parts in order, each with its seconds."""
    return " + ".join(f"{part} {seconds:.2f}" for part, seconds in path)


def batches_ideal(nodes: int, batch: int, path: list[tuple[str, float]]) -> tuple[float, str]:
    """A run's ideal over `nodes` in batches of `batch` when its budget lets one batch in at once: the batches one
    after another, each as long as one node's `path` at the least; and how it reads (`10 batches × 35.20 s (apply
    5.05 + ...)`)."""
    batches, per_node = math.ceil(nodes / batch), sum(seconds for _, seconds in path)
    return batches * per_node, f"{batches} batches × {per_node:.2f} s ({path_text(path)})"


def ideal_error(ratio: float, what: str) -> int:
    """1, saying so, when `ratio` (measured over ideal) is under 1.00: the ideal was not a lower bound, which is a bug
    in the bench, not a result; else 0. A bench puts it in its last line as `ideal_error` and then exits 1."""
    if ratio >= 1.0:
        return 0
    print(f"bench error: {what} ratio {ratio:.3f} < 1.00: the ideal is not a lower bound (a bench bug, not a result)")
    return 1


def temporal_binary() -> str | None:
    """The `temporal` CLI next to this interpreter (the venv's), else the one on PATH."""
    local = Path(sys.executable).parent / "temporal"
    return str(local) if local.exists() else shutil.which("temporal")


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) the process has used so far, all its threads, from /proc/<pid>/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime: fields 14 and 15


def resources() -> dict[str, tuple[float, int]]:
    """CPU seconds and peak resident MiB of this process and each of its children (the BMCs, the dev server)."""
    out = {}
    for pid in ["self", *filter(str.isdigit, os.listdir("/proc"))]:
        with contextlib.suppress(OSError, KeyError, ValueError):
            lines = Path(f"/proc/{pid}/status").read_text().splitlines()
            fields = dict(line.split(":", 1) for line in lines if ":" in line)
            if pid == "self" or int(fields["PPid"]) == os.getpid():
                cpu = cpu_seconds(os.getpid() if pid == "self" else int(pid))
                name = "bench" if pid == "self" else fields["Name"].strip()
                out[name] = (cpu, int(fields["VmHWM"].split()[0]) // 1024)
    return out


def warnings_in(*logs: Path) -> Counter[str]:
    """The workers' warnings and errors by message (numbers and IDs masked), to say what went wrong."""
    found: Counter[str] = Counter()
    for log in logs:
        with open(log, errors="replace") as fh:
            for line in fh:
                if " WARNING " in line or " ERROR " in line:
                    message = line.split(": ", 1)[-1].strip()
                    found[re.sub(r"[0-9a-f]{8,}|\d+(\.\d+)?", "#", message)[:100]] += 1
    return found


def print_warnings(warnings: Counter[str]) -> None:
    """The workers' warnings and errors (`warnings_in`) as a bench prints them: their count and the five most
    frequent."""
    print(f"worker warnings and errors: {sum(warnings.values())}"
          + "".join(f"\n  {n} x {message}" for message, n in warnings.most_common(5)))  # fmt: skip


def throttled_lines(*logs: Path) -> int:
    """Lines of these logs that report throttling (THROTTLED)."""
    count = 0
    for log in logs:
        with open(log, errors="replace") as fh:
            count += sum(1 for line in fh if THROTTLED.search(line))
    return count


class DevServer:
    """`temporal server start-dev` (in memory, headless) as a child process: its pid for its CPU, its log for
    what it refused. ``async with DevServer() as server: server.client``."""

    def __init__(self) -> None:
        self.address = f"{LOOPBACK}:{free_port()}"
        self._dir = tempfile.TemporaryDirectory(prefix="millwright-bench-")
        self.log = Path(self._dir.name) / "temporal.log"
        self.process: subprocess.Popen | None = None
        self._client: Client | None = None

    @property
    def client(self) -> Client:
        assert self._client is not None, "the dev server is used inside `async with`"
        return self._client

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    async def __aenter__(self) -> DevServer:
        host, port = self.address.split(":")
        command = [temporal_binary() or "temporal", "server", "start-dev", "--headless", "--ip", host, "--port", port,
                   "--log-level", "warn", *search_attribute_args()]  # fmt: skip
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True)  # fmt: skip
        deadline = time.monotonic() + 30
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"the dev server exited with {self.process.returncode}: {self.log.read_text()}")
            try:
                self._client = await Client.connect(self.address, data_converter=pydantic_data_converter)
                if await self._client.service_client.check_health():
                    return self
            except Exception:
                if time.monotonic() > deadline:
                    raise
            await asyncio.sleep(0.2)

    async def __aexit__(self, *exc: object) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        self._dir.cleanup()


async def dev_server() -> DevServer:
    """A fresh local dev server with Millwright's search attributes (use with `async with`)."""
    return DevServer()


class Workers:
    """`count` worker processes (`python -m worker`), configured by environment as a deployment configures them,
    on one task queue; their logs, and the CPU they spent."""

    def __init__(self, count: int, address: str, task_queue: str, kubeconfig: str, logs: Path, **settings: str):
        # Compiled first, as the worker image is (deploy/Dockerfile): with PYTHONDONTWRITEBYTECODE set and no
        # bytecode, the sandbox would compile a workflow module's source again for every new run.
        for package in ("workflows", "activities", "worker"):
            compileall.compile_dir(REPO / package, quiet=1)
        self.task_queue = task_queue
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TEMPORAL_", "MILLWRIGHT_"))}
        env.update(TEMPORAL_ADDRESS=address, TEMPORAL_NAMESPACE="default", MILLWRIGHT_TASK_QUEUE=task_queue,
                   MILLWRIGHT_KUBECONFIG=kubeconfig, MILLWRIGHT_METRICS_PORT="0", MILLWRIGHT_SHUTDOWN_GRACE_SECONDS="5",
                   TEMPORAL_CONFIG_FILE=str(logs / "no-such-temporal.toml"), PYTHONUNBUFFERED="1",
                   **{f"MILLWRIGHT_{k.upper()}": v for k, v in settings.items()})  # fmt: skip
        self._env = env
        self.logs = [logs / f"worker-{i + 1}.log" for i in range(count)]
        self.processes = [self._spawn(log) for log in self.logs]

    def _spawn(self, log: Path) -> subprocess.Popen:
        with open(log, "ab") as fh:  # a restarted worker appends to its log
            return subprocess.Popen([sys.executable, "-m", "worker"], env=self._env, cwd=REPO, stdout=fh,
                                    stderr=subprocess.STDOUT)  # fmt: skip

    def kill_and_restart(self, index: int = 0) -> None:
        """SIGKILL worker `index` (no graceful anything: its workflow tasks and local activities are lost) and
        start it again."""
        self.processes[index].kill()
        self.processes[index].wait(10)
        self.processes[index] = self._spawn(self.logs[index])

    async def polling(self, client: Client, timeout: float = 60) -> None:
        """Until every worker polls the task queue for workflow tasks."""
        deadline = time.monotonic() + timeout
        while True:
            for proc, log in zip(self.processes, self.logs):
                if proc.poll() is not None:
                    raise RuntimeError(f"a worker exited with {proc.returncode}:\n{log.read_text()[-4000:]}")
            pollers = await task_queue_poller_identities(client, self.task_queue) or []
            if len(set(pollers)) >= len(self.processes):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{len(set(pollers))} of {len(self.processes)} workers poll {self.task_queue}")
            await asyncio.sleep(0.2)

    def cpu_seconds(self) -> float:
        return sum(cpu_seconds(p.pid) for p in self.processes)

    def stop(self) -> None:
        for proc in self.processes:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.processes:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


def _started_with(prefixes: tuple[str, ...]) -> str:
    """The visibility query for every run whose workflow ID starts with one of the prefixes."""
    return " OR ".join(f"WorkflowId STARTS_WITH '{p}'" for p in prefixes)


async def history_lengths(client: Client, *prefixes: str) -> list[int]:
    """The history length of every run (continued-as-new runs each count) whose workflow ID starts with a prefix."""
    return [execution.history_length async for execution in client.list_workflows(_started_with(prefixes))]


async def batch_spans(client: Client, workflow_type: str, *prefixes: str) -> list[tuple[float, float]]:
    """Each batch's (start, close) as epoch seconds (a `workflow_type` child), in start order."""
    return sorted(
        [
            (execution.start_time.timestamp(), execution.close_time.timestamp())
            async for execution in client.list_workflows(_started_with(prefixes))
            if execution.workflow_type == workflow_type and execution.close_time is not None
        ]
    )


async def batch_timeline(client: Client, workflow_type: str, *prefixes: str) -> tuple[list[float], list[float]]:
    """Each batch's wall time (a `workflow_type` child, start to close) and the gaps between one batch's close and
    the next one's start, in start order: where a fleet's time goes, inside its batches or between them."""
    spans = sorted(
        [
            (execution.start_time, execution.close_time)
            async for execution in client.list_workflows(_started_with(prefixes))
            if execution.workflow_type == workflow_type and execution.close_time is not None
        ]
    )
    durations = [(close - start).total_seconds() for start, close in spans]
    gaps = [(later[0] - earlier[1]).total_seconds() for earlier, later in itertools.pairwise(spans)]
    return durations, gaps


async def event_kinds(client: Client, *prefixes: str) -> Counter[str]:
    """History events by kind (workflow tasks counted as one kind of three events, local activities and patches by
    their marker), over every run whose workflow ID starts with a prefix: where a design spends its events."""
    kinds: Counter[str] = Counter()
    async for execution in client.list_workflows(_started_with(prefixes)):
        handle = client.get_workflow_handle(execution.id, run_id=execution.run_id)
        async for event in handle.fetch_history_events():
            kind = EventType.Name(event.event_type).removeprefix("EVENT_TYPE_").lower()
            if kind.startswith("workflow_task_"):
                kind = "workflow_task"
            elif kind == "marker_recorded":
                kind = event.marker_recorded_event_attributes.marker_name.removeprefix("core_")
            elif kind.startswith("activity_task_"):
                kind = "activity"
            kinds[kind] += 1
    return kinds


async def history_figures(client: Client, what: str, nodes: int, *prefixes: str) -> dict[str, float]:
    """Over every run whose workflow ID starts with a prefix (children and continued runs included): prints the
    runs, their events and the largest run, then the events per node by kind; returns `max_run_events` and
    `events_per_node`."""
    lengths = await history_lengths(client, *prefixes)
    print(f"{what}: runs={len(lengths)} total_events={sum(lengths)} largest_run={max(lengths)}")
    kinds = (await event_kinds(client, *prefixes)).most_common()
    print(f"{what}: events per node by kind: " + ", ".join(f"{kind} {n / nodes:.2f}" for kind, n in kinds))
    return {"max_run_events": max(lengths), "events_per_node": sum(lengths) / nodes}


def cpu_per_node(worker_cpu: float, server_cpu: float, nodes: int) -> dict[str, float]:
    """The CPU seconds the workers and the dev server spent during a run, in ms per node."""
    return {"worker_cpu_ms_per_node": worker_cpu * 1000 / nodes, "server_cpu_ms_per_node": server_cpu * 1000 / nodes}


def figures_text(ratio: float, figures: dict[str, float]) -> str:
    """A run's figures (`history_figures`, `cpu_per_node`) as a rollout's last line gives them, after its ratio."""
    return (f"makespan_ratio={ratio:.2f} max_run_events={figures['max_run_events']:.0f} "
            f"events_per_node={figures['events_per_node']:.1f} "
            f"worker_cpu_ms_per_node={figures['worker_cpu_ms_per_node']:.0f} "
            f"server_cpu_ms_per_node={figures['server_cpu_ms_per_node']:.0f}")  # fmt: skip


class AuditWrites:
    """An emulator's audit log of writes, read as it grows (`follow`: every 10 s) so that its retention
    (lab/k8s/store.py AUDIT_MAX) loses nothing of a long run."""

    def __init__(self, admin: AdminClient) -> None:
        self._admin, self._next, self.entries = admin, 0, list[dict]()

    async def read(self) -> list[dict]:
        """Every write so far."""
        page = await self._admin.audit_page(self._next, writes=True)
        self.entries.extend(page["entries"])
        self._next = page["next"]
        return self.entries

    async def follow(self, every: float = 10) -> None:
        while True:
            await self.read()
            await asyncio.sleep(every)


def node_steps(writes: list[dict]) -> dict[str, list[tuple[str, float]]]:
    """Each node's rollout steps as the emulator's audit log (writes) saw them, in time order: `cordon`, each stage
    Job's creation by its stage (`apply`, `config`, `interrupt`, `post-interrupt`), `uncordon`."""
    steps: dict[str, list[tuple[str, float]]] = {}
    for entry in writes:
        if not 200 <= (entry.get("code") or 0) < 300:
            continue
        if entry.get("resource") == "nodes" and "nodeAfter" in entry and entry.get("verb") == "patch":
            changed = any(c.get("path") == ".spec.unschedulable" for c in entry.get("changes") or ())
            if changed:
                step = "cordon" if entry["nodeAfter"]["unschedulable"] else "uncordon"
                steps.setdefault(entry["name"], []).append((step, entry["time"]))
        elif "jobAfter" in entry:
            job = entry["jobAfter"]
            stage = job["labels"].get(JOB_STAGE_LABEL)
            if stage:
                steps.setdefault(job["node"], []).append((stage, entry["time"]))
    return steps


def where_batches_went(steps: dict[str, list[tuple[str, float]]], spans: list[tuple[float, float]],
                       path: list[tuple[str, float]]) -> list[str]:  # fmt: skip
    """Lines saying where each batch's time beyond the ideal went: from the batch's start to its first cordon, the
    spread of its cordons, each step's excess over the path's least (mean over nodes, and the batch's worst node),
    and from its last uncordon to its close; each averaged over the batches."""
    least = dict(path)
    # What separates two steps at the least: the Job of the step before (its pod, its run, a reboot's wait).
    expected = {("cordon", "apply"): 0.0, ("apply", "config"): least.get("apply", 0.0),
                ("config", "interrupt"): least.get("config", 0.0),
                ("interrupt", "post-interrupt"): least.get("interrupt pod", 0.0) + least.get("reboot", 0.0),
                ("post-interrupt", "uncordon"): least.get("post-interrupt", 0.0)}  # fmt: skip
    parts: dict[str, list[float]] = {}
    for start, close in spans:
        nodes = [s for s in steps.values() if s and s[0][0] == "cordon" and start <= s[0][1] <= close]
        if not nodes:
            continue
        cordons = [s[0][1] for s in nodes]
        uncordons = [s[-1][1] for s in nodes if s[-1][0] == "uncordon"]
        parts.setdefault("start to first cordon", []).append(min(cordons) - start)
        parts.setdefault("cordons' spread", []).append(max(cordons) - min(cordons))
        for (a, b), floor in expected.items():
            excess = [tb - ta - floor for s in nodes for (sa, ta), (sb, tb) in itertools.pairwise(s)
                      if (sa, sb) == (a, b)]  # fmt: skip
            if excess:
                parts.setdefault(f"{a} to {b} (mean)", []).append(sum(excess) / len(excess))
                parts.setdefault(f"{a} to {b} (worst)", []).append(max(excess))
        if uncordons:
            parts.setdefault("last uncordon to close", []).append(close - max(uncordons))
            parts.setdefault("first cordon to last uncordon, over the path", []).append(
                max(uncordons) - min(cordons) - sum(least.values())
            )
    return [f"{name}: {sum(v) / len(v):.2f}s (max {max(v):.2f}s)" for name, v in parts.items()]
