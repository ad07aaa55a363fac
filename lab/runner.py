"""`millwright lab up|down|seed|status`: the emulated AI factory on 127.0.0.1.

`up` starts every service, each child in its own session so a Ctrl-C reaches only the runner, which then stops
them in order (worker first, so in-flight activities can finish). The services (`SERVICES`), each of the optional
ones left out with ``--without NAME,...``:

- ``temporal``: the Temporal dev server with its Web UI (`lab.temporal.DevServer`), SQLite in the state dir;
- ``kubernetes``: the Kubernetes emulator (`python -m lab.k8s`) as the management cluster: the fleet's nodes and
  workloads, and the Cluster API, Metal3, KAI, Kyverno and vCluster kinds (lab/k8s/crds.py), its objects kept in
  the state dir;
- ``nvl72``: a second Kubernetes emulator beside it, a small GB200 NVL72 cluster (lab/nvl72.py: 4 racks of 18
  trays with clique and Topograph labels, training gangs on every tray as KAI PodGroups), context ``nvl72`` in the
  lab's kubeconfig, its objects kept in the state dir; with it ``nvl72-bmcs``, the BMC of each of its compute and
  NVLink switch trays (`python -m lab.redfish`, one port each, knowing its rack and slot; the credentials, CA and
  power delay of the ``bmcs``), and ``nvl72-racks`` (`python -m lab.rack_fabric`): the trays' power reaching their
  nodes, and NVLink fabric faults of a whole rack, injected at ``POST <its url>/_lab/racks/<rack>/fabric-fault``;
- ``bmcs``: the BMCs of the fleet's GPU nodes (`python -m lab.redfish`: one Redfish service per node, named like
  the node, powered On), answering HTTPS with a certificate of the lab CA (lab/tls.py, in ``<state-dir>/tls``;
  ``--bmc-http`` or the fleet's ``"bmc": {"https": false}``: plain HTTP), credentials generated per `lab up` into
  ``<state-dir>/bmc/credentials`` (0600, ``user:password``); a server's power reaches its Kubernetes node
  (lab/node_power.py: NotReady while Off, a new boot ID at each power-on); and ``hosts``, the host agents of the
  powered-on servers (`python -m lab.hosts`), left out with them;
- ``ufm``: the UFM emulator (`python -m lab.ufm`, HTTPS with a lab CA certificate) holding the fleet's InfiniBand
  fabric (its ``infiniband`` part: the same port GUIDs as NetBox's interfaces), credentials in
  ``<state-dir>/ufm/credentials``;
- ``webhook``: a webhook receiver (`python -m lab.webhook`) on 127.0.0.1:9000 (the examples' address; another port
  when that one is taken), whose deliveries `lab status` lists;
- ``prometheus``: Debian's Prometheus server (`python -m lab.prometheus`: a generated config, its data in
  ``<state-dir>/prometheus``) scraping dcgm-exporter on every GPU node and KAI's queue metrics (both served by the
  Kubernetes emulator from its nodes, pods and Queues: lab/k8s/dcgm.py) and the worker's ``/metrics``; the
  remediation sweep reads GPU faults from it;
- ``netbox``: a real NetBox (`lab.netbox.NetBoxLab`: its own PostgreSQL and Redis, its data kept in the state dir),
  started in the background: its first start builds a venv and migrates a database (minutes, once, cached), and the
  rest of the lab is usable meanwhile. Its address is a `lab.netbox.NetBoxGate` from the first second, answering
  503 "NetBox is starting (...)" until NetBox runs and holds the lab's inventory (`lab.netbox.seed_inventory`: the
  bootstrap, the fleet's devices with BMC URLs and InfiniBand ports); its API token is in
  ``<state-dir>/netbox/token`` (0600);
- ``worker``: one Millwright worker (`python -m worker`) configured for all of them, secrets and CA bundles as
  references (``file:<path>``), never values.

``--sites N`` (N >= 2; `Lab.run_sites`) plays issue 42's sites instead: per site ``site-<i>`` its own emulator
(cluster ``lab-<i>``, callers named by a token file), BMCs (their own credentials) and a site worker
(``MILLWRIGHT_SITE``) given only that site's kubeconfig and credentials, each service named ``site-<i>/<service>``
with its files in ``<state-dir>/site-<i>/``; a central worker with ``<state-dir>/site-map.json`` and neither; the
webhook receiver; not NetBox, UFM, Prometheus, NVL72 or the host agents (docs/lab.md, "Several sites").

A service whose system pieces are missing here (NetBox without PostgreSQL or redis-server, Prometheus without
its Debian package) is left out with one line
saying why and what to install. `<state-dir>/lab.json` records every service's state and address and every pid
while the lab runs; `status` and `down` read it. `<state-dir>/examples/` holds the examples that need this lab's
values (a BMC URL, the webhook receiver's address), written at each `up`.

Longer than 600 lines because `Lab` is one start-up sequence, each step a short method that hands
the next one its addresses and secrets, and `down`/`seed`/`status` read the same `lab.json` it writes; every
service it starts lives in its own module (the list above).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from activities.sites import site_task_queue
from lab.loopback import LOOPBACK, free_port, write_secret_file
from lab.temporal import DevServer, LabError, choose_port, task_queue_poller_identities

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_FLEET = Path(__file__).resolve().parent / "fleets" / "demo.json"
EXAMPLES = REPO_ROOT / "examples"
EXAMPLE = "millwright start NodeMaintenance --input examples/node-maintenance.json"
BURN_IN_TEMPLATE = EXAMPLES / "server-burn-in.json"
FIRMWARE_TEMPLATE = EXAMPLES / "firmware-update.json"
FLEET_FIRMWARE_TEMPLATE = EXAMPLES / "fleet-firmware-update.json"
ROLLOUT_TEMPLATE = EXAMPLES / "rollout.json"  # a multi-site lab's campaign rolls it out
# The copies with the BMCs' URLs (the last: `rack remediate`'s settings for the NVL72 cluster's first rack)
BMC_EXAMPLES = ("server-burn-in", "firmware-update", "fleet-firmware-update", "rack-001-remediation")
WEBHOOK_PORT = 9000  # the examples' webhook address, http://127.0.0.1:9000/hooks/ops
WEBHOOK_IN_EXAMPLES = f"http://{LOOPBACK}:{WEBHOOK_PORT}"
BMC_USER = "admin"
UFM_USER = "admin"
WORKER_GRACE_SECONDS = 10
# The lab cluster's disruption budget, declared by the lab as its operator: two nodes at once, what the examples'
# rollout asks for itself (docs/disruption-budget.md: the operator's 10% default would allow one).
LAB_BUDGET_NODES = 2
NVL72_CLUSTER = "nvl72"  # the NVL72 cluster's kubeconfig context
NVL72_RACKS = 4
NVL72_SEED = 4  # a mix: two racks shared by two half-rack jobs each, and a job of two domains
NVL72_SPLIT_RACKS = 1
POWER_POLL_SECONDS = 0.5  # how often the lab reads the BMCs' power for the nodes (lab/node_power.py)
SERVICES = {
    "temporal": "Temporal dev server and Web UI",
    "kubernetes": "Kubernetes emulator (management cluster)",
    "nvl72": "Kubernetes emulator (NVL72 cluster)",
    "nvl72-bmcs": "Redfish BMCs of the NVL72 trays",
    "nvl72-racks": "NVL72 trays' power and NVLink fabric faults",
    "bmcs": "Redfish BMCs of the GPU nodes",
    "hosts": "host agents of the powered-on servers",
    "ufm": "UFM emulator (InfiniBand fabric)",
    "webhook": "webhook receiver",
    "prometheus": "Prometheus (dcgm-exporter's GPU series)",
    "netbox": "NetBox (inventory)",
    "worker": "Millwright worker",
}
# `--without` names, with what goes along
OPTIONAL = {"netbox": (), "ufm": (), "webhook": (), "prometheus": (), "nvl72": ("nvl72-bmcs", "nvl72-racks"),
            "bmcs": ("hosts",)}  # fmt: skip
# What each recorded pid's command line must contain, so a recycled pid is never signalled.
MARKERS = {
    "runner": "lab", "temporal": "start-dev", "kubernetes": "lab.k8s", "nvl72": "lab.k8s", "worker": "worker",
    "netbox": "runserver", "netbox-redis": "redis-server", "netbox-postgres": "postgres", "netbox-migrate": "migrate",
    "bmcs": "lab.redfish", "hosts": "lab.hosts", "ufm": "lab.ufm", "webhook": "lab.webhook",
    "prometheus": "lab.prometheus", "nvl72-bmcs": "lab.redfish", "nvl72-racks": "lab.rack_fabric",
}  # fmt: skip
# `--sites N`: sites `site-1`..`site-N`, each with its own emulator (cluster `lab-<i>`), BMCs and worker; the services
# a site has are named `<site>/<service>`. What a multi-site lab leaves out, and why:
SITE_SERVICES = ("kubernetes", "bmcs", "worker")
NOT_IN_SITES = {"netbox": "one inventory of one fleet", "ufm": "one fabric of one fleet",
                "prometheus": "scrapes one cluster", "nvl72": "one cluster beside the management cluster",
                "nvl72-bmcs": "with nvl72", "nvl72-racks": "with nvl72",
                "hosts": "host agents follow one BMC lab"}  # fmt: skip
LAB_ADMIN = "lab-admin"  # the lab's own identity (its power link, your kubectl) in each site's emulator
SITE_MAP = "site-map.json"  # in the state dir: the central worker's MILLWRIGHT_SITE_MAP
# A site's worker that exits is started again this much later: past the central worker's first pickup (30 s), so a
# site's runs show it cut off before it comes back.
SITE_WORKER_RESTART_SECONDS = 60.0
STOP_ORDER = ["worker", "hosts", "nvl72-racks", "kubernetes", "nvl72", "bmcs", "nvl72-bmcs", "ufm", "webhook",
              "prometheus", "temporal", "netbox-migrate", "netbox", "netbox-redis", "netbox-postgres"]  # fmt: skip


def kind_of(name: str) -> str:
    """A service's kind: `site-1/worker` is a worker."""
    return name.rsplit("/", 1)[-1]


