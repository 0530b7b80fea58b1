"""TLS on real processes: three bookies and a broker from the local-cluster launcher with a `tls_dir` (each its
own certificate from security/certs.py), mutual TLS on, bookies that serve only the roles broker, bookie and
admin, and a certificate refresh interval of 100 ms.

Refused: a plaintext client (bookie and broker), a client that trusts another CA, a client certificate from
another CA, no client certificate, a certificate whose role a bookie does not allow, a server whose certificate
does not name the dialled host. Served: a broker writing ledgers to the TLS bookies, a topic client producing
and consuming through the TLS broker, the CLI with the cluster's client.env. Reload: a bookie's files
replaced, a new connection gets the new certificate (its serial, read with the ssl module), calls go on.
"""
from __future__ import annotations

import asyncio
import os
import socket
import ssl
import subprocess
import sys
import uuid

import pytest
from cryptography import x509

from bksim.adapters.bookie_client import BookieClient
from bksim.adapters.broker_client import BrokerCallError, SyncBrokerClient
from bksim.adapters.local_cluster import LocalCluster
from bksim.model.errors import BookieUnreachable
from bksim.security import certs
from bksim.security.tls import ChannelSecurity

from helpers import wait_until

ENV = {"BKSIM_SECURITY_TLS_CLIENT_AUTH": "true", "BKSIM_SECURITY_BOOKIE_AUTHORIZED_ROLES": "broker,bookie,admin",
       "BKSIM_SECURITY_TLS_REFRESH_INTERVAL_MS": "100", "BKSIM_AUTORECOVERY_ENABLED": "false"}
DEADLINE_S = 3.0


@pytest.fixture(scope="module")
def cluster(zookeeper, tmp_path_factory):
    run_dir = str(tmp_path_factory.mktemp("tls"))
    c = LocalCluster(run_dir, inherit_bksim_env=False, cwd=run_dir, child_env=ENV, tls_dir=os.path.join(run_dir, "tls"))
    c.attach_zookeeper(zookeeper)
    try:
        for _ in range(3):
            c.add_bookie()
        c.add_broker()
        c.start(c.nodes, serving=True)
        yield c
    finally:
        assert not c.stop_all(bookie_grace_s=10, broker_grace_s=10)


def client_cert(c: LocalCluster, name: str, roles: tuple[str, ...]) -> ChannelSecurity:
    """A client certificate `name` with `roles`, from the cluster's CA."""
    issued = certs.ensure(c.tls_dir, {name: ((), roles)})[name]
    return ChannelSecurity(os.path.join(c.tls_dir, certs.CA_FILE), issued.cert_file, issued.key_file)


def bookie_info(address: str, tls: ChannelSecurity | None) -> dict:
    async def ask():
        async with BookieClient(address, deadline_s=DEADLINE_S, tls=tls) as client:
            return await client.info()
    return asyncio.run(ask())


def broker_health(address: str, tls: ChannelSecurity | None) -> str:
    with SyncBrokerClient(address, deadline_s=DEADLINE_S, tls=tls) as broker:
        return broker.health()


def test_plaintext_clients_are_refused(cluster):
    with pytest.raises(BookieUnreachable) as refused:
        bookie_info(cluster.bookies[0].address, None)
    assert refused.value.code == "UNAVAILABLE"
    with pytest.raises(BrokerCallError) as refused_broker:
        broker_health(cluster.brokers[0].address, None)
    assert refused_broker.value.status == "UNAVAILABLE" and not refused_broker.value.from_broker
    assert broker_health(cluster.brokers[0].address, cluster.tls) == "SERVING"  # the same port, with TLS


