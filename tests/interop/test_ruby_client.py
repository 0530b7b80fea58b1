"""A non-Python gRPC client through the protos: tests/interop/client.rb (Ruby, Debian's ruby-grpc 1.51, stubs
that `make interop-deps` generates from proto/*.proto into build/ruby) against real ZooKeeper, bookies and
brokers (tests/integration/broker_harness.py: 2 bookies, 2 brokers).

Both directions, byte for byte: a ledger Ruby created, appended to and closed reads back identical through the
Python ledger client and `bksim ledger read`, and a ledger Python wrote reads back identical in Ruby; messages
Ruby produced (single Sends and batches, binary payloads, keys, properties) are what the Python client and
`bksim consume` receive, with the message ids Ruby's receipts named, and messages the Python producer batched
are what Ruby's consumer decodes from the stored entries, its acks leaving the subscription empty. Ruby talks
to the broker that does not own the topic, so its Lookup redirect is used; a refusal reaches Ruby with the
broker's status from the "bksim-status" trailer.

Every Ruby run is a subprocess with a timeout (interop/ruby_harness.py); nothing sleeps.
"""
from __future__ import annotations

import contextlib
import io
import json
import time
import uuid

import pytest

from bksim.cli.main import main as bksim_main
from bksim.client import Client, InitialPosition, SubscriptionType
from integration.broker_harness import BrokerCluster, BrokerConn
from interop.ruby_harness import b64, ensure_ruby, payloads, ruby, unb64, write_json

BOOKIES = 2  # the topics' default E = Qw = Qa = 2
BROKERS = 2
RECEIVE_MS = 10_000


@pytest.fixture(scope="module")
def cluster(zookeeper, tmp_path_factory):
    ensure_ruby()
    c = BrokerCluster(zookeeper, tmp_path_factory.mktemp("interop"))
    try:
        c.settle(BOOKIES)
        c.start_brokers(BROKERS)
        yield c
    finally:
        c.cleanup()


@pytest.fixture
def client(cluster):
    with Client([b.address for b in cluster.brokers], operation_timeout_ms=20_000) as c:
        yield c


@pytest.fixture
def ns(client):
    tenant = f"rb{uuid.uuid4().hex[:8]}"
    client.create_tenant(tenant)
    client.create_namespace(f"{tenant}/ns", retention_ms=-1)
    return f"{tenant}/ns"


def bksim(*argv: str) -> str:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = bksim_main(list(argv))
    assert code == 0, f"bksim {' '.join(argv)} exited {code}: {err.getvalue()}"
    return out.getvalue()


def test_ledger_written_in_ruby_reads_back_in_python(cluster, tmp_path):
    broker = cluster.brokers[0].address
    password = b"rb-secret"
    (tmp_path / "pw").write_bytes(password + b"\n")
    data = payloads(1, 40)
    out = ruby("ledger-write", "--payloads", write_json(tmp_path / "p.json", [b64(d) for d in data]),
               "--password-file", str(tmp_path / "pw"), "--ensemble", "2", "--write-quorum", "2",
               "--ack-quorum", "2", "--batch", "7", broker=broker)
    ledger_id = out["ledger_id"]
    assert [(a["first_entry_id"], a["count"]) for a in out["appends"]] == [(i, min(7, 40 - i)) for i in range(0, 40, 7)]
    assert [unb64(e["payload_b64"]) for e in out["read"]] == data
    assert out["closed"] == {"ledger_id": ledger_id, "state": "CLOSED", "last_entry_id": 39,
                             "length": sum(map(len, data)), "ensemble_size": 2, "write_quorum_size": 2,
                             "ack_quorum_size": 2}
    with BrokerConn(cluster.brokers[1].address) as conn:  # the other broker: nothing cached from the writer
        assert conn.read(ledger_id, password) == dict(enumerate(data))
        info = conn.metadata(ledger_id)
        assert (info.state, info.last_entry_id, info.length) == ("CLOSED", 39, sum(map(len, data)))
    rows = [json.loads(line) for line in bksim("ledger", "read", str(ledger_id), "--broker", broker, "--json",
                                               "--payload", "--password-file", str(tmp_path / "pw")).splitlines()]
    assert [unb64(r["payload"]) for r in rows] == data


