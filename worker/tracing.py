"""Optional OpenTelemetry tracing: with MILLWRIGHT_OTLP_ENDPOINT set, the worker exports a span per workflow run,
activity attempt, signal, query and update through the Temporal SDK's tracing interceptor, over OTLP/HTTP to the
endpoint's `/v1/traces` (a collector: Jaeger, Tempo, the OpenTelemetry Collector). Off by default: nothing is
imported or exported without it."""

from __future__ import annotations

import asyncio
from typing import Any

from worker.config import ConfigError, WorkerSettings
from worker.version import version

SERVICE_NAME = "millwright-worker"


class Tracing:
    """The worker's tracing interceptors (none without an endpoint); `close()` sends the spans still queued (bounded
    by the exporter's timeout) and is called with the registration's other resources."""

    def __init__(self, settings: WorkerSettings) -> None:
        self.interceptors: list[Any] = []
        self._provider: Any = None
        if not settings.otlp_endpoint:
            return
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
            from temporalio.contrib.opentelemetry import TracingInterceptor
        except ImportError as err:
            raise ConfigError(f"MILLWRIGHT_OTLP_ENDPOINT is set but OpenTelemetry is not installed ({err}): install "
                              "millwright[tracing]") from None  # fmt: skip
        resource = Resource.create({"service.name": SERVICE_NAME, "service.version": version()})
        self._provider = TracerProvider(resource=resource)
        exporter = OTLPSpanExporter(endpoint=f"{str(settings.otlp_endpoint).rstrip('/')}/v1/traces", timeout=10)
        self._provider.add_span_processor(BatchSpanProcessor(exporter))
        # Runs started from the Web UI or a Schedule carry no parent span: their workflow spans are made all the same.
        tracer = self._provider.get_tracer("millwright")
        self.interceptors = [TracingInterceptor(tracer, always_create_workflow_spans=True)]

    async def close(self) -> None:
        if self._provider is not None:
            await asyncio.to_thread(self._provider.shutdown)  # flushes the batch, off the event loop
