"""ZooKeeper security on real processes: digest ACLs, `bksim metadata secure`, and the TLS client port.

The module runs its own ZooKeeper (not the session's: ACLs would close the shared tree) with a TLS client port
(Netty, PEM key store) beside the plaintext one, certificates from security/certs.py, and one bookie (ZooKeeper
over TLS, digest credentials) and one broker (plaintext port, the same credentials) started through the
local-cluster launcher with configuration only in BKSIM_ variables. Anonymous clients use the plaintext port.
`metadata secure` runs against a second, plain ZooKeeper whose tree was made without credentials.
"""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.security import make_digest_acl

from bksim.adapters.broker_client import SyncBrokerClient
from bksim.adapters.local_cluster import LocalCluster
from bksim.adapters.zk_client import ZkSecurity, ZkTls, new_client, read_credentials
from bksim.metadata.paths import AVAILABLE, BROKERS_AVAILABLE, LEDGERS_ROOT, ledger_path
from bksim.model.errors import ConfigError
from bksim.security import certs
from helpers import free_port, wait_until

USER, PASSWORD = "bksim", "zk-digest-secret-5f1c"
LEDGER_PASSWORD = b"ledger-pw"
START_TIMEOUT_S = 30.0
QUIET = logging.getLogger("tests.zk_security")
QUIET.setLevel(logging.CRITICAL)
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _write(path: str, text: str) -> str:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    return path


def _client(hosts: str, security: ZkSecurity = ZkSecurity(), timeout_s: float = 5.0) -> KazooClient:
    client = new_client(hosts, security, timeout=timeout_s, connection_retry={"max_tries": 0}, logger=QUIET)
    client.start(timeout=timeout_s)
    return client


def _stop(client: KazooClient) -> None:
    client.stop()
    client.close()


@pytest.fixture(scope="module")
def tls_dir(tmp_path_factory) -> str:
    out = str(tmp_path_factory.mktemp("certs"))
    certs.ensure(out, {"zookeeper": ((), ()), "bookie": ((), ()), "broker": ((), ())})
    other = os.path.join(out, "other-ca")  # a CA the cluster does not trust
    certs.ensure(other, {"stranger": ((), ())})
    return out


def _tls(out: str, name: str) -> ZkTls:
    return ZkTls(os.path.join(out, certs.CA_FILE), certs.cert_path(out, name), certs.key_path(out, name))


@pytest.fixture(scope="module")
def secured(tmp_path_factory, tls_dir):
    """(cluster, bookie node, broker node, ledger id): ZooKeeper with a TLS port, a bookie on it over TLS and a
    broker on its plaintext port, both with digest credentials, and a ledger written through the broker."""
    run_dir = str(tmp_path_factory.mktemp("zk-secure"))
    credentials = _write(os.path.join(run_dir, "zk-credentials"), f"{USER}:{PASSWORD}\n")
    tls = _tls(tls_dir, "zookeeper")
    # the cluster's own clients take the credentials the children are given
    cluster = LocalCluster(run_dir, inherit_bksim_env=False, cwd=run_dir,
                           child_env={"BKSIM_ZOOKEEPER_DIGEST_CREDENTIALS_FILE": credentials,
                                      "BKSIM_ZOOKEEPER_SESSION_TIMEOUT_MS": "4000",
                                      "BKSIM_AUTORECOVERY_ENABLED": "false",
                                      "BKSIM_BOOKIE_SHUTDOWN_GRACE_MS": "3000",
                                      "BKSIM_BROKER_SHUTDOWN_GRACE_MS": "3000"})
    try:
        cluster.zookeeper_server(free_port(), secure_port=free_port(), tls=tls, heap_mb=128)
        cluster.start_zookeeper(timeout_s=START_TIMEOUT_S)
        assert cluster.zk_security == ZkSecurity(USER, PASSWORD)
        bookie_tls = _tls(tls_dir, "bookie")
        bookie = cluster.add_bookie(env={"BKSIM_BOOKIE_BOOKIE_ID": None, "BKSIM_BOOKIE_HOST": None,
                                         "BKSIM_SECURITY_TLS_CA_FILE": bookie_tls.ca_file,
                                         "BKSIM_SECURITY_TLS_CERT_FILE": bookie_tls.cert_file,
                                         "BKSIM_SECURITY_TLS_KEY_FILE": bookie_tls.key_file})
        broker = cluster.add_broker(env={"BKSIM_BROKER_BROKER_ID": None, "BKSIM_ZOOKEEPER_SECURE_PORT": "0"})
        cluster.start([bookie, broker], timeout_s=START_TIMEOUT_S, serving=True)
        with SyncBrokerClient(broker.node_id, deadline_s=15.0) as client:
            info = client.create_ledger(1, 1, 1, password=LEDGER_PASSWORD)
            client.append(info.ledger_id, [[b"entry-0", b"entry-1"]], password=LEDGER_PASSWORD)
            entries = client.read_entries(info.ledger_id, 0, 1, password=LEDGER_PASSWORD)
        assert entries == [(0, b"entry-0"), (1, b"entry-1")]
        yield cluster, bookie, broker, info.ledger_id
    finally:
        leftovers = cluster.stop_all()
        assert not leftovers, f"processes did not stop: {leftovers}"


