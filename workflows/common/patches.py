"""Patches a run decides before a local activity, not in the activation that hands back the activity's result.

Where code that decides a patch for the first time would run right after a local activity returned (a lease
asked for after the cluster's validation default was read, a step after a lease was handed back), a replay may
answer differently from the run that wrote the history (worker/patch_placement.py). `decide_early(...)`, called
before that local activity, decides them there instead, in runs started since its own patch (`EARLY_PATCHES`);
runs from before decide them where they always did, as their histories hold. The cost: two history events
(the marker and the SDK's `TemporalChangeVersion` upsert) for `EARLY_PATCHES` and for each patch decided early
that the run would not have reached.
"""

from __future__ import annotations

from temporalio import workflow

EARLY_PATCHES = "patches-decided-early"  # workflow.patched() id: `decide_early` decides before the local activity


def decide_early(*patch_ids: str) -> None:
    """Decide `patch_ids` now (each later `workflow.patched` of them answers the same), in runs that know this."""
    if workflow.patched(EARLY_PATCHES):
        for patch_id in patch_ids:
            workflow.patched(patch_id)