def test_ledger_written_in_python_reads_back_in_ruby(cluster, tmp_path):
    broker = cluster.brokers[1].address
    password = b"py-secret"
    (tmp_path / "pw").write_bytes(password)
    data = payloads(2, 25)
    with BrokerConn(broker) as conn:
        ledger_id = conn.create(2, 2, 2, password).ledger_id
        conn.client.append(ledger_id, [data[:10], data[10:]], password=password)
        out = ruby("ledger-read", str(ledger_id), "--password-file", str(tmp_path / "pw"), broker=broker)
        assert out["last_add_confirmed"] == 24 and out["metadata"]["state"] == "OPEN"
        assert [(e["entry_id"], unb64(e["payload_b64"])) for e in out["entries"]] == list(enumerate(data))
        assert [e["ledger_length"] for e in out["entries"]] == [sum(map(len, data[:i + 1])) for i in range(25)]
        conn.close_ledger(ledger_id, password)
    # a refusal: the broker's LedgerStatus reaches Ruby through the "bksim-status" trailer
    (tmp_path / "bad").write_bytes(b"not-the-password")
    out = ruby("ledger-read", str(ledger_id), "--password-file", str(tmp_path / "bad"), broker=broker, expect=2)
    assert out["error"]["bksim_status"] == "UNAUTHORIZED" and out["error"]["grpc_code"] == 7, out


def non_owner(cluster, client, topic: str) -> str:
    owner = client.lookup(topic)["address"]
    others = [b.address for b in cluster.brokers if b.address != owner]
    assert len(others) == 1, f"owner {owner} of {topic} is not one of {[b.address for b in cluster.brokers]}"
    return others[0]


def test_messages_produced_in_ruby_consumed_in_python(cluster, client, ns, tmp_path):
    topic = f"persistent://{ns}/from-ruby"
    client.create_topic(topic)
    data = payloads(3, 11)
    items = [{"payload_b64": b64(d), "key": f"k{i % 3}" if i % 4 else None,
              "properties": {"i": str(i), "lang": "ruby"}, "event_time_ms": 1_000 + i} for i, d in enumerate(data)]
    py = client.subscribe(topic, "py", initial_position=InitialPosition.Earliest)
    out = ruby("produce", topic, "--payloads", write_json(tmp_path / "m.json", items), "--batch", "5",
               "--producer-name", "ruby-1", broker=non_owner(cluster, client, topic))
    assert out["producer_name"] == "ruby-1" and out["broker_id"] == client.lookup(topic)["broker_id"]
    assert [r["batch_size"] for r in out["receipts"]] == [5, 5, 1]  # two batches and a single message
    got = [py.receive(RECEIVE_MS) for _ in data]
    for m in got:
        py.acknowledge(m)
    assert [m.data() for m in got] == data
    assert [m.key() for m in got] == [item["key"] for item in items]
    assert [m.properties() for m in got] == [item["properties"] for item in items]
    assert [m.event_timestamp() for m in got] == [item["event_time_ms"] for item in items]
    assert [str(m.message_id()) for m in got] == out["message_ids"]
    lines = bksim("consume", topic, "--broker", ",".join(b.address for b in cluster.brokers), "-s", "cli",
                  "-n", str(len(data)), "--position", "earliest", "--json", "--timeout", "20").splitlines()
    rows = [json.loads(line) for line in lines]
    assert [unb64(r["content_base64"]) if "content_base64" in r else r["content"].encode()
            for r in rows] == data
    assert [r["message_id"] for r in rows] == out["message_ids"]


