"""A consumer in any language: only the generated stubs of proto/topic.proto and grpc (no bksim.client, no
formats/message.py), against real brokers (broker_harness: ZooKeeper, 3 bookies, 2 brokers). Subscribe with
delivery_format MESSAGES: the broker delivers decoded ReceivedMessages (payload, key, properties, event and
publish time, sequence id, producer name, id with batch index and size); acks of those ids as they are are
batch-index acks (the acknowledged messages of a batch never come again, the rest does); a stubs-only reader
(non_durable) from a message id inside a batch; malformed requests answered with precise in-band errors."""
from __future__ import annotations

import json
import queue
import uuid

import grpc
import pytest

from bksim.gen import topic_pb2 as pb
from bksim.gen import topic_pb2_grpc

BOOKIES = 3
WAIT_S = 15


@pytest.fixture(scope="module")
def brokers(broker_cluster):
    broker_cluster.settle(BOOKIES)
    if not broker_cluster.brokers:
        broker_cluster.start_brokers(2)
    return [b.address for b in broker_cluster.brokers if b.alive()]


def stub(address: str):
    return topic_pb2_grpc.TopicsStub(grpc.insecure_channel(address))


@pytest.fixture
def topic(brokers):
    any_broker = stub(brokers[0])
    tenant = f"pb{uuid.uuid4().hex[:8]}"
    any_broker.CreateTenant(pb.CreateTenantRequest(tenant=tenant), timeout=WAIT_S)
    any_broker.CreateNamespace(pb.CreateNamespaceRequest(namespace=f"{tenant}/ns", policies=pb.NamespacePolicies(
        retention_ms=-1, retention_bytes=-1)), timeout=WAIT_S)
    name = f"persistent://{tenant}/ns/any-language"
    any_broker.CreateTopic(pb.CreateTopicRequest(topic=name), timeout=WAIT_S)
    return name


def owner(brokers, topic):
    return stub(stub(brokers[0]).Lookup(pb.LookupRequest(topic=topic), timeout=WAIT_S).address)


class Stream:
    """A Subscribe stream: requests pushed into a queue, responses read one at a time with a bound."""

    def __init__(self, topics, open_request: pb.SubscribeOpen) -> None:
        self.requests: queue.Queue = queue.Queue()
        self.requests.put(pb.ConsumeRequest(open=open_request))
        self.responses = topics.Subscribe(iter(self.requests.get, None), timeout=WAIT_S * 2)

    def send(self, **kind) -> None:
        self.requests.put(pb.ConsumeRequest(**kind))

    def next(self) -> pb.ConsumeResponse:
        return next(self.responses)

    def messages(self, n: int) -> list[pb.ReceivedMessage]:
        out: list[pb.ReceivedMessage] = []
        while len(out) < n:
            r = self.next()
            assert r.WhichOneof("kind") in ("deliveries", "active_change"), r
            for d in r.deliveries.deliveries:
                assert d.entry == b"", "MESSAGES: no stored entry to decode"
                out += d.messages
        return out

    def close(self) -> None:
        """Half-close and read to the end: the broker ends the stream once it has removed the consumer, so the
        subscription is free for the next consumer when this returns (bounded by the call's deadline)."""
        self.requests.put(None)
        for _ in self.responses:
            pass


def produce(topics, topic):
    """One batch of four messages and one single message, through the Produce stub; their receipts."""
    sends = [pb.ProduceRequest(open=pb.ProducerOpen(topic=topic, producer_name="stub-producer")),
             pb.ProduceRequest(send=pb.Send(request_id=1, messages=[
                 pb.Message(payload=b"b%d" % i, key=f"k{i}", has_key=i != 3, properties={"i": str(i)},
                            event_time_ms=100 + i, sequence_id=i) for i in range(4)])),
             pb.ProduceRequest(send=pb.Send(request_id=2, messages=[pb.Message(payload=b"single", sequence_id=4)]))]
    responses = list(topics.Produce(iter(sends), timeout=WAIT_S))
    assert responses[0].ready.producer_name == "stub-producer"
    return [r.receipt for r in responses[1:]]


def test_decoded_messages_and_batch_index_acks_with_the_stubs_only(brokers, topic):
    topics = owner(brokers, topic)
    batch, single = produce(topics, topic)
    s = Stream(topics, pb.SubscribeOpen(topic=topic, subscription="any", initial_position=pb.EARLIEST,
                                        delivery_format=pb.MESSAGES))
    assert s.next().subscribed.subscription == "any"
    s.send(flow=pb.Flow(permits=100))
    got = s.messages(5)
    assert [m.payload for m in got] == [b"b0", b"b1", b"b2", b"b3", b"single"]
    assert [(m.key, m.has_key) for m in got] == [("k0", True), ("k1", True), ("k2", True), ("", False), ("", False)]
    assert [dict(m.properties) for m in got[:4]] == [{"i": str(i)} for i in range(4)]
    assert [m.event_time_ms for m in got] == [100, 101, 102, 103, 0]
    assert [m.sequence_id for m in got] == [0, 1, 2, 3, 4]
    assert {m.producer_name for m in got} == {"stub-producer"} and all(m.publish_time_ms > 0 for m in got)
    assert [(m.id.ledger_id, m.id.entry_id, m.id.batch_index, m.id.batch_size) for m in got] == \
        [(batch.ledger_id, batch.entry_id, i, 4) for i in range(4)] + [(single.ledger_id, single.entry_id, -1, 0)]
    assert {m.partition for m in got} == {-1}
    # batch-index acks: messages 0 and 2 of the batch, and the single message, each by its id as delivered
    s.send(ack=pb.Ack(request_id=7, ids=[got[0].id, got[2].id, got[4].id]))
    answer = s.next()
    assert answer.ack_result.request_id == 7 and not answer.ack_result.HasField("error")
    s.close()
    again = Stream(topics, pb.SubscribeOpen(topic=topic, subscription="any", delivery_format=pb.MESSAGES))
    again.next()
    again.send(flow=pb.Flow(permits=100))
    rest = again.messages(2)
    assert [(m.payload, m.id.batch_index) for m in rest] == [(b"b1", 1), (b"b3", 3)]
    again.send(ack=pb.Ack(request_id=8, ids=[m.id for m in rest]))
    assert not again.next().ack_result.HasField("error")
    again.close()
    stats = json.loads(topics.TopicStats(pb.TopicRequest(topic=topic), timeout=WAIT_S).json)
    assert stats["subscriptions"]["any"]["msgBacklog"] == 0


