"""A stand-in for RackRemediation, registered by its name in its place: it records the input it was started with and
runs until the test terminates it, so the escalation tests see exactly what the sweep or the event path started. Its
own module, so the sandbox imports it without a test module's imports."""

from __future__ import annotations

from temporalio import workflow

from workflows.remediation.rack_models import RackRemediationInput


@workflow.defn(name="RackRemediation")
class RackStandIn:
    def __init__(self) -> None:
        self._inp: RackRemediationInput | None = None

    @workflow.run
    async def run(self, inp: RackRemediationInput) -> None:
        self._inp = inp
        await workflow.wait_condition(lambda: False)  # a rack run that is running while the test looks

    @workflow.query
    def started_with(self) -> RackRemediationInput | None:
        return self._inp
