"""The lab's and the tests' Prometheus: Debian's real server (``prometheus`` 2.42, installed by ``./dev``), run on
127.0.0.1 with a generated config and its own data directory, and stopped afterwards; the package's systemd
service plays no part.

It scrapes, every ``scrape_interval``:

* job ``dcgm-exporter``: one target per GPU node of the Kubernetes emulator, found by HTTP service discovery
  (lab/k8s/dcgm.py serves both the list and each node's exporter), with the ``cluster`` label a fleet's scrape adds;
* job ``kai-queues``: the emulator's KAI queue metrics (``kai_queue_*{queue_name}``);
* job ``millwright-worker``: a worker's own ``/metrics``, when it has one.

Every query the server answers goes to its query log (`queries()`), so a test can count what a worker asked.
``with PrometheusServer(dir, emulator_url=...) as prom: prom.url``; ``python -m lab.prometheus --ready-file F
--emulator-url U [--worker-metrics host:port]`` runs one until SIGTERM (the lab runner's shape).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from lab.loopback import LOOPBACK, free_port, write_ready_file


class PrometheusUnavailable(Exception):
    """The server binary is not installed here; the message is one line saying how to get it."""


class PrometheusError(Exception):
    """Prometheus was expected to start (or reload) but did not; the message names the log to read."""


def find_prometheus() -> str:
    """``MILLWRIGHT_PROMETHEUS_BIN``, else ``prometheus`` on PATH. Never downloads."""
    found = os.environ.get("MILLWRIGHT_PROMETHEUS_BIN") or shutil.which("prometheus")
    if not found or not Path(found).is_file():
        raise PrometheusUnavailable(
            "Prometheus not found (apt-get install prometheus, as ./dev does as root; or set MILLWRIGHT_PROMETHEUS_BIN)"
        )
    return found


def scrape_config(
    *, interval: str, emulator_url: str | None, cluster: str, worker_metrics: str | None, query_log: Path
) -> dict[str, Any]:
    """The generated prometheus.yml."""
    jobs: list[dict[str, Any]] = []
    if emulator_url:
        emulator = urlsplit(emulator_url)
        cluster_label = [{"target_label": "cluster", "replacement": cluster}]
        jobs.append({
            "job_name": "dcgm-exporter",
            "scheme": emulator.scheme,
            "http_sd_configs": [{"url": f"{emulator_url.rstrip('/')}/_lab/dcgm/targets", "refresh_interval": interval}],
            # the instance is the node, as a DaemonSet's pods would be told apart
            "relabel_configs": [*cluster_label, {"source_labels": ["node"], "target_label": "instance"}],
        })  # fmt: skip
        jobs.append({"job_name": "kai-queues", "scheme": emulator.scheme, "metrics_path": "/_lab/kai/metrics",
                     "static_configs": [{"targets": [emulator.netloc]}], "relabel_configs": cluster_label})  # fmt: skip
    if worker_metrics:
        jobs.append({"job_name": "millwright-worker", "static_configs": [{"targets": [worker_metrics]}]})
    return {
        "global": {"scrape_interval": interval, "evaluation_interval": interval, "query_log_file": str(query_log)},
        "scrape_configs": jobs,
    }


class PrometheusServer:
    def __init__(
        self,
        state_dir: Path | str,
        *,
        port: int = 0,
        scrape_interval: str = "1s",
        emulator_url: str | None = None,
        cluster: str = "lab",
        worker_metrics: str | None = None,
    ) -> None:
        # absolute: Prometheus resolves the config's relative paths (query_log_file) against the config's folder
        self.state_dir = Path(state_dir).absolute()
        self.port = port or free_port()
        self.scrape_interval = scrape_interval
        self.emulator_url, self.cluster, self.worker_metrics = emulator_url, cluster, worker_metrics
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    @property
    def log_file(self) -> Path:
        return self.state_dir / "prometheus.log"

    @property
    def query_log(self) -> Path:
        return self.state_dir / "queries.log"

    def write_config(self) -> Path:
        path = self.state_dir / "prometheus.yml"
        config = scrape_config(interval=self.scrape_interval, emulator_url=self.emulator_url, cluster=self.cluster,
                               worker_metrics=self.worker_metrics, query_log=self.query_log)  # fmt: skip
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        return path

    def command(self) -> list[str]:
        return [
            find_prometheus(),
            f"--config.file={self.state_dir / 'prometheus.yml'}",
            f"--storage.tsdb.path={self.state_dir / 'data'}",
            f"--web.listen-address={LOOPBACK}:{self.port}",
            "--web.enable-lifecycle",
            # new targets reach the scrape manager at this pace (hidden flag, default 5 s; discovery adds its own 5 s)
            f"--scrape.discovery-reload-interval={self.scrape_interval}",
            "--log.level=warn",
        ]

    def start(self, timeout: float = 30.0) -> PrometheusServer:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.write_config()
        with open(self.log_file, "ab") as log:
            self.process = subprocess.Popen(self.command(), stdin=subprocess.DEVNULL, stdout=log,
                                            stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
        deadline = time.monotonic() + timeout
        while not self._answers("/-/ready"):
            if self.process.poll() is not None:
                raise PrometheusError(f"Prometheus exited with code {self.process.returncode}; see {self.log_file}")
            if time.monotonic() > deadline:
                self.stop()
                raise PrometheusError(f"Prometheus was not ready in {timeout:.0f}s; see {self.log_file}")
            time.sleep(0.1)
        return self

    def _answers(self, path: str) -> bool:
        try:
            with urllib.request.urlopen(self.url + path, timeout=2) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def stop(self, timeout: float = 10.0) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    async def vector(self, promql: str) -> list[dict]:
        """An instant query's vector (``[{"metric": {...}, "value": [ts, "v"]}]``); AssertionError on an error."""
        import httpx

        async with httpx.AsyncClient(trust_env=False, timeout=10) as http:
            body = (await http.post(f"{self.url}/api/v1/query", data={"query": promql})).json()
        assert body["status"] == "success", body
        return list(body["data"]["result"])

    async def wait_for(self, promql: str, *, what: str, timeout: float = 30.0) -> list[dict]:
        """Until `promql` answers a non-empty vector (a scrape or two, and a new target's discovery: the discovery
        and scrape managers pass new targets on every 5 s); AssertionError naming `what` after `timeout`."""
        import asyncio

        deadline = time.monotonic() + timeout
        while not (found := await self.vector(promql)):
            if time.monotonic() > deadline:
                raise AssertionError(f"Prometheus did not show {what} ({promql}) in {timeout:.0f}s")
            await asyncio.sleep(0.2)
        return found

    def queries(self) -> list[str]:
        """The PromQL of every query answered so far, oldest first."""
        try:
            lines = self.query_log.read_text().splitlines()
        except FileNotFoundError:
            return []
        return [json.loads(line)["params"]["query"] for line in lines if line.strip()]

    def __enter__(self) -> PrometheusServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lab.prometheus", description="Debian's Prometheus for the lab")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--ready-file")
    p.add_argument("--state-dir", help="config, data and logs (default: a temporary directory, removed at the end)")
    p.add_argument("--scrape-interval", default="5s")
    p.add_argument("--emulator-url", help="the Kubernetes emulator serving dcgm-exporter and KAI metrics")
    p.add_argument("--cluster", default="lab", help="the cluster label the scrape adds")
    p.add_argument("--worker-metrics", help="host:port of a worker's /metrics")
    a = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="lab-prometheus-") as tmp:
        server = PrometheusServer(a.state_dir or tmp, port=a.port, scrape_interval=a.scrape_interval,
                                  emulator_url=a.emulator_url, cluster=a.cluster, worker_metrics=a.worker_metrics)  # fmt: skip
        try:
            server.start()
        except (PrometheusUnavailable, PrometheusError) as err:
            print(f"lab.prometheus: {err}", file=sys.stderr)
            return 1
        if a.ready_file:
            write_ready_file(a.ready_file, server.url)
        print(f"lab.prometheus: {server.url} (pid {server.process.pid if server.process else '?'})", file=sys.stderr)
        from lab.venvs import serve_until_signal

        assert server.process is not None
        process = server.process
        serve_until_signal(lambda: None if process.poll() is None else f"Prometheus exited ({process.returncode})",
                           server.stop)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
