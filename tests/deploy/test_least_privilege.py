"""Least privilege from evidence: the worker's RBAC grants what its activities were seen to do, and no more.

Evidence: every request the Kubernetes emulators of this session served (lab/k8s/evidence.py; gathered
by tests/deploy/conftest.py, which runs this module after every other test). Only the worker's own
requests count: the activities' clients send User-Agent `millwright-worker` (activities/kube/connector.py
USER_AGENT, also used by activities/capi/client.py); the lab's controllers (`lab-controller/...`), kubectl and
the tests' own clients (`OpenAPI-Generator/...`) send others, and the `/_lab` admin API is not audited.

(a) Every observed (verb, group, resource[/subresource]) is granted by the ClusterRole
    `millwright-worker`, by the jobs Role in its namespace, or — discovery only — by Kubernetes'
    built-in `system:discovery` ClusterRole, which every authenticated identity has.
(b) Every grant of those roles was used, except rules whose comment in deploy/base/rbac.yaml
    contains `justified:` (listed in the terminal summary). Only with complete evidence: the whole
    suite collected, nothing deselected, no earlier failure; otherwise this test skips, saying why.
The host agent uses no Kubernetes API at all: no request from it, no token, no binding.
"""

from __future__ import annotations

import fnmatch
import re
from typing import Any, NamedTuple

import pytest
import yaml

from activities.kube.connector import USER_AGENT
from activities.kube.models import JOB_NAMESPACE
from lab.k8s.evidence import collect
from tests.deploy.manifests import DEPLOY, one, render

# Under pytest-xdist the evidence fixture first waits for the suite's other processes (tests/deploy/conftest.py)
pytestmark = pytest.mark.timeout(1500)
HOST_AGENT_USER_AGENT = "millwright-host-agent"
HOST_AGENT = "millwright-host-agent"  # its ServiceAccount and DaemonSet
# Kubernetes' bootstrap `system:discovery` ClusterRole (bound to system:authenticated).
SYSTEM_DISCOVERY = {
    "nonResourceURLs": [
        "/api",
        "/api/*",
        "/apis",
        "/apis/*",
        "/healthz",
        "/livez",
        "/openapi",
        "/openapi/*",
        "/readyz",
        "/version",
        "/version/",
    ],
    "verbs": ["get"],
}


class Request(NamedTuple):
    verb: str
    group: str
    resource: str
    subresource: str
    namespace: str
    path: str  # non-resource requests (discovery) only

    def __str__(self) -> str:
        if self.path:
            return f"{self.verb} {self.path}"
        target = self.resource + (f"/{self.subresource}" if self.subresource else "")
        where = f" in namespace {self.namespace}" if self.namespace else " (cluster scope)"
        return f"{self.verb} {self.group or 'core'}/{target}{where}"


# ---------------------------------------------------------------- evidence


def observed(emulators: list[dict[str, Any]], agent: str) -> set[Request]:
    return {
        Request(*(r[f] for f in Request._fields))
        for e in emulators
        for r in e["requests"]
        if r["userAgent"].startswith(agent) and r["verb"]
    }


@pytest.fixture(scope="module")
def emulators(request) -> list[dict[str, Any]]:
    ev = request.getfixturevalue("k8s_evidence")
    return collect(ev.directory)


# ---------------------------------------------------------------- RBAC rules


def justifications(text: str) -> dict[tuple[str, str], list[str | None]]:
    """(kind, name) -> per rule, the text after `justified:` in the comment right above it, or None."""
    out = {}
    for chunk in re.split(r"^---\s*$", text, flags=re.M):
        obj = yaml.safe_load(chunk)
        if not isinstance(obj, dict) or "rules" not in obj:
            continue
        lines = chunk.splitlines()
        start = next(i for i, line in enumerate(lines) if re.match(r"^rules:\s*$", line))
        first_rule = next(line for line in lines[start + 1 :] if line.strip().startswith("-"))
        indent = first_rule[: len(first_rule) - len(first_rule.lstrip())]
        found: list[str | None] = []
        for i in range(start + 1, len(lines)):
            if not lines[i].startswith(f"{indent}- "):
                continue
            j = i - 1
            comment: list[str] = []
            while j > start and lines[j].strip().startswith("#"):
                comment.insert(0, lines[j].strip().lstrip("#").strip())
                j -= 1
            text_ = " ".join(comment)
            found.append(text_.split("justified:", 1)[1].strip() if "justified:" in text_ else None)
        assert len(found) == len(obj["rules"]), f"cannot pair the comments of {obj['kind']} {obj['metadata']['name']}"
        out[(obj["kind"], obj["metadata"]["name"])] = found
    return out


def url_matches(pattern: str, path: str) -> bool:
    return path == pattern or (pattern.endswith("*") and path.startswith(pattern[:-1]))


def allows(rule: dict[str, Any], req: Request) -> bool:
    verbs = rule.get("verbs") or []
    if req.verb not in verbs and "*" not in verbs:
        return False
    if req.path:
        return any(url_matches(p, req.path) for p in rule.get("nonResourceURLs") or [])
    if "nonResourceURLs" in rule or rule.get("resourceNames"):
        return False  # the evidence has no object names: a resourceNames rule proves nothing (justify it)
    groups, resources = rule.get("apiGroups") or [], rule.get("resources") or []
    target = req.resource + (f"/{req.subresource}" if req.subresource else "")
    return (req.group in groups or "*" in groups) and (
        target in resources or "*" in resources or (req.subresource != "" and f"*/{req.subresource}" in resources)
    )


