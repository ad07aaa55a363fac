"""What CreateCluster and DeleteCluster may write or delete, from who owns what already exists: checked before the
first write, so a refusal leaves nothing to undo.

A cluster's workflows adopt nothing: an existing object of the cluster's name that another workflow or a person
owns is refused, naming the input field its name comes from, the object and its owner. Namespaces are shared: the
one a person made, or another cluster's, holds a new cluster; a tenant's, or Kubernetes' and Millwright's own
(refused at the edge: `SYSTEM_NAMESPACES`), never does.
"""

from __future__ import annotations

from collections.abc import Callable

from activities.capi.models import ExistingObject, ObjectRef
from activities.capi.ownership import Ownership
from activities.kube.models import JOB_NAMESPACE

SYSTEM_NAMESPACES = frozenset({"kube-system", "kube-public", "kube-node-lease", JOB_NAMESPACE})
CLUSTER_WORKFLOWS = "cluster/"  # the prefix of every cluster's workflow ID (workflows/clusters/models.py)


def validate_cluster_namespace(value: str) -> str:
    if value in SYSTEM_NAMESPACES:
        raise ValueError(f"{value} is a system namespace (Kubernetes' or Millwright's own); use one of your own")
    return value


def not_ours(
    existing: list[ExistingObject], workflow_id: str, cluster: str, field_of: Callable[[ObjectRef], str]
) -> list[str]:
    """Each existing object the cluster's workflow (`workflow_id`) may not write or delete, as `field: object in
    cluster, whose`; empty when all are its own or shareable."""
    mine = Ownership(workflow=workflow_id)
    refused = []
    for e in existing:
        own = e.owner
        if own is not None and own.workflow == workflow_id:
            continue
        if e.ref.kind == "Namespace" and (own is None or own.workflow.startswith(CLUSTER_WORKFLOWS)):
            continue
        refused.append(f"{field_of(e.ref)}: {e.ref} exists in cluster {cluster}, {mine.whose(own)}")
    return refused
