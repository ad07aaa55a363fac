"""Worker settings, read from ``MILLWRIGHT_*`` environment variables.

The Temporal connection itself (address, namespace, API key, TLS) is not here: it comes
from Temporal's own environment configuration (``TEMPORAL_*`` variables and TOML
profiles), see :func:`worker.main.connect_config`.
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from activities.models import BaseUrl, Host


class ConfigError(Exception):
    """A configuration problem, reported as one line without a traceback."""


class WorkerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="MILLWRIGHT_", extra="ignore")

    task_queue: str = "millwright"
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

    ufm_url: BaseUrl | None = Field(None, description="NVIDIA UFM base URL, e.g. https://ufm.example.com")
    ufm_credentials: str | None = Field(
        None, description="Secret reference to UFM's user:password or access token: env:NAME or file:/path"
    )
    ironic_url: BaseUrl | None = Field(None, description="OpenStack Ironic root URL, e.g. http://ironic.example.com:6385")
    ironic_token: str | None = Field(
        None, description="Secret reference to a Keystone token for Ironic: env:NAME or file:/path (none: noauth)"
    )

    bmc_credentials: str | None = Field(
        None, description="Secret reference to BMCs' default user:password (env:NAME or file:/path); a server's own "
                          "reference (e.g. from NetBox) takes precedence",
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
        from activities.netbox import NetBoxConfig
        from activities.secrets import SecretRef

        if not self.netbox_url and not self.netbox_token:
            return None
        if not self.netbox_url or not self.netbox_token:
            missing = "MILLWRIGHT_NETBOX_URL" if not self.netbox_url else "MILLWRIGHT_NETBOX_TOKEN"
            raise ConfigError(f"NetBox is half configured: {missing} is not set")
        try:
            token = SecretRef.parse(self.netbox_token)
        except ValueError as err:
            raise ConfigError(f"MILLWRIGHT_NETBOX_TOKEN: {err}") from None
        return NetBoxConfig(url=self.netbox_url.rstrip("/"), token=token)

    def ufm_config(self):
        """The UFM connection (URL + credentials reference), or None when UFM is not configured."""
        from activities.secrets import SecretRef
        from activities.ufm import UfmConfig

        if not self.ufm_url and not self.ufm_credentials:
            return None
        if not self.ufm_url or not self.ufm_credentials:
            missing = "MILLWRIGHT_UFM_URL" if not self.ufm_url else "MILLWRIGHT_UFM_CREDENTIALS"
            raise ConfigError(f"UFM is half configured: {missing} is not set")
        try:
            credentials = SecretRef.parse(self.ufm_credentials)
        except ValueError as err:
            raise ConfigError(f"MILLWRIGHT_UFM_CREDENTIALS: {err}") from None
        return UfmConfig(url=self.ufm_url.rstrip("/"), credentials=credentials)

    def ironic_config(self):
        """The Ironic connection (URL + optional token reference), or None when Ironic is not configured."""
        from activities.ironic import IronicConfig
        from activities.secrets import SecretRef

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
        return IronicConfig(url=self.ironic_url.rstrip("/"), token=token)

    def bmc_credentials_ref(self):
        """The default BMC credentials reference, or None (then every server must name its own)."""
        from activities.secrets import SecretRef

        if not self.bmc_credentials:
            return None
        try:
            return SecretRef.parse(self.bmc_credentials)
        except ValueError as err:
            raise ConfigError(f"MILLWRIGHT_BMC_CREDENTIALS: {err}") from None
