"""Subscription types through bksim.client on real brokers: what a client sees of Shared (spread, a departed
consumer's unacked messages go to the others), Failover (one active consumer by priority, the next takes over
with what was unacked), and Key_Shared (a key stays on one consumer and keeps its order while consumers join
and leave)."""
from __future__ import annotations

import uuid

import pytest

from bksim.client import Client, ClientError, InitialPosition, SubscriptionType
from helpers import wait_until

BOOKIES = 3
POLL_MS = 20


@pytest.fixture(scope="module")
def brokers(broker_cluster):
    broker_cluster.settle(BOOKIES)
    if not broker_cluster.brokers:
        broker_cluster.start_brokers(2, env={"BKSIM_TOPIC_FAILOVER_SWITCH_DELAY_MS": "200"})
    return broker_cluster


@pytest.fixture
def client(brokers):
    with Client([b.address for b in brokers.brokers], operation_timeout_ms=20_000) as c:
        yield c


@pytest.fixture
def topic(client):
    tenant = f"s{uuid.uuid4().hex[:8]}"
    client.create_tenant(tenant)
    client.create_namespace(f"{tenant}/ns", retention_ms=-1)
    name = f"persistent://{tenant}/ns/t"
    client.create_topic(name)
    return name


def poll(consumers: dict, into: dict, ack: bool = True, order: list | None = None) -> int:
    """Receive what each consumer has now (short waits), acknowledging each before the next receive; returns how
    many came. `order` gets every message in receive order (over all consumers)."""
    n = 0
    for name, c in consumers.items():
        while True:
            try:
                m = c.receive(POLL_MS)
            except ClientError as e:
                assert e.status == "TIMEOUT", e
                break
            into.setdefault(name, []).append(m)
            if order is not None:
                order.append(m)
            if ack:
                c.acknowledge(m)
            n += 1
    return n


def total(got: dict) -> int:
    return sum(len(v) for v in got.values())


def test_shared_spreads_and_hands_over_unacked(client, topic):
    consumers = {n: client.subscribe(topic, "sh", SubscriptionType.Shared, consumer_name=n, receiver_queue_size=10,
                                     initial_position=InitialPosition.Earliest) for n in ("a", "b")}
    producer = client.create_producer(topic, batching_enabled=False)
    for i in range(100):
        producer.send_async(f"{i}".encode(), None)
    producer.flush()
    got: dict = {}
    wait_until(lambda: poll(consumers, got) >= 0 and total(got) >= 100, 30, message="100 messages delivered")
    assert total(got) == 100 and len(got["a"]) > 0 and len(got["b"]) > 0, {k: len(v) for k, v in got.items()}
    assert sorted(int(m.data()) for v in got.values() for m in v) == list(range(100))
    # b holds messages without acking them, then leaves: a gets them
    for i in range(100, 140):
        producer.send_async(f"{i}".encode(), None)
    producer.flush()
    held: dict = {}
    wait_until(lambda: poll({"b": consumers["b"]}, held, ack=False) >= 0 and len(held.get("b", [])) >= 5, 30,
               message="b receives some without acking")
    consumers["b"].close()
    rest: dict = {}
    wait_until(lambda: poll({"a": consumers["a"]}, rest) >= 0 and
               {int(m.data()) for m in rest.get("a", [])} >= {int(m.data()) for m in held["b"]}, 30,
               message="b's unacked messages redelivered to a")
    assert all(m.redelivery_count() >= 1 for m in rest["a"] if m.message_id() in {x.message_id() for x in held["b"]})


def test_failover_active_consumer_and_takeover(client, topic):
    primary = client.subscribe(topic, "fo", SubscriptionType.Failover, consumer_name="primary", priority=0,
                               initial_position=InitialPosition.Earliest)
    backup = client.subscribe(topic, "fo", SubscriptionType.Failover, consumer_name="backup", priority=1)
    producer = client.create_producer(topic)
    for i in range(20):
        producer.send(f"{i}".encode())
    got: dict = {}
    wait_until(lambda: poll({"primary": primary, "backup": backup}, got) >= 0 and total(got) >= 20, 30,
               message="20 messages to the active consumer")
    assert list(got) == ["primary"] and [int(m.data()) for m in got["primary"]] == list(range(20))
    # (the broker tells a consumer when it becomes active or stops being active; one that joins inactive
    # hears nothing: is_active() None)
    wait_until(lambda: primary.is_active() is True, 10, message="the broker told primary it is active")
    assert backup.is_active() is not True
    for i in range(20, 30):
        producer.send(f"{i}".encode())
    unacked: dict = {}
    wait_until(lambda: poll({"primary": primary}, unacked, ack=False) >= 0 and len(unacked.get("primary", [])) == 10,
               30, message="primary holds 10 unacked")
    primary.close()
    taken: dict = {}
    wait_until(lambda: poll({"backup": backup}, taken) >= 0 and len(taken.get("backup", [])) >= 10, 30,
               message="backup takes over the unacked messages")
    assert [int(m.data()) for m in taken["backup"]] == list(range(20, 30))
    assert backup.is_active() is True


def test_key_shared_keeps_per_key_order_while_consumers_join_and_leave(client, topic):
    keys = [f"k{i}" for i in range(12)]
    consumers = {"c1": client.subscribe(topic, "ks", SubscriptionType.Key_Shared, consumer_name="c1",
                                        receiver_queue_size=50, initial_position=InitialPosition.Earliest)}
    producer = client.create_producer(topic, batching_max_publish_delay_ms=2)
    got: dict = {}
    order: list = []
    n = 0

    def send(count: int) -> None:
        nonlocal n
        for _ in range(count):
            k = keys[n % len(keys)]
            producer.send_async(f"{k}:{n}".encode(), None, key=k)
            n += 1
        producer.flush()

    send(240)
    poll(consumers, got, order=order)
    consumers["c2"] = client.subscribe(topic, "ks", SubscriptionType.Key_Shared, consumer_name="c2",
                                       receiver_queue_size=50)
    send(240)
    consumers["c3"] = client.subscribe(topic, "ks", SubscriptionType.Key_Shared, consumer_name="c3",
                                       receiver_queue_size=50)
    send(240)
    wait_until(lambda: poll(consumers, got, order=order) >= 0 and total(got) >= 720, 60,
               message="720 messages delivered")
    consumers.pop("c2").close()
    send(240)
    wait_until(lambda: poll(consumers, got, order=order) >= 0 and total(got) >= 960, 60,
               message="960 messages delivered")
    assert sorted(int(m.data().split(b":")[1]) for m in order) == list(range(960))
    # per key, over all consumers: received in send order (every message is acknowledged before the next
    # receive, and a key moves to another consumer only after its in-flight messages are acknowledged)
    by_key: dict = {}
    for m in order:
        by_key.setdefault(m.key(), []).append(int(m.data().split(b":")[1]))
    for k, seq in by_key.items():
        assert seq == sorted(seq), f"key {k} out of order: {seq}"
    moved = [k for k in keys if len({name for name, msgs in got.items() for m in msgs if m.key() == k}) > 1]
    assert moved, "some key moved between consumers as they joined and left"
    spread = {name for name, msgs in got.items() if msgs}
    assert len(spread) >= 2, "keys spread over several consumers"
