"""Readers (bksim.client.Reader; topics/non_durable_cursor.py) against real brokers (broker_harness: ZooKeeper,
3 bookies, 2 brokers): from a message id exclusive and inclusive (also inside a batch), earliest and latest,
has_message_available, seek, no znode for the reader and nothing left after it closes, precise refusals of
malformed and unknown ids, a reader per partition, and a reader that continues after kill -9 of the topic's
owner from the last message it returned (nothing skipped, nothing twice)."""
from __future__ import annotations

import contextlib
import io
import json
import uuid

import pytest

from bksim.cli.main import main
from bksim.client import Client, ClientError, InitialPosition, MessageId
from bksim.model.status import TopicStatus
from bksim.topics.names import TopicName
from integration.bookie_harness import SESSION_TIMEOUT_MS

BOOKIES = 3
READ_MS = 10_000
BROKER_ENV = {"BKSIM_TOPIC_MESSAGE_BYTES_MAX": "60000"}
FAILOVER_BOUND_S = SESSION_TIMEOUT_MS / 1000 + 15  # session expiry + lookup, takeover, back-off


@pytest.fixture(scope="module")
def brokers(broker_cluster):
    broker_cluster.settle(BOOKIES)
    if not broker_cluster.brokers:
        broker_cluster.start_brokers(2, env=BROKER_ENV)
    return broker_cluster


@pytest.fixture
def client(brokers):
    live = [b for b in brokers.brokers if b.alive()]
    if len(live) < 2:
        live += brokers.start_brokers(2 - len(live), env=BROKER_ENV)
    with Client([b.address for b in live], operation_timeout_ms=int(FAILOVER_BOUND_S * 1000)) as c:
        yield c


@pytest.fixture
def topic(client):
    tenant = f"r{uuid.uuid4().hex[:8]}"
    client.create_tenant(tenant)
    client.create_namespace(f"{tenant}/ns", retention_ms=-1)
    name = f"persistent://{tenant}/ns/log"
    client.create_topic(name)
    return name


def _send(client, topic, n, *, batch=False, start=0) -> list[MessageId]:
    producer = client.create_producer(topic, batching_enabled=batch, batching_max_publish_delay_ms=1_000)
    ids: list = []
    for i in range(start, start + n):
        producer.send_async(b"m%d" % i, lambda e, mid: ids.append(mid))
    producer.flush()
    producer.close()
    assert len(ids) == n and None not in ids
    return sorted(ids)


def _read(reader, n) -> list[bytes]:
    return [reader.read_next(READ_MS).data() for _ in range(n)]


def test_reader_from_message_ids_earliest_latest_and_seek(client, topic, zk):
    ids = _send(client, topic, 10)
    with client.create_reader(topic, ids[3]) as after:
        assert _read(after, 6) == [b"m%d" % i for i in range(4, 10)]
        assert not after.has_message_available()
        stats = client.topic_stats(topic)["subscriptions"][after.reader_name()]
        assert stats["isDurable"] is False and stats["msgBacklog"] == 0  # acknowledged as the broker sent them
        path = TopicName.parse(topic).managed_ledger_path
        assert zk.get_children(path) == [], "a reader has no cursor znode"
    with client.create_reader(topic, ids[3], start_message_id_inclusive=True) as at:
        assert at.has_message_available()
        assert _read(at, 7) == [b"m%d" % i for i in range(3, 10)]
        at.seek(ids[1])
        assert _read(at, 2) == [b"m1", b"m2"]
    with client.create_reader(topic, InitialPosition.Earliest) as earliest, \
            client.create_reader(topic, "latest") as latest, \
            client.create_reader(topic, "latest", start_message_id_inclusive=True) as last:
        assert _read(earliest, 10) == [b"m%d" % i for i in range(10)]
        assert _read(last, 1) == [b"m9"]
        assert not latest.has_message_available()
        _send(client, topic, 2, start=10)
        assert latest.has_message_available()
        assert _read(latest, 2) == [b"m10", b"m11"]
        with pytest.raises(ClientError) as e:
            latest.read_next(300)
        assert e.value.status is TopicStatus.TIMEOUT
    assert not [s for s in client.topic_stats(topic)["subscriptions"] if s.startswith("reader-")], \
        "a closed reader leaves nothing behind"


def test_reader_inside_a_batch(client, topic):
    ids = _send(client, topic, 6, batch=True)
    assert {(m.ledger, m.entry) for m in ids} == {(ids[0].ledger, ids[0].entry)}, "one batch"
    with client.create_reader(topic, ids[2]) as exclusive:
        assert exclusive.has_message_available()  # asked before anything came: the rest of the batch
        assert _read(exclusive, 3) == [b"m3", b"m4", b"m5"]
        assert not exclusive.has_message_available()
    with client.create_reader(topic, ids[2], start_message_id_inclusive=True) as inclusive:
        assert _read(inclusive, 4) == [b"m2", b"m3", b"m4", b"m5"]


