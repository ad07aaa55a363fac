"""`millwright lab up|down|seed|status`: the emulated lab on 127.0.0.1.

`up` starts its children, each in its own session so a Ctrl-C reaches only the runner,
which then stops them in order (worker first, so in-flight activities can finish):

- the Temporal dev server with Web UI (`lab.temporal.DevServer`), SQLite in the state dir;
- the Kubernetes emulator (`python -m lab.k8s`), its objects kept in the state dir;
- the BMCs of the fleet's GPU nodes (`python -m lab.redfish`: one Redfish service per node, named like the
  node, powered On), with credentials generated per `lab up` into `<state-dir>/bmc/credentials` (0600,
  `user:password`) that the worker reads through `MILLWRIGHT_BMC_CREDENTIALS=file:<path>`;
- the lab's hosts (`python -m lab.hosts`): a host agent for every powered-on server, on its own task queue;
- one Millwright worker (`python -m worker`) pointed at Temporal, Kubernetes and the BMCs;
- with `--netbox`: a real NetBox (`lab.netbox.NetBoxLab`: its own PostgreSQL and Redis), its
  URL in lab.json and the worker's environment, its API token in `<state-dir>/netbox/token`
  (mode 0600) that the worker reads through the secret reference `file:<path>`. Opt-in,
  because its first start builds a venv and migrates a database (minutes, once, cached).

`<state-dir>/lab.json` records every address and pid while the lab runs; `down` reads it.
`<state-dir>/examples/server-burn-in.json` is a ServerBurnIn input for the first GPU node with its real BMC URL.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from lab.loopback import LOOPBACK, free_port
from lab.temporal import DevServer, LabError, choose_port

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_FLEET = Path(__file__).resolve().parent / "fleets" / "demo.json"
EXAMPLE = "millwright start NodeMaintenance --input examples/node-maintenance.json"
BURN_IN_TEMPLATE = REPO_ROOT / "examples" / "server-burn-in.json"
BMC_USER = "admin"
WORKER_GRACE_SECONDS = 10
# What each recorded pid's command line must contain, so a recycled pid is never signalled.
MARKERS = {
    "runner": "lab", "temporal": "start-dev", "kubernetes": "lab.k8s", "worker": "worker",
    "netbox": "runserver", "netbox-redis": "redis-server", "netbox-postgres": "postgres",
    "bmcs": "lab.redfish", "hosts": "lab.hosts",
}  # fmt: skip
STOP_ORDER = ["worker", "hosts", "kubernetes", "bmcs", "temporal", "netbox", "netbox-redis", "netbox-postgres"]


def say(msg: str) -> None:
    print(f"lab: {msg}", flush=True)


# ---------------------------------------------------------------- lab.json and pids


def lab_file(state_dir: Path) -> Path:
    return state_dir / "lab.json"


def read_info(state_dir: Path) -> dict[str, Any] | None:
    try:
        return json.loads(lab_file(state_dir).read_text())
    except (OSError, ValueError):
        return None


def write_info(state_dir: Path, info: dict[str, Any]) -> None:
    tmp = lab_file(state_dir).with_suffix(".json.tmp")
    tmp.write_text(json.dumps(info, indent=2) + "\n")
    os.replace(tmp, lab_file(state_dir))


def pid_alive(pid: Any, marker: str | None = None) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # zombies and recycled pids do not count
        stat = Path(f"/proc/{pid}/stat").read_text()
        if stat.rsplit(")", 1)[1].split()[0] == "Z":
            return False
        if marker:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            return marker in cmdline
    except (OSError, IndexError):
        pass
    return True


def running_lab(state_dir: Path) -> dict[str, Any] | None:
    """The lab.json of a lab whose runner is alive, else None."""
    info = read_info(state_dir)
    if info and pid_alive((info.get("pids") or {}).get("runner"), MARKERS.get("runner")):
        return info
    return None


def live_pids(info: dict[str, Any]) -> dict[str, int]:
    pids = info.get("pids") or {}
    return {name: pid for name, pid in pids.items() if pid_alive(pid, MARKERS.get(name))}


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def _wait_gone(pids: dict[str, int], timeout: float) -> dict[str, int]:
    deadline = time.monotonic() + timeout
    remaining = dict(pids)
    while remaining and time.monotonic() < deadline:
        remaining = {n: p for n, p in remaining.items() if pid_alive(p, MARKERS.get(n))}
        if remaining:
            time.sleep(0.1)
    return remaining


# ---------------------------------------------------------------- up


@dataclass
class Child:
    name: str
    process: subprocess.Popen
    log: Path

    @property
    def pid(self) -> int:
        return self.process.pid


@dataclass
class Lab:
    state_dir: Path
    fleet: Path
    port: int
    ui_port: int
    task_queue: str
    timeout: float
    children: dict[str, Child] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)
    netbox: bool = False
    netbox_lab: Any = None  # lab.netbox.NetBoxLab once started

    def save(self) -> None:
        self.info["pids"] = {"runner": os.getpid(), **{n: c.pid for n, c in self.children.items()}}
        write_info(self.state_dir, self.info)

    def spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Child:
        log = self.state_dir / f"{name}.log"
        with open(log, "ab") as fh:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=fh,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=str(REPO_ROOT),
                start_new_session=True,  # Ctrl-C reaches the runner only; it stops children in order
            )
        child = Child(name, proc, log)
        self.children[name] = child
        self.save()
        return child

    def dead_child(self) -> Child | None:
        for child in self.children.values():
            if child.process.poll() is not None:
                return child
        return None

    def check_children(self) -> None:
        dead = self.dead_child()
        if dead:
            raise LabError(f"the {dead.name} (pid {dead.pid}) exited with code {dead.process.returncode}; see {dead.log}")

    # -------------------------------------------------------------- steps

    async def wait_ready(self, child: Child, ready: Path, what: str) -> dict[str, Any]:
        """The child's ready file ({"url", "pid"}) once it is written; a dead child or the timeout is an error."""
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            self.check_children()
            with contextlib.suppress(OSError, ValueError):
                data = json.loads(ready.read_text())
                if data.get("url"):
                    return data
            await asyncio.sleep(0.1)
        raise LabError(f"{what} did not get ready in {self.timeout:.0f}s; see {child.log}")

    async def start_kubernetes(self) -> str:
        ready = self.state_dir / "k8s.ready.json"
        ready.unlink(missing_ok=True)
        child = self.spawn(
            "kubernetes",
            [
                sys.executable, "-m", "lab.k8s",
                "--host", LOOPBACK, "--port", "0",
                "--ready-file", str(ready),
                "--state-file", str(self.state_dir / "k8s-state.json"),
            ],
            env=_child_env(),
        )  # fmt: skip
        return str((await self.wait_ready(child, ready, "the Kubernetes emulator"))["url"])

    async def start_bmcs(self) -> dict[str, Any] | None:
        """The fleet's GPU nodes' BMCs, powered On, with fresh credentials; None when the fleet turns them off."""
        import secrets

        import httpx

        from lab.fleet import load_fleet
        from lab.loopback import write_secret_file

        fleet = load_fleet(str(self.fleet))
        servers = fleet.bmc_servers()
        if not servers:
            return None
        root = self.state_dir / "bmc"
        root.mkdir(exist_ok=True)
        credentials = write_secret_file(root / "credentials", f"{BMC_USER}:{secrets.token_urlsafe(18)}").resolve()
        password = credentials.read_text().strip().split(":", 1)[1]
        (root / "servers.json").write_text(json.dumps(servers, indent=2) + "\n")
        ready = root / "ready.json"
        ready.unlink(missing_ok=True)
        env = {**_child_env(), "LAB_BMC_USER": BMC_USER, "LAB_BMC_PASSWORD": password}  # never on a command line
        child = self.spawn(
            "bmcs",
            [
                sys.executable, "-m", "lab.redfish", "--host", LOOPBACK, "--port", "0",
                "--ready-file", str(ready), "--servers-file", str(root / "servers.json"),
                "--power-delay", str(fleet.bmc.power_delay),
            ],
            env=env,
        )  # fmt: skip
        admin = str((await self.wait_ready(child, ready, "the BMC emulator"))["url"])
        async with httpx.AsyncClient(trust_env=False, timeout=10) as http:
            views = (await http.get(f"{admin}/_lab/servers", params={"fields": "url"})).raise_for_status().json()
        return {
            "admin": admin,
            "credentials": f"file:{credentials}",  # a reference, never the password
            "power_delay": fleet.bmc.power_delay,
            "servers": {s["name"]: views["servers"][s["name"]]["url"] for s in servers},
            "specs": servers,
        }

    async def start_hosts(self, address: str, bmc_admin: str) -> None:
        """`python -m lab.hosts`: a host agent for each powered-on server; ready once they all poll."""
        ready = self.state_dir / "bmc" / "hosts.ready.json"
        ready.unlink(missing_ok=True)
        child = self.spawn(
            "hosts",
            [sys.executable, "-m", "lab.hosts", "--temporal", address, "--bmc-admin", bmc_admin,
             "--ready-file", str(ready), "--startup-timeout", str(self.timeout)],
            env=_child_env(),
        )  # fmt: skip
        await self.wait_ready(child, ready, "the lab's host agents")

    def write_burn_in_example(self, bmc: dict[str, Any]) -> Path:
        """examples/server-burn-in.json for the first GPU node, with its real BMC URL and expected hardware."""
        from lab.redfish import normalize_spec

        spec = normalize_spec(bmc["specs"][0])
        example = json.loads(BURN_IN_TEMPLATE.read_text())
        example["server"].update(
            name=spec["name"],
            bmc={**example["server"].get("bmc", {}), "url": bmc["servers"][spec["name"]]},
            expected={"gpus": spec["gpus"], "gpu_model": spec["gpu_model"], "firmware": spec["firmware"]},
        )
        path = self.state_dir / "examples" / "server-burn-in.json"
        path.parent.mkdir(exist_ok=True)
        path.write_text(json.dumps(example, indent=2) + "\n")
        return path

    async def seed_if_fresh(self, url: str, fresh: bool) -> str:
        from lab.fleet import load_fleet
        from lab.k8s.admin import EmulatorAdmin

        fleet = load_fleet(str(self.fleet))
        if fresh:
            async with EmulatorAdmin(url) as admin:
                await admin.seed(fleet.to_objects())
            say(f"seeded the Kubernetes emulator from {self.fleet}")
        else:
            say("kept the Kubernetes emulator's saved objects (use `millwright lab seed FILE --reset` to reload a fleet)")
        return fleet.cluster

    def write_kubeconfig(self, url: str, cluster: str) -> Path:
        import yaml

        from lab.k8s.admin import kubeconfig

        path = self.state_dir / "kubeconfig"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(yaml.safe_dump(kubeconfig(url, cluster), sort_keys=False))
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
        return path

    async def start_netbox(self) -> dict[str, str] | None:
        """NetBox with its PostgreSQL and Redis; None (and one line why) when a piece is missing here."""
        from lab.netbox import NetBoxError, NetBoxLab, NetBoxUnavailable, check_available, write_token_file

        try:
            await asyncio.to_thread(check_available)
        except NetBoxUnavailable as err:
            say(f"NetBox not started: {err}")
            return None
        say("starting NetBox (the first start builds its venv and database: minutes, then cached)")
        nb = NetBoxLab(self.state_dir / "netbox", keep_data=True)
        self.netbox_lab = nb
        try:
            await asyncio.to_thread(nb.start)
        except NetBoxError as err:
            raise LabError(f"NetBox did not start: {err}") from None
        for name, proc in nb._procs.items():
            self.children["netbox" if name == "netbox" else f"netbox-{name}"] = Child(
                "netbox" if name == "netbox" else f"netbox-{name}", proc, nb._log(name)
            )
        token = write_token_file(nb.root / "token", nb.token)
        self.save()
        return {"url": nb.url, "token": f"file:{token.resolve()}"}

    def stop_netbox(self) -> None:
        if self.netbox_lab is not None:
            self.netbox_lab.stop()
            for name in [n for n in self.children if n.startswith("netbox")]:
                del self.children[name]

    def start_worker(self, address: str, kubeconfig: Path, metrics_port: int, netbox: dict[str, str] | None = None,
                     bmc_credentials: str | None = None) -> Child:
        toml = self.state_dir / "temporal.toml"
        toml.write_text(f'[profile.default]\naddress = "{address}"\nnamespace = "default"\n')
        env = _child_env()
        for key in [k for k in env if k.startswith("TEMPORAL_")]:
            del env[key]  # never inherit a production profile, API key or TLS settings
        env.update(
            TEMPORAL_CONFIG_FILE=str(toml),
            TEMPORAL_ADDRESS=address,
            TEMPORAL_NAMESPACE="default",
            MILLWRIGHT_KUBECONFIG=str(kubeconfig),
            MILLWRIGHT_TASK_QUEUE=self.task_queue,
            MILLWRIGHT_METRICS_HOST=LOOPBACK,
            MILLWRIGHT_METRICS_PORT=str(metrics_port),
            MILLWRIGHT_SHUTDOWN_GRACE_SECONDS=str(WORKER_GRACE_SECONDS),
        )
        for key in ("MILLWRIGHT_NETBOX_URL", "MILLWRIGHT_NETBOX_TOKEN"):
            env.pop(key, None)  # the lab's NetBox or none, never an inherited production one
        if netbox:
            env.update(MILLWRIGHT_NETBOX_URL=netbox["url"], MILLWRIGHT_NETBOX_TOKEN=netbox["token"])
        env.pop("MILLWRIGHT_BMC_CREDENTIALS", None)  # the lab's BMCs' or none
        if bmc_credentials:
            env["MILLWRIGHT_BMC_CREDENTIALS"] = bmc_credentials
        return self.spawn("worker", [sys.executable, "-m", "worker"], env=env)

    async def wait_worker_polling(self, address: str) -> None:
        from temporalio.api.enums.v1 import TaskQueueType
        from temporalio.api.taskqueue.v1 import TaskQueue
        from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
        from temporalio.client import Client

        client = await Client.connect(address)
        request = DescribeTaskQueueRequest(
            namespace="default",
            task_queue=TaskQueue(name=self.task_queue),
            task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW,
        )
        worker_pid = self.children["worker"].pid
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            self.check_children()
            resp = await client.workflow_service.describe_task_queue(request)
            if any(str(worker_pid) in p.identity for p in resp.pollers):
                return
            await asyncio.sleep(0.2)
        raise LabError(f"the worker did not start polling in {self.timeout:.0f}s; see {self.children['worker'].log}")

    # -------------------------------------------------------------- run

    async def run(self) -> int:
        notes: list[str] = []
        taken: set[int] = set()
        port = choose_port(self.port, "Temporal", taken, notes)
        ui_port = choose_port(self.ui_port, "the Temporal UI", taken, notes)
        metrics_port = free_port(avoid=taken)
        for note in notes:
            say(note)

        server = DevServer(self.state_dir, port, ui_port)
        fresh_k8s = not (self.state_dir / "k8s-state.json").exists()
        self.info = {
            "state_dir": str(self.state_dir.resolve()),
            "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "temporal": {"address": server.address, "namespace": "default", "db": str(server.db_file.resolve())},
            "ui": server.ui_url,
            "task_queue": self.task_queue,
            "logs": {},
        }
        proc = server.start()
        self.children["temporal"] = Child("temporal", proc, server.log_file)
        self.save()

        k8s_url = await self.start_kubernetes()
        cluster = await self.seed_if_fresh(k8s_url, fresh_k8s)
        kubeconfig = self.write_kubeconfig(k8s_url, cluster)
        self.info["kubernetes"] = {"url": k8s_url, "cluster": cluster, "state": str((self.state_dir / "k8s-state.json").resolve())}
        self.info["kubeconfig"] = str(kubeconfig.resolve())
        self.save()

        bmc = await self.start_bmcs()
        example: Path | None = None
        if bmc:
            example = self.write_burn_in_example(bmc)
            self.info["bmc"] = {k: v for k, v in bmc.items() if k != "specs"}
            self.info["examples"] = {"server-burn-in": str(example.resolve())}
            self.save()

        netbox = await self.start_netbox() if self.netbox else None
        if netbox:
            self.info["netbox"] = {"url": netbox["url"], "token": netbox["token"]}  # a reference, not the token
            self.save()

        await server.wait_healthy(self.timeout)
        self.start_worker(server.address, kubeconfig, metrics_port, netbox, bmc["credentials"] if bmc else None)
        self.info["worker"] = {"metrics": f"http://{LOOPBACK}:{metrics_port}/metrics", "task_queue": self.task_queue}
        if bmc:
            await self.start_hosts(server.address, bmc["admin"])
        self.info["logs"] = {n: str(c.log.resolve()) for n, c in self.children.items()}
        self.save()
        await self.wait_worker_polling(server.address)

        self.info["ready"] = True
        self.save()
        say("ready")
        print(f"  Temporal UI:   {server.ui_url}", flush=True)
        print(f"  Temporal:      {server.address} (namespace default, task queue {self.task_queue})", flush=True)
        print(f"  Kubernetes:    {k8s_url} (cluster {cluster!r})", flush=True)
        print(f"  kubeconfig:    {kubeconfig.resolve()}", flush=True)
        print(f"  worker:        metrics {self.info['worker']['metrics']}, logs in {self.state_dir}/", flush=True)
        if netbox:
            print(f"  NetBox:        {netbox['url']} (token: {netbox['token']})", flush=True)
        if bmc:
            print(f"  BMCs:          {len(bmc['servers'])} servers (admin {bmc['admin']}, credentials "
                  f"{bmc['credentials']}); host agents for the powered-on ones; `millwright lab status` lists them",
                  flush=True)  # fmt: skip
        where = "" if self.state_dir == Path(".millwright") else f" --state-dir {self.state_dir}"
        print(f"  try:           {EXAMPLE}{where}", flush=True)
        if example:
            print(f"  burn in:       millwright start ServerBurnIn --input {self.state_dir / 'examples' / example.name}"
                  f"{where} --watch   (or paste that file in the UI: Start Workflow, type ServerBurnIn)", flush=True)
        print(f"  stop:          Ctrl-C, or `millwright lab down{where}`", flush=True)

        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        while not stop.is_set():
            dead = self.dead_child()
            if dead:
                say(f"the {dead.name} (pid {dead.pid}) exited with code {dead.process.returncode}; see {dead.log}")
                say("stopping the rest of the lab")
                return 1
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.5)
        say("stopping")
        return 0

    def stop_children(self) -> None:
        """Worker first (graceful), then the emulator and the server; SIGKILL after a timeout."""
        for group, timeout in ((["worker", "hosts"], WORKER_GRACE_SECONDS + 5), (["kubernetes", "bmcs", "temporal"], 15)):
            procs = [self.children[n] for n in group if n in self.children and self.children[n].process.poll() is None]
            for child in procs:
                _signal(child.pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout
            for child in procs:
                try:
                    child.process.wait(max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    say(f"the {child.name} (pid {child.pid}) did not stop in {timeout}s; killing it")
                    _signal(child.pid, signal.SIGKILL)
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        child.process.wait(5)


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), *filter(None, [env.get("PYTHONPATH")])])
    return env