def described(name: str) -> str:
    """What a service is, with its site: `site-1/bmcs` is the Redfish BMCs of the GPU nodes of site-1."""
    kind = kind_of(name)
    return SERVICES.get(kind, name) + ("" if kind == name else f" of {name.split('/')[0]}")


def stop_rank(name: str) -> int:
    kind = kind_of(name)
    return STOP_ORDER.index(kind) if kind in STOP_ORDER else len(STOP_ORDER)


def site_names(count: int) -> list[str]:
    return [f"site-{i}" for i in range(1, count + 1)]


def write_site_map(path: Path, sites: dict[str, tuple[str, Iterable[str]]]) -> Path:
    """A MILLWRIGHT_SITE_MAP (activities/sites.py) of sites that each hold one cluster and the BMCs at these URLs
    (by their host:port), as the lab and the tests' two sites have them: site -> (cluster, BMC URLs)."""
    from urllib.parse import urlsplit

    doc = {"sites": {name: {"clusters": [cluster], "bmcs": sorted(urlsplit(url).netloc for url in urls)}
                     for name, (cluster, urls) in sites.items()}}  # fmt: skip
    path.write_text(json.dumps(doc, indent=2) + "\n")
    return path


def say(msg: str) -> None:
    print(f"lab: {msg}", flush=True)


def parse_without(values: list[str]) -> set[str]:
    """`--without netbox,ufm` (repeatable) as service names, with what goes along; LabError naming the known ones."""
    names = {n.strip() for v in values for n in v.split(",") if n.strip()}
    unknown = sorted(names - set(OPTIONAL))
    if unknown:
        raise LabError(f"--without {', '.join(unknown)}: not a service the lab can leave out; those are "
                       f"{', '.join(OPTIONAL)}")  # fmt: skip
    return names | {extra for n in names for extra in OPTIONAL[n]}


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
    return {name: pid for name, pid in pids.items() if pid_alive(pid, MARKERS.get(kind_of(name)))}


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def _wait_gone(pids: dict[str, int], timeout: float) -> dict[str, int]:
    deadline = time.monotonic() + timeout
    remaining = dict(pids)
    while remaining and time.monotonic() < deadline:
        remaining = {n: p for n, p in remaining.items() if pid_alive(p, MARKERS.get(kind_of(n)))}
        if remaining:
            time.sleep(0.1)
    return remaining


# ---------------------------------------------------------------- up


