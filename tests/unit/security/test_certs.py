"""security/certs.py: names and SANs, key modes, roles where BookKeeper's CertUtils reads them, keeping files;
security/tls.py's file-level parts: the reloader's interval and change detection, the role decision."""
from __future__ import annotations

import ipaddress
import os
import stat
import types

import grpc
import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from bksim.model.config import SecurityConfig
from bksim.model.errors import ConfigError
from bksim.security import certs, tls


def load(path: str) -> x509.Certificate:
    with open(path, "rb") as f:
        return x509.load_pem_x509_certificate(f.read())


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("certs"))
    return out, certs.ensure(out, certs.cluster_names(2, 1, "127.0.0.1", "broker.example", ("admin", "ops")))


def test_names_and_subject_alt_names(made):
    out, issued = made
    assert set(issued) == {"bookie-1", "bookie-2", "broker-1", "client"}
    broker = load(issued["broker-1"].cert_file)
    assert broker.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "broker-1"
    san = broker.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["localhost", "broker.example"]
    assert san.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1")]
    bookie = load(issued["bookie-1"].cert_file)
    assert bookie.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
        x509.IPAddress) == [ipaddress.ip_address("127.0.0.1")]  # the host is 127.0.0.1 already: no repeat
    usages = bookie.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH} <= set(usages)


def test_every_certificate_is_signed_by_the_ca(made):
    out, issued = made
    ca = load(os.path.join(out, certs.CA_FILE))
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    for pair in issued.values():
        cert = load(pair.cert_file)
        assert cert.issuer == ca.subject
        cert.verify_directly_issued_by(ca)  # raises when the signature is not the CA's
        assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca


def test_keys_are_mode_0600_and_certificates_0644(made):
    out, issued = made
    assert stat.S_IMODE(os.stat(os.path.join(out, certs.CA_KEY_FILE)).st_mode) == 0o600
    for pair in issued.values():
        assert stat.S_IMODE(os.stat(pair.key_file).st_mode) == 0o600
        assert stat.S_IMODE(os.stat(pair.cert_file).st_mode) == 0o644
    assert not [f for f in os.listdir(out) if ".tmp-" in f]


def test_roles_live_in_the_subject_ou_as_bookkeeper_reads_them(made):
    _, issued = made
    client = load(issued["client"].cert_file)
    assert [a.value for a in client.subject.get_attributes_for_oid(NameOID.ORGANIZATIONAL_UNIT_NAME)] == ["0:admin,ops"]
    assert certs.roles_of(client) == ("admin", "ops")
    assert certs.roles_of(load(issued["bookie-2"].cert_file)) == ("bookie",)
    assert certs.roles_of(load(issued["broker-1"].cert_file)) == ("broker",)


def test_roles_of_reads_only_the_role_code(tmp_path):
    ca, ca_key = certs.make_ca()
    cert, _ = certs.issue(ca, ca_key, "x")
    assert certs.roles_of(cert) == ()
    # an OU with a cluster part (code 1) before the roles, as BookKeeper writes "1:cluster;0:roles" too
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "y"),
                      x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, "1:east; 0: a , b")])
    assert certs.roles_of(types.SimpleNamespace(subject=name)) == ("a", "b")  # roles_of reads only the subject


@pytest.mark.parametrize("role", ["", "a,b", "a;b", "a:b", " a"])
def test_a_role_that_would_not_read_back_is_refused(role):
    with pytest.raises(ConfigError):
        certs.encode_roles((role,))


def test_existing_files_are_kept_unless_replaced(tmp_path):
    out = str(tmp_path)
    first = certs.ensure(out, {"bookie-1": ((), ("bookie",))})["bookie-1"]
    serial = load(first.cert_file).serial_number
    ca_serial = load(os.path.join(out, certs.CA_FILE)).serial_number
    assert load(certs.ensure(out, {"bookie-1": ((), ("bookie",))})["bookie-1"].cert_file).serial_number == serial
    again = certs.ensure(out, {"bookie-1": ((), ("bookie",))}, replace=True)["bookie-1"]
    assert load(again.cert_file).serial_number != serial
    assert load(os.path.join(out, certs.CA_FILE)).serial_number == ca_serial  # the same CA signs it


