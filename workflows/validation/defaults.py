"""The cluster's validation default: what a run validates a node with when its input gives no `validation`.

The operator declares it once per cluster, in the ConfigMap `millwright-validation` of the `millwright-system`
namespace (key `validation`, the settings as YAML or JSON; docs/validation.md says why there). A run reads it by an
activity, so its history holds what it read and a replay agrees whatever the ConfigMap says by then. An input's own
`validation` wins, `enabled: false` included. A ConfigMap the settings' model refuses fails the run before it
changes anything, naming the field: a bad default never silently disables validation.

History events: the caller's `workflow.patched` marker and its search attribute 2, the read 1 (a local activity's
marker); none when the input has its own `validation`.
"""

from __future__ import annotations

from pydantic import ValidationError
from temporalio import workflow
from temporalio.exceptions import ApplicationError

from activities.kube.activities import KubeActivities
from activities.kube.models import VALIDATION_DEFAULT_KEY, ClusterDefaultRequest
from workflows.common.call_options import API_CALL
from workflows.rollout.spec.spec import describe_errors
from workflows.validation.models import ValidationSettings


async def validation_for(cluster: str, given: ValidationSettings | None, patch: str) -> ValidationSettings | None:
    """`given` when the input has it; else, in runs that know the default (`patch`, the caller's own id), the
    cluster's default, or None when the cluster declares none."""
    if given is not None or not workflow.patched(patch):
        return given
    found = await workflow.execute_local_activity_method(
        KubeActivities.read_validation_default, ClusterDefaultRequest(cluster=cluster), **API_CALL,
        summary=f"read {cluster}'s validation default",
    )  # fmt: skip
    if not found.found:
        return None
    try:
        return ValidationSettings.model_validate(found.settings)
    except ValidationError as err:
        fields = "; ".join(f"{VALIDATION_DEFAULT_KEY}.{line}" for line in describe_errors(err))
        raise ApplicationError(f"{found.source}: the cluster's validation default is refused: {fields}",
                               type="InvalidValidationDefault", non_retryable=True) from err  # fmt: skip