def test_a_stubs_only_reader_from_inside_a_batch(brokers, topic):
    topics = owner(brokers, topic)
    batch, single = produce(topics, topic)
    start = pb.AckId(ledger_id=batch.ledger_id, entry_id=batch.entry_id, batch_index=1)
    r = Stream(topics, pb.SubscribeOpen(topic=topic, non_durable=True, start_message_id=start,
                                        start_message_id_inclusive=True, delivery_format=pb.MESSAGES))
    subscribed = r.next().subscribed
    assert subscribed.subscription.startswith("reader-")  # named by the broker
    r.send(flow=pb.Flow(permits=100))
    assert [m.payload for m in r.messages(4)] == [b"b1", b"b2", b"b3", b"single"]
    r.send(get_last_message_id=pb.GetLastMessageId(request_id=3))
    last = r.next().last_message_id
    assert (last.request_id, last.ledger_id, last.entry_id) == (3, single.ledger_id, single.entry_id)
    r.close()


@pytest.mark.parametrize("open_request, words", [
    (dict(subscription="x", delivery_format=9), "unknown delivery format 9"),
    (dict(non_durable=True, type=pb.SHARED), "a reader (non_durable) is EXCLUSIVE"),
    (dict(subscription="x", start_message_id=pb.AckId(ledger_id=1, entry_id=0)), "start_message_id is for readers"),
    (dict(non_durable=True, start_message_id=pb.AckId(ledger_id=10 ** 9, entry_id=0)), "not a message of this topic"),
    (dict(non_durable=True, start_message_id=pb.AckId(ledger_id=3, entry_id=-4)), "malformed start message id"),
])
def test_bad_subscribe_requests_get_bad_request(brokers, topic, open_request, words):
    topics = owner(brokers, topic)
    produce(topics, topic)
    s = Stream(topics, pb.SubscribeOpen(topic=topic, **open_request))
    first = s.next()
    assert first.error.status == pb.BAD_REQUEST and words in first.error.message, first
    with pytest.raises(grpc.RpcError) as e:
        s.next()
    assert e.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert dict(e.value.trailing_metadata()).get("bksim-status") == "BAD_REQUEST"


def test_an_ack_set_acks_several_messages_of_a_batch_in_one_id_and_a_bad_one_applies_nothing(brokers, topic):
    topics = owner(brokers, topic)
    batch, single = produce(topics, topic)

    def subscribed():
        s = Stream(topics, pb.SubscribeOpen(topic=topic, subscription="sets", initial_position=pb.EARLIEST))
        assert s.next().subscribed.subscription == "sets"
        s.send(flow=pb.Flow(permits=100))
        return s

    def ack_set(first, *more):
        return pb.AckId(ledger_id=batch.ledger_id, entry_id=batch.entry_id, batch_index=first, batch_size=4,
                        more_batch_indexes=list(more))

    s = subscribed()
    s.send(ack=pb.Ack(request_id=1, ids=[ack_set(2, 0), pb.AckId(ledger_id=single.ledger_id,
                                                                 entry_id=single.entry_id, batch_index=-1)]))
    answer = s.next()
    for _ in range(5):  # the deliveries (and an active_change) may come before the answer
        if answer.WhichOneof("kind") == "ack_result":
            break
        answer = s.next()
    result = answer.ack_result
    assert result.request_id == 1 and not result.HasField("error")
    s.send(ack=pb.Ack(request_id=2, ids=[ack_set(1, 9)]))  # index 9 is outside the batch of 4
    refused = s.next().ack_result
    assert refused.request_id == 2 and refused.error.status == pb.INVALID_ACK and "9" in refused.error.message
    s.close()
    again = subscribed()
    first = again.next()
    while first.WhichOneof("kind") != "deliveries":  # an active_change may come first
        first = again.next()
    redelivered = first.deliveries.deliveries
    assert [(d.entry_id, sorted(d.acked_batch_indexes)) for d in redelivered] == [(batch.entry_id, [0, 2])]
    again.send(ack=pb.Ack(request_id=3, ids=[ack_set(3, 1)]))
    assert not again.next().ack_result.HasField("error")
    again.close()
    stats = json.loads(topics.TopicStats(pb.TopicRequest(topic=topic), timeout=WAIT_S).json)
    assert stats["subscriptions"]["sets"]["msgBacklog"] == 0
