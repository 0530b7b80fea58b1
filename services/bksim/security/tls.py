"""TLS for every gRPC link: server credentials that reload changed files, channel credentials, peer roles.

Servers (`add_port`): with `security.tls_enabled` a server listens with `add_secure_port` only, so a plaintext
client fails its handshake (UNAVAILABLE); without it, `add_insecure_port` as before. The credentials are
`grpc.dynamic_ssl_server_credentials` with a `CertificateReloader` as fetcher: gRPC asks it at the start of
each handshake; at most once per `tls_refresh_interval_ms` it compares the files' (mtime, size) with those it
loaded and, when one changed, reads all three again, so new connections get the new certificate while open
connections keep theirs (BookKeeper's tlsCertFilesRefreshDurationSeconds). A file that cannot be read or
parsed keeps the previous certificate (and is tried again at the next interval). 0 = never reload.
`tls_client_auth` requires a client certificate chained to `tls_ca_file` (mutual TLS); a handshake without one
fails.

TLS versions: gRPC's core negotiates TLS 1.2 or 1.3 and nothing older; gRPC Python offers no setting to
lower (or raise) that, so TLS 1.2+ holds whatever the configuration says.

Channels (`channel_security`, `open_channel`): a client trusts `tls_ca_file`, and presents `tls_cert_file` /
`tls_key_file` when given (a server with mutual TLS needs them). Hostname verification is gRPC's: the server's
certificate must name the host of the dialled address (SAN DNS or IP). gRPC Python cannot skip that check
(the core's custom server-authorization hook is not exposed), so `tls_hostname_verification = false` checks
the certificate against a fixed name instead of the dialled host: `grpc.ssl_target_name_override` =
`UNVERIFIED_HOST_NAME` ("localhost"), which every certificate of `bksim certs create` carries. The chain is
verified either way; what is given up is only that the name matches the address.

Roles (`peer_roles`, `RoleCheck`): a bookie with `bookie_authorized_roles` serves only a client whose
certificate's first role (subject OU `0:role,...`, certs.py) is one of them, as BookKeeper's
BookieAuthZFactory; any other call ends PERMISSION_DENIED naming the role found and the roles allowed
(UNAUTHENTICATED when the client presented no certificate).

Must not: log or return key bytes.
"""
from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from typing import Callable

import grpc
from cryptography import x509

from bksim.model.config import SecurityConfig
from bksim.model.errors import ConfigError
from bksim.security.certs import roles_of_pem
from bksim.security.handlers import around, rebuild

UNVERIFIED_HOST_NAME = "localhost"  # the name checked when hostname verification is off (see the docstring)
PEER_CERT_KEY = "x509_pem_cert"  # the auth_context() key of the peer's PEM certificate


