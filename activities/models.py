"""The base of every Millwright model: unknown fields are refused at every depth; the base of a model of another
system's answer or payload, which ignores them; and the shared field types for where other systems are (a base
URL, a host).

A typo in JSON typed into the Temporal UI, a CLI file or another service's request (``"delete_empty_dir_data"``
inside ``drain``) must fail at the edge naming the field's full path, not be silently dropped and turn into a
default. Every model that crosses a process boundary (workflow, update and signal arguments, activity requests
and results, state carried across continue-as-new) derives from ``StrictModel``, so a new one cannot forget it.
Another system's answers are read field by field (Kubernetes objects, Redfish, UFM, NetBox, Ironic and Prometheus
JSON), so a field a newer server adds breaks nothing; a model that parses one whole (Alertmanager's webhook
payload) derives from ``ForeignModel`` instead, which ignores fields it does not know, and is listed in
tests/test_input_strictness.py ``FOREIGN``. An operator's input never does.

Pure (stdlib and pydantic): these validators also run inside the workflow sandbox, when a run decodes its input.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated
from urllib.parse import urlsplit

from pydantic import AfterValidator, BaseModel, ConfigDict, WithJsonSchema
from pydantic_core import PydanticCustomError


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ForeignModel(BaseModel):
    """Another system's answer or payload, parsed whole: a field it adds in a newer release is ignored, not refused
    (refused, the answer would be lost: Alertmanager does not retry a 4xx). Never for an operator's input."""

    model_config = ConfigDict(extra="ignore")


_DNS_LABEL = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?")
_PLACEHOLDER = re.compile(r"[<>{}\s]")  # never in a real URL or host: `<port of ...>`, `{bmc}`, `${HOST}`, blanks


def host_problem(host: str) -> str | None:
    """Why ``host`` is not a DNS name or an IP address (None: it is one)."""
    if not host:
        return "has no host"
    if _PLACEHOLDER.search(host):
        return f"host {host!r} is a placeholder or has blanks: put in the real host name or IP address"
    try:
        ipaddress.ip_address(host)
        return None
    except ValueError:
        pass
    if re.fullmatch(r"[0-9.]+", host):
        return f"host {host!r} is not an IPv4 address"
    if re.search(r"[:/@]", host):
        return f"host {host!r} is not a host name or IP address (no scheme, port or path)"
    if len(host) > 253 or not all(_DNS_LABEL.fullmatch(label) for label in host.removesuffix(".").split(".")):
        return f"host {host!r} is not a DNS name (letters, digits and '-', labels of 1-63 separated by '.')"
    return None


def base_url_problem(url: str) -> str | None:
    """Why ``url`` is not ``http(s)://host[:port][/path][?query]`` (None: it is)."""
    if _PLACEHOLDER.search(url):
        return f"{url!r} is a placeholder or has blanks: put in the real URL, e.g. https://10.0.0.5:8443"
    scheme, sep, _ = url.partition("://")
    if not sep:
        return f"{url!r} is not a URL: expected http(s)://host[:port][/path]"
    if scheme not in ("http", "https"):
        return f"{url!r}: the scheme must be http or https, not {scheme!r}"
    try:
        parts = urlsplit(url)
    except ValueError as err:  # an unclosed or misused [IPv6] bracket
        return f"{url!r}: {err}"
    if parts.fragment:
        return f"{url!r}: a base URL has no #fragment"
    netloc = parts.netloc
    if "@" in netloc:  # it would be recorded in workflow history: credentials are passed as secret references
        return "credentials do not belong in the URL: give them as a secret reference (env:NAME or file:/path)"
    if netloc.startswith("["):
        host, bracket, rest = netloc[1:].partition("]")
        if not bracket or ":" not in host or (rest and not rest.startswith(":")):
            return f"{url!r}: an IPv6 host is written [address]:port, nothing else goes in brackets"
    else:
        host, colon, port = netloc.partition(":")
        rest = colon + port
    problem = host_problem(host)
    if problem:
        return f"{url!r} {problem}" if problem == "has no host" else problem
    port = rest.removeprefix(":")
    if rest and not port:
        return f"{url!r}: the port after ':' is missing"
    if port and not (port.isascii() and port.isdigit() and 1 <= int(port) <= 65535):
        return f"port {port!r} of {url!r} is not a number from 1 to 65535"
    return None


def _checked(problem_of, kind: str):
    def check(value: str) -> str:
        problem = problem_of(value)
        if problem:  # the field's path comes from pydantic's error location
            raise PydanticCustomError(kind, "{problem}", {"problem": problem})
        return value

    return AfterValidator(check)


BaseUrl = Annotated[
    str,
    _checked(base_url_problem, "base_url"),
    WithJsonSchema({"type": "string", "format": "uri", "pattern": r"^https?://[^\s<>{}@#]+$"}),
]
"""Where an HTTP service is: ``http(s)://host[:port][/path][?query]``; a host name or IP address, a port from 1 to
65535, no credentials, no placeholder (``http://127.0.0.1:<port of ...>`` is refused, naming the field)."""

Host = Annotated[
    str,
    _checked(host_problem, "host"),
    WithJsonSchema({"type": "string", "pattern": r"^[^\s<>{}/@]+$"}),
]
"""A DNS name or an IP address (no scheme, no port)."""


class SystemIdentity(StrictModel):
    """Who the BMC's ComputerSystem says it is: its SMBIOS UUID (what a Linux host, and so its Kubernetes node's
    ``status.nodeInfo.systemUUID``, reports) and serial number."""

    uuid: str = ""
    serial: str = ""

    def same_uuid(self, other: str) -> bool:
        """`other` is this system's UUID (written in either case); never true for an unknown one."""
        return bool(self.uuid) and self.uuid.strip().lower() == other.strip().lower()
