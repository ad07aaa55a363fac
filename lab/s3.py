"""A real S3-compatible object store on 127.0.0.1 for the tests: moto's server (``moto[server]``), which checks
every request's AWS Signature Version 4 with botocore once authentication is on.

moto runs from its own cached venv (lab/venvs.py: ``${MILLWRIGHT_CACHE_DIR:-~/.cache/millwright}/moto-<v>/venv``,
pip from PyPI once, about two minutes on 2 cores). `S3Server.start()` starts ``moto_server`` on a free port, then,
with moto's own boto3, makes an IAM user allowed every S3 action, its access key and the bucket; then turns
authentication on (``/moto-api/reset-auth``), so from then on an unknown key is refused (403 InvalidAccessKeyId),
a wrong secret too (403 SignatureDoesNotMatch), and a missing bucket is 404 NoSuchBucket, as AWS answers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

from lab.loopback import LOOPBACK, free_port
from lab.venvs import cache_dir, cached_venv, run
from lab.venvs import venv_ready as _venv_ready

MOTO_VERSION = "5.2.5"
MOTO_REQUIREMENT = f"moto[server]=={MOTO_VERSION}"
REGION = "us-east-1"

# Run with moto's python: the user, its key and the bucket, printed as JSON.
_SETUP = """
import json, sys, boto3
url, bucket, region = sys.argv[1:4]
kw = dict(endpoint_url=url, region_name=region, aws_access_key_id="setup", aws_secret_access_key="setup")
iam = boto3.client("iam", **kw)
iam.create_user(UserName="millwright")
iam.put_user_policy(UserName="millwright", PolicyName="s3", PolicyDocument=json.dumps({"Version": "2012-10-17",
    "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}))
key = iam.create_access_key(UserName="millwright")["AccessKey"]
boto3.client("s3", **kw).create_bucket(Bucket=bucket)
print(json.dumps({"access_key_id": key["AccessKeyId"], "secret_access_key": key["SecretAccessKey"]}))
"""


class S3Unavailable(Exception):
    """moto cannot be had here (no venv module, no PyPI); the message is one line."""


class S3Error(Exception):
    """moto was expected to start but did not; the message names the log."""


def say(msg: str) -> None:
    print(f"s3: {msg}", file=sys.stderr, flush=True)


def check_available() -> None:
    """Raise S3Unavailable when this Python cannot make moto's venv; starts nothing, downloads nothing."""
    try:
        import venv  # noqa: F401
    except ImportError as err:
        raise S3Unavailable(f"S3 tier skipped: this Python has no venv module ({err})") from None


def _venv() -> Path:
    return cache_dir(f"moto-{MOTO_VERSION}") / "venv"


def venv_ready() -> bool:
    """Whether moto's cached venv is built (then starting takes a second or two, not a pip install)."""
    return _venv_ready(_venv(), MOTO_REQUIREMENT, "moto_server")


def ensure_venv(timeout: float = 900) -> Path:
    """moto's cached venv, made once from this interpreter's base Python (pip from PyPI, about two minutes)."""
    return cached_venv(_venv(), MOTO_REQUIREMENT, getattr(sys, "_base_executable", "") or sys.executable,
                       binary="moto_server", label="moto", about="about two minutes on 2 cores", say=say,
                       timeout=timeout, error=S3Error)  # fmt: skip


class S3Server:
    """`.url` (the endpoint), `.bucket`, `.access_key_id`, `.secret_access_key` once started."""

    def __init__(self, root: Path, bucket: str = "usage-reports", timeout: float = 900) -> None:
        self.root, self.bucket, self.timeout = Path(root).absolute(), bucket, timeout
        self.log = self.root / "moto.log"
        self.url = ""
        self.access_key_id = self.secret_access_key = ""
        self._proc: subprocess.Popen | None = None

    def start(self) -> S3Server:
        venv = ensure_venv(self.timeout)
        self.root.mkdir(parents=True, exist_ok=True)
        port = free_port()
        self.url = f"http://{LOOPBACK}:{port}"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "AWS_"))}
        try:
            with open(self.log, "ab") as log:
                self._proc = subprocess.Popen([str(venv / "bin" / "moto_server"), "-H", LOOPBACK, "-p", str(port)],
                                              stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                              env=env)  # fmt: skip
            self._wait_ready()
            keys = json.loads(run([str(venv / "bin" / "python"), "-c", _SETUP, self.url, self.bucket, REGION],
                                  "moto setup", timeout=60, error=S3Error, env=env))  # fmt: skip
            self.access_key_id, self.secret_access_key = keys["access_key_id"], keys["secret_access_key"]
            httpx.post(f"{self.url}/moto-api/reset-auth", content=b"0", timeout=10).raise_for_status()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self._proc is not None and self._proc.poll() is not None:
                raise S3Error(f"moto_server exited ({self._proc.returncode}); see {self.log}")
            try:
                httpx.get(f"{self.url}/moto-api/data.json", timeout=2)
                return
            except httpx.HTTPError:
                time.sleep(0.2)
        raise S3Error(f"moto_server did not answer at {self.url} within 60 s; see {self.log}")

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc = None


if __name__ == "__main__":
    if "--build" in sys.argv:  # only the venv, e.g. ahead of a CI run
        ensure_venv()