def _read(path: str, what: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise ConfigError(f"security.{what} {path!r}: cannot read it ({e.strerror})") from None


def _stamp(paths: tuple[str, ...]) -> tuple:
    out = []
    for path in paths:
        try:
            st = os.stat(path)
            out.append((st.st_mtime_ns, st.st_size, st.st_ino))
        except OSError:
            out.append(None)
    return tuple(out)


# -- servers ------------------------------------------------------------------------------------------------

class CertificateReloader:
    """The certificate-configuration fetcher of a TLS server (see the module docstring). `statistics()`:
    reloads done, failed reads, and the serial of the certificate now served."""

    def __init__(self, security: SecurityConfig, monotonic_s: Callable[[], float] = time.monotonic,
                 log: Callable[[str], None] = lambda line: None) -> None:
        self._paths = (security.tls_ca_file, security.tls_cert_file, security.tls_key_file)
        self._interval_s = security.tls_refresh_interval_ms / 1000.0
        self._client_auth = security.tls_client_auth
        self._monotonic_s = monotonic_s
        self._log = log
        self._lock = threading.Lock()  # gRPC calls the fetcher from its own threads
        self.reloads = 0
        self.failures = 0
        self._stamp = _stamp(self._paths)
        self._pems = self._load()  # a ConfigError here: the server does not start
        self._checked_s = monotonic_s()

    def _load(self) -> tuple[bytes, bytes, bytes]:
        ca, cert, key = (_read(p, w) for p, w in zip(self._paths, ("tls_ca_file", "tls_cert_file", "tls_key_file")))
        if b"-----BEGIN" not in ca or b"-----BEGIN" not in cert or b"PRIVATE KEY-----" not in key:
            raise ConfigError(f"security.tls_ca_file / tls_cert_file / tls_key_file ({', '.join(self._paths)}): "
                              f"not PEM certificates and key")
        return ca, cert, key

    def configuration(self) -> grpc.ServerCertificateConfiguration:
        ca, cert, key = self._pems
        return grpc.ssl_server_certificate_configuration([(key, cert)], root_certificates=ca)

    def __call__(self) -> grpc.ServerCertificateConfiguration | None:
        """gRPC's fetcher: a new configuration when the files changed, else None (keep the current one)."""
        if self._interval_s <= 0:
            return None
        with self._lock:
            now = self._monotonic_s()
            if now - self._checked_s < self._interval_s:
                return None
            self._checked_s = now
            stamp = _stamp(self._paths)
            if stamp == self._stamp:
                return None
            try:
                pems = self._load()
                x509.load_pem_x509_certificate(pems[1])  # a torn or foreign file keeps the old certificate
            except Exception as e:  # noqa: BLE001 - keep serving the certificate we have
                self.failures += 1
                self._log(f"TLS certificate files changed but cannot be loaded (keeping the current ones): {e}")
                return None
            self._stamp, self._pems = stamp, pems
            self.reloads += 1
            self._log(f"TLS certificate files reloaded (serial {self.serial():x})")
            return self.configuration()

    def serial(self) -> int:
        """The serial number of the certificate served to new connections."""
        return x509.load_pem_x509_certificate(self._pems[1]).serial_number

    def statistics(self) -> dict:
        return {"reloads": self.reloads, "failures": self.failures, "serial": f"{self.serial():x}"}


def server_credentials(security: SecurityConfig, log: Callable[[str], None] = lambda line: None
                       ) -> tuple[grpc.ServerCredentials, CertificateReloader]:
    """Credentials for `add_secure_port`, reloading changed files, and their reloader (its statistics)."""
    reloader = CertificateReloader(security, log=log)
    credentials = grpc.dynamic_ssl_server_credentials(reloader.configuration(), reloader,
                                                      require_client_authentication=security.tls_client_auth)
    return credentials, reloader


def add_port(server, address: str, security: SecurityConfig | None,
             log: Callable[[str], None] = lambda line: None) -> tuple[int, CertificateReloader | None]:
    """Bind `address` on a gRPC server: TLS only when `security.tls_enabled` (plaintext is refused), else
    plaintext. Returns (bound port or 0, the reloader or None). A ConfigError when the files are unusable."""
    if security is None or not security.tls_enabled:
        return server.add_insecure_port(address), None
    credentials, reloader = server_credentials(security, log)
    return server.add_secure_port(address, credentials), reloader


# -- channels -----------------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class ChannelSecurity:
    """What a client needs to dial a TLS server: the CA file, optionally its own certificate and key (mutual
    TLS), and whether the server's name is checked against the dialled host. Files are read at each
    `credentials()`, so a channel made after the files changed uses the new ones."""
    ca_file: str
    cert_file: str = ""
    key_file: str = ""
    hostname_verification: bool = True

    def __post_init__(self) -> None:
        if not self.ca_file:
            raise ConfigError("TLS channel: a CA file (security.tls_ca_file) is needed to verify servers")
        if bool(self.cert_file) != bool(self.key_file):
            raise ConfigError("TLS channel: security.tls_cert_file and tls_key_file go together")

    def credentials(self) -> grpc.ChannelCredentials:
        ca = _read(self.ca_file, "tls_ca_file")
        if self.cert_file:
            return grpc.ssl_channel_credentials(ca, _read(self.key_file, "tls_key_file"),
                                                _read(self.cert_file, "tls_cert_file"))
        return grpc.ssl_channel_credentials(ca)

    def options(self) -> list[tuple[str, object]]:
        """Channel options TLS adds: the name override when hostname verification is off."""
        return [] if self.hostname_verification else [("grpc.ssl_target_name_override", UNVERIFIED_HOST_NAME)]


def channel_security(security: SecurityConfig | None) -> ChannelSecurity | None:
    """The channel side of `security.*`: None when TLS is off (plaintext channels)."""
    if security is None or not security.tls_enabled:
        return None
    return ChannelSecurity(security.tls_ca_file, security.tls_cert_file, security.tls_key_file,
                           security.tls_hostname_verification)


def open_channel(address: str, options: list[tuple[str, object]], tls: ChannelSecurity | None,
                 aio: bool = True):
    """A grpc.aio channel (or a blocking one, `aio=False`) to `address`: TLS with `tls`, plaintext without."""
    module = grpc.aio if aio else grpc
    if tls is None:
        return module.insecure_channel(address, options=options)
    return module.secure_channel(address, tls.credentials(), options=[*options, *tls.options()])


# -- peer roles ---------------------------------------------------------------------------------------------

def peer_certificate(context) -> bytes | None:
    """The PEM certificate the client presented on this call's connection (mutual TLS), or None."""
    pems = context.auth_context().get(PEER_CERT_KEY) or []
    return pems[0] if pems else None


def peer_roles(context) -> tuple[str, ...]:
    """The roles in the client's certificate (certs.roles_of), () without a certificate or roles."""
    pem = peer_certificate(context)
    return roles_of_pem(pem) if pem else ()


def parse_roles(text: str) -> tuple[str, ...]:
    """"a, b" -> ("a", "b")."""
    return tuple(r.strip() for r in text.split(",") if r.strip())


def role_refusal(pem: bytes | None, allowed: tuple[str, ...]) -> tuple[grpc.StatusCode, str] | None:
    """Why a client with certificate `pem` may not call (code, message), or None when its first role is in
    `allowed` (BookKeeper's BookieAuthZFactory checks the first role only)."""
    if pem is None:
        return grpc.StatusCode.UNAUTHENTICATED, (f"this bookie serves only clients whose TLS certificate carries "
                                                 f"one of the roles {', '.join(allowed)}; no client certificate "
                                                 f"was presented")
    roles = roles_of_pem(pem)
    if not roles:
        return grpc.StatusCode.PERMISSION_DENIED, (f"the client certificate carries no role (subject OU "
                                                   f"'0:ROLE'); this bookie allows {', '.join(allowed)}")
    if roles[0] not in allowed:
        return grpc.StatusCode.PERMISSION_DENIED, (f"role {roles[0]!r} of the client certificate is not allowed "
                                                   f"by this bookie (security.bookie_authorized_roles: "
                                                   f"{', '.join(allowed)})")
    return None


class RoleCheck(grpc.aio.ServerInterceptor):
    """Refuses every call whose client certificate's first role is not in `allowed` (see role_refusal)."""

    def __init__(self, allowed: tuple[str, ...]) -> None:
        assert allowed, "RoleCheck needs at least one role"
        self.allowed = allowed

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        return _checked(handler, self.allowed)


def _checked(handler: grpc.RpcMethodHandler, allowed: tuple[str, ...]) -> grpc.RpcMethodHandler:
    """`handler` behind the role check: the call is aborted before the method runs when role_refusal objects."""
    async def refuse(_request, context) -> None:
        refusal = role_refusal(peer_certificate(context), allowed)
        if refusal is not None:
            await context.abort(*refusal)

    return rebuild(handler, lambda inner: around(inner, before=refuse))


def server_interceptors(security: SecurityConfig | None) -> list[grpc.aio.ServerInterceptor]:
    """The bookie's interceptors from `security`: a RoleCheck when bookie_authorized_roles is set."""
    if security is None or not security.bookie_authorized_roles:
        return []
    return [RoleCheck(parse_roles(security.bookie_authorized_roles))]
