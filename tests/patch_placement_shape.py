"""One workflow type deciding a patch around a local activity, two ways: right after the activity returns (a run
that may not replay, worker/patch_placement.py), and before it, with `decide_early` (workflows/common/patches.py).
Test-only (tests/worker/test_patch_placement.py); in a module of its own so that the sandbox imports nothing else."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow

from workflows.common.patches import decide_early

PATCH = "cordon-after-reading-the-setting"
TIMEOUT = timedelta(seconds=10)


@workflow.defn(name="DecidedAfter")
class DecidedAfter:
    """An activity, a local activity reading a setting, then a patch first decided: the activation that hands
    back the setting decides it. The run ends there, so that it needs no replay to finish."""

    @workflow.query
    def phase(self) -> str:
        return "running"

    @workflow.run
    async def run(self) -> bool:
        await workflow.execute_activity("inspect_node", start_to_close_timeout=TIMEOUT)
        await workflow.execute_local_activity("read_setting", start_to_close_timeout=TIMEOUT)
        return workflow.patched(PATCH)


@workflow.defn(name="DecidedEarly")
class DecidedEarly(DecidedAfter):
    """The patch decided before the local activity, and an activity after it (a workflow task to replay)."""

    @workflow.run
    async def run(self) -> bool:
        await workflow.execute_activity("inspect_node", start_to_close_timeout=TIMEOUT)
        decide_early(PATCH)
        await workflow.execute_local_activity("read_setting", start_to_close_timeout=TIMEOUT)
        cordoned = workflow.patched(PATCH)
        if cordoned:
            await workflow.execute_activity("inspect_node", start_to_close_timeout=TIMEOUT)
        return cordoned
