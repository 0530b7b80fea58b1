"""A three-server ZooKeeper ensemble under bookies and brokers, all real processes on loopback.

- One server killed with -9, the leader too: the clients move to another server with their sessions (the
  bookies' and brokers' registrations are the same znodes, created by the same sessions), metadata changes go
  on after at most a short pause, nothing acknowledged is lost.
- Two servers lost (no quorum): metadata changes fail cleanly (a precise error within the operation timeout, no
  half-made ledger), appends to a ledger already open on a stable ensemble go on (they need no metadata, as in
  BookKeeper), no topic gets an owner; when a quorum returns, everything resumes with the same sessions and
  owners, and every acknowledged entry and message reads back.
"""
from __future__ import annotations

import time
import uuid

import pytest
from kazoo.exceptions import NoNodeError

from bksim.adapters.broker_client import BrokerCallError, SyncBrokerClient
from bksim.adapters.local_cluster import LocalCluster
from bksim.client import Client, ClientError, InitialPosition
from bksim.metadata import ledger_metadata
from bksim.metadata.paths import AVAILABLE, broker_path, ledger_path
from bksim.model.status import TopicStatus
from helpers import wait_until

SERVERS = 3
BOOKIES = 3
BROKERS = 2
TICK_MS = 200
SESSION_TIMEOUT_MS = 4000  # ZooKeeper's upper clamp at this tick (20 ticks)
OPERATION_TIMEOUT_MS = 3000  # the brokers' metadata operations: one unanswered this long fails
READ_TRIES = 3  # zookeeper.read_tries_max: placement reads the bookie list, tried this often in all
READY_TIMEOUT_S = 60.0
ELECTION_BOUND_S = 20.0  # a new leader is elected within this (initLimit 10 ticks, on a loaded machine)
CALL_DEADLINE_S = 20.0
REFUSED_MARK = {"made-by": "the create refused without a quorum"}  # custom metadata: tells its ledger apart


@pytest.fixture(scope="module")
def ensemble(tmp_path_factory):
    run_dir = str(tmp_path_factory.mktemp("zk-ensemble"))
    cluster = LocalCluster(run_dir, inherit_bksim_env=False, cwd=run_dir, child_env={
        "BKSIM_ZOOKEEPER_SESSION_TIMEOUT_MS": str(SESSION_TIMEOUT_MS),
        "BKSIM_ZOOKEEPER_OPERATION_TIMEOUT_MS": str(OPERATION_TIMEOUT_MS),
        "BKSIM_ZOOKEEPER_READ_TRIES_MAX": str(READ_TRIES),
        "BKSIM_AUTORECOVERY_ENABLED": "false"})
    try:
        cluster.start_zookeeper(count=SERVERS, tick_time_ms=TICK_MS, heap_mb=128, timeout_s=READY_TIMEOUT_S)
        for _ in range(BOOKIES):
            cluster.add_bookie()
        for _ in range(BROKERS):
            cluster.add_broker()
        cluster.start(cluster.bookies, READY_TIMEOUT_S)
        cluster.start(cluster.brokers, READY_TIMEOUT_S, serving=True)
        with Client(service_url(cluster)) as client:
            client.create_tenant("public")
            client.create_namespace("public/default")
        yield cluster
    finally:
        assert cluster.stop_all() == []


def service_url(cluster: LocalCluster) -> str:
    return ",".join(b.address for b in cluster.brokers)


def sessions(cluster: LocalCluster) -> dict[str, int]:
    """The ZooKeeper session owning each bookie's and broker's registration."""
    with_zk = cluster.kazoo()
    try:
        out = {}
        for node in cluster.bookies:
            out[node.name] = with_zk.get(f"{AVAILABLE}/{node.node_id}")[1].ephemeralOwner
        for node in cluster.brokers:
            out[node.name] = with_zk.get(broker_path(node.node_id))[1].ephemeralOwner
        return out
    finally:
        with_zk.stop()
        with_zk.close()


def ledger_customs(cluster: LocalCluster, ledger_ids) -> dict[int, dict[str, str]]:
    """The custom metadata of each of these ledgers that still exists (read from ZooKeeper)."""
    with_zk = cluster.kazoo()
    try:
        out = {}
        for ledger_id in ledger_ids:
            try:
                data, _ = with_zk.get(ledger_path(ledger_id))
            except NoNodeError:
                continue  # deleted meanwhile (a cursor's or a topic's old ledger)
            out[ledger_id] = dict(ledger_metadata.decode(data).custom)
        return out
    finally:
        with_zk.stop()
        with_zk.close()


def wait_leader(cluster: LocalCluster):
    return wait_until(cluster.zookeeper_leader, timeout_s=ELECTION_BOUND_S, message="a ZooKeeper leader")


def wait_writable(broker: SyncBrokerClient):
    """Create a ledger as soon as metadata changes go through again; returns it."""
    def attempt():
        try:
            return broker.create_ledger(3, 3, 2)
        except BrokerCallError:
            return None
    return wait_until(attempt, timeout_s=ELECTION_BOUND_S + SESSION_TIMEOUT_MS / 1000, message="a ledger created")


def drain(consumer, count: int) -> list[bytes]:
    """`count` messages' payloads, in the order received (bounded wait)."""
    received: list[bytes] = []

    def more() -> bool:
        try:
            received.append(consumer.receive(timeout_ms=500).data())
        except ClientError as e:
            if e.status != TopicStatus.TIMEOUT:
                raise
        return len(received) >= count
    wait_until(more, timeout_s=60, message=f"{count} messages")
    return received


