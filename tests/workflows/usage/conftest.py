"""The usage family's fixtures."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def s3(tmp_path_factory):
    """A moto S3 server with authentication on, its bucket `usage-reports` and one user's key."""
    from lab.s3 import S3Server, S3Unavailable, check_available
    from tests.tiers import require

    require(check_available, S3Unavailable, "S3")
    server = S3Server(tmp_path_factory.mktemp("s3")).start()
    yield server
    server.stop()


def pytest_collection_modifyitems(config, items):
    """On a machine without moto's venv, the first test using `s3` builds it (pip, about two minutes)."""
    from lab.s3 import venv_ready

    if not venv_ready():
        for item in items:
            if "s3" in getattr(item, "fixturenames", ()):
                item.add_marker(pytest.mark.timeout(900))
