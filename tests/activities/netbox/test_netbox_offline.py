"""NetBox activity plumbing that needs no NetBox: secret references, configuration, error mapping."""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.netbox.activities import NetBoxActivities
from activities.netbox.client import NetBoxConfig
from activities.netbox.models import DeviceLookup, SetStatusRequest
from activities.support.secrets import SecretError, SecretRef
from worker.config import ConfigError, WorkerSettings

TOKEN = "nbt_abcdefghijkl.0123456789012345678901234567890123456789"


def test_secret_ref_forms_and_errors(tmp_path, monkeypatch):
    monkeypatch.setenv("MW_TEST_TOKEN", TOKEN)
    assert SecretRef.parse("env:MW_TEST_TOKEN").resolve() == TOKEN
    f = tmp_path / "token"
    f.write_text(TOKEN + "\n")
    ref = SecretRef.parse(f"file:{f}")
    assert ref.resolve() == TOKEN and str(ref) == f"file:{f}"

    with pytest.raises(ValueError) as bad:
        SecretRef.parse(TOKEN)  # a pasted token is not a reference, and is not echoed
    assert TOKEN not in str(bad.value)
    with pytest.raises(SecretError, match="MW_NOT_SET"):
        SecretRef.parse("env:MW_NOT_SET").resolve()
    with pytest.raises(SecretError, match="cannot read"):
        SecretRef.parse(f"file:{tmp_path / 'missing'}").resolve()
    with pytest.raises(ValueError):
        SecretRef.parse("env:not a name")


def test_worker_settings_netbox(monkeypatch, tmp_path):
    for k in ("MILLWRIGHT_NETBOX_URL", "MILLWRIGHT_NETBOX_TOKEN"):
        monkeypatch.delenv(k, raising=False)
    assert WorkerSettings().netbox_config() is None
    monkeypatch.setenv("MILLWRIGHT_NETBOX_URL", "http://127.0.0.1:1/")
    with pytest.raises(ConfigError, match="MILLWRIGHT_NETBOX_TOKEN is not set"):
        WorkerSettings().netbox_config()
    monkeypatch.setenv("MILLWRIGHT_NETBOX_TOKEN", TOKEN)
    with pytest.raises(ConfigError) as bad:
        WorkerSettings().netbox_config()
    assert TOKEN not in str(bad.value)
    monkeypatch.setenv("MILLWRIGHT_NETBOX_TOKEN", "env:NETBOX_TOKEN")
    config = WorkerSettings().netbox_config()
    assert config.url == "http://127.0.0.1:1" and str(config.token) == "env:NETBOX_TOKEN"


async def run_activity(config, fn_name, arg):
    acts = NetBoxActivities(config)
    return await ActivityEnvironment().run(getattr(acts, fn_name), arg)


async def test_not_configured_is_non_retryable():
    with pytest.raises(ApplicationError) as err:
        await run_activity(None, "find_device", DeviceLookup(name="gpu-01"))
    assert err.value.type == "NetBoxNotConfigured" and err.value.non_retryable


async def test_missing_token_secret_is_non_retryable(monkeypatch):
    monkeypatch.delenv("MW_NO_TOKEN", raising=False)
    config = NetBoxConfig(url="http://127.0.0.1:1", token=SecretRef.parse("env:MW_NO_TOKEN"))
    with pytest.raises(ApplicationError) as err:
        await run_activity(config, "find_device", DeviceLookup(name="gpu-01"))
    assert err.value.type == "NetBoxNotConfigured" and "MW_NO_TOKEN" in str(err.value)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_connection_refused_is_retryable(monkeypatch):
    monkeypatch.setenv("MW_TOKEN", TOKEN)
    config = NetBoxConfig(url=f"http://127.0.0.1:{closed_port()}", token=SecretRef.parse("env:MW_TOKEN"))
    with pytest.raises(ApplicationError) as err:
        await run_activity(config, "find_device", DeviceLookup(name="gpu-01"))
    assert err.value.type == "NetBoxUnavailable" and not err.value.non_retryable
    assert TOKEN not in str(err.value)


class Stub(BaseHTTPRequestHandler):
    """Answers every request with the status and JSON body set on the server."""

    def _answer(self):
        self.server.seen.append(self.headers.get("Authorization"))
        body = json.dumps(self.server.body).encode()
        self.send_response(self.server.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_PATCH = do_POST = _answer

    def log_message(self, *args):
        pass


@pytest.fixture
def stub():
    server = HTTPServer(("127.0.0.1", 0), Stub)
    server.status, server.body, server.seen = 503, {"detail": "maintenance"}, []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


async def test_5xx_is_retryable_and_400_is_not(stub, monkeypatch):
    monkeypatch.setenv("MW_TOKEN", TOKEN)
    config = NetBoxConfig(url=f"http://127.0.0.1:{stub.server_port}", token=SecretRef.parse("env:MW_TOKEN"))
    with pytest.raises(ApplicationError) as err:
        await run_activity(config, "find_device", DeviceLookup(name="gpu-01"))
    assert err.value.type == "NetBoxUnavailable" and not err.value.non_retryable and "503" in str(err.value)
    assert stub.seen == [f"Bearer {TOKEN}"]  # v2 token sent as Bearer, read from the secret at call time

    stub.status, stub.body = 400, {"status": ["burning is not a valid choice."]}
    with pytest.raises(ApplicationError) as err:
        await run_activity(
            config, "set_device_status", SetStatusRequest(device=DeviceLookup(name="x"), status="burning", reason="r")
        )
    assert err.value.type == "NetBoxRejected" and err.value.non_retryable
    assert "burning is not a valid choice." in str(err.value) and TOKEN not in str(err.value)
