"""A real NetBox on 127.0.0.1 for the tests and the lab: PostgreSQL, Redis and NetBox from PyPI.

NetBox 4.7 needs Python >= 3.12, so it runs from its own virtual environment, separate
from Millwright's. `NetBoxLab.start()`:

1. finds a Python >= 3.12 (``MILLWRIGHT_NETBOX_PYTHON``, then pyenv 3.12.x, then
   ``python3.12`` on PATH), PostgreSQL's server binaries and ``redis-server``; a missing piece
   raises `NetBoxUnavailable` whose message is one line saying why;
2. makes (once, under a lock) a venv with ``netbox==4.7.*`` in
   ``${MILLWRIGHT_CACHE_DIR:-~/.cache/millwright}/netbox-4.7/venv``;
3. runs its own PostgreSQL cluster (initdb in the state dir; as root, as the unprivileged
   ``nobody`` since PostgreSQL refuses root) and its own Redis, each on a free loopback port;
4. restores the migrated database from a dump cached next to the venv, keyed by the NetBox
   version and a hash of the settings that shape the database; without one it runs the
   migrations (minutes on 2 cores; the progress counted as they apply) and saves the dump
   (seconds to restore next time);
5. creates a superuser and a v2 API token (``nbt_<key>.<secret>``: the one given as
   ``NetBoxLab(token=new_token())``, so a worker can be handed its file before NetBox runs, or a fresh
   one), and serves NetBox with Django's ``runserver`` on 127.0.0.1 until `stop()`.

``on_stage`` hears each step ("migrating its database: 120/336 migrations ..."). For the lab,
`NetBoxGate` answers on NetBox's address while it starts, and `seed_inventory` puts the lab's
inventory in. Nothing listens beyond 127.0.0.1. ``python -m lab.netbox`` runs one by hand.

Longer than 600 lines because the steps above are one start-up sequence over one state directory, and
`NetBoxGate` is the front of that same start-up (it answers until `NetBoxLab` is ready), so splitting them would
only spread one lifecycle over files.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import os
import pwd
import secrets
import shutil
import signal
import string
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lab.loopback import LOOPBACK, free_port
from lab.loopback import write_secret_file as write_token_file  # the API token, read by workers through file:
from lab.venvs import cache_dir, cached_venv, file_lock, python_ok, run, serve_until_signal

NETBOX_SERIES = "4.7"
NETBOX_REQUIREMENT = f"netbox=={NETBOX_SERIES}.*"
DB_NAME = "netbox"
DB_USER = "postgres"
ADMIN_USER = "millwright"
# Bump when anything below changes what the migrated database holds.
DUMP_FORMAT = "1"
# Settings that shape the migrated database; the dump's key hashes them.
_DB_SHAPING_SETTINGS = {"TIME_ZONE": "UTC", "DEFAULT_LANGUAGE": "en-us", "encoding": "UTF8", "locale": "C"}


class NetBoxUnavailable(Exception):
    """A piece NetBox needs is missing here; the message is one line saying which and why."""


class NetBoxError(Exception):
    """NetBox was expected to start but did not; the message names the log to read."""


def say(msg: str) -> None:
    print(f"netbox: {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- finding the pieces


def _python_ok(path: str) -> bool:
    return python_ok(path, (3, 12))


def find_python312() -> str:
    """A Python >= 3.12 interpreter: MILLWRIGHT_NETBOX_PYTHON, pyenv 3.12.x, then python3.12 on PATH."""
    candidates: list[str] = []
    explicit = os.environ.get("MILLWRIGHT_NETBOX_PYTHON")
    if explicit:
        candidates.append(explicit)
    pyenv = shutil.which("pyenv")
    if pyenv:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            listed = subprocess.run([pyenv, "versions", "--bare"], capture_output=True, text=True, timeout=30).stdout
            for version in sorted((v.strip() for v in listed.split()), reverse=True):
                if version.startswith("3.12"):
                    prefix = subprocess.run(
                        [pyenv, "prefix", version], capture_output=True, text=True, timeout=30
                    ).stdout.strip()
                    if prefix:
                        candidates.append(str(Path(prefix) / "bin" / "python3.12"))
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    candidates += [str(p / "bin" / "python3.12") for p in sorted(root.glob("versions/3.12*"), reverse=True)]
    on_path = shutil.which("python3.12")
    if on_path:
        candidates.append(on_path)
    for candidate in candidates:
        if Path(candidate).is_file() and _python_ok(candidate):
            return candidate
    raise NetBoxUnavailable(
        "NetBox tier skipped: no Python >= 3.12 found (NetBox 4.7 needs it; looked at "
        "MILLWRIGHT_NETBOX_PYTHON, pyenv 3.12.x and python3.12 on PATH)"
    )


def find_pg_bin() -> Path:
    """The directory holding initdb, postgres, pg_restore, pg_dump and createdb."""
    needed = ("initdb", "postgres", "pg_dump", "pg_restore", "createdb", "psql")
    candidates: list[Path] = []
    if os.environ.get("MILLWRIGHT_PG_BIN"):
        candidates.append(Path(os.environ["MILLWRIGHT_PG_BIN"]))
    candidates += sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=lambda p: p.parent.name, reverse=True)
    initdb = shutil.which("initdb")
    if initdb:
        candidates.append(Path(initdb).resolve().parent)
    for candidate in candidates:
        if all((candidate / tool).is_file() for tool in needed):
            return candidate
    raise NetBoxUnavailable(
        "NetBox tier skipped: PostgreSQL server binaries (initdb, postgres, pg_restore) not found "
        "(apt-get install postgresql, or set MILLWRIGHT_PG_BIN)"
    )


def find_redis() -> str:
    found = os.environ.get("MILLWRIGHT_REDIS_SERVER") or shutil.which("redis-server")
    if not found or not Path(found).is_file():
        raise NetBoxUnavailable("NetBox tier skipped: redis-server not found (apt-get install redis-server)")
    return found


def check_available() -> None:
    """Raise NetBoxUnavailable (one line) when a piece is missing; starts nothing, downloads nothing."""
    find_python312()
    find_pg_bin()
    find_redis()


def new_token() -> str:
    """A v2 API token, ``nbt_<key>.<secret>`` in NetBox's alphabet and lengths (12 and 40), for `NetBoxLab(token=)`:
    known before NetBox runs, so a worker can be handed its file from the start."""
    alphabet = string.ascii_letters + string.digits
    key, secret = ("".join(secrets.choice(alphabet) for _ in range(n)) for n in (12, 40))
    return f"nbt_{key}.{secret}"


def cache_root() -> Path:
    return cache_dir(f"netbox-{NETBOX_SERIES}")


# Exclusive lock across processes: two test sessions never build the same cache at once.
_file_lock = file_lock


# ---------------------------------------------------------------- the NetBox venv


def ensure_venv(python: str, timeout: float = 900) -> Path:
    """The cached NetBox venv, created once (pip from PyPI); returns its directory."""
    return cached_venv(cache_root() / "venv", NETBOX_REQUIREMENT, python, binary="netbox", label="NetBox",
                       about="about a minute", say=say, timeout=timeout, error=NetBoxError)  # fmt: skip


def installed_version(venv: Path) -> str:
    out = _run([str(venv / "bin" / "netbox"), "version"], "netbox version", timeout=60)
    return out.strip().splitlines()[-1].strip()


def _run(argv: list[str], doing: str, *, timeout: float, env: dict[str, str] | None = None, **kw) -> str:
    return run(argv, doing, timeout=timeout, env=env, error=NetBoxError, **kw)


# ---------------------------------------------------------------- the lab instance


@dataclass
class NetBoxLab:
    """PostgreSQL + Redis + NetBox on loopback, all children of this process.

    ``state_dir`` holds the configuration, logs and (when not root) the database; ``keep_data``
    keeps the database between starts (the lab) instead of restoring a fresh one (the tests).
    """

    state_dir: Path
    port: int = 0
    keep_data: bool = False
    timeout: float = 900.0
    url: str = ""
    token: str = field(default="", repr=False)  # preset (`new_token()`): NetBox is given this one; else a fresh one
    on_stage: Callable[[str], None] | None = None  # told each step of the start, e.g. "migrating: 120/412"
    stage: str = "not started"
    timings: dict[str, float] = field(default_factory=dict)
    serve: bool = True  # False: prepare the venv and the database (migrating once, cached), then stop
    _procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    _pgdata_tmp: Path | None = None
    _stopped: bool = False  # stop() from another thread: what start() would spawn next is not started

    # ------------------------------------------------------------ paths

    @property
    def root(self) -> Path:
        """NETBOX_ROOT: conf/configuration.py, media, scripts, logs."""
        return self.state_dir.resolve()

    @property
    def pids(self) -> dict[str, int]:
        return {name: p.pid for name, p in list(self._procs.items()) if p.poll() is None}

    def _log(self, name: str) -> Path:
        return self.root / f"{name}.log"

    # ------------------------------------------------------------ start

    def _stage(self, text: str) -> None:
        self.stage = text
        if self.on_stage is not None:
            self.on_stage(text)

    def start(self) -> NetBoxLab:
        started = time.monotonic()
        python = find_python312()
        pg_bin = find_pg_bin()
        redis = find_redis()
        self.root.mkdir(parents=True, exist_ok=True)
        self._stopped = False
        atexit.register(self.stop)
        try:
            t = time.monotonic()
            self._stage("preparing its venv (the first start builds it: about a minute, once)")
            venv = ensure_venv(python)
            version = installed_version(venv)
            self.timings["venv"] = time.monotonic() - t
            if not self.serve and self.dump_path(version).is_file():
                return self  # the cache is warm already
            taken: set[int] = set()
            pg_port = free_port(avoid=taken)
            taken.add(pg_port)
            redis_port = free_port(avoid=taken)
            taken.add(redis_port)
            http_port = self.port or free_port(avoid=taken)

            t = time.monotonic()
            self._stage("starting its PostgreSQL and Redis")
            fresh = self._start_postgres(pg_bin, pg_port)
            self._start_redis(redis, redis_port)
            self.timings["postgres+redis"] = time.monotonic() - t
            env = self._write_configuration(pg_port, redis_port)

            t = time.monotonic()
            migrated_for = self._pgdata().parent / "netbox-version"
            if fresh:
                self._load_database(pg_bin, pg_port, venv, version, env)
            elif not migrated_for.is_file() or migrated_for.read_text().strip() != version:
                # A kept database from another NetBox release (or a migration cut short): bring its schema up.
                self._migrate(venv, env, version, fresh=False)
            migrated_for.write_text(version + "\n")
            self.timings["database"] = time.monotonic() - t
            if not self.serve:
                self.stop()
                return self

            t = time.monotonic()
            self.url = f"http://{LOOPBACK}:{http_port}"
            self._stage("starting its web server, creating the API token")
            self._serve(venv, http_port, env)  # starts while the token is made: both take a Django start
            self.token = self._create_token(venv, env, self.token or new_token())
            self._wait_healthy()
            self.timings["serve+token"] = time.monotonic() - t
        except BaseException:
            self.stop()
            raise
        self.timings["total"] = time.monotonic() - started
        self._stage("ready")
        say(
            f"NetBox {version} ready at {self.url} in {self.timings['total']:.1f}s "
            f"({', '.join(f'{k} {v:.1f}s' for k, v in self.timings.items() if k != 'total')})"
        )
        return self

    def _spawn(
        self,
        name: str,
        argv: list[str],
        *,
        env: dict[str, str] | None = None,
        as_user: str | None = None,
        cwd: str | None = None,
    ) -> subprocess.Popen:
        if self._stopped:
            raise NetBoxError(f"stopped before {name} started")
        kw: dict = {}
        if as_user:
            entry = pwd.getpwnam(as_user)
            kw.update(user=entry.pw_uid, group=entry.pw_gid, extra_groups=[])
        with open(self._log(name), "ab") as log:
            proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=cwd or str(self.root),
                start_new_session=True,  # a Ctrl-C reaches the owner, which stops these in order
                **kw,
            )  # fmt: skip
        self._procs[name] = proc
        return proc

    def _check_alive(self, name: str) -> None:
        proc = self._procs.get(name)
        if proc is not None and proc.poll() is not None:
            tail = "\n".join(self._log(name).read_text(errors="replace").strip().splitlines()[-15:])
            raise NetBoxError(f"{name} exited with code {proc.returncode}; see {self._log(name)}:\n{tail}")

    # ------------------------------------------------------------ PostgreSQL

    def _pg_user(self) -> str | None:
        """PostgreSQL refuses to run as root: then it runs as `nobody` (override: MILLWRIGHT_PG_USER)."""
        if os.geteuid() != 0:
            return None
        return os.environ.get("MILLWRIGHT_PG_USER", "nobody")

    def _pgdata(self) -> Path:
        if self._pg_user() is None:
            return self.root / "pgdata"
        # The state dir may sit under a directory the unprivileged user cannot enter (pytest's
        # tmp dirs are 0700): keep the cluster under /tmp, owned by that user.
        if self.keep_data:
            key = hashlib.sha256(str(self.root).encode()).hexdigest()[:12]
            return Path(tempfile.gettempdir()) / f"millwright-netbox-pg-{key}" / "pgdata"
        if self._pgdata_tmp is None:
            self._pgdata_tmp = Path(tempfile.mkdtemp(prefix="millwright-netbox-pg-")) / "pgdata"
        return self._pgdata_tmp

    def _start_postgres(self, pg_bin: Path, port: int) -> bool:
        """Start the cluster (initdb first when there is none); True when its database is new."""
        user = self._pg_user()
        pgdata = self._pgdata()
        fresh = not (pgdata / "PG_VERSION").is_file()
        if fresh and pgdata.exists():
            shutil.rmtree(pgdata)
        pgdata.parent.mkdir(parents=True, exist_ok=True)
        if user:
            entry = pwd.getpwnam(user)
            os.chown(pgdata.parent, entry.pw_uid, entry.pw_gid)
            os.chmod(pgdata.parent, 0o700)
        if fresh:
            kw: dict = {}
            if user:
                entry = pwd.getpwnam(user)
                kw.update(user=entry.pw_uid, group=entry.pw_gid, extra_groups=[])
            _run(
                [str(pg_bin / "initdb"), "-D", str(pgdata), "-A", "trust", "-U", DB_USER,
                 "-E", _DB_SHAPING_SETTINGS["encoding"], "--locale", _DB_SHAPING_SETTINGS["locale"], "--no-sync"],
                "initdb", timeout=120, cwd=str(pgdata.parent), **kw,
            )  # fmt: skip
        self._spawn(
            "postgres",
            # TCP on loopback only; no Unix socket (a deep state dir would exceed its path limit).
            [str(pg_bin / "postgres"), "-D", str(pgdata), "-p", str(port), "-c", "unix_socket_directories=",
             "-c", f"listen_addresses={LOOPBACK}",
             # A lab database: durability traded for speed (migrations and restores run much faster).
             "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
             "-c", "max_connections=100", "-c", "shared_buffers=64MB"],
            as_user=user, cwd=str(pgdata.parent),
        )  # fmt: skip
        self._pg = (pg_bin, port)
        deadline = time.monotonic() + 60
        while True:
            self._check_alive("postgres")
            ready = subprocess.run(
                [str(pg_bin / "pg_isready"), "-h", LOOPBACK, "-p", str(port), "-U", DB_USER, "-q"], capture_output=True
            )
            if ready.returncode == 0:
                break
            if time.monotonic() > deadline:
                raise NetBoxError(f"PostgreSQL did not accept connections in 60s; see {self._log('postgres')}")
            time.sleep(0.2)
        if fresh or not self._database_exists(pg_bin, port):
            _run(
                [str(pg_bin / "createdb"), "-h", LOOPBACK, "-p", str(port), "-U", DB_USER, DB_NAME],
                "createdb",
                timeout=60,
            )
            return True
        return False

    def _database_exists(self, pg_bin: Path, port: int) -> bool:
        out = _run(
            [str(pg_bin / "psql"), "-h", LOOPBACK, "-p", str(port), "-U", DB_USER, "-tAc",
             f"SELECT 1 FROM pg_database WHERE datname = '{DB_NAME}'"],
            "psql", timeout=30,
        )  # fmt: skip
        return out.strip() == "1"

    # ------------------------------------------------------------ Redis

    def _start_redis(self, redis: str, port: int) -> None:
        rdir = self.root / "redis"
        rdir.mkdir(exist_ok=True)
        self._spawn(
            "redis",
            [redis, "--bind", LOOPBACK, "--port", str(port), "--protected-mode", "yes", "--save", "",
             "--appendonly", "no", "--dir", str(rdir), "--daemonize", "no"],
        )  # fmt: skip
        import socket

        deadline = time.monotonic() + 30
        while True:
            self._check_alive("redis")
            with contextlib.suppress(OSError), socket.create_connection((LOOPBACK, port), timeout=1) as s:
                s.sendall(b"PING\r\n")
                if s.recv(16).startswith(b"+PONG"):
                    return
            if time.monotonic() > deadline:
                raise NetBoxError(f"Redis did not answer in 30s; see {self._log('redis')}")
            time.sleep(0.1)

    # ------------------------------------------------------------ configuration

    def _secrets(self) -> dict[str, str]:
        """SECRET_KEY and the token pepper: generated once per state dir, kept there (0600)."""
        path = self.root / "secrets.json"
        with contextlib.suppress(OSError, ValueError):
            data = json.loads(path.read_text())
            if data.get("SECRET_KEY") and data.get("PEPPER"):
                return data
        data = {"SECRET_KEY": secrets.token_urlsafe(48), "PEPPER": secrets.token_urlsafe(48)}
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(data, fh)
        return data

    def _write_configuration(self, pg_port: int, redis_port: int) -> dict[str, str]:
        keys = self._secrets()
        conf = self.root / "conf"
        conf.mkdir(exist_ok=True)
        redis = {"HOST": LOOPBACK, "PORT": redis_port, "USERNAME": "", "PASSWORD": "", "SSL": False}
        text = f"""# Written by Millwright's lab (lab/netbox.py); rewritten at every start.
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
DATABASES = {{"default": {{
    "ENGINE": "django.db.backends.postgresql", "NAME": {DB_NAME!r}, "USER": {DB_USER!r}, "PASSWORD": "",
    "HOST": {LOOPBACK!r}, "PORT": {str(pg_port)!r}, "CONN_MAX_AGE": 300,
}}}}
REDIS = {{
    "tasks": {{**{redis!r}, "DATABASE": 0}},
    "caching": {{**{redis!r}, "DATABASE": 1}},
}}
SECRET_KEY = {keys["SECRET_KEY"]!r}
API_TOKEN_PEPPERS = {{1: {keys["PEPPER"]!r}}}
TIME_ZONE = {_DB_SHAPING_SETTINGS["TIME_ZONE"]!r}
DEFAULT_LANGUAGE = {_DB_SHAPING_SETTINGS["DEFAULT_LANGUAGE"]!r}
DEBUG = False
ISOLATED_DEPLOYMENT = True
CENSUS_REPORTING_ENABLED = False
RELEASE_CHECK_URL = None
PLUGINS = []
"""
        path = conf / "configuration.py"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "DJANGO_", "NETBOX_"))}
        env.update(NETBOX_ROOT=str(self.root), DJANGO_SETTINGS_MODULE="netbox.settings", PYTHONUNBUFFERED="1")
        return env

    # ------------------------------------------------------------ database: restore or migrate

    def dump_path(self, version: str) -> Path:
        key = hashlib.sha256(
            json.dumps({"format": DUMP_FORMAT, "version": version, **_DB_SHAPING_SETTINGS}, sort_keys=True).encode()
        ).hexdigest()[:12]
        return cache_root() / f"netbox-{version}-{key}.pgdump"

    def _load_database(self, pg_bin: Path, port: int, venv: Path, version: str, env: dict[str, str]) -> None:
        dump = self.dump_path(version)
        conn = ["-h", LOOPBACK, "-p", str(port), "-U", DB_USER]
        if not dump.is_file():
            with _file_lock(cache_root() / ".dump.lock"):
                if not dump.is_file():  # nobody made it while we waited for the lock
                    say(
                        f"migrating a fresh NetBox {version} database (a few minutes on 2 cores, once; "
                        f"cached as {dump})"
                    )
                    t = time.monotonic()
                    self._migrate(venv, env, version)
                    self.timings["migrate"] = time.monotonic() - t
                    tmp = dump.with_suffix(f".tmp{os.getpid()}")
                    _run([str(pg_bin / "pg_dump"), *conn, "-Fc", "-f", str(tmp), DB_NAME], "pg_dump", timeout=300)
                    os.replace(tmp, dump)
                    return
        t = time.monotonic()
        self._stage("restoring its database from the cache")
        _run([str(pg_bin / "pg_restore"), *conn, "-d", DB_NAME, "--no-owner", "-j", "2", str(dump)], "pg_restore",
             timeout=300)  # fmt: skip
        self.timings["restore"] = time.monotonic() - t

    def _migrate(self, venv: Path, env: dict[str, str], version: str, *, fresh: bool = True) -> None:
        """`netbox migrate`, its progress counted as it applies migrations out of the plan's total
        (`showmigrations --plan`: on a fresh database every migration, read alongside, since a Django start of its
        own would delay the migration; on a kept one those not applied, read first)."""
        netbox = str(venv / "bin" / "netbox")
        plan_file = self._log("migrate-plan")
        with open(plan_file, "w") as out:
            plan = subprocess.Popen([netbox, "showmigrations", "--plan"], stdout=out, stderr=subprocess.DEVNULL,
                                    stdin=subprocess.DEVNULL, env=env)  # fmt: skip
        if not fresh:
            plan.wait(300)
        log_file = self._log("migrate")
        offset = log_file.stat().st_size if log_file.exists() else 0
        proc = self._spawn("migrate", [netbox, "migrate", "--no-input"], env=env)
        first = f"NetBox {version}: the first start only, then cached"
        done, total, deadline = 0, "?", time.monotonic() + self.timeout
        self._stage(f"migrating its database: 0/{total} migrations ({first})")
        try:
            with open(log_file, errors="replace") as log:
                log.seek(offset)
                partial = ""  # Django writes "  Applying x..." first and " OK" when it is applied
                while True:
                    if total == "?" and plan.poll() is not None:
                        lines = plan_file.read_text(errors="replace").splitlines()
                        total = str(sum(1 for line in lines if line.startswith("[ ]" if not fresh else "[")) or "?")
                    chunk = log.readline()
                    if chunk:
                        partial += chunk
                        if partial.endswith("\n"):
                            line, partial = partial.strip(), ""
                            if line.startswith("Applying ") and line.endswith("OK"):
                                done += 1
                                self._stage(f"migrating its database: {done}/{total} migrations ({first})")
                        continue
                    if proc.poll() is not None:
                        break
                    if time.monotonic() > deadline:
                        raise NetBoxError(f"netbox migrate: timed out after {self.timeout:.0f}s; see {log_file}")
                    time.sleep(0.2)
        finally:
            if plan.poll() is None:
                plan.kill()
            plan.wait()
        self._procs.pop("migrate", None)
        if proc.returncode != 0:
            tail = "\n".join(log_file.read_text(errors="replace").strip().splitlines()[-15:])
            raise NetBoxError(f"netbox migrate failed (exit {proc.returncode}); see {log_file}:\n{tail}")

    # ------------------------------------------------------------ serve, token, health

    def _serve(self, venv: Path, port: int, env: dict[str, str]) -> None:
        self._spawn(
            "netbox",
            [str(venv / "bin" / "netbox"), "runserver", f"{LOOPBACK}:{port}", "--noreload", "--insecure"],
            env=env,
        )

    def _create_token(self, venv: Path, env: dict[str, str], token: str) -> str:
        """A superuser (no password: API only) and the v2 token `token` (``nbt_<key>.<secret>``, `new_token()`);
        the token reaches NetBox through the environment, never a command line."""
        key, secret = token.removeprefix("nbt_").split(".", 1)
        script = (
            "import os\n"
            "from users.models import Token, User\n"
            f"u = User.objects.filter(username={ADMIN_USER!r}).first() or User(username={ADMIN_USER!r})\n"
            "u.is_superuser = True\nu.is_active = True\nu.set_unusable_password()\nu.save()\n"
            # Earlier lab tokens (a kept database) are revoked: only the newest one works.
            "Token.objects.filter(user=u, description='millwright lab').delete()\n"
            "t = Token(user=u, version=2, write_enabled=True, description='millwright lab',\n"
            "          key=os.environ['MILLWRIGHT_LAB_TOKEN_KEY'], token=os.environ['MILLWRIGHT_LAB_TOKEN_SECRET'])\n"
            "t.full_clean()\nt.save()\n"
            "print('MILLWRIGHT-TOKEN-CREATED')\n"
        )
        out = _run(
            [str(venv / "bin" / "netbox"), "shell", "--no-startup", "-c", script],
            "creating the API token",
            timeout=300,
            env={**env, "MILLWRIGHT_LAB_TOKEN_KEY": key, "MILLWRIGHT_LAB_TOKEN_SECRET": secret},
        )
        if "MILLWRIGHT-TOKEN-CREATED" not in out:
            raise NetBoxError("creating the API token printed no confirmation")
        return token

    def _wait_healthy(self, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            self._check_alive("netbox")
            request = urllib.request.Request(
                f"{self.url}/api/status/",
                headers={"Authorization": f"Bearer {self.token}", "Accept": "application/json"},
            )
            try:
                with urllib.request.urlopen(request, timeout=5) as resp:
                    if resp.status == 200 and "netbox-version" in json.loads(resp.read()):
                        return
            except urllib.error.HTTPError as err:
                last = f"HTTP {err.code}"
            except (OSError, ValueError) as err:
                last = type(err).__name__
            time.sleep(0.3)
        raise NetBoxError(f"NetBox did not answer /api/status/ in {timeout:.0f}s ({last}); see {self._log('netbox')}")

    # ------------------------------------------------------------ stop

    def stop(self, timeout: float = 20) -> None:
        """Stop NetBox, then Redis, then PostgreSQL (fast shutdown); SIGKILL after a timeout."""
        self._stopped = True
        order = [
            ("migrate", signal.SIGTERM),
            ("netbox", signal.SIGTERM),
            ("redis", signal.SIGTERM),
            ("postgres", signal.SIGINT),
        ]
        for name, sig in order:
            proc = self._procs.get(name)
            if proc is None or proc.poll() is not None:
                continue
            with contextlib.suppress(ProcessLookupError, PermissionError):
                proc.send_signal(sig)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(5)
        self._procs.clear()
        if self._pgdata_tmp is not None:
            shutil.rmtree(self._pgdata_tmp.parent, ignore_errors=True)
            self._pgdata_tmp = None
        with contextlib.suppress(Exception):
            atexit.unregister(self.stop)

    def __enter__(self) -> NetBoxLab:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


# ---------------------------------------------------------------- the lab's front door and its inventory


class NetBoxGate:
    """NetBox's address in the lab, answering from the lab's first second, so the worker is given NetBox's URL
    from the start: until `open()`, every request gets ``503`` with ``Retry-After`` and
    ``{"detail": "NetBox is starting in the lab (<stage>) ..."}``, which the NetBox activities report as a
    retryable ``NetBoxUnavailable`` carrying that message (their retries wait NetBox out, visibly); after, each
    connection is relayed to NetBox byte for byte (lab/tls.py's `relay`)."""

    def __init__(self, stage: Callable[[], str], host: str = LOOPBACK, port: int = 0) -> None:
        self._stage, self._host, self._port = stage, host, port
        self._upstream: int | None = None
        self._server: Any = None
        self.url = ""

    async def start(self) -> NetBoxGate:
        import asyncio

        self._server = await asyncio.start_server(self._connection, self._host, self._port)
        self.url = f"http://{self._host}:{self._server.sockets[0].getsockname()[1]}"
        return self

    def open(self, upstream_port: int) -> None:
        self._upstream = upstream_port

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    def message(self) -> str:
        stage = self._stage()
        if stage.startswith("failed"):
            return f"NetBox did not start in the lab ({stage}); restart the lab (`millwright lab up`)"
        return (
            f"NetBox is starting in the lab ({stage}); the rest of the lab is usable meanwhile, and calls to "
            "NetBox are retried until it answers"
        )

    async def _connection(self, reader: Any, writer: Any) -> None:
        import asyncio

        from lab.tls import relay

        if self._upstream is not None:
            await relay(reader, writer, self._host, self._upstream)
            return
        try:
            await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            writer.close()
            return
        body = json.dumps({"detail": self.message()}).encode()
        writer.write(
            b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 10\r\n"
            b"Connection: close\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
        )
        with contextlib.suppress(ConnectionError):
            await writer.drain()
        writer.close()


async def seed_inventory(
    url: str, token_ref: str, devices: list[dict[str, Any]], *, site: str = "lab", device_type: str = "HGX H100 8-GPU"
) -> str:
    """Make NetBox at `url` hold the lab's inventory; idempotent (a kept database is brought up to date).

    First the bootstrap (every section of `InventoryBootstrap`, through the same activities, run here), then a
    site, an NVIDIA device type and, for each of `devices` (``{"name", "custom_fields", "interfaces": {name:
    port GUID}}``, lab/fleet.py's `Fleet.netbox_devices`), an active ``gpu-server`` device with those custom fields
    and an InfiniBand interface per port. Returns one line saying what it did."""
    import asyncio

    from temporalio.testing import ActivityEnvironment

    from activities.netbox.activities import NetBoxActivities
    from activities.netbox.bootstrap import BOOTSTRAP_SECTIONS, BootstrapRequest
    from activities.netbox.client import NetBoxConfig
    from activities.netbox.models import CF_IB_PORT_GUID, GPU_SERVER_ROLE, NVIDIA
    from activities.support.secrets import SecretRef

    ref = SecretRef.parse(token_ref)
    activities = NetBoxActivities(NetBoxConfig(url=url, token=ref))
    created = 0
    for section in BOOTSTRAP_SECTIONS:
        done = await ActivityEnvironment().run(activities.bootstrap_section, BootstrapRequest(section=section))
        created += len(done.created)

    def upsert(
        endpoint: Any, key: dict[str, Any], want: dict[str, Any], lookup: dict[str, Any] | None = None
    ) -> tuple[Any, bool]:
        found = endpoint.get(**(lookup or key))
        if found is None:
            return endpoint.create(**key, **want), True
        cf = want.get("custom_fields") or {}
        if any(found.custom_fields.get(k) != v for k, v in cf.items()):
            found.update({"custom_fields": cf})
            return found, True
        return found, False

    def devices_and_ports() -> tuple[int, int]:
        import pynetbox

        nb = pynetbox.api(url, token=ref.resolve())
        nb.http_session.trust_env = False
        where, _ = upsert(nb.dcim.sites, {"slug": site}, {"name": site, "status": "active"})
        maker = nb.dcim.manufacturers.get(slug=NVIDIA)
        slug = device_type.lower().replace(" ", "-")
        dtype, _ = upsert(nb.dcim.device_types, {"slug": slug}, {"manufacturer": maker.id, "model": device_type})
        role = nb.dcim.device_roles.get(slug=GPU_SERVER_ROLE)
        changed_devices = changed_ports = 0
        for spec in devices:
            device, changed = upsert(nb.dcim.devices, {"name": spec["name"]},
                                     {"site": where.id, "role": role.id, "device_type": dtype.id, "status": "active",
                                      "custom_fields": spec.get("custom_fields") or {}})  # fmt: skip
            changed_devices += changed
            for name, guid in (spec.get("interfaces") or {}).items():
                _, changed = upsert(nb.dcim.interfaces, {"name": name},
                                    {"device": device.id, "type": "infiniband-ndr",
                                     "custom_fields": {CF_IB_PORT_GUID: guid}},
                                    lookup={"device_id": device.id, "name": name})  # fmt: skip
                changed_ports += changed
        return changed_devices, changed_ports

    changed_devices, changed_ports = await asyncio.to_thread(devices_and_ports)
    return (
        f"bootstrapped ({created} objects created) and holds {len(devices)} devices with their InfiniBand "
        f"ports ({changed_devices} devices and {changed_ports} ports created or updated now)"
    )


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m lab.netbox", description="Run a NetBox on 127.0.0.1 until Ctrl-C.")
    # Not the lab's .millwright/netbox: a standalone NetBox never shares the lab's database.
    parser.add_argument("--state-dir", type=Path, default=Path(".millwright/netbox-standalone"))
    parser.add_argument("--port", type=int, default=0, help="HTTP port (0 = any free port)")
    parser.add_argument("--fresh", action="store_true", help="Start from a freshly restored database.")
    parser.add_argument("--check", action="store_true", help="Only say whether NetBox can run here.")
    parser.add_argument("--warm", action="store_true", help="Only build the cached venv and migrated database that "
                        "later starts restore from (minutes, once), then exit.")  # fmt: skip
    args = parser.parse_args(argv)
    if args.check:
        try:
            check_available()
        except NetBoxUnavailable as err:
            print(err)
            return 1
        print("NetBox can run here")
        return 0
    lab = NetBoxLab(args.state_dir, port=args.port, keep_data=not args.fresh and not args.warm, serve=not args.warm)
    try:
        lab.start()
        if args.warm:
            print(f"NetBox cache ready ({', '.join(f'{k} {v:.1f}s' for k, v in lab.timings.items())})", flush=True)
            return 0
    except NetBoxUnavailable as err:
        print(err, file=sys.stderr)
        return 1
    except NetBoxError as err:
        print(f"netbox: error: {err}", file=sys.stderr)
        return 1
    token_file = write_token_file(lab.root / "token", lab.token)
    print(f"NetBox:  {lab.url}", flush=True)
    print(f"token:   file:{token_file}  (MILLWRIGHT_NETBOX_TOKEN=file:{token_file})", flush=True)
    print("stop:    Ctrl-C", flush=True)

    def exited() -> str | None:
        gone = [
            f"{name} exited with code {proc.returncode}" for name, proc in lab._procs.items() if proc.poll() is not None
        ]
        return f"netbox: {', '.join(gone)}" if gone else None

    serve_until_signal(exited, lab.stop)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
