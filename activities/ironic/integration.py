"""OpenStack Ironic as the worker sees it: MILLWRIGHT_IRONIC_* and the Ironic activities."""

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
    from activities.ironic.client import IronicConfig


class IronicSettings(SystemSettings):
    ironic_url: BaseUrl | None = Field(
        None, description="OpenStack Ironic root URL, e.g. http://ironic.example.com:6385"
    )
    ironic_token: str | None = Field(
        None, description="Secret reference to a Keystone token for Ironic: env:NAME or file:/path (none: noauth)"
    )
    ironic_ca_bundle: str | None = ca_bundle_field("Ironic's")
    ironic_verify_tls: bool = verify_tls_field("Ironic")

    def ironic_config(self) -> IronicConfig | None:
        """The Ironic connection (URL + optional token reference), or None when Ironic is not configured."""
        from activities.ironic.client import IronicConfig

        if not self.ironic_url and not self.ironic_token:
            return None
        if not self.ironic_url:
            raise ConfigError("Ironic is half configured: MILLWRIGHT_IRONIC_URL is not set")
        token = secret_ref(self.ironic_token, "MILLWRIGHT_IRONIC_TOKEN") if self.ironic_token else None
        ca_bundle = self.ca_bundle("ironic")
        return IronicConfig(url=self.ironic_url.rstrip("/"), token=token, ca_bundle=ca_bundle,
                            verify_tls=self.ironic_verify_tls)  # fmt: skip


class Ironic(Service[IronicSettings]):
    name = "Ironic"
    settings = IronicSettings
    packages = ("activities.ironic",)
    in_site = True
    system, secret, not_configured = "ironic", "token", "IronicNotConfigured"
    no_secret = "none: noauth"

    def build(self, settings: IronicSettings) -> Parts:
        from activities.ironic.activities import IronicActivities

        ironic = IronicActivities(settings.ironic_config())  # without Ironic settings: IronicNotConfigured
        return Parts([ironic], [ironic])