@dataclass
class Child:
    name: str
    process: subprocess.Popen
    log: Path
    argv: list[str] = field(default_factory=list)
    env: dict[str, str] | None = None

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
    without: set[str] = field(default_factory=set)
    bmc_http: bool = False
    sites: int = 0  # `--sites N`: N sites (0: the one-site lab)
    admin_token: str = ""  # with sites: the lab's own identity in every site's emulator (never in lab.json)
    bmc_password: str | None = None  # this `up`'s, for every BMC it runs (`bmc_lab`)
    children: dict[str, Child] = field(default_factory=dict)
    _restarts: dict[str, Child] = field(default_factory=dict)  # sites' workers that exited, until started again
    info: dict[str, Any] = field(default_factory=dict)
    netbox_lab: Any = None  # lab.netbox.NetBoxLab once starting
    started: float = field(default_factory=time.monotonic)
    _netbox_shown: tuple[str, float] = ("", 0.0)  # the stage kind last printed, and when

    def __post_init__(self) -> None:
        # Every path handed to a server is absolute: children run from the repository root, and Prometheus resolves
        # relative paths in its config against the config's folder (a relative .millwright broke `lab up`)
        self.state_dir = self.state_dir.absolute()

    def save(self) -> None:
        pids = {n: c.pid for n, c in self.children.items()}
        if self.netbox_lab is not None:  # while it starts, its processes so far
            pids = {("netbox" if n == "netbox" else f"netbox-{n}"): p for n, p in self.netbox_lab.pids.items()} | pids
        self.info["pids"] = {"runner": os.getpid(), **pids}
        write_info(self.state_dir, self.info)

    def service(self, name: str, state: str, note: str = "", **facts: Any) -> None:
        """Record a service's state (starting, ready, left out, unavailable, failed) with a note and its facts."""
        entry = self.info.setdefault("services", {}).setdefault(name, {})
        entry.update(state=state, note=note, **facts)
        self.save()

    def leave_out(self, name: str, why: str) -> None:
        self.service(name, "left out", why)
        say(f"{described(name)} left out: {why}")

    def spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Child:
        log = self.state_dir / f"{name}.log"  # a site's service: in the site's folder
        log.parent.mkdir(parents=True, exist_ok=True)
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
        child = Child(name, proc, log, argv, env)
        self.children[name] = child
        self.save()
        return child

    def dead_child(self) -> Child | None:
        for child in list(self.children.values()):
            if child.process.poll() is not None:
                return child
        return None

    def check_children(self) -> None:
        dead = self.dead_child()
        if dead:
            raise LabError(
                f"the {dead.name} (pid {dead.pid}) exited with code {dead.process.returncode}; see {dead.log}"
                + "".join(f"\n  {line}" for line in log_tail(dead.log))
            )

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

    async def start_server(
        self, name: str, module: str, ready: Path, args: list[str], env: dict[str, str] | None = None
    ) -> str:
        """`python -m module --ready-file F ...args` as child `name`; its URL once ready."""
        ready.parent.mkdir(parents=True, exist_ok=True)
        ready.unlink(missing_ok=True)
        child = self.spawn(name, [sys.executable, "-m", module, "--ready-file", str(ready), *args],
                           env={**_child_env(), **(env or {})})  # fmt: skip
        return str((await self.wait_ready(child, ready, f"the {SERVICES[kind_of(name)]} ({name})"))["url"])

    async def start_kubernetes(self) -> str:
        return await self.start_server(
            "kubernetes",
            "lab.k8s",
            self.state_dir / "k8s.ready.json",
            ["--host", LOOPBACK, "--port", "0", "--state-file", str(self.state_dir / "k8s-state.json")],
        )

    async def start_nvl72(self) -> str:
        """The NVL72 cluster's emulator, seeded when fresh with `NVL72_RACKS` racks and their training gangs."""
        from lab.k8s.admin import EmulatorAdmin
        from lab.nvl72 import nvl72_objects

        self.service("nvl72", "starting")
        state = self.state_dir / "nvl72-state.json"
        fresh = not state.exists()
        url = await self.start_server("nvl72", "lab.k8s", self.state_dir / "nvl72.ready.json",
                                      ["--host", LOOPBACK, "--port", "0", "--state-file", str(state)])  # fmt: skip
        made = nvl72_objects(NVL72_RACKS, NVL72_SEED, cluster=NVL72_CLUSTER, split_racks=NVL72_SPLIT_RACKS)
        if fresh:
            async with EmulatorAdmin(url) as admin:
                await admin.seed(made.objects)
        what = f"{NVL72_RACKS} GB200 NVL72 racks, {len(made.racks)} trays, {len(made.jobs)} training gangs under KAI"
        self.info["nvl72"] = {"url": url, "cluster": NVL72_CLUSTER, "state": str(state.resolve()), "holds": what}
        self.service("nvl72", "ready", f"cluster {NVL72_CLUSTER!r}: {what}", url=url)
        return url

    def lab_ca(self) -> Any:
        from lab.tls import LabCa

        return LabCa(self.state_dir / "tls")

    def tls_arguments(self, name: str) -> list[str]:
        """--tls-cert/--tls-key of a certificate of the lab CA for 127.0.0.1 (a fresh one at each `up`)."""
        from lab.tls import LabTlsError, arguments

        try:
            return arguments(self.lab_ca().issue(name, [LOOPBACK]))
        except LabTlsError as err:
            raise LabError(f"the {SERVICES[name]} cannot answer HTTPS: {err}") from None

    async def start_bmcs(self, fleet: Any) -> dict[str, Any] | None:
        """The fleet's GPU nodes' BMCs, powered On, with fresh credentials; None when the fleet turns them off."""
        servers = fleet.bmc_servers()
        if not servers:
            self.leave_out("bmcs", 'the fleet turns its BMCs off ("bmc": {"enabled": false})')
            self.leave_out("hosts", "no BMCs")
            return None
        # The firmware example's images, on the lab's image server (lab/bmc_update.py): each installs its version.
        bundle = json.loads(FIRMWARE_TEMPLATE.read_text())["bundle"]["components"]
        images = {c["image_uri"]: {"version": c["version"]} for c in bundle}
        bmc = await self.bmc_lab("bmcs", servers, fleet, images)
        self.info["bmc"] = bmc
        self.service("bmcs", "ready", f"{len(servers)} servers, {self.bmc_scheme(fleet)}", url=bmc["admin"])
        return {**bmc, "specs": servers}

    def bmc_scheme(self, fleet: Any) -> str:
        return "HTTPS (lab CA)" if fleet.bmc.https and not self.bmc_http else "plain HTTP"

    async def bmc_lab(self, name: str, servers: list[dict], fleet: Any, images: dict | None = None,
                      site: str | None = None) -> dict[str, Any]:  # fmt: skip
        """`python -m lab.redfish` as service `name`, holding `servers`, with this `up`'s BMC credentials (written
        into `<state-dir>/bmc/credentials` at the first call; a `site`'s own user and password in
        `<state-dir>/<site>/bmc/credentials`) and the fleet's BMC settings; what the lab records of it: its admin URL,
        the credentials and CA as references, the power delay, each server's URL."""
        import httpx

        https = fleet.bmc.https and not self.bmc_http
        self.service(name, "starting", "HTTPS" if https else "plain HTTP")
        root = self.state_dir / (f"{site}/bmc" if site else "bmc")
        root.mkdir(parents=True, exist_ok=True)
        credentials = (root / "credentials").resolve()
        if site:  # another user and password at every site
            user, password = f"{BMC_USER}-{site}", secrets.token_urlsafe(18)
            write_secret_file(credentials, f"{user}:{password}")
        else:
            user = BMC_USER
            if self.bmc_password is None:
                self.bmc_password = secrets.token_urlsafe(18)
                write_secret_file(credentials, f"{user}:{self.bmc_password}")
            password = self.bmc_password
        prefix = "" if name == "bmcs" or site else f"{name}-"
        (root / f"{prefix}servers.json").write_text(json.dumps(servers, indent=2) + "\n")
        admin = await self.start_server(
            name, "lab.redfish", root / f"{prefix}ready.json",
            ["--host", LOOPBACK, "--port", "0", "--servers-file", str(root / f"{prefix}servers.json"),
             "--power-delay", str(fleet.bmc.power_delay),
             *(self.tls_arguments("bmc") if https else [])],
            env={"LAB_BMC_USER": user, "LAB_BMC_PASSWORD": password},  # never on a command line
        )  # fmt: skip
        async with httpx.AsyncClient(trust_env=False, timeout=10) as http:
            views = (await http.get(f"{admin}/_lab/servers", params={"fields": "url"})).raise_for_status().json()
            if images:
                (await http.put(f"{admin}/_lab/images", json=images)).raise_for_status()
        return {
            "admin": admin,
            "credentials": f"file:{credentials}",  # a reference, never the password
            "ca_bundle": self.lab_ca().reference if https else None,
            "power_delay": fleet.bmc.power_delay,
            "servers": {s["name"]: views["servers"][s["name"]]["url"] for s in servers},
        }

    async def start_nvl72_racks(self, url: str, fleet: Any) -> None:
        """The NVL72 trays' BMCs (`nvl72-bmcs`), and `nvl72-racks`: their power reaching the nodes, the racks'
        fabric faults (lab/rack_fabric.py). lab.json's `nvl72.bmc` has each node's BMC URL (`servers`) and each
        rack's switch trays' (`switch_trays`)."""
        from lab.nvl72 import Nvl72Fleet

        racks = Nvl72Fleet(cluster=NVL72_CLUSTER, racks=NVL72_RACKS, seed=NVL72_SEED, split_racks=NVL72_SPLIT_RACKS)
        specs = racks.bmc_specs()
        bmc = await self.bmc_lab("nvl72-bmcs", specs, fleet)
        switches = {rack: racks.switch_tray_names(rack) for rack in racks.rack_names()}
        tray_urls = bmc.pop("servers")
        bmc["servers"] = {n: tray_urls[n] for nodes in racks.layout().values() for n in nodes}
        bmc["switch_trays"] = {rack: {t: tray_urls[t] for t in trays} for rack, trays in switches.items()}
        self.info["nvl72"]["bmc"] = bmc
        self.service("nvl72-bmcs", "ready", f"{len(bmc['servers'])} compute and "
                     f"{sum(map(len, switches.values()))} NVLink switch trays, {self.bmc_scheme(fleet)}",
                     url=bmc["admin"])  # fmt: skip
        self.service("nvl72-racks", "starting")
        fabric = await self.start_server(
            "nvl72-racks", "lab.rack_fabric", self.state_dir / "nvl72-racks.ready.json",
            ["--host", LOOPBACK, "--port", "0", "--emulator-url", url, "--bmc-admin", bmc["admin"],
             "--cluster", NVL72_CLUSTER, "--racks", str(NVL72_RACKS), "--seed", str(NVL72_SEED),
             "--split-racks", str(NVL72_SPLIT_RACKS), "--poll-interval", str(POWER_POLL_SECONDS)],
        )  # fmt: skip
        self.info["nvl72"]["racks"] = fabric
        self.service("nvl72-racks", "ready", f"fault a rack: POST {fabric}/_lab/racks/<rack>/fabric-fault; GET "
                     f"{fabric}/_lab/racks/<rack>", url=fabric)  # fmt: skip

    async def start_hosts(self, address: str, bmc_admin: str) -> None:
        """`python -m lab.hosts`: a host agent for each powered-on server; ready once they all poll."""
        self.service("hosts", "starting")
        await self.start_server("hosts", "lab.hosts", self.state_dir / "bmc" / "hosts.ready.json",
                                ["--temporal", address, "--bmc-admin", bmc_admin,
                                 "--startup-timeout", str(self.timeout)])  # fmt: skip
        self.service("hosts", "ready", "an agent per powered-on server, on millwright-host-<node>")

    async def start_ufm(self, fleet: Any) -> dict[str, str] | None:
        """The UFM emulator over HTTPS, holding the fleet's fabric; None when the fleet has no InfiniBand part."""
        if fleet.infiniband is None:
            self.leave_out("ufm", 'the fleet has no "infiniband" part')
            return None
        self.service("ufm", "starting")
        root = self.state_dir / "ufm"
        root.mkdir(exist_ok=True)
        credentials = write_secret_file(root / "credentials", f"{UFM_USER}:{secrets.token_urlsafe(18)}").resolve()
        password = credentials.read_text().strip().split(":", 1)[1]
        url = await self.start_server(
            "ufm", "lab.ufm", root / "ready.json",
            ["--host", LOOPBACK, "--port", "0", "--fleet", str(self.fleet.resolve()), *self.tls_arguments("ufm")],
            env={"LAB_UFM_USER": UFM_USER, "LAB_UFM_PASSWORD": password},
        )  # fmt: skip
        ufm = {"url": url, "credentials": f"file:{credentials}", "ca_bundle": self.lab_ca().reference,
               "fabric": fleet.infiniband.fabric}  # fmt: skip
        self.info["ufm"] = ufm
        hosts = len(fleet.ib_ports())
        self.service("ufm", "ready", f"fabric {fleet.infiniband.fabric!r}: {hosts} hosts, "
                     f"{sum(len(g) for g in fleet.ib_ports().values())} ports", url=url)  # fmt: skip
        return ufm

    async def start_webhook(self, taken: set[int], notes: list[str]) -> str:
        self.service("webhook", "starting")
        port = choose_port(WEBHOOK_PORT, "the webhook receiver", taken, notes)
        url = await self.start_server(
            "webhook", "lab.webhook", self.state_dir / "webhook.ready.json", ["--host", LOOPBACK, "--port", str(port)]
        )
        self.info["webhook"] = {"url": url, "hooks": f"{url}/hooks/ops"}
        self.service("webhook", "ready", f"POST {url}/hooks/<anything>", url=url)
        return url

    async def start_prometheus(self, k8s_url: str, cluster: str, worker_metrics: str) -> None:
        """Debian's Prometheus, scraping the emulator's dcgm-exporter and KAI metrics and the worker; GPU readings
        are set through the emulator (`POST <kubernetes>/_lab/dcgm`, docs/lab.md). Left out, saying why, where the
        server is not installed."""
        from lab.prometheus import PrometheusUnavailable, find_prometheus

        try:
            find_prometheus()
        except PrometheusUnavailable as err:
            self.service("prometheus", "unavailable", str(err))
            return
        self.service("prometheus", "starting")
        url = await self.start_server("prometheus", "lab.prometheus", self.state_dir / "prometheus.ready.json",
                                      ["--state-dir", str(self.state_dir / "prometheus"), "--emulator-url", k8s_url,
                                       "--cluster", cluster, "--worker-metrics", worker_metrics])  # fmt: skip
        self.info["prometheus"] = {"url": url, "targets": f"{url}/targets"}
        self.service("prometheus", "ready", f"scraping dcgm-exporter on each GPU node, KAI queues and the worker; "
                     f"targets {url}/targets", url=url)  # fmt: skip

    async def seed_kubernetes(self, url: str, fresh: bool, fleet: Any, site: str | None = None) -> None:
        """A fresh emulator gets the fleet; every one gets the management cluster's kinds it lacks. Its lines name
        the `site` whose emulator it is (with `--sites`, one per site)."""
        import httpx

        from lab.k8s.admin import EmulatorAdmin
        from lab.k8s.crds import CAPI_CRDS, TENANCY_CRDS

        auth = {"Authorization": f"Bearer {self.admin_token}"} if self.admin_token else {}  # a site's emulator
        async with httpx.AsyncClient(trust_env=False, timeout=10, headers=auth) as http:
            listed = (await http.get(f"{url}/apis/apiextensions.k8s.io/v1/customresourcedefinitions")).json()
        have = {c["metadata"]["name"] for c in listed.get("items") or []}
        kinds = [c for c in CAPI_CRDS + TENANCY_CRDS if c["metadata"]["name"] not in have]
        async with EmulatorAdmin(url) as admin:
            await admin.seed(kinds + (fleet.to_objects() if fresh else []))
        emulator = f"{site}'s Kubernetes emulator (cluster {fleet.cluster!r})" if site else "the Kubernetes emulator"
        if fresh:
            say(f"seeded {emulator} from {self.fleet}")
        else:
            say(f"kept {emulator}'s saved objects (use `millwright lab seed FILE --reset` to reload a fleet)")
        if kinds:
            cluster = f"{site}'s cluster {fleet.cluster!r}" if site else "the management cluster"
            say(f"installed {len(kinds)} kinds in {cluster} (Cluster API, Metal3, KAI, Kyverno, vCluster)")

    def write_kubeconfig(self, url: str, cluster: str, more: dict[str, str]) -> Path:
        """The management cluster's context (the current one) and one per cluster of `more` (name -> URL)."""
        import yaml

        from lab.k8s.admin import kubeconfig, merged_kubeconfig

        doc = merged_kubeconfig([kubeconfig(url, cluster), *(kubeconfig(other, name) for name, other in more.items())])
        path = self.state_dir / "kubeconfig"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(yaml.safe_dump(doc, sort_keys=False))
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
        return path

    # -------------------------------------------------------------- NetBox, in the background

    async def open_netbox(self) -> tuple[Any, dict[str, str]] | None:
        """NetBox's gate (its address from now on) and token file; None (and one line why) when it cannot run."""
        from lab.netbox import NetBoxGate, NetBoxLab, NetBoxUnavailable, check_available, new_token

        try:
            await asyncio.to_thread(check_available)
        except NetBoxUnavailable as err:  # its message says what is missing and how to get it
            reason = str(err).replace("NetBox tier skipped: ", "")
            self.service("netbox", "unavailable", reason)
            say(
                f"NetBox left out: {reason}; the rest of the lab runs without it (as root, `./dev install` installs "
                "PostgreSQL and redis-server; then start the lab again)"
            )
            return None
        root = self.state_dir / "netbox"
        root.mkdir(exist_ok=True)
        token = new_token()
        token_file = write_secret_file(root / "token", token).resolve()
        loop = asyncio.get_running_loop()

        def on_stage(stage: str) -> None:  # from NetBox's start thread: lab.json is the loop's alone
            with contextlib.suppress(RuntimeError):  # the lab is gone
                loop.call_soon_threadsafe(self._netbox_stage, stage)

        self.netbox_lab = NetBoxLab(root, keep_data=True, token=token, on_stage=on_stage)
        gate = await NetBoxGate(lambda: self.netbox_lab.stage).start()
        netbox = {"url": gate.url, "token": f"file:{token_file}"}  # a reference, not the token
        self.info["netbox"] = netbox
        self.service("netbox", "starting", "starting", url=gate.url, since=time.time())
        return gate, netbox

    def _netbox_stage(self, stage: str) -> None:
        """Record each stage of NetBox's start, and print it when its kind changes or every 20 s."""
        entry = self.info["services"]["netbox"]
        kind = stage.split(":")[0].split("(")[0].strip()
        now = time.monotonic()
        if stage != "ready" and (kind != self._netbox_shown[0] or now - self._netbox_shown[1] >= 20):
            say(f"NetBox: {stage} [{_duration(time.time() - entry['since'])}]")
            self._netbox_shown = (kind, now)
        if stage != "ready":  # "ready" only once the inventory is in
            self.service("netbox", "starting", stage)

    async def run_netbox(self, gate: Any, fleet: Any, bmc: dict[str, Any] | None) -> None:
        """Start NetBox, put the lab's inventory in, then let the gate through; on failure the gate says why."""
        from lab.netbox import NetBoxError, seed_inventory

        nb = self.netbox_lab
        try:
            starting = asyncio.ensure_future(_in_daemon_thread(nb.start))
            while not (await asyncio.wait({starting}, timeout=30))[0]:  # a long stage still shows it goes on
                if time.monotonic() - self._netbox_shown[1] >= 30:
                    since = self.info["services"]["netbox"]["since"]
                    say(f"NetBox: still {nb.stage} [{_duration(time.time() - since)}]")
                    self._netbox_shown = (self._netbox_shown[0], time.monotonic())
            starting.result()
            nb._stage("recording the lab's inventory (bootstrap, devices, InfiniBand ports)")
            devices = fleet.netbox_devices((bmc or {}).get("servers"), (bmc or {}).get("credentials"))
            done = await seed_inventory(nb.url, self.info["netbox"]["token"], devices)
        except (NetBoxError, Exception) as err:  # the rest of the lab goes on; the gate and `lab status` say why
            reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            nb.stage = f"failed: {reason}"
            self.service("netbox", "failed", f"{reason} (logs in {nb.root})")
            say(f"NetBox did not start: {err}")
            return
        for name, proc in nb._procs.items():
            key = "netbox" if name == "netbox" else f"netbox-{name}"
            self.children[key] = Child(key, proc, nb._log(name))
        gate.open(int(nb.url.rsplit(":", 1)[1]))
        took = _duration(time.monotonic() - self.started)
        self.service("netbox", "ready", f"NetBox {nb.url} behind {gate.url}; {done}", upstream=nb.url)
        say(f"NetBox ready at {gate.url}, {took} after `lab up` began: {done}")

    def stop_netbox(self) -> None:
        if self.netbox_lab is not None:
            self.netbox_lab.stop()
            for name in [n for n in self.children if n.startswith("netbox")]:
                del self.children[name]

    # -------------------------------------------------------------- the worker

    def worker_env(self, address: str, kubeconfig: Path, metrics_port: int) -> dict[str, str]:
        """The worker's environment: the lab's integrations, each set through the integration it serves (so a
        renamed setting fails here), and nothing of a production configuration."""
        from activities.firmware.integration import Bmcs
        from activities.kube.integration import Kubernetes
        from activities.netbox.integration import NetBox
        from activities.prometheus import Prometheus
        from activities.ufm.integration import Ufm
        from activities.usage_report import UsageReports

        env = self.base_worker_env(address, metrics_port, self.task_queue)
        env.update(Kubernetes.environment(kubeconfig=str(kubeconfig)))
        if self.info.get("netbox"):
            netbox = self.info["netbox"]
            env.update(NetBox.environment(netbox_url=netbox["url"], netbox_token=netbox["token"]))
        if bmcs := self.bmc_labs():  # one set of credentials and one CA for all of them
            env.update(Bmcs.environment(bmc_credentials=bmcs[0]["credentials"]))
            if bmcs[0].get("ca_bundle"):
                env.update(Bmcs.environment(bmc_ca_bundle=bmcs[0]["ca_bundle"]))
            env["MILLWRIGHT_FAULT_EVENTS_SETTINGS"] = str(self.write_fault_event_settings(bmcs))
        if self.info.get("ufm"):
            ufm = self.info["ufm"]
            env.update(Ufm.environment(ufm_url=ufm["url"], ufm_credentials=ufm["credentials"],
                                       ufm_ca_bundle=ufm["ca_bundle"]))  # fmt: skip
        if self.info.get("prometheus"):
            env.update(Prometheus.environment(prometheus_url=self.info["prometheus"]["url"]))
        # TenantUsage's reports
        env.update(UsageReports.environment(usage_sink=str((self.state_dir / "usage").resolve())))
        return env

    def base_worker_env(self, address: str, metrics_port: int, task_queue: str) -> dict[str, str]:
        """Temporal, the task queue and the metrics port, and none of the caller's own worker settings."""
        from worker.config import WorkerSettings

        toml = self.state_dir / "temporal.toml"
        toml.write_text(f'[profile.default]\naddress = "{address}"\nnamespace = "default"\n')
        settings = {f"MILLWRIGHT_{name.upper()}" for name in WorkerSettings.model_fields if name != "log_level"}
        settings |= {"KUBECONFIG", "MILLWRIGHT_SITE", "MILLWRIGHT_SITE_MAP"}  # a central worker reads no kubeconfig
        env = {k: v for k, v in _child_env().items() if not k.startswith("TEMPORAL_") and k not in settings}
        env.update(
            TEMPORAL_CONFIG_FILE=str(toml),
            TEMPORAL_ADDRESS=address,
            TEMPORAL_NAMESPACE="default",
            MILLWRIGHT_TASK_QUEUE=task_queue,
            MILLWRIGHT_METRICS_HOST=LOOPBACK,
            MILLWRIGHT_METRICS_PORT=str(metrics_port),
            MILLWRIGHT_SHUTDOWN_GRACE_SECONDS=str(WORKER_GRACE_SECONDS),
        )
        return env

    def site_worker_env(self, address: str, site: dict[str, Any], metrics_port: int) -> dict[str, str]:
        """A site's worker (MILLWRIGHT_SITE, on `millwright-site-<site>`, docs/lab.md "Sites"): its own site's
        kubeconfig (its own identity) and BMC credentials, nothing of another site's."""
        from activities.firmware.integration import Bmcs
        from activities.kube.integration import Kubernetes

        # Its task queue is its site's (MILLWRIGHT_SITE); MILLWRIGHT_TASK_QUEUE stays the central one, where the runs
        # its fault events start go.
        env = self.base_worker_env(address, metrics_port, self.task_queue)
        env["MILLWRIGHT_SITE"] = site["name"]
        env.update(Kubernetes.environment(kubeconfig=site["kubeconfig"]))
        if site["bmc"]:
            env.update(Bmcs.environment(bmc_credentials=site["bmc"]["credentials"]))
        if (site["bmc"] or {}).get("ca_bundle"):
            env.update(Bmcs.environment(bmc_ca_bundle=site["bmc"]["ca_bundle"]))
        return env

    def central_worker_env(self, address: str, site_map: Path, metrics_port: int) -> dict[str, str]:
        """The central worker of a multi-site lab: the site map, and neither a kubeconfig nor BMC credentials."""
        from activities.usage_report import UsageReports

        env = self.base_worker_env(address, metrics_port, self.task_queue)
        env["MILLWRIGHT_SITE_MAP"] = str(site_map)
        env.update(UsageReports.environment(usage_sink=str((self.state_dir / "usage").resolve())))
        return env

    def bmc_labs(self) -> list[dict[str, Any]]:
        """What the lab recorded of each BMC lab it runs: the GPU nodes', the NVL72 trays'."""
        return [b for b in (self.info.get("bmc"), (self.info.get("nvl72") or {}).get("bmc")) if b]

    def write_fault_event_settings(self, labs: list[dict[str, Any]]) -> Path:
        """`<state-dir>/fault-events.json`: the event path's settings with the BMC of each node of the lab's
        clusters, so that its remediations can power-cycle as the sweep's do (the credentials and CA as references)."""
        from activities.redfish import BmcRef
        from worker.fault_events import FaultEventSettings

        bmcs = {node: BmcRef(url=url, credentials=bmc["credentials"], ca_bundle=bmc.get("ca_bundle"))
                for bmc in labs for node, url in bmc["servers"].items()}  # fmt: skip
        path = (self.state_dir / "fault-events.json").resolve()
        path.write_text(FaultEventSettings(bmcs=bmcs).model_dump_json(include={"bmcs"}, indent=2) + "\n")
        return path

    async def wait_worker_polling(self, address: str, name: str = "worker", task_queue: str | None = None) -> None:
        """Until worker `name` polls `task_queue` (default the lab's) for activities, which a site's worker does
        as much as one with workflows."""
        from temporalio.api.enums.v1 import TaskQueueType
        from temporalio.client import Client

        client = await Client.connect(address)
        worker_pid = str(self.children[name].pid)
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            self.check_children()
            identities = await task_queue_poller_identities(client, task_queue or self.task_queue,
                                                            TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY) or []  # fmt: skip
            if any(worker_pid in identity for identity in identities):
                return
            await asyncio.sleep(0.2)
        raise LabError(f"the {name} did not start polling in {self.timeout:.0f}s; see {self.children[name].log}")

    async def declare_budget(self, address: str, cluster: str, count: int = LAB_BUDGET_NODES,
                             *limits: str) -> None:  # fmt: skip
        """The lab's operator declares a cluster's disruption budget with the CLI, as one would in a factory
        (docs/disruption-budget.md: no requester sets it); an already declared one (a restarted lab) is set again.
        `limits`: more `budget set` options (the NVL72 cluster's: one NVLink domain at a time)."""
        command = [
            sys.executable,
            "-m",
            "starter",
            "budget",
            "set",
            cluster,
            "--count",
            str(count),
            *limits,
            "--by",
            "millwright lab",
            "--reason",
            "the lab's declared budget",
            "--task-queue",
            self.task_queue,
        ]
        env = {**os.environ, "TEMPORAL_ADDRESS": address}
        done = await asyncio.to_thread(subprocess.run, command, env=env, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise LabError(f"declaring the lab's disruption budget failed: {(done.stderr or done.stdout).strip()}")
        self.info.setdefault("budgets", {})[cluster] = f"{count} nodes out of service at once" + (
            f" ({' '.join(limits)})" if limits else ""
        )
        if cluster == (self.info.get("kubernetes") or {}).get("cluster"):
            self.info["budget"] = f"{count} nodes of {cluster} out of service at once"

    # -------------------------------------------------------------- examples with this lab's values

    def write_examples(self, bmc: dict[str, Any] | None, webhook: str | None) -> dict[str, Path]:
        """`<state-dir>/examples/`: the burn-in and firmware update inputs for the first GPU node (its real BMC URL,
        expected hardware; they take the node out of service themselves), the fleet firmware update's for every GPU node, and every example that names the webhook receiver, pointed at
        this lab's."""
        from lab.bmc import normalize_spec

        out_dir = self.state_dir / "examples"
        out_dir.mkdir(exist_ok=True)
        written: dict[str, Path] = {}
        if bmc:
            spec = normalize_spec(bmc["specs"][0])
            example = json.loads(BURN_IN_TEMPLATE.read_text())
            server = example["server"]
            server.update(name=spec["name"], expected={"gpus": spec["gpus"], "gpu_model": spec["gpu_model"],
                                                       "firmware": spec["firmware"]})  # fmt: skip
            server["bmc"] = {**server.get("bmc", {}), "url": bmc["servers"][spec["name"]]}
            if bmc.get("ca_bundle"):
                server["bmc"]["ca_bundle"] = bmc["ca_bundle"]
            written["server-burn-in"] = out_dir / "server-burn-in.json"
            written["server-burn-in"].write_text(json.dumps(example, indent=2) + "\n")
            firmware = json.loads(FIRMWARE_TEMPLATE.read_text())
            firmware["server"].update(name=spec["name"], bmc=server["bmc"])
            written["firmware-update"] = out_dir / "firmware-update.json"
            written["firmware-update"].write_text(json.dumps(firmware, indent=2) + "\n")
            fleet = json.loads(FLEET_FIRMWARE_TEMPLATE.read_text())  # every GPU node, the same bundle
            fleet.update(bundle=firmware["bundle"], servers=[
                {**fleet["servers"][0], "name": s["name"], "bmc": {**server["bmc"], "url": bmc["servers"][s["name"]]}}
                for s in map(normalize_spec, bmc["specs"])
            ])  # fmt: skip
            written["fleet-firmware-update"] = out_dir / "fleet-firmware-update.json"
            written["fleet-firmware-update"].write_text(json.dumps(fleet, indent=2) + "\n")
        nvl72_bmc = (self.info.get("nvl72") or {}).get("bmc")
        if nvl72_bmc:  # `millwright rack remediate rack-001 --settings` this: each tray's BMC, the rack's switch trays
            ref = {"credentials": nvl72_bmc["credentials"], **({"ca_bundle": nvl72_bmc["ca_bundle"]}
                                                              if nvl72_bmc.get("ca_bundle") else {})}  # fmt: skip
            rack = sorted(nvl72_bmc["switch_trays"])[0]
            settings = {"bmcs": {n: {"url": u, **ref} for n, u in nvl72_bmc["servers"].items()},
                        "switch_bmcs": [{"url": u, **ref} for u in nvl72_bmc["switch_trays"][rack].values()]}  # fmt: skip
            written[f"{rack}-remediation"] = out_dir / f"{rack}-remediation.json"
            written[f"{rack}-remediation"].write_text(json.dumps(settings, indent=2) + "\n")
        if webhook:
            for path in sorted(EXAMPLES.glob("*.json")):
                text = path.read_text()
                if WEBHOOK_IN_EXAMPLES in text:
                    written[path.stem] = out_dir / path.name
                    written[path.stem].write_text(text.replace(WEBHOOK_IN_EXAMPLES, webhook))
        self.info["examples"] = {name: str(p.resolve()) for name, p in written.items()}
        self.save()
        return written

    # -------------------------------------------------------------- run

    async def run(self) -> int:
        from lab.fleet import load_fleet

        fleet = load_fleet(str(self.fleet))
        notes: list[str] = []
        taken: set[int] = set()
        port = choose_port(self.port, "Temporal", taken, notes)
        ui_port = choose_port(self.ui_port, "the Temporal UI", taken, notes)
        metrics_port = free_port(avoid=taken)
        taken.add(metrics_port)
        for note in notes:
            say(note)
        notes.clear()

        server = DevServer(self.state_dir, port, ui_port)
        fresh_k8s = not (self.state_dir / "k8s-state.json").exists()
        self.info = {
            "state_dir": str(self.state_dir.resolve()),
            "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "temporal": {"address": server.address, "namespace": "default", "db": str(server.db_file.resolve())},
            "ui": server.ui_url,
            "task_queue": self.task_queue,
            "logs": {},
            "services": {name: {"state": "waiting", "note": ""} for name in self.service_names()},
        }
        left_out = sorted(self.without)
        if self.sites and "bmcs" in self.without:  # every site's
            left_out = [n for n in left_out if n != "bmcs"] + [f"{site}/bmcs" for site in site_names(self.sites)]
        for name in left_out:
            self.leave_out(name, "--without")
        proc = server.start()
        self.children["temporal"] = Child("temporal", proc, server.log_file)
        self.service("temporal", "starting", url=server.address)
        if self.sites:
            return await self.run_sites(server, fleet, taken, notes)

        self.service("kubernetes", "starting")
        k8s_url = await self.start_kubernetes()
        await self.seed_kubernetes(k8s_url, fresh_k8s, fleet)
        more = {NVL72_CLUSTER: await self.start_nvl72()} if "nvl72" not in self.without else {}
        kubeconfig = self.write_kubeconfig(k8s_url, fleet.cluster, more)
        self.info["kubernetes"] = {"url": k8s_url, "cluster": fleet.cluster,
                                   "state": str((self.state_dir / "k8s-state.json").resolve())}  # fmt: skip
        self.info["kubeconfig"] = str(kubeconfig.resolve())
        self.service(
            "kubernetes", "ready", f"cluster {fleet.cluster!r}, kubeconfig {kubeconfig.resolve()}", url=k8s_url
        )

        netbox_gate = await self.open_netbox() if "netbox" not in self.without else None
        bmc = await self.start_bmcs(fleet) if "bmcs" not in self.without else None
        if more:
            await self.start_nvl72_racks(more[NVL72_CLUSTER], fleet)
        if "ufm" not in self.without:
            await self.start_ufm(fleet)
        webhook = await self.start_webhook(taken, notes) if "webhook" not in self.without else None
        if "prometheus" not in self.without:
            await self.start_prometheus(k8s_url, fleet.cluster, f"{LOOPBACK}:{metrics_port}")
        for note in notes:
            say(note)
        netbox_task = None
        if netbox_gate is not None:
            netbox_task = asyncio.create_task(self.run_netbox(netbox_gate[0], fleet, bmc), name="lab-netbox")

        await server.wait_healthy(self.timeout)
        self.service("temporal", "ready", f"UI {server.ui_url}", url=server.address)
        self.service("worker", "starting")
        self.spawn(
            "worker", [sys.executable, "-m", "worker"], env=self.worker_env(server.address, kubeconfig, metrics_port)
        )
        self.info["worker"] = {"metrics": f"http://{LOOPBACK}:{metrics_port}/metrics", "task_queue": self.task_queue}
        if bmc:
            await self.start_hosts(server.address, bmc["admin"])
        self.info["logs"] = {n: str(c.log.resolve()) for n, c in self.children.items()}
        await self.wait_worker_polling(server.address)
        await self.declare_budget(server.address, fleet.cluster)
        if self.info.get("nvl72"):  # a RackRemediation takes a whole rack: 18 trays, one NVLink domain at a time
            from lab.nvl72 import TRAYS_PER_RACK

            await self.declare_budget(server.address, NVL72_CLUSTER, TRAYS_PER_RACK, "--nvlink-domains", "1")
        self.service("worker", "ready", f"task queue {self.task_queue}, metrics {self.info['worker']['metrics']}")
        examples = self.write_examples(bmc, webhook)

        self.info["ready"] = True
        self.save()
        say(
            f"ready in {_duration(time.monotonic() - self.started)}"
            + (" (NetBox goes on starting: `millwright lab status` shows how far)" if netbox_task else "")
        )
        self.print_addresses(server, kubeconfig, examples)
        try:
            async with self.follow_power(bmc, kubeconfig, fleet.cluster):
                return await self.serve()
        finally:
            if netbox_task is not None and not netbox_task.done():
                netbox_task.cancel()  # its thread ends once `up` stops NetBox's processes
                with contextlib.suppress(BaseException):
                    await netbox_task
            if netbox_gate is not None:
                await netbox_gate[0].close()

    def service_names(self) -> list[str]:
        """The one-site lab's services; with `--sites`, each site's own and the central ones."""
        if not self.sites:
            return list(SERVICES)
        per_site = [f"{site}/{kind}" for site in site_names(self.sites) for kind in SITE_SERVICES]
        return ["temporal", *per_site, "webhook", "worker", *NOT_IN_SITES]

    async def start_site(self, index: int, site: str, fleet: Any) -> dict[str, Any]:
        """A site: its own emulator (cluster `lab-<index>`, seeded with the fleet when fresh) knowing two callers,
        its worker's identity `millwright-<site>` and the lab's own; its worker's kubeconfig (its cluster, its
        identity); its BMCs with their own credentials (`bmc` None: left out). Everything in `<state-dir>/<site>/`."""
        import yaml

        from lab.k8s.admin import kubeconfig

        cluster, identity, token = f"lab-{index}", f"millwright-{site}", secrets.token_urlsafe(18)
        folder = self.state_dir / site
        folder.mkdir(exist_ok=True)
        tokens = write_secret_file(folder / "tokens.csv", f"{token},{identity},{identity}\n"
                                   f"{self.admin_token},{LAB_ADMIN},{LAB_ADMIN}\n")  # fmt: skip
        state = folder / "k8s-state.json"
        fresh = not state.exists()
        self.service(f"{site}/kubernetes", "starting")
        url = await self.start_server(f"{site}/kubernetes", "lab.k8s", folder / "k8s.ready.json",
                                      ["--host", LOOPBACK, "--port", "0", "--state-file", str(state),
                                       "--token-auth-file", str(tokens.resolve())])  # fmt: skip
        site_fleet = fleet.model_copy(update={"cluster": cluster})
        await self.seed_kubernetes(url, fresh, site_fleet, site)
        config = write_secret_file(folder / "kubeconfig", yaml.safe_dump(
            kubeconfig(url, cluster, token=token, user=identity), sort_keys=False)).resolve()  # fmt: skip
        self.service(f"{site}/kubernetes", "ready", f"cluster {cluster!r}, its audit {url}/_lab/audit", url=url)
        servers, bmc = ([] if "bmcs" in self.without else site_fleet.bmc_servers()), None
        if servers:
            bmc = await self.bmc_lab(f"{site}/bmcs", servers, fleet, site=site)
            self.service(f"{site}/bmcs", "ready", f"{len(bmc['servers'])} servers, {self.bmc_scheme(fleet)}, "
                         f"credentials {bmc['credentials']}", url=bmc["admin"])  # fmt: skip
        elif "bmcs" not in self.without:
            self.leave_out(f"{site}/bmcs", 'the fleet turns its BMCs off ("bmc": {"enabled": false})')
        return {"name": site, "cluster": cluster, "url": url, "audit": f"{url}/_lab/audit", "identity": identity,
                "kubeconfig": str(config), "task_queue": site_task_queue(site), "bmc": bmc,
                "worker": {"log": str((folder / "worker.log").resolve())}}  # fmt: skip

    def write_site_map(self, sites: dict[str, dict[str, Any]]) -> Path:
        """The central worker's MILLWRIGHT_SITE_MAP (docs/lab.md "Sites"): each site's cluster and its BMCs'
        host:port."""
        # a site whose BMCs are left out lists none
        placed = {name: (site["cluster"], ((site["bmc"] or {}).get("servers") or {}).values())
                  for name, site in sites.items()}  # fmt: skip
        return write_site_map((self.state_dir / SITE_MAP).resolve(), placed)

    def write_fleet_rollout(self, clusters: list[str]) -> Path:
        """`<state-dir>/examples/fleet-rollout.json`: a FleetRollout of examples/rollout.json across every site's
        cluster, the first one the canary, then one cluster at a time."""
        template = json.loads(ROLLOUT_TEMPLATE.read_text())
        template.pop("cluster")
        example = {"name": "lab-sites", "clusters": clusters, "plan": {"wave_size": 1}, "rollout": template}
        out_dir = self.state_dir / "examples"
        out_dir.mkdir(exist_ok=True)
        path = (out_dir / "fleet-rollout.json").resolve()
        path.write_text(json.dumps(example, indent=2) + "\n")
        self.info["examples"] = {"fleet-rollout": str(path)}
        return path

    async def run_sites(self, server: DevServer, fleet: Any, taken: set[int], notes: list[str]) -> int:
        """`--sites N`: per site an emulator, BMCs and a site worker; the central worker with the site map only;
        Temporal and the webhook receiver shared."""
        for name, why in NOT_IN_SITES.items():
            if name not in self.without:
                self.leave_out(name, f"not in a multi-site lab: {why}")
        self.admin_token = secrets.token_urlsafe(18)
        sites = {name: await self.start_site(i, name, fleet) for i, name in enumerate(site_names(self.sites), 1)}
        self.info["sites"] = sites
        kubeconfig = self.write_kubeconfig_of_sites(sites)
        self.info["kubeconfig"] = str(kubeconfig)
        site_map = self.write_site_map(sites)
        self.info["site_map"] = str(site_map)
        webhook = await self.start_webhook(taken, notes) if "webhook" not in self.without else None
        for note in notes:
            say(note)
        await server.wait_healthy(self.timeout)
        self.service("temporal", "ready", f"UI {server.ui_url}", url=server.address)
        for name, site in sites.items():
            port = free_port(avoid=taken)
            taken.add(port)
            self.service(f"{name}/worker", "starting")
            self.spawn(f"{name}/worker", [sys.executable, "-m", "worker"],
                       env=self.site_worker_env(server.address, site, port))  # fmt: skip
            site["worker"].update(metrics=f"http://{LOOPBACK}:{port}/metrics", task_queue=site["task_queue"])
        port = free_port(avoid=taken)
        self.service("worker", "starting")
        self.spawn("worker", [sys.executable, "-m", "worker"], env=self.central_worker_env(server.address, site_map,
                                                                                         port))  # fmt: skip
        self.info["worker"] = {"metrics": f"http://{LOOPBACK}:{port}/metrics", "task_queue": self.task_queue,
                               "site_map": str(site_map)}  # fmt: skip
        self.info["logs"] = {n: str(c.log.resolve()) for n, c in self.children.items()}
        for name, site in sites.items():
            await self.wait_worker_polling(server.address, f"{name}/worker", site["task_queue"])
            self.service(f"{name}/worker", "ready", f"MILLWRIGHT_SITE={name}, task queue {site['task_queue']}, "
                         f"kubeconfig {site['kubeconfig']} (user {site['identity']})")  # fmt: skip
        await self.wait_worker_polling(server.address)
        for site in sites.values():
            await self.declare_budget(server.address, site["cluster"])
        self.service("worker", "ready", f"task queue {self.task_queue}, site map {site_map}, no kubeconfig, no BMC "
                     "credentials")  # fmt: skip
        example = self.write_fleet_rollout([site["cluster"] for site in sites.values()])
        self.info["ready"] = True
        self.save()
        say(f"ready in {_duration(time.monotonic() - self.started)}: {self.sites} sites")
        self.print_sites(server, kubeconfig, example, webhook)
        async with contextlib.AsyncExitStack() as stack:
            for site in sites.values():
                await stack.enter_async_context(self.follow_power(site["bmc"], kubeconfig, site["cluster"]))
            return await self.serve()

    def write_kubeconfig_of_sites(self, sites: dict[str, dict[str, Any]]) -> Path:
        """`<state-dir>/kubeconfig`: every site's cluster as the lab's own identity (yours, and the power link's);
        the first the current context."""
        import yaml

        from lab.k8s.admin import kubeconfig, merged_kubeconfig

        doc = merged_kubeconfig([kubeconfig(s["url"], s["cluster"], token=self.admin_token,
                                            user=f"{LAB_ADMIN}-{s['cluster']}") for s in sites.values()])  # fmt: skip
        return write_secret_file(self.state_dir / "kubeconfig", yaml.safe_dump(doc, sort_keys=False)).resolve()

    def print_sites(self, server: DevServer, kubeconfig: Path, example: Path, webhook: str | None) -> None:
        """The banner of a multi-site lab: per site its cluster, the site worker's kubeconfig and queue, its
        emulator's audit; the central worker; a campaign across every site."""
        where = "" if self.state_dir == Path(".millwright").absolute() else f" --state-dir {self.state_dir}"

        def line(label: str, text: str) -> None:
            print(f"  {label + ':':<15}{text}", flush=True)

        line("Temporal UI", server.ui_url)
        line("Temporal", f"{server.address} (namespace default, task queue {self.task_queue})")
        for name, site in self.info["sites"].items():
            line(name, f"cluster {site['cluster']!r} at {site['url']}")
            line("  kubeconfig", f"{site['kubeconfig']} (its worker's: user {site['identity']}, {site['cluster']} "
                 "only)")  # fmt: skip
            line("  worker", f"MILLWRIGHT_SITE={name} on {site['task_queue']}, log {site['worker']['log']}")
            line("  BMCs", site_bmcs(site["bmc"]))
            line("  audit", f"curl {site['audit']}   (each call with its caller: `user`)")
        line("central", f"worker on {self.task_queue}, MILLWRIGHT_SITE_MAP={self.info['site_map']}, no kubeconfig, "
             "no BMC credentials")  # fmt: skip
        line("kubeconfig", f"{kubeconfig} (every site's cluster, as {LAB_ADMIN})")
        if webhook:
            line("webhook", f"{self.info['webhook']['hooks']}")
        left = [f"{n} ({s['note']})" for n, s in self.info["services"].items() if s["state"] == "left out"]
        line("left out", "; ".join(left))
        line("campaign", f"millwright start FleetRollout --input {example}{where} --watch")
        line("status", f"millwright lab status{where}")
        line("stop", f"Ctrl-C, or `millwright lab down{where}`")

    @contextlib.asynccontextmanager
    async def follow_power(self, bmc: dict[str, Any] | None, kubeconfig: Path, cluster: str):
        """While the lab runs, a server's power reaches its Kubernetes node (lab/node_power.py)."""
        if not bmc:
            yield
            return
        from kubernetes.aio import client as k8s_client
        from kubernetes.aio import config as k8s_config

        from lab.node_power import NodePowerLink
        from lab.redfish import BmcAdmin

        api = await k8s_config.new_client_from_config(str(kubeconfig), context=cluster)
        try:
            async with BmcAdmin(bmc["admin"]) as admin, \
                    NodePowerLink(admin, k8s_client.CoreV1Api(api), list(bmc["servers"]),
                                  poll_interval=POWER_POLL_SECONDS):  # fmt: skip
                yield
        finally:
            await api.close()

    def print_nvl72(self, line: Callable[[str, str], None], kubeconfig: Path, examples: dict[str, Path]) -> None:
        """The NVL72 cluster's lines of the banner: its emulator, BMCs, rack faults, and a rack's remediation."""
        if not self.info.get("nvl72"):
            return
        nvl72 = self.info["nvl72"]
        line(
            "NVL72",
            f"{nvl72['url']} (cluster {NVL72_CLUSTER!r}: {nvl72['holds']}; kubectl --context {NVL72_CLUSTER})",
        )
        if nvl72.get("bmc"):
            line("NVL72 BMCs", nvl72_bmcs(nvl72["bmc"]))
        if nvl72.get("racks"):
            line("rack faults", f"curl -X POST {nvl72['racks']}/_lab/racks/rack-001/fabric-fault   (the rack's "
                 f"state and history: curl {nvl72['racks']}/_lab/racks/rack-001)")  # fmt: skip
        if "rack-001-remediation" in examples:
            line("rack", f"millwright rack remediate rack-001 --cluster {NVL72_CLUSTER} --reason 'NVLink fabric "
                 f"down' --by you --kubeconfig {kubeconfig.resolve()} --settings "
                 f"{examples['rack-001-remediation']}   (then `rack status`; the budget: a rack at a time)")  # fmt: skip

    def print_addresses(self, server: DevServer, kubeconfig: Path, examples: dict[str, Path]) -> None:
        services = self.info["services"]
        where = "" if self.state_dir == Path(".millwright").absolute() else f" --state-dir {self.state_dir}"

        def line(label: str, text: str) -> None:
            print(f"  {label + ':':<15}{text}", flush=True)

        line("Temporal UI", server.ui_url)
        line("Temporal", f"{server.address} (namespace default, task queue {self.task_queue})")
        line("Kubernetes", f"{self.info['kubernetes']['url']} (cluster {self.info['kubernetes']['cluster']!r})")
        self.print_nvl72(line, kubeconfig, examples)
        line("kubeconfig", str(kubeconfig.resolve()))
        line("worker", f"metrics {self.info['worker']['metrics']}, logs in {self.state_dir}/")
        if self.info.get("bmc"):
            bmc = self.info["bmc"]
            line("BMCs", f"{len(bmc['servers'])} servers (admin {bmc['admin']}, credentials {bmc['credentials']}"
                 + (f", CA {bmc['ca_bundle']}" if bmc.get("ca_bundle") else ", plain HTTP") + "); host agents for the "
                 "powered-on ones")  # fmt: skip
        if self.info.get("ufm"):
            line("UFM", f"{self.info['ufm']['url']} (fabric {self.info['ufm']['fabric']!r}, credentials "
                 f"{self.info['ufm']['credentials']})")  # fmt: skip
        if self.info.get("webhook"):
            line("webhook", f"{self.info['webhook']['hooks']} (deliveries: `millwright lab status{where}`)")
        if self.info.get("prometheus"):
            line("Prometheus", f"{self.info['prometheus']['url']} (dcgm-exporter on each GPU node, KAI queues, the "
                 f"worker; targets {self.info['prometheus']['targets']}; the remediation sweep reads GPU faults)")  # fmt: skip
        if self.info.get("netbox"):
            line("NetBox", f"{self.info['netbox']['url']} (token {self.info['netbox']['token']}): "
                 f"{services['netbox']['state']}, {services['netbox']['note']}")  # fmt: skip
        left = [
            f"{n} ({s['state']}: {s['note']})" for n, s in services.items() if s["state"] in ("left out", "unavailable")
        ]
        if left:
            line("left out", "; ".join(left))
        line("try", f"{EXAMPLE}{where}")
        if "server-burn-in" in examples:
            line("burn in", f"millwright start ServerBurnIn --input {examples['server-burn-in']}{where} --watch   "
                 "(or paste that file in the UI: Start Workflow, type ServerBurnIn)")  # fmt: skip
        if "firmware-update" in examples:
            line("firmware", f"millwright start FirmwareUpdate --input {examples['firmware-update']}{where} --watch")
        if "fleet-firmware-update" in examples:
            line("fleet", f"millwright start FleetFirmwareUpdate --input {examples['fleet-firmware-update']}{where} "
                 "--watch")  # fmt: skip
        webhook_copies = [str(p) for n, p in examples.items() if n not in BMC_EXAMPLES]
        if webhook_copies and self.info["webhook"]["url"] != WEBHOOK_IN_EXAMPLES:
            line("webhook", f"port {WEBHOOK_PORT} was taken: run {', '.join(webhook_copies)} instead of the "
                     "examples/ files of the same name")  # fmt: skip
        line("status", f"millwright lab status{where}")
        line("stop", f"Ctrl-C, or `millwright lab down{where}`")

    async def serve(self) -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        cut_off: dict[str, float] = {}  # a site's worker that exited -> when the lab starts it again
        while not stop.is_set():
            if not self.watch_children(cut_off):
                return 1
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.5)
        say("stopping")
        return 0

    def watch_children(self, cut_off: dict[str, float]) -> bool:
        """One look at the children; False once one whose exit ends the lab has exited. A site's worker that exited
        is started again `SITE_WORKER_RESTART_SECONDS` later (`cut_off`: when, by name)."""
        dead = self.dead_child()
        if dead and self.sites and kind_of(dead.name) == "worker" and "/" in dead.name:
            self.site_cut_off(dead, cut_off)
        elif dead:
            say(f"the {dead.name} (pid {dead.pid}) exited with code {dead.process.returncode}; see {dead.log}")
            say("stopping the rest of the lab")
            return False
        for name, at in list(cut_off.items()):
            if time.monotonic() >= at:
                del cut_off[name]
                self.site_back(name)
        return True

    def site_cut_off(self, dead: Child, cut_off: dict[str, float]) -> None:
        """A site's worker that exited (killed, say, to try a site cut off) leaves the rest of the lab running: its
        site's runs wait, visibly (docs/sites-and-campaigns.md), until the lab starts it again."""
        site = dead.name.split("/", 1)[0]
        del self.children[dead.name]
        cut_off[dead.name] = time.monotonic() + SITE_WORKER_RESTART_SECONDS
        self.service(dead.name, "down", f"exited with code {dead.process.returncode}; started again in "
                                        f"{SITE_WORKER_RESTART_SECONDS:g}s")  # fmt: skip
        say(f"{site}'s worker (pid {dead.pid}) exited with code {dead.process.returncode}: {site} is cut off, its "
            f"runs wait and say so; the lab starts it again in {SITE_WORKER_RESTART_SECONDS:g}s")  # fmt: skip
        self._restarts[dead.name] = dead

    def site_back(self, name: str) -> None:
        dead = self._restarts.pop(name)
        child = self.spawn(name, dead.argv, dead.env)
        self.service(name, "ready", f"started again (pid {child.pid})")
        say(f"{name.split('/', 1)[0]}'s worker started again (pid {child.pid})")

    def stop_children(self) -> None:
        """Worker first (graceful), then the emulators and the server; SIGKILL after a timeout."""
        first = [n for n in self.children if kind_of(n) in ("worker", "hosts")]
        rest = sorted((n for n in self.children if n not in first and not n.startswith("netbox")), key=stop_rank)
        groups = ((first, WORKER_GRACE_SECONDS + 5), (rest, 15))
        for group, timeout in groups:
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


