"""Least-privilege evidence for tests/deploy/test_least_privilege.py.

Every Kubernetes emulator a test session starts — tests/conftest.py's `k8s_emulator`, tier fixtures,
`EmulatorProcess`es in test modules, the lab runner's — inherits LAB_K8S_EVIDENCE_DIR (the directory
tests/conftest.py makes) and keeps the kinds of request it served there (lab/k8s/evidence.py; resets do not
clear them). test_least_privilege.py is moved after every other
test and reads them. Evidence is *complete* only if every test file was collected, nothing was
deselected and no earlier test failed; otherwise the check says it is partial and only proves
that what was observed is granted.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from lab.k8s.evidence import EVIDENCE_DIR_ENV

TESTS = Path(__file__).resolve().parents[1]
LAST_MODULE = "test_least_privilege.py"


@dataclass
class Evidence:
    directory: str
    files: set[str] = field(default_factory=set)  # test files collected (rootdir-relative)
    deselected: int = 0
    failed: list[str] = field(default_factory=list)
    summary: list[str] = field(default_factory=list)  # lines for the terminal summary

    def partial_reasons(self, rootdir: Path) -> list[str]:
        every = {str(p.relative_to(rootdir)) for pattern in ("test_*.py", "*_test.py") for p in TESTS.rglob(pattern)}
        reasons = []
        missing = sorted(every - self.files)
        if missing:
            shown = ", ".join(missing[:6]) + (f" and {len(missing) - 6} more" if len(missing) > 6 else "")
            reasons.append(f"{len(missing)} test files not collected ({shown})")
        if self.deselected:
            reasons.append(f"{self.deselected} tests deselected")
        if self.failed:
            reasons.append(f"{len(self.failed)} earlier tests failed ({', '.join(self.failed[:3])})")
        return reasons


EVIDENCE = pytest.StashKey[Evidence]()
_config: pytest.Config | None = None  # the hooks below without a config argument need it


def evidence(config: pytest.Config) -> Evidence:
    return config.stash[EVIDENCE]


# trylast: after tests/conftest.py's, which pluggy would otherwise call after this later conftest's
@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    global _config
    _config = config
    # tests/conftest.py made it (and removes it): the one directory of the run, every process and emulator's
    config.stash[EVIDENCE] = Evidence(os.environ[EVIDENCE_DIR_ENV])


def pytest_collectreport(report: pytest.CollectReport) -> None:
    path = report.nodeid.split("::", 1)[0]
    if path.endswith(".py") and "::" not in report.nodeid:
        _current().files.add(path)


def pytest_deselected(items: list[pytest.Item]) -> None:
    _current().deselected += len(items)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The least-privilege checks run after everything else."""
    ev = evidence(config)
    ev.files |= {str(i.path.relative_to(config.rootpath)) for i in items if i.path.is_relative_to(config.rootpath)}
    last = [i for i in items if i.path.name == LAST_MODULE]
    if last:
        items[:] = [i for i in items if i.path.name != LAST_MODULE] + last


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.failed and LAST_MODULE not in report.nodeid:
        _current().failed.append(report.nodeid)


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    ev = config.stash.get(EVIDENCE, None)
    if ev is not None and ev.summary:
        terminalreporter.section("least privilege (tests/deploy/test_least_privilege.py)")
        for line in ev.summary:
            terminalreporter.write_line(line)


def _current() -> Evidence:
    assert _config is not None
    return evidence(_config)


# Under pytest-xdist (./dev test) each process runs its own emulators into the one directory (the workers inherit
# LAB_K8S_EVIDENCE_DIR from the controller's pytest_configure), and the process that runs the least-privilege
# module waits for every other one to finish: this module comes last in the collection, so once it is handed out the
# others are told to stop after the tests they hold (xdist's load scheduling), and say so with their failures.
WORKER = os.environ.get("PYTEST_XDIST_WORKER")
OTHERS_TIMEOUT = 1200.0  # the longest a test file of this suite takes, with room


def _finished_file(directory: str, worker: str) -> Path:
    return Path(directory) / f"finished-{worker}.json"


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    ev = session.config.stash.get(EVIDENCE, None)
    if WORKER and ev is not None:  # after its fixtures' teardown: its emulators have written their evidence
        _finished_file(ev.directory, WORKER).write_text(json.dumps({"failed": ev.failed}))


def _wait_for_other_processes(ev: Evidence) -> None:
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    others = [f"gw{i}" for i in range(count) if f"gw{i}" != WORKER]
    deadline = time.monotonic() + OTHERS_TIMEOUT
    while (waiting := [w for w in others if not _finished_file(ev.directory, w).exists()]) and (
        time.monotonic() < deadline
    ):
        time.sleep(1)
    for worker in others:
        if worker in waiting:
            ev.failed.append(f"{worker} (its tests did not finish in {OTHERS_TIMEOUT:.0f}s)")
        else:
            ev.failed += json.loads(_finished_file(ev.directory, worker).read_text())["failed"]


@pytest.fixture(scope="session")
def k8s_evidence(pytestconfig: pytest.Config) -> Evidence:
    """This session's evidence: the directory every emulator writes to, and why it may be partial."""
    ev = evidence(pytestconfig)
    if WORKER:
        _wait_for_other_processes(ev)
    return ev
