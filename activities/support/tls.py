"""TLS for every integration: what a client trusts, and which failures mean "certificate or hostname".

What a client trusts is a setting of each integration (docs/production.md, "TLS to the integrations"):

- the default CAs (certifi's bundle for the HTTP clients, the kubeconfig's CA for Kubernetes);
- a CA bundle reference ``file:/path/to/ca.pem``: the PEM file is read inside the activity at each attempt, so a
  rotated bundle is picked up without restarting the worker, and only the reference enters inputs and histories;
  the bundle replaces the default CAs for that integration;
- verification off (``verify_tls: false``), where the user accepts an unverified connection.

Beside what it trusts, a client may present a certificate of its own (mutual TLS, `ClientCertificate`): two secret
references, to the PEM certificate and to its key, read inside the activity at each attempt like the CA bundle.

A certificate the client does not trust, or one issued for another host name, is a configuration problem no retry
fixes: `Trust.failure` turns it into a non-retryable ``TlsVerificationFailed`` whose message carries the TLS error
and the setting that fixes it, instead of the "does not answer" that would have been retried for an hour. A CA
bundle reference that cannot be read, or holds no certificate, is a non-retryable ``TlsNotConfigured``.
`verification_error` is the one place that knows how each client library (requests/urllib3 under sushy and
pynetbox, httpx, aiohttp under the Kubernetes client) wraps the `ssl` error.
"""

from __future__ import annotations

import os
import ssl
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from temporalio.exceptions import ApplicationError

from activities.support.secrets import SecretError, SecretRef

TLS_VERIFICATION_FAILED = "TlsVerificationFailed"
TLS_NOT_CONFIGURED = "TlsNotConfigured"

# OpenSSL's X509_V_ERR_HOSTNAME_MISMATCH and X509_V_ERR_IP_ADDRESS_MISMATCH: the chain is trusted, the name is not.
_NAME_MISMATCH = (62, 64)
_REFERENCE_FORM = "a CA bundle reference is 'file:/path/to/ca.pem'"


def ca_bundle_path(reference: str) -> Path:
    """The file a CA bundle reference (``file:/path/to/ca.pem``) names; ValueError for anything else."""
    kind, sep, path = reference.strip().partition(":")
    if not sep or kind != "file" or not path.strip():
        raise ValueError(f"{reference!r} is not a CA bundle reference: {_REFERENCE_FORM}")
    return Path(path.strip()).expanduser()


def ca_bundle_ref(value: str | None) -> str | None:
    """A field validator for ``ca_bundle: str | None`` fields: the reference's form, checked at the edge."""
    if value is not None:
        ca_bundle_path(value)
    return value


@dataclass(frozen=True)
class TlsFix:
    """How the user fixes a TLS failure of one integration, in the words of its settings."""

    ca: str  # where a CA bundle reference goes, e.g. "bmc.ca_bundle or MILLWRIGHT_BMC_CA_BUNDLE"
    off: str  # how verification is turned off, e.g. "bmc.verify_tls: false"


@dataclass(frozen=True)
class ClientCertificate:
    """The certificate a client presents (mutual TLS): secret references to the PEM certificate and its PEM key.

    ``file:/path`` is loaded from that path; ``env:NAME`` holds the PEM text itself, written for the load to a
    private temporary directory that is removed at once. `setting` names where the references were configured."""

    cert: SecretRef
    key: SecretRef
    setting: str

    def load_into(self, context: ssl.SSLContext) -> None:
        """Load the pair into `context`; a non-retryable TlsNotConfigured naming `setting` when it cannot."""
        try:
            with tempfile.TemporaryDirectory(prefix="mw-client-cert-") as tmp:
                context.load_cert_chain(self._pem_file(self.cert, tmp, "cert.pem"),
                                        self._pem_file(self.key, tmp, "key.pem"))  # fmt: skip
        except SecretError as err:
            raise ApplicationError(f"{self.setting}: {err}", type=TLS_NOT_CONFIGURED, non_retryable=True) from None
        except ssl.SSLError as err:  # before OSError, its base: read, but not a certificate and its key
            raise ApplicationError(f"{self.setting} ({self.cert}, {self.key}): not a PEM certificate and its "
                                   f"private key ({err.reason or err})", type=TLS_NOT_CONFIGURED,
                                   non_retryable=True) from None  # fmt: skip
        except OSError as err:
            raise ApplicationError(f"{self.setting} ({self.cert}, {self.key}): cannot read: "
                                   f"{err.strerror or type(err).__name__}", type=TLS_NOT_CONFIGURED,
                                   non_retryable=True) from None  # fmt: skip

    @staticmethod
    def _pem_file(ref: SecretRef, tmp: str, name: str) -> str:
        if ref.source == "file":
            return str(Path(ref.name).expanduser())
        path = os.path.join(tmp, name)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(ref.resolve() + "\n")
        return path


