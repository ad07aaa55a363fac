"""sushy-tools' Redfish emulator (fake driver, no libvirt) as a lab child process.

``with SushyTools(systems=3, password=...) as st: sushy.Sushy(st.url, auth=BasicAuth(st.user, st.password))``;
``st.system_ids`` are the systems' Redfish paths (``/redfish/v1/Systems/<uuid>``, what ``root.get_system`` takes),
``st.systems`` the fake-system dicts (name, uuid, power_state, nics). Each start writes a fresh ``emu.conf``, a
bcrypt (cost 4) htpasswd and a fresh state directory, so runs never see an earlier run's power states.

Behaviour to expect: power changes land 0-11 s after the request (random), restarts go Off at once
and On later; ``BootSourceOverrideEnabled`` always reads ``Continuous``; no processors, BIOS, firmware inventory,
logs or sessions (``lab/redfish.py`` has those); ``/redfish/v1/`` is anonymous, the rest needs Basic auth.

``python -m lab.sushy --host H --port P --ready-file F --config emu.conf`` runs the emulator in this process and
writes the ready file once it answers.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid as _uuid
from pathlib import Path
from typing import Any

from lab.k8s.process import ChildProcess
from lab.loopback import write_ready_file

DEFAULT_USER = "admin"
DEFAULT_PASSWORD = "password"


def fake_systems(systems: int | list[dict | str], prefix: str = "fake-node-") -> list[dict]:
    """sushy-tools fake-driver system entries: a count, names, or partial dicts (defaults filled)."""
    items: list[dict | str] = [{} for _ in range(systems)] if isinstance(systems, int) else list(systems)
    out = []
    for i, item in enumerate(items):
        s = {"name": item} if isinstance(item, str) else dict(item)
        name = s.setdefault("name", f"{prefix}{i + 1:03d}")
        s.setdefault("uuid", str(_uuid.uuid5(_uuid.NAMESPACE_DNS, f"{name}.sushy-tools.millwright.lab")))
        s.setdefault("power_state", "Off")
        s.setdefault("external_notifier", False)
        s.setdefault(
            "nics", [{"mac": f"52:54:00:{i >> 16 & 255:02x}:{i >> 8 & 255:02x}:{i & 255:02x}", "ip": "127.0.0.1"}]
        )
        out.append(s)
    return out


def write_config(
    directory: Path, systems: list[dict], user: str | None, password: str | None, feature_set: str = "full"
) -> Path:
    """emu.conf (+ htpasswd with a cheap bcrypt hash when a user is given, + a fresh state dir) in `directory`."""
    state = directory / "state"
    state.mkdir(parents=True, exist_ok=True)
    lines = [
        "SUSHY_EMULATOR_FAKE_DRIVER = True",
        f"SUSHY_EMULATOR_STATE_DIR = {str(state)!r}",
        f"SUSHY_EMULATOR_FEATURE_SET = {feature_set!r}",
        f"SUSHY_EMULATOR_FAKE_SYSTEMS = {systems!r}",
    ]
    if user:
        import bcrypt

        htpasswd = directory / "htpasswd"
        digest = bcrypt.hashpw((password or "").encode(), bcrypt.gensalt(rounds=4)).decode()
        htpasswd.write_text(f"{user}:{digest}\n")
        htpasswd.chmod(0o600)
        lines.append(f"SUSHY_EMULATOR_AUTH_FILE = {str(htpasswd)!r}")
    conf = directory / "emu.conf"
    conf.write_text("\n".join(lines) + "\n")
    return conf


class SushyTools(ChildProcess):
    """sushy-emulator with the fake driver, as a child process (see the module doc)."""

    module = "lab.sushy"
    name = "lab-sushy-tools"
    binds_own_port = False  # sushy-emulator listens where it is told and cannot say where it bound

    def __init__(
        self,
        *,
        systems: int | list[dict | str] = 3,
        prefix: str = "fake-node-",
        user: str | None = DEFAULT_USER,
        password: str = DEFAULT_PASSWORD,
        feature_set: str = "full",
        **kw: Any,
    ) -> None:
        """`user=None` serves without authentication."""
        kw.setdefault("startup_timeout", 30.0)
        super().__init__(**kw)
        self.systems = fake_systems(systems, prefix)
        self.user, self.password, self.feature_set = user, password, feature_set

    @property
    def system_ids(self) -> list[str]:
        return [f"/redfish/v1/Systems/{s['uuid']}" for s in self.systems]

    def system_id(self, name: str) -> str:
        return next(f"/redfish/v1/Systems/{s['uuid']}" for s in self.systems if s["name"] == name)

    def extra_command(self) -> list[str]:
        assert self._tmpdir is not None
        conf = write_config(Path(self._tmpdir.name), self.systems, self.user, self.password, self.feature_set)
        return ["--config", str(conf)]


def _announce_when_up(url: str, ready_file: str | None, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/redfish/v1/", timeout=2):
                break
        except urllib.error.HTTPError:  # it answers
            break
        except (urllib.error.URLError, OSError):
            time.sleep(0.05)
    print(f"lab.sushy (sushy-tools) listening on {url}", flush=True)
    if ready_file:
        write_ready_file(ready_file, url)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lab.sushy", description="sushy-tools' emulator, fake driver")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--ready-file")
    p.add_argument("--config", required=True, help="an emu.conf (see write_config)")
    a = p.parse_args(argv)
    from sushy_tools.emulator import main as emulator

    url = f"http://{a.host}:{a.port}"
    threading.Thread(target=_announce_when_up, args=(url, a.ready_file), daemon=True).start()
    sys.argv = ["sushy-emulator", "--config", a.config, "-i", a.host, "-p", str(a.port)]
    return emulator.main()


if __name__ == "__main__":
    sys.exit(main())
