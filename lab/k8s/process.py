"""Run the emulator (or another lab server, e.g. the Prometheus stub) as a child process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from lab.loopback import free_port


class ChildProcess:
    """A ``python -m <module> --port P --ready-file F ...`` child that writes {"url", "pid"} to F when ready.

    ``with Sub(...) as child: child.url``. Subclasses set ``module`` and ``name`` and add their own arguments
    in ``extra_command``.
    """

    module = ""
    name = "child"
    # Given no port, the child binds one the system picks (`--port 0`) and says which in its ready file: a port picked
    # here and bound there could be taken meanwhile (a lab of 108 BMC ports binds many at once). False: the child
    # needs a port named to it, picked here (lab/sushy.py).
    binds_own_port = True

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        startup_timeout: float = 20.0,
        stop_timeout: float = 10.0,
        extra_args: list[str] | None = None,
        env: dict | None = None,
        cwd: str | None = None,
    ):
        self.host = host
        self.port = port
        self.startup_timeout = startup_timeout
        self.stop_timeout = stop_timeout
        self.extra_args = list(extra_args or [])
        self.env = env
        self.cwd = cwd
        self.proc: subprocess.Popen | None = None
        self.url: str = ""
        self.pid: int | None = None
        self._tmpdir: tempfile.TemporaryDirectory | None = None
        self._stderr_path: Path | None = None

    def extra_command(self) -> list[str]:
        return []

    def command(self, ready_file: str) -> list[str]:
        cmd = [
            sys.executable,
            "-m",
            self.module,
            "--host",
            self.host,
            "--port",
            str(self.port if self.port is not None else 0 if self.binds_own_port else free_port(self.host)),
            "--ready-file",
            ready_file,
        ]
        return cmd + self.extra_command() + self.extra_args

    def _stderr_tail(self, n: int = 4000) -> str:
        try:
            return self._stderr_path.read_text()[-n:] if self._stderr_path else ""
        except OSError:
            return ""

    def start(self):
        if self.proc is not None:
            return self
        self._tmpdir = tempfile.TemporaryDirectory(prefix=f"{self.name}-")
        ready = os.path.join(self._tmpdir.name, "ready.json")
        self._stderr_path = Path(self._tmpdir.name) / "stderr.log"
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        if self.env:
            env.update(self.env)
        with open(self._stderr_path, "wb") as err:
            self.proc = subprocess.Popen(
                self.command(ready),
                stdout=subprocess.DEVNULL,
                stderr=err,
                env=env,
                cwd=self.cwd,
                start_new_session=True,
            )
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                rc = self.proc.returncode
                tail = self._stderr_tail()
                self.proc = None
                raise RuntimeError(f"{self.module} exited with code {rc} before becoming ready:\n{tail}")
            if os.path.exists(ready):
                try:
                    with open(ready) as f:
                        data = json.load(f)
                    self.url, self.pid = data["url"], data["pid"]
                    return self
                except (OSError, ValueError, KeyError):
                    pass
            time.sleep(0.05)
        tail = self._stderr_tail()
        self.stop()
        raise TimeoutError(f"{self.module} not ready after {self.startup_timeout}s:\n{tail}")

    def stop(self) -> int | None:
        proc, self.proc = self.proc, None
        rc = None
        if proc is not None:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    rc = proc.wait(self.stop_timeout)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    rc = proc.wait(5)
            else:
                rc = proc.returncode
        if self._tmpdir is not None:
            self._tmpdir.cleanup()
            self._tmpdir = None
        return rc

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class EmulatorProcess(ChildProcess):
    """``with EmulatorProcess() as emu: emu.url`` — spawns ``python -m lab.k8s`` and waits until it is ready."""

    module = "lab.k8s"
    name = "lab-k8s"

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        seeds: list[str] | None = None,
        state_file: str | None = None,
        pod_start_seconds: float | None = None,
        grace_scale: float | None = None,
        startup_timeout: float = 20.0,
        stop_timeout: float = 10.0,
        extra_args: list[str] | None = None,
        env: dict | None = None,
        cwd: str | None = None,
    ):
        super().__init__(
            host=host,
            port=port,
            startup_timeout=startup_timeout,
            stop_timeout=stop_timeout,
            extra_args=extra_args,
            env=env,
            cwd=cwd,
        )
        self.seeds = list(seeds or [])
        self.state_file = state_file
        self.pod_start_seconds = pod_start_seconds
        self.grace_scale = grace_scale

    def extra_command(self) -> list[str]:
        cmd: list[str] = []
        for s in self.seeds:
            cmd += ["--seed", str(s)]
        if self.state_file:
            cmd += ["--state-file", str(self.state_file)]
        if self.pod_start_seconds is not None:
            cmd += ["--pod-start-seconds", str(self.pod_start_seconds)]
        if self.grace_scale is not None:
            cmd += ["--grace-scale", str(self.grace_scale)]
        return cmd
