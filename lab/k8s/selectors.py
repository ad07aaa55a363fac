"""Label and field selectors (string syntax and LabelSelector objects).

Label selectors share the product's parser, so the emulator and Millwright agree on
exactly one grammar.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from activities.support.selectors import SelectorError, requirements_of, selector_matches
from activities.support.selectors import parse_label_selector as parse_requirements


def parse_label_selector(s: str | None) -> Callable[[dict], bool]:
    """Full label-selector syntax: =, ==, !=, in, notin, key, !key (parsed as the product parses it)."""
    requirements = parse_requirements(s or "")
    return lambda labels: selector_matches(requirements, labels)


def selector_obj_empty(sel: dict | None) -> bool:
    return not sel or (not sel.get("matchLabels") and not sel.get("matchExpressions"))


def match_selector_obj(sel: dict | None, labels: dict | None) -> bool:
    """metav1.LabelSelector matching. An empty selector matches everything (callers decide)."""
    return selector_matches(requirements_of(sel), labels)


# ---------------------------------------------------------------- field selectors
POD_FIELDS = {
    "spec.nodeName",
    "spec.restartPolicy",
    "spec.schedulerName",
    "spec.serviceAccountName",
    "spec.hostNetwork",
    "status.phase",
    "status.podIP",
    "status.podIPs",
    "status.nominatedNodeName",
}
EXTRA_FIELDS: dict[tuple[str, str], set[str]] = {
    ("", "pods"): POD_FIELDS,
    ("", "nodes"): {"spec.unschedulable"},
    ("", "namespaces"): {"status.phase"},
    ("", "secrets"): {"type"},
    ("", "events"): {
        "involvedObject.kind",
        "involvedObject.namespace",
        "involvedObject.name",
        "involvedObject.uid",
        "involvedObject.apiVersion",
        "involvedObject.resourceVersion",
        "involvedObject.fieldPath",
        "reason",
        "reportingComponent",
        "source",
        "type",
    },
    ("apps", "replicasets"): {"status.replicas"},
    ("batch", "v1"): {"status.successful"},
    ("batch", "jobs"): {"status.successful"},
    ("resource.k8s.io", "resourceslices"): {"spec.nodeName", "spec.driver"},
}


def _field_value(obj: dict, path: str) -> str:
    if path == "status.podIPs":
        ips = (obj.get("status") or {}).get("podIPs") or []
        return ips[0].get("ip", "") if ips else ""
    if path == "source":
        src = obj.get("source") or {}
        return src.get("component", "")
    cur: Any = obj
    for p in path.split("."):
        if not isinstance(cur, dict):
            return ""
        cur = cur.get(p)
    if cur is None:
        if path in ("spec.hostNetwork", "spec.unschedulable"):
            return "false"
        return ""
    if isinstance(cur, bool):
        return "true" if cur else "false"
    return str(cur)


def parse_field_selector(s: str | None, key: tuple[str, str]) -> Callable[[dict], bool]:
    if not s or not s.strip():
        return lambda obj: True
    allowed = {"metadata.name", "metadata.namespace"} | EXTRA_FIELDS.get(key, set())
    reqs = []
    for part in s.split(","):
        part = part.strip()
        if not part:
            continue
        m = re.match(r"^([A-Za-z0-9_.]+)\s*(==|!=|=)\s*(.*)$", part)
        if not m:
            raise SelectorError(f"invalid selector: '{s}'; can't understand '{part}'")
        f, op, v = m.group(1), m.group(2), m.group(3)
        if f not in allowed:
            raise SelectorError(f"field label not supported: {f}")
        reqs.append((f, op != "!=", v))

    def match(obj: dict) -> bool:
        return all((_field_value(obj, f) == v) == eq for f, eq, v in reqs)

    return match


def node_name_selector(s: str | None) -> str | None:
    """The node of a `spec.nodeName=X` (or `==`) term in a field selector, for the pods-by-node index."""
    for part in (s or "").split(","):
        m = re.match(r"^\s*spec\.nodeName\s*(==|=)\s*(.*?)\s*$", part)
        if m:
            return m.group(2)
    return None
