"""The installed version, for `--version` on every entry point (millwright, millwright-worker)."""

from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as installed


def version() -> str:
    try:
        return installed("millwright")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown (not installed)"
