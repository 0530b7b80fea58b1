"""The consumer against the fake Topics service: decoding, permits, acks (batch index, cumulative, unknown
ids), negative acks, ack timeout, seek, reconnects and partitioned topics."""
from __future__ import annotations

import pytest

from bksim.client import ClientError, InitialPosition, MessageId, SubscriptionType
from bksim.formats.message import Message as Stored
from bksim.model.status import TopicStatus
from helpers import wait_until
from tests.unit.client.conftest import TOPIC
from fakes.topic_brokers import LEDGER


def _sub(client, **kw):
    kw.setdefault("initial_position", InitialPosition.Earliest)
    return client.subscribe(TOPIC, "s", kw.pop("subscription_type", SubscriptionType.Exclusive), **kw)


def test_receive_decodes_every_field_and_batches(fake, client):
    fake.add_topic(TOPIC)
    fake.publish(TOPIC, [Stored(b"single", "k", {"p": "v"}, 5, 0)], producer="prod")
    fake.publish(TOPIC, [Stored(b"b0", None, {}, 0, 1), Stored(b"b1", "kk", {}, 0, 2)])
    consumer = _sub(client)
    m = consumer.receive(2000)
    assert (m.data(), m.key(), m.properties(), m.event_timestamp(), m.publish_timestamp(), m.topic_name(),
            m.message_id(), m.redelivery_count(), m.producer_name()) == \
        (b"single", "k", {"p": "v"}, 5, 1000, TOPIC, MessageId(LEDGER, 0, -1, -1), 0, "prod")
    b0, b1 = consumer.receive(2000), consumer.receive(2000)
    assert [b0.message_id(), b1.message_id()] == [MessageId(LEDGER, 1, -1, 0), MessageId(LEDGER, 1, -1, 1)]
    assert (b0.data(), b0.key(), b1.data(), b1.key(), b1.batch_size()) == (b"b0", None, b"b1", "kk", 2)


def test_latest_position_skips_what_was_there(fake, client):
    fake.add_topic(TOPIC)
    fake.publish(TOPIC, [Stored(b"old")])
    consumer = client.subscribe(TOPIC, "s")  # Latest by default
    fake.publish(TOPIC, [Stored(b"new")])
    assert consumer.receive(2000).data() == b"new"


def test_receive_timeout_is_a_clear_error(fake, client):
    fake.add_topic(TOPIC)
    consumer = _sub(client)
    with pytest.raises(ClientError) as e:
        consumer.receive(50)
    assert e.value.status is TopicStatus.TIMEOUT and "within 50 ms" in e.value.message


def test_permits_granted_then_refilled_at_half_the_queue(fake, client):
    fake.add_topic(TOPIC)
    for i in range(10):
        fake.publish(TOPIC, [Stored(str(i).encode())])
    consumer = _sub(client, receiver_queue_size=4)
    wait_until(lambda: consumer.queued() == 4, 5, message="4 messages queued (the permits)")
    assert fake.flows == [4]
    got = [consumer.receive(2000).data() for _ in range(2)]
    wait_until(lambda: fake.flows == [4, 2], 5, message="a refill of 2 after receiving half the queue")
    got += [consumer.receive(2000).data() for _ in range(8)]
    assert got == [str(i).encode() for i in range(10)]


def test_batch_index_acks_and_acked_indexes_skipped_on_redelivery(fake, client):
    fake.add_topic(TOPIC)
    fake.publish(TOPIC, [Stored(b"a"), Stored(b"b"), Stored(b"c")])
    consumer = _sub(client, ack_group_time_ms=0)
    a, b, c = (consumer.receive(2000) for _ in range(3))
    consumer.acknowledge(b)
    wait_until(lambda: fake.acks, 5, message="the ack sent")
    assert fake.acks == [(TOPIC, [(1 - 1, 1, 3)], False)]
    consumer.close()
    again = _sub(client)
    got = [again.receive(2000) for _ in range(2)]
    assert [(m.data(), m.message_id().batch_index, m.redelivery_count()) for m in got] == [(b"a", 0, 0), (b"c", 2, 0)]
    with pytest.raises(ClientError):
        again.receive(100)


def test_grouped_acks_go_together(fake, client):
    fake.add_topic(TOPIC)
    for i in range(5):
        fake.publish(TOPIC, [Stored(str(i).encode())])
    consumer = _sub(client, ack_group_time_ms=50)
    for _ in range(5):
        consumer.acknowledge(consumer.receive(2000))
    wait_until(lambda: fake.acks, 5, message="the grouped ack")
    assert fake.acks == [(TOPIC, [(i, -1, 0) for i in range(5)], False)]
    assert consumer.unacked_count() == 0


