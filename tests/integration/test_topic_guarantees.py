"""Topic guarantees on the real cluster (ZooKeeper, bookie and broker processes; tests/integration/broker_harness.py)
through bksim.client: broker failover under load (kill -9 of the owner: another broker takes the topic within
the session timeout plus a few seconds, no acknowledged message is lost, duplicates only as documented), a
clean broker restart redelivers nothing that was acknowledged (ack holes included), Shared consumers joining
and leaving, Key_Shared per-key order across a membership change, retention trimming and TTL."""
from __future__ import annotations

import threading
import time
import uuid
from datetime import datetime, timezone

import pytest

from bksim.client import Client, ClientError, InitialPosition, SubscriptionType
from bksim.model.status import TopicStatus
from helpers import wait_until
from integration.bookie_harness import SESSION_TIMEOUT_MS

BOOKIES = 3
RECEIVE_MS = 15_000
BROKER_ENV = {
    "BKSIM_TOPIC_CURSOR_PERSIST_INTERVAL_MS": "200",
    "BKSIM_TOPIC_TRIM_INTERVAL_MS": "500",
    "BKSIM_TOPIC_LEDGER_ENTRIES_MAX": "50",
    "BKSIM_TOPIC_FAILOVER_SWITCH_DELAY_MS": "100",
}
TAKEOVER_S = SESSION_TIMEOUT_MS / 1000 + 15  # the session timeout plus a few seconds (loaded 2-core machine)


@pytest.fixture(scope="module")
def cluster(broker_cluster):
    broker_cluster.settle(BOOKIES)
    if not broker_cluster.brokers:
        broker_cluster.start_brokers(2, env=BROKER_ENV)
    return broker_cluster


def live_addresses(cluster) -> list[str]:
    return [b.address for b in cluster.brokers if b.alive()]


@pytest.fixture
def client(cluster):
    with Client(live_addresses(cluster), operation_timeout_ms=30_000) as c:
        yield c


def fresh_namespace(client, **policies) -> str:
    tenant = f"t{uuid.uuid4().hex[:8]}"
    client.create_tenant(tenant)
    client.create_namespace(f"{tenant}/ns", **({"retention_ms": -1} | policies))
    return f"{tenant}/ns"


def owner_process(cluster, client, topic):
    broker_id = client.lookup(topic)["broker_id"]
    return next(b for b in cluster.brokers if b.broker_id == broker_id)


def topic_log(broker, topic: str, lines: int = 40) -> str:
    """The last `lines` lines of a broker's log that name `topic` (when it looked it up, loaded, recovered it)."""
    with open(broker.log_path, errors="replace") as f:
        return "".join([line for line in f if topic in line][-lines:])


def restore_brokers(cluster) -> None:
    """Bring the module back to two live brokers (a test may have killed or stopped one)."""
    for b in cluster.brokers:
        if not b.alive():
            b.spawn()
            b.wait_registered(cluster.zk, timeout_s=3 * SESSION_TIMEOUT_MS / 1000 + 20)


