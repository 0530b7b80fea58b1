"""Delayed delivery, dead-letter and retry topics through bksim.client on real brokers: a delayed message
reaches a Shared consumer not before its time and soon after it (an Exclusive subscription of the same topic
gets it at once), and still does after kill -9 of the owning broker (the new owner rebuilds its tracker from
the log); a message negatively acknowledged past max_redeliver_count lands in the dead-letter topic with its
payload, key and properties and the original topic and id; reconsume_later brings a message back through the
retry topic after its delay. Times are compared on this machine's wall clock, which the brokers share."""
from __future__ import annotations

import contextlib
import io
import time
import uuid

import pytest

from bksim.client import Client, ClientError, DeadLetterPolicy, InitialPosition, SubscriptionType
from helpers import wait_until
from integration.bookie_harness import SESSION_TIMEOUT_MS

BOOKIES = 3
LATE_MS = 3_000      # a delayed message arrives at most this long after its time (dispatch + poll, loaded machine)
CLOCK_SLACK_MS = 2   # delivery times are whole ms: the receive stamp may round below the time by this


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
    tenant = f"d{uuid.uuid4().hex[:8]}"
    client.create_tenant(tenant)
    client.create_namespace(f"{tenant}/ns", retention_ms=-1)
    name = f"persistent://{tenant}/ns/t"
    client.create_topic(name)
    return name


def now_ms() -> int:
    return int(time.time() * 1000)


def receive_until(consumer, deadline_s: float):
    """The next message with its receive time (ms since the epoch), or None by the deadline."""
    while time.monotonic() < deadline_s:
        try:
            m = consumer.receive(100)
        except ClientError as e:
            assert e.status == "TIMEOUT", e
            continue
        return m, now_ms()
    return None


def delayed_count(client, topic, sub) -> int:
    try:
        return client.topic_stats(topic)["subscriptions"][sub]["msgDelayed"]
    except (ClientError, KeyError):
        return -1


def test_a_delayed_message_on_shared_comes_on_time_and_exclusive_ignores_the_delay(client, topic):
    shared = client.subscribe(topic, "sh", SubscriptionType.Shared, initial_position=InitialPosition.Earliest)
    exclusive = client.subscribe(topic, "ex", SubscriptionType.Exclusive, initial_position=InitialPosition.Earliest)
    producer = client.create_producer(topic)   # batching on: the delayed message still goes alone
    at = now_ms() + 2_000
    producer.send_async(b"later", None, key="k", properties={"a": "1"}, deliver_at_ms=at)
    producer.send_async(b"now", None)
    producer.flush()
    got = receive_until(exclusive, time.monotonic() + 10)
    assert got is not None and got[0].data() == b"later" and got[1] < at, "Exclusive delivers at once"
    first = receive_until(shared, time.monotonic() + 10)
    assert first is not None and first[0].data() == b"now" and first[1] < at
    wait_until(lambda: delayed_count(client, topic, "sh") == 1, 10, message="msgDelayed 1 on the Shared subscription")
    second = receive_until(shared, time.monotonic() + (at - now_ms() + LATE_MS) / 1000)
    assert second is not None, "the delayed message never came"
    m, received = second
    assert m.data() == b"later" and m.key() == "k" and m.properties() == {"a": "1"}
    assert at - CLOCK_SLACK_MS <= received <= at + LATE_MS, (received - at)
    shared.acknowledge(m)
    assert delayed_count(client, topic, "sh") == 0


def test_a_held_delayed_message_survives_kill9_of_the_owner(brokers, client, topic):
    shared = client.subscribe(topic, "sh", SubscriptionType.Shared, initial_position=InitialPosition.Earliest)
    producer = client.create_producer(topic, batching_enabled=False)
    failover_s = SESSION_TIMEOUT_MS / 1000 + 8
    at = now_ms() + int(failover_s * 1000) + 4_000   # still held when the new owner has taken over
    producer.send(b"held", deliver_at_ms=at)
    producer.send(b"plain")
    got = receive_until(shared, time.monotonic() + 10)
    assert got is not None and got[0].data() == b"plain"
    shared.acknowledge(got[0])
    wait_until(lambda: delayed_count(client, topic, "sh") == 1, 10, message="msgDelayed 1 before the kill")
    owner_id = client.lookup(topic)["broker_id"]
    owner = next(b for b in brokers.brokers if b.broker_id == owner_id)
    owner.kill9()
    try:
        wait_until(lambda: (client.lookup(topic)["broker_id"] != owner_id
                            and delayed_count(client, topic, "sh") == 1), failover_s + 10, interval_s=0.2,
                   message="the new owner holds the delayed message again")
        assert now_ms() < at, "the takeover took longer than the test allows"
        deadline = time.monotonic() + (at - now_ms() + LATE_MS) / 1000
        while (got := receive_until(shared, deadline)) is not None and got[0].data() == b"plain":
            shared.acknowledge(got[0])   # its ack may not have been persisted before the kill: at-least-once
        assert got is not None, "the delayed message was lost in the failover"
        m, received = got
        assert m.data() == b"held" and at - CLOCK_SLACK_MS <= received <= at + LATE_MS, (received - at)
        shared.acknowledge(m)
    finally:
        owner.spawn()
        owner.wait_registered(brokers.zk, timeout_s=3 * SESSION_TIMEOUT_MS / 1000 + 20)


