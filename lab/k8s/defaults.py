"""Defaulting on create, as the real registry strategies do: what a new object gets before it is stored."""

from __future__ import annotations

import random

from .resources import ResourceType
from .store import CRDS, NAMESPACES, NODES, PODS
from .util import clone, now_rfc3339

# non-omitempty status fields of built-ins (the typed Python client requires them)
INITIAL_STATUS = {
    ("apps", "replicasets"): {"replicas": 0},
    ("apps", "statefulsets"): {"replicas": 0, "availableReplicas": 0},
    ("apps", "daemonsets"): {
        "currentNumberScheduled": 0,
        "numberMisscheduled": 0,
        "desiredNumberScheduled": 0,
        "numberReady": 0,
    },
    ("policy", "poddisruptionbudgets"): {
        "disruptionsAllowed": 0,
        "currentHealthy": 0,
        "desiredHealthy": 0,
        "expectedPods": 0,
    },
}


def prepare_create(rt: ResourceType, obj: dict) -> None:
    """Defaulting and status reset as the real registry strategies do."""
    md = obj["metadata"]
    for k in ("deletionTimestamp", "deletionGracePeriodSeconds", "resourceVersion", "managedFields", "selfLink"):
        md.pop(k, None)
    if rt.key == PODS:
        spec = obj.setdefault("spec", {})
        spec.setdefault("restartPolicy", "Always")
        spec.setdefault("terminationGracePeriodSeconds", 30)
        spec.setdefault("dnsPolicy", "ClusterFirst")
        spec.setdefault("schedulerName", "default-scheduler")
        spec.setdefault("serviceAccountName", "default")
        spec.setdefault("enableServiceLinks", True)
        spec.setdefault("priority", 0)
        for c in spec.get("containers") or []:
            c.setdefault("terminationMessagePath", "/dev/termination-log")
            c.setdefault("terminationMessagePolicy", "File")
            c.setdefault("imagePullPolicy", "IfNotPresent")
            c.setdefault("resources", {})
        obj["status"] = {"phase": "Pending", "qosClass": "BestEffort"}
    elif rt.key == NODES:
        obj.setdefault("status", {})
    elif rt.key == NAMESPACES:
        obj["status"] = {"phase": "Active"}
    elif rt.key == CRDS:
        spec = obj["spec"]
        obj["status"] = {
            "acceptedNames": spec.get("names"),
            "storedVersions": [v["name"] for v in spec.get("versions") or [] if v.get("storage")]
            or [spec["versions"][0]["name"]],
            "conditions": [
                {
                    "type": "NamesAccepted",
                    "status": "True",
                    "reason": "NoConflicts",
                    "message": "no conflicts found",
                    "lastTransitionTime": now_rfc3339(),
                },
                {
                    "type": "Established",
                    "status": "True",
                    "reason": "InitialNamesAccepted",
                    "message": "the initial names have been accepted",
                    "lastTransitionTime": now_rfc3339(),
                },
            ],
        }
    elif rt.key == ("", "services"):
        spec = obj.setdefault("spec", {})
        spec.setdefault("type", "ClusterIP")
        if "clusterIP" not in spec:
            spec["clusterIP"] = f"10.96.{random.randint(0, 255)}.{random.randint(1, 254)}"
            spec["clusterIPs"] = [spec["clusterIP"]]
        obj["status"] = {"loadBalancer": {}}
    elif rt.status:
        obj.pop("status", None)
        if rt.builtin:
            obj["status"] = clone(INITIAL_STATUS.get(rt.key, {}))
    if rt.key == ("apps", "replicasets"):
        obj["spec"].setdefault("replicas", 1)


def default_job(job: dict) -> None:
    """batch/v1 Job defaulting as the API server does (selector and template labels from the uid)."""
    md, spec = job["metadata"], job.setdefault("spec", {})
    uid, name = md["uid"], md["name"]
    spec.setdefault("backoffLimit", 6)
    spec.setdefault("completions", 1)
    spec.setdefault("parallelism", 1)
    spec.setdefault("completionMode", "NonIndexed")
    spec.setdefault("suspend", False)
    spec.setdefault("podReplacementPolicy", "TerminatingOrFailed")
    if not spec.get("manualSelector"):
        spec["selector"] = {"matchLabels": {"batch.kubernetes.io/controller-uid": uid}}
        tmd = spec.setdefault("template", {}).setdefault("metadata", {})
        tmd.setdefault("labels", {}).update(
            {
                "batch.kubernetes.io/controller-uid": uid,
                "batch.kubernetes.io/job-name": name,
                "controller-uid": uid,
                "job-name": name,
            }
        )
