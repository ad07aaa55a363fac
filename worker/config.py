"""Worker settings, read from ``MILLWRIGHT_*`` environment variables: the worker's own, here, and each external
system's, in its integration (activities/integrations.py), so a new system's settings stay in its package.

The Temporal connection itself (address, namespace, API key, TLS) is not here: it comes
from Temporal's own environment configuration (``TEMPORAL_*`` variables and TOML
profiles), see :func:`worker.main.connect_config`.

TLS to the integrations (BMCs, NetBox, UFM, Ironic, Prometheus): ``MILLWRIGHT_<NAME>_CA_BUNDLE``
is a CA bundle reference (``file:/path/to/ca.pem``, read by the activities at each attempt)
that replaces the default CAs; ``MILLWRIGHT_<NAME>_VERIFY_TLS=false`` turns verification off.
Kubernetes takes its CA from the kubeconfig, webhooks from each target (activities/support/tls.py).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from activities.integrations import IntegrationSettings
from activities.models import BaseUrl, Host
from activities.sites import SITE_NAME
from activities.support.integration import ConfigError

__all__ = ["ConfigError", "WorkerSettings"]


class WorkerSettings(IntegrationSettings, BaseSettings):
    """The worker's own settings, and every integration's (activities/integrations.py)."""

    model_config = SettingsConfigDict(env_prefix="MILLWRIGHT_", extra="ignore")

    task_queue: str = Field(
        "millwright", description="The central task queue: workflows, and the activities of systems reachable from here"
    )
    site: str | None = Field(
        None, pattern=SITE_NAME, max_length=40,
        description="Run as this site's worker: only the activities of the site's own systems (Kubernetes, BMCs, UFM, "
        "Ironic), with this worker's settings, on task queue millwright-site-<site>; no workflows "
        "(docs/sites-and-campaigns.md)",
    )  # fmt: skip
    site_map: str | None = Field(
        None, description="The central worker's site map, a JSON file (activities/sites.py SiteMap): every site "
        "system's call runs on its site's task queue, and this worker builds none of them (docs/sites-and-campaigns.md)",
    )  # fmt: skip
    deployment_name: str | None = Field(
        None,
        pattern=r"^[^.]+$",
        description="Worker Versioning: the Worker Deployment this worker belongs to (no '.'), with "
        "MILLWRIGHT_BUILD_ID; unset: the worker is unversioned (docs/production.md, Upgrades)",
    )
    build_id: str | None = Field(
        None, min_length=1, description="Worker Versioning: this image's build ID, with MILLWRIGHT_DEPLOYMENT_NAME"
    )
    site_pickup_seconds: float = Field(
        30.0, ge=1, description="With a site map: how long a site's call may wait for one of its site's workers "
        "before the run says the site does not answer (and schedules it again, up to the run's retry_timeout)",
    )  # fmt: skip
    metrics_port: int = Field(9464, ge=0, le=65535, description="Prometheus port; 0 turns metrics off")
    metrics_host: Host = Field("0.0.0.0", description="Prometheus bind address")
    shutdown_grace_seconds: float = Field(60.0, ge=0)
    max_concurrent_activities: int | None = Field(None, ge=1)
    log_level: str = "INFO"
    otlp_endpoint: BaseUrl | None = Field(
        None,
        description="OpenTelemetry collector's OTLP/HTTP base URL, e.g. http://otel-collector:4318: the worker "
        "exports a span per workflow, activity, signal, query and update to <url>/v1/traces (none: no tracing)",
    )
    fault_events: bool = Field(
        False,
        description="Run the event path to remediation in this worker: a node watch per cluster of "
        "MILLWRIGHT_FAULT_EVENTS_CLUSTERS and, with MILLWRIGHT_FAULT_EVENTS_TOKEN, the Alertmanager receiver",
    )
    fault_events_clusters: list[str] = Field(
        default_factory=list, description="The clusters (kubeconfig contexts) to watch, as a JSON list, e.g. '[\"a\"]'"
    )
    fault_events_token: str | None = Field(
        None,
        description="Secret reference to the bearer token Alertmanager sends: env:NAME or file:/path (none: "
        "no receiver)",
    )
    fault_events_host: Host = Field("0.0.0.0", description="The Alertmanager receiver's bind address")
    fault_events_port: int = Field(9466, ge=0, le=65535, description="The Alertmanager receiver's port")
    fault_events_settings: str | None = Field(
        None,
        description="A JSON file of the event path's hold, checks, cooldown, min_healthy and remediation "
        "settings (worker/fault_events.py FaultEventSettings); default: their defaults",
    )

    host_name: str | None = Field(
        None, description="Host agent mode (--host-agent): this host's name; default socket.gethostname()"
    )
    gpu_stress_command: str | None = Field(
        None, description="Host agent mode: the GPU load command ('{seconds}' is replaced), e.g. 'gpu_burn {seconds}'"
    )

    @property
    def metrics_address(self) -> str | None:
        if not self.metrics_port:
            return None
        return f"{self.metrics_host}:{self.metrics_port}"

    @property
    def metrics_url(self) -> str | None:
        if not self.metrics_port:
            return None
        host = self.metrics_host
        if host in ("0.0.0.0", "::", ""):
            host = "127.0.0.1"
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.metrics_port}/metrics"

    def deployment_version(self):
        """This worker's Worker Deployment Version, or None when it runs unversioned; ConfigError when only one of
        the two settings is set. Unversioned is the default so a lab or test worker gets tasks without anyone
        making its version current on the server first."""
        from temporalio.common import WorkerDeploymentVersion

        if not self.deployment_name and not self.build_id:
            return None
        if not self.deployment_name or not self.build_id:
            missing = "MILLWRIGHT_DEPLOYMENT_NAME" if not self.deployment_name else "MILLWRIGHT_BUILD_ID"
            raise ConfigError(f"Worker Versioning is half configured: {missing} is not set")
        return WorkerDeploymentVersion(deployment_name=self.deployment_name, build_id=self.build_id)

    def sites(self):
        """The site map, checked, or None without one; ConfigError naming the file and the field at fault."""
        from activities.sites import SiteMap

        if not self.site_map:
            return None
        if self.site:
            raise ConfigError("MILLWRIGHT_SITE_MAP is the central worker's; a site's worker (MILLWRIGHT_SITE) takes "
                              "only its site's calls and reads none")  # fmt: skip
        try:
            return SiteMap.load(self.site_map)
        except ValueError as err:
            raise ConfigError(f"MILLWRIGHT_SITE_MAP: {err}") from None

    def fault_event_config(self):
        """(FaultEventSettings, token reference or None), checked; ConfigError naming the setting at fault."""
        from activities.support.secrets import SecretRef
        from worker.fault_events import FaultEventSettings

        if not self.fault_events_clusters:
            raise ConfigError("MILLWRIGHT_FAULT_EVENTS is on but MILLWRIGHT_FAULT_EVENTS_CLUSTERS names no cluster")
        if self.site_map:
            raise ConfigError("MILLWRIGHT_FAULT_EVENTS watches the clusters' nodes: run it in a site's worker "
                              "(MILLWRIGHT_SITE), not in the central worker with MILLWRIGHT_SITE_MAP")  # fmt: skip
        try:
            token = SecretRef.parse(self.fault_events_token) if self.fault_events_token else None
        except ValueError as err:
            raise ConfigError(f"MILLWRIGHT_FAULT_EVENTS_TOKEN: {err}") from None
        if not self.fault_events_settings:
            return FaultEventSettings(), token
        path = Path(self.fault_events_settings).expanduser()
        try:
            return FaultEventSettings.model_validate_json(path.read_text()), token
        except OSError as err:
            raise ConfigError(f"MILLWRIGHT_FAULT_EVENTS_SETTINGS: {err}") from None
        except ValueError as err:
            errors = getattr(err, "errors", lambda: [])()
            where = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in errors) or str(err)
            raise ConfigError(f"MILLWRIGHT_FAULT_EVENTS_SETTINGS ({path}): {where}") from None
