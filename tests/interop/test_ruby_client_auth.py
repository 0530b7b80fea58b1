"""The Ruby client (tests/interop/client.rb) against a broker that requires tokens: security.auth_enabled and
authorization_enabled with an HS256 secret, super-user role `admin`, ledger role `ledger-app`; 2 bookies and one
broker on the session's ZooKeeper.

Ruby's `--token-file` sends `authorization: Bearer <token>` as gRPC metadata on every call and stream. With the
role `ruby-app`, granted produce and consume on a namespace by the Python admin client, Ruby produces what the
Python client receives byte for byte and consumes what Python produced; the ledger API is open to it only with
the ledger role. The refusals reach Ruby with the broker's status: no token is UNAUTHENTICATED, a token signed
by another key too, the ledger API with `ruby-app` and a namespace without a grant are PERMISSION_DENIED.

Every Ruby run is a subprocess with a timeout (interop/ruby_harness.py); nothing sleeps.
"""
from __future__ import annotations

import uuid

import pytest

from bksim.client import Client, InitialPosition
from bksim.security import tokens
from integration.broker_harness import BrokerCluster
from interop.ruby_harness import b64, ensure_ruby, payloads, ruby, unb64, write_json

BOOKIES = 2  # the topics' default E = Qw = Qa = 2
RECEIVE_MS = 10_000
GRPC_PERMISSION_DENIED = 7
GRPC_UNAUTHENTICATED = 16


@pytest.fixture(scope="module")
def secured(zookeeper, tmp_path_factory):
    """(cluster, {role: token file}) with a broker requiring tokens; `other` is signed by a key it does not know."""
    ensure_ruby()
    base = tmp_path_factory.mktemp("interop-auth")
    secret, other_secret = str(base / "secret.key"), str(base / "other.key")
    tokens.create_secret_key(secret)
    tokens.create_secret_key(other_secret)
    files = {}
    for role, key_file in (("admin", secret), ("ruby-app", secret), ("ledger-app", secret), ("other", other_secret)):
        files[role] = str(base / f"{role}.token")
        with open(files[role], "w") as f:
            f.write(tokens.create_token(tokens.SigningKey.from_secret_file(key_file), role) + "\n")
    c = BrokerCluster(zookeeper, base)
    try:
        c.settle(BOOKIES)
        c.start_brokers(1, env={"BKSIM_SECURITY_AUTH_ENABLED": "true", "BKSIM_SECURITY_AUTHORIZATION_ENABLED": "true",
                                "BKSIM_SECURITY_TOKEN_SECRET_KEY_FILE": secret,
                                "BKSIM_SECURITY_SUPER_USER_ROLES": "admin",
                                "BKSIM_SECURITY_LEDGER_ROLES": "ledger-app"})
        yield c, files
    finally:
        c.cleanup()


def test_ruby_with_a_granted_role_produces_and_consumes(secured, tmp_path):
    cluster, token = secured
    broker = cluster.brokers[0].address
    data = payloads(6, 10)
    with Client(broker, operation_timeout_ms=20_000, token_file=token["admin"]) as admin:
        tenant = f"auth{uuid.uuid4().hex[:8]}"
        admin.create_tenant(tenant)
        admin.create_namespace(f"{tenant}/ns", retention_ms=-1)
        admin.grant_permission(f"{tenant}/ns", "ruby-app", ["produce", "consume"])
        topic = f"persistent://{tenant}/ns/t"
        admin.create_topic(topic)
        consumer = admin.subscribe(topic, "py", initial_position=InitialPosition.Earliest)
        sent = ruby("--token-file", token["ruby-app"], "produce", topic, "--batch", "3", "--payloads",
                    write_json(tmp_path / "m.json", [b64(d) for d in data[:6]]), broker=broker)
        got = [consumer.receive(RECEIVE_MS) for _ in range(6)]
        assert [m.data() for m in got] == data[:6]
        assert [str(m.message_id()) for m in got] == sent["message_ids"]
        producer = admin.create_producer(topic)
        ids = [str(producer.send(d)) for d in data[6:]]
        out = ruby("--token-file", token["ruby-app"], "consume", topic, "--subscription", "rb", "--count", "10",
                   broker=broker)
        assert [unb64(m["payload_b64"]) for m in out["messages"]] == data
        assert [m["message_id"] for m in out["messages"]] == sent["message_ids"] + ids

        admin.create_namespace(f"{tenant}/closed", retention_ms=-1)
        admin.create_topic(f"persistent://{tenant}/closed/t")
        refused = ruby("--token-file", token["ruby-app"], "produce", f"persistent://{tenant}/closed/t",
                       "--payloads", write_json(tmp_path / "x.json", [b64(b"x")]), broker=broker, expect=2)
        assert refused["error"]["bksim_status"] == "PERMISSION_DENIED", refused


def test_ruby_ledger_api_needs_the_ledger_role(secured, tmp_path):
    cluster, token = secured
    broker = cluster.brokers[0].address
    (tmp_path / "pw").write_bytes(b"pw")
    data = payloads(7, 8)
    args = ["ledger-write", "--payloads", write_json(tmp_path / "p.json", [b64(d) for d in data]),
            "--password-file", str(tmp_path / "pw"), "--ensemble", "2", "--write-quorum", "2", "--ack-quorum", "2"]
    out = ruby("--token-file", token["ledger-app"], *args, broker=broker)
    assert [unb64(e["payload_b64"]) for e in out["read"]] == data and out["closed"]["state"] == "CLOSED"
    again = ruby("--token-file", token["admin"], "ledger-read", str(out["ledger_id"]), "--password-file",
                 str(tmp_path / "pw"), broker=broker)
    assert [unb64(e["payload_b64"]) for e in again["entries"]] == data

    denied = ruby("--token-file", token["ruby-app"], *args, broker=broker, expect=2)["error"]
    assert (denied["grpc_code"], denied["bksim_status"]) == (GRPC_PERMISSION_DENIED, "PERMISSION_DENIED"), denied
    for argv in ([], ["--token-file", token["other"]]):
        refused = ruby(*argv, *args, broker=broker, expect=2)["error"]
        assert (refused["grpc_code"], refused["bksim_status"]) == (GRPC_UNAUTHENTICATED, "UNAUTHENTICATED"), refused