def test_kill9_of_the_owning_broker_loses_no_acknowledged_message(cluster, client):
    restore_brokers(cluster)
    ns = fresh_namespace(client, dedup=True)
    topic = f"persistent://{ns}/failover"
    client.create_topic(topic)
    consumer = client.subscribe(topic, "audit", SubscriptionType.Exclusive, initial_position=InitialPosition.Earliest)
    producer = client.create_producer(topic, producer_name="writer-1", batching_max_publish_delay_ms=2)
    acked: dict[int, object] = {}
    errors: list[Exception] = []
    stop = threading.Event()

    def produce():
        i = 0
        while not stop.is_set() and i < 20_000:
            try:
                acked[i] = producer.send(b"m%06d" % i)
            except ClientError as e:  # a send timeout during the takeover: its outcome is unknown, never lost
                errors.append(e)
            i += 1

    writer = threading.Thread(target=produce, daemon=True)
    writer.start()
    wait_until(lambda: len(acked) >= 200, 30, message="200 acknowledged messages before the kill")
    owner = owner_process(cluster, client, topic)
    before = len(acked)
    killed_at, killed_wall = time.monotonic(), datetime.now(timezone.utc).isoformat(timespec="milliseconds")
    owner.kill9()
    wait_until(lambda: len(acked) >= before + 200, TAKEOVER_S + 20, interval_s=0.1,
               message="200 more acknowledged messages after the takeover")
    takeover_s = time.monotonic() - killed_at
    stop.set()
    writer.join(60)
    assert not writer.is_alive()
    new_owner = owner_process(cluster, client, topic)
    assert new_owner is not owner and new_owner.alive()
    assert takeover_s < TAKEOVER_S, (f"producing resumed after {takeover_s:.1f}s; killed {owner.broker_id} at "
                                     f"{killed_wall}; the new owner's log of the topic:\n"
                                     + topic_log(new_owner, topic))
    # every acknowledged message is consumed; duplicates (at-least-once: messages delivered but not yet
    # acknowledged when the owner died come again) are counted, never a loss
    wanted = {b"m%06d" % i for i in acked}
    seen: dict[bytes, int] = {}
    at: dict[bytes, set] = {}  # payload -> the log positions it was delivered from
    while not wanted <= set(seen):
        m = consumer.receive(RECEIVE_MS)
        seen[m.data()] = seen.get(m.data(), 0) + 1
        mid = m.message_id()
        at.setdefault(m.data(), set()).add((mid.ledger, mid.entry, mid.batch_index))
        consumer.acknowledge(m)
    assert not wanted - set(seen)  # lost = 0
    # ids follow production order; a re-sent message the new owner already had (dedup) is acknowledged as a
    # duplicate with id -1:-1, as in Pulsar
    positions = [acked[i] for i in sorted(acked) if acked[i].ledger >= 0]
    assert positions == sorted(positions), "acknowledged message ids follow production order"
    # dedup on: no message is in the log twice (a duplicate in the Jepsen sense: one message at two positions)
    assert all(len(p) == 1 for p in at.values()), {k: v for k, v in at.items() if len(v) > 1}
    print(f"failover: {len(acked)} acknowledged, producing resumed {takeover_s:.1f}s after the kill, "
          f"{sum(n - 1 for n in seen.values())} duplicate deliveries, {len(errors)} sends with unknown outcome")
    producer.close()
    consumer.close()


def test_clean_restart_redelivers_nothing_acknowledged_holes_included(cluster, client):
    restore_brokers(cluster)
    ns = fresh_namespace(client)
    topic = f"persistent://{ns}/restart"
    client.create_topic(topic)
    consumer = client.subscribe(topic, "s", SubscriptionType.Shared, initial_position=InitialPosition.Earliest)
    producer = client.create_producer(topic)
    for i in range(300):
        producer.send_async(b"r%04d" % i, None)
    producer.flush()
    got = [consumer.receive(RECEIVE_MS) for _ in range(300)]
    acked = {m.data() for k, m in enumerate(got) if k % 2 == 0 or k >= 250}  # holes: every other one below 250
    for m in got:
        if m.data() in acked:
            consumer.acknowledge(m)
    consumer.close()  # flushes its grouped acks
    producer.close()
    owner = owner_process(cluster, client, topic)
    owner.cleanup()  # SIGTERM: topics unload with their final cursor state
    assert not owner.alive()
    restore_brokers(cluster)
    again = client.subscribe(topic, "s", SubscriptionType.Shared)
    redelivered = set()
    while len(redelivered) < 300 - len(acked):
        redelivered.add(again.receive(RECEIVE_MS).data())
    assert redelivered == {m.data() for m in got} - acked
    with pytest.raises(ClientError) as info:  # and nothing else comes
        again.receive(2_000)
    assert info.value.status is TopicStatus.TIMEOUT
    again.close()


def test_shared_consumer_leaving_hands_its_unacked_messages_to_the_others(cluster, client):
    restore_brokers(cluster)
    ns = fresh_namespace(client)
    topic = f"persistent://{ns}/shared"
    client.create_topic(topic)
    a = client.subscribe(topic, "work", SubscriptionType.Shared, consumer_name="a", receiver_queue_size=10,
                         initial_position=InitialPosition.Earliest)
    b = client.subscribe(topic, "work", SubscriptionType.Shared, consumer_name="b", receiver_queue_size=10)
    producer = client.create_producer(topic, batching_enabled=False)
    for i in range(40):
        producer.send(b"s%02d" % i)
    held = [a.receive(RECEIVE_MS) for _ in range(5)]  # a takes 5 and never acks them
    a.close()
    got = []
    while len(got) < 200:  # bounded: 40 messages, a few of them twice
        m = b.receive(RECEIVE_MS)
        got.append(m)
        b.acknowledge(m)
        if {x.data() for x in got} >= {b"s%02d" % i for i in range(40)}:
            break
    assert {x.data() for x in got} == {b"s%02d" % i for i in range(40)}
    again = {m.data(): m.redelivery_count() for m in got if m.data() in {h.data() for h in held}}
    assert len(again) == 5 and all(c >= 1 for c in again.values())
    b.close()
    producer.close()


