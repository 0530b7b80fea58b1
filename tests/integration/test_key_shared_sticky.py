"""Key_Shared sticky hash ranges on real brokers through bksim.client (KeySharedPolicy.sticky): a consumer whose
ranges overlap another's is refused with CONSUMER_ASSIGN_ERROR, each key goes only to the consumer whose range
holds its slot (murmur3_32(key) mod 65536), and a key no consumer covers is held until one does."""
from __future__ import annotations

import json
import subprocess
import sys
import uuid

import pytest

from bksim.client import Client, ClientError, InitialPosition, KeySharedPolicy, SubscriptionType
from bksim.formats.murmur3 import murmur3_32
from bksim.model.status import TopicStatus
from helpers import wait_until

BOOKIES = 3
RECEIVE_MS = 10_000
HALF = 1 << 15
LOW, HIGH = [(0, HALF - 1)], [(HALF, (1 << 16) - 1)]


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
    tenant = f"k{uuid.uuid4().hex[:8]}"
    client.create_tenant(tenant)
    client.create_namespace(f"{tenant}/ns", retention_ms=-1)
    name = f"persistent://{tenant}/ns/t"
    client.create_topic(name)
    return name


def _slot(key: str) -> int:
    return murmur3_32(key) % (1 << 16)


def _sticky(client, topic, name, ranges):
    return client.subscribe(topic, "ks", SubscriptionType.Key_Shared, consumer_name=name,
                            initial_position=InitialPosition.Earliest, key_shared_policy=KeySharedPolicy.sticky(ranges))


def test_overlap_refused_and_each_key_only_to_its_ranges_consumer(client, topic):
    a = _sticky(client, topic, "a", LOW)
    b = _sticky(client, topic, "b", HIGH)
    with pytest.raises(ClientError) as e:
        _sticky(client, topic, "c", [(HALF - 10, HALF + 10)])
    assert e.value.status is TopicStatus.CONSUMER_ASSIGN_ERROR and "overlaps" in str(e.value)
    keys = [f"key-{i}" for i in range(20)]
    assert {_slot(k) < HALF for k in keys} == {True, False}  # both halves are used
    with client.create_producer(topic, batching_max_publish_delay_ms=5) as producer:
        for i in range(100):
            producer.send_async(f"{i}".encode(), None, key=keys[i % 20])
        producer.flush()
    got = {"a": [], "b": []}
    for name, consumer in (("a", a), ("b", b)):
        expected = sum(1 for i in range(100) if (_slot(keys[i % 20]) < HALF) == (name == "a"))
        for _ in range(expected):
            m = consumer.receive(RECEIVE_MS)
            got[name].append((m.partition_key(), int(m.data())))
            consumer.acknowledge(m)
    assert all(_slot(k) < HALF for k, _ in got["a"]) and all(_slot(k) >= HALF for k, _ in got["b"])
    assert sorted(i for _, i in got["a"] + got["b"]) == list(range(100))  # every message, once
    for name in got:  # per-key order
        for key in keys:
            seq = [i for k, i in got[name] if k == key]
            assert seq == sorted(seq)
    stats = client.topic_stats(topic)["subscriptions"]["ks"]
    assert stats["keySharedMode"] == "STICKY"
    assert {c["consumerName"]: c["keyHashRanges"] for c in stats["consumers"]} == \
        {"a": [f"[0, {HALF - 1}]"], "b": [f"[{HALF}, {(1 << 16) - 1}]"]}


def test_a_key_no_consumer_covers_is_held_until_one_does(client, topic):
    a = _sticky(client, topic, "a", LOW)
    high_key = next(f"h{i}" for i in range(1000) if _slot(f"h{i}") >= HALF)
    with client.create_producer(topic, batching_enabled=False) as producer:
        producer.send(b"held", key=high_key)
    wait_until(lambda: client.topic_stats(topic)["subscriptions"]["ks"]["replayQueueSize"] == 1, 10,
               message="the uncovered key is not held")
    with pytest.raises(ClientError) as e:
        a.receive(300)  # not delivered to a consumer whose ranges do not hold it
    assert e.value.status is TopicStatus.TIMEOUT
    b = _sticky(client, topic, "b", HIGH)
    m = b.receive(RECEIVE_MS)
    assert m.data() == b"held" and m.partition_key() == high_key


def test_bksim_consume_takes_its_sticky_range(brokers, client, topic):
    keys = [f"key-{i}" for i in range(20)]
    with client.create_producer(topic, batching_enabled=False) as producer:
        for key in keys:
            producer.send(key.encode(), key=key)
    low = [k for k in keys if _slot(k) < HALF]

    def consume(*extra):
        return subprocess.run([sys.executable, "-m", "bksim.cli.main", "consume", topic, "-s", "cli", "--type",
                               "Key_Shared", "--position", "earliest", "--json", "--timeout", "10",
                               "--broker", brokers.brokers[0].address, *extra],
                              capture_output=True, text=True, timeout=60)
    r = consume("--sticky-range", f"0-{HALF - 1}", "-n", str(len(low)))
    assert r.returncode == 0, r.stderr
    assert [json.loads(line)["key"] for line in r.stdout.splitlines()] == low
    r = consume("--sticky-range", "7-3", "-n", "1")
    assert r.returncode == 2 and "CONSUMER_ASSIGN_ERROR" in r.stderr and "[7, 3]" in r.stderr