async def _in_daemon_thread(fn: Any) -> Any:
    """`fn()` in a daemon thread: unlike `asyncio.to_thread`, leaving the loop (Ctrl-C) never waits for it (NetBox's
    first migration takes minutes; `up` stops NetBox's processes, which ends it)."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future = loop.create_future()

    def settle(result: Any = None, error: BaseException | None = None) -> None:
        if not done.done():
            done.set_exception(error) if error is not None else done.set_result(result)

    def target() -> None:
        try:
            result = fn()
        except BaseException as err:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(settle, None, err)
            return
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(settle, result)

    threading.Thread(target=target, name="lab-netbox", daemon=True).start()
    return await done


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), *filter(None, [env.get("PYTHONPATH")])])
    return env


@contextlib.contextmanager
def _lock(state_dir: Path):
    """Held for the whole life of `lab up`: a second `lab up` on the same state dir cannot start twins."""
    fh = open(state_dir / "lab.lock", "a+")  # noqa: SIM115 (held open, and locked, for the lab's whole life)
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
    without: list[str] | None = None,
    bmc_http: bool = False,
    sites: int | None = None,
) -> int:
    try:
        left_out = parse_without(without or [])
    except LabError as err:
        say(f"error: {err}")
        return 2
    if sites is not None and sites < 2:
        say(f"error: --sites {sites}: a multi-site lab has 2 sites or more (without --sites: the one-site lab)")
        return 2
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

        lab = Lab(state_dir, fleet, port, ui_port, task_queue, timeout, without=left_out, bmc_http=bmc_http,
                  sites=sites or 0)  # fmt: skip
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
    alive = {n: p for n, p in alive.items() if pid_alive(p, MARKERS.get(kind_of(n)))}
    for name in sorted(alive, key=stop_rank):
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
    """The fleet into the running lab's emulator; with `--sites`, into every site's under its own cluster's name,
    as `up` seeded them."""
    info = read_info(state_dir) or {}
    alive = live_pids(info)
    sites = info.get("sites") or {}
    k8s = info.get("kubernetes") or {}
    emulators = {s["cluster"]: (s["url"], f"{n}/kubernetes") for n, s in sites.items()} or (
        {k8s["cluster"]: (k8s["url"], "kubernetes")} if k8s.get("url") else {}
    )
    if not emulators or any(name not in alive for _, name in emulators.values()):
        say(f"error: no running lab with a Kubernetes emulator in {state_dir} (start one with `millwright lab up`)")
        return 1
    from lab.fleet import load_fleet
    from lab.k8s.admin import EmulatorAdmin

    try:
        loaded = load_fleet(str(fleet))
        objects = {cluster: (loaded.model_copy(update={"cluster": cluster}) if sites else loaded).to_objects()
                   for cluster in emulators}  # fmt: skip
    except Exception as err:
        say(f"error: cannot load fleet {fleet}: {err}")
        return 2

    async def go(url: str, cluster: str) -> None:
        async with EmulatorAdmin(url) as admin:
            if reset:
                await admin.reset()
            await admin.seed(objects[cluster])

    for cluster, (url, name) in emulators.items():
        try:
            asyncio.run(go(url, cluster))
        except Exception as err:
            say(f"error: seeding {url} failed: {err}")
            return 1
        say(f"seeded {len(objects[cluster])} objects from {fleet} into {url}"
            + (f" ({name.split('/')[0]}'s cluster {cluster!r})" if sites else ""))  # fmt: skip
    if not sites and loaded.cluster != k8s.get("cluster"):
        say(f"note: this fleet's cluster is {loaded.cluster!r}; the lab's kubeconfig context is {k8s.get('cluster')!r}")
    return 0


def log_tail(path: Path, lines: int = 8) -> list[str]:
    """The last `lines` lines of a log, each cut to 300 characters (a log may be gone, or still empty)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 64 * 1024))
            text = fh.read().decode(errors="replace")
    except OSError:
        return []
    return [line[:300] for line in text.splitlines()[-lines:]]


