"""Resource type registry: built-in kinds, CRD-registered kinds and discovery documents."""

from __future__ import annotations

from dataclasses import dataclass, field

from .util import clone

ALL_VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]
NO_COLLECTION = ["create", "delete", "get", "list", "patch", "update", "watch"]


@dataclass
class ResourceType:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    singular: str = ""
    short_names: list[str] = field(default_factory=list)
    verbs: list[str] = field(default_factory=lambda: list(ALL_VERBS))
    status: bool = False  # has a status subresource
    builtin: bool = True
    generation: bool = True  # maintains metadata.generation
    categories: list[str] = field(default_factory=list)
    versions: list[str] = field(default_factory=list)  # all served versions (CRDs)

    def __post_init__(self) -> None:
        if not self.singular:
            self.singular = self.kind.lower()
        if not self.versions:
            self.versions = [self.version]

    @property
    def key(self) -> tuple[str, str]:
        return (self.group, self.plural)

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def group_resource(self) -> str:
        """`pods` or `deployments.apps`, as used in real error messages."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    def served(self, obj: dict, version: str | None = None, shallow: bool = False) -> dict:
        """The object as served at `version` (default: the storage version). `shallow` only where it is
        serialized before the next await."""
        o = dict(obj) if shallow else clone(obj)
        v = version or self.version
        o["apiVersion"] = f"{self.group}/{v}" if self.group else v
        o["kind"] = self.kind
        return o


class Info:
    """What a request addresses (used for routing, fault matching and the audit log)."""

    def __init__(self) -> None:
        self.kind = "other"  # discovery | resource | other
        self.verb = ""
        self.group = ""
        self.version = ""
        self.resource = ""
        self.subresource = ""
        self.namespace = ""
        self.name = ""
        self.rt: ResourceType | None = None

    def as_dict(self) -> dict:
        return {
            "verb": self.verb,
            "group": self.group,
            "version": self.version,
            "resource": self.resource,
            "subresource": self.subresource,
            "namespace": self.namespace,
            "name": self.name,
        }


def _b(group, version, plural, kind, namespaced, **kw) -> ResourceType:
    return ResourceType(group, version, plural, kind, namespaced, **kw)


BUILTINS: list[ResourceType] = [
    _b(
        "",
        "v1",
        "namespaces",
        "Namespace",
        False,
        short_names=["ns"],
        status=True,
        generation=False,
        verbs=NO_COLLECTION,
    ),
    _b("", "v1", "nodes", "Node", False, short_names=["no"], status=True, generation=False),
    _b("", "v1", "pods", "Pod", True, short_names=["po"], status=True, categories=["all"]),
    _b("", "v1", "secrets", "Secret", True, generation=False),
    _b("", "v1", "configmaps", "ConfigMap", True, short_names=["cm"], generation=False),
    _b("", "v1", "serviceaccounts", "ServiceAccount", True, short_names=["sa"], generation=False),
    _b(
        "", "v1", "services", "Service", True, short_names=["svc"], status=True, categories=["all"], verbs=NO_COLLECTION
    ),
    _b("", "v1", "resourcequotas", "ResourceQuota", True, short_names=["quota"], status=True),
    _b("", "v1", "limitranges", "LimitRange", True, short_names=["limits"]),
    _b("", "v1", "events", "Event", True, short_names=["ev"], generation=False),
    _b("", "v1", "endpoints", "Endpoints", True, short_names=["ep"], generation=False),
    _b("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim", True, short_names=["pvc"], status=True),
    _b("apps", "v1", "replicasets", "ReplicaSet", True, short_names=["rs"], status=True, categories=["all"]),
    _b("apps", "v1", "daemonsets", "DaemonSet", True, short_names=["ds"], status=True, categories=["all"]),
    _b("apps", "v1", "deployments", "Deployment", True, short_names=["deploy"], status=True, categories=["all"]),
    _b("apps", "v1", "statefulsets", "StatefulSet", True, short_names=["sts"], status=True, categories=["all"]),
    _b("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", True, short_names=["pdb"], status=True),
    _b("rbac.authorization.k8s.io", "v1", "roles", "Role", True, generation=False),
    _b("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding", True, generation=False),
    _b("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", False, generation=False),
    _b("rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding", False, generation=False),
    _b("networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy", True, short_names=["netpol"]),
    _b("batch", "v1", "jobs", "Job", True, status=True, categories=["all"]),
    _b("scheduling.k8s.io", "v1", "priorityclasses", "PriorityClass", False, short_names=["pc"], generation=False),
    _b("resource.k8s.io", "v1beta1", "resourceslices", "ResourceSlice", False),  # DRA, as v1.32 serves it
    _b(
        "apiextensions.k8s.io",
        "v1",
        "customresourcedefinitions",
        "CustomResourceDefinition",
        False,
        short_names=["crd", "crds"],
        status=True,
    ),
]

GROUP_ORDER = [
    "",
    "apps",
    "events.k8s.io",
    "batch",
    "policy",
    "rbac.authorization.k8s.io",
    "networking.k8s.io",
    "scheduling.k8s.io",
    "resource.k8s.io",
    "apiextensions.k8s.io",
]


class Registry:
    """Known resource types, keyed by (group, plural); CRDs add and remove entries."""

    def __init__(self) -> None:
        self.types: dict[tuple[str, str], ResourceType] = {}
        self.crd_owned: dict[str, list[tuple[str, str]]] = {}  # crd name -> keys
        self.reset()

    def reset(self) -> None:
        self.types = {rt.key: rt for rt in BUILTINS}
        self.crd_owned = {}

    def get(self, group: str, version: str, plural: str) -> ResourceType | None:
        rt = self.types.get((group, plural))
        if rt is None or version not in rt.versions:
            return None
        return rt

    def by_kind(self, api_version: str, kind: str) -> ResourceType | None:
        group, _, version = api_version.rpartition("/")
        for rt in self.types.values():
            if rt.group == group and rt.kind == kind and version in rt.versions:
                return rt
        return None

    def register_crd(self, crd: dict) -> ResourceType | None:
        spec = crd.get("spec") or {}
        names = spec.get("names") or {}
        group, plural, kind = spec.get("group"), names.get("plural"), names.get("kind")
        if not (group and plural and kind):
            return None
        versions = [v for v in spec.get("versions") or [] if v.get("served", True)]
        if not versions:
            return None
        storage = next((v for v in versions if v.get("storage")), versions[0])
        status = any("status" in (v.get("subresources") or {}) for v in versions)
        rt = ResourceType(
            group=group,
            version=storage["name"],
            plural=plural,
            kind=kind,
            namespaced=(spec.get("scope", "Namespaced") == "Namespaced"),
            singular=names.get("singular") or kind.lower(),
            short_names=list(names.get("shortNames") or []),
            status=status,
            builtin=False,
            categories=list(names.get("categories") or []),
            versions=[v["name"] for v in versions],
        )
        self.types[rt.key] = rt
        self.crd_owned[crd["metadata"]["name"]] = [rt.key]
        return rt

    def unregister_crd(self, crd_name: str) -> list[tuple[str, str]]:
        keys = self.crd_owned.pop(crd_name, [])
        for k in keys:
            self.types.pop(k, None)
        return keys

    # ------------------------------------------------------------------ discovery
    def groups(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for rt in self.types.values():
            vs = out.setdefault(rt.group, [])
            for v in rt.versions:
                if v not in vs:
                    vs.append(v)
        return out

    def api_group_list(self) -> dict:
        groups = self.groups()
        names = [g for g in GROUP_ORDER if g in groups and g] + sorted(g for g in groups if g and g not in GROUP_ORDER)
        items = []
        for g in names:
            vs = groups[g]
            pref = next((rt.version for rt in self.types.values() if rt.group == g), vs[0])
            items.append(
                {
                    "name": g,
                    "versions": [{"groupVersion": f"{g}/{v}", "version": v} for v in vs],
                    "preferredVersion": {"groupVersion": f"{g}/{pref}", "version": pref},
                }
            )
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": items}

    def api_group(self, group: str) -> dict | None:
        for g in self.api_group_list()["groups"]:
            if g["name"] == group:
                return {"kind": "APIGroup", "apiVersion": "v1", **g}
        return None

    def resource_list(self, group: str, version: str) -> dict | None:
        rts = [rt for rt in self.types.values() if rt.group == group and version in rt.versions]
        if not rts:
            return None
        resources = []
        for rt in sorted(rts, key=lambda r: r.plural):
            entry = {
                "name": rt.plural,
                "singularName": rt.singular,
                "namespaced": rt.namespaced,
                "kind": rt.kind,
                "verbs": list(rt.verbs),
            }
            if rt.short_names:
                entry["shortNames"] = list(rt.short_names)
            if rt.categories:
                entry["categories"] = list(rt.categories)
            resources.append(entry)
            if rt.status:
                resources.append(
                    {
                        "name": f"{rt.plural}/status",
                        "singularName": "",
                        "namespaced": rt.namespaced,
                        "kind": rt.kind,
                        "verbs": ["get", "patch", "update"],
                    }
                )
            if rt.key == ("", "pods"):
                resources.append(
                    {
                        "name": "pods/eviction",
                        "singularName": "",
                        "namespaced": True,
                        "group": "policy",
                        "version": "v1",
                        "kind": "Eviction",
                        "verbs": ["create"],
                    }
                )
        gv = f"{group}/{version}" if group else version
        return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}
