"""`millwright lab up/down/seed/status` as processes, on free loopback ports."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
import yaml
from temporalio.client import Client

REPO = Path(__file__).resolve().parents[1]


def cli_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TEMPORAL_", "MILLWRIGHT_"))}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def millwright(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "starter", *args],
        env=cli_env(),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


class BackgroundProcess:
    """A command in the background, its output collected line by line."""

    def __init__(self, argv: list[str], *, cwd: Path = REPO, env: dict[str, str] | None = None, **popen) -> None:
        self.lines: list[str] = []
        self.proc = subprocess.Popen(argv, env=cli_env() if env is None else env, cwd=cwd, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, **popen)  # fmt: skip
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_for(self, text: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if text in self.output:
                return
            if self.proc.poll() is not None:
                self._reader.join(2)
                if text in self.output:
                    return
                raise AssertionError(f"lab up exited with {self.proc.returncode}:\n{self.output}")
            time.sleep(0.1)
        raise AssertionError(f"no {text!r} after {timeout}s:\n{self.output}")

    def wait(self, timeout: float = 30) -> int:
        rc = self.proc.wait(timeout)
        self._reader.join(2)
        return rc

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                # Not stopped in time (a loaded machine): its children go with it rather than outlive the test.
                if os.getpgid(self.proc.pid) == self.proc.pid:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                else:
                    self.proc.kill()
                self.proc.wait(10)


class LabProcess(BackgroundProcess):
    """`millwright lab up` in the background."""

    def __init__(self, state_dir: Path, *args: str) -> None:
        super().__init__([sys.executable, "-m", "starter", "lab", "up", "--state-dir", str(state_dir), "--ui-port",
                          "0", *args], start_new_session=True)  # fmt: skip


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def wait_until(pred, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.1)
    return pred()


@pytest.fixture
def occupied_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def test_lab_up_refuses_twins_then_down_stops_everything(tmp_path, occupied_port):
    state = tmp_path / "state"
    lab = LabProcess(state, "--port", str(occupied_port), "--without", "netbox")  # NetBox: tests/test_examples.py
    try:
        lab.wait_for("lab: ready")
        lab.wait_for("  stop:")  # the banner's last line: every address printed before it
        assert f"port {occupied_port} for Temporal is taken; using" in lab.output
        info = json.loads((state / "lab.json").read_text())
        pids = info["pids"]
        assert set(pids) == {"runner", "temporal", "kubernetes", "nvl72", "nvl72-bmcs", "nvl72-racks", "worker", "bmcs",
                             "hosts", "ufm", "webhook", "prometheus"}  # fmt: skip
        assert all(map(alive, pids.values()))
        host, port = info["temporal"]["address"].rsplit(":", 1)
        assert host == "127.0.0.1" and int(port) != occupied_port
        assert info["ui"] in lab.output and info["kubeconfig"] in lab.output
        assert "millwright start NodeMaintenance --input examples/node-maintenance.json" in lab.output
        kubeconfig = Path(info["kubeconfig"]).read_text()
        assert info["kubernetes"]["url"] in kubeconfig and "name: lab" in kubeconfig
        with httpx.Client(trust_env=False, timeout=5) as http:
            assert http.get(f"{info['ui']}/api/v1/settings").status_code == 200
            assert "temporal_" in http.get(info["worker"]["metrics"]).text
            assert http.get(f"{info['kubernetes']['url']}/api/v1/nodes").status_code in (200, 401, 403)
            # The NVL72 trays' BMCs: each node's and each rack's switch trays', as the rack faults' admin lists them
            trays = info["nvl72"]["bmc"]
            rack = http.get(f"{info['nvl72']['racks']}/_lab/racks/rack-001").json()
            assert rack["bmcs"] == {
                **{n: trays["servers"][n] for n in rack["nodes"]},
                **trays["switch_trays"]["rack-001"],
            }
            assert not rack["faulted"] and len(trays["servers"]) == 72 and len(rack["switch_trays"]) == 9
            assert all(url.startswith("https://") for url in rack["bmcs"].values())

        twin = millwright("lab", "up", "--state-dir", str(state), "--port", "0", "--ui-port", "0")
        assert twin.returncode == 1 and "already running" in twin.stdout, twin
        assert all(map(alive, pids.values()))

        status = millwright("lab", "status", "--state-dir", str(state))
        assert status.returncode == 0 and info["ui"] in status.stdout
        # The lab declared its cluster's budget as an operator would (no requester sets it).
        budget = millwright("budget", "show", "lab", "--state-dir", str(state))
        assert budget.returncode == 0 and "millwright lab" in budget.stdout, budget
        assert info["bmc"]["admin"] in status.stdout and info["bmc"]["servers"]["gpu-node-01"] in status.stdout
        states = {line.split()[0]: line.split()[1] for line in status.stdout.splitlines()[2:14]}
        assert states == {
            "temporal": "ready",
            "kubernetes": "ready",
            "nvl72": "ready",
            "nvl72-bmcs": "ready",
            "nvl72-racks": "ready",
            "bmcs": "ready",
            "hosts": "ready",
            "ufm": "ready",
            "webhook": "ready",
            "prometheus": "ready",
            "netbox": "left",
            "worker": "ready",
        }, status.stdout
        assert "netbox      left out     -                              --without" in status.stdout

        # The webhook receiver's deliveries are listed by `lab status`.
        hook = info["webhook"]["hooks"]
        with httpx.Client(trust_env=False, timeout=5) as http:
            http.post(
                hook,
                json={"event": "node-quarantined", "cluster": "lab", "node": "gpu-node-04"},
                headers={"Idempotency-Key": "k1"},
            ).raise_for_status()
        status = millwright("lab", "status", "--state-dir", str(state))
        assert "webhook:       1 deliveries" in status.stdout
        assert "POST /hooks/ops event=node-quarantined cluster=lab node=gpu-node-04" in status.stdout

        # The worker was handed every integration the lab runs, as references, and says so at start.
        worker_log = (state / "worker.log").read_text()
        assert f"UFM: {info['ufm']['url']} (credentials {info['ufm']['credentials']}, CA bundle file:" in worker_log
        assert f"BMCs (Redfish): default credentials {info['bmc']['credentials']}, CA bundle file:" in worker_log
        assert "NetBox: not configured: its activities fail with NetBoxNotConfigured" in worker_log
        assert f"Prometheus: GPU faults from {info['prometheus']['url']}," in worker_log
        # The real Prometheus scrapes dcgm-exporter on the 6 GPU nodes (clean), and the worker.
        query = 'DCGM_FI_DEV_XID_ERRORS{cluster="lab", Hostname=~"gpu-node-.*"}'
        with httpx.Client(base_url=info["prometheus"]["url"], trust_env=False, timeout=5) as http:
            deadline = time.monotonic() + 60
            while len(series := http.get("/api/v1/query", params={"query": query}).json()["data"]["result"]) < 48:
                assert time.monotonic() < deadline, series
                time.sleep(0.5)
            assert len(series) == 6 * 8 and {s["value"][1] for s in series} == {"0"}
            while not http.get("/api/v1/query", params={"query": 'up{job="millwright-worker"} == 1'}).json()["data"][
                "result"
            ]:
                assert time.monotonic() < deadline, "the worker's /metrics is not scraped"
                time.sleep(0.5)
            targets = http.get("/api/v1/targets").json()["data"]["activeTargets"]
        assert sum(t["labels"]["job"] == "dcgm-exporter" and t["health"] == "up" for t in targets) == 6

        seeded = millwright(
            "lab", "seed", str(REPO / "lab" / "fleets" / "demo.json"), "--reset", "--state-dir", str(state)
        )
        assert seeded.returncode == 0, seeded

        down = millwright("lab", "down", "--state-dir", str(state))
        assert down.returncode == 0, down
        assert lab.wait(30) == 0, lab.output
        assert wait_until(lambda: not any(map(alive, pids.values())), 10), pids
        assert not (state / "lab.json").exists()
        assert wait_until(lambda: port_free(int(port)), 10)
        assert millwright("lab", "status", "--state-dir", str(state)).returncode == 1
    finally:
        lab.kill()


def test_lab_burns_in_a_node_through_its_bmc_and_host_agent(tmp_path):
    """`lab up` runs a BMC per GPU node (powered On, HTTPS with the lab CA) and their host agents; the example it
    writes, started the way the UI starts it (type name, plain JSON), takes the node out of service, burns it in to
    `passed` and puts it back."""
    state = tmp_path / "state"
    lab = LabProcess(state, "--port", "0", "--without", "netbox,ufm,webhook")
    try:
        lab.wait_for("lab: ready")
        info = json.loads((state / "lab.json").read_text())
        bmc = info["bmc"]
        assert set(bmc["servers"]) == {f"gpu-node-{i:02d}" for i in range(1, 7)}
        secret = state / "bmc" / "credentials"
        assert bmc["credentials"] == f"file:{secret.resolve()}" and secret.stat().st_mode & 0o777 == 0o600
        password = secret.read_text().strip().split(":", 1)[1]
        assert len(password) >= 16 and password not in (state / "lab.json").read_text() + lab.output
        example_path = state / "examples" / "server-burn-in.json"
        assert f"millwright start ServerBurnIn --input {example_path}" in lab.output
        example = json.loads(example_path.read_text())
        node = example["server"]["name"]
        assert example["server"]["bmc"] == {
            "url": bmc["servers"][node],
            "ca_bundle": f"file:{state.resolve()}/tls/ca.pem",
        }
        assert bmc["servers"][node].startswith("https://127.0.0.1:")
        assert bmc["ca_bundle"] == example["server"]["bmc"]["ca_bundle"]
        assert example["server"]["kubernetes"]["take_out_of_service"] is True
        example["settings"].update(stress_seconds=1, dcgm_level=None)

        async def burn_in() -> dict:
            client = await Client.connect(info["temporal"]["address"])
            handle = await client.start_workflow("ServerBurnIn", example, id=f"burn-in/{node}",
                                                 task_queue=info["task_queue"])  # fmt: skip
            return await asyncio.wait_for(handle.result(), 90)

        result = asyncio.run(burn_in())
        assert (result["result"], result["findings"], result["gpus"]) == ("passed", [], 8), result
        assert any("back in service" in n for n in result["notes"]), result["notes"]
        with httpx.Client(trust_env=False, timeout=5) as http:
            audit = http.get(f"{bmc['admin']}/_lab/audit", params={"server": node, "writes": 1}).json()["entries"]
            view = http.get(f"{bmc['admin']}/_lab/servers/{node}").json()
            k8s_node = http.get(f"{info['kubernetes']['url']}/api/v1/nodes/{node}").json()
            # Plain HTTP to a BMC gets nothing: neither Basic auth nor a session is answered without TLS.
            with pytest.raises(httpx.HTTPError):
                http.post(
                    bmc["servers"][node].replace("https:", "http:") + "/redfish/v1/SessionService/Sessions",
                    json={"UserName": "admin", "Password": password},
                )
        assert not k8s_node["spec"].get("unschedulable")  # back in service
        # its power reached its Kubernetes node: a new boot ID at each power-on
        assert k8s_node["status"]["nodeInfo"]["bootID"].startswith(f"{node}-boot-")
        # it was running: power-cycled into the burn-in image, then back onto its disk
        assert [e["reset_type"] for e in audit if e.get("reset_type")] == ["ForceOff", "On", "ForceOff", "On"]
        assert (view["power"], view["booted_from"]) == ("On", "Hdd")
    finally:
        lab.kill()
    assert lab.proc.returncode == 0, lab.output


def test_lab_restart_keeps_state_and_a_dead_child_stops_the_lab(tmp_path):
    assert millwright("lab", "up", "--without", "netbox,kafka").returncode == 2  # unknown service: nothing starts
    state = tmp_path / "state"
    first = LabProcess(state, "--port", "0", "--without", "netbox,ufm,webhook", "--without", "bmcs", "--bmc-http")
    try:
        first.wait_for("lab: ready")
        assert "seeded the Kubernetes emulator" in first.output
        assert "installed 13 kinds in the management cluster" in first.output
        status = millwright("lab", "status", "--state-dir", str(state)).stdout
        for service in ("netbox", "ufm", "webhook", "bmcs", "hosts"):
            assert f"\n  {service:<11} left out " in status, status
        assert "UFM: not configured: its activities fail with UfmNotConfigured" in (state / "worker.log").read_text()
    finally:
        first.kill()
    assert first.proc.returncode == 0, first.output

    lab = LabProcess(state, "--port", "0", "--without", "netbox", "--bmc-http")
    try:
        lab.wait_for("lab: ready")
        assert "kept the Kubernetes emulator's saved objects" in lab.output
        assert "installed" not in lab.output  # the kinds were kept too
        info = json.loads((state / "lab.json").read_text())
        assert info["bmc"]["servers"]["gpu-node-01"].startswith("http://") and info["bmc"]["ca_bundle"] is None
        pids = json.loads((state / "lab.json").read_text())["pids"]
        os.kill(pids["worker"], signal.SIGKILL)
        assert lab.wait(40) == 1, lab.output
        assert f"the worker (pid {pids['worker']}) exited" in lab.output
        assert wait_until(lambda: not any(alive(p) for n, p in pids.items()), 10), pids
        assert not (state / "lab.json").exists()
    finally:
        lab.kill()


CAMPAIGN_TIMEOUT = 180


def quick_campaign(example: Path, folder: Path) -> Path:
    """A copy of the multi-site lab's campaign that soaks 1 s after each batch (not the example's 10 s, after each of
    4 batches per cluster) and looks again every 2 s (not every minute) at the node of the demo fleet's protected
    pod, which finishes 60 s after the lab starts. With the emulators' quick settings the campaign then takes about
    80 s (the canary waiting for that pod, then the other cluster), not 2.5 minutes."""
    campaign = json.loads(example.read_text())
    campaign["rollout"].update(soakTime="1s", nonInterruptRetryInterval="2s")
    path = folder / example.name
    path.write_text(json.dumps(campaign, indent=2) + "\n")
    return path


def test_lab_up_with_two_sites_runs_a_campaign_each_site_reached_by_its_own_worker_only(tmp_path):
    """`lab up --sites 2` (issue 42, docs/lab.md "Several sites"): two sites, each its own emulator, BMCs and site
    worker holding only its own kubeconfig and BMC credentials, a central worker with the site map and neither; the
    campaign the banner offers completes across both, each site's emulator called by its own worker only; `lab
    down` leaves no process."""
    from activities.firmware.integration import Bmcs
    from activities.kube.integration import Kubernetes
    from activities.sites import SiteMap
    from lab.runner import LAB_ADMIN
    from tests.sites import GRACE_SCALE, POD_START_SECONDS
    from tests.test_two_sites import environment
    from tests.workflows.rollout.helpers import JOBS_FAST, REBOOT_SECONDS

    state = tmp_path / "state"
    lab, campaign = LabProcess(state, "--port", "0", "--sites", "2"), None
    try:
        lab.wait_for("  stop:", timeout=120)  # the banner's last line
        info = json.loads((state / "lab.json").read_text())
        sites, pids = info["sites"], info["pids"]
        assert list(sites) == ["site-1", "site-2"]
        assert set(pids) == {"runner", "temporal", "webhook", "worker",
                             *(f"{s}/{kind}" for s in sites for kind in ("kubernetes", "bmcs", "worker"))}  # fmt: skip
        assert all(map(alive, pids.values()))
        example = info["examples"]["fleet-rollout"]
        assert f"campaign:      millwright start FleetRollout --input {example} --state-dir {state} --watch" in (
            lab.output
        )
        for name, site in sites.items():
            assert f"seeded {name}'s Kubernetes emulator (cluster {site['cluster']!r}) from" in lab.output
            assert f"{name + ':':<15}cluster {site['cluster']!r} at {site['url']}" in lab.output
            assert f"kubeconfig:  {site['kubeconfig']} (its worker's: user {site['identity']}" in lab.output
            assert f"worker:      MILLWRIGHT_SITE={name} on {site['task_queue']}" in lab.output
            kubeconfig = yaml.safe_load(Path(site["kubeconfig"]).read_text())  # its cluster, nothing else
            assert [c["name"] for c in kubeconfig["contexts"]] == [site["cluster"]], kubeconfig
            assert len(site["bmc"]["servers"]) == 6
        assert f"MILLWRIGHT_SITE_MAP={info['site_map']}, no kubeconfig, no BMC credentials" in lab.output
        assert json.loads(Path(example).read_text())["clusters"] == ["lab-1", "lab-2"]

        # The site map in the documented format: each site's cluster and its BMCs' host:port.
        site_map = SiteMap.load(info["site_map"])
        for name, site in sites.items():
            assert site_map.sites[name].clusters == [site["cluster"]]
            assert site_map.sites[name].bmcs == sorted(url.split("/")[2] for url in site["bmc"]["servers"].values())
            assert {site_map.site_of_bmc(url) for url in site["bmc"]["servers"].values()} == {name}

        # The banner's campaign, started now and run while the rest is checked: the lab's example as written, but
        # for its timings (`quick_campaign`), in emulators told to run pods, jobs, evictions and reboots quickly
        # (`POST /_lab/config`, as tests/sites.py's emulators).
        quick = {"jobs": JOBS_FAST, "rebootSeconds": REBOOT_SECONDS, "podStartSeconds": POD_START_SECONDS,
                 "graceScale": GRACE_SCALE}  # fmt: skip
        with httpx.Client(trust_env=False, timeout=10) as http:
            for site in sites.values():
                http.post(f"{site['url']}/_lab/config", json=quick).raise_for_status()
        campaign = BackgroundProcess([sys.executable, "-m", "starter", "start", "FleetRollout", "--input",
                                      str(quick_campaign(Path(example), tmp_path)), "--state-dir", str(state),
                                      "--watch"])  # fmt: skip

        for count in ("0", "1"):  # a multi-site lab has two sites or more: refused before anything starts
            refused = millwright("lab", "up", "--sites", count, "--state-dir", str(tmp_path / "refused"))
            assert refused.returncode == 2 and "2 sites or more" in refused.stdout, refused
            assert not (tmp_path / "refused").exists()
        twin = millwright("lab", "up", "--sites", "2", "--state-dir", str(state), "--port", "0", "--ui-port", "0")
        assert twin.returncode == 1 and "already running" in twin.stdout, twin
        status = millwright("lab", "status", "--state-dir", str(state))
        assert status.returncode == 0, status
        table = status.stdout.split("\n  Temporal UI:")[0].splitlines()[2:]
        states = {line.split()[0]: line.split()[1] for line in table}
        services = ["temporal", *(f"{s}/{kind}" for s in sites for kind in ("kubernetes", "bmcs", "worker")),
                    "webhook", "worker"]  # fmt: skip
        assert {n: states.pop(n) for n in services} == dict.fromkeys(services, "ready"), status.stdout
        assert set(states.values()) == {"left"}, status.stdout  # NetBox, UFM, Prometheus, NVL72, host agents

        # Who holds what: the central worker the site map only, each site's worker its own site's settings only.
        reaching = {*Kubernetes.environment(kubeconfig=""), *Bmcs.environment(bmc_credentials="", bmc_ca_bundle="")}
        folders = {name: f"{(state / name).resolve()}/" for name in sites}
        central = environment(pids["worker"])
        assert central["MILLWRIGHT_SITE_MAP"] == info["site_map"]
        assert not ({"KUBECONFIG", "MILLWRIGHT_SITE"} | reaching) & set(central), central
        assert not [v for v in central.values() if any(f in v for f in folders.values())], central
        for name, site in sites.items():
            env = environment(pids[f"{name}/worker"])
            assert env["MILLWRIGHT_SITE"] == name and "MILLWRIGHT_SITE_MAP" not in env and "KUBECONFIG" not in env
            assert {k: env[k] for k in reaching & set(env)} == {
                **Kubernetes.environment(kubeconfig=site["kubeconfig"]),
                **Bmcs.environment(bmc_credentials=site["bmc"]["credentials"], bmc_ca_bundle=site["bmc"]["ca_bundle"]),
            }
            others = [folder for other, folder in folders.items() if other != name]
            assert not [v for v in env.values() if any(f in v for f in others)], env

        assert campaign.wait(CAMPAIGN_TIMEOUT) == 0 and '"outcome": "completed"' in campaign.output, campaign.output
        with httpx.Client(trust_env=False, timeout=10) as http:
            for name, site in sites.items():
                entries = http.get(site["audit"]).raise_for_status().json()["entries"]
                callers = {entry["user"] for entry in entries if "user" in entry}  # none: the emulator's controllers
                assert callers - {LAB_ADMIN} == {site["identity"]}, (name, callers)
        seeded = millwright("lab", "seed", str(REPO / "lab" / "fleets" / "demo.json"), "--state-dir", str(state))
        assert seeded.returncode == 0, seeded  # into every site's emulator, as its cluster
        for name, site in sites.items():
            assert f"into {site['url']} ({name}'s cluster {site['cluster']!r})" in seeded.stdout, seeded.stdout

        down = millwright("lab", "down", "--state-dir", str(state))
        assert down.returncode == 0, down
        assert lab.wait(30) == 0, lab.output
        assert wait_until(lambda: not any(map(alive, pids.values())), 10), pids
        assert not (state / "lab.json").exists()
    finally:
        if campaign is not None:
            campaign.kill()
        lab.kill()


async def test_netbox_gate_says_netbox_is_starting_then_lets_it_through(tmp_path):
    """The lab's worker has NetBox's address from the start: while NetBox migrates, a NetBox activity fails
    retryably, saying so (lab/netbox.py `NetBoxGate`); once it runs, requests reach it unchanged."""
    from aiohttp import web
    from temporalio.exceptions import ApplicationError
    from temporalio.testing import ActivityEnvironment

    from activities.netbox.activities import NetBoxActivities
    from activities.netbox.client import NetBoxConfig
    from activities.netbox.models import DeviceLookup
    from activities.support.secrets import SecretRef
    from lab.loopback import write_secret_file
    from lab.netbox import NetBoxGate, new_token

    stage = "migrating its database: 12/400 migrations (NetBox 4.7.3: the first start only, then cached)"
    gate = await NetBoxGate(lambda: stage).start()
    upstream = web.AppRunner(web.Application(middlewares=[]))
    try:
        token = write_secret_file(tmp_path / "token", new_token())
        netbox = NetBoxActivities(NetBoxConfig(url=gate.url, token=SecretRef.parse(f"file:{token}")))
        with pytest.raises(ApplicationError) as starting:
            await ActivityEnvironment().run(netbox.find_device, DeviceLookup(name="gpu-node-01"))
        assert starting.value.type == "NetBoxUnavailable" and not starting.value.non_retryable
        assert f'NetBox answered 503: {{"detail": "NetBox is starting in the lab ({stage})' in starting.value.message

        async def answer(request: web.Request) -> web.Response:
            return web.json_response({"path": request.path_qs})

        upstream.app.router.add_get("/{tail:.*}", answer)
        await upstream.setup()
        site = web.TCPSite(upstream, "127.0.0.1", 0)
        await site.start()
        gate.open(site._server.sockets[0].getsockname()[1])
        async with httpx.AsyncClient(trust_env=False, timeout=5) as http:
            assert (await http.get(f"{gate.url}/api/status/?x=1")).json() == {"path": "/api/status/?x=1"}
    finally:
        await gate.close()
        await upstream.cleanup()


def test_netbox_migration_progress_counts_applied_migrations_out_of_the_plan(tmp_path):
    """NetBox's first start migrates for minutes: `lab up` shows how far it is (lab/netbox.py `_migrate`), counting
    Django's "Applying x... OK" lines, which it writes in two parts."""
    from lab.netbox import NetBoxLab

    netbox = tmp_path / "venv" / "bin" / "netbox"
    netbox.parent.mkdir(parents=True)
    netbox.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = showmigrations ]; then printf "[ ]  a.0001\\n[ ]  a.0002\\n[ ]  b.0001\\n"; exit 0; fi\n'
        'for m in a.0001 a.0002 b.0001; do printf "  Applying $m..."; sleep 0.3; echo " OK"; done\n'
    )
    netbox.chmod(0o755)
    stages: list[str] = []
    lab = NetBoxLab(tmp_path / "netbox", on_stage=stages.append)
    lab.root.mkdir()
    lab._migrate(netbox.parents[1], dict(os.environ), "4.7.3")
    counts = [s.split(": ")[1].split(" ")[0] for s in stages]
    assert counts[0] in ("0/?", "0/3") and counts[-3:] == ["1/3", "2/3", "3/3"], stages
    assert "the first start only, then cached" in stages[-1]


def test_the_labs_worker_settings_carry_its_bmcs_for_the_event_path(tmp_path):
    """The lab's event path resolves a node's BMC as the sweep does: the map in the worker's settings, credentials
    as a reference (worker/fault_events.py)."""
    from lab.runner import Lab
    from worker.config import WorkerSettings

    lab = Lab(tmp_path, tmp_path / "fleet.json", 0, 0, "lab-queue", 1.0)
    refs = {"credentials": f"file:{tmp_path / 'credentials'}", "ca_bundle": f"file:{tmp_path / 'ca.pem'}"}
    lab.info["bmc"] = {**refs, "servers": {"gpu-node-01": "https://127.0.0.1:8443"}}
    lab.info["nvl72"] = {"bmc": {**refs, "servers": {"k2x9q0ab": "https://127.0.0.1:8444"},
                                 "switch_trays": {"rack-001": {"rack-001-nvswitch-0": "https://127.0.0.1:8445"}}}}  # fmt: skip
    env = lab.worker_env("127.0.0.1:7233", tmp_path / "kubeconfig", 9090)
    settings, _ = WorkerSettings(fault_events_clusters=["lab"],
                                 fault_events_settings=env["MILLWRIGHT_FAULT_EVENTS_SETTINGS"]).fault_event_config()  # fmt: skip
    assert {node: bmc.url for node, bmc in settings.bmcs.items()} == {"gpu-node-01": "https://127.0.0.1:8443",
                                                                      "k2x9q0ab": "https://127.0.0.1:8444"}  # fmt: skip
    for bmc in settings.bmcs.values():
        assert (bmc.credentials, bmc.ca_bundle) == (refs["credentials"], refs["ca_bundle"])


def test_a_site_without_bmcs_has_no_bmc_credentials_and_none_in_the_site_map(tmp_path):
    """`lab up --sites N --without bmcs`, or a fleet that turns its BMCs off: each site's worker gets its kubeconfig
    and no BMC credentials, and the site map lists no BMC for it."""
    from activities.sites import SiteMap
    from lab.runner import Lab

    lab = Lab(tmp_path, tmp_path / "fleet.json", 0, 0, "lab-queue", 1.0, without={"bmcs"}, sites=2)
    bare = {"name": "site-1", "cluster": "lab-1", "kubeconfig": str(tmp_path / "site-1" / "kubeconfig"), "bmc": None}
    env = lab.site_worker_env("127.0.0.1:7233", bare, 9090)
    assert (env["MILLWRIGHT_SITE"], env["MILLWRIGHT_KUBECONFIG"]) == ("site-1", bare["kubeconfig"])
    assert not {"MILLWRIGHT_BMC_CREDENTIALS", "MILLWRIGHT_BMC_CA_BUNDLE"} & set(env), env
    with_bmcs = {**bare, "name": "site-2", "cluster": "lab-2",
                 "bmc": {"servers": {"gpu-node-01": "https://127.0.0.1:8443"}}}  # fmt: skip
    site_map = SiteMap.load(lab.write_site_map({"site-1": bare, "site-2": with_bmcs}))
    assert (site_map.sites["site-1"].bmcs, site_map.sites["site-2"].bmcs) == ([], ["127.0.0.1:8443"])


def test_a_sites_worker_that_exits_leaves_the_lab_running_and_is_started_again(tmp_path, monkeypatch):
    """Killing a site's worker (to try a site cut off) marks it down and starts it again after
    SITE_WORKER_RESTART_SECONDS; any other child that exits still ends the lab."""
    from lab import runner

    monkeypatch.setattr(runner, "SITE_WORKER_RESTART_SECONDS", 0.5)
    lab = runner.Lab(tmp_path, tmp_path / "fleet.json", 0, 0, "lab-queue", 1.0, sites=2)
    lab.service("site-2/worker", "ready")
    first = lab.spawn("site-2/worker", [sys.executable, "-c", "import time; time.sleep(0.3)"])
    webhook = lab.spawn("webhook", [sys.executable, "-c", "import time; time.sleep(60)"])
    cut_off: dict[str, float] = {}
    try:
        assert wait_until(lambda: lab.watch_children(cut_off) and "site-2/worker" in cut_off, 10)
        assert lab.info["services"]["site-2/worker"]["state"] == "down"
        assert "site-2/worker" not in read_pids(tmp_path)
        assert wait_until(lambda: lab.watch_children(cut_off) and not cut_off, 10)
        again = lab.children["site-2/worker"]
        assert again.pid != first.pid and again.argv == first.argv
        assert lab.info["services"]["site-2/worker"]["state"] == "ready"
        assert read_pids(tmp_path)["site-2/worker"] == again.pid
        webhook.process.kill()
        webhook.process.wait()
        assert wait_until(lambda: not lab.watch_children(cut_off), 10)
    finally:
        for child in lab.children.values():
            child.process.kill()
            child.process.wait()


def read_pids(state_dir: Path) -> dict[str, int]:
    return json.loads((state_dir / "lab.json").read_text())["pids"]