def test_bad_start_message_ids_are_refused(client, topic):
    ids = _send(client, topic, 3)
    last = ids[-1]
    cases = [(MessageId(last.ledger, last.entry + 5), "not a message of this topic"),
             (MessageId(last.ledger + 1000, 0), "not a message of this topic"),
             (MessageId(last.ledger, -7), "malformed"),
             (MessageId(last.ledger, 0, -1, -3), "malformed")]
    for mid, words in cases:
        with pytest.raises(ClientError) as e:
            client.create_reader(topic, mid)
        assert e.value.status is TopicStatus.BAD_REQUEST and words in e.value.message, (mid, e.value)
    with pytest.raises(ClientError) as e:
        client.create_reader(topic, "yesterday")
    assert e.value.status is TopicStatus.BAD_REQUEST


def test_partitioned_reader_reads_every_partition_and_refuses_a_message_id(client, topic):
    parted = topic + "-parted"
    client.create_topic(parted, partitions=3)
    ids = _send(client, parted, 12)
    assert len({m.partition for m in ids}) == 3
    with client.create_reader(parted, "earliest") as reader:
        assert sorted(_read(reader, 12)) == sorted(b"m%d" % i for i in range(12))
        assert not reader.has_message_available()
    with pytest.raises(ClientError) as e:
        client.create_reader(parted, ids[0])
    assert e.value.status is TopicStatus.BAD_REQUEST and f"{parted}-partition-{ids[0].partition}" in e.value.message
    with client.create_reader(f"{parted}-partition-{ids[0].partition}", ids[0],
                              start_message_id_inclusive=True) as one:
        assert one.read_next(READ_MS).message_id() == ids[0]


def _cli(client, *argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([argv[0], "--broker", ",".join(client.addresses), *argv[1:]])
    return code, out.getvalue(), err.getvalue()


def test_bksim_read_command(client, topic):
    ids = _send(client, topic, 5)
    code, out, err = _cli(client, "read", topic, "--start-message-id", str(ids[1]), "-n", "3", "--json")
    assert code == 0, err
    rows = [json.loads(line) for line in out.splitlines()]
    assert [r["content"] for r in rows] == ["m2", "m3", "m4"] and rows[0]["message_id"] == str(ids[2])
    code, out, err = _cli(client, "read", topic, "-m", str(ids[1]), "--inclusive", "-n", "1")
    assert code == 0 and out == "----- got message -----\nkey:[null], properties:[], content:m1\n"
    assert err == "1 messages successfully read\n"
    code, out, _ = _cli(client, "read", topic, "--earliest", "-n", "5")
    assert code == 0 and out.count("----- got message -----") == 5
    code, _, err = _cli(client, "read", topic, "--latest", "--timeout", "1")
    assert code == 2 and "TIMEOUT" in err and "read 0" in err
    code, _, err = _cli(client, "read", topic, "-m", f"{ids[0].ledger}:999")
    assert code == 2 and "bksim: error: BAD_REQUEST: " in err and "not a message of this topic" in err
    code, _, err = _cli(client, "read", topic, "-m", "12-3")
    assert code == 2 and "LEDGER:ENTRY" in err
    assert not [s for s in client.topic_stats(topic)["subscriptions"]], "readers leave nothing behind"


def test_reader_continues_after_the_owner_is_killed(client, topic, brokers):
    """Last in the module: it kills a broker (the fixtures start another for later tests)."""
    _send(client, topic, 300, batch=True)
    reader = client.create_reader(topic, "earliest", receiver_queue_size=50)
    first = _read(reader, 100)
    while True:  # stop in the middle of a batch: the reader resumes at a batch index; more is queued
        m = reader.read_next(READ_MS)
        first.append(m.data())
        if 0 <= m.message_id().batch_index < m.batch_size() - 1:
            break
    assert len(first) < 300
    owner_address = client.lookup(topic)["address"]
    owner = next(b for b in brokers.brokers if b.address == owner_address)
    owner.kill9()
    _send(client, topic, 50, start=300)  # written through the new owner
    rest = _read(reader, 350 - len(first))
    got = first + rest
    assert got == [b"m%d" % i for i in range(350)], "in order, nothing skipped, nothing twice"
    assert client.lookup(topic)["address"] != owner_address
    with pytest.raises(ClientError):
        reader.read_next(300)
    reader.close()