@contextlib.contextmanager
def _lock(state_dir: Path):
    """Held for the whole life of `lab up`: a second `lab up` on the same state dir cannot start twins."""
    fh = open(state_dir / "lab.lock", "a+")
    try:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        fh.close()


def up(
    *,
    state_dir: Path,
    fleet: Path | None = None,
    port: int = 7233,
    ui_port: int = 8233,
    task_queue: str = "millwright",
    timeout: float = 60.0,
    netbox: bool = False,
) -> int:
    state_dir.mkdir(parents=True, exist_ok=True)
    fleet = fleet or DEFAULT_FLEET
    if not fleet.is_file():
        say(f"error: fleet file {fleet} not found")
        return 2
    with _lock(state_dir) as locked:
        info = read_info(state_dir) or {}
        alive = live_pids(info)
        if not locked or alive:
            listed = ", ".join(f"{n} {p}" for n, p in alive.items()) or "starting"
            if locked:  # the runner is gone but some of its children are not
                say(f"processes of a previous lab from {state_dir} are still running (pids: {listed})")
            else:
                say(f"a lab is already running from {state_dir} (pids: {listed})")
            if info.get("ui"):
                say(f"its UI: {info['ui']}")
            say(f"stop it with `millwright lab down --state-dir {state_dir}`")
            return 1
        lab_file(state_dir).unlink(missing_ok=True)  # stale: nothing it names is alive

        lab = Lab(state_dir, fleet, port, ui_port, task_queue, timeout, netbox=netbox)
        say(f"starting in {state_dir} (logs there)")
        signal.signal(signal.SIGTERM, _interrupt)  # `lab down` during startup still cleans up
        code = 1
        try:
            code = asyncio.run(lab.run())
        except LabError as err:
            say(f"error: {err}")
            code = 1
        except KeyboardInterrupt:
            say("interrupted; stopping")
            code = 130
        except Exception as err:
            say(f"error: {type(err).__name__}: {err}")
            code = 1
        finally:
            with _ignore_signals():
                lab.stop_children()
                lab.stop_netbox()
                lab_file(state_dir).unlink(missing_ok=True)
            say("stopped")
        return code


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


