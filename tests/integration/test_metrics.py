"""`/metrics` on real processes (adapters/metrics.py): one bookie and one broker with HTTP ports over real
ZooKeeper; messages produced and consumed through bksim.client; the scrape (urllib, 127.0.0.1) parsed with
prometheus_client's parser and its counts checked against what the test did and against the gRPC topic stats.

The broker runs with broker.metrics_topics_max = 2 and serves three topics: two have series of their own, the
third is summed into topic="_other".
"""
from __future__ import annotations

import urllib.error
import urllib.request
import uuid

import pytest
from prometheus_client.parser import text_string_to_metric_families

from bksim.client import Client, InitialPosition
from helpers import free_port, wait_until
from integration.bookie_harness import BookieProcess

TOPIC_ENV = {"BKSIM_TOPIC_ENSEMBLE_SIZE": "1", "BKSIM_TOPIC_WRITE_QUORUM_SIZE": "1",
             "BKSIM_TOPIC_ACK_QUORUM_SIZE": "1"}
COUNTS = (20, 7, 5)  # messages produced to topics a, b, c (c is beyond the cap of 2)
CONSUMED = 12        # received from topic a; ACKED of them acknowledged
ACKED = 10


def scrape(port: int) -> dict[str, list]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=20) as r:
            assert r.headers["Content-Type"].startswith("text/plain")
            text = r.read().decode()
    except urllib.error.HTTPError as e:
        raise AssertionError(f"/metrics answered {e.code}: {e.read().decode()[:500]}") from None
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def one(samples, name, **labels) -> float:
    found = [s.value for s in samples if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(found) == 1, (name, labels, [(s.name, s.labels) for s in samples])
    return found[0]


@pytest.fixture(scope="module")
def run(broker_cluster):
    bookie_http, broker_http = free_port(), free_port()
    bookie = BookieProcess(broker_cluster.zookeeper, broker_cluster.base_dir, name="bookie-metrics",
                           env={"BKSIM_BOOKIE_HTTP_PORT": str(bookie_http)})
    broker_cluster.bookies.append(bookie)
    bookie.spawn()
    bookie.wait_registered(broker_cluster.zk)
    broker_cluster.settle(1)
    (broker,) = broker_cluster.start_brokers(1, env={**TOPIC_ENV, "BKSIM_BROKER_HTTP_PORT": str(broker_http),
                                                     "BKSIM_BROKER_METRICS_TOPICS_MAX": "2"})
    tenant = f"m{uuid.uuid4().hex[:6]}"
    topics = [f"persistent://{tenant}/ns/{name}" for name in ("a", "b", "c")]
    with Client(broker.address, operation_timeout_ms=10_000) as c:
        c.create_tenant(tenant)
        c.create_namespace(f"{tenant}/ns", retention_ms=-1)
        for topic in topics:
            c.create_topic(topic, 0)
        consumer = c.subscribe(topics[0], "sub", initial_position=InitialPosition.Earliest)
        for topic, count in zip(topics, COUNTS):
            producer = c.create_producer(topic, batching_enabled=False)
            for i in range(count):
                producer.send(f"m{i}".encode())
            producer.close()
        received = [consumer.receive(timeout_ms=10_000) for _ in range(CONSUMED)]
        for message in received[:ACKED]:
            consumer.acknowledge(message)
        stats = wait_until(lambda: (lambda s: s if s["subscriptions"]["sub"]["msgBacklog"] == COUNTS[0] - ACKED
                                    else None)(c.topic_stats(topics[0])), 10, message="acks to reach the cursor")
        yield {"bookie_http": bookie_http, "broker_http": broker_http, "topics": topics, "stats": stats}
        consumer.close()


def test_the_broker_counts_what_was_produced_and_consumed(run):
    m = scrape(run["broker_http"])
    a, b, _ = run["topics"]
    in_messages = m["pulsar_in_messages"]
    assert one(in_messages, "pulsar_in_messages_total", topic=a) == COUNTS[0] == run["stats"]["msgInCounter"]
    assert one(in_messages, "pulsar_in_messages_total", topic=b) == COUNTS[1]
    # the cap: two topics of their own, the third summed into _other
    assert sorted(s.labels["topic"] for s in in_messages) == sorted([a, b, "_other"])
    assert one(in_messages, "pulsar_in_messages_total", topic="_other") == COUNTS[2]
    assert one(m["pulsar_out_messages"], "pulsar_out_messages_total", topic=a) >= CONSUMED
    assert one(m["pulsar_subscription_back_log"], "pulsar_subscription_back_log", topic=a, subscription="sub") \
        == COUNTS[0] - ACKED
    assert one(m["pulsar_subscription_unacked_messages"], "pulsar_subscription_unacked_messages", topic=a,
               subscription="sub") >= CONSUMED - ACKED
    assert one(m["pulsar_msg_backlog"], "pulsar_msg_backlog", topic=a) == COUNTS[0] - ACKED
    assert one(m["pulsar_storage_size"], "pulsar_storage_size", topic=a) == run["stats"]["storageSize"] > 0
    assert one(m["pulsar_storage_write_latency"], "pulsar_storage_write_latency_count") >= sum(COUNTS)
    assert one(m["bksim_broker_ledgers_created"], "bksim_broker_ledgers_created_total") >= 3
    assert one(m["bksim_broker_topic_ownership_changes"], "bksim_broker_topic_ownership_changes_total",
               change="loaded") == 3
    assert one(m["bookkeeper_client_NUM_ENSEMBLE_CHANGE"], "bookkeeper_client_NUM_ENSEMBLE_CHANGE") == 0


def test_the_bookie_counts_the_entries_it_stored(run):
    m = scrape(run["bookie_http"])
    entries = sum(COUNTS)  # batching off: one entry per message, all on this bookie (E = 1)
    assert one(m["bookkeeper_server_ADD_ENTRY_REQUEST"], "bookkeeper_server_ADD_ENTRY_REQUEST_count") >= entries
    assert one(m["bookie_journal_JOURNAL_ADD_ENTRY"], "bookie_journal_JOURNAL_ADD_ENTRY_count") >= entries
    syncs = one(m["bookie_journal_JOURNAL_SYNC"], "bookie_journal_JOURNAL_SYNC_count")
    assert syncs >= 1
    assert one(m["bookie_journal_JOURNAL_SYNC"], "bookie_journal_JOURNAL_SYNC_bucket", le="+Inf") == syncs
    assert one(m["bookkeeper_server_READ_ENTRY_REQUEST"], "bookkeeper_server_READ_ENTRY_REQUEST_count") >= 0
    checkpoints = one(m["bksim_bookie_checkpoints"], "bksim_bookie_checkpoints_total")
    assert checkpoints >= 1  # the one at start-up at least
    assert one(m["bookie_flush"], "bookie_flush_count") == checkpoints
    assert one(m["bookie_SERVER_STATUS"], "bookie_SERVER_STATUS") == 1
    assert one(m["bookie_ACTIVE_LEDGER_TOTAL"], "bookie_ACTIVE_LEDGER_TOTAL") >= 3
    assert one(m["bksim_bookie_add_entries"], "bksim_bookie_add_entries_total") >= entries


def test_the_under_replicated_count_reads_real_zookeeper(run, zk):
    from bksim.adapters.metrics import count_under_replicated
    from bksim.metadata.paths import underreplicated_path

    assert "auditor_NUM_UNDER_REPLICATED_LEDGERS" not in scrape(run["bookie_http"])  # autorecovery off here
    before = count_under_replicated(zk.get_children)
    paths = [underreplicated_path((1 << 50) + int(uuid.uuid4().int % 1_000_000) * 2 + i) for i in range(2)]
    for path in paths:
        zk.create(path, b'{"format_version": 1, "missing": ["x:1"]}', makepath=True)
    try:
        assert count_under_replicated(zk.get_children) == before + 2
    finally:
        for path in paths:
            zk.delete(path)
    assert count_under_replicated(zk.get_children) == before
