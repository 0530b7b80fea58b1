"""Partitioned topics on real brokers through bksim.client: stats summed over partitions served by two brokers
(Pulsar's PartitionedTopicStats), and the deletion one broker runs for every partition wherever it is served —
including the state a broker killed mid-deletion leaves (the topic marked deleting in ZooKeeper): nobody is
admitted to any partition, and a retried delete finishes it. (The crash between two partitions is driven
step by step in tests/unit/topics/test_partitioned.py.)"""
from __future__ import annotations

import json
import os
import signal
import threading
import uuid

import pytest

from bksim.client import Client, ClientError, InitialPosition
from bksim.model.status import TopicStatus
from bksim.topics.names import TopicName
from helpers import wait_until

BOOKIES = 3
PARTITIONS = 4


@pytest.fixture(scope="module")
def brokers(broker_cluster):
    broker_cluster.settle(BOOKIES)
    if not broker_cluster.brokers:
        broker_cluster.start_brokers(2)
    return broker_cluster


@pytest.fixture
def client(brokers):
    with Client([b.address for b in brokers.brokers], operation_timeout_ms=20_000) as c:
        yield c


@pytest.fixture
def topic(client):
    tenant = f"p{uuid.uuid4().hex[:8]}"
    client.create_tenant(tenant)
    client.create_namespace(f"{tenant}/ns", retention_ms=-1)
    name = f"persistent://{tenant}/ns/t"
    client.create_topic(name, partitions=PARTITIONS)
    return name


def _spread(brokers, topic) -> None:
    """Partition i taken by broker i mod 2 (a broker asked directly takes a topic nobody owns)."""
    for i in range(PARTITIONS):
        with Client(brokers.brokers[i % 2].address, operation_timeout_ms=20_000) as direct:
            direct.topic_stats(f"{topic}-partition-{i}", follow_owner=False)


def _fill(client, topic, n):
    client.subscribe(topic, "s", initial_position=InitialPosition.Earliest).close()
    with client.create_producer(topic, batching_enabled=False) as producer:
        for i in range(n):
            producer.send(f"m{i}".encode())  # round robin over the partitions


def test_stats_sum_the_partitions(brokers, client, topic):
    _spread(brokers, topic)
    _fill(client, topic, 40)
    owners = {client.lookup(f"{topic}-partition-{i}")["broker_id"] for i in range(PARTITIONS)}
    assert len(owners) == 2  # the client asked each partition's owner
    stats = client.topic_stats(topic)
    assert stats["metadata"] == {"partitions": PARTITIONS} and len(stats["partitions"]) == PARTITIONS
    parts = stats["partitions"].values()
    assert stats["msgInCounter"] == 40 == sum(p["msgInCounter"] for p in parts)
    assert all(p["msgInCounter"] == 10 for p in parts)  # round robin, one message an entry
    assert stats["bytesInCounter"] == sum(p["bytesInCounter"] for p in parts) > 0
    assert stats["storageSize"] == sum(p["storageSize"] for p in parts)
    assert stats["subscriptions"]["s"]["msgBacklog"] == 40
    assert stats["subscriptions"]["s"]["msgBacklog"] == sum(p["subscriptions"]["s"]["msgBacklog"] for p in parts)


def test_delete_reaches_every_partition_wherever_it_is_served(brokers, client, topic):
    _spread(brokers, topic)
    _fill(client, topic, 8)
    assert len({client.lookup(f"{topic}-partition-{i}")["broker_id"] for i in range(PARTITIONS)}) == 2
    with pytest.raises(ClientError) as e:
        client.delete_topic(topic)  # subscriptions, without force: refused, nothing changed
    assert e.value.status is TopicStatus.NOT_ALLOWED
    assert client.topic_stats(topic)["msgInCounter"] == 8
    assert client.delete_topic(topic, force=True) == {"topic": topic, "partitions": PARTITIONS}
    name = TopicName.parse(topic)
    zk = brokers.zk
    assert zk.exists(name.partitioned_path) is None
    assert all(zk.exists(name.partition(i).managed_ledger_path) is None for i in range(PARTITIONS))
    assert topic not in client.list_topics(name.ns)