def test_ack_of_an_unknown_id_gets_the_brokers_error(fake, client):
    fake.add_topic(TOPIC)
    consumer = _sub(client)
    with pytest.raises(ClientError) as e:
        consumer.acknowledge(MessageId(LEDGER, 99, -1, -1))
    assert e.value.status is TopicStatus.INVALID_ACK and "does not exist" in e.value.message and e.value.from_broker


def test_cumulative_ack_refused_on_shared(fake, client):
    fake.add_topic(TOPIC)
    fake.publish(TOPIC, [Stored(b"x")])
    consumer = _sub(client, subscription_type=SubscriptionType.Shared)
    m = consumer.receive(2000)
    with pytest.raises(ClientError) as e:
        consumer.acknowledge_cumulative(m)
    assert e.value.status is TopicStatus.NOT_ALLOWED and "cumulative" in e.value.message


def test_cumulative_ack_on_exclusive(fake, client):
    fake.add_topic(TOPIC)
    for i in range(3):
        fake.publish(TOPIC, [Stored(str(i).encode())])
    consumer = _sub(client)
    msgs = [consumer.receive(2000) for _ in range(3)]
    consumer.acknowledge_cumulative(msgs[1])
    assert fake.acks[-1] == (TOPIC, [(1, -1, 0)], True)
    assert consumer.unacked_count() == 1


def test_negative_ack_redelivers_after_the_delay(fake, client):
    fake.add_topic(TOPIC)
    fake.publish(TOPIC, [Stored(b"x")])
    consumer = _sub(client, negative_ack_redelivery_delay_ms=50)
    m = consumer.receive(2000)
    consumer.negative_acknowledge(m)
    again = consumer.receive(2000)
    assert fake.redelivers == [[0]]
    assert (again.data(), again.message_id(), again.redelivery_count()) == (b"x", m.message_id(), 1)


def test_ack_timeout_redelivers_unacked(fake, client):
    fake.add_topic(TOPIC)
    fake.publish(TOPIC, [Stored(b"x")])
    fake.publish(TOPIC, [Stored(b"y")])
    consumer = _sub(client, ack_timeout_ms=100)
    x, y = consumer.receive(2000), consumer.receive(2000)
    consumer.acknowledge(y)
    again = consumer.receive(2000)
    assert (again.data(), again.redelivery_count()) == (b"x", 1)
    assert fake.redelivers == [[0]]


def test_seek_to_id_and_publish_time(fake, client):
    fake.add_topic(TOPIC)
    for i in range(5):
        fake.publish(TOPIC, [Stored(str(i).encode())])  # publish times 1000 + i
    consumer = _sub(client)
    assert consumer.receive(2000).data() == b"0"
    consumer.seek(MessageId(LEDGER, 3, -1, -1))
    assert consumer.receive(2000).data() == b"3"
    consumer.seek(1_001)
    assert consumer.receive(2000).data() == b"1"


def test_exclusive_busy_is_raised_at_subscribe(fake, client):
    fake.add_topic(TOPIC)
    _sub(client)
    with pytest.raises(ClientError) as e:
        _sub(client)
    assert e.value.status is TopicStatus.CONSUMER_BUSY


def test_a_retriable_refusal_at_subscribe_is_retried_and_giving_up_is_bounded(fake):
    from bksim.client import Client

    fake.add_topic(TOPIC)
    fake.publish(TOPIC, [Stored(b"a")])
    with Client(fake.addresses, operation_timeout_ms=500, backoff_initial_ms=20, backoff_max_ms=50) as c:
        fake.fail_subscribe.append("SERVICE_UNAVAILABLE")
        assert _sub(c).receive(2000).data() == b"a"
        fake.fail_subscribe.extend(["SERVICE_UNAVAILABLE"] * 1000)
        with pytest.raises(ClientError) as e:
            c.subscribe(TOPIC, "other", SubscriptionType.Exclusive)
    assert e.value.status is TopicStatus.SERVICE_UNAVAILABLE and e.value.from_broker
    assert f"consumer of {TOPIC} (subscription other): gave up connecting after" in e.value.message


def test_reconnect_resubscribes_and_regrants_permits(fake, client):
    fake.add_topic(TOPIC)
    fake.publish(TOPIC, [Stored(b"a")])
    consumer = _sub(client, receiver_queue_size=10)
    a = consumer.receive(2000)
    fake.owner[TOPIC] = fake.addresses[1]
    assert fake.kick(TOPIC, "NOT_OWNER", fake.addresses[1]) == 1
    # Flow(10) at subscribe; Flow(1) when receive() emptied the queue (unless the kick beat it); Flow(10) again
    wait_until(lambda: fake.flows in ([10, 10], [10, 1, 10]), 5,
               message=f"permits granted again on the new stream, flows {fake.flows}")
    fake.publish(TOPIC, [Stored(b"b")])
    got = consumer.receive(2000)
    # a was received but not acked: at-least-once, it may come again; b must come
    seen = [got.data()] + ([consumer.receive(2000).data()] if got.data() == b"a" else [])
    assert seen[-1] == b"b"
    consumer.acknowledge(a)


