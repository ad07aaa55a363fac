"""Logging and the process-wide Temporal Runtime (Prometheus metrics)."""

from __future__ import annotations

import logging
import sys

from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig

from worker.config import ConfigError, WorkerSettings


def setup_logging(level: str = "INFO") -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def build_runtime(settings: WorkerSettings) -> Runtime:
    """One Runtime per process; it serves /metrics when a metrics port is set."""
    if not settings.metrics_address:
        return Runtime(telemetry=TelemetryConfig())
    try:
        return Runtime(telemetry=TelemetryConfig(metrics=PrometheusConfig(bind_address=settings.metrics_address)))
    except Exception as err:  # e.g. port in use
        raise ConfigError(f"cannot serve metrics on {settings.metrics_address}: {err}") from err
