"""NetBox as the worker sees it: MILLWRIGHT_NETBOX_* and the NetBox activities."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field

from activities.models import BaseUrl
from activities.support.integration import (
    ConfigError,
    Parts,
    Service,
    SystemSettings,
    ca_bundle_field,
    secret_ref,
    verify_tls_field,
)

if TYPE_CHECKING:
    from activities.netbox.client import NetBoxConfig


class NetBoxSettings(SystemSettings):
    netbox_url: BaseUrl | None = Field(None, description="NetBox base URL, e.g. https://netbox.example.com")
    netbox_token: str | None = Field(
        None, description="Secret reference to the NetBox API token: env:NAME or file:/path (never the token itself)"
    )
    netbox_ca_bundle: str | None = ca_bundle_field("NetBox's")
    netbox_verify_tls: bool = verify_tls_field("NetBox")

    def netbox_config(self) -> NetBoxConfig | None:
        """The NetBox connection (URL + token reference), or None when NetBox is not configured."""
        from activities.netbox.client import NetBoxConfig

        if not self.netbox_url and not self.netbox_token:
            return None
        if not self.netbox_url or not self.netbox_token:
            missing = "MILLWRIGHT_NETBOX_URL" if not self.netbox_url else "MILLWRIGHT_NETBOX_TOKEN"
            raise ConfigError(f"NetBox is half configured: {missing} is not set")
        token = secret_ref(self.netbox_token, "MILLWRIGHT_NETBOX_TOKEN")
        ca_bundle = self.ca_bundle("netbox")
        return NetBoxConfig(url=self.netbox_url.rstrip("/"), token=token, ca_bundle=ca_bundle,
                            verify_tls=self.netbox_verify_tls)  # fmt: skip


class NetBox(Service[NetBoxSettings]):
    name = "NetBox"
    settings = NetBoxSettings
    packages = ("activities.netbox",)
    system, secret, not_configured = "netbox", "token", "NetBoxNotConfigured"

    def build(self, settings: NetBoxSettings) -> Parts:
        from activities.netbox.activities import NetBoxActivities

        # Always registered: without NetBox settings each one fails with a non-retryable NetBoxNotConfigured.
        netbox = NetBoxActivities(settings.netbox_config())
        return Parts([netbox], [netbox])