def service_logs(info: dict[str, Any], state_dir: Path, name: str) -> list[Path]:
    """A service's logs: the one its process writes, and the server's own under its folder (Prometheus, NetBox)."""
    root = Path(info.get("state_dir") or state_dir)
    logged = (info.get("logs") or {}).get(name)
    candidates = [Path(logged) if logged else root / f"{name}.log", root / name / f"{name}.log"]
    return [path for path in candidates if path.is_file()]


def down_services(info: dict[str, Any], alive: dict[str, int]) -> dict[str, str]:
    """The services that failed, or whose process has exited: name -> why."""
    pids = info.get("pids") or {}
    down = {}
    for name, entry in (info.get("services") or {}).items():
        state = entry.get("state")
        if state == "failed":
            down[name] = f"failed: {entry.get('note') or 'no reason recorded'}"
        elif state in ("ready", "starting") and pids.get(name) is not None and name not in alive:
            down[name] = f"its process (pid {pids[name]}) has exited"
    return down


def status(*, state_dir: Path) -> int:
    """Every service with its state, address and note; the webhook receiver's deliveries; each pid's liveness.
    Non-zero when the lab is not running or a service is down, naming each with the last lines of its logs."""
    info = read_info(state_dir)
    if not info:
        say(f"no lab running from {state_dir}")
        return 1
    alive = live_pids(info)
    pids = info.get("pids") or {}
    running = "runner" in alive
    say(f"{'running' if running else 'NOT running (stale lab.json)'} from {info.get('state_dir', state_dir)}, "
        f"since {info.get('started_at')}{'' if info.get('ready') else ' (still starting)'}")  # fmt: skip
    down = down_services(info, alive)
    width = max([11, *map(len, info.get("services") or {})])  # a site's services: site-1/kubernetes
    print(f"  {'service':<{width}} {'state':<12} {'address':<30} note")
    for name, entry in (info.get("services") or {}).items():
        state = entry.get("state", "?")
        if name in down and state != "failed":  # its process has exited
            state = "GONE"
        note = entry.get("note") or ""
        if state == "starting" and entry.get("since"):
            note = f"{note} [{_duration(time.time() - entry['since'])} so far]"
        print(f"  {name:<{width}} {state:<12} {entry.get('url') or '-':<30} {note}")
    print(f"  Temporal UI:   {info.get('ui')}")
    if info.get("kubeconfig"):
        print(f"  kubeconfig:    {info['kubeconfig']}")
    if info.get("netbox"):
        print(f"  NetBox token:  {info['netbox'].get('token')}")
    if info.get("worker"):
        print(
            f"  worker:        metrics {info['worker'].get('metrics')}, task queue {info['worker'].get('task_queue')}"
        )
    print_sites(info)
    if info.get("bmc"):
        bmc = info["bmc"]
        print(f"  BMC admin:     {bmc.get('admin')} (credentials {bmc.get('credentials')}"
              f"{', CA ' + bmc['ca_bundle'] if bmc.get('ca_bundle') else ', plain HTTP'})")  # fmt: skip
        for node, url in (bmc.get("servers") or {}).items():
            print(f"  BMC {node}: {url}")
    nvl72 = info.get("nvl72") or {}
    if nvl72.get("bmc"):
        print(f"  NVL72 BMCs:    {nvl72_bmcs(nvl72['bmc'])}")
    if nvl72.get("racks"):
        print(f"  rack faults:   POST {nvl72['racks']}/_lab/racks/<rack>/fabric-fault")
    if info.get("ufm"):
        print(f"  UFM:           {info['ufm'].get('url')} (credentials {info['ufm'].get('credentials')})")
    for path in (info.get("examples") or {}).values():
        print(f"  example:       {path}")
    if info.get("webhook") and "webhook" in alive:
        print_deliveries(info["webhook"]["url"])
    print("  pids:          " + ", ".join(f"{n} {p}{'' if n in alive else ' (GONE)'}" for n, p in pids.items()))
    say_down(info, state_dir, down)
    return 0 if running and not down else 1


