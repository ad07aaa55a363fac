"""Third-party services the lab runs from their own cached virtual environments (NetBox, Ironic).

Each gets ``${MILLWRIGHT_CACHE_DIR:-~/.cache/millwright}/<name>-<version>/venv``, built once with pip
from PyPI under a file lock (two test sessions never build the same one at once) and marked complete
with the requirement it was built for, so a changed pin rebuilds it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

MARKER = ".millwright-complete"


def cache_dir(name: str) -> Path:
    base = os.environ.get("MILLWRIGHT_CACHE_DIR") or str(Path.home() / ".cache" / "millwright")
    return Path(base).expanduser() / name


@contextlib.contextmanager
def file_lock(path: Path):
    """Exclusive lock across processes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def run(
    argv: list[str],
    doing: str,
    *,
    timeout: float,
    error: type[Exception] = RuntimeError,
    env: dict[str, str] | None = None,
    **kw,
) -> str:
    """Run a command to completion; its stdout, or `error` with the last lines of its output."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env, **kw)
    except subprocess.TimeoutExpired as err:
        raise error(f"{doing}: timed out after {timeout:.0f}s") from err
    if done.returncode != 0:
        tail = "\n".join((done.stderr or done.stdout or "").strip().splitlines()[-15:])
        raise error(f"{doing} failed (exit {done.returncode}):\n{tail}")
    return done.stdout


def python_ok(path: str, minimum: tuple[int, int], modules: tuple[str, ...] = ("venv",)) -> bool:
    """Whether `path` is a Python >= `minimum` that can import `modules`."""
    imports = ", ".join(("sys", *modules))
    try:
        out = subprocess.run(
            [path, "-c", f"import {imports}; print(sys.version_info >= {tuple(minimum)!r})"],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return False
    return out.returncode == 0 and out.stdout.strip() == "True"


def venv_ready(venv: Path, requirement: str, binary: str) -> bool:
    marker = venv / MARKER
    return marker.is_file() and marker.read_text().strip() == requirement and (venv / "bin" / binary).is_file()


def cached_venv(
    venv: Path,
    requirement: str,
    python: str,
    *,
    binary: str,
    label: str,
    about: str,
    say: Callable[[str], None],
    timeout: float,
    error: type[Exception],
) -> Path:
    """The venv with `requirement` installed, built once (pip from PyPI); returns its directory."""
    with file_lock(venv.parent / ".venv.lock"):
        if venv_ready(venv, requirement, binary):
            return venv
        shutil.rmtree(venv, ignore_errors=True)
        say(f"creating the {label} venv in {venv} ({requirement}; {about}, once)")
        started = time.monotonic()
        run([python, "-m", "venv", str(venv)], f"creating the {label} venv", timeout=300, error=error)
        run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check", requirement],
            f"pip install {requirement}", timeout=timeout, error=error)  # fmt: skip
        (venv / MARKER).write_text(requirement + "\n")
        say(f"{label} venv ready in {time.monotonic() - started:.0f}s")
        return venv


def serve_until_signal(exited: Callable[[], str | None], stop: Callable[[], None]) -> None:
    """Block until SIGINT/SIGTERM, or until `exited()` says (in one line) that a child has exited; then `stop()`."""
    import signal
    import sys

    stopping = False

    def on_signal(signum, frame):
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        while not stopping:
            gone = exited()
            if gone:
                print(f"{gone}; stopping", file=sys.stderr)
                stopping = True
            time.sleep(0.5)
    finally:
        stop()