def test_another_ca_is_refused_both_ways(cluster, tmp_path):
    other = certs.ensure(str(tmp_path / "other"), {"admin": ((), ("admin",))})["admin"]
    other_ca = str(tmp_path / "other" / certs.CA_FILE)
    ours = client_cert(cluster, "admin", ("admin",))
    assert bookie_info(cluster.bookies[0].address, ours)["state"] == "writable"  # the control: ours is served
    # the client does not trust the servers' CA
    with pytest.raises(BookieUnreachable, match="UNAVAILABLE"):
        bookie_info(cluster.bookies[0].address, ChannelSecurity(other_ca, ours.cert_file, ours.key_file))
    with pytest.raises(BrokerCallError, match="UNAVAILABLE"):
        broker_health(cluster.brokers[0].address, ChannelSecurity(other_ca, ours.cert_file, ours.key_file))
    # the servers do not trust the client's certificate (mutual TLS), though the client trusts them
    foreign = ChannelSecurity(ours.ca_file, other.cert_file, other.key_file)
    with pytest.raises(BookieUnreachable, match="UNAVAILABLE"):
        bookie_info(cluster.bookies[0].address, foreign)
    with pytest.raises(BrokerCallError, match="UNAVAILABLE"):
        broker_health(cluster.brokers[0].address, foreign)


def test_mutual_tls_needs_a_client_certificate(cluster):
    ca_only = ChannelSecurity(os.path.join(cluster.tls_dir, certs.CA_FILE))
    with pytest.raises(BookieUnreachable, match="UNAVAILABLE"):
        bookie_info(cluster.bookies[1].address, ca_only)
    with pytest.raises(BrokerCallError, match="UNAVAILABLE"):
        broker_health(cluster.brokers[0].address, ca_only)


def test_bookie_serves_only_authorized_roles(cluster):
    address = cluster.bookies[1].address
    assert bookie_info(address, client_cert(cluster, "admin", ("admin",)))["state"] == "writable"
    with pytest.raises(BookieUnreachable) as refused:
        bookie_info(address, client_cert(cluster, "reporter", ("reporter", "admin")))  # only the first counts
    assert refused.value.code == "PERMISSION_DENIED"
    assert "'reporter'" in str(refused.value) and "broker, bookie, admin" in str(refused.value)
    with pytest.raises(BookieUnreachable) as no_role:
        bookie_info(address, client_cert(cluster, "nobody", ()))
    assert no_role.value.code == "PERMISSION_DENIED" and "no role" in str(no_role.value)
    # the broker, whose certificate says "broker", is not refused: the broker's ledger test below writes to them


def test_broker_writes_ledgers_to_tls_bookies(cluster):
    with SyncBrokerClient(cluster.brokers[0].address, tls=cluster.tls) as broker:
        info = broker.create_ledger(3, 3, 2)
        payloads = [f"entry-{i}".encode() for i in range(20)]
        broker.append(info.ledger_id, [payloads[:10], payloads[10:]])
        closed = broker.close_ledger(info.ledger_id)
        assert [p for _, p in broker.read_entries(info.ledger_id)] == payloads
    assert closed.state == "CLOSED" and closed.last_entry_id == len(payloads) - 1


def test_topic_client_produces_and_consumes_over_tls(cluster):
    from bksim.client import Client
    from bksim.client.types import InitialPosition

    with Client(cluster.brokers[0].address, tls=cluster.tls, operation_timeout_ms=20_000) as client:
        tenant = f"t{uuid.uuid4().hex[:8]}"
        client.create_tenant(tenant)
        client.create_namespace(f"{tenant}/ns")
        topic = f"persistent://{tenant}/ns/tls"
        client.create_topic(topic)
        consumer = client.subscribe(topic, "s", initial_position=InitialPosition.Earliest)
        producer = client.create_producer(topic, batching_max_publish_delay_ms=1)
        for i in range(5):
            producer.send(f"m{i}".encode())
        got = []
        for _ in range(5):
            m = consumer.receive(10_000)
            got.append(m.data())
            consumer.acknowledge(m)
        assert got == [f"m{i}".encode() for i in range(5)]


