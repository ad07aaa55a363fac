"""The README's quick start, as a new user runs it: its run command exactly as README.md writes it (read from the
README, not copied here), in a fresh copy of the checkout with nothing ignored (no .venv, no .millwright: the
default, relative state dir), until the printed UI answers and `millwright lab status` shows every service up; then
one example from the README's table as written, then Ctrl-C, and no process of the copy may be left.

Every other lab test passes an absolute `--state-dir`, which hid a Prometheus config that only worked with one
(issue: `./dev up` failed on every fresh machine). NetBox is part of the lab, so this runs with the NetBox tier
(its cached venv and database: tests/conftest.py orders it last, beside the cache's warm-up) and is left out where
NetBox cannot run, a failure in CI (tests/tiers.py).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import uuid
from pathlib import Path

import httpx
import pytest

from lab.netbox import NetBoxUnavailable, check_available
from tests.test_lab_runner import REPO, BackgroundProcess, cli_env, wait_until
from tests.tiers import require

pytestmark = [pytest.mark.needs_netbox, pytest.mark.timeout(1500)]

README = REPO / "README.md"
SET_UP_TIMEOUT = 600  # a fresh venv (pip) before the lab starts
SERVICES_TIMEOUT = 600  # NetBox restoring its cached database (minutes of migrating where the warm-up has not run)
EXAMPLE = "NodeMaintenance"
MARKER = "MILLWRIGHT_QUICK_START_RUN"  # set for the run only: every process it starts inherits it


def readme_quick_start() -> list[str]:
    """The commands of the README's quick start (its first code block), comments dropped."""
    section = README.read_text().split("## Quick start", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block, "README.md's quick start has no ```bash block"
    return [line.split("#", 1)[0].strip() for line in block.group(1).splitlines() if line.split("#", 1)[0].strip()]


def readme_lab_command(workflow: str) -> str:
    """The 'In the lab' command of the README table's row for `workflow`."""
    for line in README.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 3 and cells[0] == f"`{workflow}`":
            found = re.search(r"`([^`]+)`", cells[2])
            assert found, f"README's row for {workflow} has no command: {line}"
            return found.group(1)
    raise AssertionError(f"README.md's workflow table has no row for {workflow}")


def fresh_copy(into: Path) -> Path:
    """The checkout as a fresh clone of it has it: tracked and not-ignored files only."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            check=True, capture_output=True).stdout.decode().split("\0")  # fmt: skip
    for name in filter(None, listed):
        source = REPO / name
        if source.is_file() or source.is_symlink():  # a tracked file deleted in the working tree is left out
            (into / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, into / name, follow_symlinks=False)
    return into


def processes_of(root: Path, marker: str) -> dict[int, str]:
    """Live processes that belong to the copy: started with `marker` in their environment, or running from it."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            environ = (entry / "environ").read_bytes()
            cwd = os.readlink(entry / "cwd")
        except OSError:
            continue  # gone meanwhile, or not ours to read
        if marker.encode() in environ or str(root) in cmdline or cwd.startswith(str(root)):
            found[int(entry.name)] = cmdline[:200]
    return found


def run_in_terminal(command: str, cwd: Path, env: dict[str, str]) -> BackgroundProcess:
    """A command run as from a terminal: in its own process group, which Ctrl-C (`ctrl_c`) reaches whole."""
    return BackgroundProcess(["bash", "-c", command], cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                             start_new_session=True)  # fmt: skip


def ctrl_c(terminal: BackgroundProcess) -> None:
    os.killpg(terminal.proc.pid, signal.SIGINT)


def every_service_up(status: str) -> bool:
    states = re.findall(r"^  (\w+)\s+(ready|starting|waiting|failed|left out|unavailable|GONE)\b", status, re.M)
    return bool(states) and all(state == "ready" for _, state in states)


def test_readme_quick_start_runs_the_whole_lab_from_a_fresh_clone(tmp_path):
    require(check_available, NetBoxUnavailable, "NetBox")
    commands = readme_quick_start()
    assert len(commands) == 2, f"the quick start is two commands (run the lab, run the tests): {commands}"
    run_lab, example = commands[0], readme_lab_command(EXAMPLE)
    clone = fresh_copy(tmp_path / "millwright")
    marker = uuid.uuid4().hex
    env = {**cli_env(), MARKER: marker}
    env.pop("VIRTUAL_ENV", None)
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if not p.startswith(str(REPO)))

    lab = run_in_terminal(run_lab, clone, env)
    left: dict[int, str] = {}
    try:
        assert wait_until(lambda: "Temporal UI:" in lab.output or lab.proc.poll() is not None, SET_UP_TIMEOUT), (
            f"`{run_lab}` printed no UI address in {SET_UP_TIMEOUT}s:\n{lab.output}"
        )
        ui = re.search(r"Temporal UI:\s+(\S+)", lab.output)
        assert ui and lab.proc.poll() is None, f"`{run_lab}` exited with {lab.proc.returncode}:\n{lab.output}"
        assert httpx.get(ui.group(1), timeout=10, trust_env=False).status_code == 200

        millwright = str(clone / ".venv" / "bin" / "millwright")
        status = ""

        def services_up() -> bool:
            nonlocal status
            done = subprocess.run([millwright, "lab", "status"], cwd=clone, env=env, capture_output=True, text=True)
            status = done.stdout + done.stderr
            return done.returncode == 0 and every_service_up(done.stdout)

        assert wait_until(services_up, SERVICES_TIMEOUT), f"not every service up:\n{status}\n{lab.output}"

        # as the README says: the CLI from the venv, activated
        venv_env = {**env, "VIRTUAL_ENV": str(clone / ".venv"),
                    "PATH": f"{clone / '.venv' / 'bin'}{os.pathsep}{env['PATH']}"}  # fmt: skip
        ran = subprocess.run(["bash", "-c", example], cwd=clone, env=venv_env, capture_output=True, text=True,
                             timeout=600)  # fmt: skip
        assert ran.returncode == 0, f"`{example}` exited with {ran.returncode}:\n{ran.stdout}\n{ran.stderr}"
        assert '"outcome": "completed"' in ran.stdout, ran.stdout
    finally:
        if lab.proc.poll() is None:
            ctrl_c(lab)
        try:
            code: int | None = lab.wait(90)
        except subprocess.TimeoutExpired:
            os.killpg(lab.proc.pid, signal.SIGKILL)
            code = None
        if not wait_until(lambda: not processes_of(clone, marker), 30):
            left = processes_of(clone, marker)
            for pid in left:  # so that a failure here leaves nothing behind either
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
    assert code in (0, 130), f"`{run_lab}` after Ctrl-C exited with {code}:\n{lab.output}"
    assert "lab: stopped" in lab.output
    assert not left, f"processes of the clone left after Ctrl-C: {left}"
