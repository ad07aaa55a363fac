"""A NodeRemediation standing down for a RackRemediation of its node's whole NVLink domain (the `stand_down` signal,
`StandDown` in workflows/remediation/rack_models.py).

A run that has not cordoned its node yet (starting, waiting for its lease) withdraws its lease request and ends
`stood-down`, touching nothing. A run that has cordoned it ends at its next step boundary (after the drain, between
two steps of the ladder, at an approval it waits for; never in the middle of a power cycle), hands its cordon to the
rack run (`hand_over_cordon`: the node never schedulable in between), returns its lease and ends `stood-down`. No
last-remediation mark and no notification: the rack run remediates the node. Runs started before `PATCH` ignore
the signal.
"""

from __future__ import annotations

from collections.abc import Callable

from temporalio import workflow

from activities.kube.activities import KubeActivities
from activities.kube.models import CordonHandOver, CordonRequest
from workflows.common.call_options import API_CALL
from workflows.common.endpoints import Endpoints, kubernetes_api
from workflows.remediation.models import NodeRemediationStatus
from workflows.remediation.rack_models import StandDown

PATCH = "remediation-stand-down"  # workflow.patched() id, decided at the run's start


class StoodDown(Exception):
    """A step boundary reached after the signal."""

    def __init__(self, order: StandDown) -> None:
        super().__init__(order.by)
        self.order = order


class StandDownOrder:
    """The signal as one run holds it."""

    def __init__(self) -> None:
        self.received: StandDown | None = None
        self.obeyed = False  # PATCH

    def decide(self) -> None:
        """At the run's start: whether this run obeys the signal at all."""
        self.obeyed = workflow.patched(PATCH)

    def receive(self, order: StandDown) -> None:
        self.received = self.received or order

    @property
    def given(self) -> StandDown | None:
        return self.received if self.obeyed else None

    def boundary(self) -> None:
        """Between two steps: end here when told to."""
        if self.given is not None:
            raise StoodDown(self.given)

    async def hand_over(self, calls: Endpoints, cordon: CordonRequest, status: NodeRemediationStatus,
                        enter: Callable[[str, str], None], *, cordoned: bool) -> str:  # fmt: skip
        """Pass the cordon (`cordoned`: the node is cordoned in this run's name) to the rack run; why the run ends."""
        order = self.given
        assert order is not None
        note = f"stood down: {order.by} remediates the node's whole NVLink domain" + (
            f" ({order.reason})" if order.reason else "")  # fmt: skip
        if not cordoned:
            return f"{note}; the node untouched"
        enter("standing-down", f"handing the cordon to {order.by}")
        held = await calls.execute(
            KubeActivities.hand_over_cordon, CordonHandOver(**cordon.model_dump(), to=order.by), **API_CALL,
            endpoint=kubernetes_api(cordon.cluster), summary=f"hand {cordon.node}'s cordon to {order.by}")  # fmt: skip
        status.cordoned_by_us = not held.owned
        return f"{note}; its cordon handed over" if held.owned else \
            f"{note}; the cordon is {held.holder or 'no one'}'s, left as it is"  # fmt: skip