def test_a_bookie_and_broker_with_credentials_write_digest_acls(secured):
    cluster, bookie, broker, ledger_id = secured
    owner = _client(cluster.zookeeper.connect, ZkSecurity(USER, PASSWORD))
    try:
        wanted = [make_digest_acl(USER, PASSWORD, all=True)]
        for path in (ledger_path(ledger_id), f"{AVAILABLE}/{bookie.node_id}", f"{BROKERS_AVAILABLE}/{broker.node_id}",
                     LEDGERS_ROOT, AVAILABLE):
            acl, _ = owner.get_acls(path)
            assert list(acl) == wanted, f"{path} has ACL {acl}"
    finally:
        _stop(owner)


def test_anonymous_clients_read_and_write_nothing(secured):
    cluster, bookie, _broker, ledger_id = secured
    owner = _client(cluster.zookeeper.connect, ZkSecurity(USER, PASSWORD))
    anonymous = _client(cluster.zookeeper.connect)
    try:
        metadata_path = ledger_path(ledger_id)
        registration = f"{AVAILABLE}/{bookie.node_id}"
        before = {p: owner.get(p) for p in (metadata_path, registration)}
        with pytest.raises(NoAuthError):
            anonymous.get(metadata_path)  # ledger metadata holds the ledger's password
        with pytest.raises(NoAuthError):
            anonymous.get_children(LEDGERS_ROOT)
        with pytest.raises(NoAuthError):
            anonymous.create(f"{LEDGERS_ROOT}/intruder", b"x")
        with pytest.raises(NoAuthError):
            anonymous.set(metadata_path, b'{"state": "CLOSED"}')
        with pytest.raises(NoAuthError):
            anonymous.delete(registration)
        assert owner.exists(f"{LEDGERS_ROOT}/intruder") is None
        for path, (data, stat) in before.items():
            now_data, now_stat = owner.get(path)
            assert (now_data, now_stat.version, now_stat.mzxid) == (data, stat.version, stat.mzxid), path
    finally:
        _stop(anonymous)
        _stop(owner)


def test_wrong_credentials_are_refused(secured):
    cluster, bookie, _broker, ledger_id = secured
    wrong = _client(cluster.zookeeper.connect, ZkSecurity(USER, "not-the-password"))
    try:
        with pytest.raises(NoAuthError):
            wrong.get(ledger_path(ledger_id))
        with pytest.raises(NoAuthError):
            wrong.create(f"{LEDGERS_ROOT}/intruder", b"x")
        with pytest.raises(NoAuthError):
            wrong.set(ledger_path(ledger_id), b"{}")
        with pytest.raises(NoAuthError):
            wrong.delete(f"{AVAILABLE}/{bookie.node_id}")
        owner = cluster.kazoo()  # the cluster's own client: the right credentials
        try:
            assert owner.exists(f"{AVAILABLE}/{bookie.node_id}") is not None
            assert owner.exists(f"{LEDGERS_ROOT}/intruder") is None
        finally:
            _stop(owner)
    finally:
        _stop(wrong)


