"""Token authentication and authorization at real brokers (security/tokens.py, security/authz.py,
security/broker_auth.py, adapters/topic_server.py) over real bookies and ZooKeeper.

One broker with security.auth_enabled and authorization_enabled (an HS256 secret key file, super-user `root`,
ledger role `ledger-app`), set through BKSIM_SECURITY_* like any option. Negative cases: no token, expired
token, wrong signature, `alg: none`, a role without the grant (produce and consume), cross-tenant access,
tenant creation by a non-super-user, the raw ledger API by a non-ledger role. Positive paths: the CLI with
--token-file and $BKSIM_TOKEN, the Python client with a token, grant then produce/consume, revoke then denied.
The last test greps the broker's log for every token and the secret.
"""
from __future__ import annotations

import base64
import contextlib
import io
import json
import time
import uuid

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bksim.cli.main import main
from bksim.client import Client, ClientError
from bksim.gen import broker_pb2, broker_pb2_grpc
from bksim.model.status import TopicStatus
from bksim.security.tokens import SigningKey, create_secret_key, create_token, read_secret_key

BOOKIES = 1
RECEIVE_MS = 10_000
BROKER_ENV = {"BKSIM_TOPIC_ENSEMBLE_SIZE": "1", "BKSIM_TOPIC_WRITE_QUORUM_SIZE": "1",
              "BKSIM_TOPIC_ACK_QUORUM_SIZE": "1", "BKSIM_SECURITY_AUTH_ENABLED": "true",
              "BKSIM_SECURITY_AUTHORIZATION_ENABLED": "true", "BKSIM_SECURITY_SUPER_USER_ROLES": "root",
              "BKSIM_SECURITY_LEDGER_ROLES": "ledger-app"}
TOKENS: list[str] = []  # every token this module made: none may appear in the broker's log


class Env:
    def __init__(self, broker, key_dir) -> None:
        self.broker = broker
        self.address = broker.address
        self.key_dir = key_dir
        self.secret_file = str(key_dir / "secret.key")
        self.key = SigningKey.from_secret_file(self.secret_file)

    def token(self, role: str, **kw) -> str:
        token = create_token(self.key, role, **kw)
        TOKENS.append(token)
        return token

    def token_file(self, role: str) -> str:
        path = self.key_dir / f"{role}-{uuid.uuid4().hex[:6]}.token"
        path.write_text(self.token(role) + "\n")
        return str(path)

    def client(self, role: str | None, token: str | None = None) -> Client:
        return Client(self.address, token=token if token is not None else (self.token(role) if role else None),
                      operation_timeout_ms=10_000, reconnect_attempts_max=2)


@pytest.fixture(scope="module")
def env(broker_cluster, tmp_path_factory):
    key_dir = tmp_path_factory.mktemp("keys")
    create_secret_key(str(key_dir / "secret.key"))
    broker_cluster.settle(BOOKIES)
    (broker,) = broker_cluster.start_brokers(
        1, env={**BROKER_ENV, "BKSIM_SECURITY_TOKEN_SECRET_KEY_FILE": str(key_dir / "secret.key")})
    return Env(broker, key_dir)


@pytest.fixture(scope="module")
def tenants(env):
    """Tenant a (admin a-admin) with namespace a/ns and topic t; tenant b (admin b-admin) with b/ns and t."""
    suffix = uuid.uuid4().hex[:6]
    a, b = f"a{suffix}", f"b{suffix}"
    with env.client("root") as root:
        root.create_tenant(a, ["a-admin"])
        root.create_tenant(b, ["b-admin"])
    for tenant in (a, b):
        with env.client(f"{tenant[0]}-admin") as admin:
            admin.create_namespace(f"{tenant}/ns", retention_ms=-1)
            admin.create_topic(f"persistent://{tenant}/ns/t")
    return a, b


def refused(call, status: TopicStatus) -> ClientError:
    with pytest.raises(ClientError) as e:
        call()
    assert e.value.status is status, e.value
    return e.value


# ---- authentication ------------------------------------------------------------------------------------------