def test_a_message_nacked_past_max_redeliver_count_lands_in_the_dlq(client, topic):
    policy = DeadLetterPolicy(max_redeliver_count=2)
    consumer = client.subscribe(topic, "work", SubscriptionType.Shared, initial_position=InitialPosition.Earliest,
                                negative_ack_redelivery_delay_ms=50, dead_letter_policy=policy)
    dlq = client.subscribe(f"{topic}-work-DLQ", "ops", SubscriptionType.Shared,
                           initial_position=InitialPosition.Earliest)
    producer = client.create_producer(topic, batching_enabled=False)
    sent = producer.send(b"poison", key="k7", properties={"order": "42"})
    producer.send(b"fine")
    counts = []
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and (got := receive_until(consumer, deadline)) is not None:
        m = got[0]
        if m.data() == b"fine":
            consumer.acknowledge(m)
            continue
        counts.append(m.redelivery_count())
        consumer.negative_acknowledge(m)
        if m.redelivery_count() >= policy.max_redeliver_count:
            break
    assert counts == [0, 1, 2], counts             # seen max_redeliver_count + 1 times, then dead-lettered
    got = receive_until(dlq, time.monotonic() + 10)
    assert got is not None, "nothing in the dead-letter topic"
    m = got[0]
    assert m.data() == b"poison" and m.key() == "k7"
    assert m.properties() == {"order": "42", "REAL_TOPIC": topic, "ORIGIN_MESSAGE_ID": str(sent)}
    dlq.acknowledge(m)
    wait_until(lambda: client.topic_stats(topic)["subscriptions"]["work"]["msgBacklog"] == 0, 10,
               message="the dead-lettered message is acknowledged on the original topic")
    assert receive_until(consumer, time.monotonic() + 0.5) is None


def test_reconsume_later_brings_a_message_back_after_its_delay_through_the_retry_topic(client, topic):
    consumer = client.subscribe(topic, "work", SubscriptionType.Shared, initial_position=InitialPosition.Earliest,
                                dead_letter_policy=DeadLetterPolicy(max_redeliver_count=1), retry_enable=True)
    producer = client.create_producer(topic, batching_enabled=False)
    sent = producer.send(b"job", key="j", properties={"attempt": "x"})
    first = receive_until(consumer, time.monotonic() + 10)
    assert first is not None and first[0].data() == b"job" and first[0].topic_name() == topic
    later = now_ms() + 1_500
    consumer.reconsume_later(first[0], 1_500)
    again = receive_until(consumer, time.monotonic() + 1.5 + LATE_MS / 1000)
    assert again is not None, "the retried message never came back"
    m, received = again
    assert m.data() == b"job" and m.key() == "j" and m.topic_name() == f"{topic}-work-RETRY"
    assert later - CLOCK_SLACK_MS <= received <= later + LATE_MS, received - later
    props = m.properties()
    assert props["RECONSUMETIMES"] == "1" and props["DELAY_TIME"] == "1500" and props["attempt"] == "x"
    assert props["REAL_TOPIC"] == topic and props["ORIGIN_MESSAGE_ID"] == str(sent)
    wait_until(lambda: client.topic_stats(topic)["subscriptions"]["work"]["msgBacklog"] == 0, 10,
               message="the original is acknowledged")
    dlq = client.subscribe(f"{topic}-work-DLQ", "ops", SubscriptionType.Shared,
                           initial_position=InitialPosition.Earliest)
    consumer.reconsume_later(m, 100)               # a second retry exceeds max_redeliver_count 1: dead letter
    got = receive_until(dlq, time.monotonic() + 10)
    assert got is not None and got[0].data() == b"job" and got[0].properties()["REAL_TOPIC"] == topic
    assert receive_until(consumer, time.monotonic() + 0.5) is None


def test_bksim_produce_deliver_after(brokers, client, topic):
    from bksim.cli.main import main
    shared = client.subscribe(topic, "cli", SubscriptionType.Shared, initial_position=InitialPosition.Earliest)
    out, err = io.StringIO(), io.StringIO()
    sent = now_ms()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["produce", "--broker", ",".join(b.address for b in brokers.brokers), topic, "-m", "a,b",
                     "--deliver-after", "1500"])
    assert code == 0, err.getvalue()
    got = [receive_until(shared, time.monotonic() + 1.5 + LATE_MS / 1000) for _ in range(2)]
    assert all(g is not None for g in got), got
    assert sorted(m.data() for m, _ in got) == [b"a", b"b"]
    assert all(received >= sent + 1_500 - CLOCK_SLACK_MS for _, received in got), [r - sent for _, r in got]
