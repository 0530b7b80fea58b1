"""bksim.client against real brokers (tests/integration/broker_harness.py: ZooKeeper, 3 bookies, 2 brokers):
produce and consume through lookups and redirects, batches and batch-index acks, partitioned topics, every
subscription type's client-visible contract, dedup with a stable producer name, and the refusals of bad input
(unknown topic/namespace, cumulative ack on Shared, unknown message id, oversize message, too many pending
messages) — each a ClientError with the broker's status and text, nothing lost."""
from __future__ import annotations

import uuid

import pytest

from bksim.client import Client, ClientError, InitialPosition, MessageId, SubscriptionType
from bksim.formats.murmur3 import murmur3_32
from bksim.model.status import TopicStatus

BOOKIES = 3
RECEIVE_MS = 10_000
MESSAGE_BYTES_MAX = 60_000  # the brokers' topic.message_bytes_max (within the harness's payload_bytes_max)
BROKER_ENV = {"BKSIM_TOPIC_MESSAGE_BYTES_MAX": str(MESSAGE_BYTES_MAX), "BKSIM_TOPIC_ENSEMBLE_SIZE": "3",
              "BKSIM_TOPIC_WRITE_QUORUM_SIZE": "3", "BKSIM_TOPIC_ACK_QUORUM_SIZE": "2"}


@pytest.fixture(scope="module")
def brokers(broker_cluster):
    broker_cluster.settle(BOOKIES)
    if not broker_cluster.brokers:
        broker_cluster.start_brokers(2, env=BROKER_ENV)
    return broker_cluster


@pytest.fixture
def client(brokers):
    for b in brokers.brokers:
        assert b.alive(), f"broker {b.broker_id} died:\n{b.log_tail()}"
    with Client([b.address for b in brokers.brokers], operation_timeout_ms=20_000) as c:
        yield c


@pytest.fixture
def ns(client):
    """A fresh tenant/namespace (the session's ZooKeeper is shared by every module)."""
    tenant = f"t{uuid.uuid4().hex[:8]}"
    client.create_tenant(tenant)
    client.create_namespace(f"{tenant}/ns", retention_ms=-1)
    return f"{tenant}/ns"


def _drain(consumer, n: int, ack: bool = True) -> list:
    out = []
    for _ in range(n):
        m = consumer.receive(RECEIVE_MS)
        out.append(m)
        if ack:
            consumer.acknowledge(m)
    return out


def test_admin_round_trip(client, ns):
    topic = f"persistent://{ns}/admin"
    assert client.create_topic(topic, partitions=2) == {"topic": topic, "partitions": 2}
    assert client.get_topic(topic)["partitions"] == 2
    assert topic in client.list_topics(ns)
    owner = client.lookup(f"{topic}-partition-0")
    assert owner["address"] in [b for b in client.addresses]
    with pytest.raises(ClientError) as e:
        client.create_topic(topic)
    assert e.value.status is TopicStatus.ALREADY_EXISTS
    assert client.delete_topic(topic)["partitions"] == 2
    assert topic not in client.list_topics(ns)


def test_produce_consume_batches_in_order(client, ns):
    topic = f"persistent://{ns}/orders"
    client.create_topic(topic)
    consumer = client.subscribe(topic, "sub", initial_position=InitialPosition.Earliest)
    producer = client.create_producer(topic, batching_max_publish_delay_ms=5)
    ids = []
    for i in range(500):
        producer.send_async(f"m{i}".encode(), lambda e, mid: ids.append((e, mid)), properties={"i": str(i)})
    producer.flush()
    assert all(e is None for e, _ in ids) and len(ids) == 500
    assert any(mid.batch_index > 0 for _, mid in ids), "batching on: some Sends carry several messages"
    got = _drain(consumer, 500)
    assert [m.data() for m in got] == [f"m{i}".encode() for i in range(500)]
    assert [m.properties()["i"] for m in got] == [str(i) for i in range(500)]
    assert sorted(mid for _, mid in ids) == [m.message_id() for m in got]
    with pytest.raises(ClientError) as e:
        consumer.receive(300)
    assert e.value.status is TopicStatus.TIMEOUT


def test_batch_index_acks_survive_resubscribe(client, ns):
    topic = f"persistent://{ns}/batch-acks"
    client.create_topic(topic)
    producer = client.create_producer(topic, batching_max_publish_delay_ms=1_000)
    for i in range(6):
        producer.send_async(str(i).encode(), None)
    producer.flush()
    consumer = client.subscribe(topic, "s", initial_position=InitialPosition.Earliest, ack_group_time_ms=0)
    got = _drain(consumer, 6, ack=False)
    assert {m.message_id().entry for m in got} == {got[0].message_id().entry}, "one batch"
    for m in got[::2]:
        consumer.acknowledge(m)
    consumer.close()
    again = client.subscribe(topic, "s")
    rest = _drain(again, 3)
    assert [m.data() for m in rest] == [b"1", b"3", b"5"]
    assert all(m.redelivery_count() >= 0 for m in rest)
    with pytest.raises(ClientError):
        again.receive(500)


def test_partitioned_topic_routes_keys_and_merges(client, ns):
    topic = f"persistent://{ns}/parts"
    client.create_topic(topic, partitions=3)
    consumer = client.subscribe(topic, "s", SubscriptionType.Shared, initial_position=InitialPosition.Earliest)
    producer = client.create_producer(topic)
    keys = [f"key-{i}" for i in range(30)]
    for k in keys:
        mid = producer.send(k.encode(), key=k)
        assert mid.partition == murmur3_32(k) % 3
    got = _drain(consumer, 30)
    assert sorted(m.data() for m in got) == sorted(k.encode() for k in keys)
    assert {m.message_id().partition for m in got} == {0, 1, 2}
    assert all(m.topic_name() == f"{topic}-partition-{m.message_id().partition}" for m in got)


