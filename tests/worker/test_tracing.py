"""Tracing on: a worker built with MILLWRIGHT_OTLP_ENDPOINT exports its workflow's and activities' spans, each naming
the run, to an OTLP/HTTP receiver (a collector's `/v1/traces`, here a loopback server decoding the protobuf body)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from lab.loopback import LOOPBACK
from workflows.usage.tenant_usage import TenantUsage, TenantUsageInput


async def test_workflow_and_activity_spans_reach_the_collector(client, kubeconfig_path):
    from worker import registry
    from worker.config import WorkerSettings

    spans: list = []
    services: set[str] = set()

    async def traces(request: web.Request) -> web.Response:
        export = ExportTraceServiceRequest.FromString(await request.read())
        for resource_spans in export.resource_spans:
            services.update(a.value.string_value for a in resource_spans.resource.attributes if a.key == "service.name")
            spans.extend(s for scope in resource_spans.scope_spans for s in scope.spans)
        return web.Response(content_type="application/x-protobuf")

    app = web.Application()
    app.router.add_post("/v1/traces", traces)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, LOOPBACK, 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        settings = WorkerSettings(kubeconfig=str(kubeconfig_path), metrics_port=0,
                                  otlp_endpoint=f"http://{LOOPBACK}:{port}")  # fmt: skip
        registration = registry.build(settings)
        end = datetime.now(UTC).replace(microsecond=0)
        inp = TenantUsageInput(cluster="lab", start=end - timedelta(seconds=4), end=end, step=timedelta(seconds=1),
                               page=timedelta(seconds=4), record_in_netbox=False)  # fmt: skip
        try:
            async with registry.new_worker(client, registration, f"tracing-{uuid.uuid4().hex[:8]}") as worker:
                run_id = f"{inp.workflow_id()}-{uuid.uuid4().hex[:6]}"
                await client.execute_workflow(TenantUsage.run, inp, id=run_id, task_queue=worker.task_queue)
        finally:
            await registration.close()  # flushes the spans still queued
    finally:
        await runner.cleanup()

    names = {s.name: s for s in spans}
    assert services == {"millwright-worker"}
    assert {"RunWorkflow:TenantUsage", "RunActivity:read_tenant_quota_objects",
            "RunActivity:write_usage_report"} <= set(names), sorted(names)  # fmt: skip
    # A run started without a trace context (the Web UI, a Schedule) is one trace per call; every span names its run.
    for span in spans:
        attributes = {a.key: a.value.string_value for a in span.attributes}
        assert attributes["temporalWorkflowID"] == run_id, (span.name, attributes)
    start, ran = names["StartActivity:read_tenant_quota_objects"], names["RunActivity:read_tenant_quota_objects"]
    assert ran.trace_id == start.trace_id and ran.parent_span_id == start.span_id