def test_a_topic_left_marked_admits_nobody_and_a_retried_delete_finishes_it(brokers, client, topic):
    _fill(client, topic, 8)
    consumer = client.subscribe(topic, "s")
    name = TopicName.parse(topic)
    zk = brokers.zk
    data, stat = zk.get(name.partitioned_path)  # what a broker killed right after marking leaves behind
    zk.set(name.partitioned_path, json.dumps(json.loads(data) | {"deleting": True}).encode(), version=stat.version)

    def refused():
        try:
            client.create_producer(topic).close()
        except ClientError as e:
            return e
        return None
    e = wait_until(refused, 10, message="a producer is still admitted")  # owners release within a second
    assert e.status is TopicStatus.NOT_ALLOWED and "being deleted" in str(e)
    with pytest.raises(ClientError) as e2:
        client.subscribe(topic, "other")
    assert e2.value.status is TopicStatus.NOT_ALLOWED
    assert client.get_topic(topic)["partitions"] == PARTITIONS  # still there until the deletion finishes
    consumer.close()
    assert client.delete_topic(topic)["partitions"] == PARTITIONS  # the retry: no refusal, it goes on
    assert zk.exists(name.partitioned_path) is None
    assert all(zk.exists(name.partition(i).managed_ledger_path) is None for i in range(PARTITIONS))
    with pytest.raises(ClientError) as e3:
        client.get_topic(topic)
    assert e3.value.status is TopicStatus.TOPIC_NOT_FOUND


def test_kill9_of_the_deleting_broker_mid_deletion_then_a_retry_on_the_other_finishes(brokers, topic):
    """Broker a deletes; broker b (SIGSTOP) cannot release its partition, so a waits there after marking the topic
    and deleting its own first partition: kill -9 of a at that point. (Last in the module: a stays dead.)"""
    a, b = brokers.brokers
    _spread(brokers, topic)  # partitions 0 and 2 on a, 1 and 3 on b
    name = TopicName.parse(topic)
    zk = brokers.zk
    os.kill(b.pid, signal.SIGSTOP)
    try:
        with Client(a.address, operation_timeout_ms=20_000) as only_a:
            deleting = threading.Thread(target=lambda: _ignore(ClientError, only_a.delete_topic, topic, True),
                                        daemon=True)
            deleting.start()
            wait_until(lambda: zk.exists(name.partition(0).managed_ledger_path) is None, 10, interval_s=0.01,
                       message="broker a did not delete its first partition")
            a.kill9()  # a now waits for b's partition 1: mid-deletion
    finally:
        os.kill(b.pid, signal.SIGCONT)
    assert json.loads(zk.get(name.partitioned_path)[0])["deleting"] is True
    assert zk.exists(name.partition(1).managed_ledger_path) is not None
    with Client(b.address, operation_timeout_ms=20_000) as only_b:
        def refused():  # b unloads partition 3 within a second and admits nobody to it from then on
            try:
                only_b.subscribe(f"{topic}-partition-3", "late").close()
            except ClientError as error:
                return error
            return None
        e = wait_until(refused, 10)
        assert e.status is TopicStatus.NOT_ALLOWED and "being deleted" in str(e)

        def retried():  # partition 2 is a's until a's ZooKeeper session expires (2 s): SERVICE_UNAVAILABLE until then
            try:
                return only_b.delete_topic(topic)
            except ClientError as error:
                assert error.status is TopicStatus.SERVICE_UNAVAILABLE, error
                return None
        assert wait_until(retried, 30, interval_s=0.5)["partitions"] == PARTITIONS
    assert zk.exists(name.partitioned_path) is None
    assert all(zk.exists(name.partition(i).managed_ledger_path) is None for i in range(PARTITIONS))


def _ignore(kind, fn, *args):
    try:
        fn(*args)
    except kind:
        pass