def test_exclusive_busy_and_cumulative_rules(client, ns):
    topic = f"persistent://{ns}/rules"
    client.create_topic(topic)
    producer = client.create_producer(topic)
    for i in range(3):
        producer.send(str(i).encode())
    ex = client.subscribe(topic, "ex", initial_position=InitialPosition.Earliest)
    with pytest.raises(ClientError) as e:
        client.subscribe(topic, "ex")
    assert e.value.status is TopicStatus.CONSUMER_BUSY and e.value.from_broker
    msgs = _drain(ex, 3, ack=False)
    ex.acknowledge_cumulative(msgs[1])
    shared = client.subscribe(topic, "sh", SubscriptionType.Shared, initial_position=InitialPosition.Earliest)
    m = shared.receive(RECEIVE_MS)
    with pytest.raises(ClientError) as e:
        shared.acknowledge_cumulative(m)
    assert e.value.status is TopicStatus.NOT_ALLOWED and "cumulative" in e.value.message
    ex.close()
    again = client.subscribe(topic, "ex")
    assert again.receive(RECEIVE_MS).data() == b"2"  # 0 and 1 were acknowledged cumulatively


def test_negative_ack_redelivers_with_a_count(client, ns):
    topic = f"persistent://{ns}/nack"
    client.create_topic(topic)
    consumer = client.subscribe(topic, "s", SubscriptionType.Shared, initial_position=InitialPosition.Earliest,
                                negative_ack_redelivery_delay_ms=100)
    client.create_producer(topic).send(b"retry-me")
    m = consumer.receive(RECEIVE_MS)
    assert m.redelivery_count() == 0
    consumer.negative_acknowledge(m)
    again = consumer.receive(RECEIVE_MS)
    assert (again.data(), again.message_id(), again.redelivery_count()) == (b"retry-me", m.message_id(), 1)
    consumer.acknowledge(again)


def test_seek_by_id_and_time(client, ns):
    topic = f"persistent://{ns}/seek"
    client.create_topic(topic)
    producer = client.create_producer(topic)
    ids = [producer.send(str(i).encode()) for i in range(5)]
    consumer = client.subscribe(topic, "s", initial_position=InitialPosition.Earliest)
    first = _drain(consumer, 5)
    consumer.seek(ids[2])
    assert consumer.receive(RECEIVE_MS).data() == b"2"
    consumer.seek(first[0].publish_timestamp())
    assert consumer.receive(RECEIVE_MS).data() == b"0"


def test_dedup_with_a_stable_producer_name(client, ns):
    tenant = ns.split("/")[0]
    client.create_namespace(f"{tenant}/dedup", retention_ms=-1, dedup=True)
    topic = f"persistent://{tenant}/dedup/t"
    client.create_topic(topic)
    with client.create_producer(topic, producer_name="stable") as p:
        for i in range(3):
            p.send(str(i).encode())
    with client.create_producer(topic, producer_name="stable") as p:
        assert p.last_sequence_id() == 2
        assert p.send(b"next").entry >= 0  # sequence id 3
    with client.create_producer(topic, producer_name="stable", initial_sequence_id=0) as p:
        assert p.send(b"old").ledger == -1  # sequence id 0 was persisted: dedup drops it


def test_bad_input_is_refused_clearly(client, ns):
    topic = f"persistent://{ns}/bad"
    client.create_topic(topic)
    with pytest.raises(ClientError) as e:
        client.create_producer(f"persistent://{ns}/missing")
    assert e.value.status is TopicStatus.TOPIC_NOT_FOUND and "missing" in e.value.message
    with pytest.raises(ClientError) as e:
        client.subscribe("persistent://nobody/nothing/x", "s")
    assert e.value.status in (TopicStatus.NAMESPACE_NOT_FOUND, TopicStatus.TENANT_NOT_FOUND,
                              TopicStatus.TOPIC_NOT_FOUND)
    consumer = client.subscribe(topic, "s")
    with pytest.raises(ClientError) as e:
        consumer.acknowledge(MessageId(999_999, 0, -1, -1))
    assert e.value.status is TopicStatus.INVALID_ACK and e.value.from_broker
    producer = client.create_producer(topic, max_message_bytes=10 * MESSAGE_BYTES_MAX)
    with pytest.raises(ClientError) as e:
        producer.send(b"x" * (2 * MESSAGE_BYTES_MAX))
    assert e.value.status is TopicStatus.MESSAGE_TOO_LARGE and e.value.from_broker
    assert producer.send(b"small").entry >= 0  # the producer goes on
    assert consumer.receive(RECEIVE_MS).data() == b"small"


def test_too_many_pending_is_refused_and_nothing_accepted_is_lost(client, ns):
    topic = f"persistent://{ns}/pending"
    client.create_topic(topic)
    consumer = client.subscribe(topic, "s", initial_position=InitialPosition.Earliest)
    producer = client.create_producer(topic, max_pending_messages=5, batching_max_publish_delay_ms=50)
    accepted, refused = [], []
    for i in range(200):  # far faster than receipts come back: the bound is reached
        try:
            producer.send_async(str(i).encode(), None)
            accepted.append(str(i).encode())
        except ClientError as e:
            refused.append(e)
    producer.flush()
    assert refused and all(e.status is TopicStatus.TOO_MANY_REQUESTS and "max_pending_messages=5" in e.message
                           for e in refused)
    assert [m.data() for m in _drain(consumer, len(accepted))] == accepted
    with pytest.raises(ClientError):
        consumer.receive(300)
