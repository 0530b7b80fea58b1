"""The producer against the fake Topics service: batching, sequence ids, routing, receipts, bounds, redirects
and re-sends."""
from __future__ import annotations

import threading
import time

import pytest

from bksim.client import ClientError, MessageId, RoutingMode
from bksim.formats.murmur3 import murmur3_32
from bksim.model.status import TopicStatus
from helpers import wait_until
from tests.unit.client.conftest import TOPIC
from fakes.topic_brokers import LEDGER


def test_send_returns_message_id_and_persists_every_field(fake, client):
    fake.add_topic(TOPIC)
    with client.create_producer(TOPIC, producer_name="p1") as producer:
        mid = producer.send(b"hello", key="k1", properties={"a": "1"}, event_time_ms=42)
        assert mid == MessageId(LEDGER, 0, -1, -1)  # a Send of one message is not a batch
        assert producer.producer_name() == "p1"
    [m] = fake.published(TOPIC)
    assert (m.payload, m.key, m.properties, m.event_time_ms, m.sequence_id) == (b"hello", "k1", {"a": "1"}, 42, 0)


def test_send_async_batches_into_one_send_with_increasing_sequence_ids(fake, client):
    fake.add_topic(TOPIC)
    producer = client.create_producer(TOPIC, batching_max_publish_delay_ms=10_000, batching_max_messages=5)
    got = {}
    done = threading.Event()

    def cb(i):
        def callback(error, mid):
            got[i] = (error, mid)
            if len(got) == 5:
                done.set()
        return callback

    for i in range(5):
        producer.send_async(f"m{i}".encode(), cb(i))
    assert done.wait(5), got
    assert [got[i] for i in range(5)] == [(None, MessageId(LEDGER, 0, -1, i)) for i in range(5)]
    assert fake.sends == [(fake.addresses[0], TOPIC, [0, 1, 2, 3, 4])]
    assert len(fake.entries(TOPIC)) == 1


def test_publish_delay_seals_a_partial_batch(fake, client):
    fake.add_topic(TOPIC)
    producer = client.create_producer(TOPIC, batching_max_publish_delay_ms=20)
    results = []
    for i in range(3):
        producer.send_async(b"x", lambda e, mid: results.append((e, mid)))
    wait_until(lambda: len(results) == 3, 5, message="3 receipts after the publish delay")
    assert [mid for _, mid in results] == [MessageId(LEDGER, 0, -1, i) for i in range(3)]


def test_batch_holds_one_key(fake, client):
    fake.add_topic(TOPIC)
    producer = client.create_producer(TOPIC, batching_max_publish_delay_ms=10_000)
    for key in ["a", "a", "b", "a", None, None]:
        producer.send_async(b"v", None, key=key)
    producer.flush()
    assert [seqs for _, _, seqs in fake.sends] == [[0, 1], [2], [3], [4, 5]]
    keys = [[m.key for m in batch] for batch in _batches(fake, TOPIC)]
    assert keys == [["a", "a"], ["b"], ["a"], [None, None]]


def test_batching_max_bytes_splits_batches(fake, client):
    fake.add_topic(TOPIC)
    producer = client.create_producer(TOPIC, batching_max_publish_delay_ms=10_000, batching_max_bytes=1_000)
    for _ in range(10):
        producer.send_async(b"x" * 300, None)
    producer.flush()
    sizes = [len(seqs) for _, _, seqs in fake.sends]
    assert sum(sizes) == 10 and max(sizes) <= 3 and len(sizes) >= 4, sizes


def test_batching_disabled_sends_each_message_alone(fake, client):
    fake.add_topic(TOPIC)
    producer = client.create_producer(TOPIC, batching_enabled=False)
    ids = []
    for _ in range(3):
        producer.send_async(b"x", lambda e, mid: ids.append(mid))
    producer.flush()
    assert [seqs for _, _, seqs in fake.sends] == [[0], [1], [2]]
    assert sorted(ids) == [MessageId(LEDGER, i, -1, -1) for i in range(3)]


def test_oversize_message_is_refused_before_sending(fake, client):
    fake.add_topic(TOPIC)
    producer = client.create_producer(TOPIC, max_message_bytes=1_000)
    with pytest.raises(ClientError) as e:
        producer.send(b"x" * 2_000)
    assert e.value.status is TopicStatus.MESSAGE_TOO_LARGE and "max_message_bytes 1000" in e.value.message
    assert fake.sends == []