@dataclass(frozen=True)
class Trust:
    """What one client trusts, resolved inside an activity attempt (see `resolve`), and the certificate it
    presents, if any."""

    verify: bool
    ca_file: Path | None
    fix: TlsFix
    described: str  # what the failure message says was trusted
    client_context: ssl.SSLContext | None = None  # with the client certificate loaded (mutual TLS)

    @classmethod
    def resolve(cls, fix: TlsFix, *, verify: bool = True, ca_bundle: str | None = None,
                setting: str = "ca_bundle", client_cert: ClientCertificate | None = None) -> Trust:  # fmt: skip
        """Read the CA bundle `ca_bundle` (a reference, from `setting`) now; verification off ignores it. With
        `client_cert`, also load the client certificate the connection presents.

        Raises a non-retryable TlsNotConfigured naming the setting when a file cannot be read or holds no
        certificate."""
        trust = cls._resolve(fix, verify=verify, ca_bundle=ca_bundle, setting=setting)
        if client_cert is None:
            return trust
        context = trust._verifying_context()
        client_cert.load_into(context)
        return cls(verify=trust.verify, ca_file=trust.ca_file, fix=fix, described=trust.described,
                   client_context=context)  # fmt: skip

    def _verifying_context(self) -> ssl.SSLContext:
        """A context verifying as this Trust says (the default CAs are certifi's, as httpx's)."""
        if not self.verify:
            context = ssl.create_default_context()
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
            return context
        import certifi

        return ssl.create_default_context(cafile=str(self.ca_file) if self.ca_file else certifi.where())

    @classmethod
    def _resolve(cls, fix: TlsFix, *, verify: bool, ca_bundle: str | None, setting: str) -> Trust:
        if not verify:
            return cls(verify=False, ca_file=None, fix=fix, described="verification off")
        if ca_bundle is None:
            return cls(verify=True, ca_file=None, fix=fix, described="trusting the default CAs")
        try:
            path = ca_bundle_path(ca_bundle)
            ssl.create_default_context(cafile=str(path))  # the same check the clients make, with a clearer message
        except ValueError as err:  # a malformed reference
            raise ApplicationError(f"{setting}: {err}", type=TLS_NOT_CONFIGURED, non_retryable=True) from None
        except ssl.SSLError as err:  # before OSError, its base: the file was read and holds no certificate
            raise ApplicationError(f"{setting} {ca_bundle}: {path} holds no PEM certificate ({err.reason})",
                                   type=TLS_NOT_CONFIGURED, non_retryable=True) from None  # fmt: skip
        except OSError as err:
            reason = err.strerror or getattr(err, "reason", None) or type(err).__name__
            raise ApplicationError(f"{setting} {ca_bundle}: cannot read {path}: {reason}", type=TLS_NOT_CONFIGURED,
                                   non_retryable=True) from None  # fmt: skip
        return cls(verify=True, ca_file=path, fix=fix, described=f"trusting only the CAs in {setting} {ca_bundle}")

    def for_requests(self) -> bool | str:
        """`verify` for requests (sushy, pynetbox): False, a CA file's path, or True."""
        if not self.verify:
            return False
        return str(self.ca_file) if self.ca_file else True

    def for_httpx(self) -> bool | ssl.SSLContext:
        """`verify` for httpx: False, a context trusting the CA file, or True (httpx's default CAs); with a client
        certificate, always a context presenting it."""
        if self.client_context is not None:
            return self.client_context
        if not self.verify:
            return False
        return self._verifying_context() if self.ca_file else True

    def failure(self, err: BaseException, where: str) -> ApplicationError | None:
        """The non-retryable error for a certificate or hostname failure in `err`; None for any other error."""
        return verification_failed(err, where, self.described, self.fix)


def verification_error(err: BaseException) -> ssl.SSLCertVerificationError | None:
    """The certificate verification error behind `err`, however the client library wrapped it, or None.

    requests keeps urllib3's error in ``args`` (a MaxRetryError whose ``reason`` is urllib3's SSLError, whose
    ``args`` hold the `ssl` error); sushy raises its ConnectionError inside the handler (``__context__``); httpx
    chains httpcore's error with ``__cause__``; aiohttp's ClientConnectorCertificateError has
    ``certificate_error``. Only verification errors count: a handshake that fails otherwise (an HTTPS client
    on a plain HTTP port) is left to each integration's own mapping."""
    seen: set[int] = set()
    todo: list[BaseException] = [err]
    while todo:
        e = todo.pop(0)
        if id(e) in seen:
            continue
        seen.add(id(e))
        # aiohttp's ClientConnectorCertificateError is an SSLCertVerificationError too (ssl.CertificateError is
        # its alias), without the verify fields: the one to report is its certificate_error.
        if isinstance(e, ssl.SSLCertVerificationError) and hasattr(e, "verify_code"):
            return e
        linked = (e.__cause__, e.__context__, getattr(e, "reason", None), getattr(e, "certificate_error", None),
                  *getattr(e, "args", ()))  # fmt: skip
        todo += [x for x in linked if isinstance(x, BaseException)]
    return None


def verification_failed(err: BaseException, where: str, trusting: str, fix: TlsFix) -> ApplicationError | None:
    """`Trust.failure` for clients whose trust is not a `Trust` (Kubernetes: the kubeconfig's CA)."""
    problem = verification_error(err)
    if problem is None:
        return None
    detail = (problem.verify_message or problem.reason or str(problem)).rstrip(".")
    if problem.verify_code in _NAME_MISMATCH:
        text = (f"{where}: TLS hostname verification failed: {detail}. The certificate is trusted but issued for "
                f"other names: use a URL whose host the certificate names, or, accepting an unverified "
                f"connection, set {fix.off}")  # fmt: skip
    else:
        text = (f"{where}: TLS certificate verification failed: {detail} ({trusting}). Trust the CA that issued "
                f"the certificate with {fix.ca} (a reference file:/path/to/ca.pem), or, accepting an unverified "
                f"connection, set {fix.off}")  # fmt: skip
    return ApplicationError(text, type=TLS_VERIFICATION_FAILED, non_retryable=True)


class TrustingClient(httpx.AsyncClient):
    """An httpx client that verifies certificates as `trust` says, and keeps it for mapping its errors."""

    def __init__(self, trust: Trust, **kwargs: Any) -> None:
        super().__init__(verify=trust.for_httpx(), **kwargs)
        self.trust = trust