def test_half_a_ca_is_refused(tmp_path):
    certs.load_or_make_ca(str(tmp_path))
    os.remove(tmp_path / certs.CA_KEY_FILE)
    with pytest.raises(ConfigError, match="without the other"):
        certs.load_or_make_ca(str(tmp_path))


# -- tls.py without a network ----------------------------------------------------------------------------

def security_of(out: str, name: str, refresh_ms: int) -> SecurityConfig:
    return SecurityConfig(tls_enabled=True, tls_ca_file=os.path.join(out, certs.CA_FILE),
                          tls_cert_file=certs.cert_path(out, name), tls_key_file=certs.key_path(out, name),
                          tls_refresh_interval_ms=refresh_ms)


def test_reloader_rereads_changed_files_once_per_interval(tmp_path):
    out = str(tmp_path)
    certs.ensure(out, {"b": ((), ())})
    now = [100.0]
    reloader = tls.CertificateReloader(security_of(out, "b", 1_000), monotonic_s=lambda: now[0])
    first = reloader.serial()
    assert reloader() is None  # nothing changed, and the interval has not passed
    certs.ensure(out, {"b": ((), ())}, replace=True)
    now[0] += 0.5
    assert reloader() is None and reloader.serial() == first  # changed, but checked only once per interval
    now[0] += 0.6
    assert isinstance(reloader(), grpc.ServerCertificateConfiguration)
    assert reloader.serial() != first and reloader.statistics()["reloads"] == 1
    now[0] += 2
    assert reloader() is None  # the new files are the loaded ones now


def test_reloader_keeps_the_certificate_when_the_new_file_is_broken(tmp_path):
    out = str(tmp_path)
    certs.ensure(out, {"b": ((), ())})
    now = [0.0]
    reloader = tls.CertificateReloader(security_of(out, "b", 10), monotonic_s=lambda: now[0])
    first = reloader.serial()
    with open(certs.cert_path(out, "b"), "wb") as f:
        f.write(b"-----BEGIN CERTIFICATE-----\ntorn")
    now[0] += 1
    assert reloader() is None and reloader.serial() == first and reloader.statistics()["failures"] == 1


def test_refresh_interval_zero_never_reloads(tmp_path):
    out = str(tmp_path)
    certs.ensure(out, {"b": ((), ())})
    now = [0.0]
    reloader = tls.CertificateReloader(security_of(out, "b", 0), monotonic_s=lambda: now[0])
    certs.ensure(out, {"b": ((), ())}, replace=True)
    now[0] += 3600
    assert reloader() is None


def test_unreadable_files_stop_the_server_with_the_option_named(tmp_path):
    with pytest.raises(ConfigError, match="tls_ca_file"):
        tls.CertificateReloader(security_of(str(tmp_path), "missing", 10))


def test_role_decision_checks_the_first_role(made):
    _, issued = made
    with open(issued["client"].cert_file, "rb") as f:
        pem = f.read()  # roles admin, ops
    assert tls.role_refusal(pem, ("admin",)) is None
    code, message = tls.role_refusal(pem, ("ops",))
    assert code == grpc.StatusCode.PERMISSION_DENIED and "'admin'" in message
    code, message = tls.role_refusal(None, ("ops",))
    assert code == grpc.StatusCode.UNAUTHENTICATED and "no client certificate" in message


def test_channel_security_needs_a_ca_and_a_whole_pair():
    with pytest.raises(ConfigError):
        tls.ChannelSecurity("")
    with pytest.raises(ConfigError):
        tls.ChannelSecurity("ca.pem", cert_file="c.pem")
    assert tls.ChannelSecurity("ca.pem").options() == []
    assert tls.ChannelSecurity("ca.pem", hostname_verification=False).options() == [
        ("grpc.ssl_target_name_override", tls.UNVERIFIED_HOST_NAME)]
    assert tls.channel_security(SecurityConfig()) is None