def test_calls_without_a_valid_token_are_unauthenticated(env, tmp_path):
    with env.client(None) as c:
        e = refused(c.list_tenants, TopicStatus.UNAUTHENTICATED)
        assert "no token" in e.message and "authorization: Bearer" in e.message
    expired = env.token("root", expiry_s=1, now_s=time.time() - 60)
    other = tmp_path / "other.key"
    create_secret_key(str(other))
    forged = create_token(SigningKey.from_secret_file(str(other)), "root")
    TOKENS.append(forged)
    b64 = lambda d: base64.urlsafe_b64encode(json.dumps(d).encode()).rstrip(b"=").decode()  # noqa: E731
    unsigned = f"{b64({'alg': 'none', 'typ': 'JWT'})}.{b64({'sub': 'root'})}."
    TOKENS.append(unsigned)
    for token, words in ((expired, "expired"), (forged, "signature"), (unsigned, "algorithm 'none'"),
                         ("not-a-jwt", "not a JWT")):
        with env.client(None, token=token) as c:
            e = refused(c.list_tenants, TopicStatus.UNAUTHENTICATED)
            assert words in e.message and token not in e.message
    with env.client("root") as c:  # the same call with a good token
        assert isinstance(c.list_tenants(), list)


def test_health_stays_open_and_the_ledger_api_needs_a_token(env):
    with grpc.insecure_channel(env.address) as channel:
        health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        stub = broker_pb2_grpc.BrokerStub(channel)
        with pytest.raises(grpc.RpcError) as e:
            stub.ListLedgers(broker_pb2.ListLedgersRequest(), timeout=10)
        assert e.value.code() is grpc.StatusCode.UNAUTHENTICATED and "no token" in e.value.details()


# ---- authorization -------------------------------------------------------------------------------------------

def test_only_a_super_user_creates_tenants(env):
    with env.client("a-admin") as c:
        e = refused(lambda: c.create_tenant(f"x{uuid.uuid4().hex[:6]}"), TopicStatus.PERMISSION_DENIED)
        assert "role 'a-admin' may not create tenant" in e.message
        refused(c.list_tenants, TopicStatus.PERMISSION_DENIED)


def test_raw_ledger_api_needs_a_super_user_or_a_ledger_role(env):
    with grpc.insecure_channel(env.address) as channel:
        stub = broker_pb2_grpc.BrokerStub(channel)
        with pytest.raises(grpc.RpcError) as e:
            stub.ListLedgers(broker_pb2.ListLedgersRequest(), timeout=10,
                             metadata=(("authorization", f"Bearer {env.token('app')}"),))
        assert e.value.code() is grpc.StatusCode.PERMISSION_DENIED
        assert "role 'app' may not use the ledger API (ListLedgers)" in e.value.details()
        for role in ("ledger-app", "root"):
            stub.ListLedgers(broker_pb2.ListLedgersRequest(), timeout=10,
                             metadata=(("authorization", f"Bearer {env.token(role)}"),))


def test_cross_tenant_access_is_denied(env, tenants):
    a, b = tenants
    with env.client("b-admin") as c:
        e = refused(lambda: c.create_namespace(f"{a}/other"), TopicStatus.PERMISSION_DENIED)
        assert f"role 'b-admin' may not create namespace in tenant {a}" in e.message
        refused(lambda: c.list_topics(f"{a}/ns"), TopicStatus.PERMISSION_DENIED)
        refused(lambda: c.grant_permission(f"{a}/ns", "b-admin", "produce"), TopicStatus.PERMISSION_DENIED)
        refused(lambda: c.create_producer(f"persistent://{a}/ns/t"), TopicStatus.PERMISSION_DENIED)
    with env.client("a-admin") as c:
        c.grant_permission(f"{a}/ns", "app-cross", ["produce", "consume"])
    with env.client("app-cross") as c:  # a grant in tenant a gives nothing in tenant b
        c.create_producer(f"persistent://{a}/ns/t").close()
        e = refused(lambda: c.create_producer(f"persistent://{b}/ns/t"), TopicStatus.PERMISSION_DENIED)
        assert "role 'app-cross'" in e.message


