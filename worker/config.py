"""Worker settings, read from ``MILLWRIGHT_*`` environment variables.

The Temporal connection itself (address, namespace, API key, TLS) is not here: it comes
from Temporal's own environment configuration (``TEMPORAL_*`` variables and TOML
profiles), see :func:`worker.main.connect_config`.

TLS to the integrations (BMCs, NetBox, UFM, Ironic, Prometheus): ``MILLWRIGHT_<NAME>_CA_BUNDLE``
is a CA bundle reference (``file:/path/to/ca.pem``, read by the activities at each attempt)
that replaces the default CAs; ``MILLWRIGHT_<NAME>_VERIFY_TLS=false`` turns verification off.
Kubernetes takes its CA from the kubeconfig, webhooks from each target (activities/support/tls.py).
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from activities.capi.models import DEFAULT_RESERVED_GROUPS
from activities.models import BaseUrl, Host

_CA_BUNDLE = (
    "CA bundle reference (file:/path/to/ca.pem) {what} certificates are verified against; default: the default CAs"
)
_VERIFY_TLS = "false: accept any certificate from {what} (the connection is then not authenticated)"


class ConfigError(Exception):
    """A configuration problem, reported as one line without a traceback."""


class WorkerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="MILLWRIGHT_", extra="ignore")

    task_queue: str = "millwright"
    deployment_name: str | None = Field(
        None,
        pattern=r"^[^.]+$",
        description="Worker Versioning: the Worker Deployment this worker belongs to (no '.'), with "
        "MILLWRIGHT_BUILD_ID; unset: the worker is unversioned (docs/production.md, Upgrades)",
    )
    build_id: str | None = Field(
        None, min_length=1, description="Worker Versioning: this image's build ID, with MILLWRIGHT_DEPLOYMENT_NAME"
    )
    metrics_port: int = Field(9464, ge=0, le=65535, description="Prometheus port; 0 turns metrics off")
    metrics_host: Host = Field("0.0.0.0", description="Prometheus bind address")
    kubeconfig: str | None = Field(
        None, description="os.pathsep-separated kubeconfig files; default $KUBECONFIG, then ~/.kube/config"
    )
    shutdown_grace_seconds: float = Field(60.0, ge=0)
    max_concurrent_activities: int | None = Field(None, ge=1)
    log_level: str = "INFO"
    netbox_url: BaseUrl | None = Field(None, description="NetBox base URL, e.g. https://netbox.example.com")
    netbox_token: str | None = Field(
        None, description="Secret reference to the NetBox API token: env:NAME or file:/path (never the token itself)"
    )
    netbox_ca_bundle: str | None = Field(None, description=_CA_BUNDLE.format(what="NetBox's"))
    netbox_verify_tls: bool = Field(True, description=_VERIFY_TLS.format(what="NetBox"))

    ufm_url: BaseUrl | None = Field(None, description="NVIDIA UFM base URL, e.g. https://ufm.example.com")
    ufm_credentials: str | None = Field(
        None, description="Secret reference to UFM's user:password or access token: env:NAME or file:/path"
    )
    ufm_client_cert: str | None = Field(
        None,
        description="Secret reference to a PEM client certificate UFM authenticates (mutual TLS): file:/path "
        "or env:NAME holding the PEM; with MILLWRIGHT_UFM_CLIENT_KEY",
    )
    ufm_client_key: str | None = Field(None, description="Secret reference to the client certificate's PEM key")
    ufm_ca_bundle: str | None = Field(None, description=_CA_BUNDLE.format(what="UFM's"))
    ufm_verify_tls: bool = Field(True, description=_VERIFY_TLS.format(what="UFM"))
    ironic_url: BaseUrl | None = Field(
        None, description="OpenStack Ironic root URL, e.g. http://ironic.example.com:6385"
    )
    ironic_token: str | None = Field(
        None, description="Secret reference to a Keystone token for Ironic: env:NAME or file:/path (none: noauth)"
    )
    ironic_ca_bundle: str | None = Field(None, description=_CA_BUNDLE.format(what="Ironic's"))
    ironic_verify_tls: bool = Field(True, description=_VERIFY_TLS.format(what="Ironic"))
    prometheus_url: BaseUrl | None = Field(
        None,
        description="Prometheus base URL the remediation sweep reads dcgm-exporter's GPU fault series from, "
        "e.g. http://prometheus:9090 (none: the sweep does not use that signal, and says so)",
    )
    usage_sink_dir: str | None = Field(
        None,
        description="Directory TenantUsage writes its GPU-hours reports to, <dir>/<cluster>/<period>.json and "
        ".csv (none: reports are in the run's result only)",
    )
    prometheus_ca_bundle: str | None = Field(None, description=_CA_BUNDLE.format(what="Prometheus servers'"))
    prometheus_verify_tls: bool = Field(True, description=_VERIFY_TLS.format(what="Prometheus servers"))

    bmc_credentials: str | None = Field(
        None,
        description="Secret reference to BMCs' default user:password (env:NAME or file:/path); a server's own "
        "reference (e.g. from NetBox) takes precedence",
    )
    bmc_ca_bundle: str | None = Field(
        None, description=_CA_BUNDLE.format(what="BMCs'") + "; a server's own BmcRef.ca_bundle takes precedence"
    )
    bmc_verify_tls: bool = Field(
        True, description=_VERIFY_TLS.format(what="every BMC") + "; BmcRef.verify_tls: false does it for one BMC"
    )

    reserved_groups: list[str] = Field(
        default_factory=lambda: list(DEFAULT_RESERVED_GROUPS),
        description="Identity groups no tenant binding may name (besides every system:* group), as a JSON list, "
        'e.g. \'["kubeadm:cluster-admins", "platform-admins"]\'; default: kubeadm\'s cluster-admins group',
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

    def netbox_config(self):
        """The NetBox connection (URL + token reference), or None when NetBox is not configured."""
        from activities.netbox.client import NetBoxConfig
        from activities.support.secrets import SecretRef

        if not self.netbox_url and not self.netbox_token:
            return None
        if not self.netbox_url or not self.netbox_token:
            missing = "MILLWRIGHT_NETBOX_URL" if not self.netbox_url else "MILLWRIGHT_NETBOX_TOKEN"
            raise ConfigError(f"NetBox is half configured: {missing} is not set")
        try:
            token = SecretRef.parse(self.netbox_token)
        except ValueError as err:
            raise ConfigError(f"MILLWRIGHT_NETBOX_TOKEN: {err}") from None
        return NetBoxConfig(url=self.netbox_url.rstrip("/"), token=token, ca_bundle=self.ca_bundle("netbox"),
                            verify_tls=self.netbox_verify_tls)  # fmt: skip

    def ufm_config(self):
        """The UFM connection (URL + credentials and/or client certificate references), or None when UFM is not
        configured."""
        from activities.support.secrets import SecretRef
        from activities.ufm.client import UfmConfig

        auth = {"MILLWRIGHT_UFM_CREDENTIALS": self.ufm_credentials, "MILLWRIGHT_UFM_CLIENT_CERT": self.ufm_client_cert,
                "MILLWRIGHT_UFM_CLIENT_KEY": self.ufm_client_key}  # fmt: skip
        if not self.ufm_url and not any(auth.values()):
            return None
        if not self.ufm_url or not (self.ufm_credentials or self.ufm_client_cert):
            missing = "MILLWRIGHT_UFM_URL" if not self.ufm_url else "MILLWRIGHT_UFM_CREDENTIALS (or _CLIENT_CERT)"
            raise ConfigError(f"UFM is half configured: {missing} is not set")
        if bool(self.ufm_client_cert) != bool(self.ufm_client_key):
            raise ConfigError("MILLWRIGHT_UFM_CLIENT_CERT and MILLWRIGHT_UFM_CLIENT_KEY go together")
        refs = {}
        for name, value in auth.items():
            try:
                refs[name] = SecretRef.parse(value) if value else None
            except ValueError as err:
                raise ConfigError(f"{name}: {err}") from None
        return UfmConfig(url=self.ufm_url.rstrip("/"), credentials=refs["MILLWRIGHT_UFM_CREDENTIALS"],
                         client_cert=refs["MILLWRIGHT_UFM_CLIENT_CERT"], client_key=refs["MILLWRIGHT_UFM_CLIENT_KEY"],
                         ca_bundle=self.ca_bundle("ufm"), verify_tls=self.ufm_verify_tls)  # fmt: skip

    def ironic_config(self):
        """The Ironic connection (URL + optional token reference), or None when Ironic is not configured."""
        from activities.ironic.client import IronicConfig
        from activities.support.secrets import SecretRef

        if not self.ironic_url and not self.ironic_token:
            return None
        if not self.ironic_url:
            raise ConfigError("Ironic is half configured: MILLWRIGHT_IRONIC_URL is not set")
        token = None
        if self.ironic_token:
            try:
                token = SecretRef.parse(self.ironic_token)
            except ValueError as err:
                raise ConfigError(f"MILLWRIGHT_IRONIC_TOKEN: {err}") from None
        return IronicConfig(url=self.ironic_url.rstrip("/"), token=token, ca_bundle=self.ca_bundle("ironic"),
                            verify_tls=self.ironic_verify_tls)  # fmt: skip

    def bmc_credentials_ref(self):
        """The default BMC credentials reference, or None (then every server must name its own)."""
        from activities.support.secrets import SecretRef

        if not self.bmc_credentials:
            return None
        try:
            return SecretRef.parse(self.bmc_credentials)
        except ValueError as err:
            raise ConfigError(f"MILLWRIGHT_BMC_CREDENTIALS: {err}") from None

    def fault_event_config(self):
        """(FaultEventSettings, token reference or None), checked; ConfigError naming the setting at fault."""
        from activities.support.secrets import SecretRef
        from worker.fault_events import FaultEventSettings

        if not self.fault_events_clusters:
            raise ConfigError("MILLWRIGHT_FAULT_EVENTS is on but MILLWRIGHT_FAULT_EVENTS_CLUSTERS names no cluster")
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

    def ca_bundle(self, integration: str) -> str | None:
        """MILLWRIGHT_<INTEGRATION>_CA_BUNDLE (bmc, netbox, ufm, ironic, prometheus), checked to be a CA bundle
        reference; the file itself is read by the activities, at each attempt."""
        from activities.support.tls import ca_bundle_path

        value = getattr(self, f"{integration}_ca_bundle")
        if value is not None:
            try:
                ca_bundle_path(value)
            except ValueError as err:
                raise ConfigError(f"MILLWRIGHT_{integration.upper()}_CA_BUNDLE: {err}") from None
        return value
