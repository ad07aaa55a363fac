"""`millwright lab status` says which service is down, with its log's last lines, and exits non-zero; and every
path the lab hands a server is absolute whatever state dir it was given (a relative one broke Prometheus)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from lab import runner
from lab.prometheus import PrometheusServer
from lab.temporal import DevServer
from lab.tls import LabCa


@pytest.fixture
def lab_runner_alive():
    """A live process whose command line holds the runner's marker, standing for `lab up`'s runner."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "lab"])
    yield proc.pid
    proc.kill()
    proc.wait()


def exited_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass", "lab.prometheus"])
    proc.wait()
    return proc.pid


def write_lab(state_dir: Path, runner_pid: int, services: dict[str, dict], pids: dict[str, int]) -> None:
    runner.write_info(state_dir, {"state_dir": str(state_dir), "ready": True, "services": services,
                                  "pids": {"runner": runner_pid, **pids}})  # fmt: skip


def test_status_is_zero_while_every_service_runs(tmp_path, lab_runner_alive, capsys):
    write_lab(tmp_path, lab_runner_alive, {"prometheus": {"state": "ready"}, "netbox": {"state": "left out"}}, {})
    assert runner.status(state_dir=tmp_path) == 0
    assert "is down" not in capsys.readouterr().out


def test_status_names_an_exited_service_with_the_last_lines_of_its_logs(tmp_path, lab_runner_alive, capsys):
    (tmp_path / "prometheus.log").write_text("lab.prometheus: Prometheus exited with code 1\n")
    (tmp_path / "prometheus").mkdir()
    (tmp_path / "prometheus" / "prometheus.log").write_text(
        "".join(f"line {i}\n" for i in range(20)) + 'level=error msg="Failed to apply configuration"\n'
    )
    write_lab(tmp_path, lab_runner_alive, {"prometheus": {"state": "ready"}, "worker": {"state": "ready"}},
              {"prometheus": exited_pid()})  # fmt: skip
    assert runner.status(state_dir=tmp_path) == 1
    out = capsys.readouterr().out
    assert "(prometheus) is down: its process" in out
    assert "Prometheus exited with code 1" in out and "Failed to apply configuration" in out
    assert "line 19" in out and "line 5\n" not in out  # the last lines only
    assert "(worker) is down" not in out


def test_status_names_a_failed_service(tmp_path, lab_runner_alive, capsys):
    write_lab(tmp_path, lab_runner_alive, {"netbox": {"state": "failed", "note": "migrate exited with 1"}}, {})
    assert runner.status(state_dir=tmp_path) == 1
    assert "(netbox) is down: failed: migrate exited with 1" in capsys.readouterr().out


def test_every_path_handed_to_a_server_is_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    relative = Path(".millwright")
    prometheus = PrometheusServer(relative / "prometheus")
    prometheus.state_dir.mkdir(parents=True)
    config = yaml.safe_load(prometheus.write_config().read_text())
    assert Path(config["global"]["query_log_file"]) == tmp_path / ".millwright" / "prometheus" / "queries.log"
    assert all(Path(arg.split("=", 1)[1]).is_absolute() for arg in prometheus.command()[1:3])
    assert DevServer(relative, 0, 0).db_file.is_absolute()
    assert LabCa(relative / "tls").ca_file.is_absolute()
    lab = runner.Lab(relative, runner.DEFAULT_FLEET, 0, 0, "q", 1.0)
    assert lab.state_dir == tmp_path / ".millwright"
