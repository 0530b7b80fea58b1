"""No secret of a secured cluster appears in any log, stats answer or metadata export of its run.

One cluster of real processes (ZooKeeper with a TLS client port, a bookie, a broker) with every security switch
on: TLS with mutual authentication on every gRPC link, tokens and authorization at the broker (security/kit.py:
HS256 secret, super-user token), ZooKeeper digest credentials. The run does ordinary work and failing work:
tokens signed with another key and expired ones, a role without a grant producing, a grant by a role that is not
the tenant's admin, a grant of an unknown action, appends, reads and a fencing open with the wrong ledger
password, the CLI with a foreign token. Then every log file of the run directory (ZooKeeper's included), the
stats and metadata the tools can produce (`bksim metadata export`, `bksim bookie gc-status`, `bksim bookie
list`, `bksim broker list`, topic stats and internal stats) and the CLI's own output are searched for every
token, the HS256 secrets, every private key's PEM body, the ZooKeeper password and the ledger password (raw and
base64): none may appear.
"""
from __future__ import annotations

import asyncio
import base64
import os
import subprocess
import sys
import time
import uuid

import pytest

from bksim.adapters.broker_client import BrokerCallError, BrokerClient
from bksim.adapters.local_cluster import LocalCluster
from bksim.adapters.ports import free_port
from bksim.adapters.zk_client import ZkTls
from bksim.client import Client, ClientError
from bksim.model.status import TopicStatus
from bksim.security import certs
from bksim.security.kit import SUPER_USER_ROLE, SecurityKit
from bksim.security.tokens import SigningKey, create_secret_key, create_token

START_TIMEOUT_S = 60.0
CLI_TIMEOUT_S = 60.0
LEDGER_PASSWORD = f"ledger-pw-{uuid.uuid4().hex}".encode()


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """(cluster, kit, secrets: list of (what, text), outputs: list of (what, text)) after the operations."""
    run_dir = str(tmp_path_factory.mktemp("secrets-run"))
    kit = SecurityKit.create(os.path.join(run_dir, "security"))
    zk_files = certs.ensure(kit.tls_dir, {"zookeeper": ((), ())})["zookeeper"]
    ca_file = os.path.join(kit.tls_dir, certs.CA_FILE)
    cluster = LocalCluster(run_dir, inherit_bksim_env=False, cwd=run_dir, tls_dir=kit.tls_dir,
                           child_env={**kit.child_env(), "BKSIM_SECURITY_TLS_CLIENT_AUTH": "true",
                                      "BKSIM_ZOOKEEPER_SESSION_TIMEOUT_MS": "4000",
                                      "BKSIM_AUTORECOVERY_ENABLED": "false",
                                      "BKSIM_BOOKIE_SHUTDOWN_GRACE_MS": "3000",
                                      "BKSIM_BROKER_SHUTDOWN_GRACE_MS": "3000",
                                      "BKSIM_TOPIC_ENSEMBLE_SIZE": "1", "BKSIM_TOPIC_WRITE_QUORUM_SIZE": "1",
                                      "BKSIM_TOPIC_ACK_QUORUM_SIZE": "1"})
    secrets = [("super-user token", kit.token()), ("ZooKeeper password", kit.zk_password()),
               ("ledger password", LEDGER_PASSWORD.decode()),
               ("ledger password (base64)", base64.b64encode(LEDGER_PASSWORD).decode())]
    outputs: list[tuple[str, str]] = []
    try:
        cluster.zookeeper_server(free_port(), secure_port=free_port(), heap_mb=128,
                                 tls=ZkTls(ca_file, zk_files.cert_file, zk_files.key_file))
        cluster.start_zookeeper(timeout_s=START_TIMEOUT_S)
        bookie, broker = cluster.add_bookie(), cluster.add_broker()
        cluster.start([bookie, broker], timeout_s=START_TIMEOUT_S, serving=True)
        _work(cluster, kit, broker.address, secrets, outputs)
        _tools(cluster, kit, bookie, broker, outputs)
        yield cluster, kit, secrets, outputs
    finally:
        leftovers = cluster.stop_all()
        assert not leftovers, f"processes did not stop: {leftovers}"