def restore(cluster: LocalCluster) -> None:
    for server in cluster.zookeepers:
        if server.pid is None:
            cluster.start_zookeeper_server(server)
    cluster.wait_zookeeper(READY_TIMEOUT_S)


def test_every_server_is_named_to_the_clients_and_one_leads(ensemble):
    modes = sorted(server.mode() for server in ensemble.zookeepers)
    assert modes == ["follower", "follower", "leader"]
    connect = ",".join(server.connect for server in ensemble.zookeepers)
    for node in ensemble.nodes:
        assert node.env["BKSIM_ZOOKEEPER_CONNECT"] == connect


@pytest.mark.parametrize("victim", ["leader", "follower"])
def test_killing_one_server_is_a_short_pause(ensemble, victim):
    before = sessions(ensemble)
    topic = f"persistent://public/default/ensemble-{victim}-{uuid.uuid4().hex[:8]}"
    with Client(service_url(ensemble)) as client, SyncBrokerClient(ensemble.brokers[0].address,
                                                                     deadline_s=CALL_DEADLINE_S) as broker:
        client.create_topic(topic)
        producer = client.create_producer(topic)
        acked = [producer.send(f"before-{i}".encode()) for i in range(50)]
        leader = wait_leader(ensemble)
        server = leader if victim == "leader" else next(s for s in ensemble.zookeepers if s is not leader)
        ensemble.stop_zookeeper_server(server, kill=True)
        try:
            acked += [producer.send(f"during-{i}".encode()) for i in range(50)]
            ledger = wait_writable(broker)  # a metadata change: goes through once the rest has a leader
            assert broker.append(ledger.ledger_id, [[b"x"] * 10]) and broker.read_lac(ledger.ledger_id) == 9
            assert wait_leader(ensemble) is not server
            assert sessions(ensemble) == before  # nobody's session expired: same registrations
        finally:
            restore(ensemble)
        assert server.mode() in ("follower", "leader")
        consumer = client.subscribe(topic, "check", initial_position=InitialPosition.Earliest)
        received = drain(consumer, len(acked))
        assert sorted(received) == sorted([f"before-{i}".encode() for i in range(50)] +
                                          [f"during-{i}".encode() for i in range(50)])


def test_losing_quorum_stops_metadata_changes_and_loses_nothing(ensemble):
    before = sessions(ensemble)
    topic = f"persistent://public/default/ensemble-quorum-{uuid.uuid4().hex[:8]}"
    with Client(service_url(ensemble)) as client, SyncBrokerClient(ensemble.brokers[0].address,
                                                                     deadline_s=CALL_DEADLINE_S) as broker:
        orphan = f"persistent://public/default/ensemble-orphan-{uuid.uuid4().hex[:8]}"
        client.create_topic(topic)
        client.create_topic(orphan)  # never looked up before the outage: it has no owner
        producer = client.create_producer(topic)
        producer.send(b"first")
        owner_before = client.lookup(topic)
        ledger = broker.create_ledger(3, 3, 2)
        broker.append(ledger.ledger_id, [[f"a-{i}".encode() for i in range(20)]])
        ledgers_before = set(broker.list_ledgers())
        lost = ensemble.zookeepers[:2]
        for server in lost:
            ensemble.stop_zookeeper_server(server, kill=True)
        try:
            assert wait_until(lambda: ensemble.zookeepers[2].mode() == "", timeout_s=ELECTION_BOUND_S,
                              message="the last server stops serving (no quorum)")
            # appends to an open ledger on a stable ensemble need no metadata: they go on
            broker.append(ledger.ledger_id, [[f"b-{i}".encode() for i in range(20)]])
            assert broker.read_lac(ledger.ledger_id) == 39
            # a metadata change fails, precisely and within its operations' timeouts, and leaves nothing behind
            started = time.monotonic()
            with pytest.raises(BrokerCallError) as refused:
                broker.create_ledger(3, 3, 2, custom=REFUSED_MARK)
            assert time.monotonic() - started < READ_TRIES * OPERATION_TIMEOUT_MS / 1000 + 5
            assert refused.value.status == "METADATA_ERROR" and "no answer from ZooKeeper" in refused.value.message
            # nobody can even find out who would own a topic without an owner (so none takes it)
            with pytest.raises(ClientError) as unknown:
                client.lookup(orphan)
            assert unknown.value.status == TopicStatus.METADATA_ERROR, unknown.value
        finally:
            restore(ensemble)
        wait_leader(ensemble)
        created = wait_writable(broker)
        new = set(broker.list_ledgers()) - ledgers_before  # cursors and topics may have made ledgers meanwhile too
        assert created.ledger_id in new
        assert not [i for i, custom in ledger_customs(ensemble, new).items() if custom == REFUSED_MARK], \
            "the refused create left a ledger"
        assert sessions(ensemble) == before
        assert client.lookup(topic) == owner_before  # the owner kept its topic: never handed out twice
        client.create_producer(orphan).send(b"owned now")
        assert client.lookup(orphan)["owned"]
        entries = broker.read_entries(ledger.ledger_id, 0, 39)
        assert [payload for _, payload in entries] == ([f"a-{i}".encode() for i in range(20)] +
                                                [f"b-{i}".encode() for i in range(20)])
        producer.send(b"after")
        consumer = client.subscribe(topic, "check", initial_position=InitialPosition.Earliest)
        assert drain(consumer, 2) == [b"first", b"after"]
