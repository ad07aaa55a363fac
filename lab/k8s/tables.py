"""Server-side `Table` output (`Accept: application/json;as=Table;v=v1;g=meta.k8s.io`), what `kubectl get` prints.

Built-in kinds get the columns and cells of the real printers (kubernetes/kubernetes
pkg/printers/internalversion/printers.go); like the real server, every row carries the wide (priority 1) cells
too, and kubectl drops them without `-o wide`. Kinds the real server has no printer for get its default
NAME / CREATED AT table. Custom resources get their CRD version's `additionalPrinterColumns` (JSONPath) after NAME,
or AGE when there are none, as the apiextensions server prints them.

Longer than 600 lines because most of it is the per-kind columns and cells, one short function per kind as
printers.go has them, around one `table` entry point; they change together with kubectl's expectations.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from . import schemas

if TYPE_CHECKING:
    from .resources import ResourceType
    from .store import Store

TABLE_GROUP = "meta.k8s.io"


def wanted_version(accept: str | None) -> str | None:
    """The meta.k8s.io Table version the client asks for first, or None when it does not ask for a Table."""
    for part in (accept or "").split(","):
        fields = [f.strip() for f in part.split(";")]
        params = dict(f.split("=", 1) for f in fields[1:] if "=" in f)
        if params.get("as") == "Table" and params.get("g") == TABLE_GROUP and params.get("v") in ("v1", "v1beta1"):
            return params["v"]
        if fields[0] in ("application/json", "*/*", "application/*") and "as" not in params:
            return None
    return None


# ---------------------------------------------------------------- formatting as the printers do
def human_duration(seconds: float) -> str:
    """k8s.io/apimachinery/pkg/util/duration.HumanDuration."""
    s = int(seconds)
    if s < -1:
        return "<invalid>"
    if s < 0:
        return "0s"
    if s < 120:
        return f"{s}s"
    minutes = s // 60
    if minutes < 10:
        return f"{minutes}m" if s % 60 == 0 else f"{minutes}m{s % 60}s"
    if minutes < 180:
        return f"{minutes}m"
    hours = s // 3600
    if hours < 8:
        return f"{hours}h" if minutes % 60 == 0 else f"{hours}h{minutes % 60}m"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        return f"{hours // 24}d" if hours % 24 == 0 else f"{hours // 24}d{hours % 24}h"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    if hours < 24 * 365 * 8:
        dy = (hours // 24) % 365
        return f"{hours // 24 // 365}y" if dy == 0 else f"{hours // 24 // 365}y{dy}d"
    return f"{hours // 24 // 365}y"


def _parse_time(ts: Any) -> datetime | None:
    if not isinstance(ts, str) or not ts:
        return None
    try:
        return datetime.fromisoformat(ts.replace("Z", "+00:00"))
    except ValueError:
        return None


def since(ts: Any) -> str:
    t = _parse_time(ts)
    if t is None:
        return "<unknown>"
    if t.tzinfo is None:
        t = t.replace(tzinfo=UTC)
    return human_duration((datetime.now(UTC) - t).total_seconds())


def format_labels(labels: dict | None) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted((labels or {}).items())) or "<none>"


def selector_string(sel: dict | None) -> str:
    """metav1.LabelSelectorAsSelector(sel).String(): requirements sorted by key."""
    if not sel:
        return ""
    reqs = [(k, f"{k}={v}") for k, v in (sel.get("matchLabels") or {}).items()]
    for e in sel.get("matchExpressions") or []:
        k, op, vals = e.get("key", ""), e.get("operator"), sorted(e.get("values") or [])
        if op == "In":
            reqs.append((k, f"{k} in ({','.join(vals)})"))
        elif op == "NotIn":
            reqs.append((k, f"{k} notin ({','.join(vals)})"))
        elif op == "Exists":
            reqs.append((k, k))
        elif op == "DoesNotExist":
            reqs.append((k, f"!{k}"))
    return ",".join(r for _, r in sorted(reqs, key=lambda kr: kr[0]))


def format_selector(sel: dict | None) -> str:
    """metav1.FormatLabelSelector."""
    return selector_string(sel) or "<none>"


def int_or_string(v: Any) -> str:
    return str(v)


def _containers(spec: dict | None) -> tuple[str, str]:
    cs = (spec or {}).get("containers") or []
    return ",".join(c.get("name", "") for c in cs), ",".join(c.get("image", "") for c in cs)


def _template_spec(obj: dict) -> dict:
    return (((obj.get("spec") or {}).get("template") or {}).get("spec")) or {}


# ---------------------------------------------------------------- column definitions
def _doc(definition: str, field: str) -> str:
    try:
        return schemas.definitions()[definition]["properties"][field].get("description", "")
    except (KeyError, schemas.SchemasUnavailable):
        return ""


META = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"


def col(name: str, typ: str = "string", doc: str | tuple[str, str] = "", priority: int = 0, fmt: str = "") -> dict:
    description = _doc(*doc) if isinstance(doc, tuple) else doc
    return {"name": name, "type": typ, "format": fmt, "description": description, "priority": priority}


def NAME() -> dict:
    return col("Name", doc=(META, "name"), fmt="name")


def AGE() -> dict:
    return col("Age", doc=(META, "creationTimestamp"))


CORE, APPS, BATCH = "io.k8s.api.core.v1.", "io.k8s.api.apps.v1.", "io.k8s.api.batch.v1."
CONTAINERS_DOC, IMAGES_DOC = (
    "Names of each container in the template.",
    "Images referenced by each container in the template.",
)


def _columns(key: tuple[str, str]) -> list[dict] | None:
    c = col
    wide_template = [c("Containers", doc=CONTAINERS_DOC, priority=1), c("Images", doc=IMAGES_DOC, priority=1)]
    table: dict[tuple[str, str], Callable[[], list[dict]]] = {
        ("", "pods"): lambda: [
            NAME(),
            c("Ready", doc="The aggregate readiness state of this pod for accepting traffic."),
            c("Status", doc="The aggregate status of the containers in this pod."),
            c(
                "Restarts",
                doc="The number of times the containers in this pod have been restarted and when the "
                "last container in this pod has restarted.",
            ),
            AGE(),
            c("IP", doc=(CORE + "PodStatus", "podIP"), priority=1),
            c("Node", doc=(CORE + "PodSpec", "nodeName"), priority=1),
            c("Nominated Node", doc=(CORE + "PodStatus", "nominatedNodeName"), priority=1),
            c("Readiness Gates", doc=(CORE + "PodSpec", "readinessGates"), priority=1),
        ],
        ("", "nodes"): lambda: [
            NAME(),
            c("Status", doc="The status of the node"),
            c("Roles", doc="The roles of the node"),
            AGE(),
            c("Version", doc=(CORE + "NodeSystemInfo", "kubeletVersion")),
            c("Internal-IP", doc=(CORE + "NodeStatus", "addresses"), priority=1),
            c("External-IP", doc=(CORE + "NodeStatus", "addresses"), priority=1),
            c("OS-Image", doc=(CORE + "NodeSystemInfo", "osImage"), priority=1),
            c("Kernel-Version", doc=(CORE + "NodeSystemInfo", "kernelVersion"), priority=1),
            c("Container-Runtime", doc=(CORE + "NodeSystemInfo", "containerRuntimeVersion"), priority=1),
        ],
        ("", "namespaces"): lambda: [NAME(), c("Status", doc="The status of the namespace"), AGE()],
        ("", "secrets"): lambda: [
            NAME(),
            c("Type", doc=(CORE + "Secret", "type")),
            c("Data", doc=(CORE + "Secret", "data")),
            AGE(),
        ],
        ("", "configmaps"): lambda: [NAME(), c("Data", doc=(CORE + "ConfigMap", "data")), AGE()],
        ("", "serviceaccounts"): lambda: [NAME(), c("Secrets", doc=(CORE + "ServiceAccount", "secrets")), AGE()],
        ("", "services"): lambda: [
            NAME(),
            c("Type", doc=(CORE + "ServiceSpec", "type")),
            c("Cluster-IP", doc=(CORE + "ServiceSpec", "clusterIP")),
            c("External-IP", doc=(CORE + "ServiceSpec", "externalIPs")),
            c("Port(s)", doc=(CORE + "ServiceSpec", "ports")),
            AGE(),
            c("Selector", doc=(CORE + "ServiceSpec", "selector"), priority=1),
        ],
        ("", "resourcequotas"): lambda: [
            NAME(),
            c("Request", doc="Request represents a minimum amount of cpu/memory that a container may consume."),
            c(
                "Limit",
                doc="Limits control the maximum amount of cpu/memory that a container may use independent "
                "of contention on the node.",
            ),
            AGE(),
        ],
        ("", "events"): lambda: [
            c("Last Seen", doc=(CORE + "Event", "lastTimestamp")),
            c("Type", doc=(CORE + "Event", "type")),
            c("Reason", doc=(CORE + "Event", "reason")),
            c("Object", doc=(CORE + "Event", "involvedObject")),
            c("Subobject", doc=(CORE + "ObjectReference", "fieldPath"), priority=1),
            c("Source", doc=(CORE + "Event", "source"), priority=1),
            c("Message", doc=(CORE + "Event", "message")),
            c("First Seen", doc=(CORE + "Event", "firstTimestamp"), priority=1),
            c("Count", doc=(CORE + "Event", "count"), priority=1),
            c("Name", doc=(META, "name"), priority=1, fmt="name"),
        ],
        ("", "endpoints"): lambda: [NAME(), c("Endpoints", doc=(CORE + "Endpoints", "subsets")), AGE()],
        ("", "persistentvolumeclaims"): lambda: [
            NAME(),
            c("Status", doc=(CORE + "PersistentVolumeClaimStatus", "phase")),
            c("Volume", doc=(CORE + "PersistentVolumeClaimSpec", "volumeName")),
            c("Capacity", doc=(CORE + "PersistentVolumeClaimStatus", "capacity")),
            c("Access Modes", doc=(CORE + "PersistentVolumeClaimStatus", "accessModes")),
            c("StorageClass", doc="StorageClass of the pvc"),
            c("VolumeAttributesClass", doc="VolumeAttributesClass of the pvc"),
            AGE(),
            c("VolumeMode", doc=(CORE + "PersistentVolumeClaimSpec", "volumeMode"), priority=1),
        ],
        ("apps", "replicasets"): lambda: [
            NAME(),
            c("Desired", "integer", (APPS + "ReplicaSetSpec", "replicas")),
            c("Current", "integer", (APPS + "ReplicaSetStatus", "replicas")),
            c("Ready", "integer", (APPS + "ReplicaSetStatus", "readyReplicas")),
            AGE(),
            *wide_template,
            c("Selector", doc=(APPS + "ReplicaSetSpec", "selector"), priority=1),
        ],
        ("apps", "daemonsets"): lambda: [
            NAME(),
            c("Desired", "integer", (APPS + "DaemonSetStatus", "desiredNumberScheduled")),
            c("Current", "integer", (APPS + "DaemonSetStatus", "currentNumberScheduled")),
            c("Ready", "integer", (APPS + "DaemonSetStatus", "numberReady")),
            c("Up-to-date", "integer", (APPS + "DaemonSetStatus", "updatedNumberScheduled")),
            c("Available", "integer", (APPS + "DaemonSetStatus", "numberAvailable")),
            c("Node Selector", doc=(CORE + "PodSpec", "nodeSelector")),
            AGE(),
            *wide_template,
            c("Selector", doc=(APPS + "DaemonSetSpec", "selector"), priority=1),
        ],
        ("apps", "deployments"): lambda: [
            NAME(),
            c("Ready", doc="Number of the pod with ready state"),
            c("Up-to-date", doc=(APPS + "DeploymentStatus", "updatedReplicas")),
            c("Available", doc=(APPS + "DeploymentStatus", "availableReplicas")),
            AGE(),
            *wide_template,
            c("Selector", doc=(APPS + "DeploymentSpec", "selector"), priority=1),
        ],
        ("apps", "statefulsets"): lambda: [
            NAME(),
            c("Ready", doc="Number of the pod with ready state"),
            AGE(),
            *wide_template,
        ],
        ("batch", "jobs"): lambda: [
            NAME(),
            c("Status", doc="Status of the job."),
            c("Completions", doc=(BATCH + "JobStatus", "succeeded")),
            c("Duration", doc="Time required to complete the job."),
            AGE(),
            *wide_template,
            c("Selector", doc=(BATCH + "JobSpec", "selector"), priority=1),
        ],
        ("policy", "poddisruptionbudgets"): lambda: [
            NAME(),
            c("Min Available", doc="The minimum number of pods that must be available."),
            c("Max Unavailable", doc="The maximum number of pods that may be unavailable."),
            c("Allowed Disruptions", "integer", "Calculated number of pods that may be disrupted at this time."),
            AGE(),
        ],
        ("rbac.authorization.k8s.io", "rolebindings"): lambda: _binding_columns("roleBinding"),
        ("rbac.authorization.k8s.io", "clusterrolebindings"): lambda: _binding_columns("clusterRoleBinding"),
        ("networking.k8s.io", "networkpolicies"): lambda: [
            NAME(),
            c("Pod-Selector", doc=("io.k8s.api.networking.v1.NetworkPolicySpec", "podSelector")),
            AGE(),
        ],
        ("scheduling.k8s.io", "priorityclasses"): lambda: [
            NAME(),
            c("Value", "integer", ("io.k8s.api.scheduling.v1.PriorityClass", "value")),
            c("Global-Default", "boolean", ("io.k8s.api.scheduling.v1.PriorityClass", "globalDefault")),
            AGE(),
            c("PreemptionPolicy", doc=("io.k8s.api.scheduling.v1.PriorityClass", "preemptionPolicy")),
        ],
        ("resource.k8s.io", "resourceslices"): lambda: [
            NAME(),
            c("Node", doc=("io.k8s.api.resource.v1beta1.ResourceSliceSpec", "nodeName")),
            c("Driver", doc=("io.k8s.api.resource.v1beta1.ResourceSliceSpec", "driver")),
            c("Pool", doc=("io.k8s.api.resource.v1beta1.ResourcePool", "name")),
            AGE(),
        ],
        ("coordination.k8s.io", "leases"): lambda: [
            NAME(),
            c("Holder", doc=("io.k8s.api.coordination.v1.LeaseSpec", "holderIdentity")),
            AGE(),
        ],
    }
    make = table.get(key)
    return make() if make else None


def _binding_columns(what: str) -> list[dict]:
    rb = "io.k8s.api.rbac.v1.RoleBinding"
    return [
        NAME(),
        col("Role", doc=(rb, "roleRef")),
        AGE(),
        col("Users", doc=f"Users in the {what}", priority=1),
        col("Groups", doc=f"Groups in the {what}", priority=1),
        col("ServiceAccounts", doc=f"ServiceAccounts in the {what}", priority=1),
    ]


# ---------------------------------------------------------------- rows
def _cond(conds: list | None, typ: str) -> dict | None:
    return next((c for c in conds or [] if c.get("type") == typ), None)


def _restartable_init(c: dict | None) -> bool:
    return c is not None and c.get("restartPolicy") == "Always"


def pod_cells(pod: dict) -> list:  # noqa: C901 (one branch per column, as kubectl's pod printer computes them)
    """printPod: READY, STATUS (the reason kubectl shows), RESTARTS, and the wide cells."""
    spec, st, md = pod.get("spec") or {}, pod.get("status") or {}, pod.get("metadata") or {}
    total = len(spec.get("containers") or [])
    ready = restarts = restartable_restarts = 0
    last_restart = last_restartable = ""
    phase = st.get("phase") or ""
    reason = st.get("reason") or phase
    for c in st.get("conditions") or []:
        if c.get("type") == "PodScheduled" and c.get("reason") == "SchedulingGated":
            reason = "SchedulingGated"
    inits = {c.get("name"): c for c in spec.get("initContainers") or []}
    total += sum(1 for c in inits.values() if _restartable_init(c))
    initializing = False
    for i, cs in enumerate(st.get("initContainerStatuses") or []):
        restarts += int(cs.get("restartCount") or 0)
        term_last = ((cs.get("lastState") or {}).get("terminated")) or {}
        if term_last.get("finishedAt", "") > last_restart:
            last_restart = term_last["finishedAt"]
        restartable = _restartable_init(inits.get(cs.get("name")))
        if restartable:
            restartable_restarts += int(cs.get("restartCount") or 0)
            if term_last.get("finishedAt", "") > last_restartable:
                last_restartable = term_last["finishedAt"]
        state = cs.get("state") or {}
        term, wait = state.get("terminated"), state.get("waiting")
        if term and int(term.get("exitCode") or 0) == 0:
            continue
        if restartable and cs.get("started"):
            ready += 1 if cs.get("ready") else 0
            continue
        if term:
            reason = (
                ("Init:" + term["reason"])
                if term.get("reason")
                else (
                    f"Init:Signal:{term['signal']}"
                    if term.get("signal")
                    else f"Init:ExitCode:{term.get('exitCode', 0)}"
                )
            )
        elif wait and wait.get("reason") and wait["reason"] != "PodInitializing":
            reason = "Init:" + wait["reason"]
        else:
            reason = f"Init:{i}/{len(spec.get('initContainers') or [])}"
        initializing = True
        break
    initialized = (_cond(st.get("conditions"), "Initialized") or {}).get("status") == "True"
    if not initializing or initialized:
        restarts, last_restart = restartable_restarts, last_restartable
        has_running = False
        for cs in reversed(st.get("containerStatuses") or []):
            restarts += int(cs.get("restartCount") or 0)
            term_last = ((cs.get("lastState") or {}).get("terminated")) or {}
            if term_last.get("finishedAt", "") > last_restart:
                last_restart = term_last["finishedAt"]
            state = cs.get("state") or {}
            wait, term = state.get("waiting") or {}, state.get("terminated")
            if wait.get("reason"):
                reason = wait["reason"]
            elif term and term.get("reason"):
                reason = term["reason"]
            elif term:
                reason = f"Signal:{term['signal']}" if term.get("signal") else f"ExitCode:{term.get('exitCode', 0)}"
            elif cs.get("ready") and state.get("running") is not None:
                has_running = True
                ready += 1
        if reason == "Completed" and has_running:
            ready_cond = (_cond(st.get("conditions"), "Ready") or {}).get("status") == "True"
            reason = "Running" if ready_cond else "NotReady"
    if md.get("deletionTimestamp") and st.get("reason") == "NodeLost":
        reason = "Unknown"
    elif md.get("deletionTimestamp") and phase not in ("Succeeded", "Failed"):
        reason = "Terminating"
    restarts_s = str(restarts)
    if restarts and last_restart:
        restarts_s = f"{restarts} ({since(last_restart)} ago)"
    ips = st.get("podIPs") or []
    pod_ip = (ips[0].get("ip") if ips else "") or "<none>"
    gates = spec.get("readinessGates") or []
    gates_s = "<none>"
    if gates:
        true = sum(
            1 for g in gates if (_cond(st.get("conditions"), g.get("conditionType")) or {}).get("status") == "True"
        )
        gates_s = f"{true}/{len(gates)}"
    return [
        md.get("name"),
        f"{ready}/{total}",
        reason,
        restarts_s,
        since(md.get("creationTimestamp")),
        pod_ip,
        spec.get("nodeName") or "<none>",
        st.get("nominatedNodeName") or "<none>",
        gates_s,
    ]


def node_cells(node: dict) -> list:
    md, spec, st = node.get("metadata") or {}, node.get("spec") or {}, node.get("status") or {}
    ready = _cond(st.get("conditions"), "Ready")
    status = [("Ready" if ready.get("status") == "True" else "NotReady")] if ready else ["Unknown"]
    if spec.get("unschedulable"):
        status.append("SchedulingDisabled")
    roles = set()
    for k, v in (md.get("labels") or {}).items():
        if k.startswith("node-role.kubernetes.io/") and k[len("node-role.kubernetes.io/") :]:
            roles.add(k[len("node-role.kubernetes.io/") :])
        elif k == "kubernetes.io/role" and v:
            roles.add(v)
    info = st.get("nodeInfo") or {}

    def address(typ: str) -> str:
        return next((a.get("address") for a in st.get("addresses") or [] if a.get("type") == typ), "<none>")

    return [
        md.get("name"),
        ",".join(status),
        ",".join(sorted(roles)) or "<none>",
        since(md.get("creationTimestamp")),
        info.get("kubeletVersion", ""),
        address("InternalIP"),
        address("ExternalIP"),
        info.get("osImage") or "<unknown>",
        info.get("kernelVersion") or "<unknown>",
        info.get("containerRuntimeVersion") or "<unknown>",
    ]


def _service_external_ip(svc: dict) -> str:
    spec, st = svc.get("spec") or {}, svc.get("status") or {}
    typ, ext = spec.get("type") or "ClusterIP", spec.get("externalIPs") or []
    if typ in ("ClusterIP", "NodePort"):
        return ",".join(ext) or "<none>"
    if typ == "LoadBalancer":
        lb = sorted(
            {
                i.get("ip") or i.get("hostname")
                for i in (st.get("loadBalancer") or {}).get("ingress") or []
                if i.get("ip") or i.get("hostname")
            }
        )
        ips = ",".join(lb)
        if ext:
            return ",".join(lb + ext)
        return ips or "<pending>"
    if typ == "ExternalName":
        return spec.get("externalName", "")
    return "<unknown>"


def service_cells(svc: dict) -> list:
    md, spec = svc.get("metadata") or {}, svc.get("spec") or {}
    ports = ",".join(
        f"{p.get('port')}:{p['nodePort']}/{p.get('protocol', 'TCP')}"
        if p.get("nodePort")
        else f"{p.get('port')}/{p.get('protocol', 'TCP')}"
        for p in spec.get("ports") or []
    )
    return [
        md.get("name"),
        spec.get("type") or "ClusterIP",
        (spec.get("clusterIPs") or ["<none>"])[0],
        _service_external_ip(svc),
        ports or "<none>",
        since(md.get("creationTimestamp")),
        format_labels(spec.get("selector")),
    ]


def job_cells(job: dict) -> list:
    md, spec, st = job.get("metadata") or {}, job.get("spec") or {}, job.get("status") or {}
    succeeded = int(st.get("succeeded") or 0)
    if spec.get("completions") is not None:
        completions = f"{succeeded}/{spec['completions']}"
    else:
        par = int(spec.get("parallelism") or 0)
        completions = f"{succeeded}/1 of {par}" if par > 1 else f"{succeeded}/1"
    start, end = _parse_time(st.get("startTime")), _parse_time(st.get("completionTime"))
    duration = ""
    if start and not end:
        duration = since(st.get("startTime"))
    elif start and end:
        duration = human_duration((end - start).total_seconds())

    def has(typ: str) -> bool:
        c = _cond(st.get("conditions"), typ)
        return c is not None and c.get("status") == "True"

    if has("Complete"):
        status = "Complete"
    elif has("Failed"):
        status = "Failed"
    elif md.get("deletionTimestamp"):
        status = "Terminating"
    elif has("Suspended"):
        status = "Suspended"
    elif has("FailureTarget"):
        status = "FailureTarget"
    else:
        status = "Running"
    names, images = _containers(_template_spec(job))
    return [
        md.get("name"),
        status,
        completions,
        duration,
        since(md.get("creationTimestamp")),
        names,
        images,
        format_selector(spec.get("selector")),
    ]


def event_cells(ev: dict) -> list:
    md, inv = ev.get("metadata") or {}, ev.get("involvedObject") or {}
    first = since(ev["firstTimestamp"]) if ev.get("firstTimestamp") else since(ev.get("eventTime"))
    last = since(ev["lastTimestamp"]) if ev.get("lastTimestamp") else first
    count = ev.get("count") or 0
    if ev.get("series"):
        last, count = since(ev["series"].get("lastObservedTime")), ev["series"].get("count") or 0
    elif not count:
        count = 1
    kind = (inv.get("kind") or "").lower()
    target = f"{kind}/{inv['name']}" if inv.get("name") else kind
    src = ev.get("source") or {}
    component = src.get("component") or ev.get("reportingComponent") or ""
    host = src.get("host") or ev.get("reportingInstance") or ""
    source = f"{component}, {host}" if host else component
    return [
        last,
        ev.get("type", ""),
        ev.get("reason", ""),
        target,
        inv.get("fieldPath", ""),
        source,
        (ev.get("message") or "").strip(),
        first,
        int(count),
        md.get("name"),
    ]


def _quota_cells(q: dict) -> list:
    st = q.get("status") or {}
    hard, used = st.get("hard") or {}, st.get("used") or {}
    req: list[str] = []
    lim: list[str] = []
    for r in sorted(hard):
        (lim if r.split(".")[0] == "limits" and "." in r else req).append(f"{r}: {used.get(r, '0')}/{hard[r]}")
    return [q["metadata"].get("name"), ", ".join(req), ", ".join(lim), since(q["metadata"].get("creationTimestamp"))]


def _endpoints(ep: dict) -> str:
    subsets = ep.get("subsets") or []
    if not subsets:
        return "<none>"
    out: list[str] = []
    count = 0
    for ss in subsets:
        addrs = ss.get("addresses") or []
        ports = ss.get("ports") or [None]
        for p in ports:
            count += len(addrs)
            for a in addrs:
                if len(out) < 3:
                    out.append(a.get("ip", "") if p is None else f"{a.get('ip', '')}:{p.get('port')}")
    s = ",".join(out)
    return f"{s} + {count - 3} more..." if count > 3 else s


def _binding_cells(b: dict) -> list:
    ref = b.get("roleRef") or {}
    users = [s["name"] for s in b.get("subjects") or [] if s.get("kind") == "User"]
    groups = [s["name"] for s in b.get("subjects") or [] if s.get("kind") == "Group"]
    sas = [
        f"{s.get('namespace', '')}/{s['name']}" for s in b.get("subjects") or [] if s.get("kind") == "ServiceAccount"
    ]
    return [
        b["metadata"].get("name"),
        f"{ref.get('kind', '')}/{ref.get('name', '')}",
        since(b["metadata"].get("creationTimestamp")),
        ", ".join(users),
        ", ".join(groups),
        ", ".join(sas),
    ]


def _cells(key: tuple[str, str], o: dict) -> list:  # noqa: C901 (one branch per resource kind's columns, as kubectl's printers)
    md, spec, st = o.get("metadata") or {}, o.get("spec") or {}, o.get("status") or {}
    name, age = md.get("name"), since(md.get("creationTimestamp"))
    if key == ("", "pods"):
        return pod_cells(o)
    if key == ("", "nodes"):
        return node_cells(o)
    if key == ("", "namespaces"):
        return [name, st.get("phase", ""), age]
    if key == ("", "secrets"):
        return [name, o.get("type", ""), len(o.get("data") or {}), age]
    if key == ("", "configmaps"):
        return [name, len(o.get("data") or {}) + len(o.get("binaryData") or {}), age]
    if key == ("", "serviceaccounts"):
        return [name, len(o.get("secrets") or []), age]
    if key == ("", "services"):
        return service_cells(o)
    if key == ("", "resourcequotas"):
        return _quota_cells(o)
    if key == ("", "events"):
        return event_cells(o)
    if key == ("", "endpoints"):
        return [name, _endpoints(o), age]
    if key == ("", "persistentvolumeclaims"):
        bound = bool(spec.get("volumeName"))
        return [
            name,
            "Terminating" if md.get("deletionTimestamp") else st.get("phase", ""),
            spec.get("volumeName", ""),
            ((st.get("capacity") or {}).get("storage", "")) if bound else "",
            _access_modes(st.get("accessModes")) if bound else "",
            spec.get("storageClassName") or "",
            spec.get("volumeAttributesClassName") or "<unset>",
            age,
            spec.get("volumeMode") or "<unset>",
        ]
    if key == ("apps", "replicasets"):
        names, images = _containers(_template_spec(o))
        return [
            name,
            int(spec.get("replicas") or 0),
            int(st.get("replicas") or 0),
            int(st.get("readyReplicas") or 0),
            age,
            names,
            images,
            format_selector(spec.get("selector")),
        ]
    if key == ("apps", "daemonsets"):
        names, images = _containers(_template_spec(o))
        return [
            name,
            int(st.get("desiredNumberScheduled") or 0),
            int(st.get("currentNumberScheduled") or 0),
            int(st.get("numberReady") or 0),
            int(st.get("updatedNumberScheduled") or 0),
            int(st.get("numberAvailable") or 0),
            format_labels(_template_spec(o).get("nodeSelector")),
            age,
            names,
            images,
            format_selector(spec.get("selector")),
        ]
    if key == ("apps", "deployments"):
        names, images = _containers(_template_spec(o))
        return [
            name,
            f"{int(st.get('readyReplicas') or 0)}/{int(spec.get('replicas') or 0)}",
            int(st.get("updatedReplicas") or 0),
            int(st.get("availableReplicas") or 0),
            age,
            names,
            images,
            selector_string(spec.get("selector")),
        ]
    if key == ("apps", "statefulsets"):
        names, images = _containers(_template_spec(o))
        return [name, f"{int(st.get('readyReplicas') or 0)}/{int(spec.get('replicas') or 0)}", age, names, images]
    if key == ("batch", "jobs"):
        return job_cells(o)
    if key == ("policy", "poddisruptionbudgets"):
        return [
            name,
            int_or_string(spec["minAvailable"]) if "minAvailable" in spec else "N/A",
            int_or_string(spec["maxUnavailable"]) if "maxUnavailable" in spec else "N/A",
            int(st.get("disruptionsAllowed") or 0),
            age,
        ]
    if key in (("rbac.authorization.k8s.io", "rolebindings"), ("rbac.authorization.k8s.io", "clusterrolebindings")):
        return _binding_cells(o)
    if key == ("networking.k8s.io", "networkpolicies"):
        return [name, format_selector(spec.get("podSelector")), age]
    if key == ("scheduling.k8s.io", "priorityclasses"):
        return [name, int(o.get("value") or 0), bool(o.get("globalDefault")), age, o.get("preemptionPolicy", "")]
    if key == ("coordination.k8s.io", "leases"):
        return [name, spec.get("holderIdentity", ""), age]
    if key == ("resource.k8s.io", "resourceslices"):
        return [name, spec.get("nodeName", ""), spec.get("driver", ""), (spec.get("pool") or {}).get("name", ""), age]
    raise KeyError(key)


def _access_modes(modes: list | None) -> str:
    short = {"ReadWriteOnce": "RWO", "ReadOnlyMany": "ROX", "ReadWriteMany": "RWX", "ReadWriteOncePod": "RWOP"}
    return ",".join(
        short[m] for m in ("ReadWriteOnce", "ReadOnlyMany", "ReadWriteMany", "ReadWriteOncePod") if m in (modes or [])
    )


# ---------------------------------------------------------------- custom resources (additionalPrinterColumns)
_SEGMENT = re.compile(r"\.([A-Za-z0-9_\-]+)|\[(\d+|\*)\]|\[\?\(@\.([A-Za-z0-9_.\-]+)\s*==\s*['\"]([^'\"]*)['\"]\)\]")


def jsonpath(obj: Any, path: str) -> list:
    """The values a CRD printer column's simple JSONPath selects (fields, [n], [*], [?(@.f=="v")])."""
    path = path.strip()
    if path.startswith("{") and path.endswith("}"):
        path = path[1:-1]
    vals = [obj]
    pos = 0
    while pos < len(path):
        m = _SEGMENT.match(path, pos)
        if not m:
            return []
        pos = m.end()
        nxt = []
        for v in vals:
            if m.group(1) is not None:
                if isinstance(v, dict) and m.group(1) in v:
                    nxt.append(v[m.group(1)])
            elif m.group(2) is not None:
                if isinstance(v, list):
                    if m.group(2) == "*":
                        nxt.extend(v)
                    elif int(m.group(2)) < len(v):
                        nxt.append(v[int(m.group(2))])
            else:
                field, want = m.group(3), m.group(4)
                for item in v if isinstance(v, list) else []:
                    got = jsonpath(item, "." + field)
                    if got and _print_value(got[0]) == want:
                        nxt.append(item)
        vals = nxt
    return vals