def grants(rule: dict[str, Any]) -> list[tuple[dict[str, Any], str]]:
    """A rule split into one-verb, one-group, one-resource (or one-URL) grants, each with how to name it."""
    out = []
    for verb in rule["verbs"]:
        for url in rule.get("nonResourceURLs") or []:
            out.append(({"verbs": [verb], "nonResourceURLs": [url]}, f"{verb} {url}"))
        for group in rule.get("apiGroups") or []:
            for res in rule.get("resources") or []:
                names = f" {rule['resourceNames']}" if rule.get("resourceNames") else ""
                atom = {"verbs": [verb], "apiGroups": [group], "resources": [res]}
                out.append((atom, f"{verb} {group or 'core'}/{res}{names}"))
    return out


class Roles(NamedTuple):
    cluster: list[dict[str, Any]]
    cluster_why: list[str | None]
    jobs: list[dict[str, Any]]
    jobs_why: list[str | None]
    jobs_namespace: str


@pytest.fixture(scope="module")
def roles() -> Roles:
    objs = render("base")
    why = justifications((DEPLOY / "base" / "rbac.yaml").read_text())
    source = {
        (o["kind"], o["metadata"]["name"]): o for o in yaml.safe_load_all((DEPLOY / "base" / "rbac.yaml").read_text())
    }
    cluster = one(objs, "ClusterRole", "millwright-worker")
    jobs = one(objs, "Role", "millwright-jobs")
    for obj in (cluster, jobs):
        assert obj["rules"] == source[(obj["kind"], obj["metadata"]["name"])]["rules"], "rules changed by Kustomize"
    return Roles(
        cluster["rules"],
        why[("ClusterRole", "millwright-worker")],
        jobs["rules"],
        why[("Role", "millwright-jobs")],
        jobs["metadata"]["namespace"],
    )


# ---------------------------------------------------------------- the checks (run last: see conftest.py)


def granted(roles: Roles, req: Request) -> bool:
    if any(allows(r, req) for r in roles.cluster) or (req.path and allows(SYSTEM_DISCOVERY, req)):
        return True
    return req.namespace == roles.jobs_namespace and any(allows(r, req) for r in roles.jobs)


def test_rbac_grants_every_request_the_worker_made(emulators, roles, k8s_evidence, request):
    assert roles.jobs_namespace == JOB_NAMESPACE
    seen = observed(emulators, USER_AGENT)
    partial = k8s_evidence.partial_reasons(request.config.rootpath)
    k8s_evidence.summary.append(
        f"evidence: {len(seen)} kinds of request by {USER_AGENT} from {len(emulators)} emulator processes; "
        + (f"PARTIAL ({'; '.join(partial)}): only 'every request is granted' is checked" if partial else "complete")
    )
    missing = sorted(str(r) for r in seen if not granted(roles, r))
    assert not missing, (
        "the worker's activities made requests deploy/base/rbac.yaml does not grant (add a rule, commented with "
        "the activity that needs it):\n  " + "\n  ".join(missing)
    )


def unused(
    rules: list[dict[str, Any]], why: list[str | None], seen: set[Request], role: str, justified: list[str]
) -> list[str]:
    extra = []
    for rule, reason in zip(rules, why):
        if reason is not None:
            justified.append(f"{role}: {'; '.join(name for _, name in grants(rule))} — {reason}")
            continue
        for atom, name in grants(rule):
            wildcard = "*" in atom["verbs"] + atom.get("apiGroups", []) + atom.get("resources", [])
            if wildcard or atom.get("nonResourceURLs", [""])[0].endswith("*"):
                extra.append(f"{role}: {name} (a wildcard is wider than any evidence)")
            elif rule.get("resourceNames"):
                extra.append(f"{role}: {name} (resourceNames: the evidence has no object names)")
            elif not any(allows(atom, r) for r in seen):
                extra.append(f"{role}: {name}")
    return extra


def test_rbac_grants_nothing_the_worker_did_not_use(emulators, roles, k8s_evidence, request):
    partial = k8s_evidence.partial_reasons(request.config.rootpath)
    if partial:
        pytest.skip(f"partial evidence ({'; '.join(partial)}): unused grants are only checked over the whole suite")
    seen = observed(emulators, USER_AGENT)
    justified: list[str] = []
    extra = unused(roles.cluster, roles.cluster_why, seen, "ClusterRole millwright-worker", justified)
    extra += unused(
        roles.jobs,
        roles.jobs_why,
        {r for r in seen if r.namespace == roles.jobs_namespace},
        f"Role {roles.jobs_namespace}/millwright-jobs",
        justified,
    )
    k8s_evidence.summary += ["justified grants (used by no test, kept for the reason given):"] + [
        f"  {line}" for line in justified
    ]
    assert not extra, (
        "deploy/base/rbac.yaml grants what no activity used in the whole suite (remove it, or keep it with a "
        "`# justified: <why>` comment right above its rule):\n  " + "\n  ".join(extra)
    )


def test_host_agent_needs_no_kubernetes_api(emulators):
    """The host agent talks to Temporal and NVML only: no request, no token mounted, no binding."""
    assert not observed(emulators, HOST_AGENT_USER_AGENT)
    objs = render("base")
    sa = one(objs, "ServiceAccount", HOST_AGENT)
    pod = one(objs, "DaemonSet", HOST_AGENT)["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == HOST_AGENT
    assert sa["automountServiceAccountToken"] is False and pod["automountServiceAccountToken"] is False
    bound = [
        f"{o['kind']} {o['metadata']['name']}"
        for o in objs
        if o["kind"] in ("RoleBinding", "ClusterRoleBinding")
        and any(s.get("name") == HOST_AGENT for s in o.get("subjects") or [])
    ]
    assert bound == []
    assert not fnmatch.filter([o["kind"] for o in objs if o["metadata"]["name"].startswith(HOST_AGENT)], "*Role")
