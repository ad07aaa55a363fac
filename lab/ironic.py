"""A real OpenStack Ironic on 127.0.0.1 for the tests and the lab: standalone, fake hardware, SQLite.

Ironic runs from its own virtual environment, separate from Millwright's (it pins its own
oslo/SQLAlchemy stack). `IronicLab.start()`:

1. finds a Python >= 3.11 (``MILLWRIGHT_IRONIC_PYTHON``, then this interpreter, then pyenv,
   then ``python3.1x`` on PATH); none raises `IronicUnavailable` whose message is one line;
2. makes (once, under a lock) a venv with ``ironic==39.0.0`` in
   ``${MILLWRIGHT_CACHE_DIR:-~/.cache/millwright}/ironic-39.0.0/venv`` (pip from PyPI, ~30 s);
3. writes ``ironic.conf`` in a state dir (a fresh temp dir unless given): ``noauth``,
   ``rpc_transport = none``, the ``fake-hardware`` type with every ``fake`` interface, SQLite in
   the state dir, ``[fake]`` delays of a second at most;
4. runs ``ironic-dbsync create_schema``, then the all-in-one ``ironic`` (API + conductor in one
   process tree) on 127.0.0.1:<free port>, and waits until ``GET /v1/drivers`` lists
   ``fake-hardware`` (the conductor is up, so nodes can be enrolled);
5. `stop()` sends SIGTERM to the process group (the master stops its forked worker), then
   SIGKILL to whatever is left after a timeout.

Fake-hardware clean steps (manual cleaning, ``{"interface": ..., "step": ...}``): ``bios``:
``factory_reset``, ``cache_bios_settings``, ``apply_configuration`` (args ``settings``);
``vendor``: ``log_passthrough`` (sleeps ``vendor_delay``). IPA's ``deploy.burnin_*`` steps are
not offered: cleaning with them fails with "node does not support this clean step".

Nothing listens beyond 127.0.0.1. ``python -m lab.ironic`` runs one by hand.
"""

from __future__ import annotations

import atexit
import contextlib
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
from dataclasses import dataclass, field
from pathlib import Path

from lab.loopback import LOOPBACK, free_port
from lab.venvs import cache_dir, cached_venv, python_ok, run, serve_until_signal
from lab.venvs import venv_ready as _venv_ready

IRONIC_VERSION = "39.0.0"
IRONIC_REQUIREMENT = f"ironic=={IRONIC_VERSION}"
MIN_PYTHON = (3, 11)  # ironic 39.0.0: Requires-Python >= 3.11
API_VERSION_HEADER = "X-OpenStack-Ironic-API-Version"

# Every interface the fake-hardware type can use, fake first (the node's default).
_INTERFACES = {
    "bios": "fake,no-bios",
    "boot": "fake",
    "console": "fake,no-console",
    "deploy": "fake",
    "firmware": "fake,no-firmware",
    "inspect": "fake,no-inspect",
    "management": "fake",
    "power": "fake",
    "raid": "fake,no-raid",
    "rescue": "fake,no-rescue",
    "vendor": "fake,no-vendor",
    "network": "noop",
    "storage": "noop",
}


class IronicUnavailable(Exception):
    """A piece Ironic needs is missing here; the message is one line saying which and why."""


class IronicError(Exception):
    """Ironic was expected to start but did not; the message names the log to read."""