def _work(cluster, kit, address: str, secrets: list, outputs: list) -> None:
    key = SigningKey.from_secret_file(kit.secret_key_file)
    foreign_file = os.path.join(cluster.run_dir, "security", "foreign.key")
    create_secret_key(foreign_file)
    tokens = {"app": create_token(key, "app"), "intruder": create_token(key, "intruder"),
              "expired": create_token(key, SUPER_USER_ROLE, expiry_s=1, now_s=time.time() - 60),
              "foreign": create_token(SigningKey.from_secret_file(foreign_file), SUPER_USER_ROLE)}
    secrets += [(f"{k} token", t) for k, t in tokens.items()]
    with open(os.path.join(cluster.run_dir, "security", "foreign.token"), "w") as f:
        f.write(tokens["foreign"] + "\n")
    for path in (kit.secret_key_file, foreign_file):
        with open(path) as f:
            secrets.append((f"HS256 secret {os.path.basename(path)}", f.read().strip()))
    for name in sorted(os.listdir(kit.tls_dir)):
        if name.endswith("-key.pem"):
            with open(os.path.join(kit.tls_dir, name)) as f:
                body = [line for line in f.read().splitlines() if line and not line.startswith("-----")]
            secrets += [(f"private key {name}", line) for line in body if len(line) >= 24]

    def client(token: str) -> Client:
        return Client(address, tls=cluster.tls, token=token, operation_timeout_ms=10_000, reconnect_attempts_max=1)

    tenant = f"t{uuid.uuid4().hex[:6]}"
    topic = f"persistent://{tenant}/ns/orders"
    with client(kit.token()) as root:
        root.create_tenant(tenant, ["tenant-admin"])
        root.create_namespace(f"{tenant}/ns", retention_ms=-1)
        root.create_topic(topic)
        root.grant_permission(f"{tenant}/ns", "app", ["produce", "consume"])
        with pytest.raises(ClientError):  # a grant of an action that does not exist
            root.grant_permission(f"{tenant}/ns", "app", ["fly"])
        outputs.append(("topic stats", str(root.topic_stats(topic))))
    with client(tokens["app"]) as app:
        consumer = app.subscribe(topic, "s", initial_position="Earliest")
        producer = app.create_producer(topic)
        for i in range(5):
            producer.send(f"m{i}".encode())
        producer.close()
        assert consumer.receive(timeout_ms=10_000).data() == b"m0"
        consumer.close()
    for token, status in ((tokens["foreign"], TopicStatus.UNAUTHENTICATED),
                          (tokens["expired"], TopicStatus.UNAUTHENTICATED),
                          (tokens["intruder"], TopicStatus.PERMISSION_DENIED)):
        with client(token) as c:
            with pytest.raises(ClientError) as e:
                c.create_producer(topic).send(b"x")
            assert e.value.status is status, e.value
            outputs.append((f"error {status.name}", str(e.value)))
    with client(tokens["intruder"]) as c:  # a grant by a role that is not the tenant's admin
        with pytest.raises(ClientError) as e:
            c.grant_permission(f"{tenant}/ns", "intruder", ["produce"])
        assert e.value.status is TopicStatus.PERMISSION_DENIED
    with client(kit.token()) as root:
        outputs.append(("topic stats-internal", str(root.topic_stats_internal(topic))))

    async def ledgers() -> None:
        async with BrokerClient(address, tls=cluster.tls, token=kit.token()) as c:
            info = await c.create_ledger(1, 1, 1, password=LEDGER_PASSWORD)
            await c.append(info.ledger_id, [[b"e0", b"e1"]], password=LEDGER_PASSWORD)
            wrong = b"not-" + LEDGER_PASSWORD
            for call in (lambda: c.append(info.ledger_id, [[b"e2"]], password=wrong),
                         lambda: c.open_ledger(info.ledger_id, password=wrong, recover=True),
                         lambda: _drain(c.read_entries(info.ledger_id, 0, 1, password=wrong))):
                with pytest.raises(BrokerCallError) as e:
                    await call()
                outputs.append(("wrong ledger password", str(e.value)))
            await c.close_ledger(info.ledger_id, password=LEDGER_PASSWORD)
    asyncio.run(ledgers())