def test_hostname_mismatch_is_refused_when_verification_is_on(cluster):
    """A bookie on 127.0.0.2 that presents bookie-1's certificate (localhost, 127.0.0.1): the name does not match
    the dialled host. It is stopped at the end of the test, so no ledger of the other tests is placed on it."""
    one = cluster.bookies[0]
    node = cluster.add_bookie(host="127.0.0.2", name="bookie-misnamed", env={
        "BKSIM_SECURITY_TLS_CERT_FILE": one.env["BKSIM_SECURITY_TLS_CERT_FILE"],
        "BKSIM_SECURITY_TLS_KEY_FILE": one.env["BKSIM_SECURITY_TLS_KEY_FILE"]})
    try:
        cluster.start([node])
        admin = client_cert(cluster, "admin", ("admin",))
        with pytest.raises(BookieUnreachable, match="UNAVAILABLE"):
            bookie_info(node.address, admin)
        unverified = ChannelSecurity(admin.ca_file, admin.cert_file, admin.key_file, hostname_verification=False)
        assert bookie_info(node.address, unverified)["state"] in ("writable", "read_only")  # the chain still counts
    finally:
        assert cluster.stop(node)
        cluster.bookies.remove(node)


def served_serial(address: str, tls: ChannelSecurity) -> int:
    """The serial of the certificate the server at `address` presents to a new connection."""
    host, _, port = address.rpartition(":")
    context = ssl.create_default_context(cafile=tls.ca_file)
    context.load_cert_chain(tls.cert_file, tls.key_file)
    context.set_alpn_protocols(["h2"])
    with socket.create_connection((host, int(port)), timeout=DEADLINE_S) as raw:
        with context.wrap_socket(raw, server_hostname=host) as conn:
            return x509.load_der_x509_certificate(conn.getpeercert(binary_form=True)).serial_number


def test_replaced_certificate_files_are_served_to_new_connections(cluster):
    node = cluster.bookies[2]
    admin = client_cert(cluster, "admin", ("admin",))
    before = served_serial(node.address, admin)
    with open(node.env["BKSIM_SECURITY_TLS_CERT_FILE"], "rb") as f:
        assert x509.load_pem_x509_certificate(f.read()).serial_number == before
    renewed = certs.ensure(cluster.tls_dir, {node.name: ((node.host,), ("bookie",))}, replace=True)[node.name]
    with open(renewed.cert_file, "rb") as f:
        after = x509.load_pem_x509_certificate(f.read()).serial_number
    assert after != before
    wait_until(lambda: served_serial(node.address, admin) == after, 5.0, interval_s=0.05,
               message=f"{node.name} to serve the new certificate (serial {after:x})")
    assert bookie_info(node.address, admin)["state"] == "writable"  # a gRPC connection made now is served too
    assert "TLS certificate files reloaded" in node.log_tail(200)


def test_cli_talks_tls_with_the_client_env(cluster):
    """`bksim ledger list` with the settings `cluster up --tls` writes (client.env): served; without: refused."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BKSIM_")}
    env.update({"BKSIM_ZOOKEEPER_HOST": cluster.zookeeper.host, "BKSIM_ZOOKEEPER_PORT": str(cluster.zookeeper.port)})
    argv = [sys.executable, "-m", "bksim.cli.main", "ledger", "list", "--broker", cluster.brokers[0].address]
    plain = subprocess.run(argv, env=env, cwd=cluster.run_dir, capture_output=True, text=True, timeout=30)
    assert plain.returncode == 2 and "UNAVAILABLE" in plain.stderr
    env.update({"BKSIM_SECURITY_TLS_ENABLED": "true",
                "BKSIM_SECURITY_TLS_CA_FILE": os.path.join(cluster.tls_dir, certs.CA_FILE),
                "BKSIM_SECURITY_TLS_CERT_FILE": certs.cert_path(cluster.tls_dir, certs.CLIENT_NAME),
                "BKSIM_SECURITY_TLS_KEY_FILE": certs.key_path(cluster.tls_dir, certs.CLIENT_NAME)})
    served = subprocess.run(argv, env=env, cwd=cluster.run_dir, capture_output=True, text=True, timeout=30)
    assert served.returncode == 0, served.stderr