def test_processes_without_the_cluster_credentials_stop_with_a_message_naming_the_option(secured, tmp_path):
    cluster, _bookie, _broker, _ledger_id = secured
    anonymous = cluster.add_bookie(env={"BKSIM_BOOKIE_BOOKIE_ID": None, "BKSIM_BOOKIE_HOST": None,
                                        "BKSIM_ZOOKEEPER_DIGEST_CREDENTIALS_FILE": "",
                                        "BKSIM_ZOOKEEPER_SECURE_PORT": "0"}, name="bookie-anonymous")
    cluster.spawn(anonymous)
    wait_until(lambda: not anonymous.alive(), START_TIMEOUT_S, message="the bookie without credentials to exit")
    log = anonymous.log_tail(20)
    assert "refuses access to /ledgers (NoAuth)" in log and "digest_credentials_file" in log, log
    assert "Traceback" not in log, log
    env = {k: v for k, v in os.environ.items() if not k.startswith("BKSIM_")}
    env.update({"BKSIM_ZOOKEEPER_HOST": cluster.zookeeper.host, "BKSIM_ZOOKEEPER_PORT": str(cluster.zookeeper.port),
                "BKSIM_ZOOKEEPER_DIGEST_CREDENTIALS_FILE": _write(str(tmp_path / "wrong"), f"{USER}:wrong-pw\n")})
    listed = _bksim(env, "bookie", "list")
    assert listed.returncode == 2, listed
    assert f"the configured credentials (user {USER}) are not the ones its ACL names" in listed.stderr, listed
    assert "wrong-pw" not in listed.stdout + listed.stderr


def test_the_password_is_in_no_log_and_no_command_line(secured):
    cluster, bookie, broker, _ledger_id = secured
    for name in ("zookeeper", "bookie-1", "broker-1"):
        with open(cluster.log_path(name), errors="replace") as f:
            assert PASSWORD not in f.read(), f"the digest password is in {name}'s log"
    for node in (bookie, broker):
        with open(f"/proc/{node.pid}/cmdline", "rb") as f:
            assert PASSWORD.encode() not in f.read()


def test_a_bookie_registers_over_tls(secured, tls_dir):
    cluster, bookie, _broker, _ledger_id = secured
    zk = cluster.zookeeper
    with open(bookie.log_path) as f:  # the bookie names the ZooKeeper it uses: the TLS port
        assert f"ZooKeeper {zk.secure_connect}: cluster instance" in f.read()
    client = _client(zk.secure_connect, ZkSecurity(USER, PASSWORD, _tls(tls_dir, "bookie")))
    try:
        assert client.exists(f"{AVAILABLE}/{bookie.node_id}") is not None
    finally:
        _stop(client)


def test_the_tls_port_refuses_plaintext_and_untrusted_servers(secured, tls_dir):
    cluster, _bookie, _broker, _ledger_id = secured
    plain = KazooClient(hosts=cluster.zookeeper.secure_connect, timeout=1.0, connection_retry={"max_tries": 0},
                        logger=QUIET)
    with pytest.raises(KazooTimeoutError):
        plain.start(timeout=2.0)
    plain.close()
    other = os.path.join(tls_dir, "other-ca")
    untrusting = new_client(cluster.zookeeper.secure_connect,
                            ZkSecurity(USER, PASSWORD, ZkTls(os.path.join(other, certs.CA_FILE),
                                                             certs.cert_path(other, "stranger"),
                                                             certs.key_path(other, "stranger"))),
                            timeout=1.0, connection_retry={"max_tries": 0}, logger=QUIET)
    with pytest.raises(KazooTimeoutError):  # the server's certificate does not chain to this client's CA: no session
        untrusting.start(timeout=2.0)
    untrusting.close()


def _bksim(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bksim.cli.main", *argv], env=env, cwd=REPO, capture_output=True,
                          text=True, timeout=60)