def test_queue_full_raises_or_blocks(fake, client):
    fake.add_topic(TOPIC)
    fake.hold_receipts = True
    producer = client.create_producer(TOPIC, max_pending_messages=3, send_timeout_ms=300)
    for _ in range(3):
        producer.send_async(b"x", None)
    with pytest.raises(ClientError) as e:
        producer.send_async(b"x", None)
    assert e.value.status is TopicStatus.TOO_MANY_REQUESTS and "max_pending_messages=3" in e.value.message
    blocking = client.create_producer(TOPIC, max_pending_messages=1, block_if_queue_full=True, send_timeout_ms=300)
    first = []
    blocking.send_async(b"x", lambda e, mid: first.append(e))
    blocking.send_async(b"y", None)  # waits for room: the first message's send timeout makes it
    assert len(first) == 1 and first[0].status is TopicStatus.TIMEOUT
    assert blocking.pending_messages() == 1


def test_send_timeout_fails_the_message(fake, client):
    fake.add_topic(TOPIC)
    fake.hold_receipts = True
    producer = client.create_producer(TOPIC, send_timeout_ms=200)
    with pytest.raises(ClientError) as e:
        producer.send(b"x")
    assert e.value.status is TopicStatus.TIMEOUT and "send_timeout_ms=200" in e.value.message
    assert producer.pending_messages() == 0


def test_sequence_ids_continue_after_the_brokers_last_one(fake, client):
    fake.add_topic(TOPIC, dedup=True)
    with client.create_producer(TOPIC, producer_name="stable") as p:
        for _ in range(3):
            p.send(b"x")
    with client.create_producer(TOPIC, producer_name="stable") as p:
        assert p.last_sequence_id() == 2
        p.send(b"y")
    assert [m.sequence_id for m in fake.published(TOPIC)] == [0, 1, 2, 3]


def test_initial_sequence_id_holds_when_the_first_open_was_refused_and_retried(fake, client):
    fake.add_topic(TOPIC)
    fake.fail_produce_opens.append("SERVICE_UNAVAILABLE")  # retriable: the producer opens again
    with client.create_producer(TOPIC, initial_sequence_id=100) as p:
        p.send(b"x")
    assert fake.fail_produce_opens == []
    assert [m.sequence_id for m in fake.published(TOPIC)] == [100]


def test_explicit_sequence_ids_must_increase(fake, client):
    fake.add_topic(TOPIC)
    p = client.create_producer(TOPIC)
    p.send(b"a", sequence_id=10)
    p.send(b"b")
    with pytest.raises(ClientError) as e:
        p.send(b"c", sequence_id=5)
    assert e.value.status is TopicStatus.BAD_REQUEST
    assert [m.sequence_id for m in fake.published(TOPIC)] == [10, 11]


def test_unknown_topic_is_a_clear_error(fake, client):
    fake.add_topic(TOPIC)
    with pytest.raises(ClientError) as e:
        client.create_producer("persistent://t/ns/nope")
    assert e.value.status is TopicStatus.TOPIC_NOT_FOUND and "nope" in e.value.message


def test_not_owner_redirects_to_the_owner(fake, client):
    fake.add_topic(TOPIC)
    producer = client.create_producer(TOPIC)
    producer.send(b"one")
    fake.owner[TOPIC] = fake.addresses[1]
    fake.fail_sends.append(("NOT_OWNER", fake.addresses[1]))
    mid = producer.send(b"two")
    assert mid.entry == 1
    assert [(b, seqs) for b, _, seqs in fake.sends] == [(fake.addresses[0], [0]), (fake.addresses[0], [1]),
                                                         (fake.addresses[1], [1])]
    assert [m.payload for m in fake.published(TOPIC)] == [b"one", b"two"]


def test_unreceipted_sends_go_again_in_order_with_the_same_sequence_ids(fake, client):
    fake.add_topic(TOPIC)
    producer = client.create_producer(TOPIC, batching_max_messages=2, batching_max_publish_delay_ms=10_000)
    fake.fail_sends.append(("TOPIC_FENCED", ""))
    ids = []
    for i in range(6):
        producer.send_async(str(i).encode(), lambda e, mid: ids.append((e, mid)))
    producer.flush()
    assert all(e is None for e, _ in ids), ids
    first_fail = fake.sends[0][2]
    assert first_fail == [0, 1]
    resent = [seqs for _, _, seqs in fake.sends[1:]]
    assert resent[0] == [0, 1] and sorted(s for b in resent for s in b) == list(range(6))
    assert [m.payload for m in fake.published(TOPIC)] == [str(i).encode() for i in range(6)]