def test_a_stream_broken_by_the_transport_with_internal_is_resubscribed(fake, client):
    # grpc.aio ends a stream with INTERNAL "Internal error from Core" when the broker dies under a write: the
    # consumer must subscribe again (INTERNAL from the transport is not the broker's own refusal: it does not stop)
    fake.add_topic(TOPIC)
    fake.publish(TOPIC, [Stored(b"a")])
    consumer = _sub(client, receiver_queue_size=10)
    consumer.acknowledge(consumer.receive(2000))
    assert fake.break_streams(TOPIC) == 1
    wait_until(lambda: len(fake.flows) >= 2 and fake.flows[-1] == 10, 5,
               message=f"subscribed again after the transport failed, flows {fake.flows}")
    fake.publish(TOPIC, [Stored(b"b")])
    got = consumer.receive(5000)  # a, if its ack had not reached the broker before the stream broke, then b
    assert (consumer.receive(5000) if got.data() == b"a" else got).data() == b"b"


def test_partitioned_consumer_merges_partitions(fake, client):
    fake.add_topic(TOPIC, partitions=2)
    fake.publish(f"{TOPIC}-partition-0", [Stored(b"p0")])
    fake.publish(f"{TOPIC}-partition-1", [Stored(b"p1")])
    consumer = _sub(client, subscription_type=SubscriptionType.Shared)
    got = sorted((m.data(), m.message_id().partition, m.topic_name()) for m in (consumer.receive(2000),
                                                                                 consumer.receive(2000)))
    assert got == [(b"p0", 0, f"{TOPIC}-partition-0"), (b"p1", 1, f"{TOPIC}-partition-1")]


def test_end_to_end_with_the_producer(fake, client):
    fake.add_topic(TOPIC)
    consumer = _sub(client)
    producer = client.create_producer(TOPIC, batching_max_publish_delay_ms=5)
    for i in range(50):
        producer.send_async(str(i).encode(), None, key="k")
    producer.flush()
    got = []
    for _ in range(50):
        m = consumer.receive(2000)
        got.append(m.data())
        consumer.acknowledge(m)
    assert got == [str(i).encode() for i in range(50)]


def test_seek_grants_again_the_dropped_and_the_received_permits(fake, client):
    fake.add_topic(TOPIC)
    for i in range(20):
        fake.publish(TOPIC, [Stored(str(i).encode())])
    consumer = _sub(client, receiver_queue_size=10)
    got = [consumer.receive(2000).data() for _ in range(3)]  # 3 received: below the refill threshold (5)
    wait_until(lambda: consumer.queued() >= 7, 5, message="the rest of the permits queued")
    consumer.seek(MessageId(LEDGER, 0, -1, -1))
    # the dropped and the received messages' permits are granted again (the whole queue's worth over all Flows:
    # the queue may also have been granted back when receive() found it empty); without them the 20 below stall
    wait_until(lambda: sum(fake.flows) >= 20, 5, message=f"permits granted again after the seek, flows {fake.flows}")
    got = [consumer.receive(2000).data() for _ in range(20)]
    assert got == [str(i).encode() for i in range(20)]


def test_grouped_acks_of_one_batch_travel_as_one_id_per_entry(fake, client):
    fake.add_topic(TOPIC)
    fake.publish(TOPIC, [Stored(str(i).encode()) for i in range(5)])
    fake.publish(TOPIC, [Stored(b"single")])
    consumer = _sub(client, ack_group_time_ms=50)
    got = [consumer.receive(2000) for _ in range(6)]
    for m in [got[4], got[0], got[5], got[2]]:
        consumer.acknowledge(m)
    wait_until(lambda: fake.acks, 5, message="the grouped ack")
    assert fake.acks == [(TOPIC, [(0, (4, 0, 2), 5), (1, -1, 0)], False)]
    for m in [got[1], got[3]]:
        consumer.acknowledge(m)
    wait_until(lambda: len(fake.acks) == 2, 5, message="the second grouped ack")
    assert fake.acks[1] == (TOPIC, [(0, (1, 3), 5)], False)
    consumer.close()
    again = _sub(client)
    with pytest.raises(ClientError) as e:
        again.receive(100)
    assert e.value.status is TopicStatus.TIMEOUT  # every message of the batch was acked through the two ack sets
