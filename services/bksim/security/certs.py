"""Certificates for a local cluster: a CA and one certificate per process, made with `cryptography`.

Owns the files `bksim certs create --out DIR` and `bksim cluster up --tls` write (and their names):

    DIR/ca.pem                 the CA certificate every process trusts (security.tls_ca_file)
    DIR/ca-key.pem             the CA's key (mode 0600): kept so a later run can add certificates
    DIR/<name>.pem             the certificate of process <name> (bookie-1, broker-2, client)
    DIR/<name>-key.pem         its key (mode 0600)

Names: the subject's CN is the process name; the subjectAltName carries DNS `localhost`, IP `127.0.0.1` and
the host the process listens on (an IP address or a DNS name), so a client dialling any of them verifies the
name. Every process certificate is usable by servers and by clients (extended key usage serverAuth and
clientAuth): a broker presents its certificate to bookies when they ask for one (mutual TLS).

Roles live where BookKeeper's BookieAuthZFactory reads them (its CertUtils): in the subject's OU, written
`0:role1,role2` (code 0 = role names, separated by commas; further `;code:value` parts are ignored here).
BookKeeper checks the first role only; `roles_of()` returns them all, in order, and tls.py checks the first.

Keys are ECDSA P-256 (fast to make, accepted by gRPC's TLS 1.2 and 1.3); a key file is written mode 0600 and
every file is written whole to a temporary name and renamed, so a reader (a server reloading its files) sees
the old file or the new one, never half of one.

Must not: run openssl or any other subprocess; log a key.
"""
from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from bksim.model.errors import ConfigError

CA_FILE = "ca.pem"
CA_KEY_FILE = "ca-key.pem"
CLIENT_NAME = "client"  # the certificate of the CLI and tools
CA_VALID_DAYS = 3650
CERT_VALID_DAYS = 825  # the most public CAs issue; nothing here depends on it
ROLE_CODE = "0"  # BookKeeper CertUtils.OU_ROLE_NAME_CODE
KEY_MODE = 0o600
CERT_MODE = 0o644
_CLOCK_SKEW = datetime.timedelta(minutes=5)  # not_valid_before this far back: a peer whose clock lags accepts it


@dataclass(frozen=True, slots=True)
class Issued:
    """Paths of one process's certificate and key."""
    name: str
    cert_file: str
    key_file: str


def cert_path(out_dir: str, name: str) -> str:
    return os.path.join(out_dir, f"{name}.pem")


def key_path(out_dir: str, name: str) -> str:
    return os.path.join(out_dir, f"{name}-key.pem")


def encode_roles(roles: tuple[str, ...] | list[str]) -> str:
    """("broker", "admin") -> "0:broker,admin" (the OU value BookKeeper's CertUtils reads)."""
    for role in roles:
        if not role or any(c in role for c in ",;:") or role != role.strip():
            raise ConfigError(f"role {role!r}: a role is a non-empty name without ',', ';', ':' or edge spaces")
    return f"{ROLE_CODE}:{','.join(roles)}"


def roles_of(cert: x509.Certificate) -> tuple[str, ...]:
    """The roles a certificate carries (subject OU `0:r1,r2;1:cluster`), in order; () when none."""
    for attribute in cert.subject.get_attributes_for_oid(NameOID.ORGANIZATIONAL_UNIT_NAME):
        for part in str(attribute.value).split(";"):
            code, sep, value = part.partition(":")
            if sep and code.strip() == ROLE_CODE:
                return tuple(r.strip() for r in value.split(",") if r.strip())
    return ()


def roles_of_pem(pem: bytes) -> tuple[str, ...]:
    return roles_of(x509.load_pem_x509_certificate(pem))


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _write(path: str, data: bytes, mode: int) -> None:
    """Write `path` whole (temporary file, fsync, rename) with permissions `mode` from its creation on."""
    tmp = f"{path}.tmp-{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.fchmod(fd, mode)  # the umask may have cut the mode open() was given
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def make_ca(common_name: str = "bksim local CA", valid_days: int = CA_VALID_DAYS):
    """A self-signed CA: (certificate, key)."""
    key = _new_key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name),
                      x509.NameAttribute(NameOID.ORGANIZATION_NAME, "bksim")])
    now = _now()
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _CLOCK_SKEW).not_valid_after(now + datetime.timedelta(days=valid_days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False),
                           critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256()))
    return cert, key


