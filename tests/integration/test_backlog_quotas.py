"""Backlog quotas on real brokers through bksim.client (and the CLI's set/get/remove): each policy as a client
sees it — producer_request_hold (a send waits at the broker and completes once a consumer acknowledges; one held
until it times out is sent again before the sends behind it, none lost with dedup),
producer_exception (the send fails with PRODUCER_BLOCKED_QUOTA_EXCEEDED), consumer_backlog_eviction (the slow
subscription's mark-delete moves, the fast one keeps every message) — and the refusal of a quota that is not
below the namespace's retention."""
from __future__ import annotations

import json
import subprocess
import sys
import threading
import uuid

import pytest

from bksim.client import Client, ClientError, InitialPosition
from bksim.model.status import TopicStatus
from helpers import wait_until

BOOKIES = 3
RECEIVE_MS = 10_000
CHECK_MS = 200  # topic.backlog_quota_check_interval_ms of these brokers
HOLD_MS = 3_000  # topic.backlog_quota_hold_ms_max of these brokers: a Send held longer fails with TIMEOUT


@pytest.fixture(scope="module")
def brokers(broker_cluster):
    broker_cluster.settle(BOOKIES)
    if not broker_cluster.brokers:
        broker_cluster.start_brokers(2, env={"BKSIM_TOPIC_BACKLOG_QUOTA_CHECK_INTERVAL_MS": str(CHECK_MS),
                                             "BKSIM_TOPIC_BACKLOG_QUOTA_HOLD_MS_MAX": str(HOLD_MS)})
    return broker_cluster


@pytest.fixture
def client(brokers):
    with Client([b.address for b in brokers.brokers], operation_timeout_ms=20_000) as c:
        yield c


@pytest.fixture
def ns(client):
    tenant = f"q{uuid.uuid4().hex[:8]}"
    client.create_tenant(tenant)
    client.create_namespace(f"{tenant}/ns", retention_ms=-1)
    return f"{tenant}/ns"


def _cli(brokers, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bksim.cli.main", *args, "--broker", brokers.brokers[0].address],
                          capture_output=True, text=True, timeout=60)


def test_cli_sets_gets_and_removes_quotas_and_retention_bounds_them(brokers, client, ns):
    r = _cli(brokers, "namespace", "set-backlog-quota", ns, "--limit-size", "1000", "--policy", "producer_exception")
    assert r.returncode == 0, r.stderr
    assert "destination_storage: 1000 bytes, producer_exception" in r.stdout
    r = _cli(brokers, "namespace", "set-backlog-quota", ns, "--limit-time", "60000", "--policy",
             "consumer_backlog_eviction", "--json")
    assert json.loads(r.stdout) == {"destination_storage": {"limit_bytes": 1000, "policy": "producer_exception"},
                                    "message_age": {"limit_time_ms": 60000, "policy": "consumer_backlog_eviction"}}
    assert client.get_namespace(ns)["backlog_quotas"] == json.loads(r.stdout)
    r = _cli(brokers, "namespace", "remove-backlog-quota", ns, "--type", "message_age", "--json")
    assert json.loads(r.stdout) == {"destination_storage": {"limit_bytes": 1000, "policy": "producer_exception"}}
    r = _cli(brokers, "namespace", "get-backlog-quotas", ns)
    assert r.returncode == 0 and "message_age" not in r.stdout
    kept = f"{ns.split('/')[0]}/kept"
    client.create_namespace(kept, retention_bytes=5000)
    r = _cli(brokers, "namespace", "set-backlog-quota", kept, "--limit-size", "5000", "--policy", "producer_exception")
    assert r.returncode == 2 and "BAD_REQUEST" in r.stderr and "retention" in r.stderr


def test_producer_request_hold_send_completes_once_a_consumer_acks(client, ns):
    topic = f"persistent://{ns}/hold"
    client.create_topic(topic)
    client.set_backlog_quota(ns, "producer_request_hold", limit_bytes=1)
    consumer = client.subscribe(topic, "slow", initial_position=InitialPosition.Earliest)
    producer = client.create_producer(topic, batching_enabled=False, send_timeout_ms=20_000)
    producer.send(b"first")  # the backlog was empty: accepted; now it is over the quota
    done = threading.Event()
    result = []
    producer.send_async(b"second", lambda e, mid: (result.append((e, mid)), done.set()))
    wait_until(lambda: client.topic_stats(topic)["heldSends"] == 1, 10, message="the second send is not held")
    assert not done.is_set()  # held at the broker, not refused
    first = consumer.receive(RECEIVE_MS)
    assert first.data() == b"first"
    consumer.acknowledge(first)
    assert done.wait(10), "the held send did not complete after the ack"
    assert result[0][0] is None
    assert consumer.receive(RECEIVE_MS).data() == b"second"
    assert client.topic_stats(topic)["heldSends"] == 0