def say(msg: str) -> None:
    print(f"ironic: {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- finding the pieces


def find_python() -> str:
    """A Python >= 3.11 with venv and sqlite3: MILLWRIGHT_IRONIC_PYTHON, this one, pyenv, then PATH."""
    candidates: list[str] = []
    if os.environ.get("MILLWRIGHT_IRONIC_PYTHON"):
        candidates.append(os.environ["MILLWRIGHT_IRONIC_PYTHON"])
    # The interpreter behind this one (a venv's python makes venvs from its base as well).
    candidates.append(getattr(sys, "_base_executable", "") or sys.executable)
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    pyenv = sorted(
        root.glob("versions/3.*/bin/python3"), key=lambda p: _version_key(p.parent.parent.name), reverse=True
    )
    candidates += [str(p) for p in pyenv]
    candidates += [found for v in ("3.13", "3.12", "3.11") if (found := shutil.which(f"python{v}"))]
    for candidate in candidates:
        if candidate and Path(candidate).is_file() and python_ok(candidate, MIN_PYTHON, ("venv", "sqlite3")):
            return candidate
    raise IronicUnavailable(
        "Ironic tier skipped: no Python >= 3.11 with venv and sqlite3 found (ironic 39.0.0 needs it; looked at "
        "MILLWRIGHT_IRONIC_PYTHON, this interpreter, pyenv and python3.1x on PATH)"
    )


def _version_key(name: str) -> tuple[int, ...]:
    parts = []
    for piece in name.split("."):
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def check_available() -> None:
    """Raise IronicUnavailable (one line) when a piece is missing; starts nothing, downloads nothing."""
    find_python()


def cache_root() -> Path:
    return cache_dir(f"ironic-{IRONIC_VERSION}")


def venv_ready() -> bool:
    """Whether the cached venv is already built (then starting takes seconds, not a pip install)."""
    return _venv_ready(cache_root() / "venv", IRONIC_REQUIREMENT, "ironic")


def ensure_venv(python: str, timeout: float = 900) -> Path:
    """The cached Ironic venv, created once (pip from PyPI, ~30 s); returns its directory."""
    return cached_venv(cache_root() / "venv", IRONIC_REQUIREMENT, python, binary="ironic", label="Ironic",
                       about="about 30 s", say=say, timeout=timeout, error=IronicError)  # fmt: skip


def _run(argv: list[str], doing: str, *, timeout: float, env: dict[str, str] | None = None) -> str:
    return run(argv, doing, timeout=timeout, env=env, error=IronicError)


# ---------------------------------------------------------------- the lab instance


@dataclass
class IronicLab:
    """A standalone Ironic (API + conductor, SQLite, fake hardware) on loopback, a child of this process.

    ``state_dir`` holds ironic.conf, the SQLite database and ironic.log; without one a temp dir
    is used and removed at `stop()`. ``url`` is Ironic's root (the API is under ``/v1``).
    ``power_delay``/``vendor_delay``/``bios_delay`` are the fake interfaces' delays, whole seconds.
    """

    state_dir: Path | None = None
    port: int = 0
    power_delay: int = 0
    vendor_delay: int = 1
    bios_delay: int = 0
    timeout: float = 900.0
    url: str = ""
    max_api_version: str = ""
    timings: dict[str, float] = field(default_factory=dict)
    _proc: subprocess.Popen | None = None
    _tmp: Path | None = None

    @property
    def root(self) -> Path:
        if self.state_dir is None:
            if self._tmp is None:
                self._tmp = Path(tempfile.mkdtemp(prefix="millwright-ironic-"))
            return self._tmp
        return self.state_dir.resolve()

    @property
    def log(self) -> Path:
        return self.root / "ironic.log"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    def alive(self) -> bool:
        """Whether any process of Ironic's process group (the master or a forked worker) is still running."""
        if self._proc is None:
            return False
        try:
            os.killpg(self._proc.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    # ------------------------------------------------------------ start

    def start(self) -> IronicLab:
        started = time.monotonic()
        python = find_python()
        self.root.mkdir(parents=True, exist_ok=True)
        atexit.register(self.stop)
        try:
            t = time.monotonic()
            venv = ensure_venv(python, timeout=self.timeout)
            self.timings["venv"] = time.monotonic() - t
            port = self.port or free_port()
            conf = self._write_conf(port)
            env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "OS_"))}
            env["PYTHONUNBUFFERED"] = "1"

            t = time.monotonic()
            db = self.root / "ironic.sqlite"
            db.unlink(missing_ok=True)  # always a fresh database
            _run([str(venv / "bin" / "ironic-dbsync"), "--config-file", str(conf), "create_schema"],
                 "ironic-dbsync create_schema", timeout=300, env=env)  # fmt: skip
            self.timings["schema"] = time.monotonic() - t

            t = time.monotonic()
            self.url = f"http://{LOOPBACK}:{port}"
            with open(self.log, "ab") as log:
                self._proc = subprocess.Popen(
                    [str(venv / "bin" / "ironic"), "--config-file", str(conf)],
                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=str(self.root),
                    start_new_session=True,  # its own process group: stop() reaches the forked worker too
                )  # fmt: skip
            self._wait_ready()
            self.timings["serve"] = time.monotonic() - t
        except BaseException:
            self.stop()
            raise
        self.timings["total"] = time.monotonic() - started
        say(
            f"Ironic {IRONIC_VERSION} (API up to {self.max_api_version}) ready at {self.url} in "
            f"{self.timings['total']:.1f}s ({', '.join(f'{k} {v:.1f}s' for k, v in self.timings.items() if k != 'total')})"
        )
        return self

    def _write_conf(self, port: int) -> Path:
        interfaces = "\n".join(f"enabled_{name}_interfaces = {value}" for name, value in _INTERFACES.items())
        text = f"""# Written by Millwright's lab (lab/ironic.py); rewritten at every start.
[DEFAULT]
auth_strategy = noauth
rpc_transport = none
host = millwright-lab
enabled_hardware_types = fake-hardware
{interfaces}
use_stderr = true
debug = false

[api]
host_ip = {LOOPBACK}
port = {port}

[database]
connection = sqlite:///{self.root / "ironic.sqlite"}

[dhcp]
dhcp_provider = none

[fake]
power_delay = {self.power_delay}
vendor_delay = {self.vendor_delay}
bios_delay = {self.bios_delay}
boot_delay = 0
deploy_delay = 0
management_delay = 0
raid_delay = 0
inspect_delay = 0
"""
        path = self.root / "ironic.conf"
        path.write_text(text)
        return path

    def _wait_ready(self, timeout: float = 120) -> None:
        """Until the API answers and lists fake-hardware (a conductor registered it)."""
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            if self._proc is not None and self._proc.poll() is not None:
                raise IronicError(f"ironic exited with code {self._proc.returncode}; see {self.log}:\n{self._tail()}")
            try:
                root = _get_json(self.url + "/")
                self.max_api_version = str((root.get("default_version") or {}).get("version") or "")
                drivers = _get_json(self.url + "/v1/drivers", {API_VERSION_HEADER: "latest"})
                if any(d.get("name") == "fake-hardware" and d.get("hosts") for d in drivers.get("drivers") or []):
                    return
                last = "fake-hardware not registered yet"
            except urllib.error.HTTPError as err:
                last = f"HTTP {err.code}"
            except (OSError, ValueError) as err:
                last = type(err).__name__
            time.sleep(0.2)
        raise IronicError(f"Ironic did not answer /v1 in {timeout:.0f}s ({last}); see {self.log}:\n{self._tail()}")

    def _tail(self, n: int = 15) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").strip().splitlines()[-n:])
        except OSError:
            return ""

    # ------------------------------------------------------------ stop

    def stop(self, timeout: float = 20) -> None:
        """SIGTERM to Ironic's process group (master and worker stop gracefully), SIGKILL after `timeout`."""
        proc = self._proc
        if proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout
            while self.alive() and time.monotonic() < deadline:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(0.1)  # reaps the master once it exits
            if self.alive():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(5)
            self._proc = None
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None
        with contextlib.suppress(Exception):
            atexit.unregister(self.stop)

    def __enter__(self) -> IronicLab:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _get_json(url: str, headers: dict[str, str] | None = None) -> dict:
    request = urllib.request.Request(url, headers={"Accept": "application/json", **(headers or {})})
    with urllib.request.urlopen(request, timeout=5) as resp:
        return json.loads(resp.read())


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m lab.ironic", description="Run a standalone Ironic (fake hardware) on 127.0.0.1 until Ctrl-C."
    )
    parser.add_argument("--state-dir", type=Path, default=None, help="Where ironic.conf, the database and the log "
                        "go (default: a temp dir, removed at exit)")  # fmt: skip
    parser.add_argument("--port", type=int, default=0, help="API port (0 = any free port)")
    parser.add_argument("--vendor-delay", type=int, default=1, help="Seconds the fake vendor step sleeps")
    parser.add_argument("--check", action="store_true", help="Only say whether Ironic can run here.")
    parser.add_argument("--build", action="store_true", help="Only build the cached venv, then exit.")
    args = parser.parse_args(argv)
    try:
        if args.check:
            check_available()
            print(f"Ironic can run here (venv {'built' if venv_ready() else 'not built yet'}: {cache_root() / 'venv'})")
            return 0
        if args.build:
            print(ensure_venv(find_python()))
            return 0
        lab = IronicLab(args.state_dir, port=args.port, vendor_delay=args.vendor_delay)
        lab.start()
    except IronicUnavailable as err:
        print(err, file=sys.stderr)
        return 1
    except IronicError as err:
        print(f"ironic: error: {err}", file=sys.stderr)
        return 1
    print(f"Ironic:  {lab.url}  (MILLWRIGHT_IRONIC_URL={lab.url}; no auth)", flush=True)
    print(f"log:     {lab.log}", flush=True)
    print("stop:    Ctrl-C", flush=True)

    def exited() -> str | None:
        proc = lab._proc
        return f"ironic: exited with code {proc.returncode}" if proc is not None and proc.poll() is not None else None

    serve_until_signal(exited, lab.stop)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
