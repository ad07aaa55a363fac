"""The servers' BMCs as the worker sees them: MILLWRIGHT_BMC_* and the activities that speak Redfish to them (power,
boot, inventory: activities/redfish.py; firmware updates, built on those: this package)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import Field

from activities.support.integration import (
    Integration,
    Parts,
    SystemSettings,
    ca_bundle_field,
    secret_ref,
    trust,
    verify_tls_field,
)

if TYPE_CHECKING:
    from activities.support.secrets import SecretRef


class BmcSettings(SystemSettings):
    bmc_credentials: str | None = Field(
        None,
        description="Secret reference to BMCs' default user:password (env:NAME or file:/path); a server's own "
        "reference (e.g. from NetBox) takes precedence",
    )
    bmc_ca_bundle: str | None = ca_bundle_field("BMCs'", "; a server's own BmcRef.ca_bundle takes precedence")
    bmc_verify_tls: bool = verify_tls_field("every BMC", "; BmcRef.verify_tls: false does it for one BMC")

    def bmc_credentials_ref(self) -> SecretRef | None:
        """The default BMC credentials reference, or None (then every server must name its own)."""
        return secret_ref(self.bmc_credentials, "MILLWRIGHT_BMC_CREDENTIALS") if self.bmc_credentials else None


class Bmcs(Integration[BmcSettings]):
    name = "BMCs (Redfish)"
    settings = BmcSettings
    packages = ("activities.redfish", "activities.firmware")
    in_site = True

    def build(self, settings: BmcSettings) -> Parts:
        from activities.firmware.activities import FirmwareActivities
        from activities.redfish import RedfishActivities

        trusted: dict[str, Any] = dict(ca_bundle=settings.ca_bundle("bmc"),
                                       verify_tls=settings.bmc_verify_tls)  # fmt: skip
        redfish = RedfishActivities(settings.bmc_credentials_ref(), **trusted)
        firmware = FirmwareActivities(settings.bmc_credentials_ref(), **trusted)
        return Parts([redfish, firmware], [redfish, firmware])

    def describe(self, settings: BmcSettings) -> str:
        default = (
            f"default credentials {settings.bmc_credentials}"
            if settings.bmc_credentials
            else "no default credentials (each server names its own)"
        )
        return f"{default}, {trust(settings.bmc_verify_tls, settings.bmc_ca_bundle)}"
