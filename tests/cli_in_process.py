"""`millwright` run in the test process (`starter.cli.run`): the same parsing, client calls and printing as the
installed command, without a Python start-up per command (over a second each on CI's two cores). What the command
sees is what the subprocess of tests/starter/test_cli.py sees: its own stdin, stdout and stderr, and an environment without
TEMPORAL_* and MILLWRIGHT_* settings, with no Temporal profile and no running lab to find."""

from __future__ import annotations

import asyncio
import io
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from tests.worker_process import REPO

ENVIRONMENT = {
    "TEMPORAL_CONFIG_FILE": str(REPO / "no-such-temporal.toml"),
    "MILLWRIGHT_STATE_DIR": str(REPO / ".no-lab"),
    "COLUMNS": "200",
}


def command_environment(environ: dict[str, str]) -> dict[str, str]:
    """The environment a command runs with: this one less its Temporal and Millwright settings, plus ENVIRONMENT."""
    return {**{k: v for k, v in environ.items() if not k.startswith(("TEMPORAL_", "MILLWRIGHT_"))}, **ENVIRONMENT}


class _PerThread(io.TextIOBase):
    """sys.stdin, sys.stdout or sys.stderr while commands run: each command's thread has its own buffer, every other
    thread (the test's, an in-process worker's) the stream that was there before. Commands may run side by side
    (a `watch` in the background)."""

    encoding = "utf-8"
    errors = "strict"

    def __init__(self, before) -> None:
        self.before = before
        self.buffers: dict[int, io.StringIO] = {}

    def _stream(self):
        return self.buffers.get(threading.get_ident(), self.before)

    def write(self, s: str) -> int:
        return self._stream().write(s)

    def read(self, size: int | None = -1) -> str:
        return self._stream().read(size)

    def readline(self, size: int | None = -1) -> str:  # type: ignore[override]
        return self._stream().readline(size)

    def flush(self) -> None:
        self._stream().flush()

    def isatty(self) -> bool:
        return False  # a pipe, as for the subprocess

    def readable(self) -> bool:
        return True

    def writable(self) -> bool:
        return True


_lock = threading.Lock()
_running: dict[str, _PerThread] = {}  # the streams installed while any command runs
_saved: dict[str, str | None] = {}


@contextmanager
def _installed(stdin: str) -> Iterator[tuple[io.StringIO, io.StringIO]]:
    """The calling thread's buffers; the first command in installs the streams and the environment, the last out
    puts back what was there (the environment is the same for every command)."""
    with _lock:
        if not _running:
            for name in ("stdin", "stdout", "stderr"):
                _running[name] = _PerThread(getattr(sys, name))
                setattr(sys, name, _running[name])
            wanted = command_environment(dict(os.environ))
            _saved.update({k: os.environ.get(k) for k in {*os.environ, *wanted} if os.environ.get(k) != wanted.get(k)})
            for key in _saved:
                if key in wanted:
                    os.environ[key] = wanted[key]
                else:
                    del os.environ[key]
        me = threading.get_ident()
        out, err = io.StringIO(), io.StringIO()
        _running["stdin"].buffers[me] = io.StringIO(stdin)
        _running["stdout"].buffers[me], _running["stderr"].buffers[me] = out, err
    try:
        yield out, err
    finally:
        with _lock:
            for stream in _running.values():
                del stream.buffers[me]
            if not any(stream.buffers for stream in _running.values()):
                for name, stream in _running.items():
                    setattr(sys, name, stream.before)
                _running.clear()
                for key, value in _saved.items():
                    if value is None:
                        os.environ.pop(key, None)
                    else:
                        os.environ[key] = value
                _saved.clear()


def _run(args: tuple[str, ...], stdin: str) -> subprocess.CompletedProcess:
    from starter.cli import run

    with _installed(stdin) as (out, err):
        code = run(list(args))
    return subprocess.CompletedProcess(["millwright", *args], code, out.getvalue(), err.getvalue())


async def cli(*args: str, stdin: str | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    """``millwright ARGS`` in a thread of this process (its commands run their own event loop); the exit code,
    stdout and stderr as a subprocess's. TimeoutError after ``timeout`` seconds."""
    return await asyncio.wait_for(asyncio.to_thread(_run, args, stdin or ""), timeout)
