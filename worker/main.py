"""``python -m worker`` / ``millwright-worker``: a tiny declarative Temporal worker.

``--host-agent``: run as the GPU host agent instead: only the host activities (activities/gpu/activities.py), on task
queue ``millwright-host-<MILLWRIGHT_HOST_NAME or the hostname>``; same connection, metrics and shutdown.

Exit codes: 0 after a clean (signal-initiated) shutdown, 1 on a configuration or
connection error (one line on stderr, no traceback), 1 if the worker stops by itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
from datetime import timedelta
from typing import Any

import pydantic
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.envconfig import ClientConfig

from worker import registry
from worker.config import ConfigError, WorkerSettings
from worker.telemetry import build_runtime, setup_logging
from worker.version import version

log = logging.getLogger("millwright.worker")

DEFAULT_ADDRESS = "localhost:7233"
DEFAULT_NAMESPACE = "default"


def connect_config() -> dict[str, Any]:
    """Client.connect kwargs from TEMPORAL_* env vars / TOML profile (TEMPORAL_PROFILE)."""
    try:
        config: dict[str, Any] = dict(ClientConfig.load_client_connect_config())
    except Exception as err:
        raise ConfigError(f"bad Temporal client configuration: {err}") from err
    config.setdefault("target_host", DEFAULT_ADDRESS)
    config.setdefault("namespace", DEFAULT_NAMESPACE)
    return config


async def run(settings: WorkerSettings, *, host_agent: bool = False) -> int:  # noqa: C901 (the worker's life in order: settings, registration, connect, signals, run, shutdown)
    config = connect_config()
    address, namespace = config["target_host"], config["namespace"]

    # Everything that can be checked locally is checked before touching the network.
    try:
        # The host agent runs activities only, on its host's own queue: it stays unversioned.
        version = None
        if host_agent:
            registration = registry.build_host_agent(settings.host_name or socket.gethostname(), settings=settings)
        else:
            registration = registry.build(settings)
            # A site's worker, like the host agent, runs activities only, on its site's own queue: unversioned.
            version = None if settings.site else settings.deployment_version()
            if settings.fault_events:
                settings.fault_event_config()
    except ConfigError:
        raise
    except Exception as err:
        raise ConfigError(f"cannot set up workflows/activities: {_one_line(err)}") from err
    workflows, activities = registration.workflows, registration.activities
    task_queue = registration.task_queue or settings.task_queue
    runtime = build_runtime(settings)

    try:
        client = await Client.connect(**config, runtime=runtime, data_converter=pydantic_data_converter)
    except Exception as err:
        raise ConfigError(f"cannot connect to Temporal at {address} (namespace {namespace}): {err}") from err

    worker = registry.new_worker(
        client,
        registration,
        task_queue,
        version=version,
        max_concurrent_activities=settings.max_concurrent_activities,
        graceful_shutdown_timeout=timedelta(seconds=settings.shutdown_grace_seconds),
    )

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    received: list[str] = []

    def on_signal(sig: signal.Signals) -> None:
        if received:
            log.warning("second %s: exiting now without waiting for in-flight activities", sig.name)
            _exit(1)
        received.append(sig.name)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)

    log.info("connected to Temporal at %s, namespace %s", address, namespace)
    role = " (host agent)" if host_agent else f" (site {settings.site})" if settings.site else ""
    log.info("polling task queue %r%s", task_queue, role)
    log.info("worker versioning: %s", f"{version.to_canonical_string()} (deployment {version.deployment_name}, "
             f"build {version.build_id})" if version else "off (unversioned)")  # fmt: skip
    log.info("metrics: %s", settings.metrics_url or "off (MILLWRIGHT_METRICS_PORT=0)")
    if not host_agent:
        for name, state in integrations(settings):
            log.info("%s: %s", name, state)
    log.info(
        "registered %d workflows (%s) and %d activities",
        len(workflows),
        ", ".join(_workflow_name(w) for w in workflows),
        len(activities),
    )

    async with contextlib.AsyncExitStack() as events:
        if settings.fault_events and not host_agent:
            # The runs it starts go to the central queue, also from a site's worker (where the clusters are).
            await events.enter_async_context(fault_event_path(client, settings, settings.task_queue))
        run_task = asyncio.create_task(worker.run())
        stop_task = asyncio.create_task(stop.wait())
        await asyncio.wait({run_task, stop_task}, return_when=asyncio.FIRST_COMPLETED)

    if not stop.is_set():  # the worker ended by itself: a fatal error (e.g. unknown namespace)
        stop_task.cancel()
        failure = run_task.exception()
        if failure is not None:
            raise ConfigError(f"worker stopped: {_one_line(failure)}") from failure
        log.error("worker stopped unexpectedly")
        return 1

    log.info(
        "received %s: no new tasks; waiting up to %gs for in-flight activities to finish",
        received[0],
        settings.shutdown_grace_seconds,
    )
    await worker.shutdown()
    try:
        await run_task
    except Exception as err:  # pragma: no cover - shutdown races
        log.warning("worker ended with %s", _one_line(err))
    try:
        await registration.close()
    except Exception as err:  # pragma: no cover
        log.warning("closing clients: %s", _one_line(err))
    log.info("worker stopped cleanly")
    return 0


@contextlib.asynccontextmanager
async def fault_event_path(client: Client, settings: WorkerSettings, task_queue: str):
    """The event path to remediation (worker/fault_events.py), while the worker polls."""
    from activities.kube.connector import ClusterConnector
    from worker.alert_receiver import event_path
    from worker.fault_events import FaultEvents

    config, token = settings.fault_event_config()
    connector = ClusterConnector(settings.kubeconfig_paths())
    events = FaultEvents(client, connector, task_queue, config, settings.fault_events_clusters)
    log.info("fault events: watching the nodes of %s; hold %s; Alertmanager receiver %s",
             ", ".join(settings.fault_events_clusters), config.hold,
             f"on port {settings.fault_events_port} (token {token})" if token else "off (no MILLWRIGHT_FAULT_EVENTS_TOKEN)")  # fmt: skip
    try:
        async with event_path(events, connector, token, settings.fault_events_host, settings.fault_events_port):
            yield
    finally:
        await connector.close()


def integrations(settings: WorkerSettings) -> list[tuple[str, str]]:
    """What each integration is configured as, one line each (references, never secrets), for the start-up log."""
    lines = [(integration.name, integration.describe(settings)) for integration in registry.integrations_of(settings)]
    return [(name, line) for name, line in lines if line is not None]


def _workflow_name(cls: type) -> str:
    from temporalio.workflow import _Definition

    defn = _Definition.from_class(cls)
    return (defn.name if defn and defn.name else None) or cls.__name__


def _one_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}".rstrip(": ")


def _exit(code: int) -> None:
    """Flush and leave without interpreter finalization (temporalio/sdk-python#300)."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


USAGE = "usage: millwright-worker [--host-agent] [--help] [--version]"


def usage() -> str:
    """--help: what the worker does and every setting it reads (worker/config.py), one line each."""
    lines = [USAGE, "", (__doc__ or "").strip(), "", "Settings (environment variables; Temporal's own: TEMPORAL_*):"]
    for name, field in WorkerSettings.model_fields.items():
        lines.append(f"  MILLWRIGHT_{name.upper()}: {field.description or ''}".rstrip())
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    code = 1
    try:
        args = list(sys.argv[1:] if argv is None else argv)
        if args and args[0] in ("--help", "-h", "--version"):
            print(usage() if args[0] != "--version" else f"millwright-worker {version()}")
            _exit(0)
        if args not in ([], ["--host-agent"]):
            raise ConfigError(f"unknown arguments: {' '.join(args)} ({USAGE})")
        try:
            settings = WorkerSettings()
        except pydantic.ValidationError as err:
            raise ConfigError(
                "bad setting: "
                + "; ".join(f"MILLWRIGHT_{'_'.join(map(str, e['loc'])).upper()}: {e['msg']}" for e in err.errors())
            ) from err
        setup_logging(settings.log_level)
        code = asyncio.run(run(settings, host_agent=args == ["--host-agent"]))
    except ConfigError as err:
        print(f"millwright-worker: error: {err}", file=sys.stderr)
        code = 1
    except KeyboardInterrupt:
        code = 130
    except Exception:
        logging.getLogger("millwright.worker").exception("worker crashed")
        code = 1
    _exit(code)


if __name__ == "__main__":
    main()
