"""The lab's certificate authority, so lab servers speak HTTPS the way production endpoints do.

``LabCa(directory)`` keeps a CA in ``directory`` (``ca.pem``, and ``ca-key.pem`` with mode 0600), created on first
use and kept afterwards, so a lab restarted on the same state directory keeps the CA a worker already trusts
(through the CA bundle reference ``LabCa.reference``: ``file:<directory>/ca.pem``). ``LabCa.issue(name, hosts)``
writes a server certificate and key signed by it, naming exactly `hosts` (IP addresses or DNS names): a client
that reaches the server by another name gets a hostname mismatch, as it would in production.
``LabCa.issue_client(name, san)`` writes a client certificate (extended key usage ``clientAuth``) whose subject
alternative name is the DNS name `san`: the identity a server that authenticates clients by certificate (UFM's
``client_cert_authentication``) maps to a user.

The lab servers take ``--tls-cert FILE --tls-key FILE`` (`add_arguments`, `server_context`) and then answer HTTPS
only; their child-process wrappers take ``tls=LabCa(...).issue(...)``. Plain HTTP stays their default. With
``--tls-client-ca FILE`` as well, a server requires a client certificate issued by that CA in the handshake (mutual
TLS, as Apache's ``SSLVerifyClient require`` in front of UFM); `peer_names` reads the names a client's certificate
carries.
`TlsFront` puts HTTPS in front of a server that speaks only HTTP (the Kubernetes emulator).

Made with the system's ``openssl`` command (1.1.1 or later): the ``cryptography`` package is not a dependency of
Millwright. EC P-256 keys; certificates carry the extensions strict verifiers ask for (basic constraints, key
usage, key identifiers), so Python's ``VERIFY_X509_STRICT`` (the default from 3.13) accepts them.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import os
import secrets
import shutil
import ssl
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

_LEAF = """\
[{usage}]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = {usage}Auth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
subjectAltName = {{names}}
"""
# A leaf certificate is issued with the section of its usage: [server] (serverAuth) or [client] (clientAuth).
_CONFIG = (
    """\
