"""One object per external system: the settings it reads, the activities objects it builds from them, the clients
to close when the worker stops, and its line in the worker's start-up log.

The worker iterates the list of them (activities/integrations.py) instead of wiring each system by hand, so a new
system is its own package with an ``integration.py``, one line in that list, and its docs (docs/architecture.md).
A system's settings are a mixin of the worker's settings (worker/config.py ``WorkerSettings``): its fields are named
after the system (``netbox_url`` is ``MILLWRIGHT_NETBOX_URL``), so each environment variable is the one it always was.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

from pydantic import BaseModel, Field

if TYPE_CHECKING:
    from activities.support.secrets import SecretRef

CA_BUNDLE = (
    "CA bundle reference (file:/path/to/ca.pem) {what} certificates are verified against; default: the default CAs"
)
VERIFY_TLS = "false: accept any certificate from {what} (the connection is then not authenticated)"


class ConfigError(Exception):
    """A configuration problem, reported as one line without a traceback."""


@dataclass
class Parts:
    """What an integration builds from its settings."""

    activities: list[Any]  # objects whose methods marked @activity.defn the worker registers
    resources: list[Any] = field(default_factory=list)  # objects with ``async close()``, closed when the worker stops


S = TypeVar("S", bound="SystemSettings")


class Integration(ABC, Generic[S]):
    """An external system as the worker sees it. `settings` is the model of the fields it reads (a mixin of the
    worker's settings, so `build` and `describe` receive the worker's settings object); `packages` are the
    activities modules whose activities it registers (tests/test_architecture.py checks each system has one)."""

    name: ClassVar[str]  # as the start-up log names it
    settings: ClassVar[type[SystemSettings]]
    packages: ClassVar[tuple[str, ...]]
    # Whether it is reachable only from inside a site (activities/sites.py): a site's worker builds these, and with a
    # site map the central worker leaves them to the sites.
    in_site: ClassVar[bool] = False

    @abstractmethod
    def build(self, settings: S) -> Parts:
        """The activities objects (and the clients to close), from the settings; ConfigError for settings that
        cannot work, naming the variable."""

    def describe(self, settings: S) -> str | None:
        """What it is configured as, in one line for the start-up log (references, never secrets); None: no line."""
        return None

    @classmethod
    def environment(cls, **values: str) -> dict[str, str]:
        """The environment variables that set these fields of its settings (for the lab, which writes a worker's
        environment); a field it does not have is refused."""
        unknown = set(values) - set(cls.settings.model_fields)
        if unknown:
            raise ValueError(f"{cls.name} has no setting {', '.join(sorted(unknown))}")
        return {f"MILLWRIGHT_{name.upper()}": value for name, value in values.items()}


class SystemSettings(BaseModel):
    """The base of a system's settings: its fields are named ``<system>_<setting>``."""

    def ca_bundle(self, system: str) -> str | None:
        """MILLWRIGHT_<SYSTEM>_CA_BUNDLE, checked to be a CA bundle reference; the file itself is read by the
        activities, at each attempt."""
        from activities.support.tls import ca_bundle_path

        value = getattr(self, f"{system}_ca_bundle")
        if value is not None:
            try:
                ca_bundle_path(value)
            except ValueError as err:
                raise ConfigError(f"MILLWRIGHT_{system.upper()}_CA_BUNDLE: {err}") from None
        return value


class NoSettings(SystemSettings):
    """The settings of a system that reads none."""


class Plain(Integration[NoSettings]):
    """A system that reads no settings: one activities object, built without arguments."""

    settings = NoSettings
    activities_class: ClassVar[type]

    def build(self, settings: NoSettings) -> Parts:
        return Parts([self.activities_class()])


class Service(Integration[S]):
    """A service reached at ``<system>_url`` with a secret reference (NetBox, UFM, Ironic), whose activities fail with
    `not_configured` while it is unset."""

    system: ClassVar[str]  # its settings' prefix: netbox_url, NETBOX_URL
    secret: ClassVar[str]  # the secret's setting, after the prefix: netbox_token
    no_secret: ClassVar[str] = "none"  # what the log says of an unset secret
    not_configured: ClassVar[str]  # the error type of its activities while unset

    def describe(self, settings: S) -> str:
        url, secret = getattr(settings, f"{self.system}_url"), getattr(settings, f"{self.system}_{self.secret}")
        if not url:
            variable = f"MILLWRIGHT_{self.system.upper()}"
            return (f"not configured: its activities fail with {self.not_configured} (set {variable}_URL and "
                    f"{variable}_{self.secret.upper()})")  # fmt: skip
        tls = trust(getattr(settings, f"{self.system}_verify_tls"), getattr(settings, f"{self.system}_ca_bundle"))
        return f"{url} ({self.secret} {secret or self.no_secret}, {tls})"


def ca_bundle_field(what: str, more: str = "") -> Any:
    """A ``<system>_ca_bundle`` field: the reference `what`'s certificates are verified against."""
    return Field(None, description=CA_BUNDLE.format(what=what) + more)


def verify_tls_field(what: str, more: str = "") -> Any:
    """A ``<system>_verify_tls`` field: false accepts any certificate from `what`."""
    return Field(True, description=VERIFY_TLS.format(what=what) + more)


def trust(verify_tls: bool, ca_bundle: str | None) -> str:
    """What a system's certificates are verified against, for the start-up log."""
    if not verify_tls:
        return "TLS verification OFF"
    return f"CA bundle {ca_bundle}" if ca_bundle else "default CAs"


def secret_ref(value: str, variable: str) -> SecretRef:
    """A secret reference setting parsed (``env:NAME`` or ``file:/path``); ConfigError naming `variable`."""
    from activities.support.secrets import SecretRef

    try:
        return SecretRef.parse(value)
    except ValueError as err:
        raise ConfigError(f"{variable}: {err}") from None