def test_a_held_send_that_times_out_is_sent_again_before_the_sends_behind_it(client, ns):
    """Dedup on. Three sends are pipelined while the backlog is over a producer_request_hold quota: the first is
    held until it fails with TIMEOUT, which ends the producer's stream; the client reconnects and sends all three
    again, in order, with their sequence ids; then the consumer catches up. Each arrives once, in order: none of
    the sends behind the timed-out one was written ahead of it (its resend would then be a "duplicate", lost)."""
    deduped = f"{ns.split('/')[0]}/dedup"
    client.create_namespace(deduped, retention_ms=-1, dedup=True)
    topic = f"persistent://{deduped}/held"
    client.create_topic(topic)
    client.set_backlog_quota(deduped, "producer_request_hold", limit_bytes=1)
    consumer = client.subscribe(topic, "slow", initial_position=InitialPosition.Earliest)
    producer = client.create_producer(topic, "held", batching_enabled=False, send_timeout_ms=60_000)
    producer.send(b"m0")  # the backlog was empty: accepted; now it is over the quota
    connected = client.topic_stats(topic)["publishers"][0]["connectedSince"]
    results: dict[bytes, tuple] = {}
    done = threading.Event()

    def receipt(data):
        return lambda e, mid: (results.__setitem__(data, (e, mid)), len(results) == 3 and done.set())
    for data in (b"m1", b"m2", b"m3"):
        producer.send_async(data, receipt(data))
    wait_until(lambda: client.topic_stats(topic)["heldSends"] >= 1, 10, message="the sends are not held")
    wait_until(lambda: [p["connectedSince"] for p in client.topic_stats(topic)["publishers"]] not in ([], [connected]),
               HOLD_MS / 1000 + 20, interval_s=0.05, message="the producer's reconnect after the held send's TIMEOUT")
    first = consumer.receive(RECEIVE_MS)
    assert first.data() == b"m0"
    consumer.acknowledge(first)  # the backlog falls: the held sends may go
    assert done.wait(30), f"receipts: {results}"
    for data in (b"m1", b"m2", b"m3"):
        error, mid = results[data]
        assert error is None and mid.ledger >= 0, (data, error, mid)  # written, not answered as a duplicate
    got = [consumer.receive(RECEIVE_MS) for _ in range(3)]
    assert [m.data() for m in got] == [b"m1", b"m2", b"m3"]
    producer.close()
    consumer.close()


def test_producer_exception_fails_the_send_with_its_status(client, ns):
    topic = f"persistent://{ns}/exception"
    client.create_topic(topic)
    client.set_backlog_quota(ns, "producer_exception", limit_bytes=1)
    client.subscribe(topic, "slow", initial_position=InitialPosition.Earliest)
    producer = client.create_producer(topic, batching_enabled=False)
    producer.send(b"first")
    with pytest.raises(ClientError) as e:
        producer.send(b"second")
    assert e.value.status is TopicStatus.PRODUCER_BLOCKED_QUOTA_EXCEEDED
    assert "destination_storage" in str(e.value)
    stats = client.topic_stats(topic)
    assert stats["msgInCounter"] == 1 and stats["backlogQuotas"]["destination_storage"]["limit_bytes"] == 1


def test_consumer_backlog_eviction_moves_the_slow_cursor_and_the_fast_one_keeps_its_messages(client, ns):
    topic = f"persistent://{ns}/evict"
    client.create_topic(topic)
    client.subscribe(topic, "slow", initial_position=InitialPosition.Earliest).close()  # a subscription left behind
    fast = client.subscribe(topic, "fast", initial_position=InitialPosition.Earliest)
    producer = client.create_producer(topic, batching_enabled=False)
    for i in range(20):
        producer.send(f"m{i:02d}".encode())  # entries of one size
    got = []
    for _ in range(20):
        m = fast.receive(RECEIVE_MS)
        got.append(m.data())
        fast.acknowledge(m)
    assert got == [f"m{i:02d}".encode() for i in range(20)]
    stats = wait_until(lambda: (lambda s: s if s["subscriptions"]["fast"]["msgBacklog"] == 0 else None)(
        client.topic_stats(topic)), 10)
    per_entry = stats["estimatedBacklogSizeBytes"] // 20  # the slow subscription holds all 20
    client.set_backlog_quota(ns, "consumer_backlog_eviction", limit_bytes=per_entry * 10)
    stats = wait_until(lambda: (lambda s: s if s["backlogEvictedEntries"] else None)(client.topic_stats(topic)), 10,
                       message="no eviction")
    assert stats["subscriptions"]["slow"]["msgBacklog"] == 9  # 90% of the limit kept
    assert stats["backlogEvictedEntries"] == 11
    slow = client.subscribe(topic, "slow")
    assert slow.receive(RECEIVE_MS).data() == b"m11"  # the eleven oldest are gone for it
