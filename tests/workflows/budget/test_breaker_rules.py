"""The remediation circuit breaker's rules (workflows/budget/breaker.py `Breaker`), without a server: within its
window remediation never takes more than its share of the cluster, a tripped breaker refuses everything until an
operator's reset, and what left the window no longer counts."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from workflows.budget.breaker import Breaker, BreakerReset, BreakerSettings

T0 = datetime(2026, 12, 2, tzinfo=UTC)
WINDOW = timedelta(minutes=5)


def settings(percent: int) -> BreakerSettings:
    return BreakerSettings(max_percent=percent, window=WINDOW)


def test_the_node_past_the_share_trips_it_and_every_later_request_is_refused_until_the_reset():
    breaker = Breaker()
    assert breaker.admit("a", "r/a", 4, settings(50), T0) is None
    assert breaker.admit("b", "r/b", 4, settings(50), T0) is None
    refused = breaker.admit("c", "r/c", 4, settings(50), T0)
    assert refused is not None and "took 2 of 4 nodes" in refused and breaker.tripped and breaker.trips == 1
    assert breaker.admit("d", "r/d", 100, settings(50), T0 + timedelta(hours=1)) == refused  # tripped stays tripped
    assert breaker.refused == 2
    breaker.clear(BreakerReset(by="alice", reason="bad driver rolled back"), T0 + timedelta(hours=1))
    assert not breaker.tripped and breaker.taken == [] and "alice" in breaker.reset
    assert breaker.admit("c", "r/c", 4, settings(50), T0 + timedelta(hours=1)) is None


def test_a_node_taken_again_counts_once_and_what_left_the_window_counts_no_more():
    breaker = Breaker()
    assert breaker.admit("a", "r/a", 2, settings(50), T0) is None
    assert breaker.admit("a", "r/a2", 2, settings(50), T0 + timedelta(minutes=1)) is None  # the same node
    assert breaker.admit("b", "r/b", 2, settings(50), T0 + timedelta(minutes=2)) is not None
    later = Breaker()
    assert later.admit("a", "r/a", 2, settings(50), T0) is None
    assert later.admit("b", "r/b", 2, settings(50), T0 + WINDOW) is None  # a's remediation left the window


@given(
    total=st.integers(1, 40),
    percent=st.integers(1, 100),
    asks=st.lists(st.tuples(st.integers(0, 59), st.integers(0, 600)), max_size=60),
)
def test_within_any_window_remediation_never_takes_more_than_its_share(total, percent, asks):
    breaker = Breaker()
    admitted: list[tuple[datetime, int]] = []
    for node, seconds in sorted(asks, key=lambda a: a[1]):
        now = T0 + timedelta(seconds=seconds)
        if breaker.admit(f"n{node}", f"r/{node}", total, settings(percent), now) is None:
            admitted.append((now, node))
            recent = {n for at, n in admitted if now - at < WINDOW}
            assert len(recent) * 100 <= percent * total
    if breaker.tripped:
        assert breaker.admit("late", "r/late", total, settings(percent), T0 + timedelta(days=1)) is not None
