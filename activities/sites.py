"""Sites: the places whose systems (Kubernetes API servers, BMC networks, UFM, Ironic) are reachable only from inside.

Each site runs its own workers (``MILLWRIGHT_SITE=<site>``) on task queue ``millwright-site-<site>``; the central
worker reads the site map (``MILLWRIGHT_SITE_MAP``, a JSON file of :class:`SiteMap`) and sends each call to the site
of the cluster or BMC it names (worker/site_routing.py). docs/sites-and-campaigns.md says how to deploy them.
"""

from __future__ import annotations

import fnmatch
import ipaddress
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator

from activities.models import StrictModel

SITE_NAME = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
SITE_QUEUE_PREFIX = "millwright-site-"
SITE_WAIT = "**site unreachable**"  # how a run's current details line for a site that takes no calls starts


def site_task_queue(site: str) -> str:
    """The task queue a site's workers poll."""
    return f"{SITE_QUEUE_PREFIX}{site}"


class Site(StrictModel):
    """What belongs to one site."""

    clusters: list[str] = Field(
        default_factory=list, description="The site's clusters, by the name runs give them (the kubeconfig context)."
    )
    fabrics: list[str] = Field(
        default_factory=list, description="The site's InfiniBand fabrics (their UFM), by the name runs give them."
    )
    bmcs: list[str] = Field(
        default_factory=list,
        description="The site's BMCs: a network (CIDR, e.g. 10.20.0.0/16) or a glob over a BMC URL's host[:port] "
        "(e.g. 'bmc-*.east.example.com', '10.20.*')",
    )

    @field_validator("bmcs")
    @classmethod
    def _patterns(cls, value: list[str]) -> list[str]:
        for pattern in value:
            if not pattern.strip():
                raise ValueError("a BMC pattern is empty")
        return value


class SiteMap(StrictModel):
    """Every site and what belongs to it; a cluster belongs to one site at most."""

    sites: dict[str, Site] = Field(min_length=1)

    @field_validator("sites")
    @classmethod
    def _names(cls, value: dict[str, Site]) -> dict[str, Site]:
        import re

        for name in value:
            if len(name) > 40 or not re.match(SITE_NAME, name):
                raise ValueError(f"site name {name!r} must be lowercase letters, digits and '-', at most 40 characters")
        return value

    @model_validator(mode="after")
    def _one_site_per_cluster(self) -> SiteMap:
        seen: dict[str, str] = {}
        for site, declared in self.sites.items():
            for cluster in declared.clusters:
                if cluster in seen:
                    raise ValueError(f"cluster {cluster!r} is in two sites: {seen[cluster]} and {site}")
                seen[cluster] = site
        return self

    def site_of_cluster(self, cluster: str) -> str | None:
        return next((site for site, declared in self.sites.items() if cluster in declared.clusters), None)

    def site_of_fabric(self, fabric: str) -> str | None:
        return next((site for site, declared in self.sites.items() if fabric in declared.fabrics), None)

    def site_of_bmc(self, url: str) -> str | None:
        """The site whose BMC patterns match the URL's host (a network) or host[:port] (a glob); the first declared."""
        parts = urlsplit(url if "//" in url else f"//{url}")
        host = parts.hostname or ""
        address = f"{host}:{parts.port}" if parts.port else host
        for site, declared in self.sites.items():
            if any(_matches(pattern, host, address) for pattern in declared.bmcs):
                return site
        return None

    @classmethod
    def load(cls, path: str | Path) -> SiteMap:
        """The map in a JSON file; ValueError naming the file and the field at fault."""
        file = Path(path).expanduser()
        try:
            return cls.model_validate_json(file.read_text())
        except OSError as err:
            raise ValueError(f"{file}: {err.strerror or err}") from None
        except ValueError as err:
            errors: list[Any] = getattr(err, "errors", lambda: [])()
            where = "; ".join(f"{'.'.join(map(str, e['loc'])) or '(top)'}: {e['msg']}" for e in errors) or str(err)
            raise ValueError(f"{file}: {where}") from None


def _matches(pattern: str, host: str, address: str) -> bool:
    try:
        network = ipaddress.ip_network(pattern, strict=False)
    except ValueError:
        return fnmatch.fnmatchcase(address, pattern) or fnmatch.fnmatchcase(host, pattern)
    try:
        return ipaddress.ip_address(host) in network
    except ValueError:
        return False