def test_metadata_secure_closes_an_open_tree(tmp_path):
    run_dir = str(tmp_path)
    cluster = LocalCluster(run_dir, inherit_bksim_env=False, cwd=run_dir)
    try:
        zk = cluster.start_zookeeper(free_port(), heap_mb=128, timeout_s=START_TIMEOUT_S)
        anonymous = _client(zk.connect)
        try:
            made = ["/ledgers/00/0000/L0007", "/ledgers/available/readonly", "/brokers/available/127.0.0.1:1",
                    "/managed-ledgers/t/ns/persistent/topic/cursor", "/admin/policies/t/ns", "/ownership"]
            for path in made:
                anonymous.ensure_path(path)
            anonymous.set("/ledgers/00/0000/L0007", b'{"password": "x"}')
            nodes = len({p for path in made for p in _prefixes(path)})
            credentials = _write(os.path.join(run_dir, "zk-credentials"), f"{USER}:{PASSWORD}\n")
            env = {k: v for k, v in os.environ.items() if not k.startswith("BKSIM_")}
            env.update({"BKSIM_ZOOKEEPER_HOST": zk.host, "BKSIM_ZOOKEEPER_PORT": str(zk.port),
                        "BKSIM_ZOOKEEPER_DIGEST_CREDENTIALS_FILE": credentials})
            first = _bksim(env, "metadata", "secure", "--json")
            assert first.returncode == 0, first.stderr
            counts = json.loads(first.stdout.strip().splitlines()[-1])
            assert (counts["roots"], counts["roots_missing"], counts["secured"], counts["unchanged"]) == \
                (5, 0, nodes, 0), counts
            assert PASSWORD not in first.stdout + first.stderr
            with pytest.raises(NoAuthError):
                anonymous.set("/ledgers/00/0000/L0007", b"{}")
            with pytest.raises(NoAuthError):
                anonymous.get("/ledgers/00/0000/L0007")
            with pytest.raises(NoAuthError):
                anonymous.create("/managed-ledgers/t/ns/persistent/topic/intruder")
            with pytest.raises(NoAuthError):
                anonymous.delete("/admin/policies/t/ns")  # a leaf: its parent's ACL decides
            again = _bksim(env, "metadata", "secure", "--json")  # idempotent
            assert again.returncode == 0, again.stderr
            counts = json.loads(again.stdout.strip().splitlines()[-1])
            assert (counts["secured"], counts["unchanged"]) == (0, nodes), counts
            owner = _client(zk.connect, ZkSecurity(USER, PASSWORD))
            try:
                assert owner.get("/ledgers/00/0000/L0007")[0] == b'{"password": "x"}'
            finally:
                _stop(owner)
            del env["BKSIM_ZOOKEEPER_DIGEST_CREDENTIALS_FILE"]
            refused = _bksim(env, "metadata", "secure")
            assert refused.returncode == 2 and "digest_credentials_file" in refused.stderr, refused
        finally:
            _stop(anonymous)
    finally:
        assert not cluster.stop_all()


def _prefixes(path: str) -> list[str]:
    parts = path.strip("/").split("/")
    return ["/" + "/".join(parts[:i]) for i in range(1, len(parts) + 1)]


@pytest.mark.parametrize("text", ["", "nocolon\n", ":pw\n", "user:\n", "a:b\nc:d\n"])
def test_a_malformed_credentials_file_is_a_config_error_without_its_content(tmp_path, text):
    path = _write(str(tmp_path / "creds"), text)
    with pytest.raises(ConfigError) as caught:
        read_credentials(path)
    assert str(path) in str(caught.value)
    for secret in ("nocolon", "pw", "a:b"):
        if secret in text:
            assert secret not in str(caught.value).replace(str(path), "")


def test_a_credentials_file_is_read(tmp_path):
    assert read_credentials(_write(str(tmp_path / "creds"), "  alice:s3:cret \n")) == ("alice", "s3:cret")


def test_every_zookeeper_client_of_the_services_is_built_by_zk_client():
    """One construction site: a KazooClient made elsewhere would skip the credentials, the ACL and TLS."""
    services = os.path.join(REPO, "services", "bksim")
    found = []
    for folder, _dirs, files in os.walk(services):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                with open(path) as f:
                    if "KazooClient(" in f.read().replace("`KazooClient(...)`", ""):
                        found.append(os.path.relpath(path, services))
    assert found == [os.path.join("adapters", "zk_client.py")], found


def test_with_client_auth_the_tls_port_wants_a_certificate_from_the_ca(tmp_path, tls_dir):
    run_dir = str(tmp_path)
    cluster = LocalCluster(run_dir, inherit_bksim_env=False, cwd=run_dir)
    try:
        cluster.zookeeper_server(free_port(), secure_port=free_port(), tls=_tls(tls_dir, "zookeeper"),
                                 client_auth=True, heap_mb=128)
        zk = cluster.start_zookeeper(timeout_s=START_TIMEOUT_S)
        assert "ssl.clientAuth=need" in zk.config_text()
        bookie = _tls(tls_dir, "bookie")
        no_certificate = new_client(zk.secure_connect, ZkSecurity(tls=ZkTls(bookie.ca_file, "", "")), timeout=1.0,
                                    connection_retry={"max_tries": 0}, logger=QUIET)
        with pytest.raises(KazooTimeoutError):
            no_certificate.start(timeout=2.0)
        no_certificate.close()
        client = _client(zk.secure_connect, ZkSecurity(tls=bookie))
        try:
            assert client.exists("/zookeeper") is not None
        finally:
            _stop(client)
    finally:
        assert not cluster.stop_all()
