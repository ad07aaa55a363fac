"""NVIDIA UFM as the worker sees it: MILLWRIGHT_UFM_* and the UFM activities."""

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
    from activities.ufm.client import UfmConfig


class UfmSettings(SystemSettings):
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
    ufm_ca_bundle: str | None = ca_bundle_field("UFM's")
    ufm_verify_tls: bool = verify_tls_field("UFM")

    def ufm_config(self) -> UfmConfig | None:
        """The UFM connection (URL + credentials and/or client certificate references), or None when UFM is not
        configured."""
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
        refs = {name: secret_ref(value, name) if value else None for name, value in auth.items()}
        ca_bundle = self.ca_bundle("ufm")
        return UfmConfig(url=self.ufm_url.rstrip("/"), credentials=refs["MILLWRIGHT_UFM_CREDENTIALS"],
                         client_cert=refs["MILLWRIGHT_UFM_CLIENT_CERT"], client_key=refs["MILLWRIGHT_UFM_CLIENT_KEY"],
                         ca_bundle=ca_bundle, verify_tls=self.ufm_verify_tls)  # fmt: skip


class Ufm(Service[UfmSettings]):
    name = "UFM"
    settings = UfmSettings
    packages = ("activities.ufm",)
    in_site = True
    system, secret, not_configured = "ufm", "credentials", "UfmNotConfigured"

    def build(self, settings: UfmSettings) -> Parts:
        from activities.ufm.activities import UfmActivities

        ufm = UfmActivities(settings.ufm_config())  # without UFM settings: UfmNotConfigured, non-retryable
        return Parts([ufm], [ufm])