@contextlib.contextmanager
def _ignore_signals():
    """A second Ctrl-C during shutdown must not leave orphans behind."""
    old = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


# ---------------------------------------------------------------- down, seed, status


def down(*, state_dir: Path, timeout: float = 30.0) -> int:
    info = read_info(state_dir)
    if info is None:
        say(f"no lab running from {state_dir}")
        return 0
    alive = live_pids(info)
    runner = alive.pop("runner", None)
    if runner:  # the runner stops its children in order
        _signal(runner, signal.SIGTERM)
        left = _wait_gone({"runner": runner}, timeout)
        if left:
            say(f"the lab runner (pid {runner}) did not stop in {timeout:.0f}s; killing it")
            _signal(runner, signal.SIGKILL)
    alive = {n: p for n, p in alive.items() if pid_alive(p, MARKERS.get(n))}
    for name in STOP_ORDER:
        if name in alive:
            _signal(alive[name], signal.SIGTERM)
    left = _wait_gone(alive, timeout)
    for name, pid in left.items():
        say(f"the {name} (pid {pid}) did not stop in {timeout:.0f}s; killing it")
        _signal(pid, signal.SIGKILL)
    _wait_gone(left, 5)
    lab_file(state_dir).unlink(missing_ok=True)
    say("stopped")
    return 0