async def _drain(entries) -> list:
    return [e async for e in entries]


def _tools(cluster, kit, bookie, broker, outputs: list) -> None:
    """The CLI's stats and exports, with the cluster's TLS files and credentials (file names only)."""
    client_files = certs.ensure(kit.tls_dir, {certs.CLIENT_NAME: ((), ("client",))})[certs.CLIENT_NAME]
    env = {k: v for k, v in os.environ.items() if not k.startswith("BKSIM_")}
    env.update({"BKSIM_ZOOKEEPER_HOST": cluster.zookeeper.host, "BKSIM_ZOOKEEPER_PORT": str(cluster.zookeeper.port),
                "BKSIM_ZOOKEEPER_DIGEST_CREDENTIALS_FILE": kit.zk_credentials_file,
                "BKSIM_SECURITY_TLS_ENABLED": "true",
                "BKSIM_SECURITY_TLS_CA_FILE": os.path.join(kit.tls_dir, certs.CA_FILE),
                "BKSIM_SECURITY_TLS_CERT_FILE": client_files.cert_file,
                "BKSIM_SECURITY_TLS_KEY_FILE": client_files.key_file})
    export = os.path.join(cluster.run_dir, "metadata-export.json")
    for label, argv, ok in (
            ("metadata export", ["metadata", "export", "--out", export, "--zookeeper", cluster.zookeeper.connect], True),
            ("bookie gc-status", ["bookie", "gc-status", "--bookie", bookie.address, "--json"], True),
            ("bookie list", ["bookie", "list", "--json"], True), ("broker list", ["broker", "list", "--json"], True),
            ("foreign token", ["--token-file", os.path.join(cluster.run_dir, "security", "foreign.token"), "topic",
                               "list", "x/y", "--broker", broker.address], False)):
        done = subprocess.run([sys.executable, "-m", "bksim.cli.main", *argv], capture_output=True, text=True,
                              env=env, cwd=cluster.run_dir, timeout=CLI_TIMEOUT_S)
        assert (done.returncode == 0) is ok, f"{argv}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
        outputs.append((f"bksim {label}", done.stdout + done.stderr))
    with open(export) as f:
        outputs.append(("metadata export", f.read()))


def test_no_secret_in_any_log_stats_or_export(run):
    cluster, kit, secrets, outputs = run
    logs = sorted(os.listdir(cluster.logs_dir))
    assert {"zookeeper.log", "bookie-1.log", "broker-1.log"} <= set(logs), logs
    places = list(outputs)
    for name in logs:
        with open(os.path.join(cluster.logs_dir, name), errors="replace") as f:
            places.append((f"log {name}", f.read()))
    assert all(text for _, text in places if _.startswith("log ")), "an empty log proves nothing"
    assert any("ledger" in text for what, text in places if what == "metadata export")
    found = [f"{what} in {where}" for what, secret in secrets for where, text in places if secret in text]
    assert not found, found


def test_the_failures_were_real_and_named_what_was_wrong(run):
    _cluster, _kit, _secrets, outputs = run
    said = {what: text for what, text in outputs}
    assert "signature" in said["error UNAUTHENTICATED"] or "expired" in said["error UNAUTHENTICATED"]
    assert "intruder" in said["error PERMISSION_DENIED"]
    assert sum(1 for what, _ in outputs if what == "wrong ledger password") == 3
    assert "signature" in said["bksim foreign token"], said["bksim foreign token"]
    assert "ledger" in said["bksim bookie gc-status"] or "entry" in said["bksim bookie gc-status"]


def test_the_search_covers_every_kind_of_secret(run):
    _cluster, _kit, secrets, _outputs = run
    kinds = {what.split(" ")[0] for what, _ in secrets}
    assert {"super-user", "ZooKeeper", "ledger", "app", "intruder", "expired", "foreign", "HS256", "private"} <= kinds
    keys = {what for what, _ in secrets if what.startswith("private key ")}
    assert keys == {f"private key {n}-key.pem" for n in ("ca", "bookie-1", "broker-1", "client", "zookeeper")}
    assert all(len(text) >= 16 for _, text in secrets)