def _print_value(v: Any) -> str:
    if isinstance(v, str):
        return v
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    if isinstance(v, (dict, list)):
        return json.dumps(v, separators=(",", ":"))
    return str(v)


def _custom_cell(typ: str, v: Any) -> Any:
    if v is None:
        return None
    if typ == "string":
        return _print_value(v)
    if typ == "integer" and isinstance(v, (int, float)) and not isinstance(v, bool):
        return int(v)
    if typ == "number" and isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    if typ == "boolean" and isinstance(v, bool):
        return v
    if typ == "date" and isinstance(v, str):
        return since(v) if _parse_time(v) else "<invalid>"
    return None


def _crd_columns(store: Store, rt: ResourceType, version: str) -> list[dict]:
    crd = schemas.crd_object(store, rt) or {}
    ver: dict = next((v for v in (crd.get("spec") or {}).get("versions") or [] if v.get("name") == version), {})
    cols = ver.get("additionalPrinterColumns") or [
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}
    ]
    return cols


# ---------------------------------------------------------------- the Table
def _row_object(o: dict, include: str) -> dict | None:
    if include == "None":
        return None
    if include == "Object":
        return o
    return {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": o.get("metadata") or {}}


def table(
    store: Store,
    rt: ResourceType,
    version: str,
    objs: list[dict],
    list_meta: dict,
    query,
    table_version: str = "v1",
) -> dict:
    """A meta.k8s.io Table of `objs` (already served, with apiVersion and kind)."""
    include = query.get("includeObject") or "Metadata"
    no_headers = (query.get("noHeaders") or "").lower() in ("1", "true")
    rows = []
    if not rt.builtin:
        cols = _crd_columns(store, rt, version)
        defs = [NAME()] + [
            col(
                c["name"],
                c.get("type", "string"),
                c.get("description", ""),
                int(c.get("priority") or 0),
                c.get("format", ""),
            )
            for c in cols
        ]
        for o in objs:
            cells = [o["metadata"].get("name")]
            for c in cols:
                found = jsonpath(o, c.get("jsonPath", ""))
                cells.append(_custom_cell(c.get("type", "string"), found[0] if found else None))
            rows.append({"cells": cells, "object": _row_object(o, include)})
    elif _columns(rt.key) is not None:
        defs = _columns(rt.key) or []
        for o in objs:
            row: dict[str, Any] = {"cells": _cells(rt.key, o), "object": _row_object(o, include)}
            phase = (o.get("status") or {}).get("phase") if rt.key == ("", "pods") else None
            if phase in ("Succeeded", "Failed"):
                row["conditions"] = [
                    {
                        "type": "Completed",
                        "status": "True",
                        "reason": phase,
                        "message": "The pod has completed successfully." if phase == "Succeeded" else "The pod failed.",
                    }
                ]
            rows.append(row)
    else:  # the apiserver's default table convertor
        defs = [NAME(), col("Created At", "date", (META, "creationTimestamp"))]
        for o in objs:
            rows.append(
                {
                    "cells": [o["metadata"].get("name"), o["metadata"].get("creationTimestamp")],
                    "object": _row_object(o, include),
                }
            )
    for r in rows:
        if r["object"] is None:
            del r["object"]
    return {
        "kind": "Table",
        "apiVersion": f"meta.k8s.io/{table_version}",
        "metadata": dict(list_meta),
        "columnDefinitions": [] if no_headers else defs,
        "rows": rows,
    }