def subject_alt_names(hosts: tuple[str, ...] | list[str]) -> list[x509.GeneralName]:
    """DNS localhost, IP 127.0.0.1, then each of `hosts` (an IP address as IPAddress, else DNSName), no repeats."""
    names: list[x509.GeneralName] = []
    for host in ("localhost", "127.0.0.1", *hosts):
        if not host:
            continue
        try:
            general: x509.GeneralName = x509.IPAddress(ipaddress.ip_address(host))
        except ValueError:
            general = x509.DNSName(host)
        if general not in names:
            names.append(general)
    return names


def issue(ca_cert: x509.Certificate, ca_key, common_name: str, hosts: tuple[str, ...] | list[str] = (),
          roles: tuple[str, ...] | list[str] = (), valid_days: int = CERT_VALID_DAYS):
    """A certificate for process `common_name` signed by the CA: (certificate, key). See the module docstring
    for its names, key usages and roles."""
    key = _new_key()
    attributes = [x509.NameAttribute(NameOID.COMMON_NAME, common_name),
                  x509.NameAttribute(NameOID.ORGANIZATION_NAME, "bksim")]
    if roles:
        attributes.append(x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, encode_roles(tuple(roles))))
    now = _now()
    cert = (x509.CertificateBuilder().subject_name(x509.Name(attributes)).issuer_name(ca_cert.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - _CLOCK_SKEW).not_valid_after(now + datetime.timedelta(days=valid_days))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_encipherment=False, key_cert_sign=False,
                                         crl_sign=False, content_commitment=False, data_encipherment=False,
                                         key_agreement=True, encipher_only=False, decipher_only=False),
                           critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .add_extension(x509.SubjectAlternativeName(subject_alt_names(tuple(hosts))), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    return cert, key


def write_pair(out_dir: str, name: str, cert: x509.Certificate, key) -> Issued:
    """Write <name>.pem (0644) and <name>-key.pem (0600) under `out_dir`."""
    _write(key_path(out_dir, name), _key_pem(key), KEY_MODE)
    _write(cert_path(out_dir, name), cert.public_bytes(serialization.Encoding.PEM), CERT_MODE)
    return Issued(name, cert_path(out_dir, name), key_path(out_dir, name))


def load_or_make_ca(out_dir: str):
    """The CA under `out_dir` (ca.pem + ca-key.pem), made and written when absent: (certificate, key)."""
    os.makedirs(out_dir, exist_ok=True)
    ca_file, ca_key_file = os.path.join(out_dir, CA_FILE), os.path.join(out_dir, CA_KEY_FILE)
    if os.path.exists(ca_file) and os.path.exists(ca_key_file):
        with open(ca_file, "rb") as f:
            cert = x509.load_pem_x509_certificate(f.read())
        with open(ca_key_file, "rb") as f:
            key = serialization.load_pem_private_key(f.read(), password=None)
        return cert, key
    if os.path.exists(ca_file) or os.path.exists(ca_key_file):
        raise ConfigError(f"{out_dir} holds one of {CA_FILE} and {CA_KEY_FILE} without the other: remove it or "
                          f"choose another directory")
    cert, key = make_ca()
    _write(ca_key_file, _key_pem(key), KEY_MODE)
    _write(ca_file, cert.public_bytes(serialization.Encoding.PEM), CERT_MODE)
    return cert, key


def ensure(out_dir: str, names: dict[str, tuple[tuple[str, ...], tuple[str, ...]]],
           replace: bool = False) -> dict[str, Issued]:
    """Certificates for `names` ({name: (hosts, roles)}) under `out_dir`, signed by its CA (made when absent).
    A name whose two files exist is kept as it is unless `replace`; the others are issued and written."""
    ca_cert, ca_key = load_or_make_ca(out_dir)
    out = {}
    for name, (hosts, roles) in names.items():
        if not replace and os.path.exists(cert_path(out_dir, name)) and os.path.exists(key_path(out_dir, name)):
            out[name] = Issued(name, cert_path(out_dir, name), key_path(out_dir, name))
            continue
        cert, key = issue(ca_cert, ca_key, name, hosts, roles)
        out[name] = write_pair(out_dir, name, cert, key)
    return out


def cluster_names(bookies: int, brokers: int, bookie_host: str, broker_host: str,
                  client_roles: tuple[str, ...] = ()) -> dict[str, tuple[tuple[str, ...], tuple[str, ...]]]:
    """{name: (hosts, roles)} of a local cluster: bookie-i (role "bookie": its autorecovery calls other
    bookies), broker-i (role "broker"), and the CLI's `client` (roles `client_roles`, default "client")."""
    names = {f"bookie-{i}": ((bookie_host,), ("bookie",)) for i in range(1, bookies + 1)}
    names.update({f"broker-{i}": ((broker_host,), ("broker",)) for i in range(1, brokers + 1)})
    names[CLIENT_NAME] = ((), tuple(client_roles) or ("client",))
    return names