def test_grant_then_produce_and_consume_revoke_then_denied(env, tenants):
    a, _ = tenants
    topic = f"persistent://{a}/ns/t"
    with env.client("a-admin") as admin, env.client("app") as app:
        e = refused(lambda: app.create_producer(topic), TopicStatus.PERMISSION_DENIED)  # no grant at all
        assert "role 'app'" in e.message
        admin.grant_permission(f"{a}/ns", "app", ["consume"])
        e = refused(lambda: app.create_producer(topic), TopicStatus.PERMISSION_DENIED)
        assert f"role 'app' may not produce on {topic}" in e.message
        consumer = app.subscribe(topic, "s", initial_position="earliest")
        admin.grant_permission(f"{a}/ns", "app", ["produce"], topic=topic)  # a topic grant adds produce
        assert admin.permissions(f"{a}/ns")["destination_auth"] == {topic: {"app": ["produce"]}}
        producer = app.create_producer(topic)
        producer.send(b"granted")
        producer.close()
        assert consumer.receive(RECEIVE_MS).data() == b"granted"
        consumer.close()
        admin.revoke_permission(f"{a}/ns", "app")  # the namespace grant (consume) goes
        e = refused(lambda: app.subscribe(topic, "s"), TopicStatus.PERMISSION_DENIED)
        assert f"role 'app' may not consume on {topic}" in e.message
        app.create_producer(topic).close()  # the topic grant stays
        admin.revoke_permission(f"{a}/ns", "app", topic=topic)
        refused(lambda: app.create_producer(topic), TopicStatus.PERMISSION_DENIED)
        assert admin.permissions(f"{a}/ns")["namespace_auth"].get("app") is None


def test_consume_only_role_cannot_produce_and_produce_only_cannot_consume(env, tenants):
    a, _ = tenants
    topic = f"persistent://{a}/ns/t"
    with env.client("a-admin") as admin:
        admin.grant_permission(f"{a}/ns", "writer", "produce")
    with env.client("writer") as writer:
        writer.create_producer(topic).close()
        e = refused(lambda: writer.subscribe(topic, "w"), TopicStatus.PERMISSION_DENIED)
        assert f"role 'writer' may not consume on {topic}" in e.message


# ---- the command line ------------------------------------------------------------------------------------------

def bksim(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


def test_cli_with_token_file_and_environment(env, tenants, monkeypatch):
    a, _ = tenants
    monkeypatch.delenv("BKSIM_TOKEN", raising=False)
    code, _, err = bksim("namespace", "permissions", f"{a}/ns", "--broker", env.address)
    assert code == 2 and "UNAUTHENTICATED" in err and "no token" in err
    admin_file = env.token_file("a-admin")
    code, out, err = bksim("--token-file", admin_file, "namespace", "grant-permission", f"{a}/ns",
                           "--role", "cli-app", "--actions", "produce,consume", "--broker", env.address)
    assert code == 0, err
    assert "granted produce, consume" in out
    code, out, _ = bksim("namespace", "permissions", f"{a}/ns", "--json", "--broker", env.address,
                         "--token-file", admin_file)
    assert json.loads(out)["namespace_auth"]["cli-app"] == ["consume", "produce"]
    monkeypatch.setenv("BKSIM_TOKEN", env.token("cli-app"))
    code, out, err = bksim("produce", f"persistent://{a}/ns/t", "-m", "from-cli", "--broker", env.address)
    assert code == 0, err
    code, _, err = bksim("tenant", "create", f"c{uuid.uuid4().hex[:6]}", "--broker", env.address)
    assert code == 2 and "PERMISSION_DENIED" in err and "role 'cli-app' may not create tenant" in err


def test_ledger_cli_presents_the_token(env):
    code, out, err = bksim("--token-file", env.token_file("ledger-app"), "ledger", "list", "--json",
                           "--broker", env.address)
    assert code == 0, err
    assert isinstance(json.loads(out), (list, dict))
    code, _, err = bksim("--token-file", env.token_file("app"), "ledger", "list", "--broker", env.address)
    assert code == 2 and "PERMISSION_DENIED" in err and "role 'app' may not use the ledger API" in err


# ---- secrets ----------------------------------------------------------------------------------------------------

def test_no_token_or_key_in_the_broker_log(env):
    """Runs last: every token made above, and the secret (raw base64 and decoded), never reached the log."""
    assert len(TOKENS) >= 10
    with open(env.broker.log_path, "rb") as f:
        log = f.read()
    assert b"serving" in log  # the right file, written while the calls above were served
    secret = read_secret_key(env.secret_file)
    for needle in [t.encode() for t in TOKENS] + [secret, base64.b64encode(secret)] + \
            [t.split(".")[2].encode() for t in TOKENS if t.split(".")[2]]:
        assert needle not in log