def test_messages_produced_in_python_consumed_in_ruby(cluster, client, ns):
    topic = f"persistent://{ns}/to-ruby"
    client.create_topic(topic)
    data = payloads(4, 12)
    producer = client.create_producer(topic, producer_name="py-1", batching_max_publish_delay_ms=1_000)
    ids: list = []
    for i, d in enumerate(data[:9]):  # one batch of 9 (flush below), then three single-message Sends
        producer.send_async(d, lambda e, mid: ids.append((e, mid)), properties={"i": str(i)}, key="same")
    producer.flush()
    ids = [mid for e, mid in ids if e is None]
    ids += [producer.send(d, properties={"i": str(9 + i)}, event_time_ms=77) for i, d in enumerate(data[9:])]
    assert len(ids) == 12 and {mid.batch_index for mid in ids[:9]} == set(range(9)), ids
    out = ruby("consume", topic, "--subscription", "rb", "--count", "12", "--type", "shared",
               broker=non_owner(cluster, client, topic))
    got = out["messages"]
    assert [unb64(m["payload_b64"]) for m in got] == data
    assert [m["message_id"] for m in got] == [str(mid) for mid in ids]
    assert [m["key"] for m in got] == ["same"] * 9 + [None] * 3
    assert [m["properties"] for m in got] == [{"i": str(i)} for i in range(12)]
    assert [m["event_time_ms"] for m in got[9:]] == [77] * 3
    assert {m["producer_name"] for m in got} == {"py-1"} and out["acks"] == 4  # one Ack per entry
    stats = client.topic_stats(topic)["subscriptions"]["rb"]
    assert stats["msgBacklog"] == 0 and stats["consumers"] == [], stats  # every message acked, stream ended


def test_ruby_consumes_decoded_messages_without_the_entry_format(cluster, client, ns):
    """delivery_format MESSAGES: Ruby takes the broker's ReceivedMessages and acks them by their ids (batch-index
    acks); the same messages, ids and fields as the Python client's."""
    topic = f"persistent://{ns}/decoded-to-ruby"
    client.create_topic(topic)
    data = payloads(5, 7)
    producer = client.create_producer(topic, producer_name="py-2", batching_max_publish_delay_ms=1_000)
    ids: list = []
    for i, d in enumerate(data[:5]):  # one batch of 5, then two single messages
        producer.send_async(d, lambda e, mid: ids.append((e, mid)), properties={"i": str(i)}, key=f"k{i}")
    producer.flush()
    ids = [mid for e, mid in ids if e is None]
    ids += [producer.send(d, event_time_ms=5) for d in data[5:]]
    out = ruby("consume", topic, "--subscription", "rb-decoded", "--count", "7", "--format", "messages",
               broker=non_owner(cluster, client, topic))
    got = out["messages"]
    assert [unb64(m["payload_b64"]) for m in got] == data
    assert [m["message_id"] for m in got] == [str(mid) for mid in ids]
    assert [m["key"] for m in got] == [f"k{i}" for i in range(5)] + [None, None]
    assert [m["properties"] for m in got] == [{"i": str(i)} for i in range(5)] + [{}, {}]
    assert [m["event_time_ms"] for m in got[5:]] == [5, 5] and {m["producer_name"] for m in got} == {"py-2"}
    stats = client.topic_stats(topic)["subscriptions"]["rb-decoded"]
    assert stats["msgBacklog"] == 0 and stats["consumers"] == [], stats


def test_ruby_sends_a_delayed_message_and_decodes_its_time(cluster, client, ns, tmp_path):
    topic = f"persistent://{ns}/delayed-from-ruby"
    client.create_topic(topic)
    at = int(time.time() * 1000) + 1_500
    items = [{"payload_b64": b64(b"later"), "key": "k", "deliver_at_ms": at}, {"payload_b64": b64(b"now")}]
    shared = client.subscribe(topic, "sh", SubscriptionType.Shared, initial_position=InitialPosition.Earliest)
    ruby("produce", topic, "--payloads", write_json(tmp_path / "d.json", items), "--batch", "1",
         broker=non_owner(cluster, client, topic))
    first = shared.receive(RECEIVE_MS)
    assert first.data() == b"now" and time.time() * 1000 < at
    second = shared.receive(RECEIVE_MS)
    assert second.data() == b"later" and time.time() * 1000 >= at - 2   # never before its time (whole ms)
    shared.acknowledge(first)
    shared.acknowledge(second)
    out = ruby("consume", topic, "--subscription", "rb", "--count", "2", "--position", "earliest",
               broker=non_owner(cluster, client, topic))   # Exclusive: at once, the time in the entry header
    assert [unb64(m["payload_b64"]) for m in out["messages"]] == [b"later", b"now"]
    assert [m["deliver_at_ms"] for m in out["messages"]] == [at, 0]