def test_key_shared_keeps_per_key_order_when_consumers_join(cluster, client):
    restore_brokers(cluster)
    ns = fresh_namespace(client)
    topic = f"persistent://{ns}/keys"
    client.create_topic(topic)
    log: list[tuple[str, str, int]] = []
    a = client.subscribe(topic, "k", SubscriptionType.Key_Shared, consumer_name="a", receiver_queue_size=50,
                         initial_position=InitialPosition.Earliest)
    producer = client.create_producer(topic)
    keys = [f"key-{k}" for k in range(8)]
    for i in range(400):
        producer.send_async(b"%d" % i, None, key=keys[i % 8])
    producer.flush()
    first = [a.receive(RECEIVE_MS) for _ in range(50)]  # a holds 50 unacked
    log += [("a", m.partition_key(), int(m.data())) for m in first]
    b = client.subscribe(topic, "k", SubscriptionType.Key_Shared, consumer_name="b", receiver_queue_size=50)
    for m in first:
        a.acknowledge(m)
    seen = {int(m.data()) for m in first}
    deadline = time.monotonic() + 60
    while len(seen) < 400 and time.monotonic() < deadline:
        for name, c in (("a", a), ("b", b)):
            try:
                m = c.receive(200)
            except ClientError:
                continue
            log.append((name, m.partition_key(), int(m.data())))
            seen.add(int(m.data()))
            c.acknowledge(m)
    assert len(seen) == 400
    for key in keys:  # per key: values increase in delivery order, whichever consumer got them
        values = [v for _, k, v in log if k == key]
        assert values == sorted(values), key
    assert {n for n, _, _ in log[50:]} == {"a", "b"}  # the new consumer got keys
    for c in (a, b, producer):
        c.close()


def test_retention_trims_consumed_ledgers_and_ttl_expires_old_messages(cluster, client):
    restore_brokers(cluster)
    ns = fresh_namespace(client, retention_ms=0, retention_bytes=-1, ttl_ms=1_000)
    topic = f"persistent://{ns}/trim"
    client.create_topic(topic)
    consumer = client.subscribe(topic, "s", SubscriptionType.Exclusive, initial_position=InitialPosition.Earliest)
    producer = client.create_producer(topic, batching_enabled=False)
    for i in range(180):  # 50 entries per ledger: several ledgers
        producer.send_async(b"t%03d" % i, None)
    producer.flush()
    owner = Client(client.lookup(topic)["address"], operation_timeout_ms=30_000)  # stats are served by the owner
    ledgers = [x["ledgerId"] for x in owner.topic_stats_internal(topic)["ledgers"]]
    assert len(ledgers) >= 3
    for _ in range(120):
        consumer.acknowledge(consumer.receive(RECEIVE_MS))
    # trimmed: the ledgers entirely below the mark-delete are gone from the list and from ZooKeeper
    wait_until(lambda: owner.topic_stats_internal(topic)["ledgers"][0]["ledgerId"] != ledgers[0], 30,
               interval_s=0.2, message="retention trimming of the consumed ledgers")
    remaining = [x["ledgerId"] for x in owner.topic_stats_internal(topic)["ledgers"]]
    for lid in ledgers[:2]:
        assert lid not in remaining
        assert not cluster.zk.exists(f"/ledgers/00/0000/L{lid:04d}")
    # TTL: the 60 unacknowledged messages expire (the cursor moves past them) while the consumer holds them
    held = [consumer.receive(RECEIVE_MS) for _ in range(60)]
    wait_until(lambda: owner.topic_stats(topic)["subscriptions"]["s"]["msgBacklog"] == 0, 30, interval_s=0.2,
               message="TTL expiry of the unacknowledged messages")
    sub_stats = owner.topic_stats(topic)["subscriptions"]["s"]
    assert sub_stats["totalMsgExpired"] >= len(held) and sub_stats["lastExpireTimestamp"] > 0, sub_stats
    expired_ledger = held[0].message_id().ledger
    wait_until(lambda: expired_ledger not in [x["ledgerId"] for x in owner.topic_stats_internal(topic)["ledgers"]],
               30, interval_s=0.2, message="retention trimming of the expired messages' ledger")
    # acks of them are acks of what the cursor has already passed: they succeed and change nothing
    consumer.acknowledge_cumulative(next(m for m in reversed(held) if m.message_id().ledger == expired_ledger))
    consumer.acknowledge(held[0])
    producer.send(b"after")
    assert consumer.receive(RECEIVE_MS).data() == b"after"
    assert owner.topic_stats(topic)["subscriptions"]["s"]["msgBacklog"] == 1
    consumer.close()
    producer.close()
    owner.close()