def seed(*, state_dir: Path, fleet: Path, reset: bool = False) -> int:
    info = read_info(state_dir)
    url = ((info or {}).get("kubernetes") or {}).get("url")
    if not info or not url or not live_pids(info).get("kubernetes"):
        say(f"error: no running lab with a Kubernetes emulator in {state_dir} (start one with `millwright lab up`)")
        return 1
    from lab.fleet import load_fleet
    from lab.k8s.admin import EmulatorAdmin

    try:
        loaded = load_fleet(str(fleet))
        objects = loaded.to_objects()
    except Exception as err:
        say(f"error: cannot load fleet {fleet}: {err}")
        return 2

    async def go() -> None:
        async with EmulatorAdmin(url) as admin:
            if reset:
                await admin.reset()
            await admin.seed(objects)

    try:
        asyncio.run(go())
    except Exception as err:
        say(f"error: seeding {url} failed: {err}")
        return 1
    if loaded.cluster != info["kubernetes"].get("cluster"):
        say(f"note: this fleet's cluster is {loaded.cluster!r}; the lab's kubeconfig context is {info['kubernetes'].get('cluster')!r}")
    say(f"seeded {len(objects)} objects from {fleet} into {url}")
    return 0


def status(*, state_dir: Path) -> int:
    info = read_info(state_dir)
    if not info:
        say(f"no lab running from {state_dir}")
        return 1
    alive = live_pids(info)
    pids = info.get("pids") or {}
    running = "runner" in alive
    say(f"{'running' if running else 'NOT running (stale lab.json)'} from {info.get('state_dir', state_dir)}, since {info.get('started_at')}")
    print(f"  Temporal UI:   {info.get('ui')}")
    print(f"  Temporal:      {(info.get('temporal') or {}).get('address')}")
    if info.get("kubernetes"):
        print(f"  Kubernetes:    {info['kubernetes'].get('url')} (cluster {info['kubernetes'].get('cluster')!r})")
    if info.get("kubeconfig"):
        print(f"  kubeconfig:    {info['kubeconfig']}")
    if info.get("netbox"):
        print(f"  NetBox:        {info['netbox'].get('url')} (token: {info['netbox'].get('token')})")
    if info.get("worker"):
        print(f"  worker:        metrics {info['worker'].get('metrics')}, task queue {info['worker'].get('task_queue')}")
    if info.get("bmc"):
        print(f"  BMC admin:     {info['bmc'].get('admin')} (credentials {info['bmc'].get('credentials')})")
        for node, url in (info["bmc"].get("servers") or {}).items():
            print(f"  BMC {node}: {url}")
    if (info.get("examples") or {}).get("server-burn-in"):
        print(f"  burn-in input: {info['examples']['server-burn-in']}")
    for name, pid in pids.items():
        print(f"  {name + ':':<14} pid {pid} {'alive' if name in alive else 'GONE'}")
    return 0 if running else 1
