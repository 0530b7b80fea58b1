"""The Ruby client (tests/interop/client.rb) against a cluster whose every gRPC link is TLS: 2 bookies and a
broker serving TLS only (security.tls_enabled, certificates from security/certs.py under the module's tmp dir),
on the session's ZooKeeper.

Ruby with `--ca` (the cluster's CA, the broker's certificate naming 127.0.0.1) writes a ledger and produces
and consumes messages; the Python clients, over TLS too, read back exactly what Ruby wrote and Ruby receives
exactly what Python produced. Without `--ca` Ruby's plaintext call fails (UNAVAILABLE, no bksim status: the
broker never answered), and with a CA that did not sign the broker's certificate it fails the same way.

Every Ruby run is a subprocess with a timeout (interop/ruby_harness.py); nothing sleeps.
"""
from __future__ import annotations

import os
import uuid

import pytest

from bksim.adapters.broker_client import SyncBrokerClient
from bksim.client import Client, InitialPosition
from bksim.security import certs
from bksim.security.tls import ChannelSecurity
from integration.bookie_harness import BookieProcess
from integration.broker_harness import BrokerCluster
from interop.ruby_harness import b64, ensure_ruby, payloads, ruby, unb64, write_json

BOOKIES = 2  # the topics' default E = Qw = Qa = 2
RECEIVE_MS = 10_000
GRPC_UNAVAILABLE = 14


def tls_env(tls_dir: str, name: str) -> dict[str, str]:
    issued = certs.ensure(tls_dir, {name: (("127.0.0.1",), (name.split("-")[0],))})[name]
    return {"BKSIM_SECURITY_TLS_ENABLED": "true", "BKSIM_SECURITY_TLS_CA_FILE": os.path.join(tls_dir, certs.CA_FILE),
            "BKSIM_SECURITY_TLS_CERT_FILE": issued.cert_file, "BKSIM_SECURITY_TLS_KEY_FILE": issued.key_file}


@pytest.fixture(scope="module")
def secure(zookeeper, tmp_path_factory):
    """(cluster, CA file): TLS bookies and one TLS broker."""
    ensure_ruby()
    base = tmp_path_factory.mktemp("interop-tls")
    tls_dir = str(base / "tls")
    c = BrokerCluster(zookeeper, base)
    try:
        for i in range(1, BOOKIES + 1):
            bookie = BookieProcess(zookeeper, str(base), name=f"bookie-{i}", env=tls_env(tls_dir, f"bookie-{i}"))
            c.bookies.append(bookie)
            bookie.spawn()
        for bookie in c.bookies:
            bookie.wait_registered(c.zk)
        c.settle(BOOKIES)  # starts none: waits until exactly these bookies are registered writable
        c.start_brokers(1, env=tls_env(tls_dir, "broker-1"))
        yield c, os.path.join(tls_dir, certs.CA_FILE)
    finally:
        c.cleanup()


def test_ruby_over_tls_both_ways(secure, tmp_path):
    cluster, ca = secure
    broker = cluster.brokers[0].address
    password = b"tls-secret"
    (tmp_path / "pw").write_bytes(password)
    data = payloads(5, 20)
    out = ruby("--ca", ca, "ledger-write", "--payloads", write_json(tmp_path / "p.json", [b64(d) for d in data]),
               "--password-file", str(tmp_path / "pw"), "--ensemble", "2", "--write-quorum", "2",
               "--ack-quorum", "2", "--batch", "6", broker=broker)
    assert [unb64(e["payload_b64"]) for e in out["read"]] == data and out["closed"]["state"] == "CLOSED"
    with SyncBrokerClient(broker, deadline_s=15.0, tls=ChannelSecurity(ca)) as py:
        assert py.read_entries(out["ledger_id"], password=password) == list(enumerate(data))

    with Client(broker, operation_timeout_ms=20_000, tls=ca) as client:
        tenant = f"tls{uuid.uuid4().hex[:8]}"
        client.create_tenant(tenant)
        client.create_namespace(f"{tenant}/ns", retention_ms=-1)
        topic = f"persistent://{tenant}/ns/t"
        client.create_topic(topic)
        consumer = client.subscribe(topic, "py", initial_position=InitialPosition.Earliest)
        sent = ruby("--ca", ca, "produce", topic, "--batch", "4", "--payloads",
                    write_json(tmp_path / "m.json", [{"payload_b64": b64(d), "key": "k"} for d in data[:10]]),
                    broker=broker)
        got = [consumer.receive(RECEIVE_MS) for _ in range(10)]
        assert [m.data() for m in got] == data[:10] and [m.key() for m in got] == ["k"] * 10
        assert [str(m.message_id()) for m in got] == sent["message_ids"]

        producer = client.create_producer(topic)
        ids = [str(producer.send(d)) for d in data[10:]]
        out = ruby("--ca", ca, "consume", topic, "--subscription", "rb", "--count", "20", broker=broker)
        assert [unb64(m["payload_b64"]) for m in out["messages"]] == data
        assert [m["message_id"] for m in out["messages"]] == sent["message_ids"] + ids


def test_ruby_without_the_right_ca_is_refused(secure, tmp_path):
    cluster, _ = secure
    broker = cluster.brokers[0].address
    (tmp_path / "pw").write_bytes(b"x")
    plaintext = ruby("ledger-read", "0", "--password-file", str(tmp_path / "pw"), "--timeout", "5", broker=broker,
                     expect=2)
    assert plaintext["error"]["grpc_code"] == GRPC_UNAVAILABLE and plaintext["error"]["bksim_status"] is None
    other_ca = str(tmp_path / "other")
    certs.ensure(other_ca, {})  # a CA of its own, which signed nothing the broker presents
    untrusted = ruby("--ca", os.path.join(other_ca, certs.CA_FILE), "ledger-read", "0", "--password-file",
                     str(tmp_path / "pw"), "--timeout", "5", broker=broker, expect=2)
    assert untrusted["error"]["grpc_code"] == GRPC_UNAVAILABLE and untrusted["error"]["bksim_status"] is None