def test_a_refused_send_fails_only_its_batch(fake, client):
    fake.add_topic(TOPIC)
    producer = client.create_producer(TOPIC)
    fake.fail_sends.append(("MESSAGE_TOO_LARGE", ""))
    with pytest.raises(ClientError) as e:
        producer.send(b"big")
    assert e.value.status is TopicStatus.MESSAGE_TOO_LARGE and e.value.from_broker
    assert producer.send(b"fine").entry == 0


def test_a_fatal_refusal_fails_the_producer(fake, client):
    fake.add_topic(TOPIC)
    producer = client.create_producer(TOPIC)
    fake.fail_sends.append(("TOPIC_NOT_FOUND", ""))
    with pytest.raises(ClientError) as e:
        producer.send(b"x")
    assert e.value.status is TopicStatus.TOPIC_NOT_FOUND
    with pytest.raises(ClientError) as e2:
        producer.send(b"y")
    assert e2.value.status is TopicStatus.TOPIC_NOT_FOUND


def test_giving_up_reconnecting_is_bounded(fake):
    from bksim.client import Client

    fake.add_topic(TOPIC)
    with Client(fake.addresses[0], operation_timeout_ms=500, backoff_initial_ms=20, backoff_max_ms=50) as c:
        producer = c.create_producer(TOPIC)
        fake.owner[TOPIC] = "127.0.0.1:1"  # nobody listens there
        fake.fail_sends.append(("NOT_OWNER", ""))
        with pytest.raises(ClientError) as e:
            producer.send(b"x")
        assert e.value.status is TopicStatus.SERVICE_UNAVAILABLE and "gave up connecting" in e.value.message


def test_partitioned_routing_by_key_round_robin_and_single(fake, client):
    fake.add_topic(TOPIC, partitions=3)
    p = client.create_producer(TOPIC, batching_max_publish_delay_ms=10_000)
    assert p.partitions == 3
    for key in ("alpha", "beta", "gamma", "delta"):
        mid = p.send(b"k", key=key)
        assert mid.partition == murmur3_32(key) % 3
    rr = client.create_producer(TOPIC)
    parts = [rr.send(b"r").partition for _ in range(6)]
    assert sorted(parts) == [0, 0, 1, 1, 2, 2]  # each send() seals its batch: the next goes to the next partition
    single = client.create_producer(TOPIC, routing_mode=RoutingMode.SinglePartition)
    assert len({single.send(b"s").partition for _ in range(5)}) == 1


def _batches(fake, topic):
    from bksim.formats.message import decode_entry
    return [decode_entry(e)[1] for e in fake.entries(topic)]


def test_a_send_callback_never_blocks_the_clients_thread(fake, client):
    fake.add_topic(TOPIC)
    producer = client.create_producer(TOPIC, max_pending_messages=1, block_if_queue_full=True)
    seen = []

    def callback(error, mid):
        producer.send_async(b"from-callback-1", None)  # room: the receipt released it
        try:
            producer.send_async(b"from-callback-2", None)  # full: waiting here would stop the receipts
        except ClientError as e:
            seen.append(e)

    producer.send_async(b"first", callback)
    wait_until(lambda: seen, 5, message="the callback's second send refused")
    assert seen[0].status is TopicStatus.TOO_MANY_REQUESTS and "in a client callback" in seen[0].message
    producer.flush()
    assert [m.payload for m in fake.published(TOPIC)] == [b"first", b"from-callback-1"]


def test_a_delayed_message_is_never_batched_and_carries_its_time(fake, client):
    fake.add_topic(TOPIC)
    producer = client.create_producer(TOPIC, batching_max_publish_delay_ms=10_000)
    producer.send_async(b"a", None)
    producer.send_async(b"late", None, deliver_at_ms=1_900_000_000_000)
    producer.send_async(b"b", None)
    producer.send_async(b"c", None, deliver_after_ms=60_000)
    producer.flush()
    assert [seqs for _, _, seqs in fake.sends] == [[0], [1], [2], [3]]
    times = [[m.deliver_at_ms for m in batch] for batch in _batches(fake, TOPIC)]
    assert times[0] == [0] and times[1] == [1_900_000_000_000] and times[2] == [0]
    assert abs(times[3][0] - (time.time() * 1000 + 60_000)) < 10_000
    for bad in ({"deliver_at_ms": 1, "deliver_after_ms": 1}, {"deliver_at_ms": -1}, {"deliver_after_ms": "5"}):
        with pytest.raises(ClientError) as info:
            producer.send(b"x", **bad)
        assert info.value.status == TopicStatus.BAD_REQUEST