[req]
distinguished_name = dn
prompt = no
[dn]
CN = {cn}
[ca]
basicConstraints = critical, CA:TRUE
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash
"""
    + _LEAF.format(usage="server")
    + _LEAF.format(usage="client")
)
_KEY = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


class LabTlsError(Exception):
    """openssl is missing or failed; the message says what it printed."""


@dataclass(frozen=True)
class ServerCert:
    """A certificate and its key, as files: a server's (``--tls-cert`` / ``--tls-key``) or a client's."""

    cert: Path
    key: Path


ClientCert = ServerCert  # the same two files; `LabCa.issue_client` makes them with clientAuth usage


def _openssl(*args: str) -> None:
    exe = shutil.which("openssl")
    if exe is None:
        raise LabTlsError("the lab's HTTPS needs the openssl command; install it (e.g. apt-get install openssl)")
    done = subprocess.run([exe, *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise LabTlsError(f"openssl {args[0]} failed: {done.stderr.strip()[-2000:]}")


def _subject_alt_names(hosts: list[str]) -> str:
    names = []
    for host in hosts:
        try:
            names.append(f"IP:{ipaddress.ip_address(host)}")
        except ValueError:
            names.append(f"DNS:{host}")
    return ", ".join(names)


class LabCa:
    """A CA on disk in `directory`; see the module docstring."""

    def __init__(self, directory: Path | str, name: str = "Millwright lab CA") -> None:
        self.directory = Path(directory).absolute()  # handed to servers as their certificate's path
        self.name = name

    @property
    def ca_file(self) -> Path:
        return self.directory / "ca.pem"

    @property
    def reference(self) -> str:
        """The CA bundle reference a worker trusts this CA with (e.g. MILLWRIGHT_BMC_CA_BUNDLE)."""
        return f"file:{self.ca_file}"

    def _config(self, work: Path, cn: str, hosts: list[str]) -> Path:
        path = work / "openssl.cnf"
        path.write_text(_CONFIG.format(cn=cn, names=_subject_alt_names(hosts) or "DNS:localhost"))
        return path

    def ensure(self) -> LabCa:
        """Create the CA unless the directory has one."""
        key = self.directory / "ca-key.pem"
        if self.ca_file.is_file() and key.is_file():
            return self
        self.directory.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=self.directory, prefix=".ca-") as tmp:
            work = Path(tmp)
            _openssl("req", "-x509", "-new", "-config", str(self._config(work, self.name, [])), "-extensions", "ca",
                     *_KEY, "-keyout", str(work / "ca-key.pem"), "-out", str(work / "ca.pem"), "-days", "3650",
                     "-sha256")  # fmt: skip
            os.chmod(work / "ca-key.pem", 0o600)
            os.replace(work / "ca-key.pem", key)
            os.replace(work / "ca.pem", self.ca_file)
        return self

    def issue(self, name: str, hosts: list[str]) -> ServerCert:
        """A server certificate for `hosts`, signed by this CA: ``<name>.pem`` and ``<name>-key.pem`` (0600)."""
        return self._issue(name, hosts, "server")

    def issue_client(self, name: str, san: str) -> ClientCert:
        """A client certificate for the DNS name `san`, signed by this CA: ``<name>.pem``, ``<name>-key.pem``."""
        return self._issue(name, [san], "client")

    def _issue(self, name: str, hosts: list[str], extensions: str) -> ServerCert:
        self.ensure()
        cert, key = self.directory / f"{name}.pem", self.directory / f"{name}-key.pem"
        with tempfile.TemporaryDirectory(dir=self.directory, prefix=".cert-") as tmp:
            work = Path(tmp)
            config = self._config(work, name, hosts)
            _openssl("req", "-new", "-config", str(config), *_KEY, "-keyout", str(work / "key.pem"),
                     "-out", str(work / "csr.pem"))  # fmt: skip
            _openssl("x509", "-req", "-in", str(work / "csr.pem"), "-CA", str(self.ca_file),
                     "-CAkey", str(self.directory / "ca-key.pem"), "-set_serial", str(secrets.randbits(63)),
                     "-days", "825", "-sha256", "-extfile", str(config), "-extensions", extensions,
                     "-out", str(work / "cert.pem"))  # fmt: skip
            os.chmod(work / "key.pem", 0o600)
            os.replace(work / "key.pem", key)
            os.replace(work / "cert.pem", cert)
        return ServerCert(cert=cert, key=key)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tls-cert", help="serve HTTPS with this PEM certificate (with --tls-key); default: HTTP")
    parser.add_argument("--tls-key", help="the certificate's PEM private key")
    parser.add_argument("--tls-client-ca", help="require a client certificate issued by this PEM CA (mutual TLS)")


def server_context(args: argparse.Namespace) -> ssl.SSLContext | None:
    """The HTTPS context `add_arguments`' options ask for, or None (plain HTTP)."""
    client_ca = getattr(args, "tls_client_ca", None)
    if not args.tls_cert and not args.tls_key:
        if client_ca:
            raise SystemExit("--tls-client-ca needs --tls-cert and --tls-key (client certificates are a TLS matter)")
        return None
    if not (args.tls_cert and args.tls_key):
        raise SystemExit("--tls-cert and --tls-key go together")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(args.tls_cert, args.tls_key)
    if client_ca:
        context.load_verify_locations(cafile=client_ca)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def arguments(tls: ServerCert | None, client_ca: Path | str | None = None) -> list[str]:
    """A child process's ``--tls-cert``/``--tls-key`` (none: plain HTTP) and ``--tls-client-ca`` options."""
    out = ["--tls-cert", str(tls.cert), "--tls-key", str(tls.key)] if tls else []
    return out + (["--tls-client-ca", str(client_ca)] if client_ca else [])


def peer_names(peercert: dict | None) -> list[str]:
    """The DNS names in the subject alternative names of a verified peer certificate (``getpeercert()``)."""
    return [value for kind, value in (peercert or {}).get("subjectAltName", ()) if kind == "DNS"]


class TlsFront:
    """HTTPS in front of a plain-HTTP lab server (the Kubernetes emulator, for one): ``async with
    TlsFront(upstream_url, cert) as front: front.url``. Each connection is passed through byte for byte, so
    watches and long requests work as they do upstream."""

    def __init__(self, upstream: str, cert: ServerCert, host: str = "127.0.0.1") -> None:
        from urllib.parse import urlsplit

        parts = urlsplit(upstream)
        self._upstream = (parts.hostname or host, parts.port or 80)
        self._cert, self._host = cert, host
        self._server: asyncio.Server | None = None
        self.url = ""

    async def __aenter__(self) -> TlsFront:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self._cert.cert, self._cert.key)
        self._server = await asyncio.start_server(self._connection, self._host, 0, ssl=context)
        self.url = f"https://{self._host}:{self._server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await relay(reader, writer, *self._upstream)


async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str, port: int) -> None:
    """Pass one accepted connection through to host:port byte for byte, both ways, until either side closes."""
    try:
        up_reader, up_writer = await asyncio.open_connection(host, port)
    except OSError:
        writer.close()
        return

    async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        try:
            while data := await src.read(65536):
                dst.write(data)
                await dst.drain()
        except (ConnectionError, ssl.SSLError):
            pass
        finally:
            dst.close()

    await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