def print_sites(info: dict[str, Any]) -> None:
    """A multi-site lab's sites (`--sites`): each one's cluster, worker, BMCs and audit; the site map."""
    for name, site in (info.get("sites") or {}).items():
        print(f"  {name + ':':<15}cluster {site['cluster']!r} {site['url']}, worker on {site['task_queue']} as "
              f"{site['identity']} (kubeconfig {site['kubeconfig']}), BMCs {site_bmcs(site['bmc'])}, audit "
              f"{site['audit']}")  # fmt: skip
    if info.get("site_map"):
        print(f"  site map:      {info['site_map']} (the central worker's)")


def site_bmcs(bmc: dict[str, Any] | None) -> str:
    if not bmc:
        return "left out"
    return f"{len(bmc['servers'])} servers (admin {bmc['admin']}, credentials {bmc['credentials']})"


def nvl72_bmcs(bmc: dict[str, Any]) -> str:
    switches = sum(map(len, bmc["switch_trays"].values()))
    return (f"{len(bmc['servers'])} compute trays and {switches} NVLink switch trays, admin {bmc['admin']} (each "
            "one's URL in lab.json: nvl72.bmc.servers by node, nvl72.bmc.switch_trays by rack)")  # fmt: skip


def say_down(info: dict[str, Any], state_dir: Path, down: dict[str, str]) -> None:
    for name, why in down.items():
        say(f"{described(name)} ({name}) is down: {why}")
        for log in service_logs(info, state_dir, name):
            say(f"  last lines of {log}:")
            for line in log_tail(log):
                say(f"    {line}")


def print_deliveries(url: str, last: int = 10) -> None:
    """The webhook receiver's deliveries (lab/webhook.py): how many, and the latest ones."""
    import httpx

    try:
        with httpx.Client(trust_env=False, timeout=3) as http:
            received = http.get(f"{url}/_lab/received").raise_for_status().json()
    except httpx.HTTPError as err:
        print(f"  webhook:       deliveries unknown ({type(err).__name__})")
        return
    events = received.get("events") or []
    print(f"  webhook:       {len(events)} deliveries ({received.get('duplicates', 0)} retried duplicates) at "
          f"{url}/hooks/<anything>")  # fmt: skip
    for event in events[-last:]:
        body = event.get("body") if isinstance(event.get("body"), dict) else {}
        at = datetime.fromtimestamp(event.get("received_at") or 0, UTC).strftime("%H:%M:%SZ")
        what = " ".join(f"{k}={body[k]}" for k in ("event", "cluster", "node", "reason") if body.get(k))
        print(f"    {at} POST {event.get('path')} {what or json.dumps(body)[:120]}")
