"""How long each kind of activity call may take and how it is retried, shared by every family.

Each is a dict of `workflow.execute_activity*` arguments (`Endpoints.execute` takes the same, with `endpoint`)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio.common import RetryPolicy

from workflows.common.endpoints import NETBOX

# Kubernetes calls are cheap and idempotent: retry them until the caller's deadline,
# backing off to a ceiling so an API outage does not flood the history.
API_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1), backoff_coefficient=2.0, maximum_interval=timedelta(seconds=30)
)
# A short start-to-close bounds how long a call lost with a crashed worker waits to be retried.
API_CALL: dict[str, Any] = dict(start_to_close_timeout=timedelta(seconds=15), retry_policy=API_RETRY)
# Kubernetes calls that wait (a cluster applied and settling, a namespace's workloads), heartbeating meanwhile.
LONG_CALL: dict[str, Any] = dict(
    start_to_close_timeout=timedelta(minutes=10), heartbeat_timeout=timedelta(seconds=30), retry_policy=API_RETRY
)

# A BMC that stops answering for a while (a reset, a firmware hiccup, a flaky switch) is waited out with
# backoff, visibly, for the input's retry_timeout per call (workflows.common.endpoints); a bad answer (auth, a value
# it does not offer) is not retried.
BMC_RETRY = RetryPolicy(initial_interval=timedelta(seconds=1), backoff_coefficient=2.0,
                        maximum_interval=timedelta(seconds=30))  # fmt: skip
BMC_CALL: dict[str, Any] = dict(start_to_close_timeout=timedelta(seconds=60), retry_policy=BMC_RETRY)
# A server's NetBox record (burn-in and remediation): waited out like a BMC, under the NETBOX endpoint.
NETBOX_CALL: dict[str, Any] = dict(
    endpoint=NETBOX, start_to_close_timeout=timedelta(seconds=60), retry_policy=BMC_RETRY
)
# The host agent on the server itself: a few tries, then the caller decides (the agent may not be up yet).
AGENT_RETRY = RetryPolicy(initial_interval=timedelta(seconds=2), maximum_interval=timedelta(seconds=30),
                          maximum_attempts=5)  # fmt: skip
# Its GPU check heartbeats while NVML answers and its stress window every tick: an agent that died with its host (a
# power cycle, a crash) after taking one is noticed this fast and the call tried again, not at its start-to-close.
AGENT_HEARTBEAT = timedelta(seconds=30)
