"""The worker image ships no lab/: what deploy/Dockerfile's builder stage copies is built as its `pip install .`
builds it, and those packages run with no lab to import."""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "deploy" / "Dockerfile"
# The image's packages: the worker's and the CLI's (the search-attribute Job runs the `temporal` CLI it carries).
SHIPPED = {"workflows", "activities", "worker", "starter"}


def builder_copies(dockerfile: str) -> list[str]:
    """The repository paths the builder stage (up to the second FROM) copies into its build directory."""
    builder = dockerfile.split("\nFROM ", 2)[1]
    sources: list[str] = []
    for line in builder.splitlines():
        if line.startswith("COPY ") and "--from=" not in line:
            sources += line.split()[1:-1]
    return sources


@pytest.fixture(scope="module")
def image_packages(tmp_path_factory) -> Path:
    """What the image's `pip install .` puts in site-packages, built by setuptools from what the Dockerfile copies
    and nothing else (build_py: the packages and package data a wheel holds; offline, with the venv's setuptools)."""
    root = tmp_path_factory.mktemp("image")
    src, built = root / "src", root / "site-packages"
    src.mkdir()
    for path in builder_copies(DOCKERFILE.read_text()):
        if (REPO / path).is_dir():
            shutil.copytree(REPO / path, src / path, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(REPO / path, src / path)
    build = subprocess.run([sys.executable, "-c", "from setuptools import setup; setup()", "-q", "build_py",
                            "--build-lib", str(built)], cwd=src, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert build.returncode == 0, build.stderr
    return built


def test_the_builder_copies_no_lab():
    assert "lab" not in builder_copies(DOCKERFILE.read_text())


def test_the_image_holds_the_worker_and_no_lab(image_packages):
    assert {p.name for p in image_packages.iterdir()} == SHIPPED


def test_the_image_packages_run_without_the_lab(image_packages, tmp_path):
    """Every module imports, the worker and the CLI answer, and `millwright lab` says the lab is not there, in a
    Python that sees the image's packages and the installed dependencies but not this checkout (no site hooks, so
    not the editable install's finder either)."""
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{image_packages}:{sysconfig.get_paths()['purelib']}"}

    def python(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-S", *args], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=120)  # fmt: skip

    imports = python("-c", IMPORT_EVERY_MODULE, *sorted(SHIPPED))
    assert imports.returncode == 0, imports.stderr
    assert int(imports.stdout) > 100, imports.stdout  # it did walk the packages
    assert python("-m", "worker", "--help").returncode == 0
    assert python("-m", "starter", "--help").returncode == 0
    lab_up = python("-m", "starter", "lab", "up")
    assert lab_up.returncode == 2 and "no lab in this install" in lab_up.stderr, lab_up.stderr
    assert "seed" in python("-m", "starter", "lab", "--help").stdout  # the group is still there, and says so


IMPORT_EVERY_MODULE = """
import importlib, pkgutil, sys
from pathlib import Path
names = []
for package in sys.argv[1:]:
    root = importlib.import_module(package)
    modules = pkgutil.walk_packages(root.__path__, package + ".")
    names += [package] + [m.name for m in modules if not m.name.endswith(".__main__")]  # those run, below
for name in names:
    importlib.import_module(name)
from starter.cli.common import lab_runner, running_lab
assert lab_runner() is None and running_lab(Path("state")) is None
print(len(names))
"""
