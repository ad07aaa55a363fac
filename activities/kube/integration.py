"""The Kubernetes clusters as the worker sees them: the kubeconfig files, one connector to every cluster they name,
and the activities that speak Kubernetes through it (nodes and rollouts, MIG layouts, Cluster API's management cluster, node
health)."""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import Field

from activities.capi.models import DEFAULT_RESERVED_GROUPS
from activities.support.integration import ConfigError, Integration, Parts, SystemSettings


class KubernetesSettings(SystemSettings):
    kubeconfig: str | None = Field(
        None, description="os.pathsep-separated kubeconfig files; default $KUBECONFIG, then ~/.kube/config"
    )
    reserved_groups: list[str] = Field(
        default_factory=lambda: list(DEFAULT_RESERVED_GROUPS),
        description="Identity groups no tenant binding may name (besides every system:* group), as a JSON list, "
        'e.g. \'["kubeadm:cluster-admins", "platform-admins"]\'; default: kubeadm\'s cluster-admins group',
    )

    def kubeconfig_paths(self) -> list[str]:
        """The kubeconfig files to load, in order; raises ConfigError when there are none.

        Files named in MILLWRIGHT_KUBECONFIG must all exist. Like kubectl, entries of
        $KUBECONFIG that do not exist are skipped.
        """
        if self.kubeconfig:
            paths = [p for p in self.kubeconfig.split(os.pathsep) if p]
            missing = [p for p in paths if not Path(p).expanduser().is_file()]
            if missing:
                raise ConfigError(f"kubeconfig not found: {', '.join(missing)} (from MILLWRIGHT_KUBECONFIG)")
            return [str(Path(p).expanduser()) for p in paths]
        env = os.environ.get("KUBECONFIG")
        if env:
            candidates = [p for p in env.split(os.pathsep) if p]
            source = "KUBECONFIG"
        else:
            candidates = ["~/.kube/config"]
            source = "the default location"
        found = [str(Path(p).expanduser()) for p in candidates if Path(p).expanduser().is_file()]
        if not found:
            raise ConfigError(
                f"no kubeconfig found at {', '.join(candidates)} ({source}); "
                "set MILLWRIGHT_KUBECONFIG to one or more files separated by " + repr(os.pathsep)
            )
        return found


class Kubernetes(Integration[KubernetesSettings]):
    name = "kubeconfig"  # its start-up line says which files name the clusters
    settings = KubernetesSettings
    packages = ("activities.kube", "activities.capi", "activities.node_health")
    in_site = True

    def build(self, settings: KubernetesSettings) -> Parts:
        from activities.capi.activities import ClusterApiActivities
        from activities.kube.activities import KubeActivities
        from activities.kube.connector import ClusterConnector
        from activities.kube.mig import MigActivities
        from activities.node_health import NodeHealthActivities

        connector = ClusterConnector(settings.kubeconfig_paths())
        kube = KubeActivities(connector)
        objects = [
            kube,
            MigActivities(connector),
            ClusterApiActivities(connector, settings.reserved_groups),
            NodeHealthActivities(connector),
        ]
        return Parts(objects, [kube, connector])  # its shared watches stop before their clients close

    def describe(self, settings: KubernetesSettings) -> str:
        return os.pathsep.join(settings.kubeconfig_paths())
